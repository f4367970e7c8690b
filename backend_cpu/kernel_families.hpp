#pragma once
// One registration function per kernel family (backend_cpu/reference/*.cpp, backend_cpu/dnnl/*.cpp).

#include "backend_cpu/kernel.hpp"

namespace popart::backend_cpu {

void registerReferenceKernels(KernelRegistry &registry);
void registerDnnlKernels(KernelRegistry &registry);

void registerReferenceElementwiseKernels(KernelRegistry &registry);
void registerReferenceMatMulKernels(KernelRegistry &registry);
void registerReferenceShapeKernels(KernelRegistry &registry);
void registerReferenceReduceKernels(KernelRegistry &registry);
void registerReferenceConvPoolKernels(KernelRegistry &registry);
void registerReferenceNormKernels(KernelRegistry &registry);
void registerReferenceSoftmaxKernels(KernelRegistry &registry);
void registerReferenceGatherScatterKernels(KernelRegistry &registry);
void registerReferenceLossKernels(KernelRegistry &registry);
void registerReferenceMiscKernels(KernelRegistry &registry);
void registerReferenceResizeKernels(KernelRegistry &registry);
void registerReferenceSignalKernels(KernelRegistry &registry);
void registerReferenceRnnKernels(KernelRegistry &registry);
void registerReferenceDetectionKernels(KernelRegistry &registry);
void registerReferenceStringKernels(KernelRegistry &registry);
void registerReferenceTrainingKernels(KernelRegistry &registry);
void registerReferenceVarUpdateKernels(KernelRegistry &registry);
void registerReferenceConvGradKernels(KernelRegistry &registry);
void registerReferenceActGradKernels(KernelRegistry &registry);

/// A MaxPoolGrad that the reference family's vectorised plane kernel runs (f32, 2-D, windows
/// that tile without overlap or padding): one pass with no forward rerun, so oneDNN declines it.
bool tiledMaxPoolGrad(const ir::Op &op);

} // namespace popart::backend_cpu
