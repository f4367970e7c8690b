// Exported decompositions as one op: the LayerNorm of opsets < 17 (fuseLayerNorm) and exact GELU
// (fuseGelu), before autodiff so that the fused ops' gradient rules apply, and the hard swish
// that torch exports before opset 14 (fuseHardSwish).

#include "ir/passes/pass_manager.hpp"
#include "ir/passes/rewrite.hpp"

#include <algorithm>
#include <cmath>

namespace popart::ir {

namespace {

/// The first axis of a ReduceMean over the trailing axes of its input with keepdims, or -1.
int64_t trailingMeanAxis(const Op &mean) {
  // Canonical Reduce* form: the axes are constant input 1.
  if (mean.inputCount() != 2 || !mean.hasInput(1) || !mean.input(1).isConst()) return -1;
  if (mean.attrs.getInt("keepdims", 1) != 1 || mean.input(1).info().dataType() != DataType::INT64) return -1;
  int64_t rank = mean.inInfo(0).rank();
  std::vector<int64_t> axes = mean.input(1).data()->toInt64Vector();
  if (axes.empty()) return -1;
  for (auto &a : axes)
    a = a < 0 ? a + rank : a;
  std::sort(axes.begin(), axes.end());
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i] != rank - static_cast<int64_t>(axes.size()) + static_cast<int64_t>(i)) return -1;
  return axes.front();
}

/// An affine factor of a LayerNorm: the other input of \p op (Mul or Add reading \p t), if it is
/// not computed from \p t, has at most the normalised rank and leaves \p t's shape unchanged.
Tensor *affineInput(const Op *op, const Tensor &t, int64_t normRank) {
  if (!op) return nullptr;
  Tensor *p = otherInput(*op, t);
  if (!p || p == &t || p->info().dataType() != t.info().dataType() || p->info().rank() > normRank) return nullptr;
  if (op->outInfo(0).shape() != t.info().shape()) return nullptr;
  return p;
}

/// One LayerNorm decomposition starting at ReduceMean \p m1, fused; false if \p m1 starts none.
bool fuseLayerNormAt(Graph &graph, const Kept &kept, Op &m1, bool statistics) {
  int64_t axis = trailingMeanAxis(m1);
  if (axis < 0 || m1.inInfo(0).dataType() != DataType::FLOAT) return false;
  Tensor &x = m1.input(0);
  int64_t rank = x.info().rank();
  Op *sub = onlyReader(kept, m1.output(0));
  if (!isOnnxOp(sub, "Sub") || sub->inputCount() != 2 || &sub->input(0) != &x || &sub->input(1) != &m1.output(0))
    return false;
  Tensor &d = sub->output(0);
  if (d.consumers().size() != 2 || kept.has(d)) return false;
  Op *pow = nullptr, *div = nullptr;
  for (Op *c : d.consumers()) {
    if (isOnnxOp(c, "Pow") && &c->input(0) == &d) pow = c;
    if (isOnnxOp(c, "Div") && c->inputCount() == 2 && &c->input(0) == &d) div = c;
  }
  double v = 0;
  if (!pow || !div || pow->inputCount() != 2 || !constScalar(&pow->input(1), v) || v != 2) return false;
  Op *m2 = onlyReader(kept, pow->output(0));
  if (!isOnnxOp(m2, "ReduceMean") || trailingMeanAxis(*m2) != axis) return false;
  Op *addEps = onlyReader(kept, m2->output(0));
  double eps = 0;
  if (!isOnnxOp(addEps, "Add") || !constScalar(otherInput(*addEps, m2->output(0)), eps) || eps < 0) return false;
  Op *sqrt = onlyReader(kept, addEps->output(0));
  if (!isOnnxOp(sqrt, "Sqrt") || onlyReader(kept, sqrt->output(0)) != div || &div->input(1) != &sqrt->output(0))
    return false;
  std::vector<Op *> ops{&m1, sub, pow, m2, addEps, sqrt, div};
  Op *mul = onlyReader(kept, div->output(0));
  Tensor *scale = isOnnxOp(mul, "Mul") ? affineInput(mul, div->output(0), rank - axis) : nullptr;
  if (!scale) return false; // LayerNormalization needs a scale
  ops.push_back(mul);
  Op *add = onlyReader(kept, mul->output(0));
  Tensor *bias = isOnnxOp(add, "Add") ? affineInput(add, mul->output(0), rank - axis) : nullptr;
  if (bias) ops.push_back(add);
  TensorId y = ops.back()->output(0).id();
  std::vector<TensorId> outs{y};
  if (statistics) {
    outs.push_back(graph.uniqueId(y + "_mean"));
    outs.push_back(graph.uniqueId(y + "_inv_std_dev"));
  }
  Attributes attrs;
  attrs.set("axis", axis);
  attrs.set("epsilon", static_cast<float>(eps));
  std::vector<TensorId> ins{x.id(), scale->id()};
  if (bias) ins.push_back(bias->id());
  replaceOps(graph, ops, "LayerNormalization", "ai.onnx", 17, std::move(attrs), ins, outs);
  return true;
}

/// One GELU decomposition 0.5·(x·(1 + erf(x/√2))) around Erf \p erf, fused; false if none.
bool fuseGeluAt(Graph &graph, const Kept &kept, Op &erf) {
  if (!erf.hasInput(0) || erf.inInfo(0).dataType() != DataType::FLOAT) return false;
  Op *scaled = erf.input(0).producer();
  if (!scaled || onlyReader(kept, erf.input(0)) != &erf || scaled->inputCount() != 2) return false;
  Tensor *x = nullptr;
  double c = 0;
  if (isOnnxOp(scaled, "Div") && constScalar(&scaled->input(1), c) && std::fabs(c - M_SQRT2) <= 1e-6)
    x = &scaled->input(0);
  for (size_t i = 0; i < 2 && isOnnxOp(scaled, "Mul") && !x; ++i)
    if (constScalar(&scaled->input(1 - i), c) && std::fabs(c - M_SQRT1_2) <= 1e-6) x = &scaled->input(i);
  if (!x || x->info() != erf.inInfo(0)) return false;
  Op *plusOne = onlyReader(kept, erf.output(0));
  if (!isOnnxOp(plusOne, "Add") || !withScalar(plusOne, erf.output(0), 1.0, 0)) return false;
  Op *times = onlyReader(kept, plusOne->output(0));
  if (!isOnnxOp(times, "Mul") || otherInput(*times, plusOne->output(0)) != x) return false;
  Op *half = onlyReader(kept, times->output(0));
  if (!isOnnxOp(half, "Mul") || !withScalar(half, times->output(0), 0.5, 0)) return false;
  if (half->outInfo(0) != x->info()) return false;
  replaceOps(graph, {scaled, &erf, plusOne, times, half}, "Gelu", "ai.graphcore", 1, {}, {x->id()},
             {half->output(0).id()});
  return true;
}

} // namespace

int fuseLayerNorm(Graph &graph, bool statistics, const std::vector<TensorId> &keep) {
  Kept kept{graph, keep};
  return rewriteAll(
      graph, [&](Op &op) { return isOnnxOp(&op, "ReduceMean") && fuseLayerNormAt(graph, kept, op, statistics); });
}

int fuseGelu(Graph &graph, const std::vector<TensorId> &keep) {
  Kept kept{graph, keep};
  return rewriteAll(graph, [&](Op &op) { return isOnnxOp(&op, "Erf") && fuseGeluAt(graph, kept, op); });
}

int fuseHardSwish(Graph &graph) {
  return rewriteAll(graph, [&](Op &mul) {
    if (!isOnnxOp(&mul, "Mul") || mul.inputCount() != 2 || !mul.hasInput(0) || !mul.hasInput(1) || !mul.hasOutput(0))
      return false;
    for (size_t g = 0; g < 2; ++g) {
      Op *gate = mul.input(g).producer();
      const Tensor &x = mul.input(1 - g), &s = mul.input(g);
      if (!isOnnxOp(gate, "HardSigmoid") || !gate->hasInput(0) || &gate->input(0) != &x) continue;
      if (gate->attrs.getFloat("alpha", 0.2f) != 1.f / 6.f || gate->attrs.getFloat("beta", 0.5f) != 0.5f) continue;
      if (s.consumers().size() != 1 || isGraphOutput(graph, s) || x.info().dataType() != DataType::FLOAT ||
          mul.outInfo(0) != x.info())
        continue;
      TensorId in = x.id(), out = mul.output(0).id(), mid = s.id();
      std::string name = gate->name;
      int phase = mul.phase;
      graph.removeOp(mul);
      graph.removeOp(*gate);
      graph.removeTensor(mid);
      addRewrittenOp(graph, phase, "HardSwish", "ai.onnx", 14, name, {}, {in}, {out});
      return true;
    }
    return false;
  });
}

void registerDecompositionPasses(PassRegistry &r) {
  Pass ln = optionalPass("fuseLayerNorm", "the LayerNorm decomposition of opsets < 17 as one LayerNormalization", 0,
                         [](Graph &g, PassContext &c) { return fuseLayerNorm(g, c.training, c.keep); });
  ln.before = GradientsBuilt;
  r.add(ln);
  Pass gelu = optionalPass("fuseGelu", "exact GELU's Div/Erf/Add/Mul/Mul as one ai.graphcore Gelu", 0,
                           [](Graph &g, PassContext &c) { return fuseGelu(g, c.keep); });
  gelu.before = GradientsBuilt;
  r.add(gelu);
  r.add(optionalPass("fuseHardSwish", "x·HardSigmoid(x; 1/6, 1/2) as one HardSwish", OutputsFixed,
                     [](Graph &g, PassContext &) { return fuseHardSwish(g); }));
}

} // namespace popart::ir
