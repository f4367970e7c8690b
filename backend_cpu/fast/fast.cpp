// The fast CPU kernels (KernelProvider::Fast): vectorised, threaded and tiled f32 loops
// (vecloops.hpp) for hot paths oneDNN lacks or runs slower. Each family has a reference kernel
// of plain loops, which tests/unit/test_fast_provider.cpp compares it with.

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
  registerFastActGradKernels(r);
  registerFastGatherKernels(r);
  registerFastVarUpdateKernels(r);
  registerFastBroadcastKernels(r);
}

} // namespace popart::backend_cpu
