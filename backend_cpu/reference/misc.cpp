// Reference kernels: Misc family.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

namespace popart::backend_cpu {

void registerReferenceMiscKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
