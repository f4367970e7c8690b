// Reference kernels of the convolution and pooling gradient ops (ir/ops/convgrad.cpp):
// scatter-adds over the forward windows. Sums are kept in the compute type: straight into the
// output for float and double, in scratch made at creation for the 16-bit types.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"
#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/reference/window.hpp"
#include "core/dispatch.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace popart::backend_cpu {

namespace {

std::vector<int64_t> spatialOf(const Shape &s) { return std::vector<int64_t>(s.begin() + 2, s.end()); }

/// Where a kernel of element type T sums: the output itself, or scratch of the compute type.
template <typename T> class Sums {
public:
  using C = compute_t<T>;
  explicit Sums(int64_t size) : size_(size) {
    if constexpr (!std::is_same_v<T, C>) scratch_ = std::make_shared<std::vector<C>>(static_cast<size_t>(size));
  }
  /// Zeroed storage for the sums of output \p out.
  C *begin(T *out) const {
    C *p;
    if constexpr (std::is_same_v<T, C>)
      p = out;
    else
      p = scratch_->data();
    std::fill(p, p + size_, C(0));
    return p;
  }
  void finish(T *out) const {
    if constexpr (!std::is_same_v<T, C>)
      for (int64_t i = 0; i < size_; ++i)
        out[i] = static_cast<T>((*scratch_)[static_cast<size_t>(i)]);
  }

private:
  int64_t size_;
  std::shared_ptr<std::vector<C>> scratch_; // shared: the loop is copied into a std::function
};

/// ConvDataGrad (\p weights false): dX[b, c, i] = Σ dY[b, m, o] · W[m, c - group offset, k] over
/// the windows (o, k) that read i. ConvWeightGrad (\p weights true): dW[m, c, k] = Σ dY[b, m, o] ·
/// X[b, c + group offset, i(o, k)] over batch and output positions. Input 1 is W or X.
template <bool weights> std::unique_ptr<Kernel> createConvGrad(const ir::Op &op) {
  const Shape &dy = op.inInfo(0).shape(), &in1 = op.inInfo(1).shape(), &out = op.outInfo(0).shape();
  const Shape &x = weights ? in1 : out, &w = weights ? out : in1;
  Geom g = makeGeom(op, x, dy, spatialOf(w), false);
  if constexpr (weights)
    if (depthwiseWeightGrad(op)) {
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
                                     dW + c * taps, g.in[0], g.in[1], g.out[0], g.out[1], g.k[0], g.k[1], g.s[0],
                                     g.s[1], g.pb[0], g.pb[1], buffer.data());
        }
      });
    }
  ConvChannels ch = convChannels(op, x, dy);
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    Sums<T> sums(shapeElementCount(out));
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *dY = a.in<T>(0), *other = a.in<T>(1);
      C *sum = sums.begin(a.out<T>(0));
      forConvOutputs(g, ch, [&](int64_t o, const int64_t *oc, int64_t b, int64_t gi, int64_t mo) {
        int64_t mm = gi * ch.mg + mo;
        C gy = static_cast<C>(dY[(b * ch.m + mm) * g.outSize + o]);
        int64_t xb = (b * ch.c + gi * ch.cg) * g.inSize, wb = mm * ch.cg * g.kSize;
        forWindow(g, oc, [&](int64_t kf, int64_t inf) {
          for (int64_t ci = 0; ci < ch.cg; ++ci) {
            int64_t xi = xb + ci * g.inSize + inf, wi = wb + ci * g.kSize + kf;
            if constexpr (weights)
              sum[wi] += gy * static_cast<C>(other[xi]);
            else
              sum[xi] += gy * static_cast<C>(other[wi]);
          }
        });
      });
      sums.finish(a.out<T>(0));
    });
  });
}

/// Each output's gradient, divided by its window's count, goes to every input of the window.
std::unique_ptr<Kernel> createAveragePoolGrad(const ir::Op &op) {
  const Shape &dy = op.inInfo(0).shape(), &x = op.outInfo(0).shape();
  Geom g = makeGeom(op, x, dy, op.attrs.getInts("kernel_shape"), false);
  int64_t planes = x[0] * x[1];
  bool includePad = op.attrs.getInt("count_include_pad", 0) != 0;
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    Sums<T> sums(shapeElementCount(x));
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *dY = a.in<T>(0);
      C *dX = sums.begin(a.out<T>(0));
      int64_t oc[kMaxSpatial];
      for (int64_t o = 0; o < g.outSize; ++o) {
        outCoords(g, o, oc);
        int64_t count = 0;
        if (includePad)
          count = paddedWindowCount(g, oc);
        else
          forWindow(g, oc, [&](int64_t, int64_t) { ++count; });
        if (count == 0) continue; // the forward output is NaN: no input contributed
        for (int64_t pl = 0; pl < planes; ++pl) {
          C share = static_cast<C>(dY[pl * g.outSize + o]) / static_cast<C>(count);
          C *xp = dX + pl * g.inSize;
          forWindow(g, oc, [&](int64_t, int64_t inf) { xp[inf] += share; });
        }
      }
      sums.finish(a.out<T>(0));
    });
  });
}

/// Each output's gradient goes to the first maximum of its window, in window order: the
/// comparison is the forward MaxPool's, so ties (and NaNs) resolve as its Indices do. Windows
/// wholly in the padding took no input and pass nothing on.
/// MaxPoolGrad(X, dY); with a fused Relu (fuseMaxPoolGradRelu) X is a Relu's
/// output and dX is also the Relu's input gradient: zero where X is not > 0.
std::unique_ptr<Kernel> createMaxPoolGrad(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape(), &dy = op.inInfo(1).shape();
  Geom g = makeGeom(op, x, dy, op.attrs.getInts("kernel_shape"), false);
  int64_t planes = x[0] * x[1];
  bool relu = op.fusion.relu();
  if (tiledMaxPoolGrad(op)) {
    std::vector<int64_t> k = op.attrs.getInts("kernel_shape"), s = op.attrs.getInts("strides");
    int64_t h = x[2], w = x[3], oh = dy[2], ow = dy[3];
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const float *X = a.in<float>(0), *dY = a.in<float>(1);
      float *dX = a.out<float>(0);
#pragma omp parallel for schedule(static)
      for (int64_t p = 0; p < planes; ++p)
        vec::maxPoolGradPlane(X + p * h * w, dY + p * oh * ow, dX + p * h * w, h, w, oh, ow, k[0], k[1], s[0], s[1],
                              relu);
    });
  }
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    Sums<T> sums(shapeElementCount(x));
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0), *dY = a.in<T>(1);
      C *dX = sums.begin(a.out<T>(0));
      int64_t oc[kMaxSpatial];
      for (int64_t o = 0; o < g.outSize; ++o) {
        outCoords(g, o, oc);
        for (int64_t p = 0; p < planes; ++p) {
          const T *xp = X + p * g.inSize;
          C best = std::numeric_limits<C>::lowest();
          int64_t bestAt = -1;
          forWindow(g, oc, [&](int64_t, int64_t inf) {
            C v = static_cast<C>(xp[inf]);
            if (bestAt < 0 || v > best) {
              best = v;
              bestAt = inf;
            }
          });
          if (bestAt >= 0) dX[p * g.inSize + bestAt] += static_cast<C>(dY[p * g.outSize + o]);
        }
      }
      if (relu)
        for (int64_t i = 0; i < planes * g.inSize; ++i)
          if (!(static_cast<C>(X[i]) > C(0))) dX[i] = C(0);
      sums.finish(a.out<T>(0));
    });
  });
}

} // namespace

namespace {
bool tiledWindows(const ir::Op &op) {
  if (op.inInfo(0).dataType() != DataType::FLOAT || op.inInfo(0).rank() != 4) return false;
  std::vector<int64_t> k = op.attrs.getInts("kernel_shape", {}), s = op.attrs.getInts("strides", {});
  std::vector<int64_t> d = op.attrs.getInts("dilations", {1, 1}), pads = op.attrs.getInts("pads", {0, 0, 0, 0});
  if (k.size() != 2 || s.size() != 2) return false;
  for (size_t i = 0; i < 2; ++i)
    if (s[i] < k[i] || d[i] != 1) return false;
  return std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; });
}
} // namespace

bool depthwiseWeightGrad(const ir::Op &op) {
  if (op.type != "ConvWeightGrad" || op.inInfo(0).dataType() != DataType::FLOAT || op.inInfo(0).rank() != 4)
    return false;
  const Shape &x = op.inInfo(1).shape(), &w = op.outInfo(0).shape(), &dy = op.inInfo(0).shape();
  int64_t group = op.attrs.getInt("group", 1);
  if (group != x[1] || w[1] != 1 || w[0] != group) return false;
  Geom g = makeGeom(op, x, dy, spatialOf(w), false);
  for (int i = 0; i < 2; ++i)
    if (g.d[i] != 1 || g.pb[i] < 0 || g.pe[i] < 0) return false;
  return true;
}

bool tiledMaxPoolGrad(const ir::Op &op) { return op.type == "MaxPoolGrad" && tiledWindows(op); }

bool tiledMaxPool(const ir::Op &op) {
  if (op.type != "MaxPool" || op.hasOutput(1) || !op.hasOutput(0) || !tiledWindows(op)) return false;
  if (op.attrs.getString("auto_pad", "NOTSET") != "NOTSET") return false;
  // Every output window lies inside the input (floor rounding, or ceil that adds none).
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  std::vector<int64_t> k = op.attrs.getInts("kernel_shape"), s = op.attrs.getInts("strides");
  for (size_t i = 0; i < 2; ++i)
    if ((y[i + 2] - 1) * s[i] + k[i] > x[i + 2]) return false;
  return y[0] == x[0] && y[1] == x[1];
}

void registerReferenceConvGradKernels(KernelRegistry &r) {
  r.add({"ai.graphcore", "ConvDataGrad", KernelProvider::Reference, nullptr, createConvGrad<false>});
  r.add({"ai.graphcore", "ConvWeightGrad", KernelProvider::Reference, nullptr, createConvGrad<true>});
  r.add({"ai.graphcore", "AveragePoolGrad", KernelProvider::Reference, nullptr, createAveragePoolGrad});
  r.add({"ai.graphcore", "MaxPoolGrad", KernelProvider::Reference, nullptr, createMaxPoolGrad});
}

} // namespace popart::backend_cpu
