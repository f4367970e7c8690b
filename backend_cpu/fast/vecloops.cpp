// Built with -fno-trapping-math (CMakeLists.txt) so that GCC if-converts the selects in
// vecmath.hpp; nothing in the runtime reads floating-point exception flags.

#include "backend_cpu/fast/clones.hpp"
#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/fast/vecmath.hpp"
#include <algorithm>
#include <bit>
#include <cmath>

namespace popart::backend_cpu::vec {

POPART_CLONES void exp(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = vecmath::exp(x[i]);
}

POPART_CLONES void erf(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = vecmath::erf(x[i]);
}

POPART_CLONES float max(const float *x, int64_t n) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i)
    m = x[i] > m ? x[i] : m;
  return m;
}

POPART_CLONES float expSubSum(const float *x, float m, float *y, int64_t n) {
  float s = 0;
  if (y) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) {
      float e = vecmath::expNonPositive(x[i] - m);
      y[i] = e;
      s += e;
    }
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i)
      s += vecmath::expNonPositive(x[i] - m);
  }
  return s;
}

POPART_CLONES void scale(const float *x, float s, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = x[i] * s;
}

POPART_CLONES void addScalar(const float *x, float s, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = x[i] + s;
}

POPART_CLONES void accumulate(const float *x, double *acc, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    acc[i] += static_cast<double>(x[i]);
}

POPART_CLONES void scaleAccumulate(const float *x, float s, float *y, float *acc, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] * s;
    y[i] = v;
    acc[i] += v;
  }
}

POPART_CLONES double sum(const float *x, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i)
    s += static_cast<double>(x[i]);
  return s;
}

POPART_CLONES double sumSquaredDiff(const float *x, double m, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    double d = static_cast<double>(x[i]) - m;
    s += d * d;
  }
  return s;
}

POPART_CLONES double sumProductDiff(const float *dy, const float *x, double m, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i)
    s += static_cast<double>(dy[i]) * (static_cast<double>(x[i]) - m);
  return s;
}

POPART_CLONES void centerScaleShift(const float *x, float m, float a, float b, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = (x[i] - m) * a + b;
}

POPART_CLONES void batchNormBackward(const float *x, const float *dy, float m, float r, float g, float meanDy,
                                     float meanDyXhat, float *dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    dx[i] = g * (dy[i] - meanDy - (x[i] - m) * r * meanDyXhat);
}

POPART_CLONES void maxPoolPlane(const float *x, float *y, int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t kh,
                                int64_t kw, int64_t sh, int64_t sw) {
  if (kh == 2 && kw == 2 && sh == 2 && sw == 2 && h >= 2 * oh && w >= 2 * ow) { // the common 2×2 pool
    for (int64_t r = 0; r < oh; ++r) {
      const float *x0 = x + 2 * r * w, *x1 = x0 + w;
      float *yr = y + r * ow;
#pragma omp simd
      for (int64_t j = 0; j < ow; ++j) {
        float a = x0[2 * j], b = x0[2 * j + 1], c = x1[2 * j], d = x1[2 * j + 1];
        float m0 = b > a ? b : a, m1 = d > c ? d : c;
        yr[j] = m1 > m0 ? m1 : m0;
      }
    }
    return;
  }
  for (int64_t r = 0; r < oh; ++r)
    for (int64_t j = 0; j < ow; ++j) {
      const float *base = x + r * sh * w + j * sw;
      float m = base[0];
      for (int64_t u = 0; u < kh; ++u)
        for (int64_t v = 0; v < kw; ++v)
          if (base[u * w + v] > m) m = base[u * w + v];
      y[r * ow + j] = m;
    }
}

namespace {
/// maxPoolBlocked's loop for a block of B channels known when compiling, held as one GCC vector
/// (in registers: each clone splits it into its own vector width).
template <int64_t B>
inline __attribute__((always_inline)) void maxPoolBlockedOf(const float *x, float *y, int64_t w, int64_t oh, int64_t ow,
                                                            int64_t kh, int64_t kw, int64_t sh, int64_t sw) {
  typedef float V __attribute__((vector_size(B * sizeof(float))));
  for (int64_t r = 0; r < oh; ++r)
    for (int64_t j = 0; j < ow; ++j) {
      const float *base = x + (r * sh * w + j * sw) * B;
      V m;
      __builtin_memcpy(&m, base, sizeof(V));
      for (int64_t u = 0; u < kh; ++u)
        for (int64_t v = 0; v < kw; ++v) {
          V t;
          __builtin_memcpy(&t, base + (u * w + v) * B, sizeof(V));
          m = t > m ? t : m;
        }
      __builtin_memcpy(y + (r * ow + j) * B, &m, sizeof(V));
    }
}
} // namespace

POPART_CLONES void maxPoolBlocked(const float *x, float *y, int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t kh,
                                  int64_t kw, int64_t sh, int64_t sw, int64_t block) {
  (void)h;
  if (block == 8) return maxPoolBlockedOf<8>(x, y, w, oh, ow, kh, kw, sh, sw);
  if (block == 16) return maxPoolBlockedOf<16>(x, y, w, oh, ow, kh, kw, sh, sw);
  for (int64_t b = 0; b < block; ++b) // any other block: one channel at a time
    for (int64_t r = 0; r < oh; ++r)
      for (int64_t j = 0; j < ow; ++j) {
        const float *base = x + (r * sh * w + j * sw) * block + b;
        float m = base[0];
        for (int64_t u = 0; u < kh; ++u)
          for (int64_t v = 0; v < kw; ++v) {
            float t = base[(u * w + v) * block];
            m = t > m ? t : m;
          }
        y[(r * ow + j) * block + b] = m;
      }
}

POPART_CLONES void maxInto(const float *x, int64_t stride, float *m, int64_t n) {
  if (stride == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      m[i] = x[i] > m[i] ? x[i] : m[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    m[i] = x[i * stride] > m[i] ? x[i * stride] : m[i];
}

POPART_CLONES void adamStep(const float *g, float *w, float *m, float *v, int64_t n, float gs, float l2, float b1,
                            float b2, float decay, float stepSize, float bc2Sqrt, float eps) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] * gs + l2 * w[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * decay - stepSize * mi / (std::sqrt(vi) / bc2Sqrt + eps);
  }
}

namespace {
/// depthwiseWeightGrad's scratch: each image's dy rows at the width wq of the stride phases, zero
/// beyond ow, and the sh·sw stride phases of its zero-padded x plane, so that every tap is one
/// dot product over the flat rows, in blocks of 16 with no remainder (the zeros of dy cancel the
/// taps that run past a row's end).
struct DepthwiseGradGeom {
  int64_t wq, hq, len, phase, taps;
  DepthwiseGradGeom(int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw)
      : wq(ow + (kw - 1) / sw), hq(oh + (kh - 1) / sh), len((oh * wq + 15) / 16 * 16),
        phase((std::max(len + (kh - 1) / sh * wq + (kw - 1) / sw, hq * wq) + 15) / 16 * 16), taps(kh * kw) {}
  int64_t scratch(int64_t sh, int64_t sw) const { return len + sh * sw * phase + taps * 16; }
};
} // namespace

int64_t depthwiseWeightGradScratch(int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw) {
  return DepthwiseGradGeom(oh, ow, kh, kw, sh, sw).scratch(sh, sw);
}

POPART_CLONES void depthwiseWeightGrad(const float *x, int64_t xStride, const float *dy, int64_t dyStride,
                                       int64_t batch, float *dw, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                       int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                                       float *scratch) {
  const DepthwiseGradGeom g(oh, ow, kh, kw, sh, sw);
  float *dyq = scratch, *xq = scratch + g.len, *part = xq + sh * sw * g.phase;
  for (int64_t i = 0; i < g.scratch(sh, sw); ++i)
    scratch[i] = 0.f;
  for (int64_t b = 0; b < batch; ++b) {
    const float *xb = x + b * xStride, *dyb = dy + b * dyStride;
    for (int64_t r = 0; r < oh; ++r)
      std::copy(dyb + r * ow, dyb + (r + 1) * ow, dyq + r * g.wq);
    for (int64_t a = 0; a < sh; ++a)
      for (int64_t c = 0; c < sw; ++c) {
        float *q = xq + (a * sw + c) * g.phase;
        // The columns j whose iw = j·sw + c − pw lies in [0, w); the rest stay 0.
        int64_t lo = pw - c, hi = w - 1 + pw - c;
        int64_t j0 = std::min(g.wq, lo <= 0 ? int64_t{0} : (lo + sw - 1) / sw);
        int64_t j1 = std::max(j0, std::min(g.wq, hi < 0 ? int64_t{0} : hi / sw + 1));
        for (int64_t i = 0; i < g.hq; ++i) {
          int64_t ih = i * sh + a - ph;
          float *row = q + i * g.wq;
          if (ih < 0 || ih >= h) {
            for (int64_t j = 0; j < g.wq; ++j)
              row[j] = 0.f;
            continue;
          }
          const float *src = xb + ih * w + c - pw;
          for (int64_t j = 0; j < j0; ++j)
            row[j] = 0.f;
          if (sw == 1)
            std::copy(src + j0, src + j1, row + j0);
          else if (sw == 2) // a constant stride, which GCC vectorises with permutes
#pragma omp simd
            for (int64_t j = j0; j < j1; ++j)
              row[j] = src[2 * j];
          else
            for (int64_t j = j0; j < j1; ++j)
              row[j] = src[j * sw];
          for (int64_t j = j1; j < g.wq; ++j)
            row[j] = 0.f;
        }
      }
    for (int64_t u = 0; u < kh; ++u)
      for (int64_t v = 0; v < kw; ++v) {
        const float *q = xq + ((u % sh) * sw + v % sw) * g.phase + (u / sh) * g.wq + v / sw;
        float *p = part + (u * kw + v) * 16;
        float acc[16]; // local, so that it stays in registers (part may alias dyq and q)
        for (int64_t l = 0; l < 16; ++l)
          acc[l] = p[l];
        for (int64_t f = 0; f < g.len; f += 16)
#pragma omp simd
          for (int64_t l = 0; l < 16; ++l)
            acc[l] += dyq[f + l] * q[f + l];
        for (int64_t l = 0; l < 16; ++l)
          p[l] = acc[l];
      }
  }
  for (int64_t t = 0; t < g.taps; ++t) {
    float s = 0.f;
    for (int64_t l = 0; l < 16; ++l) // in order: the same bits in every clone
      s += part[t * 16 + l];
    dw[t] = s;
  }
}

POPART_CLONES void maxPoolGradPlane(const float *x, const float *dy, float *dx, int64_t h, int64_t w, int64_t oh,
                                    int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw, bool reluMask) {
  const float zero = 0.f;
  if (kh == 2 && kw == 2 && sh == 2 && sw == 2 && h == 2 * oh && w == 2 * ow) { // the common 2×2 pool
    for (int64_t r = 0; r < oh; ++r) {
      const float *x0 = x + 2 * r * w, *x1 = x0 + w, *g = dy + r * ow;
      float *d0 = dx + 2 * r * w, *d1 = d0 + w;
#pragma omp simd
      for (int64_t j = 0; j < ow; ++j) {
        // Masks, not an index, so that GCC vectorises it: the first maximum of a, b (top row)
        // and c, d, then of the two rows.
        float a = x0[2 * j], b = x0[2 * j + 1], c = x1[2 * j], d = x1[2 * j + 1];
        bool right0 = b > a, right1 = d > c;
        float m0 = right0 ? b : a, m1 = right1 ? d : c;
        bool top = !(m1 > m0);
        float m = top ? m0 : m1;
        float v = reluMask && !(m > zero) ? zero : g[j];
        d0[2 * j] = top && !right0 ? v : zero;
        d0[2 * j + 1] = top && right0 ? v : zero;
        d1[2 * j] = !top && !right1 ? v : zero;
        d1[2 * j + 1] = !top && right1 ? v : zero;
      }
    }
    return;
  }
  for (int64_t i = 0; i < h * w; ++i)
    dx[i] = zero;
  for (int64_t r = 0; r < oh; ++r)
    for (int64_t j = 0; j < ow; ++j) {
      const float *base = x + r * sh * w + j * sw;
      int64_t at = 0;
      float m = base[0];
      for (int64_t u = 0; u < kh; ++u)
        for (int64_t v = 0; v < kw; ++v)
          if (base[u * w + v] > m) m = base[u * w + v], at = u * w + v;
      if (!reluMask || m > zero) dx[r * sh * w + j * sw + at] = dy[r * ow + j];
    }
}

POPART_CLONES void scaleBlocked(const float *x, const float *s, float *y, int64_t n, int64_t block) {
  if (block == 16) { // the common case: a constant trip count the compiler unrolls into one vector
    for (int64_t i = 0; i < n; ++i)
#pragma omp simd
      for (int64_t j = 0; j < 16; ++j)
        y[i * 16 + j] = x[i * 16 + j] * s[j];
    return;
  }
  for (int64_t i = 0; i < n; ++i)
#pragma omp simd
    for (int64_t j = 0; j < block; ++j)
      y[i * block + j] = x[i * block + j] * s[j];
}

POPART_CLONES void sumBlocked(const float *x, float *acc, int64_t n, int64_t block) {
  if (block == 16) {
    float a[16] = {};
    for (int64_t i = 0; i < n; ++i)
#pragma omp simd
      for (int64_t j = 0; j < 16; ++j)
        a[j] += x[i * 16 + j];
    for (int64_t j = 0; j < 16; ++j)
      acc[j] += a[j];
    return;
  }
  for (int64_t i = 0; i < n; ++i)
#pragma omp simd
    for (int64_t j = 0; j < block; ++j)
      acc[j] += x[i * block + j];
}

POPART_CLONES void binary(int op, const float *a, const float *b, int64_t bStride, float *y, int64_t n) {
  if (bStride == 0) {
    const float v = b[0];
    // The cases differ in their operator only, inside `omp simd` loops that clang-tidy 14's
    // branch-clone check compares as equal.
    // NOLINTBEGIN(bugprone-branch-clone)
    switch (op) {
    case 0:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i)
        y[i] = a[i] + v;
      return;
    case 1:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i)
        y[i] = a[i] - v;
      return;
    case 2:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i)
        y[i] = a[i] * v;
      return;
    default:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i)
        y[i] = a[i] / v;
      return;
    }
  }
  switch (op) {
  case 0:
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      y[i] = a[i] + b[i];
    return;
  case 1:
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      y[i] = a[i] - b[i];
    return;
  case 2:
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      y[i] = a[i] * b[i];
    return;
  default:
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      y[i] = a[i] / b[i];
    return;
  }
  // NOLINTEND(bugprone-branch-clone)
}

namespace {

// Branch-free forms of core/half.hpp's conversions (each case computed, the right one selected), so
// that GCC vectorises them; tests/unit/test_fast_cast.cpp checks them against half.hpp.

#define POPART_HALF_INLINE inline __attribute__((always_inline))

POPART_HALF_INLINE uint16_t bitsToBfloat16(uint32_t x) {
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16; // round to nearest even
  uint32_t nan = (x >> 16) | 0x40u;                          // quiet, payload kept
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

POPART_HALF_INLINE uint32_t bfloat16ToBits(uint16_t b) { return static_cast<uint32_t>(b) << 16; }

POPART_HALF_INLINE uint16_t bitsToHalf(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  // Normal results (|x| >= 2^-14): drop 13 mantissa bits rounding to nearest even and rebias the
  // exponent; a carry into the exponent is right, and anything from 65520 up becomes Inf (0x7c00).
  uint32_t normal = ((ax + 0xfffu + ((ax >> 13) & 1u)) >> 13) - (112u << 10);
  normal = normal < 0x7c00u ? normal : 0x7c00u;
  // Subnormal results: the mantissa with its implicit bit shifted right by 126 − exponent (14 to
  // 24), rounding to nearest even; 31 for smaller exponents makes them 0.
  const int32_t exponent = static_cast<int32_t>(ax >> 23);
  int32_t shift = 126 - exponent;
  shift = shift < 14 ? 14 : (shift > 31 ? 31 : shift);
  const uint32_t s = static_cast<uint32_t>(shift), m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t sub = (m + ((1u << (s - 1)) - 1u) + ((m >> s) & 1u)) >> s;
  uint32_t h = ax >= 0x38800000u ? normal : sub;
  h = ax > 0x7f800000u ? 0x7e00u : h; // NaN: quiet, payload dropped as half.hpp does
  return static_cast<uint16_t>(sign | h);
}

POPART_HALF_INLINE uint32_t halfToBits(uint16_t hb) {
  const uint32_t h = hb, sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  const uint32_t normal = ((h & 0x7fffu) << 13) + (112u << 23);
  const uint32_t infNan = 0x7f800000u | (mantissa << 13); // NaN payload kept, as half.hpp does
  // A subnormal is mantissa · 2^-24: the exact f32 of the integer mantissa, its exponent less 24.
  const uint32_t sub =
      mantissa ? std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(mantissa))) - (24u << 23) : 0u;
  const uint32_t bits = exponent == 0 ? sub : (exponent == 0x1fu ? infNan : normal);
  return sign | bits;
}

} // namespace

POPART_CLONES void toBfloat16(const float *x, uint16_t *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = bitsToBfloat16(std::bit_cast<uint32_t>(x[i]));
}

POPART_CLONES void fromBfloat16(const uint16_t *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = std::bit_cast<float>(bfloat16ToBits(x[i]));
}

POPART_CLONES void toHalf(const float *x, uint16_t *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = bitsToHalf(std::bit_cast<uint32_t>(x[i]));
}

POPART_CLONES void fromHalf(const uint16_t *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = std::bit_cast<float>(halfToBits(x[i]));
}

POPART_CLONES void accumulateBfloat16(const uint16_t *x, float *acc, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    acc[i] += std::bit_cast<float>(bfloat16ToBits(x[i]));
}

POPART_CLONES void accumulateHalf(const uint16_t *x, float *acc, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    acc[i] += std::bit_cast<float>(halfToBits(x[i]));
}

POPART_CLONES float fromBfloat16Max(const uint16_t *x, float *y, int64_t n) {
  float m = std::bit_cast<float>(bfloat16ToBits(x[0]));
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) {
    float v = std::bit_cast<float>(bfloat16ToBits(x[i]));
    y[i] = v;
    m = v > m ? v : m;
  }
  return m;
}

POPART_CLONES float fromHalfMax(const uint16_t *x, float *y, int64_t n) {
  float m = std::bit_cast<float>(halfToBits(x[0]));
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) {
    float v = std::bit_cast<float>(halfToBits(x[i]));
    y[i] = v;
    m = v > m ? v : m;
  }
  return m;
}

POPART_CLONES void scaleToBfloat16(const float *x, float s, uint16_t *y, float *acc, int64_t n) {
  if (acc) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b = bitsToBfloat16(std::bit_cast<uint32_t>(x[i] * s));
      y[i] = b;
      acc[i] += std::bit_cast<float>(bfloat16ToBits(b));
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = bitsToBfloat16(std::bit_cast<uint32_t>(x[i] * s));
}

POPART_CLONES void scaleToHalf(const float *x, float s, uint16_t *y, float *acc, int64_t n) {
  if (acc) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h = bitsToHalf(std::bit_cast<uint32_t>(x[i] * s));
      y[i] = h;
      acc[i] += std::bit_cast<float>(halfToBits(h));
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] = bitsToHalf(std::bit_cast<uint32_t>(x[i] * s));
}

} // namespace popart::backend_cpu::vec
