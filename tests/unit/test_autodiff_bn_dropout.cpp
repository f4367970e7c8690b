// Training-mode BatchNormalization: gradients against finite differences in double, the
// running-variance option against hand-computed values, and the oneDNN kernels against the
// reference kernels.

#include "autodiff/autodiff.hpp"
#include "backend_cpu/kernel.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

using namespace popart;

namespace {

/// One tensor of a test graph: fed from the host (a stream, which gets a gradient if it is
/// floating point) or a constant.
struct Feed {
  TensorId id;
  TensorData data;
  bool stream = true;
};

/// A graph around one op: inputs \p feeds (an empty id is an omitted input), outputs \p outs,
/// loss = Σ w·out0 with uneven weights \p w. With \p grads, the gradients of the loss with
/// respect to the floating-point streams are added as outputs.
struct Net {
  ir::Graph g;
  std::vector<TensorId> streams, gradIds;
  std::vector<double> w;
  std::unique_ptr<backend_cpu::ExecutionPlan> plan;

  Net(const std::string &type, int opset, const ir::Attributes &attrs, const std::vector<Feed> &feeds,
      const std::vector<TensorId> &outs, bool grads, backend_cpu::KernelProvider provider) {
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = opset;
    std::vector<TensorId> ins;
    std::vector<TensorId> wrt;
    for (const auto &f : feeds) {
      ins.push_back(f.id);
      if (f.id.empty()) continue;
      if (f.stream) {
        g.addTensor(f.id, ir::TensorKind::Stream, f.data.info());
        g.addInput(f.id);
        streams.push_back(f.id);
        if (isFloatingPoint(f.data.info().dataType())) wrt.push_back(f.id);
      } else {
        g.addConst(f.id, f.data);
      }
    }
    g.addOp(type, "", opset, "op", attrs, ins, outs);
    ir::inferShapes(g, nullptr);
    const TensorInfo &y = g.tensor(outs[0]).info();
    w.resize(static_cast<size_t>(y.elementCount()));
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = 1.0 + 0.37 * static_cast<double>(i % 7);
    g.addConst("w", TensorData::fromDoubles(y.dataType(), y.shape(), w));
    g.addOp("Mul", "", opset, "weigh", {}, {outs[0], "w"}, {"wy"});
    ir::Attributes keep;
    keep.set("keepdims", int64_t{0});
    g.addOp("ReduceSum", "", opset, "sum", keep, {"wy"}, {"loss"});
    g.addOutput("loss");
    for (const auto &o : outs)
      if (!o.empty()) g.addOutput(o);
    ir::inferShapes(g, nullptr);
    if (grads) {
      gradIds = autodiff::buildGradients(g, "loss", wrt);
      for (const auto &id : gradIds)
        g.addOutput(id);
      ir::inferShapes(g, nullptr);
    }
    plan = std::make_unique<backend_cpu::ExecutionPlan>(g, backend_cpu::CompileOptions{provider});
  }

  /// Feeds \p feeds (matched to the streams by id) and runs.
  void run(const std::vector<Feed> &feeds) {
    for (const auto &f : feeds)
      if (!f.id.empty() && f.stream)
        std::memcpy(plan->address(f.id), f.data.data(), static_cast<size_t>(f.data.byteCount()));
    plan->run();
  }
  template <typename T> std::vector<T> get(const TensorId &id) const {
    const auto *p = static_cast<const T *>(plan->address(id));
    return std::vector<T>(p, p + plan->info(id).elementCount());
  }
  double loss() const { return get<double>("loss")[0]; }
};

TensorData randomDoubles(std::mt19937 &rng, const Shape &s, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  TensorData t(TensorInfo(DataType::DOUBLE, s));
  for (int64_t i = 0; i < t.info().elementCount(); ++i)
    t.as<double>()[i] = d(rng);
  return t;
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
                                   std::vector<Feed> feeds, const std::vector<TensorId> &outs, unsigned seed) {
  SCOPED_TRACE(testing::Message() << type << " seed " << seed);
  using backend_cpu::KernelProvider;
  Net analytic(type, opset, attrs, feeds, outs, true, KernelProvider::Reference);
  analytic.run(feeds);
  Net plain(type, opset, attrs, feeds, outs, false, KernelProvider::Reference);
  const double h = 1e-6;
  size_t g = 0;
  for (auto &f : feeds) {
    if (f.id.empty() || !f.stream) continue;
    std::vector<double> grad = analytic.get<double>(analytic.gradIds[g++]);
    for (int64_t i = 0; i < f.data.info().elementCount(); ++i) {
      double v = f.data.as<double>()[i];
      f.data.as<double>()[i] = v + h;
      plain.run(feeds);
      double up = plain.loss();
      f.data.as<double>()[i] = v - h;
      plain.run(feeds);
      double down = plain.loss();
      f.data.as<double>()[i] = v;
      double numeric = (up - down) / (2 * h);
      ASSERT_NEAR(grad[static_cast<size_t>(i)], numeric, 1e-5 * (1 + std::fabs(numeric)))
          << "d loss / d " << f.id << "[" << i << "]";
    }
  }
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
  Net net("BatchNormalization", 15, bnAttrs(1e-5f), feeds, {"y", "rm", "rv"}, true,
          backend_cpu::KernelProvider::Reference);
  net.run(feeds);
  ASSERT_EQ(net.gradIds.size(), 5u);
  for (size_t k : {3, 4})
    for (double v : net.get<double>(net.gradIds[k]))
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
  try {
    autodiff::buildGradients(g, "sm", {"x"});
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("bn1"), std::string::npos) << e.what();
  }
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

const std::vector<Shape> kShapes{{5, 3}, {2, 4, 7}, {3, 2, 4, 5}, {2, 3, 4, 2, 3}, {1, 16, 6, 6}, {32, 8}};

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

TEST(AutodiffBnDropout, TrainingGraphRunsOnOneDnn) {
  // A float training graph: the forward and the gradient op run on oneDNN and agree with the
  // reference-only plan.
  using backend_cpu::KernelProvider;
  std::mt19937 rng(950);
  std::vector<Feed> feeds = bnFeeds(rng, {4, 3, 5, 5});
  for (auto &f : feeds) {
    std::vector<double> v = f.data.toDoubleVector();
    f.data = TensorData::fromDoubles(DataType::FLOAT, f.data.info().shape(), v);
  }
  Net dnnl("BatchNormalization", 15, bnAttrs(1e-5f), feeds, {"y", "rm", "rv"}, true, KernelProvider::Any);
  Net ref("BatchNormalization", 15, bnAttrs(1e-5f), feeds, {"y", "rm", "rv"}, true, KernelProvider::Reference);
  size_t onDnnl = 0;
  for (size_t i = 0; i < dnnl.plan->stepCount(); ++i)
    if (dnnl.plan->stepProviders()[i] == KernelProvider::Dnnl &&
        (dnnl.plan->stepNames()[i].find("BatchNormalization") != std::string::npos))
      ++onDnnl;
  EXPECT_EQ(onDnnl, 2u) << "the forward and the gradient op";
  dnnl.run(feeds);
  ref.run(feeds);
  for (const auto &id : dnnl.gradIds) {
    std::vector<float> a = dnnl.get<float>(id), b = ref.get<float>(id);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], 1e-4f + 1e-3f * std::fabs(b[i])) << id << "[" << i << "]";
  }
}
