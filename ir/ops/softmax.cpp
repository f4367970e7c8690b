// Softmax ops: Softmax, LogSoftmax, Hardmax.
//
// Before opset 13 these ops flatten the input to 2-D at `axis` (default 1) and normalise over
// the second dimension; from 13 they normalise over the single axis `axis` (default -1). The
// two forms are kept as they are (the op's version tells them apart): both reduce to an
// [outer, n, inner] view, which is what the kernels use.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

void setupSoftmax(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, {DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16, DataType::BFLOAT16});
  int64_t rank = static_cast<int64_t>(op.inInfo(0).rank());
  int64_t axis = op.attrs.getInt("axis", op.version < 13 ? 1 : -1);
  if (rank == 0) throw error(op.debugName(), ": input must have rank at least 1");
  normalizeAxis(axis, rank, op);
  setupSameAsInput0(op);
}

} // namespace

void registerSoftmaxOps(OpRegistry &r) {
  for (const char *t : {"Softmax", "LogSoftmax", "Hardmax"})
    r.add(makeDef(t, 1, 1000, setupSoftmax));
}

} // namespace popart::ir
