// Reference kernels: Shape family.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

namespace popart::backend_cpu {

void registerReferenceShapeKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
