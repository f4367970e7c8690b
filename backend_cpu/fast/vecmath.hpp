#pragma once
// Branch-free float exp and erf that GCC vectorises inside `#pragma omp simd` loops (glibc's
// expf/erff are scalar calls). Accuracy, checked against std::exp and std::erf in double by the
// VecMath tests of tests/unit/test_fast_kernels.cpp: exp within 3 ulp over the normal range, erf
// within 4e-7 absolute and 1e-6 relative.

#include <bit>
#include <cstdint>

namespace popart::backend_cpu::vecmath {

#define POPART_VECMATH_INLINE inline __attribute__((always_inline))

POPART_VECMATH_INLINE float bitsToFloat(int32_t i) { return std::bit_cast<float>(i); }

/// e^c for c clamped to [-87.3, 88.7] as p · 2^n: n = round(c / ln 2) (returned in \p n) and p
/// = e^r on |r| <= ln2/2.
POPART_VECMATH_INLINE float expReduced(float c, float &n) {
  // c = n ln2 + r, |r| <= ln2/2, with n rounded to nearest by the 1.5·2^23 trick.
  const float shift = 12582912.f;
  n = (c * 1.44269504088896341f + shift) - shift;
  float r = c - n * 0.693145751953125f; // ln2 split in two for an exact product
  r = r - n * 1.42860682030941723212e-6f;
  // e^r on [-ln2/2, ln2/2]: degree-6 Taylor polynomial (truncation < 1.1e-7 relative).
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  return p * r + 1.f;
}

/// e^x. Below -87.3 (where e^x is subnormal) it returns 0; above 88.7 +inf; NaN stays NaN.
POPART_VECMATH_INLINE float exp(float x) {
  const float hi = 88.7228f, lo = -87.3365f;
  // Clamped so that a NaN x becomes hi (a comparison with NaN is false): converting a NaN n to
  // int below would be undefined behaviour. The result is x for a NaN x, at the end.
  float c = x < hi ? x : hi;
  c = c > lo ? c : lo;
  float n;
  float p = expReduced(c, n);
  // 2^n from its exponent bits; n = 128 (x above ln FLT_MAX - ln 2) is 2^127 · 2.
  int32_t ni = static_cast<int32_t>(n);
  int32_t top = ni > 127 ? 1 : 0;
  float y = p * bitsToFloat((ni - top + 127) << 23);
  y = top ? y * 2.f : y;
  y = x > hi ? __builtin_inff() : y;
  y = x < lo ? 0.f : y;
  return x != x ? x : y;
}

/// e^x for x <= 0 (softmax's x − max): exp without the overflow path. Below -87.3 it returns 0;
/// NaN stays NaN; x > 0 is outside its contract.
POPART_VECMATH_INLINE float expNonPositive(float x) {
  const float lo = -87.3365f;
  float n;
  float p = expReduced(x > lo ? x : lo, n); // a NaN x reduces lo: n stays a number (see exp)
  float y = p * bitsToFloat((static_cast<int32_t>(n) + 127) << 23);
  y = x < lo ? 0.f : y;
  return x != x ? x : y;
}

/// erf(x): the Maclaurin series below |x| = 0.5, Abramowitz and Stegun 7.1.26 above.
POPART_VECMATH_INLINE float erf(float x) {
  float a = x < 0 ? -x : x;
  // |x| < 0.5: 2/sqrt(pi) (x - x^3/3 + x^5/10 - x^7/42 + x^9/216 - x^11/1320 + x^13/9360).
  float s = a * a;
  float q = 1.f / 9360.f;
  q = q * s - 1.f / 1320.f;
  q = q * s + 1.f / 216.f;
  q = q * s - 1.f / 42.f;
  q = q * s + 1.f / 10.f;
  q = q * s - 1.f / 3.f;
  q = q * s + 1.f;
  float small = 1.12837916709551257f * a * q;
  // |x| >= 0.5: 1 - t (a1 + t (a2 + ...)) e^{-x^2}, t = 1 / (1 + p x).
  float t = 1.f / (1.f + 0.3275911f * a);
  float poly = 1.061405429f;
  poly = poly * t - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  float large = 1.f - poly * t * vecmath::exp(-s);
  float y = a < 0.5f ? small : large;
  y = a > 9.f ? 1.f : y;
  y = x < 0 ? -y : y;
  return x != x ? x : y;
}

} // namespace popart::backend_cpu::vecmath
