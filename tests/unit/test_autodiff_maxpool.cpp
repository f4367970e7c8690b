// Gradient of MaxPool through the ai.graphcore MaxPoolGrad op: the rule checked against central
// finite differences in double over varied geometry, against the forward's Indices and a
// hand-worked example on inputs with ties, and the oneDNN kernel against the reference kernel on
// random and on tied fp32 data.

#include "autodiff/autodiff.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/passes/passes.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

using namespace popart;
using backend_cpu::KernelProvider;
using Ints = std::vector<int64_t>;

namespace {

struct Case {
  Shape x;
  ir::Attributes attrs;
  int opset = 17;
};

ir::Attributes attrs(std::initializer_list<std::pair<const char *, ir::AttributeValue>> kv) {
  ir::Attributes a;
  for (const auto &[k, v] : kv)
    a.set(k, v);
  return a;
}

/// Loss weight of output element \p i: uneven, so that each output's gradient differs.
double weight(size_t i) { return 1.0 + 0.37 * static_cast<double>(i % 7); }

/// Builds y = Σ-weighted MaxPool(x0) (with its Indices as output "idx" if \p indices), and
/// the gradient of x0 if \p grad.
std::unique_ptr<ir::Graph> buildGraph(const Case &c, DataType type, TensorId *grad, bool indices = false) {
  ir::registerBuiltinOps();
  auto g = std::make_unique<ir::Graph>();
  g->opsets()["ai.onnx"] = c.opset;
  g->addTensor("x0", ir::TensorKind::Stream, TensorInfo(type, c.x));
  g->addInput("x0");
  std::vector<TensorId> outs{"y0"};
  if (indices) outs.push_back("idx");
  g->addOp("MaxPool", "", c.opset, "pool", c.attrs, {"x0"}, outs);
  ir::inferShapes(*g, nullptr);
  const TensorInfo &y0 = g->tensor("y0").info();
  std::vector<double> w(static_cast<size_t>(y0.elementCount()));
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = weight(i);
  g->addConst("w", TensorData::fromDoubles(type, y0.shape(), w));
  g->addOp("Mul", "", c.opset, "weigh", {}, {"y0", "w"}, {"y"});
  g->addOutput("y");
  if (indices) g->addOutput("idx");
  ir::inferShapes(*g, nullptr);
  if (grad) {
    *grad = autodiff::buildGradients(*g, "y", {"x0"}).at(0);
    g->addOutput(*grad);
    ir::inferShapes(*g, nullptr);
  }
  return g;
}

/// Runs the graph of \p c on \p x (values exact in \p type): Σy, and dX in *grad if given.
double evaluate(const Case &c, DataType type, const std::vector<double> &x, std::vector<double> *grad) {
  TensorId gradId;
  auto g = buildGraph(c, type, grad ? &gradId : nullptr);
  backend_cpu::ExecutionPlan plan(*g, {});
  TensorData t = TensorData::fromDoubles(type, c.x, x);
  std::memcpy(plan.address("x0"), t.data(), static_cast<size_t>(t.byteCount()));
  plan.run();
  auto read = [&](const TensorId &id) {
    TensorData r(plan.info(id));
    std::memcpy(r.data(), plan.address(id), static_cast<size_t>(r.byteCount()));
    return r.toDoubleVector();
  };
  if (grad) {
    EXPECT_EQ(plan.info(gradId).shape(), c.x);
    *grad = read(gradId);
  }
  double s = 0;
  for (double v : read("y"))
    s += v;
  return s;
}

void checkGradient(const Case &c, unsigned seed) {
  SCOPED_TRACE("MaxPool seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-2, 2);
  std::vector<double> x(static_cast<size_t>(shapeElementCount(c.x)));
  for (double &v : x)
    v = d(rng);
  std::vector<double> analytic;
  evaluate(c, DataType::DOUBLE, x, &analytic);
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> plus = x, minus = x;
    plus[i] += h;
    minus[i] -= h;
    double numeric =
        (evaluate(c, DataType::DOUBLE, plus, nullptr) - evaluate(c, DataType::DOUBLE, minus, nullptr)) / (2 * h);
    ASSERT_NEAR(analytic[i], numeric, 1e-5 * (1 + std::fabs(numeric))) << "d/dx[" << i << "] seed " << seed;
  }
}

/// The op types of the backward part of \p c's fp32 graph (the ops after the loss Mul).
std::multiset<std::string> backwardOpTypes(const Case &c) {
  TensorId grad;
  auto g = buildGraph(c, DataType::FLOAT, &grad);
  std::multiset<std::string> types;
  bool backward = false;
  for (const auto &op : g->ops()) {
    if (backward) types.insert(op->type);
    if (op->name == "weigh") backward = true;
  }
  return types;
}

/// Integer values in [0, levels): many exact ties in every window.
std::vector<double> tiedValues(const Shape &s, unsigned seed, int levels) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, levels - 1);
  std::vector<double> v(static_cast<size_t>(shapeElementCount(s)));
  for (double &x : v)
    x = d(rng);
  return v;
}

const Case kStridesPads{{2, 3, 6, 7},
                        attrs({{"kernel_shape", Ints{3, 2}}, {"strides", Ints{2, 1}}, {"pads", Ints{1, 0, 2, 1}}})};
const Case kDilations{{1, 2, 7, 6},
                      attrs({{"kernel_shape", Ints{2, 3}}, {"dilations", Ints{2, 2}}, {"pads", Ints{1, 1, 0, 1}}})};
const Case kCeilMode{{1, 2, 6, 7},
                     attrs({{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}}, {"ceil_mode", int64_t{1}}})};
const Case kOneD{{2, 3, 9}, attrs({{"kernel_shape", Ints{3}}, {"strides", Ints{2}}, {"pads", Ints{1, 2}}})};
const Case kThreeD{{1, 2, 4, 5, 4},
                   attrs({{"kernel_shape", Ints{2, 3, 2}},
                          {"strides", Ints{2, 1, 2}},
                          {"pads", Ints{0, 1, 1, 1, 1, 0}},
                          {"dilations", Ints{1, 1, 2}}})};

} // namespace

TEST(AutodiffMaxPool, RuleUsesMaxPoolGrad) {
  // One MaxPoolGrad, and no recomputed MaxPool or ScatterElements.
  for (const Case &c : {Case{{1, 2, 4, 4}, attrs({{"kernel_shape", Ints{2, 2}}})}, kCeilMode, kThreeD}) {
    std::multiset<std::string> types = backwardOpTypes(c);
    EXPECT_EQ(types.count("MaxPoolGrad"), 1u);
    EXPECT_EQ(types.count("MaxPool"), 0u);
    EXPECT_EQ(types.count("ScatterElements"), 0u);
  }
}

TEST(AutodiffMaxPool, StridesPadsDilations) {
  checkGradient(kStridesPads, 101);
  checkGradient(kDilations, 102);
}

TEST(AutodiffMaxPool, CeilModeAutoPadStorageOrder) {
  checkGradient(kCeilMode, 103);
  for (const char *ap : {"SAME_UPPER", "SAME_LOWER"})
    checkGradient(
        {{1, 2, 5, 6}, attrs({{"kernel_shape", Ints{2, 3}}, {"strides", Ints{2, 2}}, {"auto_pad", std::string(ap)}})},
        104);
  // storage_order lays out the Indices only; the gradient is the same.
  checkGradient({{1, 2, 4, 5}, attrs({{"kernel_shape", Ints{2, 2}}, {"storage_order", int64_t{1}}})}, 105);
}

TEST(AutodiffMaxPool, OneDAndThreeD) {
  checkGradient(kOneD, 106);
  checkGradient(kThreeD, 107);
}

TEST(AutodiffMaxPool, TiesGoToTheFirstMaximumByHand) {
  // X all ones (1x1x2x2), 2x2 windows with stride 1 and one pad all round: 3x3 outputs, each
  // taking its first tap inside the input. Output weights w0..w8 = 1, 1.37, ..., 3.22, 1, 1.37.
  // dX[0,0] = w0 + w1 + w3 + w4, dX[0,1] = w2 + w5, dX[1,0] = w6 + w7, dX[1,1] = w8.
  Case c{{1, 1, 2, 2}, attrs({{"kernel_shape", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}})};
  std::vector<double> expected{6.96, 4.59, 4.22, 1.37};
  for (DataType type : {DataType::DOUBLE, DataType::FLOAT}) {
    std::vector<double> dx;
    evaluate(c, type, {1, 1, 1, 1}, &dx);
    ASSERT_EQ(dx.size(), expected.size());
    for (size_t i = 0; i < dx.size(); ++i)
      EXPECT_NEAR(dx[i], expected[i], 1e-5) << toString(type) << " dX[" << i << "]";
  }
}

TEST(AutodiffMaxPool, TiesFollowTheForwardIndices) {
  // On integer-valued inputs, dX must be dY scattered to the forward MaxPool's Indices.
  unsigned seed = 110;
  for (const Case &c : {kStridesPads, kDilations, kCeilMode, kOneD, kThreeD})
    for (DataType type : {DataType::DOUBLE, DataType::FLOAT, DataType::FLOAT16}) {
      SCOPED_TRACE(toString(type) + " seed " + std::to_string(seed));
      std::vector<double> x = tiedValues(c.x, seed++, 3);
      TensorId gradId;
      auto g = buildGraph(c, type, &gradId, true);
      backend_cpu::ExecutionPlan plan(*g, {});
      TensorData t = TensorData::fromDoubles(type, c.x, x);
      std::memcpy(plan.address("x0"), t.data(), static_cast<size_t>(t.byteCount()));
      plan.run();
      const auto *idx = static_cast<const int64_t *>(plan.address("idx"));
      std::vector<double> expected(x.size(), 0.0);
      for (int64_t k = 0; k < plan.info("idx").elementCount(); ++k)
        expected[static_cast<size_t>(idx[k])] += weight(static_cast<size_t>(k));
      TensorData dx(plan.info(gradId));
      std::memcpy(dx.data(), plan.address(gradId), static_cast<size_t>(dx.byteCount()));
      std::vector<double> got = dx.toDoubleVector();
      ASSERT_EQ(got.size(), expected.size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], expected[i], 1e-2 * (1 + expected[i])) << "dX[" << i << "]";
    }
}

namespace {

/// Runs the MaxPoolGrad op of \p c with oneDNN and with the reference kernel and compares: on
/// random data (\p levels 0) to rounding, on integer values in [0, levels) (ties) exactly.
/// \p dnnl says whether oneDNN is expected to take the op.
void compareKernels(const Case &c, unsigned seed, int levels, bool dnnl = true) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  backend_cpu::registerBuiltinKernels();
  TensorId grad;
  auto g = buildGraph(c, DataType::FLOAT, &grad);
  const ir::Op *op = nullptr;
  for (const auto &o : g->ops())
    if (o->type == "MaxPoolGrad") op = o.get();
  ASSERT_NE(op, nullptr);
  const backend_cpu::KernelEntry *fast = backend_cpu::KernelRegistry::instance().find(*op, KernelProvider::Dnnl);
  ASSERT_EQ(fast != nullptr, dnnl) << "oneDNN " << (dnnl ? "declined" : "accepted") << " it";
  if (!fast) return;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  TensorData x(op->inInfo(0)), dy(op->inInfo(1));
  std::vector<double> tied = tiedValues(c.x, seed, std::max(levels, 1));
  for (int64_t k = 0; k < x.info().elementCount(); ++k)
    x.as<float>()[k] = levels ? static_cast<float>(tied[static_cast<size_t>(k)]) : d(rng);
  for (int64_t k = 0; k < dy.info().elementCount(); ++k)
    dy.as<float>()[k] = d(rng);
  std::vector<const void *> in{x.data(), dy.data()};
  TensorData ref(op->outInfo(0)), out(op->outInfo(0));
  for (int64_t k = 0; k < out.info().elementCount(); ++k)
    out.as<float>()[k] = ref.as<float>()[k] = 1e6f; // stale values must not leak into the result
  void *o = ref.data();
  backend_cpu::createKernel(*op, KernelProvider::Reference)->run({in.data(), in.size(), &o, 1});
  o = out.data();
  auto kernel = backend_cpu::createKernel(*op, KernelProvider::Dnnl);
  kernel->run({in.data(), in.size(), &o, 1});
  kernel->run({in.data(), in.size(), &o, 1}); // a second run must not accumulate
  for (int64_t k = 0; k < out.info().elementCount(); ++k)
    ASSERT_NEAR(out.as<float>()[k], ref.as<float>()[k], 1e-5f * (1 + std::fabs(ref.as<float>()[k])))
        << "dX[" << k << "]";
}

} // namespace

TEST(DnnlVsReference, MaxPoolGradKernel) {
  unsigned seed = 120;
  for (int levels : {0, 2, 3})
    for (const Case &c : {kStridesPads, kDilations, kCeilMode, kOneD, kThreeD})
      compareKernels(c, seed++, levels);
  // Larger, overlapping, typical CNN geometry.
  compareKernels({{4, 16, 13, 13}, attrs({{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}}})}, 140, 0);
  compareKernels({{4, 16, 13, 13}, attrs({{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}}})}, 141, 2);
  // A window wholly in the padding (dilated taps straddle the single input row): declined.
  compareKernels(
      {{1, 2, 1, 5}, attrs({{"kernel_shape", Ints{2, 2}}, {"dilations", Ints{2, 1}}, {"pads", Ints{1, 0, 1, 0}}})}, 142,
      0, false);
}
