#include "optimizer/sharding.hpp"
#include "optimizer/passes.hpp"
#include <popart/error.hpp>

namespace popart::optimizer {

namespace {

TensorId addOp(ir::Graph &g, int phase, const std::string &domain, const std::string &type,
               const std::vector<TensorId> &inputs, const std::string &hint, ir::Attributes attrs = {}) {
  const int version = domain == "ai.onnx" ? (g.opsets().count("ai.onnx") ? g.opsets().at("ai.onnx") : 17) : 1;
  TensorId out = g.uniqueId(hint);
  ir::Op &op = g.addOp(type, domain, version, "", std::move(attrs), inputs, {out});
  op.phase = phase;
  op.def->setup(op);
  return out;
}

TensorId int64Const(ir::Graph &g, const std::string &hint, const std::vector<int64_t> &values) {
  TensorId id = g.uniqueId(hint);
  g.addConst(id, TensorData::fromInt64({static_cast<int64_t>(values.size())}, values));
  return id;
}

TensorId reshape(ir::Graph &g, int phase, const TensorId &x, const Shape &shape, const std::string &hint) {
  return addOp(g, phase, "ai.onnx", "Reshape", {x, int64Const(g, hint + "_shape", shape)}, hint);
}

/// The 1-D \p x followed by \p count zeros of its type.
TensorId padWithZeros(ir::Graph &g, int phase, const TensorId &x, int64_t count, const std::string &hint) {
  if (count == 0) return x;
  TensorId zeros = g.uniqueId(hint + "_zeros");
  g.addConst(zeros, TensorData(TensorInfo(g.tensor(x).info().dataType(), {count})));
  ir::Attributes axis;
  axis.set("axis", int64_t{0});
  return addOp(g, phase, "ai.onnx", "Concat", {x, zeros}, hint, std::move(axis));
}

} // namespace

ShardLayout shardLayout(int64_t elements, const ShardingOptions &options) {
  if (options.replicas < 1) throw error("sharding: the replica count must be at least 1, got ", options.replicas);
  if (options.rank < 0 || options.rank >= options.replicas)
    throw error("sharding: rank ", options.rank, " is not one of the ", options.replicas, " replicas");
  ShardLayout layout;
  layout.elements = elements;
  layout.shard = (elements + options.replicas - 1) / options.replicas;
  layout.padded = layout.shard * options.replicas;
  layout.begin = layout.shard * options.rank;
  return layout;
}

TensorId reduceScatterGradient(ir::Graph &g, const TensorId &grad, const ShardLayout &layout,
                               const ShardingOptions &options) {
  TensorId flat = reshape(g, PreUpdate, grad, {layout.elements}, grad + "_flat");
  TensorId padded = padWithZeros(g, PreUpdate, flat, layout.padded - layout.elements, grad + "_padded");
  ir::Attributes attrs;
  attrs.set("op", std::string(options.mean ? "Mean" : "Sum"));
  attrs.set("replicas", int64_t{options.replicas});
  return addOp(g, PreUpdate, "ai.graphcore", "ReduceScatter", {padded}, grad + "_shard", std::move(attrs));
}

std::pair<TensorId, TensorId> weightShard(ir::Graph &g, const TensorId &weight, const ShardLayout &layout) {
  const TensorInfo info(g.tensor(weight).info().dataType(), {layout.shard});
  TensorId shard = g.uniqueId("shard_" + weight);
  ir::Tensor &t = g.addTensor(shard, ir::TensorKind::Variable, info);
  t.setData(std::make_shared<TensorData>(info));
  // Even a shard of padding only (which stays zero) is copied: every rank then has the same ops,
  // so that the scheduler cannot order their collectives differently.
  ir::Attributes attrs;
  attrs.set("begin", layout.begin);
  ir::Op &copy = g.addOp("CopyShardVar", "ai.graphcore", 1, "shard_of_" + weight, std::move(attrs), {shard, weight},
                         {g.uniqueId(shard + "_synced")});
  copy.phase = PreUpdate;
  copy.def->setup(copy);
  return {shard, copy.outputs[0]->id()};
}

void gatherWeight(ir::Graph &g, const TensorId &weight, const TensorId &updatedShard, const ShardLayout &,
                  const ShardingOptions &options) {
  ir::Attributes attrs;
  attrs.set("replicas", int64_t{options.replicas});
  ir::Op &gather = g.addOp("AllGatherInto", "ai.graphcore", 1, "gather_" + weight, std::move(attrs),
                           {weight, updatedShard}, {g.uniqueId(weight + "_gathered")});
  gather.phase = PostUpdate;
  gather.def->setup(gather);
}

TensorId allReduceSum(ir::Graph &g, const TensorId &x, int phase) {
  ir::Attributes attrs;
  attrs.set("op", std::string("Sum"));
  return addOp(g, phase, "ai.graphcore", "AllReduce", {x}, x + "_allreduced", std::move(attrs));
}

namespace {

/// The pass state of shardedWeights.
struct ShardedWeights {
  bool decided = false;
  std::set<TensorId> weights;
};

} // namespace

const std::set<TensorId> &shardedWeights(const ir::Graph &g, ir::PassContext &c) {
  ShardedWeights &sharded = c.state<ShardedWeights>();
  if (!sharded.decided) {
    // By the test applyOptimizer makes, so that every weight it shards is left out of the all-reduce.
    const ShardingOptions &options = c.state<OptimizerPassState>().options.sharding;
    for (const auto &[weight, grad] : c.state<ir::TrainingTensors>().weightGrads)
      if (options.shards(g.tensor(weight).info().elementCount())) sharded.weights.insert(weight);
    sharded.decided = true;
  }
  return sharded.weights;
}

} // namespace popart::optimizer
