// Gradient rules: shape ops (data movement only, so every gradient is a linear re-arrangement).

#include "autodiff/grad_rules.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/ops/dropout.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <numeric>
#include <optional>

namespace popart::autodiff {

namespace {

TensorId ints(GradContext &c, const std::vector<int64_t> &v) {
  return c.constant(TensorData::fromInt64({static_cast<int64_t>(v.size())}, v));
}

/// The values of constant int input \p i (shape, axes, pads...); the rule needs them at build time.
std::vector<int64_t> constInts(const GradContext &c, size_t i, const char *role) {
  const TensorData &d = c.op().constInput(i, role);
  std::vector<int64_t> v(static_cast<size_t>(d.info().elementCount()));
  if (d.info().dataType() == DataType::INT32)
    for (size_t k = 0; k < v.size(); ++k)
      v[k] = d.as<int32_t>()[k];
  else if (d.info().dataType() == DataType::INT64)
    for (size_t k = 0; k < v.size(); ++k)
      v[k] = d.as<int64_t>()[k];
  else
    throw error(c.op().debugName(), ": ", role, " must be INT32 or INT64 for the gradient");
  return v;
}

ir::Attributes attrs(std::initializer_list<std::pair<const char *, int64_t>> kv) {
  ir::Attributes a;
  for (const auto &[k, v] : kv)
    a.set(k, v);
  return a;
}

int64_t axisOf(const GradContext &c, int64_t rank) {
  int64_t axis = c.op().attrs.getInt("axis", 0);
  return axis < 0 ? axis + rank : axis;
}

TensorId zerosLike(GradContext &c, const TensorInfo &info) { return c.constant(TensorData(info)); }

TensorId zeroScalar(GradContext &c, DataType type) { return c.constant(TensorData::fromDoubles(type, {}, {0.0})); }

void reshapeBack(GradContext &c) { c.setInGrad(0, c.add("Reshape", {c.outGrad(0), ints(c, c.inShape(0))})); }

int64_t product(const Shape &s) { return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>()); }

/// Slice: scatter the gradient to the constant flat positions the slice read from.
void sliceRule(GradContext &c) {
  const Shape &in = c.inShape(0);
  const Shape &out = c.op().outInfo(0).shape();
  size_t rank = in.size();
  std::vector<int64_t> starts = constInts(c, 1, "starts"), ends = constInts(c, 2, "ends");
  std::vector<int64_t> axes, steps(starts.size(), 1);
  if (c.op().hasInput(3))
    axes = constInts(c, 3, "axes");
  else
    for (size_t i = 0; i < starts.size(); ++i)
      axes.push_back(static_cast<int64_t>(i));
  if (c.op().hasInput(4)) steps = constInts(c, 4, "steps");
  std::vector<int64_t> first(rank, 0), step(rank, 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + static_cast<int64_t>(rank) : axes[i];
    int64_t dim = in[static_cast<size_t>(a)], s = starts[i];
    if (s < 0) s += dim;
    s = steps[i] > 0 ? std::clamp<int64_t>(s, 0, dim) : std::clamp<int64_t>(s, 0, dim - 1);
    first[static_cast<size_t>(a)] = s;
    step[static_cast<size_t>(a)] = steps[i];
  }
  int64_t n = product(out);
  std::vector<int64_t> index(static_cast<size_t>(n) * rank);
  std::vector<int64_t> pos(rank, 0);
  for (int64_t e = 0; e < n; ++e) {
    for (size_t d = 0; d < rank; ++d)
      index[static_cast<size_t>(e) * rank + d] = first[d] + pos[d] * step[d];
    for (size_t d = rank; d-- > 0;) {
      if (++pos[d] < out[d]) break;
      pos[d] = 0;
    }
  }
  TensorId idx = c.constant(TensorData::fromInt64({n, static_cast<int64_t>(rank)}, index));
  TensorId flat = c.add("Reshape", {c.outGrad(0), ints(c, {n})});
  c.setInGrad(0, c.add("ScatterND", {zerosLike(c, c.op().inInfo(0)), idx, flat}));
}

/// Gather along axis: each gathered slice adds back into the row it came from.
void gatherRule(GradContext &c) {
  const Shape &data = c.inShape(0);
  const Shape &ind = c.op().inInfo(1).shape();
  int64_t rank = static_cast<int64_t>(data.size());
  int64_t axis = axisOf(c, rank);
  const Shape &out = c.op().outInfo(0).shape();
  if (axis == 0) {
    // Rows of data (an embedding table): ScatterND adds each gradient row to its table row, one
    // contiguous slice per index, with no index per element.
    TensorId idx = c.in(1);
    if (c.op().inInfo(1).dataType() != DataType::INT64)
      idx = c.add("Cast", {idx}, attrs({{"to", static_cast<int64_t>(DataType::INT64)}}));
    idx = c.add("Reshape", {idx, ints(c, {product(ind), 1})});
    Shape rows{product(ind)};
    rows.insert(rows.end(), data.begin() + 1, data.end());
    TensorId g = c.add("Reshape", {c.outGrad(0), ints(c, rows)});
    ir::Attributes a;
    a.set("reduction", std::string("add"));
    c.setInGrad(0, c.add("ScatterND", {zerosLike(c, c.op().inInfo(0)), idx, g}, std::move(a)));
    return;
  }
  // Indices broadcast to the output shape, then the index dims collapsed into one axis so that
  // ScatterElements (same rank as data) can take them.
  Shape indView(static_cast<size_t>(axis), 1);
  indView.insert(indView.end(), ind.begin(), ind.end());
  indView.resize(out.size(), 1);
  TensorId idx = c.add("Reshape", {c.in(1), ints(c, indView)});
  idx = c.add("Expand", {idx, ints(c, out)});
  Shape collapsed(data.begin(), data.begin() + axis);
  collapsed.push_back(product(ind));
  collapsed.insert(collapsed.end(), data.begin() + axis + 1, data.end());
  idx = c.add("Reshape", {idx, ints(c, collapsed)});
  TensorId g = c.add("Reshape", {c.outGrad(0), ints(c, collapsed)});
  ir::Attributes a = attrs({{"axis", axis}});
  a.set("reduction", std::string("add"));
  c.setInGrad(0, c.add("ScatterElements", {zerosLike(c, c.op().inInfo(0)), idx, g}, std::move(a)));
}

void gatherElementsRule(GradContext &c) {
  ir::Attributes a = attrs({{"axis", axisOf(c, static_cast<int64_t>(c.inShape(0).size()))}});
  a.set("reduction", std::string("add"));
  c.setInGrad(0, c.add("ScatterElements", {zerosLike(c, c.op().inInfo(0)), c.in(1), c.outGrad(0)}, std::move(a)));
}

/// Tile: the output is laid out as [r0, d0, r1, d1, ...]; sum over the repeat axes.
void tileRule(GradContext &c) {
  const Shape &in = c.inShape(0);
  std::vector<int64_t> repeats = constInts(c, 1, "repeats");
  Shape split;
  std::vector<int64_t> axes;
  for (size_t d = 0; d < in.size(); ++d) {
    axes.push_back(static_cast<int64_t>(split.size()));
    split.push_back(repeats[d]);
    split.push_back(in[d]);
  }
  TensorId g = c.add("Reshape", {c.outGrad(0), ints(c, split)});
  g = c.add("ReduceSum", {g, ints(c, axes)}, attrs({{"keepdims", 1}}));
  c.setInGrad(0, c.add("Reshape", {g, ints(c, in)}));
}

/// Pad (constant): negated pads crop what was added and zero-fill what was cropped.
void padRule(GradContext &c) {
  if (c.op().attrs.getString("mode", "constant") != "constant")
    throw error(c.op().debugName(), ": only the gradient of constant-mode Pad is supported");
  std::vector<int64_t> pads = constInts(c, 1, "pads");
  for (auto &p : pads)
    p = -p;
  std::vector<TensorId> inputs{c.outGrad(0), ints(c, pads)};
  if (c.op().hasInput(3)) inputs.insert(inputs.end(), {"", c.in(3)});
  c.setInGrad(0, c.add("Pad", inputs));
}

void concatRule(GradContext &c) {
  const Shape &out = c.op().outInfo(0).shape();
  int64_t axis = axisOf(c, static_cast<int64_t>(out.size()));
  int64_t offset = 0;
  for (size_t i = 0; i < c.op().inputCount(); ++i) {
    int64_t len = c.inShape(i)[static_cast<size_t>(axis)];
    if (isFloatingPoint(c.op().inInfo(i).dataType()))
      c.setInGrad(i, c.add("Slice", {c.outGrad(0), ints(c, {offset}), ints(c, {offset + len}), ints(c, {axis})}));
    offset += len;
  }
}

void splitRule(GradContext &c) {
  std::vector<TensorId> parts;
  for (size_t k = 0; k < c.op().outputCount(); ++k) {
    if (!c.op().hasOutput(k)) throw error(c.op().debugName(), ": omitted Split outputs are not supported");
    TensorId g = c.outGrad(k);
    parts.push_back(g.empty() ? zerosLike(c, c.op().outInfo(k)) : g);
  }
  int64_t axis = axisOf(c, static_cast<int64_t>(c.inShape(0).size()));
  c.setInGrad(0, parts.size() == 1 ? parts[0] : c.add("Concat", parts, attrs({{"axis", axis}})));
}

void whereRule(GradContext &c) {
  TensorId g = c.outGrad(0);
  DataType type = c.op().outInfo(0).dataType();
  c.setInGrad(1, c.add("Where", {c.in(0), g, zeroScalar(c, type)}));
  c.setInGrad(2, c.add("Where", {c.in(0), zeroScalar(c, type), g}));
}

/// The value of constant scalar input \p i, or nothing if it is computed at run time.
std::optional<double> constScalar(const GradContext &c, size_t i) {
  const ir::Tensor &t = c.op().input(i);
  if (!t.isConst() || t.info().elementCount() != 1) return std::nullopt;
  return t.data()->valueAsDouble(0);
}

/// Dropout: y = x·mask/(1 − ratio). The mask is reproducible when it comes from the (seed, counter)
/// input or a seed attribute: the gradient is then the same Dropout applied to dY (same inputs,
/// same salt), which recomputes the mask and is also right, as identity, when training_mode is off
/// at run time. Otherwise the mask output must be there.
void dropoutRule(GradContext &c) {
  const ir::Op &op = c.op();
  TensorId dy = c.outGrad(0);
  if (dy.empty()) return;
  std::optional<bool> training;
  std::optional<double> ratio;
  if (op.version >= 12) {
    if (!op.hasInput(2))
      training = false;
    else if (auto t = constScalar(c, 2))
      training = *t != 0;
    if (!op.hasInput(1))
      ratio = 0.5;
    else
      ratio = constScalar(c, 1);
  } else {
    training = ir::dropoutTraining(op, false);
    ratio = op.attrs.getFloat("ratio", 0.5f);
  }
  if (training == false || ratio == 0.0) return c.setInGrad(0, dy);
  if (op.hasInput(3) || op.attrs.has("seed")) {
    ir::Attributes gradAttrs = op.attrs;
    gradAttrs.set(ir::internal_attr::kSalt, ir::dropoutSalt(op));
    std::vector<TensorId> inputs{dy};
    for (size_t i = 1; i < op.inputCount(); ++i)
      inputs.push_back(op.hasInput(i) ? c.in(i) : "");
    TensorId out = c.graph().uniqueId(c.out(0) + "_grad_Dropout");
    ir::Op &grad = c.graph().addOp("Dropout", "ai.onnx", op.version, "", std::move(gradAttrs), inputs, {out});
    grad.def->setup(grad);
    return c.setInGrad(0, out);
  }
  if (op.hasOutput(1) && training == true && ratio) {
    DataType type = op.outInfo(0).dataType();
    TensorId scaled = c.add("Mul", {dy, c.constant(TensorData::fromDoubles(type, {}, {1.0 / (1.0 - *ratio)}))});
    // Only opset 12+ trains without input 3, and its mask is BOOL.
    return c.setInGrad(0, c.add("Where", {c.out(1), scaled, zeroScalar(c, type)}));
  }
  throw error(op.debugName(), ": the gradient of training-mode Dropout needs a reproducible mask: a seed attribute, "
                              "the (seed, counter) input 3, or the mask output with constant ratio and training_mode");
}

} // namespace

void registerShapeRules(GradRuleRegistry &r) {
  std::map<std::string, GradRule> rules{
      {"Reshape", reshapeBack},
      {"Flatten", reshapeBack},
      {"Squeeze", reshapeBack},
      {"Unsqueeze", reshapeBack},
      {"Transpose",
       [](GradContext &c) {
         size_t rank = c.inShape(0).size();
         std::vector<int64_t> perm(rank);
         for (size_t i = 0; i < rank; ++i)
           perm[i] = static_cast<int64_t>(rank - 1 - i);
         perm = c.op().attrs.getInts("perm", perm);
         std::vector<int64_t> inverse(rank);
         for (size_t i = 0; i < rank; ++i)
           inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
         ir::Attributes a;
         a.set("perm", inverse);
         c.setInGrad(0, c.add("Transpose", {c.outGrad(0)}, std::move(a)));
       }},
      {"Concat", concatRule},
      {"Split", splitRule},
      {"Slice", sliceRule},
      {"Gather", gatherRule},
      {"GatherElements", gatherElementsRule},
      {"Expand", [](GradContext &c) { c.setInGrad(0, c.outGrad(0)); }},
      {"Tile", tileRule},
      {"Pad", padRule},
      {"Where", whereRule},
      {"Cast",
       [](GradContext &c) {
         c.setInGrad(0,
                     c.add("Cast", {c.outGrad(0)}, attrs({{"to", static_cast<int64_t>(c.op().inInfo(0).dataType())}})));
       }},
      {"Dropout", dropoutRule},
  };
  addOnnxRules(r, rules);
}

} // namespace popart::autodiff
