#pragma once
// Pipelined model parallelism in the IR (docs/distributed.md, "Pipelining"): every op of the
// training graph gets a pipeline stage, and each process keeps the ops of its own stage, the
// tensors that cross stages becoming messages between the stages' processes.
//
// assignPipelineStages (before autodiff) gives every forward op a stage: the model's annotations,
// tensors to cut at, or a split of the forward schedule balanced by the ops' cost estimates.
// Autodiff gives each gradient op its forward op's stage. splitPipelineStages (after autodiff)
// keeps this process's stage: a tensor read on another stage than the one producing it is kept
// (sent) on the producing stage and becomes a graph input (received) on the reading one.
// markPipelineForward (last) moves the stage's forward ops into the phase kPipelineForwardPhase,
// so that the session can run the forward and the backward of different micro-batches apart.

#include "ir/graph.hpp"

#include <map>
#include <string>
#include <vector>

namespace popart::ir {

/// The phase (Op::phase) of a pipeline stage's forward ops: before the micro-batch phase (0),
/// which then holds the stage's backward ops.
inline constexpr int kPipelineForwardPhase = -1;

/// How the stages are chosen; the session fills it (PassContext::state<PipelineSettings>()).
struct PipelineSettings {
  /// Pipeline stages; 1: no pipelining, the passes do nothing.
  int stages = 1;
  /// The stage this process runs.
  int stage = 0;
  enum class Cut {
    Annotations, ///< __pipeline_stage, else __ipu_number; unannotated ops follow their producers
    Balanced,    ///< contiguous pieces of the forward schedule of about equal estimated cost
    AtTensors    ///< a stage starts after each tensor of splitAt
  };
  Cut cut = Cut::Annotations;
  std::vector<TensorId> splitAt;
};

/// One tensor that one stage produces and another reads, sent once per micro-batch.
struct StageMessage {
  TensorId tensor;
  int from = 0, to = 0;
  /// Its index among all messages of the pipeline (the same on every stage), the message's tag.
  int tag = 0;
  /// A forward activation (from an earlier stage), else a gradient (from a later stage).
  bool forward() const { return from < to; }
};

/// What the passes decided (PassContext::state<PipelineStages>()): the session reads it.
struct PipelineStages {
  /// This stage's messages: those it sends and those it receives (graph inputs of its graph).
  std::vector<StageMessage> sends, receives;
  /// The stage whose ops produce each tensor that the session reads (the loss and the anchors
  /// named by PassContext::keep before the split); tensors without a producer are not listed.
  std::map<TensorId, int> producerStage;
  /// Their infos, so that every stage can size the host buffers of those another stage produces.
  std::map<TensorId, TensorInfo> producedInfo;
  /// The estimated cost (seconds, see assignPipelineStages) of each stage's forward ops.
  std::vector<double> stageCost;
};

/// The nominal cost of \p op used to balance stages: its FLOPs at 50 GFLOP/s plus the bytes it
/// reads and writes at 10 GB/s (one core's order of magnitude; only the ratios matter).
double estimatedSeconds(const Op &op);

} // namespace popart::ir
