#pragma once
// Registration functions of the oneDNN kernel families.

#include "backend_cpu/kernel.hpp"

namespace popart::backend_cpu {

void registerDnnlElementwiseKernels(KernelRegistry &registry);
void registerDnnlMatMulKernels(KernelRegistry &registry);
void registerDnnlGemmKernels(KernelRegistry &registry);
/// FLOAT16 MatMul and Gemm (matmul_f16.cpp): fp32 products of blocks widened from fp16 on oneDNN's
/// f32 matmul. The oneDNN MatMul and Gemm entries hand FLOAT16 operands to these checks and kernels.
Support supportsHalfMatMul(const ir::Op &op);
Support supportsHalfGemm(const ir::Op &op);
std::unique_ptr<Kernel> createHalfMatMul(const ir::Op &op);
std::unique_ptr<Kernel> createHalfGemm(const ir::Op &op);
void registerDnnlConvPoolKernels(KernelRegistry &registry);
/// FLOAT16 Conv, ConvTranspose, ConvDataGrad and ConvWeightGrad (conv_f16.cpp): oneDNN's f32
/// primitives on chunks of images widened from fp16. The oneDNN entries of these ops hand FLOAT16
/// X to these.
Support supportsHalfConv(const ir::Op &op);
std::unique_ptr<Kernel> createHalfConv(const ir::Op &op, const KernelContext &context);
/// A convolution entry's check: supportsHalfConv for FLOAT16 X, else \p Check.
template <Support (*Check)(const ir::Op &)> Support halfConvOr(const ir::Op &op) {
  return op.inInfo(0).dataType() == DataType::FLOAT16 ? supportsHalfConv(op) : Check(op);
}
/// A convolution entry's kernel: createHalfConv's for FLOAT16 X, else \p Create's.
template <std::unique_ptr<Kernel> (*Create)(const ir::Op &, const KernelContext &)>
std::unique_ptr<Kernel> makeHalfConvOr(const ir::Op &op, const KernelContext &context) {
  return op.inInfo(0).dataType() == DataType::FLOAT16 ? createHalfConv(op, context) : Create(op, context);
}
void registerDnnlNormKernels(KernelRegistry &registry);
void registerDnnlSoftmaxKernels(KernelRegistry &registry);
void registerDnnlReduceKernels(KernelRegistry &registry);
void registerDnnlConvGradKernels(KernelRegistry &registry);
void registerDnnlActGradKernels(KernelRegistry &registry);
void registerDnnlTransposeKernels(KernelRegistry &registry);
void registerDnnlRnnKernels(KernelRegistry &registry);
/// MultiConv and MultiConvGrad (multiconv.cpp): the convolutions on their own kernels, concurrently.
void registerDnnlMultiConvKernels(KernelRegistry &registry);
/// Cast and CastLike between FLOAT, BFLOAT16 and FLOAT16 (reorders).
void registerDnnlCastKernels(KernelRegistry &registry);
/// Ours on oneDNN's blocked layouts: GlobalAveragePool, Mul by per-channel gates.
void registerDnnlChannelwiseKernels(KernelRegistry &registry);
/// Ours: broadcast Add/Sub/Mul/Div where oneDNN's binary has only its reference code.

} // namespace popart::backend_cpu
