// Gradient rules checked against central finite differences, in double.

#include "gradcheck.hpp"

#include "autodiff/autodiff.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>

using namespace popart;

namespace {

/// Graph: inputs a (and b) as streams → op → y; the loss is Σ y.
struct Case {
  std::string type;
  Shape a, b; // b empty: unary
};

void checkGradient(const Case &c, unsigned seed) {
  gradcheck::Problem p{c.type, 13};
  p.feeds.push_back({"a", TensorData(TensorInfo(DataType::DOUBLE, c.a))});
  if (!c.b.empty()) p.feeds.push_back({"b", TensorData(TensorInfo(DataType::DOUBLE, c.b))});
  p.loss = gradcheck::plainLoss;
  gradcheck::fillStreams(p.feeds, seed, [&](size_t k, double v) {
    bool kink = c.type == "Relu" || c.type == "Selu" || (c.type == "PRelu" && k == 0);
    if (kink && std::fabs(v) < 0.1) v += 0.3; // keep away from the kink
    if (c.type == "Div" && k == 1 && std::fabs(v) < 0.5) v = v < 0 ? v - 0.5 : v + 0.5;
    return v;
  });
  gradcheck::checkGradient(p, seed);
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
  gradcheck::expectGradientError(g, "y", {"a"}, "Round 'round1': no gradient rule for Round");
}
