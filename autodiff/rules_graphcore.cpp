// Gradient rules of PopART's ai.graphcore opset 1 (ir/ops/graphcore.hpp): GroupNormalization,
// Scale, Subsample, Detach, IdentityLoss, Nll, L1 and PrintTensor. Gelu's is with the elementwise
// rules; Init has no inputs.

#include "autodiff/grad_rules.hpp"
#include "ir/ops/graphcore.hpp"

#include <popart/error.hpp>

namespace popart::autodiff {

namespace {

/// Adds ai.graphcore \p type (opset 1) with \p inputs and \p attrs; returns its outputs, named after
/// the forward op's output 0 and \p names.
std::vector<TensorId> addGraphcore(GradContext &c, const std::string &type, const std::vector<TensorId> &inputs,
                                   ir::Attributes attrs, const std::vector<std::string> &names) {
  ir::Graph &g = c.graph();
  std::vector<TensorId> outs;
  outs.reserve(names.size());
  for (const auto &n : names)
    outs.push_back(g.uniqueId(c.out(0) + "_grad_" + n));
  ir::Op &op = g.addOp(type, "ai.graphcore", 1, "", std::move(attrs), inputs, outs);
  op.def->setup(op);
  return outs;
}

/// dX, dScale and dBias from one GroupNormalizationGrad op, which reuses the forward's statistics.
/// Gradients arriving at the Mean and InvStdDev outputs are refused: PopART's grad op takes none.
void groupNormRule(GradContext &c) {
  const ir::Op &op = c.op();
  for (size_t i : {1, 2})
    if (op.hasOutput(i) && !c.outGrad(i).empty())
      throw error(op.debugName(), ": the gradient through ", i == 1 ? "Mean" : "InvStdDev", " (output ", i,
                  ") is not supported; only Y is differentiable");
  if (c.outGrad(0).empty()) return;
  ir::Attributes attrs;
  attrs.set("num_groups", op.attrs.getInt("num_groups"));
  attrs.set("epsilon", op.attrs.getFloat("epsilon", 1e-5f));
  const bool stats = op.hasOutput(1) && op.hasOutput(2);
  std::vector<TensorId> outs = addGraphcore(
      c, "GroupNormalizationGrad", {c.in(0), c.in(1), stats ? c.out(1) : "", stats ? c.out(2) : "", c.outGrad(0)},
      std::move(attrs), {"dX", "dScale", "dBias"});
  for (size_t i = 0; i < 3; ++i)
    c.setInGrad(i, outs[i]);
}

/// Y = X·s, so dX = dY·s: a Scale of dY.
void scaleRule(GradContext &c) {
  ir::Attributes attrs;
  attrs.set("scale", c.op().attrs.getFloat("scale", 1.0f));
  c.setInGrad(0, addGraphcore(c, "Scale", {c.outGrad(0)}, std::move(attrs), {"dX"})[0]);
}

/// dY scattered back to the kept positions of X, zeros elsewhere.
void subsampleRule(GradContext &c) {
  ir::Attributes attrs;
  attrs.set("strides", c.op().attrs.getInts("strides"));
  const Shape &x = c.inShape(0);
  attrs.set("shape", std::vector<int64_t>(x.begin(), x.end()));
  c.setInGrad(0, addGraphcore(c, "SubsampleGrad", {c.outGrad(0)}, std::move(attrs), {"dX"})[0]);
}

/// Nothing flows back through a Detach: no input gets a gradient from it.
void detachRule(GradContext & /*c*/) {}

/// dY over every element of X for Sum, dY / n for Mean, dY itself for None.
void identityLossRule(GradContext &c) {
  const Shape &x = c.inShape(0);
  ir::LossReduction r = ir::lossReduction(c.op());
  if (r == ir::LossReduction::None) {
    c.setInGrad(0, c.outGrad(0));
    return;
  }
  TensorId dy = c.outGrad(0);
  if (r == ir::LossReduction::Mean) dy = c.add("Mul", {dy, c.scalar(1.0 / static_cast<double>(shapeElementCount(x)))});
  c.setInGrad(0, c.add("Expand", {dy, shapeConst(c, x)}));
}

/// d(λ·|x|)/dx = λ·sign(x), times dY (per element for None, / n for Mean).
void l1Rule(GradContext &c) {
  const Shape &x = c.inShape(0);
  ir::LossReduction r = ir::lossReduction(c.op());
  double factor = c.op().attrs.getFloat("lambda");
  if (r == ir::LossReduction::Mean) factor /= static_cast<double>(shapeElementCount(x));
  TensorId dy = c.add("Mul", {c.outGrad(0), c.scalar(factor)});
  c.setInGrad(0, c.add("Mul", {c.add("Sign", {c.in(0)}), dy}));
}

/// One NllGrad op: −dY/p (or −dY for log-probabilities) at each label, scaled as the reduction.
void nllRule(GradContext &c) {
  const ir::Op &op = c.op();
  c.setInGrad(0, addGraphcore(c, "NllGrad", {c.in(0), c.in(1), c.outGrad(0)}, op.attrs, {"dProbs"})[0]);
}

/// The gradient of the identity, printed as PopART does (title "<title>_gradient", or
/// "Gradient___<input>" without a title) when print_gradient is set.
void printTensorRule(GradContext &c) {
  const ir::Op &op = c.op();
  if (op.attrs.getInt("print_gradient", 1) == 0) {
    c.setInGrad(0, c.outGrad(0));
    return;
  }
  ir::Attributes attrs = op.attrs;
  std::string title = op.attrs.getString("title", "");
  attrs.set("title", title.empty() ? "Gradient___" + c.in(0) : title + "_gradient");
  attrs.set("print_gradient", int64_t{0});
  c.setInGrad(0, addGraphcore(c, "PrintTensor", {c.outGrad(0)}, std::move(attrs), {"printed"})[0]);
}

} // namespace

void registerGraphcoreRules(GradRuleRegistry &r) {
  for (const auto &[type, rule] : std::vector<std::pair<const char *, GradRule>>{{"GroupNormalization", groupNormRule},
                                                                                 {"Scale", scaleRule},
                                                                                 {"Subsample", subsampleRule},
                                                                                 {"Detach", detachRule},
                                                                                 {"IdentityLoss", identityLossRule},
                                                                                 {"Nll", nllRule},
                                                                                 {"L1", l1Rule},
                                                                                 {"PrintTensor", printTensorRule}})
    r.add({"ai.graphcore", type, 1, 1000, rule});
}

} // namespace popart::autodiff
