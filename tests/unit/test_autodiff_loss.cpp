// Gradient rules of the loss and normalisation ops, checked against central finite differences
// in double.

#include "gradcheck.hpp"

#include <gtest/gtest.h>

#include "autodiff/autodiff.hpp"
#include "autodiff/grad_rules.hpp"

#include <algorithm>
#include <set>
#include <cmath>
#include <random>

using namespace popart;

namespace {

/// An op input: random double data that gets a gradient (data undefined), a fixed constant, or omitted.
struct Input {
  Shape shape;
  TensorData constant;
  bool omitted = false;
  bool positive = false; ///< random values in [0.5, 2.5] (variances)
  static Input stream(Shape s, bool pos = false) { return {std::move(s), TensorData(), false, pos}; }
  static Input fixed(TensorData t) { return {t.info().shape(), std::move(t), false, false}; }
  static Input none() { return {{}, TensorData(), true, false}; }
  bool isStream() const { return !omitted && constant.info().dataType() == DataType::UNDEFINED; }
};

struct Case {
  std::string type;
  std::vector<Input> inputs;
  ir::Attributes attrs;
  int opset = 17;
  /// Outputs that exist; the loss is a weighted sum of all of them.
  size_t outputs = 1;
};

/// Loss = Σ_k Σ w_k·y_k over all outputs, with uneven weights w_k.
void checkGradient(const Case &c, unsigned seed) {
  SCOPED_TRACE(testing::Message() << c.type << " seed " << seed);
  gradcheck::Problem p{c.type, c.opset, c.attrs};
  std::vector<bool> positive;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Input &in = c.inputs[i];
    if (in.omitted)
      p.feeds.push_back({"", TensorData(), false});
    else if (in.isStream())
      p.feeds.push_back({gradcheck::named("in", i), TensorData(TensorInfo(DataType::DOUBLE, in.shape))});
    else
      p.feeds.push_back({gradcheck::named("in", i), in.constant, false});
    if (in.isStream()) positive.push_back(in.positive);
  }
  p.outs.clear();
  for (size_t k = 0; k < c.outputs; ++k)
    p.outs.push_back(gradcheck::named("y", k));
  p.loss = gradcheck::weightedSumLoss(c.outputs);
  gradcheck::fillStreams(p.feeds, seed, [&](size_t k, double v) { return positive[k] ? std::fabs(v) * 0.5 + 0.5 : v; });
  gradcheck::checkGradient(p, seed);
}

Shape randomShape(std::mt19937 &rng, size_t rank, int64_t lo = 1) {
  std::uniform_int_distribution<int64_t> d(lo, 4);
  Shape s;
  for (size_t i = 0; i < rank; ++i)
    s.push_back(d(rng));
  return s;
}

/// Labels in [0, C) with some set to \p ignore (if any), for scores of shape \p x.
TensorData labels(std::mt19937 &rng, const Shape &x, int64_t ignore, bool hasIgnore) {
  Shape s = x;
  s.erase(s.begin() + 1);
  TensorData t(TensorInfo(DataType::INT64, s));
  std::uniform_int_distribution<int64_t> cls(0, x[1] - 1);
  for (int64_t i = 0; i < t.info().elementCount(); ++i)
    t.as<int64_t>()[i] = hasIgnore && i % 3 == 1 ? ignore : cls(rng);
  // Keep one non-ignored label so that the mean's denominator is not zero.
  if (hasIgnore && t.info().elementCount() > 0 && ignore >= 0 && ignore < x[1])
    t.as<int64_t>()[0] = (ignore + 1) % x[1] == ignore ? ignore : (ignore + 1) % x[1];
  return t;
}

void lossCases(const char *type, size_t outputs, unsigned seedBase) {
  unsigned seed = seedBase;
  for (const char *reduction : {"none", "sum", "mean"})
    for (size_t rank : {2, 3, 4})
      for (int variant = 0; variant < 3; ++variant) { // plain, weighted, weighted + ignore_index
        ++seed;
        std::mt19937 rng(seed);
        Shape x = randomShape(rng, rank);
        x[1] = std::max<int64_t>(x[1], 2);
        ir::Attributes a;
        a.set("reduction", std::string(reduction));
        int64_t ignore = variant == 2 ? (seed % 2 ? 1 : -100) : 0;
        if (variant == 2) a.set("ignore_index", ignore);
        std::vector<Input> in{Input::stream(x), Input::fixed(labels(rng, x, ignore, variant == 2))};
        if (variant >= 1) {
          std::vector<double> w(static_cast<size_t>(x[1]));
          for (size_t k = 0; k < w.size(); ++k)
            w[k] = 0.5 + 0.3 * static_cast<double>(k);
          in.push_back(Input::fixed(TensorData::fromDoubles(DataType::DOUBLE, {x[1]}, w)));
        }
        // NLL takes log-probabilities, but its gradient does not depend on that.
        checkGradient({type, in, a, 13, outputs}, seed);
      }
}

} // namespace

TEST(AutodiffLoss, NegativeLogLikelihoodLoss) { lossCases("NegativeLogLikelihoodLoss", 1, 100); }

TEST(AutodiffLoss, SoftmaxCrossEntropyLoss) { lossCases("SoftmaxCrossEntropyLoss", 1, 200); }

TEST(AutodiffLoss, SoftmaxCrossEntropyLossWithLogProb) { lossCases("SoftmaxCrossEntropyLoss", 2, 300); }

TEST(AutodiffNorm, LayerNormalization) {
  for (unsigned seed = 400; seed < 404; ++seed) {
    std::mt19937 rng(seed);
    Shape x = randomShape(rng, 3, 2);
    for (int64_t axis : {-1, 1, 0}) {
      Shape tail(x.begin() + (axis < 0 ? axis + 3 : axis), x.end());
      ir::Attributes a;
      a.set("axis", axis);
      a.set("epsilon", 0.01f);
      a.set("stash_type", int64_t{11}); // double statistics, so that the loss can weigh them
      checkGradient({"LayerNormalization", {Input::stream(x), Input::stream(tail), Input::stream(tail)}, a}, seed);
      checkGradient({"LayerNormalization", {Input::stream(x), Input::stream(tail)}, a}, seed);
      checkGradient({"LayerNormalization", {Input::stream(x), Input::stream(tail), Input::stream(tail)}, a, 17, 3},
                    seed);
    }
  }
}

TEST(AutodiffNorm, InstanceNormalization) {
  for (unsigned seed = 500; seed < 504; ++seed) {
    std::mt19937 rng(seed);
    Shape x = randomShape(rng, 3 + seed % 2, 2);
    ir::Attributes a;
    a.set("epsilon", 0.01f);
    checkGradient({"InstanceNormalization", {Input::stream(x), Input::stream({x[1]}), Input::stream({x[1]})}, a, 13},
                  seed);
  }
}

TEST(AutodiffNorm, BatchNormalizationInference) {
  for (unsigned seed = 600; seed < 604; ++seed) {
    std::mt19937 rng(seed);
    Shape x = randomShape(rng, 2 + seed % 3);
    Shape c{x[1]};
    ir::Attributes a;
    a.set("epsilon", 0.01f);
    checkGradient({"BatchNormalization",
                   {Input::stream(x), Input::stream(c), Input::stream(c), Input::stream(c), Input::stream(c, true)},
                   a,
                   15},
                  seed);
  }
}

TEST(AutodiffLoss, SoftmaxCrossEntropyGradientIsOneFusedOp) {
  for (bool withLogProb : {false, true}) {
    ir::registerBuiltinOps();
    ir::Graph g;
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4, 5}));
    g.addInput("x");
    g.addConst("labels", TensorData::fromInt64({4}, {0, 3, 4, 1}));
    ir::Attributes a;
    a.set("reduction", std::string("mean"));
    ir::Op &sce = g.addOp("SoftmaxCrossEntropyLoss", "ai.onnx", 13, "", a, {"x", "labels"},
                          {"loss", withLogProb ? "logp" : ""});
    sce.def->setup(sce);
    TensorId y = "loss";
    if (withLogProb) { // a loss that also uses the log-probabilities: the composition handles it
      ir::Op &sum = g.addOp("ReduceSum", "ai.onnx", 13, "", autodiff::intAttr("keepdims", 0), {"logp"}, {"s"});
      sum.def->setup(sum);
      ir::Op &add = g.addOp("Add", "ai.onnx", 13, "", {}, {"loss", "s"}, {"total"});
      add.def->setup(add);
      y = "total";
    }
    autodiff::buildGradients(g, y, {"x"});
    std::multiset<std::string> types;
    for (const auto &op : g.ops())
      types.insert(op->type);
    EXPECT_EQ(types.count("SoftmaxCrossEntropyLossGrad"), withLogProb ? 0u : 1u);
    EXPECT_EQ(types.count("Exp"), withLogProb ? 1u : 0u);
  }
}
