// PopART's ai.graphcore opset 1: GroupNormalization, Scale, Subsample, Detach, Init, IdentityLoss,
// Nll, L1 and PrintTensor, with the grad ops GroupNormalizationGrad, SubsampleGrad and NllGrad.

#include "ir/ops/graphcore.hpp"
#include "ir/ops/helpers.hpp"

#include <string>

namespace popart::ir {

namespace {

const std::initializer_list<DataType> kFloatTypes{DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16,
                                                  DataType::BFLOAT16};

void requireAttribute(const Op &op, const char *name) {
  if (!op.attrs.has(name)) throw error(op.debugName(), ": attribute '", name, "' is required");
}

/// The num_groups attribute of GroupNormalization(Grad) \p op over \p channels channels.
int64_t groupCount(const Op &op, int64_t channels) {
  requireAttribute(op, "num_groups");
  int64_t groups = op.attrs.getInt("num_groups");
  if (groups < 1 || channels % groups != 0)
    throw error(op.debugName(), ": num_groups ", groups, " does not divide the ", channels, " channels");
  return groups;
}

/// X [N, C, ...]: its rank checked.
const Shape &channelsFirst(const Op &op) {
  const Shape &x = op.inInfo(0).shape();
  if (x.size() < 2) throw error(op.debugName(), ": X has shape ", toString(x), ", expected rank >= 2 (N, C, ...)");
  return x;
}

void requireVector(const Op &op, size_t i, const char *role, const Shape &shape, DataType type) {
  if (op.inInfo(i).shape() != shape || op.inInfo(i).dataType() != type)
    throw error(op.debugName(), ": ", role, " ('", op.input(i).id(), "') is ", op.inInfo(i).toString(), ", expected ",
                TensorInfo(type, shape).toString());
}

/// GroupNormalization: X [N, C, ...], Scale [C], Bias [C] -> Y (X's info), Mean and InvStdDev
/// [N·num_groups], X's type. Group g holds channels [g·C/G, (g+1)·C/G) (PopART's default
/// grouping, torch.nn.GroupNorm's); its statistics are element n·G + g.
void setupGroupNorm(Op &op) {
  requireInputCount(op, 3, 3);
  requireType(op, 0, kFloatTypes);
  const Shape &x = channelsFirst(op);
  const DataType type = op.inInfo(0).dataType();
  int64_t groups = groupCount(op, x[1]);
  requireVector(op, 1, "Scale", {x[1]}, type);
  requireVector(op, 2, "Bias", {x[1]}, type);
  op.setOutInfo(0, op.inInfo(0));
  op.setOutInfo(1, TensorInfo(type, {x[0] * groups}));
  op.setOutInfo(2, TensorInfo(type, {x[0] * groups}));
}

/// GroupNormalizationGrad: X, Scale, Mean, InvStdDev (the forward's outputs 1 and 2; both omitted:
/// recomputed from X), dY -> dX, dScale, dBias. Attributes num_groups and epsilon as the forward's.
void setupGroupNormGrad(Op &op) {
  requireInputCount(op, 5, 5);
  requireType(op, 0, kFloatTypes);
  const Shape &x = channelsFirst(op);
  const DataType type = op.inInfo(0).dataType();
  int64_t groups = groupCount(op, x[1]);
  requireVector(op, 1, "Scale", {x[1]}, type);
  if (op.hasInput(2) != op.hasInput(3)) throw error(op.debugName(), ": give both Mean and InvStdDev, or neither");
  if (op.hasInput(2)) {
    requireVector(op, 2, "Mean", {x[0] * groups}, type);
    requireVector(op, 3, "InvStdDev", {x[0] * groups}, type);
  }
  requireVector(op, 4, "dY", x, type);
  op.setOutInfo(0, op.inInfo(0));
  op.setOutInfo(1, op.inInfo(1));
  op.setOutInfo(2, op.inInfo(1));
}

/// Scale: Y = X · scale (attribute, default 1).
void setupScale(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, kFloatTypes);
  setupSameAsInput0(op);
}

/// The strides attribute of Subsample(Grad) \p op: one per dimension of a tensor of rank \p rank,
/// each >= 1.
std::vector<int64_t> subsampleStrides(const Op &op, size_t rank) {
  requireAttribute(op, "strides");
  std::vector<int64_t> strides = op.attrs.getInts("strides");
  if (strides.size() != rank)
    throw error(op.debugName(), ": strides has ", strides.size(), " values, expected one per dimension (", rank, ")");
  for (size_t d = 0; d < strides.size(); ++d)
    if (strides[d] < 1) throw error(op.debugName(), ": stride ", strides[d], " of dimension ", d, " is not >= 1");
  return strides;
}

/// Subsample: every strides[d]-th element along each dimension d from the first; a dimension of
/// size n becomes ⌈n / strides[d]⌉.
void setupSubsample(Op &op) {
  requireInputCount(op, 1, 1);
  const Shape &x = op.inInfo(0).shape();
  std::vector<int64_t> strides = subsampleStrides(op, x.size());
  Shape y(x.size());
  for (size_t d = 0; d < x.size(); ++d)
    y[d] = (x[d] + strides[d] - 1) / strides[d];
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), y));
}

/// SubsampleGrad: dY -> dX of the forward input's shape (attribute shape), dY at the kept
/// positions and 0 elsewhere.
void setupSubsampleGrad(Op &op) {
  requireInputCount(op, 1, 1);
  requireAttribute(op, "shape");
  std::vector<int64_t> shape = op.attrs.getInts("shape");
  Shape x(shape.begin(), shape.end());
  std::vector<int64_t> strides = subsampleStrides(op, x.size());
  Shape y(x.size());
  for (size_t d = 0; d < x.size(); ++d)
    y[d] = (x[d] + strides[d] - 1) / strides[d];
  if (op.inInfo(0).shape() != y)
    throw error(op.debugName(), ": dY has shape ", toString(op.inInfo(0).shape()), ", expected ", toString(y),
                " for an input of shape ", toString(x));
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), x));
}

/// Detach: the identity, through which no gradient flows.
void setupDetach(Op &op) {
  requireInputCount(op, 1, 1);
  setupSameAsInput0(op);
}

/// Init: no inputs; a tensor of attributes shape and data_type (this runtime's DataType values,
/// which are ONNX's), zero-filled. tensor_type (PopART's TensorType: 0 ActGrad ... 4 Variable) and
/// init_type (0 NoInit, 1 Zero) are checked; both kinds give zeros, and the output is an ordinary
/// tensor whatever its tensor_type.
void setupInit(Op &op) {
  requireInputCount(op, 0, 0);
  for (const char *a : {"shape", "data_type", "tensor_type", "init_type"})
    requireAttribute(op, a);
  std::vector<int64_t> shape = op.attrs.getInts("shape");
  for (int64_t d : shape)
    if (d < 0)
      throw error(op.debugName(), ": shape ", toString(Shape(shape.begin(), shape.end())), " has a negative dimension");
  int64_t dataType = op.attrs.getInt("data_type");
  DataType type = DataType::UNDEFINED;
  try {
    type = dataTypeFromOnnx(static_cast<int>(dataType));
  } catch (const error &) {
    type = DataType::UNDEFINED;
  }
  if (type == DataType::UNDEFINED || type == DataType::STRING || dataTypeSize(type) == 0)
    throw error(op.debugName(), ": data_type ", dataType, " is not a numeric or boolean DataType");
  int64_t tensorType = op.attrs.getInt("tensor_type");
  if (tensorType < 0 || tensorType > 4)
    throw error(op.debugName(), ": tensor_type ", tensorType, " is not a TensorType (0 ActGrad to 4 Variable)");
  int64_t initType = op.attrs.getInt("init_type");
  if (initType != 0 && initType != 1)
    throw error(op.debugName(), ": init_type ", initType, " is not 0 (NoInit) or 1 (Zero)");
  if (op.attrs.has("batch_axis")) {
    int64_t axis = op.attrs.getInt("batch_axis");
    if (axis != -1) normalizeAxis(axis, static_cast<int64_t>(shape.size()), op);
  }
  op.setOutInfo(0, TensorInfo(type, Shape(shape.begin(), shape.end())));
}

/// The loss's output: a scalar, or \p perElement for reduction None.
TensorInfo lossOutput(const Op &op, DataType type, const Shape &perElement) {
  return TensorInfo(type, lossReduction(op) == LossReduction::None ? perElement : Shape{});
}

/// IdentityLoss: the sum or mean of every element of X, or X itself (reduction None).
void setupIdentityLoss(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, kFloatTypes);
  op.setOutInfo(0, lossOutput(op, op.inInfo(0).dataType(), op.inInfo(0).shape()));
}

/// L1: lambda · |X|, summed, averaged over every element, or per element (reduction None).
void setupL1(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, kFloatTypes);
  requireAttribute(op, "lambda");
  op.setOutInfo(0, lossOutput(op, op.inInfo(0).dataType(), op.inInfo(0).shape()));
}

/// Probabilities [..., C] (classes last, as PopART's Nll) and integer labels [...]: the labels' shape.
Shape nllLabelShape(const Op &op) {
  requireType(op, 0, kFloatTypes);
  requireType(op, 1,
              {DataType::INT32, DataType::INT64, DataType::UINT32, DataType::INT16, DataType::INT8, DataType::UINT8,
               DataType::UINT16});
  const Shape &p = op.inInfo(0).shape();
  if (p.empty()) throw error(op.debugName(), ": the probabilities are a scalar, expected [..., classes]");
  Shape labels(p.begin(), p.end() - 1);
  if (op.inInfo(1).shape() != labels)
    throw error(op.debugName(), ": the label ('", op.input(1).id(), "') has shape ", toString(op.inInfo(1).shape()),
                ", expected ", toString(labels), ", all but the last dimension of the probabilities ", toString(p));
  nllIgnoreIndex(op);
  return labels;
}

/// Nll: −log(max(p[label], floor)) per label position (inputIsLogProbability: −p[label]), 0 where
/// the label is ignoreIndex; summed, averaged over the positions not ignored, or per position.
void setupNll(Op &op) {
  requireInputCount(op, 2, 2);
  Shape labels = nllLabelShape(op);
  op.setOutInfo(0, lossOutput(op, op.inInfo(0).dataType(), labels));
}

/// NllGrad: probabilities, label, dY (a scalar, or of the label's shape for reduction None) -> the
/// probabilities' gradient. Attributes as Nll's.
void setupNllGrad(Op &op) {
  requireInputCount(op, 3, 3);
  Shape labels = nllLabelShape(op);
  TensorInfo dy = lossOutput(op, op.inInfo(0).dataType(), labels);
  if (op.inInfo(2).dataType() != dy.dataType() || op.inInfo(2).elementCount() != dy.elementCount())
    throw error(op.debugName(), ": dY is ", op.inInfo(2).toString(), ", expected ", dy.toString());
  op.setOutInfo(0, op.inInfo(0));
}

/// PrintTensor: the identity, which logs its input (at info level) with its title; attributes
/// print_gradient (default 1: the gradient is logged too), title, summariseThreshold (default
/// 1000: larger tensors show their first and last edgeItems, default 3, elements).
void setupPrintTensor(Op &op) {
  requireInputCount(op, 1, 1);
  if (op.attrs.getInt("summariseThreshold", 1000) < 0 || op.attrs.getInt("edgeItems", 3) < 0)
    throw error(op.debugName(), ": summariseThreshold and edgeItems must be >= 0");
  setupSameAsInput0(op);
}

OpDef graphcoreDef(const char *type, void (*setup)(Op &)) {
  OpDef d = makeDef(type, 1, 1000, setup);
  d.domain = "ai.graphcore";
  return d;
}

} // namespace

LossReduction lossReduction(const Op &op) {
  if (!op.attrs.has("reduction"))
    throw error(op.debugName(), ": attribute 'reduction' is required (Sum, Mean or None)");
  std::string r = op.attrs.getString("reduction");
  if (r == "Sum") return LossReduction::Sum;
  if (r == "Mean") return LossReduction::Mean;
  if (r == "None") return LossReduction::None;
  throw error(op.debugName(), ": reduction '", r, "' is not one of Sum, Mean, None");
}

std::optional<int64_t> nllIgnoreIndex(const Op &op) {
  if (!op.attrs.has("ignoreIndex")) return std::nullopt;
  return op.attrs.getInt("ignoreIndex");
}

double nllProbabilityFloor(DataType type) { return type == DataType::FLOAT16 ? 6.104e-5 : 1e-7; }

void registerGraphcoreOps(OpRegistry &r) {
  r.add(graphcoreDef("GroupNormalization", setupGroupNorm));
  r.add(graphcoreDef("GroupNormalizationGrad", setupGroupNormGrad));
  r.add(graphcoreDef("Scale", setupScale));
  r.add(graphcoreDef("Subsample", setupSubsample));
  r.add(graphcoreDef("SubsampleGrad", setupSubsampleGrad));
  r.add(graphcoreDef("Detach", setupDetach));
  r.add(graphcoreDef("Init", setupInit));
  r.add(graphcoreDef("IdentityLoss", setupIdentityLoss));
  r.add(graphcoreDef("Nll", setupNll));
  r.add(graphcoreDef("NllGrad", setupNllGrad));
  r.add(graphcoreDef("L1", setupL1));
  // Printing is its effect: never folded away at compile time.
  OpDef print = graphcoreDef("PrintTensor", setupPrintTensor);
  print.foldable = false;
  r.add(print);
}

} // namespace popart::ir
