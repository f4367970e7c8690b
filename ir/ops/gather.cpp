// Indexing ops: Gather, GatherElements, GatherND, Scatter, ScatterElements, ScatterND, OneHot,
// NonZero, Compress, Unique.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

#include <algorithm>
#include <numeric>

namespace popart::ir {

namespace {

void requireIndices(const Op &op, size_t i) { requireType(op, i, {DataType::INT32, DataType::INT64}); }

void setupGather(Op &op) {
  requireInputCount(op, 2, 2);
  requireIndices(op, 1);
  const Shape &data = op.inInfo(0).shape();
  if (data.empty()) throw error(op.debugName(), ": data must have rank >= 1");
  int64_t axis = normalizeAxis(op.attrs.getInt("axis", 0), static_cast<int64_t>(data.size()), op);
  Shape out(data.begin(), data.begin() + axis);
  const Shape &ind = op.inInfo(1).shape();
  out.insert(out.end(), ind.begin(), ind.end());
  out.insert(out.end(), data.begin() + axis + 1, data.end());
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void setupGatherElements(Op &op) {
  requireInputCount(op, 2, 2);
  requireIndices(op, 1);
  const Shape &data = op.inInfo(0).shape(), &ind = op.inInfo(1).shape();
  if (data.empty() || data.size() != ind.size())
    throw error(op.debugName(), ": data ", toString(data), " and indices ", toString(ind),
                " must have the same rank >= 1");
  normalizeAxis(op.attrs.getInt("axis", 0), static_cast<int64_t>(data.size()), op);
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), ind));
}

void setupGatherND(Op &op) {
  requireInputCount(op, 2, 2);
  requireType(op, 1, {DataType::INT64});
  const Shape &data = op.inInfo(0).shape(), &ind = op.inInfo(1).shape();
  int64_t b = op.attrs.getInt("batch_dims", 0);
  int64_t r = static_cast<int64_t>(data.size()), q = static_cast<int64_t>(ind.size());
  if (r < 1 || q < 1) throw error(op.debugName(), ": data and indices must have rank >= 1");
  if (b < 0 || b >= std::min(r, q))
    throw error(op.debugName(), ": batch_dims ", b, " must be in [0, min(rank(data), rank(indices)))");
  for (int64_t i = 0; i < b; ++i)
    if (data[i] != ind[i])
      throw error(op.debugName(), ": batch dimension ", i, " differs between data ", toString(data), " and indices ",
                  toString(ind));
  int64_t k = ind.back();
  if (k < 1 || b + k > r)
    throw error(op.debugName(), ": last dimension of indices (", k, ") must be in [1, rank(data) - batch_dims] = [1, ",
                r - b, "]");
  Shape out(ind.begin(), ind.end() - 1);
  out.insert(out.end(), data.begin() + b + k, data.end());
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void checkReduction(const Op &op) {
  std::string red = op.attrs.getString("reduction", "none");
  if (red != "none" && red != "add" && red != "mul" && red != "max" && red != "min")
    throw error(op.debugName(), ": reduction '", red, "' is not one of none, add, mul, max, min");
}

void setupScatterElements(Op &op) {
  requireInputCount(op, 3, 3);
  requireIndices(op, 1);
  const Shape &data = op.inInfo(0).shape(), &ind = op.inInfo(1).shape();
  if (data.empty() || data.size() != ind.size())
    throw error(op.debugName(), ": data ", toString(data), " and indices ", toString(ind),
                " must have the same rank >= 1");
  if (op.inInfo(2).shape() != ind)
    throw error(op.debugName(), ": updates shape ", toString(op.inInfo(2).shape()), " differs from indices shape ",
                toString(ind));
  if (op.inInfo(2).dataType() != op.inInfo(0).dataType())
    throw error(op.debugName(), ": updates type ", toString(op.inInfo(2).dataType()), " differs from data type ",
                toString(op.inInfo(0).dataType()));
  normalizeAxis(op.attrs.getInt("axis", 0), static_cast<int64_t>(data.size()), op);
  checkReduction(op);
  setupSameAsInput0(op);
}

void setupScatterND(Op &op) {
  requireInputCount(op, 3, 3);
  requireType(op, 1, {DataType::INT64});
  const Shape &data = op.inInfo(0).shape(), &ind = op.inInfo(1).shape();
  if (data.empty() || ind.empty()) throw error(op.debugName(), ": data and indices must have rank >= 1");
  int64_t k = ind.back();
  if (k < 1 || k > static_cast<int64_t>(data.size()))
    throw error(op.debugName(), ": last dimension of indices (", k, ") must be in [1, rank(data)]");
  Shape upd(ind.begin(), ind.end() - 1);
  upd.insert(upd.end(), data.begin() + k, data.end());
  if (op.inInfo(2).shape() != upd)
    throw error(op.debugName(), ": updates have shape ", toString(op.inInfo(2).shape()), ", expected ", toString(upd));
  if (op.inInfo(2).dataType() != op.inInfo(0).dataType())
    throw error(op.debugName(), ": updates type differs from data type");
  checkReduction(op);
  setupSameAsInput0(op);
}

void setupOneHot(Op &op) {
  requireInputCount(op, 3, 3);
  const TensorData &depthData = op.constInput(1, "depth");
  if (depthData.info().elementCount() != 1) throw error(op.debugName(), ": depth must have one element");
  double depthValue = depthData.valueAsDouble(0);
  if (!(depthValue >= 1)) throw error(op.debugName(), ": depth must be positive, got ", depthValue);
  const int64_t depth = depthData.valueAsInt64(0);
  if (op.inInfo(2).elementCount() != 2)
    throw error(op.debugName(), ": values must have two elements [off, on], got shape ",
                toString(op.inInfo(2).shape()));
  if (op.inInfo(0).dataType() == DataType::BOOL || op.inInfo(0).dataType() == DataType::STRING)
    throw error(op.debugName(), ": indices must be numeric");
  Shape out = op.inInfo(0).shape();
  int64_t axis = normalizeAxis(op.attrs.getInt("axis", -1), static_cast<int64_t>(out.size()) + 1, op);
  out.insert(out.begin() + axis, depth);
  op.setOutInfo(0, TensorInfo(op.inInfo(2).dataType(), out));
}

void setupNonZero(Op &op) {
  requireInputCount(op, 1, 1);
  const TensorData &x = op.constInput(0, "data");
  if (x.info().dataType() == DataType::STRING) throw error(op.debugName(), ": STRING input is not supported");
  int64_t count = 0;
  for (int64_t i = 0; i < x.info().elementCount(); ++i)
    count += x.valueAsDouble(i) != 0;
  op.setOutInfo(0, TensorInfo(DataType::INT64, {x.info().rank(), count}));
}

void setupCompress(Op &op) {
  requireInputCount(op, 2, 2);
  requireType(op, 1, {DataType::BOOL});
  const TensorData &cond = op.constInput(1, "condition");
  if (cond.info().rank() != 1)
    throw error(op.debugName(), ": condition must be 1-D, got ", toString(cond.info().shape()));
  const Shape &in = op.inInfo(0).shape();
  int64_t len = cond.info().elementCount();
  int64_t count = 0;
  for (int64_t i = 0; i < len; ++i)
    count += cond.as<bool>()[i] ? 1 : 0;
  if (!op.attrs.has("axis")) {
    if (len > shapeElementCount(in))
      throw error(op.debugName(), ": condition has ", len, " elements but the input only ", shapeElementCount(in));
    op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), {count}));
    return;
  }
  int64_t axis = normalizeAxis(op.attrs.getInt("axis"), static_cast<int64_t>(in.size()), op);
  if (len > in[axis])
    throw error(op.debugName(), ": condition has ", len, " elements but axis ", axis, " has size ", in[axis]);
  Shape out = in;
  out[axis] = count;
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void setupUnique(Op &op) {
  requireInputCount(op, 1, 1);
  const TensorData &x = op.constInput(0, "X");
  if (x.info().dataType() == DataType::STRING) throw error(op.debugName(), ": STRING input is not supported");
  const Shape &shape = x.info().shape();
  int64_t outer = 1, slices = x.info().elementCount(), inner = 1;
  std::optional<int64_t> axis;
  if (op.attrs.has("axis")) {
    axis = normalizeAxis(op.attrs.getInt("axis"), static_cast<int64_t>(shape.size()), op);
    slices = shape[*axis];
    for (int64_t i = 0; i < *axis; ++i)
      outer *= shape[i];
    for (size_t i = *axis + 1; i < shape.size(); ++i)
      inner *= shape[i];
  }
  std::vector<double> values = x.toDoubleVector();
  // Slice s, element j (row-major within the slice).
  auto at = [&](int64_t s, int64_t j) {
    return values[static_cast<size_t>(((j / inner) * slices + s) * inner + j % inner)];
  };
  int64_t sliceSize = outer * inner;
  std::vector<int64_t> order(static_cast<size_t>(slices));
  std::iota(order.begin(), order.end(), 0);
  auto less = [&](int64_t a, int64_t b) {
    for (int64_t j = 0; j < sliceSize; ++j)
      if (at(a, j) != at(b, j)) return at(a, j) < at(b, j);
    return false;
  };
  std::stable_sort(order.begin(), order.end(), less);
  int64_t unique = slices > 0 ? 1 : 0;
  for (size_t i = 1; i < order.size(); ++i)
    unique += less(order[i - 1], order[i]) ? 1 : 0;
  Shape y = axis ? shape : Shape{unique};
  if (axis) y[*axis] = unique;
  op.setOutInfo(0, TensorInfo(x.info().dataType(), y));
  op.setOutInfo(1, TensorInfo(DataType::INT64, {unique}));
  op.setOutInfo(2, TensorInfo(DataType::INT64, {slices}));
  op.setOutInfo(3, TensorInfo(DataType::INT64, {unique}));
}

} // namespace

void registerGatherScatterOps(OpRegistry &r) {
  r.add(makeDef("Gather", 1, 1000, setupGather));
  r.add(makeDef("GatherElements", 11, 1000, setupGatherElements));
  r.add(makeDef("GatherND", 11, 1000, setupGatherND));
  r.add(makeDef("Scatter", 9, 1000, setupScatterElements));
  r.add(makeDef("ScatterElements", 11, 1000, setupScatterElements));
  r.add(makeDef("ScatterND", 11, 1000, setupScatterND));
  OpDef oneHot = makeDef("OneHot", 9, 1000, setupOneHot);
  oneHot.valueInputs = {1};
  r.add(oneHot);
  OpDef nonZero = makeDef("NonZero", 9, 1000, setupNonZero);
  nonZero.allInputsAreValueInputs = true;
  r.add(nonZero);
  OpDef compress = makeDef("Compress", 9, 1000, setupCompress);
  compress.valueInputs = {1};
  r.add(compress);
  OpDef unique = makeDef("Unique", 11, 1000, setupUnique);
  unique.allInputsAreValueInputs = true;
  r.add(unique);
}

} // namespace popart::ir
