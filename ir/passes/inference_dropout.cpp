// inferenceDropoutAsIdentity: a Dropout that does not train becomes an Identity, which the plan
// makes a view.

#include "ir/passes/pass_manager.hpp"
#include "ir/passes/rewrite.hpp"

namespace popart::ir {

int inferenceDropoutAsIdentity(Graph &graph) {
  return rewriteAll(graph, [&](Op &op) {
    if (!isOnnxOp(&op, "Dropout") || !op.hasInput(0) || !op.hasOutput(0)) return false;
    if (op.inputCount() > 3 && op.hasInput(3)) return false; // the session's seed: it trains
    if (op.version >= 12 && op.inputCount() > 2 && op.hasInput(2)) {
      const Tensor &mode = op.input(2);
      if (!mode.isConst() || mode.info().elementCount() != 1 || mode.data()->valueAsDouble(0) != 0) return false;
    }
    if (op.outputs.size() > 1 && op.hasOutput(1)) {
      const Tensor &mask = op.output(1);
      if (!mask.consumers().empty() || isGraphOutput(graph, mask)) return false;
    }
    TensorId in = op.input(0).id(), out = op.output(0).id();
    std::vector<TensorId> gone;
    for (size_t i = 1; i < op.outputs.size(); ++i)
      if (op.hasOutput(i)) gone.push_back(op.output(i).id());
    std::string name = op.name;
    int phase = op.phase;
    graph.removeOp(op);
    for (const auto &id : gone)
      graph.removeTensor(id);
    addRewrittenOp(graph, phase, "Identity", "ai.onnx", 16, name, {}, {in}, {out});
    return true;
  });
}

void registerInferenceDropoutPasses(PassRegistry &r) {
  Pass p = optionalPass("inferenceDropoutAsIdentity",
                        "a Dropout that does not train and whose mask nothing reads becomes an Identity (a view)", 0,
                        [](Graph &g, PassContext &) { return inferenceDropoutAsIdentity(g); });
  p.before = TrainingPrepared;
  r.add(p);
}

} // namespace popart::ir
