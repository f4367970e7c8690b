// Reference kernels for the indexing family. Data moves as raw bytes so every dtype works;
// only scatter reductions and NonZero/Unique/OneHot need the element type.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/broadcast.hpp"
#include "core/dispatch.hpp"
#include "core/int_range.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <type_traits>

namespace popart::backend_cpu {

namespace {

/// Reads indices stored as INT32 or INT64.
struct IndexReader {
  bool is64 = true;
  int64_t operator()(const void *p, int64_t i) const {
    return is64 ? static_cast<const int64_t *>(p)[i] : static_cast<const int32_t *>(p)[i];
  }
};

IndexReader indexReader(const ir::Op &op, size_t i) { return {op.inInfo(i).dataType() == DataType::INT64}; }

/// \p v in [-dim, dim) made non-negative; throws naming the op otherwise.
int64_t checkIndex(int64_t v, int64_t dim, const std::string &name) {
  if (v < -dim || v >= dim) throw error(name, ": index ", v, " is out of range [", -dim, ", ", dim, ")");
  return v < 0 ? v + dim : v;
}

int64_t product(const Shape &s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < s.size(); ++i)
    p *= s[i];
  return p;
}

class GatherKernel : public Kernel {
public:
  explicit GatherKernel(const ir::Op &op) : name_(op.debugName()), idx_(indexReader(op, 1)) {
    const Shape &data = op.inInfo(0).shape();
    auto axis = static_cast<size_t>(op.attrs.getInt("axis", 0) < 0
                                        ? op.attrs.getInt("axis", 0) + static_cast<int64_t>(data.size())
                                        : op.attrs.getInt("axis", 0));
    outer_ = product(data, 0, axis);
    dim_ = data[axis];
    block_ = product(data, axis + 1, data.size()) * static_cast<int64_t>(dataTypeSize(op.inInfo(0).dataType()));
    count_ = op.inInfo(1).elementCount();
  }
  void run(const KernelArgs &a) override {
    const auto *x = static_cast<const uint8_t *>(a.inputs[0]);
    auto *y = static_cast<uint8_t *>(a.outputs[0]);
    for (int64_t o = 0; o < outer_; ++o)
      for (int64_t i = 0; i < count_; ++i) {
        int64_t k = checkIndex(idx_(a.inputs[1], i), dim_, name_);
        std::memcpy(y + (o * count_ + i) * block_, x + (o * dim_ + k) * block_, static_cast<size_t>(block_));
      }
  }

private:
  std::string name_;
  IndexReader idx_;
  int64_t outer_, dim_, block_, count_;
};

/// Walks an index tensor's elements and gives the matching offset in data, with the
/// coordinate along `axis` replaced by the index value (GatherElements, ScatterElements).
class ElementsMap {
public:
  ElementsMap(const ir::Op &op, const Shape &data, const Shape &ind)
      : name_(op.debugName()), ind_(ind), strides_(rowMajorStrides(data)), pos_(ind.size()) {
    int64_t axis = op.attrs.getInt("axis", 0);
    axis_ = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(data.size()) : axis);
    dim_ = data[axis_];
    for (size_t d = 0; d < data.size(); ++d)
      if (d != axis_ && ind[d] > data[d])
        throw error(name_, ": indices dimension ", d, " (", ind[d], ") exceeds the data dimension (", data[d], ")");
  }
  template <typename F> void forEach(const void *indices, IndexReader idx, F &&f) {
    int64_t n = shapeElementCount(ind_);
    std::fill(pos_.begin(), pos_.end(), 0);
    int64_t base = 0; // offset of pos_ without the axis coordinate
    for (int64_t i = 0; i < n; ++i) {
      int64_t k = checkIndex(idx(indices, i), dim_, name_);
      f(i, base + k * strides_[axis_]);
      for (size_t d = ind_.size(); d-- > 0;) {
        if (d != axis_) base += strides_[d];
        if (++pos_[d] < ind_[d]) break;
        if (d != axis_) base -= strides_[d] * pos_[d];
        pos_[d] = 0;
      }
    }
  }

private:
  std::string name_;
  Shape ind_;
  std::vector<int64_t> strides_;
  std::vector<int64_t> pos_;
  size_t axis_;
  int64_t dim_;
};

class GatherElementsKernel : public Kernel {
public:
  explicit GatherElementsKernel(const ir::Op &op)
      : map_(op, op.inInfo(0).shape(), op.inInfo(1).shape()), idx_(indexReader(op, 1)),
        size_(dataTypeSize(op.inInfo(0).dataType())) {}
  void run(const KernelArgs &a) override {
    const auto *x = static_cast<const uint8_t *>(a.inputs[0]);
    auto *y = static_cast<uint8_t *>(a.outputs[0]);
    map_.forEach(a.inputs[1], idx_,
                 [&](int64_t i, int64_t off) { std::memcpy(y + i * size_, x + off * size_, size_); });
  }

private:
  ElementsMap map_;
  IndexReader idx_;
  size_t size_;
};

class GatherNDKernel : public Kernel {
public:
  explicit GatherNDKernel(const ir::Op &op) : name_(op.debugName()) {
    const Shape &data = op.inInfo(0).shape(), &ind = op.inInfo(1).shape();
    auto b = static_cast<size_t>(op.attrs.getInt("batch_dims", 0));
    k_ = ind.back();
    batches_ = product(ind, 0, b);
    tuples_ = product(ind, b, ind.size() - 1);
    slice_ = product(data, b + static_cast<size_t>(k_), data.size());
    batchData_ = product(data, b, data.size());
    for (int64_t j = 0; j < k_; ++j) {
      dims_.push_back(data[b + static_cast<size_t>(j)]);
      strides_.push_back(product(data, b + static_cast<size_t>(j) + 1, data.size()));
    }
    size_ = dataTypeSize(op.inInfo(0).dataType());
  }
  void run(const KernelArgs &a) override {
    const auto *x = static_cast<const uint8_t *>(a.inputs[0]);
    const auto *ind = a.in<int64_t>(1);
    auto *y = static_cast<uint8_t *>(a.outputs[0]);
    for (int64_t bi = 0; bi < batches_; ++bi)
      for (int64_t t = 0; t < tuples_; ++t) {
        const int64_t *tuple = ind + (bi * tuples_ + t) * k_;
        int64_t off = bi * batchData_;
        for (int64_t j = 0; j < k_; ++j)
          off += checkIndex(tuple[j], dims_[j], name_) * strides_[j];
        std::memcpy(y + (bi * tuples_ + t) * slice_ * static_cast<int64_t>(size_),
                    x + off * static_cast<int64_t>(size_), static_cast<size_t>(slice_) * size_);
      }
  }

private:
  std::string name_;
  int64_t k_, batches_, tuples_, slice_, batchData_;
  std::vector<int64_t> dims_, strides_;
  size_t size_;
};

enum class Reduction { None, Add, Mul, Max, Min };

Reduction reductionOf(const ir::Op &op) {
  std::string r = op.attrs.getString("reduction", "none");
  if (r == "add") return Reduction::Add;
  if (r == "mul") return Reduction::Mul;
  if (r == "max") return Reduction::Max;
  if (r == "min") return Reduction::Min;
  return Reduction::None;
}

/// dst[0] = reduce(dst[0], src[0]) for the element type of \p type.
template <typename T> void combine(T *dst, const T *src, Reduction r) {
  using C = compute_t<T>;
  C d = static_cast<C>(*dst), s = static_cast<C>(*src);
  if constexpr (std::is_same_v<T, bool>) {
    switch (r) {
    case Reduction::Add:
    case Reduction::Max: *dst = d || s; break;
    case Reduction::Mul:
    case Reduction::Min: *dst = d && s; break;
    default: *dst = s;
    }
  } else {
    switch (r) {
    case Reduction::Add: *dst = static_cast<T>(d + s); break;
    case Reduction::Mul: *dst = static_cast<T>(d * s); break;
    case Reduction::Max: *dst = static_cast<T>(std::max(d, s)); break;
    case Reduction::Min: *dst = static_cast<T>(std::min(d, s)); break;
    default: *dst = *src;
    }
  }
}

/// Applies \p count elements of \p src to \p dst with reduction \p r.
void applyUpdate(uint8_t *dst, const uint8_t *src, int64_t count, size_t size, DataType type, Reduction r) {
  if (r == Reduction::None) {
    std::memcpy(dst, src, static_cast<size_t>(count) * size);
    return;
  }
  dispatchAll(type, "scatter reduction", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      if (r == Reduction::Add) { // the embedding gradient's rows: a plain add, which GCC vectorises
        auto *d = reinterpret_cast<T *>(dst);
        const auto *u = reinterpret_cast<const T *>(src);
        for (int64_t i = 0; i < count; ++i)
          d[i] += u[i];
        return;
      }
    for (int64_t i = 0; i < count; ++i)
      combine(reinterpret_cast<T *>(dst) + i, reinterpret_cast<const T *>(src) + i, r);
  });
}

class ScatterElementsKernel : public Kernel {
public:
  explicit ScatterElementsKernel(const ir::Op &op)
      : map_(op, op.inInfo(0).shape(), op.inInfo(1).shape()), idx_(indexReader(op, 1)), type_(op.inInfo(0).dataType()),
        size_(dataTypeSize(type_)), bytes_(op.inInfo(0).byteCount()), reduction_(reductionOf(op)) {}
  void run(const KernelArgs &a) override {
    auto *y = static_cast<uint8_t *>(a.outputs[0]);
    const auto *u = static_cast<const uint8_t *>(a.inputs[2]);
    if (a.outputs[0] != a.inputs[0]) std::memcpy(y, a.inputs[0], static_cast<size_t>(bytes_));
    map_.forEach(a.inputs[1], idx_, [&](int64_t i, int64_t off) {
      applyUpdate(y + off * static_cast<int64_t>(size_), u + i * static_cast<int64_t>(size_), 1, size_, type_,
                  reduction_);
    });
  }

private:
  ElementsMap map_;
  IndexReader idx_;
  DataType type_;
  size_t size_;
  int64_t bytes_;
  Reduction reduction_;
};

class ScatterNDKernel : public Kernel {
public:
  explicit ScatterNDKernel(const ir::Op &op)
      : name_(op.debugName()), type_(op.inInfo(0).dataType()), size_(dataTypeSize(type_)),
        bytes_(op.inInfo(0).byteCount()), reduction_(reductionOf(op)) {
    const Shape &data = op.inInfo(0).shape(), &ind = op.inInfo(1).shape();
    k_ = ind.back();
    tuples_ = product(ind, 0, ind.size() - 1);
    slice_ = product(data, static_cast<size_t>(k_), data.size());
    for (int64_t j = 0; j < k_; ++j) {
      dims_.push_back(data[static_cast<size_t>(j)]);
      strides_.push_back(product(data, static_cast<size_t>(j) + 1, data.size()));
    }
  }
  void run(const KernelArgs &a) override {
    auto *y = static_cast<uint8_t *>(a.outputs[0]);
    const auto *ind = a.in<int64_t>(1);
    const auto *u = static_cast<const uint8_t *>(a.inputs[2]);
    if (a.outputs[0] != a.inputs[0]) std::memcpy(y, a.inputs[0], static_cast<size_t>(bytes_));
    auto sz = static_cast<int64_t>(size_);
    for (int64_t t = 0; t < tuples_; ++t) {
      int64_t off = 0;
      for (int64_t j = 0; j < k_; ++j)
        off += checkIndex(ind[t * k_ + j], dims_[j], name_) * strides_[j];
      applyUpdate(y + off * sz, u + t * slice_ * sz, slice_, size_, type_, reduction_);
    }
  }

private:
  std::string name_;
  DataType type_;
  size_t size_;
  int64_t bytes_;
  Reduction reduction_;
  int64_t k_, tuples_, slice_;
  std::vector<int64_t> dims_, strides_;
};

class OneHotKernel : public Kernel {
public:
  explicit OneHotKernel(const ir::Op &op)
      : indType_(op.inInfo(0).dataType()), size_(dataTypeSize(op.inInfo(2).dataType())) {
    const Shape &out = op.outInfo(0).shape();
    int64_t axis = op.attrs.getInt("axis", -1);
    auto ax = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(out.size()) : axis);
    outer_ = product(out, 0, ax);
    depth_ = out[ax];
    inner_ = product(out, ax + 1, out.size());
  }
  void run(const KernelArgs &a) override {
    const auto *values = static_cast<const uint8_t *>(a.inputs[2]);
    auto *y = static_cast<uint8_t *>(a.outputs[0]);
    dispatchNumeric(indType_, "OneHot indices", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T *ind = a.in<T>(0);
      for (int64_t o = 0; o < outer_; ++o)
        for (int64_t i = 0; i < inner_; ++i) {
          const auto x = static_cast<compute_t<T>>(ind[o * inner_ + i]);
          // A float index that int64 cannot hold (NaN, 1e30) is out of range too.
          const bool fits = std::is_integral_v<compute_t<T>> || fitsInt64(static_cast<double>(x));
          int64_t v = fits ? static_cast<int64_t>(x) : depth_;
          if (v < 0) v += depth_; // out-of-range values give an all-off row, as the spec says
          for (int64_t d = 0; d < depth_; ++d)
            std::memcpy(y + ((o * depth_ + d) * inner_ + i) * static_cast<int64_t>(size_),
                        values + (d == v ? size_ : 0), size_);
        }
    });
  }

private:
  DataType indType_;
  size_t size_;
  int64_t outer_, depth_, inner_;
};

/// True where element i of \p p is non-zero.
bool isNonZero(DataType type, const void *p, int64_t i) {
  return dispatchAll(type, "NonZero", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return static_cast<compute_t<T>>(static_cast<const T *>(p)[i]) != compute_t<T>(0);
  });
}

class NonZeroKernel : public Kernel {
public:
  explicit NonZeroKernel(const ir::Op &op)
      : type_(op.inInfo(0).dataType()), shape_(op.inInfo(0).shape()), count_(op.outInfo(0).dim(1)),
        pos_(shape_.size()) {}
  void run(const KernelArgs &a) override {
    int64_t n = shapeElementCount(shape_), j = 0;
    std::fill(pos_.begin(), pos_.end(), 0);
    int64_t *y = a.out<int64_t>(0);
    for (int64_t i = 0; i < n; ++i) {
      if (isNonZero(type_, a.inputs[0], i)) {
        if (j >= count_) throw error("NonZero: input has more non-zero elements than at compile time");
        for (size_t d = 0; d < shape_.size(); ++d)
          y[static_cast<int64_t>(d) * count_ + j] = pos_[d];
        ++j;
      }
      for (size_t d = shape_.size(); d-- > 0;) {
        if (++pos_[d] < shape_[d]) break;
        pos_[d] = 0;
      }
    }
    if (j != count_) throw error("NonZero: input has fewer non-zero elements than at compile time");
  }

private:
  DataType type_;
  Shape shape_;
  int64_t count_;
  std::vector<int64_t> pos_;
};

class CompressKernel : public Kernel {
public:
  explicit CompressKernel(const ir::Op &op) : name_(op.debugName()), len_(op.inInfo(1).elementCount()) {
    const Shape &in = op.inInfo(0).shape();
    auto size = static_cast<int64_t>(dataTypeSize(op.inInfo(0).dataType()));
    if (!op.attrs.has("axis")) {
      outer_ = 1;
      dim_ = shapeElementCount(in);
      block_ = size;
    } else {
      int64_t axis = op.attrs.getInt("axis");
      auto ax = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(in.size()) : axis);
      outer_ = product(in, 0, ax);
      dim_ = in[ax];
      block_ = product(in, ax + 1, in.size()) * size;
    }
    const Shape &out = op.outInfo(0).shape();
    selected_ = op.attrs.has("axis")
                    ? out[static_cast<size_t>(op.attrs.getInt("axis") < 0
                                                  ? op.attrs.getInt("axis") + static_cast<int64_t>(out.size())
                                                  : op.attrs.getInt("axis"))]
                    : out[0];
  }
  void run(const KernelArgs &a) override {
    const bool *cond = a.in<bool>(1);
    int64_t count = 0;
    for (int64_t i = 0; i < len_; ++i)
      count += cond[i] ? 1 : 0;
    if (count != selected_)
      throw error(name_, ": condition selects ", count, " slices, but ", selected_, " at compile time");
    const auto *x = static_cast<const uint8_t *>(a.inputs[0]);
    auto *y = static_cast<uint8_t *>(a.outputs[0]);
    for (int64_t o = 0; o < outer_; ++o)
      for (int64_t i = 0; i < len_; ++i)
        if (cond[i]) {
          std::memcpy(y, x + (o * dim_ + i) * block_, static_cast<size_t>(block_));
          y += block_;
        }
  }

private:
  std::string name_;
  int64_t len_, outer_, dim_, block_, selected_;
};

class UniqueKernel : public Kernel {
public:
  explicit UniqueKernel(const ir::Op &op)
      : name_(op.debugName()), type_(op.inInfo(0).dataType()), size_(dataTypeSize(type_)),
        sorted_(op.attrs.getInt("sorted", 1) != 0) {
    const Shape &shape = op.inInfo(0).shape();
    outer_ = 1;
    slices_ = op.inInfo(0).elementCount();
    inner_ = 1;
    if (op.attrs.has("axis")) {
      int64_t axis = op.attrs.getInt("axis");
      auto ax = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(shape.size()) : axis);
      outer_ = product(shape, 0, ax);
      slices_ = shape[ax];
      inner_ = product(shape, ax + 1, shape.size());
    }
    unique_ = op.outInfo(0).elementCount() / std::max<int64_t>(1, outer_ * inner_);
    if (outer_ * inner_ == 0) unique_ = slices_ > 0 ? 1 : 0;
    order_.resize(static_cast<size_t>(slices_));
    inverse_.resize(static_cast<size_t>(slices_));
    first_.resize(static_cast<size_t>(slices_));
    counts_.resize(static_cast<size_t>(slices_));
  }

  void run(const KernelArgs &a) override {
    dispatchAll(type_, name_.c_str(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const T *x = a.in<T>(0);
      int64_t sliceSize = outer_ * inner_;
      auto at = [&](int64_t s, int64_t j) {
        return static_cast<C>(x[((j / inner_) * slices_ + s) * inner_ + j % inner_]);
      };
      auto cmp = [&](int64_t p, int64_t q) {
        for (int64_t j = 0; j < sliceSize; ++j) {
          C u = at(p, j), v = at(q, j);
          if (u != v) return u < v ? -1 : 1;
        }
        return 0;
      };
      // Sort by value with the slice index as tie-break, so the first of equal slices leads.
      std::iota(order_.begin(), order_.end(), 0);
      std::sort(order_.begin(), order_.end(), [&](int64_t p, int64_t q) {
        int c = cmp(p, q);
        return c != 0 ? c < 0 : p < q;
      });
      // Group equal slices: first_[g] is the first occurrence, counts_[g] the size.
      int64_t groups = 0;
      for (int64_t i = 0; i < slices_; ++i) {
        int64_t s = order_[i];
        if (i == 0 || cmp(order_[i - 1], s) != 0) {
          first_[groups] = s;
          counts_[groups] = 0;
          ++groups;
        }
        ++counts_[groups - 1];
        inverse_[s] = groups - 1;
      }
      if (groups != unique_)
        throw error(name_, ": input has ", groups, " unique values, but ", unique_, " at compile time");
      // Unsorted output lists groups by first occurrence: rank groups by first_.
      // rank[g] is stored in order_ (free now) to avoid allocating.
      std::vector<int64_t> &rank = order_;
      for (int64_t g = 0; g < groups; ++g)
        rank[g] = g;
      if (!sorted_) {
        std::sort(rank.begin(), rank.begin() + groups, [&](int64_t p, int64_t q) { return first_[p] < first_[q]; });
      }
      // rank[pos] = group at output position pos; posOf[group] is needed for inverse indices.
      T *y = a.hasOutput(0) ? a.out<T>(0) : nullptr;
      int64_t *indices = a.hasOutput(1) ? a.out<int64_t>(1) : nullptr;
      int64_t *counts = a.hasOutput(3) ? a.out<int64_t>(3) : nullptr;
      for (int64_t pos = 0; pos < groups; ++pos) {
        int64_t g = rank[pos];
        if (indices) indices[pos] = first_[g];
        if (counts) counts[pos] = counts_[g];
        if (y)
          for (int64_t o = 0; o < outer_; ++o)
            std::memcpy(y + (o * groups + pos) * inner_, x + (o * slices_ + first_[g]) * inner_,
                        static_cast<size_t>(inner_) * size_);
      }
      if (a.hasOutput(2)) {
        int64_t *inv = a.out<int64_t>(2);
        // posOf[group] reuses counts_ (already written out).
        for (int64_t pos = 0; pos < groups; ++pos)
          counts_[rank[pos]] = pos;
        for (int64_t s = 0; s < slices_; ++s)
          inv[s] = counts_[inverse_[s]];
      }
    });
  }

private:
  std::string name_;
  DataType type_;
  size_t size_;
  bool sorted_;
  int64_t outer_, slices_, inner_, unique_;
  std::vector<int64_t> order_, inverse_, first_, counts_;
};

} // namespace

void registerReferenceGatherScatterKernels(KernelRegistry &r) {
  auto add = [&](const char *type, KernelFactory create) {
    r.add({"ai.onnx", type, KernelProvider::Reference, nullptr, create});
  };
  add("Gather", makeKernel<GatherKernel>);
  add("GatherElements", makeKernel<GatherElementsKernel>);
  add("GatherND", makeKernel<GatherNDKernel>);
  add("Scatter", makeKernel<ScatterElementsKernel>);
  add("ScatterElements", makeKernel<ScatterElementsKernel>);
  add("ScatterND", makeKernel<ScatterNDKernel>);
  add("OneHot", makeKernel<OneHotKernel>);
  add("NonZero", makeKernel<NonZeroKernel>);
  add("Compress", makeKernel<CompressKernel>);
  add("Unique", makeKernel<UniqueKernel>);
}

} // namespace popart::backend_cpu
