// AllReduce(x; op) -> y: y has x's info and holds x combined over the replicas by op.
// ReduceScatter(x; op, replicas) -> y: x is cut into `replicas` equal blocks of its flattened
// elements; replica r receives block r combined over the replicas, a 1-D tensor.
// AllGather(x; replicas) -> y: y is [replicas, x's shape], block r holding replica r's x.
// AllReduceStart(g0, g1, ...; op) -> bucket: the inputs (one type) copied one after the other into
// a 1-D bucket, whose all-reduce starts without blocking; AllReduceWait(bucket; shapes) -> (g0',
// g1', ...): waits for that all-reduce and cuts the bucket back into tensors of the given shapes
// (attribute `shapes`: rank, dims..., per output). Between the two, the ring advances whenever the
// plan polls it between kernels, overlapping the kernels scheduled in between.
// `replicas` is an attribute because shape inference runs before any communicator is known; the
// kernel checks it against the communicator's size.

#include "ir/ops/collectives.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

void setupAllReduce(Op &op) {
  requireInputCount(op, 1, 1);
  collectiveReduction(op);
  op.setOutInfo(0, op.inInfo(0));
}

int64_t replicasAttribute(const Op &op) {
  const int64_t replicas = op.attrs.getInt("replicas");
  if (replicas < 1) throw error(op.debugName(), ": attribute replicas must be at least 1, got ", replicas);
  return replicas;
}

void setupReduceScatter(Op &op) {
  requireInputCount(op, 1, 1);
  collectiveReduction(op);
  const int64_t replicas = replicasAttribute(op);
  const int64_t n = op.inInfo(0).elementCount();
  if (n % replicas != 0)
    throw error(op.debugName(), ": ", op.inInfo(0).toString(), " has ", n, " elements, which do not split into ",
                replicas, " equal blocks (pad it to a multiple of the replica count)");
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), {n / replicas}));
}

void setupAllGather(Op &op) {
  requireInputCount(op, 1, 1);
  const DataType t = op.inInfo(0).dataType();
  if (t == DataType::STRING || t == DataType::UNDEFINED)
    throw error(op.debugName(), ": cannot gather ", toString(t), " (only fixed-size element types)");
  Shape shape{replicasAttribute(op)};
  const Shape &in = op.inInfo(0).shape();
  shape.insert(shape.end(), in.begin(), in.end());
  op.setOutInfo(0, TensorInfo(t, shape));
}

void setupAllReduceStart(Op &op) {
  requireInputCount(op, 1, 1u << 20);
  collectiveReduction(op);
  const DataType t = op.inInfo(0).dataType();
  int64_t count = 0;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    if (op.inInfo(i).dataType() != t)
      throw error(op.debugName(), ": a bucket holds one type, but input ", i, " is ", toString(op.inInfo(i).dataType()),
                  " and input 0 ", toString(t));
    count += op.inInfo(i).elementCount();
  }
  op.setOutInfo(0, TensorInfo(t, {count}));
}

void setupAllReduceWait(Op &op) {
  requireInputCount(op, 1, 1);
  const std::vector<int64_t> shapes = op.attrs.getInts("shapes");
  int64_t count = 0;
  size_t output = 0;
  for (size_t k = 0; k < shapes.size(); ++output) {
    const auto rank = static_cast<size_t>(shapes[k]);
    if (shapes[k] < 0 || k + 1 + rank > shapes.size())
      throw error(op.debugName(), ": attribute shapes is not a list of (rank, dims...) entries");
    Shape shape(shapes.begin() + static_cast<std::ptrdiff_t>(k + 1),
                shapes.begin() + static_cast<std::ptrdiff_t>(k + 1 + rank));
    TensorInfo info(op.inInfo(0).dataType(), shape);
    count += info.elementCount();
    if (output < op.outputs.size()) op.setOutInfo(output, info);
    k += 1 + rank;
  }
  if (output != op.outputs.size())
    throw error(op.debugName(), ": attribute shapes describes ", output, " outputs, the op has ", op.outputs.size());
  if (count != op.inInfo(0).elementCount())
    throw error(op.debugName(), ": its outputs hold ", count, " elements, its bucket ", op.inInfo(0).elementCount());
}

OpDef def(const char *type, void (*setup)(Op &)) {
  OpDef d = makeDef(type, 1, 1000, setup);
  d.domain = "ai.graphcore";
  d.foldable = false; // communication, never evaluated at compile time
  return d;
}

bool isFloating(DataType t) { return t == DataType::FLOAT || t == DataType::FLOAT16 || t == DataType::BFLOAT16; }

// AllGatherInto(target, shard; replicas) -> target, updated in place: the replicas' shards in
// rank order, the first target.elementCount() of them (the rest is padding that the sharded
// optimiser state added, optimizer/sharding.hpp). It gathers an updated weight's shards straight
// into the weight Variable rather than through an activation of the padded size and copies.
void setupAllGatherInto(Op &op) {
  requireInputCount(op, 2, 2);
  const int64_t replicas = replicasAttribute(op);
  const TensorInfo &target = op.inInfo(0), &shard = op.inInfo(1);
  const int64_t elements = target.elementCount();
  if (target.dataType() != shard.dataType() || shard.shape().size() != 1 ||
      shard.elementCount() != (elements + replicas - 1) / replicas)
    throw error(op.debugName(), ": cannot gather ", replicas, " shards ", shard.toString(), " into ", target.toString(),
                " (expected 1-D shards of its type, each of its elements divided by ", replicas, ", rounded up)");
  op.setOutInfo(0, target);
}

// CopyShardVar(shard, whole; begin) -> shard, updated in place: elements [begin, begin + shard's
// count) of the flattened whole, zeros past its end (all zeros for a shard of padding only). The other half of
// AllGatherInto: a replica takes its shard of a weight without an activation of the weight's size.
void setupCopyShardVar(Op &op) {
  requireInputCount(op, 2, 2);
  const TensorInfo &shard = op.inInfo(0), &whole = op.inInfo(1);
  const int64_t begin = op.attrs.getInt("begin");
  if (shard.dataType() != whole.dataType() || shard.shape().size() != 1 || begin < 0)
    throw error(op.debugName(), ": cannot copy a shard ", shard.toString(), " from element ", begin, " of ",
                whole.toString(), " (expected a 1-D shard of its type)");
  op.setOutInfo(0, shard);
}

} // namespace

std::string collectiveReduction(const Op &op) {
  std::string reduction = op.attrs.getString("op", "Sum");
  const DataType t = op.inInfo(0).dataType();
  bool ok = false;
  if (reduction == "Sum")
    ok = isFloating(t) || t == DataType::INT64;
  else if (reduction == "Mean")
    ok = isFloating(t);
  else if (reduction == "And")
    ok = t == DataType::BOOL;
  else
    throw error(op.debugName(), ": attribute op must be Sum, Mean or And, got '", reduction, "'");
  if (!ok)
    throw error(op.debugName(), ": cannot combine ", toString(t), " by ", reduction,
                " (Sum: FLOAT, FLOAT16, BFLOAT16, INT64; Mean: the floating types; And: BOOL)");
  return reduction;
}

void registerCollectiveOps(OpRegistry &r) {
  r.add(def("AllReduce", setupAllReduce));
  r.add(def("ReduceScatter", setupReduceScatter));
  r.add(def("AllGather", setupAllGather));
  r.add(def("AllReduceStart", setupAllReduceStart));
  OpDef wait = def("AllReduceWait", setupAllReduceWait);
  wait.scheduleLate = true;
  r.add(std::move(wait));
  OpDef gatherInto = def("AllGatherInto", setupAllGatherInto);
  gatherInto.modifies = {{0, 0}};
  r.add(std::move(gatherInto));
  OpDef copy = def("CopyShardVar", setupCopyShardVar);
  copy.modifies = {{0, 0}};
  r.add(std::move(copy));
}

} // namespace popart::ir
