#include "optimizer/replication.hpp"
#include "optimizer/apply.hpp"
#include "optimizer/passes.hpp"
#include "optimizer/sharding.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

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

/// Gradients in the order the backward produces them (by their producers' places in the
/// schedule; a gradient without a producer first), as indices into \p weightGrads.
std::vector<size_t> productionOrder(const ir::Graph &g, const std::vector<std::pair<TensorId, TensorId>> &weightGrads) {
  std::map<const ir::Op *, size_t> place;
  const std::vector<ir::Op *> schedule = g.schedule();
  for (size_t s = 0; s < schedule.size(); ++s)
    place[schedule[s]] = s + 1;
  std::vector<std::pair<size_t, size_t>> keyed; // (place of the producer, index)
  for (size_t i = 0; i < weightGrads.size(); ++i) {
    const ir::Op *producer = g.tensor(weightGrads[i].second).producer();
    keyed.emplace_back(producer ? place.at(producer) : 0, i);
  }
  std::stable_sort(keyed.begin(), keyed.end());
  std::vector<size_t> order;
  order.reserve(keyed.size());
  for (const auto &k : keyed)
    order.push_back(k.second);
  return order;
}

/// Groups \p weightGrads (but the gradients of the weights in \p skip) in production order into buckets of one type,
/// each closed once it holds \p bucketBytes (a gradient of half that or more alone), and adds per bucket an
/// AllReduceStart in the backward's phase (scheduled once its last gradient exists) and an AllReduceWait in PreUpdate
/// (after the whole backward), whose outputs replace the gradients. \returns the number of buckets.
int addBuckets(ir::Graph &g, std::vector<std::pair<TensorId, TensorId>> &weightGrads, const std::set<TensorId> &skip,
               const char *reduction, int64_t bucketBytes) {
  std::vector<std::vector<size_t>> buckets;
  int64_t bytes = 0;
  for (size_t i : productionOrder(g, weightGrads)) {
    if (skip.count(weightGrads[i].first)) continue;
    const TensorInfo &info = g.tensor(weightGrads[i].second).info();
    if (!buckets.empty() && bytes > 0 &&
        g.tensor(weightGrads[buckets.back().front()].second).info().dataType() != info.dataType())
      bytes = 0; // a bucket holds one type
    // A gradient of half a bucket or more goes alone: a bucket of one is reduced in the
    // gradient's own bytes (the kernels run in place), without copies in and out of a bucket
    // buffer, which for the MLP's 7.4 MB of gradients cost more than the ring itself.
    const bool alone = 2 * info.byteCount() >= bucketBytes;
    if (alone) bytes = 0;
    if (buckets.empty() || bytes == 0) buckets.emplace_back();
    buckets.back().push_back(i);
    bytes += info.byteCount();
    if (alone || bytes >= bucketBytes) bytes = 0;
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    std::vector<TensorId> grads, reduced;
    std::vector<int64_t> shapes;
    int phase = MicroBatch;
    for (size_t i : buckets[b]) {
      const TensorId &grad = weightGrads[i].second;
      grads.push_back(grad);
      reduced.push_back(g.uniqueId(grad + "_allreduced"));
      const Shape &shape = g.tensor(grad).info().shape();
      shapes.push_back(static_cast<int64_t>(shape.size()));
      shapes.insert(shapes.end(), shape.begin(), shape.end());
      if (const ir::Op *producer = g.tensor(grad).producer()) phase = std::max(phase, producer->phase);
    }
    const std::string name = "allreduce_bucket" + std::to_string(b);
    ir::Attributes startAttrs;
    startAttrs.set("op", std::string(reduction));
    const TensorId bucket = g.uniqueId(name);
    ir::Op &start =
        g.addOp("AllReduceStart", "ai.graphcore", 1, name + "_start", std::move(startAttrs), grads, {bucket});
    start.phase = phase;
    start.def->setup(start);
    ir::Attributes waitAttrs;
    waitAttrs.set("shapes", shapes);
    ir::Op &wait = g.addOp("AllReduceWait", "ai.graphcore", 1, name + "_wait", std::move(waitAttrs), {bucket}, reduced);
    wait.phase = std::max(phase, static_cast<int>(PreUpdate));
    wait.def->setup(wait);
    for (size_t k = 0; k < buckets[b].size(); ++k)
      weightGrads[buckets[b][k]].second = reduced[k];
  }
  return static_cast<int>(buckets.size());
}

/// Replaces each weight gradient by its all-reduce, so that clipping, the finite check and the
/// update all read the replicas' combined gradient: in buckets that overlap the rest of the
/// backward, or (bucketBytes 0) one blocking all-reduce per gradient in the phase of its
/// producer. With accumulation it leaves the gradients to allReduceAccumulatedGradients; the
/// sharded weights' gradients it leaves to applyOptimizer, which reduce-scatters them.
int allReduceGradients(ir::Graph &g, ir::PassContext &c) {
  const ReplicationPassOptions &options = c.state<ReplicationPassOptions>();
  if (!options.enabled || c.state<OptimizerPassState>().options.accumulationFactor > 1) return 0;
  auto &weightGrads = c.state<ir::TrainingTensors>().weightGrads;
  const char *reduction = options.mean ? "Mean" : "Sum";
  const std::set<TensorId> &sharded = shardedWeights(g, c);
  if (options.bucketBytes > 0) return addBuckets(g, weightGrads, sharded, reduction, options.bucketBytes);
  int added = 0;
  for (auto &[weight, grad] : weightGrads) {
    if (sharded.count(weight)) continue;
    const ir::Op *producer = g.tensor(grad).producer();
    grad = addAllReduce(g, grad, reduction, producer ? producer->phase : MicroBatch);
    ++added;
  }
  return added;
}

/// With accumulation, all-reduces each accumulated gradient once per update (PreUpdate), rather
/// than every micro-batch's gradient: clipping, the finite check, the statistics and the update
/// read the reduced sum; the accumulator itself, which ResetVar clears, stays this replica's.
int allReduceAccumulatedGradients(ir::Graph &g, ir::PassContext &c) {
  const ReplicationPassOptions &options = c.state<ReplicationPassOptions>();
  const OptimizerPassState &state = c.state<OptimizerPassState>();
  if (!options.enabled || state.options.accumulationFactor <= 1) return 0;
  const std::set<TensorId> &sharded = shardedWeights(g, c);
  int added = 0;
  for (const WeightUpdate &u : state.applied.updates) {
    // A sharded weight's accumulated gradient is reduce-scattered by the optimiser instead.
    if (u.accumulator.empty() || sharded.count(u.weight)) continue;
    const ir::Op *accumulate = nullptr;
    for (const ir::Op *op : g.tensor(u.accumulator).consumers())
      if (op->type == "Accumulate") accumulate = op;
    if (!accumulate)
      throw error("allReduceAccumulatedGradients: no Accumulate op updates '", u.accumulator, "' (of weight '",
                  u.weight, "')");
    const TensorId sum = accumulate->output(0).id();
    const std::vector<ir::Op *> readers = g.tensor(sum).consumers();
    const TensorId reduced = addAllReduce(g, sum, options.mean ? "Mean" : "Sum", PreUpdate);
    for (ir::Op *reader : readers) {
      if (reader->type == "ResetVar") continue;
      for (size_t i = 0; i < reader->inputs.size(); ++i)
        if (reader->inputs[i] && reader->inputs[i]->id() == sum) g.setOpInput(*reader, i, &g.tensor(reduced));
    }
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

/// Moves each bucket's AllReduceWait into the Update phase when only update ops read what it
/// waits for and no finite check can skip that phase: the scheduler runs a Wait late
/// (OpDef::scheduleLate), so each waits just before its weights' updates, and the last buckets'
/// rings advance during the updates of the earlier ones.
int waitForBucketsAtTheirUpdates(ir::Graph &g, ir::PassContext &c) {
  if (!c.state<ReplicationPassOptions>().enabled || !c.state<OptimizerPassState>().applied.allFinite.empty()) return 0;
  int moved = 0;
  for (const auto &op : g.ops()) {
    if (op->type != "AllReduceWait" || op->phase != PreUpdate) continue;
    bool onlyUpdates = true;
    for (const ir::Tensor *t : op->outputs)
      if (t)
        for (const ir::Op *reader : t->consumers())
          onlyUpdates = onlyUpdates && reader->phase == Update;
    if (!onlyUpdates) continue;
    op->phase = Update;
    ++moved;
  }
  return moved;
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
        .name = "allReduceAccumulatedGradients",
        .purpose = "replication with accumulation: each accumulated gradient all-reduced once per update, before "
                   "clipping, the finite check and the optimiser",
        .needs = ir::OptimizerApplied,
        .run = allReduceAccumulatedGradients,
    });
    ir::PassRegistry::instance().add({
        .name = "waitForBucketsAtTheirUpdates",
        .purpose = "replication: a bucket's AllReduceWait runs just before its weights' updates when only they read "
                   "its gradients, so that later buckets overlap earlier updates",
        .needs = ir::OptimizerApplied,
        .optional = true,
        .run = waitForBucketsAtTheirUpdates,
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
