// Signal ops: window functions (opset 17).

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

void setupWindow(Op &op) {
  requireInputCount(op, 1, 1);
  const TensorData &size = op.constInput(0, "size");
  if (size.info().elementCount() != 1) throw error(op.debugName(), ": size must be a scalar");
  int64_t n = size.valueAsInt64(0);
  if (n < 0) throw error(op.debugName(), ": size ", n, " is negative");
  DataType type = dataTypeFromOnnx(static_cast<int>(op.attrs.getInt("output_datatype", 1)));
  op.setOutInfo(0, TensorInfo(type, {n}));
}

void setupDft(Op &op) {
  requireInputCount(op, 1, 2);
  Shape s = op.inInfo(0).shape();
  if (s.size() < 3 || (s.back() != 1 && s.back() != 2))
    throw error(op.debugName(), ": input must be [batch, ..., 1 or 2], got ", toString(s));
  int64_t axis = normalizeAxis(op.attrs.getInt("axis", 1), static_cast<int64_t>(s.size()) - 1, op);
  if (axis == 0) throw error(op.debugName(), ": axis 0 is the batch axis");
  int64_t length = s[static_cast<size_t>(axis)];
  if (const TensorData *l = op.optionalConstInput(1, "dft_length")) length = l->valueAsInt64(0);
  if (length <= 0) throw error(op.debugName(), ": dft_length must be positive, got ", length);
  bool onesided = op.attrs.getInt("onesided", 0) != 0;
  s[static_cast<size_t>(axis)] = onesided ? length / 2 + 1 : length;
  s.back() = 2;
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), s));
}

void setupStft(Op &op) {
  requireInputCount(op, 2, 4);
  const Shape &s = op.inInfo(0).shape();
  if (s.size() != 3 || (s[2] != 1 && s[2] != 2))
    throw error(op.debugName(), ": signal must be [batch, length, 1 or 2], got ", toString(s));
  int64_t step = op.constInput(1, "frame_step").valueAsInt64(0);
  int64_t frame = -1;
  if (op.hasInput(2)) frame = op.inInfo(2).dim(0);
  if (const TensorData *l = op.optionalConstInput(3, "frame_length")) frame = l->valueAsInt64(0);
  if (frame <= 0 || step <= 0 || frame > s[1])
    throw error(op.debugName(), ": frame length ", frame, " and step ", step, " do not fit a signal of ", s[1]);
  bool onesided = op.attrs.getInt("onesided", 1) != 0;
  int64_t frames = (s[1] - frame) / step + 1;
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), {s[0], frames, onesided ? frame / 2 + 1 : frame, 2}));
}

} // namespace

void registerSignalOps(OpRegistry &r) {
  OpDef dft = makeDef("DFT", 17, 1000, setupDft);
  dft.valueInputs = {1};
  r.add(dft);
  OpDef stft = makeDef("STFT", 17, 1000, setupStft);
  stft.valueInputs = {1, 3};
  r.add(stft);
  for (const char *t : {"HannWindow", "HammingWindow", "BlackmanWindow"}) {
    OpDef d = makeDef(t, 17, 1000, setupWindow);
    d.valueInputs = {0};
    r.add(d);
  }
}

} // namespace popart::ir
