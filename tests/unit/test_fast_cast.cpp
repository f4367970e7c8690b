// The fast Cast kernel (backend_cpu/fast/cast.cpp) and its conversion loops (vecloops.hpp) against
// core/half.hpp and the reference kernel, bit for bit: every one of the 65536 16-bit patterns to
// FLOAT, and FLOAT to both 16-bit types on the special values (±0,
// subnormals, the edges of rounding and overflow, ±Inf, quiet and signalling NaNs) and on a few
// million random bit patterns.

#include "fast_cases.hpp"

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel.hpp"
#include "core/half.hpp"
#include "ir/graph.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace popart;

using backend_cpu::KernelProvider;

POPART_FAST_KERNEL_COMPARED("ai.onnx", "Cast");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "CastLike");

namespace {

int onnxNumber(DataType t) {
  switch (t) {
  case DataType::FLOAT: return 1;
  case DataType::FLOAT16: return 10;
  default: return 16; // BFLOAT16
  }
}

/// A graph with one Cast (or CastLike) of a [n] tensor of \p from to \p to, set up.
struct CastGraph {
  CastGraph(DataType from, DataType to, int64_t n, bool like = false) {
    ir::registerBuiltinOps();
    backend_cpu::registerBuiltinKernels();
    g.opsets()["ai.onnx"] = 19;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(from, {n}));
    if (like) {
      g.addTensor("like", ir::TensorKind::Stream, TensorInfo(to, {1}));
      op = &g.addOp("CastLike", "ai.onnx", 19, "cast", {}, {"x", "like"}, {"y"});
    } else {
      ir::Attributes a;
      a.set("to", static_cast<int64_t>(onnxNumber(to)));
      op = &g.addOp("Cast", "ai.onnx", 19, "cast", std::move(a), {"x"}, {"y"});
    }
    op->def->setup(*op);
  }
  ir::Graph g;
  ir::Op *op = nullptr;
};

/// Runs \p op's kernel of \p provider on the bytes of \p x, output bytes returned (started as garbage).
std::vector<uint8_t> runCast(const ir::Op &op, KernelProvider provider, const void *x) {
  auto kernel = backend_cpu::createKernel(op, provider);
  std::vector<uint8_t> y(static_cast<size_t>(op.outInfo(0).elementCount()) * dataTypeSize(op.outInfo(0).dataType()),
                         0xa5);
  uint16_t likeValue = 0;
  std::vector<const void *> in{x, &likeValue};
  void *out = y.data();
  kernel->run({in.data(), op.inputCount(), &out, 1});
  return y;
}

/// The 16-bit results of half.hpp for float bit patterns \p bits.
uint16_t referenceTo(DataType to, uint32_t bits) {
  float f = std::bit_cast<float>(bits);
  return to == DataType::BFLOAT16 ? floatToBfloat16(f) : floatToHalf(f);
}

uint32_t referenceFrom(DataType from, uint16_t h) {
  return std::bit_cast<uint32_t>(from == DataType::BFLOAT16 ? bfloat16ToFloat(h) : halfToFloat(h));
}

/// f32 bit patterns worth checking one by one: zeros, subnormals, normals at the edges of each 16-bit
/// type's range and of its rounding (halfway cases, both parities), the largest finite, Inf and NaNs.
std::vector<uint32_t> specialFloats() {
  std::vector<uint32_t> v{0x00000000u, 0x00000001u, 0x00000002u, 0x007fffffu, 0x00400000u, 0x00800000u, 0x00800001u,
                          0x7f7fffffu, 0x7f800000u, 0x7f800001u, 0x7fbfffffu, 0x7fc00000u, 0x7fffffffu, 0x7fc00001u,
                          0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x3f7fffffu, 0x7f7f8000u,
                          0x7f7f7fffu, 0x7f7fc000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477fffffu, 0x47800000u,
                          0x38800000u, 0x387fffffu, 0x387ff000u, 0x387fe000u, 0x33800000u, 0x33800001u, 0x33000000u,
                          0x33000001u, 0x32ffffffu, 0x33c00000u, 0x34000000u, 0x34200000u, 0x34400000u, 0x3f801000u,
                          0x3f803000u, 0x3f800fffu, 0x3f801001u, 0x00010000u, 0x00018000u, 0x00008000u, 0x0000ffffu};
  // Every exponent, with mantissas at and around each 16-bit type's halfway points.
  for (uint32_t e = 0; e < 256; ++e)
    for (uint32_t m : {0x0u, 0x1u, 0x7fffu, 0x8000u, 0x8001u, 0x18000u, 0xfffu, 0x1000u, 0x1001u, 0x3000u, 0x7fffffu,
                       0x400000u, 0x401000u, 0x7ff000u, 0x7fe000u, 0x7fefffu, 0x200000u, 0x100000u, 0x080000u})
      v.push_back((e << 23) | m);
  size_t count = v.size();
  for (size_t i = 0; i < count; ++i)
    v.push_back(v[i] | 0x80000000u); // and their negatives
  return v;
}

/// Floats from \p bits for the two narrowing casts, checked against half.hpp and the reference kernel.
void expectNarrowingExact(const std::vector<uint32_t> &bits, const std::string &what) {
  const auto n = static_cast<int64_t>(bits.size());
  for (DataType to : {DataType::BFLOAT16, DataType::FLOAT16}) {
    CastGraph cast(DataType::FLOAT, to, n);
    ASSERT_EQ(backend_cpu::KernelRegistry::instance().find(*cast.op)->provider, KernelProvider::Fast) << what;
    std::vector<uint8_t> fast = runCast(*cast.op, KernelProvider::Fast, bits.data());
    std::vector<uint8_t> ref = runCast(*cast.op, KernelProvider::Reference, bits.data());
    std::vector<uint16_t> got(bits.size());
    std::memcpy(got.data(), fast.data(), fast.size());
    int failures = 0;
    for (size_t i = 0; i < bits.size() && failures < 10; ++i)
      if (got[i] != referenceTo(to, bits[i])) {
        ++failures;
        ADD_FAILURE() << what << " to " << toString(to) << ": 0x" << std::hex << bits[i] << " gave 0x" << got[i]
                      << ", half.hpp 0x" << referenceTo(to, bits[i]);
      }
    EXPECT_EQ(fast, ref) << what << " to " << toString(to) << ": the fast kernel and the reference kernel differ";
  }
}

TEST(FastCast, EverySixteenBitPatternWidensExactly) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i)
    all[i] = static_cast<uint16_t>(i);
  for (DataType from : {DataType::BFLOAT16, DataType::FLOAT16}) {
    for (bool like : {false, true}) {
      CastGraph cast(from, DataType::FLOAT, 65536, like);
      std::vector<uint8_t> fast = runCast(*cast.op, KernelProvider::Fast, all.data());
      std::vector<uint8_t> ref = runCast(*cast.op, KernelProvider::Reference, all.data());
      std::vector<uint32_t> got(65536);
      std::memcpy(got.data(), fast.data(), fast.size());
      int failures = 0;
      for (uint32_t i = 0; i < 65536 && failures < 10; ++i)
        if (got[i] != referenceFrom(from, static_cast<uint16_t>(i))) {
          ++failures;
          ADD_FAILURE() << toString(from) << " 0x" << std::hex << i << " gave 0x" << got[i] << ", half.hpp 0x"
                        << referenceFrom(from, static_cast<uint16_t>(i));
        }
      EXPECT_EQ(fast, ref) << toString(from) << (like ? " CastLike" : " Cast") << " against the reference kernel";
    }
  }
}

TEST(FastCast, SpecialFloatsNarrowExactly) { expectNarrowingExact(specialFloats(), "special values"); }

TEST(FastCast, RandomFloatBitPatternsNarrowExactly) {
  unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::vector<uint32_t> bits(size_t{1} << 22); // 4M: also runs the kernel's chunks in parallel
  for (auto &b : bits)
    b = static_cast<uint32_t>(rng());
  // A quarter near the 16-bit types' subnormal and overflow ranges, where random patterns seldom land.
  std::uniform_int_distribution<uint32_t> nearSmall(0x32000000u, 0x39000000u), nearLarge(0x47000000u, 0x48000000u);
  for (size_t i = 0; i < bits.size() / 4; ++i)
    bits[i * 4] = (i % 2 ? nearSmall(rng) : nearLarge(rng)) | (static_cast<uint32_t>(rng()) & 0x80000000u);
  expectNarrowingExact(bits, "random bit patterns, seed " + std::to_string(seed));
}

TEST(FastCast, LoopsAgreeAtEveryOffsetAndLength) {
  // The vector body and the remainder of each loop, from unaligned starts.
  std::mt19937 rng(7);
  std::vector<uint32_t> bits(300);
  for (auto &b : bits)
    b = static_cast<uint32_t>(rng());
  std::vector<uint16_t> h(300);
  std::vector<float> f(300);
  for (int64_t start = 0; start < 17; ++start)
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{15}, int64_t{33}, int64_t{129}, int64_t{250}}) {
      const auto *x = reinterpret_cast<const float *>(bits.data()) + start;
      backend_cpu::vec::toBfloat16(x, h.data() + start, n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(h[start + i], floatToBfloat16(x[i])) << start << " " << n;
      backend_cpu::vec::toHalf(x, h.data() + start, n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(h[start + i], floatToHalf(x[i])) << start << " " << n;
      backend_cpu::vec::fromHalf(h.data() + start, f.data() + start, n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(f[start + i]), std::bit_cast<uint32_t>(halfToFloat(h[start + i])));
      std::vector<float> acc(300, 1.5f);
      backend_cpu::vec::accumulateHalf(h.data() + start, acc.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(acc[i]), std::bit_cast<uint32_t>(1.5f + halfToFloat(h[start + i])));
    }
}

TEST(FastCast, TakesOnlyTheFloatingPointPairs) {
  CastGraph toInt(DataType::FLOAT, DataType::FLOAT, 4);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*toInt.op, KernelProvider::Fast), nullptr);
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 19;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4}));
  ir::Attributes a;
  a.set("to", int64_t{7}); // INT64
  ir::Op &op = g.addOp("Cast", "ai.onnx", 19, "cast", std::move(a), {"x"}, {"y"});
  op.def->setup(op);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(op, KernelProvider::Fast), nullptr);
  CastGraph between(DataType::BFLOAT16, DataType::FLOAT16, 4); // no precision mode casts between them
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*between.op, KernelProvider::Fast), nullptr);
  // oneDNN keeps the bf16 → f32 cast, where its reorder is exact; the fast kernel takes the others.
  CastGraph widen(DataType::BFLOAT16, DataType::FLOAT, 4);
  EXPECT_NE(backend_cpu::KernelRegistry::instance().find(*widen.op, KernelProvider::Fast), nullptr);
  for (auto [from, to] : {std::pair{DataType::FLOAT, DataType::BFLOAT16},
                          {DataType::FLOAT, DataType::FLOAT16},
                          {DataType::FLOAT16, DataType::FLOAT}}) {
    CastGraph cast(from, to, 4);
    EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*cast.op)->provider, KernelProvider::Fast)
        << toString(from) << " to " << toString(to);
  }
}

} // namespace
