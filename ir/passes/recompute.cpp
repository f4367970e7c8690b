// recompute: a forward activation held from the forward pass to the backward pass costs its bytes
// for the whole of the step between; computing it again just before the backward pass reads it
// costs time instead. The clones run the same kernels on the same inputs, so the step's results
// are the same bit for bit.

#include "ir/passes/recompute.hpp"
#include "ir/annotations.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/ops/dropout.hpp"
#include "ir/passes/pass_manager.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>

namespace popart::ir {

namespace {

// PopART's RecomputeType values of the annotation.
constexpr int64_t kCheckpoint = 1;
constexpr int64_t kRecompute = 2;
constexpr int64_t kRecomputed = 3;

bool isNormalisation(const Op &op) {
  return op.type == "BatchNormalization" || op.type == "LayerNormalization" || op.type == "GroupNormalization" ||
         op.type == "InstanceNormalization";
}

/// Why \p op cannot be recomputed, or "" if it can.
std::string notRecomputable(const Op &op) {
  if (op.def && !op.def->modifies.empty()) return "it updates an input in place";
  if (op.attrs.has(internal_attr::kCaptures)) return "it runs a subgraph";
  if (op.phase != 0) return "it runs once per step after the micro-batches";
  if (op.def && op.def->randomInput >= 0 && op.type != "Dropout")
    return "it draws random numbers that a copy would not draw again";
  for (const Tensor *t : op.outputs)
    if (t)
      for (const Op *reader : t->consumers())
        if (reader->attrs.has(internal_attr::kForward)) return "its gradient op reads its saved state";
  return "";
}

int64_t outputBytes(const Op &op) {
  int64_t bytes = 0;
  for (const Tensor *t : op.outputs)
    if (t && t->info().isKnown()) bytes += t->info().byteCount();
  return bytes;
}

/// Standard: the forward schedule in about sqrt(N) segments; in each, the point where the fewest
/// bytes cross from earlier ops to later forward readers; the ops whose outputs cross a chosen point
/// are kept (checkpoints), and with them every op after the last point, whose outputs the backward
/// pass reads first. The rest is recomputed, one segment at a time as the backward pass reaches it.
std::set<const Op *> standardChoice(const std::vector<Op *> &forward) {
  const size_t n = forward.size();
  std::map<const Op *, size_t> position;
  for (size_t i = 0; i < n; ++i)
    position[forward[i]] = i;
  // lastUse[i]: the last forward position reading op i's outputs.
  std::vector<size_t> lastUse(n);
  for (size_t i = 0; i < n; ++i) {
    lastUse[i] = i;
    for (const Tensor *t : forward[i]->outputs)
      if (t)
        for (const Op *reader : t->consumers())
          if (auto it = position.find(reader); it != position.end()) lastUse[i] = std::max(lastUse[i], it->second);
  }
  // crossing[i]: bytes of the outputs of ops at or before i read after i.
  std::vector<int64_t> delta(n + 1, 0);
  for (size_t i = 0; i < n; ++i)
    if (lastUse[i] > i) {
      delta[i] += outputBytes(*forward[i]);
      delta[lastUse[i]] -= outputBytes(*forward[i]);
    }
  std::vector<int64_t> crossing(n);
  int64_t sum = 0;
  for (size_t i = 0; i < n; ++i)
    crossing[i] = sum += delta[i];
  const auto segments = static_cast<size_t>(std::max(1.0, std::round(std::sqrt(static_cast<double>(n)))));
  std::set<const Op *> kept;
  size_t lastPoint = 0;
  // No point in the last segment: the backward pass would recompute it as soon as it starts (the
  // loss's few bytes would put the point at the very end), holding the same bytes for no gain.
  for (size_t s = 0; s + 1 < segments; ++s) {
    const size_t from = s * n / segments, to = (s + 1) * n / segments;
    if (from >= to) continue;
    size_t best = from;
    for (size_t i = from; i < to; ++i)
      if (crossing[i] < crossing[best]) best = i;
    for (size_t j = 0; j <= best; ++j)
      if (lastUse[j] > best) kept.insert(forward[j]);
    lastPoint = best;
  }
  for (size_t i = segments > 1 ? lastPoint + 1 : 0; i < n; ++i)
    kept.insert(forward[i]);
  std::set<const Op *> chosen;
  for (const Op *op : forward)
    if (!kept.count(op)) chosen.insert(op);
  return chosen;
}

/// Pipeline: every forward op but those whose outputs a forward op of another stage reads.
std::set<const Op *> pipelineChoice(const std::vector<Op *> &forward) {
  const std::set<const Op *> forwardSet(forward.begin(), forward.end());
  std::set<const Op *> chosen;
  for (const Op *op : forward) {
    const std::optional<int64_t> stage = pipelineStageOf(*op);
    bool crosses = false;
    for (const Tensor *t : op->outputs)
      if (t)
        for (const Op *reader : t->consumers())
          crosses = crosses || (forwardSet.count(reader) && pipelineStageOf(*reader) != stage);
    if (!crosses) chosen.insert(op);
  }
  return chosen;
}

/// True if an op made after \p lastForward (a backward op) reads an output of \p op.
bool readInBackward(const Op &op, int64_t lastForward) {
  for (const Tensor *t : op.outputs)
    if (t)
      for (const Op *reader : t->consumers())
        if (reader->id > lastForward) return true;
  return false;
}

/// Backward ops that read no gradient (the Transpose of a forward input that a weight's gradient
/// MatMul reads) are ready as soon as what they read is: reading a clone, they would pull it into
/// the forward pass. Their outputs are made Tensor::recomputed too, so that they run just before
/// their readers. The gradients are the backward ops that depend on the loss scale, the Variable
/// the scaled loss is a product with.
void markGradientFreeReaders(Graph &graph, const std::vector<Op *> &backward, const TensorId &scaledLoss) {
  std::set<const Tensor *> gradients;
  for (const Tensor *t : graph.tensor(scaledLoss).producer()->inputs)
    if (t && !t->producer() && t->kind() == TensorKind::Variable) gradients.insert(t);
  std::set<const Op *> backwardSet(backward.begin(), backward.end());
  // Backward ops in an order where producers come first.
  std::vector<Op *> order;
  for (Op *op : graph.schedule())
    if (backwardSet.count(op)) order.push_back(op);
  for (Op *op : order) {
    bool gradient = false, recomputed = false;
    for (const Tensor *t : op->inputs) {
      gradient = gradient || (t && gradients.count(t));
      recomputed = recomputed || (t && t->recomputed());
    }
    for (Tensor *t : op->outputs) {
      if (!t) continue;
      if (gradient)
        gradients.insert(t);
      else if (recomputed)
        t->setRecomputed(true);
    }
  }
}

} // namespace

RecomputePlan planRecomputation(const Graph &graph, const TensorId &scaledLoss, RecomputeMode mode) {
  RecomputePlan plan;
  std::set<const Op *> ancestors;
  std::vector<const Tensor *> stack{&graph.tensor(scaledLoss)};
  while (!stack.empty()) {
    const Tensor *t = stack.back();
    stack.pop_back();
    if (Op *p = t->producer(); p && ancestors.insert(p).second)
      for (const Tensor *in : p->inputs)
        if (in) stack.push_back(in);
  }
  for (Op *op : graph.schedule())
    if (ancestors.count(op)) plan.forward.push_back(op);
  std::set<const Op *> chosen;
  switch (mode) {
  case RecomputeMode::None: break;
  case RecomputeMode::Standard: chosen = standardChoice(plan.forward); break;
  case RecomputeMode::NormOnly:
    for (const Op *op : plan.forward)
      if (isNormalisation(*op)) chosen.insert(op);
    break;
  case RecomputeMode::All: chosen.insert(plan.forward.begin(), plan.forward.end()); break;
  case RecomputeMode::Pipeline: chosen = pipelineChoice(plan.forward); break;
  }
  // The last forward op that the backward pass reads is kept, so that the backward pass depends on
  // the forward pass: with everything recomputed from the inputs, the backward ops would not, and
  // the schedule could run them first.
  for (const Op *op : plan.forward)
    plan.lastForwardId = std::max(plan.lastForwardId, op->id);
  for (auto op = plan.forward.rbegin(); op != plan.forward.rend(); ++op)
    if (readInBackward(**op, plan.lastForwardId)) {
      chosen.erase(*op);
      break;
    }
  for (const Op *op : plan.forward) {
    const int64_t annotated = recomputeOf(*op);
    const std::string why = notRecomputable(*op);
    if (annotated == kRecompute && !why.empty())
      throw error(op->debugName(), " is annotated ", kRecomputeAttribute,
                  " = Recompute, but it cannot be recomputed: ", why);
    if (annotated == kRecompute) plan.chosen.insert(op);
    if (annotated != kCheckpoint && why.empty() && chosen.count(op)) plan.chosen.insert(op);
  }
  return plan;
}

int recompute(Graph &graph, const TensorId &scaledLoss, RecomputeMode mode) {
  const RecomputePlan plan = planRecomputation(graph, scaledLoss, mode);
  if (plan.chosen.empty()) return 0;
  const std::set<const Op *> forward(plan.forward.begin(), plan.forward.end());
  std::map<const Op *, Op *> clones;
  // The clone of chosen op \p op, made with the clones of the chosen ops it reads.
  std::function<Op &(const Op &)> cloneOf = [&](const Op &op) -> Op & {
    if (auto it = clones.find(&op); it != clones.end()) return *it->second;
    std::vector<TensorId> inputs, outputs;
    for (const Tensor *t : op.inputs) {
      const Op *p = t ? t->producer() : nullptr;
      if (p && plan.chosen.count(p)) {
        const Op &c = cloneOf(*p);
        const auto k = static_cast<size_t>(std::find(p->outputs.begin(), p->outputs.end(), t) - p->outputs.begin());
        inputs.push_back(c.output(k).id());
      } else {
        inputs.push_back(t ? t->id() : "");
      }
    }
    for (const Tensor *t : op.outputs)
      outputs.push_back(t ? graph.uniqueId(t->id() + "_recomputed") : "");
    Attributes attrs = op.attrs;
    // The salt defaults to a hash of output 0's name, which the clone's differs in.
    if (op.def && op.def->randomInput >= 0) attrs.set(internal_attr::kSalt, dropoutSalt(op));
    attrs.set(kRecomputeAttribute, kRecomputed);
    Op &c = graph.addOp(op.type, op.domain, op.version, op.name.empty() ? "" : op.name + "_recomputed",
                        std::move(attrs), inputs, outputs);
    c.fusion = op.fusion;
    c.phase = op.phase;
    for (size_t k = 0; k < op.outputs.size(); ++k)
      if (op.outputs[k]) {
        c.output(k).setInfo(op.outputs[k]->info());
        c.output(k).setRecomputed(true);
      }
    clones[&op] = &c;
    return c;
  };
  std::vector<Op *> backward;
  for (const auto &op : graph.ops())
    if (op->id > plan.lastForwardId && !forward.count(op.get())) backward.push_back(op.get());
  for (Op *reader : backward)
    for (size_t k = 0; k < reader->inputCount(); ++k) {
      const Tensor *t = reader->inputs[k];
      const Op *p = t ? t->producer() : nullptr;
      if (!p || !plan.chosen.count(p)) continue;
      const Op &c = cloneOf(*p);
      const auto out = static_cast<size_t>(std::find(p->outputs.begin(), p->outputs.end(), t) - p->outputs.begin());
      graph.setOpInput(*reader, k, &c.output(out));
    }
  markGradientFreeReaders(graph, backward, scaledLoss);
  return static_cast<int>(clones.size());
}

void registerRecomputePasses(PassRegistry &r) {
  r.add({
      .name = "recompute",
      .purpose = "the backward pass reads recomputed copies of the forward activations that "
                 "SessionOptions::autoRecomputation or the ops' recompute annotations choose, made just before it "
                 "needs them",
      .needs = ShapesInferred | GradientsBuilt,
      .before = OptimizerApplied,
      .run =
          [](Graph &g, PassContext &c) {
            return recompute(g, c.state<TrainingTensors>().scaledLoss, c.state<RecomputeOptions>().mode);
          },
  });
}

} // namespace popart::ir
