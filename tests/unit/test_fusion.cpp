// The compile-time fusions of exported decompositions: fuseLayerNorm (the pre-opset-17 LayerNorm
// written as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add) and fuseGelu (exact GELU as
// Div/Erf/Add/Mul/Mul). The fused graphs must compute what the decompositions compute, forward
// and backward, on the reference kernels and on oneDNN's; patterns that differ in any part, or
// whose intermediates are needed elsewhere, must be left alone. The ai.graphcore Gelu op and its
// ActivationGrad form are checked against finite differences and oneDNN against the reference.

#include "gradcheck.hpp"
#include "kernel_compare.hpp"

#include "autodiff/autodiff.hpp"
#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include "ir/verify.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <random>

using namespace popart;
using backend_cpu::KernelProvider;

namespace {

TensorData randomFloats(const Shape &shape, std::mt19937 &rng, float lo = -2, float hi = 2) {
  TensorData t(TensorInfo(DataType::FLOAT, shape));
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.info().elementCount(); ++i)
    t.as<float>()[i] = d(rng);
  return t;
}

TensorData scalarF(float v) { return TensorData::fromDoubles(DataType::FLOAT, {}, {v}); }

int countType(const ir::Graph &g, const std::string &type) {
  int n = 0;
  for (const auto &op : g.ops())
    n += op->type == type;
  return n;
}

/// Which part of the LayerNorm decomposition a test changes, so that it must not fuse.
enum class LnVariant { Exact, NoBias, TwoAxes, SharedDiff, StreamEpsilon, MiddleAxis, PowThree, NoScale };

/// x [3, 5, 8] → the exporters' LayerNorm decomposition over the last axis (or two) → y.
struct LayerNormGraph {
  ir::Graph g;
  explicit LayerNormGraph(LnVariant v, unsigned seed = 5) {
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = 13;
    std::mt19937 rng(seed);
    Shape xs{3, 5, 8};
    Shape norm = v == LnVariant::TwoAxes ? Shape{5, 8} : Shape{8};
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, xs));
    g.addInput("x");
    g.addConst("two", scalarF(v == LnVariant::PowThree ? 3.f : 2.f));
    if (v == LnVariant::StreamEpsilon) {
      g.addTensor("eps", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {}));
      g.addInput("eps");
    } else {
      g.addConst("eps", scalarF(1e-5f));
    }
    g.addConst("gamma", randomFloats(norm, rng, 0.5f, 1.5f));
    g.addConst("beta", randomFloats(norm, rng));
    ir::Attributes mean;
    mean.set("axes", v == LnVariant::TwoAxes      ? std::vector<int64_t>{-2, -1}
                     : v == LnVariant::MiddleAxis ? std::vector<int64_t>{1}
                                                  : std::vector<int64_t>{-1});
    g.addOp("ReduceMean", "", 13, "m1", mean, {"x"}, {"mu"});
    g.addOp("Sub", "", 13, "sub", {}, {"x", "mu"}, {"d"});
    g.addOp("Pow", "", 13, "pow", {}, {"d", "two"}, {"d2"});
    g.addOp("ReduceMean", "", 13, "m2", mean, {"d2"}, {"var"});
    g.addOp("Add", "", 13, "add_eps", {}, {"var", "eps"}, {"ve"});
    g.addOp("Sqrt", "", 13, "sqrt", {}, {"ve"}, {"sd"});
    g.addOp("Div", "", 13, "div", {}, {"d", "sd"}, {"n"});
    if (v == LnVariant::NoScale) {
      g.addOp("Add", "", 13, "shift", {}, {"n", "beta"}, {"y"});
    } else if (v == LnVariant::NoBias) {
      g.addOp("Mul", "", 13, "scale", {}, {"gamma", "n"}, {"y"}); // scale first: either order
    } else {
      g.addOp("Mul", "", 13, "scale", {}, {"n", "gamma"}, {"s"});
      g.addOp("Add", "", 13, "shift", {}, {"s", "beta"}, {"y"});
    }
    g.addOutput("y");
    if (v == LnVariant::SharedDiff) g.addOutput("d");
    ir::inferShapes(g, nullptr);
  }
};

/// Runs \p g with \p p on x (and eps = 1e-5 if it is a stream); returns output \p out.
std::vector<float> runGraph(const ir::Graph &g, KernelProvider p, const TensorData &x, const TensorId &out = "y") {
  backend_cpu::ExecutionPlan plan(g, {p});
  std::memcpy(plan.address("x"), x.data(), static_cast<size_t>(x.byteCount()));
  if (g.findTensor("eps") && g.tensor("eps").kind() == ir::TensorKind::Stream)
    *static_cast<float *>(plan.address("eps")) = 1e-5f;
  plan.run();
  const auto *y = static_cast<const float *>(plan.address(out));
  return std::vector<float>(y, y + plan.info(out).elementCount());
}

/// Adds a Transpose of the 2-D tensor \p id; returns its output id + "t".
TensorId transpose2d(ir::Graph &g, const TensorId &id) {
  ir::Attributes perm;
  perm.set("perm", std::vector<int64_t>{1, 0});
  g.addOp("Transpose", "", 13, "transpose_" + id, perm, {id}, {id + "t"});
  return id + "t";
}

void expectNear(const std::vector<float> &got, const std::vector<float> &want, float tol, const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " element " << i;
}

} // namespace

TEST(FuseLayerNorm, FusedMatchesTheDecomposition) {
  std::mt19937 rng(11);
  TensorData x = randomFloats({3, 5, 8}, rng, -3, 3);
  for (LnVariant v : {LnVariant::Exact, LnVariant::NoBias, LnVariant::TwoAxes})
    for (bool statistics : {false, true}) {
      LayerNormGraph plain(v), fused(v);
      ASSERT_EQ(ir::fuseLayerNorm(fused.g, statistics), 1);
      EXPECT_EQ(fused.g.ops().size(), 1u);
      ASSERT_EQ(countType(fused.g, "LayerNormalization"), 1);
      const ir::Op &ln = *fused.g.ops()[0];
      EXPECT_EQ(ln.attrs.getInt("axis"), v == LnVariant::TwoAxes ? 1 : 2);
      EXPECT_FLOAT_EQ(ln.attrs.getFloat("epsilon"), 1e-5f);
      EXPECT_EQ(ln.hasInput(2), v != LnVariant::NoBias);
      EXPECT_EQ(ln.hasOutput(1) && ln.hasOutput(2), statistics);
      std::vector<float> want = runGraph(plain.g, KernelProvider::Reference, x);
      for (auto p : {KernelProvider::Reference, KernelProvider::Any})
        expectNear(runGraph(fused.g, p, x), want, 2e-5f, "variant " + std::to_string(int(v)));
    }
}

TEST(FuseLayerNorm, LeavesOtherPatternsAlone) {
  for (LnVariant v : {LnVariant::SharedDiff, LnVariant::StreamEpsilon, LnVariant::MiddleAxis, LnVariant::PowThree,
                      LnVariant::NoScale}) {
    LayerNormGraph g(v);
    size_t ops = g.g.ops().size();
    EXPECT_EQ(ir::fuseLayerNorm(g.g, true), 0) << "variant " << int(v);
    EXPECT_EQ(g.g.ops().size(), ops) << "variant " << int(v);
  }
  // A tensor the caller keeps (an anchor) stops it as well.
  LayerNormGraph kept(LnVariant::Exact);
  EXPECT_EQ(ir::fuseLayerNorm(kept.g, true, {"var"}), 0);
}

namespace {

enum class GeluVariant { DivSqrt2, MulInvSqrt2, WrongConstant, SharedErf };

/// x [4, 33] → 0.5 · (x · (1 + Erf(x / √2))) in the form torch 1.13 exports, or a variant.
struct GeluGraph {
  ir::Graph g;
  explicit GeluGraph(GeluVariant v) {
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4, 33}));
    g.addInput("x");
    g.addConst("one", scalarF(1.f));
    g.addConst("half", scalarF(0.5f));
    if (v == GeluVariant::MulInvSqrt2) {
      g.addConst("c", scalarF(static_cast<float>(M_SQRT1_2)));
      g.addOp("Mul", "", 13, "scale", {}, {"c", "x"}, {"a"});
    } else {
      g.addConst("c", scalarF(v == GeluVariant::WrongConstant ? 1.5f : static_cast<float>(M_SQRT2)));
      g.addOp("Div", "", 13, "scale", {}, {"x", "c"}, {"a"});
    }
    g.addOp("Erf", "", 13, "erf", {}, {"a"}, {"e"});
    g.addOp("Add", "", 13, "plus_one", {}, {"one", "e"}, {"p"});
    g.addOp("Mul", "", 13, "times_x", {}, {"x", "p"}, {"t"});
    g.addOp("Mul", "", 13, "halve", {}, {"t", "half"}, {"y"});
    g.addOutput("y");
    if (v == GeluVariant::SharedErf) g.addOutput("e");
    ir::inferShapes(g, nullptr);
  }
};

} // namespace

TEST(FuseGelu, FusedMatchesTheDecomposition) {
  std::mt19937 rng(12);
  TensorData x = randomFloats({4, 33}, rng, -5, 5);
  for (GeluVariant v : {GeluVariant::DivSqrt2, GeluVariant::MulInvSqrt2}) {
    GeluGraph plain(v), fused(v);
    ASSERT_EQ(ir::fuseGelu(fused.g), 1);
    ASSERT_EQ(fused.g.ops().size(), 1u);
    EXPECT_EQ(fused.g.ops()[0]->type, "Gelu");
    EXPECT_EQ(fused.g.ops()[0]->domain, "ai.graphcore");
    std::vector<float> want = runGraph(plain.g, KernelProvider::Reference, x);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(runGraph(fused.g, p, x), want, 1e-5f, "variant " + std::to_string(int(v)));
  }
  for (GeluVariant v : {GeluVariant::WrongConstant, GeluVariant::SharedErf}) {
    GeluGraph g(v);
    EXPECT_EQ(ir::fuseGelu(g.g), 0) << "variant " << int(v);
  }
}

namespace {

/// A small encoder block: y = LayerNorm(x + Gelu(x·W)) in the exported decompositions, loss
/// Σ y·w with uneven w. Returns the gradients of x and W (float), fused or not.
std::vector<std::vector<float>> blockGradients(bool fuse, KernelProvider p, const TensorData &x, const TensorData &w) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  for (const char *id : {"x", "W"}) {
    g.addTensor(id, ir::TensorKind::Stream, (std::string(id) == "x" ? x : w).info());
    g.addInput(id);
  }
  std::mt19937 rng(9);
  Shape norm{x.info().shape().back()};
  g.addConst("gamma", randomFloats(norm, rng, 0.5f, 1.5f));
  g.addConst("beta", randomFloats(norm, rng));
  const std::pair<const char *, float> scalars[] = {
      {"two", 2.f}, {"eps", 1e-5f}, {"one", 1.f}, {"half", 0.5f}, {"c", float(M_SQRT2)}};
  for (auto [id, v] : scalars)
    g.addConst(id, scalarF(v));
  ir::Attributes last;
  last.set("axes", std::vector<int64_t>{-1});
  auto op = [&](const char *type, std::vector<TensorId> ins, const TensorId &out, ir::Attributes a = {}) {
    g.addOp(type, "", 13, "", std::move(a), std::move(ins), {out});
  };
  op("MatMul", {"x", "W"}, "h");
  op("Div", {"h", "c"}, "ga");
  op("Erf", {"ga"}, "ge");
  op("Add", {"ge", "one"}, "gp");
  op("Mul", {"h", "gp"}, "gt");
  op("Mul", {"gt", "half"}, "gelu");
  op("Add", {"x", "gelu"}, "r");
  op("ReduceMean", {"r"}, "mu", last);
  op("Sub", {"r", "mu"}, "d");
  op("Pow", {"d", "two"}, "d2");
  op("ReduceMean", {"d2"}, "var", last);
  op("Add", {"var", "eps"}, "ve");
  op("Sqrt", {"ve"}, "sd");
  op("Div", {"d", "sd"}, "n");
  op("Mul", {"n", "gamma"}, "s");
  op("Add", {"s", "beta"}, "y");
  ir::inferShapes(g, nullptr);
  TensorId loss = gradcheck::weightedSumLoss()(g, {"y"}, 13); // Σ y·w, uneven w
  g.addOutput(loss);
  ir::inferShapes(g, nullptr);
  if (fuse) {
    EXPECT_EQ(ir::fuseLayerNorm(g, true), 1);
    EXPECT_EQ(ir::fuseGelu(g), 1);
  }
  std::vector<TensorId> grads = autodiff::buildGradients(g, loss, {"x", "W"});
  for (const auto &id : grads)
    g.addOutput(id);
  ir::inferShapes(g, nullptr);
  if (fuse) {
    EXPECT_EQ(countType(g, "LayerNormalizationGrad"), 1);
    EXPECT_EQ(countType(g, "Erf"), 0);
    EXPECT_EQ(countType(g, "Pow"), 0);
  }
  backend_cpu::ExecutionPlan plan(g, {p});
  std::memcpy(plan.address("x"), x.data(), static_cast<size_t>(x.byteCount()));
  std::memcpy(plan.address("W"), w.data(), static_cast<size_t>(w.byteCount()));
  plan.run();
  std::vector<std::vector<float>> out;
  for (const auto &id : grads) {
    const auto *v = static_cast<const float *>(plan.address(id));
    out.emplace_back(v, v + plan.info(id).elementCount());
  }
  return out;
}

} // namespace

TEST(FuseLayerNormAndGelu, GradientsMatchTheDecomposition) {
  std::mt19937 rng(13);
  TensorData x = randomFloats({6, 4, 16}, rng), w = randomFloats({16, 16}, rng, -0.5f, 0.5f);
  auto want = blockGradients(false, KernelProvider::Reference, x, w);
  for (auto p : {KernelProvider::Reference, KernelProvider::Any}) {
    auto got = blockGradients(true, p, x, w);
    ASSERT_EQ(got.size(), 2u);
    expectNear(got[0], want[0], 1e-4f, "dX");
    expectNear(got[1], want[1], 1e-4f, "dW");
  }
}

TEST(GeluOp, GradientMatchesFiniteDifferences) {
  for (unsigned seed = 900; seed < 903; ++seed) {
    gradcheck::Problem p{"Gelu", 1, {}, gradcheck::streamsThenConsts({{3, 7}}, DataType::DOUBLE)};
    p.domain = "ai.graphcore";
    gradcheck::fillStreams(p.feeds, seed, [](size_t, double v) { return 2.5 * v; });
    gradcheck::checkGradient(p, seed);
  }
}

TEST(GeluOp, DnnlMatchesReference) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  std::mt19937 rng(930);
  auto fill = [](size_t, std::mt19937 &r) { return std::uniform_real_distribution<float>(-6.f, 6.f)(r); };
  for (const Shape &s : {Shape{7, 13}, Shape{2, 3, 4, 5}}) {
    ir::Graph g;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, s));
    g.addTensor("dy", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, s));
    ir::Op &fwd = g.addOp("Gelu", "ai.graphcore", 1, "gelu", {}, {"x"}, {"y"});
    fwd.def->setup(fwd);
    ir::Attributes a;
    a.set("activation", std::string("Gelu"));
    ir::Op &bwd = g.addOp("ActivationGrad", "ai.graphcore", 1, "gelu_grad", a, {"x", "dy"}, {"dx"});
    bwd.def->setup(bwd);
    for (const ir::Op *op : {&fwd, &bwd}) {
      ASSERT_NE(backend_cpu::KernelRegistry::instance().find(*op, KernelProvider::Dnnl), nullptr) << op->type;
      kernel_compare::expectDnnlMatchesReference(*op, rng, fill);
    }
  }
}

TEST(LayerNormOp, DnnlWritesTheStatisticsLikeTheReference) {
  // The training form (Mean and InvStdDev outputs, which LayerNormalizationGrad reads) on oneDNN:
  // its variance is turned into 1/√(variance + ε) after the primitive.
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  std::mt19937 rng(940);
  auto fill = [](size_t i, std::mt19937 &r) {
    return i == 0 ? std::uniform_real_distribution<float>(-3.f, 5.f)(r)
                  : std::uniform_real_distribution<float>(0.5f, 1.5f)(r);
  };
  for (bool bias : {false, true})
    for (int64_t axis : {-1, 1}) {
      ir::Graph g;
      Shape x{6, 4, 32}, norm = axis == 1 ? Shape{4, 32} : Shape{32};
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, x));
      g.addTensor("s", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, norm));
      g.addTensor("b", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, norm));
      ir::Attributes a;
      a.set("axis", axis);
      a.set("epsilon", 1e-3f);
      std::vector<TensorId> ins{"x", "s"};
      if (bias) ins.push_back("b");
      ir::Op &op = g.addOp("LayerNormalization", "", 17, "ln", a, ins, {"y", "mean", "inv_std_dev"});
      op.def->setup(op);
      ASSERT_NE(backend_cpu::KernelRegistry::instance().find(op, KernelProvider::Dnnl), nullptr);
      kernel_compare::expectDnnlMatchesReference(op, rng, fill);
    }
}

namespace {

struct PoolCase {
  std::vector<int64_t> kernel, strides, pads;
  bool relu = true, sameConv = false, shared = false, indices = false, ceil = false;
};

/// x [batch, 5, 11, 11] → Conv 3×3 (16 channels) [→ Relu] → MaxPool → y.
void buildConvPool(ir::Graph &g, const PoolCase &c, int64_t batch = 2) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {batch, 5, 11, 11}));
  g.addInput("x");
  std::mt19937 rng(33);
  g.addConst("w", randomFloats({16, 5, 3, 3}, rng, -0.5f, 0.5f));
  g.addConst("b", randomFloats({16}, rng, -0.5f, 0.5f));
  ir::Attributes conv;
  if (c.sameConv)
    conv.set("auto_pad", std::string("SAME_UPPER"));
  else
    conv.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  g.addOp("Conv", "", 13, "conv", conv, {"x", "w", "b"}, {"c"});
  TensorId pooled = "c";
  if (c.relu) {
    g.addOp("Relu", "", 13, "relu", {}, {"c"}, {"r"});
    pooled = "r";
  }
  ir::Attributes pool;
  pool.set("kernel_shape", c.kernel);
  pool.set("strides", c.strides);
  if (!c.pads.empty()) pool.set("pads", c.pads);
  if (c.ceil) pool.set("ceil_mode", int64_t{1});
  std::vector<TensorId> outs{"y"};
  if (c.indices) outs.push_back("idx");
  g.addOp("MaxPool", "", 12, "pool", pool, {pooled}, outs);
  g.addOutput("y");
  if (c.shared) g.addOutput(pooled);
  ir::inferShapes(g, nullptr);
}

} // namespace

TEST(FuseConvPool, FusedMatchesConvThenPool) {
  std::mt19937 rng(34);
  TensorData x = randomFloats({2, 5, 11, 11}, rng);
  std::vector<PoolCase> fusing{
      {{2, 2}, {2, 2}, {}},                  // the CNN's pool; 11 → 5 drops the last row
      {{3, 3}, {2, 2}, {1, 1, 1, 1}},        // padded windows
      {{2, 3}, {1, 2}, {0, 1, 1, 0}, false}, // uneven, no Relu before it
      {{2, 2}, {2, 2}, {}, true, true},      // a SAME_UPPER convolution
  };
  for (size_t i = 0; i < fusing.size(); ++i) {
    ir::Graph plain, fused;
    buildConvPool(plain, fusing[i]);
    buildConvPool(fused, fusing[i]);
    Shape want = plain.tensor("y").info().shape();
    if (fusing[i].relu) {
      ASSERT_EQ(ir::fuseRelu(fused), 1);
    }
    ASSERT_EQ(ir::fuseConvPool(fused), 1) << "case " << i;
    ASSERT_EQ(fused.ops().size(), 1u);
    EXPECT_EQ(fused.tensor("y").info().shape(), want);
    std::vector<float> expected = runGraph(plain, KernelProvider::Reference, x);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(runGraph(fused, p, x), expected, 1e-5f, "case " + std::to_string(i));
  }
  // Left alone: the conv result read elsewhere, the Indices output, ceil rounding.
  for (PoolCase c :
       {PoolCase{{2, 2}, {2, 2}, {}, true, false, true}, PoolCase{{2, 2}, {2, 2}, {}, true, false, false, true},
        PoolCase{{2, 2}, {2, 2}, {}, true, false, false, false, true}}) {
    ir::Graph g;
    buildConvPool(g, c);
    ir::fuseRelu(g);
    EXPECT_EQ(ir::fuseConvPool(g), 0);
  }
}

TEST(FuseConvPool, ChunksOfTheBatchMatchTheWholeBatch) {
  // The oneDNN kernel pools blocked channels itself (no padding: windows apart or overlapping)
  // and may convolve and pool a chunk of images at a time, with a tail chunk for the rest; with
  // padding oneDNN's pooling runs on the whole batch. Every way matches the unfused reference.
  const int64_t batch = 7;
  std::mt19937 rng(39);
  TensorData x = randomFloats({batch, 5, 11, 11}, rng);
  for (const PoolCase &c : {PoolCase{{2, 2}, {2, 2}, {}}, PoolCase{{3, 3}, {2, 2}, {}},
                            PoolCase{{2, 3}, {1, 2}, {}, false}, PoolCase{{3, 3}, {2, 2}, {1, 1, 1, 1}}}) {
    ir::Graph plain, fused;
    buildConvPool(plain, c, batch);
    buildConvPool(fused, c, batch);
    if (c.relu) ir::fuseRelu(fused);
    ASSERT_EQ(ir::fuseConvPool(fused), 1);
    std::vector<float> want = runGraph(plain, KernelProvider::Reference, x);
    for (int64_t chunk : {0, 1, 3, 7, 100}) {
      backend_cpu::KernelContext context;
      context.convPoolChunk = chunk;
      std::string what = "window " + std::to_string(c.kernel[0]) + "x" + std::to_string(c.kernel[1]) + ", pads " +
                         std::to_string(c.pads.size()) + ", chunk " + std::to_string(chunk);
      backend_cpu::ExecutionPlan plan(fused, {KernelProvider::Dnnl}, context);
      std::memcpy(plan.address("x"), x.data(), static_cast<size_t>(x.byteCount()));
      float *y = static_cast<float *>(plan.address("y"));
      int64_t n = plan.info("y").elementCount();
      std::fill(y, y + n, std::nanf("")); // nothing left from an earlier plan in the same memory
      plan.run();
      expectNear(std::vector<float>(y, y + n), want, 1e-5f, what);
    }
  }
}

TEST(BlockedMaxPool, MatchesAPoolOfEachChannel) {
  // vec::maxPoolBlocked on [h, w, block] planes against a plain loop over each channel, with
  // ties, for the vector blocks (8, 16) and another (3), windows apart and overlapping.
  struct Case {
    int64_t block, h, w, kh, kw, sh, sw;
  };
  for (const Case &c :
       {Case{8, 6, 6, 2, 2, 2, 2}, Case{16, 7, 5, 3, 3, 2, 2}, Case{3, 5, 8, 2, 3, 1, 2}, Case{8, 9, 4, 3, 1, 3, 1}}) {
    int64_t oh = (c.h - c.kh) / c.sh + 1, ow = (c.w - c.kw) / c.sw + 1;
    std::mt19937 rng(40);
    std::uniform_int_distribution<int> small(-4, 4);
    std::vector<float> x(static_cast<size_t>(c.h * c.w * c.block)), got(static_cast<size_t>(oh * ow * c.block));
    for (auto &v : x)
      v = static_cast<float>(small(rng));
    backend_cpu::vec::maxPoolBlocked(x.data(), got.data(), c.h, c.w, oh, ow, c.kh, c.kw, c.sh, c.sw, c.block);
    for (int64_t b = 0; b < c.block; ++b)
      for (int64_t r = 0; r < oh; ++r)
        for (int64_t j = 0; j < ow; ++j) {
          float m = -100.f;
          for (int64_t u = 0; u < c.kh; ++u)
            for (int64_t v = 0; v < c.kw; ++v)
              m = std::max(m, x[static_cast<size_t>(((r * c.sh + u) * c.w + j * c.sw + v) * c.block + b)]);
          ASSERT_EQ(got[static_cast<size_t>((r * ow + j) * c.block + b)], m)
              << "block " << c.block << " channel " << b << " at " << r << "," << j;
        }
  }
}

TEST(AgreedLayouts, ConvChainStaysBlockedBetweenConvolutions) {
  // x → Conv+Relu+MaxPool → Conv+Relu → Conv → y (the CNN's chain plus one): between the oneDNN
  // convolutions the tensors stay in their 16-channel blocks; the result matches the reference.
  auto build = [](ir::Graph &g) {
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3, 12, 12}));
    g.addInput("x");
    std::mt19937 rng(35);
    ir::Attributes pad;
    pad.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    g.addConst("w1", randomFloats({32, 3, 3, 3}, rng, -0.5f, 0.5f));
    g.addConst("w2", randomFloats({32, 32, 3, 3}, rng, -0.2f, 0.2f));
    g.addConst("w3", randomFloats({16, 32, 3, 3}, rng, -0.2f, 0.2f));
    g.addConst("b2", randomFloats({32}, rng, -0.5f, 0.5f));
    g.addOp("Conv", "", 13, "c1", pad, {"x", "w1"}, {"a"});
    g.addOp("Relu", "", 13, "r1", {}, {"a"}, {"ar"});
    ir::Attributes pool;
    pool.set("kernel_shape", std::vector<int64_t>{2, 2});
    pool.set("strides", std::vector<int64_t>{2, 2});
    g.addOp("MaxPool", "", 12, "p1", pool, {"ar"}, {"ap"});
    g.addOp("Conv", "", 13, "c2", pad, {"ap", "w2", "b2"}, {"b"});
    g.addOp("Relu", "", 13, "r2", {}, {"b"}, {"br"});
    g.addOp("Conv", "", 13, "c3", pad, {"br", "w3"}, {"y"});
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
  };
  std::mt19937 rng(36);
  TensorData x = randomFloats({2, 3, 12, 12}, rng);
  ir::Graph plain, fused;
  build(plain);
  build(fused);
  ir::fuseRelu(fused);
  ir::fuseConvPool(fused);
  ASSERT_EQ(fused.ops().size(), 3u);
  backend_cpu::ExecutionPlan chained(fused, {KernelProvider::Any});
  EXPECT_EQ(chained.agreedLayouts(), (std::vector<TensorId>{"ap", "br"}));
  backend_cpu::ExecutionPlan reference(fused, {KernelProvider::Reference});
  EXPECT_TRUE(reference.agreedLayouts().empty());
  std::vector<float> want = runGraph(plain, KernelProvider::Reference, x);
  expectNear(runGraph(fused, KernelProvider::Any, x), want, 1e-4f, "chain");
  // A tensor that is also a graph output stays plain.
  fused.addOutput("ap");
  backend_cpu::ExecutionPlan outputSeen(fused, {KernelProvider::Any});
  EXPECT_EQ(outputSeen.agreedLayouts(), std::vector<TensorId>{"br"});
  expectNear(runGraph(fused, KernelProvider::Any, x), want, 1e-4f, "chain with an output");
}

namespace {

/// dX of Relu → MaxPool → Σ y·w for x of \p shape, through autodiff; fused (MaxPoolGrad applies
/// the Relu's gradient) or not, in \p type (DOUBLE takes the generic reference loops). The pass is
/// expected to fuse once, unless \p fused takes the count it returned.
std::vector<double> reluPoolGradient(bool fuse, DataType type, const Shape &shape, std::vector<int64_t> kernel,
                                     std::vector<int64_t> strides, const std::vector<double> &x,
                                     KernelProvider p = KernelProvider::Any, int *fused = nullptr) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(type, shape));
  g.addInput("x");
  g.addOp("Relu", "", 13, "relu", {}, {"x"}, {"r"});
  ir::Attributes pool;
  pool.set("kernel_shape", kernel);
  pool.set("strides", strides);
  g.addOp("MaxPool", "", 12, "pool", pool, {"r"}, {"y"});
  ir::inferShapes(g, nullptr);
  TensorId loss = gradcheck::weightedSumLoss()(g, {"y"}, 13);
  g.addOutput(loss);
  ir::inferShapes(g, nullptr);
  TensorId dx = autodiff::buildGradients(g, loss, {"x"})[0];
  g.addOutput(dx);
  ir::inferShapes(g, nullptr);
  if (fuse) {
    int n = ir::fuseMaxPoolGradRelu(g);
    if (fused)
      *fused = n;
    else
      EXPECT_EQ(n, 1);
  }
  backend_cpu::ExecutionPlan plan(g, {p});
  TensorData in = TensorData::fromDoubles(type, shape, x);
  std::memcpy(plan.address("x"), in.data(), static_cast<size_t>(in.byteCount()));
  plan.run();
  TensorData out(plan.info(dx), plan.address(dx));
  return out.toDoubleVector();
}

} // namespace

namespace {
struct TiledPoolCase {
  Shape shape;
  std::vector<int64_t> kernel, strides;
};
/// Pools whose windows tile: 2×2 / 2 (the CNN's), an odd size that leaves a row and column
/// uncovered, 3×3 / 3, and windows with gaps between them (2×2 / 3).
std::vector<TiledPoolCase> tiledPoolCases() {
  return {{{2, 3, 8, 10}, {2, 2}, {2, 2}},
          {{2, 3, 9, 7}, {2, 2}, {2, 2}},
          {{1, 2, 9, 9}, {3, 3}, {3, 3}},
          {{1, 2, 8, 8}, {2, 2}, {3, 3}}};
}
} // namespace

TEST(FuseMaxPoolGradRelu, TiledKernelAndFusionMatchTheGenericGradient) {
  for (const TiledPoolCase &c : tiledPoolCases()) {
    std::mt19937 rng(37);
    std::uniform_int_distribution<int> small(-3, 3); // small integers: ties and zeros in most windows
    std::vector<double> x(static_cast<size_t>(shapeElementCount(c.shape)));
    for (auto &v : x)
      v = small(rng);
    // Ties go to the first maximum in window order; the Relu's zeros and the pool's ties interact.
    std::vector<double> want = reluPoolGradient(false, DataType::DOUBLE, c.shape, c.kernel, c.strides, x);
    for (bool fuse : {false, true}) {
      std::vector<double> got = reluPoolGradient(fuse, DataType::FLOAT, c.shape, c.kernel, c.strides, x);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-6) << "fused " << fuse << " element " << i;
    }
    // The generic loops with the fused Relu (double is never tiled).
    std::vector<double> generic = reluPoolGradient(true, DataType::DOUBLE, c.shape, c.kernel, c.strides, x);
    for (size_t i = 0; i < generic.size(); ++i)
      ASSERT_NEAR(generic[i], want[i], 1e-12) << "generic fused element " << i;
  }
}

// A bf16 pool's fused gradient runs on the fast kernel's f32 blocks (backend_cpu/fast/half.cpp),
// so the pass fuses it where the windows tile; with overlapping windows only the reference kernel
// would apply the Relu's gradient, so it is left apart.
TEST(FuseMaxPoolGradRelu, Bf16FusesTiledPoolsOnlyAndMatchesTheGenericGradient) {
  for (const TiledPoolCase &c : tiledPoolCases()) {
    std::mt19937 rng(41);
    std::uniform_int_distribution<int> small(-3, 3); // exact in bf16; ties and zeros in most windows
    std::vector<double> x(static_cast<size_t>(shapeElementCount(c.shape)));
    for (auto &v : x)
      v = small(rng);
    std::vector<double> want = reluPoolGradient(false, DataType::DOUBLE, c.shape, c.kernel, c.strides, x);
    std::vector<double> got = reluPoolGradient(true, DataType::BFLOAT16, c.shape, c.kernel, c.strides, x);
    ASSERT_EQ(got.size(), want.size());
    // Each dX element is one dY (the loss's weights) rounded to bf16 once, or 0.
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::fabs(got[i] - want[i]), std::ldexp(1.0, -8) * std::fabs(want[i])) << "element " << i;
  }
  std::vector<double> x(2 * 3 * 9 * 9, 1.0);
  int fused = -1;
  reluPoolGradient(true, DataType::BFLOAT16, {2, 3, 9, 9}, {3, 3}, {2, 2}, x, KernelProvider::Any, &fused);
  EXPECT_EQ(fused, 0) << "overlapping bf16 windows";
  reluPoolGradient(true, DataType::FLOAT, {2, 3, 9, 9}, {3, 3}, {2, 2}, x, KernelProvider::Any, &fused);
  EXPECT_EQ(fused, 1) << "f32 fuses any windows, as before";
}

TEST(FuseBatchNormRelu, TrainingGradientsAndStatisticsMatchTheUnfusedGraph) {
  // Conv-free block: BatchNormalization (training mode, running statistics out) → Relu → loss.
  // The fusion runs after autodiff, as in TrainingSession; float (vectorised path) and double.
  for (DataType type : {DataType::FLOAT, DataType::DOUBLE})
    for (const Shape &shape : {Shape{4, 3, 5, 6}, Shape{8, 5}}) {
      auto run = [&](bool fuse) {
        ir::registerBuiltinOps();
        ir::Graph g;
        g.opsets()["ai.onnx"] = 15;
        int64_t c = shape[1];
        g.addTensor("x", ir::TensorKind::Stream, TensorInfo(type, shape));
        g.addInput("x");
        std::mt19937 rng(38);
        auto consts = [&](const char *id, double lo, double hi) {
          std::uniform_real_distribution<double> d(lo, hi);
          std::vector<double> v(static_cast<size_t>(c));
          for (auto &e : v)
            e = d(rng);
          g.addConst(id, TensorData::fromDoubles(type, {c}, v));
        };
        consts("scale", 0.5, 1.5);
        consts("bias", -0.5, 0.5);
        consts("mean", -0.1, 0.1);
        consts("var", 0.5, 1.5);
        ir::Attributes a;
        a.set("training_mode", int64_t{1});
        g.addOp("BatchNormalization", "", 15, "bn", a, {"x", "scale", "bias", "mean", "var"},
                {"n", "running_mean", "running_var"});
        g.addOp("Relu", "", 13, "relu", {}, {"n"}, {"y"});
        ir::inferShapes(g, nullptr);
        TensorId loss = gradcheck::weightedSumLoss()(g, {"y"}, 13);
        g.addOutput(loss);
        g.addOutput("running_var");
        ir::inferShapes(g, nullptr);
        TensorId dx = autodiff::buildGradients(g, loss, {"x"})[0];
        g.addOutput(dx);
        ir::inferShapes(g, nullptr);
        if (fuse) {
          EXPECT_EQ(ir::fuseBatchNormRelu(g), 1);
          EXPECT_EQ(countType(g, "Relu"), 0);
          EXPECT_EQ(countType(g, "BatchNormalization"), 1);
        }
        backend_cpu::ExecutionPlan plan(g, {KernelProvider::Any});
        std::mt19937 xr(39);
        std::uniform_real_distribution<double> d(-2, 2);
        std::vector<double> xv(static_cast<size_t>(shapeElementCount(shape)));
        for (auto &e : xv)
          e = d(xr);
        TensorData in = TensorData::fromDoubles(type, shape, xv);
        std::memcpy(plan.address("x"), in.data(), static_cast<size_t>(in.byteCount()));
        plan.run();
        std::vector<std::vector<double>> out;
        for (const TensorId &id : {loss, TensorId("running_var"), dx})
          out.push_back(TensorData(plan.info(id), plan.address(id)).toDoubleVector());
        return out;
      };
      auto plain = run(false), fused = run(true);
      for (size_t k = 0; k < plain.size(); ++k) {
        ASSERT_EQ(fused[k].size(), plain[k].size());
        for (size_t i = 0; i < plain[k].size(); ++i)
          ASSERT_NEAR(fused[k][i], plain[k][i], 1e-5 * (1 + std::fabs(plain[k][i])))
              << "output " << k << " element " << i;
      }
    }
}

TEST(FuseMatMulBias, FusedMatchesMatMulThenAdd) {
  struct Case {
    Shape x, bias;
    bool biasFirst, transposedWeight, shared;
    int fuses;
  };
  for (const Case &c : {Case{{2, 5, 8}, {6}, false, false, false, 1}, Case{{7, 8}, {6}, true, true, false, 1},
                        Case{{2, 5, 8}, {5, 6}, false, false, false, 0}, Case{{7, 8}, {6}, false, false, true, 0}}) {
    auto build = [&](ir::Graph &g) {
      ir::registerBuiltinOps();
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, c.x));
      g.addInput("x");
      std::mt19937 rng(40);
      g.addConst("w", randomFloats(c.transposedWeight ? Shape{6, 8} : Shape{8, 6}, rng));
      g.addConst("b", randomFloats(c.bias, rng));
      TensorId w = "w";
      if (c.transposedWeight) {
        ir::Attributes perm;
        perm.set("perm", std::vector<int64_t>{1, 0});
        g.addOp("Transpose", "", 13, "t", perm, {"w"}, {"wt"});
        w = "wt";
      }
      g.addOp("MatMul", "", 13, "mm", {}, {"x", w}, {"p"});
      g.addOp("Add", "", 13, "add", {}, c.biasFirst ? std::vector<TensorId>{"b", "p"} : std::vector<TensorId>{"p", "b"},
              {"y"});
      g.addOutput("y");
      if (c.shared) g.addOutput("p");
      ir::inferShapes(g, nullptr);
    };
    ir::Graph plain, fused;
    build(plain);
    build(fused);
    ir::foldTransposesIntoMatMul(fused);
    ASSERT_EQ(ir::fuseMatMulBias(fused), c.fuses);
    if (!c.fuses) continue;
    ASSERT_EQ(fused.ops().size(), 1u);
    std::mt19937 rng(41);
    TensorData x = randomFloats(c.x, rng);
    std::vector<float> want = runGraph(plain, KernelProvider::Reference, x);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(runGraph(fused, p, x), want, 1e-5f, "fused bias");
  }
}

TEST(FuseMatMulScale, ScaledProductMatchesMatMulThenDivOrMul) {
  // Attention's scores: [2, 3, 5, 8] · [2, 3, 8, 5] / 8, and a product times 0.3 (constant first).
  for (bool div : {true, false}) {
    auto build = [&](ir::Graph &g, bool sharedProduct) {
      ir::registerBuiltinOps();
      g.opsets()["ai.onnx"] = 13;
      for (const char *id : {"q", "k"}) {
        g.addTensor(id, ir::TensorKind::Stream,
                    TensorInfo(DataType::FLOAT, std::string(id) == "q" ? Shape{2, 3, 5, 8} : Shape{2, 3, 8, 5}));
        g.addInput(id);
      }
      g.addConst("c", scalarF(div ? 8.f : 0.3f));
      g.addOp("MatMul", "", 13, "mm", {}, {"q", "k"}, {"s"});
      if (div)
        g.addOp("Div", "", 13, "scale", {}, {"s", "c"}, {"y"});
      else
        g.addOp("Mul", "", 13, "scale", {}, {"c", "s"}, {"y"});
      g.addOutput("y");
      if (sharedProduct) g.addOutput("s");
      ir::inferShapes(g, nullptr);
    };
    ir::Graph plain, fused, shared;
    build(plain, false);
    build(fused, false);
    build(shared, true);
    EXPECT_EQ(ir::fuseMatMulScale(shared), 0);
    ASSERT_EQ(ir::fuseMatMulScale(fused), 1);
    ASSERT_EQ(fused.ops().size(), 1u);
    auto run = [](const ir::Graph &g, KernelProvider p) {
      backend_cpu::ExecutionPlan plan(g, {p});
      std::mt19937 rng(42);
      for (const char *id : {"q", "k"}) {
        TensorData v = randomFloats(plan.info(id).shape(), rng);
        std::memcpy(plan.address(id), v.data(), static_cast<size_t>(v.byteCount()));
      }
      plan.run();
      const auto *y = static_cast<const float *>(plan.address("y"));
      return std::vector<float>(y, y + plan.info("y").elementCount());
    };
    std::vector<float> want = run(plain, KernelProvider::Reference);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(run(fused, p), want, 1e-5f, div ? "div" : "mul");
  }
}

namespace {

/// logits = z [3, 20, 10] + b [10], viewed as [60, 10] for SoftmaxCrossEntropyLoss with
/// \p reduction and some labels ignored (and one out of range if \p badLabel). Returns the loss
/// (summed) and the gradients of z and b, with the passes applied as asked.
std::vector<std::vector<double>> lossAndGradients(DataType type, bool classSums, bool withLoss,
                                                  const std::string &reduction = "mean", bool badLabel = false,
                                                  const std::vector<TensorId> &wrt = {"z", "b"}) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("z", ir::TensorKind::Stream, TensorInfo(type, {3, 20, 10}));
  g.addTensor("b", ir::TensorKind::Stream, TensorInfo(type, {10}));
  g.addInput("z");
  g.addInput("b");
  std::vector<int64_t> labels(60);
  for (size_t i = 0; i < labels.size(); ++i)
    labels[i] = i % 7 == 3 ? -100 : static_cast<int64_t>((i * 7) % 10);
  if (badLabel) labels[5] = 10;
  g.addConst("labels", TensorData::fromInt64({60}, labels));
  g.addConst("rows", TensorData::fromInt64({2}, {60, 10}));
  g.addOp("Add", "", 13, "bias", {}, {"z", "b"}, {"logits"});
  g.addOp("Reshape", "", 13, "view", {}, {"logits", "rows"}, {"flat"});
  ir::Attributes a;
  a.set("ignore_index", int64_t{-100});
  a.set("reduction", reduction);
  g.addOp("SoftmaxCrossEntropyLoss", "", 13, "sce", a, {"flat", "labels"}, {"nll"});
  TensorId loss = "nll";
  if (reduction == "none") {
    ir::Attributes all;
    all.set("keepdims", int64_t{0});
    g.addOp("ReduceSum", "", 13, "total", all, {"nll"}, {"loss"});
    loss = "loss";
  }
  g.addOutput(loss);
  ir::inferShapes(g, nullptr);
  std::vector<TensorId> grads = autodiff::buildGradients(g, loss, wrt);
  for (const auto &id : grads)
    g.addOutput(id);
  ir::inferShapes(g, nullptr);
  if (classSums) {
    EXPECT_EQ(ir::fuseLossGradClassSums(g), 1);
  }
  if (withLoss) {
    EXPECT_EQ(ir::fuseLossWithGradient(g), 1);
    EXPECT_EQ(countType(g, "SoftmaxCrossEntropyLoss"), 0);
  }
  backend_cpu::ExecutionPlan plan(g, {KernelProvider::Any});
  // With the forward fused into it, the loss gradient is the logits' last reader, so unless it
  // is a graph output (dz) it is written over them.
  if (wrt.size() == 1 && withLoss)
    for (const auto &op : g.ops())
      if (op->type == "SoftmaxCrossEntropyLossGrad") {
        const auto &inPlace = plan.inPlace();
        EXPECT_NE(std::find(inPlace.begin(), inPlace.end(), op->output(0).id()), inPlace.end());
      }
  std::mt19937 rng(43);
  std::uniform_real_distribution<double> d(-3, 3);
  for (const char *id : {"z", "b"}) {
    std::vector<double> v(static_cast<size_t>(plan.info(id).elementCount()));
    for (auto &e : v)
      e = d(rng);
    TensorData t = TensorData::fromDoubles(type, plan.info(id).shape(), v);
    std::memcpy(plan.address(id), t.data(), static_cast<size_t>(t.byteCount()));
  }
  plan.run();
  std::vector<std::vector<double>> out{TensorData(plan.info(loss), plan.address(loss)).toDoubleVector()};
  for (const auto &id : grads)
    out.push_back(TensorData(plan.info(id), plan.address(id)).toDoubleVector());
  return out;
}

void expectSame(const std::vector<std::vector<double>> &got, const std::vector<std::vector<double>> &want,
                const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(got[k].size(), want[k].size()) << what;
    for (size_t i = 0; i < want[k].size(); ++i)
      ASSERT_NEAR(got[k][i], want[k][i], 1e-6 * (1 + std::fabs(want[k][i])))
          << what << " output " << k << " element " << i;
  }
}

} // namespace

TEST(FuseLossGradClassSums, BiasGradientFromTheLossGradientMatches) {
  // db, the sum of the loss gradient over rows, is written by the loss gradient op.
  for (DataType type : {DataType::FLOAT, DataType::DOUBLE})
    expectSame(lossAndGradients(type, true, false), lossAndGradients(type, false, false), "class sums");
}

TEST(SoftmaxCrossEntropyLossGrad, WrittenOverTheLogitsMatches) {
  // Only db asked for: dlogits is an intermediate, which the plan writes over the logits once
  // nothing else reads them (with the forward fused in).
  for (DataType type : {DataType::FLOAT, DataType::DOUBLE})
    for (bool withLoss : {false, true}) {
      auto all = lossAndGradients(type, false, false);
      auto got = lossAndGradients(type, false, withLoss, "mean", false, {"b"});
      expectSame({got[0], got[1]}, {all[0], all[2]}, withLoss ? "in place, with the loss" : "in place");
    }
}

TEST(FuseLossWithGradient, LossFromTheGradientPassMatchesTheForward) {
  for (DataType type : {DataType::FLOAT, DataType::DOUBLE})
    for (const char *reduction : {"mean", "sum", "none"}) {
      auto want = lossAndGradients(type, false, false, reduction);
      expectSame(lossAndGradients(type, false, true, reduction), want, reduction);
      expectSame(lossAndGradients(type, true, true, reduction), want, std::string(reduction) + " with class sums");
    }
  // A label out of range is an error in the fused op as in the forward.
  try {
    lossAndGradients(DataType::FLOAT, true, true, "mean", true);
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("label 10 at position 5 is out of range [0, 10)"), std::string::npos)
        << e.what();
  }
}

TEST(FuseRelu, GemmWithReluMatchesGemmThenReluForwardAndBackward) {
  // x [6, 5] → Gemm(W [4, 5]ᵀ, b [4]) → Relu → Σ y·w: the Gemm applies the Relu after its bias.
  for (auto p : {KernelProvider::Reference, KernelProvider::Any}) {
    auto run = [&](bool fuse) {
      ir::registerBuiltinOps();
      ir::Graph g;
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {6, 5}));
      g.addTensor("W", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4, 5}));
      g.addInput("x");
      g.addInput("W");
      std::mt19937 rng(44);
      g.addConst("b", randomFloats({4}, rng));
      ir::Attributes t;
      t.set("transB", int64_t{1});
      g.addOp("Gemm", "", 13, "fc", t, {"x", "W", "b"}, {"h"});
      g.addOp("Relu", "", 13, "relu", {}, {"h"}, {"y"});
      ir::inferShapes(g, nullptr);
      TensorId loss = gradcheck::weightedSumLoss()(g, {"y"}, 13);
      g.addOutput(loss);
      g.addOutput("y");
      ir::inferShapes(g, nullptr);
      std::vector<TensorId> grads = autodiff::buildGradients(g, loss, {"x", "W"});
      for (const auto &id : grads)
        g.addOutput(id);
      ir::inferShapes(g, nullptr);
      if (fuse) {
        EXPECT_EQ(ir::fuseRelu(g, false), 1);
        EXPECT_EQ(countType(g, "Relu"), 0);
      }
      backend_cpu::ExecutionPlan plan(g, {p});
      std::mt19937 in(45);
      for (const char *id : {"x", "W"}) {
        TensorData v = randomFloats(plan.info(id).shape(), in);
        std::memcpy(plan.address(id), v.data(), static_cast<size_t>(v.byteCount()));
      }
      plan.run();
      std::vector<std::vector<double>> out;
      for (const TensorId &id : {TensorId("y"), grads[0], grads[1]})
        out.push_back(TensorData(plan.info(id), plan.address(id)).toDoubleVector());
      return out;
    };
    expectSame(run(true), run(false), "gemm relu");
  }
}

TEST(PackedWeights, ConstantMatMulAndGemmWeightsInOneDnnLayoutMatchTheReference) {
  // Constant B (inference weights) is packed once into oneDNN's layout; a second run reuses it.
  for (bool gemm : {false, true})
    for (bool transposed : {false, true}) {
      ir::registerBuiltinOps();
      ir::Graph g;
      g.opsets()["ai.onnx"] = 13;
      Shape xs = gemm ? Shape{64, 96} : Shape{3, 40, 96};
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, xs));
      g.addInput("x");
      std::mt19937 rng(46);
      g.addConst("w", randomFloats(transposed ? Shape{80, 96} : Shape{96, 80}, rng, -0.3f, 0.3f));
      ir::Attributes a;
      if (gemm) {
        if (transposed) a.set("transB", int64_t{1});
        g.addOp("Gemm", "", 13, "fc", a, {"x", "w"}, {"y"});
      } else {
        g.addOp("MatMul", "", 13, "mm", {}, {"x", transposed ? transpose2d(g, "w") : TensorId("w")}, {"y"});
      }
      g.addOutput("y");
      ir::inferShapes(g, nullptr);
      ir::foldTransposesIntoMatMul(g);
      TensorData x1 = randomFloats(xs, rng), x2 = randomFloats(xs, rng);
      backend_cpu::ExecutionPlan plan(g, {KernelProvider::Any});
      for (const TensorData *x : {&x1, &x2}) {
        std::memcpy(plan.address("x"), x->data(), static_cast<size_t>(x->byteCount()));
        plan.run();
        const auto *y = static_cast<const float *>(plan.address("y"));
        std::vector<float> got(y, y + plan.info("y").elementCount());
        expectNear(got, runGraph(g, KernelProvider::Reference, *x), 1e-5f, gemm ? "gemm" : "matmul");
      }
    }
}

TEST(FuseRelu, MatMulWithBiasAndReluMatchesTheUnfusedGraph) {
  // x [2, 5, 8] · W [8, 6] + b → Relu as one MatMul; a Gelu stays apart (slower as a post-op).
  for (bool gelu : {true, false}) {
    auto build = [&](ir::Graph &g) {
      ir::registerBuiltinOps();
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 5, 8}));
      g.addInput("x");
      std::mt19937 rng(47);
      g.addConst("w", randomFloats({8, 6}, rng));
      g.addConst("b", randomFloats({6}, rng));
      g.addOp("MatMul", "", 13, "mm", {}, {"x", "w"}, {"p"});
      g.addOp("Add", "", 13, "add", {}, {"p", "b"}, {"h"});
      if (gelu)
        g.addOp("Gelu", "ai.graphcore", 1, "act", {}, {"h"}, {"y"});
      else
        g.addOp("Relu", "", 13, "act", {}, {"h"}, {"y"});
      g.addOutput("y");
      ir::inferShapes(g, nullptr);
    };
    ir::Graph plain, fused;
    build(plain);
    build(fused);
    ASSERT_EQ(ir::fuseMatMulBias(fused), 1);
    ASSERT_EQ(ir::fuseRelu(fused), gelu ? 0 : 1);
    ASSERT_EQ(fused.ops().size(), gelu ? 2u : 1u);
    if (!gelu) {
      EXPECT_TRUE(fused.ops()[0]->fusion.relu());
    }
    std::mt19937 rng(48);
    TensorData x = randomFloats({2, 5, 8}, rng, -3, 3);
    std::vector<float> want = runGraph(plain, KernelProvider::Reference, x);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(runGraph(fused, p, x), want, 1e-5f, gelu ? "gelu" : "relu");
  }
}

TEST(FuseRelu, ABiasOrScaleAfterTheActivationIsNotFusedIntoIt) {
  // MatMul → Relu → Add(b) / Mul(c): once the Relu is in the MatMul, bias and scale would be
  // applied before it, so they stay separate ops.
  for (const char *after : {"Add", "Mul"}) {
    ir::registerBuiltinOps();
    ir::Graph g;
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4, 8}));
    g.addInput("x");
    std::mt19937 rng(49);
    g.addConst("w", randomFloats({8, 6}, rng));
    g.addConst("b", std::string(after) == "Add" ? randomFloats({6}, rng) : scalarF(0.5f));
    g.addOp("MatMul", "", 13, "mm", {}, {"x", "w"}, {"p"});
    g.addOp("Relu", "", 13, "relu", {}, {"p"}, {"r"});
    g.addOp(after, "", 13, "after", {}, {"r", "b"}, {"y"});
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
    ASSERT_EQ(ir::fuseRelu(g), 1);
    EXPECT_EQ(ir::fuseMatMulBias(g), 0) << after;
    EXPECT_EQ(ir::fuseMatMulScale(g), 0) << after;
    EXPECT_EQ(g.ops().size(), 2u) << after;
  }
}

TEST(FusedAttributes, SetupRejectsMalformedInternalAttributes) {
  // The popart_* attributes (and the typed fusion fields) can be malformed: setup names what is wrong.
  ir::registerBuiltinOps();
  auto expectError = [](ir::Op &op, const std::string &what) {
    try {
      op.def->setup(op);
      FAIL() << "expected an error containing: " << what;
    } catch (const error &e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("a", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4, 8}));
  g.addTensor("b", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {8, 6}));
  g.addTensor("bias5", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {5}));
  ir::Op &noFlag = g.addOp("MatMul", "", 13, "three_inputs", {}, {"a", "b", "bias5"}, {"y0"});
  expectError(noFlag, "three_inputs");
  ir::Op &wrongBias = g.addOp("MatMul", "", 13, "bad_bias", {}, {"a", "b", "bias5"}, {"y1"});
  wrongBias.fusion.bias = true;
  expectError(wrongBias, "must be 1-D of the output's last dimension 6");
  ir::Fusion residual;
  residual.residual = true;
  ir::Op &noResidual = g.addOp("MatMul", "", 13, "no_residual", {}, {"a", "b"}, {"y3"});
  noResidual.fusion = residual;
  expectError(noResidual, "no_residual");
  ir::Op &wrongResidual = g.addOp("MatMul", "", 13, "bad_residual", {}, {"a", "b", "", "b"}, {"y4"});
  wrongResidual.fusion = residual;
  expectError(wrongResidual, "the residual input 3 must be FLOAT[4,6], got FLOAT[8,6]");
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {1, 2, 6, 6}));
  g.addTensor("w", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {3, 2, 3, 3}));
  ir::Op &wrongPool = g.addOp("Conv", "", 13, "bad_pool", {}, {"x", "w"}, {"y2"});
  wrongPool.fusion.pool = ir::FusedPool{{2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 3, 5, 5}};
  expectError(wrongPool, "is not the convolution's result shape");
  ir::Op &convResidual = g.addOp("Conv", "", 13, "bad_conv_residual", {}, {"x", "w", "", "x"}, {"y5"});
  convResidual.fusion = residual;
  expectError(convResidual, "the residual input 3 must be FLOAT[1,3,4,4] without a fused pool, got FLOAT[1,2,6,6]");
}

namespace {

/// Runs \p g with \p p on the stream inputs \p feeds (id → value); returns output "y".
std::vector<float> runFeeds(const ir::Graph &g, KernelProvider p, const std::map<TensorId, TensorData> &feeds,
                            const backend_cpu::KernelContext &context = {}) {
  backend_cpu::ExecutionPlan plan(g, {p}, context);
  for (const auto &[id, v] : feeds)
    std::memcpy(plan.address(id), v.data(), static_cast<size_t>(v.byteCount()));
  plan.run();
  const auto *y = static_cast<const float *>(plan.address("y"));
  return std::vector<float>(y, y + plan.info("y").elementCount());
}

} // namespace

TEST(FuseMatMulResidual, ResidualAddedByTheMatMulMatchesTheAdd) {
  // y = [Relu](x · w [+ b]) + r, as Add(p, r), Add(r, p) or Sum(p, r); r has the product's shape.
  struct Case {
    Shape x;
    const char *op;
    bool residualFirst, bias, relu, sharedProduct, broadcastResidual;
    int fuses;
  };
  for (const Case &c : {Case{{2, 5, 8}, "Add", false, true, false, false, false, 1},
                        Case{{7, 8}, "Add", true, false, true, false, false, 1},
                        Case{{7, 8}, "Sum", false, true, true, false, false, 1},
                        Case{{7, 8}, "Add", false, true, false, true, false, 0},
                        Case{{7, 8}, "Add", false, false, false, false, true, 0}}) {
    std::string what = std::string(c.op) + (c.bias ? "+bias" : "") + (c.relu ? "+relu" : "") +
                       (c.sharedProduct ? " shared" : "") + (c.broadcastResidual ? " broadcast" : "");
    Shape y = c.x;
    y.back() = 6;
    Shape rShape = c.broadcastResidual ? Shape{1, 6} : y;
    auto build = [&](ir::Graph &g) {
      ir::registerBuiltinOps();
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, c.x));
      g.addTensor("r", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, rShape));
      g.addInput("x");
      g.addInput("r");
      std::mt19937 rng(50);
      g.addConst("w", randomFloats({8, 6}, rng));
      g.addConst("b", randomFloats({6}, rng));
      g.addOp("MatMul", "", 13, "mm", {}, {"x", "w"}, {"p"});
      TensorId p = "p";
      if (c.bias) {
        g.addOp("Add", "", 13, "bias", {}, {p, "b"}, {"pb"});
        p = "pb";
      }
      if (c.relu) {
        g.addOp("Relu", "", 13, "relu", {}, {p}, {"pr"});
        p = "pr";
      }
      g.addOp(c.op, "", 13, "residual", {},
              c.residualFirst ? std::vector<TensorId>{"r", p} : std::vector<TensorId>{p, "r"}, {"y"});
      g.addOutput("y");
      if (c.sharedProduct) g.addOutput(p);
      ir::inferShapes(g, nullptr);
    };
    ir::Graph plain, fused;
    build(plain);
    build(fused);
    ir::fuseMatMulBias(fused);
    ir::fuseRelu(fused);
    ASSERT_EQ(ir::fuseMatMulResidual(fused), c.fuses) << what;
    if (!c.fuses) continue;
    ASSERT_EQ(fused.ops().size(), 1u) << what;
    // Nothing fuses after the residual: it would apply before it.
    EXPECT_EQ(ir::fuseMatMulResidual(fused) + ir::fuseMatMulBias(fused) + ir::fuseRelu(fused), 0) << what;
    std::mt19937 rng(51);
    std::map<TensorId, TensorData> feeds{{"x", randomFloats(c.x, rng)}, {"r", randomFloats(rShape, rng)}};
    std::vector<float> want = runFeeds(plain, KernelProvider::Reference, feeds);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(runFeeds(fused, p, feeds), want, 1e-5f, what);
  }
}

TEST(FuseMatMulResidual, GemmWithAResidualBecomesAMatMulThatAddsIt) {
  // y = [Relu](Gemm(a, b [, c])) + r: the Gemm becomes a MatMul with its transposes and bias and
  // adds r; alpha ≠ 1 or a [M, N] C stay a Gemm and an Add.
  struct Case {
    bool transA, transB, bias, relu;
    float alpha;
    bool fullC;
    int fuses;
  };
  for (const Case &c : {Case{false, true, true, false, 1.f, false, 1}, Case{true, false, false, true, 1.f, false, 1},
                        Case{false, false, true, true, 1.f, false, 1}, Case{false, true, true, false, 2.f, false, 0},
                        Case{false, true, true, false, 1.f, true, 0}}) {
    std::string what = std::string(c.transA ? "Aᵀ" : "A") + (c.transB ? "·Bᵀ" : "·B") + (c.bias ? "+bias" : "") +
                       (c.relu ? "+relu" : "") + " alpha " + std::to_string(c.alpha) + (c.fullC ? " [M,N] C" : "");
    const int64_t m = 7, k = 8, n = 6;
    auto build = [&](ir::Graph &g) {
      ir::registerBuiltinOps();
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("a", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, c.transA ? Shape{k, m} : Shape{m, k}));
      g.addTensor("r", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {m, n}));
      g.addInput("a");
      g.addInput("r");
      std::mt19937 rng(56);
      g.addConst("b", randomFloats(c.transB ? Shape{n, k} : Shape{k, n}, rng));
      g.addConst("c", randomFloats(c.fullC ? Shape{m, n} : Shape{n}, rng));
      ir::Attributes attrs;
      attrs.set("transA", int64_t{c.transA});
      attrs.set("transB", int64_t{c.transB});
      attrs.set("alpha", c.alpha);
      std::vector<TensorId> ins{"a", "b"};
      if (c.bias) ins.push_back("c");
      g.addOp("Gemm", "", 13, "gemm", attrs, ins, {"p"});
      TensorId p = "p";
      if (c.relu) {
        g.addOp("Relu", "", 13, "relu", {}, {p}, {"pr"});
        p = "pr";
      }
      g.addOp("Add", "", 13, "residual", {}, {p, "r"}, {"y"});
      g.addOutput("y");
      ir::inferShapes(g, nullptr);
    };
    ir::Graph plain, fused;
    build(plain);
    build(fused);
    ir::fuseRelu(fused);
    ASSERT_EQ(ir::fuseMatMulResidual(fused), c.fuses) << what;
    if (c.fuses) {
      ASSERT_EQ(fused.ops().size(), 1u) << what;
      EXPECT_EQ(fused.ops().front()->type, "MatMul") << what;
    }
    std::mt19937 rng(57);
    std::map<TensorId, TensorData> feeds{{"a", randomFloats(plain.tensor("a").info().shape(), rng)},
                                         {"r", randomFloats({m, n}, rng)}};
    std::vector<float> want = runFeeds(plain, KernelProvider::Reference, feeds);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(runFeeds(fused, p, feeds), want, 1e-5f, what);
  }
}

TEST(FoldBatchNormIntoConv, FoldedConvolutionMatchesConvThenBatchNorm) {
  // y = Relu(BatchNormalization(Conv(x, w [, b]))) with constant statistics: the normalisation
  // goes into new weights and bias; a streamed scale, a second reader of the convolution's
  // result or a training-mode node (running statistics as outputs) keep the two ops.
  struct Case {
    bool bias, streamScale, sharedResult, trainingOutputs;
    int folds;
  };
  for (const Case &c :
       {Case{true, false, false, false, 1}, Case{false, false, false, false, 1}, Case{true, true, false, false, 0},
        Case{true, false, true, false, 0}, Case{true, false, false, true, 0}}) {
    std::string what = std::string(c.bias ? "bias" : "no bias") + (c.streamScale ? " streamed scale" : "") +
                       (c.sharedResult ? " shared" : "") + (c.trainingOutputs ? " training outputs" : "");
    const int64_t ch = 16;
    auto build = [&](ir::Graph &g) {
      ir::registerBuiltinOps();
      g.opsets()["ai.onnx"] = 14;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 4, 7, 7}));
      g.addInput("x");
      std::mt19937 rng(58);
      g.addConst("w", randomFloats({ch, 4, 3, 3}, rng, -0.3f, 0.3f));
      g.addConst("b", randomFloats({ch}, rng));
      if (c.streamScale) {
        g.addTensor("scale", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {ch}));
        g.addInput("scale");
      } else {
        g.addConst("scale", randomFloats({ch}, rng, 0.5f, 1.5f));
      }
      g.addConst("shift", randomFloats({ch}, rng));
      g.addConst("mean", randomFloats({ch}, rng, -0.2f, 0.2f));
      g.addConst("var", randomFloats({ch}, rng, 0.5f, 2.f));
      ir::Attributes pad;
      pad.set("pads", std::vector<int64_t>{1, 1, 1, 1});
      std::vector<TensorId> convIns{"x", "w"};
      if (c.bias) convIns.push_back("b");
      g.addOp("Conv", "", 14, "conv", pad, convIns, {"cv"});
      ir::Attributes bnAttrs;
      bnAttrs.set("epsilon", 1e-3f);
      std::vector<TensorId> bnOuts{"n"};
      if (c.trainingOutputs) {
        bnAttrs.set("training_mode", int64_t{1});
        bnOuts = {"n", "rm", "rv"};
      }
      g.addOp("BatchNormalization", "", 14, "bn", bnAttrs, {"cv", "scale", "shift", "mean", "var"}, bnOuts);
      g.addOp("Relu", "", 14, "relu", {}, {"n"}, {"y"});
      g.addOutput("y");
      if (c.sharedResult) g.addOutput("cv");
      ir::inferShapes(g, nullptr);
    };
    ir::Graph plain, fused;
    build(plain);
    build(fused);
    ASSERT_EQ(ir::foldBatchNormIntoConv(fused), c.folds) << what;
    if (!c.folds) continue;
    EXPECT_EQ(ir::fuseRelu(fused), 1) << what;
    ASSERT_EQ(fused.ops().size(), 1u) << what;
    std::mt19937 rng(59);
    std::map<TensorId, TensorData> feeds{{"x", randomFloats({2, 4, 7, 7}, rng)}};
    std::vector<float> want = runFeeds(plain, KernelProvider::Reference, feeds);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(runFeeds(fused, p, feeds), want, 1e-5f, what);
  }
}

TEST(FuseConvResidual, ResidualAddedByTheConvolutionMatchesTheAdd) {
  // y = [Relu](Conv(x, w [, b]) + r), as Add(c, r), Add(r, c) or Sum(c, r): the residual added
  // by the convolution (oneDNN's sum post-op, before the Relu) matches the ops one by one, with
  // 16 and 3 (padded to a block) channels and with r a graph input or computed.
  struct Case {
    int64_t channels;
    const char *op;
    bool residualFirst, bias, relu, rComputed, sharedResult, broadcastResidual, reluBeforeAdd;
    int fuses;
  };
  for (const Case &c : {Case{16, "Add", false, true, true, false, false, false, false, 1},
                        Case{16, "Add", true, false, false, true, false, false, false, 1},
                        Case{3, "Sum", false, true, true, false, false, false, false, 1},
                        Case{3, "Add", false, false, true, true, false, false, false, 1},
                        Case{16, "Add", false, true, false, false, true, false, false, 0},
                        Case{16, "Add", false, true, false, false, false, true, false, 0},
                        Case{16, "Add", false, true, false, false, false, false, true, 0}}) {
    std::string what = std::to_string(c.channels) + " channels " + c.op + (c.bias ? "+bias" : "") +
                       (c.relu ? "+relu" : "") + (c.rComputed ? " r computed" : "") +
                       (c.sharedResult ? " shared" : "") + (c.broadcastResidual ? " broadcast" : "") +
                       (c.reluBeforeAdd ? " relu before the add" : "");
    const Shape xs{2, 4, 9, 9}, ys{2, c.channels, 9, 9};
    const Shape rs = c.broadcastResidual ? Shape{1, c.channels, 1, 1} : ys;
    auto build = [&](ir::Graph &g) {
      ir::registerBuiltinOps();
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, xs));
      g.addTensor("r0", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, rs));
      g.addInput("x");
      g.addInput("r0");
      std::mt19937 rng(52);
      g.addConst("w", randomFloats({c.channels, 4, 3, 3}, rng, -0.3f, 0.3f));
      g.addConst("b", randomFloats({c.channels}, rng));
      ir::Attributes pad;
      pad.set("pads", std::vector<int64_t>{1, 1, 1, 1});
      std::vector<TensorId> convIns{"x", "w"};
      if (c.bias) convIns.push_back("b");
      g.addOp("Conv", "", 13, "conv", pad, convIns, {"cv"});
      TensorId cv = "cv";
      if (c.reluBeforeAdd) {
        g.addOp("Relu", "", 13, "relu0", {}, {cv}, {"cvr"});
        cv = "cvr";
      }
      TensorId r = "r0";
      if (c.rComputed) { // an intermediate: the output may take its bytes
        g.addOp("Neg", "", 13, "neg", {}, {"r0"}, {"r"});
        r = "r";
      }
      // With r computed, the block's result goes on to a Neg (no graph output either).
      TensorId result = c.rComputed ? "z" : "y", sum = c.relu ? "s" : result;
      g.addOp(c.op, "", 13, "residual", {},
              c.residualFirst ? std::vector<TensorId>{r, cv} : std::vector<TensorId>{cv, r}, {sum});
      if (c.relu) g.addOp("Relu", "", 13, "relu", {}, {sum}, {result});
      if (c.rComputed) g.addOp("Neg", "", 13, "after", {}, {result}, {"y"});
      g.addOutput("y");
      if (c.sharedResult) g.addOutput(cv);
      ir::inferShapes(g, nullptr);
    };
    ir::Graph plain, fused;
    build(plain);
    build(fused);
    ASSERT_EQ(ir::fuseConvResidual(fused), c.fuses) << what;
    if (!c.fuses) continue;
    if (c.relu) {
      EXPECT_EQ(ir::fuseRelu(fused), 1) << what; // relu(conv + r)
    }
    EXPECT_EQ(ir::fuseConvPool(fused) + ir::fuseConvResidual(fused), 0) << what;
    ASSERT_EQ(fused.ops().size(), c.rComputed ? 3u : 1u) << what;
    std::mt19937 rng(53);
    std::map<TensorId, TensorData> feeds{{"x", randomFloats(xs, rng)}, {"r0", randomFloats(rs, rng)}};
    std::vector<float> want = runFeeds(plain, KernelProvider::Reference, feeds);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(runFeeds(fused, p, feeds), want, 1e-5f, what);
  }
}

TEST(FuseConvResidual, ResNetBlocksStayBlockedAndMatch) {
  // Two blocks x → Conv+Relu → Conv → Add(x) → Relu, 16 channels. The shortcut is the block's
  // input, which its first convolution reads too; between the blocks that tensor stays in
  // oneDNN's blocked layout for both readers (the second block's first convolution and its
  // residual), and inside each block the first convolution's result stays blocked.
  auto build = [](ir::Graph &g) {
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x0", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 16, 8, 8}));
    g.addInput("x0");
    std::mt19937 rng(54);
    ir::Attributes pad;
    pad.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    g.addOp("Relu", "", 13, "pre", {}, {"x0"}, {"in0"});
    for (int k = 0; k < 2; ++k) {
      std::string n = std::to_string(k), in = "in" + n, out = k == 1 ? "y" : "in" + std::to_string(k + 1);
      g.addConst("w1_" + n, randomFloats({16, 16, 3, 3}, rng, -0.2f, 0.2f));
      g.addConst("w2_" + n, randomFloats({16, 16, 3, 3}, rng, -0.2f, 0.2f));
      g.addConst("b2_" + n, randomFloats({16}, rng));
      g.addOp("Conv", "", 13, "c1_" + n, pad, {in, "w1_" + n}, {"a" + n});
      g.addOp("Relu", "", 13, "r1_" + n, {}, {"a" + n}, {"ar" + n});
      g.addOp("Conv", "", 13, "c2_" + n, pad, {"ar" + n, "w2_" + n, "b2_" + n}, {"b" + n});
      g.addOp("Add", "", 13, "add_" + n, {}, {"b" + n, in}, {"s" + n});
      g.addOp("Relu", "", 13, "r2_" + n, {}, {"s" + n}, {out});
    }
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
  };
  ir::Graph plain, fused;
  build(plain);
  build(fused);
  EXPECT_EQ(ir::fuseConvResidual(fused), 2);
  EXPECT_EQ(ir::fuseRelu(fused), 4);
  ASSERT_EQ(fused.ops().size(), 5u);
  backend_cpu::ExecutionPlan plan(fused, {KernelProvider::Any});
  EXPECT_EQ(plan.agreedLayouts(), (std::vector<TensorId>{"ar0", "in1", "ar1"}));
  std::mt19937 rng(55);
  std::map<TensorId, TensorData> feeds{{"x0", randomFloats({2, 16, 8, 8}, rng)}};
  std::vector<float> want = runFeeds(plain, KernelProvider::Reference, feeds);
  for (auto p : {KernelProvider::Reference, KernelProvider::Any})
    expectNear(runFeeds(fused, p, feeds), want, 1e-4f, "blocks");
}

TEST(MatMulOperands, EveryOperandLayoutMatchesTheReference) {
  // Weight-gradient form Xᵀ · dY (A stored transposed), and a plain product, each with and
  // without a bias; each way of presenting the operands to oneDNN (forced) matches the reference
  // kernel, in a plan (with scratch) and outside one (without: the kernel runs as stored).
  for (bool transposedA : {true, false})
    for (bool bias : {true, false}) {
      ir::Graph g;
      ir::registerBuiltinOps();
      g.opsets()["ai.onnx"] = 13;
      Shape aShape = transposedA ? Shape{33, 20} : Shape{20, 33};
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, aShape));
      g.addTensor("dy", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {33, 17}));
      g.addInput("x");
      g.addInput("dy");
      std::mt19937 rng(60);
      g.addConst("b", randomFloats({17}, rng));
      g.addOp("MatMul", "", 13, "mm", {}, {transposedA ? transpose2d(g, "x") : TensorId("x"), "dy"},
              {bias ? "p" : "y"});
      if (bias) g.addOp("Add", "", 13, "add", {}, {"p", "b"}, {"y"});
      g.addOutput("y");
      ir::inferShapes(g, nullptr);
      ir::foldTransposesIntoMatMul(g);
      ir::fuseMatMulBias(g);
      ASSERT_EQ(g.ops().size(), 1u);
      std::map<TensorId, TensorData> feeds{{"x", randomFloats(aShape, rng)}, {"dy", randomFloats({33, 17}, rng)}};
      std::vector<float> want = runFeeds(g, KernelProvider::Reference, feeds);
      for (auto way : {backend_cpu::MatMulOperands::AsStored, backend_cpu::MatMulOperands::FlippedA,
                       backend_cpu::MatMulOperands::FlippedB, backend_cpu::MatMulOperands::ShiftedB,
                       backend_cpu::MatMulOperands::Pointwise, backend_cpu::MatMulOperands::Swapped,
                       backend_cpu::MatMulOperands::SwappedCopy, backend_cpu::MatMulOperands::FlippedPointwise}) {
        backend_cpu::KernelContext context;
        context.matmulOperands = way;
        std::string what =
            std::string(transposedA ? "Xt·dY" : "X·dY") + (bias ? " + b" : "") + " way " + std::to_string(int(way));
        {
          backend_cpu::ExecutionPlan plan(g, {KernelProvider::Dnnl}, context);
          // Pointwise needs a row-major A and FlippedPointwise a transposed one (else the product
          // runs as stored); both reorder B. The swapped ways do not take a bias.
          bool swapped = way == backend_cpu::MatMulOperands::Swapped || way == backend_cpu::MatMulOperands::SwappedCopy;
          bool reorders = way != backend_cpu::MatMulOperands::AsStored &&
                          !(way == backend_cpu::MatMulOperands::Pointwise && transposedA) &&
                          !(way == backend_cpu::MatMulOperands::FlippedPointwise && !transposedA) && !(swapped && bias);
          EXPECT_EQ(plan.memoryPlan().scratchOffsets.at(0) >= 0, reorders) << what;
        }
        expectNear(runFeeds(g, KernelProvider::Dnnl, feeds, context), want, 1e-5f, what);
        // Outside a plan: no scratch.
        auto kernel = backend_cpu::createKernel(*g.schedule()[0], KernelProvider::Dnnl, context);
        std::vector<float> out(want.size());
        const void *ins[] = {feeds.at("x").data(), feeds.at("dy").data(), g.tensor("b").data()->data()};
        void *outs[] = {out.data()};
        kernel->run({ins, bias ? size_t{3} : size_t{2}, outs, 1});
        expectNear(out, want, 1e-5f, what + " without scratch");
      }
    }
}

TEST(MatMulOperands, PointwiseConvolutionMatchesTheReference) {
  // Products run as oneDNN 1×1 convolutions (forced Pointwise): MatMul with a batched A and a
  // constant or streamed B (stored or transposed), with bias, Relu, scale or residual; Gemm with
  // C as a bias, C added before the Relu, alpha. Each matches the reference kernel; a streamed B
  // is reordered into the plan's scratch. Where Pointwise does not apply (C of [M, 1]; a C row
  // with alpha, which oneDNN would scale with the product) the product runs as stored.
  struct Case {
    std::string what;
    bool gemm, constB, transB, bias, relu, residual;
    float scale; ///< MatMul: a Mul by this; Gemm: alpha
    Shape c;     ///< Gemm's C
    bool pointwise = true;
  };
  const Shape a{3, 7, 20};
  const int64_t n = 17;
  std::vector<Case> cases{
      {"MatMul const B + bias + Relu", false, true, false, true, true, false, 1.f, {}},
      {"MatMul streamed Bt + residual", false, false, true, false, false, true, 1.f, {}},
      {"MatMul streamed B, scaled", false, false, false, false, false, false, 0.5f, {}},
      {"Gemm const Bt, C [N] + Relu", true, true, true, false, true, false, 1.f, {n}},
      {"Gemm streamed B, C [M, N], alpha", true, false, false, false, true, false, 0.5f, {21, n}},
      {"Gemm streamed B, C [1, N]", true, false, false, false, false, false, 1.f, {1, n}},
      {"Gemm C [1, N], alpha", true, false, false, false, false, false, 2.f, {1, n}, false},
      {"Gemm C [M, 1]", true, false, true, false, false, false, 1.f, {21, 1}, false},
  };
  for (const Case &c : cases) {
    ir::registerBuiltinOps();
    ir::Graph g;
    g.opsets()["ai.onnx"] = 13;
    std::mt19937 rng(61);
    Shape xShape = c.gemm ? Shape{21, 20} : a, bShape = c.transB ? Shape{n, 20} : Shape{20, n};
    Shape yShape = c.gemm ? Shape{21, n} : Shape{3, 7, n};
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, xShape));
    g.addInput("x");
    std::map<TensorId, TensorData> feeds{{"x", randomFloats(xShape, rng)}};
    if (c.constB) {
      g.addConst("w", randomFloats(bShape, rng));
    } else {
      g.addTensor("w", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, bShape));
      g.addInput("w");
      feeds.emplace("w", randomFloats(bShape, rng));
    }
    // Each stage's output; the last one's is y.
    int stages = 1 + (!c.gemm && c.scale != 1.f) + (!c.gemm && c.bias) + c.relu + c.residual;
    auto next = [&](const char *id) { return TensorId(--stages == 0 ? "y" : id); };
    TensorId out = next("p");
    if (c.gemm) {
      ir::Attributes attrs;
      attrs.set("transB", int64_t{c.transB});
      attrs.set("alpha", c.scale);
      g.addConst("c", randomFloats(c.c, rng));
      g.addOp("Gemm", "", 13, "gemm", attrs, {"x", "w", "c"}, {out});
    } else {
      g.addOp("MatMul", "", 13, "mm", {}, {"x", c.transB ? transpose2d(g, "w") : TensorId("w")}, {out});
      if (c.scale != 1.f) {
        g.addConst("s", scalarF(c.scale));
        TensorId ps = next("ps");
        g.addOp("Mul", "", 13, "scale", {}, {out, "s"}, {ps});
        out = ps;
      }
      if (c.bias) {
        g.addConst("b", randomFloats({n}, rng));
        TensorId pb = next("pb");
        g.addOp("Add", "", 13, "bias", {}, {out, "b"}, {pb});
        out = pb;
      }
    }
    if (c.relu) {
      TensorId pr = next("pr");
      g.addOp("Relu", "", 13, "relu", {}, {out}, {pr});
      out = pr;
    }
    if (c.residual) {
      g.addTensor("r", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, yShape));
      g.addInput("r");
      feeds.emplace("r", randomFloats(yShape, rng));
      TensorId pa = next("pa");
      g.addOp("Add", "", 13, "residual", {}, {out, "r"}, {pa});
      out = pa;
    }
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
    std::vector<float> want = runFeeds(g, KernelProvider::Reference, feeds);
    ir::foldTransposesIntoMatMul(g);
    ir::fuseMatMulScale(g);
    ir::fuseMatMulBias(g);
    ir::fuseRelu(g);
    ir::fuseMatMulResidual(g);
    ASSERT_EQ(countType(g, c.gemm ? "Gemm" : "MatMul"), 1) << c.what;
    ASSERT_EQ(g.ops().size(), 1u) << c.what << ": everything fused";
    for (auto way : {backend_cpu::MatMulOperands::AsStored, backend_cpu::MatMulOperands::Pointwise}) {
      backend_cpu::KernelContext context;
      context.matmulOperands = way;
      std::string what = c.what + (way == backend_cpu::MatMulOperands::Pointwise ? ", pointwise" : ", stored");
      backend_cpu::ExecutionPlan plan(g, {KernelProvider::Dnnl}, context);
      bool reorders = way == backend_cpu::MatMulOperands::Pointwise && c.pointwise && !c.constB;
      EXPECT_EQ(plan.memoryPlan().scratchOffsets.at(0) >= 0, reorders) << what;
      expectNear(runFeeds(g, KernelProvider::Dnnl, feeds, context), want, 1e-5f, what);
    }
  }
}

TEST(TiledMaxPool, VectorisedPassMatchesTheGenericLoop) {
  // FLOAT takes the fast kernel's vectorised pass (oneDNN declines it), DOUBLE the reference loop.
  for (const TiledPoolCase &c : tiledPoolCases()) {
    std::mt19937 rng(38);
    std::uniform_int_distribution<int> small(-3, 3); // ties in most windows
    std::vector<double> x(static_cast<size_t>(shapeElementCount(c.shape)));
    for (auto &v : x)
      v = small(rng);
    auto pool = [&](DataType type, KernelProvider p, KernelProvider *used) {
      ir::registerBuiltinOps();
      ir::Graph g;
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(type, c.shape));
      g.addInput("x");
      ir::Attributes a;
      a.set("kernel_shape", c.kernel);
      a.set("strides", c.strides);
      g.addOp("MaxPool", "", 13, "pool", a, {"x"}, {"y"});
      g.addOutput("y");
      ir::inferShapes(g, nullptr);
      backend_cpu::ExecutionPlan plan(g, {p});
      TensorData in = TensorData::fromDoubles(type, c.shape, x);
      std::memcpy(plan.address("x"), in.data(), static_cast<size_t>(in.byteCount()));
      plan.run();
      if (used) *used = plan.stepProviders()[0];
      std::vector<double> y(static_cast<size_t>(plan.info("y").elementCount()));
      for (size_t i = 0; i < y.size(); ++i)
        y[i] = type == DataType::FLOAT ? static_cast<const float *>(plan.address("y"))[i]
                                       : static_cast<const double *>(plan.address("y"))[i];
      return y;
    };
    std::vector<double> want = pool(DataType::DOUBLE, KernelProvider::Reference, nullptr);
    KernelProvider used = KernelProvider::Any;
    std::vector<double> got = pool(DataType::FLOAT, KernelProvider::Any, &used);
    EXPECT_EQ(used, KernelProvider::Fast);
    ASSERT_EQ(got, want);
  }
}

namespace {

/// Attention's head split and merge as exported from PyTorch, forward and backward: q, k, v
/// [2, 5, 3, 4] (batch, sequence, heads, head size) → Q = q(0,2,1,3), Kᵀ = k(0,2,3,1),
/// V = v(0,2,1,3); y = (Q·Kᵀ·V)(0,2,1,3) + (q(0,2,3,1)·Q·Kᵀ)(0,3,1,2); u = q(3,1,2,0)·e, whose
/// transpose moves the stored last axis first and cannot be read through strides. The loss is a
/// weighted sum of y and u; the outputs are y, u and the gradients of q, k, v and e.
void attentionPermutations(ir::Graph &g) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 13;
  for (const char *id : {"q", "k", "v"}) {
    g.addTensor(id, ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 5, 3, 4}));
    g.addInput(id);
  }
  g.addTensor("e", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 6}));
  g.addInput("e");
  auto transpose = [&](const TensorId &in, std::vector<int64_t> perm, const TensorId &out) {
    ir::Attributes a;
    a.set("perm", perm);
    g.addOp("Transpose", "", 13, out, a, {in}, {out});
  };
  transpose("q", {0, 2, 1, 3}, "Q");
  transpose("k", {0, 2, 3, 1}, "Kt");
  transpose("v", {0, 2, 1, 3}, "V");
  g.addOp("MatMul", "", 13, "scores", {}, {"Q", "Kt"}, {"S"}); // [2, 3, 5, 5]
  g.addOp("MatMul", "", 13, "context", {}, {"S", "V"}, {"O"}); // [2, 3, 5, 4]
  transpose("O", {0, 2, 1, 3}, "merged");                      // [2, 5, 3, 4]
  transpose("q", {0, 2, 3, 1}, "Qt");                          // [2, 3, 4, 5]
  g.addOp("MatMul", "", 13, "w", {}, {"Qt", "S"}, {"W"});      // [2, 3, 4, 5]
  transpose("W", {0, 3, 1, 2}, "Wt");                          // [2, 5, 3, 4]
  g.addOp("Add", "", 13, "add", {}, {"merged", "Wt"}, {"y"});
  transpose("q", {3, 1, 2, 0}, "U");                     // [4, 5, 3, 2]
  g.addOp("MatMul", "", 13, "u", {}, {"U", "e"}, {"u"}); // [4, 5, 3, 6]
  ir::inferShapes(g, nullptr);
  TensorId loss = gradcheck::weightedSumLoss(2)(g, {"y", "u"}, 13);
  ir::inferShapes(g, nullptr);
  std::vector<TensorId> grads = autodiff::buildGradients(g, loss, {"q", "k", "v", "e"});
  g.addOutput("y");
  g.addOutput("u");
  for (const auto &id : grads)
    g.addOutput(id);
  ir::inferShapes(g, nullptr);
}

std::vector<std::vector<float>> runOutputs(const ir::Graph &g, KernelProvider p,
                                           const backend_cpu::KernelContext &context = {}) {
  backend_cpu::ExecutionPlan plan(g, {p}, context);
  std::mt19937 rng(71);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (const char *id : {"q", "k", "v", "e"}) {
    auto *x = static_cast<float *>(plan.address(id));
    for (int64_t i = 0; i < plan.info(id).elementCount(); ++i)
      x[i] = d(rng);
  }
  plan.run();
  std::vector<std::vector<float>> out;
  for (const auto &id : g.outputs()) {
    const auto *y = static_cast<const float *>(plan.address(id));
    out.emplace_back(y, y + plan.info(id).elementCount());
  }
  return out;
}

} // namespace

TEST(FoldTransposes, HeadPermutationsAreReadAndWrittenThroughStrides) {
  ir::Graph built, folded;
  attentionPermutations(built);
  attentionPermutations(folded);
  int transposes = countType(built, "Transpose");
  EXPECT_GT(ir::foldTransposesIntoMatMul(folded), 0);
  // Every Transpose folds into the products but u's input (and its gradient's, which is not
  // next to a MatMul): the forward's 7 and the backward's.
  EXPECT_EQ(countType(folded, "Transpose"), 2) << "of " << transposes;
  int permuted = 0;
  for (const auto &op : folded.ops())
    permuted += op->fusion.permuted();
  EXPECT_GE(permuted, 6);
  auto want = runOutputs(built, KernelProvider::Reference);
  // Any: oneDNN's MatMul, reading through the strides or (Unpermuted) copying to plain layouts.
  for (auto way : {backend_cpu::MatMulOperands::AsStored, backend_cpu::MatMulOperands::Unpermuted})
    for (auto p : {KernelProvider::Reference, KernelProvider::Any}) {
      backend_cpu::KernelContext context;
      context.matmulOperands = way;
      auto got = runOutputs(folded, p, context);
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < want.size(); ++k)
        expectNear(got[k], want[k], 1e-5f,
                   "output " + built.outputs()[k] + " provider " + std::to_string(int(p)) + " way " +
                       std::to_string(int(way)));
    }
}

TEST(FoldTransposes, BadPermutationsAreErrors) {
  ir::registerBuiltinOps();
  for (std::string field : {"permA", "permY"})
    for (std::vector<int64_t> perm :
         {std::vector<int64_t>{0, 1, 1}, std::vector<int64_t>{1, 0, 2, 3}, std::vector<int64_t>{0, 2, 1}}) {
      if (field == "permA" && perm == std::vector<int64_t>{0, 2, 1}) continue; // valid
      ir::Graph g;
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("a", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3, 3}));
      g.addTensor("b", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3, 3}));
      g.addInput("a");
      g.addInput("b");
      ir::Op &mm = g.addOp("MatMul", "", 13, "mm", {}, {"a", "b"}, {"y"});
      (field == "permA" ? mm.fusion.permA : mm.fusion.permY) = perm;
      try {
        ir::inferShapes(g, nullptr);
        FAIL() << field << " " << toString(Shape(perm.begin(), perm.end()));
      } catch (const error &e) {
        EXPECT_NE(std::string(e.what()).find("MatMul 'mm': fusion field " + field), std::string::npos) << e.what();
      }
    }
}

TEST(FuseMatMulResidual, ResidualThroughAReshapeOfTheProductMatches) {
  // y = Reshape(x [6, 8] · w [8, 5], [2, 3, 5]) + r [2, 3, 5]: the MatMul adds r viewed as
  // [6, 5] and its result is reshaped back; a Reshape that something else reads stops it.
  for (bool sharedView : {false, true}) {
    auto build = [&](ir::Graph &g) {
      ir::registerBuiltinOps();
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {6, 8}));
      g.addTensor("r", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3, 5}));
      g.addInput("x");
      g.addInput("r");
      std::mt19937 rng(52);
      g.addConst("w", randomFloats({8, 5}, rng));
      g.addConst("to3d", TensorData::fromInt64({3}, {2, 3, 5}));
      g.addOp("MatMul", "", 13, "mm", {}, {"x", "w"}, {"p"});
      g.addOp("Reshape", "", 13, "view", {}, {"p", "to3d"}, {"p3"});
      g.addOp("Sum", "", 13, "sum", {}, {"r", "p3"}, {"y"});
      g.addOutput("y");
      if (sharedView) g.addOutput("p3");
      ir::inferShapes(g, nullptr);
    };
    ir::Graph plain, fused;
    build(plain);
    build(fused);
    ASSERT_EQ(ir::fuseMatMulResidual(fused), sharedView ? 0 : 1);
    EXPECT_EQ(countType(fused, "Sum"), sharedView ? 1 : 0);
    std::mt19937 rng(53);
    std::map<TensorId, TensorData> feeds{{"x", randomFloats({6, 8}, rng)}, {"r", randomFloats({2, 3, 5}, rng)}};
    std::vector<float> want = runFeeds(plain, KernelProvider::Reference, feeds);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(runFeeds(fused, p, feeds), want, 1e-5f, sharedView ? "shared view" : "through the view");
  }
}

TEST(FuseMatMulResidual, SumOfSeveralProductsBecomesAChain) {
  // y = Sum(r, Reshape(x·w1), x3·w2, Reshape(x·w3)) with r and x3 [2, 3, 5]: each product adds
  // the sum before it, and no Sum is left.
  auto build = [&](ir::Graph &g) {
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {6, 8}));
    g.addTensor("x3", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3, 8}));
    g.addTensor("r", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3, 5}));
    for (const char *id : {"x", "x3", "r"})
      g.addInput(id);
    std::mt19937 rng(54);
    for (const char *w : {"w1", "w2", "w3"})
      g.addConst(w, randomFloats({8, 5}, rng));
    g.addConst("to3d", TensorData::fromInt64({3}, {2, 3, 5}));
    g.addOp("MatMul", "", 13, "mm1", {}, {"x", "w1"}, {"p1"});
    g.addOp("Reshape", "", 13, "view1", {}, {"p1", "to3d"}, {"q1"});
    g.addOp("MatMul", "", 13, "mm2", {}, {"x3", "w2"}, {"q2"});
    g.addOp("MatMul", "", 13, "mm3", {}, {"x", "w3"}, {"p3"});
    g.addOp("Reshape", "", 13, "view3", {}, {"p3", "to3d"}, {"q3"});
    g.addOp("Sum", "", 13, "sum", {}, {"r", "q1", "q2", "q3"}, {"y"});
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
  };
  ir::Graph plain, fused;
  build(plain);
  build(fused);
  EXPECT_EQ(ir::fuseMatMulResidual(fused), 3);
  EXPECT_EQ(countType(fused, "Sum"), 0);
  std::mt19937 rng(55);
  std::map<TensorId, TensorData> feeds{
      {"x", randomFloats({6, 8}, rng)}, {"x3", randomFloats({2, 3, 8}, rng)}, {"r", randomFloats({2, 3, 5}, rng)}};
  std::vector<float> want = runFeeds(plain, KernelProvider::Reference, feeds);
  for (auto p : {KernelProvider::Reference, KernelProvider::Any})
    expectNear(runFeeds(fused, p, feeds), want, 1e-5f, "chain");
}

TEST(FuseConvActivation, ActivationAppliedByTheConvolutionMatchesTheOps) {
  // y = act(Conv(x, w [, b])) for ReLU6 (Clip 0..6), HardSigmoid, HardSwish, Sigmoid, and SiLU and
  // hard swish written as x · Sigmoid(x) / x · HardSigmoid(x; 1/6, 1/2): the convolution applies
  // it (oneDNN eltwise post-ops) and matches the ops one by one, with 16 and 3 (padded) channels.
  // A gate that something else reads, or a HardSigmoid of other parameters before the Mul, stays.
  enum class Pattern {
    Clip,
    ClipNoMax,
    HardSigmoid,
    HardSwish,
    Sigmoid,
    SiLU,
    SiLUSwapped,
    HardSwishMul,
    OtherHardSigmoidMul,
    SharedGate
  };
  struct Case {
    Pattern pattern;
    int64_t channels;
    bool bias;
    const char *kind; ///< the fused activation ("" : not fused)
  };
  for (const Case &c :
       {Case{Pattern::Clip, 16, true, "Clip"}, Case{Pattern::ClipNoMax, 3, false, "Clip"},
        Case{Pattern::HardSigmoid, 16, true, "HardSigmoid"}, Case{Pattern::HardSwish, 3, true, "HardSwish"},
        Case{Pattern::Sigmoid, 16, false, "Sigmoid"}, Case{Pattern::SiLU, 16, true, "Swish"},
        Case{Pattern::SiLUSwapped, 3, true, "Swish"}, Case{Pattern::HardSwishMul, 16, true, "HardSwish"},
        Case{Pattern::OtherHardSigmoidMul, 16, true, ""}, Case{Pattern::SharedGate, 16, true, ""}}) {
    std::string what = std::to_string(static_cast<int>(c.pattern)) + " " + std::to_string(c.channels) + " channels";
    const Shape xs{2, 4, 9, 9};
    auto build = [&](ir::Graph &g) {
      ir::registerBuiltinOps();
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, xs));
      g.addInput("x");
      std::mt19937 rng(56);
      g.addConst("w", randomFloats({c.channels, 4, 3, 3}, rng, -0.5f, 0.5f));
      g.addConst("b", randomFloats({c.channels}, rng));
      g.addConst("lo", scalarF(0.f));
      g.addConst("hi", scalarF(6.f));
      ir::Attributes pad;
      pad.set("pads", std::vector<int64_t>{1, 1, 1, 1});
      std::vector<TensorId> convIns{"x", "w"};
      if (c.bias) convIns.push_back("b");
      g.addOp("Conv", "", 13, "conv", pad, convIns, {"cv"});
      ir::Attributes hs;
      hs.set("alpha", c.pattern == Pattern::OtherHardSigmoidMul ? 0.2f : 1.f / 6.f);
      hs.set("beta", 0.5f);
      switch (c.pattern) {
      case Pattern::Clip: g.addOp("Clip", "", 13, "act", {}, {"cv", "lo", "hi"}, {"y"}); break;
      case Pattern::ClipNoMax: g.addOp("Clip", "", 13, "act", {}, {"cv", "lo"}, {"y"}); break;
      case Pattern::HardSigmoid: g.addOp("HardSigmoid", "", 13, "act", hs, {"cv"}, {"y"}); break;
      case Pattern::HardSwish: g.addOp("HardSwish", "", 14, "act", {}, {"cv"}, {"y"}); break;
      case Pattern::Sigmoid: g.addOp("Sigmoid", "", 13, "act", {}, {"cv"}, {"y"}); break;
      case Pattern::SiLU:
      case Pattern::SharedGate:
        g.addOp("Sigmoid", "", 13, "gate", {}, {"cv"}, {"s"});
        g.addOp("Mul", "", 13, "mul", {}, {"cv", "s"}, {"y"});
        break;
      case Pattern::SiLUSwapped:
        g.addOp("Sigmoid", "", 13, "gate", {}, {"cv"}, {"s"});
        g.addOp("Mul", "", 13, "mul", {}, {"s", "cv"}, {"y"});
        break;
      case Pattern::HardSwishMul:
      case Pattern::OtherHardSigmoidMul:
        g.addOp("HardSigmoid", "", 13, "gate", hs, {"cv"}, {"s"});
        g.addOp("Mul", "", 13, "mul", {}, {"cv", "s"}, {"y"});
        break;
      }
      g.addOutput("y");
      if (c.pattern == Pattern::SharedGate) g.addOutput("s");
      ir::inferShapes(g, nullptr);
    };
    ir::Graph plain, fused;
    build(plain);
    build(fused);
    bool fuses = *c.kind != '\0';
    ASSERT_EQ(ir::fuseConvActivation(fused), fuses ? 1 : 0) << what;
    if (!fuses) continue;
    ASSERT_EQ(fused.ops().size(), 1u) << what;
    EXPECT_STREQ(ir::FusedActivation::name(fused.ops()[0]->fusion.activation.kind), c.kind) << what;
    EXPECT_EQ(ir::fuseConvActivation(fused) + ir::fuseRelu(fused), 0) << what;
    std::mt19937 rng(57);
    std::map<TensorId, TensorData> feeds{{"x", randomFloats(xs, rng, -3, 3)}};
    std::vector<float> want = runFeeds(plain, KernelProvider::Reference, feeds);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(runFeeds(fused, p, feeds), want, 2e-5f, what);
  }
}

TEST(FuseConvActivation, VerifierRejectsAnActivationTheOpCannotApply) {
  // A Conv applies any kind; MatMul, Gemm, BatchNormalization and MaxPoolGrad only a Relu; the
  // parameters must fit the kind; the old string attribute is refused.
  ir::registerBuiltinOps();
  using K = ir::FusedActivation::Kind;
  struct Case {
    const char *op;
    ir::FusedActivation act;
    const char *attribute; // set instead of the field when not null
    const char *error;     // "" if the graph is valid
  };
  for (const Case &c : {
           Case{"Conv", {K::Clip, 0.f, 6.f}, nullptr, ""},
           Case{"Conv", {K::HardSwish, 0.f, 0.f}, nullptr, ""},
           Case{"MatMul", {K::Relu, 0.f, 0.f}, nullptr, ""},
           Case{"MatMul",
                {K::Clip, 0.f, 6.f},
                nullptr,
                "MatMul 'mm' carries fusion field 'activation Clip', which ai.onnx::MatMul does not declare"},
           Case{"Conv",
                {K::Clip, 6.f, 0.f},
                nullptr,
                "Conv 'conv': fusion field 'activation' Clip needs alpha <= beta, not 6.000000 and 0.000000"},
           Case{"Conv", {K::Relu, 0.5f, 0.f}, nullptr, "Conv 'conv': fusion field 'activation' Relu takes no alpha"},
           Case{"Conv",
                {},
                "popart_activation",
                "Conv 'conv' has internal attribute 'popart_activation', which ai.onnx::Conv does not declare"},
       }) {
    ir::Graph g;
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {1, 2, 6, 6}));
    g.addInput("x");
    g.addConst("w", TensorData(TensorInfo(DataType::FLOAT, {3, 2, 3, 3})));
    g.addConst("m", TensorData(TensorInfo(DataType::FLOAT, {4, 5})));
    ir::Op &conv = g.addOp("Conv", "", 13, "conv", {}, {"x", "w"}, {"c"});
    ir::Op &mm = g.addOp("MatMul", "", 13, "mm", {}, {"c", "m"}, {"y"});
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
    ir::Op &op = std::string(c.op) == "Conv" ? conv : mm;
    if (c.attribute)
      op.attrs.set(c.attribute, std::string("Relu"));
    else
      op.fusion.activation = c.act;
    std::string what = std::string(c.op) + " " + ir::FusedActivation::name(c.act.kind);
    if (!*c.error) {
      EXPECT_NO_THROW(ir::verifyGraph(g, "")) << what;
      continue;
    }
    try {
      ir::verifyGraph(g, "");
      FAIL() << what << ": expected an error containing: " << c.error;
    } catch (const error &e) {
      EXPECT_NE(std::string(e.what()).find(c.error), std::string::npos) << e.what();
    }
  }
}

TEST(AgreedLayouts, InvertedResidualChainStaysBlockedWithPaddedChannels) {
  // MobileNet v2's block with 24 channels (padded to 32 in oneDNN's 16-channel blocks):
  // x → Conv 1x1 + ReLU6 → depthwise Conv 3x3 + ReLU6 → Conv 1x1 → + x → y. The depthwise
  // convolution runs on the pointwise ones' blocks and every tensor between them stays blocked,
  // its arena slot sized for the padded layout; the result matches the reference.
  const Shape xs{2, 24, 10, 10};
  auto build = [&](ir::Graph &g) {
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x0", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, xs));
    g.addInput("x0");
    std::mt19937 rng(58);
    g.addConst("lo", scalarF(0.f));
    g.addConst("hi", scalarF(6.f));
    g.addConst("w0", randomFloats({24, 24, 1, 1}, rng, -0.4f, 0.4f));
    g.addConst("w1", randomFloats({72, 24, 1, 1}, rng, -0.4f, 0.4f));
    g.addConst("w2", randomFloats({72, 1, 3, 3}, rng, -0.5f, 0.5f));
    g.addConst("w3", randomFloats({24, 72, 1, 1}, rng, -0.3f, 0.3f));
    g.addConst("b1", randomFloats({72}, rng));
    g.addConst("b2", randomFloats({72}, rng));
    g.addConst("b3", randomFloats({24}, rng));
    ir::Attributes dw;
    dw.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    dw.set("group", int64_t{72});
    g.addOp("Conv", "", 13, "c0", {}, {"x0", "w0"}, {"x"}); // so that x is not a graph input
    g.addOp("Conv", "", 13, "c1", {}, {"x", "w1", "b1"}, {"a"});
    g.addOp("Clip", "", 13, "r1", {}, {"a", "lo", "hi"}, {"ar"});
    g.addOp("Conv", "", 13, "c2", dw, {"ar", "w2", "b2"}, {"d"});
    g.addOp("Clip", "", 13, "r2", {}, {"d", "lo", "hi"}, {"dr"});
    g.addOp("Conv", "", 13, "c3", {}, {"dr", "w3", "b3"}, {"p"});
    g.addOp("Add", "", 13, "add", {}, {"p", "x"}, {"y"});
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
  };
  ir::Graph plain, fused;
  build(plain);
  build(fused);
  EXPECT_EQ(ir::fuseConvResidual(fused), 1);
  EXPECT_EQ(ir::fuseConvActivation(fused), 2);
  ASSERT_EQ(fused.ops().size(), 4u);
  backend_cpu::ExecutionPlan plan(fused, {KernelProvider::Any});
  EXPECT_EQ(plan.agreedLayouts(), (std::vector<TensorId>{"x", "ar", "dr"}));
  std::mt19937 rng(59);
  std::map<TensorId, TensorData> feeds{{"x0", randomFloats(xs, rng)}};
  std::vector<float> want = runFeeds(plain, KernelProvider::Reference, feeds);
  for (auto p : {KernelProvider::Reference, KernelProvider::Any})
    expectNear(runFeeds(fused, p, feeds), want, 1e-4f, "inverted residual");
}

TEST(InferenceDropoutAsIdentity, NonTrainingDropoutBecomesAView) {
  // x → Neg → Dropout(ratio 0.1, training_mode false) → Relu → y: the Dropout becomes an
  // Identity (a view in the plan) unless its mask is an output or its mode is not a constant false.
  for (int variant = 0; variant < 3; ++variant) { // 0: rewritten, 1: mask is an output, 2: training
    ir::registerBuiltinOps();
    ir::Graph g;
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {3, 8}));
    g.addInput("x");
    g.addConst("ratio", scalarF(0.1f));
    g.addConst("mode", TensorData::fromDoubles(DataType::BOOL, {}, {variant == 2 ? 1.0 : 0.0}));
    g.addOp("Neg", "", 13, "neg", {}, {"x"}, {"n"});
    g.addOp("Dropout", "", 13, "drop", {}, {"n", "ratio", "mode"}, {"d", "mask"});
    g.addOp("Relu", "", 13, "relu", {}, {"d"}, {"y"});
    g.addOutput("y");
    if (variant == 1) g.addOutput("mask");
    ir::inferShapes(g, nullptr);
    ASSERT_EQ(ir::inferenceDropoutAsIdentity(g), variant == 0 ? 1 : 0) << variant;
    if (variant != 0) continue;
    EXPECT_EQ(countType(g, "Dropout"), 0);
    EXPECT_EQ(countType(g, "Identity"), 1);
    std::mt19937 rng(65);
    TensorData x = randomFloats({3, 8}, rng);
    std::vector<float> got = runGraph(g, KernelProvider::Any, x);
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i], std::max(0.f, -x.as<float>()[i]));
  }
}

TEST(FuseHardSwish, MulByHardSigmoidBecomesHardSwish) {
  // y = x · HardSigmoid(x; 1/6, 1/2) (either order) on a computed x: one HardSwish that matches;
  // other parameters, or a gate that is also an output, stay.
  for (int variant = 0; variant < 4; ++variant) { // 0, 1: fused (gate second, first); 2: alpha 0.2; 3: shared
    ir::registerBuiltinOps();
    auto build = [&](ir::Graph &g) {
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4, 33}));
      g.addInput("x");
      g.addOp("Neg", "", 13, "neg", {}, {"x"}, {"n"});
      ir::Attributes hs;
      hs.set("alpha", variant == 2 ? 0.2f : 1.f / 6.f);
      hs.set("beta", 0.5f);
      g.addOp("HardSigmoid", "", 6, "gate", hs, {"n"}, {"s"});
      g.addOp("Mul", "", 13, "mul", {},
              variant == 1 ? std::vector<TensorId>{"s", "n"} : std::vector<TensorId>{"n", "s"}, {"y"});
      g.addOutput("y");
      if (variant == 3) g.addOutput("s");
      ir::inferShapes(g, nullptr);
    };
    ir::Graph plain, fused;
    build(plain);
    build(fused);
    bool fuses = variant < 2;
    ASSERT_EQ(ir::fuseHardSwish(fused), fuses ? 1 : 0) << variant;
    if (!fuses) continue;
    EXPECT_EQ(countType(fused, "HardSwish"), 1);
    EXPECT_EQ(fused.ops().size(), 2u);
    std::mt19937 rng(67);
    TensorData x = randomFloats({4, 33}, rng, -5, 5);
    std::vector<float> want = runGraph(plain, KernelProvider::Reference, x);
    for (auto p : {KernelProvider::Reference, KernelProvider::Any})
      expectNear(runGraph(fused, p, x), want, 1e-6f, "hard swish");
  }
}

TEST(FuseChannelShuffle, ConcatShuffleAndChunksBecomeOneCopy) {
  // ShuffleNet's block end: Concat(a [2,4,3,5], b [2,8,3,5]) → Reshape [2, g, 12/g, 3, 5] →
  // Transpose(0,2,1,3,4) → Reshape [2,12,3,5] → k equal Slices. Fused, it must give the same
  // outputs; a different permutation, an intermediate that is also an output, or unequal chunks
  // must keep the parts they need.
  struct Case {
    int64_t group, chunks;
    const char *variant; // "", "perm", "output", "unequal"
  };
  for (Case c : {Case{2, 2, ""}, Case{3, 3, ""}, Case{4, 1, ""}, Case{2, 0, ""}, Case{2, 2, "perm"},
                 Case{2, 2, "output"}, Case{2, 2, "unequal"}}) {
    std::string what = "group " + std::to_string(c.group) + ", chunks " + std::to_string(c.chunks) + " " + c.variant;
    std::string variant = c.variant;
    std::vector<TensorId> outs;
    auto build = [&](ir::Graph &g) {
      ir::registerBuiltinOps();
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 4, 3, 5}));
      g.addInput("x");
      g.addOp("Neg", "", 13, "neg", {}, {"x"}, {"a"});
      g.addOp("Relu", "", 13, "relu", {}, {"x"}, {"r"});
      g.addOp("Abs", "", 13, "abs", {}, {"x"}, {"s"});
      ir::Attributes axis1;
      axis1.set("axis", int64_t{1});
      g.addOp("Concat", "", 13, "inner", axis1, {"r", "s"}, {"b"});
      g.addOp("Concat", "", 13, "concat", axis1, {"a", "b"}, {"joined"});
      g.addConst("grouped_shape", TensorData::fromInt64({5}, {2, c.group, 12 / c.group, 3, 5}));
      g.addConst("merged_shape", TensorData::fromInt64({4}, {2, 12, 3, 5}));
      g.addOp("Reshape", "", 13, "split", {}, {"joined", "grouped_shape"}, {"grouped"});
      ir::Attributes perm;
      perm.set("perm", variant == "perm" ? std::vector<int64_t>{0, 2, 1, 4, 3} : std::vector<int64_t>{0, 2, 1, 3, 4});
      g.addOp("Transpose", "", 13, "transpose", perm, {"grouped"}, {"swapped"});
      g.addOp("Reshape", "", 13, "merge", {}, {"swapped", "merged_shape"}, {"shuffled"});
      outs.clear();
      if (c.chunks == 0) {
        outs.push_back("shuffled");
      } else {
        std::vector<int64_t> bounds;
        for (int64_t k = 0; k <= c.chunks; ++k)
          bounds.push_back(k * 12 / c.chunks);
        if (variant == "unequal") bounds = {0, 5, 12};
        for (size_t k = 0; k + 1 < bounds.size(); ++k) {
          std::string id = "chunk" + std::to_string(k);
          g.addConst(id + "_start", TensorData::fromInt64({1}, {bounds[k]}));
          // the exporter's end of the last chunk is often INT64_MAX
          g.addConst(id + "_end", TensorData::fromInt64({1}, {k + 2 == bounds.size() ? INT64_MAX : bounds[k + 1]}));
          g.addConst(id + "_axis", TensorData::fromInt64({1}, {k % 2 ? -3 : 1}));
          g.addOp("Slice", "", 13, id, {}, {"shuffled", id + "_start", id + "_end", id + "_axis"}, {id});
          outs.push_back(id);
        }
      }
      for (const auto &id : outs)
        g.addOutput(id);
      if (variant == "output") g.addOutput("swapped");
      ir::inferShapes(g, nullptr);
    };
    ir::Graph plain, fused;
    build(plain);
    build(fused);
    bool fuses = variant.empty() || variant == "unequal";
    ASSERT_EQ(ir::fuseChannelShuffle(fused), fuses ? 1 : 0) << what;
    if (fuses) {
      EXPECT_EQ(countType(fused, "ChannelShuffle"), 1) << what;
      EXPECT_EQ(countType(fused, "Transpose") + countType(fused, "Reshape"), 0) << what;
      EXPECT_EQ(countType(fused, "Concat"), 1) << what; // the inner one, read by the shuffle
      EXPECT_EQ(countType(fused, "Slice"), variant == "unequal" ? 2 : 0) << what;
    }
    std::mt19937 rng(71);
    TensorData x = randomFloats({2, 4, 3, 5}, rng);
    for (const auto &id : outs) {
      std::vector<float> want = runGraph(plain, KernelProvider::Reference, x, id);
      std::vector<float> got = runGraph(fused, KernelProvider::Any, x, id);
      ASSERT_EQ(got, want) << what << ", output " << id; // a copy: bit-exact
    }
  }
}

TEST(FuseChannelShuffle, BadGroupOrOutputCountIsAnErrorNamingIt) {
  // An ai.graphcore ChannelShuffle (from a model or a pass) whose group or output count does not
  // divide the channels is refused at shape inference, naming the op and the numbers.
  for (int variant = 0; variant < 2; ++variant) {
    ir::registerBuiltinOps();
    ir::Graph g;
    g.opsets()["ai.onnx"] = 13;
    g.opsets()["ai.graphcore"] = 1;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 12, 3, 3}));
    g.addInput("x");
    ir::Attributes a;
    a.set("group", int64_t{variant == 0 ? 5 : 2});
    std::vector<TensorId> outs =
        variant == 0 ? std::vector<TensorId>{"y"} : std::vector<TensorId>{"y0", "y1", "y2", "y3", "y4"};
    g.addOp("ChannelShuffle", "ai.graphcore", 1, "shuffle", a, {"x"}, outs);
    try {
      ir::inferShapes(g, nullptr);
      FAIL() << "variant " << variant << " was accepted";
    } catch (const error &e) {
      std::string m = e.what();
      EXPECT_NE(m.find("shuffle"), std::string::npos) << m;
      EXPECT_NE(m.find(variant == 0 ? "group 5" : "5 outputs"), std::string::npos) << m;
      EXPECT_NE(m.find("12 channels"), std::string::npos) << m;
    }
  }
}
