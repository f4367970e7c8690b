#include "ir/ops/window.hpp"

#include <popart/error.hpp>

#include <algorithm>
#include <string>

namespace popart::ir {

bool fusedPool(const Op &op, FusedPool &pool) {
  if (!op.fusion.pool) return false;
  pool = *op.fusion.pool;
  return true;
}

Shape FusedPool::output(const Op &op) const {
  size_t nsp = kernel.size();
  if (input.size() != nsp + 2 || strides.size() != nsp || pads.size() != 2 * nsp)
    throw error(op.debugName(), ": fused pool attributes do not match ", nsp, " spatial axes");
  Shape y(input.begin(), input.begin() + 2);
  for (size_t i = 0; i < nsp; ++i) {
    int64_t span = input[i + 2] + pads[i] + pads[i + nsp] - kernel[i];
    if (kernel[i] < 1 || strides[i] < 1 || span < 0)
      throw error(op.debugName(), ": fused pool window ", kernel[i], " does not fit spatial axis ", i);
    y.push_back(span / strides[i] + 1);
  }
  return y;
}

std::string whyWindowsDoNotTile(const Op &op, const Shape &windows) {
  if (!op.hasInput(0) || op.inInfo(0).rank() != 4 || windows.size() != 4) return "not 2-D";
  const std::vector<int64_t> k = op.attrs.getInts("kernel_shape", {}), s = op.attrs.getInts("strides", {});
  const std::vector<int64_t> d = op.attrs.getInts("dilations", {1, 1}), pads = op.attrs.getInts("pads", {0, 0, 0, 0});
  if (k.size() != 2 || s.size() != 2 || d.size() != 2) return "no 2-D kernel_shape, strides and dilations";
  for (size_t i = 0; i < 2; ++i) {
    if (s[i] < k[i]) return "overlapping windows (a stride below the kernel)";
    if (d[i] != 1) return "dilated windows";
  }
  if (!std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) return "padded windows";
  // The windows' shape carries a ceil_mode, whose last window may reach past the input.
  const Shape &x = op.inInfo(0).shape();
  for (size_t i = 0; i < 2; ++i)
    if ((windows[i + 2] - 1) * s[i] + k[i] > x[i + 2]) return "a window (ceil_mode) reaches past the input";
  return {};
}

Shape convResultShape(const Op &op) {
  FusedPool pool;
  return fusedPool(op, pool) ? pool.input : op.outInfo(0).shape();
}

std::vector<int64_t> WindowGeometry::pads() const {
  std::vector<int64_t> p = padBegin;
  p.insert(p.end(), padEnd.begin(), padEnd.end());
  return p;
}

WindowGeometry resolveWindow(const Op &op, const Shape &x, const Shape &y, const std::vector<int64_t> &kernel,
                             bool transposed) {
  size_t nsp = x.size() - 2;
  WindowGeometry g;
  g.strides = op.attrs.getInts("strides", std::vector<int64_t>(nsp, 1));
  g.dilations = op.attrs.getInts("dilations", std::vector<int64_t>(nsp, 1));
  auto pads = op.attrs.getInts("pads", std::vector<int64_t>(2 * nsp, 0));
  auto outPad = op.attrs.getInts("output_padding", std::vector<int64_t>(nsp, 0));
  std::string ap = op.attrs.getString("auto_pad", "NOTSET");
  bool same = ap == "SAME_UPPER" || ap == "SAME_LOWER";
  g.in.assign(x.begin() + 2, x.end());
  g.out.assign(y.begin() + 2, y.end());
  g.kernel = kernel;
  g.padBegin.resize(nsp);
  g.padEnd.resize(nsp);
  for (size_t i = 0; i < nsp; ++i) {
    int64_t dk = g.dilatedKernel(i), pb, pe;
    if (ap == "VALID") {
      pb = pe = 0;
    } else if (!transposed && same) {
      int64_t total = std::max<int64_t>(0, (g.out[i] - 1) * g.strides[i] + dk - g.in[i]);
      pb = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else if (transposed && (same || op.attrs.has("output_shape"))) {
      int64_t total = g.strides[i] * (g.in[i] - 1) + outPad[i] + dk - g.out[i];
      // Floor division: a negative total (output_shape larger than natural) pads at the end.
      int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      pb = ap == "SAME_UPPER" ? half : total - half;
      pe = total - pb;
    } else {
      pb = pads[i];
      pe = pads[i + nsp];
    }
    g.padBegin[i] = pb;
    g.padEnd[i] = pe;
  }
  return g;
}

} // namespace popart::ir
