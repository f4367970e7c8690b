// Fast kernels: Cast and CastLike between FLOAT and BFLOAT16 or FLOAT16 (mixed precision's casts of
// master weights, weight gradients and the activations around fp32 ops), vectorised conversions
// (vecloops.hpp) that give core/half.hpp's bits for every input, in parallel chunks. oneDNN 2.6's
// reorders flush f32 subnormals (f32 → bf16) and lose the sign of zero (f16 ↔ f32), so its Cast
// kernel (dnnl/cast.cpp) takes only bf16 → f32, where it is exact (and as fast: both run at memory
// speed). BFLOAT16 ↔ FLOAT16, which no precision mode casts, stays with the reference kernel.

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"

#include <algorithm>
#include <cstdint>

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

/// One conversion loop of vecloops.hpp over n elements, in chunks of kChunk in parallel.
template <typename From, typename To> class CastKernel : public Kernel {
public:
  using Loop = void (*)(const From *, To *, int64_t);
  CastKernel(int64_t n, Loop loop) : n_(n), loop_(loop) {}
  void run(const KernelArgs &a) override {
    const From *x = a.in<From>(0);
    To *y = a.out<To>(0);
    const int64_t n = n_;
    // The conversion runs at memory speed: threads pay off from a few chunks up.
#pragma omp parallel for schedule(static) if (n > 2 * kChunk)
    for (int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c)
      loop_(x + c * kChunk, y + c * kChunk, std::min(kChunk, n - c * kChunk));
  }

private:
  static constexpr int64_t kChunk = 16384;
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

void registerFastCastKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "Cast", KernelProvider::Fast, supportsCast, createCast});
  r.add({"ai.onnx", "CastLike", KernelProvider::Fast, supportsCast, createCast});
}

} // namespace popart::backend_cpu
