#pragma once
// Conversion loops between fp16 and f32 blocks for the FLOAT16 kernels that compute in fp32: those
// on oneDNN's f32 primitives (dnnl/matmul_f16.cpp, dnnl/conv_f16.cpp) and the fast 16-bit
// BatchNormalization (fast/norm.cpp), so they live with the fast kernels, which use no oneDNN: widening a run of fp16
// values, and narrowing a run of f32 results with an epilogue (scale, bias or addend, Relu, residual) applied on the
// way, both picked once for the CPU (AVX-512, AVX2 with F16C, or plain C++).

#include <cstdint>

namespace popart::backend_cpu::half_blocks {

/// Elements below which a conversion pass runs on one thread: one thread converts 128 Ki elements
/// in some 50 µs, and an OpenMP region costs microseconds, far more on a loaded machine.
constexpr int64_t kThreadedElements = int64_t{1} << 17;

/// What is applied to each f32 product element v on its way to Y:
/// relu(alpha·v + beta·addend) + residual, then Y's type.
struct Epilogue {
  float alpha = 1.f, beta = 1.f;
  bool relu = false;
  const void *addend = nullptr; ///< this row's first element; null: none
  bool addendHalf = false;
  int64_t addendStride = 0;       ///< 0 (broadcast along the row) or 1
  const void *residual = nullptr; ///< this row's first element, Y's type and layout; null: none
  void *y = nullptr;              ///< this row's first element
  bool yHalf = true;
  int64_t yStride = 1; ///< elements between Y's (and the residual's) columns
};

/// \p n fp16 values from \p src widened into \p dst (plain C++).
void widenScalar(const uint16_t *src, float *dst, int64_t n);
/// The row \p acc of \p cols f32 values through \p e into its Y (plain C++).
void epilogueScalar(const float *acc, int64_t cols, const Epilogue &e);

/// The conversion loops this CPU runs best.
struct HalfLoops {
  void (*widen)(const uint16_t *, float *, int64_t) = widenScalar;
  void (*epilogue)(const float *, int64_t, const Epilogue &) = epilogueScalar;
};

/// The loops for this CPU: AVX-512 or AVX2 with F16C and FMA where it has them, else plain C++.
HalfLoops halfLoops();

} // namespace popart::backend_cpu::half_blocks
