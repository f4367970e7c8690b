#include "ir/passes/passes.hpp"
#include "core/log.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <set>

namespace popart::ir {

static bool allInputsConst(const Op &op) {
  for (const Tensor *t : op.inputs)
    if (t && !t->isConst()) return false;
  return true;
}

static void fold(Graph &graph, Op &op, const ConstEvaluator &folder) {
  std::vector<TensorData> values = folder.evaluate(op);
  std::vector<Tensor *> outs = op.outputs;
  graph.removeOp(op);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i]) continue;
    if (i >= values.size()) throw error("constant folding produced too few outputs");
    outs[i]->setKind(TensorKind::Const);
    outs[i]->setInfo(values[i].info());
    outs[i]->setData(std::make_shared<TensorData>(std::move(values[i])));
  }
}

void inferShapes(Graph &graph, const ConstEvaluator *folder) {
  for (Op *op : graph.schedule()) {
    for (const Tensor *t : op->inputs)
      if (t && !t->info().isKnown() && t->info().dataType() != DataType::STRING)
        throw error(op->debugName(), ": input '", t->id(), "' has unknown type or shape ", t->info().toString());
    try {
      op->def->setup(*op);
    } catch (const error &e) {
      std::string msg = e.what();
      if (msg.find(op->debugName()) == std::string::npos) throw error(op->debugName(), ": ", msg);
      throw;
    }
    bool outputsConst = true;
    for (const Tensor *t : op->outputs)
      if (t && !t->isConst()) outputsConst = false;
    if (outputsConst && !op->outputs.empty()) {
      // setup() computed the values itself (Shape, Size): the op has nothing left to do.
      graph.removeOp(*op);
      continue;
    }
    if (folder && op->def->foldable && allInputsConst(*op) && folder->canEvaluate(*op)) {
      logging::logger().trace("folding {}", op->debugName());
      fold(graph, *op, *folder);
    }
  }
}

void removeDeadCode(Graph &graph, const std::vector<TensorId> &keep) {
  std::vector<TensorId> roots = keep.empty() ? graph.outputs() : keep;
  std::set<const Op *> live;
  std::vector<const Tensor *> stack;
  for (const auto &id : roots)
    stack.push_back(&graph.tensor(id));
  // Ops that update a tensor in place are kept for their effect.
  for (const auto &op : graph.ops())
    if (!op->def->modifies.empty())
      for (const Tensor *out : op->outputs)
        if (out) stack.push_back(out);
  std::set<const Tensor *> seen;
  while (!stack.empty()) {
    const Tensor *t = stack.back();
    stack.pop_back();
    if (!seen.insert(t).second) continue;
    if (Op *p = t->producer(); p && live.insert(p).second)
      for (const Tensor *in : p->inputs)
        if (in) stack.push_back(in);
  }
  std::vector<Op *> dead;
  for (const auto &op : graph.ops())
    if (!live.count(op.get())) dead.push_back(op.get());
  for (Op *op : dead)
    graph.removeOp(*op);
  std::set<TensorId> keepIds(graph.inputs().begin(), graph.inputs().end());
  keepIds.insert(graph.outputs().begin(), graph.outputs().end());
  keepIds.insert(roots.begin(), roots.end());
  std::vector<TensorId> unused;
  for (const auto &[id, t] : graph.tensors())
    if (!t->producer() && t->consumers().empty() && !keepIds.count(id) && t->kind() != TensorKind::Variable)
      unused.push_back(id);
  for (const auto &id : unused)
    graph.removeTensor(id);
}

static bool swapsLastTwoAxes(const Op &transpose) {
  size_t rank = transpose.inInfo(0).rank();
  if (rank < 2) return false;
  std::vector<int64_t> perm = transpose.attrs.getInts("perm", {});
  if (perm.empty()) return rank == 2; // the default reverses the axes
  if (perm.size() != rank) return false;
  for (size_t i = 0; i + 2 < rank; ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return perm[rank - 2] == static_cast<int64_t>(rank - 1) && perm[rank - 1] == static_cast<int64_t>(rank - 2);
}

static bool isGraphOutput(const Graph &graph, const Tensor &t) {
  return std::find(graph.outputs().begin(), graph.outputs().end(), t.id()) != graph.outputs().end();
}

/// Replaces \p producer and \p consumer, the only reader of \p producer's output 0, by one op of
/// \p producer's type, version, name and phase that reads \p inputs and writes \p consumer's output 0.
static Op &replacePair(Graph &graph, Op &producer, Op &consumer, Attributes attrs, const std::vector<TensorId> &inputs) {
  TensorId out = consumer.output(0).id(), mid = producer.output(0).id();
  std::string type = producer.type, name = producer.name;
  int version = producer.version, phase = producer.phase;
  graph.removeOp(consumer);
  graph.removeOp(producer);
  graph.removeTensor(mid);
  Op &op = graph.addOp(type, "ai.onnx", version, name, std::move(attrs), inputs, {out});
  op.phase = phase;
  op.def->setup(op);
  return op;
}

/// A Transpose (last two axes) of a MatMul's only use: (A·B)ᵀ = Bᵀ·Aᵀ, as one MatMul.
static bool foldTransposedProduct(Graph &graph) {
  for (Op *t : graph.schedule()) {
    if (t->type != "Transpose" || t->domain != "ai.onnx" || !t->hasInput(0) || !swapsLastTwoAxes(*t)) continue;
    Op *m = t->input(0).producer();
    if (!m || m->type != "MatMul" || m->domain != "ai.onnx" || m->inputCount() != 2) continue;
    const Tensor &product = m->output(0);
    if (product.consumers().size() != 1 || isGraphOutput(graph, product)) continue;
    if (m->inInfo(0).rank() < 2 || m->inInfo(1).rank() < 2) continue;
    Attributes attrs;
    if (!m->attrs.getInt("popart_transB", 0)) attrs.set("popart_transA", int64_t{1});
    if (!m->attrs.getInt("popart_transA", 0)) attrs.set("popart_transB", int64_t{1});
    replacePair(graph, *m, *t, std::move(attrs), {m->input(1).id(), m->input(0).id()});
    return true;
  }
  return false;
}

int foldTransposesIntoMatMul(Graph &graph) {
  int folded = 0;
  while (foldTransposedProduct(graph))
    ++folded;
  std::vector<Op *> transposes;
  for (Op *op : graph.schedule()) {
    if (op->type != "MatMul" || op->domain != "ai.onnx" || op->inputCount() != 2) continue;
    for (size_t i = 0; i < 2; ++i) {
      const char *attr = i == 0 ? "popart_transA" : "popart_transB";
      Op *producer = op->input(i).producer();
      if (!producer || producer->type != "Transpose" || producer->domain != "ai.onnx") continue;
      if (!swapsLastTwoAxes(*producer) || producer->inInfo(0).rank() != op->inInfo(i).rank()) continue;
      graph.setOpInput(*op, i, &producer->input(0));
      op->attrs.set(attr, int64_t{op->attrs.getInt(attr, 0) ? 0 : 1}); // a transpose of a transpose cancels
      op->def->setup(*op); // same output; checks the folded form
      transposes.push_back(producer);
      ++folded;
    }
  }
  std::set<Op *> done;
  for (Op *t : transposes) {
    if (!done.insert(t).second) continue;
    bool used = false;
    for (const Tensor *out : t->outputs)
      if (out && (!out->consumers().empty() || isGraphOutput(graph, *out))) used = true;
    if (used) continue;
    std::vector<TensorId> outs;
    for (const Tensor *out : t->outputs)
      if (out) outs.push_back(out->id());
    graph.removeOp(*t);
    for (const auto &id : outs)
      graph.removeTensor(id);
  }
  return folded;
}

int fuseConvRelu(Graph &graph) {
  int fused = 0;
  bool changed = true;
  while (changed) {
    changed = false;
    for (Op *r : graph.schedule()) {
      if (r->type != "Relu" || r->domain != "ai.onnx" || !r->hasInput(0) || !r->hasOutput(0)) continue;
      Op *c = r->input(0).producer();
      if (!c || c->type != "Conv" || c->domain != "ai.onnx" || c->attrs.has("popart_activation")) continue;
      const Tensor &pre = c->output(0);
      if (pre.consumers().size() != 1 || isGraphOutput(graph, pre)) continue;
      std::vector<TensorId> ins;
      for (const Tensor *t : c->inputs)
        ins.push_back(t ? t->id() : "");
      Attributes attrs = c->attrs;
      attrs.set("popart_activation", std::string("Relu"));
      replacePair(graph, *c, *r, std::move(attrs), ins);
      ++fused;
      changed = true;
      break;
    }
  }
  return fused;
}

} // namespace popart::ir
