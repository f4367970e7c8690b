// oneDNN kernels in BFLOAT16 (and FLOAT16 where oneDNN 2.6 has them: only the reorders of Cast)
// against the fp32 reference kernel of the same op, every family the oneDNN kernels accept 16-bit
// types for; the mixed-type normalisations the precision pass creates; and the oneDNN Cast, bit for
// bit against core/half.hpp's conversions. On a CPU where oneDNN 2.6 computes no bf16 (AVX2 only:
// backend_cpu::dnnlComputesIn), each such op must be declined saying so, and the kernel that runs
// instead must give the same values.

#include "kernel_compare.hpp"
#include "one_op.hpp"

#include "backend_cpu/kernel.hpp"
#include "core/half.hpp"
#include "ir/graph.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>

using namespace popart;
using backend_cpu::KernelProvider;

namespace {

constexpr DataType BF16 = DataType::BFLOAT16;
constexpr DataType F16 = DataType::FLOAT16;
constexpr DataType F32 = DataType::FLOAT;

using test_ops::OneOp;

/// One op of its own graph (test_ops::makeOneOp).
OneOp makeOp(const std::string &type, const std::string &domain, int opset, const std::vector<TensorInfo> &ins,
             ir::Attributes attrs = {}, size_t outputs = 1, const std::map<size_t, TensorData> &consts = {},
             const std::function<void(ir::Op &)> &prepare = {}) {
  return test_ops::makeOneOp(type, domain, opset, ins, std::move(attrs), outputs, consts, prepare);
}

/// An omitted optional input.
TensorInfo omitted() { return TensorInfo(F32, {-1}); }

/// Whether oneDNN computes in bf16 on this CPU (not on an AVX2-only one).
bool dnnlBf16() { return static_cast<bool>(backend_cpu::dnnlComputesIn(BF16)); }

/// Expects oneDNN to take \p op and to match the fp32 reference of its twin within \p tolerance;
/// on a CPU where oneDNN has no kernels of the op's type, to decline it saying so and the kernel
/// that runs instead to match (kernel_compare::expectDnnlOrItsFallbackMatchesFp32Reference).
void expectDnnl(const ir::Op &op, double tolerance, const std::function<float(size_t, std::mt19937 &)> &fill,
                unsigned seed = 1) {
  std::mt19937 rng(seed);
  kernel_compare::expectDnnlOrItsFallbackMatchesFp32Reference(op, rng, fill, tolerance);
}

/// Expects oneDNN to decline \p op naming \p word (a type: "f16") in its reason.
void expectDnnlDeclines(const ir::Op &op, const std::string &word) {
  backend_cpu::KernelChoice choice = backend_cpu::KernelRegistry::instance().choose(op, KernelProvider::Dnnl);
  EXPECT_EQ(choice.entry, nullptr) << op.type << " in " << toString(op.inInfo(0).dataType());
  std::string reasons;
  for (const auto &d : choice.declined)
    reasons += d + "; ";
  EXPECT_NE(reasons.find(word), std::string::npos) << op.type << ": " << reasons;
}

/// expectDnnlDeclines of a bf16 \p op on a CPU where oneDNN computes in bf16; elsewhere oneDNN
/// declines every bf16 op for that reason first.
void expectDnnlDeclinesBf16(const ir::Op &op, const std::string &word) {
  if (dnnlBf16())
    expectDnnlDeclines(op, word);
  else
    kernel_compare::expectDnnlDeclinesOnThisCpu(op, BF16);
}

std::function<float(size_t, std::mt19937 &)> uniform(float lo, float hi) {
  return [lo, hi](size_t, std::mt19937 &r) { return std::uniform_real_distribution<float>(lo, hi)(r); };
}

double tol(DataType t, int64_t k = 1) { return kernel_compare::sixteenBitTolerance(t, k); }

} // namespace

TEST(Dnnl16Bit, ToleranceFollowsTheTypeAndTheReductionLength) {
  EXPECT_EQ(kernel_compare::unitRoundoff(BF16), 1.0 / 256);
  EXPECT_EQ(kernel_compare::unitRoundoff(F16), 1.0 / 2048);
  EXPECT_GT(tol(BF16, 1024), tol(BF16, 16));
  EXPECT_GT(tol(BF16), tol(F16));
}

TEST(Dnnl16Bit, MatMulShapesAndFusions) {
  struct Case {
    Shape a, b;
  };
  for (const Case &c : std::vector<Case>{{{64, 96}, {96, 80}},
                                         {{3, 17, 40}, {3, 40, 24}},
                                         {{2, 3, 17, 40}, {40, 24}},
                                         {{40}, {40, 24}},
                                         {{5, 40}, {40}},
                                         {{1, 256}, {256, 1000}}}) {
    OneOp o = makeOp("MatMul", "ai.onnx", 13, {TensorInfo(BF16, c.a), TensorInfo(BF16, c.b)});
    SCOPED_TRACE(toString(c.a) + " x " + toString(c.b));
    expectDnnl(*o.op, tol(BF16, c.a.back()), uniform(-2, 2));
  }
  // Fusions (ir/fusion.hpp): bias, scale, Relu, residual, transposed operands.
  Shape a{32, 64}, b{64, 48};
  OneOp bias = makeOp("MatMul", "ai.onnx", 13, {TensorInfo(BF16, a), TensorInfo(BF16, b), TensorInfo(BF16, {48})}, {},
                      1, {}, [](ir::Op &op) { op.fusion.bias = true; });
  expectDnnl(*bias.op, tol(BF16, 64), uniform(-2, 2));
  OneOp scaled = makeOp("MatMul", "ai.onnx", 13, {TensorInfo(BF16, a), TensorInfo(BF16, b)}, {}, 1, {},
                        [](ir::Op &op) { op.fusion.scale = 0.125f; });
  expectDnnl(*scaled.op, tol(BF16, 64), uniform(-2, 2));
  OneOp relu =
      makeOp("MatMul", "ai.onnx", 13, {TensorInfo(BF16, a), TensorInfo(BF16, b), TensorInfo(BF16, {48}), omitted()}, {},
             1, {}, [](ir::Op &op) {
               op.fusion.bias = true;
               op.fusion.activation.kind = ir::FusedActivation::Kind::Relu;
             });
  expectDnnl(*relu.op, tol(BF16, 64), uniform(-2, 2));
  OneOp residual =
      makeOp("MatMul", "ai.onnx", 13, {TensorInfo(BF16, a), TensorInfo(BF16, b), omitted(), TensorInfo(BF16, {32, 48})},
             {}, 1, {}, [](ir::Op &op) { op.fusion.residual = true; });
  expectDnnl(*residual.op, tol(BF16, 64), uniform(-2, 2));
  OneOp transposed = makeOp("MatMul", "ai.onnx", 13, {TensorInfo(BF16, {64, 32}), TensorInfo(BF16, {48, 64})}, {}, 1,
                            {}, [](ir::Op &op) {
                              op.fusion.transA = true;
                              op.fusion.transB = true;
                            });
  expectDnnl(*transposed.op, tol(BF16, 64), uniform(-2, 2));
}

TEST(Dnnl16Bit, GemmWithBf16OrFloatC) {
  for (DataType cType : {BF16, F32})
    for (int ta : {0, 1})
      for (int tb : {0, 1}) {
        ir::Attributes attrs;
        attrs.set("transA", int64_t{ta});
        attrs.set("transB", int64_t{tb});
        attrs.set("alpha", 0.5f);
        Shape a = ta ? Shape{72, 24} : Shape{24, 72}, b = tb ? Shape{40, 72} : Shape{72, 40};
        OneOp o =
            makeOp("Gemm", "ai.onnx", 13, {TensorInfo(BF16, a), TensorInfo(BF16, b), TensorInfo(cType, {40})}, attrs);
        SCOPED_TRACE(toString(cType) + " C, transA " + std::to_string(ta) + " transB " + std::to_string(tb));
        expectDnnl(*o.op, tol(BF16, 72), uniform(-2, 2));
      }
}

TEST(Dnnl16Bit, EltwiseForward) {
  Shape s{6, 37};
  for (const char *t :
       {"Relu", "Tanh", "Sigmoid", "Exp", "Abs", "Elu", "LeakyRelu", "Softplus", "Neg", "HardSwish", "HardSigmoid"}) {
    OneOp o = makeOp(t, "ai.onnx", 13, {TensorInfo(BF16, s)});
    SCOPED_TRACE(t);
    expectDnnl(*o.op, tol(BF16, 4), uniform(-3, 3));
  }
  OneOp sqrt = makeOp("Sqrt", "ai.onnx", 13, {TensorInfo(BF16, s)});
  expectDnnl(*sqrt.op, tol(BF16, 4), uniform(0.01f, 4));
  OneOp gelu = makeOp("Gelu", "ai.graphcore", 1, {TensorInfo(BF16, s)});
  expectDnnl(*gelu.op, tol(BF16, 4), uniform(-3, 3));
  std::map<size_t, TensorData> bounds{{1, TensorData::fromDoubles(BF16, {}, {0.0})},
                                      {2, TensorData::fromDoubles(BF16, {}, {6.0})}};
  OneOp clip =
      makeOp("Clip", "ai.onnx", 13, {TensorInfo(BF16, s), TensorInfo(BF16, {}), TensorInfo(BF16, {})}, {}, 1, bounds);
  expectDnnl(*clip.op, tol(BF16), uniform(-8, 8));
  OneOp pow = makeOp("Pow", "ai.onnx", 13, {TensorInfo(BF16, s), TensorInfo(F32, {})}, {}, 1,
                     {{1, TensorData::scalarFloat(2.f)}});
  expectDnnl(*pow.op, tol(BF16, 4), uniform(-3, 3));
}

TEST(Dnnl16Bit, ActivationGradients) {
  Shape s{5, 41};
  for (const char *act : {"Relu", "Elu", "Tanh", "Sigmoid", "Exp", "Sqrt", "LeakyRelu", "Abs", "Gelu", "Clip"}) {
    ir::Attributes attrs;
    attrs.set("activation", std::string(act));
    if (std::string(act) == "Clip") {
      attrs.set("alpha", -1.f);
      attrs.set("beta", 1.f);
    }
    OneOp o = makeOp("ActivationGrad", "ai.graphcore", 1, {TensorInfo(BF16, s), TensorInfo(BF16, s)}, attrs);
    SCOPED_TRACE(act);
    // From the forward output for Relu ... Sqrt: values a forward output can hold.
    bool positive = std::string(act) == "Sqrt" || std::string(act) == "Exp";
    bool unit = std::string(act) == "Sigmoid" || std::string(act) == "Tanh";
    expectDnnl(*o.op, tol(BF16, 4), [&](size_t i, std::mt19937 &r) {
      float lo = i == 1 ? -2.f : positive ? 0.1f : unit ? -0.9f : -2.f, hi = i == 1 ? 2.f : unit ? 0.9f : 2.f;
      if (std::string(act) == "Sigmoid" && i == 0) lo = 0.05f;
      return std::uniform_real_distribution<float>(lo, hi)(r);
    });
  }
}

TEST(Dnnl16Bit, BinaryWithBroadcast) {
  for (const char *t : {"Add", "Sub", "Mul", "Div"})
    for (const Shape &b : {Shape{7, 33}, Shape{33}, Shape{7, 1}}) {
      OneOp o = makeOp(t, "ai.onnx", 14, {TensorInfo(BF16, {7, 33}), TensorInfo(BF16, b)});
      SCOPED_TRACE(std::string(t) + " " + toString(b));
      expectDnnl(*o.op, tol(BF16), [](size_t, std::mt19937 &r) {
        float v = std::uniform_real_distribution<float>(0.25f, 2.f)(r);
        return r() % 2 ? v : -v; // away from 0: Div
      });
    }
  for (const char *t : {"Sum", "Mean"}) {
    Shape s{9, 31};
    OneOp o = makeOp(t, "ai.onnx", 13, {TensorInfo(BF16, s), TensorInfo(BF16, s), TensorInfo(BF16, s)});
    SCOPED_TRACE(t);
    expectDnnl(*o.op, tol(BF16, 3), uniform(-2, 2));
  }
}

TEST(Dnnl16Bit, SoftmaxForwardAndGradients) {
  // oneDNN 2.6 normalises bf16 over an inner axis (one with axes after it) in its reference code
  // only: declined, for the reference kernel.
  for (const char *t : {"Softmax", "LogSoftmax"}) {
    ir::Attributes attrs;
    attrs.set("axis", int64_t{1});
    expectDnnlDeclinesBf16(*makeOp(t, "ai.onnx", 13, {TensorInfo(BF16, {4, 50, 3})}, attrs).op, "reference bf16");
  }
  for (const char *t : {"SoftmaxGrad", "LogSoftmaxGrad"}) {
    ir::Attributes attrs;
    attrs.set("axis", int64_t{1});
    expectDnnlDeclinesBf16(
        *makeOp(t, "ai.graphcore", 1, {TensorInfo(BF16, {4, 50, 3}), TensorInfo(BF16, {4, 50, 3})}, attrs).op,
        "reference bf16");
  }
  for (const char *t : {"Softmax", "LogSoftmax"})
    for (int64_t axis : {-1, 2}) {
      ir::Attributes attrs;
      attrs.set("axis", axis);
      OneOp o = makeOp(t, "ai.onnx", 13, {TensorInfo(BF16, {4, 3, 50})}, attrs);
      SCOPED_TRACE(std::string(t) + " axis " + std::to_string(axis));
      expectDnnl(*o.op, tol(BF16, 50), uniform(-4, 4));
    }
  for (const char *t : {"SoftmaxGrad", "LogSoftmaxGrad"})
    for (int64_t axis : {-1, 2}) {
      ir::Attributes attrs;
      attrs.set("axis", axis);
      OneOp o = makeOp(t, "ai.graphcore", 1, {TensorInfo(BF16, {4, 3, 50}), TensorInfo(BF16, {4, 3, 50})}, attrs);
      SCOPED_TRACE(std::string(t) + " axis " + std::to_string(axis));
      bool log = std::string(t) == "LogSoftmaxGrad";
      expectDnnl(*o.op, tol(BF16, 50), [log](size_t i, std::mt19937 &r) {
        if (i == 1) return std::uniform_real_distribution<float>(-2.f, 2.f)(r);
        return log ? std::uniform_real_distribution<float>(-6.f, -0.5f)(r)
                   : std::uniform_real_distribution<float>(0.f, 0.1f)(r);
      });
    }
}

TEST(Dnnl16Bit, LayerNormalizationWithBf16OrFloatScaleAndFloatStatistics) {
  Shape x{6, 5, 64};
  for (DataType p : {BF16, F32})
    for (size_t outputs : {1u, 3u}) {
      OneOp o = makeOp("LayerNormalization", "ai.onnx", 17,
                       {TensorInfo(BF16, x), TensorInfo(p, {64}), TensorInfo(p, {64})}, {}, outputs);
      SCOPED_TRACE(toString(p) + " scale and bias, outputs " + std::to_string(outputs));
      if (outputs == 3) {
        EXPECT_EQ(o.op->outInfo(1).dataType(), F32);
      }
      expectDnnl(*o.op, tol(BF16, 64), uniform(-2, 2));
    }
  // bf16 statistics (stash_type BFLOAT16).
  ir::Attributes stash;
  stash.set("stash_type", int64_t{16});
  OneOp o = makeOp("LayerNormalization", "ai.onnx", 17,
                   {TensorInfo(BF16, x), TensorInfo(BF16, {64}), TensorInfo(BF16, {64})}, stash, 3);
  EXPECT_EQ(o.op->outInfo(2).dataType(), BF16);
  expectDnnl(*o.op, tol(BF16, 64), uniform(-2, 2));
}

TEST(Dnnl16Bit, LayerNormalizationGrad) {
  Shape x{12, 48};
  for (bool stats : {false, true}) {
    std::vector<TensorInfo> ins{TensorInfo(BF16, x), TensorInfo(BF16, {48}), TensorInfo(BF16, x)};
    if (stats) {
      ins.emplace_back(BF16, Shape{12, 1});
      ins.emplace_back(BF16, Shape{12, 1});
    }
    OneOp o = makeOp("LayerNormalizationGrad", "ai.graphcore", 1, ins, {}, 3);
    SCOPED_TRACE(stats ? "given statistics" : "recomputed statistics");
    // Given statistics are those of X: recomputed by the test from a draw would not be exact in
    // bf16, so X is drawn around them (mean 0, InvStdDev 1) loosely and the tolerance is the
    // reduction's over the rows.
    expectDnnl(*o.op, tol(BF16, 48 * 4), [](size_t i, std::mt19937 &r) {
      if (i == 3) return std::uniform_real_distribution<float>(-0.1f, 0.1f)(r);
      if (i == 4) return std::uniform_real_distribution<float>(0.8f, 1.2f)(r);
      return std::uniform_real_distribution<float>(-2.f, 2.f)(r);
    });
  }
}

// Whichever kernel runs a bf16 X with FLOAT parameters and statistics is right; oneDNN 2.6 leaves
// plain NCHW to the fast kernel (its ncsp_bnorm is generic loops), saying so, and keeps (N, C) and
// all-bf16 parameters.
TEST(Dnnl16Bit, BatchNormalizationBf16XWithFloatParameters) {
  const auto &registry = backend_cpu::KernelRegistry::instance();
  auto fill = [](size_t i, std::mt19937 &r) {
    return std::uniform_real_distribution<float>(i == 4 ? 0.5f : -2.f, 2.f)(r);
  };
  for (const Shape &x : {Shape{8, 16, 5, 5}, Shape{32, 24}}) {
    SCOPED_TRACE(toString(x));
    const bool spatial = x.size() > 2;
    // Expects op right on the kernel the registry picks: the fast one with oneDNN's decline
    // naming its generic implementation where X has planes, else oneDNN's; without bf16 in
    // oneDNN, whichever runs after oneDNN declined saying so.
    auto expectRight = [&](const ir::Op &op, double tolerance) {
      backend_cpu::KernelChoice choice = registry.choose(op);
      ASSERT_NE(choice.entry, nullptr) << choice.explanation();
      if (!dnnlBf16()) {
        kernel_compare::expectDnnlDeclinesOnThisCpu(op, BF16);
      } else if (spatial) {
        EXPECT_EQ(choice.entry->provider, KernelProvider::Fast) << choice.explanation();
        EXPECT_NE(choice.explanation().find("oneDNN declined: only oneDNN's generic loops ("), std::string::npos)
            << choice.explanation();
      } else {
        EXPECT_EQ(choice.entry->provider, KernelProvider::Dnnl) << choice.explanation();
      }
      std::mt19937 rng(1);
      kernel_compare::expectSixteenBitMatchesFp32Reference(KernelProvider::Any, op, rng, fill, tolerance);
    };
    // Inference with the global statistics.
    OneOp inference = makeOp("BatchNormalization", "ai.onnx", 15,
                             {TensorInfo(BF16, x), TensorInfo(F32, {x[1]}), TensorInfo(F32, {x[1]}),
                              TensorInfo(F32, {x[1]}), TensorInfo(F32, {x[1]})});
    expectRight(*inference.op, tol(BF16, 4));
    // Training: batch statistics, running statistics out in FLOAT.
    ir::Attributes training;
    training.set("training_mode", int64_t{1});
    OneOp train = makeOp("BatchNormalization", "ai.onnx", 15,
                         {TensorInfo(BF16, x), TensorInfo(F32, {x[1]}), TensorInfo(F32, {x[1]}),
                          TensorInfo(F32, {x[1]}), TensorInfo(F32, {x[1]})},
                         training, 3);
    EXPECT_EQ(train.op->outInfo(1).dataType(), F32);
    expectRight(*train.op, tol(BF16, shapeElementCount(x) / x[1]));
    // All bf16: the fast kernel does not take bf16 parameters, so oneDNN keeps it.
    OneOp all = makeOp("BatchNormalization", "ai.onnx", 15,
                       {TensorInfo(BF16, x), TensorInfo(BF16, {x[1]}), TensorInfo(BF16, {x[1]}),
                        TensorInfo(BF16, {x[1]}), TensorInfo(BF16, {x[1]})});
    expectDnnl(*all.op, tol(BF16, 4), fill);
  }
}

TEST(Dnnl16Bit, BatchNormalizationGrad) {
  Shape x{8, 16, 4, 4};
  for (bool stats : {false, true}) {
    std::vector<TensorInfo> ins{TensorInfo(BF16, x), TensorInfo(BF16, {16}), TensorInfo(BF16, x)};
    if (stats) {
      ins.emplace_back(BF16, Shape{16});
      ins.emplace_back(BF16, Shape{16});
    }
    OneOp o = makeOp("BatchNormalizationGrad", "ai.graphcore", 1, ins, {}, 3);
    SCOPED_TRACE(stats ? "given statistics" : "recomputed statistics");
    expectDnnl(*o.op, tol(BF16, 128 * 4), [](size_t i, std::mt19937 &r) {
      if (i == 3) return std::uniform_real_distribution<float>(-0.1f, 0.1f)(r);
      if (i == 4) return std::uniform_real_distribution<float>(0.8f, 1.2f)(r);
      return std::uniform_real_distribution<float>(-2.f, 2.f)(r);
    });
  }
}

TEST(Dnnl16Bit, Float16DeclinesNamingTheType) {
  // oneDNN 2.6.3 has no f16 matmul, eltwise, binary, softmax or normalisation on the CPU (only
  // reorders, and its reference sum): each declines, saying so. (MatMul and Gemm run on our f16
  // kernel over oneDNN's f32 matmul: test_dnnl_f16_product.cpp.)
  Shape s{8, 32};
  expectDnnlDeclines(*makeOp("Relu", "ai.onnx", 13, {TensorInfo(F16, s)}).op, "f16");
  expectDnnlDeclines(*makeOp("Add", "ai.onnx", 14, {TensorInfo(F16, s), TensorInfo(F16, s)}).op, "f16");
  expectDnnlDeclines(*makeOp("Sum", "ai.onnx", 13, {TensorInfo(F16, s), TensorInfo(F16, s)}).op, "f16");
  expectDnnlDeclines(*makeOp("Softmax", "ai.onnx", 13, {TensorInfo(F16, s)}).op, "f16");
  expectDnnlDeclines(
      *makeOp("LayerNormalization", "ai.onnx", 17, {TensorInfo(F16, s), TensorInfo(F16, {32}), TensorInfo(F16, {32})})
           .op,
      "f16");
  ir::Attributes relu;
  relu.set("activation", std::string("Relu"));
  expectDnnlDeclines(*makeOp("ActivationGrad", "ai.graphcore", 1, {TensorInfo(F16, s), TensorInfo(F16, s)}, relu).op,
                     "f16");
}

namespace {

/// A Cast of \p in to \p to; its kernel from \p provider run, returning the output.
TensorData cast(const TensorData &in, DataType to, KernelProvider provider) {
  ir::Attributes attrs;
  attrs.set("to", static_cast<int64_t>(to == BF16 ? 16 : to == F16 ? 10 : 1));
  OneOp o = makeOp("Cast", "ai.onnx", 19, {in.info()}, attrs);
  auto kernel = backend_cpu::createKernel(*o.op, provider);
  TensorData out(o.op->outInfo(0));
  const void *ins[1] = {in.data()};
  void *outs[1] = {out.data()};
  kernel->run({ins, 1, outs, 1});
  return out;
}

/// The Cast that sessions choose (oneDNN where exact, else the reference).
KernelProvider chosenCast(DataType from, DataType to) {
  ir::Attributes attrs;
  attrs.set("to", static_cast<int64_t>(to == BF16 ? 16 : to == F16 ? 10 : 1));
  OneOp o = makeOp("Cast", "ai.onnx", 19, {TensorInfo(from, {64})}, attrs);
  return backend_cpu::KernelRegistry::instance().find(*o.op)->provider;
}

bool isNaN16(uint16_t bits, DataType t) {
  return t == BF16 ? (bits & 0x7f80u) == 0x7f80u && (bits & 0x7fu) : (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu);
}

} // namespace

TEST(Dnnl16Bit, CastWidensEvery16BitPatternExactly) {
  if (dnnlBf16()) {
    EXPECT_EQ(chosenCast(BF16, F32), KernelProvider::Dnnl);
  } else { // its C++ loop reorder turns −0 into +0: the chosen Cast below must still be exact
    ir::Attributes attrs;
    attrs.set("to", int64_t{1});
    kernel_compare::expectDnnlDeclinesOnThisCpu(*makeOp("Cast", "ai.onnx", 19, {TensorInfo(BF16, {64})}, attrs).op,
                                                BF16);
  }
  for (DataType t : {BF16, F16}) {
    TensorData in(TensorInfo(t, {65536}));
    for (uint32_t b = 0; b < 65536; ++b)
      in.as<uint16_t>()[b] = static_cast<uint16_t>(b);
    TensorData out = cast(in, F32, chosenCast(t, F32));
    int mismatches = 0;
    for (uint32_t b = 0; b < 65536; ++b) {
      float want = t == BF16 ? bfloat16ToFloat(static_cast<uint16_t>(b)) : halfToFloat(static_cast<uint16_t>(b));
      float got = out.as<float>()[b];
      bool same = std::isnan(want) ? std::isnan(got) && std::signbit(got) == std::signbit(want)
                                   : std::memcmp(&want, &got, 4) == 0;
      if (!same && ++mismatches < 5) ADD_FAILURE() << toString(t) << " bits " << b << ": " << got << " vs " << want;
    }
    EXPECT_EQ(mismatches, 0) << toString(t);
  }
}

TEST(Dnnl16Bit, CastNarrowsRoundingToNearestEven) {
  // oneDNN 2.6's narrowing reorders are not exact (backend_cpu/dnnl/cast.cpp): f32 → bf16 flushes
  // subnormals, f16 loses −0. They decline, and the Cast that runs (the reference's) must be exact:
  // special values, ties at both types' halfway points, subnormals of both, overflow, and random
  // bit patterns of every exponent.
  for (auto [from, to] : {std::pair{F32, BF16}, std::pair{F32, F16}, std::pair{F16, F32}}) {
    ir::Attributes attrs;
    attrs.set("to", static_cast<int64_t>(to == BF16 ? 16 : to == F16 ? 10 : 1));
    expectDnnlDeclines(*makeOp("Cast", "ai.onnx", 19, {TensorInfo(from, {64})}, attrs).op,
                       to == BF16 ? "subnormals" : "sign of zero");
  }
  std::vector<uint32_t> bits{0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
                             0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x3f801000u,
                             0x3f803000u, 0x477fe000u, 0x477ff000u, 0x477fefffu, 0x47800000u, 0x33800000u, 0x33000000u,
                             0x33000001u, 0x387fc000u, 0x38800000u, 0x7f7fffffu, 0xff7fffffu, 0x3c000000u, 0x2f800000u};
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i)
    bits.push_back(rng());
  TensorData in(TensorInfo(F32, {static_cast<int64_t>(bits.size())}));
  std::memcpy(in.data(), bits.data(), bits.size() * 4);
  for (DataType t : {BF16, F16}) {
    TensorData out = cast(in, t, chosenCast(F32, t));
    int mismatches = 0;
    for (size_t i = 0; i < bits.size(); ++i) {
      float f;
      std::memcpy(&f, &bits[i], 4);
      uint16_t want = t == BF16 ? floatToBfloat16(f) : floatToHalf(f);
      uint16_t got = out.as<uint16_t>()[i];
      bool same = std::isnan(f) ? isNaN16(got, t) && (got & 0x8000u) == (want & 0x8000u) : got == want;
      if (!same && ++mismatches < 5)
        ADD_FAILURE() << toString(t) << " of float bits " << std::hex << bits[i] << ": " << got << " vs " << want;
    }
    EXPECT_EQ(mismatches, 0) << toString(t);
  }
}

TEST(Dnnl16Bit, CastBetweenBf16AndF16IsTheReferenceKernels) {
  ir::Attributes attrs;
  attrs.set("to", int64_t{10});
  OneOp o = makeOp("Cast", "ai.onnx", 19, {TensorInfo(BF16, {4})}, attrs);
  expectDnnlDeclines(*o.op, "reorder");
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*o.op)->provider, KernelProvider::Reference);
}

TEST(Dnnl16Bit, ConvForwardAndGradients) {
  struct Case {
    Shape x, w;
    int64_t group;
    std::vector<int64_t> pads, strides;
  };
  for (const Case &c : std::vector<Case>{{{2, 16, 9, 9}, {32, 16, 3, 3}, 1, {1, 1, 1, 1}, {1, 1}},
                                         {{2, 8, 10, 10}, {16, 8, 1, 1}, 1, {0, 0, 0, 0}, {2, 2}},
                                         {{2, 16, 8, 8}, {16, 1, 3, 3}, 16, {1, 1, 1, 1}, {1, 1}},
                                         {{3, 4, 20}, {6, 4, 5}, 1, {2, 2}, {1}}}) {
    ir::Attributes attrs;
    attrs.set("group", c.group);
    attrs.set("pads", c.pads);
    attrs.set("strides", c.strides);
    attrs.set("dilations", std::vector<int64_t>(c.strides.size(), 1));
    int64_t k = shapeElementCount(c.w) / c.w[0];
    SCOPED_TRACE(toString(c.x) + " * " + toString(c.w));
    for (DataType biasType : {BF16, F32}) {
      OneOp conv = makeOp("Conv", "ai.onnx", 13,
                          {TensorInfo(BF16, c.x), TensorInfo(BF16, c.w), TensorInfo(biasType, {c.w[0]})}, attrs);
      expectDnnl(*conv.op, tol(BF16, k), uniform(-2, 2));
    }
    // The grad ops: ConvDataGrad (dY, W → dX), ConvWeightGrad (dY, X → dW).
    OneOp conv = makeOp("Conv", "ai.onnx", 13, {TensorInfo(BF16, c.x), TensorInfo(BF16, c.w)}, attrs);
    Shape y = conv.op->outInfo(0).shape();
    ir::Attributes data = attrs, weights = attrs;
    data.set("input_shape", std::vector<int64_t>(c.x.begin(), c.x.end()));
    weights.set("weight_shape", std::vector<int64_t>(c.w.begin(), c.w.end()));
    data.set("kernel_shape", std::vector<int64_t>(c.w.begin() + 2, c.w.end()));
    weights.set("kernel_shape", std::vector<int64_t>(c.w.begin() + 2, c.w.end()));
    OneOp dx = makeOp("ConvDataGrad", "ai.graphcore", 1, {TensorInfo(BF16, y), TensorInfo(BF16, c.w)}, data);
    expectDnnl(*dx.op, tol(BF16, shapeElementCount(c.w) / c.w[1] / c.group), uniform(-2, 2));
    OneOp dw = makeOp("ConvWeightGrad", "ai.graphcore", 1, {TensorInfo(BF16, y), TensorInfo(BF16, c.x)}, weights);
    expectDnnl(*dw.op, tol(BF16, shapeElementCount(y) / y[1]), uniform(-2, 2));
  }
}

TEST(Dnnl16Bit, PoolingForwardAndGradients) {
  Shape x{2, 16, 9, 9};
  for (const char *t : {"MaxPool", "AveragePool"}) {
    ir::Attributes attrs;
    attrs.set("kernel_shape", std::vector<int64_t>{3, 3});
    attrs.set("strides", std::vector<int64_t>{2, 2});
    attrs.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    attrs.set("dilations", std::vector<int64_t>{1, 1});
    OneOp pool = makeOp(t, "ai.onnx", 13, {TensorInfo(BF16, x)}, attrs);
    SCOPED_TRACE(t);
    expectDnnl(*pool.op, tol(BF16, 9), uniform(-2, 2));
    Shape y = pool.op->outInfo(0).shape();
    if (std::string(t) == "MaxPool") {
      OneOp grad = makeOp("MaxPoolGrad", "ai.graphcore", 1, {TensorInfo(BF16, x), TensorInfo(BF16, y)}, attrs);
      expectDnnl(*grad.op, tol(BF16, 9), uniform(-2, 2));
    } else {
      ir::Attributes g = attrs;
      g.set("input_shape", std::vector<int64_t>(x.begin(), x.end()));
      OneOp grad = makeOp("AveragePoolGrad", "ai.graphcore", 1, {TensorInfo(BF16, y)}, g);
      expectDnnl(*grad.op, tol(BF16, 9), uniform(-2, 2));
    }
  }
}

TEST(Dnnl16Bit, Reductions) {
  Shape x{6, 40, 7};
  for (const char *t : {"ReduceSum", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceSumSquare"})
    for (const std::vector<int64_t> &axes :
         {std::vector<int64_t>{-1}, std::vector<int64_t>{1}, std::vector<int64_t>{}}) {
      std::map<size_t, TensorData> consts;
      std::vector<TensorInfo> ins{TensorInfo(BF16, x)};
      if (!axes.empty()) {
        consts.emplace(1, TensorData::fromInt64({static_cast<int64_t>(axes.size())}, axes));
        ins.emplace_back(DataType::INT64, Shape{static_cast<int64_t>(axes.size())});
      }
      OneOp o = makeOp(t, "ai.onnx", 18, ins, {}, 1, consts);
      SCOPED_TRACE(std::string(t) + " axes " + toString(axes));
      int64_t k = shapeElementCount(x) / o.op->outInfo(0).elementCount();
      backend_cpu::KernelChoice choice = backend_cpu::KernelRegistry::instance().choose(*o.op, KernelProvider::Dnnl);
      if (!choice.entry && dnnlBf16()) { // oneDNN's reference code only: the reference kernel's, said so
        EXPECT_NE(choice.explanation().find("plain C++"), std::string::npos) << choice.explanation();
        continue;
      }
      expectDnnl(*o.op, tol(BF16, k), uniform(0.1f, 2));
    }
}

TEST(Dnnl16Bit, TransposeMovesBitsExactly) {
  {
    ir::Attributes attrs;
    attrs.set("perm", std::vector<int64_t>{1, 0});
    expectDnnlDeclines(*makeOp("Transpose", "ai.onnx", 13, {TensorInfo(F16, {4, 8})}, attrs).op, "f16");
  }
  for (DataType t : {BF16}) {
    ir::Attributes attrs;
    attrs.set("perm", std::vector<int64_t>{2, 0, 1});
    OneOp o = makeOp("Transpose", "ai.onnx", 13, {TensorInfo(t, {5, 17, 33})}, attrs);
    SCOPED_TRACE(toString(t));
    // Without bf16 in oneDNN its only reorder is a C++ loop that turns −0 into +0: declined, and
    // the Transpose that runs instead must move the bits.
    if (dnnlBf16())
      ASSERT_EQ(backend_cpu::KernelRegistry::instance().find(*o.op, KernelProvider::Dnnl) != nullptr, true);
    else
      kernel_compare::expectDnnlDeclinesOnThisCpu(*o.op, t);
    TensorData in(o.op->inInfo(0));
    std::mt19937 rng(4);
    for (int64_t i = 0; i < in.info().elementCount(); ++i) // every pattern: −0, NaNs, subnormals
      in.as<uint16_t>()[i] = i < 4 ? std::vector<uint16_t>{0x8000u, 0x7fc1u, 0xfe01u, 0x0001u}[static_cast<size_t>(i)]
                                   : static_cast<uint16_t>(rng());
    // out[c][a][b] = in[a][b][c] for perm (2, 0, 1).
    TensorData want(o.op->outInfo(0));
    for (int64_t a = 0; a < 5; ++a)
      for (int64_t b = 0; b < 17; ++b)
        for (int64_t c = 0; c < 33; ++c)
          want.as<uint16_t>()[(c * 5 + a) * 17 + b] = in.as<uint16_t>()[(a * 17 + b) * 33 + c];
    for (KernelProvider p :
         {KernelProvider::Reference, backend_cpu::KernelRegistry::instance().find(*o.op)->provider}) {
      auto kernel = backend_cpu::createKernel(*o.op, p);
      TensorData out(o.op->outInfo(0));
      const void *ins[1] = {in.data()};
      void *outs[1] = {out.data()};
      kernel->run({ins, 1, outs, 1});
      EXPECT_EQ(std::memcmp(out.data(), want.data(), static_cast<size_t>(want.byteCount())), 0)
          << backend_cpu::kernelProviderName(p);
    }
  }
}

// The reference kernels of every family a training step uses take FLOAT16 and BFLOAT16 (computing
// in float, core/dispatch.hpp's compute_t) and agree with their fp32 twins within the tolerance.
namespace {

struct RefCase {
  std::string type, domain = "ai.onnx";
  int opset = 13;
  /// Input shapes; a type of UNDEFINED means the case's 16-bit type, others as given.
  std::vector<TensorInfo> ins;
  ir::Attributes attrs = {};
  size_t outputs = 1;
  int64_t k = 1; ///< reduction length, for the tolerance
  std::function<float(size_t, std::mt19937 &)> fill = uniform(-2, 2);
  std::map<size_t, TensorData> consts = {};
};

TensorInfo T(const Shape &s) { return TensorInfo(DataType::UNDEFINED, s); }

ir::Attributes attrs(std::initializer_list<std::pair<const char *, std::vector<int64_t>>> ints) {
  ir::Attributes a;
  for (const auto &[name, v] : ints)
    if (v.size() == 1 && std::string(name) != "kernel_shape" && std::string(name) != "strides" &&
        std::string(name) != "dilations" && std::string(name) != "axes")
      a.set(name, v[0]);
    else
      a.set(name, v);
  return a;
}

std::function<float(size_t, std::mt19937 &)> labelsAt(size_t input, int64_t classes, float lo = -2, float hi = 2) {
  return [=](size_t i, std::mt19937 &r) {
    if (i == input) return static_cast<float>(std::uniform_int_distribution<int64_t>(0, classes - 1)(r));
    return std::uniform_real_distribution<float>(lo, hi)(r);
  };
}

void expectReference16Bit(const RefCase &c) {
  for (DataType t : {BF16, F16}) {
    std::vector<TensorInfo> ins;
    for (const TensorInfo &i : c.ins)
      ins.emplace_back(i.dataType() == DataType::UNDEFINED ? t : i.dataType(), i.shape());
    OneOp o = makeOp(c.type, c.domain, c.opset, ins, c.attrs, c.outputs, c.consts);
    SCOPED_TRACE(c.type + " in " + toString(t));
    std::mt19937 rng(7);
    kernel_compare::expectSixteenBitMatchesFp32Reference(KernelProvider::Reference, *o.op, rng, c.fill, tol(t, c.k));
  }
}

} // namespace

TEST(Reference16Bit, TrainingStepFamiliesMatchFp32) {
  constexpr DataType I64 = DataType::INT64;
  auto conv = attrs({{"pads", {1, 1, 1, 1}}, {"strides", {1, 1}}, {"dilations", {1, 1}}, {"group", {1}}});
  auto dataGrad = conv, weightGrad = conv;
  dataGrad.set("input_shape", std::vector<int64_t>{2, 3, 7, 7});
  dataGrad.set("kernel_shape", std::vector<int64_t>{3, 3});
  weightGrad.set("weight_shape", std::vector<int64_t>{4, 3, 3, 3});
  weightGrad.set("kernel_shape", std::vector<int64_t>{3, 3});
  auto pool = attrs({{"kernel_shape", {2, 2}}, {"strides", {2, 2}}, {"dilations", {1, 1}}, {"pads", {0, 0, 0, 0}}});
  auto poolGrad = pool;
  poolGrad.set("input_shape", std::vector<int64_t>{2, 3, 8, 8});
  auto positive = [](size_t i, std::mt19937 &r) {
    return std::uniform_real_distribution<float>(i == 4 ? 0.5f : -2.f, 2.f)(r);
  };
  std::vector<RefCase> cases{
      {"MatMul", "ai.onnx", 13, {T({8, 32}), T({32, 12})}, {}, 1, 32},
      {"Gemm", "ai.onnx", 13, {T({8, 32}), T({32, 12}), T({12})}, {}, 1, 32},
      {"Conv", "ai.onnx", 13, {T({2, 3, 7, 7}), T({4, 3, 3, 3}), T({4})}, conv, 1, 27},
      {"ConvDataGrad", "ai.graphcore", 1, {T({2, 4, 7, 7}), T({4, 3, 3, 3})}, dataGrad, 1, 36},
      {"ConvWeightGrad", "ai.graphcore", 1, {T({2, 4, 7, 7}), T({2, 3, 7, 7})}, weightGrad, 1, 98},
      {"MaxPool", "ai.onnx", 13, {T({2, 3, 8, 8})}, pool},
      {"AveragePool", "ai.onnx", 13, {T({2, 3, 8, 8})}, pool, 1, 4},
      {"MaxPoolGrad", "ai.graphcore", 1, {T({2, 3, 8, 8}), T({2, 3, 4, 4})}, pool},
      {"AveragePoolGrad", "ai.graphcore", 1, {T({2, 3, 4, 4})}, poolGrad, 1, 4},
      {"BatchNormalization",
       "ai.onnx",
       15,
       {T({4, 3, 5, 5}), T({3}), T({3}), T({3}), T({3})},
       attrs({{"training_mode", {1}}}),
       3,
       100,
       positive},
      {"BatchNormalizationGrad", "ai.graphcore", 1, {T({4, 3, 5, 5}), T({3}), T({4, 3, 5, 5})}, {}, 3, 400},
      {"LayerNormalization", "ai.onnx", 17, {T({6, 40}), T({40}), T({40})}, {}, 3, 40},
      {"LayerNormalizationGrad", "ai.graphcore", 1, {T({6, 40}), T({40}), T({6, 40})}, {}, 3, 240},
      {"Softmax", "ai.onnx", 13, {T({6, 40})}, {}, 1, 40},
      {"LogSoftmax", "ai.onnx", 13, {T({6, 40})}, {}, 1, 40},
      {"SoftmaxGrad", "ai.graphcore", 1, {T({6, 40}), T({6, 40})}, {}, 1, 40, uniform(0, 0.1f)},
      {"LogSoftmaxGrad", "ai.graphcore", 1, {T({6, 40}), T({6, 40})}, {}, 1, 40, uniform(-4, -0.5f)},
      {"Relu", "ai.onnx", 13, {T({6, 40})}},
      {"Tanh", "ai.onnx", 13, {T({6, 40})}},
      {"Sigmoid", "ai.onnx", 13, {T({6, 40})}},
      {"Exp", "ai.onnx", 13, {T({6, 40})}},
      {"Gelu", "ai.graphcore", 1, {T({6, 40})}},
      {"Add", "ai.onnx", 14, {T({6, 40}), T({40})}},
      {"Mul", "ai.onnx", 14, {T({6, 40}), T({6, 40})}},
      {"ReduceSum", "ai.onnx", 13, {T({6, 40})}, attrs({{"keepdims", {0}}}), 1, 240},
      {"ReduceMean", "ai.onnx", 13, {T({6, 40})}, {}, 1, 240},
      {"ReduceMax", "ai.onnx", 13, {T({6, 40})}},
      {"Gather", "ai.onnx", 13, {T({10, 6}), TensorInfo(I64, {4})}, {}, 1, 1, labelsAt(1, 10)},
      {"ScatterND",
       "ai.onnx",
       16,
       {T({10, 6}), TensorInfo(I64, {4, 1}), T({4, 6})},
       [] {
         ir::Attributes a;
         a.set("reduction", std::string("add"));
         return a;
       }(),
       1,
       4,
       labelsAt(1, 10)},
      {"SoftmaxCrossEntropyLoss", "ai.onnx", 13, {T({6, 5}), TensorInfo(I64, {6})}, {}, 2, 30, labelsAt(1, 5)},
      {"NegativeLogLikelihoodLoss", "ai.onnx", 13, {T({6, 5}), TensorInfo(I64, {6})}, {}, 1, 6, labelsAt(1, 5, -3, 0)},
  };
  for (const char *act : {"Relu", "Tanh", "Gelu", "Sigmoid"}) {
    ir::Attributes a;
    a.set("activation", std::string(act));
    cases.push_back(
        {"ActivationGrad",
         "ai.graphcore",
         1,
         {T({6, 40}), T({6, 40})},
         a,
         1,
         1,
         std::string(act) == "Sigmoid" || std::string(act) == "Tanh" ? uniform(0.05f, 0.9f) : uniform(-2, 2)});
  }
  for (const RefCase &c : cases)
    expectReference16Bit(c);
}

TEST(Reference16Bit, CastBothWays) {
  for (DataType t : {BF16, F16}) {
    for (auto [from, to] : {std::pair{F32, t}, std::pair{t, F32}}) {
      ir::Attributes a;
      a.set("to", static_cast<int64_t>(to == BF16 ? 16 : to == F16 ? 10 : 1));
      OneOp o = makeOp("Cast", "ai.onnx", 19, {TensorInfo(from, {7, 9})}, a);
      SCOPED_TRACE(toString(from) + " to " + toString(to));
      std::mt19937 rng(2);
      kernel_compare::expectSixteenBitMatchesFp32Reference(KernelProvider::Reference, *o.op, rng, uniform(-100, 100),
                                                           tol(t));
    }
  }
}

// The FLOAT bias, C and parameters that mixed precision leaves on 16-bit ops, on the reference
// kernels (which run them wherever oneDNN computes no bf16: they read them as 16-bit before).
TEST(Reference16Bit, FloatBiasAndParametersOfA16BitOp) {
  for (DataType t : {BF16, F16}) {
    SCOPED_TRACE(toString(t));
    std::mt19937 rng(5);
    OneOp gemm =
        makeOp("Gemm", "ai.onnx", 13, {TensorInfo(t, {6, 24}), TensorInfo(t, {24, 10}), TensorInfo(F32, {10})});
    kernel_compare::expectSixteenBitMatchesFp32Reference(KernelProvider::Reference, *gemm.op, rng, uniform(-2, 2),
                                                         tol(t, 24));
    OneOp conv =
        makeOp("Conv", "ai.onnx", 13, {TensorInfo(t, {2, 3, 6, 6}), TensorInfo(t, {4, 3, 3, 3}), TensorInfo(F32, {4})},
               attrs({{"pads", {1, 1, 1, 1}}}));
    kernel_compare::expectSixteenBitMatchesFp32Reference(KernelProvider::Reference, *conv.op, rng, uniform(-2, 2),
                                                         tol(t, 27));
    OneOp norm = makeOp("LayerNormalization", "ai.onnx", 17,
                        {TensorInfo(t, {5, 32}), TensorInfo(F32, {32}), TensorInfo(F32, {32})});
    kernel_compare::expectSixteenBitMatchesFp32Reference(KernelProvider::Reference, *norm.op, rng, uniform(-2, 2),
                                                         tol(t, 32));
  }
}
