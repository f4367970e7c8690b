// Reference kernels: Norm family.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

namespace popart::backend_cpu {

void registerReferenceNormKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
