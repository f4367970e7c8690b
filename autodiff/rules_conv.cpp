// Gradient rules of Conv, ConvTranspose, AveragePool and ai.graphcore MultiConv. The backward passes are the dedicated
// ai.graphcore grad ops (ir/ops/convgrad.cpp) with the geometry resolved here into explicit
// strides, dilations and pads, plus forward ops where the math allows (ConvTranspose's dX is a
// Conv of dY).

#include "autodiff/grad_rules.hpp"
#include "ir/ops/window.hpp"
#include <popart/error.hpp>

#include <algorithm>

namespace popart::autodiff {

namespace {

Shape spatialOf(const Shape &s) { return Shape(s.begin() + 2, s.end()); }

/// Adds grad op \p type of domain ai.graphcore with one output and returns that output.
TensorId addGradOp(GradContext &c, const std::string &type, const std::vector<TensorId> &inputs, ir::Attributes attrs) {
  TensorId out = c.graph().uniqueId(c.out(0) + "_grad_" + type);
  ir::Op &op = c.graph().addOp(type, "ai.graphcore", 1, "", std::move(attrs), inputs, {out});
  op.def->setup(op);
  return out;
}

/// The explicit-geometry attributes of the grad ops, with end pads \p padEnd.
ir::Attributes geometryAttrs(const ir::WindowGeometry &g, const std::vector<int64_t> &padEnd) {
  ir::Attributes a;
  a.set("strides", g.strides);
  a.set("dilations", g.dilations);
  std::vector<int64_t> pads = g.padBegin;
  pads.insert(pads.end(), padEnd.begin(), padEnd.end());
  a.set("pads", pads);
  return a;
}

/// Bias gradient: dY summed over batch and spatial axes.
TensorId biasGrad(GradContext &c, const TensorId &dy, size_t rank) {
  std::vector<int64_t> axes{0};
  for (size_t d = 2; d < rank; ++d)
    axes.push_back(static_cast<int64_t>(d));
  return c.add("ReduceSum", {dy, axesConst(c, axes)}, intAttr("keepdims", 0));
}

void convRule(GradContext &c) {
  const ir::Op &op = c.op();
  const Shape &x = c.inShape(0), &w = c.inShape(1);
  ir::WindowGeometry g = ir::resolveWindow(op, x, op.outInfo(0).shape(), spatialOf(w), false);
  ir::Attributes a = geometryAttrs(g, g.padEnd);
  a.set("group", op.attrs.getInt("group", 1));
  TensorId dy = c.outGrad(0);
  ir::Attributes data = a;
  data.set("input_shape", x);
  c.setInGrad(0, addGradOp(c, "ConvDataGrad", {dy, c.in(1)}, data));
  ir::Attributes weights = a;
  weights.set("weight_shape", w);
  c.setInGrad(1, addGradOp(c, "ConvWeightGrad", {dy, c.in(0)}, weights));
  if (op.hasInput(2)) c.setInGrad(2, biasGrad(c, dy, x.size()));
}

/// ConvTranspose from X (N, C, in...) to Y (N, M, out...) is the data gradient of the
/// convolution K from Y-shaped to X-shaped tensors with the same W (C, M/g, k...), strides,
/// dilations and begin pads; K's end pads are ConvTranspose's less output_padding, which makes
/// K's output exactly `in` long. Hence dX = K(dY) and dW = K's weight gradient with X in the
/// role of K's output gradient and dY in the role of K's input.
void convTransposeRule(GradContext &c) {
  const ir::Op &op = c.op();
  const Shape &x = c.inShape(0), &w = c.inShape(1), &y = op.outInfo(0).shape();
  size_t nsp = x.size() - 2;
  ir::WindowGeometry g = ir::resolveWindow(op, x, y, spatialOf(w), true);
  auto outPad = op.attrs.getInts("output_padding", std::vector<int64_t>(nsp, 0));
  std::vector<int64_t> padEnd(nsp);
  for (size_t i = 0; i < nsp; ++i) {
    padEnd[i] = g.padEnd[i] - outPad[i];
    // Any end pad up to stride - 1 more gives K the same output length and values: prefer one
    // that is not negative (no crop below, and oneDNN takes the weight gradient).
    if (padEnd[i] < 0) padEnd[i] = std::min<int64_t>(0, padEnd[i] + g.strides[i] - 1);
  }
  int64_t group = op.attrs.getInt("group", 1);
  TensorId dy = c.outGrad(0);

  ir::Attributes weights = geometryAttrs(g, padEnd);
  weights.set("group", group);
  weights.set("weight_shape", w);
  c.setInGrad(1, addGradOp(c, "ConvWeightGrad", {c.in(0), dy}, weights));

  // K(dY) as a Conv, which takes no negative pads: those crop dY instead (the cropped part of Y
  // depends on no element of X).
  std::vector<int64_t> starts, ends, axes, pads(2 * nsp);
  for (size_t i = 0; i < nsp; ++i) {
    pads[i] = std::max<int64_t>(0, g.padBegin[i]);
    pads[i + nsp] = std::max<int64_t>(0, padEnd[i]);
    if (g.padBegin[i] < 0 || padEnd[i] < 0) {
      axes.push_back(static_cast<int64_t>(i + 2));
      starts.push_back(std::max<int64_t>(0, -g.padBegin[i]));
      ends.push_back(y[i + 2] - std::max<int64_t>(0, -padEnd[i]));
    }
  }
  TensorId source = dy;
  if (!axes.empty()) source = c.add("Slice", {dy, axesConst(c, starts), axesConst(c, ends), axesConst(c, axes)});
  ir::Attributes conv;
  conv.set("strides", g.strides);
  conv.set("dilations", g.dilations);
  conv.set("pads", pads);
  conv.set("group", group);
  c.setInGrad(0, c.add("Conv", {source, c.in(1)}, conv));
  if (op.hasInput(2)) c.setInGrad(2, biasGrad(c, dy, x.size()));
}

void averagePoolRule(GradContext &c) {
  const ir::Op &op = c.op();
  const Shape &x = c.inShape(0);
  std::vector<int64_t> kernel = op.attrs.getInts("kernel_shape");
  // The output shape already reflects ceil_mode; the grad op only needs the window positions.
  ir::WindowGeometry g = ir::resolveWindow(op, x, op.outInfo(0).shape(), kernel, false);
  ir::Attributes a = geometryAttrs(g, g.padEnd);
  a.set("kernel_shape", kernel);
  a.set("count_include_pad", op.attrs.getInt("count_include_pad", 0));
  a.set("input_shape", x);
  c.setInGrad(0, addGradOp(c, "AveragePoolGrad", {c.outGrad(0)}, a));
}

/// MultiConv: one MultiConvGrad for the data and weight gradients of every convolution that a
/// gradient reaches (its kernel runs them concurrently, as the forward ones), with the forward
/// op's geometry attributes; bias gradients as Conv's.
void multiConvRule(GradContext &c) {
  const ir::Op &op = c.op();
  const size_t k = op.outputCount();
  std::vector<TensorId> inputs, outputs;
  bool any = false;
  for (size_t i = 0; i < k; ++i) {
    const TensorId dy = c.outGrad(i);
    inputs.insert(inputs.end(), {dy, c.in(3 * i), c.in(3 * i + 1)});
    if (dy.empty()) {
      outputs.insert(outputs.end(), {"", ""});
      continue;
    }
    any = true;
    outputs.push_back(c.graph().uniqueId(c.out(i) + "_grad_MultiConvGrad_dX"));
    outputs.push_back(c.graph().uniqueId(c.out(i) + "_grad_MultiConvGrad_dW"));
  }
  if (!any) return;
  ir::Attributes a;
  for (const char *name : {"strides", "pads", "dilations"})
    if (op.attrs.has(name)) a.set(name, op.attrs.getInts(name));
  ir::Op &grad = c.graph().addOp("MultiConvGrad", "ai.graphcore", 1, "", std::move(a), inputs, outputs);
  grad.def->setup(grad);
  for (size_t i = 0; i < k; ++i) {
    if (outputs[2 * i].empty()) continue;
    c.setInGrad(3 * i, outputs[2 * i]);
    c.setInGrad(3 * i + 1, outputs[2 * i + 1]);
    if (op.hasInput(3 * i + 2)) c.setInGrad(3 * i + 2, biasGrad(c, c.outGrad(i), c.inShape(3 * i).size()));
  }
}

} // namespace

void registerConvRules(GradRuleRegistry &r) {
  addOnnxRules(r, {{"Conv", convRule}, {"ConvTranspose", convTransposeRule}, {"AveragePool", averagePoolRule}});
  r.add({"ai.graphcore", "MultiConv", 1, 1000, multiConvRule});
}

} // namespace popart::autodiff
