// oneDNN kernels: ConvPool family.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

namespace popart::backend_cpu {

void registerDnnlConvPoolKernels(KernelRegistry &) {}

} // namespace popart::backend_cpu
