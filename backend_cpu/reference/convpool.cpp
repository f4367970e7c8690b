// Reference kernels: Conv, ConvTranspose and the pools, as plain loops over N-D windows.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"
#include "core/dispatch.hpp"

#include <array>
#include <cmath>
#include <functional>
#include <limits>

namespace popart::backend_cpu {

namespace {

constexpr int kMaxSpatial = 8;
using Dims = std::array<int64_t, kMaxSpatial>;

/// The sliding-window geometry of one op, with the padding resolved from its attributes and the
/// output shape that setup inferred.
struct Geom {
  int nsp = 0;
  Dims in{}, out{}, k{}, s{}, d{}, pb{}, pe{};
  Dims inStride{}, outStride{}, kStride{};
  int64_t inSize = 1, outSize = 1, kSize = 1;
};

Geom makeGeom(const ir::Op &op, const Shape &x, const Shape &y, const std::vector<int64_t> &kernel, bool transposed) {
  Geom g;
  size_t nsp = x.size() - 2;
  if (nsp > kMaxSpatial) throw error(op.debugName(), ": at most ", kMaxSpatial, " spatial axes are supported");
  g.nsp = static_cast<int>(nsp);
  auto strides = op.attrs.getInts("strides", std::vector<int64_t>(nsp, 1));
  auto dil = op.attrs.getInts("dilations", std::vector<int64_t>(nsp, 1));
  auto pads = op.attrs.getInts("pads", std::vector<int64_t>(2 * nsp, 0));
  auto outPad = op.attrs.getInts("output_padding", std::vector<int64_t>(nsp, 0));
  std::string ap = op.attrs.getString("auto_pad", "NOTSET");
  bool same = ap == "SAME_UPPER" || ap == "SAME_LOWER";
  for (size_t i = 0; i < nsp; ++i) {
    g.in[i] = x[i + 2];
    g.out[i] = y[i + 2];
    g.k[i] = kernel[i];
    g.s[i] = strides[i];
    g.d[i] = dil[i];
    int64_t dk = (kernel[i] - 1) * dil[i] + 1;
    if (ap == "VALID") {
      g.pb[i] = g.pe[i] = 0;
    } else if (!transposed && same) {
      int64_t total = std::max<int64_t>(0, (g.out[i] - 1) * g.s[i] + dk - g.in[i]);
      g.pb[i] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      g.pe[i] = total - g.pb[i];
    } else if (transposed && (same || op.attrs.has("output_shape"))) {
      int64_t total = g.s[i] * (g.in[i] - 1) + outPad[i] + dk - g.out[i];
      // Floor division: a negative total (output_shape larger than natural) pads at the end.
      int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      g.pb[i] = ap == "SAME_UPPER" ? half : total - half;
      g.pe[i] = total - g.pb[i];
    } else {
      g.pb[i] = pads[i];
      g.pe[i] = pads[i + nsp];
    }
  }
  for (int i = g.nsp - 1; i >= 0; --i) {
    g.inStride[i] = g.inSize;
    g.outStride[i] = g.outSize;
    g.kStride[i] = g.kSize;
    g.inSize *= g.in[i];
    g.outSize *= g.out[i];
    g.kSize *= g.k[i];
  }
  return g;
}

/// Spatial coordinates of flat output index \p o.
inline void outCoords(const Geom &g, int64_t o, int64_t *oc) {
  for (int i = 0; i < g.nsp; ++i) {
    oc[i] = o / g.outStride[i];
    o -= oc[i] * g.outStride[i];
  }
}

/// Calls f(kernelFlat, inputFlat) for each window position of output coordinates \p oc that lies
/// inside the (unpadded) input.
template <typename F> inline void forWindow(const Geom &g, const int64_t *oc, F &&f) {
  int64_t base[kMaxSpatial], lo[kMaxSpatial], hi[kMaxSpatial], j[kMaxSpatial];
  for (int i = 0; i < g.nsp; ++i) {
    base[i] = oc[i] * g.s[i] - g.pb[i];
    lo[i] = base[i] >= 0 ? 0 : (-base[i] + g.d[i] - 1) / g.d[i];
    if (base[i] > g.in[i] - 1) return;
    hi[i] = std::min(g.k[i] - 1, (g.in[i] - 1 - base[i]) / g.d[i]);
    if (lo[i] > hi[i]) return;
    j[i] = lo[i];
  }
  while (true) {
    int64_t kf = 0, inf = 0;
    for (int i = 0; i < g.nsp; ++i) {
      kf += j[i] * g.kStride[i];
      inf += (base[i] + j[i] * g.d[i]) * g.inStride[i];
    }
    f(kf, inf);
    int i = g.nsp - 1;
    for (; i >= 0; --i) {
      if (++j[i] <= hi[i]) break;
      j[i] = lo[i];
    }
    if (i < 0) return;
  }
}

/// Number of window positions of \p oc inside the padded input (count_include_pad).
inline int64_t paddedWindowCount(const Geom &g, const int64_t *oc) {
  int64_t count = 1;
  for (int i = 0; i < g.nsp; ++i) {
    int64_t base = oc[i] * g.s[i] - g.pb[i], c = 0;
    for (int64_t j = 0; j < g.k[i]; ++j) {
      int64_t p = base + j * g.d[i];
      if (p >= -g.pb[i] && p < g.in[i] + g.pe[i]) ++c;
    }
    count *= c;
  }
  return count;
}

std::vector<int64_t> weightKernel(const ir::Op &op) {
  const Shape &w = op.inInfo(1).shape();
  return std::vector<int64_t>(w.begin() + 2, w.end());
}

std::unique_ptr<Kernel> createConv(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  Geom g = makeGeom(op, x, y, weightKernel(op), false);
  int64_t group = op.attrs.getInt("group", 1);
  int64_t n = x[0], c = x[1], m = y[1], cg = c / group, mg = m / group;
  bool bias = op.hasInput(2);
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0), *W = a.in<T>(1), *B = bias ? a.in<T>(2) : nullptr;
      T *Y = a.out<T>(0);
      int64_t oc[kMaxSpatial];
      for (int64_t o = 0; o < g.outSize; ++o) {
        outCoords(g, o, oc);
        for (int64_t b = 0; b < n; ++b)
          for (int64_t gi = 0; gi < group; ++gi)
            for (int64_t mo = 0; mo < mg; ++mo) {
              int64_t mm = gi * mg + mo;
              C acc = B ? static_cast<C>(B[mm]) : C(0);
              const T *xb = X + (b * c + gi * cg) * g.inSize;
              const T *wb = W + mm * cg * g.kSize;
              forWindow(g, oc, [&](int64_t kf, int64_t inf) {
                for (int64_t ci = 0; ci < cg; ++ci)
                  acc += static_cast<C>(xb[ci * g.inSize + inf]) * static_cast<C>(wb[ci * g.kSize + kf]);
              });
              Y[(b * m + mm) * g.outSize + o] = static_cast<T>(acc);
            }
      }
    });
  });
}

/// ConvTranspose as a gather: output o takes input i where o = i*s - pb + k*d.
std::unique_ptr<Kernel> createConvTranspose(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  Geom g = makeGeom(op, x, y, weightKernel(op), true);
  int64_t group = op.attrs.getInt("group", 1);
  int64_t n = x[0], c = x[1], m = y[1], cg = c / group, mg = m / group;
  bool bias = op.hasInput(2);
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0), *W = a.in<T>(1), *B = bias ? a.in<T>(2) : nullptr;
      T *Y = a.out<T>(0);
      int64_t oc[kMaxSpatial], j[kMaxSpatial];
      for (int64_t o = 0; o < g.outSize; ++o) {
        outCoords(g, o, oc);
        for (int64_t b = 0; b < n; ++b)
          for (int64_t gi = 0; gi < group; ++gi)
            for (int64_t mo = 0; mo < mg; ++mo) {
              int64_t mm = gi * mg + mo;
              C acc = B ? static_cast<C>(B[mm]) : C(0);
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
                  for (int64_t ci = 0; ci < cg; ++ci) {
                    int64_t cc = gi * cg + ci;
                    acc += static_cast<C>(X[(b * c + cc) * g.inSize + inf]) *
                           static_cast<C>(W[(cc * mg + mo) * g.kSize + kf]);
                  }
                for (int i = g.nsp - 1; i >= 0; --i) {
                  if (++j[i] < g.k[i]) break;
                  j[i] = 0;
                }
              }
              Y[(b * m + mm) * g.outSize + o] = static_cast<T>(acc);
            }
      }
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
          C best = std::numeric_limits<C>::lowest();
          int64_t bestAt = -1;
          forWindow(g, oc, [&](int64_t, int64_t inf) {
            C v = static_cast<C>(xp[inf]);
            if (bestAt < 0 || v > best) {
              best = v;
              bestAt = inf;
            }
          });
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
