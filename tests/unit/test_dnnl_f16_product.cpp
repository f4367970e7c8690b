// The FLOAT16 MatMul and Gemm kernel (backend_cpu/dnnl/matmul_f16.cpp: fp32 products of blocks
// widened from fp16) against the fp32 reference of the same op on the same fp16 inputs: every
// operand form and fusion, sizes whose blocks and panels leave edges, broadcast batches, a FLOAT
// output; its rounding bit for bit against core/half.hpp; and no allocation in run().

#include "fast_cases.hpp"
#include "kernel_compare.hpp"
#include "one_op.hpp"

#include "backend_cpu/kernel.hpp"
#include "core/half.hpp"
#include "core/tensordata.hpp"
#include "ir/graph.hpp"
#include "ir/internal_attributes.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace popart;
using backend_cpu::KernelProvider;

namespace {

constexpr DataType F16 = DataType::FLOAT16;
constexpr DataType F32 = DataType::FLOAT;

using test_ops::OneOp;

/// One op of its own graph reading stream inputs \p ins (shape {-1}: omitted); \p prepare sets
/// fusion fields before its setup.
OneOp makeOp(const std::string &type, const std::vector<TensorInfo> &ins, ir::Attributes attrs = {},
             const std::function<void(ir::Op &)> &prepare = {}) {
  return test_ops::makeOneOp(type, "ai.onnx", 13, ins, std::move(attrs), 1, {}, prepare);
}

TensorInfo omitted() { return TensorInfo(F32, {-1}); }

/// The entry oneDNN's provider chooses for \p op, and what declined.
backend_cpu::KernelChoice dnnlChoice(const ir::Op &op) {
  return backend_cpu::KernelRegistry::instance().choose(op, KernelProvider::Dnnl);
}

/// Expects the f16 kernel to take \p op and match the fp32 reference within the 16-bit tolerance
/// of a reduction of \p k terms.
void expectMatches(const ir::Op &op, int64_t k, unsigned seed = 1) {
  backend_cpu::KernelChoice choice = dnnlChoice(op);
  ASSERT_NE(choice.entry, nullptr) << op.type << ": oneDNN declined: " << choice.explanation();
  std::mt19937 rng(seed);
  kernel_compare::expectSixteenBitMatchesFp32Reference(
      KernelProvider::Dnnl, op, rng,
      [](size_t, std::mt19937 &r) { return std::uniform_real_distribution<float>(-2, 2)(r); },
      kernel_compare::sixteenBitTolerance(F16, k));
}

OneOp matMul(const Shape &a, const Shape &b, const std::function<void(ir::Op &)> &prepare = {},
             std::vector<TensorInfo> extra = {}) {
  std::vector<TensorInfo> ins{TensorInfo(F16, a), TensorInfo(F16, b)};
  ins.insert(ins.end(), extra.begin(), extra.end());
  return makeOp("MatMul", ins, {}, prepare);
}

} // namespace

TEST(DnnlHalfProduct, MatMulFormsMatchTheFp32Reference) {
  struct Case {
    Shape a, b;
  };
  for (const Case &c : std::vector<Case>{{{64, 96}, {96, 80}},
                                         {{7, 3}, {3, 5}},
                                         {{3, 17, 40}, {3, 40, 24}},     // batched
                                         {{2, 3, 17, 40}, {40, 24}},     // batch folded into rows
                                         {{2, 1, 17, 40}, {3, 40, 24}},  // both broadcast
                                         {{17, 40}, {2, 40, 24}},        // A broadcast
                                         {{40}, {40, 24}},               // vector A
                                         {{5, 40}, {40}},                // vector B
                                         {{3, 5, 40}, {40}},             // vector B, batched A
                                         {{1, 256}, {256, 1000}},        // one row
                                         {{300, 1100}, {1100, 1000}}}) { // row blocks and B panels, with edges
    OneOp o = matMul(c.a, c.b);
    SCOPED_TRACE(toString(c.a) + " x " + toString(c.b));
    expectMatches(*o.op, c.a.back());
  }
}

TEST(DnnlHalfProduct, MatMulTransposedOperandsInBlocksAndPanels) {
  // B of 4.4 MB in f32 goes in panels of 240 columns (two, then 40), A in blocks of 80 rows (then
  // 50): every block shape, with each operand stored transposed or not.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Shape a = ta ? Shape{2100, 130} : Shape{130, 2100}, b = tb ? Shape{520, 2100} : Shape{2100, 520};
      OneOp o = matMul(a, b, [&](ir::Op &op) {
        op.fusion.transA = ta;
        op.fusion.transB = tb;
      });
      SCOPED_TRACE(std::string("transA ") + (ta ? "1" : "0") + " transB " + (tb ? "1" : "0"));
      expectMatches(*o.op, 2100);
    }
  // Small ones, and a batched transposed B.
  OneOp small = matMul({33, 19}, {3, 21, 33}, [](ir::Op &op) {
    op.fusion.transA = true;
    op.fusion.transB = true;
  });
  expectMatches(*small.op, 33);
}

TEST(DnnlHalfProduct, MatMulFusions) {
  Shape a{37, 64}, b{64, 45};
  auto biasOp = [](ir::Op &op) { op.fusion.bias = true; };
  OneOp bias = matMul(a, b, biasOp, {TensorInfo(F16, {45})});
  expectMatches(*bias.op, 64);
  OneOp scaled = matMul(a, b, [](ir::Op &op) { op.fusion.scale = 0.125f; });
  expectMatches(*scaled.op, 64);
  OneOp relu = matMul(a, b,
                      [](ir::Op &op) {
                        op.fusion.bias = true;
                        op.fusion.activation.kind = ir::FusedActivation::Kind::Relu;
                      },
                      {TensorInfo(F16, {45})});
  expectMatches(*relu.op, 64);
  OneOp residual = matMul(a, b, [](ir::Op &op) { op.fusion.residual = true; }, {omitted(), TensorInfo(F16, {37, 45})});
  expectMatches(*residual.op, 64);
  OneOp everything = matMul({2, 37, 64}, b,
                            [](ir::Op &op) {
                              op.fusion.bias = true;
                              op.fusion.residual = true;
                              op.fusion.activation.kind = ir::FusedActivation::Kind::Relu;
                            },
                            {TensorInfo(F16, {45}), TensorInfo(F16, {2, 37, 45})});
  expectMatches(*everything.op, 64);
}

TEST(DnnlHalfProduct, MatMulPermutedOperandsAndResult) {
  // Attention's head split folded in (foldTransposesIntoMatMul): Q [2, 9, 3, 16] read as
  // [2, 3, 9, 16], K [2, 11, 3, 16] as [2, 3, 16, 11], the scores written as [2, 9, 3, 11].
  OneOp scores = matMul({2, 9, 3, 16}, {2, 11, 3, 16}, [](ir::Op &op) {
    op.fusion.permA = {0, 2, 1, 3};
    op.fusion.permB = {0, 2, 3, 1};
    op.fusion.permY = {0, 2, 1, 3};
    op.fusion.scale = 0.25f;
  });
  EXPECT_EQ(scores.op->outInfo(0).shape(), (Shape{2, 9, 3, 11}));
  expectMatches(*scores.op, 16);
  // Probabilities [2, 3, 9, 11] times V [2, 11, 3, 16] read as [2, 3, 11, 16].
  OneOp context = matMul({2, 3, 9, 11}, {2, 11, 3, 16}, [](ir::Op &op) { op.fusion.permB = {0, 2, 1, 3}; });
  expectMatches(*context.op, 11);
  // A permuted with its last axis moved: neither of A's matrix axes is contiguous.
  OneOp strided = matMul({16, 2, 9}, {16, 7}, [](ir::Op &op) { op.fusion.permA = {1, 2, 0}; });
  expectMatches(*strided.op, 16);
}

TEST(DnnlHalfProduct, MatMulWritesFloatOutput) {
  // Fusion::outputType (foldCastIntoMatMul): fp16 operands, the product rounded once, to fp32.
  for (bool big : {false, true}) {
    Shape a = big ? Shape{300, 1100} : Shape{2, 19, 40}, b = big ? Shape{1100, 1000} : Shape{40, 33};
    OneOp o = matMul(a, b,
                     [](ir::Op &op) {
                       op.fusion.outputType = DataType::FLOAT;
                       op.fusion.bias = true;
                     },
                     {TensorInfo(F16, {b.back()})});
    ASSERT_EQ(o.op->outInfo(0).dataType(), F32);
    expectMatches(*o.op, a.back());
  }
}

TEST(DnnlHalfProduct, GemmTransposesAlphaBetaCAndRelu) {
  for (int ta : {0, 1})
    for (int tb : {0, 1})
      for (const Shape &c : std::vector<Shape>{{}, {41}, {1, 41}, {29, 1}, {29, 41}}) {
        ir::Attributes attrs;
        attrs.set("transA", int64_t{ta});
        attrs.set("transB", int64_t{tb});
        attrs.set("alpha", 0.5f);
        attrs.set("beta", c.size() == 2 ? 1.5f : 1.f);
        Shape a = ta ? Shape{72, 29} : Shape{29, 72}, b = tb ? Shape{41, 72} : Shape{72, 41};
        DataType cType = c.size() == 1 ? F32 : F16; // C in FLOAT too
        OneOp o =
            makeOp("Gemm", {TensorInfo(F16, a), TensorInfo(F16, b), TensorInfo(cType, c)}, attrs, [&](ir::Op &op) {
              if (c == Shape{29, 41}) op.fusion.activation.kind = ir::FusedActivation::Kind::Relu;
            });
        SCOPED_TRACE("transA " + std::to_string(ta) + " transB " + std::to_string(tb) + " C " + toString(c));
        expectMatches(*o.op, 72);
      }
  OneOp noC = makeOp("Gemm", {TensorInfo(F16, {300, 1100}), TensorInfo(F16, {1000, 1100})}, [] {
    ir::Attributes attrs;
    attrs.set("transB", int64_t{1});
    return attrs;
  }());
  expectMatches(*noC.op, 1100);
}

TEST(DnnlHalfProduct, DeclinesHalfPartialsAndOtherTypes) {
  OneOp partials = matMul({8, 32}, {32, 8});
  partials.op->attrs.set(ir::internal_attr::kHalfPartials, int64_t{1});
  backend_cpu::KernelChoice choice = dnnlChoice(*partials.op);
  EXPECT_EQ(choice.entry, nullptr);
  std::string reasons;
  for (const auto &d : choice.declined)
    reasons += d + "; ";
  EXPECT_NE(reasons.find("fp16.16"), std::string::npos) << reasons;
  // The oneDNN MatMul entry hands FLOAT16 to the f16 kernel, and keeps bf16 and fp32 products.
  OneOp f16 = matMul({8, 32}, {32, 8});
  OneOp bf16 = makeOp("MatMul", {TensorInfo(DataType::BFLOAT16, {8, 32}), TensorInfo(DataType::BFLOAT16, {32, 8})});
  EXPECT_EQ(dnnlChoice(*f16.op).explanation(), "oneDNN");
  EXPECT_EQ(backend_cpu::createKernel(*f16.op, KernelProvider::Dnnl)->choice().rfind("fp32 blocks", 0), 0u);
  // Where oneDNN computes no bf16 (an AVX2-only CPU), bf16 is declined saying so, not blocked in f32.
  if (backend_cpu::dnnlComputesIn(DataType::BFLOAT16))
    EXPECT_EQ(backend_cpu::createKernel(*bf16.op, KernelProvider::Dnnl)->choice().find("fp32 blocks"),
              std::string::npos);
  else
    kernel_compare::expectDnnlDeclinesOnThisCpu(*bf16.op, DataType::BFLOAT16);
}

TEST(DnnlHalfProduct, RoundsLikeCoreHalf) {
  // K = 1: each result is one product of two fp16 values, exact in fp32, so Y must be exactly
  // floatToHalf of it: normal results, subnormal ones, underflow to ±0 and overflow to ±inf, each
  // rounded to nearest even. Operands over all exponents, both signs, no zeros, infinities or NaNs.
  const int64_t m = 61, n = 67;
  OneOp o = matMul({m, 1}, {1, n});
  std::mt19937 rng(7);
  auto randomHalf = [&] {
    for (;;) {
      auto bits = static_cast<uint16_t>(rng());
      if ((bits & 0x7c00u) != 0x7c00u && (bits & 0x7fffu) != 0) return bits;
    }
  };
  TensorData a(o.op->inInfo(0)), b(o.op->inInfo(1)), y(o.op->outInfo(0));
  for (int64_t i = 0; i < m; ++i)
    a.as<uint16_t>()[i] = randomHalf();
  for (int64_t j = 0; j < n; ++j)
    b.as<uint16_t>()[j] = randomHalf();
  auto kernel = backend_cpu::createKernel(*o.op, KernelProvider::Dnnl);
  const void *ins[2] = {a.data(), b.data()};
  void *outs[1] = {y.data()};
  kernel->run({ins, 2, outs, 1});
  int mismatches = 0, subnormal = 0, infinite = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      uint16_t want = floatToHalf(halfToFloat(a.as<uint16_t>()[i]) * halfToFloat(b.as<uint16_t>()[j]));
      uint16_t got = y.as<uint16_t>()[i * n + j];
      subnormal += (want & 0x7c00u) == 0 && (want & 0x3ffu) != 0;
      infinite += (want & 0x7fffu) == 0x7c00u;
      if (got != want && ++mismatches < 5) ADD_FAILURE() << i << ", " << j << ": " << got << " vs " << want;
    }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(subnormal, 0);
  EXPECT_GT(infinite, 0);
}

// ---------------------------------------------------------------------------------------------
// fp16.16's products (backend_cpu/fast/half_partials.cpp): partial sums rounded to fp16 after
// every addition, bit for bit the reference kernel's.

POPART_FAST_KERNEL_COMPARED("ai.onnx", "MatMul");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Gemm");

namespace {

/// Whether \p a and \p b hold the same values bit for bit, any NaN matching any NaN.
bool sameBits(const TensorData &a, const TensorData &b) {
  if (a.byteCount() != b.byteCount()) return false;
  const bool half = a.info().dataType() == F16;
  for (int64_t i = 0; i < a.info().elementCount(); ++i) {
    const float x = half ? halfToFloat(a.as<uint16_t>()[i]) : a.as<float>()[i];
    const float y = half ? halfToFloat(b.as<uint16_t>()[i]) : b.as<float>()[i];
    if (std::isnan(x) && std::isnan(y)) continue;
    if (std::memcmp(&x, &y, sizeof x) != 0) return false;
  }
  return true;
}

/// Marks \p op fp16.16 (kHalfPartials), expects the fast kernel to take it, and runs it and the
/// reference on the same inputs (uniform in ±\p range, with \p specials NaN and ±inf placed in A):
/// the results must be the same bits. The fast kernel runs twice, in a scratch of garbage.
void expectHalfPartialsLikeReference(ir::Op &op, float range = 2.f, bool specials = false, unsigned seed = 3) {
  op.attrs.set(ir::internal_attr::kHalfPartials, int64_t{1});
  backend_cpu::KernelChoice choice = backend_cpu::KernelRegistry::instance().choose(op, KernelProvider::Fast);
  ASSERT_NE(choice.entry, nullptr) << op.type << ": " << choice.explanation();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-range, range);
  std::vector<TensorData> inputs;
  std::vector<const void *> in;
  for (size_t i = 0; i < op.inputCount(); ++i) {
    inputs.emplace_back(op.hasInput(i) ? op.inInfo(i) : TensorInfo(F32, {0}));
    TensorData &t = inputs.back();
    for (int64_t k = 0; k < t.info().elementCount(); ++k) {
      float v = d(rng);
      if (specials && i == 0 && k % 97 == 5)
        v = k % 3 == 0 ? std::numeric_limits<float>::quiet_NaN()
                       : (k % 3 == 1 ? 1.f : -1.f) * std::numeric_limits<float>::infinity();
      if (t.info().dataType() == F16)
        t.as<uint16_t>()[k] = floatToHalf(v);
      else
        t.as<float>()[k] = v;
    }
    in.push_back(op.hasInput(i) ? t.data() : nullptr);
  }
  TensorData ref(op.outInfo(0)), out(op.outInfo(0));
  std::memset(out.data(), 0x7b, static_cast<size_t>(out.byteCount()));
  void *refp = ref.data(), *outp = out.data();
  backend_cpu::createKernel(op, KernelProvider::Reference)->run({in.data(), in.size(), &refp, 1});
  auto kernel = backend_cpu::createKernel(op, KernelProvider::Fast);
  std::vector<float> scratch(static_cast<size_t>(kernel->scratchBytes() / 4 + 16), 3e7f);
  void *aligned =
      reinterpret_cast<uint8_t *>(scratch.data()) + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  for (int run = 0; run < 2; ++run)
    kernel->run({in.data(), in.size(), &outp, 1, aligned});
  EXPECT_TRUE(sameBits(out, ref)) << op.type << " " << toString(op.inInfo(0).shape()) << " x "
                                  << toString(op.inInfo(1).shape()) << " (" << kernel->choice() << ")";
}

} // namespace

TEST(FastHalfPartials, MatMulFormsMatchTheReferenceBitForBit) {
  struct Case {
    Shape a, b;
  };
  // Columns: multiples of 8 and not, one chunk of 64 and more, a single one; K long enough for the
  // fp16 partials to saturate (|sum| over 2048 terms of ±2).
  for (const Case &c : std::vector<Case>{{{64, 96}, {96, 80}},
                                         {{7, 3}, {3, 5}},
                                         {{3, 17, 40}, {3, 40, 24}},
                                         {{2, 1, 17, 40}, {3, 40, 203}},
                                         {{17, 40}, {2, 40, 24}},
                                         {{40}, {40, 24}},
                                         {{5, 40}, {40}},
                                         {{1, 256}, {256, 1000}},
                                         {{9, 2048}, {2048, 72}}}) {
    OneOp o = matMul(c.a, c.b);
    expectHalfPartialsLikeReference(*o.op);
  }
  for (bool ta : {false, true})
    for (bool tb : {false, true}) { // a transposed B is copied row-major into the scratch first
      OneOp o =
          matMul(ta ? Shape{130, 21} : Shape{21, 130}, tb ? Shape{3, 77, 130} : Shape{3, 130, 77}, [&](ir::Op &op) {
            op.fusion.transA = ta;
            op.fusion.transB = tb;
          });
      expectHalfPartialsLikeReference(*o.op);
    }
}

TEST(FastHalfPartials, MatMulFusionsFloatOutputAndSpecialValues) {
  Shape a{37, 64}, b{64, 45};
  OneOp everything = matMul({2, 37, 64}, b,
                            [](ir::Op &op) {
                              op.fusion.bias = true;
                              op.fusion.residual = true;
                              op.fusion.scale = 0.125f;
                              op.fusion.activation.kind = ir::FusedActivation::Kind::Relu;
                            },
                            {TensorInfo(F16, {45}), TensorInfo(F16, {2, 37, 45})});
  expectHalfPartialsLikeReference(*everything.op);
  OneOp floatY = matMul(a, b,
                        [](ir::Op &op) {
                          op.fusion.outputType = DataType::FLOAT;
                          op.fusion.bias = true;
                        },
                        {TensorInfo(F16, {45})});
  expectHalfPartialsLikeReference(*floatY.op);
  // Large values overflow the fp16 partials to ±inf; NaN and ±inf in A propagate.
  OneOp big = matMul(a, b);
  expectHalfPartialsLikeReference(*big.op, 300.f, true);
}

TEST(FastHalfPartials, GemmTransposesAlphaBetaCAndRelu) {
  for (int ta : {0, 1})
    for (int tb : {0, 1})
      for (const Shape &c : std::vector<Shape>{{}, {41}, {29, 1}, {29, 41}}) {
        ir::Attributes attrs;
        attrs.set("transA", int64_t{ta});
        attrs.set("transB", int64_t{tb});
        attrs.set("alpha", 0.5f);
        attrs.set("beta", 1.5f);
        Shape a = ta ? Shape{72, 29} : Shape{29, 72}, b = tb ? Shape{41, 72} : Shape{72, 41};
        OneOp o = makeOp("Gemm", {TensorInfo(F16, a), TensorInfo(F16, b), TensorInfo(F16, c)}, attrs, [&](ir::Op &op) {
          if (c.size() == 2) op.fusion.activation.kind = ir::FusedActivation::Kind::Relu;
        });
        SCOPED_TRACE("transA " + std::to_string(ta) + " transB " + std::to_string(tb) + " C " + toString(c));
        expectHalfPartialsLikeReference(*o.op);
      }
}

TEST(FastHalfPartials, DeclinesWithoutHalfPartialsOrFloat16) {
  OneOp plain = matMul({8, 32}, {32, 8});
  EXPECT_FALSE(backend_cpu::KernelRegistry::instance().choose(*plain.op, KernelProvider::Fast).entry);
  OneOp bf16 = makeOp("MatMul", {TensorInfo(DataType::BFLOAT16, {8, 32}), TensorInfo(DataType::BFLOAT16, {32, 8})});
  bf16.op->attrs.set(ir::internal_attr::kHalfPartials, int64_t{1});
  EXPECT_FALSE(backend_cpu::KernelRegistry::instance().choose(*bf16.op, KernelProvider::Fast).entry);
}
