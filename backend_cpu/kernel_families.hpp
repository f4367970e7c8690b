#pragma once
// One registration function per kernel family (backend_cpu/reference/*.cpp, backend_cpu/fast/*.cpp,
// backend_cpu/dnnl/*.cpp).

#include "backend_cpu/kernel.hpp"

namespace popart::backend_cpu {

void registerReferenceKernels(KernelRegistry &registry);
void registerFastKernels(KernelRegistry &registry);
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
void registerReferenceSequenceKernels(KernelRegistry &registry);
void registerReferenceControlFlowKernels(KernelRegistry &registry);
/// AllReduce, ReduceScatter and AllGather over KernelContext::communicator (reference/collectives.cpp).
void registerReferenceCollectiveKernels(KernelRegistry &registry);
/// The ai.graphcore opset-1 ops and their grad ops (reference/graphcore.cpp).
void registerReferenceGraphcoreKernels(KernelRegistry &registry);

void registerFastNormKernels(KernelRegistry &registry);
void registerFastReduceKernels(KernelRegistry &registry);
void registerFastLossKernels(KernelRegistry &registry);
void registerFastSoftmaxKernels(KernelRegistry &registry);
void registerFastConvPoolKernels(KernelRegistry &registry);
void registerFastConvGradKernels(KernelRegistry &registry);
void registerFastElementwiseKernels(KernelRegistry &registry);
void registerFastVarUpdateKernels(KernelRegistry &registry);
void registerFastBroadcastKernels(KernelRegistry &registry);
void registerFastCastKernels(KernelRegistry &registry);
/// FLOAT16 elementwise, activation, softmax and layer-norm ops and their gradients, in f32 blocks
/// on the f32 kernels of the ops' fp32 twins (backend_cpu/fast/half.cpp).
void registerFastHalfKernels(KernelRegistry &registry);
/// fp16.16's FLOAT16 MatMul and Gemm with partial sums rounded to fp16 (fast/half_partials.cpp).
void registerFastHalfPartialsKernels(KernelRegistry &registry);

/// Bytes of the saved state (ir::saveRecurrentState) through which the oneDNN kernels of LSTM,
/// GRU or RNN op \p op and of its grad op pass the forward's workspace; 0 if oneDNN does not
/// take the op.
int64_t recurrentSavedBytes(const ir::Op &op);

/// A depthwise ConvWeightGrad that the fast family's kernel runs (f32, 2-D, one input channel
/// per group, no dilation, no negative pads; backend_cpu/fast/convgrad.cpp), so oneDNN declines
/// it: 2.6 runs 5×5 ones on GEMM (35 ms for one of EfficientNet-B0's at batch 8, 4 ms on ours),
/// and its jit 3×3 one plus the reorders of X and dY to blocked channels took longer than ours on
/// plain NCHW.
bool depthwiseWeightGrad(const ir::Op &op);
/// A MaxPoolGrad that the fast family's plane kernel runs (f32, 2-D, windows that tile without
/// overlap, padding or dilation, each inside X; backend_cpu/fast/convpool.cpp): one pass with no
/// forward rerun, which also applies a fused Relu gradient, so oneDNN declines it.
bool tiledMaxPoolGrad(const ir::Op &op);
/// The same for MaxPool without Indices (the fast family's MaxPool, backend_cpu/fast/convpool.cpp):
/// one vectorised pass at memory speed, where oneDNN 2.6 without AVX-512 runs plain NCHW pooling
/// in its generic simple_nchw code (10.7 ms against about 1 ms for the CNN benchmark's first
/// pool), so oneDNN declines it too.
bool tiledMaxPool(const ir::Op &op);
/// A f32 2-D MaxPool without Indices whose windows each hold a tap of X (any stride, padding or
/// dilation): the fast family's separable kernel (backend_cpu/fast/convpool.cpp), which oneDNN
/// declines where its own pooling is the generic simple_nchw code (oneDNN 2.6 on plain NCHW
/// without AVX-512 took 26 ms for GoogLeNet 3a's 3×3 stride-1 pool of [8, 192, 28, 28]).
bool separableMaxPool(const ir::Op &op);
/// A f32 SoftmaxGrad over the last axis: the fast family's threaded row pass (fast/softmax.cpp),
/// where oneDNN 2.6 without AVX-512 took 3.8 ms per BERT attention softmax gradient (3.3 GB/s),
/// so oneDNN declines it.
bool rowSoftmaxGrad(const ir::Op &op);

} // namespace popart::backend_cpu
