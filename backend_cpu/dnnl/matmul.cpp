// oneDNN MatMul and Gemm, f32.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "core/log.hpp"
#include "core/tensordata.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
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

MatMulOperands forcedOperands = MatMulOperands::Auto;

/// Whether \p md is a plain strided layout (no inner blocks). Packing constant weights into one
/// gains nothing: oneDNN's AVX2 gemm picks row-major for any weights, which ran the MLP's
/// transposed [1024, 1024] Gemm weights at half the speed of their stored layout (5.8 ms against
/// about 3 ms per 256-row product). A blocked choice (brgemm with AVX-512) is kept.
bool unblocked(const memory::desc &md) {
  return md.data.format_kind == dnnl_blocked && md.data.format_desc.blocking.inner_nblks == 0;
}

/// Products smaller than this (FLOPs) are run as stored: timing them would cost more than it saves.
constexpr double kTuneFlops = 2e8;
/// ShiftedB's offset of B in the scratch: 16 bytes off oneDNN's 64-byte alignment.
constexpr int64_t kShift = 16;

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

class MatMulKernel : public Kernel {
public:
  explicit MatMulKernel(const ir::Op &op) {
    Shape a = op.inInfo(0).shape(), b = op.inInfo(1).shape();
    bool ta = op.attrs.getInt("popart_transA", 0) != 0 && a.size() >= 2;
    bool tb = op.attrs.getInt("popart_transB", 0) != 0 && b.size() >= 2;
    if (ta) std::swap(a[a.size() - 1], a[a.size() - 2]);
    if (tb) std::swap(b[b.size() - 1], b[b.size() - 2]);
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
    if (!constB && !batched) chooseOperands(op, a, b, rank, ta, tb, make);
  }
  int64_t scratchBytes() const override {
    return operands_ == MatMulOperands::FlippedA   ? static_cast<int64_t>(a_.get_desc().get_size())
           : operands_ == MatMulOperands::FlippedB ? static_cast<int64_t>(b_.get_desc().get_size())
           : operands_ == MatMulOperands::ShiftedB ? static_cast<int64_t>(b_.get_desc().get_size()) + kShift
                                                   : 0;
  }
  void run(const KernelArgs &args) override {
    a_.set_data_handle(const_cast<void *>(args.inputs[0]));
    b_.set_data_handle(const_cast<void *>(args.inputs[1]));
    y_.set_data_handle(args.outputs[0]);
    if (hasBias_) bias_.set_data_handle(const_cast<void *>(args.inputs[2]));
    if (hasResidual_) r_.set_data_handle(const_cast<void *>(args.inputs[3]));
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
  /// Which operand, if any, to reorder into the scratch first (see MatMulOperands). Auto times
  /// each way on zeroed buffers once per configuration.
  template <typename Make>
  void chooseOperands(const ir::Op &op, const Shape &a, const Shape &b, size_t rank, bool ta, bool tb, Make &&make) {
    MatMulOperands choice = forcedOperands;
    double flops = 2.0 * static_cast<double>(shapeElementCount(a)) * static_cast<double>(b.back());
    if (choice == MatMulOperands::Auto) {
      const char *env = std::getenv("POPART_MATMUL_TUNING"); // 0: as stored; a, b, s: flip A, B, shift B
      std::string mode = env ? env : "";
      if (mode == "0" || flops < kTuneFlops) return;
      if (mode == "a") choice = MatMulOperands::FlippedA;
      if (mode == "b") choice = MatMulOperands::FlippedB;
      if (mode == "s") choice = MatMulOperands::ShiftedB;
      static const bool warned = [&] {
        if (!mode.empty() && mode != "1" && choice == MatMulOperands::Auto)
          logging::logger().warn("POPART_MATMUL_TUNING='{}' is not 0, 1, a, b or s; timing as for 1", mode);
        return true;
      }();
      (void)warned;
    }
    memory::desc flippedA = storedDesc(a, rank, !ta), flippedB = storedDesc(b, rank, !tb);
    auto build = [&](MatMulOperands way) {
      reorderedArgs_.clear(); // they name the previous way's memories
      reorderArgs_.clear();
      if (way == MatMulOperands::ShiftedB) {
        scratchB_ = memory(b_.get_desc(), dnnl_util::engine(), DNNL_MEMORY_NONE);
        return true;
      }
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
      static std::mutex mutex;
      static std::map<std::string, MatMulOperands> chosen;
      std::string key = toString(a) + (ta ? "T" : "") + "x" + toString(b) + (tb ? "T" : "") + (hasBias_ ? "+bias" : "") +
                        (hasResidual_ ? "+residual" : "") + op.attrs.getString("popart_activation", "") +
                        std::to_string(op.attrs.getFloat("popart_scale", 1.f));
      std::lock_guard<std::mutex> lock(mutex);
      auto it = chosen.find(key);
      choice = it != chosen.end() ? it->second : timeOperands(build);
      chosen[key] = choice;
      logging::logger().debug("{}: {} operands for {}", op.debugName(),
                              choice == MatMulOperands::FlippedA     ? "flipped A"
                              : choice == MatMulOperands::FlippedB ? "flipped B"
                              : choice == MatMulOperands::ShiftedB ? "shifted B"
                                                                   : "stored",
                              key);
    }
    if (choice == MatMulOperands::AsStored || !build(choice)) return;
    operands_ = choice;
  }

  /// Times the product as stored and with each reorder; the fastest if it beats the stored way by
  /// 8% (the fastest of three runs each; a smaller gain could be noise).
  template <typename Build> MatMulOperands timeOperands(Build &&build) {
    // 64-byte aligned like the arena and the variables: oneDNN's AVX2 gemm takes another path
    // for a B that is not (the MLP's dY·W ran in 3.2 ms with B 16 bytes off, 5.8 ms aligned), so
    // timing on malloc'd buffers chose wrongly.
    size_t bytesA = a_.get_desc().get_size(), bytesB = b_.get_desc().get_size(), bytesY = y_.get_desc().get_size();
    auto bufA = alignedBytes(bytesA), bufB = alignedBytes(bytesB), bufY = alignedBytes(bytesY);
    auto scratch = alignedBytes(std::max(bytesA, bytesB) + static_cast<size_t>(kShift)); // as scratchBytes() for every way
    auto bias = alignedBytes(hasBias_ ? bias_.get_desc().get_size() : 1), residual = alignedBytes(hasResidual_ ? bytesY : 1);
    const void *ins[4] = {bufA.get(), bufB.get(), hasBias_ ? bias.get() : nullptr, hasResidual_ ? residual.get() : nullptr};
    void *outs[1] = {bufY.get()};
    KernelArgs args{ins, 4, outs, 1, scratch.get()};
    operands_ = MatMulOperands::AsStored;
    double stored = fastestMs([&] { run(args); });
    MatMulOperands best = MatMulOperands::AsStored;
    double bestMs = stored / 1.08;
    for (MatMulOperands way : {MatMulOperands::FlippedA, MatMulOperands::FlippedB, MatMulOperands::ShiftedB}) {
      if (!build(way)) continue;
      operands_ = way;
      double ms = fastestMs([&] { run(args); });
      logging::logger().trace("MatMul operands: stored {:.3f} ms, way {} {:.3f} ms", stored, static_cast<int>(way), ms);
      if (ms < bestMs) {
        best = way;
        bestMs = ms;
      }
    }
    operands_ = MatMulOperands::AsStored;
    return best;
  }

  /// Runs \p prim from \p src and \p wt into y_, with the bias and residual memories if any.
  void product(const primitive &prim, std::vector<dnnl_exec_arg_t> &cache, const memory &src, const memory &wt) {
    if (hasBias_ && hasResidual_)
      dnnl_util::execute(prim, cache,
                         {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_BIAS, bias_}, {DNNL_ARG_DST, y_},
                          {residualArg_, r_}});
    else if (hasBias_)
      dnnl_util::execute(prim, cache,
                         {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_BIAS, bias_}, {DNNL_ARG_DST, y_}});
    else if (hasResidual_)
      dnnl_util::execute(prim, cache,
                         {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_DST, y_}, {residualArg_, r_}});
    else
      dnnl_util::execute(prim, cache, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_DST, y_}});
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
  dnnl_util::PackedWeights packed_;
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
  }
  void run(const KernelArgs &args) override {
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
