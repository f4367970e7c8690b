// Fast kernels of fp16.16's products: FLOAT16 MatMul and Gemm whose partial sums are rounded to
// fp16 after every addition (internal_attr::kHalfPartials, PopART's partialsType half; set by
// markHalfPartials). The reference kernel does the same one element at a time at about 0.1 GFLOP/s;
// here each row of the result is computed 8 columns per AVX2 vector and up to 64 columns per pass
// over K, with F16C conversions: acc = half(acc + a·b) for p = 0, 1, ..., K - 1 in that order, as
// the reference. a·b of two fp16 values is exact in fp32 (22 significant bits, exponents within
// fp32's normal range), so the fused multiply-add rounds exactly as the reference's multiply then
// add, and the result is the reference's bit for bit. The epilogues (MatMul's fused bias, scale,
// Relu and residual; Gemm's alpha, beta·C and Relu) run per element as in the reference. B is read
// along its rows; a B stored column-major (transposed) is first copied into the scratch row-major.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/broadcast.hpp"
#include "core/half.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/ops/matmul_layout.hpp"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// Columns computed per pass over K: 8 vectors of 8 accumulators, which stay in registers.
constexpr int kVectors = 8;
constexpr int64_t kChunk = int64_t{8} * kVectors;

/// Whether the CPU has AVX2, FMA and F16C (cpuid leaf 1, ecx bit 29, for F16C).
bool hasVectorHalf() {
  __builtin_cpu_init();
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
  return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/// \p acc[0, 8·V) (in: the start values, out: the sums) += row \p a (K values at stride \p aCol) ·
/// the 8·V columns of B at \p b (rows at stride \p bRow), rounding every partial sum to fp16.
template <int V>
__attribute__((target("avx2,fma,f16c"))) void halfPartialsChunk(const uint16_t *a, int64_t aCol, const uint16_t *b,
                                                                int64_t bRow, int64_t k, float *acc) {
  __m256 r[V];
  for (int v = 0; v < V; ++v)
    r[v] = _mm256_loadu_ps(acc + ptrdiff_t{8} * v);
  for (int64_t p = 0; p < k; ++p) {
    const __m256 av = _mm256_set1_ps(_cvtsh_ss(a[p * aCol]));
    const uint16_t *bp = b + p * bRow;
    for (int v = 0; v < V; ++v) {
      const __m256 bv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(bp + ptrdiff_t{8} * v)));
      const __m256 sum = _mm256_fmadd_ps(av, bv, r[v]);
      r[v] = _mm256_cvtph_ps(_mm256_cvtps_ph(sum, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
  for (int v = 0; v < V; ++v)
    _mm256_storeu_ps(acc + ptrdiff_t{8} * v, r[v]);
}

using ChunkFn = void (*)(const uint16_t *, int64_t, const uint16_t *, int64_t, int64_t, float *);
constexpr ChunkFn kChunkFns[kVectors + 1] = {nullptr,
                                             halfPartialsChunk<1>,
                                             halfPartialsChunk<2>,
                                             halfPartialsChunk<3>,
                                             halfPartialsChunk<4>,
                                             halfPartialsChunk<5>,
                                             halfPartialsChunk<6>,
                                             halfPartialsChunk<7>,
                                             halfPartialsChunk<8>};

/// Row \p a times \p n columns of B (rows at stride \p bRow, columns contiguous) into \p acc, which
/// holds the start values: vectors of 8 columns, the last < 8 columns one at a time as the reference.
void halfPartialsRow(const uint16_t *a, int64_t aCol, const uint16_t *b, int64_t bRow, int64_t k, int64_t n,
                     float *acc) {
  int64_t j = 0;
  for (; j + 8 <= n; j += kChunk) {
    const int vectors = static_cast<int>(std::min<int64_t>(kVectors, (n - j) / 8));
    kChunkFns[vectors](a, aCol, b + j, bRow, k, acc + j);
    if (vectors < kVectors) {
      j += int64_t{8} * vectors;
      break;
    }
  }
  for (; j < n; ++j) {
    float s = acc[j];
    for (int64_t p = 0; p < k; ++p)
      s = halfToFloat(floatToHalf(s + halfToFloat(a[p * aCol]) * halfToFloat(b[p * bRow + j])));
    acc[j] = s;
  }
}

/// Why the kernel does not take \p op ("" if it does).
std::string whyNotHalfPartials(const ir::Op &op) {
  if (op.attrs.getInt(ir::internal_attr::kHalfPartials, 0) == 0) return "no fp16.16 partials (kHalfPartials)";
  for (size_t i = 0; i < 2; ++i)
    if (op.inInfo(i).dataType() != DataType::FLOAT16) return "operands not FLOAT16";
  const DataType y = op.outInfo(0).dataType();
  if (y != DataType::FLOAT16 && (op.type != "MatMul" || y != DataType::FLOAT)) return "Y not FLOAT16 (or FLOAT)";
  if (op.type == "MatMul") {
    if (op.hasInput(2) && op.inInfo(2).dataType() != DataType::FLOAT16) return "a bias not FLOAT16";
    if (op.hasInput(3) && op.inInfo(3).dataType() != y) return "a residual not of Y's type";
  } else if (op.hasInput(2) && op.inInfo(2).dataType() != DataType::FLOAT16) {
    return "C not FLOAT16";
  }
  if (op.outInfo(0).elementCount() == 0) return "an empty result";
  if (!hasVectorHalf()) return "no AVX2, FMA and F16C on this CPU";
  return {};
}

Support supportsHalfPartials(const ir::Op &op) { return Support::unless(whyNotHalfPartials(op)); }

class HalfPartialsKernel : public Kernel {
public:
  HalfPartialsKernel(const ir::Op &op, const KernelContext &context)
      : gemm_(op.type == "Gemm"), floatY_(op.outInfo(0).dataType() == DataType::FLOAT),
        threads_(std::max(1, context.threads)) {
    if (gemm_) {
      const bool transA = op.attrs.getInt("transA", 0) != 0, transB = op.attrs.getInt("transB", 0) != 0;
      g_.m = op.outInfo(0).dim(0);
      g_.n = op.outInfo(0).dim(1);
      g_.k = transA ? op.inInfo(0).dim(0) : op.inInfo(0).dim(1);
      g_.aRow = transA ? 1 : g_.k, g_.aCol = transA ? g_.m : 1;
      g_.bRow = transB ? 1 : g_.n, g_.bCol = transB ? g_.k : 1;
      g_.yRow = g_.n, g_.yCol = 1;
      alpha_ = op.attrs.getFloat("alpha", 1.f);
      beta_ = op.attrs.getFloat("beta", 1.f);
      if (op.hasInput(2)) cStrides_ = broadcastStrides(op.inInfo(2).shape(), {g_.m, g_.n});
    } else {
      g_ = ir::matMulGeometry(op);
      scale_ = op.fusion.scale.value_or(1.f);
    }
    relu_ = op.fusion.relu();
    packB_ = g_.bCol != 1 && g_.n > 1;
    // The scratch: B copied row-major (if it is not), then a row of partial sums per thread.
    accOffset_ = packB_ ? (g_.k * g_.n * 2 + 63) / 64 * 64 : 0;
    scratchBytes_ = accOffset_ + threads_ * ((g_.n * 4 + 63) / 64 * 64);
  }

  int64_t scratchBytes() const override { return scratchBytes_; }
  std::string choice() const override {
    return std::string("fp16 partials in AVX2 vectors") + (packB_ ? ", B copied row-major" : "");
  }

  void run(const KernelArgs &args) override {
    // In a plan the scratch is the arena's; outside one (tests, constant folding) the kernel's own.
    if (!args.scratch && owned_.empty()) owned_.resize(static_cast<size_t>(scratchBytes_ / 4 + 16));
    auto *scratch = static_cast<uint8_t *>(args.scratch ? args.scratch : owned_.data());
    auto *packed = reinterpret_cast<uint16_t *>(scratch);
    const int64_t accStride = (g_.n * 4 + 63) / 64 * 16; // floats per thread's row
    auto *accRows = reinterpret_cast<float *>(scratch + accOffset_);
    const auto *a = args.in<uint16_t>(0), *b = args.in<uint16_t>(1);
    const auto *addend = args.hasInput(2) ? args.in<uint16_t>(2) : nullptr; // MatMul's bias, Gemm's C
    const void *residual = !gemm_ && args.hasInput(3) ? args.inputs[3] : nullptr;
    void *y = args.outputs[0];
    const ir::MatMulGeometry &g = g_;
    int64_t packedOffset = -1; // the batch offset of B in `packed`
    for (size_t bi = 0; bi < g.offsetA.size(); ++bi) {
      const uint16_t *pb = b + g.offsetB[bi];
      int64_t bRow = g.bRow;
      if (packB_) {
        if (packedOffset != g.offsetB[bi]) {
#pragma omp parallel for schedule(static) num_threads(threads_) if (g.k * g.n > 65536)
          for (int64_t p = 0; p < g.k; ++p)
            for (int64_t j = 0; j < g.n; ++j)
              packed[p * g.n + j] = pb[p * g.bRow + j * g.bCol];
          packedOffset = g.offsetB[bi];
        }
        pb = packed, bRow = g.n;
      }
      const uint16_t *pa = a + g.offsetA[bi];
      const int64_t oy = g.offsetY[bi];
#pragma omp parallel for schedule(static) num_threads(threads_) if (g.m > 1 && g.m * g.n * g.k > 65536)
      for (int64_t i = 0; i < g.m; ++i) {
        float *acc = accRows + omp_get_thread_num() * accStride;
        for (int64_t j = 0; j < g.n; ++j)
          acc[j] = !gemm_ && addend ? halfToFloat(addend[j]) : 0.f;
        halfPartialsRow(pa + i * g.aRow, g.aCol, pb, bRow, g.k, g.n, acc);
        for (int64_t j = 0; j < g.n; ++j)
          store(acc[j], i, j, oy + i * g.yRow + j * g.yCol, addend, residual, y);
      }
    }
  }

private:
  /// The reference's epilogue of element (\p i, \p j), stored at \p at.
  void store(float acc, int64_t i, int64_t j, int64_t at, const uint16_t *addend, const void *residual, void *y) const {
    float v = 0;
    if (gemm_) {
      v = alpha_ * acc;
      if (addend) v += beta_ * halfToFloat(addend[i * cStrides_[0] + j * cStrides_[1]]);
    } else {
      v = scale_ == 1.f ? acc : acc * scale_;
    }
    if (relu_ && v < 0.f) v = 0.f; // NaN stays NaN
    if (residual)
      v +=
          floatY_ ? static_cast<const float *>(residual)[at] : halfToFloat(static_cast<const uint16_t *>(residual)[at]);
    if (floatY_)
      static_cast<float *>(y)[at] = v;
    else
      static_cast<uint16_t *>(y)[at] = floatToHalf(v);
  }

  bool gemm_, floatY_;
  int threads_;
  ir::MatMulGeometry g_;
  float scale_ = 1.f, alpha_ = 1.f, beta_ = 1.f;
  bool relu_ = false, packB_ = false;
  std::vector<int64_t> cStrides_{0, 0};
  int64_t accOffset_ = 0, scratchBytes_ = 0;
  std::vector<float> owned_;
};

} // namespace

void registerFastHalfPartialsKernels(KernelRegistry &r) {
  for (const char *t : {"MatMul", "Gemm"})
    r.add({"ai.onnx", t, KernelProvider::Fast, supportsHalfPartials, makeKernel<HalfPartialsKernel>});
}

} // namespace popart::backend_cpu
