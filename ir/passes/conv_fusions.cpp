// The inference Conv fusions: BatchNormalization folded into the weights (foldBatchNormIntoConv,
// first), the residual addition (fuseConvResidual, before fuseRelu), activations as oneDNN
// post-ops (fuseConvActivation, after fuseRelu) and the MaxPool that reads the result (fuseConvPool).

#include "ir/ops/window.hpp"
#include "ir/passes/pass_manager.hpp"
#include "ir/passes/rewrite.hpp"
#include <popart/error.hpp>

#include <cmath>

namespace popart::ir {

/// The float Conv that produced \p t, if nothing else reads \p t and the Conv has no fused
/// pool, activation or residual yet.
static Op *bareConvOf(const Graph &graph, const Tensor &t) {
  Op *c = t.producer();
  if (!isOnnxOp(c, "Conv") || c->inputCount() > 3 || c->fusion.activated() || c->fusion.pool || c->fusion.residual)
    return nullptr;
  if (t.consumers().size() != 1 || isGraphOutput(graph, t) || t.info().dataType() != DataType::FLOAT) return nullptr;
  return c;
}

/// The activation \p op computes of its input 0 as a Conv post-op (Kind::None if none): Relu,
/// Clip with constant scalar bounds (or none), HardSigmoid, HardSwish, Sigmoid.
static FusedActivation activationOf(const Op &op) {
  FusedActivation a;
  using K = FusedActivation::Kind;
  if (op.domain != "ai.onnx" || !op.hasInput(0) || !op.hasOutput(0) || op.outputs.size() != 1) return a;
  if (op.type == "Relu") {
    a.kind = K::Relu;
  } else if (op.type == "Clip") {
    double lo = -INFINITY, hi = INFINITY;
    if (op.inputCount() > 1 && op.hasInput(1) && !constScalar(&op.input(1), lo)) return a;
    if (op.inputCount() > 2 && op.hasInput(2) && !constScalar(&op.input(2), hi)) return a;
    if (!(lo <= hi)) return a; // min > max sets everything to max: leave it to the op
    a = {K::Clip, static_cast<float>(lo), static_cast<float>(hi)};
  } else if (op.type == "HardSigmoid") {
    a = {K::HardSigmoid, op.attrs.getFloat("alpha", 0.2f), op.attrs.getFloat("beta", 0.5f)};
  } else if (op.type == "HardSwish") {
    a.kind = K::HardSwish;
  } else if (op.type == "Sigmoid") {
    a.kind = K::Sigmoid;
  }
  return a;
}

/// Rewrites \p conv, whose result only \p ops read, into one Conv that applies \p act and writes
/// \p out.
static void convWithActivation(Graph &graph, Op &conv, const std::vector<Op *> &ops, const FusedActivation &act,
                               const TensorId &out) {
  std::vector<TensorId> ins = inputIds(conv), gone{conv.output(0).id()};
  Attributes attrs = conv.attrs;
  Fusion fusion = conv.fusion; // conv is removed below
  fusion.activation = act;
  std::string name = conv.name;
  int version = conv.version, phase = conv.phase;
  for (Op *op : ops) {
    for (const Tensor *t : op->outputs)
      if (t && t->id() != out) gone.push_back(t->id());
    graph.removeOp(*op);
  }
  graph.removeOp(conv);
  for (const auto &id : gone)
    graph.removeTensor(id);
  addRewrittenOp(graph, phase, "Conv", "ai.onnx", version, name, std::move(attrs), ins, {out}, fusion);
}

int fuseConvActivation(Graph &graph) {
  using K = FusedActivation::Kind;
  return rewriteAll(graph, [&](Op &conv) {
    if (!isOnnxOp(&conv, "Conv") || !conv.hasOutput(0) || conv.fusion.activated() || conv.fusion.pool) return false;
    const Tensor &y = conv.output(0);
    if (isGraphOutput(graph, y) || y.info().dataType() != DataType::FLOAT) return false;
    const auto &readers = y.consumers();
    if (readers.size() == 1) { // Conv → activation
      FusedActivation act = activationOf(*readers[0]);
      if (act.kind == K::None || readers[0]->outInfo(0) != y.info()) return false;
      convWithActivation(graph, conv, {readers[0]}, act, readers[0]->output(0).id());
      return true;
    }
    // Conv → Sigmoid / HardSigmoid(1/6, 1/2) → Mul with the result: SiLU and hard swish as
    // exported (torch writes hardswish so before opset 14, SiLU so always).
    if (readers.size() != 2) return false;
    for (int first = 0; first < 2; ++first) {
      Op *gate = readers[static_cast<size_t>(first)], *mul = readers[static_cast<size_t>(1 - first)];
      FusedActivation g = activationOf(*gate);
      K kind = g.kind == K::Sigmoid                                                 ? K::Swish
               : g.kind == K::HardSigmoid && g.alpha == 1.f / 6.f && g.beta == 0.5f ? K::HardSwish
                                                                                    : K::None;
      if (kind == K::None || !isOnnxOp(mul, "Mul") || mul->inputCount() != 2) continue;
      const Tensor &s = gate->output(0);
      if (s.consumers().size() != 1 || s.consumers()[0] != mul || isGraphOutput(graph, s)) continue;
      bool operands = (&mul->input(0) == &y && &mul->input(1) == &s) || (&mul->input(0) == &s && &mul->input(1) == &y);
      if (!operands || mul->outInfo(0) != y.info()) continue;
      FusedActivation act;
      act.kind = kind;
      convWithActivation(graph, conv, {gate, mul}, act, mul->output(0).id());
      return true;
    }
    return false;
  });
}

int foldBatchNormIntoConv(Graph &graph) {
  return rewriteAll(graph, [&](Op &bn) {
    if (!isOnnxOp(&bn, "BatchNormalization") || bn.inputCount() != 5 || !bn.hasOutput(0)) return false;
    if (bn.attrs.getInt("training_mode", 0) != 0 || bn.attrs.getInt("spatial", 1) == 0) return false;
    for (size_t i = 1; i < bn.outputs.size(); ++i)
      if (bn.hasOutput(i)) return false; // running statistics asked for: a training-mode node
    Op *conv = bn.hasInput(0) ? bareConvOf(graph, bn.input(0)) : nullptr;
    if (!conv) return false;
    auto constFloats = [](const Op &op, size_t i) -> const TensorData * {
      if (!op.hasInput(i) || !op.input(i).isConst() || op.inInfo(i).dataType() != DataType::FLOAT) return nullptr;
      return op.input(i).data().get();
    };
    const int64_t m = conv->outInfo(0).dim(1);
    const TensorData *w = constFloats(*conv, 1), *b = conv->hasInput(2) ? constFloats(*conv, 2) : nullptr;
    if (!w || (conv->hasInput(2) && !b)) return false;
    std::vector<const TensorData *> p; // scale, B, mean, var
    for (size_t i = 1; i < 5; ++i) {
      p.push_back(constFloats(bn, i));
      if (!p.back() || p.back()->info().shape() != Shape{m}) return false;
    }
    // y = (conv - mean) * scale / sqrt(var + eps) + B, per output channel: the factor goes into
    // W's rows and the rest into the bias.
    const double eps = bn.attrs.getFloat("epsilon", 1e-5f);
    const int64_t perChannel = w->info().elementCount() / m;
    TensorData w2(w->info()), b2(TensorInfo(DataType::FLOAT, {m}));
    for (int64_t c = 0; c < m; ++c) {
      const double f = double(p[0]->as<float>()[c]) / std::sqrt(double(p[3]->as<float>()[c]) + eps);
      for (int64_t k = 0; k < perChannel; ++k)
        w2.as<float>()[c * perChannel + k] = static_cast<float>(double(w->as<float>()[c * perChannel + k]) * f);
      const double bias = b ? double(b->as<float>()[c]) : 0.0;
      b2.as<float>()[c] = static_cast<float>((bias - double(p[2]->as<float>()[c])) * f + double(p[1]->as<float>()[c]));
    }
    TensorId wId = graph.uniqueId(bn.output(0).id() + "_folded_weights");
    TensorId bId = graph.uniqueId(bn.output(0).id() + "_folded_bias");
    graph.addConst(wId, std::move(w2));
    graph.addConst(bId, std::move(b2));
    std::vector<TensorId> ins = inputIds(*conv);
    ins.resize(3);
    ins[1] = wId;
    ins[2] = bId;
    replacePair(graph, *conv, bn, conv->attrs, conv->fusion, ins);
    return true;
  });
}

int fuseConvResidual(Graph &graph) {
  return rewriteAll(
      graph, [&](Op &op) { return foldResidual(graph, op, [&](const Tensor &t) { return bareConvOf(graph, t); }); });
}

int fuseConvPool(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *p = &candidate;
    if (p->type != "MaxPool" || p->domain != "ai.onnx" || !p->hasInput(0) || !p->hasOutput(0) || p->hasOutput(1))
      return false;
    Op *c = p->input(0).producer();
    if (!c || c->type != "Conv" || c->domain != "ai.onnx" || c->fusion.pool || c->fusion.residual) return false;
    const Tensor &convOut = c->output(0);
    if (convOut.consumers().size() != 1 || isGraphOutput(graph, convOut)) return false;
    // The pooled kernels: oneDNN's f32 and bf16 convolutions, and the FLOAT16 one's f32 chunks, each
    // pooling a chunk of images as it is convolved, so that no full-size result is stored.
    const DataType t = convOut.info().dataType();
    if (t != DataType::FLOAT && t != DataType::BFLOAT16 && t != DataType::FLOAT16) return false;
    const Shape &x = p->inInfo(0).shape();
    size_t nsp = x.size() - 2;
    if (nsp < 1 || nsp > 3 || p->attrs.getInt("ceil_mode", 0) != 0) return false;
    std::vector<int64_t> kernel = p->attrs.getInts("kernel_shape", {});
    if (kernel.size() != nsp) return false;
    WindowGeometry w = resolveWindow(*p, x, p->outInfo(0).shape(), kernel, false);
    bool plain = true;
    for (size_t i = 0; i < nsp; ++i)
      plain = plain && w.dilations[i] == 1 && w.padBegin[i] >= 0 && w.padEnd[i] >= 0 && w.padBegin[i] < kernel[i] &&
              w.padEnd[i] < kernel[i];
    if (!plain) return false;
    Fusion fusion = c->fusion;
    fusion.pool = FusedPool{w.kernel, w.strides, w.pads(), x};
    Shape pooled = p->outInfo(0).shape();
    Op &op = replacePair(graph, *c, *p, c->attrs, fusion, inputIds(*c));
    if (op.outInfo(0).shape() != pooled) throw error(op.debugName(), ": fused pool changed the output shape");
    return true;
  });
}

void registerConvFusionPasses(PassRegistry &r) {
  r.add(optionalPass("foldBatchNormIntoConv",
                     "inference BatchNormalization with constant statistics folded into the Conv before it",
                     OutputsFixed, [](Graph &g, PassContext &) { return foldBatchNormIntoConv(g); }));
  r.add(optionalPass("fuseConvResidual",
                     "a Conv adds the other input of the Add that is its only reader (before fuseRelu)", OutputsFixed,
                     [](Graph &g, PassContext &) { return fuseConvResidual(g); }));
  r.add(optionalPass("fuseConvActivation", "a Conv applies ReLU6, HardSigmoid, HardSwish, Sigmoid or SiLU as post-ops",
                     OutputsFixed, [](Graph &g, PassContext &) { return fuseConvActivation(g); }));
  r.add(optionalPass("fuseConvPool", "a Conv pools its result with the MaxPool that is its only reader", OutputsFixed,
                     [](Graph &g, PassContext &) { return fuseConvPool(g); }));
}

} // namespace popart::ir
