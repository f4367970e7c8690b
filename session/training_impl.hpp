#pragma once
// TrainingSession's state (its pimpl), shared by the files that implement the session: the
// session itself (training_session.cpp), weight I/O (training_weights.cpp) and checkpoints
// (training_checkpoint.cpp).

#include "autodiff/weights.hpp"
#include "backend_cpu/kernel_context.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/passes/pass_manager.hpp"
#include "onnx_import/onnx_import.hpp"
#include "optimizer/apply.hpp"
#include "session/pipeline_run.hpp"
#include "session/session_common.hpp"
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <nlohmann/json_fwd.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace popart {

namespace session {
/// Where one sharded optimiser state Variable (this replica's shard) sits in the whole state,
/// which has its weight's shape: what checkpoints gather and cut.
struct StateShard {
  optimizer::ShardLayout layout;
  Shape wholeShape;
};
} // namespace session

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
  /// With enablePipelining: the job's process groups, and this stage's side of a step (made with
  /// the plan, whose buffers it reads and writes).
  std::optional<session::PipelineGroups> pipelineGroups;
  std::unique_ptr<session::PipelineRun> pipeline;
  /// Pipelined: this stage's one-forward-one-backward order over a step's micro-batches, and the
  /// anchors it writes, each with whether the forward writes it (else the backward); made once.
  std::vector<std::pair<bool, int>> pipelineOrder;
  std::vector<std::pair<TensorId, bool>> pipelineAnchors;
  /// Pipelined and profiling: wall time of the steps run since profiling started, and their count.
  int64_t pipelineWallNs = 0, pipelineSteps = 0;
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
  std::vector<ir::PassRecord> passRecords; ///< what each pass of the last compile did, and its time
  session::Streams streams;                ///< inputs and anchors the device keeps in 16 bits

  int64_t step = 0, skipped = 0, goodSteps = 0;
  /// Skipped steps' numbers (1-based, counting every step run), the first kSkippedStepsKept.
  std::vector<int64_t> skippedSteps;
  static constexpr size_t kSkippedStepsKept = 64;
  int64_t currentStep = 0; ///< the step being run (1-based, skipped ones counted), for error messages
  float lossScale = 1.0f;
  /// The histogram method's counts of gradient elements below and at or above the bin edge,
  /// summed over the steps of the current update period so far (periodSteps of them).
  int64_t histogramBelow = 0, histogramUpper = 0, periodSteps = 0;
  uint64_t seed = 0;
  int64_t rngCounter = 0;

  int accumulation() const { return options.enableGradientAccumulation ? options.accumulationFactor : 1; }
  /// The divisor of the accumulated gradient: the accumulation factor for a Mean reduction, 1
  /// for Sum (the replicas' part of a Mean is done by the all-reduce itself).
  int accumulationDivisor() const {
    return options.accumulationAndReplicationReductionType == ReductionType::Sum ? 1 : accumulation();
  }
  bool dynamicScaling() const { return options.automaticLossScalingSettings.enabled; }
  bool histogramScaling() const {
    return dynamicScaling() &&
           options.automaticLossScalingSettings.method == AutomaticLossScalingSettings::Method::Histogram;
  }
  /// Moves the dynamic loss scale after a step: \p finite says whether its gradients were.
  void updateLossScale(bool finite);

  /// Variables whose values persist across steps and go into checkpoints.
  std::vector<TensorId> persistentIds() const {
    std::vector<TensorId> ids = weightIds;
    ids.insert(ids.end(), runningStats.begin(), runningStats.end());
    ids.insert(ids.end(), stateIds.begin(), stateIds.end());
    return ids;
  }

  TensorData &variable(const TensorId &id) const { return *graph->tensor(id).data(); }

  /// The parts of the memory report and of the memory limit's check, for \p g compiled to
  /// \p planned (the variables split into weights, optimiser state, accumulators...).
  session::MemoryParts memoryParts(const ir::Graph &g, const backend_cpu::PlannedMemory &planned) const;

  /// The optimiser state Variables that hold this replica's shard, by id (none unless the
  /// session shards its optimiser state; training_checkpoint.cpp).
  std::map<TensorId, session::StateShard> shardedState() const;

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
  /// inferred if \p inferShapes (the training pipeline's first pass does it otherwise).
  std::unique_ptr<ir::Graph> shapedImport(autodiff::Constants *constants = nullptr, bool inferShapes = true) const;
  /// Sets lossId, if not given, to \p g's only scalar output.
  void findLoss(const ir::Graph &g);
  void compile();
  /// run() of a pipelined session: \p accum micro-batches of each of \p bps batches flow through
  /// the stages in one-forward-one-backward order.
  void runPipelined(StepIO &stepio, int bps, int accum);
  /// run() after its StepIO checks: \p bps steps of \p accum micro-batches each, as replica
  /// \p replica (its random seed).
  void runSteps(StepIO &stepio, int bps, int accum, int replica);
  /// Pipelined: every stage's busy and waiting time per step, for profileSummary (a collective
  /// over the stages); "" otherwise.
  std::string pipelineSummary() const;
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
  /// Replicated sessions: every rank takes rank 0's timed MatMul ways (recompiling if its own
  /// timing chose others), so that the replicas run the same kernels and a job's results do not
  /// depend on which rank timed what on a noisy host.
  void agreeOnTunedWays();
};

} // namespace popart
