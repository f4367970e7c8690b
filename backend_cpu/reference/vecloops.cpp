// Built with -fno-trapping-math (CMakeLists.txt) so that GCC if-converts the selects in
// vecmath.hpp; nothing in the runtime reads floating-point exception flags.

#include "backend_cpu/reference/vecloops.hpp"
#include "backend_cpu/reference/vecmath.hpp"

#define POPART_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

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
      float e = vecmath::exp(x[i] - m);
      y[i] = e;
      s += e;
    }
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i)
      s += vecmath::exp(x[i] - m);
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

} // namespace popart::backend_cpu::vec
