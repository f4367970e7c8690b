#include "ir/passes/pipeline_stages.hpp"
#include "core/log.hpp"
#include "ir/annotations.hpp"
#include "ir/passes/pass_manager.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <set>

namespace popart::ir {

double estimatedSeconds(const Op &op) {
  double bytes = 0;
  for (const Tensor *t : op.inputs)
    if (t && t->info().isTensor()) bytes += static_cast<double>(t->info().byteCount());
  for (const Tensor *t : op.outputs)
    if (t && t->info().isTensor()) bytes += static_cast<double>(t->info().byteCount());
  return estimateFlops(op) / 50e9 + bytes / 10e9;
}

namespace {

/// The stage the passes gave \p op; -1 if none yet.
int stageOf(const Op &op) { return static_cast<int>(pipelineStageOf(op).value_or(-1)); }
void setStage(Op &op, int stage) { op.attrs.set(kPipelineStageAttribute, int64_t{stage}); }

/// Gives each op without a stage one: the latest stage of the ops producing its inputs, else (an
/// op reading only weights, constants or graph inputs, such as a weight's Cast) the earliest
/// stage of the ops reading its outputs, else 0.
void followNeighbours(const std::vector<Op *> &schedule) {
  std::vector<Op *> open;
  for (Op *op : schedule) {
    if (stageOf(*op) >= 0) continue;
    int stage = -1;
    for (const Tensor *t : op->inputs)
      if (t && t->producer()) stage = std::max(stage, stageOf(*t->producer()));
    if (stage >= 0)
      setStage(*op, stage);
    else
      open.push_back(op);
  }
  for (auto it = open.rbegin(); it != open.rend(); ++it) {
    int stage = -1;
    for (const Tensor *t : (*it)->outputs)
      if (t)
        for (const Op *c : t->consumers())
          if (const int s = stageOf(*c); s >= 0) stage = stage < 0 ? s : std::min(stage, s);
    setStage(**it, std::max(stage, 0));
  }
}

/// Throws unless every op's stage is in [0, stages) and no op reads a tensor of a later stage.
void checkStages(const std::vector<Op *> &schedule, int stages) {
  for (const Op *op : schedule) {
    const int stage = stageOf(*op);
    if (stage >= stages)
      throw error(op->debugName(), " is on pipeline stage ", stage, " but the pipeline has ", stages,
                  " stages (one per process of a replica: MPI ranks / replicatedGraphCount)");
    for (const Tensor *t : op->inputs)
      if (t && t->producer() && stageOf(*t->producer()) > stage)
        throw error(op->debugName(), " of pipeline stage ", stage, " reads tensor '", t->id(), "' of the later stage ",
                    stageOf(*t->producer()));
  }
}

/// The estimated cost of \p op in a training step: its forward (estimatedSeconds), as much again
/// for each input whose gradient autodiff will compute (an input that is or depends on a trained
/// weight), and the optimiser's pass over each trained weight it reads (about six times its bytes
/// read or written: the weight, its gradient and the optimiser's state).
double trainingCost(const Op &op, const std::set<const Tensor *> &needGradient, const std::set<TensorId> &weights) {
  const double forward = estimatedSeconds(op);
  double cost = forward;
  for (const Tensor *t : op.inputs)
    if (t && needGradient.count(t)) {
      cost += forward;
      if (weights.count(t->id())) cost += 6.0 * static_cast<double>(t->info().byteCount()) / 10e9;
    }
  return cost;
}

/// Contiguous pieces of \p schedule of about equal estimated training cost, each at least one op.
void balance(const std::vector<Op *> &schedule, int stages, const TrainingTensors &tt) {
  const std::set<TensorId> weights(tt.weights.begin(), tt.weights.end());
  std::set<const Tensor *> needGradient;
  for (const Op *op : schedule)
    for (const Tensor *t : op->inputs)
      if (t && weights.count(t->id())) needGradient.insert(t);
  for (const Op *op : schedule)
    if (std::any_of(op->inputs.begin(), op->inputs.end(), [&](const Tensor *t) { return needGradient.count(t); }))
      for (const Tensor *t : op->outputs)
        if (t) needGradient.insert(t);
  const auto n = static_cast<int64_t>(schedule.size());
  if (n < stages)
    throw error("cannot cut ", n, " ops into ", stages, " pipeline stages: the model has fewer ops than stages");
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i)
    prefix[static_cast<size_t>(i) + 1] =
        prefix[static_cast<size_t>(i)] + trainingCost(*schedule[size_t(i)], needGradient, weights);
  const double total = prefix.back();
  // Stage k starts at the op whose cost midpoint first passes k/stages of the total, moved so that
  // every stage keeps at least one op.
  std::vector<int64_t> start(static_cast<size_t>(stages) + 1, n);
  start[0] = 0;
  for (int k = 1; k < stages; ++k) {
    int64_t i = 0;
    const double target = total * k / stages;
    while (i < n && (prefix[size_t(i)] + prefix[size_t(i) + 1]) / 2 < target)
      ++i;
    start[size_t(k)] = std::clamp(i, start[size_t(k) - 1] + 1, n - (stages - k));
  }
  for (int k = 0; k < stages; ++k)
    for (int64_t i = start[size_t(k)]; i < start[size_t(k) + 1]; ++i)
      setStage(*schedule[size_t(i)], k);
}

/// Stage of each op: how many tensors of \p splitAt it depends on (they must come in forward order).
void cutAtTensors(Graph &g, const std::vector<Op *> &schedule, const std::vector<TensorId> &splitAt, int stages) {
  if (static_cast<int>(splitAt.size()) != stages - 1)
    throw error("pipelineSplit names ", splitAt.size(), " tensors; ", stages, " pipeline stages need ", stages - 1);
  std::map<const Tensor *, int> level; // stages a tensor's readers are at least on
  for (size_t i = 0; i < splitAt.size(); ++i) {
    const Tensor *t = g.findTensor(splitAt[i]);
    if (!t || !t->producer())
      throw error("pipelineSplit: '", splitAt[i], "' is not a tensor that an op of the model produces");
    level[t] = static_cast<int>(i) + 1;
  }
  for (Op *op : schedule) {
    int stage = 0;
    for (const Tensor *t : op->inputs)
      if (t) {
        if (auto it = level.find(t); it != level.end()) stage = std::max(stage, it->second);
        if (t->producer()) stage = std::max(stage, stageOf(*t->producer()));
      }
    setStage(*op, stage);
  }
  for (size_t i = 0; i < splitAt.size(); ++i) {
    const Tensor &t = g.tensor(splitAt[i]);
    if (stageOf(*t.producer()) != static_cast<int>(i))
      throw error("pipelineSplit: '", splitAt[i], "' is produced on stage ", stageOf(*t.producer()), ", not ", i,
                  ": list the tensors in forward order, each depending on the one before");
  }
}

/// Throws if a trained weight is read on two stages: its gradient would have two owners.
void checkWeightsOnOneStage(const Graph &g, const TrainingTensors &tt) {
  for (const TensorId &w : tt.weights) {
    const Tensor *t = g.findTensor(w);
    if (!t) continue;
    std::set<int> stages;
    for (const Op *c : t->consumers())
      stages.insert(stageOf(*c));
    if (stages.size() > 1)
      throw error("weight '", w, "' is read on pipeline stages ", *stages.begin(), " and ", *stages.rbegin(),
                  ": each trained weight must belong to one stage (annotate its readers alike)");
  }
}

int assignPipelineStages(Graph &g, PassContext &c) {
  const PipelineSettings &settings = c.state<PipelineSettings>();
  if (settings.stages <= 1) return 0;
  const std::vector<Op *> schedule = g.schedule();
  switch (settings.cut) {
  case PipelineSettings::Cut::Annotations:
    for (Op *op : schedule) {
      std::optional<int64_t> stage = pipelineStageOf(*op);
      if (!stage) stage = virtualGraphOf(*op);
      if (stage) setStage(*op, static_cast<int>(*stage));
    }
    break;
  case PipelineSettings::Cut::Balanced: balance(schedule, settings.stages, c.state<TrainingTensors>()); break;
  case PipelineSettings::Cut::AtTensors: cutAtTensors(g, schedule, settings.splitAt, settings.stages); break;
  }
  followNeighbours(schedule);
  checkStages(schedule, settings.stages);
  checkWeightsOnOneStage(g, c.state<TrainingTensors>());
  PipelineStages &ps = c.state<PipelineStages>();
  ps.stageCost.assign(static_cast<size_t>(settings.stages), 0.0);
  std::vector<int> ops(static_cast<size_t>(settings.stages), 0);
  for (const Op *op : schedule) {
    ps.stageCost[size_t(stageOf(*op))] += estimatedSeconds(*op);
    ++ops[size_t(stageOf(*op))];
  }
  for (int k = 0; k < settings.stages; ++k) {
    if (ops[size_t(k)] == 0)
      throw error("pipeline stage ", k, " of ", settings.stages,
                  " has no ops: every stage needs some (annotations skip it, or too few ops to cut)");
    logging::logger().info("pipeline stage {}: {} forward ops, estimated {:.3f} ms", k, ops[size_t(k)],
                           ps.stageCost[size_t(k)] * 1e3);
  }
  return static_cast<int>(schedule.size());
}

int splitPipelineStages(Graph &g, PassContext &c) {
  const PipelineSettings &settings = c.state<PipelineSettings>();
  if (settings.stages <= 1) return 0;
  const std::vector<Op *> schedule = g.schedule();
  followNeighbours(schedule); // ops that autodiff made without a forward op to follow (sums of partials)
  for (const Op *op : schedule)
    if (stageOf(*op) >= settings.stages)
      throw error(op->debugName(), " is on pipeline stage ", stageOf(*op), " of ", settings.stages);
  TrainingTensors &tt = c.state<TrainingTensors>();
  checkWeightsOnOneStage(g, tt);

  // Every (tensor, reading stage) pair across stages, in an order all stages agree on.
  std::vector<StageMessage> all;
  for (const Op *op : schedule)
    for (const Tensor *t : op->outputs) {
      if (!t) continue;
      std::set<int> readers;
      for (const Op *reader : t->consumers())
        if (stageOf(*reader) != stageOf(*op)) readers.insert(stageOf(*reader));
      for (int to : readers)
        all.push_back({t->id(), stageOf(*op), to, 0});
    }
  std::sort(all.begin(), all.end(), [](const StageMessage &a, const StageMessage &b) {
    return std::tie(a.tensor, a.to) < std::tie(b.tensor, b.to);
  });
  if (all.size() >= (size_t{1} << 15))
    throw error("the pipeline stages exchange ", all.size(), " tensors per micro-batch; at most 32767 are supported");
  PipelineStages &ps = c.state<PipelineStages>();
  ps.sends.clear();
  ps.receives.clear();
  for (size_t i = 0; i < all.size(); ++i) {
    all[i].tag = static_cast<int>(i);
    if (all[i].from == settings.stage) ps.sends.push_back(all[i]);
    if (all[i].to == settings.stage) ps.receives.push_back(all[i]);
  }
  ps.producerStage.clear();
  ps.producedInfo.clear();
  for (const TensorId &id : c.keep)
    if (const Tensor *t = g.findTensor(id); t && t->producer()) {
      ps.producerStage[id] = stageOf(*t->producer());
      ps.producedInfo[id] = t->info();
    }

  int removed = 0;
  for (Op *op : schedule)
    if (stageOf(*op) != settings.stage) {
      g.removeOp(*op);
      ++removed;
    }
  std::set<TensorId> received;
  for (const StageMessage &m : ps.receives)
    if (received.insert(m.tensor).second) g.addInput(m.tensor);
  std::vector<TensorId> keep;
  for (const TensorId &id : c.keep) {
    auto it = ps.producerStage.find(id);
    if (g.hasTensor(id) && (it == ps.producerStage.end() || it->second == settings.stage)) keep.push_back(id);
  }
  for (const StageMessage &m : ps.sends)
    if (std::find(keep.begin(), keep.end(), m.tensor) == keep.end()) keep.push_back(m.tensor);
  c.keep = std::move(keep);
  std::vector<TensorId> outputs;
  std::copy_if(g.outputs().begin(), g.outputs().end(), std::back_inserter(outputs),
               [&](const TensorId &id) { return std::find(c.keep.begin(), c.keep.end(), id) != c.keep.end(); });
  g.setOutputs(std::move(outputs));
  // Weights, constants and activations of the other stages that nothing here reads.
  const std::set<TensorId> inputs(g.inputs().begin(), g.inputs().end());
  std::vector<TensorId> unused;
  for (const auto &[id, t] : g.tensors())
    if (!t->producer() && t->consumers().empty() && !inputs.count(id) &&
        std::find(c.keep.begin(), c.keep.end(), id) == c.keep.end())
      unused.push_back(id);
  for (const TensorId &id : unused)
    g.removeTensor(id);
  auto present = [&](const TensorId &id) { return g.hasTensor(id); };
  std::vector<TensorId> weights;
  std::copy_if(tt.weights.begin(), tt.weights.end(), std::back_inserter(weights), present);
  tt.weights = std::move(weights);
  std::vector<std::pair<TensorId, TensorId>> grads;
  std::copy_if(tt.weightGrads.begin(), tt.weightGrads.end(), std::back_inserter(grads),
               [&](const auto &wg) { return present(wg.first); });
  tt.weightGrads = std::move(grads);
  std::vector<TensorId> stats;
  std::copy_if(tt.runningStats.begin(), tt.runningStats.end(), std::back_inserter(stats), present);
  tt.runningStats = std::move(stats);
  logging::logger().info("pipeline stage {} of {}: {} ops kept, {} tensors sent and {} received per micro-batch",
                         settings.stage, settings.stages, g.ops().size(), ps.sends.size(), ps.receives.size());
  return removed;
}

int markPipelineForward(Graph &g, PassContext &c) {
  const PipelineSettings &settings = c.state<PipelineSettings>();
  if (settings.stages <= 1 || settings.stage == settings.stages - 1) return 0;
  // The backward: what depends on the gradients received from later stages, and the ops whose
  // outputs only the backward reads (a weight's transposed copy for the gradient MatMul).
  std::set<const Tensor *> gradients;
  for (const StageMessage &m : c.state<PipelineStages>().receives)
    if (!m.forward()) gradients.insert(&g.tensor(m.tensor));
  const std::vector<Op *> schedule = g.schedule();
  std::set<const Op *> backward;
  for (const Op *op : schedule) {
    if (op->phase != 0) continue;
    const bool reads = std::any_of(op->inputs.begin(), op->inputs.end(), [&](const Tensor *t) {
      return t && (gradients.count(t) || (t->producer() && backward.count(t->producer())));
    });
    if (reads) backward.insert(op);
  }
  const std::set<TensorId> outputs(g.outputs().begin(), g.outputs().end());
  for (auto it = schedule.rbegin(); it != schedule.rend(); ++it) {
    const Op *op = *it;
    if (op->phase != 0 || backward.count(op)) continue;
    bool onlyBackward = true, read = false;
    for (const Tensor *t : op->outputs) {
      if (!t) continue;
      onlyBackward =
          onlyBackward && !outputs.count(t->id()) && std::find(c.keep.begin(), c.keep.end(), t->id()) == c.keep.end();
      for (const Op *reader : t->consumers()) {
        read = true;
        onlyBackward = onlyBackward && backward.count(reader);
      }
    }
    if (read && onlyBackward) backward.insert(op);
  }
  int marked = 0;
  for (Op *op : schedule)
    if (op->phase == 0 && !backward.count(op)) {
      op->phase = kPipelineForwardPhase;
      ++marked;
    }
  return marked;
}

} // namespace

void registerPipelineStagePasses(PassRegistry &r) {
  r.add({
      .name = "assignPipelineStages",
      .purpose = "pipelining: gives every forward op a pipeline stage (annotations, pipelineSplit or a balanced cut)",
      .needs = ShapesInferred, // training: after scaleLoss, so that the loss scaling goes with the loss
      .before = GradientsBuilt,
      .run = assignPipelineStages,
  });
  r.add({
      .name = "splitPipelineStages",
      .purpose = "pipelining: keeps this process's stage; tensors read across stages become messages (sent, received)",
      .needs = ShapesInferred, // training: after autodiff, so that gradients go with their ops
      .before = OptimizerApplied,
      .run = splitPipelineStages,
  });
  r.add({
      .name = "markPipelineForward",
      .purpose = "pipelining: a stage's forward ops go to a phase of their own, run apart from its backward",
      .needs = OptimizerApplied,
      .run = markPipelineForward,
  });
}

} // namespace popart::ir
