// BatchNormalization with a 16-bit X (FLOAT16, BFLOAT16) beside FLOAT scale, bias and statistics,
// as mixed precision runs it (docs/precision.md, "statistics in fp32, data in the low type"): the
// fast and reference kernels, forward (training and inference, fused Relu) and gradient, against
// the fp32 reference kernel on the widened inputs; the gradient op's types; the precision pass's
// LowData class; and the inference form's gradient rule against the same graph in double.

#include "gradcheck.hpp"
#include "kernel_compare.hpp"
#include "one_op.hpp"

#include "backend_cpu/kernel.hpp"
#include "core/tensordata.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include "ir/passes/precision.hpp"
#include "ir/verify.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace popart;
using backend_cpu::KernelProvider;
using test_ops::OneOp;

namespace {

constexpr DataType F32 = DataType::FLOAT;

/// Shapes of X: channels widened whole, and channels too large for a thread's scratch (runs of
/// a plane; a plane cut in several runs).
const std::vector<Shape> kShapes{{4, 5, 6, 7}, {3, 2, 120, 200}, {1, 2, 300, 300}};

std::function<float(size_t, std::mt19937 &)> bnFill() {
  return [](size_t i, std::mt19937 &r) {
    if (i == 0) return std::uniform_real_distribution<float>(-1.f, 3.f)(r); // a mean away from 0
    if (i == 4) return std::uniform_real_distribution<float>(0.5f, 2.f)(r); // a variance
    return std::uniform_real_distribution<float>(-2.f, 2.f)(r);
  };
}

ir::Attributes trainingAttrs(bool training) {
  ir::Attributes a;
  a.set("training_mode", int64_t{training ? 1 : 0});
  a.set("momentum", 0.8f);
  return a;
}

/// BatchNormalization-15 of a \p type X of \p x, FLOAT parameters and statistics.
OneOp batchNorm(DataType type, const Shape &x, bool training, bool relu) {
  std::vector<TensorInfo> ins{TensorInfo(type, x)};
  for (int i = 0; i < 4; ++i)
    ins.emplace_back(F32, Shape{x[1]});
  std::function<void(ir::Op &)> prepare;
  if (relu) prepare = [](ir::Op &op) { op.fusion.activation.kind = ir::FusedActivation::Kind::Relu; };
  return test_ops::makeOneOp("BatchNormalization", "ai.onnx", 15, ins, trainingAttrs(training), training ? 3 : 1, {},
                             prepare);
}

/// ai.graphcore BatchNormalizationGrad of a \p type X and dY of \p x, FLOAT scale (and statistics).
OneOp batchNormGrad(DataType type, const Shape &x, bool givenStats) {
  std::vector<TensorInfo> ins{TensorInfo(type, x), TensorInfo(F32, {x[1]}), TensorInfo(type, x)};
  if (givenStats) {
    ins.emplace_back(F32, Shape{x[1]});
    ins.emplace_back(F32, Shape{x[1]});
  }
  return test_ops::makeOneOp("BatchNormalizationGrad", "ai.graphcore", 1, ins, {}, 3);
}

/// The fast kernel's choice for \p op: whether it widened whole channels.
std::string fastChoice(const ir::Op &op) { return backend_cpu::createKernel(op, KernelProvider::Fast)->choice(); }

} // namespace

TEST(BatchNorm16Bit, ForwardMatchesTheFp32ReferenceOnTheWidenedInputs) {
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16})
    for (const Shape &x : kShapes)
      for (bool training : {true, false})
        for (bool relu : {false, true}) {
          OneOp o = batchNorm(type, x, training, relu);
          SCOPED_TRACE(toString(type) + " " + toString(x) + (training ? " training" : " inference") +
                       (relu ? " with Relu" : ""));
          EXPECT_EQ(o.op->outInfo(0).dataType(), type);
          if (training) {
            EXPECT_EQ(o.op->outInfo(1).dataType(), F32) << "the running mean stays FLOAT";
          }
          const bool whole = x[0] * x[2] * x[3] <= 64 * 1024;
          EXPECT_EQ(fastChoice(*o.op) == "channels widened whole", whole) << fastChoice(*o.op);
          // Y is rounded once from the f32 result; the statistics are sums in double in both.
          const double tol = kernel_compare::sixteenBitTolerance(type);
          for (KernelProvider p : {KernelProvider::Fast, KernelProvider::Reference}) {
            std::mt19937 rng(11);
            kernel_compare::expectSixteenBitMatchesFp32Reference(p, *o.op, rng, bnFill(), tol);
          }
        }
}

TEST(BatchNorm16Bit, GradientMatchesTheFp32ReferenceOnTheWidenedInputs) {
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16})
    for (const Shape &x : kShapes)
      for (bool givenStats : {false, true}) {
        OneOp o = batchNormGrad(type, x, givenStats);
        SCOPED_TRACE(toString(type) + " " + toString(x) +
                     (givenStats ? " given statistics" : " recomputed statistics"));
        EXPECT_EQ(o.op->outInfo(0).dataType(), type) << "dX";
        EXPECT_EQ(o.op->outInfo(1).dataType(), F32) << "dScale";
        EXPECT_EQ(o.op->outInfo(2).dataType(), F32) << "dBias";
        const bool whole = 2 * x[0] * x[2] * x[3] <= 64 * 1024;
        EXPECT_EQ(fastChoice(*o.op) == "channels widened whole", whole) << fastChoice(*o.op);
        // dX rounds once; its terms are computed in f32 from double sums (a few f32 units, far
        // below the 16-bit rounding), dScale and dBias are double sums in both.
        const double tol = kernel_compare::sixteenBitTolerance(type, 4);
        auto fill = [](size_t i, std::mt19937 &r) {
          if (i == 3) return std::uniform_real_distribution<float>(-0.2f, 0.2f)(r);
          if (i == 4) return std::uniform_real_distribution<float>(0.7f, 1.3f)(r);
          return std::uniform_real_distribution<float>(-2.f, 2.f)(r);
        };
        for (KernelProvider p : {KernelProvider::Fast, KernelProvider::Reference}) {
          std::mt19937 rng(5);
          kernel_compare::expectSixteenBitMatchesFp32Reference(p, *o.op, rng, fill, tol);
        }
      }
}

TEST(BatchNorm16Bit, TheFastKernelsRunMixedPrecisionBatchNormOnPlainLayouts) {
  // FLOAT16: oneDNN 2.6 has no f16 batch normalisation. BFLOAT16 gradient: oneDNN has only its
  // generic loops on NCHW, several times slower. A fused Relu: oneDNN declines it in any type.
  const auto &registry = backend_cpu::KernelRegistry::instance();
  const Shape x{32, 32, 32, 32};
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16}) {
    OneOp grad = batchNormGrad(type, x, true);
    OneOp fused = batchNorm(type, x, true, true);
    for (const ir::Op *op : {grad.op, fused.op}) {
      const backend_cpu::KernelEntry *e = registry.find(*op);
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->provider, KernelProvider::Fast)
          << op->type << " " << toString(type) << ": " << registry.choose(*op).explanation();
    }
  }
  // Parameters of X's 16-bit type are not the mixed-precision form: the fast kernel declines them.
  std::vector<TensorInfo> ins{TensorInfo(DataType::FLOAT16, x)};
  for (int i = 0; i < 4; ++i)
    ins.emplace_back(DataType::FLOAT16, Shape{x[1]});
  OneOp allHalf = test_ops::makeOneOp("BatchNormalization", "ai.onnx", 15, ins);
  const backend_cpu::KernelEntry *e = registry.find(*allHalf.op, KernelProvider::Fast);
  EXPECT_EQ(e, nullptr);
}

TEST(BatchNorm16Bit, TheGradientOpTakesFloatScaleAndStatisticsAndRefusesOtherMixesByName) {
  auto expectRefused = [](std::vector<TensorInfo> ins, const std::string &words) {
    try {
      test_ops::makeOneOp("BatchNormalizationGrad", "ai.graphcore", 1, ins, {}, 3);
      ADD_FAILURE() << "accepted; expected an error naming " << words;
    } catch (const error &e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  const Shape x{2, 3, 4, 4};
  const TensorInfo h(DataType::FLOAT16, x), b(DataType::BFLOAT16, x), f(F32, x), c(F32, {3});
  expectRefused({h, c, f}, "dY has type FLOAT");
  expectRefused({b, TensorInfo(DataType::FLOAT16, {3}), b}, "input 1 has type FLOAT16");
  expectRefused({h, c, h, c, TensorInfo(DataType::FLOAT16, {3})}, "the batch mean is FLOAT and the variance FLOAT16");
  OneOp ok = test_ops::makeOneOp("BatchNormalizationGrad", "ai.graphcore", 1, {b, c, b, c, c}, {}, 3);
  EXPECT_EQ(ok.op->outInfo(0).dataType(), DataType::BFLOAT16);
  EXPECT_EQ(ok.op->outInfo(1).dataType(), F32);
}

namespace {

/// x [2, 3, 6, 6] → Conv(w) → BatchNormalization(scale, bias, mean, var) → Relu → out, the BN's
/// parameters Variables (training) or constants (inference).
void buildConvBatchNorm(ir::Graph &g, bool training) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 15;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(F32, {2, 3, 6, 6}));
  g.addInput("x");
  ir::Tensor &w = g.addTensor("w", ir::TensorKind::Variable, TensorInfo(F32, {4, 3, 3, 3}));
  w.setData(std::make_shared<TensorData>(TensorData::fromDoubles(F32, {4, 3, 3, 3}, std::vector<double>(108, 0.1))));
  g.addInitializer("w");
  for (const char *p : {"scale", "bias", "mean", "var"}) {
    TensorData v = TensorData::fromDoubles(F32, {4}, {1, 0.5, 0.25, 2});
    if (training) {
      g.addTensor(p, ir::TensorKind::Variable, TensorInfo(F32, {4})).setData(std::make_shared<TensorData>(v));
      g.addInitializer(p);
    } else {
      g.addConst(p, std::move(v));
    }
  }
  g.addOp("Conv", "", 15, "conv", {}, {"x", "w"}, {"c"});
  std::vector<TensorId> outs{"y"};
  if (training) outs = {"y", "rm", "rv"};
  g.addOp("BatchNormalization", "", 15, "bn", trainingAttrs(training), {"c", "scale", "bias", "mean", "var"}, outs);
  g.addOp("Relu", "", 15, "relu", {}, {"y"}, {"out"});
  g.addOutput("out");
}

} // namespace

TEST(BatchNorm16Bit, ThePrecisionPassGivesBatchNormALowXAndKeepsItsParametersAndStatisticsFloat) {
  for (DataType low : {DataType::FLOAT16, DataType::BFLOAT16})
    for (bool training : {true, false}) {
      SCOPED_TRACE(toString(low) + (training ? " training" : " inference"));
      ir::Graph g;
      buildConvBatchNorm(g, training);
      ir::inferShapes(g, nullptr);
      ir::PrecisionPolicy policy;
      policy.low = low;
      ir::convertPrecision(g, policy, {});
      ir::verifyGraph(g, "");
      const ir::Op *bn = nullptr;
      for (const auto &op : g.ops())
        if (op->type == "BatchNormalization") bn = op.get();
      ASSERT_NE(bn, nullptr);
      EXPECT_EQ(ir::precisionClass(*bn), ir::PrecisionClass::LowData);
      EXPECT_EQ(bn->inInfo(0).dataType(), low);
      ASSERT_NE(bn->input(0).producer(), nullptr);
      EXPECT_EQ(bn->input(0).producer()->type, "Conv") << "the Conv's low output is read with no Cast";
      const char *params[] = {"scale", "bias", "mean", "var"};
      for (size_t i = 1; i < 5; ++i) {
        EXPECT_EQ(bn->input(i).id(), params[i - 1]) << "read as it is, not through a Cast";
        EXPECT_EQ(bn->inInfo(i).dataType(), F32) << params[i - 1];
      }
      EXPECT_EQ(bn->outInfo(0).dataType(), low);
      for (size_t i = 1; i < bn->outputCount(); ++i)
        EXPECT_EQ(bn->outInfo(i).dataType(), F32) << "running statistic " << i;
      for (const auto &op : g.ops())
        if (op->type == "Relu") {
          EXPECT_EQ(op->inInfo(0).dataType(), low) << "the Relu follows the BN's low Y";
        }
    }
}

TEST(BatchNorm16Bit, TheInferenceFormGradientOfA16BitXWithFloatStatisticsMatchesDouble) {
  // The gradient rule composes elementwise ops: with a FLOAT16 X and FLOAT parameters it must cast
  // the per-channel factors to X's type and the parameters' gradients back to FLOAT. Compared
  // with the same graph in double on the same (fp16-exact) X.
  const Shape x{2, 3, 4, 5};
  std::mt19937 rng(3);
  TensorData xd = gradcheck::randomDoubles(rng, x, -1, 3);
  xd = TensorData::fromDoubles(DataType::FLOAT16, x, xd.toDoubleVector());
  std::vector<TensorData> params;
  for (size_t i = 0; i < 4; ++i)
    params.push_back(gradcheck::randomDoubles(rng, {3}, i == 3 ? 0.5 : -1.5, 1.5));
  auto problem = [&](DataType xType, DataType paramType) {
    std::vector<gradcheck::Feed> feeds{{"x", TensorData::fromDoubles(xType, x, xd.toDoubleVector())}};
    const char *names[] = {"scale", "bias", "mean", "var"};
    for (size_t i = 0; i < 4; ++i)
      feeds.push_back({names[i], TensorData::fromDoubles(paramType, {3}, params[i].toDoubleVector())});
    ir::Attributes a;
    a.set("epsilon", 1e-3f);
    return gradcheck::Problem("BatchNormalization", 15, a, feeds);
  };
  gradcheck::Problem mixed = problem(DataType::FLOAT16, F32), wide = problem(DataType::DOUBLE, DataType::DOUBLE);
  gradcheck::OpNet got(mixed, true), want(wide, true);
  got.run(mixed.feeds);
  want.run(wide.feeds);
  ASSERT_EQ(got.gradIds().size(), 5u);
  EXPECT_EQ(got.graph().tensor(got.gradIds()[0]).info().dataType(), DataType::FLOAT16);
  for (size_t k = 0; k < 5; ++k) {
    if (k > 0) {
      EXPECT_EQ(got.graph().tensor(got.gradIds()[k]).info().dataType(), F32) << "input " << k;
    }
    std::vector<double> g = got.value(got.gradIds()[k]).toDoubleVector();
    std::vector<double> w = want.value(want.gradIds()[k]).toDoubleVector();
    ASSERT_EQ(g.size(), w.size());
    // X-sized terms round to fp16 (several per element), and the parameters' gradients sum 40
    // such terms per channel.
    const double tol = kernel_compare::sixteenBitTolerance(DataType::FLOAT16, 40, 4.0);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      worst = kernel_compare::worseOf(worst, std::fabs(g[i] - w[i]));
      scale = std::max(scale, std::fabs(w[i]));
    }
    EXPECT_LE(worst, tol * (1 + scale)) << "gradient of input " << k;
  }
}
