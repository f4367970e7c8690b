// Elementwise ops: unary maths and activations, broadcasting binary and variadic ops,
// comparisons and logic, Where, Clip, Cast.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

void setupBroadcast(Op &op) {
  requireInputCount(op, 1, 1000);
  Shape shape = op.inInfo(0).shape();
  DataType type = op.inInfo(0).dataType();
  for (size_t i = 1; i < op.inputCount(); ++i) {
    if (op.inInfo(i).dataType() != type && op.type != "Pow" && op.type != "BitShift")
      throw error(op.debugName(), ": input ", i, " ('", op.input(i).id(), "') has type ",
                  toString(op.inInfo(i).dataType()), " but input 0 has type ", toString(type));
    shape = broadcastShapes(shape, op.inInfo(i).shape(), op);
  }
  op.setOutInfo(0, TensorInfo(type, shape));
}

void setupCompare(Op &op) {
  requireInputCount(op, 2, 2);
  setupBroadcast(op);
  op.setOutInfo(0, TensorInfo(DataType::BOOL, op.outInfo(0).shape()));
}

void setupLogical(Op &op) {
  requireInputCount(op, 2, 2);
  requireType(op, 0, {DataType::BOOL});
  setupBroadcast(op);
}

void setupUnary(Op &op) {
  requireInputCount(op, 1, 1);
  setupSameAsInput0(op);
}

void setupFloatUnary(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, {DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16, DataType::BFLOAT16});
  setupSameAsInput0(op);
}

void setupNot(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, {DataType::BOOL});
  setupSameAsInput0(op);
}

void setupIsNanInf(Op &op) {
  requireInputCount(op, 1, 1);
  setupSameShape(op, DataType::BOOL);
}

void setupPRelu(Op &op) {
  requireInputCount(op, 2, 2);
  const Shape &x = op.inInfo(0).shape(), &slope = op.inInfo(1).shape();
  // Before opset 7 a 1-D slope of size C applies along the channel axis (PyTorch's exports).
  if (op.version < 7 && slope.size() == 1 && x.size() >= 2 && slope[0] == x[1] && x.size() > 2) {
    op.attrs.set("channel_slope", int64_t{1});
    setupSameAsInput0(op);
    return;
  }
  Shape s = broadcastShapes(op.inInfo(0).shape(), op.inInfo(1).shape(), op);
  if (s != op.inInfo(0).shape())
    throw error(op.debugName(), ": slope shape ", toString(op.inInfo(1).shape()), " does not broadcast to input shape ",
                toString(op.inInfo(0).shape()));
  setupSameAsInput0(op);
}

void setupWhere(Op &op) {
  requireInputCount(op, 3, 3);
  requireType(op, 0, {DataType::BOOL});
  if (op.inInfo(1).dataType() != op.inInfo(2).dataType())
    throw error(op.debugName(), ": X and Y have different types ", toString(op.inInfo(1).dataType()), " and ",
                toString(op.inInfo(2).dataType()));
  Shape s = broadcastShapes(broadcastShapes(op.inInfo(0).shape(), op.inInfo(1).shape(), op), op.inInfo(2).shape(), op);
  op.setOutInfo(0, TensorInfo(op.inInfo(1).dataType(), s));
}

void setupClip(Op &op) {
  requireInputCount(op, 1, 3);
  setupSameAsInput0(op);
}

void canonicalizeClip(Op &op, Graph &graph) {
  // Clip before opset 11 takes min and max as attributes; from 11 they are inputs.
  if (!op.attrs.has("min") && !op.attrs.has("max")) return;
  if (op.attrs.has("min")) moveFloatAttributeToInput(op, graph, "min", 1, DataType::FLOAT);
  if (op.attrs.has("max")) moveFloatAttributeToInput(op, graph, "max", 2, DataType::FLOAT);
}

void setupCast(Op &op) {
  requireInputCount(op, 1, 1);
  setupSameShape(op, dataTypeFromOnnx(static_cast<int>(op.attrs.getInt("to"))));
}

void setupCastLike(Op &op) {
  requireInputCount(op, 2, 2);
  setupSameShape(op, op.inInfo(1).dataType());
}

void setupIdentity(Op &op) { setupSameAsInput0(op); }

} // namespace

void registerElementwiseOps(OpRegistry &r) {
  for (const char *t : {"Abs", "Neg", "Sign", "Identity"})
    r.add(makeDef(t, 1, 1000, setupUnary));
  for (const char *t : {"Reciprocal", "Floor", "Ceil",      "Sqrt",        "Relu",      "Exp",
                        "Log",        "Tanh",  "Sigmoid",   "Erf",         "Sin",       "Cos",
                        "Tan",        "Asin",  "Acos",      "Atan",        "Sinh",      "Cosh",
                        "Asinh",      "Acosh", "Atanh",     "Round",       "Softsign",  "Softplus",
                        "Elu",        "Selu",  "LeakyRelu", "HardSigmoid", "HardSwish", "ThresholdedRelu",
                        "Celu",       "Shrink"})
    r.add(makeDef(t, 1, 1000,
                  std::string(t) == "Relu" || std::string(t) == "Abs" || std::string(t) == "Shrink" ? setupUnary
                                                                                                    : setupFloatUnary));
  // PopART's ai.graphcore Gelu, exact form 0.5·x·(1 + erf(x/√2)); fuseGelu forms it from ONNX's
  // decomposition.
  OpDef gelu = makeDef("Gelu", 1, 1000, setupFloatUnary);
  gelu.domain = "ai.graphcore";
  r.add(gelu);
  r.add(makeDef("Not", 1, 1000, setupNot));
  r.add(makeDef("IsNaN", 9, 1000, setupIsNanInf));
  r.add(makeDef("IsInf", 10, 1000, setupIsNanInf));
  for (const char *t : {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean"})
    r.add(makeDef(t, 1, 1000, setupBroadcast));
  r.add(makeDef("Mod", 10, 1000, setupBroadcast));
  r.add(makeDef("BitShift", 11, 1000, setupBroadcast));
  for (const char *t : {"Equal", "Less", "Greater"})
    r.add(makeDef(t, 1, 1000, setupCompare));
  for (const char *t : {"LessOrEqual", "GreaterOrEqual"})
    r.add(makeDef(t, 12, 1000, setupCompare));
  for (const char *t : {"And", "Or", "Xor"})
    r.add(makeDef(t, 1, 1000, setupLogical));
  r.add(makeDef("PRelu", 1, 1000, setupPRelu));
  r.add(makeDef("Where", 9, 1000, setupWhere));
  OpDef clip = makeDef("Clip", 1, 1000, setupClip);
  clip.canonicalize = canonicalizeClip;
  clip.valueInputs = {};
  r.add(clip);
  r.add(makeDef("Cast", 1, 1000, setupCast));
  OpDef castLike = makeDef("CastLike", 15, 1000, setupCastLike);
  castLike.shapeOnlyInputs = {1};
  r.add(castLike);
  (void)setupIdentity;
}

} // namespace popart::ir
