// Fast FLOAT16 kernels for the elementwise, activation, softmax, layer-normalisation and pooling ops
// and their gradients, and BFLOAT16 ones for the pools and MaxPoolGrad, through one mechanism
// instead of a kernel per op. oneDNN 2.6 has no f16 eltwise, softmax or layer norm on CPUs without
// fp16 units, and the reference kernels run these at about 0.03 GFLOP/s; its bf16 pools and pool
// gradient run on generic loops, and no oneDNN kernel applies a fused Relu gradient to MaxPoolGrad.
// Here the op's tensors are cut into blocks of rows: the leading k
// dimensions of the output merged into rows (every element a row for elementwise ops; the
// dimensions before the axis for the softmax and layer-norm ops), which each tensor either shares
// (blocked) or broadcasts over (whole: a bias, a scale, a scalar operand). Each block of every
// 16-bit input (one type per op) is widened into f32 in its thread's part of the scratch
// (vec::fromHalf or vec::fromBfloat16, exact), the best f32 kernel of the op's fp32 twin — oneDNN's
// primitive or a fast loop, created once per thread for the block shape — runs on it, and its f32
// result is narrowed once into the output (vec::toHalf or vec::toBfloat16, core/half.hpp's
// rounding), or written in place where the output is FLOAT. So no
// full-size f32 copy of any tensor is made, and a block's tensors stay in cache between the three
// passes. A whole output (LayerNormalizationGrad's dScale and dBias) sums its blocks' partial
// results in block order. Blocks run on the kernel's threads when the twin is a fast loop; a oneDNN
// twin runs them in turn on the calling thread, threading each block itself.

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "ir/graph.hpp"
#include <popart/error.hpp>

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// f32 bytes of a block's blocked tensors, per thread: small enough to stay in L2 between the
/// widening, the f32 kernel and the narrowing.
constexpr int64_t kBlockBytes = int64_t{256} * 1024;
/// The largest row (all blocked tensors' f32 bytes for one row) taken; longer rows stay with the
/// reference kernel rather than need a scratch this large per thread.
constexpr int64_t kMaxRowBytes = int64_t{4} * 1024 * 1024;
/// The largest f32 copy of the whole (broadcast) inputs.
constexpr int64_t kMaxWholeBytes = int64_t{4} * 1024 * 1024;

/// How an op's rows are found: elementwise ops may merge every dimension; the ops with an axis
/// only the dimensions before it, and their twin gets the axis renumbered; the pools and their
/// gradients only the batch (a row is an image, so the twin pools [rows, C, spatial...]).
enum class RowKind { Elementwise, BeforeAxis, Batch };

struct OpKind {
  RowKind rows = RowKind::Elementwise;
  /// The default of attribute "axis" (BeforeAxis), by opset: below 13 and from 13.
  int64_t axisBefore13 = -1, axisFrom13 = -1;
  /// Whether outputs not shared by the rows are sums over them (LayerNormalizationGrad's dScale
  /// and dBias); any other op with such an output is declined.
  bool wholeOutputsSumRows = false;
  /// Whether BFLOAT16 tensors are taken too (else FLOAT16 only): the pools and MaxPoolGrad, which
  /// oneDNN 2.6 runs in bf16 several times slower than the fast f32 twins (3.4 ms against 0.6 ms
  /// for the CNN's MaxPoolGrad with its Relu). oneDNN's bf16 eltwise, softmax and layer norm are
  /// native and faster than widening, so those ops stay FLOAT16 only.
  bool bf16 = false;
};

/// The ops this family runs, by (domain, type).
const std::vector<std::pair<std::pair<std::string, std::string>, OpKind>> &halfOps() {
  static const std::vector<std::pair<std::pair<std::string, std::string>, OpKind>> ops = [] {
    std::vector<std::pair<std::pair<std::string, std::string>, OpKind>> v;
    for (const char *t :
         {"Relu",        "LeakyRelu", "Elu",  "Tanh", "Sigmoid", "Exp", "Sqrt", "Abs", "Neg", "Softplus", "HardSwish",
          "HardSigmoid", "Erf",       "Clip", "Pow",  "Add",     "Sub", "Mul",  "Div", "Sum", "Mean"})
      v.push_back({{"ai.onnx", t}, OpKind{}});
    v.push_back({{"ai.graphcore", "Gelu"}, OpKind{}});
    v.push_back({{"ai.graphcore", "ActivationGrad"}, OpKind{}});
    for (const char *t : {"Softmax", "LogSoftmax"})
      v.push_back({{"ai.onnx", t}, OpKind{RowKind::BeforeAxis, 1, -1}});
    for (const char *t : {"SoftmaxGrad", "LogSoftmaxGrad"})
      v.push_back({{"ai.graphcore", t}, OpKind{RowKind::BeforeAxis, -1, -1}});
    v.push_back({{"ai.onnx", "LayerNormalization"}, OpKind{RowKind::BeforeAxis, -1, -1}});
    v.push_back({{"ai.graphcore", "LayerNormalizationGrad"}, OpKind{RowKind::BeforeAxis, -1, -1, true}});
    for (const char *t : {"MaxPool", "AveragePool", "GlobalAveragePool"})
      v.push_back({{"ai.onnx", t}, OpKind{RowKind::Batch, -1, -1, false, true}});
    v.push_back({{"ai.graphcore", "MaxPoolGrad"}, OpKind{RowKind::Batch, -1, -1, false, true}});
    return v;
  }();
  return ops;
}

const OpKind *opKind(const ir::Op &op) {
  for (const auto &[key, kind] : halfOps())
    if (key.first == op.domain && key.second == op.type) return &kind;
  return nullptr;
}

/// How one tensor of the op is cut.
struct Part {
  bool present = false;
  bool blocked = false; ///< one slice per row; else whole (read by every row, or summed over them)
  bool low = false;     ///< of the op's 16-bit type (converted); else FLOAT (used in place)
  int64_t rowElems = 0; ///< elements per row (blocked) or in all (whole)
  Shape tail;           ///< the dimensions after the rows (blocked) or the twin's shape (whole)
};

/// The blocks of an op: rows, the parts of its tensors, and the fp32 twin graphs for a full block
/// and for the last, shorter one.
struct BlockPlan {
  DataType low = DataType::FLOAT16; ///< the op's one 16-bit type
  int64_t rows = 0, blockRows = 0, blocks = 0, tailRows = 0;
  std::vector<Part> in, out;
  int64_t twinAxis = -1; ///< the renumbered axis (BeforeAxis), or -1
  bool sumWholeOutputs = false;
  /// Whether output 0 may overwrite a 16-bit input of its size. Not for MaxPoolGrad's dX over the
  /// pool's X: that grew the bf16 CNN's activation arena from 11.79 to 12.70 MB (the planner's gaps
  /// between lifetimes), with the same arena in fp16 either way.
  bool inPlace = true;
  int64_t rowBytes = 0; ///< f32 bytes of one row of all blocked tensors
};

/// Why \p op's tensors are not FLOAT and of one 16-bit type \p low (at least one): FLOAT16, or
/// BFLOAT16 where \p kind takes it; sets \p low.
std::string notLowOrFloat(const ir::Op &op, const OpKind &kind, DataType &low) {
  bool found = false;
  auto check = [&](const TensorInfo &t, const std::string &what) -> std::string {
    const DataType d = t.dataType();
    if (d == DataType::FLOAT) return {};
    if (d == DataType::BFLOAT16 && !kind.bf16) return what + " is BFLOAT16, left to oneDNN's native bf16 kernels";
    if (d != DataType::FLOAT16 && d != DataType::BFLOAT16)
      return what + " is " + toString(d) + (kind.bf16 ? ", not FLOAT16, BFLOAT16 or FLOAT" : ", not FLOAT16 or FLOAT");
    if (found && d != low) return what + " is " + toString(d) + " beside " + toString(low) + ": one 16-bit type per op";
    found = true;
    low = d;
    return {};
  };
  for (size_t i = 0; i < op.inputCount(); ++i)
    if (op.hasInput(i))
      if (std::string why = check(op.inInfo(i), "input " + std::to_string(i)); !why.empty()) return why;
  for (size_t i = 0; i < op.outputCount(); ++i)
    if (op.hasOutput(i))
      if (std::string why = check(op.outInfo(i), "output " + std::to_string(i)); !why.empty()) return why;
  if (!found) return kind.bf16 ? "no FLOAT16 or BFLOAT16 tensor" : "no FLOAT16 tensor";
  return {};
}

/// Cuts tensor \p t against the first \p k dimensions of the output shape \p outShape: blocked if
/// its own leading dimensions (aligned to the right) are those, whole if they are all 1 (and the
/// output's are not: with a single row the two are the same). False if neither.
bool cut(const TensorInfo &t, const Shape &outShape, size_t k, DataType low, Part &p) {
  const Shape &s = t.shape();
  const size_t r = outShape.size();
  if (s.size() > r) return false;
  const size_t pad = r - s.size(); // s's dimension d is the output's d + pad
  bool same = true, ones = true;
  for (size_t d = 0; d < k; ++d) {
    int64_t v = d < pad ? 1 : s[d - pad];
    same = same && v == outShape[d];
    ones = ones && v == 1;
  }
  p.present = true;
  p.low = t.dataType() == low;
  p.tail = Shape(s.begin() + static_cast<std::ptrdiff_t>(std::max(k, pad) - pad), s.end());
  p.rowElems = shapeElementCount(p.tail);
  if (same) {
    p.blocked = true;
    return true;
  }
  if (ones) {
    p.blocked = false;
    return true;
  }
  return false;
}

/// The plan of \p op, or why there is none. Blocks do not depend on the thread count, so that the
/// capability check sees the twin kernels that the kernel creates.
Support planBlocks(const ir::Op &op, BlockPlan &plan) {
  const OpKind *kind = opKind(op);
  if (!kind) return Support::no("not an op of the 16-bit block kernels");
  DataType low = DataType::FLOAT16;
  if (std::string why = notLowOrFloat(op, *kind, low); !why.empty()) return Support::no(why);
  const Shape &outShape = op.outInfo(0).shape();
  const auto r = static_cast<int64_t>(outShape.size());
  if (op.outInfo(0).elementCount() == 0) return Support::no("empty output");
  int64_t kMax = r, axis = -1;
  if (kind->rows == RowKind::BeforeAxis) {
    axis = op.attrs.getInt("axis", op.version < 13 ? kind->axisBefore13 : kind->axisFrom13);
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r) return Support::no("axis out of range");
    kMax = axis;
  }
  if (kind->rows == RowKind::Batch) kMax = 1;
  for (int64_t k = kMax; k >= 1; --k) {
    BlockPlan p;
    p.low = low;
    bool ok = true;
    p.in.resize(op.inputCount());
    p.out.resize(op.outputCount());
    for (size_t i = 0; ok && i < op.inputCount(); ++i)
      if (op.hasInput(i)) ok = cut(op.inInfo(i), outShape, static_cast<size_t>(k), low, p.in[i]);
    for (size_t i = 0; ok && i < op.outputCount(); ++i)
      if (op.hasOutput(i)) ok = cut(op.outInfo(i), outShape, static_cast<size_t>(k), low, p.out[i]);
    if (!ok || !p.out[0].blocked) continue;
    bool wholeOut = false;
    for (const Part &o : p.out)
      wholeOut = wholeOut || (o.present && !o.blocked);
    if (wholeOut && !kind->wholeOutputsSumRows) continue;
    p.sumWholeOutputs = wholeOut;
    p.inPlace = kind->rows != RowKind::Batch;
    p.rows = shapeElementCount(Shape(outShape.begin(), outShape.begin() + k));
    p.twinAxis = axis < 0 ? -1 : axis - k + 1;
    int64_t rowBytes = 0, wholeBytes = 0;
    for (const auto *parts : {&p.in, &p.out})
      for (const Part &t : *parts) {
        if (t.present && t.blocked) rowBytes += 4 * t.rowElems;
        if (t.present && !t.blocked) wholeBytes += 4 * t.rowElems;
      }
    if (rowBytes > kMaxRowBytes) return Support::no("rows of more than 4 MiB in f32");
    if (wholeBytes > kMaxWholeBytes) return Support::no("broadcast operands of more than 4 MiB in f32");
    p.rowBytes = rowBytes;
    p.blockRows = std::clamp<int64_t>(kBlockBytes / std::max<int64_t>(rowBytes, 1), 1, p.rows);
    if (p.blockRows >= 16) p.blockRows -= p.blockRows % 16; // whole vectors per block, where rows are elements
    p.blocks = (p.rows + p.blockRows - 1) / p.blockRows;
    p.tailRows = p.rows - (p.blocks - 1) * p.blockRows;
    plan = std::move(p);
    return Support::yes();
  }
  return Support::no("its tensors share no leading dimensions to cut into rows");
}

/// The fp32 twin of \p op for a block of \p rows rows: FLOAT tensors of the block's shapes,
/// constants widened exactly, the axis renumbered.
struct Twin {
  std::unique_ptr<ir::Graph> graph;
  ir::Op *op = nullptr;
};

Twin makeTwin(const ir::Op &op, const BlockPlan &plan, int64_t rows) {
  Twin twin;
  twin.graph = std::make_unique<ir::Graph>();
  ir::Graph &g = *twin.graph;
  if (op.graph) g.opsets() = op.graph->opsets();
  auto shapeOf = [rows](const Part &p) {
    if (!p.blocked) return p.tail;
    Shape s{rows};
    s.insert(s.end(), p.tail.begin(), p.tail.end());
    return s;
  };
  std::vector<TensorId> ins, outs;
  for (size_t i = 0; i < op.inputCount(); ++i) {
    if (!op.hasInput(i)) {
      ins.emplace_back();
      continue;
    }
    ins.push_back("in" + std::to_string(i));
    const ir::Tensor &t = op.input(i);
    TensorInfo info(DataType::FLOAT, shapeOf(plan.in[i]));
    if (t.isConst() && !plan.in[i].blocked)
      g.addConst(ins.back(), TensorData::fromDoubles(DataType::FLOAT, info.shape(), t.data()->toDoubleVector()));
    else
      g.addTensor(ins.back(), ir::TensorKind::Stream, info);
  }
  for (size_t i = 0; i < op.outputCount(); ++i)
    outs.push_back(op.hasOutput(i) ? "out" + std::to_string(i) : std::string());
  ir::Attributes attrs = op.attrs;
  if (plan.twinAxis >= 0) attrs.set("axis", plan.twinAxis);
  ir::Op &t = g.addOp(op.type, op.domain, op.version, op.name, std::move(attrs), ins, outs);
  t.fusion = op.fusion;
  t.def->setup(t);
  twin.op = &t;
  return twin;
}

/// Why the twin's outputs are not the block's shapes in FLOAT (empty if they are).
std::string twinMismatch(const ir::Op &twin, const BlockPlan &plan, int64_t rows) {
  for (size_t i = 0; i < twin.outputCount(); ++i) {
    const Part &p = plan.out[i];
    if (!p.present) continue;
    const TensorInfo &t = twin.outInfo(i);
    int64_t want = p.blocked ? rows * p.rowElems : p.rowElems;
    if (t.dataType() != DataType::FLOAT || t.elementCount() != want)
      return "the fp32 twin's output " + std::to_string(i) + " is " + t.toString();
  }
  return {};
}

/// The f32 kernel entry for the block twin: oneDNN's or a fast one, never the reference (which
/// would gain nothing over the FLOAT16 reference kernel) nor this family.
Support twinEntry(const ir::Op &twin, const KernelEntry *&entry) {
  KernelChoice choice = KernelRegistry::instance().choose(twin);
  entry = choice.entry;
  if (!entry || entry->provider == KernelProvider::Reference)
    return Support::no("no oneDNN or fast f32 kernel for the blocks (" + choice.explanation() + ")");
  return Support::yes();
}

Support supportsHalfBlocks(const ir::Op &op) {
  BlockPlan plan;
  if (Support s = planBlocks(op, plan); !s) return s;
  for (int64_t rows : {plan.blockRows, plan.tailRows}) {
    Twin twin;
    try {
      twin = makeTwin(op, plan, rows);
    } catch (const error &e) {
      return Support::no(std::string("its fp32 twin does not set up: ") + e.what());
    }
    if (std::string why = twinMismatch(*twin.op, plan, rows); !why.empty()) return Support::no(why);
    const KernelEntry *entry = nullptr;
    if (Support s = twinEntry(*twin.op, entry); !s) return s;
  }
  return Support::yes();
}

int64_t aligned64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

class HalfBlockKernel : public Kernel {
public:
  HalfBlockKernel(const ir::Op &op, const KernelContext &context) {
    if (Support s = planBlocks(op, plan_); !s) throw error(op.debugName(), ": no 16-bit block plan: ", s.reason);
    threads_ = static_cast<int>(std::min<int64_t>(std::max(context.threads, 1), plan_.blocks));
    const bool bf16 = plan_.low == DataType::BFLOAT16;
    widen_ = bf16 ? vec::fromBfloat16 : vec::fromHalf;
    narrow_ = bf16 ? vec::toBfloat16 : vec::toHalf;
    // One kernel per thread for full blocks (kernels keep per-run state such as oneDNN memory
    // handles), and one for the shorter last block, which one thread runs.
    fullTwin_ = makeTwin(op, plan_, plan_.blockRows);
    tailTwin_ = makeTwin(op, plan_, plan_.tailRows);
    const KernelEntry *fullEntry = nullptr, *tailEntry = nullptr;
    if (Support s = twinEntry(*fullTwin_.op, fullEntry); !s) throw error(op.debugName(), ": ", s.reason);
    if (Support s = twinEntry(*tailTwin_.op, tailEntry); !s) throw error(op.debugName(), ": ", s.reason);
    // oneDNN's primitives run on the thread that created them (its library scratchpad is per
    // thread: a layer-norm gradient run on a worker thread gave dBias 0), each block threaded by
    // oneDNN as for f32 ops; only the fast loops run blocks on threads of their own.
    if (fullEntry->provider != KernelProvider::Fast || tailEntry->provider != KernelProvider::Fast) threads_ = 1;
    int64_t twinScratch = 0;
    for (int i = 0; i < threads_; ++i) {
      full_.push_back(createKernel(*fullEntry, *fullTwin_.op, context));
      twinScratch = std::max(twinScratch, full_.back()->scratchBytes());
    }
    tail_ = createKernel(*tailEntry, *tailTwin_.op, context);
    twinScratch = std::max(twinScratch, tail_->scratchBytes());
    choice_ = std::to_string(plan_.blocks) + " f32 blocks of " + std::to_string(plan_.blockRows) + " rows on the " +
              kernelProviderName(fullEntry->provider) + " kernel";

    // Scratch: the f32 whole inputs (shared), the partial sums of whole outputs per block, then
    // per thread the f32 blocks of the converted blocked tensors and the twin's scratch.
    int64_t at = 0;
    auto place = [&at](int64_t bytes) {
      int64_t o = at;
      at += aligned64(bytes);
      return o;
    };
    wholeIn_.assign(plan_.in.size(), -1);
    for (size_t i = 0; i < plan_.in.size(); ++i)
      if (plan_.in[i].present && !plan_.in[i].blocked && plan_.in[i].low) wholeIn_[i] = place(4 * plan_.in[i].rowElems);
    partialOut_.assign(plan_.out.size(), -1);
    for (size_t i = 0; i < plan_.out.size(); ++i)
      if (plan_.out[i].present && !plan_.out[i].blocked)
        partialOut_[i] = place(4 * plan_.out[i].rowElems * plan_.blocks);
    shared_ = at;
    at = 0;
    blockIn_.assign(plan_.in.size(), -1);
    for (size_t i = 0; i < plan_.in.size(); ++i)
      if (plan_.in[i].present && plan_.in[i].blocked && plan_.in[i].low)
        blockIn_[i] = place(4 * plan_.in[i].rowElems * plan_.blockRows);
    blockOut_.assign(plan_.out.size(), -1);
    for (size_t i = 0; i < plan_.out.size(); ++i)
      if (plan_.out[i].present && plan_.out[i].blocked && plan_.out[i].low)
        blockOut_[i] = place(4 * plan_.out[i].rowElems * plan_.blockRows);
    twinScratch_ = place(twinScratch);
    perThread_ = at;
    scratchBytes_ = shared_ + perThread_ * threads_;
    args_.assign(static_cast<size_t>(threads_) + 1, {});
    for (auto &a : args_) {
      a.in.assign(plan_.in.size(), nullptr);
      a.out.assign(plan_.out.size(), nullptr);
    }
    // Output 0 may overwrite a FLOAT16 input of its size: a block is read (widened) before the
    // same block of the output is written, and the twin only ever sees the f32 copies.
    for (size_t i = 0; i < plan_.in.size() && plan_.inPlace && plan_.out[0].low; ++i)
      if (plan_.in[i].present && plan_.in[i].blocked && plan_.in[i].low &&
          plan_.in[i].rowElems == plan_.out[0].rowElems) {
        inPlace_ = static_cast<int>(i);
        break;
      }
  }

  int64_t scratchBytes() const override { return scratchBytes_; }
  int inPlaceInput() const override { return inPlace_; }
  std::string choice() const override { return choice_; }

  void run(const KernelArgs &a) override {
    // Outside a plan (tests, constant folding) the first run allocates memory of the kernel's own.
    if (!a.scratch && owned_.empty()) owned_.resize(static_cast<size_t>(scratchBytes_ + 64));
    auto *scratch = static_cast<uint8_t *>(a.scratch);
    if (!scratch) {
      auto address = reinterpret_cast<uintptr_t>(owned_.data());
      scratch = owned_.data() + (64 - address % 64) % 64;
    }
    for (size_t i = 0; i < plan_.in.size(); ++i)
      if (wholeIn_[i] >= 0 && a.hasInput(i))
        widen_(a.in<uint16_t>(i), reinterpret_cast<float *>(scratch + wholeIn_[i]), plan_.in[i].rowElems);
    const int64_t blocks = plan_.blocks;
    const int threads = static_cast<int>(std::min<int64_t>(threads_, blocks));
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
      {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        uint8_t *mine = scratch + shared_ + perThread_ * t;
        // Blocks in a fixed round-robin, so each is computed the same way whichever thread runs it.
        for (int64_t b = t; b < blocks; b += n)
          runBlock(a, scratch, mine, t, b);
      }
    } else {
      for (int64_t b = 0; b < blocks; ++b)
        runBlock(a, scratch, scratch + shared_, 0, b);
    }
    if (plan_.sumWholeOutputs) sumPartials(a, scratch);
  }

private:
  /// The buffers a twin kernel reads and writes for one block, kept per thread so that a run
  /// builds no vectors.
  struct BlockArgs {
    std::vector<const void *> in;
    std::vector<void *> out;
  };

  void runBlock(const KernelArgs &a, uint8_t *scratch, uint8_t *mine, int t, int64_t b) {
    const bool last = b == plan_.blocks - 1;
    const int64_t rows = last ? plan_.tailRows : plan_.blockRows, row0 = b * plan_.blockRows;
    BlockArgs &ba = args_[last ? static_cast<size_t>(threads_) : static_cast<size_t>(t)];
    for (size_t i = 0; i < plan_.in.size(); ++i) {
      const Part &p = plan_.in[i];
      if (!p.present || !a.hasInput(i)) {
        ba.in[i] = nullptr;
        continue;
      }
      if (!p.blocked) {
        ba.in[i] = wholeIn_[i] >= 0 ? static_cast<const void *>(scratch + wholeIn_[i]) : a.inputs[i];
      } else if (p.low) {
        auto *f = reinterpret_cast<float *>(mine + blockIn_[i]);
        widen_(a.in<uint16_t>(i) + row0 * p.rowElems, f, rows * p.rowElems);
        ba.in[i] = f;
      } else {
        ba.in[i] = a.in<float>(i) + row0 * p.rowElems;
      }
    }
    for (size_t i = 0; i < plan_.out.size(); ++i) {
      const Part &p = plan_.out[i];
      if (!p.present || !a.hasOutput(i))
        ba.out[i] = nullptr;
      else if (!p.blocked)
        ba.out[i] = reinterpret_cast<float *>(scratch + partialOut_[i]) + b * p.rowElems;
      else if (p.low)
        ba.out[i] = mine + blockOut_[i];
      else
        ba.out[i] = a.out<float>(i) + row0 * p.rowElems;
    }
    KernelArgs twinArgs{ba.in.data(), ba.in.size(), ba.out.data(), ba.out.size(), mine + twinScratch_};
    (last ? *tail_ : *full_[static_cast<size_t>(t)]).run(twinArgs);
    for (size_t i = 0; i < plan_.out.size(); ++i) {
      const Part &p = plan_.out[i];
      if (p.present && p.blocked && p.low && a.hasOutput(i))
        narrow_(static_cast<const float *>(ba.out[i]), a.out<uint16_t>(i) + row0 * p.rowElems, rows * p.rowElems);
    }
  }

  /// Each whole output as the sum of its blocks' partial results, in block order, in double.
  void sumPartials(const KernelArgs &a, uint8_t *scratch) const {
    for (size_t i = 0; i < plan_.out.size(); ++i) {
      const Part &p = plan_.out[i];
      if (!p.present || p.blocked || !a.hasOutput(i)) continue;
      const auto *partial = reinterpret_cast<const float *>(scratch + partialOut_[i]);
      for (int64_t e = 0; e < p.rowElems; ++e) {
        double s = 0;
        for (int64_t b = 0; b < plan_.blocks; ++b)
          s += static_cast<double>(partial[b * p.rowElems + e]);
        auto f = static_cast<float>(s);
        if (p.low)
          narrow_(&f, a.out<uint16_t>(i) + e, 1);
        else
          a.out<float>(i)[e] = f;
      }
    }
  }

  BlockPlan plan_;
  int threads_ = 1;
  Twin fullTwin_, tailTwin_;
  std::vector<std::unique_ptr<Kernel>> full_;
  std::unique_ptr<Kernel> tail_;
  std::vector<BlockArgs> args_; ///< per thread, and the last for the tail block
  std::vector<int64_t> wholeIn_, partialOut_, blockIn_, blockOut_;
  int64_t shared_ = 0, perThread_ = 0, twinScratch_ = 0, scratchBytes_ = 0;
  int inPlace_ = -1;
  std::string choice_;
  std::vector<uint8_t> owned_;
  void (*widen_)(const uint16_t *, float *, int64_t) = vec::fromHalf;
  void (*narrow_)(const float *, uint16_t *, int64_t) = vec::toHalf;
};

std::unique_ptr<Kernel> createHalfBlocks(const ir::Op &op, const KernelContext &context) {
  return std::make_unique<HalfBlockKernel>(op, context);
}

} // namespace

void registerFastHalfKernels(KernelRegistry &r) {
  for (const auto &[key, kind] : halfOps())
    r.add({key.first, key.second, KernelProvider::Fast, supportsHalfBlocks, createHalfBlocks});
}

} // namespace popart::backend_cpu
