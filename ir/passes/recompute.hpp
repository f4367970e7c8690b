#pragma once
// recompute: the backward pass reads copies of forward activations computed again just before it
// needs them, instead of holding the forward pass's own from the forward pass to the backward pass
// (PopART's recomputation; docs/training.md, "Recomputation").

#include "ir/graph.hpp"

#include <set>
#include <vector>

namespace popart::ir {

/// Which forward ops the recompute pass chooses on top of those annotated Recompute (the modes of
/// popart::RecomputationType).
enum class RecomputeMode {
  None,     ///< only the annotated ops
  Standard, ///< all but checkpoints spaced along the forward schedule, and the forward's tail
  NormOnly, ///< the normalisation ops
  All,      ///< every forward op
  Pipeline  ///< all but the ops whose outputs cross a __pipeline_stage boundary
};

/// The recompute pass's options (PassContext::state<RecomputeOptions>()), which the session sets.
struct RecomputeOptions {
  RecomputeMode mode = RecomputeMode::None;
};

/// What recompute decides: the forward ops and which of them the backward pass reads recomputed.
struct RecomputePlan {
  std::vector<Op *> forward;   ///< ancestors of the scaled loss, in schedule order
  std::set<const Op *> chosen; ///< forward ops whose outputs the backward pass reads recomputed
  /// The largest id of a forward op: autodiff, which runs after every forward op exists, numbers
  /// the backward ops above it.
  int64_t lastForwardId = -1;
};

/// The plan of recompute(\p graph, \p scaledLoss, \p mode); throws naming the op when an op
/// annotated Recompute cannot be recomputed (it updates a tensor in place, runs a subgraph, or
/// keeps state for a recurrent gradient op).
RecomputePlan planRecomputation(const Graph &graph, const TensorId &scaledLoss, RecomputeMode mode);

/// Right after autodiff: the forward ops are the ancestors of \p scaledLoss and the backward ops
/// those made after all of them. For the forward ops \p mode chooses (and those annotated
/// `__recompute_output_in_backward_pass` Recompute, less those annotated Checkpoint), every
/// backward reader of their outputs reads instead the output of a clone that reads the kept
/// tensors or other clones. The clones' outputs are Tensor::recomputed, so Graph::schedule() runs
/// each clone just before its first reader: the forward pass's own outputs then die with their
/// last forward reader, and the memory planner sees the shorter lifetimes. A Dropout's clone
/// draws the same mask (same inputs, same salt). \returns the number of clones.
int recompute(Graph &graph, const TensorId &scaledLoss, RecomputeMode mode);

} // namespace popart::ir
