// Fast activation-gradient kernels: f32 SoftmaxGrad over the last axis, rows in parallel, each
// summed in f32 by one thread in a fixed order (vectorised), where the reference walks any axis
// in double.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"

namespace popart::backend_cpu {

bool rowSoftmaxGrad(const ir::Op &op) {
  if (op.type != "SoftmaxGrad" || op.inInfo(0).dataType() != DataType::FLOAT || op.inInfo(0).rank() < 1) return false;
  int64_t rank = static_cast<int64_t>(op.inInfo(0).rank()), axis = op.attrs.getInt("axis", -1);
  return axis == -1 || axis == rank - 1;
}

namespace {

Support supportsRowSoftmaxGrad(const ir::Op &op) {
  return rowSoftmaxGrad(op) ? Support::yes() : Support::no("the fast SoftmaxGrad takes f32 over the last axis only");
}

/// dx = y·(dy − Σ dy·y) per row of the last axis.
std::unique_ptr<Kernel> createRowSoftmaxGrad(const ir::Op &op) {
  const Shape &s = op.inInfo(0).shape();
  int64_t n = s.back(), outer = n == 0 ? 0 : op.inInfo(0).elementCount() / n;
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    const float *y = a.in<float>(0), *dy = a.in<float>(1);
    float *dx = a.out<float>(0);
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const float *yr = y + o * n, *gr = dy + o * n;
      float *dr = dx + o * n;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t k = 0; k < n; ++k)
        sum += gr[k] * yr[k];
#pragma omp simd
      for (int64_t k = 0; k < n; ++k)
        dr[k] = yr[k] * (gr[k] - sum);
    }
  });
}

} // namespace

void registerFastActGradKernels(KernelRegistry &r) {
  r.add({"ai.graphcore", "SoftmaxGrad", KernelProvider::Fast, supportsRowSoftmaxGrad, createRowSoftmaxGrad});
}

} // namespace popart::backend_cpu
