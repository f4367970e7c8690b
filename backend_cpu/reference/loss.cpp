// Reference kernels: Loss family.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

namespace popart::backend_cpu {

void registerReferenceLossKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
