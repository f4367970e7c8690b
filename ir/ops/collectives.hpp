#pragma once
// The ai.graphcore collective ops of replicated training (docs/distributed.md): AllReduce,
// ReduceScatter and AllGather across the replicas of a session. Their kernels reach the replicas
// through the KernelContext's communicator; every replica runs the same graph, so every rank
// starts the same collectives in the same (scheduled) order.

#include "ir/op.hpp"

#include <string>

namespace popart::ir {

/// The `op` attribute of AllReduce and ReduceScatter: how the replicas' elements combine.
/// "Sum" (FLOAT, FLOAT16, BFLOAT16, INT64), "Mean" (the floating types) or "And" (BOOL).
/// \returns \p op's value after checking it and that input 0's type suits it (throws naming \p op).
std::string collectiveReduction(const Op &op);

/// Registers AllReduce, ReduceScatter, AllGather, AllReduceStart, AllReduceWait, and AllGatherInto and
/// CopyShardVar (a sharded weight's gather and its shard's copy).
void registerCollectiveOps(OpRegistry &registry);

} // namespace popart::ir
