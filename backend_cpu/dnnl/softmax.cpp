// oneDNN kernels: Softmax family.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

namespace popart::backend_cpu {

void registerDnnlSoftmaxKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
