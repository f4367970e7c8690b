// Fast kernels of the pools: f32 MaxPool over 2-D windows that tile the plane, one vectorised
// pass per plane (vec::maxPoolPlane). The window test is shared with MaxPoolGrad's fast kernel
// (fast/convgrad.cpp), whose predicate tiledMaxPoolGrad is defined here beside tiledMaxPool.

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// Why the windows of pool (or pool gradient) \p op do not tile its f32 NCHW planes without
/// overlap, padding or dilation (stride >= kernel); empty if they do.
std::string whyWindowsDoNotTile(const ir::Op &op) {
  if (op.inInfo(0).dataType() != DataType::FLOAT) return "not f32";
  if (op.inInfo(0).rank() != 4) return "not 2-D";
  std::vector<int64_t> k = op.attrs.getInts("kernel_shape", {}), s = op.attrs.getInts("strides", {});
  std::vector<int64_t> d = op.attrs.getInts("dilations", {1, 1}), pads = op.attrs.getInts("pads", {0, 0, 0, 0});
  if (k.size() != 2 || s.size() != 2) return "no 2-D kernel_shape and strides";
  for (size_t i = 0; i < 2; ++i) {
    if (s[i] < k[i]) return "overlapping windows (a stride below the kernel)";
    if (d[i] != 1) return "dilated windows";
  }
  if (!std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) return "padded windows";
  return {};
}

/// Why the fast MaxPool declines \p op; empty if it takes it.
std::string whyNotTiledMaxPool(const ir::Op &op) {
  if (op.type != "MaxPool") return "not a MaxPool";
  if (op.hasOutput(1)) return "it gives no Indices";
  if (!op.hasOutput(0)) return "no output Y";
  if (std::string why = whyWindowsDoNotTile(op); !why.empty()) return why;
  if (op.attrs.getString("auto_pad", "NOTSET") != "NOTSET") return "auto_pad";
  // Every output window lies inside the input (floor rounding, or ceil that adds none).
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  std::vector<int64_t> k = op.attrs.getInts("kernel_shape"), s = op.attrs.getInts("strides");
  for (size_t i = 0; i < 2; ++i)
    if ((y[i + 2] - 1) * s[i] + k[i] > x[i + 2]) return "a window (ceil_mode) reaches past the input";
  if (y[0] != x[0] || y[1] != x[1]) return "batch or channels differ between X and Y";
  return {};
}

Support supportsTiledMaxPool(const ir::Op &op) { return Support::unless(whyNotTiledMaxPool(op)); }

std::unique_ptr<Kernel> createTiledMaxPool(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  std::vector<int64_t> k = op.attrs.getInts("kernel_shape"), s = op.attrs.getInts("strides");
  int64_t planes = x[0] * x[1], h = x[2], w = x[3], oh = y[2], ow = y[3];
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    const float *X = a.in<float>(0);
    float *Y = a.out<float>(0);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < planes; ++p)
      vec::maxPoolPlane(X + p * h * w, Y + p * oh * ow, h, w, oh, ow, k[0], k[1], s[0], s[1]);
  });
}

} // namespace

bool tiledMaxPool(const ir::Op &op) { return whyNotTiledMaxPool(op).empty(); }

bool tiledMaxPoolGrad(const ir::Op &op) {
  if (op.type != "MaxPoolGrad" || !whyWindowsDoNotTile(op).empty()) return false;
  // Every window of dY lies inside X: dY's shape carries the forward's ceil_mode, whose last
  // window may reach past the input (vec::maxPoolGradPlane would read and write beyond the plane).
  const Shape &x = op.inInfo(0).shape(), &dy = op.inInfo(1).shape();
  std::vector<int64_t> k = op.attrs.getInts("kernel_shape"), s = op.attrs.getInts("strides");
  for (size_t i = 0; i < 2; ++i)
    if ((dy[i + 2] - 1) * s[i] + k[i] > x[i + 2]) return false;
  return true;
}

void registerFastConvPoolKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "MaxPool", KernelProvider::Fast, supportsTiledMaxPool, createTiledMaxPool});
}

} // namespace popart::backend_cpu
