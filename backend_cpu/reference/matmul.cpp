// Reference MatMul (numpy batching and broadcasting) and Gemm.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/broadcast.hpp"
#include "core/dispatch.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/ops/matmul_layout.hpp"

namespace popart::backend_cpu {

namespace {

class MatMulKernel : public Kernel {
public:
  explicit MatMulKernel(const ir::Op &op)
      : type_(op.inInfo(0).dataType()), floatOutput_(op.outInfo(0).dataType() == DataType::FLOAT),
        halfPartials_(op.attrs.getInt(ir::internal_attr::kHalfPartials, 0) != 0), g_(ir::matMulGeometry(op)) {
    scale_ = op.fusion.scale.value_or(1.f);
    relu_ = op.fusion.relu();
  }

  void run(const KernelArgs &args) override {
    dispatchNumeric(type_, "MatMul", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        if (floatOutput_) { // Fusion::outputType: 16-bit operands, a FLOAT product
          product<T, float>(args);
          return;
        }
      }
      product<T, T>(args);
    });
  }

private:
  /// Y (of type O) = A · B of type T, with the fused bias, scale, Relu and residual.
  template <typename T, typename O> void product(const KernelArgs &args) {
    using C = compute_t<T>;
    const T *a = args.in<T>(0);
    const T *b = args.in<T>(1);
    O *y = args.out<O>(0);
    const T *bias = args.hasInput(2) ? args.in<T>(2) : nullptr;     // fused by fuseMatMulBias
    const O *residual = args.hasInput(3) ? args.in<O>(3) : nullptr; // fused by fuseMatMulResidual
    const auto scale = static_cast<C>(scale_);                      // fused by fuseMatMulScale
    const ir::MatMulGeometry &g = g_;
    for (size_t bi = 0; bi < g.offsetA.size(); ++bi) {
      const T *pa = a + g.offsetA[bi];
      const T *pb = b + g.offsetB[bi];
      for (int64_t i = 0; i < g.m; ++i)
        for (int64_t j = 0; j < g.n; ++j) {
          C acc = bias ? static_cast<C>(bias[j]) : C(0);
          for (int64_t p = 0; p < g.k; ++p) {
            acc += static_cast<C>(pa[i * g.aRow + p * g.aCol]) * static_cast<C>(pb[p * g.bRow + j * g.bCol]);
            if (halfPartials_) acc = static_cast<C>(static_cast<T>(acc)); // fp16.16: 16-bit partials
          }
          C v = scale_ == 1.f ? acc : acc * scale;
          if (relu_ && v < C(0)) v = C(0);                      // fused by fuseRelu; NaN stays NaN
          int64_t at = g.offsetY[bi] + i * g.yRow + j * g.yCol; // the residual is stored as the output
          if (residual) v += static_cast<C>(residual[at]);
          y[at] = static_cast<O>(v);
        }
    }
  }

  DataType type_; ///< of the operands
  bool floatOutput_;
  bool halfPartials_; ///< internal_attr::kHalfPartials
  float scale_ = 1.f;
  bool relu_ = false; ///< fuseRelu
  /// Operands and result through strides (Fusion::transA/B, permA/B/Y; matmul_layout.hpp).
  ir::MatMulGeometry g_;
};

class GemmKernel : public Kernel {
public:
  explicit GemmKernel(const ir::Op &op)
      : type_(op.outInfo(0).dataType()), transA_(op.attrs.getInt("transA", 0) != 0),
        transB_(op.attrs.getInt("transB", 0) != 0), alpha_(op.attrs.getFloat("alpha", 1.f)),
        beta_(op.attrs.getFloat("beta", 1.f)), relu_(op.fusion.relu()),
        halfPartials_(op.attrs.getInt(ir::internal_attr::kHalfPartials, 0) != 0) {
    m_ = op.outInfo(0).dim(0);
    n_ = op.outInfo(0).dim(1);
    k_ = transA_ ? op.inInfo(0).dim(0) : op.inInfo(0).dim(1);
    if (op.hasInput(2)) {
      cStrides_ = broadcastStrides(op.inInfo(2).shape(), {m_, n_});
      DataType c = op.inInfo(2).dataType();
      if (c != type_ && c != DataType::FLOAT)
        throw ::popart::error(op.debugName(), ": Gemm's C is ", toString(c), ", expected ", toString(type_),
                              " or FLOAT");
      floatC_ = c != type_;
    }
  }

  void run(const KernelArgs &args) override {
    dispatchNumeric(type_, "Gemm", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const T *a = args.in<T>(0);
      const T *b = args.in<T>(1);
      const void *c = args.hasInput(2) ? args.inputs[2] : nullptr;
      T *y = args.out<T>(0);
      for (int64_t i = 0; i < m_; ++i)
        for (int64_t j = 0; j < n_; ++j) {
          C acc = 0;
          for (int64_t p = 0; p < k_; ++p) {
            C av = static_cast<C>(transA_ ? a[p * m_ + i] : a[i * k_ + p]);
            C bv = static_cast<C>(transB_ ? b[j * k_ + p] : b[p * n_ + j]);
            acc += av * bv;
            if (halfPartials_) acc = static_cast<C>(static_cast<T>(acc)); // fp16.16: 16-bit partials
          }
          C v = static_cast<C>(alpha_) * acc;
          if (c) {
            int64_t at = i * cStrides_[0] + j * cStrides_[1];
            C cv = floatC_ ? static_cast<C>(static_cast<const float *>(c)[at])
                           : static_cast<C>(static_cast<const T *>(c)[at]);
            v += static_cast<C>(beta_) * cv;
          }
          if (relu_ && v < C(0)) v = C(0); // fused by fuseRelu; NaN stays NaN
          y[i * n_ + j] = static_cast<T>(v);
        }
    });
  }

private:
  DataType type_;
  bool transA_, transB_;
  float alpha_, beta_;
  bool relu_;
  bool halfPartials_;   ///< internal_attr::kHalfPartials
  bool floatC_ = false; ///< a FLOAT C of a 16-bit product (mixed precision's bias)
  int64_t m_, n_, k_;
  std::vector<int64_t> cStrides_;
};

} // namespace

void registerReferenceMatMulKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "MatMul", KernelProvider::Reference, nullptr, makeKernel<MatMulKernel>});
  r.add({"ai.onnx", "Gemm", KernelProvider::Reference, nullptr, makeKernel<GemmKernel>});
}

} // namespace popart::backend_cpu
