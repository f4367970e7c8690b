// oneDNN Gemm, f32 or bf16 (fp32 accumulation): Y = alpha·op(A)·op(B) + beta·C as a oneDNN matmul, or as a 1×1
// convolution (PointwiseProduct) where the timing or the session chooses it (matmul_tuning.hpp).

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/dnnl/matmul_tuning.hpp"
#include "backend_cpu/dnnl/pointwise_product.hpp"
#include "core/log.hpp"
#include "core/tensordata.hpp"

#include <algorithm>
#include <string>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;
using matmul_tuning::fastestMs;
using matmul_tuning::kPointwiseGain;
using matmul_tuning::kTuneFlops;
using matmul_tuning::tunedWay;
using matmul_tuning::unblocked;

/// The product's descriptors and attributes: transposes are strides, C a broadcast binary post-op.
struct GemmSetup {
  memory::desc mdA, mdB, mdY, mdC;
  primitive_attr attr;
  bool hasC = false;
};

GemmSetup gemmSetup(const ir::Op &op) {
  GemmSetup g;
  bool ta = op.attrs.getInt("transA", 0) != 0, tb = op.attrs.getInt("transB", 0) != 0;
  float alpha = op.attrs.getFloat("alpha", 1.f), beta = op.attrs.getFloat("beta", 1.f);
  int64_t m = op.outInfo(0).dim(0), n = op.outInfo(0).dim(1);
  int64_t k = ta ? op.inInfo(0).dim(0) : op.inInfo(0).dim(1);
  g.mdA = memory::desc({m, k}, dnnl_util::dnnlType(op.inInfo(0)), ta ? memory::dims{1, m} : memory::dims{k, 1});
  g.mdB = memory::desc({k, n}, dnnl_util::dnnlType(op.inInfo(1)), tb ? memory::dims{1, k} : memory::dims{n, 1});
  g.mdY = memory::desc({m, n}, dnnl_util::dnnlType(op.outInfo(0)), memory::dims{n, 1});
  post_ops po;
  g.hasC = op.hasInput(2) && beta != 0.f;
  if (alpha != 1.f) g.attr.set_output_scales(0, {alpha});
  if (g.hasC) {
    g.mdC = dnnl_util::plainDesc(op.inInfo(2), 2);
    po.append_binary(algorithm::binary_add, g.mdC);
  }
  if (op.fusion.relu()) // fused by fuseRelu, after C
    po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
  if (po.len() > 0) g.attr.set_post_ops(po);
  return g;
}

Support supportsGemm(const ir::Op &op) {
  // FLOAT16: oneDNN 2.6 has no f16 matmul on this CPU; the f16 kernel computes in f32 blocks (matmul_f16.cpp).
  if (op.inInfo(0).dataType() == DataType::FLOAT16) return supportsHalfGemm(op);
  // 16-bit A and B: C and Y in their type or FLOAT (fp32 accumulation).
  if (Support types = dnnl_util::productTypes(op, {2}); !types) return types;
  DataType t = op.inInfo(0).dataType(), y = op.outInfo(0).dataType();
  auto type = dnnl_util::dnnlType(t);
  if (t == DataType::FLOAT && (y != t || (op.hasInput(2) && op.inInfo(2).dataType() != t)))
    return Support::no("FLOAT operands with a 16-bit C or Y");
  // beta other than 1 with C is left to the reference kernel (no exact oneDNN post-op for it).
  if (op.hasInput(2) && op.attrs.getFloat("beta", 1.f) != 1.f) return Support::no("beta other than 1 with C");
  if (op.outInfo(0).elementCount() == 0) return Support::no("an empty result");
  if (t == DataType::FLOAT) return Support::yes();
  GemmSetup g = gemmSetup(op);
  matmul::primitive_desc pd(matmul::desc(g.mdA, g.mdB, g.mdY), g.attr, dnnl_util::engine(), true);
  return dnnl_util::implementationFor(pd, "matmul", *type);
}

/// Y = alpha * op(A) op(B) + beta * C: transposes are strides, C is a broadcast binary post-op.
class GemmKernel : public Kernel {
public:
  GemmKernel(const ir::Op &op, const KernelContext &context) {
    bool ta = op.attrs.getInt("transA", 0) != 0, tb = op.attrs.getInt("transB", 0) != 0;
    float alpha = op.attrs.getFloat("alpha", 1.f);
    int64_t m = op.outInfo(0).dim(0), n = op.outInfo(0).dim(1);
    int64_t k = ta ? op.inInfo(0).dim(0) : op.inInfo(0).dim(1);
    GemmSetup g = gemmSetup(op);
    const memory::desc &mdA = g.mdA, &mdB = g.mdB, &mdY = g.mdY;
    const primitive_attr &attr = g.attr;
    hasC_ = g.hasC;
    mdC_ = g.mdC;
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
    // The 1×1 convolution way is f32's (pointwise_product.cpp).
    if (!ta && op.inInfo(0).dataType() == DataType::FLOAT) choosePointwise(op, context, m, k, n, tb, constB, alpha);
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
  void choosePointwise(const ir::Op &op, const KernelContext &context, int64_t m, int64_t k, int64_t n, bool tb,
                       bool constB, float alpha) {
    MatMulOperands mode = context.matmulOperands;
    if (mode != MatMulOperands::Auto && mode != MatMulOperands::Pointwise) return;
    if (mode == MatMulOperands::Auto && 2.0 * static_cast<double>(m * n * k) < kTuneFlops) return;
    PointwiseProduct::Spec spec;
    spec.m = m, spec.k = k, spec.n = n, spec.bTransposed = tb, spec.constB = constB, spec.scale = alpha;
    spec.relu = op.fusion.relu();
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
    std::string key = "Gemm " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) +
                      (tb ? "T" : "") +
                      (spec.bias            ? "+bias"
                       : spec.addBeforeRelu ? "+C"
                                            : "") +
                      (spec.relu ? "Relu" : "") + std::to_string(alpha) + (constB ? "const" : "");
    timed_ = true;
    MatMulOperands way = tunedWay(context, key, [&] {
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

public:
  std::string choice() const override {
    if (!timed_ && !pointwise_) return {};
    return std::string(pointwise_ ? "1x1 convolution" : "as stored") + (timed_ ? ", timed" : ", forced");
  }

private:
  PointwiseProduct pointwise_; ///< initialised: the product runs as a 1×1 convolution
  bool timed_ = false;         ///< whether to run pointwise_ came from the timing
  dnnl_util::PackedWeights packed_;
  bool hasC_ = false;
  memory::desc mdC_;
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory a_, b_, y_, c_;
};

/// The f16 kernel for FLOAT16 operands (supportsHalfGemm), ours otherwise.
std::unique_ptr<Kernel> createGemm(const ir::Op &op, const KernelContext &context) {
  if (op.inInfo(0).dataType() == DataType::FLOAT16) return createHalfGemm(op);
  return std::make_unique<GemmKernel>(op, context);
}

} // namespace

void registerDnnlGemmKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "Gemm", KernelProvider::Dnnl, supportsGemm, createGemm});
}

} // namespace popart::backend_cpu
