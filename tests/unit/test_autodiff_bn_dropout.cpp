// Training-mode BatchNormalization and Dropout: gradients against finite differences in double,
// the running-variance option against hand-computed values, the counter-based dropout mask, and
// the oneDNN kernels against the reference kernels.

#include "gradcheck.hpp"

#include "autodiff/autodiff.hpp"
#include "backend_cpu/kernel.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

using namespace popart;

namespace {

using gradcheck::Feed;
using gradcheck::randomDoubles;

/// A graph around one op: inputs \p feeds (an empty id is an omitted input), outputs \p outs,
/// loss = Σ w·out0 with uneven weights w (gradcheck::unevenWeights). With \p grads, the
/// gradients of the loss with respect to the floating-point streams are added as outputs.
gradcheck::Problem problem(const std::string &type, int opset, const ir::Attributes &attrs,
                           const std::vector<Feed> &feeds, const std::vector<TensorId> &outs,
                           backend_cpu::KernelProvider provider) {
  gradcheck::Problem p{type, opset, attrs, feeds};
  p.outs = outs;
  p.loss = gradcheck::weightedSumLoss(1);
  p.exposeOutputs = true;
  p.options.provider = provider;
  return p;
}

gradcheck::OpNet net(const std::string &type, int opset, const ir::Attributes &attrs, const std::vector<Feed> &feeds,
                     const std::vector<TensorId> &outs, bool grads, backend_cpu::KernelProvider provider) {
  return gradcheck::OpNet(problem(type, opset, attrs, feeds, outs, provider), grads);
}

ir::Attributes bnAttrs(float eps, int64_t unbiased = 0) {
  ir::Attributes a;
  a.set("epsilon", eps);
  a.set("training_mode", int64_t{1});
  if (unbiased) a.set("popart_unbiased_running_var", unbiased);
  return a;
}

/// Central differences of the loss against the analytic gradient of every stream element.
void checkAgainstFiniteDifferences(const std::string &type, int opset, const ir::Attributes &attrs,
                                   const std::vector<Feed> &feeds, const std::vector<TensorId> &outs, unsigned seed) {
  SCOPED_TRACE(testing::Message() << type << " seed " << seed);
  gradcheck::checkGradient(problem(type, opset, attrs, feeds, outs, backend_cpu::KernelProvider::Reference), seed);
}

std::vector<Feed> bnFeeds(std::mt19937 &rng, const Shape &x, bool statsStreams = false) {
  Shape c{x[1]};
  return {{"x", randomDoubles(rng, x, -2, 2)},
          {"scale", randomDoubles(rng, c, 0.5, 2)},
          {"bias", randomDoubles(rng, c, -1, 1)},
          {"mean", randomDoubles(rng, c, -1, 1), statsStreams},
          {"var", randomDoubles(rng, c, 0.5, 2), statsStreams}};
}

} // namespace

TEST(AutodiffBnDropout, BatchNormTrainingGradient) {
  const std::vector<std::pair<Shape, float>> cases{{{4, 3}, 1e-5f},       {{5, 2}, 0.1f},
                                                   {{3, 2, 5}, 1e-3f},    {{2, 3, 2, 3}, 0.01f},
                                                   {{3, 2, 1, 2}, 1e-5f}, {{2, 2, 2, 1, 2}, 0.5f}};
  unsigned seed = 700;
  for (const auto &[x, eps] : cases) {
    std::mt19937 rng(++seed);
    // Opset 15 form (Y, running mean, running var): only Y enters the loss.
    checkAgainstFiniteDifferences("BatchNormalization", 15, bnAttrs(eps), bnFeeds(rng, x), {"y", "rm", "rv"}, seed);
    if (HasFatalFailure()) return;
    // Opset 9 form with the saved batch statistics, which the gradient op then takes as inputs.
    ir::Attributes old;
    old.set("epsilon", eps);
    checkAgainstFiniteDifferences("BatchNormalization", 9, old, bnFeeds(rng, x), {"y", "rm", "rv", "sm", "sv"}, seed);
    if (HasFatalFailure()) return;
  }
}

TEST(AutodiffBnDropout, BatchNormRunningStatsGetNoGradient) {
  // Running mean and variance fed as streams: they only reach the running outputs, so their
  // gradient is zero (as in PyTorch).
  std::mt19937 rng(750);
  std::vector<Feed> feeds = bnFeeds(rng, {3, 2, 2}, true);
  auto bn = net("BatchNormalization", 15, bnAttrs(1e-5f), feeds, {"y", "rm", "rv"}, true,
                backend_cpu::KernelProvider::Reference);
  bn.run(feeds);
  ASSERT_EQ(bn.gradIds().size(), 5u);
  for (size_t k : {3, 4})
    for (double v : bn.get<double>(bn.gradIds()[k]))
      EXPECT_EQ(v, 0.0) << "gradient of " << feeds[k].id;
}

TEST(AutodiffBnDropout, BatchNormSavedStatisticGradientIsRejectedByName) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 9;
  std::vector<TensorId> ins{"x", "s", "b", "m", "v"};
  for (const auto &id : ins) {
    g.addTensor(id, ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, id == "x" ? Shape{2, 3} : Shape{3}));
    g.addInput(id);
  }
  g.addOp("BatchNormalization", "", 9, "bn1", {}, ins, {"y", "rm", "rv", "sm", "sv"});
  ir::inferShapes(g, nullptr);
  gradcheck::expectGradientError(g, "sm", {"x"}, "bn1");
}

namespace {

/// X [4, 2] with channel 0 = {1, 2, 3, 4} and channel 1 = {0, 0, 2, 2}; running mean 0, running
/// var 1, momentum 0.9. Batch variances by hand: population 1.25 and 1, unbiased (÷3) 5/3 and 4/3.
std::vector<float> runningVarOf(int64_t unbiased, backend_cpu::KernelProvider provider) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 15;
  g.addConst("x", TensorData::fromDoubles(DataType::FLOAT, {4, 2}, {1, 0, 2, 0, 3, 2, 4, 2}));
  g.addConst("s", TensorData::fromDoubles(DataType::FLOAT, {2}, {1, 1}));
  g.addConst("b", TensorData::fromDoubles(DataType::FLOAT, {2}, {0, 0}));
  g.addConst("m", TensorData::fromDoubles(DataType::FLOAT, {2}, {0, 0}));
  g.addConst("v", TensorData::fromDoubles(DataType::FLOAT, {2}, {1, 1}));
  ir::Attributes a = bnAttrs(1e-5f, unbiased);
  a.set("momentum", 0.9f);
  ir::Op &op = g.addOp("BatchNormalization", "", 15, "bn", a, {"x", "s", "b", "m", "v"}, {"y", "rm", "rv"});
  op.def->setup(op);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(op, provider)->provider, provider);
  auto k = backend_cpu::createKernel(op, provider);
  std::vector<const void *> in;
  for (size_t i = 0; i < 5; ++i)
    in.push_back(op.input(i).data()->data());
  std::vector<float> y(8), rm(2), rv(2);
  void *out[] = {y.data(), rm.data(), rv.data()};
  k->run({in.data(), in.size(), out, 3});
  EXPECT_NEAR(rm[0], 0.1 * 2.5, 1e-6);
  EXPECT_NEAR(rm[1], 0.1 * 1.0, 1e-6);
  return rv;
}

} // namespace

TEST(AutodiffBnDropout, UnbiasedRunningVarianceAttribute) {
  for (auto provider : {backend_cpu::KernelProvider::Reference, backend_cpu::KernelProvider::Dnnl}) {
    SCOPED_TRACE(provider == backend_cpu::KernelProvider::Dnnl ? "oneDNN" : "reference");
    std::vector<float> spec = runningVarOf(0, provider), torch = runningVarOf(1, provider);
    EXPECT_NEAR(spec[0], 0.9 + 0.1 * 1.25, 1e-6);
    EXPECT_NEAR(spec[1], 0.9 + 0.1 * 1.0, 1e-6);
    EXPECT_NEAR(torch[0], 0.9 + 0.1 * 5.0 / 3.0, 1e-6);
    EXPECT_NEAR(torch[1], 0.9 + 0.1 * 4.0 / 3.0, 1e-6);
  }
}

TEST(AutodiffBnDropout, UnbiasedRunningVarianceNeedsTwoValues) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 15;
  for (const char *id : {"x", "s", "b", "m", "v"})
    g.addTensor(id, ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, id[0] == 'x' ? Shape{1, 3, 1} : Shape{3}));
  ir::Op &op =
      g.addOp("BatchNormalization", "", 15, "bn9", bnAttrs(1e-5f, 1), {"x", "s", "b", "m", "v"}, {"y", "rm", "rv"});
  op.def->setup(op);
  for (auto provider : {backend_cpu::KernelProvider::Reference, backend_cpu::KernelProvider::Dnnl}) {
    try {
      backend_cpu::createKernel(op, provider);
      FAIL() << "expected an error";
    } catch (const error &e) {
      EXPECT_NE(std::string(e.what()).find("bn9"), std::string::npos) << e.what();
    }
  }
}

// ---- oneDNN against reference ----

namespace {

/// Runs \p op with the oneDNN and the reference kernel on the same random f32 inputs (variances
/// positive) and compares every output.
void compareKernels(const ir::Op &op, unsigned seed, const std::vector<size_t> &positiveInputs) {
  SCOPED_TRACE(testing::Message() << op.type << " " << op.attrs.toString() << " X " << toString(op.inInfo(0).shape())
                                  << " seed " << seed);
  using backend_cpu::KernelProvider;
  backend_cpu::registerBuiltinKernels();
  const backend_cpu::KernelEntry *e = backend_cpu::KernelRegistry::instance().find(op, KernelProvider::Dnnl);
  ASSERT_NE(e, nullptr) << "no oneDNN kernel accepts this case";
  auto dnnlK = backend_cpu::createKernel(op, KernelProvider::Dnnl);
  auto refK = backend_cpu::createKernel(op, KernelProvider::Reference);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<std::vector<float>> in(op.inputCount());
  std::vector<const void *> inPtrs(op.inputCount(), nullptr);
  for (size_t i = 0; i < op.inputCount(); ++i) {
    if (!op.hasInput(i)) continue;
    in[i].resize(static_cast<size_t>(op.inInfo(i).elementCount()));
    bool positive = std::find(positiveInputs.begin(), positiveInputs.end(), i) != positiveInputs.end();
    for (auto &v : in[i])
      v = positive ? std::fabs(dist(rng)) + 0.1f : dist(rng);
    inPtrs[i] = in[i].data();
  }
  std::vector<std::vector<float>> outD(op.outputCount()), outR(op.outputCount());
  std::vector<void *> pd(op.outputCount(), nullptr), pr(op.outputCount(), nullptr);
  for (size_t i = 0; i < op.outputCount(); ++i)
    if (op.hasOutput(i)) {
      outD[i].assign(static_cast<size_t>(op.outInfo(i).elementCount()), 7.f);
      outR[i].assign(outD[i].size(), -7.f);
      pd[i] = outD[i].data();
      pr[i] = outR[i].data();
    }
  dnnlK->run({inPtrs.data(), inPtrs.size(), pd.data(), pd.size()});
  refK->run({inPtrs.data(), inPtrs.size(), pr.data(), pr.size()});
  for (size_t o = 0; o < op.outputCount(); ++o)
    for (size_t i = 0; i < outR[o].size(); ++i)
      ASSERT_NEAR(outD[o][i], outR[o][i], 1e-4f + 1e-3f * std::fabs(outR[o][i])) << "output " << o << " element " << i;
}

ir::Op &addFloatOp(ir::Graph &g, const std::string &type, const std::string &domain, int version,
                   const ir::Attributes &attrs, const std::vector<Shape> &inputs, const std::vector<bool> &outputs) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = version;
  std::vector<TensorId> ins, outs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].empty()) {
      ins.push_back("");
      continue;
    }
    ins.push_back("in" + std::to_string(i));
    g.addTensor(ins.back(), ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, inputs[i]));
  }
  for (size_t i = 0; i < outputs.size(); ++i)
    outs.push_back(outputs[i] ? "out" + std::to_string(i) : "");
  ir::Op &op = g.addOp(type, domain, version, "", attrs, ins, outs);
  op.def->setup(op);
  return op;
}

// oneDNN's kernels take (N, C) only: on plain rank 3-5 oneDNN 2.6 has only generic loops
// (ncsp_bnorm, bnorm_ref), so they decline for our fast kernel, which test_fast_norm.cpp checks
// against the reference (DnnlDeclinesGenericBatchNorm below).
const std::vector<Shape> kShapes{{5, 3}, {32, 8}, {7, 16}, {2, 4}};

} // namespace

TEST(AutodiffBnDropout, DnnlBatchNormTrainingMatchesReference) {
  unsigned seed = 800;
  for (const Shape &x : kShapes)
    for (int64_t unbiased : {0, 1}) {
      Shape c{x[1]};
      ir::Graph g;
      ir::Attributes a = bnAttrs(1e-3f, unbiased);
      a.set("momentum", 0.8f);
      compareKernels(addFloatOp(g, "BatchNormalization", "ai.onnx", 15, a, {x, c, c, c, c}, {true, true, true}), ++seed,
                     {4});
      if (HasFatalFailure()) return;
      // Opset 9: also the saved batch statistics.
      ir::Graph g9;
      ir::Attributes a9;
      a9.set("epsilon", 1e-3f);
      a9.set("popart_unbiased_running_var", unbiased);
      compareKernels(
          addFloatOp(g9, "BatchNormalization", "ai.onnx", 9, a9, {x, c, c, c, c}, {true, true, true, true, true}),
          ++seed, {4});
      if (HasFatalFailure()) return;
    }
}

TEST(AutodiffBnDropout, DnnlBatchNormGradMatchesReference) {
  unsigned seed = 900;
  for (const Shape &x : kShapes)
    for (int variant = 0; variant < 3; ++variant) {
      Shape c{x[1]};
      ir::Graph g;
      ir::Attributes a;
      a.set("epsilon", variant == 1 ? 0.1f : 1e-5f);
      // 0: statistics recomputed; 1: given as inputs; 2: recomputed, only dX wanted.
      std::vector<Shape> ins{x, c, x};
      if (variant == 1) ins.insert(ins.end(), {c, c});
      std::vector<bool> outs{true, variant != 2, variant != 2};
      compareKernels(addFloatOp(g, "BatchNormalizationGrad", "ai.graphcore", 1, a, ins, outs), ++seed, {4});
      if (HasFatalFailure()) return;
    }
}

TEST(AutodiffBnDropout, DnnlDeclinesGenericBatchNorm) {
  for (const Shape &x : std::vector<Shape>{{2, 4, 7}, {3, 2, 4, 5}, {2, 3, 4, 2, 3}, {4, 32, 6, 6}}) {
    ir::Graph g, g2;
    Shape c{x[1]};
    ir::Op &fwd = addFloatOp(g, "BatchNormalization", "ai.onnx", 15, bnAttrs(1e-5f), {x, c, c, c, c}, {true, true, true});
    ir::Op &grad = addFloatOp(g2, "BatchNormalizationGrad", "ai.graphcore", 1, bnAttrs(1e-5f), {x, c, x}, {true, true, true});
    backend_cpu::registerBuiltinKernels();
    EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(fwd, backend_cpu::KernelProvider::Dnnl), nullptr);
    EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(grad, backend_cpu::KernelProvider::Dnnl), nullptr);
  }
}

TEST(AutodiffBnDropout, TrainingGraphRunsOnOneDnn) {
  // A float training graph: the forward and the gradient op run on oneDNN and agree with the
  // reference-only plan.
  using backend_cpu::KernelProvider;
  std::mt19937 rng(950);
  std::vector<Feed> feeds = bnFeeds(rng, {12, 3});
  for (auto &f : feeds) {
    std::vector<double> v = f.data.toDoubleVector();
    f.data = TensorData::fromDoubles(DataType::FLOAT, f.data.info().shape(), v);
  }
  auto dnnl = net("BatchNormalization", 15, bnAttrs(1e-5f), feeds, {"y", "rm", "rv"}, true, KernelProvider::Any);
  auto ref = net("BatchNormalization", 15, bnAttrs(1e-5f), feeds, {"y", "rm", "rv"}, true, KernelProvider::Reference);
  size_t onDnnl = 0;
  for (size_t i = 0; i < dnnl.plan().stepCount(); ++i)
    if (dnnl.plan().stepProviders()[i] == KernelProvider::Dnnl &&
        (dnnl.plan().stepNames()[i].find("BatchNormalization") != std::string::npos))
      ++onDnnl;
  EXPECT_EQ(onDnnl, 2u) << "the forward and the gradient op";
  dnnl.run(feeds);
  ref.run(feeds);
  for (const auto &id : dnnl.gradIds()) {
    std::vector<float> a = dnnl.get<float>(id), b = ref.get<float>(id);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], 1e-4f + 1e-3f * std::fabs(b[i])) << id << "[" << i << "]";
  }
}

// ---- Dropout ----

namespace {

TensorData seedCounter(int64_t seed, int64_t counter) { return TensorData::fromInt64({2}, {seed, counter}); }

TensorData scalarOf(DataType t, double v) { return TensorData::fromDoubles(t, {}, {v}); }

ir::Attributes saltAttr(int64_t salt) {
  ir::Attributes a;
  a.set("popart_salt", salt);
  return a;
}

/// Forward Dropout (opset 13, training) over \p n FLOAT ones with ratio \p p and (seed, counter);
/// returns the mask.
std::vector<bool> maskOf(int64_t n, double p, int64_t seed, int64_t counter, const ir::Attributes &attrs = {}) {
  std::vector<Feed> feeds{{"x", TensorData::fromDoubles(DataType::FLOAT, {n}, std::vector<double>(n, 1.0))},
                          {"ratio", scalarOf(DataType::FLOAT, p), false},
                          {"train", scalarOf(DataType::BOOL, 1), false},
                          {"sc", seedCounter(seed, counter)}};
  auto drop = net("Dropout", 13, attrs, feeds, {"y", "mask"}, false, backend_cpu::KernelProvider::Any);
  drop.run(feeds);
  std::vector<float> y = drop.get<float>("y");
  std::vector<bool> mask;
  const auto *m = static_cast<const bool *>(drop.plan().address("mask"));
  for (int64_t i = 0; i < n; ++i) {
    mask.push_back(m[i]);
    EXPECT_FLOAT_EQ(y[static_cast<size_t>(i)], m[i] ? static_cast<float>(1.0 / (1.0 - p)) : 0.f) << i;
  }
  return mask;
}

size_t differing(const std::vector<bool> &a, const std::vector<bool> &b) {
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    d += a[i] != b[i];
  return d;
}

} // namespace

TEST(AutodiffBnDropout, DropoutMaskIsDeterministicPerSeedAndCounter) {
  const int64_t n = 100000;
  const double p = 0.3;
  std::vector<bool> a = maskOf(n, p, 42, 7, saltAttr(1)), again = maskOf(n, p, 42, 7, saltAttr(1));
  EXPECT_EQ(differing(a, again), 0u) << "same seed, counter and salt";
  // Independent masks with keep probability 0.7 differ in 2·0.7·0.3 = 42% of the elements.
  for (const auto &other :
       {maskOf(n, p, 42, 8, saltAttr(1)), maskOf(n, p, 43, 7, saltAttr(1)), maskOf(n, p, 42, 7, saltAttr(2))})
    EXPECT_NEAR(static_cast<double>(differing(a, other)) / n, 0.42, 0.02);
  // Keep ratio: the standard deviation of the kept fraction is √(0.21/n) ≈ 0.0015.
  size_t kept = 0;
  for (bool k : a)
    kept += k;
  EXPECT_NEAR(static_cast<double>(kept) / n, 1 - p, 0.01);
}

TEST(AutodiffBnDropout, DropoutSaltDefaultsDifferBetweenOps) {
  // No popart_salt: the salt comes from the seed attribute, else from the output name.
  const int64_t n = 4096;
  ir::Attributes s1, s2;
  s1.set("seed", int64_t{1});
  s2.set("seed", int64_t{2});
  EXPECT_EQ(differing(maskOf(n, 0.5, 3, 4, s1), maskOf(n, 0.5, 3, 4, s1)), 0u);
  EXPECT_GT(differing(maskOf(n, 0.5, 3, 4, s1), maskOf(n, 0.5, 3, 4, s2)), n / 4u);

  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  g.addConst("x", TensorData::fromDoubles(DataType::FLOAT, {n}, std::vector<double>(n, 1.0)));
  g.addConst("r", scalarOf(DataType::FLOAT, 0.5));
  g.addConst("t", scalarOf(DataType::BOOL, 1));
  g.addConst("sc", seedCounter(3, 4));
  g.addOp("Dropout", "", 13, "d1", {}, {"x", "r", "t", "sc"}, {"y1", "m1"});
  g.addOp("Dropout", "", 13, "d2", {}, {"x", "r", "t", "sc"}, {"y2", "m2"});
  for (const char *o : {"m1", "m2"})
    g.addOutput(o);
  ir::inferShapes(g, nullptr);
  backend_cpu::ExecutionPlan plan(g, {});
  plan.run();
  const auto *m1 = static_cast<const bool *>(plan.address("m1")), *m2 = static_cast<const bool *>(plan.address("m2"));
  EXPECT_GT(differing(std::vector<bool>(m1, m1 + n), std::vector<bool>(m2, m2 + n)), n / 4u);
}

namespace {

/// Dropout gradient check: the gradient of Σ w·y must be w·mask/(1 − p), with the mask read from
/// the forward's mask output or, without it, from where y is zero (x is never zero here).
void checkDropoutGradient(int opset, const ir::Attributes &attrs, std::vector<Feed> feeds, bool maskOutput, double p,
                          bool training, unsigned seed) {
  SCOPED_TRACE(testing::Message() << "opset " << opset << " " << attrs.toString() << " seed " << seed);
  std::vector<TensorId> outs{"y"};
  if (maskOutput) outs.push_back("mask");
  auto drop = net("Dropout", opset, attrs, feeds, outs, true, backend_cpu::KernelProvider::Any);
  for (int step = 0; step < 2; ++step) { // twice: a generator state carried over would show
    drop.run(feeds);
    std::vector<double> x = feeds[0].data.toDoubleVector(), y = drop.get<double>("y");
    std::vector<double> dx = drop.get<double>(drop.gradIds().at(0));
    std::vector<double> w = gradcheck::unevenWeights(static_cast<int64_t>(x.size()));
    const bool *m = maskOutput ? static_cast<const bool *>(drop.plan().address("mask")) : nullptr;
    size_t dropped = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      bool keep = m ? m[i] : y[i] != 0.0;
      dropped += !keep;
      double scale = training ? 1.0 / (1.0 - p) : 1.0;
      // The kernel scales by 1/(1 − p) in float.
      ASSERT_NEAR(y[i], keep ? x[i] * scale : 0.0, 1e-6 * std::fabs(x[i])) << "y[" << i << "]";
      ASSERT_NEAR(dx[i], keep ? w[i] * scale : 0.0, 1e-6 * w[i]) << "dx[" << i << "]";
    }
    if (training && p > 0) {
      EXPECT_GT(dropped, 0u);
    } else {
      EXPECT_EQ(dropped, 0u);
    }
  }
}

TensorData nonZero(std::mt19937 &rng, const Shape &s) {
  TensorData t = randomDoubles(rng, s, 0.5, 2);
  for (int64_t i = 0; i < t.info().elementCount(); i += 2)
    t.as<double>()[i] = -t.as<double>()[i];
  return t;
}

} // namespace

TEST(AutodiffBnDropout, DropoutGradientReproducesTheMask) {
  for (unsigned seed = 1000; seed < 1003; ++seed) {
    std::mt19937 rng(seed);
    Shape s{4, 5, 6};
    double p = 0.25 + 0.1 * (seed % 3);
    auto feedsWith = [&](TensorData train, bool trainStream, bool withSeed) {
      std::vector<Feed> f{{"x", nonZero(rng, s)},
                          {"ratio", scalarOf(DataType::DOUBLE, p), false},
                          {"train", std::move(train), trainStream}};
      if (withSeed) f.push_back({"sc", seedCounter(seed, 3)});
      return f;
    };
    // Counter-based mask, with and without the mask output; training_mode constant or fed.
    for (bool maskOut : {true, false}) {
      checkDropoutGradient(13, {}, feedsWith(scalarOf(DataType::BOOL, 1), false, true), maskOut, p, true, seed);
      checkDropoutGradient(13, {}, feedsWith(scalarOf(DataType::BOOL, 1), true, true), maskOut, p, true, seed);
      checkDropoutGradient(13, {}, feedsWith(scalarOf(DataType::BOOL, 0), true, true), maskOut, p, false, seed);
    }
    // Seed attribute without input 3: the MT19937 mask, re-drawn identically by the gradient op.
    ir::Attributes seeded;
    seeded.set("seed", static_cast<int64_t>(seed));
    checkDropoutGradient(13, seeded, feedsWith(scalarOf(DataType::BOOL, 1), false, false), false, p, true, seed);
    // No seed at all: the gradient takes the mask output.
    checkDropoutGradient(13, {}, feedsWith(scalarOf(DataType::BOOL, 1), false, false), true, p, true, seed);
    // Opset 10 form: ratio attribute; training because the (seed, counter) input is connected.
    ir::Attributes old;
    old.set("ratio", static_cast<float>(p));
    std::vector<Feed> f10{{"x", nonZero(rng, s)}, {"", {}}, {"", {}}, {"sc", seedCounter(seed, 9)}};
    checkDropoutGradient(10, old, f10, true, static_cast<float>(p), true, seed);
    checkDropoutGradient(10, old, {{"x", nonZero(rng, s)}}, true, p, false, seed);
    // Ratio 0 passes through.
    std::vector<Feed> zero = feedsWith(scalarOf(DataType::BOOL, 1), false, true);
    zero[1].data = scalarOf(DataType::DOUBLE, 0);
    checkDropoutGradient(13, {}, zero, false, 0, true, seed);
    if (HasFatalFailure()) return;
  }
}

TEST(AutodiffBnDropout, DropoutGradientWithoutReproducibleMaskIsRejectedByName) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3}));
  g.addInput("x");
  g.addConst("r", scalarOf(DataType::FLOAT, 0.5));
  g.addConst("t", scalarOf(DataType::BOOL, 1));
  g.addOp("Dropout", "", 13, "drop7", {}, {"x", "r", "t"}, {"y"});
  ir::inferShapes(g, nullptr);
  gradcheck::expectGradientError(g, "y", {"x"}, "drop7");
}
