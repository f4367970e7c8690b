// Fast elementwise kernels: f32 Erf (the unfused GELU's), vectorised (vecmath::erf, within 4e-7
// of libm) in parallel chunks where the reference calls libm's scalar erff per element.

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"

#include <algorithm>

namespace popart::backend_cpu {

namespace {

Support supportsErf(const ir::Op &op) {
  if (!op.inInfo(0).isTensor() || op.inInfo(0).dataType() != DataType::FLOAT)
    return Support::no("the fast Erf takes f32 tensors only");
  return Support::yes();
}

std::unique_ptr<Kernel> createErf(const ir::Op &op) {
  int64_t n = op.inInfo(0).elementCount();
  return std::make_unique<LoopKernel>([n](const KernelArgs &a) {
    constexpr int64_t kChunk = 16384;
    const float *x = a.in<float>(0);
    float *y = a.out<float>(0);
#pragma omp parallel for schedule(static) if (n > kChunk)
    for (int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c)
      vec::erf(x + c * kChunk, y + c * kChunk, std::min(kChunk, n - c * kChunk));
  });
}

} // namespace

void registerFastElementwiseKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "Erf", KernelProvider::Fast, supportsErf, createErf});
}

} // namespace popart::backend_cpu
