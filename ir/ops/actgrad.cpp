// Gradient ops of softmax, layer normalisation and elementwise activations (domain ai.graphcore),
// created by the autodiff rules where a dedicated backward kernel beats a composition:
//   SoftmaxGrad(Y, dY) -> dX               dX = Y·(dY − Σ dY·Y) over the single axis `axis`
//   LogSoftmaxGrad(Y, dY) -> dX            dX = dY − exp(Y)·Σ dY over `axis`
//   LayerNormalizationGrad(X, scale, dY [, mean, invStdDev]) -> dX, dScale, dBias
//   ActivationGrad(X or Y, dY) -> dX       attribute activation, see setupActivationGrad
// The softmax ops have opset-13 semantics only (one axis, default -1): the rules reshape the
// older, flattened form to 2-D.

#include "ir/ops/actgrad.hpp"
#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

#include <map>

namespace popart::ir {

namespace {

const std::initializer_list<DataType> kFloatTypes{DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16,
                                                  DataType::BFLOAT16};

/// Inputs 0 and 1 have the same type and shape; output 0 gets their info.
void setupSameTwo(Op &op) {
  requireInputCount(op, 2, 2);
  requireType(op, 0, kFloatTypes);
  if (op.inInfo(1) != op.inInfo(0))
    throw error(op.debugName(), ": dY ", toString(op.inInfo(1).shape()), " of ", toString(op.inInfo(1).dataType()),
                " must match input 0 ", toString(op.inInfo(0).shape()), " of ", toString(op.inInfo(0).dataType()));
  op.setOutInfo(0, op.inInfo(0));
}

void setupSoftmaxGrad(Op &op) {
  setupSameTwo(op);
  int64_t rank = op.inInfo(0).rank();
  if (rank == 0) throw error(op.debugName(), ": input must have rank at least 1");
  normalizeAxis(op.attrs.getInt("axis", -1), rank, op);
}

/// LayerNormalizationGrad: X, scale (holding the normalised shape's element count: the rule
/// expands a broadcast scale), dY like X, and optionally the forward's Mean and InvStdDev
/// outputs (X's type, one value per normalised row); without them the kernel recomputes them.
/// Outputs dX, dScale, dBias (each optional; dScale and dBias of the normalised shape). Attributes
/// axis and epsilon as the forward op.
void setupLayerNormGrad(Op &op) {
  requireInputCount(op, 3, 5);
  requireType(op, 0, kFloatTypes);
  const Shape &x = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(x.size());
  if (rank == 0) throw error(op.debugName(), ": X must have rank >= 1");
  int64_t axis = normalizeAxis(op.attrs.getInt("axis", -1), rank, op);
  int64_t outer = shapeElementCount(Shape(x.begin(), x.begin() + axis));
  int64_t inner = shapeElementCount(Shape(x.begin() + axis, x.end()));
  if (op.inInfo(1).elementCount() != inner)
    throw error(op.debugName(), ": scale has shape ", toString(op.inInfo(1).shape()), ", expected ", inner,
                " elements (the normalised shape)");
  if (op.inInfo(2).shape() != x)
    throw error(op.debugName(), ": dY has shape ", toString(op.inInfo(2).shape()), ", expected ", toString(x));
  if (op.hasInput(3) != op.hasInput(4)) throw error(op.debugName(), ": give both the mean and InvStdDev, or neither");
  for (size_t i = 1; i < op.inputCount(); ++i)
    if (op.hasInput(i) && op.inInfo(i).dataType() != op.inInfo(0).dataType())
      throw error(op.debugName(), ": input ", i, " has type ", toString(op.inInfo(i).dataType()), ", expected ",
                  toString(op.inInfo(0).dataType()), " like X");
  for (size_t i : {3, 4})
    if (op.hasInput(i) && op.inInfo(i).elementCount() != outer)
      throw error(op.debugName(), ": input ", i, " has shape ", toString(op.inInfo(i).shape()), ", expected ", outer,
                  " elements (one per normalised row)");
  op.setOutInfo(0, op.inInfo(0));
  TensorInfo norm(op.inInfo(0).dataType(), Shape(x.begin() + axis, x.end()));
  op.setOutInfo(1, norm);
  op.setOutInfo(2, norm);
}

} // namespace

bool activationGradForm(const std::string &act, bool &takesOutput) {
  static const std::map<std::string, bool> m{{"Relu", true},       {"Elu", true},  {"Tanh", true},
                                             {"Sigmoid", true},    {"Exp", true},  {"Sqrt", true},
                                             {"LeakyRelu", false}, {"Abs", false}, {"Clip", false},
                                             {"Gelu", false}};
  auto it = m.find(act);
  if (it == m.end()) return false;
  takesOutput = it->second;
  return true;
}

namespace {

/// ActivationGrad(input, dY) -> dX, attribute activation (string) with its parameters:
///   Relu(Y):           dY where Y > 0, else 0
///   Elu(Y), alpha ≥ 0: dY where Y > 0, else dY·(Y + alpha)
///   Tanh(Y):           dY·(1 − Y²)
///   Sigmoid(Y):        dY·Y·(1 − Y)
///   Exp(Y):            dY·Y
///   Sqrt(Y):           dY / (2·Y)
///   LeakyRelu(X):      dY where X > 0, else alpha·dY
///   Abs(X):            dY·sign(X)
///   Clip(X):           dY where alpha ≤ X ≤ beta, else 0 (bounds ±inf when absent)
///   Gelu(X):           dY·(Φ(X) + X·φ(X)), Φ and φ the standard normal CDF and density
/// Input 0 is the forward output Y where the derivative is a function of it, so the forward input
/// need not be kept; else the forward input X.
void setupActivationGrad(Op &op) {
  setupSameTwo(op);
  if (!op.attrs.has("activation")) throw error(op.debugName(), ": attribute 'activation' is required");
  std::string act = op.attrs.getString("activation");
  bool takesOutput = false;
  if (!activationGradForm(act, takesOutput))
    throw error(op.debugName(), ": activation '", act, "' has no ActivationGrad form");
  if (act == "Elu" && op.attrs.getFloat("alpha", 1.f) < 0)
    throw error(op.debugName(), ": Elu's gradient from its output needs alpha >= 0");
}

} // namespace

void registerActGradOps(OpRegistry &r) {
  for (OpDef d :
       {makeDef("SoftmaxGrad", 1, 1000, setupSoftmaxGrad), makeDef("LogSoftmaxGrad", 1, 1000, setupSoftmaxGrad),
        makeDef("LayerNormalizationGrad", 1, 1000, setupLayerNormGrad),
        makeDef("ActivationGrad", 1, 1000, setupActivationGrad)}) {
    d.domain = "ai.graphcore";
    r.add(d);
  }
}

} // namespace popart::ir
