#pragma once
// Loops over N-D sliding windows for the reference Conv, pool and grad-op kernels. The geometry
// itself (padding resolved from the attributes) comes from ir::resolveWindow.

#include "ir/ops/window.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <utility>

namespace popart::backend_cpu {

constexpr int kMaxSpatial = 8;
using Dims = std::array<int64_t, kMaxSpatial>;

/// ir::WindowGeometry in fixed arrays, with the row-major strides of the spatial blocks.
struct Geom {
  int nsp = 0;
  Dims in{}, out{}, k{}, s{}, d{}, pb{}, pe{};
  Dims inStride{}, outStride{}, kStride{};
  int64_t inSize = 1, outSize = 1, kSize = 1;
};

/// The loop geometry of resolved window \p w.
inline Geom makeGeom(const ir::WindowGeometry &w) {
  size_t nsp = w.in.size();
  Geom g;
  g.nsp = static_cast<int>(nsp);
  for (size_t i = 0; i < nsp; ++i) {
    g.in[i] = w.in[i];
    g.out[i] = w.out[i];
    g.k[i] = w.kernel[i];
    g.s[i] = w.strides[i];
    g.d[i] = w.dilations[i];
    g.pb[i] = w.padBegin[i];
    g.pe[i] = w.padEnd[i];
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

/// The geometry of \p op between full shapes \p x and \p y (see ir::resolveWindow).
inline Geom makeGeom(const ir::Op &op, const Shape &x, const Shape &y, const std::vector<int64_t> &kernel,
                     bool transposed) {
  size_t nsp = x.size() - 2;
  if (nsp > kMaxSpatial) throw error(op.debugName(), ": at most ", kMaxSpatial, " spatial axes are supported");
  return makeGeom(ir::resolveWindow(op, x, y, kernel, transposed));
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
  // A local count (makeGeom keeps it within kMaxSpatial): f cannot change it between the loops.
  const int nsp = std::min(g.nsp, kMaxSpatial);
  int64_t base[kMaxSpatial], lo[kMaxSpatial], hi[kMaxSpatial], j[kMaxSpatial];
  for (int i = 0; i < nsp; ++i) {
    base[i] = oc[i] * g.s[i] - g.pb[i];
    lo[i] = base[i] >= 0 ? 0 : (-base[i] + g.d[i] - 1) / g.d[i];
    if (base[i] > g.in[i] - 1) return;
    hi[i] = std::min(g.k[i] - 1, (g.in[i] - 1 - base[i]) / g.d[i]);
    if (lo[i] > hi[i]) return;
    j[i] = lo[i];
  }
  while (true) {
    int64_t kf = 0, inf = 0;
    for (int i = 0; i < nsp; ++i) {
      kf += j[i] * g.kStride[i];
      inf += (base[i] + j[i] * g.d[i]) * g.inStride[i];
    }
    f(kf, inf);
    int i = nsp - 1;
    for (; i >= 0; --i) {
      if (++j[i] <= hi[i]) break;
      j[i] = lo[i];
    }
    if (i < 0) return;
  }
}

/// The largest of \p xp over the window of output coordinates \p oc, converted to C, and its
/// flat input index (the first one on ties); index -1 and C's lowest value for an empty window.
template <typename C, typename T>
inline std::pair<C, int64_t> windowArgMax(const Geom &g, const int64_t *oc, const T *xp) {
  C best = std::numeric_limits<C>::lowest();
  int64_t bestAt = -1;
  forWindow(g, oc, [&](int64_t, int64_t inf) {
    C v = static_cast<C>(xp[inf]);
    if (bestAt < 0 || v > best) {
      best = v;
      bestAt = inf;
    }
  });
  return {best, bestAt};
}

/// Batch and channel counts of a grouped convolution from input X and output Y (for the grad
/// ops, X and dY) and the group attribute.
struct ConvChannels {
  int64_t n = 0, c = 0, m = 0, group = 1, cg = 0, mg = 0;
};

inline ConvChannels convChannels(const ir::Op &op, const Shape &x, const Shape &y) {
  ConvChannels ch;
  ch.group = op.attrs.getInt("group", 1);
  ch.n = x[0];
  ch.c = x[1];
  ch.m = y[1];
  ch.cg = ch.c / ch.group;
  ch.mg = ch.m / ch.group;
  return ch;
}

/// Calls f(o, oc, b, gi, mo) for every output position o (spatial coordinates oc), batch b and
/// output channel mo of group gi, in that nesting.
template <typename F> inline void forConvOutputs(const Geom &g, const ConvChannels &ch, F &&f) {
  int64_t oc[kMaxSpatial];
  for (int64_t o = 0; o < g.outSize; ++o) {
    outCoords(g, o, oc);
    for (int64_t b = 0; b < ch.n; ++b)
      for (int64_t gi = 0; gi < ch.group; ++gi)
        for (int64_t mo = 0; mo < ch.mg; ++mo)
          f(o, static_cast<const int64_t *>(oc), b, gi, mo);
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

} // namespace popart::backend_cpu
