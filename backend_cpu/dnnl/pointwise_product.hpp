#pragma once
// PointwiseProduct: a row-major matrix product run as oneDNN's 1×1 convolution, one of the ways
// the MatMul and Gemm kernels may take (MatMulOperands::Pointwise, FlippedPointwise).

#include "backend_cpu/dnnl/dnnl_common.hpp"

#include <cstdint>
#include <vector>

namespace popart::backend_cpu {

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
  bool init(const Spec &s);
  explicit operator bool() const { return static_cast<bool>(prim_); }
  /// The weights reordered on every run (0 for constant B).
  int64_t scratchBytes() const { return pack_ ? static_cast<int64_t>(perRun_.get_desc().get_size()) : 0; }
  /// \p bias and \p add are null unless the spec has them; \p scratch holds scratchBytes().
  void run(const void *a, const void *b, const void *bias, const void *add, void *c, void *scratch);

private:
  dnnl::primitive prim_;
  dnnl::reorder pack_;
  std::vector<dnnl_exec_arg_t> args_, packArgs_;
  dnnl::memory a_, c_, add_, bias_, stored_, perRun_, convScratch_;
  dnnl_util::PackedWeights packed_;
  bool hasAdd_ = false;
  int addArg_ = 0;
};

} // namespace popart::backend_cpu
