#pragma once
// The timing that chooses how the oneDNN MatMul and Gemm kernels run a large product
// (MatMulOperands, kernel_context.hpp): thresholds, the timer, and the session's record of the
// ways chosen.

#include "backend_cpu/kernel_context.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>

namespace popart::backend_cpu::matmul_tuning {

/// Products smaller than this (FLOPs) are run as stored: timing them would cost more than it saves.
constexpr double kTuneFlops = 1e8;
/// The gain another way must show over the stored one to be chosen; Pointwise copies no operand
/// (constant B is packed once, another B is a weights reorder far smaller than the product).
constexpr double kGain = 1.08, kPointwiseGain = 1.02;

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

/// The way \p context's session recorded for configuration \p key, or \p decide()'s (the timing),
/// which is then recorded so that the session's other kernels of that configuration, and a
/// session resumed from its checkpoint, take the same way.
MatMulOperands tunedWay(const KernelContext &context, const std::string &key,
                        const std::function<MatMulOperands()> &decide);

/// Whether \p md is a plain strided layout (no inner blocks). Packing constant weights into one
/// gains nothing: oneDNN's AVX2 gemm picks row-major for any weights, which ran the MLP's
/// transposed [1024, 1024] Gemm weights at half the speed of their stored layout (5.8 ms against
/// about 3 ms per 256-row product). A blocked choice (brgemm with AVX-512) is kept.
bool unblocked(const dnnl::memory::desc &md);

} // namespace popart::backend_cpu::matmul_tuning
