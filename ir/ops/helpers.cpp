#include "ir/ops/helpers.hpp"
#include "core/dispatch.hpp"

#include <algorithm>
#include <set>

namespace popart::ir {

Shape broadcastShapes(const Shape &a, const Shape &b, const Op &op) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      throw error(op.debugName(), ": shapes ", toString(a), " and ", toString(b), " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t normalizeAxis(int64_t axis, int64_t rank, const Op &op) {
  if (axis < -rank || axis >= rank) throw error(op.debugName(), ": axis ", axis, " is out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

std::vector<int64_t> normalizeAxes(const std::vector<int64_t> &axes, int64_t rank, const Op &op) {
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (int64_t a : axes) {
    int64_t n = normalizeAxis(a, rank, op);
    if (!seen.insert(n).second) throw error(op.debugName(), ": axis ", a, " is repeated");
    out.push_back(n);
  }
  return out;
}

std::string intsToString(const std::vector<int64_t> &v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

int64_t checkedAdd(const Op &op, int64_t a, int64_t b, const std::string &what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw error(op.debugName(), ": ", what, " ", a, " + ", b, " is past int64");
  return r;
}

int64_t checkedMul(const Op &op, int64_t a, int64_t b, const std::string &what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw error(op.debugName(), ": ", what, " ", a, " * ", b, " is past int64");
  return r;
}

void setupSameAsInput0(Op &op) { op.setOutInfo(0, op.inInfo(0)); }

void setupSameShape(Op &op, DataType type) { op.setOutInfo(0, TensorInfo(type, op.inInfo(0).shape())); }

void requireType(const Op &op, size_t i, std::initializer_list<DataType> types) {
  DataType t = op.inInfo(i).dataType();
  for (DataType ok : types)
    if (t == ok) return;
  std::string list;
  for (DataType ok : types)
    list += (list.empty() ? "" : ", ") + toString(ok);
  throw error(op.debugName(), ": input ", i, " ('", op.input(i).id(), "') has type ", toString(t), ", expected one of ",
              list);
}

void requireInputCount(const Op &op, size_t min, size_t max) {
  size_t n = op.inputCount();
  if (n < min || n > max)
    throw error(op.debugName(), ": has ", n, " inputs, expected ", min,
                (min == max ? "" : " to " + std::to_string(max)));
}

OpDef makeDef(const char *type, int minVersion, int maxVersion, void (*setup)(Op &)) {
  OpDef d;
  d.domain = "ai.onnx";
  d.type = type;
  d.minVersion = minVersion;
  d.maxVersion = maxVersion;
  d.setup = setup;
  return d;
}

void moveIntsAttributeToInput(Op &op, Graph &graph, const char *attr, size_t index) {
  if (!op.attrs.has(attr)) return;
  std::vector<int64_t> values = op.attrs.getInts(attr);
  op.attrs.erase(attr);
  Tensor &t = graph.addConst(graph.uniqueId(op.type + "_" + attr),
                             TensorData::fromInt64({static_cast<int64_t>(values.size())}, values));
  graph.setOpInput(op, index, &t);
}

void moveFloatAttributeToInput(Op &op, Graph &graph, const char *attr, size_t index, DataType type) {
  if (!op.attrs.has(attr)) return;
  double value = op.attrs.getFloat(attr);
  op.attrs.erase(attr);
  Tensor &t = graph.addConst(graph.uniqueId(op.type + "_" + attr), TensorData::fromDoubles(type, {}, {value}));
  graph.setOpInput(op, index, &t);
}

} // namespace popart::ir
