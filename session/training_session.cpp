// TrainingSession: import with initializers as Variables, backward graph of the (scaled) loss,
// optimiser update ops, one execution plan run phase by phase; checkpoints and weight I/O.

#include "autodiff/autodiff.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/plan.hpp"
#include "core/log.hpp"
#include "ir/ops/rnn.hpp"
#include "ir/passes/passes.hpp"
#include "onnx_import/onnx_import.hpp"
#include "optimizer/apply.hpp"
#include "session/profile.hpp"
#include "session/session_common.hpp"
#include "session/threads.hpp"
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

namespace popart {

namespace {
constexpr char kCheckpointMagic[8] = {'P', 'O', 'P', 'A', 'R', 'T', 'C', 'K'};
constexpr int kCheckpointVersion = 1;

/// 64-bit FNV-1a of the model bytes: a checkpoint belongs to one model.
uint64_t fingerprint(const std::string &bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

/// Float initializers made constants before shape inference, and why.
struct Constants {
  std::map<TensorId, std::string> frozen;        ///< by SessionOptions::frozenWeights: the entry
  std::map<TensorId, std::string> shapeDeciding; ///< values decide shapes: where
  /// For each shape-deciding one, the tensors it reaches through ops that differentiate it.
  std::map<TensorId, std::set<TensorId>> differentiableReach;
};

/// "trained N of M weights" and each weight not trained with its reason.
std::string weightSummary(const std::vector<WeightStatus> &statuses) {
  size_t trained = 0;
  std::string rest;
  for (const auto &st : statuses) {
    if (st.role == WeightStatus::Role::Trained) {
      ++trained;
      continue;
    }
    rest += (rest.empty() ? "; not trained: '" : ", '") + st.id + "' (" + st.reason + ")";
  }
  return "trained " + std::to_string(trained) + " of " + std::to_string(statuses.size()) + " weights" + rest;
}

/// The MatMul and Gemm ways \p plan's timing chose, by configuration, for a checkpoint header.
nlohmann::json tunedWaysToJson(const backend_cpu::ExecutionPlan &plan) {
  nlohmann::json ways = nlohmann::json::object();
  for (const auto &[key, way] : plan.tunedMatMulWays())
    ways[key] = backend_cpu::matMulOperandsName(way);
  return ways;
}

} // namespace

struct TrainingSession::Impl {
  session::ModelSource model;
  DataFlow dataFlow;
  SessionOptions options;
  InputShapeInfo inputShapes;
  std::unique_ptr<Optimizer> optimizer;
  TensorId lossId;

  std::unique_ptr<ir::Graph> declared;
  std::vector<TensorId> inputIds;
  std::unique_ptr<ir::Graph> graph;
  backend_cpu::KernelContext kernelContext; ///< what the plan's kernels are created with
  std::unique_ptr<backend_cpu::ExecutionPlan> plan;
  optimizer::AppliedOptimizer applied;
  std::vector<TensorId> weightIds;          ///< trained weights, model order
  std::vector<WeightStatus> weightStatuses; ///< every float initializer, model order
  std::vector<TensorId> runningStats;       ///< BatchNormalization running mean/var (updated, not trained)
  std::vector<TensorId> stateIds;           ///< optimiser state
  /// Per update op, its weight's hyperparameters resolved once (optimizer::resolveHyperParameters).
  std::vector<std::vector<float>> resolvedHp;
  TensorId lossScaleId; ///< FLOAT scalar Variable multiplying the loss
  TensorId rngStateId;  ///< INT64 [2] Variable {seed, counter} for random ops
  /// What weightsFromHost restores: each persistent tensor's value after compile, shared with
  /// `declared` where it holds the same bytes (the model's weights), or null when all zero (most
  /// optimiser state), so that the session does not hold another copy of them.
  std::map<TensorId, std::shared_ptr<const TensorData>> initialValues;

  int64_t step = 0, skipped = 0, goodSteps = 0;
  float lossScale = 1.0f;
  uint64_t seed = 0;
  int64_t rngCounter = 0;

  int accumulation() const { return options.enableGradientAccumulation ? options.accumulationFactor : 1; }
  bool dynamicScaling() const { return options.automaticLossScalingSettings.enabled; }

  /// Variables whose values persist across steps and go into checkpoints.
  std::vector<TensorId> persistentIds() const {
    std::vector<TensorId> ids = weightIds;
    ids.insert(ids.end(), runningStats.begin(), runningStats.end());
    ids.insert(ids.end(), stateIds.begin(), stateIds.end());
    return ids;
  }

  TensorData &variable(const TensorId &id) const { return *graph->tensor(id).data(); }

  /// The persistent tensor \p id, after checking \p arr can hold it; errors start with \p what.
  TensorData &checkedWeight(const char *what, const TensorId &id, const IArray &arr) const {
    std::vector<TensorId> ids = persistentIds();
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
      for (const auto &st : weightStatuses)
        if (st.id == id)
          throw error(what, ": weight '", id, "' is not trained (", st.reason,
                      "): the compiled plan holds it as a constant");
      throw error(what, ": '", id, "' is not a weight, running statistic or optimiser state tensor of the session");
    }
    TensorData &d = variable(id);
    if (arr.dataType() != d.info().dataType() || arr.nelms() != d.info().elementCount())
      throw error(what, ": buffer for '", id, "' is ", toString(arr.dataType()), " ", toString(arr.shape()),
                  ", the tensor is ", d.info().toString());
    return d;
  }

  std::unique_ptr<ir::Graph> import() const {
    onnx_import::ImportOptions io;
    io.check = options.checkModel;
    io.initializersAsVariables = true;
    return onnx_import::importModelBytes(model.bytes, model.baseDir, io, model.sourceName);
  }

  /// The model imported with the session's input shapes, frozen and shape-deciding float
  /// initializers and all non-float ones made constants (described in \p constants), shapes
  /// inferred.
  std::unique_ptr<ir::Graph> shapedImport(Constants *constants = nullptr) const;
  /// Sorts the float initializers of \p g into weightIds and weightStatuses; throws for a weight
  /// that would be a shape constant while the loss depends on it through differentiable ops.
  void classifyWeights(const ir::Graph &g, const Constants &constants);
  /// Sets lossId, if not given, to \p g's only scalar output.
  void findLoss(const ir::Graph &g);
  void compile();
  void writeHostScalars();
  void resolveHyperParameters() {
    resolvedHp.clear();
    for (const auto &u : applied.updates)
      resolvedHp.push_back(optimizer::resolveHyperParameters(*optimizer, u.weight));
  }
  void resetState();
  /// Gives the session the MatMul and Gemm ways recorded in checkpoint \p header (a resumed run
  /// then computes the same bits as the run that wrote it), recompiling if the plan took others.
  void adoptTunedWays(const nlohmann::json &header);
};

/// The tensors \p from reaches through inputs that ops differentiate (not value inputs, not
/// inputs read only for their shapes) and outputs that may be floating point.
static std::set<TensorId> differentiableReach(const ir::Tensor &from) {
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

/// Makes constants of the float initializers that \p frozenWeights names, of those whose values
/// decide shapes (through value inputs, not through Shape or Size) and of every non-float one.
static Constants makeConstants(ir::Graph &g, const std::vector<std::string> &frozenWeights) {
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

std::unique_ptr<ir::Graph> TrainingSession::Impl::shapedImport(Constants *constants) const {
  auto g = import();
  for (const auto &id : inputIds) {
    TensorInfo info = session::resolvedInputInfo(*declared, id, inputShapes, options);
    if (!info.isKnown())
      throw error("input '", id, "' has shape ", toString(info.shape()),
                  ": training needs every input shape (set SessionOptions::batchSize or an InputShapeInfo)");
    g->tensor(id).setInfo(info);
  }
  Constants c = makeConstants(*g, options.frozenWeights);
  if (constants) *constants = std::move(c);
  backend_cpu::ReferenceEvaluator evaluator;
  ir::inferShapes(*g, options.constantFolding ? &evaluator : nullptr);
  return g;
}

void TrainingSession::Impl::findLoss(const ir::Graph &g) {
  if (!lossId.empty()) return;
  std::vector<TensorId> scalars;
  for (const auto &o : g.outputs())
    if (g.tensor(o).info().elementCount() == 1) scalars.push_back(o);
  if (scalars.size() != 1)
    throw error("model '", model.sourceName, "' has ", scalars.size(), " scalar outputs (", session::joinIds(scalars),
                "): name the loss tensor");
  lossId = scalars[0];
}

void TrainingSession::Impl::classifyWeights(const ir::Graph &g, const Constants &constants) {
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
  weightIds.clear();
  weightStatuses.clear();
  for (const auto &id : declared->initializers()) {
    const ir::Tensor *declaredTensor = declared->findTensor(id);
    if (!declaredTensor || !isFloatingPoint(declaredTensor->info().dataType())) continue;
    WeightStatus st;
    st.id = id;
    const ir::Tensor *t = g.findTensor(id);
    if (auto it = constants.frozen.find(id); it != constants.frozen.end()) {
      st.role = WeightStatus::Role::Frozen;
      st.reason = it->second == id ? "frozen by SessionOptions::frozenWeights"
                                   : "frozen by SessionOptions::frozenWeights entry '" + it->second + "'";
    } else if (auto sd = constants.shapeDeciding.find(id); sd != constants.shapeDeciding.end()) {
      if (constants.differentiableReach.at(id).count(lossId))
        throw error(
            "initializer '", id, "' cannot be trained: ", sd->second, ", so it is a constant, but loss '", lossId,
            "' also depends on it through ops that differentiate it. Freeze it explicitly "
            "(SessionOptions::frozenWeights) or export the model so that no shape is computed from a weight's values");
      st.role = WeightStatus::Role::ShapeConstant;
      st.reason = sd->second;
    } else if (std::find(runningStats.begin(), runningStats.end(), id) != runningStats.end()) {
      st.role = WeightStatus::Role::RunningStatistic;
      st.reason = "running statistic of BatchNormalization, updated each step";
    } else if (!t || t->kind() != ir::TensorKind::Variable || !upstream.count(t)) {
      st.role = WeightStatus::Role::NoGradient;
      st.reason = "loss '" + lossId + "' does not depend on it";
    } else {
      weightIds.push_back(id);
    }
    weightStatuses.push_back(std::move(st));
  }
}

void TrainingSession::Impl::compile() {
  Constants constants;
  auto g = shapedImport(&constants);
  findLoss(*g);
  // Control flow the loss depends on becomes ordinary ops, which autodiff differentiates; what
  // cannot be unrolled stays, and autodiff names it if the loss needs a gradient through it.
  ir::UnrollOptions unroll;
  unroll.maxOps = options.maxUnrolledOps;
  if (int unrolled = g->hasTensor(lossId) ? ir::unrollControlFlow(*g, {lossId}, unroll) : 0; unrolled > 0) {
    logging::logger().info("unrolled {} If, Loop and Scan ops for the backward graph", unrolled);
    backend_cpu::ReferenceEvaluator evaluator;
    ir::inferShapes(*g, options.constantFolding ? &evaluator : nullptr);
  }
  if (options.fuseOps) { // before autodiff, so that the fused ops' gradient rules apply
    std::vector<TensorId> keep = dataFlow.anchors();
    keep.push_back(lossId);
    ir::fuseLayerNorm(*g, true, keep);
    ir::fuseGelu(*g, keep);
  }

  if (!g->hasTensor(lossId)) throw error("loss '", lossId, "' is not a tensor of model '", model.sourceName, "'");
  const TensorInfo &lossInfo = g->tensor(lossId).info();
  if (lossInfo.elementCount() != 1 || !isFloatingPoint(lossInfo.dataType()))
    throw error("loss '", lossId, "' must be a floating-point scalar, got ", lossInfo.toString());

  // Random ops draw from {seed, counter}; the counter moves every micro-batch.
  rngStateId = g->uniqueId("popart_rng_state");
  {
    TensorInfo info(DataType::INT64, {2});
    g->addTensor(rngStateId, ir::TensorKind::Variable, info).setData(std::make_shared<TensorData>(info));
  }
  for (const auto &op : g->ops())
    if (op->type == "Dropout" && op->domain == "ai.onnx") {
      g->setOpInput(*op, 3, &g->tensor(rngStateId)); // pads inputs 1-2 with "absent" if needed
      op->def->setup(*op);
    }
  // BatchNormalization in training mode writes its running statistics back.
  std::vector<ir::Op *> bnOps;
  for (const auto &op : g->ops())
    if (op->type == "BatchNormalization" && op->version >= 14 && op->attrs.getInt("training_mode", 0) != 0)
      bnOps.push_back(op.get());
  for (ir::Op *bn : bnOps) {
    bn->attrs.set("popart_unbiased_running_var", int64_t{options.batchNormUnbiasedRunningVariance ? 1 : 0});
    for (size_t k : {size_t{3}, size_t{4}}) {
      ir::Tensor &stat = bn->input(k);
      if (stat.kind() != ir::TensorKind::Variable) continue;
      if (!bn->hasOutput(k - 2)) {
        while (bn->outputs.size() <= k - 2)
          bn->outputs.push_back(nullptr);
        ir::Tensor &t = g->addTensor(g->uniqueId(stat.id() + "_batch"), ir::TensorKind::ActGrad, stat.info());
        t.setProducer(bn);
        bn->outputs[k - 2] = &t;
      }
      ir::Op &copy = g->addOp("CopyVar", "ai.graphcore", 1, "update_" + stat.id(), {},
                              {stat.id(), bn->output(k - 2).id()}, {g->uniqueId(stat.id() + "_updated")});
      copy.def->setup(copy);
      runningStats.push_back(stat.id());
    }
    bn->def->setup(*bn);
  }

  classifyWeights(*g, constants);
  // Loss scaling multiplies the loss, so the whole backward pass sees scaled gradients.
  lossScaleId = g->uniqueId("popart_loss_scale");
  g->addTensor(lossScaleId, ir::TensorKind::Variable, TensorInfo(DataType::FLOAT, {}))
      .setData(std::make_shared<TensorData>(TensorData::scalarFloat(1.0f)));
  TensorId lossF = lossId;
  if (lossInfo.dataType() != DataType::FLOAT) {
    ir::Attributes to;
    to.set("to", int64_t{static_cast<int64_t>(DataType::FLOAT)});
    lossF = g->uniqueId(lossId + "_float");
    ir::Op &cast = g->addOp("Cast", "ai.onnx", 13, "", to, {lossId}, {lossF});
    cast.def->setup(cast);
  }
  TensorId reshaped = g->uniqueId(lossId + "_scalar");
  TensorId emptyShape = g->uniqueId("popart_scalar_shape");
  g->addConst(emptyShape, TensorData::fromInt64({0}, {}));
  ir::Op &rs = g->addOp("Reshape", "ai.onnx", 13, "", {}, {lossF, emptyShape}, {reshaped});
  rs.def->setup(rs);
  TensorId scaled = g->uniqueId(lossId + "_scaled");
  ir::Op &mul = g->addOp("Mul", "ai.onnx", 13, "", {}, {reshaped, lossScaleId}, {scaled});
  mul.def->setup(mul);

  // A weight upstream of the loss through ops without a gradient (ArgMax, comparisons...) gets
  // none: PyTorch leaves such a parameter alone, and so does the optimiser here.
  std::vector<TensorId> grads = autodiff::buildGradients(*g, scaled, weightIds, false);
  std::vector<std::pair<TensorId, TensorId>> weightGrads;
  std::vector<TensorId> trained;
  for (size_t i = 0; i < weightIds.size(); ++i) {
    if (!grads[i].empty()) {
      weightGrads.emplace_back(weightIds[i], grads[i]);
      trained.push_back(weightIds[i]);
      continue;
    }
    for (auto &st : weightStatuses)
      if (st.id == weightIds[i]) {
        st.role = WeightStatus::Role::NoGradient;
        st.reason = "no gradient reaches it from loss '" + lossId + "': only ops without one lie between";
      }
  }
  weightIds = std::move(trained);
  if (weightIds.empty())
    throw error("loss '", lossId, "' depends on no trainable weight: ", weightSummary(weightStatuses));
  optimizer::ApplyOptions ao;
  ao.accumulationFactor = accumulation();
  ao.checkFinite = dynamicScaling();
  applied = optimizer::applyOptimizer(*g, *optimizer, weightGrads, ao);
  stateIds.clear();
  for (const auto &u : applied.updates)
    stateIds.insert(stateIds.end(), u.state.begin(), u.state.end());
  resolveHyperParameters();

  backend_cpu::ReferenceEvaluator evaluator;
  ir::inferShapes(*g, options.constantFolding ? &evaluator : nullptr);
  std::vector<TensorId> keep{lossId};
  for (const auto &a : dataFlow.anchors()) {
    if (!g->hasTensor(a)) throw error("anchor '", a, "' is not a tensor of the model");
    if (std::find(keep.begin(), keep.end(), a) == keep.end()) keep.push_back(a);
  }
  if (!applied.allFinite.empty()) keep.push_back(applied.allFinite);
  ir::removeDeadCode(*g, keep);
  g->setOutputs(keep);
  if (options.fuseOps) {
    ir::foldTransposesIntoMatMul(*g);
    ir::fuseMaxPoolGradRelu(*g);
    ir::fuseBatchNormRelu(*g);
    ir::fuseMatMulBias(*g);
    ir::fuseMatMulScale(*g);
    ir::fuseRelu(*g, false);    // after the bias and scale; training Convs keep their plain kernels
    ir::fuseMatMulResidual(*g); // last of the MatMul fusions, which cannot follow it
    ir::fuseLossGradClassSums(*g);
    ir::fuseLossWithGradient(*g);
    // Recurrent ops keep oneDNN's workspace for their grad ops instead of the grad ops
    // recomputing the forward pass.
    if (options.kernels != "reference")
      ir::saveRecurrentState(*g, [](const ir::Op &op) { return backend_cpu::recurrentSavedBytes(op); });
  }
  plan = std::make_unique<backend_cpu::ExecutionPlan>(*g, session::compileOptions(options), kernelContext);
  graph = std::move(g);
  initialValues.clear();
  for (const auto &id : persistentIds()) {
    const TensorData &now = variable(id);
    const auto *bytes = static_cast<const uint8_t *>(now.data());
    const auto size = static_cast<size_t>(now.byteCount());
    const ir::Tensor *inModel = declared->findTensor(id);
    std::shared_ptr<const TensorData> value;
    if (inModel && inModel->data() && inModel->data()->byteCount() == now.byteCount() &&
        std::memcmp(inModel->data()->data(), bytes, size) == 0)
      value = inModel->data();
    else if (std::any_of(bytes, bytes + size, [](uint8_t b) { return b != 0; }))
      value = std::make_shared<const TensorData>(now);
    initialValues.emplace(id, std::move(value)); // null: all zero
  }
  logging::logger().info("trained {} of {} weights of '{}' with {}; {} ops, arena {} bytes", weightIds.size(),
                         weightStatuses.size(), model.sourceName, optimizer->name(), plan->stepCount(),
                         plan->memoryPlan().arenaBytes);
  for (const auto &st : weightStatuses)
    if (st.role != WeightStatus::Role::Trained) logging::logger().info("not trained: '{}': {}", st.id, st.reason);
}

void TrainingSession::Impl::resetState() {
  for (const auto &[id, data] : initialValues) {
    TensorData &v = variable(id);
    if (data)
      std::memcpy(v.data(), data->data(), static_cast<size_t>(data->byteCount()));
    else
      std::memset(v.data(), 0, static_cast<size_t>(v.byteCount()));
  }
  for (const auto &u : applied.updates)
    if (!u.accumulator.empty())
      std::memset(variable(u.accumulator).data(), 0, size_t(variable(u.accumulator).byteCount()));
  step = skipped = goodSteps = 0;
  rngCounter = 0;
  lossScale = dynamicScaling() ? options.automaticLossScalingSettings.initialScale : optimizer->lossScaling().val();
}

void TrainingSession::Impl::writeHostScalars() {
  *variable(lossScaleId).as<float>() = lossScale;
  *variable(applied.gradScale).as<float>() = 1.0f / (lossScale * static_cast<float>(accumulation()));
  for (size_t i = 0; i < applied.updates.size(); ++i)
    optimizer::writeHyperParameters(*optimizer, resolvedHp[i], step + 1,
                                    variable(applied.updates[i].hyperParameters).as<float>());
}

TrainingSession::TrainingSession() : impl_(std::make_unique<Impl>()) {}
TrainingSession::~TrainingSession() = default;

std::unique_ptr<TrainingSession> TrainingSession::createFromOnnxModel(const std::string &model,
                                                                      const DataFlow &dataFlow, const TensorId &loss,
                                                                      const Optimizer &optimizer,
                                                                      const SessionOptions &options,
                                                                      const InputShapeInfo &inputShapes) {
  std::unique_ptr<TrainingSession> s(new TrainingSession());
  Impl &m = *s->impl_;
  m.model = session::loadModel(model);
  m.dataFlow = dataFlow;
  m.options = options;
  m.inputShapes = inputShapes;
  m.optimizer = optimizer.clone();
  m.lossId = loss;
  if (options.accumulationFactor < 1) throw error("SessionOptions.accumulationFactor must be at least 1");
  if (options.accumulationFactor > 1 && !options.enableGradientAccumulation)
    throw error("SessionOptions.accumulationFactor is ", options.accumulationFactor,
                " but enableGradientAccumulation is false");
  const auto &als = options.automaticLossScalingSettings;
  if (als.enabled && !(als.initialScale > 0.0f && als.growthFactor >= 1.0f && als.backoffFactor > 0.0f &&
                       als.backoffFactor <= 1.0f && als.growthInterval > 0))
    throw error("automaticLossScalingSettings: need initialScale > 0, growthFactor >= 1, 0 < backoffFactor <= 1 "
                "and growthInterval > 0");
  if (als.enabled && m.optimizer->lossScaling().val() != 1.0f)
    throw error("dynamic loss scaling replaces the optimiser's static lossScaling; set one or the other");
  setThreadCount(options.numThreads);
  m.kernelContext = session::kernelContext(options);
  m.declared = m.import();
  m.inputIds = m.declared->inputs();
  for (const auto &[id, info] : inputShapes.getAll())
    if (std::find(m.inputIds.begin(), m.inputIds.end(), id) == m.inputIds.end())
      throw error("InputShapeInfo names '", id, "', which is not an input of the model");
  for (const auto &a : dataFlow.anchors())
    if (!m.declared->hasTensor(a) && a != loss)
      throw error("anchor '", a, "' is not a tensor of model '", m.model.sourceName, "'");
  return s;
}

void TrainingSession::prepareDevice() {
  Impl &m = *impl_;
  if (m.plan) return;
  m.compile();
  m.resetState();
}

void TrainingSession::weightsFromHost() {
  prepareDevice();
  impl_->resetState();
}

void TrainingSession::run(StepIO &stepio) {
  Impl &m = *impl_;
  prepareDevice();
  const int bps = m.dataFlow.batchesPerStep(), accum = m.accumulation();
  const int micro = bps * accum;
  Shape prefix;
  if (bps > 1) prefix.push_back(bps);
  if (accum > 1) prefix.push_back(accum);
  for (const auto &[id, arr] : stepio.inputs())
    if (std::find(m.inputIds.begin(), m.inputIds.end(), id) == m.inputIds.end())
      throw error("StepIO input '", id, "' is not an input of the model (inputs: ", session::joinIds(m.inputIds), ")");
  for (const auto &id : m.inputIds) {
    auto it = stepio.inputs().find(id);
    if (it == stepio.inputs().end()) throw error("input '", id, "' is missing from the StepIO");
    session::checkInputArray(id, it->second, m.plan->info(id), prefix);
  }
  for (const auto &[id, arr] : stepio.outputs()) {
    if (!m.dataFlow.isAnchored(id)) throw error("StepIO output '", id, "' is not an anchor of the DataFlow");
    const TensorInfo &info = m.plan->info(id);
    Shape expected = session::anchorShape(m.dataFlow.art(id), info, prefix, micro);
    if (arr.dataType() != info.dataType() || arr.shape() != expected)
      throw error("output buffer for anchor '", id, "' is ", toString(arr.dataType()), " ", toString(arr.shape()),
                  ", expected ", toString(info.dataType()), " ", toString(expected));
  }
  auto [p0b, p0e] = m.plan->phaseSteps(optimizer::MicroBatch);
  auto [p1b, p1e] = m.plan->phaseSteps(optimizer::PreUpdate);
  auto [p2b, p2e] = m.plan->phaseSteps(optimizer::Update);
  auto [p3b, p3e] = m.plan->phaseSteps(optimizer::PostUpdate);
  int64_t *rng = m.variable(m.rngStateId).as<int64_t>();
  for (int b = 0; b < bps; ++b) {
    m.writeHostScalars();
    for (int a = 0; a < accum; ++a) {
      int k = b * accum + a;
      for (const auto &id : m.inputIds) {
        IArray &arr = stepio.inputs().at(id);
        int64_t bytes = m.plan->info(id).byteCount();
        if (bytes > 0)
          std::memcpy(m.plan->address(id), static_cast<uint8_t *>(arr.data()) + k * bytes, static_cast<size_t>(bytes));
      }
      rng[0] = static_cast<int64_t>(m.seed);
      rng[1] = m.rngCounter++;
      m.plan->run(p0b, p0e);
      for (const auto &[id, arr] : stepio.outputs())
        session::writeAnchor(m.dataFlow.art(id), m.plan->info(id), m.plan->address(id), arr, k, micro);
    }
    m.plan->run(p1b, p1e);
    bool finite = true;
    if (!m.applied.allFinite.empty()) finite = *static_cast<const bool *>(m.plan->address(m.applied.allFinite));
    if (finite) {
      m.plan->run(p2b, p2e);
      ++m.step;
    } else {
      ++m.skipped;
    }
    m.plan->run(p3b, p3e);
    if (m.dynamicScaling()) {
      const auto &als = m.options.automaticLossScalingSettings;
      if (!finite) {
        m.lossScale *= als.backoffFactor;
        m.goodSteps = 0;
        logging::logger().info("non-finite gradients: update skipped, loss scale now {}", m.lossScale);
      } else if (++m.goodSteps >= als.growthInterval) {
        m.lossScale *= als.growthFactor;
        m.goodSteps = 0;
      }
    }
  }
}

void TrainingSession::readWeights(const WeightsIO &weights) const {
  const Impl &m = *impl_;
  if (!m.plan) throw error("readWeights: call prepareDevice() first");
  for (const auto &[id, arr] : weights.all()) {
    // A float initializer that is not trained keeps the model's value.
    auto st = std::find_if(m.weightStatuses.begin(), m.weightStatuses.end(),
                           [&](const WeightStatus &w) { return w.id == id; });
    bool untrained = st != m.weightStatuses.end() && st->role != WeightStatus::Role::Trained &&
                     st->role != WeightStatus::Role::RunningStatistic;
    const TensorData &d = untrained ? *m.declared->tensor(id).data() : m.checkedWeight("readWeights", id, arr);
    if (untrained && (arr.dataType() != d.info().dataType() || arr.nelms() != d.info().elementCount()))
      throw error("readWeights: buffer for '", id, "' is ", toString(arr.dataType()), " ", toString(arr.shape()),
                  ", the tensor is ", d.info().toString());
    std::memcpy(arr.data(), d.data(), static_cast<size_t>(d.byteCount()));
  }
}

void TrainingSession::writeWeights(const WeightsIO &weights) {
  Impl &m = *impl_;
  prepareDevice();
  for (const auto &[id, arr] : weights.all())
    m.checkedWeight("writeWeights", id, arr); // all checked before any is written
  for (const auto &[id, arr] : weights.all())
    std::memcpy(m.variable(id).data(), const_cast<IArray &>(arr).data(),
                static_cast<size_t>(m.variable(id).byteCount()));
}

void TrainingSession::modelToHost(const std::string &path) const {
  const Impl &m = *impl_;
  std::map<TensorId, const TensorData *> values;
  if (m.plan) {
    for (const auto &id : m.weightIds)
      values[id] = &m.variable(id);
    for (const auto &id : m.runningStats)
      values[id] = &m.variable(id);
  }
  std::string bytes = onnx_import::withInitializers(m.model.bytes, values);
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw error("modelToHost: cannot write '", tmp, "'");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) throw error("modelToHost: writing '", tmp, "' failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw error("modelToHost: cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

void TrainingSession::updateOptimizerFromHost(const Optimizer *optimizer) {
  Impl &m = *impl_;
  if (!optimizer) throw error("updateOptimizerFromHost: null optimiser");
  optimizer::checkReplaceable(*m.optimizer, *optimizer, m.weightIds);
  for (const auto &[w, params] : optimizer->specifics())
    if (std::find(m.weightIds.begin(), m.weightIds.end(), w) == m.weightIds.end())
      throw error("updateOptimizerFromHost: insertSpecific names '", w, "', which is not a trained weight");
  m.optimizer = optimizer->clone();
  if (m.plan) m.resolveHyperParameters();
  if (!m.dynamicScaling()) m.lossScale = m.optimizer->lossScaling().val();
}

void TrainingSession::saveCheckpoint(const std::string &path) const {
  const Impl &m = *impl_;
  if (!m.plan) throw error("saveCheckpoint: call prepareDevice() first");
  nlohmann::json header;
  header["version"] = kCheckpointVersion;
  header["model"] = std::to_string(fingerprint(m.model.bytes));
  header["optimizer"] = m.optimizer->name();
  header["step"] = m.step;
  header["skipped"] = m.skipped;
  header["goodSteps"] = m.goodSteps;
  header["lossScale"] = m.lossScale;
  header["seed"] = std::to_string(m.seed);
  header["rngCounter"] = m.rngCounter;
  header["matmulWays"] = tunedWaysToJson(*m.plan);
  int64_t offset = 0;
  std::vector<TensorId> ids = m.persistentIds();
  for (const auto &id : ids) {
    const TensorData &d = m.variable(id);
    header["tensors"].push_back({{"id", id},
                                 {"type", toString(d.info().dataType())},
                                 {"shape", d.info().shape()},
                                 {"offset", offset},
                                 {"bytes", d.byteCount()}});
    offset += d.byteCount();
  }
  std::string h = header.dump();
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw error("saveCheckpoint: cannot write '", tmp, "'");
    uint64_t n = h.size();
    out.write(kCheckpointMagic, sizeof kCheckpointMagic);
    out.write(reinterpret_cast<const char *>(&n), sizeof n);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto &id : ids) {
      const TensorData &d = m.variable(id);
      out.write(static_cast<const char *>(d.data()), static_cast<std::streamsize>(d.byteCount()));
    }
    if (!out.flush()) throw error("saveCheckpoint: writing '", tmp, "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw error("saveCheckpoint: cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

void TrainingSession::loadCheckpoint(const std::string &path) {
  Impl &m = *impl_;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error("loadCheckpoint: cannot open '", path, "'");
  char magic[sizeof kCheckpointMagic];
  uint64_t n = 0;
  in.read(magic, sizeof magic);
  in.read(reinterpret_cast<char *>(&n), sizeof n);
  if (!in || std::memcmp(magic, kCheckpointMagic, sizeof magic) != 0 || n > (1u << 30))
    throw error("loadCheckpoint: '", path, "' is not a checkpoint");
  std::string h(n, '\0');
  in.read(h.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h);
  } catch (const std::exception &e) {
    throw error("loadCheckpoint: '", path, "' has a corrupt header: ", e.what());
  }
  try {
    m.adoptTunedWays(header);
  } catch (const std::exception &e) {
    throw error("loadCheckpoint: '", path, "' has malformed MatMul ways: ", e.what());
  }
  prepareDevice();
  try {
    if (header.at("version").get<int>() != kCheckpointVersion)
      throw error("version ", header.at("version").get<int>(), " (expected ", kCheckpointVersion, ")");
    if (header.at("model").get<std::string>() != std::to_string(fingerprint(m.model.bytes)))
      throw error("it was written for a different model");
    if (header.at("optimizer").get<std::string>() != m.optimizer->name())
      throw error("it holds ", header.at("optimizer").get<std::string>(), " state, the session uses ",
                  m.optimizer->name());
    std::vector<TensorId> ids = m.persistentIds();
    const auto &tensors = header.at("tensors");
    if (tensors.size() != ids.size())
      throw error("it holds ", tensors.size(), " tensors, the session has ", ids.size());
    std::vector<TensorData> values;
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto &t = tensors[i];
      const TensorData &d = m.variable(ids[i]);
      if (t.at("id").get<std::string>() != ids[i])
        throw error("tensor ", i, " is '", t.at("id").get<std::string>(), "', expected '", ids[i], "'");
      if (t.at("shape").get<Shape>() != d.info().shape() ||
          t.at("type").get<std::string>() != toString(d.info().dataType()))
        throw error("tensor '", ids[i], "' is ", t.at("type").get<std::string>(), " ",
                    toString(t.at("shape").get<Shape>()), ", the session has ", d.info().toString());
      TensorData v(d.info());
      in.read(static_cast<char *>(v.data()), static_cast<std::streamsize>(v.byteCount()));
      if (!in) throw error("it is truncated in tensor '", ids[i], "'");
      values.push_back(std::move(v));
    }
    // Everything read and checked: only now change the session.
    for (size_t i = 0; i < ids.size(); ++i)
      std::memcpy(m.variable(ids[i]).data(), values[i].data(), static_cast<size_t>(values[i].byteCount()));
    m.step = header.at("step").get<int64_t>();
    m.skipped = header.at("skipped").get<int64_t>();
    m.goodSteps = header.at("goodSteps").get<int64_t>();
    m.lossScale = header.at("lossScale").get<float>();
    m.seed = std::stoull(header.at("seed").get<std::string>());
    m.rngCounter = header.at("rngCounter").get<int64_t>();
  } catch (const nlohmann::json::exception &e) {
    throw error("loadCheckpoint: '", path, "' has a malformed header: ", e.what());
  } catch (const error &e) {
    throw error("loadCheckpoint: '", path, "': ", e.what());
  }
}

void TrainingSession::Impl::adoptTunedWays(const nlohmann::json &header) {
  auto recorded = header.find("matmulWays");
  if (recorded == header.end() || kernelContext.matmulOperands != backend_cpu::MatMulOperands::Auto) return;
  if (header.value("model", std::string()) != std::to_string(fingerprint(model.bytes))) return; // refused later
  std::map<std::string, backend_cpu::MatMulOperands> ways;
  for (const auto &[key, name] : recorded->items())
    ways[key] = backend_cpu::matMulOperandsNamed(name.get<std::string>());
  bool differs = false;
  if (plan)
    for (const auto &[key, way] : ways) {
      auto taken = plan->tunedMatMulWays().find(key);
      differs = differs || (taken != plan->tunedMatMulWays().end() && taken->second != way);
    }
  kernelContext.matmulTuning->preset(ways);
  if (!differs) return;
  logging::logger().info("recompiling with the MatMul ways the checkpoint recorded");
  plan.reset();
  runningStats.clear(); // compile() finds them again
  compile();
  resetState();
}

void TrainingSession::setRandomSeed(uint64_t seed) {
  impl_->seed = seed;
  impl_->rngCounter = 0;
}

std::vector<TensorId> TrainingSession::getInputIds() const { return impl_->inputIds; }
std::vector<TensorId> TrainingSession::getWeightIds() const {
  const_cast<TrainingSession *>(this)->prepareDevice();
  return impl_->weightIds;
}
std::vector<WeightStatus> TrainingSession::getWeightStatuses() const {
  const_cast<TrainingSession *>(this)->prepareDevice();
  return impl_->weightStatuses;
}
std::vector<TensorId> TrainingSession::getOptimizerStateIds() const {
  const_cast<TrainingSession *>(this)->prepareDevice();
  return impl_->stateIds;
}
const TensorId &TrainingSession::getLossId() const {
  // Found from the shapes alone: no plan is compiled for it.
  if (impl_->lossId.empty()) impl_->findLoss(*impl_->shapedImport());
  return impl_->lossId;
}
TensorInfo TrainingSession::getInfo(const TensorId &id) const {
  const_cast<TrainingSession *>(this)->prepareDevice();
  return impl_->plan->info(id);
}
int64_t TrainingSession::getStepCount() const { return impl_->step; }
float TrainingSession::getLossScale() const { return impl_->lossScale; }
int64_t TrainingSession::getSkippedSteps() const { return impl_->skipped; }
std::string TrainingSession::dumpIr() const { return (impl_->graph ? impl_->graph : impl_->declared)->dump(); }
int64_t TrainingSession::plannedArenaBytes() const { return impl_->plan ? impl_->plan->memoryPlan().arenaBytes : 0; }

std::string TrainingSession::explainKernels() const {
  if (!impl_->plan) throw error("explainKernels: call prepareDevice() first");
  return session::kernelReport(*impl_->plan);
}

void TrainingSession::enableProfiling() {
  prepareDevice();
  impl_->plan->enableProfiling();
}

void TrainingSession::writeProfileTrace(const std::string &path) const {
  if (!impl_->plan) throw error("writeProfileTrace: the session has not run");
  session::writeChromeTrace(*impl_->plan, path);
}

std::string TrainingSession::profileSummary() const {
  const Impl &m = *impl_;
  if (!m.plan) throw error("profileSummary: the session has not run");
  auto bytesOf = [&](const std::vector<TensorId> &ids) {
    int64_t n = 0;
    for (const auto &id : ids)
      n += m.variable(id).byteCount();
    return n;
  };
  int64_t weights = bytesOf(m.weightIds), stats = bytesOf(m.runningStats), state = bytesOf(m.stateIds);
  int64_t accumulators = 0;
  for (const auto &u : m.applied.updates)
    if (!u.accumulator.empty()) accumulators += m.variable(u.accumulator).byteCount();
  const auto &p = *m.plan;
  int64_t other = p.variableBytes() - weights - stats - state - accumulators;
  return session::profileSummary(p, {{"activation arena", p.memoryPlan().arenaBytes},
                                     {"kernels", p.kernelBytes()},
                                     {"weights", weights},
                                     {"optimiser state", state},
                                     {"gradient accumulators", accumulators},
                                     {"running statistics", stats},
                                     {"constants and hyperparameters", p.constBytes() + other}});
}

} // namespace popart
