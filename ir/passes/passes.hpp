#pragma once
// Graph passes: shape inference with constant folding, dead-code elimination.

#include "ir/graph.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace popart::ir {

/// Where a tensor's values come to decide a shape: input \p input of \p op is a value input
/// (OpDef::valueInputs) computed from the tensor.
struct ShapeUse {
  const Op *op = nullptr;
  size_t input = 0;
};

/// Tensors whose values decide output shapes: every value input of an op and every tensor it is
/// computed from, except through inputs read only for their shapes (OpDef::shapeOnlyInputs:
/// Shape, Size...), whose producers need not be constant. Each maps to one value input it
/// reaches (the first found in schedule order).
std::map<const Tensor *, ShapeUse> shapeDecidingTensors(const Graph &graph);

/// The indices of \p op's value inputs (OpDef::valueInputs, or all with allInputsAreValueInputs).
std::vector<size_t> valueInputIndices(const Op &op);

/// True unless input \p i of \p op is read only for its shape (OpDef::shapeOnlyInputs).
bool readsValuesOf(const Op &op, size_t i);

/// Computes the outputs of an op whose inputs are all constant. The IR cannot run kernels,
/// so the backend provides this (with its reference kernels) and the session passes it in.
class ConstEvaluator {
public:
  virtual ~ConstEvaluator() = default;
  /// True if \p op can be evaluated on the host.
  virtual bool canEvaluate(const Op &op) const = 0;
  /// Output values of \p op, one per output (empty TensorData for an omitted output).
  virtual std::vector<TensorData> evaluate(const Op &op) const = 0;
};

/// Runs every op's setup() in schedule order. When \p folder is given, an op whose inputs
/// are all constant is evaluated and replaced by constants, so that shape inputs computed
/// from shapes (Shape → Gather → Reshape) become known. Graph input infos must be known.
void inferShapes(Graph &graph, const ConstEvaluator *folder);

/// Removes ops none of whose outputs lead to one of \p keep (graph outputs by default), and
/// tensors left with neither producer nor consumer that are not graph inputs or outputs.
void removeDeadCode(Graph &graph, const std::vector<TensorId> &keep = {});

/// Where a MatMul input comes from a Transpose that swaps only its last two axes, the MatMul
/// reads the Transpose's input instead, marked Fusion::transA / transB (the kernels read it
/// through strides). Transposes left without consumers are removed. Returns how many inputs
/// were folded. Shapes must be known.
int foldTransposesIntoMatMul(Graph &graph);

/// A float Gemm or MatMul, or with \p convolutions a Conv, whose result only feeds a Relu computes
/// the Relu itself (Fusion::activation Relu, a oneDNN post-op after any bias) and writes the
/// Relu's output. Returns how many were fused.
int fuseRelu(Graph &graph, bool convolutions = true);

/// A Conv whose result only feeds a MaxPool (no Indices output, floor rounding, no dilation)
/// pools it itself (Fusion::pool, an ir::FusedPool) and writes the pool's output:
/// oneDNN then pools in the convolution's blocked layout and reorders only the pooled result.
/// Returns how many were fused.
int fuseConvPool(Graph &graph);

/// Training: a MaxPoolGrad whose result only feeds the ActivationGrad of the Relu that produced
/// the pool's input applies that Relu's gradient itself (Fusion::activation Relu: zero where
/// the pool's input is not > 0) and writes its output. Returns how many were fused.
int fuseMaxPoolGradRelu(Graph &graph);

/// A BatchNormalization whose output only feeds a Relu applies it (Fusion::activation Relu)
/// and writes the Relu's output; its other outputs stay. After autodiff (the gradients read the
/// Relu's output and BatchNormalization's input, not the normalised value). Returns the count.
int fuseBatchNormRelu(Graph &graph);

/// A float MatMul (A [..., M, K] times a matrix B) whose product only feeds an Add of a [N] bias
/// adds the bias itself (Fusion::bias, bias as input 2: oneDNN's matmul bias) and writes the
/// Add's output. After autodiff. Returns how many were fused.
int fuseMatMulBias(Graph &graph);

/// A float MatMul (B a matrix) whose product only feeds an Add or a two-input Sum with a tensor r
/// of the product's shape (a residual connection, or a gradient summed with another) adds r
/// itself (Fusion::residual, r as input 3 after an optional bias: a oneDNN binary post-op,
/// applied last) and writes the Add's output. Also through a Reshape of the product (the
/// gradient of a 3-D activation from a 2-D product): r is viewed in the product's shape and the
/// result reshaped to the Add's. A Sum of three or more same-shaped inputs is first split into
/// two-input Sums, one per such product (Sum(a, p, q) = Sum(Sum(a, p), q)), so that each
/// product adds the sum before it. A Gemm (alpha 1, no C or a [N] bias with beta 1, maybe
/// with a fused Relu) followed by such an Add first becomes its MatMul (Fusion::transA/B,
/// Fusion::bias). After autodiff and after the other MatMul fusions, which cannot apply after
/// it. Returns how many were fused.
int fuseMatMulResidual(Graph &graph);
/// A MatMul of 16-bit operands whose only reader is a Cast to FLOAT writes the Cast's output
/// itself (Fusion::outputType): a weight gradient goes to its fp32 master copy in one rounding.
/// Tensors in \p keep are not fused away.
int foldCastIntoMatMul(Graph &graph, const std::vector<TensorId> &keep = {});

/// Inference: a BatchNormalization (running statistics, no training outputs) whose input is a
/// float Conv's result that nothing else reads, with constant weights, bias and statistics,
/// folds into that Conv: W'[c] = W[c]·s[c], b'[c] = (b[c] − mean[c])·s[c] + B[c] with
/// s = scale / √(var + ε), new constants (the originals are not written). Before the other Conv
/// fusions. Returns how many were folded.
int foldBatchNormIntoConv(Graph &graph);

/// Inference: a float Conv (no fused pool or activation) whose result only feeds a Relu, a Clip
/// with constant bounds (ReLU6), a HardSigmoid, a HardSwish or a Sigmoid, or only feeds a Sigmoid
/// (or HardSigmoid with alpha 1/6, beta 1/2) and the Mul of the result by it (SiLU, hard swish as
/// exported), applies that activation itself (Fusion::activation, an ir::FusedActivation: oneDNN
/// eltwise post-ops after any bias and residual) and writes its output. After fuseConvResidual
/// and fuseRelu. Returns how many were fused.
int fuseConvActivation(Graph &graph);

/// Inference: Mul(x, HardSigmoid(x; alpha 1/6, beta 1/2)), either order, hard swish as torch
/// exports it before opset 14, becomes one HardSwish (oneDNN's eltwise_hardswish) when nothing
/// else reads the HardSigmoid. After fuseConvActivation, which takes those after a Conv. Returns
/// how many were fused.
int fuseHardSwish(Graph &graph);

/// ShuffleNet's channel shuffle (Concat on axis 1 → Reshape [N, g, C/g, ...] → Transpose of axes
/// 1 and 2 → Reshape back, and the equal-chunk Slices that may read it) as one ai.graphcore
/// ChannelShuffle. Returns how many it fused.
int fuseChannelShuffle(Graph &graph);

/// Inference: a Dropout that does not train (no session seed input 3, training_mode absent or a
/// constant false) and whose mask nothing reads becomes an Identity, which the plan makes a view
/// (Swin-T's 24 exported Dropouts copied 2.5 ms per run). Returns how many were rewritten.
int inferenceDropoutAsIdentity(Graph &graph);

/// A float Conv (no fused pool or activation) whose result only feeds an Add or a two-input Sum
/// with a tensor r of the result's shape (a ResNet block's shortcut) adds r itself
/// (Fusion::residual, r as input 3 after an optional bias: oneDNN's sum post-op, before a
/// Relu that fuseRelu fuses after it) and writes the Add's output. Inference, before fuseRelu.
/// Returns how many were fused.
int fuseConvResidual(Graph &graph);

/// A float MatMul without a bias whose product only feeds a Mul or Div by a constant scalar c
/// scales it itself (Fusion::scale = c or 1/c: oneDNN's output scale) and writes that output
/// (attention's 1/√d). A division becomes a product with 1/c, which may differ in the last bit
/// unless c is a power of two. After autodiff. Returns how many were fused.
int fuseMatMulScale(Graph &graph);

/// Training: a ReduceSum of the softmax cross-entropy gradient dX [N, C] (through Reshapes
/// that keep C last) over every axis but the class axis, e.g. the bias gradient of the output
/// layer, is computed by SoftmaxCrossEntropyLossGrad itself (its output 1) while the rows are in
/// cache, instead of reading dX again. Returns how many were fused.
int fuseLossGradClassSums(Graph &graph);

/// Training: SoftmaxCrossEntropyLoss and its SoftmaxCrossEntropyLossGrad on the same scores,
/// labels, weights and attributes become the gradient op alone, which also writes the loss
/// (its output 2) from the same pass over the scores, when the gradient's seed does not depend
/// on the loss and the forward's log_prob is unused. Returns how many were fused.
int fuseLossWithGradient(Graph &graph);

/// Replaces the float32 LayerNorm decomposition that exporters write before opset 17,
///   d = x − ReduceMean(x); y = d / Sqrt(ReduceMean(Pow(d, 2)) + eps) · scale [+ bias]
/// (means over the trailing axes, keepdims), by one LayerNormalization (opset 17), whose
/// intermediates are then neither stored nor differentiated op by op. With \p statistics it also
/// writes Mean and InvStdDev, which its gradient reads. Intermediates that are graph outputs or
/// in \p keep stop a fusion. Returns how many were fused.
int fuseLayerNorm(Graph &graph, bool statistics, const std::vector<TensorId> &keep = {});

/// Replaces the float32 exact-GELU decomposition 0.5 · (x · (1 + Erf(x / √2))) (or x · (1/√2)
/// inside the Erf) by one ai.graphcore Gelu. Intermediates that are graph outputs or in \p keep
/// stop a fusion. Returns how many were fused.
int fuseGelu(Graph &graph, const std::vector<TensorId> &keep = {});

/// Limits of unrollControlFlow.
struct UnrollOptions {
  /// Ops the pass may add in all (iterations times body ops, summed over the ops it unrolls): an
  /// op whose unrolling would pass it stays as it is, and autodiff names it if it reaches it.
  int64_t maxOps = 65536;
};

/// Replaces control flow that the tensors \p roots (the graph outputs if empty) depend on by the
/// ops it runs, so that autodiff can differentiate them: an If whose condition is a constant by its
/// taken branch; a Loop whose trip count and conditions fold to constants (M constant, the
/// condition constant or computed from the iteration number) by one copy of its body per
/// iteration, loop-carried values chained from one copy to the next, scan outputs stacked by
/// Unsqueeze + Concat; a Scan (opset 9+) by one copy per position of its scan axis, each scan input
/// read by a Gather of that position. Each copy is the subgraph specialised for its input infos
/// (and for Loop its iteration number), with new tensor ids starting with the op's name and the
/// iteration; captured tensors become the outer tensors the op read, the op's outputs keep their
/// ids (Identity of the last copy's values). Nested control flow is unrolled too, outside in.
/// Ops that cannot be unrolled are left alone, with the reason in their attribute
/// internal_attr::kNotUnrolled ("popart_not_unrolled"), for autodiff's error message only. Shapes must be known.
/// Returns how many ops were unrolled.
int unrollControlFlow(Graph &graph, const std::vector<TensorId> &roots = {}, const UnrollOptions &options = {});

/// Why unrollControlFlow cannot unroll \p op (an If, Loop or Scan): its condition or trip count
/// is known only at run time, the unrolled graph would pass the limit...; "" if it can.
std::string unrollObstacle(const Op &op, const UnrollOptions &options = {});

} // namespace popart::ir
