// Fast kernels of the pools: f32 MaxPool over 2-D windows that tile the plane, one vectorised
// pass per plane (vec::maxPoolPlane). The window test (ir::whyWindowsDoNotTile) is shared with
// MaxPoolGrad's fast kernel (fast/convgrad.cpp), whose predicate tiledMaxPoolGrad is defined here
// beside tiledMaxPool, and with fuseMaxPoolGradRelu.

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"
#include "ir/ops/window.hpp"

#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// Why the fast MaxPool declines \p op; empty if it takes it.
std::string whyNotTiledMaxPool(const ir::Op &op) {
  if (op.type != "MaxPool") return "not a MaxPool";
  if (op.hasOutput(1)) return "it gives no Indices";
  if (!op.hasOutput(0)) return "no output Y";
  if (op.inInfo(0).dataType() != DataType::FLOAT) return "not f32";
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  if (std::string why = ir::whyWindowsDoNotTile(op, y); !why.empty()) return why;
  if (op.attrs.getString("auto_pad", "NOTSET") != "NOTSET") return "auto_pad";
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
  // Every window of dY inside X, too: vec::maxPoolGradPlane would read and write beyond the plane.
  return op.type == "MaxPoolGrad" && op.hasInput(0) && op.hasInput(1) && op.inInfo(0).dataType() == DataType::FLOAT &&
         ir::whyWindowsDoNotTile(op, op.inInfo(1).shape()).empty();
}

void registerFastConvPoolKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "MaxPool", KernelProvider::Fast, supportsTiledMaxPool, createTiledMaxPool});
}

} // namespace popart::backend_cpu
