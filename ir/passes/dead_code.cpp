// removeDeadCode: ops that nothing kept reads go, and with them the tensors left unconnected.

#include "ir/passes/pass_manager.hpp"
#include <popart/error.hpp>

#include <set>

namespace popart::ir {

void removeDeadCode(Graph &graph, const std::vector<TensorId> &keep) {
  std::vector<TensorId> roots = keep.empty() ? graph.outputs() : keep;
  std::set<const Op *> live;
  std::vector<const Tensor *> stack;
  stack.reserve(roots.size());
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

void registerDeadCodePasses(PassRegistry &r) {
  r.add({
      .name = "removeDeadCode",
      .purpose = "removes ops nothing kept reads and makes the kept tensors (outputs, anchors, loss) the outputs",
      .needs = ShapesInferred,
      .establishes = OutputsFixed,
      .run =
          [](Graph &g, PassContext &c) {
            for (const auto &id : c.keep)
              if (!g.hasTensor(id)) throw error("removeDeadCode: kept tensor '", id, "' is not a tensor of the graph");
            size_t before = g.ops().size();
            // Outputs first, so that a model output nothing keeps goes with its producer.
            if (!c.keep.empty()) g.setOutputs(c.keep); // anchors keep their buffers to the end of the run
            removeDeadCode(g, c.keep);
            return static_cast<int>(before - g.ops().size());
          },
  });
}

} // namespace popart::ir
