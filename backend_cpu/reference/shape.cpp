// Reference kernels for the shape and data-movement family. Most of them only move elements, so
// they copy elements of dataTypeSize bytes and work for every type (bool, float16, bfloat16...);
// only EyeLike and Range, which create values, dispatch on the element type.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/broadcast.hpp"
#include "core/dispatch.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace popart::backend_cpu {

namespace {

bool notString(const ir::Op &op) {
  for (const ir::Tensor *t : op.inputs)
    if (t && t->info().dataType() == DataType::STRING) return false;
  for (const ir::Tensor *t : op.outputs)
    if (t && t->info().dataType() == DataType::STRING) return false;
  return true;
}

size_t elemSize(const ir::Op &op) { return dataTypeSize(op.outInfo(0).dataType()); }

std::vector<int64_t> constInts(const ir::Op &op, size_t i) {
  if (!op.hasInput(i)) return {};
  return op.constInput(i, "shape value").toInt64Vector();
}

/// Writes \p value converted to \p type into \p dst (one element).
void storeValue(double value, DataType type, void *dst) {
  dispatchAll(type, "constant value", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v = static_cast<T>(static_cast<compute_t<T>>(value));
    std::memcpy(dst, &v, sizeof(T));
  });
}

double loadValue(DataType type, const void *src) {
  return dispatchAll(type, "constant value", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    std::memcpy(&v, src, sizeof(T));
    return static_cast<double>(static_cast<compute_t<T>>(v));
  });
}

// ---------------------------------------------------------------------------------------------

/// Reshape, Flatten, Squeeze, Unsqueeze: the bytes do not change.
class CopyKernel : public Kernel {
public:
  explicit CopyKernel(const ir::Op &op) : bytes_(static_cast<size_t>(op.outInfo(0).byteCount())) {}
  void run(const KernelArgs &a) override {
    if (bytes_ && a.outputs[0] != a.inputs[0]) std::memcpy(a.outputs[0], a.inputs[0], bytes_);
  }

private:
  size_t bytes_;
};

constexpr int64_t kPad = std::numeric_limits<int64_t>::min();

/// How each output element is found in input 0: the output is walked in row-major order over
/// outShape (which may be a finer view of the real output shape, as for DepthToSpace), and the
/// input element offset is the sum over dimensions d of tables[d][index_d]. kPad in any table
/// means the element is padding.
struct IndexMap {
  Shape outShape;
  std::vector<std::vector<int64_t>> tables;
  bool innerContiguous = false; ///< the last table is t0, t0+1, ...: rows are copied whole
};

/// A view of \p view (row-major) permuted by \p perm: output dim d walks view dim perm[d].
IndexMap transposedView(const Shape &view, const std::vector<int64_t> &perm) {
  std::vector<int64_t> strides = rowMajorStrides(view);
  IndexMap m;
  for (int64_t p : perm) {
    int64_t n = view[static_cast<size_t>(p)];
    m.outShape.push_back(n);
    std::vector<int64_t> t(static_cast<size_t>(n));
    for (int64_t o = 0; o < n; ++o)
      t[static_cast<size_t>(o)] = o * strides[static_cast<size_t>(p)];
    m.tables.push_back(std::move(t));
  }
  return m;
}

template <typename E> void walkMap(const IndexMap &m, const uint8_t *inBytes, uint8_t *outBytes, const E &pad) {
  const E *in = reinterpret_cast<const E *>(inBytes);
  E *out = reinterpret_cast<E *>(outBytes);
  size_t rank = m.outShape.size();
  if (rank == 0) {
    out[0] = in[0];
    return;
  }
  if (shapeElementCount(m.outShape) == 0) return;
  const std::vector<int64_t> &inner = m.tables[rank - 1];
  int64_t n = m.outShape[rank - 1];
  // Index of the outer dimensions, kept in a fixed-size buffer so run() does not allocate.
  int64_t idx[16] = {};
  for (;;) {
    int64_t base = 0;
    bool padRow = false;
    for (size_t d = 0; d + 1 < rank; ++d) {
      int64_t t = m.tables[d][static_cast<size_t>(idx[d])];
      if (t == kPad)
        padRow = true;
      else
        base += t;
    }
    if (padRow) {
      for (int64_t o = 0; o < n; ++o)
        out[o] = pad;
    } else if (m.innerContiguous) {
      std::copy(in + base + inner[0], in + base + inner[0] + n, out);
    } else {
      for (int64_t o = 0; o < n; ++o) {
        int64_t t = inner[static_cast<size_t>(o)];
        out[o] = t == kPad ? pad : in[base + t];
      }
    }
    out += n;
    for (size_t d = rank - 1;;) {
      if (d == 0) return;
      --d;
      if (++idx[d] < m.outShape[d]) break;
      idx[d] = 0;
    }
  }
}

/// Element types by size, so the copy loops move whole elements.
struct Bytes16 {
  uint64_t lo, hi;
};

/// Transpose, Slice, Expand, Tile, Pad, DepthToSpace, SpaceToDepth.
/// Fills \p m.tables for the first \p rank axes with entry \p f(d, o) for output index o of axis
/// d; none for an empty result, which walkMap does not walk (and whose other axes may be huge).
template <typename F> void fillTables(IndexMap &m, size_t rank, F f) {
  const bool empty = shapeElementCount(m.outShape) == 0;
  for (size_t d = 0; d < rank; ++d) {
    std::vector<int64_t> t(empty ? 0 : static_cast<size_t>(m.outShape[d]));
    for (size_t o = 0; o < t.size(); ++o)
      t[o] = f(d, static_cast<int64_t>(o));
    m.tables.push_back(std::move(t));
  }
}

class IndexMapKernel : public Kernel {
public:
  IndexMapKernel(const ir::Op &op, IndexMap map)
      : map_(std::move(map)), elem_(elemSize(op)), outType_(op.outInfo(0).dataType()) {
    if (map_.outShape.size() > 17) throw error(op.debugName(), ": rank ", map_.outShape.size(), " is too large");
    if (!map_.tables.empty()) {
      const std::vector<int64_t> &t = map_.tables.back();
      map_.innerContiguous = !t.empty() && t[0] != kPad;
      for (size_t o = 1; o < t.size() && map_.innerContiguous; ++o)
        map_.innerContiguous = t[o] == t[0] + static_cast<int64_t>(o);
    }
    if (op.type == "Pad" && op.hasInput(2)) padType_ = op.inInfo(2).dataType();
  }

  void run(const KernelArgs &a) override {
    alignas(16) uint8_t pad[16] = {};
    if (padType_ != DataType::UNDEFINED && a.hasInput(2)) storeValue(loadValue(padType_, a.inputs[2]), outType_, pad);
    const auto *in = static_cast<const uint8_t *>(a.inputs[0]);
    auto *out = static_cast<uint8_t *>(a.outputs[0]);
    switch (elem_) {
    case 1: walkMap(map_, in, out, *reinterpret_cast<uint8_t *>(pad)); break;
    case 2: walkMap(map_, in, out, *reinterpret_cast<uint16_t *>(pad)); break;
    case 4: walkMap(map_, in, out, *reinterpret_cast<uint32_t *>(pad)); break;
    case 8: walkMap(map_, in, out, *reinterpret_cast<uint64_t *>(pad)); break;
    case 16: walkMap(map_, in, out, *reinterpret_cast<Bytes16 *>(pad)); break;
    default: throw error("data movement kernel: element size ", elem_, " is not supported");
    }
  }

private:
  IndexMap map_;
  size_t elem_;
  DataType outType_;
  DataType padType_ = DataType::UNDEFINED;
};

std::vector<int64_t> transposePerm(const ir::Op &op) {
  int64_t rank = op.inInfo(0).rank();
  std::vector<int64_t> perm = op.attrs.getInts("perm", {});
  if (perm.empty())
    for (int64_t i = rank - 1; i >= 0; --i)
      perm.push_back(i);
  for (int64_t &p : perm)
    if (p < 0) p += rank;
  return perm;
}

std::unique_ptr<Kernel> createTranspose(const ir::Op &op) {
  return std::make_unique<IndexMapKernel>(op, transposedView(op.inInfo(0).shape(), transposePerm(op)));
}

/// Slice of one axis to a range with step 1: for each of \p outer indices, \p bytes bytes from
/// offset \p offset of a row of \p row bytes.
class BlockSliceKernel : public Kernel {
public:
  BlockSliceKernel(int64_t outer, int64_t row, int64_t offset, int64_t bytes)
      : outer_(outer), row_(row), offset_(offset), bytes_(bytes) {}
  void run(const KernelArgs &a) override {
    const auto *in = static_cast<const uint8_t *>(a.inputs[0]) + offset_;
    auto *out = static_cast<uint8_t *>(a.outputs[0]);
    if (bytes_ == 0) return;
    for (int64_t o = 0; o < outer_; ++o)
      std::memcpy(out + o * bytes_, in + o * row_, static_cast<size_t>(bytes_));
  }

private:
  int64_t outer_, row_, offset_, bytes_;
};

std::unique_ptr<Kernel> createSlice(const ir::Op &op) {
  const Shape &in = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> strides = rowMajorStrides(in);
  std::vector<int64_t> starts = constInts(op, 1), axes = constInts(op, 3), steps = constInts(op, 4);
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i)
      axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  std::vector<int64_t> first(in.size(), 0), step(in.size(), 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
    int64_t dim = in[static_cast<size_t>(a)];
    int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i];
    s = steps[i] > 0 || dim == 0 ? std::clamp<int64_t>(s, 0, dim) : std::clamp<int64_t>(s, 0, dim - 1);
    first[static_cast<size_t>(a)] = s;
    step[static_cast<size_t>(a)] = steps[i];
  }
  const Shape &out = op.outInfo(0).shape();
  // One axis cut to a range with step 1 (a channel split): a block per outer index.
  std::vector<size_t> cut;
  for (size_t d = 0; d < in.size(); ++d)
    if (out[d] != in[d] || first[d] != 0 || (step[d] != 1 && out[d] > 1)) cut.push_back(d);
  if (cut.size() == 1 && step[cut[0]] == 1) {
    const size_t k = cut[0];
    int64_t outer = 1, inner = static_cast<int64_t>(elemSize(op));
    for (size_t d = 0; d < k; ++d)
      outer *= in[d];
    for (size_t d = k + 1; d < in.size(); ++d)
      inner *= in[d];
    return std::make_unique<BlockSliceKernel>(outer, in[k] * inner, first[k] * inner, out[k] * inner);
  }
  IndexMap m;
  m.outShape = out;
  fillTables(m, in.size(), [&](size_t d, int64_t o) { return (first[d] + o * step[d]) * strides[d]; });
  return std::make_unique<IndexMapKernel>(op, std::move(m));
}

std::unique_ptr<Kernel> createExpand(const ir::Op &op) {
  IndexMap m;
  m.outShape = op.outInfo(0).shape();
  std::vector<int64_t> strides = broadcastStrides(op.inInfo(0).shape(), m.outShape);
  fillTables(m, m.outShape.size(), [&](size_t d, int64_t o) { return o * strides[d]; });
  return std::make_unique<IndexMapKernel>(op, std::move(m));
}

std::unique_ptr<Kernel> createTile(const ir::Op &op) {
  const Shape &in = op.inInfo(0).shape();
  std::vector<int64_t> strides = rowMajorStrides(in);
  IndexMap m;
  m.outShape = op.outInfo(0).shape();
  fillTables(m, in.size(), [&](size_t d, int64_t o) { return (o % in[d]) * strides[d]; });
  return std::make_unique<IndexMapKernel>(op, std::move(m));
}

/// Source index along one axis of size \p n for padded position \p i (relative to the input start).
int64_t padSource(int64_t i, int64_t n, const std::string &mode) {
  if (i >= 0 && i < n) return i;
  if (mode == "constant" || n == 0) return kPad;
  if (mode == "edge") return i < 0 ? 0 : n - 1;
  if (mode == "wrap") return ((i % n) + n) % n;
  // reflect, repeatedly for pads larger than the axis, as numpy does
  if (n == 1) return 0;
  int64_t period = 2 * (n - 1);
  int64_t r = ((i % period) + period) % period;
  return r < n ? r : period - r;
}

std::unique_ptr<Kernel> createPad(const ir::Op &op) {
  const Shape &in = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> pads = constInts(op, 1), axes = constInts(op, 3);
  if (!op.hasInput(3))
    for (int64_t i = 0; i < rank; ++i)
      axes.push_back(i);
  std::vector<int64_t> begin(in.size(), 0);
  for (size_t i = 0; i < axes.size(); ++i)
    begin[static_cast<size_t>(axes[i] < 0 ? axes[i] + rank : axes[i])] = pads[i];
  std::string mode = op.attrs.getString("mode", "constant");
  std::vector<int64_t> strides = rowMajorStrides(in);
  IndexMap m;
  m.outShape = op.outInfo(0).shape();
  fillTables(m, in.size(), [&](size_t d, int64_t o) {
    int64_t s = padSource(o - begin[d], in[d], mode);
    return s == kPad ? kPad : s * strides[d];
  });
  return std::make_unique<IndexMapKernel>(op, std::move(m));
}

std::unique_ptr<Kernel> createDepthToSpace(const ir::Op &op) {
  const Shape &s = op.inInfo(0).shape();
  int64_t b = op.attrs.getInt("blocksize");
  int64_t c = s[1] / (b * b);
  bool crd = op.attrs.getString("mode", "DCR") == "CRD";
  // DCR reads channels as (b1, b2, c), CRD as (c, b1, b2); both write (n, c, h, b1, w, b2).
  if (crd) return std::make_unique<IndexMapKernel>(op, transposedView({s[0], c, b, b, s[2], s[3]}, {0, 1, 4, 2, 5, 3}));
  return std::make_unique<IndexMapKernel>(op, transposedView({s[0], b, b, c, s[2], s[3]}, {0, 3, 4, 1, 5, 2}));
}

std::unique_ptr<Kernel> createSpaceToDepth(const ir::Op &op) {
  const Shape &s = op.inInfo(0).shape();
  int64_t b = op.attrs.getInt("blocksize");
  return std::make_unique<IndexMapKernel>(op,
                                          transposedView({s[0], s[1], s[2] / b, b, s[3] / b, b}, {0, 3, 5, 1, 2, 4}));
}

// ---------------------------------------------------------------------------------------------

/// Concat (many inputs into one) and Split (one into many) copy contiguous blocks.
class ConcatSplitKernel : public Kernel {
public:
  explicit ConcatSplitKernel(const ir::Op &op) : split_(op.type == "Split") {
    const TensorInfo &whole = split_ ? op.inInfo(0) : op.outInfo(0);
    int64_t axis = op.attrs.getInt("axis", split_ ? 0 : 1);
    if (axis < 0) axis += whole.rank();
    outer_ = 1;
    for (int64_t d = 0; d < axis; ++d)
      outer_ *= whole.shape()[static_cast<size_t>(d)];
    int64_t inner = static_cast<int64_t>(dataTypeSize(whole.dataType()));
    for (int64_t d = axis + 1; d < whole.rank(); ++d)
      inner *= whole.shape()[static_cast<size_t>(d)];
    size_t parts = split_ ? op.outputCount() : op.inputCount();
    for (size_t i = 0; i < parts; ++i) {
      bool present = split_ ? op.hasOutput(i) : true;
      int64_t dim = present ? (split_ ? op.outInfo(i) : op.inInfo(i)).shape()[static_cast<size_t>(axis)] : 0;
      chunks_.push_back(dim * inner);
      present_.push_back(present);
    }
    if (split_ && std::find(present_.begin(), present_.end(), false) != present_.end())
      throw error(op.debugName(), ": omitted outputs of Split are not supported");
  }

  void run(const KernelArgs &a) override {
    int64_t total = 0;
    for (int64_t c : chunks_)
      total += c;
    auto *whole = static_cast<uint8_t *>(split_ ? const_cast<void *>(a.inputs[0]) : a.outputs[0]);
    for (int64_t o = 0; o < outer_; ++o) {
      uint8_t *row = whole + o * total;
      for (size_t i = 0; i < chunks_.size(); ++i) {
        size_t c = static_cast<size_t>(chunks_[i]);
        if (c) {
          if (split_)
            std::memcpy(static_cast<uint8_t *>(a.outputs[i]) + o * chunks_[i], row, c);
          else
            std::memcpy(row, static_cast<const uint8_t *>(a.inputs[i]) + o * chunks_[i], c);
        }
        row += c;
      }
    }
  }

private:
  bool split_;
  int64_t outer_ = 1;
  std::vector<int64_t> chunks_;
  std::vector<bool> present_;
};

/// ai.graphcore ChannelShuffle: each (image, output channel) plane is one copy from the input
/// that holds it, so the concatenation, shuffle and split move every element once.
class ChannelShuffleKernel : public Kernel {
public:
  explicit ChannelShuffleKernel(const ir::Op &op) {
    const Shape &shape = op.inInfo(0).shape();
    batch_ = shape[0];
    plane_ = static_cast<int64_t>(dataTypeSize(op.inInfo(0).dataType()));
    for (size_t d = 2; d < shape.size(); ++d)
      plane_ *= shape[d];
    std::vector<std::pair<size_t, int64_t>> concatenated; // (input, channel) of each concatenated channel
    for (size_t i = 0; i < op.inputCount(); ++i) {
      inChannels_.push_back(op.inInfo(i).shape()[1]);
      for (int64_t c = 0; c < inChannels_.back(); ++c)
        concatenated.emplace_back(i, c);
    }
    auto channels = static_cast<int64_t>(concatenated.size());
    int64_t group = op.attrs.getInt("group"), perGroup = channels / group;
    outChannels_ = channels / static_cast<int64_t>(op.outputCount());
    for (int64_t s = 0; s < channels; ++s)
      source_.push_back(concatenated[static_cast<size_t>((s % group) * perGroup + s / group)]);
  }

  void run(const KernelArgs &a) override {
    auto channels = static_cast<int64_t>(source_.size());
    int64_t planes = batch_ * channels;
    auto bytes = static_cast<size_t>(plane_);
#pragma omp parallel for schedule(static) if (planes * plane_ > (1 << 16))
    for (int64_t p = 0; p < planes; ++p) {
      int64_t n = p / channels, s = p % channels;
      auto [input, c] = source_[static_cast<size_t>(s)];
      const auto *src = static_cast<const uint8_t *>(a.inputs[input]) + (n * inChannels_[input] + c) * plane_;
      auto *dst = static_cast<uint8_t *>(a.outputs[static_cast<size_t>(s / outChannels_)]) +
                  (n * outChannels_ + s % outChannels_) * plane_;
      std::memcpy(dst, src, bytes);
    }
  }

private:
  int64_t batch_ = 0, plane_ = 0, outChannels_ = 0;
  std::vector<int64_t> inChannels_;
  std::vector<std::pair<size_t, int64_t>> source_; ///< (input, channel) of each shuffled channel
};

/// Shape, Size, Constant, ConstantOfShape: outputs known at creation.
class FixedOutputKernel : public Kernel {
public:
  explicit FixedOutputKernel(TensorData value) : value_(std::move(value)) {}
  void run(const KernelArgs &a) override {
    if (value_.byteCount()) std::memcpy(a.outputs[0], value_.data(), static_cast<size_t>(value_.byteCount()));
  }

private:
  TensorData value_;
};

std::unique_ptr<Kernel> createShape(const ir::Op &op) {
  const Shape &in = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(in.size());
  int64_t start = op.attrs.getInt("start", 0), end = op.attrs.getInt("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, 0, rank);
  std::vector<int64_t> dims;
  for (int64_t i = start; i < end; ++i)
    dims.push_back(in[static_cast<size_t>(i)]);
  return std::make_unique<FixedOutputKernel>(TensorData::fromInt64({static_cast<int64_t>(dims.size())}, dims));
}

std::unique_ptr<Kernel> createSize(const ir::Op &op) {
  return std::make_unique<FixedOutputKernel>(TensorData::fromInt64({}, {op.inInfo(0).elementCount()}));
}

std::unique_ptr<Kernel> createConstant(const ir::Op &op) {
  auto v = op.attrs.getTensor("value");
  if (!v) throw error(op.debugName(), ": has no tensor attribute 'value'");
  return std::make_unique<FixedOutputKernel>(*v);
}

std::unique_ptr<Kernel> createConstantOfShape(const ir::Op &op) {
  const TensorInfo &info = op.outInfo(0);
  TensorData out(info);
  if (auto v = op.attrs.getTensor("value")) {
    size_t es = dataTypeSize(info.dataType());
    auto *p = static_cast<uint8_t *>(out.data());
    for (int64_t i = 0; i < info.elementCount(); ++i)
      std::memcpy(p + i * es, v->data(), es);
  }
  return std::make_unique<FixedOutputKernel>(std::move(out));
}

bool supportsConstant(const ir::Op &op) {
  auto v = op.attrs.getTensor("value");
  return v && v->info().dataType() != DataType::STRING;
}

// ---------------------------------------------------------------------------------------------

class RangeKernel : public Kernel {
public:
  explicit RangeKernel(const ir::Op &op) : type_(op.outInfo(0).dataType()), n_(op.outInfo(0).elementCount()) {}
  void run(const KernelArgs &a) override {
    dispatchNumeric(type_, "Range", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      C start = static_cast<C>(*a.in<T>(0)), delta = static_cast<C>(*a.in<T>(2));
      T *y = a.out<T>(0);
      for (int64_t i = 0; i < n_; ++i)
        y[i] = static_cast<T>(start + static_cast<C>(i) * delta);
    });
  }

private:
  DataType type_;
  int64_t n_;
};

class EyeLikeKernel : public Kernel {
public:
  explicit EyeLikeKernel(const ir::Op &op)
      : type_(op.outInfo(0).dataType()), rows_(op.outInfo(0).shape()[0]), cols_(op.outInfo(0).shape()[1]),
        k_(op.attrs.getInt("k", 0)) {}
  void run(const KernelArgs &a) override {
    dispatchAll(type_, "EyeLike", [&](auto tag) {
      using T = typename decltype(tag)::type;
      T *y = a.out<T>(0);
      std::memset(static_cast<void *>(y), 0, static_cast<size_t>(rows_ * cols_) * sizeof(T));
      for (int64_t i = 0; i < rows_; ++i) {
        int64_t j = i + k_;
        if (j >= 0 && j < cols_) y[i * cols_ + j] = static_cast<T>(static_cast<compute_t<T>>(1));
      }
    });
  }

private:
  DataType type_;
  int64_t rows_, cols_, k_;
};

class TriluKernel : public Kernel {
public:
  explicit TriluKernel(const ir::Op &op) : elem_(elemSize(op)), upper_(op.attrs.getInt("upper", 1) != 0) {
    const Shape &s = op.inInfo(0).shape();
    rows_ = s[s.size() - 2];
    cols_ = s[s.size() - 1];
    batches_ = rows_ * cols_ == 0 ? 0 : op.inInfo(0).elementCount() / (rows_ * cols_);
  }
  void run(const KernelArgs &a) override {
    // Past either corner every row keeps all or none of its columns: clamped, i + k cannot overflow.
    const int64_t k = std::clamp<int64_t>(a.hasInput(1) ? *a.in<int64_t>(1) : 0, -rows_ - 1, cols_);
    const auto *x = static_cast<const uint8_t *>(a.inputs[0]);
    auto *y = static_cast<uint8_t *>(a.outputs[0]);
    for (int64_t b = 0; b < batches_; ++b)
      for (int64_t i = 0; i < rows_; ++i) {
        // Kept columns form one contiguous range [lo, hi) of the row; all-zero bytes are 0 in every type.
        int64_t lo = upper_ ? std::clamp<int64_t>(i + k, 0, cols_) : 0;
        int64_t hi = upper_ ? cols_ : std::clamp<int64_t>(i + k + 1, 0, cols_);
        if (hi < lo) hi = lo;
        size_t row = static_cast<size_t>(((b * rows_) + i) * cols_) * elem_;
        std::memset(y + row, 0, static_cast<size_t>(lo) * elem_);
        std::memcpy(y + row + lo * elem_, x + row + lo * elem_, static_cast<size_t>(hi - lo) * elem_);
        std::memset(y + row + hi * elem_, 0, static_cast<size_t>(cols_ - hi) * elem_);
      }
  }

private:
  size_t elem_;
  bool upper_;
  int64_t rows_, cols_, batches_;
};

class ReverseSequenceKernel : public Kernel {
public:
  explicit ReverseSequenceKernel(const ir::Op &op)
      : batchAxis_(op.attrs.getInt("batch_axis", 1)), lensType_(op.inInfo(1).dataType()) {
    const Shape &s = op.inInfo(0).shape();
    d0_ = s[0];
    d1_ = s[1];
    inner_ = static_cast<int64_t>(elemSize(op));
    for (size_t d = 2; d < s.size(); ++d)
      inner_ *= s[d];
  }
  void run(const KernelArgs &a) override {
    const auto *x = static_cast<const uint8_t *>(a.inputs[0]);
    auto *y = static_cast<uint8_t *>(a.outputs[0]);
    int64_t times = batchAxis_ == 1 ? d0_ : d1_;
    for (int64_t i0 = 0; i0 < d0_; ++i0)
      for (int64_t i1 = 0; i1 < d1_; ++i1) {
        int64_t b = batchAxis_ == 1 ? i1 : i0, t = batchAxis_ == 1 ? i0 : i1;
        int64_t len = lensType_ == DataType::INT64 ? a.in<int64_t>(1)[b] : a.in<int32_t>(1)[b];
        if (len < 0 || len > times) throw error("sequence_lens[", b, "] = ", len, " is outside [0, ", times, "]");
        int64_t src = t < len ? len - 1 - t : t;
        int64_t s0 = batchAxis_ == 1 ? src : i0, s1 = batchAxis_ == 1 ? i1 : src;
        std::memcpy(y + (i0 * d1_ + i1) * inner_, x + (s0 * d1_ + s1) * inner_, static_cast<size_t>(inner_));
      }
  }

private:
  int64_t batchAxis_;
  DataType lensType_;
  int64_t d0_ = 0, d1_ = 0, inner_ = 0;
};

bool supportsRange(const ir::Op &op) { return op.outInfo(0).dataType() != DataType::BOOL && notString(op); }

} // namespace

void registerReferenceShapeKernels(KernelRegistry &r) {
  auto add = [&](const char *type, bool (*supports)(const ir::Op &), KernelFactory create) {
    r.add({"ai.onnx", type, KernelProvider::Reference, supports, create});
  };
  for (const char *t : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
    add(t, notString, makeKernel<CopyKernel>);
  add("Transpose", notString, createTranspose);
  add("Slice", notString, createSlice);
  add("Expand", notString, createExpand);
  add("Tile", notString, createTile);
  add("Pad", notString, createPad);
  add("DepthToSpace", notString, createDepthToSpace);
  add("SpaceToDepth", notString, createSpaceToDepth);
  add("Concat", notString, makeKernel<ConcatSplitKernel>);
  add("Split", notString, makeKernel<ConcatSplitKernel>);
  r.add({"ai.graphcore", "ChannelShuffle", KernelProvider::Reference, notString, makeKernel<ChannelShuffleKernel>});
  add("Shape", nullptr, createShape);
  add("Size", nullptr, createSize);
  add("Constant", supportsConstant, createConstant);
  add("ConstantOfShape", notString, createConstantOfShape);
  add("Range", supportsRange, makeKernel<RangeKernel>);
  add("EyeLike", notString, makeKernel<EyeLikeKernel>);
  add("Trilu", notString, makeKernel<TriluKernel>);
  add("ReverseSequence", notString, makeKernel<ReverseSequenceKernel>);
}

} // namespace popart::backend_cpu
