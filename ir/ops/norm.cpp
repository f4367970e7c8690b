// Normalisation ops: BatchNormalization, LayerNormalization, InstanceNormalization, LRN,
// MeanVarianceNormalization, and ai.graphcore BatchNormalizationGrad (training-mode backward).

#include "ir/internal_attributes.hpp"
#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

const std::initializer_list<DataType> kFloatTypes{DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16,
                                                  DataType::BFLOAT16};

void requireChannelVector(const Op &op, size_t i, int64_t c, const char *role) {
  if (op.inInfo(i).elementCount() != c && op.inInfo(i).shape() != Shape{c})
    throw error(op.debugName(), ": ", role, " has shape ", toString(op.inInfo(i).shape()), ", expected [", c, "]");
}

/// BatchNormalization. Internal attribute popart_unbiased_running_var (int, default 0): in training
/// mode, 1 updates running_var with the unbiased batch variance (·N/(N−1), as PyTorch does) instead
/// of the population variance the ONNX spec asks for; Y always uses the population variance.
void setupBatchNorm(Op &op) {
  requireInputCount(op, 5, 5);
  requireType(op, 0, kFloatTypes);
  const Shape &x = op.inInfo(0).shape();
  if (x.size() < 2) throw error(op.debugName(), ": X has shape ", toString(x), ", expected rank >= 2 (N, C, ...)");
  // Opset 6's spatial=0 keeps one statistic per (channel, position).
  int64_t params = x[1];
  if (op.attrs.getInt("spatial", 1) == 0)
    for (size_t i = 2; i < x.size(); ++i)
      params *= x[i];
  const char *roles[] = {"", "scale", "B", "mean", "var"};
  // The parameters and statistics may be of another float type than X (FLOAT beside a 16-bit X
  // under mixed precision); the statistics outputs take the mean's.
  for (size_t i = 1; i < 5; ++i) {
    requireType(op, i, kFloatTypes);
    requireChannelVector(op, i, params, roles[i]);
  }
  bool training = op.version >= 14 && op.attrs.getInt("training_mode", 0) != 0;
  if (op.version >= 14 && !training)
    for (size_t i = 1; i < op.outputCount(); ++i)
      if (op.hasOutput(i)) throw error(op.debugName(), ": output ", i, " is only valid with training_mode=1");
  op.setOutInfo(0, op.inInfo(0));
  for (size_t i = 1; i < op.outputCount(); ++i)
    op.setOutInfo(i, op.inInfo(3));
}

/// ai.graphcore BatchNormalizationGrad: inputs X, scale, dY and optionally the batch mean and
/// (biased) variance that the forward computed; without them the kernel recomputes them from X.
/// Outputs dX (X's type), dScale and dBias (scale's type), each optional. Attribute epsilon as in
/// the forward op.
void setupBatchNormGrad(Op &op) {
  requireInputCount(op, 3, 5);
  requireType(op, 0, kFloatTypes);
  const Shape &x = op.inInfo(0).shape();
  if (x.size() < 2) throw error(op.debugName(), ": X has shape ", toString(x), ", expected rank >= 2 (N, C, ...)");
  requireChannelVector(op, 1, x[1], "scale");
  if (op.inInfo(2).shape() != x)
    throw error(op.debugName(), ": dY has shape ", toString(op.inInfo(2).shape()), ", expected ", toString(x));
  if (op.hasInput(3) != op.hasInput(4))
    throw error(op.debugName(), ": give both the batch mean and variance, or neither");
  // dY is X's type; scale and the statistics may also be FLOAT under a 16-bit X (mixed precision
  // keeps them in fp32, as the forward op reads them).
  const DataType xType = op.inInfo(0).dataType();
  if (op.inInfo(2).dataType() != xType)
    throw error(op.debugName(), ": dY has type ", toString(op.inInfo(2).dataType()), ", expected ", toString(xType),
                " like X");
  for (size_t i : {size_t{1}, size_t{3}, size_t{4}})
    if (op.hasInput(i) && op.inInfo(i).dataType() != xType && op.inInfo(i).dataType() != DataType::FLOAT)
      throw error(op.debugName(), ": input ", i, " has type ", toString(op.inInfo(i).dataType()), ", expected ",
                  toString(xType), " like X, or FLOAT");
  if (op.hasInput(3) && op.inInfo(3).dataType() != op.inInfo(4).dataType())
    throw error(op.debugName(), ": the batch mean is ", toString(op.inInfo(3).dataType()), " and the variance ",
                toString(op.inInfo(4).dataType()), ", expected one type");
  if (op.hasInput(3)) {
    requireChannelVector(op, 3, x[1], "mean");
    requireChannelVector(op, 4, x[1], "var");
  }
  op.setOutInfo(0, op.inInfo(0));
  op.setOutInfo(1, op.inInfo(1));
  op.setOutInfo(2, op.inInfo(1));
}

void setupLayerNorm(Op &op) {
  requireInputCount(op, 2, 3);
  requireType(op, 0, kFloatTypes);
  const Shape &x = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(x.size());
  if (rank == 0) throw error(op.debugName(), ": X must have rank >= 1");
  int64_t axis = normalizeAxis(op.attrs.getInt("axis", -1), rank, op);
  Shape norm(x.begin() + axis, x.end());
  for (size_t i = 1; i < op.inputCount(); ++i) {
    if (!op.hasInput(i)) continue;
    Shape b = broadcastShapes(norm, op.inInfo(i).shape(), op);
    if (b != norm)
      throw error(op.debugName(), ": ", i == 1 ? "Scale" : "B", " has shape ", toString(op.inInfo(i).shape()),
                  " which does not broadcast to the normalised shape ", toString(norm));
  }
  op.setOutInfo(0, op.inInfo(0));
  int64_t stash = op.attrs.getInt("stash_type", 1);
  DataType statType = dataTypeFromOnnx(static_cast<int>(stash));
  if (statType != DataType::FLOAT && statType != DataType::DOUBLE && statType != DataType::FLOAT16 &&
      statType != DataType::BFLOAT16)
    throw error(op.debugName(), ": stash_type ", stash, " is not a floating-point type");
  Shape stat = x;
  for (int64_t i = axis; i < rank; ++i)
    stat[i] = 1;
  op.setOutInfo(1, TensorInfo(statType, stat));
  op.setOutInfo(2, TensorInfo(statType, stat));
}

void setupInstanceNorm(Op &op) {
  requireInputCount(op, 3, 3);
  requireType(op, 0, kFloatTypes);
  const Shape &x = op.inInfo(0).shape();
  if (x.size() < 3)
    throw error(op.debugName(), ": X has shape ", toString(x), ", expected rank >= 3 (N, C, spatial...)");
  requireChannelVector(op, 1, x[1], "scale");
  requireChannelVector(op, 2, x[1], "B");
  op.setOutInfo(0, op.inInfo(0));
}

void setupLRN(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, kFloatTypes);
  if (op.inInfo(0).rank() < 2)
    throw error(op.debugName(), ": X has shape ", toString(op.inInfo(0).shape()), ", expected rank >= 2");
  if (!op.attrs.has("size")) throw error(op.debugName(), ": attribute 'size' is required");
  if (op.attrs.getInt("size") < 1) throw error(op.debugName(), ": size must be >= 1");
  op.setOutInfo(0, op.inInfo(0));
}

void setupMVN(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, kFloatTypes);
  int64_t rank = op.inInfo(0).rank();
  std::vector<int64_t> axes = op.attrs.getInts("axes", {0, 2, 3});
  normalizeAxes(axes, rank, op);
  op.setOutInfo(0, op.inInfo(0));
}

} // namespace

void registerNormOps(OpRegistry &r) {
  OpDef bn = makeDef("BatchNormalization", 6, 1000, setupBatchNorm);
  // In training mode (opset 14+) its outputs 1 and 2 are the updated running mean and variance.
  bn.trainingState = [](const Op &op) {
    if (op.version < 14 || op.attrs.getInt("training_mode", 0) == 0) return std::vector<OpDef::InPlace>{};
    return std::vector<OpDef::InPlace>{{1, 3}, {2, 4}};
  };
  bn.internalAttributes = {ir::internal_attr::kUnbiasedRunningVar}; // runningVarianceFactor (norm.hpp)
  bn.fusionFields = fusionFieldBits({FusionField::Relu});
  r.add(bn);
  OpDef bnGrad = makeDef("BatchNormalizationGrad", 1, 1000, setupBatchNormGrad);
  bnGrad.domain = "ai.graphcore";
  r.add(bnGrad);
  r.add(makeDef("LayerNormalization", 17, 1000, setupLayerNorm));
  r.add(makeDef("InstanceNormalization", 1, 1000, setupInstanceNorm));
  r.add(makeDef("LRN", 1, 1000, setupLRN));
  r.add(makeDef("MeanVarianceNormalization", 9, 1000, setupMVN));
}

} // namespace popart::ir
