// Reference kernels: Conv, ConvTranspose and the pools, as plain loops over N-D windows.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"
#include "backend_cpu/reference/window.hpp"
#include "core/dispatch.hpp"

#include <cmath>
#include <functional>
#include <limits>

namespace popart::backend_cpu {

namespace {

std::vector<int64_t> weightKernel(const ir::Op &op) {
  const Shape &w = op.inInfo(1).shape();
  return std::vector<int64_t>(w.begin() + 2, w.end());
}

/// The window of the max pool fused into a Conv (fuseConvPool), from its input to output \p y.
Geom fusedPoolGeom(const ir::FusedPool &p, const Shape &y) {
  ir::WindowGeometry w;
  size_t nsp = p.kernel.size();
  w.in.assign(p.input.begin() + 2, p.input.end());
  w.out.assign(y.begin() + 2, y.end());
  w.kernel = p.kernel;
  w.strides = p.strides;
  w.dilations.assign(nsp, 1);
  w.padBegin.assign(p.pads.begin(), p.pads.begin() + static_cast<std::ptrdiff_t>(nsp));
  w.padEnd.assign(p.pads.begin() + static_cast<std::ptrdiff_t>(nsp), p.pads.end());
  return makeGeom(w);
}

std::unique_ptr<Kernel> createConv(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape(), y = ir::convResultShape(op);
  Geom g = makeGeom(op, x, y, weightKernel(op), false);
  ConvChannels ch = convChannels(op, x, y);
  bool bias = op.hasInput(2);
  // A FLOAT bias of a 16-bit convolution (mixed precision keeps biases FLOAT).
  bool floatBias = bias && op.inInfo(2).dataType() == DataType::FLOAT && op.inInfo(0).dataType() != DataType::FLOAT;
  const ir::FusedActivation act = op.fusion.activation; // fused by fuseRelu / fuseConvActivation
  bool residual = op.fusion.residual;                   // fused by fuseConvResidual
  ir::FusedPool pool;
  bool pooled = ir::fusedPool(op, pool); // fused by fuseConvPool: the convolution goes to a buffer
  Geom pg = pooled ? fusedPoolGeom(pool, op.outInfo(0).shape()) : Geom{};
  int64_t convElements = pooled ? shapeElementCount(y) : 0;
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    auto buffer = std::make_shared<std::vector<T>>(static_cast<size_t>(convElements));
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0), *W = a.in<T>(1);
      const void *B = bias ? a.inputs[2] : nullptr;
      const T *R = residual ? a.in<T>(3) : nullptr;
      T *Y = pooled ? buffer->data() : a.out<T>(0);
      forConvOutputs(g, ch, [&](int64_t o, const int64_t *oc, int64_t b, int64_t gi, int64_t mo) {
        int64_t mm = gi * ch.mg + mo;
        C acc = !B          ? C(0)
                : floatBias ? static_cast<C>(static_cast<const float *>(B)[mm])
                            : static_cast<C>(static_cast<const T *>(B)[mm]);
        const T *xb = X + (b * ch.c + gi * ch.cg) * g.inSize;
        const T *wb = W + mm * ch.cg * g.kSize;
        forWindow(g, oc, [&](int64_t kf, int64_t inf) {
          for (int64_t ci = 0; ci < ch.cg; ++ci)
            acc += static_cast<C>(xb[ci * g.inSize + inf]) * static_cast<C>(wb[ci * g.kSize + kf]);
        });
        const int64_t at = (b * ch.m + mm) * g.outSize + o;
        if (R) acc = static_cast<C>(static_cast<T>(acc)) + static_cast<C>(R[at]); // the Add, in T as unfused
        // The activation of the value the unfused graph stores, in T as unfused.
        Y[at] = act.kind == ir::FusedActivation::Kind::None
                    ? static_cast<T>(acc)
                    : static_cast<T>(act.apply(static_cast<C>(static_cast<T>(acc))));
      });
      if (!pooled) return;
      T *P = a.out<T>(0);
      int64_t oc[kMaxSpatial];
      for (int64_t p = 0; p < ch.n * ch.m; ++p)
        for (int64_t o = 0; o < pg.outSize; ++o) {
          outCoords(pg, o, oc);
          C best = std::numeric_limits<C>::lowest();
          forWindow(pg, oc,
                    [&](int64_t, int64_t inf) { best = std::max(best, static_cast<C>(Y[p * pg.inSize + inf])); });
          P[p * pg.outSize + o] = static_cast<T>(best);
        }
    });
  });
}

/// ConvTranspose as a gather: output o takes input i where o = i*s - pb + k*d.
std::unique_ptr<Kernel> createConvTranspose(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  Geom g = makeGeom(op, x, y, weightKernel(op), true);
  ConvChannels ch = convChannels(op, x, y);
  bool bias = op.hasInput(2);
  // A FLOAT bias of a 16-bit convolution (mixed precision keeps biases FLOAT).
  bool floatBias = bias && op.inInfo(2).dataType() == DataType::FLOAT && op.inInfo(0).dataType() != DataType::FLOAT;
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0), *W = a.in<T>(1);
      const void *B = bias ? a.inputs[2] : nullptr;
      T *Y = a.out<T>(0);
      int64_t j[kMaxSpatial];
      forConvOutputs(g, ch, [&](int64_t o, const int64_t *oc, int64_t b, int64_t gi, int64_t mo) {
        int64_t mm = gi * ch.mg + mo;
        C acc = !B          ? C(0)
                : floatBias ? static_cast<C>(static_cast<const float *>(B)[mm])
                            : static_cast<C>(static_cast<const T *>(B)[mm]);
        for (int i = 0; i < g.nsp; ++i)
          j[i] = 0;
        for (int64_t kf = 0; kf < g.kSize; ++kf) {
          int64_t inf = 0;
          bool ok = true;
          for (int i = 0; i < g.nsp && ok; ++i) {
            int64_t num = oc[i] + g.pb[i] - j[i] * g.d[i];
            if (num < 0 || num % g.s[i] != 0 || num / g.s[i] >= g.in[i])
              ok = false;
            else
              inf += (num / g.s[i]) * g.inStride[i];
          }
          if (ok)
            for (int64_t ci = 0; ci < ch.cg; ++ci) {
              int64_t cc = gi * ch.cg + ci;
              acc += static_cast<C>(X[(b * ch.c + cc) * g.inSize + inf]) *
                     static_cast<C>(W[(cc * ch.mg + mo) * g.kSize + kf]);
            }
          for (int i = g.nsp - 1; i >= 0; --i) {
            if (++j[i] < g.k[i]) break;
            j[i] = 0;
          }
        }
        Y[(b * ch.m + mm) * g.outSize + o] = static_cast<T>(acc);
      });
    });
  });
}

std::unique_ptr<Kernel> createMaxPool(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  Geom g = makeGeom(op, x, y, op.attrs.getInts("kernel_shape"), false);
  int64_t planes = x[0] * x[1];
  bool colMajor = op.attrs.getInt("storage_order", 0) == 1;
  Dims colStride{};
  for (int i = 0, s = 1; i < g.nsp; ++i) {
    colStride[i] = s;
    s *= static_cast<int>(g.in[i]);
  }
  return dispatchNumeric(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0);
      T *Y = a.out<T>(0);
      int64_t *I = a.hasOutput(1) ? a.out<int64_t>(1) : nullptr;
      int64_t oc[kMaxSpatial];
      for (int64_t o = 0; o < g.outSize; ++o) {
        outCoords(g, o, oc);
        for (int64_t p = 0; p < planes; ++p) {
          const T *xp = X + p * g.inSize;
          const auto [best, bestAt] = windowArgMax<C>(g, oc, xp);
          Y[p * g.outSize + o] = static_cast<T>(best);
          if (I) {
            int64_t idx = bestAt;
            if (colMajor && bestAt >= 0) {
              idx = 0;
              for (int i = 0; i < g.nsp; ++i)
                idx += (bestAt / g.inStride[i] % g.in[i]) * colStride[i];
            }
            I[p * g.outSize + o] = p * g.inSize + idx;
          }
        }
      }
    });
  });
}

/// AveragePool and LpPool.
std::unique_ptr<Kernel> createAvgLpPool(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  Geom g = makeGeom(op, x, y, op.attrs.getInts("kernel_shape"), false);
  int64_t planes = x[0] * x[1];
  bool lp = op.type == "LpPool";
  bool includePad = op.attrs.getInt("count_include_pad", 0) != 0;
  double p = static_cast<double>(op.attrs.getInt("p", 2));
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0);
      T *Y = a.out<T>(0);
      int64_t oc[kMaxSpatial];
      for (int64_t o = 0; o < g.outSize; ++o) {
        outCoords(g, o, oc);
        int64_t padded = includePad ? paddedWindowCount(g, oc) : 0;
        for (int64_t pl = 0; pl < planes; ++pl) {
          const T *xp = X + pl * g.inSize;
          C acc = 0;
          int64_t count = 0;
          forWindow(g, oc, [&](int64_t, int64_t inf) {
            C v = static_cast<C>(xp[inf]);
            acc += lp ? static_cast<C>(std::pow(std::fabs(v), p)) : v;
            ++count;
          });
          C r;
          if (lp)
            r = static_cast<C>(std::pow(acc, 1.0 / p));
          else {
            int64_t div = includePad ? padded : count;
            r = div > 0 ? acc / static_cast<C>(div) : std::numeric_limits<C>::quiet_NaN();
          }
          Y[pl * g.outSize + o] = static_cast<T>(r);
        }
      }
    });
  });
}

std::unique_ptr<Kernel> createGlobalPool(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t planes = x[0] * x[1];
  int64_t size = 1;
  for (size_t i = 2; i < x.size(); ++i)
    size *= x[i];
  int kind = op.type == "GlobalAveragePool" ? 0 : op.type == "GlobalMaxPool" ? 1 : 2;
  double p = static_cast<double>(op.attrs.getInt("p", 2));
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0);
      T *Y = a.out<T>(0);
      for (int64_t pl = 0; pl < planes; ++pl) {
        const T *xp = X + pl * size;
        C acc = kind == 1 ? -std::numeric_limits<C>::infinity() : C(0);
        for (int64_t i = 0; i < size; ++i) {
          C v = static_cast<C>(xp[i]);
          if (kind == 0)
            acc += v;
          else if (kind == 1)
            acc = v > acc ? v : acc;
          else
            acc += static_cast<C>(std::pow(std::fabs(v), p));
        }
        if (kind == 0) acc = size > 0 ? acc / static_cast<C>(size) : std::numeric_limits<C>::quiet_NaN();
        if (kind == 2) acc = static_cast<C>(std::pow(acc, 1.0 / p));
        Y[pl] = static_cast<T>(acc);
      }
    });
  });
}

} // namespace

void registerReferenceConvPoolKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "Conv", KernelProvider::Reference, nullptr, createConv});
  r.add({"ai.onnx", "ConvTranspose", KernelProvider::Reference, nullptr, createConvTranspose});
  r.add({"ai.onnx", "MaxPool", KernelProvider::Reference, nullptr, createMaxPool});
  r.add({"ai.onnx", "AveragePool", KernelProvider::Reference, nullptr, createAvgLpPool});
  r.add({"ai.onnx", "LpPool", KernelProvider::Reference, nullptr, createAvgLpPool});
  for (const char *t : {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
    r.add({"ai.onnx", t, KernelProvider::Reference, nullptr, createGlobalPool});
}

} // namespace popart::backend_cpu
