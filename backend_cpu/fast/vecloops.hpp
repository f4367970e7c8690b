#pragma once
// Vectorised f32 loops for the reference kernels' hot paths. Each is built for x86-64-v4
// (AVX-512 with VL), x86-64-v3 (AVX2 with FMA) and baseline x86-64 and picked at load time
// (target_clones), so the binary stays portable.
// They are serial: callers split work across threads and keep each output's order fixed, so
// results do not depend on the thread count's scheduling. An element gets the same bits in the
// vector body and in the remainder loops, wherever a range starts: the AVX-512 clone is v4, not
// plain avx512f, whose 256-bit remainder had no FMA and rounded differently from the body.

#include <cstdint>

namespace popart::backend_cpu::vec {

/// Depthwise convolution weight gradient of one channel: dw[u·kw + v] = Σ dy[b, r, j] ·
/// x[b, r·sh + u − ph, j·sw + v − pw] over \p batch images (planes \p xStride and \p dyStride
/// floats apart; x planes [h, w], dy planes [oh, ow]), a kh × kw kernel without dilation, taps
/// outside the plane read as 0. \p scratch holds depthwiseWeightGradScratch floats.
void depthwiseWeightGrad(const float *x, int64_t xStride, const float *dy, int64_t dyStride, int64_t batch, float *dw,
                         int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                         int64_t ph, int64_t pw, float *scratch);
/// The scratch floats of depthwiseWeightGrad.
int64_t depthwiseWeightGradScratch(int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw);

/// y = e^x (y may alias x).
void exp(const float *x, float *y, int64_t n);
/// y = erf(x) (y may alias x).
void erf(const float *x, float *y, int64_t n);
/// The largest of x[0..n), n > 0 (NaNs are skipped; callers' later sums propagate them).
float max(const float *x, int64_t n);
/// Σ e^(x - m) for m >= every x (softmax's row maximum); also stores each e^(x - m) in y when y
/// is not null.
float expSubSum(const float *x, float m, float *y, int64_t n);
/// y = x * s (y may alias x).
void scale(const float *x, float s, float *y, int64_t n);
/// y = x + s.
void addScalar(const float *x, float s, float *y, int64_t n);
/// acc += x, in double.
void accumulate(const float *x, double *acc, int64_t n);
/// y = x * s and acc += y (y may alias x).
void scaleAccumulate(const float *x, float s, float *y, float *acc, int64_t n);
/// Σ x, in double.
double sum(const float *x, int64_t n);
/// Σ (x − m)², in double.
double sumSquaredDiff(const float *x, double m, int64_t n);
/// Σ dy·(x − m), in double.
double sumProductDiff(const float *dy, const float *x, double m, int64_t n);
/// y = (x − m)·a + b (y may alias x).
void centerScaleShift(const float *x, float m, float a, float b, float *y, int64_t n);
/// Batch-norm input gradient: dx = g·(dy − meanDy − (x − m)·r·meanDyXhat).
void batchNormBackward(const float *x, const float *dy, float m, float r, float g, float meanDy, float meanDyXhat,
                       float *dx, int64_t n);

/// MaxPool gradient on one [h, w] plane whose windows do not overlap (stride ≥ kernel, no padding,
/// no dilation): each dy of the [oh, ow] output goes to its window's first maximum of x in
/// row-major order; with \p reluMask only where that maximum is > 0 (the gradient of a Relu
/// whose output x is). dx is 0 everywhere else. A NaN wins its window only as the first tap (as
/// in the generic loop) except in the 2×2 path, where a NaN in the second row hides that row.
void maxPoolGradPlane(const float *x, const float *dy, float *dx, int64_t h, int64_t w, int64_t oh, int64_t ow,
                      int64_t kh, int64_t kw, int64_t sh, int64_t sw, bool reluMask);

/// MaxPool on one [h, w] plane whose windows do not overlap (as maxPoolGradPlane): y [oh, ow]
/// is each window's maximum, with maxPoolGradPlane's choice of the first maximum (and of NaN).
void maxPoolPlane(const float *x, float *y, int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t kh, int64_t kw,
                  int64_t sh, int64_t sw);

/// One tap of a max pool's windows: m[i] = x[i·stride] where it is greater, for i < n (a NaN
/// already in m stays, a NaN in x is passed over: the first tap of a window decides NaN).
void maxInto(const float *x, int64_t stride, float *m, int64_t n);

/// MaxPool on one plane of a channel-blocked layout, x [h, w, block] to y [oh, ow, block]:
/// each output pixel's \p block channels are the maxima of its kh×kw window (stride sh, sw; no
/// padding or dilation; windows may overlap), the first maximum winning as in maxPoolPlane.
void maxPoolBlocked(const float *x, float *y, int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t kh, int64_t kw,
                    int64_t sh, int64_t sw, int64_t block);

/// One Adam / AdamW step over n elements, in place: g' = g·gs + l2·w; m = b1·m + (1 − b1)·g';
/// v = b2·v + (1 − b2)·g'²; w = w·decay − stepSize·m / (√v / bc2Sqrt + eps).
void adamStep(const float *g, float *w, float *m, float *v, int64_t n, float gs, float l2, float b1, float b2,
              float decay, float stepSize, float bc2Sqrt, float eps);

/// y[i·block + j] = x[i·block + j] · s[j] for i < n, j < block (a plane of blocked channels
/// scaled per channel).
void scaleBlocked(const float *x, const float *s, float *y, int64_t n, int64_t block);

/// acc[j] += Σ_i x[i·block + j] for i < n, j < block (per-channel sums of blocked channels).
void sumBlocked(const float *x, float *acc, int64_t n, int64_t block);

/// y[i] = a[i] op b[i] (op 0 add, 1 sub, 2 mul, 3 div); \p bStride 0 reads b[0] for every i.
void binary(int op, const float *a, const float *b, int64_t bStride, float *y, int64_t n);

// Conversions between f32 and the 16-bit types (bfloat16 and IEEE fp16 as their bit patterns),
// bit for bit those of core/half.hpp for every input: round to nearest even, subnormals kept both
// ways, ±0, ±Inf, and NaNs as half.hpp makes them (f32 → 16-bit: quiet). Integer arithmetic only
// (and exact int → f32 conversions), so no MXCSR setting (FTZ, DAZ) changes a result.

/// y = floatToBfloat16(x).
void toBfloat16(const float *x, uint16_t *y, int64_t n);
/// y = bfloat16ToFloat(x).
void fromBfloat16(const uint16_t *x, float *y, int64_t n);
/// y = floatToHalf(x).
void toHalf(const float *x, uint16_t *y, int64_t n);
/// y = halfToFloat(x).
void fromHalf(const uint16_t *x, float *y, int64_t n);
/// acc += bfloat16ToFloat(x), in f32.
void accumulateBfloat16(const uint16_t *x, float *acc, int64_t n);
/// acc += halfToFloat(x), in f32.
void accumulateHalf(const uint16_t *x, float *acc, int64_t n);
/// y = bfloat16ToFloat(x), n > 0; returns the largest y (NaNs skipped, as max()).
float fromBfloat16Max(const uint16_t *x, float *y, int64_t n);
/// y = halfToFloat(x), n > 0; returns the largest y (NaNs skipped, as max()).
float fromHalfMax(const uint16_t *x, float *y, int64_t n);
/// y = floatToBfloat16(x · s), and acc += bfloat16ToFloat(y) unless acc is null.
void scaleToBfloat16(const float *x, float s, uint16_t *y, float *acc, int64_t n);
/// y = floatToHalf(x · s), and acc += halfToFloat(y) unless acc is null.
void scaleToHalf(const float *x, float s, uint16_t *y, float *acc, int64_t n);

} // namespace popart::backend_cpu::vec
