// Our f32 kernels registered with oneDNN's (backend_cpu/dnnl/channelwise.cpp) against the
// reference kernels: GlobalAveragePool (and ReduceMean over H, W), Mul by per-channel gates; the
// fast broadcast Add/Sub/Mul/Div where oneDNN's binary would run its reference code; oneDNN's Clip and
// HardSigmoid; and a squeeze-excitation block whose feature map stays in the convolutions' blocked
// layout through the pool and the Mul.

#include "backend_cpu/kernel.hpp"
#include "backend_cpu/plan.hpp"
#include "fast_cases.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include "kernel_compare.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

using namespace popart;
using backend_cpu::KernelProvider;

namespace {

ir::Op &addOp(ir::Graph &g, const std::string &type, const std::vector<Shape> &shapes) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  g.opsets()["ai.onnx"] = 13;
  std::vector<TensorId> ins;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ins.push_back("x" + std::to_string(i));
    g.addTensor(ins.back(), ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, shapes[i]));
  }
  ir::Op &op = g.addOp(type, "ai.onnx", 13, "", {}, ins, {"y"});
  op.def->setup(op);
  return op;
}

/// Checks that \p provider's kernel runs \p type of inputs \p shapes and matches the reference.
void expectFastMatches(const std::string &type, const std::vector<Shape> &shapes,
                       KernelProvider provider = KernelProvider::Dnnl) {
  SCOPED_TRACE(type + " of " + std::to_string(shapes.size()) + " inputs, first rank " +
               std::to_string(shapes[0].size()));
  ir::Graph g;
  ir::Op &op = addOp(g, type, shapes);
  // oneDNN's own choice among its binary implementations depends on the CPU, so a fast kernel
  // is run directly where oneDNN might also take the op.
  if (provider == KernelProvider::Fast)
    ASSERT_NE(backend_cpu::KernelRegistry::instance().find(op, provider), nullptr);
  else
    ASSERT_EQ(backend_cpu::KernelRegistry::instance().find(op)->provider, provider);
  std::mt19937 rng(61);
  std::uniform_real_distribution<float> d(0.5f, 2.f); // no division by ~0
  kernel_compare::expectProviderMatchesReference(provider, op, rng, [&](size_t, std::mt19937 &r) { return d(r); });
}

TensorData randomFloats(const Shape &shape, std::mt19937 &rng, float lo, float hi) {
  TensorData t(TensorInfo(DataType::FLOAT, shape));
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.info().elementCount(); ++i)
    t.as<float>()[i] = d(rng);
  return t;
}

} // namespace

TEST(ChannelwiseKernels, GlobalAveragePoolAndChannelScaleMatchTheReference) {
  expectFastMatches("GlobalAveragePool", {{2, 20, 7, 9}});
  expectFastMatches("Mul", {{2, 20, 7, 9}, {2, 20, 1, 1}});
  expectFastMatches("Mul", {{1, 20, 1, 1}, {3, 20, 5, 5}});
}

TEST(ChannelwiseKernels, ReduceMeanOverTheSpatialAxesMatchesTheReference) {
  // x.mean([2, 3]) as exported (MNASNet, ShuffleNet): the pooling kernel, keepdims 0 or 1.
  for (int64_t keep : {0, 1})
    for (std::vector<int64_t> axes : {std::vector<int64_t>{2, 3}, std::vector<int64_t>{-1, -2}}) {
      ir::registerBuiltinOps();
      backend_cpu::registerBuiltinKernels();
      ir::Graph g;
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {3, 20, 5, 7}));
      g.addConst("axes", TensorData::fromDoubles(DataType::INT64, {2}, {double(axes[0]), double(axes[1])}));
      ir::Attributes a;
      a.set("keepdims", keep);
      ir::Op &op = g.addOp("ReduceMean", "ai.onnx", 18, "", a, {"x", "axes"}, {"y"});
      op.def->setup(op);
      ASSERT_EQ(backend_cpu::KernelRegistry::instance().find(op)->provider, KernelProvider::Dnnl);
      std::mt19937 rng(64);
      TensorData x = randomFloats({3, 20, 5, 7}, rng, -2, 2);
      std::vector<const void *> in{x.data(), g.tensor("axes").data()->data()};
      TensorData want(op.outInfo(0)), got(op.outInfo(0));
      std::vector<void *> refOut{want.data()}, fastOut{got.data()};
      backend_cpu::createKernel(op, KernelProvider::Reference)->run({in.data(), 2, refOut.data(), 1});
      backend_cpu::createKernel(op, KernelProvider::Dnnl)->run({in.data(), 2, fastOut.data(), 1});
      EXPECT_LT(kernel_compare::maxRelDiff(got, want), 1e-5) << "keepdims " << keep;
    }
}

POPART_FAST_KERNEL_COMPARED("ai.onnx", "Add");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Sub");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Mul");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "Div");

TEST(BroadcastBinary, MiddleAxisBroadcastsMatchTheReference) {
  // Swin's attention mask, and broadcasts on either side, inner and outer: the fast kernel.
  const auto fast = KernelProvider::Fast;
  expectFastMatches("Add", {{1, 4, 3, 7, 7}, {1, 4, 1, 7, 7}}, fast);
  expectFastMatches("Add", {{1, 4, 1, 7, 7}, {1, 4, 3, 7, 7}}, fast);
  expectFastMatches("Sub", {{2, 3, 5, 6}, {2, 1, 5, 6}}, fast);
  expectFastMatches("Div", {{2, 3, 5, 6}, {1, 3, 1, 1}}, fast);
  expectFastMatches("Mul", {{2, 3, 5, 6}, {2, 3, 5, 1}}, fast);
  expectFastMatches("Div", {{4, 1, 6}, {4, 5, 6}}, fast);
  // Runs of one element (b varies along the innermost axis too), and a threaded size.
  expectFastMatches("Mul", {{3, 1, 5}, {3, 4, 1}}, fast);
  expectFastMatches("Add", {{8, 64, 2, 49}, {8, 1, 2, 49}}, fast);
}

TEST(BroadcastBinary, TheFastKernelTakesWhatOneDnnsBinaryDeclines) {
  // Both inputs broadcast: oneDNN's binary broadcasts one only, so the fast kernel runs it.
  ir::Graph g;
  ir::Op &op = addOp(g, "Mul", {{3, 1, 5}, {3, 4, 1}});
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(op)->provider, KernelProvider::Fast);
  EXPECT_NE(backend_cpu::KernelRegistry::instance().choose(op).explanation().find(
                "oneDNN declined: both inputs broadcast (oneDNN broadcasts one)"),
            std::string::npos)
      << backend_cpu::KernelRegistry::instance().choose(op).explanation();
}

TEST(BroadcastBinary, OneDnnReferenceBinaryIsNeverChosen) {
  // What the oneDNN binary kernel accepts runs on one of its optimised implementations; a
  // broadcast of the first input within a row of a Sub stays on the reference kernel.
  ir::Graph g;
  ir::Op &op = addOp(g, "Sub", {{4, 1}, {4, 6}});
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(op)->provider, KernelProvider::Reference);
}

TEST(AgreedLayouts, SqueezeExcitationKeepsTheFeatureMapBlocked) {
  // x → depthwise Conv + SiLU (f) → GlobalAveragePool → Conv 1x1 + SiLU → Conv 1x1 + Sigmoid (s)
  // → Mul(f, s) (m) → Conv 1x1 → y, 40 channels (padded to 48): f and m stay in the convolutions'
  // 16-channel blocks (the pool and the Mul read them there) and the result matches.
  const Shape xs{2, 40, 6, 6};
  auto build = [&](ir::Graph &g) {
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x0", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, xs));
    g.addInput("x0");
    std::mt19937 rng(62);
    g.addConst("w0", randomFloats({40, 40, 1, 1}, rng, -0.3f, 0.3f));
    g.addConst("wd", randomFloats({40, 1, 3, 3}, rng, -0.5f, 0.5f));
    g.addConst("w1", randomFloats({10, 40, 1, 1}, rng, -0.5f, 0.5f));
    g.addConst("w2", randomFloats({40, 10, 1, 1}, rng, -0.5f, 0.5f));
    g.addConst("w3", randomFloats({24, 40, 1, 1}, rng, -0.3f, 0.3f));
    g.addConst("b1", randomFloats({10}, rng, -0.5f, 0.5f));
    g.addConst("b2", randomFloats({40}, rng, -0.5f, 0.5f));
    ir::Attributes dw;
    dw.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    dw.set("group", int64_t{40});
    g.addOp("Conv", "", 13, "c0", {}, {"x0", "w0"}, {"x"});
    g.addOp("Conv", "", 13, "cd", dw, {"x", "wd"}, {"d"});
    g.addOp("Sigmoid", "", 13, "sd", {}, {"d"}, {"dg"});
    g.addOp("Mul", "", 13, "md", {}, {"d", "dg"}, {"f"});
    g.addOp("GlobalAveragePool", "", 1, "gap", {}, {"f"}, {"p"});
    g.addOp("Conv", "", 13, "c1", {}, {"p", "w1", "b1"}, {"q"});
    g.addOp("Sigmoid", "", 13, "s1", {}, {"q"}, {"qg"});
    g.addOp("Mul", "", 13, "m1", {}, {"q", "qg"}, {"r"});
    g.addOp("Conv", "", 13, "c2", {}, {"r", "w2", "b2"}, {"t"});
    g.addOp("Sigmoid", "", 13, "s2", {}, {"t"}, {"s"});
    g.addOp("Mul", "", 13, "scale", {}, {"f", "s"}, {"m"});
    g.addOp("Conv", "", 13, "c3", {}, {"m", "w3"}, {"y"});
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
  };
  ir::Graph plain, fused;
  build(plain);
  build(fused);
  EXPECT_EQ(ir::fuseConvActivation(fused), 3);
  backend_cpu::ExecutionPlan plan(fused, {KernelProvider::Any});
  std::vector<TensorId> agreed = plan.agreedLayouts();
  for (const char *t : {"x", "f", "m"})
    EXPECT_NE(std::find(agreed.begin(), agreed.end(), t), agreed.end()) << t << " is not blocked";
  std::mt19937 rng(63);
  TensorData x = randomFloats(xs, rng, -2, 2);
  auto run = [&](const ir::Graph &g, KernelProvider p) {
    backend_cpu::ExecutionPlan pl(g, {p});
    std::memcpy(pl.address("x0"), x.data(), static_cast<size_t>(x.byteCount()));
    pl.run();
    const auto *y = static_cast<const float *>(pl.address("y"));
    return std::vector<float>(y, y + pl.info("y").elementCount());
  };
  std::vector<float> want = run(plain, KernelProvider::Reference), got = run(fused, KernelProvider::Any);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << "element " << i;
}

TEST(ActivationKernels, ClipWithConstantBoundsAndHardSigmoidMatchTheReference) {
  // ReLU6 and a Clip with only a lower bound on oneDNN's clip; HardSigmoid as linear + clip.
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  std::mt19937 rng(66);
  std::uniform_real_distribution<float> d(-9.f, 9.f);
  for (int variant = 0; variant < 3; ++variant) {
    ir::Graph g;
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {5, 37}));
    g.addConst("lo", TensorData::scalarFloat(0.f));
    g.addConst("hi", TensorData::scalarFloat(6.f));
    ir::Attributes hs;
    hs.set("alpha", 0.3f);
    hs.set("beta", 0.4f);
    ir::Op &op = variant == 0   ? g.addOp("Clip", "ai.onnx", 13, "relu6", {}, {"x", "lo", "hi"}, {"y"})
                 : variant == 1 ? g.addOp("Clip", "ai.onnx", 13, "min_only", {}, {"x", "lo"}, {"y"})
                                : g.addOp("HardSigmoid", "ai.onnx", 6, "hs", hs, {"x"}, {"y"});
    op.def->setup(op);
    ASSERT_EQ(backend_cpu::KernelRegistry::instance().find(op)->provider, KernelProvider::Dnnl) << variant;
    TensorData x = randomFloats({5, 37}, rng, -9, 9);
    std::vector<const void *> in{x.data(), g.tensor("lo").data()->data(), g.tensor("hi").data()->data()};
    in.resize(op.inputCount());
    TensorData want(op.outInfo(0)), got(op.outInfo(0));
    std::vector<void *> refOut{want.data()}, fastOut{got.data()};
    backend_cpu::createKernel(op, KernelProvider::Reference)->run({in.data(), in.size(), refOut.data(), 1});
    backend_cpu::createKernel(op, KernelProvider::Dnnl)->run({in.data(), in.size(), fastOut.data(), 1});
    EXPECT_LT(kernel_compare::maxRelDiff(got, want), 1e-6) << variant;
  }
  ir::Graph g; // a fed bound stays on the reference
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {5, 37}));
  g.addTensor("lo", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {}));
  ir::Op &fed = g.addOp("Clip", "ai.onnx", 13, "fed", {}, {"x", "lo"}, {"y"});
  fed.def->setup(fed);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(fed)->provider, KernelProvider::Reference);
}
