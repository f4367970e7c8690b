// Gradient rules checked against central finite differences, in double.

#include "autodiff/autodiff.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace popart;

namespace {

/// Graph: inputs a (and b) as streams → op → y; returns dsum(y)/da and dsum(y)/db.
struct Case {
  std::string type;
  Shape a, b; // b empty: unary
};

std::vector<double> evaluate(const Case &c, const std::vector<TensorData> &inputs, bool withGradients,
                             std::vector<std::vector<double>> *grads) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  std::vector<TensorId> ids{"a", "b"};
  size_t n = c.b.empty() ? 1 : 2;
  for (size_t i = 0; i < n; ++i) {
    g.addTensor(ids[i], ir::TensorKind::Stream, inputs[i].info());
    g.addInput(ids[i]);
  }
  g.addOp(c.type, "", 13, "op", {}, std::vector<TensorId>(ids.begin(), ids.begin() + static_cast<long>(n)), {"y"});
  g.addOutput("y");
  ir::inferShapes(g, nullptr);
  std::vector<TensorId> gradIds;
  if (withGradients) {
    gradIds = autodiff::buildGradients(g, "y", std::vector<TensorId>(ids.begin(), ids.begin() + static_cast<long>(n)));
    for (const auto &id : gradIds)
      g.addOutput(id);
    ir::inferShapes(g, nullptr);
  }
  backend_cpu::ExecutionPlan plan(g, {});
  for (size_t i = 0; i < n; ++i)
    std::memcpy(plan.address(ids[i]), inputs[i].data(), static_cast<size_t>(inputs[i].byteCount()));
  plan.run();
  const TensorInfo &yInfo = plan.info("y");
  std::vector<double> y(static_cast<size_t>(yInfo.elementCount()));
  for (size_t i = 0; i < y.size(); ++i)
    y[i] = static_cast<const double *>(plan.address("y"))[i];
  if (grads) {
    grads->clear();
    for (const auto &id : gradIds) {
      const auto *p = static_cast<const double *>(plan.address(id));
      grads->emplace_back(p, p + plan.info(id).elementCount());
    }
  }
  return y;
}

double sum(const std::vector<double> &v) {
  double s = 0;
  for (double x : v)
    s += x;
  return s;
}

void checkGradient(const Case &c, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-2, 2);
  std::vector<TensorData> inputs;
  size_t count = c.b.empty() ? 1 : 2;
  for (size_t k = 0; k < count; ++k) {
    const Shape &s = k == 0 ? c.a : c.b;
    TensorData t(TensorInfo(DataType::DOUBLE, s));
    for (int64_t i = 0; i < t.info().elementCount(); ++i) {
      double v = d(rng);
      bool kink = c.type == "Relu" || c.type == "Selu" || (c.type == "PRelu" && k == 0);
      if (kink && std::fabs(v) < 0.1) v += 0.3; // keep away from the kink
      if (c.type == "Div" && k == 1 && std::fabs(v) < 0.5) v = v < 0 ? v - 0.5 : v + 0.5;
      t.as<double>()[i] = v;
    }
    inputs.push_back(std::move(t));
  }
  std::vector<std::vector<double>> analytic;
  evaluate(c, inputs, true, &analytic);
  ASSERT_EQ(analytic.size(), inputs.size()) << c.type;
  const double h = 1e-6;
  for (size_t which = 0; which < inputs.size(); ++which)
    for (int64_t i = 0; i < inputs[which].info().elementCount(); ++i) {
      std::vector<TensorData> plus = inputs, minus = inputs;
      plus[which].as<double>()[i] += h;
      minus[which].as<double>()[i] -= h;
      double numeric = (sum(evaluate(c, plus, false, nullptr)) - sum(evaluate(c, minus, false, nullptr))) / (2 * h);
      ASSERT_NEAR(analytic[which][static_cast<size_t>(i)], numeric, 1e-5 * (1 + std::fabs(numeric)))
          << c.type << " d/d" << (which ? "b" : "a") << "[" << i << "] seed " << seed;
    }
}

} // namespace

TEST(Autodiff, BinaryRulesWithBroadcastingMatchFiniteDifferences) {
  for (const char *type : {"Add", "Sub", "Mul", "Div"}) {
    checkGradient({type, {2, 3}, {2, 3}}, 1);
    checkGradient({type, {2, 3}, {3}}, 2);
    checkGradient({type, {2, 1, 4}, {3, 1}}, 3);
  }
}

TEST(Autodiff, UnaryRulesMatchFiniteDifferences) {
  for (const char *type : {"Neg", "Exp", "Tanh", "Sigmoid", "Relu", "Identity", "Erf"})
    checkGradient({type, {3, 4}, {}}, 7);
}

TEST(Autodiff, ParametricActivationsAndPooling) {
  checkGradient({"Selu", {3, 4}, {}}, 11);
  checkGradient({"PRelu", {2, 3, 4}, {3, 1}}, 12);
  checkGradient({"PRelu", {2, 3}, {3}}, 13);
  checkGradient({"GlobalAveragePool", {2, 3, 4, 5}, {}}, 14);
}

TEST(Autodiff, MissingRuleIsNamed) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.addTensor("a", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {3}));
  g.addInput("a");
  g.addOp("Round", "", 13, "round1", {}, {"a"}, {"y"});
  ir::inferShapes(g, nullptr);
  try {
    autodiff::buildGradients(g, "y", {"a"});
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("Round 'round1': no gradient rule for Round"), std::string::npos) << e.what();
  }
}
