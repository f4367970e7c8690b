#pragma once
// The passes of replicated training (docs/distributed.md, "Replicated training"): every weight
// gradient is all-reduced over the replicas before the optimiser reads it, and the all-finite
// flag of dynamic loss scaling is agreed by all of them.

#include "ir/passes/pass_manager.hpp"

#include <cstdint>

namespace popart::optimizer {

/// What the replication passes read (PassContext::state), set by the session.
struct ReplicationPassOptions {
  /// The session is replicated: without it both passes leave the graph as it is.
  bool enabled = false;
  /// All-reduce gradients by their mean over the replicas (true) or their sum.
  bool mean = true;
  /// Without accumulation: all-reduce the gradients in buckets of about this many bytes that
  /// overlap the backward (SessionOptions::replicationBucketBytes); 0: one blocking all-reduce each.
  int64_t bucketBytes = 0;
};

/// Registers allReduceGradients (between buildGradients and applyOptimizer; nothing with
/// accumulation), allReduceAccumulatedGradients (after applyOptimizer; only with accumulation) and
/// agreeAllFinite (after applyOptimizer); safe to call more than once.
void registerReplicationPasses();

} // namespace popart::optimizer
