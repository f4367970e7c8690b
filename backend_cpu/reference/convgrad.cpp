// Reference kernels of the convolution and pooling gradient ops (ir/ops/convgrad.cpp):
// scatter-adds over the forward windows. Sums are kept in the compute type: straight into the
// output for float and double, in scratch made at creation for the 16-bit types.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"
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
          const auto [best, bestAt] = windowArgMax<C>(g, oc, xp);
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

void registerReferenceConvGradKernels(KernelRegistry &r) {
  r.add({"ai.graphcore", "ConvDataGrad", KernelProvider::Reference, nullptr, createConvGrad<false>});
  r.add({"ai.graphcore", "ConvWeightGrad", KernelProvider::Reference, nullptr, createConvGrad<true>});
  r.add({"ai.graphcore", "AveragePoolGrad", KernelProvider::Reference, nullptr, createAveragePoolGrad});
  r.add({"ai.graphcore", "MaxPoolGrad", KernelProvider::Reference, nullptr, createMaxPoolGrad});
}

} // namespace popart::backend_cpu
