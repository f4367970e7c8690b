// The histogram method of automatic loss scaling (PopART's automaticLossScalingSettings;
// docs/precision.md, "Loss scaling"): the GradientStatistics kernels against counts made here by
// plain loops, and training sessions whose loss-scale sequence is checked step by step against
// the rule evaluated here from the gradients, which the models make known (loss = x · w, so the
// gradient of w is the loss scale times x).

#include "fast_cases.hpp"
#include "one_op.hpp"

#include "backend_cpu/kernel.hpp"
#include "backend_cpu/plan.hpp"
#include "core/half.hpp"
#include "core/tensordata.hpp"
#include "ir/graph.hpp"
#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <unistd.h>

using namespace popart;
using backend_cpu::KernelProvider;
using Method = AutomaticLossScalingSettings::Method;

POPART_FAST_KERNEL_COMPARED("ai.graphcore", "GradientStatistics");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "AllFinite");

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kHalfMax = 65504.0f;
constexpr float kBfloat16Max = 0x1.fep127f;

// ---------------------------------------------------------------------------------------------
// The kernels

using test_ops::tensorOf;

/// Element \p i of \p t as a float.
float valueAt(const TensorData &t, size_t i) {
  switch (t.info().dataType()) {
  case DataType::FLOAT16: return halfToFloat(t.as<uint16_t>()[i]);
  case DataType::BFLOAT16: return bfloat16ToFloat(t.as<uint16_t>()[i]);
  default: return t.as<float>()[i];
  }
}

/// {below, at or above} \p edge over \p grads, counted one element at a time.
std::array<int64_t, 2> countByHand(const std::vector<TensorData> &grads, float edge) {
  std::array<int64_t, 2> counts{0, 0};
  for (const TensorData &g : grads)
    for (size_t i = 0; i < static_cast<size_t>(g.info().elementCount()); ++i) {
      const float v = valueAt(g, i);
      if (std::isnan(v) || std::isinf(v) || std::fabs(v) >= edge)
        ++counts[1];
      else
        ++counts[0];
    }
  return counts;
}

/// Runs GradientStatistics over \p grads with \p provider's kernel through an execution plan, the
/// counts Variable holding stale values first (the op must overwrite them).
std::array<int64_t, 2> runGradientStatistics(const std::vector<TensorData> &grads, float edge,
                                             KernelProvider provider) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 17;
  const TensorInfo countsInfo(DataType::INT64, {2});
  auto stale = std::make_shared<TensorData>(countsInfo);
  stale->as<int64_t>()[0] = 12345;
  stale->as<int64_t>()[1] = -7;
  g.addTensor("counts", ir::TensorKind::Variable, countsInfo).setData(stale);
  std::vector<TensorId> inputs{"counts"};
  for (size_t k = 0; k < grads.size(); ++k) {
    inputs.push_back("g" + std::to_string(k));
    g.addTensor(inputs.back(), ir::TensorKind::Stream, grads[k].info());
    g.addInput(inputs.back());
  }
  ir::Attributes attrs;
  attrs.set("edge", edge);
  g.addOp("GradientStatistics", "ai.graphcore", 1, "", std::move(attrs), inputs, {"counts_updated"});
  g.addOutput("counts_updated");
  ir::inferShapes(g, nullptr);
  backend_cpu::ExecutionPlan plan(g, {provider});
  EXPECT_EQ(plan.stepProviders().back(), provider) << "the plan chose another provider's kernel";
  for (size_t k = 0; k < grads.size(); ++k)
    std::memcpy(plan.address(inputs[k + 1]), grads[k].data(), static_cast<size_t>(grads[k].byteCount()));
  plan.run();
  const auto *out = static_cast<const int64_t *>(plan.address("counts_updated"));
  return {out[0], out[1]};
}

/// Values around \p edge and the special ones, then \p random values uniform in ±2·edge.
std::vector<float> valuesAround(float edge, size_t random, std::mt19937 &rng) {
  std::vector<float> v{
      0.0f, -0.0f, edge, -edge, std::nextafter(edge, 0.0f), -std::nextafter(edge, 0.0f), std::nextafter(edge, kInf),
      kInf, -kInf, kNaN, 1e-40f};
  std::uniform_real_distribution<float> d(-2.0f * edge, 2.0f * edge);
  for (size_t i = 0; i < random; ++i)
    v.push_back(d(rng));
  return v;
}

TEST(GradientStatistics, CountsMatchPlainLoopsInEveryFloatTypeWithInfAndNaN) {
  std::mt19937 rng(11);
  const std::vector<KernelProvider> providers{KernelProvider::Reference, KernelProvider::Fast};
  // Edges: fp16's (what the fp16 modes use), bfloat16's and fp32's largest halves, and ones that
  // fall between representable 16-bit values (the kernels must not round the edge).
  struct Case {
    DataType type;
    float edge;
  };
  const std::vector<Case> cases{{DataType::FLOAT16, 0.5f * kHalfMax},
                                {DataType::FLOAT16, 3.0001f},
                                {DataType::FLOAT16, 1e-6f}, // among fp16's subnormals
                                {DataType::BFLOAT16, 0.5f * kBfloat16Max},
                                {DataType::BFLOAT16, 2.71828f},
                                {DataType::FLOAT, 0.5f * std::numeric_limits<float>::max()},
                                {DataType::FLOAT, 2.71828f}};
  for (const Case &c : cases)
    for (size_t n : {size_t{0}, size_t{5}, size_t{1000}, size_t{4099}}) {
      std::vector<TensorData> grads{tensorOf(c.type, valuesAround(c.edge, n, rng))};
      const std::array<int64_t, 2> want = countByHand(grads, c.edge);
      ASSERT_GE(want[1], 3); // ±inf and NaN at least
      for (KernelProvider p : providers)
        EXPECT_EQ(runGradientStatistics(grads, c.edge, p), want)
            << toString(c.type) << " edge " << c.edge << " n " << n << " " << backend_cpu::kernelProviderName(p);
    }
  // Several gradients of mixed types: the counts add up over all of them.
  std::vector<TensorData> mixed{tensorOf(DataType::FLOAT, valuesAround(3.5f, 77, rng)),
                                tensorOf(DataType::FLOAT16, valuesAround(3.5f, 300, rng)),
                                tensorOf(DataType::BFLOAT16, valuesAround(3.5f, 9, rng))};
  const std::array<int64_t, 2> want = countByHand(mixed, 3.5f);
  EXPECT_EQ(want[0] + want[1], 77 + 300 + 9 + 3 * 11);
  for (KernelProvider p : providers)
    EXPECT_EQ(runGradientStatistics(mixed, 3.5f, p), want) << backend_cpu::kernelProviderName(p);
}

/// Runs AllFinite over \p inputs with \p provider's kernel through an execution plan.
bool runAllFinite(const std::vector<TensorData> &inputs, KernelProvider provider) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 17;
  std::vector<TensorId> ids;
  for (size_t k = 0; k < inputs.size(); ++k) {
    ids.push_back("g" + std::to_string(k));
    g.addTensor(ids.back(), ir::TensorKind::Stream, inputs[k].info());
    g.addInput(ids.back());
  }
  g.addOp("AllFinite", "ai.graphcore", 1, "", {}, ids, {"finite"});
  g.addOutput("finite");
  ir::inferShapes(g, nullptr);
  backend_cpu::ExecutionPlan plan(g, {provider});
  EXPECT_EQ(plan.stepProviders().back(), provider) << "the plan chose another provider's kernel";
  for (size_t k = 0; k < inputs.size(); ++k)
    std::memcpy(plan.address(ids[k]), inputs[k].data(), static_cast<size_t>(inputs[k].byteCount()));
  plan.run();
  return *static_cast<const bool *>(plan.address("finite"));
}

TEST(AllFinite, FastKernelMatchesTheReferenceAndPlainLoopsInEveryFloatType) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  const std::vector<KernelProvider> providers{KernelProvider::Reference, KernelProvider::Fast};
  for (DataType type : {DataType::FLOAT, DataType::FLOAT16, DataType::BFLOAT16}) {
    // The largest finite values and the smallest subnormals are finite; inf and NaN of either
    // sign are not, wherever they stand (first, last, mid-vector past a vector width).
    const float largest = type == DataType::FLOAT16    ? kHalfMax
                          : type == DataType::BFLOAT16 ? kBfloat16Max
                                                       : std::numeric_limits<float>::max();
    const float tiny = type == DataType::FLOAT16 ? 6e-8f : 1e-44f;
    for (size_t n : {size_t{1}, size_t{17}, size_t{40000}}) {
      std::vector<float> values(n);
      for (float &v : values)
        v = d(rng);
      values[0] = -largest;
      values[n - 1] = n > 1 ? tiny : largest;
      const TensorData finite = tensorOf(type, values);
      for (KernelProvider p : providers)
        EXPECT_TRUE(runAllFinite({finite}, p)) << toString(type) << " n " << n;
      for (float special : {kInf, -kInf, kNaN, -kNaN})
        for (size_t at : {size_t{0}, n / 2 + 1, n - 1}) {
          if (at >= n) continue;
          std::vector<float> bad = values;
          bad[at] = special;
          const TensorData t = tensorOf(type, bad);
          bool byHand = true;
          for (size_t i = 0; i < n; ++i)
            byHand = byHand && std::isfinite(valueAt(t, i));
          ASSERT_FALSE(byHand);
          for (KernelProvider p : providers)
            EXPECT_FALSE(runAllFinite({t}, p)) << toString(type) << " n " << n << " " << special << " at " << at << " "
                                               << backend_cpu::kernelProviderName(p);
          // A finite input first, the bad one second: the check covers every input.
          for (KernelProvider p : providers)
            EXPECT_FALSE(runAllFinite({finite, t}, p)) << backend_cpu::kernelProviderName(p);
        }
    }
  }
}

TEST(GradientStatistics, SetupRefusesBadCountsAndEdgesByName) {
  ir::registerBuiltinOps();
  auto setup = [](const TensorInfo &counts, float edge) {
    ir::Graph g;
    g.addTensor("counts", ir::TensorKind::Variable, counts);
    g.addTensor("g", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {3}));
    ir::Attributes attrs;
    attrs.set("edge", edge);
    ir::Op &op = g.addOp("GradientStatistics", "ai.graphcore", 1, "stats", std::move(attrs), {"counts", "g"}, {"y"});
    op.def->setup(op);
  };
  EXPECT_NO_THROW(setup(TensorInfo(DataType::INT64, {2}), 1.0f));
  auto message = [&](const TensorInfo &counts, float edge) {
    try {
      setup(counts, edge);
    } catch (const error &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(TensorInfo(DataType::FLOAT, {2}), 1.0f).find("the counts must be INT64 [2]"), std::string::npos);
  EXPECT_NE(message(TensorInfo(DataType::INT64, {2}), 0.0f).find("bin edge must be a positive finite value"),
            std::string::npos);
  EXPECT_NE(message(TensorInfo(DataType::INT64, {2}), kInf).find("'stats'"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Training sessions

constexpr int64_t kN = 6;
const std::vector<float> kW0 = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f};

/// loss = sum(x · w) with x [1, 6] and w [6, 1] FLOAT: in fp16.32 the MatMul runs in fp16, and the
/// gradient of w is x times the scaled loss's gradient, the loss scale, rounded to fp16.
std::string matMulModel() {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {1, kN}), "x");
  TensorId w = b->addInitializedInputTensor(kW0, {kN, 1}, "w");
  b->addOutputTensor(ai.reducesum({ai.matmul({x, w})}, std::nullopt, 0));
  return b->getModelProto();
}

std::unique_ptr<TrainingSession> session(const SessionOptions &so, float lr = 1e-3f) {
  SGD opt({{"defaultLearningRate", {lr, false}}});
  auto s = TrainingSession::createFromOnnxModel(matMulModel(), DataFlow(1, {}, AnchorReturnType("ALL")), "", opt, so);
  s->prepareDevice();
  s->weightsFromHost();
  return s;
}

SessionOptions histogramOptions(float initialScale, int updatePeriod = 1, float threshold = 1e-7f,
                                const std::string &precision = "fp16.32", float binEdgeLocation = 0.5f) {
  SessionOptions so;
  so.automaticLossScalingSettings.binEdgeLocation = binEdgeLocation;
  so.precision = precision;
  so.automaticLossScalingSettings.enabled = true;
  so.automaticLossScalingSettings.method = Method::Histogram;
  so.automaticLossScalingSettings.initialScale = initialScale;
  so.automaticLossScalingSettings.updatePeriod = updatePeriod;
  so.automaticLossScalingSettings.thresholdUpperCountProportion = threshold;
  return so;
}

void step(TrainingSession &s, std::vector<float> x) {
  NDArrayWrapper<float> in(x.data(), {1, kN});
  StepIO io({{"x", in}}, {});
  s.run(io);
}

std::vector<float> readW(const TrainingSession &s) {
  std::vector<float> v(kN);
  NDArrayWrapper<float> arr(v.data(), {kN, 1});
  WeightsIO io;
  io.insert("w", arr);
  s.readWeights(io);
  return v;
}

/// Step \p k's data: multiples of 1/64 (exact in fp16) with largest magnitude 1.5, so that the
/// gradient S·x at a power-of-two scale S is exact in fp16 and fp32 alike, and its elements
/// reach the fp16 bin edge 32752 at S = 2^15 (49152) but not at 2^14 (24576).
std::vector<float> data(int k) {
  std::vector<float> x(kN);
  for (int64_t i = 0; i < kN; ++i)
    x[size_t(i)] = std::round(64.0f * static_cast<float>(std::sin(0.9 * double(i + 1) * double(k + 1)))) / 64.0f;
  x[size_t(k) % kN] = (k % 2 == 0) ? 1.5f : -1.5f;
  return x;
}

/// The histogram rule evaluated here: the scale after each step of \p xs from \p scale, with the
/// gradient S·x of the linear model, the edge of the fp16 modes (\p edgeLocation · 65504) and no
/// step skipped (the data keeps S·x finite).
std::vector<float> expectedScales(const std::vector<std::vector<float>> &xs, float scale, int period, double threshold,
                                  double edgeLocation = 0.5) {
  const double edge = edgeLocation * 65504.0;
  std::vector<float> scales;
  int64_t upper = 0, total = 0;
  int inPeriod = 0;
  for (const auto &x : xs) {
    for (float v : x) {
      const double g = double(scale) * double(v);
      EXPECT_LT(std::fabs(g), 65504.0) << "the test's data would overflow fp16";
      upper += std::fabs(g) >= edge ? 1 : 0;
      ++total;
    }
    if (++inPeriod == period) {
      scale = double(upper) / double(total) > threshold ? scale / 2 : scale * 2;
      scale = std::clamp(scale, 0x1p-24f, 0x1p24f);
      upper = total = 0;
      inPeriod = 0;
    }
    scales.push_back(scale);
  }
  return scales;
}

TEST(HistogramLossScaling, ScaleFollowsTheRuleStepByStepInFp16) {
  // From scale 1 the gradients stay below the edge: the scale doubles every step up to 2^15,
  // where the ±1.5 elements cross it (49152 ≥ 32752): it halves, doubles again, and so on.
  auto s = session(histogramOptions(1.0f));
  EXPECT_EQ(s->getLossScale(), 1.0f);
  EXPECT_NE(s->dumpIr().find("GradientStatistics"), std::string::npos);
  std::vector<std::vector<float>> xs;
  for (int k = 0; k < 22; ++k)
    xs.push_back(data(k));
  const std::vector<float> want = expectedScales(xs, 1.0f, 1, 1e-7);
  ASSERT_EQ(want[14], 32768.0f); // the rule reaches the edge within the run...
  ASSERT_EQ(want[15], 16384.0f); // ...and halves there
  std::vector<float> w = readW(*s);
  for (size_t k = 0; k < xs.size(); ++k) {
    step(*s, xs[k]);
    EXPECT_EQ(s->getLossScale(), want[k]) << "after step " << k + 1;
    // The update is not lost at any scale: it is the unscaled gradient x.
    std::vector<float> now = readW(*s);
    for (size_t i = 0; i < kN; ++i)
      EXPECT_NEAR(now[i], w[i] - 1e-3f * xs[k][i], 1e-6) << "step " << k + 1 << " element " << i;
    w = now;
  }
  EXPECT_EQ(s->getSkippedSteps(), 0);
  EXPECT_EQ(s->getStepCount(), 22);
}

TEST(HistogramLossScaling, NonFiniteStepIsSkippedAndHalvesAtOnce) {
  // Period 3: a non-finite step in the middle of a period halves the scale at once and starts a
  // new period, whatever the counts so far.
  auto s = session(histogramOptions(1024.0f, 3));
  step(*s, data(0));
  EXPECT_EQ(s->getLossScale(), 1024.0f);
  const std::vector<float> w = readW(*s);
  std::vector<float> bad = data(1);
  bad[2] = kInf;
  step(*s, bad);
  EXPECT_EQ(s->getSkippedSteps(), 1);
  EXPECT_EQ(s->getStepCount(), 1);
  EXPECT_EQ(s->getLossScale(), 512.0f);
  EXPECT_EQ(readW(*s), w);
  step(*s, data(2));
  step(*s, data(3));
  EXPECT_EQ(s->getLossScale(), 512.0f); // two steps into the new period
  step(*s, data(4));
  EXPECT_EQ(s->getLossScale(), 1024.0f);
}

TEST(HistogramLossScaling, UpdatePeriodChangesTheScaleEveryNStepsFromSummedCounts) {
  // Period 3, threshold 0.1, bin edge 0.25 · 65504 = 16376: one element of 18 at or above the
  // edge in a period (0.056) doubles the scale although that step alone (1 of 6) would halve it;
  // two (0.11) halve it.
  std::vector<float> one(kN, 0.25f), none(kN, 0.25f), two(kN, 0.25f);
  one[1] = 1.5f;
  two[1] = -1.5f;
  two[4] = 1.25f;
  const std::vector<std::vector<float>> xs{none, none, none, one, none, none, none, two, none, one, none, one};
  const std::vector<float> want = expectedScales(xs, 8192.0f, 3, 0.1, 0.25);
  ASSERT_EQ(want[0], 8192.0f);
  ASSERT_EQ(want[2], 16384.0f); // no element reaches the edge at 2^13
  ASSERT_EQ(want[5], 32768.0f); // one does at 2^14 (24576): doubles
  ASSERT_EQ(want[8], 16384.0f); // two at 2^15: halves
  ASSERT_EQ(want[11], 8192.0f); // two, in two steps, at 2^14: halves
  auto s = session(histogramOptions(8192.0f, 3, 0.1f, "fp16.32", 0.25f));
  for (size_t k = 0; k < xs.size(); ++k) {
    step(*s, xs[k]);
    EXPECT_EQ(s->getLossScale(), want[k]) << "after step " << k + 1;
  }
  // Period 1: the step with one element halves the scale.
  auto every = session(histogramOptions(16384.0f, 1, 0.1f, "fp16.32", 0.25f));
  step(*every, one);
  EXPECT_EQ(every->getLossScale(), 8192.0f);
}

TEST(HistogramLossScaling, EdgeIsOfFp16InTheFp16ModesElseOfTheGradientType) {
  // fp32: the edge is half of fp32's largest value, which no gradient here reaches: the scale
  // doubles every step up to the clamp at 2^24 and stays there. In fp16.32 and fp16.16 the same
  // data halves it at 2^15.
  auto s = session(histogramOptions(0x1p22f, 1, 1e-7f, "fp32"));
  step(*s, data(0));
  EXPECT_EQ(s->getLossScale(), 0x1p23f);
  step(*s, data(1));
  EXPECT_EQ(s->getLossScale(), 0x1p24f);
  step(*s, data(2));
  EXPECT_EQ(s->getLossScale(), 0x1p24f);
  auto half = session(histogramOptions(32768.0f));
  step(*half, data(0));
  EXPECT_EQ(half->getLossScale(), 16384.0f);
  // fp16.16: FLOAT16 weights, whose gradients are fp16 themselves.
  auto half16 = session(histogramOptions(32768.0f, 1, 1e-7f, "fp16.16"));
  ASSERT_EQ(half16->getInfo("w").dataType(), DataType::FLOAT16);
  step(*half16, data(0));
  EXPECT_EQ(half16->getLossScale(), 16384.0f);
  step(*half16, data(1));
  EXPECT_EQ(half16->getLossScale(), 32768.0f);
  // bf16: the edge is half of bfloat16's largest value.
  auto bf16 = session(histogramOptions(32768.0f, 1, 1e-7f, "bf16"));
  step(*bf16, data(0));
  EXPECT_EQ(bf16->getLossScale(), 65536.0f);
}

TEST(HistogramLossScaling, GradScalerStaysTheDefaultMethodWithoutStatistics) {
  SessionOptions so;
  so.precision = "fp16.32";
  so.automaticLossScalingSettings.enabled = true;
  so.automaticLossScalingSettings.initialScale = 1024.0f;
  EXPECT_EQ(so.automaticLossScalingSettings.method, Method::GradScaler);
  auto s = session(so);
  EXPECT_EQ(s->dumpIr().find("GradientStatistics"), std::string::npos);
  step(*s, data(0)); // GradScaler keeps the scale for 2000 finite steps; the histogram would double it
  EXPECT_EQ(s->getLossScale(), 1024.0f);
}

TEST(HistogramLossScaling, CheckpointResumeMidPeriodIsBitIdentical) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("popart_als_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string ckpt = (dir / "state.ckpt").string();
  // Period 2 from 2^15: step 1 has elements at or above the edge, step 2 none. The checkpoint
  // after step 1 must carry that step's counts: without them the resumed period would end one step
  // later, with no counts, and double the scale instead of halving it.
  const SessionOptions so = histogramOptions(32768.0f, 2);
  std::vector<float> small(kN, 0.25f);
  auto a = session(so);
  step(*a, data(0));
  a->saveCheckpoint(ckpt);
  std::vector<std::vector<float>> rest{small, data(1), data(2), small, data(3)};
  std::vector<float> scalesA;
  for (const auto &x : rest) {
    step(*a, x);
    scalesA.push_back(a->getLossScale());
  }
  EXPECT_EQ(scalesA[0], 16384.0f);
  auto b = session(so);
  b->loadCheckpoint(ckpt);
  EXPECT_EQ(b->getLossScale(), 32768.0f);
  std::vector<float> scalesB;
  for (const auto &x : rest) {
    step(*b, x);
    scalesB.push_back(b->getLossScale());
  }
  EXPECT_EQ(scalesA, scalesB);
  EXPECT_EQ(readW(*a), readW(*b));
  EXPECT_EQ(a->getStepCount(), b->getStepCount());
  fs::remove_all(dir);
}

TEST(HistogramLossScaling, BadSettingsAreRefusedByName) {
  auto message = [](const SessionOptions &so) {
    try {
      session(so);
    } catch (const error &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto with = [](auto change) {
    SessionOptions so = histogramOptions(1024.0f);
    change(so.automaticLossScalingSettings);
    return so;
  };
  EXPECT_NE(message(with([](auto &s) { s.binEdgeLocation = 0.0f; })).find("binEdgeLocation"), std::string::npos);
  EXPECT_NE(message(with([](auto &s) { s.binEdgeLocation = 1.5f; })).find("must be in (0, 1], got 1.5"),
            std::string::npos);
  EXPECT_NE(message(with([](auto &s) {
              s.thresholdUpperCountProportion = -0.1f;
            })).find("thresholdUpperCountProportion must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(message(with([](auto &s) { s.updatePeriod = 0; })).find("updatePeriod must be at least 1"),
            std::string::npos);
  EXPECT_NE(message(with([](auto &s) { s.initialScale = 1e9f; })).find("initialScale in [2^-24, 2^24]"),
            std::string::npos);
  // GradScaler's own fields do not matter to the histogram method.
  EXPECT_EQ(message(with([](auto &s) { s.growthInterval = 0; })), "no error");
}

} // namespace
