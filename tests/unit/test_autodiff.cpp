// Gradient rules checked against central finite differences, in double.

#include "gradcheck.hpp"

#include "autodiff/autodiff.hpp"
#include "autodiff/grad_rules.hpp"
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
  gradcheck::expectGradientError(g, "y", {"a"}, "Round 'round1': no gradient rule for ai.onnx Round at opset 13");
}

TEST(Autodiff, RulesAreKeyedByDomainTypeAndOpset) {
  // ai.graphcore Gelu has a rule; an ai.onnx op of the same type (ONNX's Gelu-20) must not take it.
  // The op registry defines no ai.onnx Gelu yet, and registering one here would leave a definition
  // without kernels in this process's registry, so the op is the ai.graphcore one moved into ai.onnx
  // opset 20 (its setup is that of ONNX's Gelu: a float unary op).
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 20;
  g.addTensor("a", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {3}));
  g.addInput("a");
  ir::Op &gelu = g.addOp("Gelu", "ai.graphcore", 1, "gelu20", {}, {"a"}, {"y"});
  gelu.domain = "ai.onnx";
  gelu.version = 20;
  ir::inferShapes(g, nullptr);
  gradcheck::expectGradientError(g, "y", {"a"}, "Gelu 'gelu20': no gradient rule for ai.onnx Gelu at opset 20");
  EXPECT_FALSE(autodiff::hasGradient("ai.onnx", "Gelu", 20));
  EXPECT_FALSE(autodiff::hasGradient("", "Gelu", 20));
  EXPECT_TRUE(autodiff::hasGradient("ai.graphcore", "Gelu", 1));
  EXPECT_TRUE(autodiff::hasGradient("", "Relu", 6)); // "" is ai.onnx

  // The ai.graphcore one still differentiates, against finite differences.
  gradcheck::Problem p{"Gelu", 1};
  p.domain = "ai.graphcore";
  p.feeds = gradcheck::streamsThenConsts({{3, 4}}, DataType::DOUBLE);
  p.loss = gradcheck::plainLoss;
  gradcheck::fillStreams(p.feeds, 21, [](size_t, double v) { return 3 * v; });
  gradcheck::checkGradient(p, 21);
}

TEST(Autodiff, RuleRegistryMatchesOpsetRanges) {
  autodiff::GradRuleRegistry r; // not the global one: these rules are for this test only
  auto rule = [](autodiff::GradContext &) {};
  r.add({"test.domain", "Op", 1, 5, rule});
  r.add({"test.domain", "Op", 6, 1000, rule});
  r.add({"", "Op", 3, 4, rule});
  EXPECT_NE(r.find("test.domain", "Op", 5), nullptr);
  EXPECT_NE(r.find("test.domain", "Op", 6), nullptr);
  EXPECT_NE(r.find("ai.onnx", "Op", 3), nullptr);
  EXPECT_EQ(r.find("ai.onnx", "Op", 2), nullptr);
  EXPECT_EQ(r.find("ai.onnx", "Op", 5), nullptr);
  EXPECT_EQ(r.find("other.domain", "Op", 3), nullptr);
  EXPECT_EQ(autodiff::ruleCoverage(r, "test.domain", "Op", {{1, 12}, {13, 1000}}), "yes");
  EXPECT_EQ(autodiff::ruleCoverage(r, "ai.onnx", "Op", {{1, 12}}), "opsets 3-4");
  EXPECT_EQ(autodiff::ruleCoverage(r, "ai.onnx", "Op", {{5, 1000}}), "no");
  r.add({"ai.onnx", "Op", 9, 1000, rule});
  EXPECT_EQ(autodiff::ruleCoverage(r, "ai.onnx", "Op", {{1, 6}, {7, 1000}}), "opsets 3-4, 9+");
  try {
    r.add({"ai.onnx", "Op", 4, 8, rule});
    FAIL() << "an overlapping rule was accepted";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("ai.onnx::Op opsets 4-8 overlap an earlier rule (opsets 3-4)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Autodiff, OpsDocGradientColumnFollowsTheOpsets) {
  EXPECT_EQ(autodiff::gradientSupport("ai.onnx", "Softmax", {{1, 12}, {13, 1000}}), "yes");
  EXPECT_EQ(autodiff::gradientSupport("ai.onnx", "Round", {{11, 1000}}), "no");
  EXPECT_EQ(autodiff::gradientSupport("ai.onnx", "Gelu", {{20, 1000}}), "no");
  EXPECT_EQ(autodiff::gradientSupport("ai.graphcore", "Gelu", {{1, 1000}}), "yes");
  EXPECT_EQ(autodiff::gradientSupport("ai.onnx", "Loop", {{1, 1000}}), "unrolled");
}
