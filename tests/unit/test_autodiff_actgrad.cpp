// The ai.graphcore grad ops of softmax, layer normalisation and the activations: the rules create
// them (and keep the composition where they do not apply), their gradients match central finite
// differences in double where the other suites do not reach (LayerNormalization with saved but
// unweighted statistics), and their oneDNN kernels match the reference kernels on random fp32 data.

#include "gradcheck.hpp"
#include "kernel_compare.hpp"

#include "backend_cpu/kernel.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

using namespace popart;
using backend_cpu::KernelProvider;

namespace {

using gradcheck::attrs;

/// One forward op: stream inputs of \p shapes, constant inputs \p consts after them (Clip's
/// bounds), \p outputs outputs of which only the first is weighed into the loss.
struct Case {
  std::string type;
  std::vector<Shape> shapes;
  ir::Attributes attrs = {};
  int opset = 17;
  std::vector<TensorData> consts = {};
  size_t outputs = 1;
};

/// y = w·op(x...)[0] with uneven weights w, its inputs (and the constants) in \p type.
gradcheck::Problem problem(const Case &c, DataType type) {
  std::vector<TensorData> consts;
  for (const auto &k : c.consts) // TensorData(): an absent optional input
    consts.push_back(k.data() ? TensorData::fromDoubles(type, {}, k.toDoubleVector()) : TensorData());
  gradcheck::Problem p{c.type, c.opset, c.attrs, gradcheck::streamsThenConsts(c.shapes, type, consts)};
  for (size_t i = 1; i < c.outputs; ++i) {
    p.outs.push_back(std::to_string(i));
    p.outs.back().insert(0, "extra"); // not "extra" + ...: GCC 12 warns falsely (-Wrestrict) on that
  }
  return p;
}

std::unique_ptr<ir::Graph> buildGraph(const Case &c, DataType type, std::vector<TensorId> *grads) {
  return gradcheck::buildGraph(problem(c, type), grads);
}

/// Types of the ops that the gradient added in an fp32 graph of \p c (with their domain's
/// "ai.graphcore." prefix where it applies).
std::vector<std::string> gradOpTypes(const Case &c, DataType type = DataType::FLOAT) {
  auto forward = buildGraph(c, type, nullptr);
  size_t skip = forward->ops().size();
  std::vector<TensorId> grads;
  auto g = buildGraph(c, type, &grads);
  std::vector<std::string> types;
  for (size_t i = 0; i < g->ops().size(); ++i) {
    const auto &op = g->ops()[i];
    if (i < skip && op->domain != "ai.graphcore") continue;
    types.push_back(op->domain == "ai.graphcore" ? "ai.graphcore." + op->type : op->type);
  }
  return types;
}

bool contains(const std::vector<std::string> &v, const std::string &s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

void checkGradient(const Case &c, unsigned seed) {
  SCOPED_TRACE(c.type + " seed " + std::to_string(seed));
  gradcheck::Problem p = problem(c, DataType::DOUBLE);
  gradcheck::fillStreams(p.feeds, seed);
  gradcheck::checkGradient(p, seed);
}

TensorData scalar(double v) { return TensorData::fromDoubles(DataType::DOUBLE, {}, {v}); }

} // namespace

TEST(ActGradRules, SoftmaxFamilyUsesTheGradOps) {
  for (const char *type : {"Softmax", "LogSoftmax"}) {
    std::string grad = std::string("ai.graphcore.") + type + "Grad";
    auto single = gradOpTypes({type, {{2, 3, 4}}, attrs({{"axis", int64_t{1}}})});
    EXPECT_TRUE(contains(single, grad)) << type;
    for (const char *composed : {"ReduceSum", "Sub", "Exp", "Reshape"})
      EXPECT_FALSE(contains(single, composed)) << type << " " << composed;
    // Opset 11's flattened axis: viewed as 2-D around the grad op.
    auto old = gradOpTypes({type, {{2, 3, 4}}, attrs({{"axis", int64_t{1}}}), 11});
    EXPECT_TRUE(contains(old, grad)) << type;
    EXPECT_TRUE(contains(old, "Reshape")) << type;
    EXPECT_FALSE(contains(old, "ReduceSum")) << type;
  }
}

TEST(ActGradRules, LayerNormalizationUsesTheGradOpUnlessStatisticsGetGradients) {
  ir::Attributes a = attrs({{"axis", int64_t{1}}});
  EXPECT_TRUE(contains(gradOpTypes({"LayerNormalization", {{2, 3, 4}, {3, 4}, {3, 4}}, a}),
                       "ai.graphcore.LayerNormalizationGrad"));
  // A scale broadcast over the normalised shape is expanded for it.
  auto broadcast = gradOpTypes({"LayerNormalization", {{2, 3, 4}, {4}}, a});
  EXPECT_TRUE(contains(broadcast, "ai.graphcore.LayerNormalizationGrad"));
  EXPECT_TRUE(contains(broadcast, "Expand"));
  EXPECT_FALSE(contains(broadcast, "ReduceMean"));
}

TEST(ActGradRules, ActivationsUseActivationGradForFloats) {
  for (const char *type : {"Relu", "Elu", "Tanh", "Sigmoid", "Exp", "Sqrt", "LeakyRelu", "Abs"})
    EXPECT_TRUE(contains(gradOpTypes({type, {{3, 4}}}), "ai.graphcore.ActivationGrad")) << type;
  EXPECT_TRUE(
      contains(gradOpTypes({"Clip", {{3, 4}}, {}, 13, {scalar(-1), scalar(0.5)}}), "ai.graphcore.ActivationGrad"));
  // Elu from its output needs alpha >= 0; a bound that a float attribute cannot hold exactly, in
  // double, keeps the composition.
  EXPECT_FALSE(contains(gradOpTypes({"Elu", {{3, 4}}, attrs({{"alpha", -0.5f}})}), "ai.graphcore.ActivationGrad"));
  EXPECT_FALSE(contains(gradOpTypes({"Clip", {{3, 4}}, {}, 13, {scalar(0.1)}}, DataType::DOUBLE),
                        "ai.graphcore.ActivationGrad"));
  EXPECT_TRUE(contains(gradOpTypes({"Clip", {{3, 4}}, {}, 13, {scalar(0.25)}}, DataType::DOUBLE),
                       "ai.graphcore.ActivationGrad"));
}

TEST(ActGradRules, FiniteDifferencesOfTheFallbacksAndNewPaths) {
  // Saved statistics in X's type but no gradient at them: the grad op takes them as inputs.
  for (unsigned seed = 700; seed < 703; ++seed)
    for (int64_t axis : {-1, 1}) {
      ir::Attributes a = attrs({{"axis", axis}, {"epsilon", 0.01f}, {"stash_type", int64_t{11}}});
      Shape norm = axis == 1 ? Shape{3, 4} : Shape{4};
      checkGradient({"LayerNormalization", {{2, 3, 4}, norm, norm}, a, 17, {}, 3}, seed);
      checkGradient({"LayerNormalization", {{2, 3, 4}, {4}}, a, 17, {}, 3}, seed); // scale broadcast
    }
  // Elu with a negative alpha (composition) and Clip with a bound not exact in float.
  checkGradient({"Elu", {{3, 4}}, attrs({{"alpha", -0.5f}})}, 710);
  checkGradient({"Clip", {{3, 5}}, {}, 13, {scalar(0.1), scalar(1.3)}}, 711);
  checkGradient({"Clip", {{3, 5}}, {}, 13, {scalar(-0.75), scalar(1.5)}}, 712);
  // Opset 11's flattened softmax over the last two axes of three.
  for (const char *type : {"Softmax", "LogSoftmax"})
    checkGradient({type, {{2, 3, 4}}, attrs({{"axis", int64_t{1}}}), 11}, 713);
}

namespace {

/// An op of \p type in domain ai.graphcore over float inputs of \p shapes; \p fill gives input i's
/// random values.
struct GradOpCase {
  std::string type;
  std::vector<Shape> shapes;
  ir::Attributes attrs = {};
  size_t outputs = 1;
  std::function<float(size_t input, std::mt19937 &rng)> fill;
};

/// Runs \p c with oneDNN (which must accept it unless \p dnnl is false) and the reference kernel.
void compareKernels(const GradOpCase &c, unsigned seed, bool dnnl = true) {
  SCOPED_TRACE(c.type + " seed " + std::to_string(seed));
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  ir::Graph g;
  std::vector<TensorId> ins, outs;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    ins.push_back(gradcheck::named("x", i));
    g.addTensor(ins.back(), ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, c.shapes[i]));
  }
  for (size_t i = 0; i < c.outputs; ++i) {
    outs.push_back(std::to_string(i));
    outs.back().insert(0, "out");
  }
  ir::Op &op = g.addOp(c.type, "ai.graphcore", 1, "grad", c.attrs, ins, outs);
  op.def->setup(op);
  const backend_cpu::KernelEntry *fast = backend_cpu::KernelRegistry::instance().find(op, KernelProvider::Dnnl);
  ASSERT_EQ(fast != nullptr, dnnl) << c.type << ": oneDNN " << (dnnl ? "declined" : "accepted") << " it";
  if (!fast) return;
  std::mt19937 rng(seed);
  kernel_compare::expectDnnlMatchesReference(op, rng, c.fill);
}

float uniform(std::mt19937 &rng, float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }

} // namespace

TEST(DnnlVsReference, SoftmaxGradKernels) {
  auto fill = [](size_t, std::mt19937 &rng) { return uniform(rng, -2.f, 2.f); };
  unsigned seed = 800;
  for (const char *type : {"SoftmaxGrad", "LogSoftmaxGrad"})
    for (int64_t axis : {-1, 0, 1}) {
      // A last-axis f32 SoftmaxGrad runs the reference row pass (RowSoftmaxGrad tests it).
      bool last = std::string(type) == "SoftmaxGrad" && (axis == -1);
      compareKernels({type, {{4, 7, 5}, {4, 7, 5}}, attrs({{"axis", axis}}), 1, fill}, ++seed, !last);
      bool last2 = std::string(type) == "SoftmaxGrad" && axis != 0;
      compareKernels({type, {{64, 33}, {64, 33}}, attrs({{"axis", axis == 0 ? int64_t{0} : int64_t{1}}}), 1, fill},
                     ++seed, !last2);
    }
}

TEST(DnnlVsReference, LayerNormalizationGradKernel) {
  unsigned seed = 820;
  for (int64_t axis : {-1, 1, 2}) {
    Shape x{3, 5, 8}, norm(x.begin() + (axis < 0 ? 2 : axis), x.end());
    ir::Attributes a = attrs({{"axis", axis}, {"epsilon", 1e-3f}});
    auto fill = [](size_t, std::mt19937 &rng) { return uniform(rng, -2.f, 2.f); };
    compareKernels({"LayerNormalizationGrad", {x, norm, x}, a, 3, fill}, ++seed);
    // With the forward's Mean and InvStdDev (positive) given.
    Shape stat = x;
    for (size_t d = static_cast<size_t>(axis < 0 ? 2 : axis); d < x.size(); ++d)
      stat[d] = 1;
    auto withStats = [](size_t i, std::mt19937 &rng) {
      return i == 4 ? uniform(rng, 0.3f, 3.f) : uniform(rng, -2.f, 2.f);
    };
    compareKernels({"LayerNormalizationGrad", {x, norm, x, stat, stat}, a, 3, withStats}, ++seed);
  }
  auto fill = [](size_t, std::mt19937 &rng) { return uniform(rng, -2.f, 2.f); };
  compareKernels({"LayerNormalizationGrad", {{16, 256}, {256}, {16, 256}}, attrs({}), 3, fill}, ++seed);
}

TEST(DnnlVsReference, ActivationGradKernels) {
  // Input 0 is Y or X: values in each activation's range, with exact zeros and, for Clip, exact
  // bounds mixed in so that the conventions at the kinks are compared too.
  auto mixed = [](std::vector<float> specials, float lo, float hi) {
    return [specials, lo, hi](size_t i, std::mt19937 &rng) {
      if (i == 0 && !specials.empty() && rng() % 4 == 0) return specials[rng() % specials.size()];
      return i == 0 ? uniform(rng, lo, hi) : uniform(rng, -2.f, 2.f);
    };
  };
  struct Act {
    const char *name;
    ir::Attributes attrs;
    std::function<float(size_t, std::mt19937 &)> fill;
  };
  std::vector<Act> acts{
      {"Relu", {}, mixed({0.f}, 0.f, 3.f)},
      {"Elu", attrs({{"alpha", 0.7f}}), mixed({0.f}, -0.69f, 3.f)},
      {"Elu", attrs({{"alpha", 0.f}}), mixed({0.f}, 0.f, 3.f)},
      {"Tanh", {}, mixed({}, -1.f, 1.f)},
      {"Sigmoid", {}, mixed({}, 0.f, 1.f)},
      {"Exp", {}, mixed({}, 0.f, 5.f)},
      {"Sqrt", {}, mixed({}, 0.1f, 3.f)},
      {"LeakyRelu", attrs({{"alpha", 0.2f}}), mixed({0.f}, -3.f, 3.f)},
      {"LeakyRelu", attrs({{"alpha", -0.5f}}), mixed({0.f}, -3.f, 3.f)},
      {"Abs", {}, mixed({0.f}, -3.f, 3.f)},
      {"Clip", attrs({{"alpha", -0.5f}, {"beta", 1.25f}}), mixed({-0.5f, 1.25f}, -2.f, 2.f)},
      {"Clip", attrs({{"alpha", 0.f}, {"beta", INFINITY}}), mixed({0.f, INFINITY}, -2.f, 2.f)},
      {"Gelu", {}, mixed({0.f}, -5.f, 5.f)},
  };
  unsigned seed = 840;
  for (auto &act : acts) {
    ir::Attributes a = act.attrs;
    a.set("activation", std::string(act.name));
    for (const Shape &s : {Shape{7, 13}, Shape{2, 3, 4, 5}})
      compareKernels({"ActivationGrad", {s, s}, a, 1, act.fill}, ++seed);
  }
  // No lower bound: oneDNN's clip cannot give x = −inf its gradient; min > max: oneDNN wants
  // alpha <= beta. Both declined.
  auto fill = mixed({}, -2.f, 2.f);
  for (auto [lo, hi] : {std::pair{-INFINITY, 1.f}, std::pair{1.f, -1.f}})
    compareKernels({"ActivationGrad",
                    {{4, 4}, {4, 4}},
                    attrs({{"activation", std::string("Clip")}, {"alpha", lo}, {"beta", hi}}),
                    1,
                    fill},
                   ++seed, false);
}

TEST(ActGradOps, SetupChecksInputs) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.addTensor("y", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3}));
  g.addTensor("dy", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {3, 2}));
  ir::Op &op = g.addOp("SoftmaxGrad", "ai.graphcore", 1, "sg", {}, {"y", "dy"}, {"dx"});
  EXPECT_THROW(op.def->setup(op), error);
  g.addTensor("dy2", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3}));
  ir::Op &act = g.addOp("ActivationGrad", "ai.graphcore", 1, "ag", attrs({{"activation", std::string("Softsign")}}),
                        {"y", "dy2"}, {"dx2"});
  try {
    act.def->setup(act);
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("activation 'Softsign' has no ActivationGrad form"), std::string::npos)
        << e.what();
  }
}
