#pragma once
// Replicated tensor sharding of the optimiser state (PopART's replicatedTensorSharding, ZeRO
// stage 1; docs/distributed.md, "Sharded optimiser state"): each sharded weight's gradient is
// reduce-scattered over the replicas, each replica updates its 1/N shard of the weight with its
// 1/N shard of the optimiser state, and the updated shards are all-gathered back into the whole
// weight on every rank. applyOptimizer builds the sharded updates with these helpers; the
// replication passes read shardedWeights to keep those gradients out of their all-reduces.

#include "ir/graph.hpp"
#include "ir/passes/pass_manager.hpp"

#include <set>
#include <utility>
#include <vector>

namespace popart::optimizer {

/// Which weights are sharded and over how many replicas (ApplyOptions::sharding, PassContext
/// state), set by the session.
struct ShardingOptions {
  /// The replicas the state is sharded over; 1: no sharding.
  int replicas = 1;
  /// This replica's index: the shard it owns.
  int rank = 0;
  /// Reduce-scatter gradients by their mean over the replicas (true) or their sum.
  bool mean = true;
  /// Weights with fewer elements stay whole (PopART's minElementsForReplicatedTensorSharding).
  int64_t minElements = 0;

  bool enabled() const { return replicas > 1; }
  /// Whether \p weight (of \p elements elements) is sharded.
  bool shards(int64_t elements) const { return enabled() && elements > 0 && elements >= minElements; }
};

/// The layout of one sharded weight: \p elements padded with zeros to a multiple of the
/// replicas, cut into equal shards.
struct ShardLayout {
  int64_t elements = 0; ///< of the whole weight
  int64_t padded = 0;   ///< elements rounded up to a multiple of the replicas
  int64_t shard = 0;    ///< padded / replicas
  int64_t begin = 0;    ///< this replica's first element (may be past the end: all padding)
};

/// The layout of a weight of \p elements elements under \p options.
ShardLayout shardLayout(int64_t elements, const ShardingOptions &options);

/// Adds the PreUpdate ops that reduce-scatter \p grad (flattened, zero-padded) and \returns this
/// replica's shard of the combined gradient, 1-D of layout.shard elements in \p grad's type.
TensorId reduceScatterGradient(ir::Graph &g, const TensorId &grad, const ShardLayout &layout,
                               const ShardingOptions &options);

/// Adds the Variable that holds this replica's shard of \p weight, made from the weight's
/// current values in the PreUpdate phase of every step (so that writeWeights and a restored
/// checkpoint reach it), and \returns {the Variable, the tensor the update op updates in place}.
std::pair<TensorId, TensorId> weightShard(ir::Graph &g, const TensorId &weight, const ShardLayout &layout);

/// Adds the PostUpdate AllGatherInto that gathers every replica's updated shard (\p updatedShard
/// on this one) into \p weight, without the padding.
void gatherWeight(ir::Graph &g, const TensorId &weight, const TensorId &updatedShard, const ShardLayout &layout,
                  const ShardingOptions &options);

/// Adds AllReduce(\p x, Sum) in \p phase and \returns its output: the whole-tensor sums of
/// squares of clipping and LAMB from the replicas' partial ones.
TensorId allReduceSum(ir::Graph &g, const TensorId &x, int phase);

/// The weights whose optimiser state is sharded (ShardingOptions::shards of their element counts
/// under OptimizerPassState's options), decided once per pipeline from TrainingTensors::weightGrads
/// and kept in \p c: the replication passes leave their gradients to applyOptimizer, which
/// reduce-scatters them. \returns an empty set without sharding.
const std::set<TensorId> &shardedWeights(const ir::Graph &g, ir::PassContext &c);

} // namespace popart::optimizer
