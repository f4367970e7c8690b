// Reference kernels: GatherScatter family.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

namespace popart::backend_cpu {

void registerReferenceGatherScatterKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
