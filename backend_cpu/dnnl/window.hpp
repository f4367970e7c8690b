#pragma once
// Window parameters of the conv and pool ops (forward and grad) in oneDNN's terms, from
// ir::resolveWindow.

#include "ir/ops/window.hpp"

#include <oneapi/dnnl/dnnl.hpp>
#include <popart/error.hpp>

#include <vector>

namespace popart::backend_cpu::dnnl_util {

/// Padding resolved as ONNX defines it; dilations as oneDNN counts them (the gaps between taps).
struct Window {
  dnnl::memory::dims kernel, strides, dilates, padL, padR;
};

/// \p transposed: ConvTranspose's rules for output_shape / auto_pad (see ir::resolveWindow).
/// padR is the ONNX end padding; callers adapt it to oneDNN's size formula.
inline Window makeWindow(const ir::Op &op, const Shape &x, const Shape &y, const std::vector<int64_t> &kernel,
                         bool transposed) {
  ir::WindowGeometry g = ir::resolveWindow(op, x, y, kernel, transposed);
  Window w;
  for (size_t i = 0; i < g.spatialRank(); ++i) {
    w.kernel.push_back(g.kernel[i]);
    w.strides.push_back(g.strides[i]);
    w.dilates.push_back(g.dilations[i] - 1); // oneDNN counts the gaps between taps
    w.padL.push_back(g.padBegin[i]);
    w.padR.push_back(g.padEnd[i]);
  }
  return w;
}

/// Throws (declines) if a pad of \p w is negative.
inline void rejectNegativePads(const ir::Op &op, const Window &w) {
  for (size_t i = 0; i < w.padR.size(); ++i)
    if (w.padL[i] < 0 || w.padR[i] < 0)
      throw ::popart::error(op.debugName(), ": negative padding is left to the reference kernel");
}

/// ceil_mode for a pool between \p x and \p y: extends the end padding where needed so that
/// oneDNN's floor formula gives the ceil size. The extension is ignored by max and excluded
/// averaging, but would be counted when padding is (\p includePad): then it throws (declines).
inline void extendPadsForCeilMode(const ir::Op &op, const Shape &x, const Shape &y, bool includePad, Window &w) {
  for (size_t i = 0; i < w.padR.size(); ++i) {
    int64_t in = x[i + 2], out = y[i + 2], dk = (w.kernel[i] - 1) * (w.dilates[i] + 1) + 1;
    if ((in + w.padL[i] + w.padR[i] - dk) / w.strides[i] + 1 == out) continue;
    int64_t needed = (out - 1) * w.strides[i] + dk - in - w.padL[i];
    if (includePad && needed > w.padR[i])
      throw ::popart::error(op.debugName(), ": ceil_mode with count_include_pad is left to the reference kernel");
    w.padR[i] = needed;
  }
}

} // namespace popart::backend_cpu::dnnl_util
