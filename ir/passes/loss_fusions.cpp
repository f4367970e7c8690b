// Training: SoftmaxCrossEntropyLossGrad also writes the class sums of its gradient
// (fuseLossGradClassSums) and the loss itself (fuseLossWithGradient), so the scores are read once;
// in mixed precision it reads the 16-bit logits and writes their 16-bit gradient itself
// (foldLossCasts), without the Casts to and from the fp32 loss.

#include "ir/passes/pass_manager.hpp"
#include "ir/passes/rewrite.hpp"

#include <algorithm>
#include <set>

namespace popart::ir {

int fuseLossGradClassSums(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *r = &candidate;
    if (!isOnnxOp(r, "ReduceSum") || r->inputCount() != 2 || !r->hasInput(1) || !r->input(1).isConst()) return false;
    // Through Reshapes that keep the class axis last, back to the loss gradient.
    const Tensor *t = &r->input(0);
    int64_t classes = t->info().rank() >= 1 ? t->info().shape().back() : 0;
    while (t->producer() && isOnnxOp(t->producer(), "Reshape") && t->info().rank() >= 1 &&
           t->info().shape().back() == classes)
      t = &t->producer()->input(0);
    Op *sce = t->producer();
    if (!sce || sce->type != "SoftmaxCrossEntropyLossGrad" || sce->domain != "ai.graphcore" || sce->hasOutput(1))
      return false;
    if (&sce->output(0) != t || t->info().rank() != 2 || t->info().shape().back() != classes) return false;
    // The sum runs over every axis but the last.
    int64_t rank = r->inInfo(0).rank();
    std::vector<int64_t> axes = r->input(1).data()->toInt64Vector();
    for (auto &a : axes)
      a = a < 0 ? a + rank : a;
    std::sort(axes.begin(), axes.end());
    std::vector<int64_t> all(static_cast<size_t>(rank - 1));
    for (int64_t a = 0; a < rank - 1; ++a)
      all[static_cast<size_t>(a)] = a;
    if (axes != all || r->outInfo(0).elementCount() != classes) return false;
    TensorId out = r->output(0).id(), sums = graph.uniqueId(out + "_class_sums");
    Shape outShape = r->outInfo(0).shape();
    // The loss, when fuseLossWithGradient has fused it, stays an output.
    std::vector<TensorId> ins = inputIds(*sce),
                          outs{sce->output(0).id(), sums, sce->hasOutput(2) ? sce->output(2).id() : ""};
    if (outs.back().empty()) outs.pop_back();
    std::string name = sce->name;
    int phase = sce->phase, version = sce->version;
    Attributes attrs = sce->attrs;
    Fusion fusion = sce->fusion;
    graph.removeOp(*r);
    graph.removeOp(*sce);
    Op &grad = graph.addOp("SoftmaxCrossEntropyLossGrad", "ai.graphcore", version, name, std::move(attrs), ins, outs);
    grad.phase = phase;
    grad.fusion = fusion;
    grad.def->setup(grad);
    TensorId shape = graph.uniqueId(out + "_shape");
    graph.addConst(shape, TensorData::fromInt64({static_cast<int64_t>(outShape.size())},
                                                std::vector<int64_t>(outShape.begin(), outShape.end())));
    Op &view = graph.addOp("Reshape", "ai.onnx", 14, "", {}, {sums, shape}, {out});
    view.phase = phase;
    view.def->setup(view);
    return true;
  });
}

/// True if \p t is computed (transitively) from an output of \p op.
static bool dependsOn(const Tensor &t, const Op &op) {
  std::vector<const Tensor *> stack{&t};
  std::set<const Tensor *> seen;
  while (!stack.empty()) {
    const Tensor *x = stack.back();
    stack.pop_back();
    if (!seen.insert(x).second) continue;
    const Op *p = x->producer();
    if (!p) continue;
    if (p == &op) return true;
    for (const Tensor *in : p->inputs)
      if (in) stack.push_back(in);
  }
  return false;
}

int fuseLossWithGradient(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *g = &candidate;
    if (g->type != "SoftmaxCrossEntropyLossGrad" || g->domain != "ai.graphcore" || g->hasOutput(2)) return false;
    if (!g->hasInput(0) || !g->hasInput(1) || !g->hasInput(3)) return false;
    Op *f = nullptr;
    for (Op *c : g->input(0).consumers())
      if (isOnnxOp(c, "SoftmaxCrossEntropyLoss") && c->hasInput(1) && &c->input(1) == &g->input(1) &&
          c->hasInput(2) == g->hasInput(2) && (!c->hasInput(2) || &c->input(2) == &g->input(2)) &&
          c->attrs.getString("reduction", "mean") == g->attrs.getString("reduction", "mean") &&
          c->attrs.has("ignore_index") == g->attrs.has("ignore_index") &&
          c->attrs.getInt("ignore_index", 0) == g->attrs.getInt("ignore_index", 0))
        f = c;
    if (!f || !f->hasOutput(0)) return false;
    if (f->hasOutput(1) && (!f->output(1).consumers().empty() || isGraphOutput(graph, f->output(1)))) return false;
    if (dependsOn(g->input(3), *f)) return false; // the gradient seed must not need the loss
    std::vector<TensorId> ins = inputIds(*g),
                          outs{g->output(0).id(), g->hasOutput(1) ? g->output(1).id() : "", f->output(0).id()};
    // Named and phased as the forward; its unused log_prob goes with it.
    replaceOps(graph, {f, g}, g->type, g->domain, g->version, g->attrs, ins, outs, g->fusion);
    return true;
  });
}

/// A 16-bit floating-point type: what foldLossCasts lets the loss gradient read and write.
static bool sixteenBitFloat(DataType t) { return t == DataType::BFLOAT16 || t == DataType::FLOAT16; }

static int foldLossCasts(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *g = &candidate;
    if (g->type != "SoftmaxCrossEntropyLossGrad" || g->domain != "ai.graphcore" || !g->hasInput(0)) return false;
    // Its class sums would change type with the scores: fuseLossGradClassSums runs after this.
    if (g->hasOutput(1) || g->inInfo(0).dataType() != DataType::FLOAT) return false;
    // The FLOAT scores are a Cast of 16-bit logits that nothing else reads.
    Tensor &scores = g->input(0);
    Op *widen = scores.producer();
    if (!isOnnxOp(widen, "Cast") || !sixteenBitFloat(widen->inInfo(0).dataType())) return false;
    if (scores.consumers().size() != 1 || isGraphOutput(graph, scores)) return false;
    const DataType low = widen->inInfo(0).dataType();
    // The FLOAT gradient is read by one Cast back to that type alone (or by nothing), since the
    // gradient takes the scores' type: a FLOAT reader would get it rounded.
    Op *narrow = nullptr;
    if (g->hasOutput(0)) {
      Tensor &dx = g->output(0);
      if (isGraphOutput(graph, dx)) return false;
      if (!dx.consumers().empty()) {
        narrow = dx.consumers().front();
        if (dx.consumers().size() != 1 || !isOnnxOp(narrow, "Cast") || narrow->outInfo(0).dataType() != low)
          return false;
      }
    }
    std::vector<TensorId> ins = inputIds(*g), outs;
    ins[0] = widen->input(0).id();
    for (size_t i = 0; i < g->outputCount(); ++i)
      outs.push_back(g->hasOutput(i) ? g->output(i).id() : "");
    if (narrow) outs[0] = narrow->output(0).id();
    std::vector<Op *> ops{g, widen};
    if (narrow) ops.push_back(narrow);
    // Named and phased as the loss gradient; its FLOAT scores and FLOAT gradient go.
    replaceOps(graph, ops, g->type, g->domain, g->version, g->attrs, ins, outs, g->fusion);
    return true;
  });
}

void registerLossFusionPasses(PassRegistry &r) {
  r.add(
      optionalPass("fuseLossGradClassSums",
                   "SoftmaxCrossEntropyLossGrad also writes the class sums of its gradient (the output bias gradient)",
                   OutputsFixed | GradientsBuilt, [](Graph &g, PassContext &) { return fuseLossGradClassSums(g); }));
  r.add(optionalPass("fuseLossWithGradient",
                     "SoftmaxCrossEntropyLossGrad also writes the loss, so the forward loss op goes",
                     OutputsFixed | GradientsBuilt, [](Graph &g, PassContext &) { return fuseLossWithGradient(g); }));
  r.add(optionalPass("foldLossCasts",
                     "SoftmaxCrossEntropyLossGrad reads 16-bit logits and writes their 16-bit gradient itself, "
                     "without the Casts to and from the fp32 loss",
                     OutputsFixed | GradientsBuilt, [](Graph &g, PassContext &) { return foldLossCasts(g); }));
}

} // namespace popart::ir
