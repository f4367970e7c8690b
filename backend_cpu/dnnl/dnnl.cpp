#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/kernel_families.hpp"

namespace popart::backend_cpu {

void registerDnnlKernels(KernelRegistry &r) {
  registerDnnlChannelwiseKernels(r); // before the binary Mul: found first
  registerDnnlElementwiseKernels(r);
  registerDnnlMatMulKernels(r);
  registerDnnlGemmKernels(r);
  registerDnnlConvPoolKernels(r);
  registerDnnlNormKernels(r);
  registerDnnlSoftmaxKernels(r);
  registerDnnlReduceKernels(r);
  registerDnnlConvGradKernels(r);
  registerDnnlActGradKernels(r);
  registerDnnlTransposeKernels(r);
  registerDnnlRnnKernels(r);
  registerDnnlCastKernels(r);
  registerDnnlMultiConvKernels(r);
}

} // namespace popart::backend_cpu
