#pragma once
/// \file Options of a session.

#include <popart/builder.hpp> // ReductionType
#include <popart/tensorinfo.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace popart {

namespace comm {
class Communicator; // comm/communicator.hpp: kept out of this header, which every user includes
} // namespace comm

/// Dynamic loss scaling (docs/precision.md, "Loss scaling"), in one of two methods. GradScaler
/// (torch.cuda.amp.GradScaler): the scale starts at initialScale, is multiplied by growthFactor
/// after growthInterval steps with finite gradients, and by backoffFactor on a step with an
/// inf/NaN gradient, whose update is skipped. Histogram (PopART's automatic loss scaling): each
/// step counts the weight gradients' elements with |g| at or above a bin edge; every
/// updatePeriod steps the scale halves if those counts exceed thresholdUpperCountProportion of
/// all counted elements, and doubles otherwise. Both skip a step with an inf/NaN gradient.
struct AutomaticLossScalingSettings {
  /// How the scale moves.
  enum class Method {
    GradScaler, ///< growthFactor, backoffFactor and growthInterval
    Histogram   ///< binEdgeLocation, thresholdUpperCountProportion and updatePeriod
  };
  /// Turns dynamic loss scaling on (it replaces the optimiser's static lossScaling).
  bool enabled = false;
  /// The method; GradScaler by default.
  Method method = Method::GradScaler;
  /// The scale of the first step (both methods).
  float initialScale = 65536.0f;
  /// GradScaler: factor after growthInterval finite steps.
  float growthFactor = 2.0f;
  /// GradScaler: factor on a step with non-finite gradients.
  float backoffFactor = 0.5f;
  /// GradScaler: finite steps between growths.
  int growthInterval = 2000;
  /// Histogram: the bin edge as a proportion of the largest finite value of fp16 (65504) in the
  /// fp16 modes and for FLOAT16 gradients, else of the gradients' type; in (0, 1].
  float binEdgeLocation = 0.5f;
  /// Histogram: the proportion of gradient elements at or above the edge (NaN and inf included)
  /// above which the scale halves; in [0, 1].
  float thresholdUpperCountProportion = 1e-7f;
  /// Histogram: steps whose counts are summed before the scale changes; at least 1.
  int updatePeriod = 1;
};

/// How BatchNormalization's running statistics combine over replicas (docs/distributed.md).
enum class ReplicatedStatistics {
  Local, ///< each replica keeps the running statistics of its own micro-batches (the default)
  Mean   ///< after each update the replicas' running statistics are averaged: all ranks hold the same
};

/// Automatic recomputation (PopART's RecomputationType; docs/training.md, "Recomputation"):
/// which forward activations the backward pass recomputes instead of reading them kept from the
/// forward pass. Ops annotated Recompute or Checkpoint (Builder::recomputeOutputInBackwardPass)
/// are recomputed or kept whatever the mode.
enum class RecomputationType {
  None,         ///< only the ops annotated Recompute
  Standard,     ///< checkpoints spaced along the forward schedule (about sqrt(2N) of N ops); the rest recomputed
  NormOnly,     ///< the normalisation ops (BatchNorm, LayerNorm, GroupNorm, InstanceNorm)
  RecomputeAll, ///< every forward op: only graph inputs and weights are kept
  Pipeline      ///< checkpoints are the tensors crossing __pipeline_stage boundaries and the graph inputs
};

/// Options that change how a session compiles and runs; the defaults suit most models.
/// Whether a tensor class is sharded over the replicas (PopART's ReplicatedTensorSharding).
enum class ReplicatedTensorSharding { Off, On };

/// Where a class of tensors lives (PopART's TensorLocation): on this backend only its
/// replicated tensor sharding is read; every tensor is in host memory.
struct TensorLocation {
  ReplicatedTensorSharding replicatedTensorSharding = ReplicatedTensorSharding::Off;
};

/// The location of a class of tensors and from what size it applies (PopART's
/// TensorLocationSettings).
struct TensorLocationSettings {
  TensorLocation location;
  /// Weights with fewer elements keep their whole state on every replica (PopART's default).
  int64_t minElementsForReplicatedTensorSharding = 8192;
};

/// How ops are placed on virtual graphs (PopART's VirtualGraphMode); with enablePipelining, each
/// virtual graph is a pipeline stage run by its own process (docs/distributed.md, "Pipelining").
enum class VirtualGraphMode {
  Off,    ///< one graph (the default)
  Manual, ///< the model's annotations: __pipeline_stage, else __ipu_number (Builder::pipelineStage)
  Auto    ///< the session cuts the forward schedule: at SessionOptions::pipelineSplit, else into
          ///< balanced stages by the ops' FLOP and memory estimates
};

struct SessionOptions {
  /// Threads for oneDNN and the reference kernels; 0 uses every core.
  int numThreads = 0;
  /// Sets every unknown (symbolic) leading dimension of the graph inputs; 0 leaves them to
  /// be taken from the first fed tensors.
  int64_t batchSize = 0;
  /// Fold ops whose inputs are all constant at compile time.
  bool constantFolding = true;
  /// "any" (oneDNN where it applies, else reference), "reference" or "dnnl".
  std::string kernels = "any";
  /// Rewrite op patterns into fused kernels at compile time (docs/architecture.md lists them: the
  /// LayerNorm and GELU decompositions of older opsets, Transposes and biases into MatMul, Relu
  /// into Conv, BatchNormalization and MaxPoolGrad, MaxPool into Conv). false keeps the graph op
  /// by op, for debugging and for measuring what the fusions give: it disables every optional
  /// pass of the pipelines (popart-run --passes lists them) and merged optimiser updates.
  bool fuseOps = true;
  /// Optional passes not to run, by name (popart-run --passes lists the pipelines; an unknown or
  /// required pass is an error when the session is created).
  std::vector<std::string> disabledPasses;
  /// Passes after which the IR is printed on standard output, by name.
  std::vector<std::string> dumpIrAfter;
  /// Verify the IR after every pass (always on in debug builds; tests turn it on).
  bool verifyIr = false;
  /// After each op of a run, check its floating-point outputs for NaN and inf and stop at the
  /// first one with an error naming the op, the tensor, the step and the element
  /// (docs/training.md, "Numeric checks"). Off: nothing is checked and nothing costs. Under
  /// dynamic loss scaling, the tensors computed from the scaled loss before the weight update
  /// (gradients, their norms and statistics) are not checked: the session's finite check skips
  /// such steps (TrainingSession::getSkippedSteps).
  bool enableFloatingPointChecks = false;
  /// Run the ONNX checker on the imported model.
  bool checkModel = true;
  /// Training unrolls the If, Loop and Scan ops the loss depends on (docs/training.md, "Control
  /// flow"); this bounds the ops the unrolled copies add in all. A loop past it is not unrolled,
  /// and training stops with an error naming it if the loss needs a gradient through it.
  int64_t maxUnrolledOps = 65536;
  /// Training: run accumulationFactor micro-batches per weight update and update with the mean
  /// of their gradients. A factor above 1 needs enableGradientAccumulation.
  bool enableGradientAccumulation = false;
  int accumulationFactor = 1;
  /// Training: dynamic loss scaling (overrides the optimiser's static lossScaling).
  AutomaticLossScalingSettings automaticLossScalingSettings;
  /// Training: BatchNormalization updates its running variance with the unbiased batch variance,
  /// as PyTorch does (false: the population variance of the ONNX specification).
  bool batchNormUnbiasedRunningVariance = true;
  /// Training: floating-point initializers to keep as they are (PyTorch's requires_grad=False),
  /// each entry an initializer name or an ECMAScript regular expression matching whole names.
  /// An entry that matches no floating-point initializer is an error.
  std::vector<std::string> frozenWeights;

  /// How the oneDNN MatMul and Gemm kernels run products of 1e8 FLOPs or more: "auto" (or "1")
  /// times the ways that apply (operand layouts, a 1×1 convolution...) once per configuration at
  /// compile time and keeps the fastest, which checkpoints record; "0" runs every product as
  /// stored; "a", "b", "s", "p", "t", "tc", "ap", "u" force one way (FlippedA, FlippedB, ShiftedB,
  /// Pointwise, Swapped, SwappedCopy, FlippedPointwise, Unpermuted; docs/architecture.md), for
  /// tests and A/B runs. Was the environment variable POPART_MATMUL_TUNING.
  std::string matmulTuning = "auto";
  /// Images per chunk of a oneDNN Conv with a fused MaxPool, which convolves and pools a chunk at
  /// a time so that the convolution's result stays in cache: 0 sizes chunks to about 512 KiB of
  /// result; N ≥ 1 forces N images (N ≥ the batch: all at once). Was POPART_CONVPOOL_CHUNK.
  int64_t convPoolChunk = 0;
  /// Seed of the random ops that have no seed of their own and no training seed input: a
  /// Dropout that an inference session runs with training_mode true and no seed attribute. -1
  /// (the default) draws one from the system for each such op, as the ONNX spec leaves it; any
  /// other value makes their masks the same in every session with that seed. (Training's random
  /// ops draw from the session's {seed, counter} state, which checkpoints save.)
  int64_t randomSeed = -1;
  /// Mixed precision with PopTorch's names (docs/precision.md): "fp32" (as the model is), "fp16.32"
  /// (fp16 weights, activations and gradients; fp32 partials, master weights and optimiser state),
  /// "fp16.16" (as fp16.32, but fp16 weights and first-order state, no master copy, and MatMul
  /// partial sums rounded to fp16; second moments stay fp32) or
  /// "bf16" (bfloat16 on oneDNN's bf16 kernels, fp32 master weights and state). Losses, batch
  /// statistics and large reductions stay fp32; graph inputs and outputs keep their types for
  /// the user (the session converts those the device keeps in 16 bits as it copies them).
  std::string precision = "fp32";
  /// Pipelined model parallelism (docs/distributed.md, "Pipelining"): the model's ops are cut
  /// into stages (virtualGraphMode), one process (MPI rank) per stage and replica, activations and
  /// their gradients sent between the stages' processes. Training needs gradient accumulation,
  /// whose micro-batches flow through the stages in a one-forward-one-backward schedule.
  bool enablePipelining = false;
  VirtualGraphMode virtualGraphMode = VirtualGraphMode::Off;
  /// With virtualGraphMode Auto: tensors (in forward order) after which a new stage starts; an
  /// op belongs to stage k if it depends on k of them. Empty: balanced stages.
  std::vector<std::string> pipelineSplit;
  /// Training: data-parallel replication (docs/distributed.md, "Replicated training"): this
  /// process is one of replicatedGraphCount replicas, each running the whole model on its own
  /// micro-batches, whose weight gradients are all-reduced before clipping and the optimiser.
  bool enableReplicatedGraphs = false;
  /// The number of replicas with enableReplicatedGraphs; it must equal the communicator's size.
  int replicatedGraphCount = 1;
  /// How gradients combine over the accumulated micro-batches and the replicas: Mean (the
  /// default; the update sees the mean gradient of all of them) or Sum.
  ReductionType accumulationAndReplicationReductionType = ReductionType::Mean;
  /// The replicas' communicator with enableReplicatedGraphs; null makes an MpiCommunicator over
  /// MPI_COMM_WORLD (initialising MPI if the caller has not). Every rank must create its session
  /// with the same model and options.
  std::shared_ptr<comm::Communicator> communicator;
  /// Training with enableReplicatedGraphs: Local (the default) keeps each replica's BatchNorm
  /// running mean and variance from its own micro-batches; Mean averages the updated running
  /// statistics over the replicas (an AllReduce after each update), so every rank holds the same.
  ReplicatedStatistics replicatedBatchNormStatistics = ReplicatedStatistics::Local;
  /// Training with enableReplicatedGraphs: location.replicatedTensorSharding = On shards the
  /// optimiser state over the replicas (docs/distributed.md, "Sharded optimiser state"): each
  /// replica keeps and updates 1/replicatedGraphCount of the state of every weight of at least
  /// minElementsForReplicatedTensorSharding elements, whose gradients are reduce-scattered and
  /// whose updated shards are all-gathered back into the whole weight every step.
  TensorLocationSettings optimizerStateTensorLocationSettings;
  /// Replication without accumulation: weight gradients are all-reduced in buckets of about this
  /// many bytes, each started as soon as the backward has produced its gradients and waited for
  /// just before the optimiser, so that communication overlaps the rest of the backward
  /// (docs/distributed.md, "Overlapping the all-reduce"). 0: one blocking all-reduce per gradient.
  int64_t replicationBucketBytes = int64_t{4} << 20;
  /// Training: which forward activations the backward pass recomputes (RecomputationType), on
  /// top of the ops annotated Recompute; results are the same bit for bit in every mode.
  RecomputationType autoRecomputation = RecomputationType::None;

  /// The most memory prepareDevice may plan for, in bytes: the activation arena, the kernels,
  /// weights, constants and optimiser state (profileSummary's "planned peak"). A plan above it is
  /// refused with an error giving its size and parts, before its arena is allocated (and a plan
  /// whose largest tensor alone is above it, before its kernels are made). 0 (the
  /// default): the RAM available when the plan is made (MemAvailable in /proc/meminfo, or what
  /// the cgroup's memory.max leaves if lower) plus what the session already holds.
  int64_t memoryLimitBytes = 0;
};

/// Shapes of graph inputs given explicitly at session creation (PopART's InputShapeInfo).
class InputShapeInfo {
public:
  void add(const TensorId &id, const TensorInfo &info) { infos_[id] = info; }
  bool has(const TensorId &id) const { return infos_.count(id) != 0; }
  const TensorInfo &get(const TensorId &id) const { return infos_.at(id); }
  const std::map<TensorId, TensorInfo> &getAll() const { return infos_; }

private:
  std::map<TensorId, TensorInfo> infos_;
};

} // namespace popart
