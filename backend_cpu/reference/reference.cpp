#include "backend_cpu/kernel_families.hpp"

namespace popart::backend_cpu {

void registerReferenceKernels(KernelRegistry &r) {
  registerReferenceElementwiseKernels(r);
  registerReferenceMatMulKernels(r);
  registerReferenceShapeKernels(r);
  registerReferenceReduceKernels(r);
  registerReferenceConvPoolKernels(r);
  registerReferenceNormKernels(r);
  registerReferenceSoftmaxKernels(r);
  registerReferenceGatherScatterKernels(r);
  registerReferenceLossKernels(r);
  registerReferenceMiscKernels(r);
  registerReferenceResizeKernels(r);
  registerReferenceSignalKernels(r);
  registerReferenceRnnKernels(r);
  registerReferenceDetectionKernels(r);
  registerReferenceStringKernels(r);
  registerReferenceTrainingKernels(r);
  registerReferenceVarUpdateKernels(r);
  registerReferenceConvGradKernels(r);
  registerReferenceActGradKernels(r);
  registerReferenceSequenceKernels(r);
  registerReferenceControlFlowKernels(r);
  registerReferenceCollectiveKernels(r);
  registerReferenceGraphcoreKernels(r);
}

} // namespace popart::backend_cpu
