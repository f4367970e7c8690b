// findLoss and findWeights, and the constants they start from (see weights.hpp).

#include "autodiff/weights.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <mutex>
#include <regex>

namespace popart::autodiff {

namespace {

/// The tensors \p from reaches through inputs that ops differentiate (not value inputs, not
/// inputs read only for their shapes) and outputs that may be floating point.
std::set<TensorId> differentiableReach(const ir::Tensor &from) {
  std::set<TensorId> reach;
  std::vector<const ir::Tensor *> stack{&from};
  while (!stack.empty()) {
    const ir::Tensor *t = stack.back();
    stack.pop_back();
    if (!reach.insert(t->id()).second) continue;
    for (const ir::Op *c : t->consumers()) {
      std::vector<size_t> values = ir::valueInputIndices(*c);
      bool differentiated = false;
      for (size_t k = 0; k < c->inputCount(); ++k)
        differentiated = differentiated || (c->inputs[k] == t && ir::readsValuesOf(*c, k) &&
                                            std::find(values.begin(), values.end(), k) == values.end());
      if (!differentiated) continue;
      for (const ir::Tensor *out : c->outputs) {
        DataType type = out ? out->info().dataType() : DataType::UNDEFINED;
        if (out && (type == DataType::UNDEFINED || isFloatingPoint(type))) stack.push_back(out);
      }
    }
  }
  return reach;
}

/// Sets the loss, if not given, to the only scalar output, and checks it is a float scalar.
int findLoss(ir::Graph &g, ir::PassContext &c) {
  const WeightDiscovery &d = c.state<WeightDiscovery>();
  if (c.loss.empty()) c.loss = onlyScalarOutput(g, d.sourceName);
  if (!g.hasTensor(c.loss)) throw error("loss '", c.loss, "' is not a tensor of model '", d.sourceName, "'");
  const TensorInfo &lossInfo = g.tensor(c.loss).info();
  if (lossInfo.elementCount() != 1 || !isFloatingPoint(lossInfo.dataType()))
    throw error("loss '", c.loss, "' must be a floating-point scalar, got ", lossInfo.toString());
  if (std::find(c.keep.begin(), c.keep.end(), c.loss) == c.keep.end()) c.keep.insert(c.keep.begin(), c.loss);
  return 0;
}

/// Sorts the float initializers of the model into the weights to train and the statuses of the
/// others; throws for a weight that would be a shape constant while the loss depends on it
/// through differentiable ops.
int findWeights(ir::Graph &g, ir::PassContext &c) {
  WeightDiscovery &d = c.state<WeightDiscovery>();
  ir::TrainingTensors &tt = c.state<ir::TrainingTensors>();
  const TensorId &lossId = c.loss;
  // The tensors the loss is computed from, all inputs followed (value inputs are constants by now).
  std::set<const ir::Tensor *> upstream;
  std::vector<const ir::Tensor *> stack{&g.tensor(lossId)};
  while (!stack.empty()) {
    const ir::Tensor *t = stack.back();
    stack.pop_back();
    if (!upstream.insert(t).second) continue;
    if (const ir::Op *p = t->producer())
      for (const ir::Tensor *in : p->inputs)
        if (in) stack.push_back(in);
  }
  tt.weights.clear();
  d.weights.clear();
  for (const auto &id : d.declared->initializers()) {
    const ir::Tensor *declaredTensor = d.declared->findTensor(id);
    if (!declaredTensor || !isFloatingPoint(declaredTensor->info().dataType())) continue;
    FoundWeight st;
    st.id = id;
    const ir::Tensor *t = g.findTensor(id);
    if (auto it = d.constants.frozen.find(id); it != d.constants.frozen.end()) {
      st.role = WeightRole::Frozen;
      st.reason = it->second == id ? "frozen by SessionOptions::frozenWeights"
                                   : "frozen by SessionOptions::frozenWeights entry '" + it->second + "'";
    } else if (auto sd = d.constants.shapeDeciding.find(id); sd != d.constants.shapeDeciding.end()) {
      if (d.constants.differentiableReach.at(id).count(lossId))
        throw error(
            "initializer '", id, "' cannot be trained: ", sd->second, ", so it is a constant, but loss '", lossId,
            "' also depends on it through ops that differentiate it. Freeze it explicitly "
            "(SessionOptions::frozenWeights) or export the model so that no shape is computed from a weight's values");
      st.role = WeightRole::ShapeConstant;
      st.reason = sd->second;
    } else if (std::find(tt.runningStats.begin(), tt.runningStats.end(), id) != tt.runningStats.end()) {
      st.role = WeightRole::RunningStatistic;
      st.reason = "running statistic of BatchNormalization, updated each step";
    } else if (!t || t->kind() != ir::TensorKind::Variable || !upstream.count(t)) {
      st.role = WeightRole::NoGradient;
      st.reason = "loss '" + lossId + "' does not depend on it";
    } else {
      tt.weights.push_back(id);
    }
    if (st.role != WeightRole::Trained) tt.untrained.push_back("'" + id + "' (" + st.reason + ")");
    d.weights.push_back(std::move(st));
  }
  tt.floatInitializers = d.weights.size();
  return static_cast<int>(tt.weights.size());
}

} // namespace

Constants makeConstants(ir::Graph &g, const std::vector<std::string> &frozenWeights) {
  Constants c;
  auto isFloatVariable = [&](const TensorId &id) {
    const ir::Tensor *t = g.findTensor(id);
    return t && t->kind() == ir::TensorKind::Variable && isFloatingPoint(t->info().dataType());
  };
  for (const auto &entry : frozenWeights) {
    std::regex pattern;
    try {
      pattern = std::regex(entry, std::regex::ECMAScript);
    } catch (const std::regex_error &e) {
      throw error("SessionOptions::frozenWeights entry '", entry,
                  "' is neither an initializer name nor a valid regular expression (", e.what(), ")");
    }
    bool matched = false;
    for (const auto &id : g.initializers())
      if (isFloatVariable(id) && (id == entry || std::regex_match(id, pattern))) {
        c.frozen.emplace(id, entry);
        matched = true;
      }
    if (!matched)
      throw error("SessionOptions::frozenWeights entry '", entry,
                  "' matches no floating-point initializer of the model");
  }
  for (const auto &[id, entry] : c.frozen)
    g.tensor(id).setKind(ir::TensorKind::Const);
  for (const auto &[t, use] : ir::shapeDecidingTensors(g)) {
    if (t->kind() != ir::TensorKind::Variable) continue;
    if (isFloatingPoint(t->info().dataType())) {
      c.shapeDeciding.emplace(t->id(), "its values decide a shape: input " + std::to_string(use.input) + " of " +
                                           use.op->debugName());
      c.differentiableReach.emplace(t->id(), differentiableReach(*t));
    }
    g.tensor(t->id()).setKind(ir::TensorKind::Const);
  }
  for (const auto &[id, t] : g.tensors())
    if (t->kind() == ir::TensorKind::Variable && !isFloatingPoint(t->info().dataType()))
      t->setKind(ir::TensorKind::Const);
  return c;
}

TensorId onlyScalarOutput(const ir::Graph &g, const std::string &sourceName) {
  std::vector<TensorId> scalars;
  for (const auto &o : g.outputs())
    if (g.tensor(o).info().elementCount() == 1) scalars.push_back(o);
  if (scalars.size() != 1) {
    std::string ids;
    for (const auto &id : scalars)
      ids += (ids.empty() ? "" : ", ") + id;
    throw error("model '", sourceName, "' has ", scalars.size(), " scalar outputs (", ids, "): name the loss tensor");
  }
  return scalars[0];
}

void registerWeightPasses() {
  static std::once_flag once;
  std::call_once(once, [] {
    ir::PassRegistry &r = ir::PassRegistry::instance();
    r.add({
        .name = "findLoss",
        .purpose = "the loss (the model's only scalar output unless named) must be a floating-point scalar",
        .needs = ir::ShapesInferred,
        .before = ir::TrainingPrepared,
        .run = findLoss,
    });
    r.add({
        .name = "findWeights",
        .purpose = "which float initializers the loss trains, and why each other one is not trained",
        .needs = ir::ShapesInferred,
        .before = ir::TrainingPrepared,
        .run = findWeights,
    });
  });
}

} // namespace popart::autodiff
