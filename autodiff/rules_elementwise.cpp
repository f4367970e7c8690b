// Gradient rules of elementwise ops. The common activations of floating-point tensors use the
// ai.graphcore ActivationGrad op (ir/ops/actgrad.cpp), which has a oneDNN eltwise_backward kernel;
// other types and forms keep their composition of forward ops.

#include "autodiff/grad_rules.hpp"
#include "ir/ops/actgrad.hpp"

#include <popart/error.hpp>

#include <cmath>

namespace popart::autodiff {

namespace {

/// Max/Min of two inputs: the gradient goes to the selected one (to input 0 on ties).
void minMaxRule(GradContext &c, const char *beats) {
  if (c.op().inputCount() == 1) {
    c.setInGrad(0, c.outGrad(0));
    return;
  }
  if (c.op().inputCount() != 2)
    throw error(c.op().debugName(), ": gradient of ", c.op().type, " needs 1 or 2 inputs, got ", c.op().inputCount());
  TensorId secondWins = c.add(beats, {c.in(1), c.in(0)});
  c.setInGrad(0, c.add("Where", {secondWins, c.scalar(0), c.outGrad(0)}));
  c.setInGrad(1, c.add("Where", {secondWins, c.outGrad(0), c.scalar(0)}));
}

/// Sets dX to ActivationGrad(X or Y, dY) with activation \p act and \returns true, if \p c's op
/// is floating point (and its parameters fit: Elu's alpha >= 0, Clip's bounds constants that a
/// float attribute holds exactly); else \returns false and the caller composes.
bool activationGrad(GradContext &c, const std::string &act) {
  const ir::Op &op = c.op();
  if (!isFloatingPoint(op.inInfo(0).dataType()) || c.outGrad(0).empty()) return false;
  bool takesOutput = false;
  if (!ir::activationGradForm(act, takesOutput)) return false;
  ir::Attributes a;
  a.set("activation", act);
  if (act == "LeakyRelu") a.set("alpha", op.attrs.getFloat("alpha", 0.01f));
  if (act == "Elu") {
    float alpha = op.attrs.getFloat("alpha", 1.f);
    if (alpha < 0) return false;
    a.set("alpha", alpha);
  }
  if (act == "Clip") {
    float bounds[2] = {-INFINITY, INFINITY};
    for (size_t i : {1, 2}) {
      if (!op.hasInput(i)) continue;
      if (!op.input(i).isConst()) return false;
      std::vector<double> v = op.input(i).data()->toDoubleVector();
      if (v.size() != 1 || static_cast<double>(static_cast<float>(v[0])) != v[0]) return false;
      bounds[i - 1] = static_cast<float>(v[0]);
    }
    a.set("alpha", bounds[0]);
    a.set("beta", bounds[1]);
  }
  TensorId dx = c.graph().uniqueId(c.out(0) + "_grad_ActivationGrad");
  ir::Op &grad = c.graph().addOp("ActivationGrad", "ai.graphcore", 1, "", std::move(a),
                                 {takesOutput ? c.out(0) : c.in(0), c.outGrad(0)}, {dx});
  grad.def->setup(grad);
  c.setInGrad(0, dx);
  return true;
}

/// Wraps \p composed: ActivationGrad where it applies, else \p composed.
GradRule orActivationGrad(const char *act, GradRule composed) {
  return [act, composed](GradContext &c) {
    if (!activationGrad(c, act)) composed(c);
  };
}

} // namespace

void registerElementwiseRules(GradRuleRegistry &r) {
  std::map<std::string, GradRule> rules{
      {"Identity", [](GradContext &c) { c.setInGrad(0, c.outGrad(0)); }},
      {"Add",
       [](GradContext &c) {
         c.setInGrad(0, c.outGrad(0));
         c.setInGrad(1, c.outGrad(0));
       }},
      {"Sub",
       [](GradContext &c) {
         c.setInGrad(0, c.outGrad(0));
         c.setInGrad(1, c.add("Neg", {c.outGrad(0)}));
       }},
      {"Mul",
       [](GradContext &c) {
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.in(1)}));
         c.setInGrad(1, c.add("Mul", {c.outGrad(0), c.in(0)}));
       }},
      {"Div",
       [](GradContext &c) { // d(a/b) = g/b, -g·a/b²
         c.setInGrad(0, c.add("Div", {c.outGrad(0), c.in(1)}));
         TensorId q = c.add("Div", {c.out(0), c.in(1)});
         c.setInGrad(1, c.add("Neg", {c.add("Mul", {c.outGrad(0), q})}));
       }},
      {"Neg", [](GradContext &c) { c.setInGrad(0, c.add("Neg", {c.outGrad(0)})); }},
      {"Exp",
       [](GradContext &c) {
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.out(0)}));
       }},
      {"Tanh",
       [](GradContext &c) { // g·(1 − y²)
         TensorId y2 = c.add("Mul", {c.out(0), c.out(0)});
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.add("Sub", {c.scalar(1), y2})}));
       }},
      {"Sigmoid",
       [](GradContext &c) { // g·y·(1 − y)
         TensorId oneMinus = c.add("Sub", {c.scalar(1), c.out(0)});
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.add("Mul", {c.out(0), oneMinus})}));
       }},
      {"Relu",
       [](GradContext &c) { // g where x > 0
         TensorId positive = c.add("Greater", {c.in(0), c.scalar(0)});
         c.setInGrad(0, c.add("Where", {positive, c.outGrad(0), c.scalar(0)}));
       }},
      {"Sqrt",
       [](GradContext &c) { // g / (2·y)
         c.setInGrad(0, c.add("Div", {c.outGrad(0), c.add("Mul", {c.scalar(2), c.out(0)})}));
       }},
      {"Log",
       [](GradContext &c) {
         c.setInGrad(0, c.add("Div", {c.outGrad(0), c.in(0)}));
       }},
      {"Abs",
       [](GradContext &c) {
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.add("Sign", {c.in(0)})}));
       }},
      {"Reciprocal",
       [](GradContext &c) { // −g·y²
         TensorId y2 = c.add("Mul", {c.out(0), c.out(0)});
         c.setInGrad(0, c.add("Neg", {c.add("Mul", {c.outGrad(0), y2})}));
       }},
      {"Pow",
       [](GradContext &c) { // d(a^b) = g·b·a^(b−1), g·y·ln a
         // a^(b−1) rather than y/a, so that a = 0 does not divide by zero.
         // The exponent may be of another (even integer) type: compute in the base's type.
         TensorId b = c.in(1);
         if (c.op().inInfo(1).dataType() != c.op().inInfo(0).dataType()) {
           ir::Attributes to;
           to.set("to", static_cast<int64_t>(c.op().inInfo(0).dataType()));
           b = c.add("Cast", {b}, std::move(to));
         }
         TensorId pm1 = c.add("Pow", {c.in(0), c.add("Sub", {b, c.scalar(1)})});
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.add("Mul", {b, pm1})}));
         if (isFloatingPoint(c.op().inInfo(1).dataType()) && c.op().inInfo(1).dataType() == c.op().inInfo(0).dataType())
           c.setInGrad(1, c.add("Mul", {c.outGrad(0), c.add("Mul", {c.out(0), c.add("Log", {c.in(0)})})}));
       }},
      {"Selu",
       [](GradContext &c) { // γ·g where x > 0, else g·(y + γα)
         double alpha = c.op().attrs.getFloat("alpha", 1.67326319217681884765625f);
         double gamma = c.op().attrs.getFloat("gamma", 1.05070102214813232421875f);
         TensorId positive = c.add("Greater", {c.in(0), c.scalar(0)});
         TensorId inside = c.add("Mul", {c.outGrad(0), c.scalar(gamma)});
         TensorId outside = c.add("Mul", {c.outGrad(0), c.add("Add", {c.out(0), c.scalar(gamma * alpha)})});
         c.setInGrad(0, c.add("Where", {positive, inside, outside}));
       }},
      {"PRelu",
       [](GradContext &c) { // dx = g where x > 0 else g·slope; dslope = g·x where x <= 0
         if (c.op().attrs.getInt("channel_slope", 0))
           throw error(c.op().debugName(), ": no gradient for the opset-6 channel slope form");
         TensorId positive = c.add("Greater", {c.in(0), c.scalar(0)});
         c.setInGrad(0, c.add("Where", {positive, c.outGrad(0), c.add("Mul", {c.outGrad(0), c.in(1)})}));
         c.setInGrad(1, c.add("Where", {positive, c.scalar(0), c.add("Mul", {c.outGrad(0), c.in(0)})}));
       }},
      {"GlobalAveragePool",
       [](GradContext &c) { // each input element gets g / (number of spatial elements)
         const Shape &x = c.inShape(0);
         int64_t spatial = 1;
         for (size_t d = 2; d < x.size(); ++d)
           spatial *= x[d];
         TensorId scaled = c.add("Mul", {c.outGrad(0), c.scalar(1.0 / static_cast<double>(spatial))});
         c.setInGrad(0,
                     c.add("Expand", {scaled, c.constant(TensorData::fromInt64({static_cast<int64_t>(x.size())}, x))}));
       }},
      {"LeakyRelu",
       [](GradContext &c) {
         double alpha = c.op().attrs.getFloat("alpha", 0.01f);
         TensorId positive = c.add("Greater", {c.in(0), c.scalar(0)});
         c.setInGrad(0, c.add("Where", {positive, c.outGrad(0), c.add("Mul", {c.outGrad(0), c.scalar(alpha)})}));
       }},
      {"Elu",
       [](GradContext &c) { // g where x > 0, else g·(y + α)
         double alpha = c.op().attrs.getFloat("alpha", 1.0f);
         TensorId positive = c.add("Greater", {c.in(0), c.scalar(0)});
         TensorId neg = c.add("Mul", {c.outGrad(0), c.add("Add", {c.out(0), c.scalar(alpha)})});
         c.setInGrad(0, c.add("Where", {positive, c.outGrad(0), neg}));
       }},
      {"Softplus",
       [](GradContext &c) {
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.add("Sigmoid", {c.in(0)})}));
       }},
      {"HardSigmoid",
       [](GradContext &c) { // g·α where 0 < αx + β < 1 (PyTorch's hardsigmoid: strict bounds)
         double alpha = c.op().attrs.getFloat("alpha", 0.2f), beta = c.op().attrs.getFloat("beta", 0.5f);
         TensorId t = c.add("Add", {c.add("Mul", {c.in(0), c.scalar(alpha)}), c.scalar(beta)});
         TensorId inside = c.add("And", {c.add("Greater", {t, c.scalar(0)}), c.add("Less", {t, c.scalar(1)})});
         c.setInGrad(0, c.add("Where", {inside, c.add("Mul", {c.outGrad(0), c.scalar(alpha)}), c.scalar(0)}));
       }},
      {"HardSwish",
       [](GradContext &c) { // 0 below −3, g above 3, g·(x/3 + 1/2) between (PyTorch's hardswish)
         TensorId ramp =
             c.add("Mul", {c.outGrad(0), c.add("Add", {c.add("Mul", {c.in(0), c.scalar(1.0 / 3.0)}), c.scalar(0.5)})});
         TensorId upper = c.add("Where", {c.add("Greater", {c.in(0), c.scalar(3)}), c.outGrad(0), ramp});
         c.setInGrad(0, c.add("Where", {c.add("Less", {c.in(0), c.scalar(-3)}), c.scalar(0), upper}));
       }},
      {"Sin",
       [](GradContext &c) {
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.add("Cos", {c.in(0)})}));
       }},
      {"Cos",
       [](GradContext &c) {
         c.setInGrad(0, c.add("Neg", {c.add("Mul", {c.outGrad(0), c.add("Sin", {c.in(0)})})}));
       }},
      {"Erf",
       [](GradContext &c) { // g·2/√π·exp(−x²)
         TensorId x2 = c.add("Mul", {c.in(0), c.in(0)});
         TensorId e = c.add("Exp", {c.add("Neg", {x2})});
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.add("Mul", {e, c.scalar(1.1283791670955126)})}));
       }},
      {"Sum",
       [](GradContext &c) {
         for (size_t i = 0; i < c.op().inputCount(); ++i)
           c.setInGrad(i, c.outGrad(0));
       }},
      {"Mean",
       [](GradContext &c) {
         TensorId g = c.add("Mul", {c.outGrad(0), c.scalar(1.0 / static_cast<double>(c.op().inputCount()))});
         for (size_t i = 0; i < c.op().inputCount(); ++i)
           c.setInGrad(i, g);
       }},
      {"Max", [](GradContext &c) { minMaxRule(c, "Greater"); }},
      {"Min", [](GradContext &c) { minMaxRule(c, "Less"); }},
      {"Clip",
       [](GradContext &c) { // g where min ≤ x ≤ max; the bounds get no gradient
         TensorId g = c.outGrad(0);
         if (c.op().hasInput(1)) g = c.add("Where", {c.add("Less", {c.in(0), c.in(1)}), c.scalar(0), g});
         if (c.op().hasInput(2)) g = c.add("Where", {c.add("Greater", {c.in(0), c.in(2)}), c.scalar(0), g});
         c.setInGrad(0, g);
       }},
  };
  for (const char *act : {"Relu", "Elu", "Tanh", "Sigmoid", "Exp", "Sqrt", "LeakyRelu", "Abs", "Clip"})
    rules[act] = orActivationGrad(act, rules.at(act));
  addOnnxRules(r, rules);
  // ai.graphcore Gelu is floating point only (setupFloatUnary), so ActivationGrad always applies.
  r.add({"ai.graphcore", "Gelu", 1, 1000, [](GradContext &c) {
           if (!activationGrad(c, "Gelu"))
             throw error(c.op().debugName(), ": no gradient form for Gelu of ", toString(c.op().inInfo(0).dataType()));
         }});
}

} // namespace popart::autodiff
