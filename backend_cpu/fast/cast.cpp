// Fast kernels: Cast and CastLike between FLOAT and BFLOAT16 or FLOAT16 (mixed precision's casts of
// master weights, weight gradients and the activations around fp32 ops), vectorised conversions
// (vecloops.hpp) that give core/half.hpp's bits for every input, in parallel chunks. oneDNN 2.6's
// reorders flush f32 subnormals (f32 → bf16) and lose the sign of zero (f16 ↔ f32), so its Cast
// kernel (dnnl/cast.cpp) takes only bf16 → f32, where it is exact (and as fast: both run at memory
// speed). BFLOAT16 ↔ FLOAT16, which no precision mode casts, stays with the reference kernel.

#include "backend_cpu/convert.hpp"
#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"

#include <popart/error.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace popart::backend_cpu {

namespace {

bool sixteenBit(DataType t) { return t == DataType::BFLOAT16 || t == DataType::FLOAT16; }

Support supportsCast(const ir::Op &op) {
  if (!op.inInfo(0).isTensor()) return Support::no("not a tensor");
  DataType from = op.inInfo(0).dataType(), to = op.outInfo(0).dataType();
  if (!(from == DataType::FLOAT && sixteenBit(to)) && !(sixteenBit(from) && to == DataType::FLOAT))
    return Support::no("the fast Cast converts between FLOAT and BFLOAT16 or FLOAT16 only");
  return Support::yes();
}

/// \p loop over \p n elements in chunks, in parallel: the conversion runs at memory speed, so
/// threads pay off from a few chunks up.
template <typename From, typename To>
void convertChunks(void (*loop)(const From *, To *, int64_t), const From *x, To *y, int64_t n) {
  constexpr int64_t kChunk = 16384;
#pragma omp parallel for schedule(static) if (n > 2 * kChunk)
  for (int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c)
    loop(x + c * kChunk, y + c * kChunk, std::min(kChunk, n - c * kChunk));
}

/// One conversion loop of vecloops.hpp over the whole tensor.
template <typename From, typename To> class CastKernel : public Kernel {
public:
  using Loop = void (*)(const From *, To *, int64_t);
  CastKernel(int64_t n, Loop loop) : n_(n), loop_(loop) {}
  void run(const KernelArgs &a) override { convertChunks(loop_, a.in<From>(0), a.out<To>(0), n_); }

private:
  int64_t n_;
  Loop loop_;
};

template <typename From, typename To>
std::unique_ptr<Kernel> makeCast(int64_t n, void (*loop)(const From *, To *, int64_t)) {
  return std::make_unique<CastKernel<From, To>>(n, loop);
}

std::unique_ptr<Kernel> createCast(const ir::Op &op) {
  const int64_t n = op.inInfo(0).elementCount();
  DataType from = op.inInfo(0).dataType(), to = op.outInfo(0).dataType();
  using DT = DataType;
  if (from == DT::FLOAT && to == DT::BFLOAT16) return makeCast(n, vec::toBfloat16);
  if (from == DT::FLOAT && to == DT::FLOAT16) return makeCast(n, vec::toHalf);
  if (from == DT::BFLOAT16 && to == DT::FLOAT) return makeCast(n, vec::fromBfloat16);
  return makeCast(n, vec::fromHalf); // FLOAT16 → FLOAT, the last pair supportsCast takes
}

} // namespace

void convertElements(DataType from, const void *src, DataType to, void *dst, int64_t n) {
  using DT = DataType;
  const auto *f = static_cast<const float *>(src);
  const auto *h = static_cast<const uint16_t *>(src);
  if (from == to)
    std::memcpy(dst, src, static_cast<size_t>(n) * dataTypeSize(from));
  else if (from == DT::FLOAT && to == DT::BFLOAT16)
    convertChunks(vec::toBfloat16, f, static_cast<uint16_t *>(dst), n);
  else if (from == DT::FLOAT && to == DT::FLOAT16)
    convertChunks(vec::toHalf, f, static_cast<uint16_t *>(dst), n);
  else if (from == DT::BFLOAT16 && to == DT::FLOAT)
    convertChunks(vec::fromBfloat16, h, static_cast<float *>(dst), n);
  else if (from == DT::FLOAT16 && to == DT::FLOAT)
    convertChunks(vec::fromHalf, h, static_cast<float *>(dst), n);
  else
    throw error("convertElements: no conversion from ", toString(from), " to ", toString(to));
}

void registerFastCastKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "Cast", KernelProvider::Fast, supportsCast, createCast});
  r.add({"ai.onnx", "CastLike", KernelProvider::Fast, supportsCast, createCast});
}

} // namespace popart::backend_cpu
