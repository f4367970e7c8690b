// Loss ops: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (opset 12+).

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

/// Both losses take scores/log-probabilities [N, C, D1..Dk], labels [N, D1..Dk] and optional weights [C].
void setupLoss(Op &op) {
  requireInputCount(op, 2, 3);
  const TensorInfo &x = op.inInfo(0);
  requireType(op, 0, {DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16, DataType::BFLOAT16});
  requireType(op, 1, {DataType::INT32, DataType::INT64});
  if (x.rank() < 2) throw error(op.debugName(), ": input 0 must have rank >= 2 (N, C, ...), got ", toString(x.shape()));
  Shape labels = x.shape();
  labels.erase(labels.begin() + 1);
  if (op.inInfo(1).shape() != labels)
    throw error(op.debugName(), ": labels have shape ", toString(op.inInfo(1).shape()), ", expected ", toString(labels),
                " for input of shape ", toString(x.shape()));
  if (op.hasInput(2)) {
    if (op.inInfo(2).shape() != Shape{x.dim(1)})
      throw error(op.debugName(), ": weights have shape ", toString(op.inInfo(2).shape()), ", expected [", x.dim(1),
                  "]");
    if (op.inInfo(2).dataType() != x.dataType())
      throw error(op.debugName(), ": weights have type ", toString(op.inInfo(2).dataType()), ", expected ",
                  toString(x.dataType()));
  }
  std::string reduction = op.attrs.getString("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    throw error(op.debugName(), ": reduction '", reduction, "' is not one of none, sum, mean");
  op.setOutInfo(0, TensorInfo(x.dataType(), reduction == "none" ? labels : Shape{}));
  if (op.type == "SoftmaxCrossEntropyLoss") op.setOutInfo(1, x);
}

/// ai.graphcore SoftmaxCrossEntropyLossGrad: scores X [N, C, D...], labels, weights (optional),
/// dY (the loss gradient: a scalar, or [N, D...] for reduction none) -> dX [, class sums]. Attributes
/// as the forward op (reduction, ignore_index). Optional output 1 (fuseLossGradClassSums): dX
/// summed over every axis but the class axis, [C]. Optional output 2 (fuseLossWithGradient): the
/// forward's loss, computed in the same pass (labels out of range are then errors, as there).
/// FLOAT16 or BFLOAT16 scores (foldLossCasts: mixed precision's logits, without the Casts to and from
/// the fp32 loss) take a FLOAT dY and FLOAT or same-type weights: dX and the class sums are in the
/// scores' type, the loss in dY's, all computed in fp32 or wider.
void setupSoftmaxCrossEntropyGrad(Op &op) {
  requireInputCount(op, 4, 4);
  const TensorInfo &x = op.inInfo(0);
  requireType(op, 0, {DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16, DataType::BFLOAT16});
  requireType(op, 1, {DataType::INT32, DataType::INT64});
  if (x.rank() < 2) throw error(op.debugName(), ": input 0 must have rank >= 2 (N, C, ...), got ", toString(x.shape()));
  const bool sixteenBit = x.dataType() == DataType::FLOAT16 || x.dataType() == DataType::BFLOAT16;
  // The type of dY (and of the loss): the scores', or FLOAT for 16-bit scores.
  const DataType seedType = sixteenBit ? DataType::FLOAT : x.dataType();
  Shape labels = x.shape();
  labels.erase(labels.begin() + 1);
  if (op.inInfo(1).shape() != labels)
    throw error(op.debugName(), ": labels have shape ", toString(op.inInfo(1).shape()), ", expected ",
                toString(labels));
  if (op.hasInput(2) && (op.inInfo(2).shape() != Shape{x.dim(1)} ||
                         (op.inInfo(2).dataType() != x.dataType() && op.inInfo(2).dataType() != seedType)))
    throw error(op.debugName(), ": weights are ", op.inInfo(2).toString(), ", expected ", toString(x.dataType()),
                sixteenBit ? " or FLOAT" : "", " [", x.dim(1), "]");
  std::string reduction = op.attrs.getString("reduction", "mean");
  Shape dy = reduction == "none" ? labels : Shape{};
  if (op.inInfo(3).dataType() != seedType || op.inInfo(3).elementCount() != shapeElementCount(dy))
    throw error(op.debugName(), ": the loss gradient is ", op.inInfo(3).toString(), ", expected ", toString(seedType),
                " ", toString(dy));
  op.setOutInfo(0, x);
  if (op.hasOutput(1)) op.setOutInfo(1, TensorInfo(x.dataType(), {x.dim(1)}));
  if (op.hasOutput(2)) op.setOutInfo(2, TensorInfo(seedType, dy));
}

} // namespace

void registerLossOps(OpRegistry &r) {
  r.add(makeDef("SoftmaxCrossEntropyLoss", 12, 1000, setupLoss));
  r.add(makeDef("NegativeLogLikelihoodLoss", 12, 1000, setupLoss));
  OpDef grad = makeDef("SoftmaxCrossEntropyLossGrad", 1, 1000, setupSoftmaxCrossEntropyGrad);
  grad.domain = "ai.graphcore";
  r.add(grad);
}

} // namespace popart::ir
