// Resize (opsets 10-17) and Upsample (7-9).

#include "core/int_range.hpp"
#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

#include <cmath>

namespace popart::ir {

namespace {

/// Index of the scales input and of the sizes input (-1 if none) for this op and version.
void resizeInputs(const Op &op, int &scalesIndex, int &sizesIndex) {
  if (op.type == "Upsample" || op.version < 11) { // (X, scales)
    scalesIndex = 1;
    sizesIndex = -1;
  } else { // (X, roi, scales, sizes)
    scalesIndex = 2;
    sizesIndex = 3;
  }
}

void setupResize(Op &op) {
  const Shape &in = op.inInfo(0).shape();
  int scalesIndex, sizesIndex;
  resizeInputs(op, scalesIndex, sizesIndex);
  Shape out = in;
  const TensorData *sizes = sizesIndex >= 0 ? op.optionalConstInput(static_cast<size_t>(sizesIndex), "sizes") : nullptr;
  const TensorData *scales = op.optionalConstInput(static_cast<size_t>(scalesIndex), "scales");
  if (sizes && sizes->info().elementCount() > 0) {
    std::vector<int64_t> s = sizes->toInt64Vector();
    if (s.size() != in.size())
      throw error(op.debugName(), ": sizes has ", s.size(), " values for an input of rank ", in.size());
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] < 0) throw error(op.debugName(), ": size ", s[i], " on axis ", i, " is negative");
    out = s;
  } else if (scales && scales->info().elementCount() > 0) {
    std::vector<double> s = scales->toDoubleVector();
    if (s.size() != in.size())
      throw error(op.debugName(), ": scales has ", s.size(), " values for an input of rank ", in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      if (!(s[i] > 0)) throw error(op.debugName(), ": scale ", s[i], " on axis ", i, " must be positive");
      const double size = std::floor(static_cast<double>(in[i]) * static_cast<float>(s[i]));
      if (!fitsInt64(size))
        throw error(op.debugName(), ": scale ", s[i], " on axis ", i, " of size ", in[i], " gives a size past 2^63");
      out[i] = static_cast<int64_t>(size);
    }
  } else {
    throw error(op.debugName(), ": needs scales or sizes");
  }
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] == 0 && out[i] != 0) // no value to sample (the kernels read past the empty input)
      throw error(op.debugName(), ": axis ", i, " of the input is empty but resized to ", out[i]);
  std::string mode = op.attrs.getString("mode", "nearest");
  if (mode != "nearest" && mode != "linear" && mode != "cubic" && mode != "bilinear")
    throw error(op.debugName(), ": mode '", mode, "' is not one of nearest, linear, cubic");
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void canonicalizeUpsample(Op &op, Graph &graph) {
  // Upsample-7 has the scales as an attribute; later versions take them as an input.
  if (!op.attrs.has("scales")) return;
  std::vector<float> s = op.attrs.getFloats("scales");
  op.attrs.erase("scales");
  Tensor &t = graph.addConst(graph.uniqueId("Upsample_scales"),
                             TensorData::fromDoubles(DataType::FLOAT, {static_cast<int64_t>(s.size())},
                                                     std::vector<double>(s.begin(), s.end())));
  graph.setOpInput(op, 1, &t);
}

} // namespace

void registerResizeOps(OpRegistry &r) {
  OpDef resize = makeDef("Resize", 10, 1000, setupResize);
  resize.valueInputs = {1, 2, 3};
  r.add(resize);
  OpDef up = makeDef("Upsample", 7, 9, setupResize);
  up.valueInputs = {1};
  up.canonicalize = canonicalizeUpsample;
  r.add(up);
}

} // namespace popart::ir
