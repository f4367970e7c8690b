// Gradient rules: matmul and reduce ops (and softmax, which is a normalised reduction, through
// the ai.graphcore SoftmaxGrad and LogSoftmaxGrad ops; MaxPool through MaxPoolGrad).

#include "autodiff/grad_rules.hpp"
#include "ir/ops/window.hpp"

#include <popart/error.hpp>

#include <algorithm>

namespace popart::autodiff {

namespace {

/// Swaps the last two dims of a tensor of rank \p rank (>= 2).
TensorId transposeLast2(GradContext &c, const TensorId &t, size_t rank) {
  std::vector<int64_t> perm(rank);
  for (size_t i = 0; i < rank; ++i)
    perm[i] = static_cast<int64_t>(i);
  std::swap(perm[rank - 1], perm[rank - 2]);
  ir::Attributes a;
  a.set("perm", perm);
  return c.add("Transpose", {t}, std::move(a));
}

TensorId scaled(GradContext &c, const TensorId &t, double k) { return k == 1.0 ? t : c.add("Mul", {t, c.scalar(k)}); }

void matMulRule(GradContext &c) {
  Shape aShape = c.inShape(0), bShape = c.inShape(1);
  Shape yShape = c.op().outInfo(0).shape();
  TensorId a = c.in(0), b = c.in(1), dy = c.outGrad(0);
  // 1-D operands behave as matrices with a unit dimension that the output drops: restore it.
  if (aShape.size() == 1) {
    a = c.add("Reshape", {a, shapeConst(c, {1, aShape[0]})});
    Shape s = yShape;
    s.insert(s.end() - (bShape.size() == 1 ? 0 : 1), 1);
    yShape = s;
    aShape = {1, aShape[0]};
  }
  bool bVector = bShape.size() == 1;
  if (bVector) {
    b = c.add("Reshape", {b, shapeConst(c, {bShape[0], 1})});
    yShape.push_back(1);
    bShape = {bShape[0], 1};
  }
  if (yShape != c.op().outInfo(0).shape()) dy = c.add("Reshape", {dy, shapeConst(c, yShape)});
  if (aShape.size() > 2 && bShape.size() == 2 && !bVector) {
    // A batch of rows times one matrix (a Linear layer): the batch folds into the rows, so both
    // gradients are single matrix products and dB needs no product per batch element summed after.
    int64_t k = aShape.back(), n = bShape.back(), rows = shapeElementCount(aShape) / std::max<int64_t>(k, 1);
    TensorId a2 = c.add("Reshape", {a, shapeConst(c, {rows, k})});
    TensorId dy2 = c.add("Reshape", {dy, shapeConst(c, {rows, n})});
    TensorId dA = c.add("MatMul", {dy2, transposeLast2(c, b, 2)});
    c.setInGrad(0, c.add("Reshape", {dA, shapeConst(c, aShape)}));
    c.setInGrad(1, c.add("MatMul", {transposeLast2(c, a2, 2), dy2}));
    return;
  }
  c.setInGrad(0, c.add("MatMul", {dy, transposeLast2(c, b, bShape.size())}));
  TensorId dB = c.add("MatMul", {transposeLast2(c, a, aShape.size()), dy});
  if (bVector) { // [..., K, 1]: drop the unit column before summing over the batch dims
    Shape s(yShape.begin(), yShape.end() - 2);
    s.push_back(bShape[0]);
    dB = c.add("Reshape", {dB, shapeConst(c, s)});
  }
  c.setInGrad(1, dB);
}

void gemmRule(GradContext &c) {
  const auto &at = c.op().attrs;
  bool transA = at.getInt("transA", 0) != 0, transB = at.getInt("transB", 0) != 0;
  double alpha = at.getFloat("alpha", 1.0f), beta = at.getFloat("beta", 1.0f);
  TensorId dy = c.outGrad(0);
  // With A' = op(A), B' = op(B): dA' = dY·B'ᵀ and dB' = A'ᵀ·dY.
  TensorId bT = transB ? c.in(1) : transposeLast2(c, c.in(1), 2);
  TensorId aT = transA ? c.in(0) : transposeLast2(c, c.in(0), 2);
  TensorId dA = c.add("MatMul", {dy, bT});
  TensorId dB = c.add("MatMul", {aT, dy});
  if (transA) dA = transposeLast2(c, dA, 2);
  if (transB) dB = transposeLast2(c, dB, 2);
  c.setInGrad(0, scaled(c, dA, alpha));
  c.setInGrad(1, scaled(c, dB, alpha));
  if (c.op().hasInput(2)) c.setInGrad(2, scaled(c, dy, beta));
}

/// Reduce{Sum,Mean}: dY broadcast back over the reduced axes (times 1/count for the mean).
/// The input shape with reduced axes set to 1, and how many elements each output sums;
/// \returns false for the no-op form (empty axes with noop_with_empty_axes).
bool keptShape(const GradContext &c, Shape &kept, int64_t &count) {
  const Shape &x = c.inShape(0);
  int64_t rank = static_cast<int64_t>(x.size());
  std::vector<int64_t> axes;
  if (const TensorData *t = c.op().optionalConstInput(1, "axes")) axes = t->toInt64Vector();
  if (axes.empty() && c.op().attrs.getInt("noop_with_empty_axes", 0) != 0) return false;
  std::vector<bool> reduced(x.size(), axes.empty());
  for (int64_t a : axes) {
    if (a < -rank || a >= rank) throw error(c.op().debugName(), ": axis ", a, " out of range for rank ", rank);
    reduced[static_cast<size_t>(a < 0 ? a + rank : a)] = true;
  }
  kept = x;
  count = 1;
  for (size_t d = 0; d < x.size(); ++d)
    if (reduced[d]) {
      count *= x[d];
      kept[d] = 1;
    }
  return true;
}

/// A reduced tensor (output or output gradient) broadcast back to the input's shape.
TensorId expandToInput(GradContext &c, const TensorId &t, const Shape &kept) {
  return c.add("Expand", {c.add("Reshape", {t, shapeConst(c, kept)}), shapeConst(c, c.inShape(0))});
}

void reduceRule(GradContext &c, bool mean) {
  Shape kept;
  int64_t count = 0;
  if (!keptShape(c, kept, count)) {
    c.setInGrad(0, c.outGrad(0));
    return;
  }
  TensorId g = expandToInput(c, c.outGrad(0), kept);
  if (mean && count > 0) g = scaled(c, g, 1.0 / static_cast<double>(count));
  c.setInGrad(0, g);
}

/// ReduceL2: g·x/y; ReduceLogSumExp: g·exp(x − y); ReduceMax/Min: g shared evenly by the
/// elements equal to the result (as torch.amax/amin).
void reduceValueRule(GradContext &c) {
  Shape kept;
  int64_t count = 0;
  if (!keptShape(c, kept, count)) {
    c.setInGrad(0, c.outGrad(0));
    return;
  }
  TensorId g = expandToInput(c, c.outGrad(0), kept);
  TensorId y = expandToInput(c, c.out(0), kept);
  const std::string &type = c.op().type;
  if (type == "ReduceL2") {
    c.setInGrad(0, c.add("Mul", {g, c.add("Div", {c.in(0), y})}));
  } else if (type == "ReduceLogSumExp") {
    c.setInGrad(0, c.add("Mul", {g, c.add("Exp", {c.add("Sub", {c.in(0), y})})}));
  } else {
    ir::Attributes to;
    to.set("to", static_cast<int64_t>(c.op().inInfo(0).dataType()));
    TensorId mask = c.add("Cast",
                          {
                              c.add("Equal", {c.in(0), y}),
                          },
                          to);
    TensorId ties = c.add("ReduceSum", {mask, c.op().hasInput(1) ? c.in(1) : axesConst(c, {})}, intAttr("keepdims", 1));
    if (!c.op().hasInput(1)) {
      std::vector<int64_t> all;
      for (size_t d = 0; d < kept.size(); ++d)
        all.push_back(static_cast<int64_t>(d));
      ties = c.add("ReduceSum", {mask, axesConst(c, all)}, intAttr("keepdims", 1));
    }
    c.setInGrad(0, c.add("Mul", {g, c.add("Div", {mask, ties})}));
  }
}

/// (Log)Softmax: ai.graphcore SoftmaxGrad / LogSoftmaxGrad of (y, dY) over the single axis; the
/// flattened form of opsets < 13 is viewed as 2-D [outer, rest] for it.
void softmaxRule(GradContext &c) {
  const ir::Op &op = c.op();
  const Shape &x = c.inShape(0);
  int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = op.attrs.getInt("axis", op.version < 13 ? 1 : -1);
  if (axis < -rank || axis >= rank) throw error(op.debugName(), ": axis ", axis, " out of range for rank ", rank);
  if (axis < 0) axis += rank;
  TensorId y = c.out(0), dy = c.outGrad(0);
  bool flatten = op.version < 13 && axis != rank - 1;
  if (flatten) {
    Shape view{shapeElementCount(Shape(x.begin(), x.begin() + axis)),
               shapeElementCount(Shape(x.begin() + axis, x.end()))};
    y = c.add("Reshape", {y, shapeConst(c, view)});
    dy = c.add("Reshape", {dy, shapeConst(c, view)});
    axis = 1;
  }
  TensorId dx = c.graph().uniqueId(c.out(0) + "_grad_" + op.type + "Grad");
  ir::Op &grad = c.graph().addOp(op.type + "Grad", "ai.graphcore", 1, "", intAttr("axis", axis), {y, dy}, {dx});
  grad.def->setup(grad);
  c.setInGrad(0, flatten ? c.add("Reshape", {dx, shapeConst(c, x)}) : dx);
}

} // namespace

void registerMatMulReduceRules(GradRuleRegistry &registry) {
  std::map<std::string, GradRule> r;
  r["MatMul"] = matMulRule;
  r["Gemm"] = gemmRule;
  r["ReduceSum"] = [](GradContext &c) { reduceRule(c, false); };
  r["ReduceMean"] = [](GradContext &c) { reduceRule(c, true); };
  for (const char *t : {"ReduceL2", "ReduceLogSumExp", "ReduceMax", "ReduceMin"})
    r[t] = reduceValueRule;
  r["MaxPool"] = [](GradContext &c) {
    // Each output's gradient goes to the input element it took (the first maximum of its
    // window): the ai.graphcore MaxPoolGrad op with the geometry resolved here. dY's shape
    // carries ceil_mode; storage_order only lays out the Indices, which get no gradient.
    const ir::Op &op = c.op();
    const Shape &x = c.inShape(0);
    std::vector<int64_t> kernel = op.attrs.getInts("kernel_shape");
    ir::WindowGeometry g = ir::resolveWindow(op, x, op.outInfo(0).shape(), kernel, false);
    ir::Attributes a;
    a.set("kernel_shape", kernel);
    a.set("strides", g.strides);
    a.set("dilations", g.dilations);
    a.set("pads", g.pads());
    TensorId dx = c.graph().uniqueId(c.out(0) + "_grad_MaxPoolGrad");
    ir::Op &grad = c.graph().addOp("MaxPoolGrad", "ai.graphcore", 1, "", std::move(a), {c.in(0), c.outGrad(0)}, {dx});
    grad.def->setup(grad);
    c.setInGrad(0, dx);
  };
  r["CumSum"] = [](GradContext &c) { // the gradient accumulates in the opposite direction
    ir::Attributes a;
    a.set("exclusive", c.op().attrs.getInt("exclusive", 0));
    a.set("reverse", int64_t{c.op().attrs.getInt("reverse", 0) == 0 ? 1 : 0});
    c.setInGrad(0, c.add("CumSum", {c.outGrad(0), c.in(1)}, a));
  };
  r["Softmax"] = softmaxRule;
  r["LogSoftmax"] = softmaxRule;
  addOnnxRules(registry, r);
}

} // namespace popart::autodiff
