// Gradient rules of the loss and normalisation ops, checked against central finite differences
// in double.

#include "autodiff/autodiff.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

/// \p prefix followed by \p i (written with insert: operator+ trips a GCC 12 -Wrestrict false positive).
std::string named(const char *prefix, size_t i) {
  std::string s = std::to_string(i);
  s.insert(0, prefix);
  return s;
}

struct Case {
  std::string type;
  std::vector<Input> inputs;
  ir::Attributes attrs;
  int opset = 17;
  /// Outputs that exist; the loss is a weighted sum of all of them.
  size_t outputs = 1;
};

std::vector<double> evaluate(const Case &c, const std::vector<TensorData> &streams, bool withGradients,
                             std::vector<std::vector<double>> *grads) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = c.opset;
  std::vector<TensorId> opInputs, streamIds;
  size_t s = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    TensorId id = named("in", i);
    if (c.inputs[i].omitted) {
      opInputs.push_back("");
      continue;
    }
    if (c.inputs[i].isStream()) {
      g.addTensor(id, ir::TensorKind::Stream, streams[s++].info());
      g.addInput(id);
      streamIds.push_back(id);
    } else {
      g.addConst(id, c.inputs[i].constant);
    }
    opInputs.push_back(id);
  }
  std::vector<TensorId> outs;
  for (size_t k = 0; k < c.outputs; ++k)
    outs.push_back(named("y", k));
  g.addOp(c.type, "", c.opset, "op", c.attrs, opInputs, outs);
  ir::inferShapes(g, nullptr);
  // Uneven weights per element so that each output element matters differently.
  std::vector<TensorId> terms;
  for (size_t k = 0; k < c.outputs; ++k) {
    const TensorInfo &info = g.tensor(outs[k]).info();
    std::vector<double> w(static_cast<size_t>(info.elementCount()));
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = 1.0 + 0.37 * static_cast<double>((i + 3 * k) % 7);
    std::string wk = named("w", k), zk = named("z", k), sk = named("s", k);
    g.addConst(wk, TensorData::fromDoubles(DataType::DOUBLE, info.shape(), w));
    g.addOp("Mul", "", c.opset, named("weigh", k), {}, {outs[k], wk}, {zk});
    ir::Attributes keep;
    keep.set("keepdims", int64_t{0});
    g.addOp("ReduceSum", "", c.opset, named("sum", k), keep, {zk}, {sk});
    terms.push_back(sk);
  }
  g.addOp("Sum", "", c.opset, "total", {}, terms, {"y"});
  g.addOutput("y");
  ir::inferShapes(g, nullptr);
  std::vector<TensorId> gradIds;
  if (withGradients) {
    gradIds = autodiff::buildGradients(g, "y", streamIds);
    for (const auto &id : gradIds)
      g.addOutput(id);
    ir::inferShapes(g, nullptr);
  }
  backend_cpu::ExecutionPlan plan(g, {});
  for (size_t i = 0; i < streams.size(); ++i)
    std::memcpy(plan.address(streamIds[i]), streams[i].data(), static_cast<size_t>(streams[i].byteCount()));
  plan.run();
  const auto *yp = static_cast<const double *>(plan.address("y"));
  std::vector<double> y(yp, yp + plan.info("y").elementCount());
  if (grads) {
    grads->clear();
    for (const auto &id : gradIds) {
      EXPECT_EQ(plan.info(id).shape(), streams[grads->size()].info().shape()) << c.type << " gradient " << id;
      const auto *p = static_cast<const double *>(plan.address(id));
      grads->emplace_back(p, p + plan.info(id).elementCount());
    }
  }
  return y;
}

void checkGradient(const Case &c, unsigned seed) {
  SCOPED_TRACE(testing::Message() << c.type << " seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-2, 2);
  std::vector<TensorData> streams;
  for (const auto &in : c.inputs)
    if (in.isStream()) {
      TensorData t(TensorInfo(DataType::DOUBLE, in.shape));
      for (int64_t i = 0; i < t.info().elementCount(); ++i)
        t.as<double>()[i] = in.positive ? std::fabs(d(rng)) * 0.5 + 0.5 : d(rng);
      streams.push_back(std::move(t));
    }
  std::vector<std::vector<double>> analytic;
  evaluate(c, streams, true, &analytic);
  ASSERT_EQ(analytic.size(), streams.size());
  const double h = 1e-6;
  for (size_t which = 0; which < streams.size(); ++which)
    for (int64_t i = 0; i < streams[which].info().elementCount(); ++i) {
      std::vector<TensorData> plus = streams, minus = streams;
      plus[which].as<double>()[i] += h;
      minus[which].as<double>()[i] -= h;
      double numeric = (evaluate(c, plus, false, nullptr)[0] - evaluate(c, minus, false, nullptr)[0]) / (2 * h);
      ASSERT_NEAR(analytic[which][static_cast<size_t>(i)], numeric, 1e-5 * (1 + std::fabs(numeric)))
          << "d/dinput" << which << "[" << i << "]";
    }
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
