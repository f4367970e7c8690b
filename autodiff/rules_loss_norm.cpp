// Gradient rules: losses (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss) and normalisations
// (LayerNormalization, InstanceNormalization, BatchNormalization in inference and training form).

#include "autodiff/grad_rules.hpp"
#include "ir/ops/norm.hpp"

#include <popart/error.hpp>

namespace popart::autodiff {

namespace {

TensorId reshape(GradContext &c, const TensorId &t, const Shape &s) { return c.add("Reshape", {t, shapeConst(c, s)}); }

TensorId reduce(GradContext &c, const std::string &type, const TensorId &t, const std::vector<int64_t> &axes,
                bool keep) {
  return c.add(type, {t, axesConst(c, axes)}, intAttr("keepdims", keep ? 1 : 0));
}

/// [1, C, 1, ..., 1] for an input of shape \p x (class / channel dim 1).
Shape channelShape(const Shape &x) {
  Shape s(x.size(), 1);
  s[1] = x[1];
  return s;
}

/// All axes of rank \p rank except 1.
std::vector<int64_t> axesExceptChannel(size_t rank) {
  std::vector<int64_t> axes;
  for (size_t d = 0; d < rank; ++d)
    if (d != 1) axes.push_back(static_cast<int64_t>(d));
  return axes;
}

/// Gradient of the NLL loss w.r.t. its log-probability input [N, C, D...]: −M·dY/denominator where
/// M[n, c, d] = weight[c] if label[n, d] == c and c is not the ignored class, else 0. Labels out of range
/// (e.g. an ignore_index outside [0, C)) simply match no class.
TensorId nllInputGrad(GradContext &c) {
  const Shape &x = c.inShape(0);
  DataType type = c.op().inInfo(0).dataType();
  DataType labelType = c.op().inInfo(1).dataType();
  int64_t classes = x[1];
  Shape ch = channelShape(x);
  Shape labelShape = x;
  labelShape[1] = 1;
  std::vector<double> classIds(static_cast<size_t>(classes));
  for (int64_t k = 0; k < classes; ++k)
    classIds[static_cast<size_t>(k)] = static_cast<double>(k);
  TensorId ids = c.constant(TensorData::fromDoubles(labelType, ch, classIds));
  TensorId hit = c.add("Equal", {reshape(c, c.in(1), labelShape), ids});
  TensorId mask = c.add("Cast", {hit}, intAttr("to", static_cast<int64_t>(type)));
  if (c.op().attrs.has("ignore_index")) {
    int64_t ignored = c.op().attrs.getInt("ignore_index", 0);
    if (ignored >= 0 && ignored < classes) {
      std::vector<double> keep(static_cast<size_t>(classes), 1.0);
      keep[static_cast<size_t>(ignored)] = 0.0;
      mask = c.add("Mul", {mask, c.constant(TensorData::fromDoubles(type, ch, keep))});
    }
  }
  if (c.op().hasInput(2)) mask = c.add("Mul", {mask, reshape(c, c.in(2), ch)});
  std::string reduction = c.op().attrs.getString("reduction", "mean");
  TensorId dy = c.outGrad(0);
  if (reduction == "none") dy = reshape(c, dy, labelShape);
  TensorId g = c.add("Neg", {c.add("Mul", {mask, dy})});
  if (reduction == "mean") {
    std::vector<int64_t> all(x.size());
    for (size_t d = 0; d < x.size(); ++d)
      all[d] = static_cast<int64_t>(d);
    g = c.add("Div", {g, reduce(c, "ReduceSum", mask, all, false)});
  }
  return g;
}

void nllRule(GradContext &c) { c.setInGrad(0, nllInputGrad(c)); }

/// loss = NLL(LogSoftmax(x, axis 1)): the gradient reaching the log-probabilities (from the loss and
/// from the optional log_prob output) goes back through the log-softmax: g − softmax·Σ_c g.
void softmaxCrossEntropyRule(GradContext &c) {
  DataType type = c.op().inInfo(0).dataType();
  bool logProbGrad = c.op().hasOutput(1) && !c.outGrad(1).empty();
  if (!c.outGrad(0).empty() && !logProbGrad && (type == DataType::FLOAT || type == DataType::DOUBLE)) {
    // Only the loss is differentiated: one fused op (softmax − one-hot, weighted and scaled).
    ir::Attributes attrs;
    attrs.set("reduction", c.op().attrs.getString("reduction", "mean"));
    if (c.op().attrs.has("ignore_index")) attrs.set("ignore_index", c.op().attrs.getInt("ignore_index"));
    TensorId dx = c.graph().uniqueId(c.in(0) + "_grad");
    ir::Op &grad = c.graph().addOp("SoftmaxCrossEntropyLossGrad", "ai.graphcore", 1, "", std::move(attrs),
                                   {c.in(0), c.in(1), c.op().hasInput(2) ? c.in(2) : "", c.outGrad(0)}, {dx});
    grad.def->setup(grad);
    c.setInGrad(0, dx);
    return;
  }
  TensorId g;
  if (!c.outGrad(0).empty()) g = nllInputGrad(c);
  if (c.op().hasOutput(1) && !c.outGrad(1).empty()) g = g.empty() ? c.outGrad(1) : c.add("Add", {g, c.outGrad(1)});
  if (g.empty()) return;
  TensorId logProb =
      c.op().hasOutput(1) ? c.out(1) : c.add("Sub", {c.in(0), reduce(c, "ReduceLogSumExp", c.in(0), {1}, true)});
  TensorId prob = c.add("Exp", {logProb});
  c.setInGrad(0, c.add("Sub", {g, c.add("Mul", {prob, reduce(c, "ReduceSum", g, {1}, true)})}));
}

/// Shared by the normalisations over \p axes: returns dX for y = x̂·γ (x̂ = (x − μ)·r, r = 1/√(σ² + ε))
/// given gγ = dY·γ, plus optional gradients of the saved mean and inverse std-dev (shape with the
/// reduced axes kept).
struct Normalized {
  TensorId centered, invStd, xhat;
};

Normalized normalize(GradContext &c, const std::vector<int64_t> &axes, double epsilon) {
  Normalized n;
  n.centered = c.add("Sub", {c.in(0), reduce(c, "ReduceMean", c.in(0), axes, true)});
  TensorId var = reduce(c, "ReduceMean", c.add("Mul", {n.centered, n.centered}), axes, true);
  n.invStd = c.add("Reciprocal", {c.add("Sqrt", {c.add("Add", {var, c.scalar(epsilon)})})});
  n.xhat = c.add("Mul", {n.centered, n.invStd});
  return n;
}

/// dX = r·(g − mean(g) − x̂·mean(g·x̂)) for g = dY·γ.
TensorId normalizedInputGrad(GradContext &c, const Normalized &n, const TensorId &g, const std::vector<int64_t> &axes) {
  TensorId meanG = reduce(c, "ReduceMean", g, axes, true);
  TensorId meanGX = reduce(c, "ReduceMean", c.add("Mul", {g, n.xhat}), axes, true);
  TensorId inner = c.add("Sub", {c.add("Sub", {g, meanG}), c.add("Mul", {n.xhat, meanGX})});
  return c.add("Mul", {n.invStd, inner});
}

int64_t countOver(const Shape &x, const std::vector<int64_t> &axes) {
  int64_t count = 1;
  for (int64_t a : axes)
    count *= x[static_cast<size_t>(a)];
  return count;
}

/// The ai.graphcore LayerNormalizationGrad op's dX, dScale and dBias, when no gradient arrives at
/// the saved Mean and InvStdDev outputs. The forward's statistics are passed on where it has them
/// in X's type, else the grad op recomputes them.
void layerNormGradOp(GradContext &c, int64_t axis) {
  const ir::Op &op = c.op();
  const Shape &x = c.inShape(0);
  Shape norm(x.begin() + axis, x.end());
  TensorId scale = c.in(1);
  // The op wants a scale of the normalised size: a broadcast one is expanded.
  if (op.inInfo(1).elementCount() != shapeElementCount(norm)) scale = c.add("Expand", {scale, shapeConst(c, norm)});
  std::vector<TensorId> inputs{c.in(0), scale, c.outGrad(0)};
  DataType type = op.inInfo(0).dataType();
  if (op.hasOutput(1) && op.hasOutput(2) && op.outInfo(1).dataType() == type && op.outInfo(2).dataType() == type) {
    inputs.push_back(c.out(1));
    inputs.push_back(c.out(2));
  }
  ir::Graph &g = c.graph();
  std::string base = c.out(0) + "_grad_";
  std::vector<TensorId> outs{g.uniqueId(base + "dX"), g.uniqueId(base + "dScale")};
  if (op.hasInput(2)) outs.push_back(g.uniqueId(base + "dBias"));
  ir::Attributes attrs;
  attrs.set("axis", axis);
  attrs.set("epsilon", op.attrs.getFloat("epsilon", 1e-5f));
  ir::Op &grad = g.addOp("LayerNormalizationGrad", "ai.graphcore", 1, "", std::move(attrs), inputs, outs);
  grad.def->setup(grad);
  c.setInGrad(0, outs[0]);
  c.setInGrad(1, outs[1]);
  if (op.hasInput(2)) c.setInGrad(2, outs[2]);
}

void layerNormRule(GradContext &c) {
  const Shape &x = c.inShape(0);
  int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = c.op().attrs.getInt("axis", -1);
  if (axis < -rank || axis >= rank) throw error(c.op().debugName(), ": axis ", axis, " out of range for rank ", rank);
  if (axis < 0) axis += rank;
  bool statGrads = (c.op().hasOutput(1) && !c.outGrad(1).empty()) || (c.op().hasOutput(2) && !c.outGrad(2).empty());
  if (!statGrads) {
    if (!c.outGrad(0).empty()) layerNormGradOp(c, axis);
    return;
  }
  // Gradients through the saved statistics too: composed of forward ops.
  std::vector<int64_t> axes;
  for (int64_t d = axis; d < rank; ++d)
    axes.push_back(d);
  Normalized n = normalize(c, axes, c.op().attrs.getFloat("epsilon", 1e-5f));
  TensorId dx;
  if (TensorId dy = c.outGrad(0); !dy.empty()) {
    c.setInGrad(1, c.add("Mul", {dy, n.xhat}));
    if (c.op().hasInput(2)) c.setInGrad(2, dy);
    dx = normalizedInputGrad(c, n, c.add("Mul", {dy, c.in(1)}), axes);
  }
  auto accumulate = [&](const TensorId &t) { dx = dx.empty() ? t : c.add("Add", {dx, t}); };
  double count = static_cast<double>(countOver(x, axes));
  // The statistics may be stored in another type (stash_type) than X.
  auto statGrad = [&](size_t i) {
    return c.add("Cast", {c.outGrad(i)}, intAttr("to", static_cast<int64_t>(c.op().inInfo(0).dataType())));
  };
  // The saved Mean and InvStdDev outputs: dμ/dx = 1/n, dr/dx = −r³·(x − μ)/n.
  if (c.op().hasOutput(1) && !c.outGrad(1).empty())
    accumulate(c.add("Expand", {c.add("Mul", {statGrad(1), c.scalar(1.0 / count)}), shapeConst(c, x)}));
  if (c.op().hasOutput(2) && !c.outGrad(2).empty()) {
    TensorId r3 = c.add("Mul", {n.invStd, c.add("Mul", {n.invStd, n.invStd})});
    accumulate(c.add("Mul", {c.add("Mul", {statGrad(2), r3}), c.add("Mul", {n.centered, c.scalar(-1.0 / count)})}));
  }
  if (!dx.empty()) c.setInGrad(0, dx);
}

void instanceNormRule(GradContext &c) {
  const Shape &x = c.inShape(0);
  if (x.size() < 3) throw error(c.op().debugName(), ": input must have rank >= 3, got ", x.size());
  std::vector<int64_t> axes;
  for (size_t d = 2; d < x.size(); ++d)
    axes.push_back(static_cast<int64_t>(d));
  Normalized n = normalize(c, axes, c.op().attrs.getFloat("epsilon", 1e-5f));
  TensorId dy = c.outGrad(0);
  std::vector<int64_t> notChannel = axesExceptChannel(x.size());
  c.setInGrad(1, reduce(c, "ReduceSum", c.add("Mul", {dy, n.xhat}), notChannel, false));
  c.setInGrad(2, reduce(c, "ReduceSum", dy, notChannel, false));
  TensorId scale = reshape(c, c.in(1), channelShape(x));
  c.setInGrad(0, normalizedInputGrad(c, n, c.add("Mul", {dy, scale}), axes));
}

/// Training form: y = x̂·γ + β with the batch statistics, so the statistics depend on x too. One
/// ai.graphcore BatchNormalizationGrad op gives dX, dScale and dBias. The running statistics
/// (outputs 1, 2) are state, not functions to differentiate: gradients arriving there are dropped,
/// and the running inputs 3, 4 get none, as in PyTorch.
void batchNormTrainingRule(GradContext &c) {
  const ir::Op &op = c.op();
  for (size_t i : {3, 4})
    if (op.hasOutput(i) && !c.outGrad(i).empty())
      throw error(op.debugName(), ": the gradient through the saved batch statistics (output ", i,
                  ") is not supported");
  TensorId dy = c.outGrad(0);
  if (dy.empty()) return;
  if (op.attrs.getInt("spatial", 1) == 0)
    throw error(op.debugName(), ": the training-mode gradient with spatial=0 is not supported");
  std::vector<TensorId> inputs{c.in(0), c.in(1), dy};
  // Opset 9-13 forms may output the batch statistics; the gradient op then need not recompute them.
  if (op.hasOutput(3) && op.hasOutput(4)) {
    inputs.push_back(c.out(3));
    inputs.push_back(c.out(4));
  }
  ir::Graph &g = c.graph();
  std::string base = c.out(0) + "_grad_";
  std::vector<TensorId> outs{g.uniqueId(base + "dX"), g.uniqueId(base + "dScale"), g.uniqueId(base + "dBias")};
  ir::Attributes attrs;
  attrs.set("epsilon", op.attrs.getFloat("epsilon", 1e-5f));
  ir::Op &grad = g.addOp("BatchNormalizationGrad", "ai.graphcore", 1, "", std::move(attrs), inputs, outs);
  grad.def->setup(grad);
  c.setInGrad(0, outs[0]);
  c.setInGrad(1, outs[1]);
  // dBias comes shaped like scale; both hold C values.
  c.setInGrad(2, c.inShape(2) == c.inShape(1) ? outs[2] : reshape(c, outs[2], c.inShape(2)));
}

/// Inference form: the statistics are inputs, so y is affine in x: y = (x − m)·γ·r + β, r = 1/√(v + ε).
/// Under mixed precision X may be 16-bit beside FLOAT parameters and statistics: the per-channel
/// factors are computed in the statistics' type and cast to X's for the X-sized products, and the
/// parameters' gradients, reduced in X's type (in fp32 inside the kernels), are cast to their types.
void batchNormRule(GradContext &c) {
  if (ir::batchNormTraining(c.op())) return batchNormTrainingRule(c);
  const Shape &x = c.inShape(0);
  if (x.size() < 2) throw error(c.op().debugName(), ": input must have rank >= 2, got ", x.size());
  const DataType xType = c.op().inInfo(0).dataType(), varType = c.op().inInfo(4).dataType();
  auto as = [&](const TensorId &t, DataType from, DataType to) {
    return from == to ? t : c.add("Cast", {t}, intAttr("to", static_cast<int64_t>(to)));
  };
  auto asX = [&](size_t i, const TensorId &t) { return as(t, c.op().inInfo(i).dataType(), xType); };
  auto asInput = [&](size_t i, const TensorId &t) { return as(t, xType, c.op().inInfo(i).dataType()); };
  Shape ch = channelShape(x);
  std::vector<int64_t> notChannel = axesExceptChannel(x.size());
  TensorId dy = c.outGrad(0);
  TensorId scale = asX(1, reshape(c, c.in(1), ch)), mean = asX(3, reshape(c, c.in(3), ch));
  TensorId var = reshape(c, c.in(4), ch);
  TensorId eps = c.constant(TensorData::fromDoubles(varType, {}, {c.op().attrs.getFloat("epsilon", 1e-5f)}));
  TensorId invStdOfVar = c.add("Reciprocal", {c.add("Sqrt", {c.add("Add", {var, eps})})});
  TensorId invStd = as(invStdOfVar, varType, xType);
  TensorId centered = c.add("Sub", {c.in(0), mean});
  TensorId xhat = c.add("Mul", {centered, invStd});
  TensorId dxhat = c.add("Mul", {dy, scale});
  TensorId dx = c.add("Mul", {dxhat, invStd});
  c.setInGrad(0, dx);
  c.setInGrad(1, asInput(1, reduce(c, "ReduceSum", c.add("Mul", {dy, xhat}), notChannel, false)));
  c.setInGrad(2, asInput(2, reduce(c, "ReduceSum", dy, notChannel, false)));
  c.setInGrad(3, asInput(3, c.add("Neg", {reduce(c, "ReduceSum", dx, notChannel, false)})));
  // dv = Σ dx̂·(x − m)·(−r³/2) = −r²/2 · Σ dx̂·x̂: r² is applied per channel in the variance's type,
  // since in fp16 it overflows for a variance below 1.5e-5.
  TensorId sumDxhatXhat = asInput(4, reduce(c, "ReduceSum", c.add("Mul", {dxhat, xhat}), notChannel, false));
  TensorId halfR2 =
      c.add("Div", {c.constant(TensorData::fromDoubles(varType, {}, {-0.5})), c.add("Add", {c.in(4), eps})});
  c.setInGrad(4, c.add("Mul", {sumDxhatXhat, halfR2}));
}

} // namespace

void registerLossNormRules(GradRuleRegistry &r) {
  addOnnxRules(r, {{"NegativeLogLikelihoodLoss", nllRule},
                   {"SoftmaxCrossEntropyLoss", softmaxCrossEntropyRule},
                   {"LayerNormalization", layerNormRule},
                   {"InstanceNormalization", instanceNormRule},
                   {"BatchNormalization", batchNormRule}});
}

} // namespace popart::autodiff
