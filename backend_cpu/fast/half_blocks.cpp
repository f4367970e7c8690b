// The conversion loops of half_blocks.hpp, shared by the fp16 products (dnnl/matmul_f16.cpp,
// dnnl/conv_f16.cpp) and the fast 16-bit BatchNormalization.

#include "backend_cpu/fast/half_blocks.hpp"

#include "core/half.hpp"

#include <cpuid.h>
#include <immintrin.h>

namespace popart::backend_cpu::half_blocks {

namespace {

float loadAs(const void *p, bool half, int64_t i) {
  return half ? halfToFloat(static_cast<const uint16_t *>(p)[i]) : static_cast<const float *>(p)[i];
}

} // namespace

// The conversions, three ways: AVX-512 (F16C's 16-wide forms, masked tails), AVX2 with F16C
// (8-wide, scalar tails) and plain C++ (core/half.hpp). vcvtps2ph with _MM_FROUND_TO_NEAREST_INT
// rounds to nearest even with subnormals and overflow to infinity as floatToHalf does (a NaN keeps
// its payload's top bits where floatToHalf gives the canonical quiet NaN: NaN either way).

void widenScalar(const uint16_t *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = halfToFloat(src[i]);
}

void epilogueScalar(const float *acc, int64_t cols, const Epilogue &e) {
  for (int64_t j = 0; j < cols; ++j) {
    float v = e.alpha * acc[j];
    if (e.addend) v += e.beta * loadAs(e.addend, e.addendHalf, j * e.addendStride);
    if (e.relu && v < 0.f) v = 0.f; // NaN stays NaN
    if (e.residual) v += loadAs(e.residual, e.yHalf, j * e.yStride);
    if (e.yHalf)
      static_cast<uint16_t *>(e.y)[j * e.yStride] = floatToHalf(v);
    else
      static_cast<float *>(e.y)[j * e.yStride] = v;
  }
}

namespace {

__attribute__((target("avx2,f16c,fma"))) void widenAvx2(const uint16_t *src, float *dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i))));
  widenScalar(src + i, dst + i, n - i);
}

__attribute__((target("avx2,f16c,fma"))) void epilogueAvx2(const float *acc, int64_t cols, const Epilogue &e) {
  if (e.yStride != 1) return epilogueScalar(acc, cols, e);
  const __m256 alpha = _mm256_set1_ps(e.alpha), beta = _mm256_set1_ps(e.beta), zero = _mm256_setzero_ps();
  const __m256 broadcast =
      _mm256_set1_ps(e.addend && e.addendStride == 0 ? e.beta * loadAs(e.addend, e.addendHalf, 0) : 0.f);
  int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(acc + j), alpha);
    if (e.addend) {
      if (e.addendStride == 0)
        v = _mm256_add_ps(v, broadcast);
      else if (e.addendHalf)
        v = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(
                                reinterpret_cast<const __m128i *>(static_cast<const uint16_t *>(e.addend) + j))),
                            beta, v);
      else
        v = _mm256_fmadd_ps(_mm256_loadu_ps(static_cast<const float *>(e.addend) + j), beta, v);
    }
    if (e.relu) v = _mm256_max_ps(zero, v); // the second operand when either is NaN: NaN stays NaN
    if (e.residual)
      v = _mm256_add_ps(v, e.yHalf ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(
                                         static_cast<const uint16_t *>(e.residual) + j)))
                                   : _mm256_loadu_ps(static_cast<const float *>(e.residual) + j));
    if (e.yHalf)
      _mm_storeu_si128(reinterpret_cast<__m128i *>(static_cast<uint16_t *>(e.y) + j),
                       _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else
      _mm256_storeu_ps(static_cast<float *>(e.y) + j, v);
  }
  if (j == cols) return;
  Epilogue tail = e;
  auto advance = [&](const void *p, bool half, int64_t by) -> const void * {
    return p ? static_cast<const uint8_t *>(p) + by * (half ? 2 : 4) : nullptr;
  };
  tail.addend = advance(e.addend, e.addendHalf, j * e.addendStride);
  tail.residual = advance(e.residual, e.yHalf, j);
  tail.y = const_cast<void *>(advance(e.y, e.yHalf, j));
  epilogueScalar(acc + j, cols - j, tail);
}

// GCC 12 warns (maybe-uninitialized) of the _mm512_undefined_* inside the unmasked forms of these
// three: their zero-masked forms with every lane set are the same instructions.
constexpr __mmask16 kAllLanes = 0xffff;
__attribute__((target("avx512f"))) inline __m512 widen16(__m256i h) { return _mm512_maskz_cvtph_ps(kAllLanes, h); }
__attribute__((target("avx512f"))) inline __m256i narrow16(__m512 v) {
  return _mm512_maskz_cvtps_ph(kAllLanes, v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
__attribute__((target("avx512f"))) inline __m512 max16(__m512 a, __m512 b) {
  return _mm512_maskz_max_ps(kAllLanes, a, b);
}

__attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma"))) void widenAvx512(const uint16_t *src, float *dst,
                                                                               int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(src + i))));
  if (i < n) {
    auto mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, mask, widen16(_mm256_maskz_loadu_epi16(mask, src + i)));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma"))) void epilogueAvx512(const float *acc, int64_t cols,
                                                                                  const Epilogue &e) {
  if (e.yStride != 1) return epilogueScalar(acc, cols, e);
  const __m512 alpha = _mm512_set1_ps(e.alpha), beta = _mm512_set1_ps(e.beta), zero = _mm512_setzero_ps();
  const __m512 broadcast =
      _mm512_set1_ps(e.addend && e.addendStride == 0 ? e.beta * loadAs(e.addend, e.addendHalf, 0) : 0.f);
  const auto *addendHalf = static_cast<const uint16_t *>(e.addend);
  const auto *addendFloat = static_cast<const float *>(e.addend);
  const auto *residualHalf = static_cast<const uint16_t *>(e.residual);
  const auto *residualFloat = static_cast<const float *>(e.residual);
  for (int64_t j = 0; j < cols; j += 16) {
    __mmask16 mask = cols - j >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (cols - j)) - 1);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, acc + j), alpha);
    if (e.addend) {
      if (e.addendStride == 0)
        v = _mm512_add_ps(v, broadcast);
      else if (e.addendHalf)
        v = _mm512_fmadd_ps(widen16(_mm256_maskz_loadu_epi16(mask, addendHalf + j)), beta, v);
      else
        v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, addendFloat + j), beta, v);
    }
    if (e.relu) v = max16(zero, v); // the second operand when either is NaN: NaN stays NaN
    if (e.residual)
      v = _mm512_add_ps(v, e.yHalf ? widen16(_mm256_maskz_loadu_epi16(mask, residualHalf + j))
                                   : _mm512_maskz_loadu_ps(mask, residualFloat + j));
    if (e.yHalf)
      _mm256_mask_storeu_epi16(static_cast<uint16_t *>(e.y) + j, mask, narrow16(v));
    else
      _mm512_mask_storeu_ps(static_cast<float *>(e.y) + j, mask, v);
  }
}

/// Whether the CPU converts with F16C (cpuid leaf 1, ecx bit 29; Clang's __builtin_cpu_supports
/// does not know the name).
bool hasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

} // namespace

HalfLoops halfLoops() {
  __builtin_cpu_init();
  if (!hasF16c() || !__builtin_cpu_supports("fma")) return {};
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return {widenAvx512, epilogueAvx512};
  if (__builtin_cpu_supports("avx2")) return {widenAvx2, epilogueAvx2};
  return {};
}

} // namespace popart::backend_cpu::half_blocks
