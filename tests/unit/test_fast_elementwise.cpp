// The fast kernels of the elementwise and optimiser-update families (backend_cpu/fast/
// elementwise.cpp, varupdate.cpp) and SoftmaxGrad's (fast/softmax.cpp) against the reference
// kernels: f32 Erf, the row pass of SoftmaxGrad and the Adam / AdamW step, on the cases that select them
// and their edges (vector remainders, thread chunks, special values, runRange splits).

#include "fast_cases.hpp"
#include "kernel_compare.hpp"
#include "op_runner.hpp"

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

using namespace popart;

using backend_cpu::KernelProvider;
using op_runner::randomTensor;
using op_runner::runOp;

POPART_FAST_KERNEL_COMPARED("ai.onnx", "Erf");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "SoftmaxGrad");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "AdamUpdate");

namespace {

/// A graph holding one op of \p type on stream inputs of \p infos, set up (shapes inferred).
class OneOp {
public:
  OneOp(const std::string &type, const std::string &domain, ir::Attributes attrs, const std::vector<TensorInfo> &infos,
        size_t outputs) {
    ir::registerBuiltinOps();
    backend_cpu::registerBuiltinKernels();
    std::vector<TensorId> ins, outs;
    for (size_t i = 0; i < infos.size(); ++i) {
      ins.push_back("in" + std::to_string(i));
      graph_.addTensor(ins.back(), ir::TensorKind::Stream, infos[i]);
    }
    for (size_t i = 0; i < outputs; ++i)
      outs.push_back("out" + std::to_string(i));
    op_ = &graph_.addOp(type, domain, domain == "ai.onnx" ? 13 : 1, type, std::move(attrs), ins, outs);
    op_->def->setup(*op_);
  }
  const ir::Op &op() const { return *op_; }
  /// The provider of the kernel that \p provider's choice runs; Any if none accepts the op.
  KernelProvider chosen(KernelProvider provider = KernelProvider::Any) const {
    const backend_cpu::KernelEntry *e = backend_cpu::KernelRegistry::instance().find(*op_, provider);
    return e ? e->provider : KernelProvider::Any;
  }

private:
  ir::Graph graph_;
  ir::Op *op_ = nullptr;
};

/// Expects \p got to be NaN where \p want is, equal where \p want is infinite, and within \p
/// tolerance (kernel_compare::relDiff) elsewhere.
void expectCloseWithSameSpecials(const TensorData &got, const TensorData &want, double tolerance,
                                 const std::string &what) {
  ASSERT_EQ(got.info().elementCount(), want.info().elementCount()) << what;
  double worst = 0;
  for (int64_t i = 0; i < want.info().elementCount(); ++i) {
    double g = got.valueAsDouble(i), w = want.valueAsDouble(i);
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(g)) << what << " element " << i << ": " << g << ", want NaN";
    } else if (std::isinf(w)) {
      EXPECT_EQ(g, w) << what << " element " << i;
    } else {
      worst = kernel_compare::worseOf(worst, kernel_compare::relDiff(g, w));
    }
  }
  EXPECT_LE(worst, tolerance) << what;
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Erf

TEST(FastErf, MatchesTheReferenceOverTailsSpecialsAndThreadChunks) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float fmax = std::numeric_limits<float>::max(), fmin = std::numeric_limits<float>::min();
  // Both branches of vecmath::erf (series below |x| = 0.5, A&S 7.1.26 above, 1 beyond 9) and
  // their boundaries, large |x|, zeros, subnormals and non-finite values; then a grid over
  // [-12, 12), cycled to 2 chunks of 16384 and a remainder so that the threads split it.
  std::vector<float> values{0.f,       -0.f,   0.4999999f, 0.5f,  0.50000006f, -0.5f, 8.999999f, 9.f,
                            9.000001f, -9.f,   20.f,       -20.f, 1e4f,        -1e4f, 1e30f,     fmax,
                            -fmax,     inf,    -inf,       nan,   -nan,        fmin,  -fmin,     1e-40f,
                            -1e-40f,   1e-30f, -1e-20f,    1e-6f, 3.f,         -2.5f, 1.f,       -1.f};
  for (double v = -12; v < 12; v += 0.0037)
    values.push_back(static_cast<float>(v));
  const int64_t n = 2 * 16384 + 1001;
  std::vector<double> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = values[i % values.size()];
  TensorData in = TensorData::fromDoubles(DataType::FLOAT, {n}, x);
  auto fast = runOp("Erf", 13, {}, {{"x", in}}, {}, 1, "ai.onnx", KernelProvider::Fast);
  auto ref = runOp("Erf", 13, {}, {{"x", in}}, {}, 1, "ai.onnx", KernelProvider::Reference);
  const float *got = fast[0].as<float>(), *want = ref[0].as<float>();
  double worstAbs = 0, worstRel = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float xi = static_cast<float>(x[static_cast<size_t>(i)]);
    if (std::isnan(xi)) {
      EXPECT_TRUE(std::isnan(got[i]) && std::isnan(want[i])) << "erf(NaN) at " << i;
      continue;
    }
    if (std::fabs(xi) >= 9.f) {
      EXPECT_EQ(got[i], std::copysign(1.f, xi)) << "erf(" << xi << ")";
    }
    if (xi == 0.f) { // ±0 (the fast kernel's erf(-0) is +0, the reference's -0)
      EXPECT_EQ(got[i], 0.f) << "erf(" << xi << ")";
    }
    // vecmath::erf's bounds (the VecMath tests' against libm in double) plus the reference's own
    // rounding: absolute 4e-7 everywhere, relative 1e-6 for normal results (near 0, where a
    // formula for all x would lose digits; a subnormal result has fewer digits than that).
    worstAbs = kernel_compare::worseOf(worstAbs, std::fabs(double(got[i]) - double(want[i])));
    if (std::fabs(want[i]) >= fmin)
      worstRel = kernel_compare::worseOf(worstRel, std::fabs(double(got[i]) - double(want[i])) / std::fabs(want[i]));
  }
  EXPECT_LE(worstAbs, 4.5e-7);
  EXPECT_LE(worstRel, 1e-6);
}

TEST(FastErf, TakesF32OnlyAndIsWhatAnyRunsForIt) {
  OneOp f32("Erf", "ai.onnx", {}, {TensorInfo(DataType::FLOAT, {7, 5})}, 1);
  OneOp f64("Erf", "ai.onnx", {}, {TensorInfo(DataType::DOUBLE, {7, 5})}, 1);
  EXPECT_EQ(f32.chosen(), KernelProvider::Fast);
  EXPECT_EQ(f64.chosen(KernelProvider::Fast), KernelProvider::Any); // declined
  EXPECT_EQ(f64.chosen(), KernelProvider::Reference);
  // An empty tensor runs (no chunks).
  TensorData empty(TensorInfo(DataType::FLOAT, {0, 3}));
  auto y = runOp("Erf", 13, {}, {{"x", empty}}, {}, 1, "ai.onnx", KernelProvider::Fast);
  EXPECT_EQ(y[0].info().elementCount(), 0);
}

// ---------------------------------------------------------------------------------------------
// SoftmaxGrad

// (The row pass against the reference over shapes and axes: test_fast_loss.cpp.)

TEST(FastSoftmaxGrad, NonFiniteValuesSpoilOnlyTheirRows) {
  std::mt19937 rng(72);
  const Shape shape{6, 37};
  TensorData y = randomTensor(DataType::FLOAT, shape, rng, 0.0, 1.0);
  TensorData g = randomTensor(DataType::FLOAT, shape, rng, -1.0, 1.0);
  g.as<float>()[1 * 37 + 5] = std::numeric_limits<float>::quiet_NaN();
  g.as<float>()[3 * 37 + 36] = std::numeric_limits<float>::infinity();
  y.as<float>()[4 * 37 + 0] = std::numeric_limits<float>::infinity();
  ir::Attributes attrs;
  attrs.set("axis", int64_t{-1});
  auto got = runOp("SoftmaxGrad", 13, attrs, {{"y", y}, {"g", g}}, {}, 1, "ai.graphcore", KernelProvider::Fast);
  auto want = runOp("SoftmaxGrad", 13, attrs, {{"y", y}, {"g", g}}, {}, 1, "ai.graphcore", KernelProvider::Reference);
  expectCloseWithSameSpecials(got[0], want[0], 2e-6, "SoftmaxGrad with NaN and inf");
  for (int64_t k = 0; k < 37; ++k) { // a clean row stays finite
    EXPECT_TRUE(std::isfinite(got[0].as<float>()[0 * 37 + k]));
    EXPECT_TRUE(std::isnan(got[0].as<float>()[1 * 37 + k])) << k;
  }
}

TEST(FastSoftmaxGrad, TakesF32OverTheLastAxisOnlyAndOneDnnlDeclinesThat) {
  // f32 over the last axis is the fast row pass (oneDNN declines it); another axis, another type
  // or LogSoftmaxGrad is not.
  const TensorInfo f32(DataType::FLOAT, {2, 3, 4}), f64(DataType::DOUBLE, {2, 3, 4});
  ir::Attributes last, middle;
  last.set("axis", int64_t{2});
  middle.set("axis", int64_t{1});
  OneOp lastAxis("SoftmaxGrad", "ai.graphcore", last, {f32, f32}, 1);
  OneOp middleAxis("SoftmaxGrad", "ai.graphcore", middle, {f32, f32}, 1);
  OneOp doubles("SoftmaxGrad", "ai.graphcore", last, {f64, f64}, 1);
  OneOp logGrad("LogSoftmaxGrad", "ai.graphcore", last, {f32, f32}, 1);
  EXPECT_EQ(lastAxis.chosen(), KernelProvider::Fast);
  EXPECT_EQ(lastAxis.chosen(KernelProvider::Dnnl), KernelProvider::Any);
  EXPECT_EQ(middleAxis.chosen(), KernelProvider::Dnnl);
  EXPECT_EQ(middleAxis.chosen(KernelProvider::Fast), KernelProvider::Any);
  EXPECT_EQ(doubles.chosen(KernelProvider::Fast), KernelProvider::Any);
  EXPECT_EQ(logGrad.chosen(KernelProvider::Fast), KernelProvider::Any);
  const auto choice = backend_cpu::KernelRegistry::instance().choose(lastAxis.op());
  EXPECT_NE(choice.explanation().find("the fast kernel's row pass"), std::string::npos) << choice.explanation();
}

// ---------------------------------------------------------------------------------------------
// Optimiser updates

namespace {

/// An update op (weight, gradient, hyperparameters, gradient scale, state...) over \p n f32
/// elements, and the buffers it updates in place: weight and state, as the plan gives them.
class UpdateRun {
public:
  UpdateRun(const std::string &type, ir::Attributes attrs, int64_t n, size_t states, size_t hyper)
      : one_(type, "ai.graphcore", std::move(attrs), infos(n, states, hyper), 1 + states), n_(n) {
    std::mt19937 rng(static_cast<unsigned>(n + states));
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    buffers_.resize(1 + states, std::vector<float>(static_cast<size_t>(n)));
    for (float &w : buffers_[0])
      w = d(rng);
    for (size_t k = 1; k < buffers_.size(); ++k) // moments start at 0, as torch's do
      std::fill(buffers_[k].begin(), buffers_[k].end(), 0.f);
  }
  const OneOp &one() const { return one_; }
  std::unique_ptr<backend_cpu::Kernel> kernel(KernelProvider provider) const {
    return backend_cpu::createKernel(one_.op(), provider);
  }
  /// One step with gradient \p g and hyperparameters \p hp: run() if \p cuts is empty, else
  /// runRange over the ranges between the cuts, last range first (the plan may run them in any order).
  void step(backend_cpu::Kernel &kernel, const std::vector<float> &g, const std::vector<float> &hp, float gs,
            const std::vector<int64_t> &cuts) {
    std::vector<void *> buffers;
    for (auto &b : buffers_)
      buffers.push_back(b.data());
    op_runner::runUpdateStep(kernel, buffers, g.data(), hp.data(), gs, n_, cuts);
  }
  const std::vector<std::vector<float>> &buffers() const { return buffers_; }

private:
  static std::vector<TensorInfo> infos(int64_t n, size_t states, size_t hyper) {
    std::vector<TensorInfo> v{TensorInfo(DataType::FLOAT, {n}), TensorInfo(DataType::FLOAT, {n}),
                              TensorInfo(DataType::FLOAT, {static_cast<int64_t>(hyper)}),
                              TensorInfo(DataType::FLOAT, Shape{})};
    for (size_t k = 0; k < states; ++k)
      v.emplace_back(DataType::FLOAT, Shape{n});
    return v;
  }
  OneOp one_;
  int64_t n_;
  std::vector<std::vector<float>> buffers_;
};

/// Gradients of \p steps steps over \p n elements, with a few large and tiny ones.
std::vector<std::vector<float>> gradients(int64_t n, int steps) {
  std::mt19937 rng(static_cast<unsigned>(n));
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<std::vector<float>> g(static_cast<size_t>(steps), std::vector<float>(static_cast<size_t>(n)));
  for (auto &gs : g) {
    for (float &x : gs)
      x = d(rng);
    gs[0] = 1e3f;
    gs[static_cast<size_t>(n) / 2] = 1e-7f;
    gs[static_cast<size_t>(n) - 1] = 0.f;
  }
  return g;
}

/// AdamUpdate's hyperparameters at step \p t: [lr, beta1, beta2, eps, weightDecay, 1-beta1^t,
/// 1-beta2^t, maxWeightNorm].
std::vector<float> adamHyper(int t, float wd) {
  const float b1 = 0.9f, b2 = 0.999f;
  return {1e-2f, b1, b2, 1e-8f, wd, 1.f - std::pow(b1, float(t)), 1.f - std::pow(b2, float(t)), 0.f};
}

/// Expects \p got within \p ulps units in the last place of \p want for every element, where a
/// unit is at least that of the tensor's largest magnitude divided by 16: a value near 0 from
/// cancellation (a weight that an update carried across 0, a moment whose gradient changed sign)
/// keeps the absolute error of the values it came from, not one relative to itself.
void expectBitClose(const std::vector<float> &got, const std::vector<float> &want, int ulps, const std::string &what) {
  float scale = 0.f;
  for (float w : want)
    scale = std::max(scale, std::fabs(w));
  const float floorUlp = std::nextafter(scale, INFINITY) - scale;
  for (size_t i = 0; i < want.size(); ++i) {
    const float w = want[i], unit = std::max(std::nextafter(std::fabs(w), INFINITY) - std::fabs(w), floorUlp / 16);
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
    ASSERT_LE(std::fabs(got[i] - w), ulps * unit) << what << " element " << i << ": " << got[i] << " vs " << w;
  }
}

void expectSameBits(const std::vector<std::vector<float>> &a, const std::vector<std::vector<float>> &b,
                    const std::string &what) {
  for (size_t k = 0; k < a.size(); ++k)
    ASSERT_EQ(0, std::memcmp(a[k].data(), b[k].data(), a[k].size() * sizeof(float))) << what << " buffer " << k;
}

} // namespace

TEST(FastAdamUpdate, MatchesTheReferenceOverStepsWithAndWithoutDecoupledDecay) {
  // 203: vector bodies and remainders; 70001: run() splits it into 2^16-element chunks over the
  // threads, with a remainder.
  for (int64_t n : {int64_t{203}, int64_t{70001}})
    for (int decoupled : {1, 0})
      for (float wd : {0.f, 0.05f}) {
        ir::Attributes attrs;
        attrs.set("mode", std::string("adam"));
        attrs.set("decoupled", int64_t{decoupled});
        UpdateRun fast("AdamUpdate", attrs, n, 2, 8), ref("AdamUpdate", attrs, n, 2, 8);
        auto fk = fast.kernel(KernelProvider::Fast), rk = ref.kernel(KernelProvider::Reference);
        EXPECT_EQ(fk->rangeElements(), n); // the plan merges it with the other updates
        const auto g = gradients(n, 6);
        for (int t = 1; t <= 6; ++t) {
          const float gs = t == 3 ? 0.25f : 1.f; // a loss-scaled step
          fast.step(*fk, g[static_cast<size_t>(t - 1)], adamHyper(t, wd), gs, {});
          ref.step(*rk, g[static_cast<size_t>(t - 1)], adamHyper(t, wd), gs, {});
          const std::string what = "n " + std::to_string(n) + " decoupled " + std::to_string(decoupled) + " wd " +
                                   std::to_string(wd) + " step " + std::to_string(t);
          // FMA in the AVX2 / AVX-512 clones rounds once where the reference rounds twice (w·decay,
          // then the step subtracted; the moments' sums): each drifts from the exact value by up
          // to about 2 ulps a step, in its own direction, so 4 ulps per step. A wrong formula or
          // a lost bias correction would be off by orders of magnitude more.
          for (size_t k = 0; k < 3; ++k)
            expectBitClose(fast.buffers()[k], ref.buffers()[k], 4 * t, what + " buffer " + std::to_string(k));
        }
      }
}

TEST(FastAdamUpdate, RangesGiveTheBitsOfAWholeRunWhereverTheyAreCut) {
  // The plan merges updates and splits their elements among threads at any element; each
  // element must come out the same (vecloops: the same bits in the vector body and remainders).
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> splits{
      {203, {1, 2, 3, 5, 7, 13, 17, 31, 33, 64, 100, 201, 202}}, {203, {101}}, {70001, {3, 65535, 65537, 69999}}};
  for (const auto &[n, cuts] : splits)
    for (KernelProvider provider : {KernelProvider::Fast, KernelProvider::Reference}) {
      ir::Attributes attrs;
      attrs.set("decoupled", int64_t{1});
      UpdateRun whole("AdamUpdate", attrs, n, 2, 8), split("AdamUpdate", attrs, n, 2, 8);
      auto wk = whole.kernel(provider), sk = split.kernel(provider);
      const auto g = gradients(n, 3);
      for (int t = 1; t <= 3; ++t) {
        whole.step(*wk, g[static_cast<size_t>(t - 1)], adamHyper(t, 0.05f), 1.f, {});
        split.step(*sk, g[static_cast<size_t>(t - 1)], adamHyper(t, 0.05f), 1.f, cuts);
      }
      expectSameBits(whole.buffers(), split.buffers(),
                     std::string(backend_cpu::kernelProviderName(provider)) + " n " + std::to_string(n));
    }
}

TEST(FastAdamUpdate, TakesModeAdamOnlyAndIsWhatAnyRunsForIt) {
  const int64_t n = 10;
  auto op = [&](const std::string &mode) {
    ir::Attributes attrs;
    attrs.set("mode", mode);
    return std::make_unique<UpdateRun>("AdamUpdate", attrs, n, 2, 8);
  };
  EXPECT_EQ(op("adam")->one().chosen(), KernelProvider::Fast);
  for (const char *mode : {"adamax", "lamb"}) {
    EXPECT_EQ(op(mode)->one().chosen(KernelProvider::Fast), KernelProvider::Any) << mode;
    EXPECT_EQ(op(mode)->one().chosen(), KernelProvider::Reference) << mode;
  }
}

TEST(ReferenceSgdUpdate, RangesGiveTheBitsOfAWholeRunWhereverTheyAreCut) {
  // SGDUpdate has no fast kernel: its reference loop is what GCC vectorises on its own (the
  // `omp simd` it had changed nothing measurable). Its ranges must still split anywhere.
  // hp = [lr, momentum, dampening, weightDecay, velocityScaling, firstStep].
  const int64_t n = 203;
  const std::vector<int64_t> cuts{1, 2, 3, 5, 7, 13, 17, 31, 33, 64, 100, 201, 202};
  for (size_t states : {size_t{0}, size_t{1}})
    for (int64_t nesterov : {int64_t{0}, int64_t{1}}) {
      ir::Attributes attrs;
      attrs.set("nesterov", nesterov);
      UpdateRun whole("SGDUpdate", attrs, n, states, 6), split("SGDUpdate", attrs, n, states, 6);
      auto wk = whole.kernel(KernelProvider::Any), sk = split.kernel(KernelProvider::Any);
      EXPECT_EQ(wk->rangeElements(), n);
      const auto g = gradients(n, 3);
      for (int t = 1; t <= 3; ++t) {
        const std::vector<float> hp{0.01f, 0.9f, 0.1f, 0.01f, 2.f, t == 1 ? 1.f : 0.f};
        whole.step(*wk, g[static_cast<size_t>(t - 1)], hp, 0.5f, {});
        split.step(*sk, g[static_cast<size_t>(t - 1)], hp, 0.5f, cuts);
      }
      expectSameBits(whole.buffers(), split.buffers(),
                     "states " + std::to_string(states) + " nesterov " + std::to_string(nesterov));
      EXPECT_NE(whole.buffers()[0], UpdateRun("SGDUpdate", attrs, n, states, 6).buffers()[0]) << "no update";
    }
}
