#pragma once
// popart-run --train: trains a model on datasets given as .npy files.

#include "cli/replication.hpp"
#include "core/tensordata.hpp"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace popart::cli {

struct TrainOptions {
  bool train = false;
  std::string loss;
  std::string optimizer = "sgd";
  double lr = -1; ///< < 0: the optimiser's default
  double momentum = 0, dampening = 0, weightDecay = 0;
  bool nesterov = false, centered = false;
  double beta1 = 0.9, beta2 = 0.999, eps = -1, alpha = 0.99, maxWeightNorm = 0, lrDecay = 0, initialAccumulator = 0;
  std::string lrSchedule = "constant";
  int64_t warmupSteps = 0, lrStepSize = 0;
  double lrGamma = 0.1, lrMin = 0;
  std::string lossScaling; ///< "" (none), a static scale, "dynamic" or "histogram"
  /// --loss-scaling histogram: AutomaticLossScalingSettings' binEdgeLocation,
  /// thresholdUpperCountProportion and updatePeriod.
  double alsBinEdge = 0.5, alsThreshold = 1e-7;
  int alsUpdatePeriod = 1;
  double clipNorm = 0;
  int accumulate = 1;
  std::string replicaBnStats = "local"; ///< SessionOptions::replicatedBatchNormStatistics
  /// SessionOptions::replicationBucketBytes under mpirun; -1 keeps the session's default.
  int64_t bucketBytes = -1;
  /// SessionOptions::autoRecomputation: none, standard, normonly, all or pipeline.
  std::string recompute = "none";
  /// Replicated: each replica keeps and updates 1/N of the optimiser state (SessionOptions::
  /// optimizerStateTensorLocationSettings' replicatedTensorSharding On).
  bool shardOptimizerState = false;
  /// With shardOptimizerState: minElementsForReplicatedTensorSharding; -1 keeps the session's default.
  int64_t shardMinElements = -1;
  int64_t steps = 0;
  double epochs = 0;
  bool shuffle = false;
  std::string save, checkpoint, resume;
  std::string savePrecision = "training"; ///< TrainingSession::modelToHost's precision
  int64_t checkpointEvery = 0;
  std::vector<std::string> freeze; ///< initializer names or regular expressions not to train
  /// Copied from the common options of popart-run.
  std::vector<std::string> inputs;
  uint64_t seed = 0;
  int threads = 0;
  int64_t batch = 0;
  std::string kernels = "any";
  std::string precision = "fp32"; ///< SessionOptions::precision
  bool fuseOps = true;
  std::vector<std::string> disabledPasses, dumpIrAfter; ///< pass names (--disable-pass, --dump-ir-after)
  bool verifyIr = false;
  std::string matmulTuning = "auto"; ///< SessionOptions::matmulTuning
  int64_t convPoolChunk = 0;         ///< SessionOptions::convPoolChunk
  int64_t memoryLimit = 0;           ///< SessionOptions::memoryLimitBytes (0: the available RAM)
  std::string profile;               ///< Chrome trace path ("" = no profiling)
  bool dumpIr = false;               ///< print the compiled training graph (forward, backward and updates)
  bool explainKernels = false;       ///< print the kernel of each op and why
  bool checkNumerics = false;        ///< SessionOptions::enableFloatingPointChecks
  /// This process's replica of a data-parallel run (not replicated by default).
  Replication replication;
  /// Pipelined training over this many processes (mpirun -np K), one stage each; 0: not pipelined.
  int pipelineStages = 0;
  /// Tensors after which a stage starts (pipelineStages - 1 of them); empty: balanced stages, or
  /// the model's annotations with pipelineCut "annotations".
  std::vector<std::string> pipelineSplit;
  std::string pipelineCut = "auto"; ///< auto | annotations
};

/// \p message with the C++ option names of the API (SessionOptions::batchSize...) replaced by
/// the popart-run flags that set them.
std::string cliWording(std::string message);

/// Adds the training flags to \p app.
void addTrainOptions(CLI::App &app, TrainOptions &options);
/// Flags of \p app given that only make sense with --train; empty if none.
std::string trainOnlyFlagGiven(const CLI::App &app);
/// Throws naming flags that make no sense together.
void checkTrainFlags(const CLI::App &app, const TrainOptions &options);
/// Trains \p model; returns the exit status.
int runTraining(const std::string &model, const TrainOptions &options);

/// Reads an input file: .npy, or a serialized TensorProto .pb. numpy has no bfloat16, so a
/// UINT16 array (bit patterns) or a .pb stands for BFLOAT16 data where \p wanted is BFLOAT16
/// (docs/precision.md); ONNX 1.12's own test data stores bfloat16 as UINT16 too.
TensorData loadTensorFile(const std::string &path, DataType wanted = DataType::UNDEFINED);

} // namespace popart::cli
