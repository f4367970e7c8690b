// oneDNN kernels: Reduce family.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

namespace popart::backend_cpu {

void registerDnnlReduceKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
