// oneDNN kernels: Norm family.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

namespace popart::backend_cpu {

void registerDnnlNormKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
