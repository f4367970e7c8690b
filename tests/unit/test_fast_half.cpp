// The fast 16-bit block kernels (backend_cpu/fast/half.cpp) against the fp32 reference kernel of
// each op's fp32 twin on the widened inputs: every op the family registers in FLOAT16, and the
// pools and MaxPoolGrad (with a fused Relu gradient too) in BFLOAT16, on shapes that need several
// blocks and a shorter last one, broadcasting binary ops, mixed FLOAT statistics, two threads, and
// NaN and infinite inputs.

#include "fast_cases.hpp"
#include "kernel_compare.hpp"
#include "one_op.hpp"

#include "backend_cpu/kernel.hpp"
#include "core/half.hpp"
#include "ir/graph.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace popart;
using backend_cpu::KernelProvider;

POPART_FAST_KERNEL_COMPARED("ai.onnx", "Relu");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "LeakyRelu");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Elu");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Tanh");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Sigmoid");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Exp");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Sqrt");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Abs");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Neg");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Softplus");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "HardSwish");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "HardSigmoid");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Erf");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Clip");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Pow");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "Gelu");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "ActivationGrad");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Softmax");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "LogSoftmax");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "SoftmaxGrad");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "LogSoftmaxGrad");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "LayerNormalization");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "LayerNormalizationGrad");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "MaxPool");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Sum");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Mean");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "AveragePool");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "GlobalAveragePool");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "MaxPoolGrad");

namespace {

constexpr DataType F16 = DataType::FLOAT16;
constexpr DataType BF16 = DataType::BFLOAT16;
constexpr DataType F32 = DataType::FLOAT;

using test_ops::OneOp;

/// \p type of \p domain over stream inputs \p ins (constants where \p consts gives them, omitted
/// where the shape is {-1}), with \p outputs outputs (empty ids in \p omittedOutputs).
OneOp makeOp(const std::string &type, const std::string &domain, int opset, const std::vector<TensorInfo> &ins,
             ir::Attributes attrs = {}, size_t outputs = 1, const std::map<size_t, TensorData> &consts = {},
             const std::vector<size_t> &omittedOutputs = {}, const std::function<void(ir::Op &)> &prepare = {}) {
  return test_ops::makeOneOp(type, domain, opset, ins, std::move(attrs), outputs, consts, prepare, omittedOutputs);
}

/// Gives \p op the Relu's gradient that fuseMaxPoolGradRelu folds into MaxPoolGrad.
void fuseRelu(ir::Op &op) { op.fusion.activation.kind = ir::FusedActivation::Kind::Relu; }

/// \p v rounded to 16-bit \p type, as bits.
uint16_t narrowed(DataType type, float v) { return type == BF16 ? floatToBfloat16(v) : floatToHalf(v); }
/// 16-bit \p bits of \p type widened.
float widened(DataType type, uint16_t bits) { return type == BF16 ? bfloat16ToFloat(bits) : halfToFloat(bits); }

std::function<float(size_t, std::mt19937 &)> uniform(float lo, float hi) {
  return [lo, hi](size_t, std::mt19937 &r) { return std::uniform_real_distribution<float>(lo, hi)(r); };
}

/// An omitted optional input.
TensorInfo omitted() { return TensorInfo(F32, {-1}); }

double tol(int64_t k = 1) { return kernel_compare::sixteenBitTolerance(F16, k); }
double tolBf16(int64_t k = 1) { return kernel_compare::sixteenBitTolerance(BF16, k); }

/// Expects the fast block kernel, and nothing ranked above it, to run \p op, in several blocks
/// unless \p oneBlock.
void expectChosen(const ir::Op &op, bool oneBlock = false) {
  const auto &registry = backend_cpu::KernelRegistry::instance();
  const backend_cpu::KernelEntry *e = registry.find(op);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->provider, KernelProvider::Fast) << op.type << ": " << registry.choose(op).explanation();
  auto kernel = backend_cpu::createKernel(op, KernelProvider::Fast);
  EXPECT_NE(kernel->choice().find("f32 blocks"), std::string::npos) << op.type << ": " << kernel->choice();
  EXPECT_EQ(kernel->choice().rfind("1 f32 blocks", 0) == 0, oneBlock) << op.type << ": " << kernel->choice();
}

/// The fast kernel against the fp32 reference on the widened inputs.
void expectHalf(const ir::Op &op, double tolerance, const std::function<float(size_t, std::mt19937 &)> &fill,
                bool oneBlock = false) {
  SCOPED_TRACE(op.type + " " + toString(op.outInfo(0).shape()));
  expectChosen(op, oneBlock);
  std::mt19937 rng(7);
  kernel_compare::expectSixteenBitMatchesFp32Reference(KernelProvider::Fast, op, rng, fill, tolerance);
}

/// Runs \p op's fast kernel on \p threads threads and its fp32 twin's \p oracle kernel (the
/// reference, or the f32 kernel Any chooses) on the widened inputs \p values (16-bit inputs
/// rounded from them first; NaN and infinities allowed), and expects every 16-bit output to be the
/// oracle's narrowed once: NaN where it is NaN, the same infinity, else within \p tolerance relative.
void expectHalfWithSpecials(const ir::Op &op, const std::vector<std::vector<float>> &values, int threads,
                            double tolerance, KernelProvider oracle = KernelProvider::Reference) {
  SCOPED_TRACE(op.type + " on " + std::to_string(threads) + " threads");
  kernel_compare::Fp32Twin twin = kernel_compare::fp32Twin(op);
  std::vector<TensorData> in, wide;
  for (size_t i = 0; i < op.inputCount(); ++i) {
    in.emplace_back(op.inInfo(i));
    wide.emplace_back(TensorInfo(F32, op.inInfo(i).shape()));
    for (int64_t k = 0; k < op.inInfo(i).elementCount(); ++k) {
      float v = values[i][static_cast<size_t>(k)];
      if (DataType t = op.inInfo(i).dataType(); t == F16 || t == BF16) {
        uint16_t h = narrowed(t, v);
        in.back().as<uint16_t>()[k] = h;
        v = widened(t, h);
      } else {
        in.back().as<float>()[k] = v;
      }
      wide.back().as<float>()[k] = v;
    }
  }
  std::vector<const void *> inp, widep;
  for (size_t i = 0; i < in.size(); ++i) {
    inp.push_back(in[i].data());
    widep.push_back(wide[i].data());
  }
  std::vector<TensorData> refs, outs;
  std::vector<void *> refp, outp;
  for (size_t i = 0; i < op.outputCount(); ++i) {
    refs.emplace_back(op.hasOutput(i) ? twin.op->outInfo(i) : TensorInfo(F32, {0}));
    outs.emplace_back(op.hasOutput(i) ? op.outInfo(i) : TensorInfo(F32, {0}));
    refp.push_back(op.hasOutput(i) ? refs.back().data() : nullptr);
    outp.push_back(op.hasOutput(i) ? outs.back().data() : nullptr);
  }
  auto oracleKernel = backend_cpu::createKernel(*twin.op, oracle);
  std::vector<uint8_t> oracleScratch(static_cast<size_t>(oracleKernel->scratchBytes()) + 64);
  oracleKernel->run({widep.data(), widep.size(), refp.data(), refp.size(),
                     oracleScratch.data() + (64 - reinterpret_cast<uintptr_t>(oracleScratch.data()) % 64) % 64});
  backend_cpu::KernelContext context;
  context.threads = threads;
  auto kernel = backend_cpu::createKernel(op, KernelProvider::Fast, context);
  std::vector<uint8_t> scratch(static_cast<size_t>(kernel->scratchBytes()) + 64);
  void *aligned = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  kernel->run({inp.data(), inp.size(), outp.data(), outp.size(), aligned});
  for (size_t o = 0; o < op.outputCount(); ++o) {
    if (!op.hasOutput(o)) continue;
    int bad = 0;
    for (int64_t k = 0; k < op.outInfo(o).elementCount() && bad < 5; ++k) {
      const DataType t = op.outInfo(o).dataType();
      float want = widened(t, narrowed(t, refs[o].as<float>()[k])), got = widened(t, outs[o].as<uint16_t>()[k]);
      bool ok = std::isnan(want)   ? std::isnan(got)
                : std::isinf(want) ? got == want
                                   : !std::isnan(got) && kernel_compare::relDiff(got, want) < tolerance;
      if (!ok) {
        ++bad;
        ADD_FAILURE() << "output " << o << " element " << k << ": got " << got << ", want " << want;
      }
    }
  }
}

/// \p n values from \p fill with NaN, +Inf and −Inf at a few places (after the first block too).
std::vector<float> withSpecials(int64_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float &x : v)
    x = std::uniform_real_distribution<float>(lo, hi)(rng);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t at : {int64_t{3}, n / 2 + 1, n - 2}) {
    v[static_cast<size_t>(at)] = std::numeric_limits<float>::quiet_NaN();
    v[static_cast<size_t>(at + 1) % v.size()] = inf;
    v[static_cast<size_t>(at + 5) % v.size()] = -inf;
  }
  return v;
}

} // namespace

// 3 × 25000 elements: unary blocks hold 32768 (two f32 copies), so two full blocks and a tail.
TEST(FastHalf, UnaryActivationsInBlocks) {
  Shape s{3, 25000};
  for (const char *t : {"Relu", "LeakyRelu", "Elu", "Tanh", "Sigmoid", "Exp", "Abs", "Neg", "Softplus", "HardSwish",
                        "HardSigmoid", "Erf"}) {
    OneOp o = makeOp(t, "ai.onnx", 13, {TensorInfo(F16, s)});
    expectHalf(*o.op, tol(4), uniform(-4, 4));
  }
  OneOp sqrt = makeOp("Sqrt", "ai.onnx", 13, {TensorInfo(F16, s)});
  expectHalf(*sqrt.op, tol(4), uniform(0.01f, 8));
  OneOp gelu = makeOp("Gelu", "ai.graphcore", 1, {TensorInfo(F16, s)});
  expectHalf(*gelu.op, tol(4), uniform(-4, 4));
  std::map<size_t, TensorData> bounds{{1, TensorData::fromDoubles(F16, {}, {0.0})},
                                      {2, TensorData::fromDoubles(F16, {}, {6.0})}};
  OneOp clip =
      makeOp("Clip", "ai.onnx", 13, {TensorInfo(F16, s), TensorInfo(F16, {}), TensorInfo(F16, {})}, {}, 1, bounds);
  expectHalf(*clip.op, tol(), uniform(-8, 8));
  OneOp pow = makeOp("Pow", "ai.onnx", 13, {TensorInfo(F16, s), TensorInfo(F32, {})}, {}, 1,
                     {{1, TensorData::scalarFloat(2.f)}});
  expectHalf(*pow.op, tol(4), uniform(-3, 3));
}

TEST(FastHalf, ActivationGradientsInBlocks) {
  Shape s{5, 13001};
  for (const char *act : {"Relu", "Elu", "Tanh", "Sigmoid", "Exp", "Sqrt", "LeakyRelu", "Abs", "Gelu", "Clip"}) {
    ir::Attributes attrs;
    attrs.set("activation", std::string(act));
    if (std::string(act) == "Clip") {
      attrs.set("alpha", -1.f);
      attrs.set("beta", 1.f);
    }
    OneOp o = makeOp("ActivationGrad", "ai.graphcore", 1, {TensorInfo(F16, s), TensorInfo(F16, s)}, attrs);
    std::string a = act;
    bool positive = a == "Sqrt" || a == "Exp", unit = a == "Sigmoid" || a == "Tanh";
    expectHalf(*o.op, tol(4), [&](size_t i, std::mt19937 &r) {
      float lo = i == 1 ? -2.f : positive ? 0.1f : unit ? -0.9f : -2.f, hi = i == 1 ? 2.f : unit ? 0.9f : 2.f;
      if (a == "Sigmoid" && i == 0) lo = 0.05f;
      return std::uniform_real_distribution<float>(lo, hi)(r);
    });
  }
}

TEST(FastHalf, BinaryOpsWithBroadcasts) {
  struct Case {
    Shape a, b;
  };
  for (const Case &c : std::vector<Case>{{{4, 23000}, {4, 23000}}, // same shape: every element a row
                                         {{3, 200, 129}, {129}},   // a trailing row broadcast
                                         {{3, 200, 129}, {}},      // a scalar
                                         {{600, 129}, {600, 1}},   // one value per row
                                         {{2, 300, 129}, {1, 1, 129}}})
    for (const char *t : {"Add", "Sub", "Mul", "Div"}) {
      OneOp o = makeOp(t, "ai.onnx", 13, {TensorInfo(F16, c.a), TensorInfo(F16, c.b)});
      SCOPED_TRACE(toString(c.a) + " " + t + " " + toString(c.b));
      expectHalf(*o.op, tol(2), [t](size_t i, std::mt19937 &r) {
        // Divisors away from 0, so that the quotient's rounding is what is compared.
        bool divisor = i == 1 && std::string(t) == "Div";
        float v = std::uniform_real_distribution<float>(divisor ? 0.5f : -3.f, 3.f)(r);
        return divisor && (r() & 1) ? -v : v;
      });
    }
  // A constant FLOAT16 divisor (BERT's attention scale).
  OneOp scaled = makeOp("Div", "ai.onnx", 13, {TensorInfo(F16, {8, 4, 64, 64}), TensorInfo(F16, {})}, {}, 1,
                        {{1, TensorData::fromDoubles(F16, {}, {8.0})}});
  expectHalf(*scaled.op, tol(2), uniform(-40, 40));
}

// The variadic ops (Sum accumulates the gradient contributions of a tensor read twice) over
// operands of one shape (with broadcasts their f32 twin is the reference kernel: declined).
TEST(FastHalf, VariadicOpsInBlocks) {
  for (const char *t : {"Sum", "Mean"}) {
    OneOp o = makeOp(t, "ai.onnx", 13,
                     {TensorInfo(F16, {5, 13001}), TensorInfo(F16, {5, 13001}), TensorInfo(F16, {5, 13001})});
    SCOPED_TRACE(t);
    expectHalf(*o.op, tol(3), uniform(-3, 3));
  }
}

// 7 × 111 rows of 100: softmax blocks hold 320 rows, so two full blocks and a tail.
TEST(FastHalf, SoftmaxFamilyOverRows) {
  Shape s{7, 111, 100};
  for (const char *t : {"Softmax", "LogSoftmax"}) {
    OneOp o = makeOp(t, "ai.onnx", 13, {TensorInfo(F16, s)});
    expectHalf(*o.op, tol(100), uniform(-6, 6));
    ir::Attributes middle;
    middle.set("axis", int64_t{1}); // rows are the 7 leading indices, each [111, 100]
    OneOp m = makeOp(t, "ai.onnx", 13, {TensorInfo(F16, {40, 33, 100})}, middle);
    expectHalf(*m.op, tol(100), uniform(-6, 6));
    OneOp old = makeOp(t, "ai.onnx", 11, {TensorInfo(F16, {400, 3, 100})}); // opset 11: axis 1, flattened
    expectHalf(*old.op, tol(300), uniform(-6, 6));
  }
  // A single row (batch-1 inference's classifier): one block, every tensor whole and blocked alike.
  OneOp single = makeOp("Softmax", "ai.onnx", 13, {TensorInfo(F16, {1, 3000})});
  expectHalf(*single.op, tol(3000), uniform(-6, 6), true);
  OneOp lnSingle = makeOp("LayerNormalizationGrad", "ai.graphcore", 1,
                          {TensorInfo(F16, {1, 500}), TensorInfo(F16, {500}), TensorInfo(F16, {1, 500})}, {}, 3);
  expectHalf(*lnSingle.op, tol(500), uniform(-2, 2), true);
  for (const char *t : {"SoftmaxGrad", "LogSoftmaxGrad"}) {
    OneOp o = makeOp(t, "ai.graphcore", 1, {TensorInfo(F16, s), TensorInfo(F16, s)});
    bool log = std::string(t) == "LogSoftmaxGrad";
    expectHalf(*o.op, tol(100), [log](size_t i, std::mt19937 &r) {
      // Y: a softmax output (probabilities, or their logarithms).
      float v = std::uniform_real_distribution<float>(i == 0 ? 0.f : -2.f, i == 0 ? 0.02f : 2.f)(r);
      return i == 0 && log ? std::log(v + 1e-3f) : v;
    });
  }
}

// The pools in blocks of images: [20, 16, 24, 24] is 36 KiB of f32 input per image, so several
// blocks and a shorter last one. Max picks one of its inputs (exact); averages sum a window.
TEST(FastHalf, PoolsAndTheirGradientsOverBlocksOfImages) {
  const Shape x{20, 16, 24, 24}, pooled{20, 16, 12, 12};
  ir::Attributes tiled; // windows that tile the plane
  tiled.set("kernel_shape", std::vector<int64_t>{2, 2});
  tiled.set("strides", std::vector<int64_t>{2, 2});
  ir::Attributes overlapping; // 3x3 windows at stride 2 with padding
  overlapping.set("kernel_shape", std::vector<int64_t>{3, 3});
  overlapping.set("strides", std::vector<int64_t>{2, 2});
  overlapping.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  for (const ir::Attributes &attrs : {tiled, overlapping}) {
    OneOp max = makeOp("MaxPool", "ai.onnx", 12, {TensorInfo(F16, x)}, attrs);
    expectHalf(*max.op, tol(), uniform(-4, 4));
    OneOp avg = makeOp("AveragePool", "ai.onnx", 11, {TensorInfo(F16, x)}, attrs);
    expectHalf(*avg.op, tol(9), uniform(-4, 4));
    ir::Attributes gradAttrs = attrs; // the gradient op carries the forward's attributes in full
    gradAttrs.set("dilations", std::vector<int64_t>{1, 1});
    if (!gradAttrs.has("pads")) gradAttrs.set("pads", std::vector<int64_t>{0, 0, 0, 0});
    OneOp maxGrad = makeOp("MaxPoolGrad", "ai.graphcore", 1, {TensorInfo(F16, x), TensorInfo(F16, pooled)}, gradAttrs);
    expectHalf(*maxGrad.op, tol(9), uniform(-4, 4));
  }
  OneOp global = makeOp("GlobalAveragePool", "ai.onnx", 13, {TensorInfo(F16, x)});
  expectHalf(*global.op, tol(24 * 24), uniform(-4, 4));
}

// The pools and MaxPoolGrad in BFLOAT16 over blocks of images, asked of the fast family by name
// (oneDNN, ranked above it, takes the unfused ones); max picks one input (exact), averages sum a
// window.
TEST(FastHalf, Bf16PoolsAndTheirGradientsOverBlocksOfImages) {
  const Shape x{20, 16, 24, 24}, pooled{20, 16, 12, 12};
  ir::Attributes tiled;
  tiled.set("kernel_shape", std::vector<int64_t>{2, 2});
  tiled.set("strides", std::vector<int64_t>{2, 2});
  ir::Attributes overlapping;
  overlapping.set("kernel_shape", std::vector<int64_t>{3, 3});
  overlapping.set("strides", std::vector<int64_t>{2, 2});
  overlapping.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  auto expectBlocks = [](const ir::Op &op, double tolerance) {
    SCOPED_TRACE(op.type + " " + toString(op.inInfo(0).shape()));
    auto kernel = backend_cpu::createKernel(op, KernelProvider::Fast);
    EXPECT_NE(kernel->choice().find("f32 blocks"), std::string::npos) << kernel->choice();
    EXPECT_NE(kernel->choice().rfind("1 f32 blocks", 0), 0u) << kernel->choice();
    std::mt19937 rng(7);
    kernel_compare::expectSixteenBitMatchesFp32Reference(KernelProvider::Fast, op, rng, uniform(-4, 4), tolerance);
  };
  for (const ir::Attributes &attrs : {tiled, overlapping}) {
    expectBlocks(*makeOp("MaxPool", "ai.onnx", 12, {TensorInfo(BF16, x)}, attrs).op, tolBf16());
    expectBlocks(*makeOp("AveragePool", "ai.onnx", 11, {TensorInfo(BF16, x)}, attrs).op, tolBf16(9));
    ir::Attributes gradAttrs = attrs;
    gradAttrs.set("dilations", std::vector<int64_t>{1, 1});
    if (!gradAttrs.has("pads")) gradAttrs.set("pads", std::vector<int64_t>{0, 0, 0, 0});
    expectBlocks(
        *makeOp("MaxPoolGrad", "ai.graphcore", 1, {TensorInfo(BF16, x), TensorInfo(BF16, pooled)}, gradAttrs).op,
        tolBf16(9));
  }
  expectBlocks(*makeOp("GlobalAveragePool", "ai.onnx", 13, {TensorInfo(BF16, x)}).op, tolBf16(24 * 24));
}

// The CNN's bf16 MaxPoolGrad with the Relu's gradient fused (fuseMaxPoolGradRelu): oneDNN has no
// such kernel, so the blocks run it over the fast f32 plane kernel, chosen over the reference.
TEST(FastHalf, Bf16MaxPoolGradWithFusedReluIsChosenAndMatches) {
  const Shape x{32, 32, 32, 32}, pooled{32, 32, 16, 16};
  ir::Attributes attrs;
  attrs.set("kernel_shape", std::vector<int64_t>{2, 2});
  attrs.set("strides", std::vector<int64_t>{2, 2});
  attrs.set("dilations", std::vector<int64_t>{1, 1});
  attrs.set("pads", std::vector<int64_t>{0, 0, 0, 0});
  for (DataType t : {BF16, F16}) {
    OneOp o =
        makeOp("MaxPoolGrad", "ai.graphcore", 1, {TensorInfo(t, x), TensorInfo(t, pooled)}, attrs, 1, {}, {}, fuseRelu);
    ASSERT_TRUE(o.op->fusion.relu());
    SCOPED_TRACE(toString(t));
    // X a Relu's output: zeros and positives, so that the mask matters.
    expectHalf(*o.op, t == BF16 ? tolBf16() : tol(), [](size_t i, std::mt19937 &r) {
      float v = std::uniform_real_distribution<float>(-2, 2)(r);
      return i == 0 ? std::max(v, 0.f) : v;
    });
    EXPECT_NE(backend_cpu::KernelRegistry::instance().choose(*o.op).explanation().find("a fused Relu gradient"),
              std::string::npos);
  }
  // NaN and infinities in X and dY, on one and two threads, against the f32 kernel Any chooses
  // for the twin (the fast plane kernel, whose 2x2 windows order a NaN as documented in
  // vecloops.hpp, unlike the reference's).
  OneOp o = makeOp("MaxPoolGrad", "ai.graphcore", 1, {TensorInfo(BF16, x), TensorInfo(BF16, pooled)}, attrs, 1, {}, {},
                   fuseRelu);
  for (int threads : {1, 2})
    expectHalfWithSpecials(
        *o.op, {withSpecials(shapeElementCount(x), -2, 2, 5), withSpecials(shapeElementCount(pooled), -2, 2, 6)},
        threads, tolBf16(), KernelProvider::Any);
}

// oneDNN's bf16 eltwise and softmax are native: the blocks decline bf16 for those, saying why.
TEST(FastHalf, Bf16OnlyForThePools) {
  const auto &registry = backend_cpu::KernelRegistry::instance();
  for (const char *t : {"Relu", "Softmax"}) {
    OneOp o = makeOp(t, "ai.onnx", 13, {TensorInfo(BF16, {4, 300})});
    std::string why = registry.choose(*o.op, KernelProvider::Fast).explanation();
    EXPECT_NE(why.find("input 0 is BFLOAT16, left to oneDNN's native bf16 kernels"), std::string::npos) << why;
    const backend_cpu::KernelEntry *e = registry.find(*o.op);
    ASSERT_NE(e, nullptr);
    if (backend_cpu::dnnlComputesIn(BF16)) {
      EXPECT_EQ(e->provider, KernelProvider::Dnnl) << t;
    } else { // an AVX2-only CPU: oneDNN declines too, saying so, and the reference kernel runs it
      kernel_compare::expectDnnlDeclinesOnThisCpu(*o.op, BF16);
      EXPECT_EQ(e->provider, KernelProvider::Reference) << t;
    }
  }
}

TEST(FastHalf, LayerNormForwardWithHalfOrFloatStatistics) {
  Shape x{3, 400, 64};
  for (DataType statType : {F16, F32}) {
    OneOp o = makeOp("LayerNormalization", "ai.onnx", 17,
                     {TensorInfo(F16, x), TensorInfo(F16, {64}), TensorInfo(F16, {64})}, {}, 3);
    o.op->setOutInfo(1, TensorInfo(statType, {3, 400, 1}));
    o.op->setOutInfo(2, TensorInfo(statType, {3, 400, 1}));
    SCOPED_TRACE(toString(statType) + " statistics");
    expectHalf(*o.op, tol(64), uniform(-3, 3));
  }
  ir::Attributes twoAxes; // normalised over the last two dimensions
  twoAxes.set("axis", int64_t{1});
  OneOp o = makeOp("LayerNormalization", "ai.onnx", 17,
                   {TensorInfo(F16, {900, 8, 16}), TensorInfo(F16, {8, 16}), omitted()}, twoAxes, 1);
  expectHalf(*o.op, tol(128), uniform(-3, 3));
}

TEST(FastHalf, LayerNormGradSumsScaleAndBiasGradientsOverBlocks) {
  Shape x{3, 400, 64};
  for (bool stats : {false, true}) {
    std::vector<TensorInfo> ins{TensorInfo(F16, x), TensorInfo(F16, {64}), TensorInfo(F16, x)};
    if (stats) {
      ins.emplace_back(F16, Shape{3, 400, 1});
      ins.emplace_back(F16, Shape{3, 400, 1});
    }
    OneOp o = makeOp("LayerNormalizationGrad", "ai.graphcore", 1, ins, {}, 3);
    SCOPED_TRACE(stats ? "given statistics" : "recomputed statistics");
    // dScale and dBias sum 1200 rows.
    expectHalf(*o.op, tol(1200), [stats](size_t i, std::mt19937 &r) {
      if (i == 3) return std::uniform_real_distribution<float>(-0.2f, 0.2f)(r); // mean
      if (i == 4) return std::uniform_real_distribution<float>(0.5f, 1.5f)(r);  // 1/σ
      return std::uniform_real_distribution<float>(-2.f, 2.f)(r);
    });
  }
  // dX only.
  OneOp dxOnly = makeOp("LayerNormalizationGrad", "ai.graphcore", 1,
                        {TensorInfo(F16, x), TensorInfo(F16, {64}), TensorInfo(F16, x)}, {}, 3, {}, {1, 2});
  expectHalf(*dxOnly.op, tol(64), uniform(-2, 2));
}

TEST(FastHalf, TwoThreadsAndNanAndInfinities) {
  const int64_t n = 3 * 25000;
  Shape s{3, 25000};
  for (const char *t : {"Relu", "Abs", "Neg", "Tanh", "Sigmoid"}) {
    OneOp o = makeOp(t, "ai.onnx", 13, {TensorInfo(F16, s)});
    for (int threads : {1, 2})
      expectHalfWithSpecials(*o.op, {withSpecials(n, -4, 4, 1)}, threads, tol(4));
  }
  // oneDNN's f32 exp maps NaN to +Inf and its softmax makes a row with a NaN or +Inf zeros, where
  // the reference kernels give NaN; the blocks give the f32 kernel's results, as f32 models get.
  OneOp exp = makeOp("Exp", "ai.onnx", 13, {TensorInfo(F16, s)});
  for (int threads : {1, 2})
    expectHalfWithSpecials(*exp.op, {withSpecials(n, -4, 4, 1)}, threads, tol(4), KernelProvider::Any);
  for (const char *t : {"Add", "Sub", "Mul", "Div"}) {
    OneOp o = makeOp(t, "ai.onnx", 13, {TensorInfo(F16, s), TensorInfo(F16, s)});
    for (int threads : {1, 2})
      expectHalfWithSpecials(*o.op, {withSpecials(n, -4, 4, 2), withSpecials(n, 0.5f, 4, 3)}, threads, tol(2));
  }
  OneOp softmax = makeOp("Softmax", "ai.onnx", 13, {TensorInfo(F16, {7, 111, 100})});
  for (int threads : {1, 2})
    expectHalfWithSpecials(*softmax.op, {withSpecials(7 * 111 * 100, -6, 6, 4)}, threads, tol(100),
                           KernelProvider::Any);
}

TEST(FastHalf, DeclinesWhatItDoesNotCover) {
  const auto &registry = backend_cpu::KernelRegistry::instance();
  // f32: the f32 kernels' (never this family's twin of itself).
  OneOp f32 = makeOp("Gelu", "ai.graphcore", 1, {TensorInfo(F32, {4, 8})});
  EXPECT_NE(registry.choose(*f32.op, KernelProvider::Fast).explanation().find("no FLOAT16 tensor"), std::string::npos);
  // A row longer than the blocks may be.
  OneOp huge = makeOp("Softmax", "ai.onnx", 13, {TensorInfo(F16, {2, 1 << 21})});
  const backend_cpu::KernelEntry *e = registry.find(*huge.op);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->provider, KernelProvider::Reference) << "a row of 8 MiB in f32 stays with the reference kernel";
  EXPECT_NE(registry.choose(*huge.op, KernelProvider::Fast).explanation().find("rows of more than 4 MiB"),
            std::string::npos);
}

TEST(FastHalf, LayerNormGradOnTwoThreadsAndFastTwinsBitIdenticalOnAnyThreadCount) {
  // dScale and dBias sum the blocks' partial results; oneDNN's twin runs on the creating thread.
  Shape x{3, 400, 64};
  OneOp ln = makeOp("LayerNormalizationGrad", "ai.graphcore", 1,
                    {TensorInfo(F16, x), TensorInfo(F16, {64}), TensorInfo(F16, x)}, {}, 3);
  std::vector<std::vector<float>> values;
  for (unsigned i = 0; i < 3; ++i) {
    std::mt19937 rng(10 + i);
    values.emplace_back();
    for (int64_t k = 0; k < ln.op->inInfo(i).elementCount(); ++k)
      values.back().push_back(std::uniform_real_distribution<float>(-2, 2)(rng));
  }
  for (int threads : {1, 2})
    expectHalfWithSpecials(*ln.op, values, threads, tol(1200));
  // SoftmaxGrad's twin is the fast row pass: blocks on threads of their own, the same bits.
  Shape s{7, 111, 100};
  OneOp sg = makeOp("SoftmaxGrad", "ai.graphcore", 1, {TensorInfo(F16, s), TensorInfo(F16, s)});
  std::vector<TensorData> in;
  std::mt19937 rng(3);
  for (size_t i = 0; i < 2; ++i) {
    in.emplace_back(sg.op->inInfo(i));
    for (int64_t k = 0; k < sg.op->inInfo(i).elementCount(); ++k)
      in.back().as<uint16_t>()[k] = floatToHalf(std::uniform_real_distribution<float>(i == 0 ? 0 : -2, 2)(rng));
  }
  const void *inp[2] = {in[0].data(), in[1].data()};
  std::vector<TensorData> outs;
  for (int threads : {1, 2, 3}) {
    backend_cpu::KernelContext context;
    context.threads = threads;
    auto kernel = backend_cpu::createKernel(*sg.op, KernelProvider::Fast, context);
    outs.emplace_back(sg.op->outInfo(0));
    void *outp[1] = {outs.back().data()};
    kernel->run({inp, 2, outp, 1});
  }
  for (size_t t = 1; t < outs.size(); ++t)
    EXPECT_EQ(std::memcmp(outs[t].data(), outs[0].data(), static_cast<size_t>(outs[0].byteCount())), 0)
        << "SoftmaxGrad on " << t + 1 << " threads differs from one thread's";
}
