// Relu applied by the op before it: a MatMul, Gemm, Conv or one convolution of a MultiConv
// (fuseRelu), a BatchNormalization (fuseBatchNormRelu), and in training the Relu's gradient by
// MaxPoolGrad (fuseMaxPoolGradRelu).

#include "ir/ops/multiconv.hpp"
#include "ir/ops/window.hpp"
#include "ir/passes/pass_manager.hpp"
#include "ir/passes/rewrite.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace popart::ir {

namespace {

/// Relu \p r of output i of MultiConv \p c becomes convolution i's post-op (kMultiConvReluAttr),
/// as separate Convs take theirs.
bool fuseMultiConvRelu(Graph &graph, Op &c, Op &r) {
  const Tensor &pre = r.input(0);
  if (pre.consumers().size() != 1 || isGraphOutput(graph, pre)) return false;
  std::vector<int64_t> relu = c.attrs.getInts(kMultiConvReluAttr, {});
  std::vector<TensorId> outs;
  for (size_t i = 0; i < c.outputCount(); ++i) {
    outs.push_back(c.hasOutput(i) ? c.output(i).id() : "");
    if (c.hasOutput(i) && &c.output(i) == &pre) {
      if (std::find(relu.begin(), relu.end(), static_cast<int64_t>(i)) != relu.end()) return false;
      relu.push_back(static_cast<int64_t>(i));
      outs.back() = r.output(0).id();
    }
  }
  Attributes attrs = c.attrs;
  attrs.set(kMultiConvReluAttr, relu);
  replaceOps(graph, {&c, &r}, c.type, c.domain, c.version, attrs, inputIds(c), outs, c.fusion);
  return true;
}

} // namespace

int fuseRelu(Graph &graph, bool convolutions) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *r = &candidate;
    if (r->type != "Relu" || r->domain != "ai.onnx" || !r->hasInput(0) || !r->hasOutput(0)) return false;
    Op *c = r->input(0).producer();
    if (convolutions && c && c->type == "MultiConv" && c->domain == "ai.graphcore")
      return fuseMultiConvRelu(graph, *c, *r);
    if (!c || c->domain != "ai.onnx" || c->fusion.activated()) return false;
    // A MatMul adds its residual after its post-ops; a Conv adds it before them.
    if (c->fusion.residual && c->type != "Conv") return false;
    // oneDNN post-ops. Not Gelu after MatMul: oneDNN 2.6's brgemm with an eltwise_gelu_erf
    // post-op took 8.2 ms for BERT's FFN product against 6.4 + 0.8 ms for the two apart.
    bool producer = c->type == "MatMul" || c->type == "Gemm" || (convolutions && c->type == "Conv");
    if (!producer) return false;
    if (c->type != "Conv" && !isMatMulFusionType(c->outInfo(0).dataType())) return false;
    const Tensor &pre = c->output(0);
    if (pre.consumers().size() != 1 || isGraphOutput(graph, pre)) return false;
    std::vector<TensorId> ins = inputIds(*c);
    Fusion fusion = c->fusion;
    fusion.activation.kind = FusedActivation::Kind::Relu;
    replacePair(graph, *c, *r, c->attrs, fusion, ins);
    return true;
  });
}

namespace {

bool isSixteenBit(DataType t) { return t == DataType::FLOAT16 || t == DataType::BFLOAT16; }

} // namespace

int fuseMaxPoolGradRelu(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *a = &candidate;
    if (a->type != "ActivationGrad" || a->domain != "ai.graphcore" || a->attrs.getString("activation", "") != "Relu")
      return false;
    if (!a->hasInput(0) || !a->hasInput(1) || !a->hasOutput(0)) return false;
    Op *m = a->input(1).producer();
    if (!m || m->type != "MaxPoolGrad" || m->domain != "ai.graphcore" || m->fusion.activated()) return false;
    // A 16-bit pool's fused gradient runs fast only on f32 blocks over the fast f32 kernel, which
    // takes windows that tile; elsewhere only the reference kernel applies the Relu's gradient (at
    // about a tenth of the speed of oneDNN's MaxPoolGrad and ActivationGrad apart).
    if (m->hasInput(0) && isSixteenBit(m->inInfo(0).dataType()) &&
        (!m->hasInput(1) || !whyWindowsDoNotTile(*m, m->inInfo(1).shape()).empty()))
      return false;
    // The Relu's output must be what the pool read: dX of the pool is then masked by it.
    if (!m->hasInput(0) || &m->input(0) != &a->input(0)) return false;
    const Tensor &pooled = m->output(0);
    if (pooled.consumers().size() != 1 || isGraphOutput(graph, pooled)) return false;
    Fusion fusion = m->fusion;
    fusion.activation.kind = FusedActivation::Kind::Relu;
    replacePair(graph, *m, *a, m->attrs, fusion, {m->input(0).id(), m->input(1).id()});
    return true;
  });
}

int fuseBatchNormRelu(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *r = &candidate;
    if (!isOnnxOp(r, "Relu") || !r->hasInput(0) || !r->hasOutput(0)) return false;
    Op *bn = r->input(0).producer();
    if (!isOnnxOp(bn, "BatchNormalization") || bn->fusion.activated()) return false;
    if (bn->output(0).consumers().size() != 1 || isGraphOutput(graph, bn->output(0))) return false;
    std::vector<TensorId> ins = inputIds(*bn), outs{r->output(0).id()};
    for (size_t i = 1; i < bn->outputs.size(); ++i)
      outs.push_back(bn->hasOutput(i) ? bn->output(i).id() : "");
    Fusion fusion = bn->fusion;
    fusion.activation.kind = FusedActivation::Kind::Relu;
    replaceOps(graph, {bn, r}, bn->type, bn->domain, bn->version, bn->attrs, ins, outs, fusion);
    return true;
  });
}

void registerReluFusionPasses(PassRegistry &r) {
  r.add(optionalPass("fuseMaxPoolGradRelu", "MaxPoolGrad applies the gradient of the Relu its pool read",
                     OutputsFixed | GradientsBuilt, [](Graph &g, PassContext &) { return fuseMaxPoolGradRelu(g); }));
  r.add(optionalPass("fuseBatchNormRelu", "BatchNormalization applies the Relu that is its only reader", OutputsFixed,
                     [](Graph &g, PassContext &) { return fuseBatchNormRelu(g); }));
  r.add(optionalPass("fuseRelu", "a MatMul or Gemm (and in inference a Conv) applies the Relu that is its only reader",
                     OutputsFixed, [](Graph &g, PassContext &c) { return fuseRelu(g, !c.training); }));
}

} // namespace popart::ir
