// Reference kernels: Softmax family.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

namespace popart::backend_cpu {

void registerReferenceSoftmaxKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
