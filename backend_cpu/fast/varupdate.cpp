// Fast optimiser updates: SGDUpdate (plain and with momentum) and AdamUpdate in mode "adam", for
// FLOAT, FLOAT16 and BFLOAT16 weights with gradient and state in the weight's type or FLOAT
// (UpdateTypes: the second moment FLOAT or the first moment's type), and FLOAT master weights
// with a FLOAT16 or BFLOAT16 gradient (fp16.32, bf16), which alone is widened in blocks.
//
// - f32 Adam / AdamW through vec::adamStep, built for AVX2 and AVX-512 (sqrt and divide): built
//   for baseline x86-64, as the reference is, it ran BERT's AdamW at 13.5 GB/s, compute-bound;
//   this host moves about 34 GB/s.
// - f32 SGD: the reference's plain step is what GCC vectorises on its own, but with momentum its
//   loop (a velocity that may be absent, the first step, Nesterov, all decided per element) ran
//   scalar: 1.08 ms for the 1.9 M weights of the 784-1024-1024-10 MLP, against 0.29 ms without
//   momentum. Here each case is a loop of its own, vectorised. It is built without FMA
//   contraction, so it computes the reference's bits; it is memory-bound either way.
// - 16-bit weights, gradients or state: blocks of kBlock elements are widened to float on the
//   stack (F16C for fp16 where the CPU has it, integer shifts for bfloat16), updated by the f32
//   loops and rounded back to nearest even, each stored value once, as the reference does. Adam's
//   second moment may be FLOAT beside a 16-bit first moment (fp16.16): it is then read in place.
//
// Like the reference kernels these split into ranges (Kernel::rangeElements) that the plan merges
// across weights into one parallel step.
//
// GradientStatistics (the histogram of automatic loss scaling) compares magnitudes as integers:
// the sign bit cleared, an IEEE value's bits order as its magnitude does, with inf and NaN above
// every finite value. So each gradient is read in its own type, 16-bit ones unconverted, by a
// vectorised count against the bits of the smallest value of that type at or above the edge.
// AllFinite (the finite check of loss scaling) is the same count against inf's bits.

#include "backend_cpu/fast/clones.hpp"
#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/update_kernel.hpp"
#include "core/half.hpp"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace popart::backend_cpu {

namespace {

/// Elements widened to float at a time (on the stack: a few KB per state tensor).
constexpr int64_t kBlock = 512;

// ---- f32 SGD steps (see SGDKernel in reference/varupdate.cpp for the formula) ----
// No FMA contraction: the same roundings as the reference kernel, built for baseline x86-64.
#if defined(__clang__)
#define POPART_NO_FP_CONTRACT _Pragma("clang fp contract(off)")
#else
#define POPART_NO_FP_CONTRACT
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

/// w -= lr·(g·gs + wd·w).
POPART_CLONES void sgdPlain(const float *g, float *w, int64_t n, float gs, float wd, float lr) {
  POPART_NO_FP_CONTRACT
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float wi = w[i];
    const float d = g[i] * gs + wd * wi;
    w[i] = wi - lr * d;
  }
}

/// The momentum step of one case: \p First (v = vs·d) or not (v = m·v + (1 − dampening)·vs·d),
/// \p Nesterov or not.
template <bool First, bool Nesterov>
[[gnu::always_inline]] inline void sgdMomentumLoop(const float *g, float *w, float *v, int64_t n, float gs, float wd,
                                                   float lr, float mom, float damp, float vs) {
  POPART_NO_FP_CONTRACT
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float wi = w[i];
    const float d = g[i] * gs + wd * wi;
    float vi;
    if constexpr (First)
      vi = vs * d;
    else
      vi = mom * v[i] + (1.0f - damp) * vs * d;
    v[i] = vi;
    const float buf = vi / vs;
    if constexpr (Nesterov)
      w[i] = wi - lr * (d + mom * buf);
    else
      w[i] = wi - lr * buf;
  }
}

/// SGD with momentum, velocity v stored times velocityScaling \p vs.
POPART_CLONES void sgdMomentum(const float *g, float *w, float *v, int64_t n, float gs, float wd, float lr, float mom,
                               float damp, float vs, bool first, bool nesterov) {
  if (first) {
    if (nesterov)
      sgdMomentumLoop<true, true>(g, w, v, n, gs, wd, lr, mom, damp, vs);
    else
      sgdMomentumLoop<true, false>(g, w, v, n, gs, wd, lr, mom, damp, vs);
  } else {
    if (nesterov)
      sgdMomentumLoop<false, true>(g, w, v, n, gs, wd, lr, mom, damp, vs);
    else
      sgdMomentumLoop<false, false>(g, w, v, n, gs, wd, lr, mom, damp, vs);
  }
}

#if !defined(__clang__)
#pragma GCC pop_options
#endif

// ---- widening and rounding of blocks ----

/// fp16 to float and back with F16C (exact, and round to nearest even like floatToHalf).
__attribute__((target("avx,f16c"))) void halfToFloatF16C(const Half *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x + i))));
  for (; i < n; ++i)
    y[i] = static_cast<float>(x[i]);
}

__attribute__((target("avx,f16c"))) void floatToHalfF16C(const float *x, Half *y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i *>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i)
    y[i] = Half(x[i]);
}

/// Whether the CPU has F16C (CPUID leaf 1, ECX bit 29) and the OS saves the AVX registers it uses.
bool hasF16C() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_F16C) == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") != 0;
  }();
  return has;
}

void widen(const Half *x, float *y, int64_t n) {
  if (hasF16C()) {
    halfToFloatF16C(x, y, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    y[i] = static_cast<float>(x[i]);
}

void narrow(const float *x, Half *y, int64_t n) {
  if (hasF16C()) {
    floatToHalfF16C(x, y, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    y[i] = Half(x[i]);
}

/// bfloat16 is float's upper half. (BFloat16 is a struct of one uint16_t, read as that.)
POPART_CLONES void widen(const BFloat16 *x, float *y, int64_t n) {
  static_assert(sizeof(BFloat16) == sizeof(uint16_t));
  const auto *words = reinterpret_cast<const uint16_t *>(x);
  uint32_t bits[kBlock];
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    bits[i] = static_cast<uint32_t>(words[i]) << 16;
  std::memcpy(y, bits, static_cast<size_t>(n) * sizeof(float));
}

/// floatToBfloat16 (core/half.hpp) without branches, so that it vectorises: the same bits.
POPART_CLONES void narrow(const float *x, BFloat16 *y, int64_t n) {
  uint32_t bits[kBlock];
  std::memcpy(bits, x, static_cast<size_t>(n) * sizeof(float));
  auto *words = reinterpret_cast<uint16_t *>(y);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = bits[i];
    const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    const uint32_t quietNan = (b >> 16) | 0x40u;
    words[i] = static_cast<uint16_t>((b & 0x7fffffffu) > 0x7f800000u ? quietNan : rounded);
  }
}

/// The float values of \p x[0, n): \p x itself for float, else widened into \p buffer.
template <typename T> const float *floatsOf(const T *x, float *buffer, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    widen(x, buffer, n);
    return buffer;
  }
}
template <typename T> float *floatsOf(T *x, float *buffer, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    widen(x, buffer, n);
    return buffer;
  }
}
/// Stores the float values \p f (from floatsOf) back into \p x, rounded.
template <typename T> void storeFloats(const float *f, T *x, int64_t n) {
  if constexpr (!std::is_same_v<T, float>) narrow(f, x, n);
}

/// Runs \p step(g, w, s0, s1, count) on float views of elements [begin, end) of the gradient,
/// the weight and up to two state tensors (null when absent; \p S0 and \p S1 the weight's type
/// or FLOAT, each its own): in place when all are float, else in blocks widened on the stack and
/// rounded back.
template <typename T, typename S0, typename S1, typename Step>
void inFloatBlocks(const typename T::Grad *g, typename T::Weight *w, S0 *s0, S1 *s1, int64_t begin, int64_t end,
                   Step &&step) {
  using W = typename T::Weight;
  using G = typename T::Grad;
  if constexpr (std::is_same_v<W, float> && std::is_same_v<G, float> && std::is_same_v<S0, float> &&
                std::is_same_v<S1, float>) {
    step(g + begin, w + begin, s0 ? s0 + begin : nullptr, s1 ? s1 + begin : nullptr, end - begin);
  } else {
    float gBuffer[kBlock], wBuffer[kBlock], s0Buffer[kBlock], s1Buffer[kBlock];
    for (int64_t b = begin; b < end; b += kBlock) {
      const int64_t n = std::min(kBlock, end - b);
      const float *gf = floatsOf(g + b, gBuffer, n);
      float *wf = floatsOf(w + b, wBuffer, n);
      float *s0f = s0 ? floatsOf(s0 + b, s0Buffer, n) : nullptr;
      float *s1f = s1 ? floatsOf(s1 + b, s1Buffer, n) : nullptr;
      step(gf, wf, s0f, s1f, n);
      storeFloats(wf, w + b, n);
      if (s0) storeFloats(s0f, s0 + b, n);
      if (s1) storeFloats(s1f, s1 + b, n);
    }
  }
}

/// A member function that updates elements [begin, end) for one set of storage types.
template <typename K> using RangeFn = void (K::*)(const KernelArgs &, int64_t, int64_t);

Support supportsSgd(const ir::Op &op) {
  if (!updateTypesSupported(op)) return Support::no("weight, gradient and state types");
  return Support::yes();
}

/// SGDUpdate: hp = [lr, momentum, dampening, weightDecay, velocityScaling, firstStep]; the
/// velocity (input 4) is stored times velocityScaling and absent without momentum.
class FastSgdKernel : public UpdateKernel {
public:
  explicit FastSgdKernel(const ir::Op &op) : UpdateKernel(op), nesterov_(op.attrs.getInt("nesterov", 0) != 0) {
    dispatchUpdateTypes(op, [&](auto types) {
      using T = decltype(types);
      range_ = &FastSgdKernel::update<T>;
    });
  }
  void runRange(const KernelArgs &a, int64_t begin, int64_t end) override { (this->*range_)(a, begin, end); }

private:
  template <typename T> void update(const KernelArgs &a, int64_t begin, int64_t end) {
    const float *hp = a.in<float>(2);
    const float lr = hp[0], mom = hp[1], damp = hp[2], wd = hp[3], vs = hp[4];
    const bool first = hp[5] != 0.0f;
    const float gs = *a.in<float>(3);
    const bool nesterov = nesterov_;
    inFloatBlocks<T>(a.in<typename T::Grad>(1), a.out<typename T::Weight>(0), state<typename T::State>(a, 0),
                     static_cast<typename T::State *>(nullptr), begin, end,
                     [&](const float *g, float *w, float *v, float *, int64_t n) {
                       if (v)
                         sgdMomentum(g, w, v, n, gs, wd, lr, mom, damp, vs, first, nesterov);
                       else
                         sgdPlain(g, w, n, gs, wd, lr);
                     });
  }

  bool nesterov_;
  RangeFn<FastSgdKernel> range_ = nullptr;
};

Support supportsAdam(const ir::Op &op) {
  if (!updateTypesSupported(op)) return Support::no("weight, gradient and state types");
  if (op.attrs.getString("mode", "adam") != "adam") return Support::no("the fast kernel runs mode adam only");
  if (!op.hasOutput(1) || !op.hasOutput(2)) return Support::no("without both moments");
  return Support::yes();
}

/// AdamUpdate in mode "adam": hp = [lr, beta1, beta2, eps, weightDecay, 1-beta1^t, 1-beta2^t,
/// maxWeightNorm]; decoupled: weight decay as AdamW (1) or as L2 on the gradient (0). Large
/// updates are split into chunks over the threads; the plan may merge it with others through
/// runRange.
class FastAdamKernel : public UpdateKernel {
public:
  explicit FastAdamKernel(const ir::Op &op) : UpdateKernel(op), decoupled_(op.attrs.getInt("decoupled", 1) != 0) {
    dispatchUpdateTypes(op, [&](auto types) {
      using T = decltype(types);
      range_ = &FastAdamKernel::update<T>;
    });
  }
  void runRange(const KernelArgs &a, int64_t begin, int64_t end) override { (this->*range_)(a, begin, end); }

private:
  template <typename T> void update(const KernelArgs &a, int64_t begin, int64_t end) {
    const float *hp = a.in<float>(2);
    const float lr = hp[0], b1 = hp[1], b2 = hp[2], eps = hp[3], wd = hp[4], bc1 = hp[5], bc2 = hp[6];
    const float gs = *a.in<float>(3), l2 = decoupled_ ? 0.0f : wd;
    const float stepSize = lr / bc1, bc2Sqrt = std::sqrt(bc2), decay = decoupled_ ? 1.0f - lr * wd : 1.0f;
    inFloatBlocks<T>(a.in<typename T::Grad>(1), a.out<typename T::Weight>(0), a.out<typename T::State>(1),
                     a.out<typename T::SecondMoment>(2), begin, end,
                     [&](const float *g, float *w, float *m, float *v, int64_t n) {
                       vec::adamStep(g, w, m, v, n, gs, l2, b1, b2, decay, stepSize, bc2Sqrt, eps);
                     });
  }

  bool decoupled_;
  RangeFn<FastAdamKernel> range_ = nullptr;
};

// ---- GradientStatistics ----

/// Elements of \p bits (IEEE values of one width, \p Bits) whose magnitude bits are at least
/// \p threshold. One thread: the count is bound by memory, which one core reads at about 20 GB/s
/// (the MLP's 1.9 M fp32 gradients in 0.4 ms), and a parallel region per gradient measured 40x
/// slower on a loaded 2-core host, where its barrier waits for a descheduled thread.
template <typename Bits>
inline __attribute__((always_inline)) int64_t countAtOrAbove(const Bits *bits, int64_t n, Bits threshold) {
  constexpr Bits magnitude = std::numeric_limits<Bits>::max() >> 1;
  int64_t count = 0;
  for (int64_t c = 0; c < n; c += 16384) {
    const int64_t end = std::min(n, c + 16384);
    // 32-bit lanes vectorise where a 64-bit count would not; a chunk cannot overflow them.
    uint32_t inChunk = 0;
#pragma omp simd reduction(+ : inChunk)
    for (int64_t i = c; i < end; ++i)
      inChunk += static_cast<Bits>(bits[i] & magnitude) >= threshold ? 1u : 0u;
    count += inChunk;
  }
  return count;
}

// One clone set per width: target_clones takes no templates (clang).
POPART_CLONES int64_t countAtOrAbove32(const uint32_t *bits, int64_t n, uint32_t threshold) {
  return countAtOrAbove(bits, n, threshold);
}
POPART_CLONES int64_t countAtOrAbove16(const uint16_t *bits, int64_t n, uint16_t threshold) {
  return countAtOrAbove(bits, n, threshold);
}

/// The magnitude bits of the smallest value of \p type at or above \p edge (> 0, finite): inf's
/// if \p edge is above the type's largest finite value.
uint32_t thresholdBits(DataType type, float edge) {
  if (type == DataType::FLOAT) {
    uint32_t bits;
    std::memcpy(&bits, &edge, sizeof bits);
    return bits;
  }
  const bool half = type == DataType::FLOAT16;
  uint16_t bits = half ? floatToHalf(edge) : floatToBfloat16(edge); // nearest, maybe below the edge
  const float value = half ? halfToFloat(bits) : bfloat16ToFloat(bits);
  if (value < edge) ++bits; // the next larger magnitude (inf after the largest finite value)
  return bits;
}

/// Whether inputs \p first... of \p op are all FLOAT, FLOAT16 or BFLOAT16 (\p what names them).
Support floatInputsFrom(const ir::Op &op, size_t first, const char *what) {
  for (size_t k = first; k < op.inputCount(); ++k) {
    const DataType t = op.hasInput(k) ? op.inInfo(k).dataType() : DataType::UNDEFINED;
    if (t != DataType::FLOAT && t != DataType::FLOAT16 && t != DataType::BFLOAT16)
      return Support::no(std::string(what) + " of FLOAT, FLOAT16 or BFLOAT16");
  }
  return Support::yes();
}

/// One input counted against a threshold on its magnitude bits.
struct CountedInput {
  int64_t count;
  bool wide; ///< FLOAT (32-bit words), else a 16-bit type
  uint32_t threshold;

  int64_t atOrAbove(const void *bits) const {
    return wide ? countAtOrAbove32(static_cast<const uint32_t *>(bits), count, threshold)
                : countAtOrAbove16(static_cast<const uint16_t *>(bits), count, static_cast<uint16_t>(threshold));
  }
};

Support supportsGradientStatistics(const ir::Op &op) {
  if (op.inputCount() < 2 || op.inInfo(0).dataType() != DataType::INT64) return Support::no("counts type");
  return floatInputsFrom(op, 1, "gradients");
}

/// GradientStatistics: counts over every gradient (inputs 1...) of the elements below the edge
/// and at or above it (NaN and inf included), into the INT64 [2] counts (output 0).
class FastGradientStatisticsKernel : public Kernel {
public:
  explicit FastGradientStatisticsKernel(const ir::Op &op) {
    const float edge = op.attrs.getFloat("edge");
    for (size_t k = 1; k < op.inputCount(); ++k) {
      const TensorInfo &info = op.inInfo(k);
      inputs_.push_back(
          {info.elementCount(), info.dataType() == DataType::FLOAT, thresholdBits(info.dataType(), edge)});
    }
  }
  void run(const KernelArgs &a) override {
    int64_t total = 0, upper = 0;
    for (size_t k = 0; k < inputs_.size(); ++k) {
      total += inputs_[k].count;
      upper += inputs_[k].atOrAbove(a.in<uint8_t>(k + 1));
    }
    int64_t *out = a.out<int64_t>(0);
    out[0] = total - upper;
    out[1] = upper;
  }

private:
  std::vector<CountedInput> inputs_;
};

// ---- AllFinite ----

Support supportsAllFinite(const ir::Op &op) { return floatInputsFrom(op, 0, "inputs"); }

/// AllFinite: whether no element of any input is inf or NaN, by the same integer comparison as
/// GradientStatistics: a value is not finite when its magnitude bits are at least inf's (all
/// exponent bits set). Stops at the first input that has one.
class FastAllFiniteKernel : public Kernel {
public:
  explicit FastAllFiniteKernel(const ir::Op &op) {
    for (size_t k = 0; k < op.inputCount(); ++k) {
      const TensorInfo &info = op.inInfo(k);
      const DataType t = info.dataType();
      inputs_.push_back({info.elementCount(), t == DataType::FLOAT,
                         t == DataType::FLOAT ? 0x7f800000u : (t == DataType::FLOAT16 ? 0x7c00u : 0x7f80u)});
    }
  }
  void run(const KernelArgs &a) override {
    bool finite = true;
    for (size_t k = 0; k < inputs_.size() && finite; ++k)
      finite = inputs_[k].atOrAbove(a.in<uint8_t>(k)) == 0;
    *a.out<bool>(0) = finite;
  }

private:
  std::vector<CountedInput> inputs_; ///< thresholds: inf's bits
};

} // namespace

void registerFastVarUpdateKernels(KernelRegistry &r) {
  r.add({"ai.graphcore", "SGDUpdate", KernelProvider::Fast, supportsSgd, makeKernel<FastSgdKernel>});
  r.add({"ai.graphcore", "AdamUpdate", KernelProvider::Fast, supportsAdam, makeKernel<FastAdamKernel>});
  r.add({"ai.graphcore", "GradientStatistics", KernelProvider::Fast, supportsGradientStatistics,
         makeKernel<FastGradientStatisticsKernel>});
  r.add({"ai.graphcore", "AllFinite", KernelProvider::Fast, supportsAllFinite, makeKernel<FastAllFiniteKernel>});
}

} // namespace popart::backend_cpu
