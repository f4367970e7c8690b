// The fast CPU kernels (KernelProvider::Fast): vectorised, threaded and tiled f32 loops
// (vecloops.hpp) for hot paths oneDNN lacks or runs slower. Each has a reference kernel of plain
// loops that a test compares it with (tests/unit/test_fast_*.cpp; test_fast_provider.cpp checks
// that every fast kernel is).

#include "backend_cpu/kernel_families.hpp"

namespace popart::backend_cpu {

void registerFastKernels(KernelRegistry &r) {
  registerFastNormKernels(r);
  registerFastReduceKernels(r);
  registerFastLossKernels(r);
  registerFastSoftmaxKernels(r);
  registerFastConvPoolKernels(r);
  registerFastConvGradKernels(r);
  registerFastElementwiseKernels(r);
  registerFastVarUpdateKernels(r);
  registerFastBroadcastKernels(r);
  registerFastCastKernels(r);
  registerFastHalfPartialsKernels(r);
  registerFastHalfKernels(r);
}

} // namespace popart::backend_cpu
