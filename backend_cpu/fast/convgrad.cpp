// Fast kernels of the convolution and pooling gradients: the depthwise f32 ConvWeightGrad
// (vec::depthwiseWeightGrad, threaded over channels) and the f32 MaxPoolGrad over windows that
// tile the plane (vec::maxPoolGradPlane, one pass per plane with its fused Relu gradient; the
// predicate tiledMaxPoolGrad is in fast/convpool.cpp beside tiledMaxPool's, sharing its window test).

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"
#include "backend_cpu/reference/window.hpp"

#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

std::vector<int64_t> spatialOf(const Shape &s) { return std::vector<int64_t>(s.begin() + 2, s.end()); }

/// Why the fast depthwise ConvWeightGrad declines \p op; empty if it takes it.
std::string whyNotDepthwiseWeightGrad(const ir::Op &op) {
  if (op.type != "ConvWeightGrad") return "not a ConvWeightGrad";
  if (op.inInfo(0).dataType() != DataType::FLOAT) return "not f32";
  if (op.inInfo(0).rank() != 4) return "not 2-D";
  const Shape &x = op.inInfo(1).shape(), &w = op.outInfo(0).shape(), &dy = op.inInfo(0).shape();
  int64_t group = op.attrs.getInt("group", 1);
  if (group != x[1] || w[1] != 1 || w[0] != group) return "not depthwise (one input and output channel per group)";
  Geom g = makeGeom(op, x, dy, spatialOf(w), false);
  for (int i = 0; i < 2; ++i) {
    if (g.d[i] != 1) return "dilated";
    if (g.pb[i] < 0 || g.pe[i] < 0) return "negative pads";
  }
  return {};
}

Support supportsDepthwiseWeightGrad(const ir::Op &op) { return Support::unless(whyNotDepthwiseWeightGrad(op)); }

std::unique_ptr<Kernel> createDepthwiseWeightGrad(const ir::Op &op) {
  const Shape &dy = op.inInfo(0).shape(), &x = op.inInfo(1).shape(), &w = op.outInfo(0).shape();
  Geom g = makeGeom(op, x, dy, spatialOf(w), false);
  // Threads over channels, each summing its batch in order: the same bits at any thread count.
  int64_t batch = x[0], channels = x[1], inSize = g.inSize, outSize = g.outSize, taps = g.kSize;
  int64_t scratch = vec::depthwiseWeightGradScratch(g.out[0], g.out[1], g.k[0], g.k[1], g.s[0], g.s[1]);
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    const float *dY = a.in<float>(0), *X = a.in<float>(1);
    float *dW = a.out<float>(0);
#pragma omp parallel
    {
      thread_local std::vector<float> buffer; // grows on the first run only
      if (buffer.size() < static_cast<size_t>(scratch)) buffer.resize(static_cast<size_t>(scratch));
#pragma omp for schedule(static)
      for (int64_t c = 0; c < channels; ++c)
        vec::depthwiseWeightGrad(X + c * inSize, channels * inSize, dY + c * outSize, channels * outSize, batch,
                                 dW + c * taps, g.in[0], g.in[1], g.out[0], g.out[1], g.k[0], g.k[1], g.s[0], g.s[1],
                                 g.pb[0], g.pb[1], buffer.data());
    }
  });
}

Support supportsTiledMaxPoolGrad(const ir::Op &op) {
  if (tiledMaxPoolGrad(op)) return Support::yes();
  return Support::no("not f32 2-D windows that tile the input (stride >= kernel, no padding or dilation, each "
                     "window inside X)");
}

/// MaxPoolGrad(X, dY); with a fused Relu (fuseMaxPoolGradRelu) dX is zero where X is not > 0.
std::unique_ptr<Kernel> createTiledMaxPoolGrad(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape(), &dy = op.inInfo(1).shape();
  std::vector<int64_t> k = op.attrs.getInts("kernel_shape"), s = op.attrs.getInts("strides");
  int64_t planes = x[0] * x[1], h = x[2], w = x[3], oh = dy[2], ow = dy[3];
  bool relu = op.fusion.relu();
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    const float *X = a.in<float>(0), *dY = a.in<float>(1);
    float *dX = a.out<float>(0);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < planes; ++p)
      vec::maxPoolGradPlane(X + p * h * w, dY + p * oh * ow, dX + p * h * w, h, w, oh, ow, k[0], k[1], s[0], s[1],
                            relu);
  });
}

} // namespace

bool depthwiseWeightGrad(const ir::Op &op) { return whyNotDepthwiseWeightGrad(op).empty(); }

void registerFastConvGradKernels(KernelRegistry &r) {
  r.add(
      {"ai.graphcore", "ConvWeightGrad", KernelProvider::Fast, supportsDepthwiseWeightGrad, createDepthwiseWeightGrad});
  r.add({"ai.graphcore", "MaxPoolGrad", KernelProvider::Fast, supportsTiledMaxPoolGrad, createTiledMaxPoolGrad});
}

} // namespace popart::backend_cpu
