// Reduce ops: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax/ArgMin,
// CumSum and TopK.
//
// Canonical form of the Reduce* ops: the axes are always the optional constant input 1 (as
// ReduceSum has them from opset 13); the attribute form of older opsets is rewritten at import.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

const char *const kReduceTypes[] = {"ReduceSum", "ReduceMean", "ReduceMax",    "ReduceMin",       "ReduceProd",
                                    "ReduceL1",  "ReduceL2",   "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};

void canonicalizeReduce(Op &op, Graph &graph) {
  if (op.attrs.has("axes") && op.hasInput(1))
    throw error(op.debugName(), ": has both an 'axes' attribute and an axes input");
  moveIntsAttributeToInput(op, graph, "axes", 1);
}

void setupReduce(Op &op) {
  requireInputCount(op, 1, 2);
  const TensorInfo &in = op.inInfo(0);
  if (in.dataType() == DataType::BOOL || in.dataType() == DataType::STRING)
    throw error(op.debugName(), ": input type ", toString(in.dataType()), " is not supported (numeric types only)");
  int64_t rank = static_cast<int64_t>(in.rank());
  std::vector<int64_t> axes;
  if (const TensorData *a = op.optionalConstInput(1, "axes")) {
    if (a->info().dataType() != DataType::INT64)
      throw error(op.debugName(), ": axes input has type ", toString(a->info().dataType()), ", expected INT64");
    if (a->info().rank() > 1)
      throw error(op.debugName(), ": axes input must be 1-D, got shape ", toString(a->info().shape()));
    axes = a->toInt64Vector();
  }
  int64_t keepdims = op.attrs.getInt("keepdims", 1);
  int64_t noop = op.attrs.getInt("noop_with_empty_axes", 0);
  if ((keepdims != 0 && keepdims != 1) || (noop != 0 && noop != 1))
    throw error(op.debugName(), ": keepdims and noop_with_empty_axes must be 0 or 1");
  if (axes.empty() && noop) {
    setupSameAsInput0(op);
    return;
  }
  std::vector<bool> reduced(static_cast<size_t>(rank), axes.empty());
  for (int64_t a : normalizeAxes(axes, rank, op))
    reduced[static_cast<size_t>(a)] = true;
  Shape out;
  for (int64_t d = 0; d < rank; ++d) {
    if (!reduced[static_cast<size_t>(d)])
      out.push_back(in.shape()[static_cast<size_t>(d)]);
    else if (keepdims)
      out.push_back(1);
  }
  op.setOutInfo(0, TensorInfo(in.dataType(), out));
}

void setupArgMinMax(Op &op) {
  requireInputCount(op, 1, 1);
  const TensorInfo &in = op.inInfo(0);
  if (in.dataType() == DataType::BOOL || in.dataType() == DataType::STRING)
    throw error(op.debugName(), ": input type ", toString(in.dataType()), " is not supported (numeric types only)");
  int64_t rank = static_cast<int64_t>(in.rank());
  int64_t axis = normalizeAxis(op.attrs.getInt("axis", 0), rank, op);
  int64_t keepdims = op.attrs.getInt("keepdims", 1);
  if (in.shape()[static_cast<size_t>(axis)] == 0)
    throw error(op.debugName(), ": cannot take the arg-extremum over axis ", axis, " of size 0 (input shape ",
                toString(in.shape()), ")");
  Shape out = in.shape();
  if (keepdims)
    out[static_cast<size_t>(axis)] = 1;
  else
    out.erase(out.begin() + axis);
  op.setOutInfo(0, TensorInfo(DataType::INT64, out));
}

void setupCumSum(Op &op) {
  requireInputCount(op, 2, 2);
  requireType(op, 1, {DataType::INT32, DataType::INT64});
  if (op.inInfo(1).elementCount() != 1)
    throw error(op.debugName(), ": axis input must hold one value, got shape ", toString(op.inInfo(1).shape()));
  if (op.inInfo(0).rank() == 0) throw error(op.debugName(), ": input must have rank at least 1");
  DataType t = op.inInfo(0).dataType();
  if (t == DataType::BOOL || t == DataType::STRING)
    throw error(op.debugName(), ": input type ", toString(t), " is not supported (numeric types only)");
  if (op.input(1).isConst())
    normalizeAxis(op.input(1).data()->valueAsInt64(0), static_cast<int64_t>(op.inInfo(0).rank()),
                  op);
  setupSameAsInput0(op);
}

void canonicalizeTopK(Op &op, Graph &graph) {
  // Before opset 10, k is an attribute; from 10 it is a 1-element INT64 input.
  if (!op.attrs.has("k")) return;
  int64_t k = op.attrs.getInt("k");
  op.attrs.erase("k");
  Tensor &t = graph.addConst(graph.uniqueId(op.type + "_k"), TensorData::fromInt64({1}, {k}));
  graph.setOpInput(op, 1, &t);
}

void setupTopK(Op &op) {
  requireInputCount(op, 2, 2);
  const TensorInfo &in = op.inInfo(0);
  if (in.dataType() == DataType::BOOL || in.dataType() == DataType::STRING)
    throw error(op.debugName(), ": input type ", toString(in.dataType()), " is not supported (numeric types only)");
  int64_t rank = static_cast<int64_t>(in.rank());
  int64_t axis = normalizeAxis(op.attrs.getInt("axis", -1), rank, op);
  const TensorData &kd = op.constInput(1, "K");
  if (kd.info().elementCount() != 1 ||
      (kd.info().dataType() != DataType::INT64 && kd.info().dataType() != DataType::INT32))
    throw error(op.debugName(), ": K must be a 1-element INT64 tensor, got ", kd.info().toString());
  int64_t k = kd.valueAsInt64(0);
  int64_t n = in.shape()[static_cast<size_t>(axis)];
  if (k < 0 || k > n)
    throw error(op.debugName(), ": K = ", k, " is out of range for axis ", axis, " of size ", n, " (input shape ",
                toString(in.shape()), ")");
  Shape out = in.shape();
  out[static_cast<size_t>(axis)] = k;
  op.setOutInfo(0, TensorInfo(in.dataType(), out));
  op.setOutInfo(1, TensorInfo(DataType::INT64, out));
}

} // namespace

void registerReduceOps(OpRegistry &r) {
  for (const char *t : kReduceTypes) {
    OpDef d = makeDef(t, 1, 1000, setupReduce);
    d.canonicalize = canonicalizeReduce;
    d.valueInputs = {1};
    r.add(d);
  }
  for (const char *t : {"ArgMax", "ArgMin"})
    r.add(makeDef(t, 1, 1000, setupArgMinMax));
  r.add(makeDef("CumSum", 11, 1000, setupCumSum));
  OpDef topk = makeDef("TopK", 1, 1000, setupTopK);
  topk.canonicalize = canonicalizeTopK;
  topk.valueInputs = {1};
  r.add(topk);
}

} // namespace popart::ir
