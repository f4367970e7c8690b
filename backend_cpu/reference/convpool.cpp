// Reference kernels: ConvPool family.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

namespace popart::backend_cpu {

void registerReferenceConvPoolKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
