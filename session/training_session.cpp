// TrainingSession: imports the model with initializers as Variables, runs the training pipeline
// (session/pipelines.cpp: backward graph of the scaled loss, optimiser updates, fusions), compiles
// one execution plan and runs it phase by phase, moving inputs, anchors and host scalars.

#include "autodiff/training_passes.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "comm/mpi_communicator.hpp"
#include "core/log.hpp"
#include "ir/passes/pipeline_stages.hpp"
#include "ir/passes/recompute.hpp"
#include "optimizer/passes.hpp"
#include "optimizer/replication.hpp"
#include "session/pipelines.hpp"
#include "session/profile.hpp"
#include "session/threads.hpp"
#include "session/training_impl.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <set>
#include <sstream>
#include <type_traits>

namespace popart {

namespace {

/// The histogram method keeps the loss scale within [2^-24, 2^24]: a scale that only grows (no
/// gradient ever near the edge) stays finite, and one that keeps halving (NaN from the data, not
/// from overflow) stays a normal float that the scaled loss does not flush to zero.
constexpr float kMinHistogramLossScale = 0x1p-24f;
constexpr float kMaxHistogramLossScale = 0x1p24f;

WeightStatus::Role statusRole(autodiff::WeightRole role) {
  switch (role) {
  case autodiff::WeightRole::Trained: return WeightStatus::Role::Trained;
  case autodiff::WeightRole::Frozen: return WeightStatus::Role::Frozen;
  case autodiff::WeightRole::ShapeConstant: return WeightStatus::Role::ShapeConstant;
  case autodiff::WeightRole::NoGradient: return WeightStatus::Role::NoGradient;
  case autodiff::WeightRole::RunningStatistic: return WeightStatus::Role::RunningStatistic;
  }
  return WeightStatus::Role::NoGradient;
}

/// A hash built field by field, the same on every rank (all ranks of a job share one byte order).
/// Four lanes of independent multiply chains hash a model's weights at several GB/s.
class AgreementHash {
public:
  void bytes(const void *data, size_t n) {
    const auto *p = static_cast<const unsigned char *>(data);
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (size_t k = 0; k < 4; ++k)
        lane(k, load(p + i + 8 * k));
    for (; i + 8 <= n; i += 8)
      lane(0, load(p + i));
    uint64_t tail = n;
    for (; i < n; ++i)
      tail = (tail << 8) | p[i];
    lane(1, tail);
  }
  void text(const std::string &s) { bytes(s.data(), s.size()); }
  template <typename T> void value(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes(&v, sizeof v);
  }
  uint64_t get() const {
    uint64_t h = 0;
    for (uint64_t l : lanes_)
      h = (h ^ l) * 0x100000001b3ULL + (h >> 31);
    return h;
  }

private:
  static uint64_t load(const unsigned char *p) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    return w;
  }
  void lane(size_t k, uint64_t w) {
    uint64_t &h = lanes_[k];
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  uint64_t lanes_[4] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL, 0x9e3779b97f4a7c15ULL, 0xbf58476d1ce4e5b9ULL};
};

/// What every replica must agree on, one hash per group so that a mismatch can be named.
struct AgreementGroup {
  const char *name;
  uint64_t hash;
};

std::vector<AgreementGroup> agreementGroups(const session::ModelSource &model, const ir::Graph &declared,
                                            const SessionOptions &o, const Optimizer &optimizer,
                                            const InputShapeInfo &inputShapes, const TensorId &loss) {
  AgreementHash graph;
  graph.text(model.bytes);
  // Initializers in external files are not in the model's bytes.
  for (const TensorId &id : declared.initializers())
    if (const auto *data = declared.tensor(id).data().get()) {
      graph.text(id);
      graph.bytes(data->data(), static_cast<size_t>(data->byteCount()));
    }
  graph.text(loss);

  AgreementHash replication;
  replication.value(o.replicatedGraphCount);
  replication.value(o.accumulationAndReplicationReductionType);
  replication.value(o.replicatedBatchNormStatistics);
  replication.value(o.replicationBucketBytes); // the buckets decide the ranks' collectives

  AgreementHash pipelining;
  pipelining.value(o.enablePipelining);
  pipelining.value(o.virtualGraphMode);
  for (const std::string &t : o.pipelineSplit)
    pipelining.text(t);

  AgreementHash accumulation;
  accumulation.value(o.enableGradientAccumulation);
  accumulation.value(o.accumulationFactor);

  AgreementHash opt;
  opt.text(optimizer.name());
  auto optimizerValue = [&](const OptimizerValue &v) {
    opt.value(v.val());
    opt.value(v.isConst());
  };
  for (const std::string &name : optimizer.hyperParameterNames()) {
    opt.text(name);
    optimizerValue(optimizer.get(name));
  }
  for (const auto &[weight, values] : optimizer.specifics()) {
    opt.text(weight);
    for (const auto &[name, v] : values) {
      opt.text(name);
      optimizerValue(v);
    }
  }
  optimizerValue(optimizer.lossScaling());
  for (const ClipNormSettings &clip : optimizer.clipNormSettings()) {
    opt.value(clip.maxNorm);
    for (const TensorId &id : clip.weightIds)
      opt.text(id);
  }

  AgreementHash precision;
  precision.text(o.precision);
  const AutomaticLossScalingSettings &als = o.automaticLossScalingSettings;
  precision.value(als.enabled);
  precision.value(als.method);
  precision.value(als.initialScale);
  precision.value(als.growthFactor);
  precision.value(als.backoffFactor);
  precision.value(als.growthInterval);
  precision.value(als.binEdgeLocation);
  precision.value(als.thresholdUpperCountProportion);
  precision.value(als.updatePeriod);

  AgreementHash batch;
  batch.value(o.batchSize);
  for (const auto &[id, info] : inputShapes.getAll()) {
    batch.text(id);
    batch.value(info.dataType());
    for (int64_t d : info.shape())
      batch.value(d);
  }

  // What changes the graph that is compiled, and so the order of the ranks' collectives.
  AgreementHash compilation;
  compilation.value(o.batchNormUnbiasedRunningVariance);
  for (const std::string &w : o.frozenWeights)
    compilation.text(w);
  compilation.value(o.constantFolding);
  compilation.value(o.fuseOps);
  compilation.text(o.kernels);
  for (const std::string &p : o.disabledPasses)
    compilation.text(p);
  compilation.value(o.maxUnrolledOps);
  compilation.text(o.matmulTuning); // Auto's ways are agreed after compiling (agreeOnTunedWays)

  return {{"the model (graph or initial weights) or loss", graph.get()},
          {"replication options (replicatedGraphCount, accumulationAndReplicationReductionType, "
           "replicatedBatchNormStatistics, replicationBucketBytes)",
           replication.get()},
          {"pipelining options (enablePipelining, virtualGraphMode, pipelineSplit)", pipelining.get()},
          {"gradient accumulation (enableGradientAccumulation, accumulationFactor)", accumulation.get()},
          {"the optimiser (type, hyperparameters, loss scaling or clipping)", opt.get()},
          {"precision (precision, automaticLossScalingSettings)", precision.get()},
          {"batch size or input shapes (batchSize, InputShapeInfo)", batch.get()},
          {"compilation options (frozenWeights, batchNormUnbiasedRunningVariance, constantFolding, fuseOps, kernels, "
           "disabledPasses, maxUnrolledOps, matmulTuning)",
           compilation.get()}};
}

/// Throws on every rank, naming the ranks and groups that differ from rank 0's, unless all ranks
/// of \p communicator hold the same \p groups. One all-gather of a fixed size, so that ranks that
/// disagree still meet in it instead of waiting for each other in different collectives later.
void checkReplicasAgree(comm::Communicator &communicator, const std::vector<AgreementGroup> &groups) {
  const auto n = static_cast<size_t>(communicator.size());
  std::vector<uint64_t> mine(groups.size());
  std::transform(groups.begin(), groups.end(), mine.begin(), [](const AgreementGroup &g) { return g.hash; });
  std::vector<uint64_t> all(mine.size() * n);
  communicator.allGather(mine.data(), all.data(), static_cast<int64_t>(mine.size()), DataType::INT64);
  std::string differences;
  for (size_t r = 1; r < n; ++r) {
    std::string which;
    for (size_t k = 0; k < groups.size(); ++k)
      if (all[r * groups.size() + k] != all[k]) which += std::string(which.empty() ? "" : "; ") + groups[k].name;
    if (!which.empty())
      differences +=
          (differences.empty() ? "" : ". ") + ("rank " + std::to_string(r) + " differs from rank 0 in " + which);
  }
  if (differences.empty()) return;
  throw error("rank ", communicator.rank(), " of ", n,
              ": the replicas were not created from the same model and options (every rank must create its "
              "TrainingSession alike): ",
              differences);
}

ir::RecomputeMode recomputeMode(RecomputationType type) {
  switch (type) {
  case RecomputationType::None: return ir::RecomputeMode::None;
  case RecomputationType::Standard: return ir::RecomputeMode::Standard;
  case RecomputationType::NormOnly: return ir::RecomputeMode::NormOnly;
  case RecomputationType::RecomputeAll: return ir::RecomputeMode::All;
  case RecomputationType::Pipeline: return ir::RecomputeMode::Pipeline;
  }
  throw error("SessionOptions.autoRecomputation is ", static_cast<int>(type),
              ", not a RecomputationType (None, Standard, NormOnly, RecomputeAll, Pipeline)");
}

} // namespace

std::unique_ptr<ir::Graph> TrainingSession::Impl::shapedImport(autodiff::Constants *constants, bool inferShapes) const {
  auto g = import();
  for (const auto &id : inputIds) {
    TensorInfo info = session::resolvedInputInfo(*declared, id, inputShapes, options);
    if (!info.isKnown())
      throw error("input '", id, "' has shape ", toString(info.shape()),
                  ": training needs every input shape (set SessionOptions::batchSize or an InputShapeInfo)");
    g->tensor(id).setInfo(info);
  }
  autodiff::Constants c = autodiff::makeConstants(*g, options.frozenWeights);
  if (constants) *constants = std::move(c);
  if (inferShapes) {
    backend_cpu::ReferenceEvaluator evaluator;
    ir::inferShapes(*g, options.constantFolding ? &evaluator : nullptr);
  }
  return g;
}

void TrainingSession::Impl::findLoss(const ir::Graph &g) {
  if (lossId.empty()) lossId = autodiff::onlyScalarOutput(g, model.sourceName);
}

namespace {
// Under dynamic loss scaling a step whose gradients overflow is expected: its update is skipped.
// What the scaled loss reaches before the update (gradients, their norms and statistics) is left
// to that finite check; the update itself runs only on finite gradients, so it stays checked.
std::set<TensorId> scaledBeforeUpdate(const ir::Graph &g, const TensorId &lossScale) {
  std::set<TensorId> scaled;
  if (!g.hasTensor(lossScale)) return scaled; // a pipeline stage without the loss
  std::vector<const ir::Tensor *> todo{&g.tensor(lossScale)};
  while (!todo.empty()) {
    const ir::Tensor *t = todo.back();
    todo.pop_back();
    for (const ir::Op *op : t->consumers()) {
      if (op->phase == optimizer::Update) continue;
      for (const ir::Tensor *out : op->outputs)
        if (out && scaled.insert(out->id()).second) todo.push_back(out);
    }
  }
  return scaled;
}
} // namespace

void TrainingSession::Impl::compile() {
  session::registerAllPasses();
  ir::PassContext context;
  autodiff::WeightDiscovery &discovery = context.state<autodiff::WeightDiscovery>();
  auto g = shapedImport(&discovery.constants, false);
  discovery.declared = declared.get();
  discovery.sourceName = model.sourceName;
  backend_cpu::ReferenceEvaluator evaluator;
  context.folder = options.constantFolding ? &evaluator : nullptr;
  context.training = true;
  context.loss = lossId;
  if (!lossId.empty()) context.keep.push_back(lossId);
  for (const auto &a : dataFlow.anchors())
    if (std::find(context.keep.begin(), context.keep.end(), a) == context.keep.end()) context.keep.push_back(a);
  context.state<ir::UnrollOptions>().maxOps = options.maxUnrolledOps;
  autodiff::TrainingPassOptions &trainingOptions = context.state<autodiff::TrainingPassOptions>();
  trainingOptions.unbiasedRunningVariance = options.batchNormUnbiasedRunningVariance;
  trainingOptions.averageRunningStatistics =
      kernelContext.communicator && options.replicatedBatchNormStatistics == ReplicatedStatistics::Mean;
  optimizer::OptimizerPassState &opt = context.state<optimizer::OptimizerPassState>();
  opt.optimizer = optimizer.get();
  opt.options.accumulationFactor = accumulation();
  opt.options.checkFinite = dynamicScaling();
  optimizer::ReplicationPassOptions &replication = context.state<optimizer::ReplicationPassOptions>();
  replication.enabled = kernelContext.communicator != nullptr;
  replication.mean = options.accumulationAndReplicationReductionType == ReductionType::Mean;
  const TensorLocationSettings &stateLocation = options.optimizerStateTensorLocationSettings;
  if (stateLocation.location.replicatedTensorSharding == ReplicatedTensorSharding::On && replication.enabled) {
    opt.options.sharding.replicas = kernelContext.communicator->size();
    opt.options.sharding.rank = kernelContext.communicator->rank();
    opt.options.sharding.mean = replication.mean;
    opt.options.sharding.minElements = stateLocation.minElementsForReplicatedTensorSharding;
  }
  if (options.replicationBucketBytes < 0)
    throw error("SessionOptions.replicationBucketBytes must be 0 (no buckets) or positive, got ",
                options.replicationBucketBytes);
  replication.bucketBytes = options.replicationBucketBytes;
  const ir::PrecisionPolicy precision = session::precisionPolicy(options, true);
  if (histogramScaling()) {
    opt.options.binEdgeLocation = options.automaticLossScalingSettings.binEdgeLocation;
    opt.options.binEdgeOfHalf = precision.low == DataType::FLOAT16;
  }
  // Second moments in fp32 in every mode (PopART's accl2Type float). It decides the state of the
  // 16-bit Variables, fp16.16's weights and those of a model.half() model: in fp16 a squared
  // gradient below ~2.4e-4 underflows and Adam divides m by ε; in bfloat16 v can never decrease
  // (β2 = 0.999 moves it by less than half a unit). FLOAT weights' state is FLOAT anyway.
  opt.options.secondMomentType = DataType::FLOAT;
  // Recurrent ops keep oneDNN's workspace for their grad ops instead of the grad ops
  // recomputing the forward pass.
  if (options.kernels != "reference")
    context.recurrentSavedBytes = [](const ir::Op &op) { return backend_cpu::recurrentSavedBytes(op); };
  context.state<ir::PrecisionPolicy>() = precision;
  pipeline.reset();
  if (pipelineGroups) context.state<ir::PipelineSettings>() = session::pipelineSettings(*pipelineGroups, options);
  context.state<ir::RecomputeOptions>().mode = recomputeMode(options.autoRecomputation);
  passRecords =
      ir::runPipeline("training", session::trainingPipeline(), *g, context, session::pipelineOptions(options));

  lossId = context.loss;
  streams.host = context.state<ir::StreamTypes>().host;
  const ir::TrainingTensors &tt = context.state<ir::TrainingTensors>();
  weightIds = tt.weights;
  weightStatuses.clear();
  for (const autodiff::FoundWeight &w : discovery.weights) {
    WeightStatus st;
    st.id = w.id;
    st.role = statusRole(w.role);
    st.reason = w.reason;
    weightStatuses.push_back(std::move(st));
  }
  for (const auto &id : tt.unreached)
    for (auto &st : weightStatuses)
      if (st.id == id) {
        st.role = WeightStatus::Role::NoGradient;
        st.reason = "no gradient reaches it from loss '" + lossId + "': only ops without one lie between";
      }
  runningStats = tt.runningStats;
  rngStateId = tt.rngState;
  lossScaleId = tt.lossScale;
  applied = std::move(opt.applied);
  stateIds.clear();
  for (const auto &u : applied.updates)
    stateIds.insert(stateIds.end(), u.state.begin(), u.state.end());
  resolveHyperParameters();
  backend_cpu::CompileOptions compile = session::compileOptions(options);
  compile.checkMemory = [&](const backend_cpu::PlannedMemory &planned) {
    session::checkMemoryLimit(memoryParts(*g, planned), planned, options, model.sourceName);
  };
  plan = std::make_unique<backend_cpu::ExecutionPlan>(*g, compile, kernelContext);
  if (options.enableFloatingPointChecks)
    plan->enableNumericChecks(dynamicScaling() ? scaledBeforeUpdate(*g, lossScaleId) : std::set<TensorId>{});
  if (pipelineGroups) {
    const int stages = pipelineGroups->stageCount, stage = pipelineGroups->stage;
    pipeline = std::make_unique<session::PipelineRun>(*pipelineGroups, context.state<ir::PipelineStages>(), *g, *plan,
                                                      stage == stages - 1 ? 0 : stages - stage);
    pipelineOrder = session::PipelineRun::trainingOrder(stages, stage, accumulation());
    pipelineAnchors.clear();
    for (const auto &id : dataFlow.anchors()) {
      auto owner = pipeline->stages().producerStage.find(id);
      if (owner != pipeline->stages().producerStage.end() && owner->second != stage) continue;
      if (!g->hasTensor(id)) continue;
      const ir::Op *producer = g->tensor(id).producer();
      pipelineAnchors.emplace_back(id, !producer || producer->phase == ir::kPipelineForwardPhase);
    }
  }
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
  skippedSteps.clear();
  histogramBelow = histogramUpper = periodSteps = 0;
  rngCounter = 0;
  lossScale = dynamicScaling() ? options.automaticLossScalingSettings.initialScale : optimizer->lossScaling().val();
}

void TrainingSession::Impl::writeHostScalars() {
  // A pipeline stage holds the loss scale only where the loss is, and the gradient scale only if
  // it has weights to update.
  if (graph->hasTensor(lossScaleId)) *variable(lossScaleId).as<float>() = lossScale;
  if (graph->hasTensor(applied.gradScale))
    *variable(applied.gradScale).as<float>() = 1.0f / (lossScale * static_cast<float>(accumulationDivisor()));
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
  using Method = AutomaticLossScalingSettings::Method;
  if (als.enabled && als.method != Method::GradScaler && als.method != Method::Histogram)
    throw error("automaticLossScalingSettings: unknown method ", static_cast<int>(als.method),
                " (GradScaler or Histogram)");
  if (als.enabled && als.method == Method::GradScaler &&
      !(als.initialScale > 0.0f && als.growthFactor >= 1.0f && als.backoffFactor > 0.0f && als.backoffFactor <= 1.0f &&
        als.growthInterval > 0))
    throw error("automaticLossScalingSettings: need initialScale > 0, growthFactor >= 1, 0 < backoffFactor <= 1 "
                "and growthInterval > 0");
  if (als.enabled && als.method == Method::Histogram) {
    if (!(als.initialScale >= kMinHistogramLossScale && als.initialScale <= kMaxHistogramLossScale))
      throw error("automaticLossScalingSettings: the histogram method needs initialScale in [2^-24, 2^24], got ",
                  als.initialScale);
    if (!(als.binEdgeLocation > 0.0f && als.binEdgeLocation <= 1.0f))
      throw error("automaticLossScalingSettings: binEdgeLocation is a proportion of the largest representable value "
                  "and must be in (0, 1], got ",
                  als.binEdgeLocation);
    if (!(als.thresholdUpperCountProportion >= 0.0f && als.thresholdUpperCountProportion <= 1.0f))
      throw error("automaticLossScalingSettings: thresholdUpperCountProportion must be in [0, 1], got ",
                  als.thresholdUpperCountProportion);
    if (als.updatePeriod < 1)
      throw error("automaticLossScalingSettings: updatePeriod must be at least 1 step, got ", als.updatePeriod);
  }
  if (als.enabled && m.optimizer->lossScaling().val() != 1.0f)
    throw error("dynamic loss scaling replaces the optimiser's static lossScaling; set one or the other");
  session::checkPassOptions("training", session::trainingPipeline(), options);
  setThreadCount(options.numThreads);
  m.kernelContext = session::kernelContext(options);
  if (options.enablePipelining) {
    if (!options.enableGradientAccumulation)
      throw error("pipelined training needs gradient accumulation (SessionOptions.enableGradientAccumulation and "
                  "accumulationFactor): its micro-batches are what flows through the stages");
    if (als.enabled)
      throw error("pipelined training does not take dynamic loss scaling yet (automaticLossScalingSettings): "
                  "use a static lossScaling");
    if (!m.optimizer->clipNormSettings().empty())
      throw error("pipelined training does not take gradient clipping yet: its norm spans every stage's weights");
    m.pipelineGroups = session::pipelineGroups(options);
    m.kernelContext.communicator = m.pipelineGroups->replicas;
  } else {
    if (options.virtualGraphMode != VirtualGraphMode::Off || !options.pipelineSplit.empty())
      logging::logger().warn("virtualGraphMode and pipelineSplit take effect with enablePipelining only");
    m.kernelContext.communicator = session::replicationCommunicator(options);
  }
  session::precisionPolicy(options, true); // a bad mode is an error now, not at prepareDevice
  m.declared = m.import();
  m.inputIds = m.declared->inputs();
  for (const auto &[id, info] : inputShapes.getAll())
    if (std::find(m.inputIds.begin(), m.inputIds.end(), id) == m.inputIds.end())
      throw error("InputShapeInfo names '", id, "', which is not an input of the model");
  for (const auto &a : dataFlow.anchors())
    if (!m.declared->hasTensor(a) && a != loss)
      throw error("anchor '", a, "' is not a tensor of model '", m.model.sourceName, "'");
  if (options.replicatedBatchNormStatistics != ReplicatedStatistics::Local &&
      options.replicatedBatchNormStatistics != ReplicatedStatistics::Mean)
    throw error("SessionOptions.replicatedBatchNormStatistics must be Local or Mean, got ",
                static_cast<int>(options.replicatedBatchNormStatistics));
  // Every check above throws alike on every rank given the same arguments; this one finds the
  // ranks that were given others, before they part ways in the collectives of training.
  comm::Communicator *job = m.pipelineGroups ? m.pipelineGroups->world.get() : m.kernelContext.communicator.get();
  if (job) {
    const auto start = std::chrono::steady_clock::now();
    checkReplicasAgree(*job, agreementGroups(m.model, *m.declared, options, *m.optimizer, inputShapes, loss));
    logging::logger().debug(
        "the {} processes agree on the model ({} bytes) and options: checked in {:.1f} ms", job->size(),
        m.model.bytes.size(),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return s;
}

void TrainingSession::Impl::agreeOnTunedWays() {
  comm::Communicator *communicator = kernelContext.communicator.get();
  if (!communicator || communicator->size() == 1 || kernelContext.matmulOperands != backend_cpu::MatMulOperands::Auto)
    return;
  // Rank 0's record, one "key=way" line each (keys never hold a newline), broadcast length first.
  std::string ways;
  if (communicator->rank() == 0)
    for (const auto &[key, way] : plan->tunedMatMulWays())
      ways += key + '=' + backend_cpu::matMulOperandsName(way) + '\n';
  auto length = static_cast<int64_t>(ways.size());
  communicator->broadcast(&length, 1, DataType::INT64, 0);
  ways.resize(static_cast<size_t>(length));
  communicator->broadcast(ways.data(), length, DataType::UINT8, 0);
  std::map<std::string, backend_cpu::MatMulOperands> chosen;
  for (size_t begin = 0, end = 0; begin < ways.size(); begin = end + 1) {
    end = ways.find('\n', begin);
    const size_t eq = ways.rfind('=', end);
    chosen[ways.substr(begin, eq - begin)] = backend_cpu::matMulOperandsNamed(ways.substr(eq + 1, end - eq - 1));
  }
  if (chosen == plan->tunedMatMulWays()) return;
  logging::logger().info("replica {}: recompiling with rank 0's timed MatMul ways", communicator->rank());
  kernelContext.matmulTuning->preset(chosen);
  plan.reset();
  runningStats.clear(); // compile() finds them again
  compile();
}

void TrainingSession::prepareDevice() {
  Impl &m = *impl_;
  if (m.plan) return;
  m.compile();
  m.agreeOnTunedWays();
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
    session::checkInputArray(id, it->second, m.streams.hostInfo(id, m.plan->info(id)), prefix);
  }
  for (const auto &[id, arr] : stepio.outputs()) {
    if (!m.dataFlow.isAnchored(id)) throw error("StepIO output '", id, "' is not an anchor of the DataFlow");
    if (m.pipeline && !m.graph->hasTensor(id)) continue; // another stage's, which sends it (shareAnchors)
    const TensorInfo info = m.streams.hostInfo(id, m.plan->info(id));
    Shape expected = session::anchorShape(m.dataFlow.art(id), info, prefix, micro);
    if (arr.dataType() != info.dataType() || arr.shape() != expected)
      throw error("output buffer for anchor '", id, "' is ", toString(arr.dataType()), " ", toString(arr.shape()),
                  ", expected ", toString(info.dataType()), " ", toString(expected));
  }
  try {
    m.runSteps(stepio, bps, accum, getReplicationIndex());
  } catch (const error &) {
    // The step that failed: the next to be counted (a fault in PostUpdate comes after ++step).
    session::throwIfNumericFault(*m.plan, m.currentStep);
    throw;
  }
}

void TrainingSession::Impl::runSteps(StepIO &stepio, int bps, int accum, int replica) {
  Impl &m = *this;
  const int micro = bps * accum;
  if (m.pipeline) {
    m.runPipelined(stepio, bps, accum);
    return;
  }
  auto [p0b, p0e] = m.plan->phaseSteps(optimizer::MicroBatch);
  auto [p1b, p1e] = m.plan->phaseSteps(optimizer::PreUpdate);
  auto [p2b, p2e] = m.plan->phaseSteps(optimizer::Update);
  auto [p3b, p3e] = m.plan->phaseSteps(optimizer::PostUpdate);
  int64_t *rng = m.variable(m.rngStateId).as<int64_t>();
  const auto seed = static_cast<int64_t>(session::replicaSeed(m.seed, replica));
  for (int b = 0; b < bps; ++b) {
    m.currentStep = m.step + m.skipped + 1;
    m.writeHostScalars();
    for (int a = 0; a < accum; ++a) {
      int k = b * accum + a;
      for (const auto &id : m.inputIds) {
        IArray &arr = stepio.inputs().at(id);
        const TensorInfo &device = m.plan->info(id);
        int64_t bytes = m.streams.hostInfo(id, device).byteCount();
        if (bytes > 0)
          m.streams.copyIn(id, device, static_cast<uint8_t *>(arr.data()) + k * bytes, m.plan->address(id));
      }
      rng[0] = seed;
      rng[1] = m.rngCounter++;
      m.plan->run(p0b, p0e);
      for (const auto &[id, arr] : stepio.outputs())
        session::writeAnchor(m.dataFlow.art(id), m.streams.hostInfo(id, m.plan->info(id)), m.plan->info(id).dataType(),
                             m.plan->address(id), arr, k, micro);
    }
    m.plan->run(p1b, p1e);
    bool finite = true;
    if (!m.applied.allFinite.empty()) finite = *static_cast<const bool *>(m.plan->address(m.applied.allFinite));
    if (finite) {
      m.plan->run(p2b, p2e);
      ++m.step;
    } else {
      ++m.skipped;
      if (m.skippedSteps.size() < kSkippedStepsKept) m.skippedSteps.push_back(m.currentStep);
    }
    m.plan->run(p3b, p3e);
    m.updateLossScale(finite);
  }
}

void TrainingSession::Impl::runPipelined(StepIO &stepio, int bps, int accum) {
  const auto [fb, fe] = plan->phaseSteps(ir::kPipelineForwardPhase);
  const auto [bb, be] = plan->phaseSteps(optimizer::MicroBatch);
  const auto [p1b, p1e] = plan->phaseSteps(optimizer::PreUpdate);
  const auto [p2b, p2e] = plan->phaseSteps(optimizer::Update);
  const auto [p3b, p3e] = plan->phaseSteps(optimizer::PostUpdate);
  const session::PipelineGroups &groups = pipeline->groups();
  int64_t *rng = graph->hasTensor(rngStateId) ? variable(rngStateId).as<int64_t>() : nullptr;
  const auto seedOfReplica = static_cast<int64_t>(session::replicaSeed(seed, groups.replica));
  const int micro = bps * accum;
  auto writeAnchors = [&](bool forward, int k) {
    for (const auto &[id, byForward] : pipelineAnchors) {
      auto out = stepio.outputs().find(id);
      if (byForward != forward || out == stepio.outputs().end()) continue;
      session::writeAnchor(dataFlow.art(id), streams.hostInfo(id, plan->info(id)), plan->info(id).dataType(),
                           plan->address(id), out->second, k, micro);
    }
  };
  for (int b = 0; b < bps; ++b) {
    const auto start = std::chrono::steady_clock::now();
    currentStep = step + skipped + 1;
    writeHostScalars();
    const int64_t counter = rngCounter;
    rngCounter += accum;
    for (const auto &[forward, i] : pipelineOrder) {
      const int k = b * accum + i;
      if (forward) {
        for (const auto &id : inputIds) {
          IArray &arr = stepio.inputs().at(id);
          const TensorInfo &device = plan->info(id);
          int64_t bytes = streams.hostInfo(id, device).byteCount();
          if (bytes > 0) streams.copyIn(id, device, static_cast<uint8_t *>(arr.data()) + k * bytes, plan->address(id));
        }
        pipeline->receive(true);
      } else {
        pipeline->restore(i);
        pipeline->receive(false);
      }
      if (rng) {
        rng[0] = seedOfReplica;
        rng[1] = counter + i;
      }
      if (forward)
        plan->run(fb, fe);
      else
        plan->run(bb, be);
      writeAnchors(forward, k);
      if (forward) pipeline->stash(i);
      pipeline->send(forward);
    }
    plan->run(p1b, p1e);
    plan->run(p2b, p2e);
    ++step;
    plan->run(p3b, p3e);
    if (plan->profiling()) {
      pipelineWallNs +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      ++pipelineSteps;
    }
  }
  pipeline->finishSends();
  pipeline->shareAnchors(stepio.outputs());
}

void TrainingSession::Impl::updateLossScale(bool finite) {
  if (!dynamicScaling()) return;
  const auto &als = options.automaticLossScalingSettings;
  if (!histogramScaling()) {
    if (!finite) {
      lossScale *= als.backoffFactor;
      goodSteps = 0;
      logging::logger().info("non-finite gradients: update skipped, loss scale now {}", lossScale);
    } else if (++goodSteps >= als.growthInterval) {
      lossScale *= als.growthFactor;
      goodSteps = 0;
    }
    return;
  }
  // Histogram (PopART's rule). Halving and doubling a float within [2^-24, 2^24] is exact.
  auto clamped = [](float s) { return std::clamp(s, kMinHistogramLossScale, kMaxHistogramLossScale); };
  if (!finite) {
    // The skipped step's counts, and those of the period so far, were taken at a scale that no
    // longer holds: the period starts again at the halved scale.
    lossScale = clamped(lossScale * 0.5f);
    histogramBelow = histogramUpper = periodSteps = 0;
    logging::logger().info("non-finite gradients: update skipped, loss scale now {}", lossScale);
    return;
  }
  if (!applied.gradientStatistics.empty()) { // a model without trained weights has none
    const auto *counts = static_cast<const int64_t *>(plan->address(applied.gradientStatistics));
    histogramBelow += counts[0];
    histogramUpper += counts[1];
  }
  if (++periodSteps < als.updatePeriod) return;
  const int64_t total = histogramBelow + histogramUpper;
  const double upperProportion = total > 0 ? static_cast<double>(histogramUpper) / static_cast<double>(total) : 0.0;
  const float before = lossScale;
  lossScale = clamped(upperProportion > static_cast<double>(als.thresholdUpperCountProportion) ? lossScale * 0.5f
                                                                                               : lossScale * 2.0f);
  logging::logger().debug("loss scale {} -> {}: {} of {} gradient elements at or above the bin edge", before, lossScale,
                          histogramUpper, total);
  histogramBelow = histogramUpper = periodSteps = 0;
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
  if (const auto &p = impl_->pipeline; p && !impl_->graph->hasTensor(id)) {
    // Another stage's anchor, which this process receives after each step (shareAnchors).
    auto it = p->stages().producedInfo.find(id);
    if (it != p->stages().producedInfo.end()) return impl_->streams.hostInfo(id, it->second);
  }
  return impl_->streams.hostInfo(id, impl_->plan->info(id));
}
int64_t TrainingSession::getStepCount() const { return impl_->step; }
float TrainingSession::getLossScale() const { return impl_->lossScale; }
int TrainingSession::getReplicationIndex() const {
  if (impl_->pipelineGroups) return impl_->pipelineGroups->replica;
  const auto &communicator = impl_->kernelContext.communicator;
  return communicator ? communicator->rank() : 0;
}
int64_t TrainingSession::getSkippedSteps() const { return impl_->skipped; }
std::vector<int64_t> TrainingSession::getSkippedStepNumbers() const { return impl_->skippedSteps; }
int TrainingSession::getPipelineStage() const { return impl_->pipelineGroups ? impl_->pipelineGroups->stage : 0; }
std::string TrainingSession::dumpIr() const { return (impl_->graph ? impl_->graph : impl_->declared)->dump(); }
int64_t TrainingSession::plannedArenaBytes() const { return impl_->plan ? impl_->plan->memoryPlan().arenaBytes : 0; }

std::string TrainingSession::explainKernels() const {
  if (!impl_->plan) throw error("explainKernels: call prepareDevice() first");
  return session::kernelReport(*impl_->plan);
}

void TrainingSession::enableProfiling() {
  prepareDevice();
  impl_->plan->enableProfiling();
  if (impl_->pipeline) impl_->pipeline->countTimes();
}

void TrainingSession::writeProfileTrace(const std::string &path) const {
  if (!impl_->plan) throw error("writeProfileTrace: the session has not run");
  session::writeChromeTrace(*impl_->plan, path);
}

session::MemoryParts TrainingSession::Impl::memoryParts(const ir::Graph &g,
                                                        const backend_cpu::PlannedMemory &planned) const {
  auto bytesOf = [&](const std::vector<TensorId> &ids) {
    int64_t n = 0;
    for (const auto &id : ids)
      n += g.tensor(id).data()->byteCount();
    return n;
  };
  int64_t weights = bytesOf(weightIds), stats = bytesOf(runningStats), state = bytesOf(stateIds);
  int64_t accumulators = 0, shards = 0;
  for (const auto &u : applied.updates) {
    if (!u.accumulator.empty()) accumulators += g.tensor(u.accumulator).data()->byteCount();
    if (!u.shard.empty()) shards += g.tensor(u.shard).data()->byteCount();
  }
  int64_t other = planned.variableBytes - weights - stats - state - accumulators - shards;
  session::MemoryParts memory{{session::arenaPartName(planned), planned.arenaBytes},
                              {"kernels", planned.kernelBytes},
                              {"weights", weights},
                              {shards ? "optimiser state (this replica's shards)" : "optimiser state", state},
                              {"gradient accumulators", accumulators},
                              {"running statistics", stats},
                              {"constants and hyperparameters", planned.constBytes + other}};
  // Sharded optimiser state: the replica's fp32 copies of its weight shards, which it updates.
  if (shards) memory.insert(memory.begin() + 4, {"weight shards", shards});
  return memory;
}

std::string TrainingSession::profileSummary() const {
  const Impl &m = *impl_;
  if (!m.plan) throw error("profileSummary: the session has not run");
  const auto &p = *m.plan;
  return session::profileSummary(p, m.memoryParts(*m.graph, session::plannedMemory(p))) + m.pipelineSummary() +
         session::passTimes(m.passRecords);
}

std::string TrainingSession::Impl::pipelineSummary() const {
  if (!pipeline) return "";
  // Every stage's figures, gathered: {op ns, receiving ns, copying ns, wall ns, steps}.
  int64_t opNs = 0;
  for (const auto &[ns, runs] : plan->stepTimes())
    opNs += ns;
  const std::vector<int64_t> mine{opNs, pipeline->times().receiving, pipeline->times().copying, pipelineWallNs,
                                  pipelineSteps};
  const session::PipelineGroups &groups = pipeline->groups();
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(groups.stageCount));
  groups.stages->allGather(mine.data(), all.data(), static_cast<int64_t>(mine.size()), DataType::INT64);
  const int stages = groups.stageCount, micro = accumulation();
  std::ostringstream os;
  os << std::fixed << std::setprecision(2);
  os << "pipeline: " << stages << " stages, " << micro << " micro-batches per step; the one-forward-one-backward "
     << "schedule leaves each stage idle for " << stages - 1 << " of " << micro + stages - 1
     << " micro-batch slots (bubble " << 100.0 * (stages - 1) / (micro + stages - 1) << "%)\n";
  for (int k = 0; k < stages; ++k) {
    const int64_t *f = all.data() + static_cast<size_t>(k) * mine.size();
    const double steps = std::max<int64_t>(f[4], 1), ms = 1e-6 / steps;
    os << "  stage " << k << ": step " << f[3] * ms << " ms, ops " << f[0] * ms << " ms (busy "
       << (f[3] > 0 ? 100.0 * double(f[0]) / double(f[3]) : 0.0) << "%), waiting for tensors " << f[1] * ms
       << " ms, copying activations and messages " << f[2] * ms << " ms\n";
  }
  return os.str();
}

} // namespace popart
