#include "optimizer/replication.hpp"
#include "optimizer/apply.hpp"
#include "optimizer/passes.hpp"

#include <algorithm>
#include <mutex>

namespace popart::optimizer {

namespace {

/// Adds AllReduce(\p x) by \p reduction in \p phase and \returns its output.
TensorId addAllReduce(ir::Graph &g, const TensorId &x, const char *reduction, int phase) {
  ir::Attributes attrs;
  attrs.set("op", std::string(reduction));
  TensorId y = g.uniqueId(x + "_allreduced");
  ir::Op &op = g.addOp("AllReduce", "ai.graphcore", 1, "allreduce_" + x, std::move(attrs), {x}, {y});
  op.phase = phase;
  op.def->setup(op);
  return y;
}

/// Replaces each weight gradient by its all-reduce, so that accumulation, clipping, the finite
/// check and the update all read the replicas' combined gradient. The all-reduce takes the phase
/// of the op that produces the gradient: the backward's, once per micro-batch.
int allReduceGradients(ir::Graph &g, ir::PassContext &c) {
  const ReplicationPassOptions &options = c.state<ReplicationPassOptions>();
  if (!options.enabled) return 0;
  int added = 0;
  for (auto &[weight, grad] : c.state<ir::TrainingTensors>().weightGrads) {
    const ir::Op *producer = g.tensor(grad).producer();
    grad = addAllReduce(g, grad, options.mean ? "Mean" : "Sum", producer ? producer->phase : MicroBatch);
    ++added;
  }
  return added;
}

/// Combines the all-finite flag over the replicas by And, so that every replica skips the same
/// steps and moves its dynamic loss scale alike even where their gradients differ (sharded
/// updates, later); the session reads the agreed flag.
int agreeAllFinite(ir::Graph &g, ir::PassContext &c) {
  if (!c.state<ReplicationPassOptions>().enabled) return 0;
  AppliedOptimizer &applied = c.state<OptimizerPassState>().applied;
  if (applied.allFinite.empty()) return 0;
  const TensorId agreed = addAllReduce(g, applied.allFinite, "And", PreUpdate);
  std::replace(c.keep.begin(), c.keep.end(), applied.allFinite, agreed);
  applied.allFinite = agreed;
  return 1;
}

} // namespace

void registerReplicationPasses() {
  static std::once_flag once;
  std::call_once(once, [] {
    ir::PassRegistry::instance().add({
        .name = "allReduceGradients",
        .purpose = "replication: each weight gradient all-reduced over the replicas (Mean or Sum) before the optimiser",
        .needs = ir::GradientsBuilt,
        .before = ir::OptimizerApplied,
        .run = allReduceGradients,
    });
    ir::PassRegistry::instance().add({
        .name = "agreeAllFinite",
        .purpose = "replication: the all-finite flag of dynamic loss scaling combined over the replicas by And",
        .needs = ir::OptimizerApplied,
        .run = agreeAllFinite,
    });
  });
}

} // namespace popart::optimizer
