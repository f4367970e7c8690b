#pragma once
/// \file Sessions: compile a model once, then run it step by step.

#include <popart/dataflow.hpp>
#include <popart/optimizer.hpp>
#include <popart/sessionoptions.hpp>
#include <popart/stepio.hpp>

#include <memory>
#include <string>
#include <vector>

namespace popart {

/// Runs an ONNX model for inference.
/// Threads (docs/threads.md): distinct sessions may be created, compiled and run on distinct threads
/// at once; one session is not synchronised: its const calls may overlap, nothing else may.
class InferenceSession {
public:
  /// \p model is a path to an .onnx file or a serialized ModelProto.
  static std::unique_ptr<InferenceSession> createFromOnnxModel(const std::string &model, const DataFlow &dataFlow,
                                                               const SessionOptions &options = {});
  /// As above, with explicit shapes for inputs whose shapes the model leaves symbolic.
  static std::unique_ptr<InferenceSession> createFromOnnxModel(const std::string &model, const DataFlow &dataFlow,
                                                               const InputShapeInfo &inputShapes,
                                                               const SessionOptions &options = {});
  ~InferenceSession();

  /// Compiles the execution plan now if every input shape is known; otherwise the first
  /// run() compiles it from the fed shapes.
  void prepareDevice();
  /// Runs batchesPerStep batches from \p stepio's inputs and writes the anchors.
  void run(StepIO &stepio);

  /// The graph inputs fed from the host, in model order.
  std::vector<TensorId> getInputIds() const;
  /// The graph outputs, in model order.
  std::vector<TensorId> getOutputIds() const;
  /// Type and shape of tensor \p id (-1 for dimensions not known until the first run).
  TensorInfo getInfo(const TensorId &id) const;
  /// The value of sequence or optional output \p id after the last run (such outputs are not
  /// written to StepIO buffers, since their shapes may change from run to run).
  SequenceOutput getSequenceOutput(const TensorId &id) const;
  /// The IR as text (after compilation if it has happened).
  std::string dumpIr() const;
  /// Bytes of the activation arena of the compiled plan (0 before compilation).
  int64_t plannedArenaBytes() const;
  /// This replica's index, from 0 (its communicator's rank; SessionOptions::enableReplicatedGraphs:
  /// each replica runs its own inputs); 0 without replication.
  int getReplicationIndex() const;
  /// For each op of the compiled plan, the kernel that runs it and why, one line each
  /// ("MatMul 'fc1': oneDNN, operands FlippedB, timed (reference declined: ...)").
  std::string explainKernels() const;
  /// Times every op from now on: spans for writeProfileTrace, totals for profileSummary.
  /// Profiled runs allocate nothing either (span storage is reserved here).
  void enableProfiling();
  /// Writes the recorded spans as a Chrome trace (chrome://tracing or ui.perfetto.dev).
  void writeProfileTrace(const std::string &path) const;
  /// Per-op and per-op-type share of time, time per run, GFLOP/s and GB/s, and a memory report.
  std::string profileSummary() const;

private:
  InferenceSession();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// What a training session does with one floating-point initializer of its model.
struct WeightStatus {
  enum class Role {
    Trained,          ///< a gradient reaches it from the loss; the optimiser updates it
    Frozen,           ///< named by SessionOptions::frozenWeights
    ShapeConstant,    ///< its values decide a shape (Reshape's shape, Resize's scales...)
    NoGradient,       ///< off every differentiable path to the loss
    RunningStatistic, ///< BatchNormalization's running mean or variance: updated, not trained
  };
  TensorId id;
  Role role = Role::Trained;
  /// Why it is not trained, naming the op or option responsible ("" when trained).
  std::string reason;
};

/// Trains an ONNX model: the backward graph of a scalar loss tensor, optimiser updates of every
/// floating-point initializer that a gradient reaches (getWeightStatuses says what happens to each
/// of the others and why), gradient accumulation, loss scaling and checkpoints.
/// Threads (docs/threads.md): as InferenceSession, distinct sessions on distinct threads run at once;
/// calls on one session must not overlap unless all of them are const.
class TrainingSession {
public:
  /// \p model is a path or serialized ModelProto; \p loss is a scalar (or one-element) tensor
  /// of it, "" for the model's only scalar output.
  static std::unique_ptr<TrainingSession> createFromOnnxModel(const std::string &model, const DataFlow &dataFlow,
                                                              const TensorId &loss, const Optimizer &optimizer,
                                                              const SessionOptions &options = {},
                                                              const InputShapeInfo &inputShapes = {});
  ~TrainingSession();

  /// Builds the backward graph and the optimiser and compiles the plan (input shapes must be
  /// known from the model, InputShapeInfo or SessionOptions::batchSize).
  void prepareDevice();
  /// Weights live in host memory on this backend: this makes the session's weights the
  /// model's initializers again, dropping any training done since (PopART's semantics of
  /// copying the host weights to the device), and resets the optimiser state.
  void weightsFromHost();
  /// Kept for PopART compatibility; weights are always readable on this backend.
  void weightsToHost() {}
  /// One step: batchesPerStep weight updates, each over accumulationFactor micro-batches.
  /// Inputs have leading dimensions [batchesPerStep, accumulationFactor] (each omitted when 1).
  void run(StepIO &stepio);

  /// Copies the current values of the weights named in \p weights into its buffers.
  void readWeights(const WeightsIO &weights) const;
  /// Sets weights from \p weights' buffers (any subset of the trainable weights and
  /// optimiser state tensors).
  void writeWeights(const WeightsIO &weights);
  /// Writes the model with the current weights as its initializers (ONNX, passes the checker).
  /// \p precision "training" (the default) stores each weight in the type the forward pass reads
  /// it in (a bf16 or fp16 copy of a master weight, an fp16.16 weight as it is) behind a Cast to
  /// its declared type, so that the model stays valid at half the size; "fp32" stores every weight
  /// in its declared type (a master weight exactly). The two differ only in a precision mode
  /// (SessionOptions::precision).
  void modelToHost(const std::string &path, const std::string &precision = "training") const;
  /// Replaces the non-const hyperparameters; the optimiser must be of the same kind and agree
  /// on every const value.
  void updateOptimizerFromHost(const Optimizer *optimizer);
  /// Writes weights, optimiser state, step count, loss scale and random state to \p path
  /// atomically and durably (a temporary file, synced, renamed over it, the folder synced), with a
  /// checksum over the file. Replicated: rank 0 writes and the other ranks
  /// return at once; with the optimiser state sharded (replicatedTensorSharding) it is a collective
  /// that every rank must call: the shards are all-gathered and rank 0 writes the whole state, in
  /// the same format, and every rank throws if rank 0 could not write the file.
  void saveCheckpoint(const std::string &path) const;
  /// Restores a checkpoint written by saveCheckpoint for the same model and optimiser; throws
  /// naming the first mismatch (a truncated, extended or corrupt file: its size or checksum) and
  /// leaves the session unchanged. Any replica count, sharded or not,
  /// loads it: a session with sharded optimiser state takes its shard of the whole state.
  void loadCheckpoint(const std::string &path);
  /// Seeds the random ops (Dropout); the stream of masks depends only on the seed and the step.
  void setRandomSeed(uint64_t seed);

  std::vector<TensorId> getInputIds() const;
  /// The trained weights, in model order.
  std::vector<TensorId> getWeightIds() const;
  /// Every floating-point initializer of the model, in model order, with what training does
  /// with it and why (after prepareDevice).
  std::vector<WeightStatus> getWeightStatuses() const;
  /// Optimiser state tensors (velocities, moments...), as readWeights/writeWeights accept.
  std::vector<TensorId> getOptimizerStateIds() const;
  const TensorId &getLossId() const;
  TensorInfo getInfo(const TensorId &id) const;
  /// Weight updates done so far (skipped ones excluded).
  int64_t getStepCount() const;
  /// The loss scale in use (changes with dynamic loss scaling).
  float getLossScale() const;
  /// This replica's index, from 0 (its communicator's rank); 0 without replication.
  int getReplicationIndex() const;
  /// The pipeline stage this process runs, from 0; 0 without pipelining (enablePipelining).
  int getPipelineStage() const;
  /// Weight updates skipped for non-finite gradients (dynamic loss scaling).
  int64_t getSkippedSteps() const;
  /// The numbers of the first 64 skipped steps (1-based, every step run counted), in order, since
  /// the state was last reset (prepareDevice, weightsFromHost); a resumed checkpoint restores
  /// getSkippedSteps but not these.
  std::vector<int64_t> getSkippedStepNumbers() const;
  std::string dumpIr() const;
  int64_t plannedArenaBytes() const;
  /// For each op of the compiled plan, the kernel that runs it and why, one line each.
  std::string explainKernels() const;
  /// Times every op from now on: spans for writeProfileTrace, totals for profileSummary.
  /// Profiled runs allocate nothing either (span storage is reserved here).
  void enableProfiling();
  /// Writes the recorded spans as a Chrome trace (chrome://tracing or ui.perfetto.dev).
  void writeProfileTrace(const std::string &path) const;
  /// Per-op and per-op-type share of time, time per run, GFLOP/s and GB/s, and a memory report;
  /// pipelined, also every stage's busy and waiting time per step (then a collective: every
  /// stage's process must call it).
  std::string profileSummary() const;

private:
  TrainingSession();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace popart
