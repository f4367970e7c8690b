#pragma once
// Running one pipeline stage (docs/distributed.md, "Pipelining"): the stage's process receives
// the tensors its ops read from other stages, sends those other stages read, and keeps each
// micro-batch's activations from its forward to its backward while later micro-batches' forwards
// run in between (one forward, one backward: at most stages - stage micro-batches at once).

#include "backend_cpu/plan.hpp"
#include "comm/communicator.hpp"
#include "ir/passes/pipeline_stages.hpp"
#include <popart/sessionoptions.hpp>
#include <popart/stepio.hpp>

#include <memory>
#include <utility>
#include <vector>

namespace popart::session {

/// The process groups of a pipelined job: ranks = stages × replicas, rank r running stage
/// r / replicas of replica r % replicas.
struct PipelineGroups {
  std::shared_ptr<comm::Communicator> world;
  /// This replica's stages, ranked by stage: the messages between stages.
  std::shared_ptr<comm::Communicator> stages;
  /// This stage's replicas, ranked by replica: the gradient all-reduce; null with one replica.
  std::shared_ptr<comm::Communicator> replicas;
  int stage = 0, stageCount = 1, replica = 0;
};

/// The groups of a session with \p options (enablePipelining): the communicator given or one over
/// MPI_COMM_WORLD, split by stage and by replica (a collective over all ranks). Throws naming the
/// option when the options do not make a pipeline.
PipelineGroups pipelineGroups(const SessionOptions &options);

/// How the pipeline passes cut the model for \p groups and \p options.
ir::PipelineSettings pipelineSettings(const PipelineGroups &groups, const SessionOptions &options);

/// One stage's side of a pipelined step, over a compiled plan whose forward ops are in phase
/// ir::kPipelineForwardPhase (none on the last stage, which runs each micro-batch's forward and
/// backward together). Buffers are made once: a run allocates nothing beyond what comm/ does.
class PipelineRun {
public:
  /// \p stashDepth: micro-batches whose activations the stage holds at once (0: none, the last stage).
  PipelineRun(PipelineGroups groups, ir::PipelineStages stages, const ir::Graph &graph,
              const backend_cpu::ExecutionPlan &plan, int stashDepth);
  PipelineRun(const PipelineRun &) = delete;
  PipelineRun &operator=(const PipelineRun &) = delete;
  ~PipelineRun();

  /// The one-forward-one-backward order of stage \p stage of \p stages over \p microBatches:
  /// {true, i} is micro-batch i's forward, {false, i} its backward. Stage s first runs
  /// stages - s - 1 forwards, then alternates, then runs the backwards left.
  static std::vector<std::pair<bool, int>> trainingOrder(int stages, int stage, int microBatches);

  const PipelineGroups &groups() const { return groups_; }
  const ir::PipelineStages &stages() const { return stages_; }

  /// Receives the tensors of the forward (activations) or the backward (gradients) from the
  /// stages that send them, into the plan's buffers.
  void receive(bool forward);
  /// Starts sending the tensors of the forward or the backward; their bytes are copied first, so
  /// that the next run may overwrite the plan's buffers at once.
  void send(bool forward);
  /// Copies the activations the backward reads out of the plan (micro-batch \p microBatch's slot).
  void stash(int microBatch);
  /// Copies micro-batch \p microBatch's activations back for its backward.
  void restore(int microBatch);
  /// Waits for every send in flight (at the end of a step).
  void finishSends();
  /// Copies each anchor of \p outputs that another stage produces from that stage to this one.
  void shareAnchors(const std::map<TensorId, IArray &> &outputs);
  /// Bytes held for the activations in flight (stash) and the messages being sent.
  int64_t stashBytes() const { return static_cast<int64_t>(stash_.size()); }

  /// Time spent since the counters were last reset (ns): waiting for received tensors, and
  /// copying activations into and out of the stash and tensors into send buffers.
  struct Times {
    int64_t receiving = 0, copying = 0;
  };
  const Times &times() const { return times_; }
  /// Starts counting time (profiling); off by default, so that a run reads no clock.
  void countTimes() { counting_ = true; }

private:
  struct Outgoing {
    ir::StageMessage message;
    const void *source = nullptr;
    int64_t bytes = 0;
    std::vector<uint8_t> slots; ///< depth copies of the tensor
    std::vector<comm::Request> requests;
    int64_t sent = 0;
  };
  PipelineGroups groups_;
  ir::PipelineStages stages_;
  std::vector<std::pair<void *, int64_t>> saved_; ///< arena blocks the backward reads
  int64_t savedBytes_ = 0;
  int stashDepth_ = 0;
  std::vector<uint8_t> stash_;
  std::vector<std::pair<void *, int64_t>> incoming_[2]; ///< [forward]: buffers of receives
  std::vector<const ir::StageMessage *> incomingMessages_[2];
  std::vector<Outgoing> outgoing_;
  bool counting_ = false;
  Times times_;
};

} // namespace popart::session
