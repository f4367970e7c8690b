#include "ir/passes/passes.hpp"
#include "core/log.hpp"
#include <popart/error.hpp>

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

} // namespace popart::ir
