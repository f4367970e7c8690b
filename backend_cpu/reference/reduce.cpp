// Reference kernels: Reduce family.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

namespace popart::backend_cpu {

void registerReferenceReduceKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
