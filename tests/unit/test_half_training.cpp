// Training of FLOAT16 and BFLOAT16 weights (PopTorch's fp16.16 and a model exported with
// model.half()): the update kernels against the same computation in fp32 rounded to the storage
// type after each step, the fast kernels against the reference, fp32 optimiser state
// (ApplyOptions::stateType) and fp32 second moments beside 16-bit first-order state
// (ApplyOptions::secondMomentType, the fp16.16 session's), 16-bit models trained through a session with every
// optimiser, clipping, dynamic loss scaling, accumulation, checkpoints and weight I/O. tests/parity/half_optim.py
// compares the 16-bit updates with torch.optim.

#include "fast_cases.hpp"
#include "one_op.hpp"
#include "op_runner.hpp"

#include "backend_cpu/kernel.hpp"
#include "backend_cpu/plan.hpp"
#include "core/half.hpp"
#include "core/tensordata.hpp"
#include "ir/graph.hpp"
#include "optimizer/apply.hpp"
#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <unistd.h>

using namespace popart;
using backend_cpu::KernelProvider;

POPART_FAST_KERNEL_COMPARED("ai.graphcore", "SGDUpdate");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "AdamUpdate");

namespace {

// ---------------------------------------------------------------------------------------------
// Storage types

/// The spacing of \p type's values at 1 (2^-10 for fp16, 2^-7 for bfloat16, 2^-23 for float).
double epsilonOf(DataType type) {
  switch (type) {
  case DataType::FLOAT16: return std::ldexp(1.0, -10);
  case DataType::BFLOAT16: return std::ldexp(1.0, -7);
  default: return std::ldexp(1.0, -23);
  }
}

/// \p v rounded to \p type (to nearest even), as a float.
float roundTo(DataType type, float v) {
  switch (type) {
  case DataType::FLOAT16: return halfToFloat(floatToHalf(v));
  case DataType::BFLOAT16: return bfloat16ToFloat(floatToBfloat16(v));
  default: return v;
  }
}

using test_ops::tensorOf;

std::vector<float> floatsOf(const TensorData &t) {
  std::vector<float> v(static_cast<size_t>(t.info().elementCount()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(t.valueAsDouble(static_cast<int64_t>(i)));
  return v;
}

/// Expects \p got within \p ulps of \p type's spacing at each element of \p want (and at least
/// at the scale of the tensor's largest value / 64, for values near 0 after cancellation).
void expectWithinUlps(const std::vector<float> &got, const std::vector<float> &want, DataType type, double ulps,
                      const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float w : want)
    scale = std::max(scale, std::fabs(double(w)));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
    const double unit = epsilonOf(type) * std::max(std::fabs(double(want[i])), scale / 64);
    ASSERT_LE(std::fabs(double(got[i]) - want[i]), ulps * unit)
        << what << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

// ---------------------------------------------------------------------------------------------
// Update kernels on typed buffers

/// One update op's configuration: type, attributes, which state inputs it has, its
/// hyperparameters at step t (1-based) and the initial value of its first state tensor.
struct UpdateCase {
  std::string name;
  std::string type;
  ir::Attributes attrs;
  std::vector<bool> states;
  std::function<std::vector<float>(int)> hyper;
  float firstStateInit = 0.0f;
};

std::vector<float> sgdHyper(float lr, float mom, float damp, float wd, float vs, int t) {
  return {lr, mom, damp, wd, vs, t == 1 ? 1.0f : 0.0f};
}

std::vector<float> adamHyper(float lr, float wd, float maxNorm, bool bias, int t) {
  const float b1 = 0.9f, b2 = 0.999f;
  const float bc1 = bias ? static_cast<float>(1.0 - std::pow(double(b1), t)) : 1.0f;
  const float bc2 = bias ? static_cast<float>(1.0 - std::pow(double(b2), t)) : 1.0f;
  return {lr, b1, b2, 1e-6f, wd, bc1, bc2, maxNorm};
}

ir::Attributes attrsOf(std::initializer_list<std::pair<const char *, std::string>> strings,
                       std::initializer_list<std::pair<const char *, int64_t>> ints) {
  ir::Attributes a;
  for (const auto &[k, v] : strings)
    a.set(k, v);
  for (const auto &[k, v] : ints)
    a.set(k, v);
  return a;
}

std::vector<UpdateCase> updateCases() {
  std::vector<UpdateCase> c;
  c.push_back({"sgd", "SGDUpdate", {}, {}, [](int t) { return sgdHyper(0.1f, 0, 0, 0.01f, 1, t); }});
  c.push_back({"sgd momentum dampening wd", "SGDUpdate", {}, {true}, [](int t) {
                 return sgdHyper(0.1f, 0.9f, 0.2f, 0.01f, 1, t);
               }});
  c.push_back({"sgd nesterov velocity scaling", "SGDUpdate", attrsOf({}, {{"nesterov", 1}}), {true}, [](int t) {
                 return sgdHyper(0.05f, 0.8f, 0, 0, 4, t);
               }});
  c.push_back({"adam l2", "AdamUpdate", attrsOf({{"mode", "adam"}}, {{"decoupled", 0}}), {true, true}, [](int t) {
                 return adamHyper(0.01f, 0.01f, 0, true, t);
               }});
  c.push_back({"adamw", "AdamUpdate", attrsOf({{"mode", "adam"}}, {{"decoupled", 1}}), {true, true}, [](int t) {
                 return adamHyper(0.01f, 0.05f, 0, true, t);
               }});
  c.push_back({"adamax", "AdamUpdate", attrsOf({{"mode", "adamax"}}, {{"decoupled", 0}}), {true, true}, [](int t) {
                 auto hp = adamHyper(0.01f, 0.01f, 0, true, t);
                 hp[6] = 1.0f;
                 return hp;
               }});
  c.push_back({"lamb", "AdamUpdate", attrsOf({{"mode", "lamb"}}, {{"decoupled", 1}}), {true, true}, [](int t) {
                 return adamHyper(0.01f, 0.01f, 0, true, t);
               }});
  c.push_back({"lamb nobias max weight norm",
               "AdamUpdate",
               attrsOf({{"mode", "lamb"}}, {{"decoupled", 1}}),
               {true, true},
               [](int t) { return adamHyper(0.01f, 0.01f, 0.5f, false, t); }});
  c.push_back({"rmsprop", "AdaptiveUpdate", attrsOf({{"mode", "rmsprop"}}, {}), {true}, [](int) {
                 return std::vector<float>{0.01f, 0.99f, 0, 1e-4f, 0.01f, 0};
               }});
  c.push_back({"rmsprop momentum", "AdaptiveUpdate", attrsOf({{"mode", "rmsprop"}}, {}), {true, false, true}, [](int) {
                 return std::vector<float>{0.01f, 0.9f, 0.5f, 1e-4f, 0, 0};
               }});
  c.push_back({"centered rmsprop momentum",
               "AdaptiveUpdate",
               attrsOf({{"mode", "centeredrmsprop"}}, {}),
               {true, true, true},
               [](int) { return std::vector<float>{0.01f, 0.9f, 0.5f, 1e-2f, 0, 0}; }});
  c.push_back({"adagrad",
               "AdaptiveUpdate",
               attrsOf({{"mode", "adagrad"}}, {}),
               {true},
               [](int t) { return std::vector<float>{0.1f / (1.0f + 0.01f * float(t - 1)), 0, 0, 1e-6f, 0.01f, 0}; },
               0.1f});
  return c;
}

/// Whether state tensor \p k of an update op of \p type is second-order (PopART's accl2): Adam's v
/// (AdaMax's u), RMSprop's square and gradient averages, AdaGrad's sum.
bool secondOrder(const std::string &type, size_t k) {
  return (type == "AdamUpdate" && k == 1) || (type == "AdaptiveUpdate" && k <= 1);
}

/// The state types tested with weights of type \p w: {first-order, second-order}.
std::vector<std::pair<DataType, DataType>> stateTypes(DataType w) {
  if (w == DataType::FLOAT) return {{w, w}};
  return {{w, w}, {w, DataType::FLOAT}, {DataType::FLOAT, DataType::FLOAT}};
}

/// The gradient types tested with weights of type \p w: its own and FLOAT, and for FLOAT (master)
/// weights also the 16-bit types (fp16.32's and bf16's gradients).
std::vector<DataType> gradientTypes(DataType w) {
  if (w == DataType::FLOAT) return {w, DataType::FLOAT16, DataType::BFLOAT16};
  return {w, DataType::FLOAT};
}

/// One update op on typed buffers: weight of type \p w, gradient \p g, first-order state \p s and
/// second-order state \p s2 (UNDEFINED: \p s).
class TypedUpdate {
public:
  TypedUpdate(const UpdateCase &c, DataType w, DataType g, DataType s, int64_t n, DataType s2 = DataType::UNDEFINED)
      : n_(n) {
    if (s2 == DataType::UNDEFINED) s2 = s;
    ir::registerBuiltinOps();
    backend_cpu::registerBuiltinKernels();
    const size_t hyper = c.type == "AdamUpdate" ? 8 : 6;
    std::vector<TensorInfo> infos{TensorInfo(w, {n}), TensorInfo(g, {n}),
                                  TensorInfo(DataType::FLOAT, {static_cast<int64_t>(hyper)}),
                                  TensorInfo(DataType::FLOAT, Shape{})};
    std::vector<TensorId> ins, outs{"w_out"};
    for (size_t i = 0; i < infos.size(); ++i) {
      ins.push_back("in" + std::to_string(i));
      graph_.addTensor(ins.back(), ir::TensorKind::Stream, infos[i]);
    }
    std::mt19937 rng(static_cast<unsigned>(n));
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    std::vector<float> w0(static_cast<size_t>(n));
    for (float &x : w0)
      x = d(rng);
    buffers_.push_back(tensorOf(w, w0));
    for (size_t k = 0; k < c.states.size(); ++k) {
      if (!c.states[k]) {
        ins.emplace_back();
        outs.emplace_back();
        buffers_.emplace_back();
        continue;
      }
      const DataType type = secondOrder(c.type, k) ? s2 : s;
      ins.push_back("state" + std::to_string(k));
      graph_.addTensor(ins.back(), ir::TensorKind::Stream, TensorInfo(type, {n}));
      outs.push_back("state_out" + std::to_string(k));
      std::vector<float> init(static_cast<size_t>(n), k == 0 ? c.firstStateInit : 0.0f);
      buffers_.push_back(tensorOf(type, init));
    }
    op_ = &graph_.addOp(c.type, "ai.graphcore", 1, c.type, c.attrs, ins, outs);
    op_->def->setup(*op_);
    gradType_ = g;
  }
  const ir::Op &op() const { return *op_; }
  std::unique_ptr<backend_cpu::Kernel> kernel(KernelProvider provider) const {
    return backend_cpu::createKernel(*op_, provider);
  }
  /// One step with gradient \p grad (rounded to the gradient's type), hyperparameters \p hp and
  /// gradient scale \p gs: run(), or runRange over the ranges between \p cuts, last first.
  void step(backend_cpu::Kernel &kernel, const std::vector<float> &grad, const std::vector<float> &hp, float gs,
            const std::vector<int64_t> &cuts = {}) {
    TensorData g = tensorOf(gradType_, grad);
    std::vector<void *> buffers;
    for (auto &b : buffers_)
      buffers.push_back(b.data());
    op_runner::runUpdateStep(kernel, buffers, g.data(), hp.data(), gs, n_, cuts);
  }
  /// Buffer \p k (0: the weight, then the state) as floats; empty if absent.
  std::vector<float> values(size_t k) const {
    return buffers_[k].data() ? floatsOf(buffers_[k]) : std::vector<float>{};
  }
  /// Sets buffer \p k to \p v rounded to its type.
  void set(size_t k, const std::vector<float> &v) { buffers_[k] = tensorOf(buffers_[k].info().dataType(), v); }
  size_t bufferCount() const { return buffers_.size(); }
  DataType type(size_t k) const { return buffers_[k].info().dataType(); }

private:
  ir::Graph graph_;
  ir::Op *op_ = nullptr;
  int64_t n_;
  DataType gradType_ = DataType::FLOAT;
  std::vector<TensorData> buffers_;
};

/// Gradients of \p steps steps over \p n elements in [-1, 1], with a few large and tiny ones.
std::vector<std::vector<float>> gradients(int64_t n, int steps) {
  std::mt19937 rng(static_cast<unsigned>(n) * 7u);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<std::vector<float>> g(static_cast<size_t>(steps), std::vector<float>(static_cast<size_t>(n)));
  for (auto &gs : g) {
    for (float &x : gs)
      x = d(rng);
    gs[0] = 30.f;
    gs[static_cast<size_t>(n) / 2] = 1e-3f;
    gs[static_cast<size_t>(n) - 1] = 0.f;
  }
  return g;
}

/// Runs \p c for 4 steps on weights of type \p w (gradient \p g, first-order state \p s,
/// second-order state \p s2) and on an fp32 copy of the same op, whose weight and state are
/// rounded to the storage types after each step and whose gradients are the 16-bit ones; expects
/// the two within \p ulps of the storage type.
void compareWithRoundedFloat(const UpdateCase &c, DataType w, DataType g, DataType s, DataType s2,
                             KernelProvider provider, int64_t n, double ulps) {
  TypedUpdate typed(c, w, g, s, n, s2), shadow(c, DataType::FLOAT, DataType::FLOAT, DataType::FLOAT, n);
  for (size_t k = 0; k < typed.bufferCount(); ++k)
    if (!typed.values(k).empty()) shadow.set(k, typed.values(k));
  auto tk = typed.kernel(provider), sk = shadow.kernel(KernelProvider::Reference);
  const auto grads = gradients(n, 4);
  for (int t = 1; t <= 4; ++t) {
    std::vector<float> grad = grads[static_cast<size_t>(t - 1)];
    for (float &x : grad)
      x = roundTo(g, x);
    const float gs = t == 3 ? 0.25f : 1.0f;
    typed.step(*tk, grad, c.hyper(t), gs);
    shadow.step(*sk, grad, c.hyper(t), gs);
    for (size_t k = 0; k < typed.bufferCount(); ++k) {
      std::vector<float> v = shadow.values(k);
      if (v.empty()) continue;
      for (float &x : v)
        x = roundTo(typed.type(k), x);
      shadow.set(k, v);
      expectWithinUlps(typed.values(k), v, typed.type(k), ulps,
                       c.name + " " + toString(w) + " state " + toString(s) + "/" + toString(s2) + " step " +
                           std::to_string(t) + " buffer " + std::to_string(k));
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_NE(typed.values(0), TypedUpdate(c, w, g, s, n, s2).values(0)) << c.name << ": no update";
}

/// acc += g by the reference Accumulate kernel on one-element tensors; returns acc.
float accumulate(TensorData acc, const TensorData &g) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  ir::Graph graph;
  graph.addTensor("acc", ir::TensorKind::Variable, acc.info()).setData(std::make_shared<TensorData>(acc));
  graph.addTensor("g", ir::TensorKind::Stream, g.info());
  ir::Op &op = graph.addOp("Accumulate", "ai.graphcore", 1, "", {}, {"acc", "g"}, {"acc_sum"});
  op.def->setup(op);
  auto kernel = backend_cpu::createKernel(op, KernelProvider::Reference);
  const void *in[] = {acc.data(), g.data()};
  void *out[] = {acc.data()};
  kernel->run(backend_cpu::KernelArgs{in, 2, out, 1});
  return static_cast<float>(acc.valueAsDouble(0));
}

} // namespace

TEST(HalfUpdateKernels, EachOptimiserMatchesFp32RoundedToTheStorageTypeAfterEachStep) {
  // The reference kernels compute in fp32 and round each stored value once, so they give the
  // fp32 step rounded: the same bits.
  for (const UpdateCase &c : updateCases())
    for (DataType w : {DataType::FLOAT16, DataType::BFLOAT16})
      for (const auto &[s, s2] : stateTypes(w)) {
        compareWithRoundedFloat(c, w, w, s, s2, KernelProvider::Reference, 203, 0.0);
        if (::testing::Test::HasFatalFailure()) return;
      }
}

TEST(HalfUpdateKernels, FloatGradientsOfAccumulatedMicroBatchesUpdate16BitWeights) {
  // With fp32 state the gradient accumulator is fp32 too, and the update reads it.
  // fp16.16 with accumulation: a FLOAT accumulator, 16-bit first-order and FLOAT second-order state.
  for (const UpdateCase &c : updateCases())
    for (DataType w : {DataType::FLOAT16, DataType::BFLOAT16})
      for (DataType s : {w, DataType::FLOAT}) {
        compareWithRoundedFloat(c, w, DataType::FLOAT, s, DataType::FLOAT, KernelProvider::Reference, 64, 1.0);
        if (::testing::Test::HasFatalFailure()) return;
      }
}

TEST(HalfUpdateKernels, FloatMasterWeightsTake16BitGradientsAsTheFp32UpdateOfTheWidenedGradient) {
  // fp16.32 and bf16: the update reads the 16-bit gradient of an fp32 master weight with fp32
  // state. Widening is exact, so every optimiser gives the fp32 reference kernel's bits for the
  // same gradient values given as FLOAT; the fast kernels (SGD, Adam) the fast FLOAT kernel's.
  for (const UpdateCase &c : updateCases())
    for (DataType g : {DataType::FLOAT16, DataType::BFLOAT16}) {
      compareWithRoundedFloat(c, DataType::FLOAT, g, DataType::FLOAT, DataType::FLOAT, KernelProvider::Reference, 203,
                              0.0);
      if (::testing::Test::HasFatalFailure()) return;
      if (c.type == "AdaptiveUpdate" || (c.type == "AdamUpdate" && c.attrs.getString("mode", "adam") != "adam"))
        continue;
      for (int64_t n : {int64_t{1500}, int64_t{70001}}) {
        TypedUpdate low(c, DataType::FLOAT, g, DataType::FLOAT, n),
            wide(c, DataType::FLOAT, DataType::FLOAT, DataType::FLOAT, n);
        auto lk = low.kernel(KernelProvider::Fast), wk = wide.kernel(KernelProvider::Fast);
        const auto grads = gradients(n, 3);
        for (int t = 1; t <= 3; ++t) {
          std::vector<float> grad = grads[static_cast<size_t>(t - 1)];
          for (float &x : grad)
            x = roundTo(g, x);
          low.step(*lk, grad, c.hyper(t), 0.5f);
          wide.step(*wk, grad, c.hyper(t), 0.5f);
        }
        for (size_t k = 0; k < low.bufferCount(); ++k)
          EXPECT_EQ(low.values(k), wide.values(k))
              << c.name << " grad " << toString(g) << " n " << n << " buffer " << k;
      }
    }
}

TEST(HalfUpdateKernels, FastSgdAndAdamMatchTheReference) {
  // Fast SGD is built without FMA contraction and widens/rounds exactly, so it computes the
  // reference's bits for every type. Fast Adam's FMA rounds once where the reference rounds
  // twice: rounded to a 16-bit type the two may land on neighbours, and carry that into the next
  // step, so one unit of the storage type per step (FLOAT: test_fast_elementwise.cpp's bound).
  // Sizes: vector remainders; several widening blocks; thread chunks of 2^16.
  for (const UpdateCase &c : updateCases()) {
    if (c.type == "AdaptiveUpdate" || (c.type == "AdamUpdate" && c.attrs.getString("mode", "adam") != "adam")) continue;
    for (DataType w : {DataType::FLOAT, DataType::FLOAT16, DataType::BFLOAT16})
      for (const auto &[s, s2] : stateTypes(w))
        for (DataType g : gradientTypes(w))
          for (int64_t n : {int64_t{203}, int64_t{1500}, int64_t{70001}}) {
            // threads: fp16.16's combinations and fp16.32's and bf16's master weights
            if (n == 70001 && (s != w || g != w) && w != DataType::FLOAT) continue;
            TypedUpdate fast(c, w, g, s, n, s2), ref(c, w, g, s, n, s2);
            EXPECT_EQ(fast.op().type, c.type);
            auto fk = fast.kernel(KernelProvider::Fast), rk = ref.kernel(KernelProvider::Reference);
            const auto grads = gradients(n, 4);
            for (int t = 1; t <= 4; ++t) {
              const float gs = t == 2 ? 0.5f : 1.0f;
              fast.step(*fk, grads[static_cast<size_t>(t - 1)], c.hyper(t), gs);
              ref.step(*rk, grads[static_cast<size_t>(t - 1)], c.hyper(t), gs);
              for (size_t k = 0; k < fast.bufferCount(); ++k) {
                const std::string what = c.name + " " + toString(w) + " grad " + toString(g) + " state " + toString(s) +
                                         "/" + toString(s2) + " n " + std::to_string(n) + " step " + std::to_string(t) +
                                         " buffer " + std::to_string(k);
                if (c.type == "SGDUpdate")
                  ASSERT_EQ(fast.values(k), ref.values(k)) << what;
                else if (fast.type(k) != DataType::FLOAT) // a rounding to the other neighbour a step
                  expectWithinUlps(fast.values(k), ref.values(k), fast.type(k), 1.0 * t, what);
                else
                  expectWithinUlps(fast.values(k), ref.values(k), DataType::FLOAT, 4.0 * t, what);
              }
              if (::testing::Test::HasFatalFailure()) return;
            }
          }
  }
}

TEST(HalfUpdateKernels, FastRangesGiveTheBitsOfAWholeRunWhereverTheyAreCut) {
  const std::vector<int64_t> cuts{1, 2, 3, 17, 31, 100, 511, 512, 513, 1024, 1400, 1499};
  for (const UpdateCase &c : updateCases()) {
    if (c.name != "sgd" && c.name != "sgd momentum dampening wd" && c.name != "adamw") continue;
    for (DataType w : {DataType::FLOAT, DataType::FLOAT16, DataType::BFLOAT16})
      for (const auto &[s, s2] : stateTypes(w)) {
        TypedUpdate whole(c, w, w, s, 1500, s2), split(c, w, w, s, 1500, s2);
        auto wk = whole.kernel(KernelProvider::Fast), sk = split.kernel(KernelProvider::Fast);
        const auto grads = gradients(1500, 3);
        for (int t = 1; t <= 3; ++t) {
          whole.step(*wk, grads[static_cast<size_t>(t - 1)], c.hyper(t), 1.0f);
          split.step(*sk, grads[static_cast<size_t>(t - 1)], c.hyper(t), 1.0f, cuts);
        }
        for (size_t k = 0; k < whole.bufferCount(); ++k)
          EXPECT_EQ(whole.values(k), split.values(k))
              << c.name << " " << toString(w) << " state " << toString(s) << "/" << toString(s2) << " buffer " << k;
      }
  }
}

TEST(HalfUpdateKernels, FastKernelsAreChosenFor16BitWeightsAndFloatStateAndNotForOtherTypes) {
  const UpdateCase sgd = updateCases()[1], adamw = updateCases()[4];
  ASSERT_EQ(adamw.name, "adamw");
  for (DataType w : {DataType::FLOAT, DataType::FLOAT16, DataType::BFLOAT16})
    for (const auto &[s, s2] : stateTypes(w))
      for (const UpdateCase *c : {&sgd, &adamw}) {
        TypedUpdate u(*c, w, w, s, 10, s2);
        const backend_cpu::KernelEntry *e = backend_cpu::KernelRegistry::instance().find(u.op(), KernelProvider::Any);
        ASSERT_NE(e, nullptr);
        EXPECT_EQ(e->provider, KernelProvider::Fast)
            << c->name << " " << toString(w) << " state " << toString(s) << "/" << toString(s2);
      }
  // fp16.32's and bf16's master weights: FLOAT weight and state, 16-bit gradient.
  for (DataType g : {DataType::FLOAT16, DataType::BFLOAT16})
    for (const UpdateCase *c : {&sgd, &adamw}) {
      TypedUpdate u(*c, DataType::FLOAT, g, DataType::FLOAT, 10);
      const backend_cpu::KernelEntry *e = backend_cpu::KernelRegistry::instance().find(u.op(), KernelProvider::Any);
      ASSERT_NE(e, nullptr) << c->name << " grad " << toString(g);
      EXPECT_EQ(e->provider, KernelProvider::Fast) << c->name << " grad " << toString(g);
    }
}

TEST(HalfUpdateKernels, AFloatFirstMomentBesideA16BitSecondMomentHasNoKernel) {
  // The kernels take the second-order state FLOAT or of the first-order state's type
  // (UpdateTypes<W, G, S, S2>); the reverse has no use and no instantiation.
  const DataType h = DataType::FLOAT16, f = DataType::FLOAT;
  const UpdateCase adamw = updateCases()[4], centered = updateCases()[10];
  ASSERT_EQ(centered.name, "centered rmsprop momentum");
  TypedUpdate rms(centered, h, h, h, 4, f);
  EXPECT_EQ(rms.type(1), f); // square average
  EXPECT_EQ(rms.type(2), f); // gradient average
  EXPECT_EQ(rms.type(3), h); // momentum buffer
  const auto &registry = backend_cpu::KernelRegistry::instance();
  EXPECT_NE(registry.find(rms.op(), KernelProvider::Reference), nullptr);
  EXPECT_NE(registry.find(TypedUpdate(adamw, h, h, h, 4, f).op(), KernelProvider::Reference), nullptr);
  TypedUpdate reversed(adamw, h, h, f, 4, h);
  EXPECT_EQ(registry.find(reversed.op(), KernelProvider::Any), nullptr);
  EXPECT_THROW(reversed.kernel(KernelProvider::Reference), error);
}

TEST(HalfUpdateKernels, Fp16SecondMomentsUnderflowAndBlowAdamUpWhereFloatOnesTrain) {
  // Adam with PyTorch's defaults (lr 1e-3, eps 1e-8) on fp16 weights whose gradients are about
  // 1e-4 for 5 steps and then 0 (an input feature absent from the next batches, a ReLU gone
  // quiet): (1 - β2)·g² ≈ 1e-11 is below fp16's smallest subnormal (6e-8), so an fp16 v stays 0.
  // The step computes the new v in fp32 before rounding it, so while g ≠ 0 the update is still
  // sane; once g = 0 the update is lr·m̂/ε with m ≈ 0.4·g: about 10 per step, and the weights blow
  // up. A FLOAT v keeps Adam's steps at most lr each (m̂/√v̂ <= 1 here).
  const int64_t n = 64;
  const float lr = 1e-3f;
  UpdateCase adam{"adam", "AdamUpdate", attrsOf({{"mode", "adam"}}, {{"decoupled", 0}}), {true, true}, [&](int t) {
                    auto hp = adamHyper(lr, 0, 0, true, t);
                    hp[3] = 1e-8f;
                    return hp;
                  }};
  std::vector<float> grad(static_cast<size_t>(n));
  for (size_t i = 0; i < grad.size(); ++i)
    grad[i] = roundTo(DataType::FLOAT16, (i % 2 == 0 ? 1.0f : -1.0f) * (5e-5f + 2e-4f * float(i) / float(n)));
  const std::vector<float> zero(grad.size(), 0.0f);
  for (KernelProvider provider : {KernelProvider::Reference, KernelProvider::Fast})
    for (DataType s2 : {DataType::FLOAT16, DataType::FLOAT}) {
      TypedUpdate u(adam, DataType::FLOAT16, DataType::FLOAT16, DataType::FLOAT16, n, s2);
      const std::vector<float> w0 = u.values(0);
      auto k = u.kernel(provider);
      const int steps = 10;
      for (int t = 1; t <= steps; ++t)
        u.step(*k, t <= 5 ? grad : zero, adam.hyper(t), 1.0f);
      const std::vector<float> w = u.values(0), v = u.values(2);
      const std::string what =
          std::string(provider == KernelProvider::Fast ? "fast" : "reference") + " second moment " + toString(s2);
      if (s2 == DataType::FLOAT16) {
        EXPECT_EQ(v, std::vector<float>(v.size(), 0.0f)) << what << ": v should have underflowed";
        double largest = 0;
        for (size_t i = 0; i < w.size(); ++i)
          largest = std::isfinite(w[i]) ? std::max(largest, std::fabs(double(w[i]) - w0[i])) : HUGE_VAL;
        EXPECT_GT(largest, 1000 * lr) << what << ": the steps should have blown up";
        continue;
      }
      for (size_t i = 0; i < w.size(); ++i) {
        ASSERT_GT(v[i], 0.0f) << what << " element " << i;
        // Five steps of about lr while g ≠ 0, then shrinking ones as m decays faster than v;
        // against the gradient's sign, give or take fp16's spacing below 1 (2^-11) a step.
        const double moved = -std::copysign(1.0, grad[i]) * (double(w[i]) - w0[i]);
        EXPECT_GE(moved, 5 * lr - steps * std::ldexp(1.0, -12)) << what << " element " << i;
        EXPECT_LE(moved, steps * lr + steps * std::ldexp(1.0, -12)) << what << " element " << i;
      }
    }
}

TEST(HalfUpdateKernels, SixteenBitStateRoundsToNearestEven) {
  // SGD with momentum 0 and velocity scaling 1 at the first step stores v = g·gs exactly as the
  // fp32 product rounded: 1 + 2^-11 is a tie between two fp16 values and goes to the even one,
  // 1 + 3·2^-11 to 1 + 2^-9.
  UpdateCase c{"sgd", "SGDUpdate", {}, {true}, [](int t) { return sgdHyper(0.0f, 0.5f, 0, 0, 1, t); }};
  TypedUpdate u(c, DataType::FLOAT16, DataType::FLOAT, DataType::FLOAT16, 2);
  auto k = u.kernel(KernelProvider::Reference);
  u.step(*k, {1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11)}, c.hyper(1), 1.0f);
  EXPECT_EQ(u.values(1), (std::vector<float>{1.0f, 1.0f + std::ldexp(1.0f, -9)}));
}

TEST(HalfUpdateKernels, AllFiniteSeesAnFp16OverflowAndAccumulateWidensIntoFloat) {
  using op_runner::runOp;
  // 60000 + 60000 overflows fp16 (max 65504) to inf: AllFinite must say so.
  TensorData a = tensorOf(DataType::FLOAT16, {60000.0f, 1.0f}), b = tensorOf(DataType::FLOAT16, {60000.0f, 2.0f});
  auto sum = runOp("Add", 13, {}, {{"a", a}, {"b", b}}, {});
  ASSERT_TRUE(std::isinf(sum[0].valueAsDouble(0)));
  for (DataType t : {DataType::FLOAT16, DataType::BFLOAT16}) {
    auto finite = runOp("AllFinite", 1, {}, {{"g", tensorOf(t, {1.0f, -2.0f})}, {"h", tensorOf(t, {3.0f})}}, {}, 1,
                        "ai.graphcore");
    EXPECT_EQ(finite[0].valueAsDouble(0), 1.0) << toString(t);
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      auto notFinite = runOp("AllFinite", 1, {}, {{"g", tensorOf(t, {1.0f, -2.0f})}, {"h", tensorOf(t, {bad})}}, {}, 1,
                             "ai.graphcore");
      EXPECT_EQ(notFinite[0].valueAsDouble(0), 0.0) << toString(t) << " " << bad;
    }
  }
  auto overflowed = runOp("AllFinite", 1, {}, {{"g", sum[0]}}, {}, 1, "ai.graphcore");
  EXPECT_EQ(overflowed[0].valueAsDouble(0), 0.0);
  // A 16-bit gradient accumulates into a FLOAT accumulator exactly: 2048 + 1 is not an fp16.
  EXPECT_EQ(accumulate(tensorOf(DataType::FLOAT, {2048.0f}), tensorOf(DataType::FLOAT16, {1.0f})), 2049.0f);
  EXPECT_EQ(accumulate(tensorOf(DataType::FLOAT, {256.0f}), tensorOf(DataType::BFLOAT16, {1.0f})), 257.0f);
  // Into a 16-bit accumulator it is rounded once: 2048 + 3 = 2051 goes to the even 2052.
  EXPECT_EQ(accumulate(tensorOf(DataType::FLOAT16, {2048.0f}), tensorOf(DataType::FLOAT16, {3.0f})), 2052.0f);
}

TEST(HalfUpdateKernels, OnnxTrainingOpsRoundADoubleOnceTo16Bits) {
  // Momentum computes in double: x - r·v = 1 + 2^-11 + 2^-40 is just above the tie between fp16's
  // 1 and 1 + 2^-10. Rounded to float first (1 + 2^-11, a tie) and then to fp16 it became 1.
  ir::Attributes attrs;
  attrs.set("alpha", 0.0f);
  attrs.set("beta", 1.0f);
  attrs.set("norm_coefficient", 0.0f);
  attrs.set("mode", std::string("standard"));
  TensorData r = TensorData::fromDoubles(DataType::DOUBLE, {}, {1.0 + std::ldexp(1.0, -29)});
  TensorData t = TensorData::fromInt64({}, {1});
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16}) {
    // bfloat16: 1 + 2^-8 + 2^-37 lies just above the tie between 1 and 1 + 2^-7.
    const int bits = type == DataType::FLOAT16 ? 11 : 8;
    auto out = op_runner::runOp("Momentum", 1, attrs,
                                {{"r", r},
                                 {"t", t},
                                 {"x", tensorOf(type, {1.0f})},
                                 {"g", tensorOf(type, {-std::ldexp(1.0f, -bits)})},
                                 {"v", tensorOf(type, {0.0f})}},
                                {}, 2, "ai.onnx.preview.training");
    EXPECT_EQ(out[0].valueAsDouble(0), 1.0 + std::ldexp(1.0, -(bits - 1))) << toString(type);
  }
}

// ---------------------------------------------------------------------------------------------
// applyOptimizer: state types

namespace {

/// A graph with one weight w [4] of \p type and its gradient g (of \p gradType, UNDEFINED: \p type)
/// as a stream input, the optimiser applied with \p options.
struct AppliedGraph {
  ir::Graph graph;
  optimizer::AppliedOptimizer applied;
  AppliedGraph(DataType type, const Optimizer &opt, const optimizer::ApplyOptions &options,
               DataType gradType = DataType::UNDEFINED) {
    ir::registerBuiltinOps();
    backend_cpu::registerBuiltinKernels();
    graph.opsets()["ai.onnx"] = 17;
    graph.addTensor("w", ir::TensorKind::Variable, TensorInfo(type, {4}))
        .setData(std::make_shared<TensorData>(tensorOf(type, {0.5f, -1.0f, 2.0f, 0.25f})));
    graph.addTensor("g", ir::TensorKind::Stream, TensorInfo(gradType == DataType::UNDEFINED ? type : gradType, {4}));
    graph.addInput("g");
    applied = optimizer::applyOptimizer(graph, opt, {{"w", "g"}}, options);
    ir::inferShapes(graph, nullptr);
  }
  DataType typeOf(const TensorId &id) const { return graph.tensor(id).info().dataType(); }
  bool hasOp(const std::string &type) const {
    for (const auto &op : graph.ops())
      if (op->type == type) return true;
    return false;
  }
};

} // namespace

TEST(HalfApplyOptimizer, StateTakesTheWeightsTypeUnlessFloatIsAsked) {
  Adam adam({{"defaultLearningRate", {0.01f, false}}}, AdamMode::Adam);
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16}) {
    optimizer::ApplyOptions half;
    half.accumulationFactor = 2;
    AppliedGraph a(type, adam, half);
    ASSERT_EQ(a.applied.updates.size(), 1u);
    const optimizer::WeightUpdate &u = a.applied.updates[0];
    ASSERT_EQ(u.state.size(), 2u);
    for (const auto &s : u.state)
      EXPECT_EQ(a.typeOf(s), type) << s; // fp16.16: accl1/accl2 of the weight's type
    EXPECT_EQ(a.typeOf(u.accumulator), type);
    EXPECT_EQ(a.typeOf(u.hyperParameters), DataType::FLOAT);
    EXPECT_EQ(a.typeOf(a.applied.gradScale), DataType::FLOAT);

    optimizer::ApplyOptions full = half;
    full.stateType = DataType::FLOAT;
    AppliedGraph b(type, adam, full);
    for (const auto &s : b.applied.updates[0].state)
      EXPECT_EQ(b.typeOf(s), DataType::FLOAT) << s;
    EXPECT_EQ(b.typeOf(b.applied.updates[0].accumulator), DataType::FLOAT);
    EXPECT_EQ(b.typeOf("w"), type);
  }
  optimizer::ApplyOptions wrong;
  wrong.stateType = DataType::DOUBLE;
  EXPECT_THROW(AppliedGraph(DataType::FLOAT16, adam, wrong), error);
}

TEST(HalfApplyOptimizer, SecondMomentsTakeSecondMomentTypeAndFirstOrderStateTheStateType) {
  using P = Optimizer::Params;
  struct Case {
    std::string name;
    std::shared_ptr<Optimizer> optimizer;
    std::vector<bool> second; ///< per state tensor, in WeightUpdate::state order
  };
  const std::vector<Case> cases{
      {"sgd momentum", std::make_shared<SGD>(P{{"defaultMomentum", {0.9f, true}}}), {false}},
      {"adam", std::make_shared<Adam>(P{}, AdamMode::Adam), {false, true}},
      {"adamax", std::make_shared<Adam>(P{}, AdamMode::AdaMax), {false, true}},
      {"lamb", std::make_shared<Adam>(P{}, AdamMode::Lamb), {false, true}},
      {"centered rmsprop momentum",
       std::make_shared<Adaptive>(P{{"defaultMomentum", {0.5f, true}}}, AdaptiveMode::CenteredRMSProp),
       {true, true, false}},
      {"adagrad", std::make_shared<Adaptive>(P{}, AdaptiveMode::AdaGrad), {true}},
  };
  const DataType f = DataType::FLOAT;
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16})
    for (const Case &c : cases)
      for (DataType state : {DataType::UNDEFINED, f})
        for (DataType second : {DataType::UNDEFINED, f}) {
          optimizer::ApplyOptions options;
          options.stateType = state;
          options.secondMomentType = second;
          options.accumulationFactor = 2;
          AppliedGraph a(type, *c.optimizer, options);
          const optimizer::WeightUpdate &u = a.applied.updates[0];
          const std::string what =
              toString(type) + " " + c.name + " state " + toString(state) + " second " + toString(second);
          ASSERT_EQ(u.state.size(), c.second.size()) << what;
          const DataType first = state == f ? f : type;
          for (size_t k = 0; k < u.state.size(); ++k)
            EXPECT_EQ(a.typeOf(u.state[k]), c.second[k] && second == f ? f : first) << what << " " << u.state[k];
          EXPECT_EQ(a.typeOf(u.accumulator), first) << what; // the accumulator follows stateType
          // The update runs: its kernel takes the mix.
          options.accumulationFactor = 1;
          AppliedGraph b(type, *c.optimizer, options);
          backend_cpu::ExecutionPlan plan(b.graph, {});
          TensorData g = tensorOf(type, {1e-4f, -2e-4f, 0.0f, 1.0f});
          std::memcpy(plan.address("g"), g.data(), static_cast<size_t>(g.byteCount()));
          plan.run();
          plan.run();
          TensorData w(TensorInfo(type, {4}), plan.address("w"));
          for (float x : floatsOf(w))
            EXPECT_TRUE(std::isfinite(x)) << what;
        }
  optimizer::ApplyOptions wrong;
  wrong.secondMomentType = DataType::FLOAT16;
  EXPECT_THROW(AppliedGraph(DataType::FLOAT16, Adam(P{}, AdamMode::Adam), wrong), error);
}

TEST(HalfApplyOptimizer, WeightsOfOtherTypesAreRefusedByName) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.addTensor("w", ir::TensorKind::Variable, TensorInfo(DataType::DOUBLE, {2}))
      .setData(std::make_shared<TensorData>(TensorInfo(DataType::DOUBLE, {2})));
  g.addTensor("g", ir::TensorKind::Stream, TensorInfo(DataType::DOUBLE, {2}));
  try {
    optimizer::applyOptimizer(g, SGD(), {{"w", "g"}}, {});
    FAIL();
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("weight 'w' is DOUBLE: only FLOAT, FLOAT16 and BFLOAT16"), std::string::npos)
        << e.what();
  }
}

TEST(HalfApplyOptimizer, FloatStateRunsThroughAPlanAndClipsInFloat) {
  // fp32 state, clipping and the finiteness check, run on the plan: the clipping norm of the
  // fp16 gradient [300, 300, 0, 0] is 424.3, whose square overflows fp16; it must be summed in
  // fp32 (a Cast before ReduceSumSquare).
  SGD sgd({{"defaultLearningRate", {1.0f, false}}, {"defaultMomentum", {0.9f, true}}},
          {ClipNormSettings::clipAllWeights(1.0f)});
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16})
    for (DataType state : {DataType::UNDEFINED, DataType::FLOAT}) {
      optimizer::ApplyOptions options;
      options.stateType = state;
      options.checkFinite = true;
      AppliedGraph a(type, sgd, options);
      EXPECT_TRUE(a.hasOp("Cast"));
      EXPECT_EQ(a.typeOf(a.applied.updates[0].state[0]), state == DataType::FLOAT ? DataType::FLOAT : type);
      // An output, so that the plan keeps it after the step (a dead arena slot is reused).
      a.graph.addOutput(a.applied.allFinite);
      backend_cpu::ExecutionPlan plan(a.graph, {});
      TensorData g = tensorOf(type, {300.0f, 300.0f, 0.0f, 0.0f});
      std::memcpy(plan.address("g"), g.data(), static_cast<size_t>(g.byteCount()));
      plan.run();
      EXPECT_TRUE(*static_cast<const bool *>(plan.address(a.applied.allFinite)));
      TensorData w(TensorInfo(type, {4}), plan.address("w"));
      const double coef = 1.0 / (std::sqrt(2.0) * 300.0 + 1e-6); // g·coef = 1/√2 each
      const std::vector<float> want{roundTo(type, float(0.5 - 300.0 * coef)), roundTo(type, float(-1.0 - 300.0 * coef)),
                                    2.0f, 0.25f};
      expectWithinUlps(floatsOf(w), want, type, 1.0, toString(type) + " state " + toString(state));
    }
}

TEST(HalfApplyOptimizer, AFloatMasterWeightReadsA16BitGradientWithFloatStateAccumulatorAndNorms) {
  // fp16.32 and bf16: every reader of the 16-bit gradient takes it as it is (the update, the
  // finiteness check, the accumulator) except the clipping norm, which squares it in fp32: the
  // norm of [300, 300, 0, 0] is 424.3, whose square overflows fp16. State and accumulator FLOAT.
  SGD sgd({{"defaultLearningRate", {1.0f, false}}, {"defaultMomentum", {0.9f, true}}},
          {ClipNormSettings::clipAllWeights(1.0f)});
  for (DataType g : {DataType::FLOAT16, DataType::BFLOAT16})
    for (int accumulation : {1, 2}) {
      const std::string what = toString(g) + " accumulation " + std::to_string(accumulation);
      optimizer::ApplyOptions options;
      options.checkFinite = true;
      options.accumulationFactor = accumulation;
      AppliedGraph a(DataType::FLOAT, sgd, options, g);
      const optimizer::WeightUpdate &u = a.applied.updates[0];
      EXPECT_EQ(a.typeOf(u.state[0]), DataType::FLOAT) << what;
      if (accumulation > 1) {
        EXPECT_EQ(a.typeOf(u.accumulator), DataType::FLOAT) << what;
      }
      // Accumulated, the update and the check read the FLOAT sum; else the 16-bit gradient itself.
      const DataType effective = accumulation > 1 ? DataType::FLOAT : g;
      for (const auto &op : a.graph.ops()) {
        if (op->type == "ReduceSumSquare") {
          EXPECT_EQ(op->inInfo(0).dataType(), DataType::FLOAT) << what;
        }
        if (op->type == "SGDUpdate") {
          EXPECT_EQ(op->inInfo(1).dataType(), effective) << what;
        }
        if (op->type == "AllFinite") {
          EXPECT_EQ(op->inInfo(0).dataType(), effective) << what;
        }
        if (op->type == "Accumulate") {
          EXPECT_EQ(op->input(1).id(), "g") << what;
        }
      }
      a.graph.addOutput(a.applied.allFinite);
      backend_cpu::ExecutionPlan plan(a.graph, {});
      TensorData grad = tensorOf(g, {300.0f, 300.0f, 0.0f, 0.0f});
      std::memcpy(plan.address("g"), grad.data(), static_cast<size_t>(grad.byteCount()));
      plan.run();
      EXPECT_TRUE(*static_cast<const bool *>(plan.address(a.applied.allFinite))) << what;
      TensorData w(TensorInfo(DataType::FLOAT, {4}), plan.address("w"));
      const double coef = 1.0 / (std::sqrt(2.0) * 300.0 + 1e-6); // g·coef = 1/√2 each
      const std::vector<float> want{float(0.5 - 300.0 * coef), float(-1.0 - 300.0 * coef), 2.0f, 0.25f};
      expectWithinUlps(floatsOf(w), want, DataType::FLOAT, 4.0, what);
    }
}

// ---------------------------------------------------------------------------------------------
// Sessions on 16-bit models

namespace {

constexpr int64_t kN = 6;

/// Values of \p type (FLOAT16 or BFLOAT16) as raw 16-bit words.
std::vector<uint16_t> words(DataType type, const std::vector<float> &v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = type == DataType::FLOAT16 ? floatToHalf(v[i]) : floatToBfloat16(v[i]);
  return out;
}
float fromWord(DataType type, uint16_t w) { return type == DataType::FLOAT16 ? halfToFloat(w) : bfloat16ToFloat(w); }

const std::vector<float> kW0 = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f};
const std::vector<float> kU0 = {1.0f, 2.0f, -3.0f, 0.5f, 0.0f, -0.5f};

/// loss = sum(w * x) (+ sum(u * x)) in \p type: the gradient of w is x.
std::string linearModel(DataType type, bool twoWeights = false) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(type, {kN}), "x");
  std::vector<uint16_t> w0 = words(type, kW0), u0 = words(type, kU0);
  TensorId w = b->addInitializedInputTensor(w0.data(), TensorInfo(type, {kN}), "w");
  TensorId loss = ai.reducesum({ai.mul({w, x})}, std::nullopt, 0);
  if (twoWeights) {
    TensorId u = b->addInitializedInputTensor(u0.data(), TensorInfo(type, {kN}), "u");
    loss = ai.add({loss, ai.reducesum({ai.mul({u, x})}, std::nullopt, 0)});
  }
  b->addOutputTensor(loss);
  return b->getModelProto();
}

/// A 4-8-2 perceptron in \p type with a squared-error loss, and its batch of 8.
struct Mlp {
  std::string model;
  std::vector<uint16_t> x, y;
  std::vector<TensorId> weights{"w1", "b1", "w2", "b2"};
  TensorId loss;
  explicit Mlp(DataType type) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    auto random = [&](size_t n, float scale) {
      std::vector<float> v(n);
      for (float &e : v)
        e = d(rng) * scale;
      return words(type, v);
    };
    auto b = Builder::create();
    auto ai = b->aiOnnxOpset13();
    TensorId in = b->addInputTensor(TensorInfo(type, {8, 4}), "x");
    TensorId target = b->addInputTensor(TensorInfo(type, {8, 2}), "y");
    auto w1 = random(32, 0.5f), b1 = random(8, 0.1f), w2 = random(16, 0.5f), b2 = random(2, 0.1f);
    TensorId tw1 = b->addInitializedInputTensor(w1.data(), TensorInfo(type, {4, 8}), "w1");
    TensorId tb1 = b->addInitializedInputTensor(b1.data(), TensorInfo(type, {8}), "b1");
    TensorId tw2 = b->addInitializedInputTensor(w2.data(), TensorInfo(type, {8, 2}), "w2");
    TensorId tb2 = b->addInitializedInputTensor(b2.data(), TensorInfo(type, {2}), "b2");
    TensorId h = ai.relu({ai.add({ai.matmul({in, tw1}), tb1})});
    TensorId out = ai.add({ai.matmul({h, tw2}), tb2});
    TensorId diff = ai.sub({out, target});
    loss = ai.reducemean({ai.mul({diff, diff})}, std::nullopt, 0);
    b->addOutputTensor(loss);
    model = b->getModelProto();
    x = random(32, 1.0f);
    std::vector<float> yf(16);
    for (size_t i = 0; i < 8; ++i) { // a target the network can fit: a function of x
      yf[2 * i] = 0.5f * fromWord(type, x[4 * i]) - 0.25f * fromWord(type, x[4 * i + 1]);
      yf[2 * i + 1] = 0.3f * fromWord(type, x[4 * i + 2]);
    }
    y = words(type, yf);
  }
};

std::unique_ptr<TrainingSession> session(const std::string &model, const Optimizer &opt, const SessionOptions &so = {},
                                         const std::vector<TensorId> &anchors = {}) {
  auto s = TrainingSession::createFromOnnxModel(model, DataFlow(1, anchors, AnchorReturnType("ALL")), "", opt, so);
  s->prepareDevice();
  s->weightsFromHost();
  return s;
}

/// Tensor \p id read as raw 16-bit words.
std::vector<uint16_t> readWords(const TrainingSession &s, const TensorId &id) {
  const TensorInfo info = s.getInfo(id);
  std::vector<uint16_t> v(static_cast<size_t>(info.elementCount()));
  RawArray arr(v.data(), info.dataType(), info.shape());
  WeightsIO io;
  io.insert(id, arr);
  s.readWeights(io);
  return v;
}

/// Tensor \p id read as raw bytes, whatever its type.
std::vector<uint8_t> readBytes(const TrainingSession &s, const TensorId &id) {
  const TensorInfo info = s.getInfo(id);
  std::vector<uint8_t> v(static_cast<size_t>(info.byteCount()));
  RawArray arr(v.data(), info.dataType(), info.shape());
  WeightsIO io;
  io.insert(id, arr);
  s.readWeights(io);
  return v;
}

/// Whether optimiser state \p id is second-order (PopART's accl2; optimizer/apply.cpp names it).
bool isSecondMoment(const TensorId &id) {
  for (const char *prefix : {"adam_v_", "adamax_u_", "rmsprop_sq_", "rmsprop_avg_", "adagrad_sum_"})
    if (id.rfind(prefix, 0) == 0) return true;
  return false;
}

/// Tensor \p id read into a FLOAT buffer (converted on the way for 16-bit tensors).
std::vector<float> readFloats(const TrainingSession &s, const TensorId &id) {
  const TensorInfo info = s.getInfo(id);
  std::vector<float> v(static_cast<size_t>(info.elementCount()));
  NDArrayWrapper<float> arr(v.data(), info.shape());
  WeightsIO io;
  io.insert(id, arr);
  s.readWeights(io);
  return v;
}

/// One step of the linear model with x = \p x (rounded to \p type).
void linearStep(TrainingSession &s, DataType type, const std::vector<float> &x) {
  std::vector<uint16_t> xs = words(type, x);
  RawArray in(xs.data(), type, {kN});
  StepIO io({{"x", in}}, {});
  s.run(io);
}

std::vector<float> data(int k) {
  std::vector<float> x(kN);
  for (int64_t i = 0; i < kN; ++i)
    x[size_t(i)] = static_cast<float>(std::sin(0.7 * double(i + 1) * double(k + 1)) * (0.5 + 0.2 * double(i)));
  return x;
}

std::vector<std::pair<std::string, std::function<std::unique_ptr<Optimizer>()>>> optimisers() {
  using P = Optimizer::Params;
  return {
      {"sgd momentum",
       [] {
         return std::make_unique<SGD>(P{{"defaultLearningRate", {0.1f, false}}, {"defaultMomentum", {0.9f, true}}});
       }},
      {"sgd nesterov",
       [] {
         return std::make_unique<SGD>(P{{"defaultLearningRate", {0.05f, false}},
                                        {"defaultMomentum", {0.9f, true}},
                                        {"defaultNesterov", {1.0f, true}}});
       }},
      {"adam",
       [] {
         return std::make_unique<Adam>(P{{"defaultLearningRate", {0.02f, false}}}, AdamMode::Adam);
       }},
      {"adamw",
       [] {
         return std::make_unique<Adam>(
             P{{"defaultLearningRate", {0.02f, false}}, {"defaultWeightDecay", {0.01f, true}}}, AdamMode::Adam,
             WeightDecayMode::Decay);
       }},
      {"adamax",
       [] {
         return std::make_unique<Adam>(P{{"defaultLearningRate", {0.02f, false}}}, AdamMode::AdaMax);
       }},
      {"lamb",
       [] {
         return std::make_unique<Adam>(P{{"defaultLearningRate", {0.02f, false}}}, AdamMode::Lamb);
       }},
      {"rmsprop",
       [] {
         return std::make_unique<Adaptive>(P{{"defaultLearningRate", {0.01f, false}}, {"defaultEps", {1e-3f, true}}},
                                           AdaptiveMode::RMSProp);
       }},
      {"centered rmsprop",
       [] {
         return std::make_unique<Adaptive>(P{{"defaultLearningRate", {0.01f, false}}, {"defaultEps", {1e-3f, true}}},
                                           AdaptiveMode::CenteredRMSProp);
       }},
      {"adagrad",
       [] {
         return std::make_unique<Adaptive>(P{{"defaultLearningRate", {0.05f, false}}}, AdaptiveMode::AdaGrad);
       }},
  };
}

} // namespace

TEST(HalfTraining, A16BitPerceptronTrainsWithEveryOptimiser) {
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16}) {
    Mlp mlp(type);
    for (const auto &[name, make] : optimisers()) {
      auto opt = make();
      auto s = session(mlp.model, *opt, {}, {mlp.loss});
      ASSERT_EQ(s->getWeightIds().size(), 4u) << name;
      for (const auto &id : s->getOptimizerStateIds()) // 16-bit first-order state, fp32 second moments
        EXPECT_EQ(s->getInfo(id).dataType(), isSecondMoment(id) ? DataType::FLOAT : type) << name << " " << id;
      std::vector<std::vector<uint16_t>> before;
      for (const auto &id : mlp.weights)
        before.push_back(readWords(*s, id));
      std::vector<float> losses;
      for (int k = 0; k < 30; ++k) {
        RawArray x(mlp.x.data(), type, {8, 4}), y(mlp.y.data(), type, {8, 2});
        uint16_t loss = 0;
        RawArray out(&loss, type, {});
        StepIO io({{"x", x}, {"y", y}}, {{s->getLossId(), out}});
        s->run(io);
        losses.push_back(fromWord(type, loss));
        ASSERT_TRUE(std::isfinite(losses.back())) << toString(type) << " " << name << " step " << k;
      }
      EXPECT_LT(losses.back(), 0.7f * losses.front())
          << toString(type) << " " << name << ": " << losses.front() << " -> " << losses.back();
      for (size_t i = 0; i < mlp.weights.size(); ++i)
        EXPECT_NE(readWords(*s, mlp.weights[i]), before[i])
            << toString(type) << " " << name << " " << mlp.weights[i] << " did not move";
    }
  }
}

TEST(HalfTraining, SgdStepsOnTheLinearModelAreTheFp32StepsRounded) {
  // loss = sum(w·x): the gradient is x, exactly. Each weight is w - lr·x rounded once.
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16}) {
    auto s = session(linearModel(type), SGD({{"defaultLearningRate", {0.1f, false}}}));
    std::vector<float> w(kW0.begin(), kW0.end());
    for (float &e : w)
      e = roundTo(type, e);
    for (int t = 0; t < 3; ++t) {
      std::vector<float> x = data(t);
      linearStep(*s, type, x);
      for (size_t i = 0; i < kN; ++i)
        w[i] = roundTo(type, w[i] - 0.1f * roundTo(type, x[i]));
      EXPECT_EQ(readFloats(*s, "w"), w) << toString(type) << " step " << t;
    }
  }
}

TEST(HalfTraining, ClippingNormsOfFp16GradientsAreComputedInFloat) {
  // Gradients of 150..250: their sum of squares (about 4e5) overflows fp16.
  SGD opt({{"defaultLearningRate", {1.0f, false}}}, {ClipNormSettings::clipAllWeights(0.5f)});
  const DataType type = DataType::FLOAT16;
  auto s = session(linearModel(type, true), opt);
  const std::vector<float> x{150.0f, -200.0f, 250.0f, 175.0f, -160.0f, 220.0f};
  linearStep(*s, type, x);
  double norm = 0;
  for (float v : x)
    norm += 2.0 * double(v) * v; // both weights have gradient x
  norm = std::sqrt(norm);
  ASSERT_GT(norm * norm, 65504.0);
  const double coef = std::min(1.0, 0.5 / (norm + 1e-6));
  std::vector<float> want(kN);
  for (size_t i = 0; i < kN; ++i)
    want[i] = roundTo(type, static_cast<float>(kW0[i] - coef * x[i]));
  expectWithinUlps(readFloats(*s, "w"), want, type, 1.0, "clipped w");
  EXPECT_EQ(s->getStepCount(), 1);
}

TEST(HalfTraining, DynamicLossScalingSkipsAStepWhoseFp16GradientOverflowed) {
  // The scaled loss's gradient starts at the loss scale 2^16, which fp16 cannot hold (max 65504):
  // the first step's gradients are inf and it is skipped; at 2^15 they fit and the step is taken.
  SessionOptions so;
  so.automaticLossScalingSettings.enabled = true;
  const DataType type = DataType::FLOAT16;
  auto s = session(linearModel(type), SGD({{"defaultLearningRate", {0.1f, false}}}), so);
  EXPECT_EQ(s->getLossScale(), 65536.0f);
  const std::vector<uint16_t> w0 = readWords(*s, "w");
  linearStep(*s, type, data(0));
  EXPECT_EQ(s->getStepCount(), 0);
  EXPECT_EQ(s->getSkippedSteps(), 1);
  EXPECT_EQ(s->getLossScale(), 32768.0f);
  EXPECT_EQ(readWords(*s, "w"), w0);
  // At 2^15 a gradient of 1.9 is 62259: finite.
  std::vector<float> x = data(1);
  for (float v : x)
    ASSERT_LT(std::fabs(v) * 32768.0f, 65504.0f);
  linearStep(*s, type, x);
  EXPECT_EQ(s->getStepCount(), 1);
  EXPECT_EQ(s->getSkippedSteps(), 1);
  std::vector<float> want(kN);
  for (size_t i = 0; i < kN; ++i) // x·2^15 is exact in fp16, and so is its unscaling
    want[i] = roundTo(type, kW0[i] - 0.1f * roundTo(type, x[i]));
  EXPECT_EQ(readFloats(*s, "w"), want);
}

TEST(HalfTraining, AccumulationOfFp16GradientsUsesTheMean) {
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16}) {
    SessionOptions so;
    so.enableGradientAccumulation = true;
    so.accumulationFactor = 2;
    auto s = session(linearModel(type), SGD({{"defaultLearningRate", {0.1f, false}}}), so);
    for (const auto &id : s->getOptimizerStateIds())
      EXPECT_EQ(s->getInfo(id).dataType(), type) << id;
    std::vector<float> x = data(0), y = data(1), both = x;
    both.insert(both.end(), y.begin(), y.end());
    std::vector<uint16_t> xs = words(type, both);
    RawArray in(xs.data(), type, {2, kN});
    StepIO io({{"x", in}}, {});
    s->run(io);
    std::vector<float> want(kN);
    for (size_t i = 0; i < kN; ++i) {
      const float sum = roundTo(type, roundTo(type, x[i]) + roundTo(type, y[i])); // the accumulator
      want[i] = roundTo(type, kW0[i] - 0.1f * (sum * 0.5f));
    }
    expectWithinUlps(readFloats(*s, "w"), want, type, 1.0, toString(type) + " accumulated");
    EXPECT_EQ(s->getStepCount(), 1);
  }
}

TEST(HalfTraining, CheckpointsRoundTrip16BitWeightsAndStateBitForBit) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("popart_half_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16}) {
    const std::string ckpt = (dir / (toString(type) + ".ckpt")).string();
    Adam opt({{"defaultLearningRate", {0.01f, false}}}, AdamMode::Adam);
    auto a = session(linearModel(type, true), opt);
    linearStep(*a, type, data(0));
    linearStep(*a, type, data(1));
    a->saveCheckpoint(ckpt);
    std::map<TensorId, std::vector<uint8_t>> saved;
    std::vector<TensorId> ids = a->getWeightIds();
    for (const auto &id : a->getOptimizerStateIds())
      ids.push_back(id);
    for (const auto &id : ids) {
      EXPECT_EQ(a->getInfo(id).dataType(), isSecondMoment(id) ? DataType::FLOAT : type) << id;
      saved[id] = readBytes(*a, id);
    }
    linearStep(*a, type, data(2));
    linearStep(*a, type, data(3));

    auto b = session(linearModel(type, true), opt);
    b->loadCheckpoint(ckpt);
    EXPECT_EQ(b->getStepCount(), 2);
    for (const auto &id : ids)
      EXPECT_EQ(readBytes(*b, id), saved[id]) << toString(type) << " " << id << " after loading";
    linearStep(*b, type, data(2));
    linearStep(*b, type, data(3));
    for (const auto &id : ids)
      EXPECT_EQ(readBytes(*b, id), readBytes(*a, id)) << toString(type) << " " << id << " after resuming";
  }
  fs::remove_all(dir);
}

TEST(HalfTraining, ReadAndWriteWeightsConvertFloatBuffersOf16BitTensors) {
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16}) {
    Adam opt({{"defaultLearningRate", {0.01f, false}}}, AdamMode::Adam);
    auto s = session(linearModel(type), opt);
    // Read: the raw words, and FLOAT values widened exactly.
    const std::vector<uint16_t> raw = readWords(*s, "w");
    std::vector<float> widened = readFloats(*s, "w");
    for (size_t i = 0; i < kN; ++i)
      EXPECT_EQ(widened[i], fromWord(type, raw[i]));
    EXPECT_EQ(widened, std::vector<float>(kW0.begin(), kW0.end())); // all exact in both types
    // Write FLOAT values: rounded to nearest even. 0.1 is exact in neither type.
    std::vector<float> v{0.1f, -0.2f, 1.0f / 3.0f, 1000.0f, 1e-3f, -7.0f};
    NDArrayWrapper<float> arr(v.data(), {kN});
    WeightsIO io;
    io.insert("w", arr);
    s->writeWeights(io);
    EXPECT_EQ(readWords(*s, "w"), words(type, v));
    // Write raw words: stored as they are (a NaN payload included).
    std::vector<uint16_t> bits = words(type, {1.5f, -2.0f, 0.0f, -0.0f, 3.0f, 4.0f});
    bits[5] = 0x7e01;
    RawArray rawArr(bits.data(), type, {kN});
    WeightsIO rawIo;
    rawIo.insert("w", rawArr);
    s->writeWeights(rawIo);
    EXPECT_EQ(readWords(*s, "w"), bits);
    // Optimiser state converts the same way.
    const TensorId m = s->getOptimizerStateIds()[0];
    std::vector<float> state(kN, 1.0f);
    NDArrayWrapper<float> stateArr(state.data(), {kN});
    WeightsIO stateIo;
    stateIo.insert(m, stateArr);
    s->readWeights(stateIo);
    EXPECT_EQ(state, std::vector<float>(kN, 0.0f)); // Adam's first moment before any step
    // Other buffer types and sizes are refused, naming the tensor.
    std::vector<double> d(kN);
    NDArrayWrapper<double> dArr(d.data(), {kN});
    WeightsIO dIo;
    dIo.insert("w", dArr);
    EXPECT_THROW(s->writeWeights(dIo), error);
    EXPECT_THROW(s->readWeights(dIo), error);
    std::vector<float> small(2);
    NDArrayWrapper<float> smallArr(small.data(), {2});
    WeightsIO smallIo;
    smallIo.insert("w", smallArr);
    try {
      s->readWeights(smallIo);
      FAIL();
    } catch (const error &e) {
      EXPECT_NE(std::string(e.what()).find("buffer for 'w' is FLOAT [2]"), std::string::npos) << e.what();
    }
  }
}

TEST(HalfTraining, Fp16_16KeepsSecondMomentsInFloatSoThatAdamSurvivesSmallGradients) {
  // An fp32 model trained in fp16.16: fp16 weights and first moments, fp32 second moments. Its
  // gradients (x, about 1e-4 for 5 steps, then 0) square to ~1e-8, below what an fp16
  // (1 - β2)·g² can hold. With fp16 second moments v stayed 0: the first steps were √t times too
  // large, and once the gradient was 0 the step was lr·m̂/ε ≈ 10: the weights blew up.
  // loss = sum(x·w) with x [1, N] and w [N, 1]: a MatMul, which fp16.16 runs in fp16 (so w becomes
  // an fp16 Variable); the gradient of w is x.
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {1, kN}), "x");
  std::vector<float> w0(kW0.begin(), kW0.end());
  TensorId w = b->addInitializedInputTensor(w0.data(), TensorInfo(DataType::FLOAT, {kN, 1}), "w");
  b->addOutputTensor(ai.reducesum({ai.matmul({x, w})}, std::nullopt, 0));
  SessionOptions so;
  so.precision = "fp16.16";
  const double lr = 1e-3;
  Adam adam({{"defaultLearningRate", {float(lr), false}}, {"defaultEps", {1e-8f, true}}}, AdamMode::Adam);
  auto s = session(b->getModelProto(), adam, so);
  const std::vector<TensorId> state = s->getOptimizerStateIds();
  ASSERT_EQ(state.size(), 2u);
  for (const auto &id : state)
    EXPECT_EQ(s->getInfo(id).dataType(), isSecondMoment(id) ? DataType::FLOAT : DataType::FLOAT16) << id;
  const std::vector<float> xs{1e-4f, -1.5e-4f, 2e-4f, -1e-4f, 1.2e-4f, -2e-4f}, zeros(kN, 0.0f);
  const int steps = 10;
  for (int t = 1; t <= steps; ++t) {
    std::vector<float> in = t <= 5 ? xs : zeros;
    NDArrayWrapper<float> arr(in.data(), {1, kN});
    StepIO io({{"x", arr}}, {});
    s->run(io);
  }
  const std::vector<float> trained = readFloats(*s, "w");
  for (size_t i = 0; i < kN; ++i) {
    // Five steps of about lr against the gradient's sign while it is not 0, then shrinking ones
    // as m decays faster than v; fp16 rounds each step by at most half its spacing at |w| < 2.
    const double moved = -std::copysign(1.0, double(xs[i])) * (double(trained[i]) - roundTo(DataType::FLOAT16, kW0[i]));
    const double rounding = steps * std::ldexp(1.0, -11);
    EXPECT_GE(moved, 5 * lr - rounding) << "w[" << i << "]";
    EXPECT_LE(moved, steps * lr + rounding) << "w[" << i << "]";
  }
}
