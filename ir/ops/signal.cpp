// Signal ops: window functions (opset 17).

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

void setupWindow(Op &op) {
  requireInputCount(op, 1, 1);
  const TensorData &size = op.constInput(0, "size");
  if (size.info().elementCount() != 1) throw error(op.debugName(), ": size must be a scalar");
  int64_t n = static_cast<int64_t>(size.valueAsDouble(0));
  if (n < 0) throw error(op.debugName(), ": size ", n, " is negative");
  DataType type = dataTypeFromOnnx(static_cast<int>(op.attrs.getInt("output_datatype", 1)));
  op.setOutInfo(0, TensorInfo(type, {n}));
}

} // namespace

void registerSignalOps(OpRegistry &r) {
  for (const char *t : {"HannWindow", "HammingWindow", "BlackmanWindow"}) {
    OpDef d = makeDef(t, 17, 1000, setupWindow);
    d.valueInputs = {0};
    r.add(d);
  }
}

} // namespace popart::ir
