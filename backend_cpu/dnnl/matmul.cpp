// oneDNN MatMul and Gemm, f32.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "core/log.hpp"
#include "core/tensordata.hpp"
#include "ir/ops/matmul_layout.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

bool supportsMatMul(const ir::Op &op) {
  if (op.inInfo(0).dataType() != DataType::FLOAT || op.inInfo(1).dataType() != DataType::FLOAT) return false;
  if (op.outInfo(0).elementCount() == 0) return false;
  size_t ra = op.inInfo(0).shape().size(), rb = op.inInfo(1).shape().size();
  return ra >= 1 && rb >= 1 && std::max(ra, rb) <= 12;
}

/// The f32 descriptor of logical matrix batch \p shape (padded to \p rank); \p transposed: the
/// buffer holds each matrix with its last two axes swapped, which the strides express.
memory::desc storedDesc(const Shape &shape, size_t rank, bool transposed) {
  memory::desc plain = dnnl_util::plainDesc(shape, rank);
  if (!transposed) return plain;
  memory::dims dims = plain.dims(), swapped = dims;
  std::swap(swapped[rank - 1], swapped[rank - 2]);
  memory::dims strides = dnnl_util::plainStrides(swapped);
  std::swap(strides[rank - 1], strides[rank - 2]);
  return memory::desc(dims, memory::data_type::f32, strides);
}

/// \p md with its last two axes swapped: the transposed view of the same bytes.
memory::desc transposedView(const memory::desc &md) {
  std::vector<int> perm(static_cast<size_t>(md.data.ndims));
  for (size_t i = 0; i < perm.size(); ++i)
    perm[i] = static_cast<int>(i);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return md.permute_axes(perm);
}

/// Bytes rounded up to oneDNN's 64-byte alignment.
int64_t aligned64(size_t bytes) { return static_cast<int64_t>((bytes + 63) / 64 * 64); }

/// \p s padded in front to \p rank axes of size 1, as a desc with its strides.
memory::desc stridedDesc(const ir::StridedShape &s, size_t rank) {
  memory::dims dims(rank, 1), strides(rank, shapeElementCount(s.shape));
  size_t pad = rank - s.shape.size();
  for (size_t j = pad; j < rank; ++j) {
    dims[j] = s.shape[j - pad];
    strides[j] = s.strides[j - pad];
  }
  return memory::desc(dims, memory::data_type::f32, strides);
}

MatMulOperands forcedOperands = MatMulOperands::Auto;

/// Whether \p md is a plain strided layout (no inner blocks). Packing constant weights into one
/// gains nothing: oneDNN's AVX2 gemm picks row-major for any weights, which ran the MLP's
/// transposed [1024, 1024] Gemm weights at half the speed of their stored layout (5.8 ms against
/// about 3 ms per 256-row product). A blocked choice (brgemm with AVX-512) is kept.
bool unblocked(const memory::desc &md) {
  return md.data.format_kind == dnnl_blocked && md.data.format_desc.blocking.inner_nblks == 0;
}

/// Products smaller than this (FLOPs) are run as stored: timing them would cost more than it saves.
constexpr double kTuneFlops = 1e8;
/// The gain another way must show over the stored one to be chosen; Pointwise copies no operand
/// (constant B is packed once, another B is a weights reorder far smaller than the product).
constexpr double kGain = 1.08, kPointwiseGain = 1.02;
/// The ways timed against the stored one, in order.
constexpr MatMulOperands kTimedWays[] = {MatMulOperands::FlippedA,         MatMulOperands::FlippedB,
                                         MatMulOperands::ShiftedB,         MatMulOperands::Pointwise,
                                         MatMulOperands::Swapped,          MatMulOperands::SwappedCopy,
                                         MatMulOperands::FlippedPointwise, MatMulOperands::Unpermuted};
/// ShiftedB's offset of B in the scratch: 16 bytes off oneDNN's 64-byte alignment.
constexpr int64_t kShift = 16;

/// The way remembered for \p key, or \p decide()'s, remembered: the timing runs once per shape and
/// configuration in a process (sessions of the same model reuse it).
MatMulOperands rememberedWay(const std::string &key, const std::function<MatMulOperands()> &decide) {
  static std::mutex mutex;
  static std::map<std::string, MatMulOperands> chosen;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = chosen.find(key);
  if (it != chosen.end()) return it->second;
  return chosen[key] = decide();
}

/// The tuning mode: forcedOperands unless it is Auto, then POPART_MATMUL_TUNING's (0: AsStored;
/// a, b, s, p, t, tc, ap, u: FlippedA, FlippedB, ShiftedB, Pointwise, Swapped, SwappedCopy,
/// FlippedPointwise, Unpermuted; else Auto, warning once about a value other than 1).
MatMulOperands tuningMode() {
  if (forcedOperands != MatMulOperands::Auto) return forcedOperands;
  const char *env = std::getenv("POPART_MATMUL_TUNING");
  std::string mode = env ? env : "";
  if (mode == "0") return MatMulOperands::AsStored;
  if (mode == "a") return MatMulOperands::FlippedA;
  if (mode == "b") return MatMulOperands::FlippedB;
  if (mode == "s") return MatMulOperands::ShiftedB;
  if (mode == "p") return MatMulOperands::Pointwise;
  if (mode == "t") return MatMulOperands::Swapped;
  if (mode == "tc") return MatMulOperands::SwappedCopy;
  if (mode == "ap") return MatMulOperands::FlippedPointwise;
  if (mode == "u") return MatMulOperands::Unpermuted;
  static const bool warned = [&] {
    if (!mode.empty() && mode != "1")
      logging::logger().warn("POPART_MATMUL_TUNING='{}' is not 0, 1, a, b, s, p, t, tc, ap or u; timing as for 1", mode);
    return true;
  }();
  (void)warned;
  return MatMulOperands::Auto;
}

/// Milliseconds of the fastest of three runs of \p f after one warm-up.
template <typename F> double fastestMs(F &&f) {
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, ms);
  }
  return best;
}

/// C[M, N] = A[M, K]·B[K, N] as oneDNN's 1×1 convolution: M pixels of K channels (row-major A is
/// the nhwc tensor [1, K, 1, M]) into N channels (row-major C), with B as the weights in the
/// layout oneDNN picks (constant B packed once, another B reordered into the scratch every run).
/// On AVX2 oneDNN 2.6 runs this jit_1x1 kernel at 190-198 GFLOP/s where its gemm runs the same
/// product at 163-187 (interleaved micro-benchmark on the AVX2 host: [256, 1024]·[1024, 1024]
/// 3.26 → 2.77 ms, [2048, 1024]·[1024, 256] 6.58 → 5.50 ms).
class PointwiseProduct {
public:
  struct Spec {
    int64_t m = 0, k = 0, n = 0;
    bool bTransposed = false;   ///< B stored as [N, K]
    bool constB = false;        ///< pack B once
    bool bias = false;          ///< a [N] bias, added first
    bool addBeforeRelu = false; ///< a [M, N] tensor added before the Relu (Gemm's C)
    bool relu = false;
    bool addAfter = false; ///< a [M, N] tensor added last (the residual)
    float scale = 1.f;     ///< applied first, after the bias (so never with one)
  };
  /// False if oneDNN has no optimised convolution for it (or refuses it).
  bool init(const Spec &s) {
    *this = PointwiseProduct(); // the argument caches name the memories of an earlier init
    auto &eng = dnnl_util::engine();
    using tag = memory::format_tag;
    memory::desc src({1, s.k, 1, s.m}, memory::data_type::f32, tag::nhwc);
    memory::desc dst({1, s.n, 1, s.m}, memory::data_type::f32, tag::nhwc);
    // (o, i) = (n, k): B[k, n] at k·N + n, or transposed at n·K + k.
    memory::desc stored({s.n, s.k, 1, 1}, memory::data_type::f32,
                        s.bTransposed ? memory::dims{s.k, 1, 1, 1} : memory::dims{1, s.n, 1, 1});
    memory::desc bias = s.bias ? memory::desc({s.n}, memory::data_type::f32, tag::a) : memory::desc();
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    post_ops po; // the scale as a post-op: oneDNN's jit 1×1 kernels take no f32 output scales
    if (s.scale != 1.f) po.append_eltwise(1.f, algorithm::eltwise_linear, s.scale, 0.f);
    auto add = [&] {
      addArg_ = DNNL_ARG_ATTR_MULTIPLE_POST_OP(po.len()) | DNNL_ARG_SRC_1;
      po.append_binary(algorithm::binary_add, dst);
    };
    if (s.addBeforeRelu) add();
    if (s.relu) po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
    if (s.addAfter) add();
    if (po.len() > 0) attr.set_post_ops(po);
    try {
      convolution_forward::primitive_desc pd(
          convolution_forward::desc(prop_kind::forward_inference, algorithm::convolution_direct, src,
                                    dnnl_util::anyLayout(stored), bias, dst, {1, 1}, {0, 0}, {0, 0}),
          attr, eng);
      dnnl_util::skipBrgconv(pd);
      if (dnnl_util::implIs(pd, "ref") || pd.src_desc() != src || pd.dst_desc() != dst) return false;
      prim_ = convolution_forward(pd);
      convScratch_ = memory(pd.scratchpad_desc(), eng);
      stored_ = memory(stored, eng, DNNL_MEMORY_NONE);
      if (s.constB) {
        packed_.init(stored_, pd.weights_desc(), true);
      } else {
        perRun_ = memory(pd.weights_desc(), eng, DNNL_MEMORY_NONE);
        if (pd.weights_desc() != stored) pack_ = dnnl_util::userScratchReorder(stored_, perRun_);
      }
    } catch (const dnnl::error &) {
      return false;
    }
    a_ = memory(src, eng, DNNL_MEMORY_NONE);
    c_ = memory(dst, eng, DNNL_MEMORY_NONE);
    add_ = memory(dst, eng, DNNL_MEMORY_NONE);
    if (s.bias) bias_ = memory(bias, eng, DNNL_MEMORY_NONE);
    hasAdd_ = s.addBeforeRelu || s.addAfter;
    return true;
  }
  explicit operator bool() const { return static_cast<bool>(prim_); }
  /// The weights reordered on every run (0 for constant B).
  int64_t scratchBytes() const { return pack_ ? static_cast<int64_t>(perRun_.get_desc().get_size()) : 0; }
  /// \p bias and \p add are null unless the spec has them; \p scratch holds scratchBytes().
  void run(const void *a, const void *b, const void *bias, const void *add, void *c, void *scratch) {
    a_.set_data_handle(const_cast<void *>(a));
    c_.set_data_handle(c);
    stored_.set_data_handle(const_cast<void *>(b));
    const memory *wt = &stored_;
    if (packed_) {
      wt = &packed_.get(stored_, b);
    } else if (pack_) {
      perRun_.set_data_handle(scratch);
      dnnl_util::execute(pack_, packArgs_, {{DNNL_ARG_FROM, stored_}, {DNNL_ARG_TO, perRun_}});
      wt = &perRun_;
    }
    if (bias_) bias_.set_data_handle(const_cast<void *>(bias));
    if (hasAdd_) add_.set_data_handle(const_cast<void *>(add));
    if (bias_ && hasAdd_)
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, *wt}, {DNNL_ARG_BIAS, bias_}, {DNNL_ARG_DST, c_},
                          {DNNL_ARG_SCRATCHPAD, convScratch_}, {addArg_, add_}});
    else if (bias_)
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, *wt}, {DNNL_ARG_BIAS, bias_}, {DNNL_ARG_DST, c_},
                          {DNNL_ARG_SCRATCHPAD, convScratch_}});
    else if (hasAdd_)
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, *wt}, {DNNL_ARG_DST, c_},
                          {DNNL_ARG_SCRATCHPAD, convScratch_}, {addArg_, add_}});
    else
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, *wt}, {DNNL_ARG_DST, c_},
                          {DNNL_ARG_SCRATCHPAD, convScratch_}});
  }

private:
  primitive prim_;
  reorder pack_;
  std::vector<dnnl_exec_arg_t> args_, packArgs_;
  memory a_, c_, add_, bias_, stored_, perRun_, convScratch_;
  dnnl_util::PackedWeights packed_;
  bool hasAdd_ = false;
  int addArg_ = 0;
};

class MatMulKernel : public Kernel {
public:
  explicit MatMulKernel(const ir::Op &op) {
    // The logical operands (popart_transA/B and popart_permA/B applied; matmul_layout.hpp).
    Shape a = ir::matMulOperand(op, 0).shape, b = ir::matMulOperand(op, 1).shape;
    bool ta = op.attrs.getInt("popart_transA", 0) != 0 && a.size() >= 2;
    bool tb = op.attrs.getInt("popart_transB", 0) != 0 && b.size() >= 2;
    if (a.size() == 1) a.insert(a.begin(), 1);
    if (b.size() == 1) b.push_back(1);
    size_t rank = std::max(a.size(), b.size());
    while (a.size() < rank)
      a.insert(a.begin(), 1);
    while (b.size() < rank)
      b.insert(b.begin(), 1);
    Shape y(rank);
    for (size_t i = 0; i + 2 < rank; ++i)
      y[i] = std::max(a[i], b[i]);
    y[rank - 2] = a[rank - 2];
    y[rank - 1] = b[rank - 1];
    auto mdA = storedDesc(a, rank, ta), mdB = storedDesc(b, rank, tb), mdY = dnnl_util::plainDesc(y, rank);
    const bool permuted = ir::matMulPermuted(op); // popart_permA/B/Y: every operand through its strides
    if (permuted) {
      // Unpermuted's plain layouts of the permuted tensors (transposes stay strides).
      if (op.attrs.has("popart_permA")) unpermuted_[0] = dnnl_util::plainDesc(a, rank);
      if (op.attrs.has("popart_permB")) unpermuted_[1] = dnnl_util::plainDesc(b, rank);
      if (op.attrs.has("popart_permY")) unpermuted_[2] = mdY;
      mdA = stridedDesc(ir::matMulOperand(op, 0), rank);
      mdB = stridedDesc(ir::matMulOperand(op, 1), rank);
      mdY = stridedDesc(ir::matMulResult(op), rank);
    }
    hasBias_ = op.hasInput(2); // fused by fuseMatMulBias: [N] broadcast over the rows
    memory::dims biasDims(rank, 1);
    biasDims.back() = y.back();
    memory::desc mdBias = hasBias_ ? dnnl_util::plainDesc(Shape(biasDims.begin(), biasDims.end()), rank) : memory::desc();
    primitive_attr attr;
    float scale = op.attrs.getFloat("popart_scale", 1.f); // fused by fuseMatMulScale (never with a bias)
    if (scale != 1.f) attr.set_output_scales(0, {scale});
    post_ops po;
    if (op.attrs.getString("popart_activation", "") == "Relu") // fused by fuseRelu, after the bias
      po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
    hasResidual_ = op.hasInput(3); // fused by fuseMatMulResidual: added last
    if (hasResidual_) {
      residualArg_ = DNNL_ARG_ATTR_MULTIPLE_POST_OP(po.len()) | DNNL_ARG_SRC_1;
      po.append_binary(algorithm::binary_add, mdY);
      r_ = memory(mdY, dnnl_util::engine(), DNNL_MEMORY_NONE);
    }
    if (po.len() > 0) attr.set_post_ops(po);
    attr_ = attr;
    // Constant weights (inference) in the layout oneDNN prefers, packed once.
    auto make = [&](const memory::desc &src, const memory::desc &weights) {
      return matmul::primitive_desc(matmul::desc(src, weights, mdBias, mdY), attr, dnnl_util::engine());
    };
    bool constB = op.input(1).isConst();
    auto pd = make(mdA, constB ? dnnl_util::anyLayout(mdB) : mdB);
    if (constB && (dnnl_util::implIs(pd, "ref") || unblocked(pd.weights_desc()))) pd = make(mdA, mdB);
    prim_ = matmul(pd);
    a_ = memory(mdA, dnnl_util::engine(), DNNL_MEMORY_NONE);
    b_ = memory(mdB, dnnl_util::engine(), DNNL_MEMORY_NONE);
    y_ = memory(mdY, dnnl_util::engine(), DNNL_MEMORY_NONE);
    if (hasBias_) bias_ = memory(mdBias, dnnl_util::engine(), DNNL_MEMORY_NONE);
    if (constB) packed_.init(b_, pd.weights_desc(), true);
    bool batched = shapeElementCount(y) != y[rank - 1] * y[rank - 2];
    reorderable_ = !constB && !batched && !permuted;
    bool oneB = shapeElementCount(b) == b[rank - 1] * b[rank - 2];
    if (oneB && !permuted) { // a 1×1 convolution over all of A's rows applies (PointwiseProduct), A row-major first
      pointwiseFlipsA_ = ta;
      pointwiseSpec_.m = shapeElementCount(y) / y[rank - 1];
      pointwiseSpec_.k = a[rank - 1];
      pointwiseSpec_.n = y[rank - 1];
      pointwiseSpec_.bTransposed = tb;
      pointwiseSpec_.constB = constB;
      pointwiseSpec_.bias = hasBias_;
      pointwiseSpec_.relu = op.attrs.getString("popart_activation", "") == "Relu";
      pointwiseSpec_.addAfter = hasResidual_;
      pointwiseSpec_.scale = scale;
    }
    if (reorderable_ || pointwiseSpec_.m > 0 || permuted) chooseOperands(op, a, b, rank, ta, tb, make);
  }
  int64_t scratchBytes() const override {
    return operands_ == MatMulOperands::FlippedA   ? static_cast<int64_t>(a_.get_desc().get_size())
           : operands_ == MatMulOperands::FlippedB ? static_cast<int64_t>(b_.get_desc().get_size())
           : operands_ == MatMulOperands::ShiftedB  ? static_cast<int64_t>(b_.get_desc().get_size()) + kShift
           : operands_ == MatMulOperands::Pointwise ? pointwise_.scratchBytes()
           : operands_ == MatMulOperands::FlippedPointwise
               ? aligned64(a_.get_desc().get_size()) + pointwise_.scratchBytes()
           : operands_ == MatMulOperands::Unpermuted ? unpermutedOffset_[3]
           : swapped()                               ? swapCopyOffset_ + (operands_ == MatMulOperands::SwappedCopy
                                                                            ? aligned64(b_.get_desc().get_size())
                                                                            : 0)
                                                    : 0;
  }
  void run(const KernelArgs &args) override {
    a_.set_data_handle(const_cast<void *>(args.inputs[0]));
    b_.set_data_handle(const_cast<void *>(args.inputs[1]));
    y_.set_data_handle(args.outputs[0]);
    if (hasBias_) bias_.set_data_handle(const_cast<void *>(args.inputs[2]));
    if (hasResidual_) r_.set_data_handle(const_cast<void *>(args.inputs[3]));
    if (operands_ == MatMulOperands::Pointwise && (args.scratch || pointwise_.scratchBytes() == 0)) {
      pointwise_.run(args.inputs[0], args.inputs[1], hasBias_ ? args.inputs[2] : nullptr,
                     hasResidual_ ? args.inputs[3] : nullptr, args.outputs[0], args.scratch);
      return;
    }
    if (operands_ == MatMulOperands::Unpermuted && args.scratch) {
      auto *scratch = static_cast<uint8_t *>(args.scratch);
      const memory *src = &a_, *wt = &b_, *dst = &y_;
      if (plainA_) {
        plainA_.set_data_handle(scratch + unpermutedOffset_[0]);
        dnnl_util::execute(reorderA_, reorderAArgs_, {{DNNL_ARG_FROM, a_}, {DNNL_ARG_TO, plainA_}});
        src = &plainA_;
      }
      if (plainB_) {
        plainB_.set_data_handle(scratch + unpermutedOffset_[1]);
        dnnl_util::execute(reorderB_, reorderBArgs_, {{DNNL_ARG_FROM, b_}, {DNNL_ARG_TO, plainB_}});
        wt = &plainB_;
      }
      if (plainY_) {
        plainY_.set_data_handle(scratch + unpermutedOffset_[2]);
        dst = &plainY_;
      }
      product(reordered_, reorderedArgs_, *src, *wt, *dst); // no residual (buildUnpermuted)
      if (plainY_) dnnl_util::execute(reorderY_, reorderYArgs_, {{DNNL_ARG_FROM, plainY_}, {DNNL_ARG_TO, y_}});
      return;
    }
    if (operands_ == MatMulOperands::FlippedPointwise && args.scratch) {
      auto *scratch = static_cast<uint8_t *>(args.scratch);
      scratchA_.set_data_handle(scratch);
      dnnl_util::execute(reorder_, reorderArgs_, {{DNNL_ARG_FROM, a_}, {DNNL_ARG_TO, scratchA_}});
      pointwise_.run(scratch, args.inputs[1], hasBias_ ? args.inputs[2] : nullptr,
                     hasResidual_ ? args.inputs[3] : nullptr, args.outputs[0],
                     scratch + aligned64(a_.get_desc().get_size()));
      return;
    }
    if (swapped() && args.scratch) {
      auto *scratch = static_cast<uint8_t *>(args.scratch);
      bT_.set_data_handle(const_cast<void *>(args.inputs[1]));
      aT_.set_data_handle(const_cast<void *>(args.inputs[0]));
      yT_.set_data_handle(scratch);
      yTasY_.set_data_handle(scratch);
      const memory *src = &bT_;
      if (operands_ == MatMulOperands::SwappedCopy) {
        bTcopy_.set_data_handle(scratch + swapCopyOffset_);
        dnnl_util::execute(reorder_, reorderArgs_, {{DNNL_ARG_FROM, bT_}, {DNNL_ARG_TO, bTcopy_}});
        src = &bTcopy_;
      }
      product(reordered_, reorderedArgs_, *src, aT_, yT_); // no bias or residual (buildSwapped)
      dnnl_util::execute(swapOut_, swapOutArgs_, {{DNNL_ARG_FROM, yTasY_}, {DNNL_ARG_TO, y_}});
      return;
    }
    if (operands_ == MatMulOperands::ShiftedB && args.scratch) {
      void *shifted = static_cast<uint8_t *>(args.scratch) + kShift;
      std::memcpy(shifted, args.inputs[1], b_.get_desc().get_size());
      scratchB_.set_data_handle(shifted);
      product(prim_, reorderedArgs_, a_, scratchB_);
      return;
    }
    if (operands_ != MatMulOperands::AsStored && args.scratch) {
      bool flippedA = operands_ == MatMulOperands::FlippedA;
      memory &scratch = flippedA ? scratchA_ : scratchB_;
      scratch.set_data_handle(args.scratch);
      dnnl_util::execute(reorder_, reorderArgs_, {{DNNL_ARG_FROM, flippedA ? a_ : b_}, {DNNL_ARG_TO, scratch}});
      product(reordered_, reorderedArgs_, flippedA ? scratch : a_, flippedA ? b_ : scratch);
      return;
    }
    product(prim_, args_, a_, packed_ ? packed_.get(b_, args.inputs[1]) : b_);
  }

private:
  /// Which operand, if any, to reorder into the scratch first, or whether to run as a 1×1
  /// convolution (see MatMulOperands). Auto times each way that applies on zeroed buffers once
  /// per configuration.
  template <typename Make>
  void chooseOperands(const ir::Op &op, const Shape &a, const Shape &b, size_t rank, bool ta, bool tb, Make &&make) {
    MatMulOperands choice = tuningMode();
    double flops = 2.0 * static_cast<double>(shapeElementCount(a)) * static_cast<double>(b.back());
    if (choice == MatMulOperands::AsStored || (choice == MatMulOperands::Auto && flops < kTuneFlops)) return;
    memory::desc flippedA = storedDesc(a, rank, !ta), flippedB = storedDesc(b, rank, !tb);
    auto build = [&](MatMulOperands way) {
      reorderedArgs_.clear(); // they name the previous way's memories
      reorderArgs_.clear();
      if (way == MatMulOperands::Unpermuted) return buildUnpermuted();
      if (way == MatMulOperands::Pointwise)
        return pointwiseSpec_.m > 0 && !pointwiseFlipsA_ && pointwise_.init(pointwiseSpec_);
      if (way == MatMulOperands::FlippedPointwise) {
        if (pointwiseSpec_.m == 0 || !pointwiseFlipsA_ || !pointwise_.init(pointwiseSpec_)) return false;
        scratchA_ = memory(flippedA, dnnl_util::engine(), DNNL_MEMORY_NONE);
        reorder_ = dnnl_util::userScratchReorder(a_, scratchA_);
        return true;
      }
      if (!reorderable_) return false;
      if (way == MatMulOperands::ShiftedB) {
        scratchB_ = memory(b_.get_desc(), dnnl_util::engine(), DNNL_MEMORY_NONE);
        return true;
      }
      if (way == MatMulOperands::Swapped || way == MatMulOperands::SwappedCopy) return buildSwapped(way);
      memory::desc mdA = way == MatMulOperands::FlippedA ? flippedA : a_.get_desc();
      memory::desc mdB = way == MatMulOperands::FlippedB ? flippedB : b_.get_desc();
      auto pd = make(mdA, mdB);
      if (dnnl_util::implIs(pd, "ref")) return false;
      reordered_ = matmul(pd);
      memory &scratch = way == MatMulOperands::FlippedA ? scratchA_ : scratchB_;
      scratch = memory(way == MatMulOperands::FlippedA ? flippedA : flippedB, dnnl_util::engine(), DNNL_MEMORY_NONE);
      const memory &from = way == MatMulOperands::FlippedA ? a_ : b_;
      reorder_ = dnnl_util::userScratchReorder(from, scratch);
      return true;
    };
    if (choice == MatMulOperands::Auto) {
      std::string key = toString(a) + (ta ? "T" : "") + "x" + toString(b) + (tb ? "T" : "") + (hasBias_ ? "+bias" : "") +
                        (hasResidual_ ? "+residual" : "") + op.attrs.getString("popart_activation", "") +
                        std::to_string(op.attrs.getFloat("popart_scale", 1.f)) + (op.input(1).isConst() ? "const" : "");
      for (const char *perm : {"popart_permA", "popart_permB", "popart_permY"})
        if (op.attrs.has(perm)) key += std::string(" ") + (perm + 7) + toString(Shape(op.attrs.getInts(perm)));
      choice = rememberedWay(key, [&] { return timeOperands(build); });
      logging::logger().debug("{}: {} operands for {}", op.debugName(),
                              choice == MatMulOperands::FlippedA     ? "flipped A"
                              : choice == MatMulOperands::FlippedB ? "flipped B"
                              : choice == MatMulOperands::ShiftedB  ? "shifted B"
                              : choice == MatMulOperands::Pointwise ? "1x1 convolution"
                              : choice == MatMulOperands::Swapped   ? "swapped"
                              : choice == MatMulOperands::SwappedCopy ? "swapped, B copied,"
                              : choice == MatMulOperands::FlippedPointwise ? "flipped A, 1x1 convolution"
                              : choice == MatMulOperands::Unpermuted ? "unpermuted"
                                                                    : "stored",
                              key);
    }
    bool applied = choice != MatMulOperands::AsStored && build(choice);
    if (!applied || (choice != MatMulOperands::Pointwise && choice != MatMulOperands::FlippedPointwise))
      pointwise_ = PointwiseProduct(); // its packed weights
    if (applied) operands_ = choice;
  }

  /// Times the product as stored and each other way that applies; the fastest if it beats the
  /// stored way by kGain (the fastest of three runs each; a smaller gain could be noise).
  template <typename Build> MatMulOperands timeOperands(Build &&build) {
    // 64-byte aligned like the arena and the variables: oneDNN's AVX2 gemm takes another path
    // for a B that is not (the MLP's dY·W ran in 3.2 ms with B 16 bytes off, 5.8 ms aligned), so
    // timing on malloc'd buffers chose wrongly.
    size_t bytesA = a_.get_desc().get_size(), bytesB = b_.get_desc().get_size(), bytesY = y_.get_desc().get_size();
    auto bufA = alignedBytes(bytesA), bufB = alignedBytes(bytesB), bufY = alignedBytes(bytesY);
    auto bias = alignedBytes(hasBias_ ? bias_.get_desc().get_size() : 1), residual = alignedBytes(hasResidual_ ? bytesY : 1);
    const void *ins[4] = {bufA.get(), bufB.get(), hasBias_ ? bias.get() : nullptr, hasResidual_ ? residual.get() : nullptr};
    void *outs[1] = {bufY.get()};
    KernelArgs args{ins, 4, outs, 1, nullptr};
    operands_ = MatMulOperands::AsStored;
    double stored = fastestMs([&] { run(args); });
    MatMulOperands best = MatMulOperands::AsStored;
    double bestMs = stored;
    for (MatMulOperands way : kTimedWays) {
      if (!build(way)) continue;
      operands_ = way;
      auto scratch = alignedBytes(static_cast<size_t>(std::max<int64_t>(scratchBytes(), 1))); // as the plan's
      args.scratch = scratch.get();
      double ms = fastestMs([&] { run(args); });
      logging::logger().trace("MatMul operands: stored {:.3f} ms, way {} {:.3f} ms", stored, static_cast<int>(way), ms);
      double gain = way == MatMulOperands::Pointwise ? kPointwiseGain : kGain;
      if (ms * gain < stored && ms < bestMs) {
        best = way;
        bestMs = ms;
      }
    }
    operands_ = MatMulOperands::AsStored;
    return best;
  }

  /// Unpermuted: the operands that popart_permA/B permute copied into plain layouts, the product
  /// into a plain buffer and copied into the permuted output (for a oneDNN whose strided product
  /// is slower than the copies). Not with a residual (read in the output's permuted layout).
  bool buildUnpermuted() {
    bool any = !unpermuted_[0].is_zero() || !unpermuted_[1].is_zero() || !unpermuted_[2].is_zero();
    if (!any || hasResidual_) return false;
    memory::desc src = unpermuted_[0].is_zero() ? a_.get_desc() : unpermuted_[0];
    memory::desc wt = unpermuted_[1].is_zero() ? b_.get_desc() : unpermuted_[1];
    memory::desc dst = unpermuted_[2].is_zero() ? y_.get_desc() : unpermuted_[2];
    matmul::primitive_desc pd;
    try {
      pd = matmul::primitive_desc(matmul::desc(src, wt, hasBias_ ? bias_.get_desc() : memory::desc(), dst), attr_,
                                  dnnl_util::engine());
    } catch (const dnnl::error &) {
      return false;
    }
    if (dnnl_util::implIs(pd, "ref")) return false;
    reordered_ = matmul(pd);
    reorderAArgs_.clear();
    reorderBArgs_.clear();
    reorderYArgs_.clear();
    plainA_ = plainB_ = plainY_ = memory();
    int64_t offset = 0;
    memory *plain[3] = {&plainA_, &plainB_, &plainY_};
    for (size_t i = 0; i < 3; ++i) {
      unpermutedOffset_[i] = offset;
      if (unpermuted_[i].is_zero()) continue;
      *plain[i] = memory(unpermuted_[i], dnnl_util::engine(), DNNL_MEMORY_NONE);
      offset += aligned64(unpermuted_[i].get_size());
    }
    unpermutedOffset_[3] = offset;
    if (plainA_) reorderA_ = dnnl_util::userScratchReorder(a_, plainA_);
    if (plainB_) reorderB_ = dnnl_util::userScratchReorder(b_, plainB_);
    if (plainY_) reorderY_ = dnnl_util::userScratchReorder(plainY_, y_);
    return true;
  }

  bool swapped() const { return operands_ == MatMulOperands::Swapped || operands_ == MatMulOperands::SwappedCopy; }

  /// Swapped ways: Yᵀ = Bᵀ·Aᵀ into the scratch (Bᵀ as a view of B, or for SwappedCopy a row-major
  /// copy of it after Yᵀ), then transposed into Y. Not with a bias (per row of Yᵀ, which oneDNN
  /// 2.6 leaves to its reference matmul) or a residual (the post-op would read it transposed).
  bool buildSwapped(MatMulOperands way) {
    if (hasBias_ || hasResidual_) return false;
    memory::desc src = transposedView(b_.get_desc()), wts = transposedView(a_.get_desc());
    memory::dims yDims = y_.get_desc().dims(), yTDims = yDims;
    std::swap(yTDims[yTDims.size() - 1], yTDims[yTDims.size() - 2]);
    memory::desc yT(yTDims, memory::data_type::f32, dnnl_util::plainStrides(yTDims));
    memory::desc srcCopy(src.dims(), memory::data_type::f32, dnnl_util::plainStrides(src.dims()));
    bool copy = way == MatMulOperands::SwappedCopy;
    matmul::primitive_desc pd(matmul::desc(copy ? srcCopy : src, wts, yT), attr_, dnnl_util::engine());
    if (dnnl_util::implIs(pd, "ref")) return false;
    reordered_ = matmul(pd);
    bT_ = memory(src, dnnl_util::engine(), DNNL_MEMORY_NONE);
    aT_ = memory(wts, dnnl_util::engine(), DNNL_MEMORY_NONE);
    yT_ = memory(yT, dnnl_util::engine(), DNNL_MEMORY_NONE);
    yTasY_ = memory(transposedView(yT), dnnl_util::engine(), DNNL_MEMORY_NONE);
    swapOutArgs_.clear();
    swapOut_ = dnnl_util::userScratchReorder(yTasY_, y_);
    swapCopyOffset_ = aligned64(yT.get_size());
    if (copy) {
      bTcopy_ = memory(srcCopy, dnnl_util::engine(), DNNL_MEMORY_NONE);
      reorder_ = dnnl_util::userScratchReorder(bT_, bTcopy_);
    }
    return true;
  }

  /// Runs \p prim from \p src and \p wt into \p dst (y_ unless given), with the bias and
  /// residual memories if any.
  void product(const primitive &prim, std::vector<dnnl_exec_arg_t> &cache, const memory &src, const memory &wt) {
    product(prim, cache, src, wt, y_);
  }
  void product(const primitive &prim, std::vector<dnnl_exec_arg_t> &cache, const memory &src, const memory &wt,
               const memory &dst) {
    if (hasBias_ && hasResidual_)
      dnnl_util::execute(prim, cache,
                         {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_BIAS, bias_}, {DNNL_ARG_DST, dst},
                          {residualArg_, r_}});
    else if (hasBias_)
      dnnl_util::execute(prim, cache,
                         {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_BIAS, bias_}, {DNNL_ARG_DST, dst}});
    else if (hasResidual_)
      dnnl_util::execute(prim, cache,
                         {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_DST, dst}, {residualArg_, r_}});
    else
      dnnl_util::execute(prim, cache, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_DST, dst}});
  }

  bool hasBias_ = false, hasResidual_ = false;
  int residualArg_ = 0;
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory a_, b_, y_, bias_, r_;
  MatMulOperands operands_ = MatMulOperands::AsStored;
  primitive reordered_, reorder_;
  std::vector<dnnl_exec_arg_t> reorderedArgs_, reorderArgs_;
  memory scratchA_, scratchB_;
  primitive_attr attr_;                   ///< the product's output scale and post-ops
  memory bT_, aT_, yT_, yTasY_, bTcopy_; ///< Swapped ways (buildSwapped)
  primitive swapOut_;
  std::vector<dnnl_exec_arg_t> swapOutArgs_;
  int64_t swapCopyOffset_ = 0;
  memory::desc unpermuted_[3];          ///< plain layouts of the permuted A, B, Y (empty: as stored)
  memory plainA_, plainB_, plainY_;    ///< Unpermuted's copies (buildUnpermuted)
  primitive reorderA_, reorderB_, reorderY_;
  std::vector<dnnl_exec_arg_t> reorderAArgs_, reorderBArgs_, reorderYArgs_;
  int64_t unpermutedOffset_[4] = {0, 0, 0, 0}; ///< of A, B, Y in the scratch, and its size
  dnnl_util::PackedWeights packed_;
  bool reorderable_ = false;          ///< FlippedA, FlippedB and ShiftedB apply
  PointwiseProduct::Spec pointwiseSpec_; ///< m > 0: Pointwise (A row-major) or FlippedPointwise applies
  bool pointwiseFlipsA_ = false;         ///< A is stored transposed: FlippedPointwise, not Pointwise
  PointwiseProduct pointwise_;
};

bool supportsGemm(const ir::Op &op) {
  if (!dnnl_util::inputsFloat(op)) return false;
  // beta other than 1 with C is left to the reference kernel (no exact oneDNN post-op for it).
  if (op.hasInput(2) && op.attrs.getFloat("beta", 1.f) != 1.f) return false;
  return op.outInfo(0).elementCount() > 0;
}

/// Y = alpha * op(A) op(B) + beta * C: transposes are strides, C is a broadcast binary post-op.
class GemmKernel : public Kernel {
public:
  explicit GemmKernel(const ir::Op &op) {
    bool ta = op.attrs.getInt("transA", 0) != 0, tb = op.attrs.getInt("transB", 0) != 0;
    float alpha = op.attrs.getFloat("alpha", 1.f), beta = op.attrs.getFloat("beta", 1.f);
    int64_t m = op.outInfo(0).dim(0), n = op.outInfo(0).dim(1);
    int64_t k = ta ? op.inInfo(0).dim(0) : op.inInfo(0).dim(1);
    memory::desc mdA({m, k}, memory::data_type::f32, ta ? memory::dims{1, m} : memory::dims{k, 1});
    memory::desc mdB({k, n}, memory::data_type::f32, tb ? memory::dims{1, k} : memory::dims{n, 1});
    memory::desc mdY({m, n}, memory::data_type::f32, memory::dims{n, 1});
    primitive_attr attr;
    post_ops po;
    hasC_ = op.hasInput(2) && beta != 0.f;
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    if (hasC_) {
      mdC_ = dnnl_util::plainDesc(op.inInfo(2).shape(), 2);
      po.append_binary(algorithm::binary_add, mdC_);
    }
    if (op.attrs.getString("popart_activation", "") == "Relu") // fused by fuseRelu, after C
      po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
    if (po.len() > 0) attr.set_post_ops(po);
    auto make = [&](const memory::desc &weights) {
      return matmul::primitive_desc(matmul::desc(mdA, weights, mdY), attr, dnnl_util::engine());
    };
    bool constB = op.input(1).isConst(); // inference: packed once in oneDNN's layout
    auto pd = make(constB ? dnnl_util::anyLayout(mdB) : mdB);
    if (constB && (dnnl_util::implIs(pd, "ref") || unblocked(pd.weights_desc()))) pd = make(mdB);
    prim_ = matmul(pd);
    a_ = memory(mdA, dnnl_util::engine(), DNNL_MEMORY_NONE);
    b_ = memory(mdB, dnnl_util::engine(), DNNL_MEMORY_NONE);
    y_ = memory(mdY, dnnl_util::engine(), DNNL_MEMORY_NONE);
    if (hasC_) c_ = memory(mdC_, dnnl_util::engine(), DNNL_MEMORY_NONE);
    if (constB) packed_.init(b_, pd.weights_desc(), true);
    if (!ta) choosePointwise(op, m, k, n, tb, constB, alpha);
  }
  int64_t scratchBytes() const override { return pointwise_ ? pointwise_.scratchBytes() : 0; }
  void run(const KernelArgs &args) override {
    if (pointwise_ && (args.scratch || pointwise_.scratchBytes() == 0)) {
      pointwise_.run(args.inputs[0], args.inputs[1], hasC_ ? args.inputs[2] : nullptr, hasC_ ? args.inputs[2] : nullptr,
                     args.outputs[0], args.scratch);
      return;
    }
    a_.set_data_handle(const_cast<void *>(args.inputs[0]));
    b_.set_data_handle(const_cast<void *>(args.inputs[1]));
    y_.set_data_handle(args.outputs[0]);
    const memory &wt = packed_ ? packed_.get(b_, args.inputs[1]) : b_;
    if (hasC_) {
      c_.set_data_handle(const_cast<void *>(args.inputs[2]));
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, a_},
                          {DNNL_ARG_WEIGHTS, wt},
                          {DNNL_ARG_DST, y_},
                          {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, c_}});
    } else {
      dnnl_util::execute(prim_, args_, {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_DST, y_}});
    }
  }

private:
  /// Whether to run as a 1×1 convolution (PointwiseProduct; MatMulOperands): C of [N] or [1, N]
  /// is its bias (alpha 1 only: oneDNN would scale it), [M, N] is added before the Relu.
  void choosePointwise(const ir::Op &op, int64_t m, int64_t k, int64_t n, bool tb, bool constB, float alpha) {
    MatMulOperands mode = tuningMode();
    if (mode != MatMulOperands::Auto && mode != MatMulOperands::Pointwise) return;
    if (mode == MatMulOperands::Auto && 2.0 * static_cast<double>(m * n * k) < kTuneFlops) return;
    PointwiseProduct::Spec spec;
    spec.m = m, spec.k = k, spec.n = n, spec.bTransposed = tb, spec.constB = constB, spec.scale = alpha;
    spec.relu = op.attrs.getString("popart_activation", "") == "Relu";
    if (hasC_) {
      const Shape &c = op.inInfo(2).shape();
      bool row = shapeElementCount(c) == n && (c.size() == 1 || (c.size() == 2 && c[0] == 1));
      if (row && alpha == 1.f)
        spec.bias = true;
      else if (c == Shape{m, n})
        spec.addBeforeRelu = true;
      else
        return;
    }
    if (!pointwise_.init(spec)) return;
    if (mode == MatMulOperands::Pointwise) return;
    std::string key = "Gemm " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) + (tb ? "T" : "") +
                      (spec.bias ? "+bias" : spec.addBeforeRelu ? "+C" : "") + (spec.relu ? "Relu" : "") +
                      std::to_string(alpha) + (constB ? "const" : "");
    MatMulOperands way = rememberedWay(key, [&] {
      // On 64-byte aligned buffers, as in the plan (see MatMulKernel::timeOperands).
      auto bufA = alignedBytes(a_.get_desc().get_size()), bufB = alignedBytes(b_.get_desc().get_size());
      auto bufC = alignedBytes(hasC_ ? mdC_.get_size() : 1), bufY = alignedBytes(y_.get_desc().get_size());
      auto scratch = alignedBytes(static_cast<size_t>(std::max<int64_t>(pointwise_.scratchBytes(), 1)));
      const void *ins[3] = {bufA.get(), bufB.get(), hasC_ ? bufC.get() : nullptr};
      void *outs[1] = {bufY.get()};
      KernelArgs args{ins, 3, outs, 1, nullptr};
      PointwiseProduct pointwise = std::move(pointwise_);
      double stored = fastestMs([&] { run(args); });
      pointwise_ = std::move(pointwise);
      args.scratch = scratch.get();
      double ms = fastestMs([&] { run(args); });
      logging::logger().trace("Gemm: stored {:.3f} ms, 1x1 convolution {:.3f} ms", stored, ms);
      return ms * kPointwiseGain < stored ? MatMulOperands::Pointwise : MatMulOperands::AsStored;
    });
    logging::logger().debug("{}: {} for {}", op.debugName(),
                            way == MatMulOperands::Pointwise ? "1x1 convolution" : "stored", key);
    if (way != MatMulOperands::Pointwise) pointwise_ = PointwiseProduct();
  }

  PointwiseProduct pointwise_; ///< initialised: the product runs as a 1×1 convolution
  dnnl_util::PackedWeights packed_;
  bool hasC_ = false;
  memory::desc mdC_;
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory a_, b_, y_, c_;
};

} // namespace

void setMatMulOperands(MatMulOperands choice) { forcedOperands = choice; }

void registerDnnlMatMulKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "MatMul", KernelProvider::Dnnl, supportsMatMul, makeKernel<MatMulKernel>});
  r.add({"ai.onnx", "Gemm", KernelProvider::Dnnl, supportsGemm, makeKernel<GemmKernel>});
}

} // namespace popart::backend_cpu
