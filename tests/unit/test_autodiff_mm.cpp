// Gradient rules of matmul, reduce, softmax and the remaining elementwise ops, checked against
// central finite differences in double.

#include "gradcheck.hpp"

#include "autodiff/autodiff.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

using namespace popart;

namespace {

/// One op whose stream inputs (x0, x1, ...) get gradients; constInputs follow them (e.g. axes).
struct Case {
  Case(std::string t, std::vector<Shape> s, ir::Attributes a = {}, std::vector<TensorData> k = {}, int o = 13,
       std::function<double(size_t, double)> adj = {})
      : type(std::move(t)), shapes(std::move(s)), attrs(std::move(a)), constInputs(std::move(k)), opset(o),
        adjust(std::move(adj)) {}
  std::string type;
  std::vector<Shape> shapes;
  ir::Attributes attrs;
  std::vector<TensorData> constInputs;
  int opset = 13;
  /// Value transform applied to the random inputs (keeps data away from kinks / out of domain).
  std::function<double(size_t input, double v)> adjust;
};

/// y = w·op(x..., k...) with uneven weights w: a plain Σ y has zero gradient through Softmax.
void checkGradient(const Case &c, unsigned seed) {
  gradcheck::Problem p{c.type, c.opset, c.attrs,
                       gradcheck::streamsThenConsts(c.shapes, DataType::DOUBLE, c.constInputs)};
  gradcheck::fillStreams(p.feeds, seed, c.adjust);
  gradcheck::checkGradient(p, seed);
}

Shape randomShape(std::mt19937 &rng, size_t rank) {
  std::uniform_int_distribution<int64_t> d(1, 4);
  Shape s;
  for (size_t i = 0; i < rank; ++i)
    s.push_back(d(rng));
  return s;
}

using gradcheck::attrs;

TensorData axes(std::vector<int64_t> v) { return TensorData::fromInt64({static_cast<int64_t>(v.size())}, v); }

} // namespace

TEST(AutodiffMatMul, TwoDAndBatchedWithBroadcasting) {
  for (unsigned seed = 1; seed <= 4; ++seed) {
    std::mt19937 rng(seed);
    Shape m = randomShape(rng, 3); // M, K, N
    checkGradient({"MatMul", {{m[0], m[1]}, {m[1], m[2]}}}, seed);
    Shape batch = randomShape(rng, 2);
    checkGradient({"MatMul", {{batch[0], batch[1], m[0], m[1]}, {batch[1], m[1], m[2]}}}, seed);
    checkGradient({"MatMul", {{batch[0], 1, m[0], m[1]}, {1, batch[1], m[1], m[2]}}}, seed);
    checkGradient({"MatMul", {{m[0], m[1]}, {batch[0], m[1], m[2]}}}, seed);
  }
}

TEST(AutodiffMatMul, OneDOperands) {
  checkGradient({"MatMul", {{3}, {3, 4}}}, 11);
  checkGradient({"MatMul", {{2, 3, 4}, {4}}}, 12);
  checkGradient({"MatMul", {{5}, {2, 5, 3}}}, 13);
  checkGradient({"MatMul", {{4}, {4}}}, 14);
}

TEST(AutodiffMatMul, Gemm) {
  unsigned seed = 20;
  for (int64_t ta : {0, 1})
    for (int64_t tb : {0, 1}) {
      Shape a = ta ? Shape{4, 3} : Shape{3, 4}, b = tb ? Shape{5, 4} : Shape{4, 5};
      ir::Attributes at = attrs({{"transA", ta}, {"transB", tb}, {"alpha", 0.7f}, {"beta", 1.5f}});
      checkGradient({"Gemm", {a, b, {3, 5}}, at}, ++seed);
      checkGradient({"Gemm", {a, b, {5}}, at}, ++seed);
      checkGradient({"Gemm", {a, b, {3, 1}}, at}, ++seed);
      checkGradient({"Gemm", {a, b}, at}, ++seed);
    }
}

TEST(AutodiffReduce, L2LogSumExpMaxMin) {
  for (const char *type : {"ReduceL2", "ReduceLogSumExp", "ReduceMax", "ReduceMin"})
    for (unsigned seed = 60; seed < 63; ++seed) {
      std::mt19937 rng(seed);
      Shape s = randomShape(rng, 3);
      for (int64_t keep : {0, 1}) {
        ir::Attributes k = attrs({{"keepdims", keep}});
        checkGradient({type, {s}, k, {axes({1})}}, seed);
        checkGradient({type, {s}, k}, seed); // all axes
      }
    }
}

TEST(AutodiffPool, MaxPool) {
  ir::Attributes k2 = attrs({{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}});
  checkGradient({"MaxPool", {{2, 3, 4, 6}}, k2}, 90);
  ir::Attributes overlap = attrs({{"kernel_shape", std::vector<int64_t>{3, 3}},
                                  {"strides", std::vector<int64_t>{1, 2}},
                                  {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  checkGradient({"MaxPool", {{1, 2, 5, 5}}, overlap}, 91);
}

TEST(AutodiffReduce, CumSum) {
  for (int64_t exclusive : {0, 1})
    for (int64_t reverse : {0, 1}) {
      ir::Attributes a = attrs({{"exclusive", exclusive}, {"reverse", reverse}});
      checkGradient({"CumSum", {{3, 4}}, a, {axes({1})}}, 70 + static_cast<unsigned>(2 * exclusive + reverse));
      checkGradient({"CumSum", {{2, 3, 2}}, a, {axes({0})}}, 80 + static_cast<unsigned>(2 * exclusive + reverse));
    }
}

TEST(AutodiffReduce, SumAndMean) {
  for (const char *type : {"ReduceSum", "ReduceMean"})
    for (unsigned seed = 30; seed < 34; ++seed) {
      std::mt19937 rng(seed);
      Shape s = randomShape(rng, 3);
      for (int64_t keep : {0, 1}) {
        ir::Attributes k = attrs({{"keepdims", keep}});
        checkGradient({type, {s}, k, {axes({1})}}, seed);
        checkGradient({type, {s}, k, {axes({-1, 0})}}, seed);
        checkGradient({type, {s}, k}, seed); // all axes
      }
      checkGradient({type, {s}, attrs({{"noop_with_empty_axes", int64_t{1}}})}, seed);
    }
}

TEST(AutodiffReduce, ReduceMeanAxesAttributeOfOldOpsets) {
  Case c{"ReduceMean", {{2, 3, 4}}, attrs({{"axes", std::vector<int64_t>{0, 2}}, {"keepdims", int64_t{0}}})};
  checkGradient(c, 40);
}

TEST(AutodiffSoftmax, SoftmaxAndLogSoftmax) {
  for (const char *type : {"Softmax", "LogSoftmax"})
    for (unsigned seed = 50; seed < 53; ++seed) {
      std::mt19937 rng(seed);
      Shape s = randomShape(rng, 3);
      checkGradient({type, {s}}, seed);
      checkGradient({type, {s}, attrs({{"axis", int64_t{0}}})}, seed);
      checkGradient({type, {s}, attrs({{"axis", int64_t{1}}})}, seed);
      Case old{type, {s}, attrs({{"axis", int64_t{1}}}), {}, 11};
      checkGradient(old, seed);
    }
}

TEST(AutodiffElementwise, UnaryRules) {
  auto positive = [](size_t, double v) { return std::fabs(v) + 0.2; };
  auto awayFromZero = [](size_t, double v) { return v < 0 ? v - 0.1 : v + 0.1; };
  unsigned seed = 60;
  for (const char *type : {"Sqrt", "Log", "Reciprocal"})
    checkGradient({type, {{3, 4}}, {}, {}, 13, positive}, ++seed);
  for (const char *type : {"Abs", "LeakyRelu", "Elu"})
    checkGradient({type, {{3, 4}}, {}, {}, 13, awayFromZero}, ++seed);
  checkGradient({"LeakyRelu", {{2, 5}}, attrs({{"alpha", 0.3f}}), {}, 13, awayFromZero}, ++seed);
  checkGradient({"Elu", {{2, 5}}, attrs({{"alpha", 0.5f}}), {}, 13, awayFromZero}, ++seed);
  for (const char *type : {"Softplus", "Sin", "Cos"})
    checkGradient({type, {{3, 4}}}, ++seed);
  // Kinks at ±3 (HardSwish) and where αx + β crosses 0 or 1 (HardSigmoid): values kept off them,
  // spread over [-6, 6] so that every piece is exercised.
  auto offKinks = [](size_t, double v) {
    double x = 6.0 * std::tanh(v);
    for (double k : {-3.0, 3.0, -2.5, 2.5})
      if (std::fabs(x - k) < 0.05) x += 0.1;
    return x;
  };
  checkGradient({"HardSwish", {{4, 6}}, {}, {}, 14, offKinks}, ++seed);
  checkGradient({"HardSigmoid", {{4, 6}}, {}, {}, 13, offKinks}, ++seed);
  checkGradient({"HardSigmoid", {{4, 6}}, attrs({{"alpha", 1.0f / 6}, {"beta", 0.5f}}), {}, 13, offKinks}, ++seed);
}

TEST(AutodiffElementwise, Pow) {
  auto basePositive = [](size_t i, double v) { return i == 0 ? std::fabs(v) + 0.2 : v; };
  checkGradient({"Pow", {{3, 4}, {3, 4}}, {}, {}, 13, basePositive}, 70);
  checkGradient({"Pow", {{2, 3, 4}, {4}}, {}, {}, 13, basePositive}, 71);
  checkGradient({"Pow", {{3, 1}, {}}, {}, {}, 13, basePositive}, 72);
}

TEST(AutodiffElementwise, VariadicSumMeanMaxMin) {
  checkGradient({"Sum", {{2, 3}, {3}, {2, 1}}}, 80);
  checkGradient({"Sum", {{2, 3}}}, 81);
  checkGradient({"Mean", {{2, 3}, {2, 3}, {1, 3}}}, 82);
  // Second input shifted by ±0.5 per element so that no pair is close to a tie.
  auto apart = [](size_t i, double v) { return i == 1 ? v : (v > 0 ? 2.5 : -2.5) + v * 0.1; };
  for (const char *type : {"Max", "Min"}) {
    checkGradient({type, {{3, 4}, {3, 4}}, {}, {}, 13, apart}, 83);
    checkGradient({type, {{3, 4}, {4}}, {}, {}, 13, apart}, 84);
  }
}

TEST(AutodiffElementwise, Clip) {
  // Values at least 0.1 from the bounds ±1.
  auto apart = [](size_t, double v) { return std::fabs(std::fabs(v) - 1) < 0.1 ? v * 1.3 : v; };
  TensorData lo = TensorData::fromDoubles(DataType::DOUBLE, {}, {-1.0});
  TensorData hi = TensorData::fromDoubles(DataType::DOUBLE, {}, {1.0});
  checkGradient({"Clip", {{4, 5}}, {}, {lo, hi}, 13, apart}, 90);
  checkGradient({"Clip", {{4, 5}}, {}, {lo}, 13, apart}, 91);
  checkGradient({"Clip", {{4, 5}}, {}, {TensorData(), hi}, 13, apart}, 92);
  checkGradient({"Clip", {{4, 5}}, {}, {}, 13, apart}, 93);
}

TEST(AutodiffElementwise, MaxOfThreeInputsIsRejectedByName) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  for (const char *id : {"a", "b", "c"}) {
    g.addTensor(id, ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {3}));
    g.addInput(id);
  }
  g.addOp("Max", "", 13, "max1", {}, {"a", "b", "c"}, {"y"});
  ir::inferShapes(g, nullptr);
  gradcheck::expectGradientError(g, "y", {"a"}, "max1");
}
