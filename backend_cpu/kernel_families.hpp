#pragma once
// One registration function per kernel family (backend_cpu/reference/*.cpp, backend_cpu/dnnl/*.cpp).

#include "backend_cpu/kernel.hpp"

namespace popart::backend_cpu {

/// How the oneDNN MatMul kernel presents a large 2-D product of non-constant operands to oneDNN:
/// as stored, or with A or B first reordered into its other layout (row-major ↔ transposed, in
/// the kernel's scratch). oneDNN 2.6's AVX2 f32 gemm runs some shape and layout pairs at half
/// speed (weight gradients Xᵀ·dY with a long K), and takes a faster path for some when B is not
/// 64-byte aligned (ShiftedB: B copied 16 bytes off alignment; [256, 1024]·[1024, 1024] in 3.2 ms
/// instead of 5.8). Pointwise runs a product whose A is row-major (and whose B is one matrix) as
/// a 1×1 convolution over A's rows, which oneDNN's AVX2 jit_1x1 kernel runs 5-17% faster than its
/// gemm; it applies to MatMul and Gemm, with constant B too (packed once). Auto times the ways
/// that apply once per shape and configuration, on aligned buffers as in the plan, and keeps the
/// fastest if it gains 8% (Pointwise: 2%, as it needs no copy of A); the others force one (where
/// it applies), for tests and A/B runs. Swapped computes Yᵀ = Bᵀ·Aᵀ into the scratch and
/// transposes it into Y (SwappedCopy: with Bᵀ first copied row-major): the head's weight gradient
/// [8000, 2048]ᵀ·[2048, 256] runs as [256, 2048]·[2048, 8000] at 170 GFLOP/s, not 140.
/// FlippedPointwise copies a transposed A row-major, then runs Pointwise (weight gradients).
/// Unpermuted copies the operands a MatMul reads through popart_permA/B (attention's head
/// split) into plain layouts and writes a popart_permY result through a plain buffer: as fast
/// on AVX2's gemm as the strided product, but oneDNN's AVX-512 brgemm ran strided heads 50-70%
/// slower, so the tuning decides.
/// POPART_MATMUL_TUNING=0 makes Auto AsStored; =a, =b, =s, =p, =t, =tc, =ap, =u force FlippedA,
/// FlippedB, ShiftedB, Pointwise, Swapped, SwappedCopy, FlippedPointwise, Unpermuted.
enum class MatMulOperands {
  Auto,
  AsStored,
  FlippedA,
  FlippedB,
  ShiftedB,
  Pointwise,
  Swapped,
  SwappedCopy,
  FlippedPointwise,
  Unpermuted
};
void setMatMulOperands(MatMulOperands choice);

/// Images per chunk of a oneDNN Conv with a fused MaxPool (fuseConvPool), which convolves and
/// pools a chunk at a time so that the convolution's result stays in cache: 0 (the default)
/// sizes chunks to about 512 KiB of result; N ≥ 1 forces N images (N ≥ the batch: all at once),
/// for tests and A/B runs, as POPART_CONVPOOL_CHUNK=N does when this is 0.
void setConvPoolChunk(int64_t images);

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
void registerReferenceSequenceKernels(KernelRegistry &registry);
void registerReferenceControlFlowKernels(KernelRegistry &registry);

/// Bytes of the saved state (ir::saveRecurrentState) through which the oneDNN kernels of LSTM,
/// GRU or RNN op \p op and of its grad op pass the forward's workspace; 0 if oneDNN does not
/// take the op.
int64_t recurrentSavedBytes(const ir::Op &op);

/// A depthwise ConvWeightGrad that the reference family's vectorised kernel runs (f32, 2-D, one
/// input channel per group, no dilation), so oneDNN declines it: 2.6 runs 5×5 ones on GEMM
/// (35 ms for one of EfficientNet-B0's at batch 8, 4 ms on ours), and its jit 3×3 one plus the
/// reorders of X and dY to blocked channels took longer than ours on plain NCHW.
bool depthwiseWeightGrad(const ir::Op &op);
/// A MaxPoolGrad that the reference family's vectorised plane kernel runs (f32, 2-D, windows
/// that tile without overlap or padding): one pass with no forward rerun, so oneDNN declines it.
bool tiledMaxPoolGrad(const ir::Op &op);
/// The same for MaxPool without Indices: one vectorised pass at memory speed, where oneDNN 2.6
/// without AVX-512 runs plain NCHW pooling in its generic simple_nchw code (10.7 ms against
/// about 1 ms for the CNN benchmark's first pool), so oneDNN declines it too.
bool tiledMaxPool(const ir::Op &op);
/// A f32 SoftmaxGrad over the last axis: the reference family's threaded row pass, where oneDNN
/// 2.6 without AVX-512 took 3.8 ms per BERT attention softmax gradient (3.3 GB/s), so oneDNN
/// declines it.
bool rowSoftmaxGrad(const ir::Op &op);

} // namespace popart::backend_cpu
