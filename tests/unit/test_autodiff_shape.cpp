// Gradient rules of shape ops checked against central finite differences, in double.
// The loss is sum(w · y) with random weights w, so that a gradient routed to the wrong element fails.

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

/// One input of the op under test: a differentiable DOUBLE stream, or a constant (shape, axes, indices...).
struct Input {
  TensorData value;
  bool stream = true;
};

struct Case {
  std::string type;
  std::vector<Input> inputs;
  ir::Attributes attrs;
  size_t outputs = 1;
  std::vector<size_t> lossOutputs{0}; ///< outputs that contribute to the loss
};

Input stream(const Shape &s, std::mt19937 &rng) {
  std::uniform_real_distribution<double> d(-2, 2);
  TensorData t(TensorInfo(DataType::DOUBLE, s));
  for (int64_t i = 0; i < t.info().elementCount(); ++i)
    t.as<double>()[i] = d(rng);
  return {std::move(t), true};
}
Input ints(const std::vector<int64_t> &v) {
  return {TensorData::fromInt64({static_cast<int64_t>(v.size())}, v), false};
}
Input intTensor(const Shape &s, const std::vector<int64_t> &v) { return {TensorData::fromInt64(s, v), false}; }

ir::Attributes attr(const char *name, ir::AttributeValue v) {
  ir::Attributes a;
  a.set(name, std::move(v));
  return a;
}

/// Builds a → op → Cast(double) → ·w → flattened and concatenated → loss; returns the loss, and d loss / d streams if
/// asked.
double evaluate(const Case &c, const std::vector<Input> &inputs, const std::vector<TensorData> &weights,
                std::vector<std::vector<double>> *grads) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 17;
  std::vector<TensorId> ids, streams;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TensorId id = std::string("in") + std::to_string(i);
    if (inputs[i].stream) {
      g.addTensor(id, ir::TensorKind::Stream, inputs[i].value.info());
      g.addInput(id);
      streams.push_back(id);
    } else {
      g.addConst(id, inputs[i].value);
    }
    ids.push_back(id);
  }
  std::vector<TensorId> outs;
  for (size_t k = 0; k < c.outputs; ++k)
    outs.push_back(std::string("y") + std::to_string(k));
  g.addOp(c.type, "", 17, "op", c.attrs, ids, outs);
  ir::inferShapes(g, nullptr);
  std::vector<TensorId> terms;
  for (size_t k : c.lossOutputs) {
    ir::Attributes to;
    to.set("to", static_cast<int64_t>(DataType::DOUBLE));
    TensorId yd = std::string("yd") + std::to_string(k), w = std::string("w") + std::to_string(k),
             t = std::string("t") + std::to_string(k);
    g.addOp("Cast", "", 17, "", to, {outs[k]}, {yd});
    g.addConst(w, weights[k]);
    g.addOp("Mul", "", 17, "", {}, {yd, w}, {t});
    terms.push_back(t);
  }
  // The terms may differ in shape: flatten and concatenate them; the seed gradient of ones sums them.
  std::vector<TensorId> flat;
  g.addConst("minus1", TensorData::fromInt64({1}, {-1}));
  for (const auto &t : terms) {
    flat.push_back(t + "_flat");
    g.addOp("Reshape", "", 17, "", {}, {t, "minus1"}, {flat.back()});
  }
  g.addOp("Concat", "", 17, "", attr("axis", int64_t{0}), flat, {"loss"});
  g.addOutput("loss");
  ir::inferShapes(g, nullptr);
  std::vector<TensorId> gradIds;
  if (grads) {
    gradIds = autodiff::buildGradients(g, "loss", streams);
    for (const auto &id : gradIds)
      g.addOutput(id);
    ir::inferShapes(g, nullptr);
  }
  backend_cpu::ExecutionPlan plan(g, {});
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].stream)
      std::memcpy(plan.address(ids[i]), inputs[i].value.data(), static_cast<size_t>(inputs[i].value.byteCount()));
  plan.run();
  double loss = 0;
  const auto *l = static_cast<const double *>(plan.address("loss"));
  for (int64_t i = 0; i < plan.info("loss").elementCount(); ++i)
    loss += l[i];
  if (grads) {
    grads->clear();
    for (const auto &id : gradIds) {
      const auto *p = static_cast<const double *>(plan.address(id));
      grads->emplace_back(p, p + plan.info(id).elementCount());
    }
  }
  return loss;
}

/// Output shapes, found by shape inference on the op alone.
std::vector<Shape> outputShapes(const Case &c) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 17;
  std::vector<TensorId> ids;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    TensorId id = std::string("in") + std::to_string(i);
    g.addConst(id, c.inputs[i].value);
    ids.push_back(id);
  }
  std::vector<TensorId> outs;
  for (size_t k = 0; k < c.outputs; ++k)
    outs.push_back(std::string("y") + std::to_string(k));
  ir::Op &op = g.addOp(c.type, "", 17, "op", c.attrs, ids, outs);
  op.def->setup(op);
  std::vector<Shape> shapes;
  for (size_t k = 0; k < c.outputs; ++k)
    shapes.push_back(op.outInfo(k).shape());
  return shapes;
}

void checkGradient(const Case &c, unsigned seed, double tol = 1e-5) {
  std::mt19937 rng(seed * 7919 + 1);
  std::vector<Shape> shapes = outputShapes(c);
  std::vector<TensorData> weights;
  for (const Shape &s : shapes)
    weights.push_back(stream(s, rng).value);
  std::vector<std::vector<double>> analytic;
  evaluate(c, c.inputs, weights, &analytic);
  const double h = 1e-6;
  size_t which = 0;
  for (size_t in = 0; in < c.inputs.size(); ++in) {
    if (!c.inputs[in].stream) continue;
    ASSERT_LT(which, analytic.size()) << c.type << " seed " << seed;
    for (int64_t i = 0; i < c.inputs[in].value.info().elementCount(); ++i) {
      std::vector<Input> plus = c.inputs, minus = c.inputs;
      plus[in].value.as<double>()[i] += h;
      minus[in].value.as<double>()[i] -= h;
      double numeric = (evaluate(c, plus, weights, nullptr) - evaluate(c, minus, weights, nullptr)) / (2 * h);
      ASSERT_NEAR(analytic[which][static_cast<size_t>(i)], numeric, tol * (1 + std::fabs(numeric)))
          << c.type << " d/d input " << in << "[" << i << "] seed " << seed;
    }
    ++which;
  }
}

Shape randomShape(std::mt19937 &rng, size_t rank, int64_t lo = 1, int64_t hi = 4) {
  std::uniform_int_distribution<int64_t> d(lo, hi);
  Shape s;
  for (size_t i = 0; i < rank; ++i)
    s.push_back(d(rng));
  return s;
}

} // namespace

TEST(AutodiffShape, ReshapeFamily) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    std::mt19937 rng(seed);
    Shape s = randomShape(rng, 3);
    checkGradient({"Reshape", {stream(s, rng), ints({-1})}, {}}, seed);
    checkGradient({"Flatten", {stream(s, rng)}, attr("axis", int64_t{2})}, seed);
    Shape with1 = {s[0], 1, s[2]};
    checkGradient({"Squeeze", {stream(with1, rng), ints({1})}, {}}, seed);
    checkGradient({"Unsqueeze", {stream(s, rng), ints({0, -1})}, {}}, seed);
  }
}

TEST(AutodiffShape, Transpose) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    std::mt19937 rng(seed);
    checkGradient({"Transpose", {stream(randomShape(rng, 3, 2, 4), rng)}, attr("perm", std::vector<int64_t>{1, 2, 0})},
                  seed);
    checkGradient({"Transpose", {stream(randomShape(rng, 3, 2, 4), rng)}, {}}, seed);
  }
}

TEST(AutodiffShape, ConcatAndSplit) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    std::mt19937 rng(seed);
    Shape a = randomShape(rng, 3), b = a;
    b[1] += 2;
    checkGradient({"Concat", {stream(a, rng), stream(b, rng), stream(a, rng)}, attr("axis", int64_t{-2})}, seed);
    Shape s = randomShape(rng, 2);
    s[1] = 5;
    checkGradient({"Split", {stream(s, rng), ints({2, 3})}, attr("axis", int64_t{1}), 2, {0, 1}}, seed);
    checkGradient({"Split", {stream(s, rng), ints({1, 3, 1})}, attr("axis", int64_t{1}), 3, {1}}, seed);
  }
}

TEST(AutodiffShape, Slice) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    std::mt19937 rng(seed);
    Shape s = randomShape(rng, 3, 3, 6);
    checkGradient({"Slice", {stream(s, rng), ints({1, 0}), ints({-1, 100}), ints({0, 2})}, {}}, seed);
    checkGradient({"Slice", {stream(s, rng), ints({-1, 0}), ints({-100, 5}), ints({1, 2}), ints({-2, 2})}, {}}, seed);
  }
}

TEST(AutodiffShape, GatherWithRepeatedIndices) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    std::mt19937 rng(seed);
    Shape s = randomShape(rng, 3, 2, 4);
    std::uniform_int_distribution<int64_t> pick(-s[1], s[1] - 1);
    std::vector<int64_t> idx(6);
    for (auto &v : idx)
      v = pick(rng);
    idx[1] = idx[0];
    checkGradient({"Gather", {stream(s, rng), intTensor({2, 3}, idx)}, attr("axis", int64_t{1})}, seed);
    checkGradient({"Gather", {stream(s, rng), intTensor({}, {idx[2] < s[0] && idx[2] >= -s[0] ? idx[2] : 0})}, {}},
                  seed);
    Shape is = s;
    is[2] = 5;
    std::uniform_int_distribution<int64_t> pick2(0, s[2] - 1);
    std::vector<int64_t> ge(static_cast<size_t>(is[0] * is[1] * is[2]));
    for (auto &v : ge)
      v = pick2(rng);
    checkGradient({"GatherElements", {stream(s, rng), intTensor(is, ge)}, attr("axis", int64_t{2})}, seed);
  }
}

TEST(AutodiffShape, ExpandTileAndPad) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    std::mt19937 rng(seed);
    checkGradient({"Expand", {stream({3, 1}, rng), ints({2, 3, 4})}, {}}, seed);
    Shape s = randomShape(rng, 3);
    checkGradient({"Tile", {stream(s, rng), ints({2, 1, 3})}, {}}, seed);
    Shape p = randomShape(rng, 2, 3, 5);
    checkGradient({"Pad", {stream(p, rng), ints({1, -1, 2, 0})}, {}}, seed);
    checkGradient(
        {"Pad",
         {stream(p, rng), ints({2, -1}), {TensorData::fromDoubles(DataType::DOUBLE, {}, {3.5}), false}, ints({1})},
         {}},
        seed);
  }
}

TEST(AutodiffShape, WhereCastDropout) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    std::mt19937 rng(seed);
    TensorData cond(TensorInfo(DataType::BOOL, {2, 3}));
    for (int i = 0; i < 6; ++i)
      cond.as<bool>()[i] = (rng() & 1) != 0;
    checkGradient({"Where", {{cond, false}, stream({2, 3}, rng), stream({3}, rng)}, {}}, seed);
    checkGradient({"Cast", {stream({2, 3}, rng)}, attr("to", static_cast<int64_t>(DataType::DOUBLE))}, seed);
    checkGradient({"Dropout", {stream({2, 3}, rng)}, {}}, seed);
    checkGradient({"Dropout",
                   {stream({2, 3}, rng),
                    {TensorData::fromDoubles(DataType::DOUBLE, {}, {0.5}), false},
                    {TensorData::fromDoubles(DataType::BOOL, {}, {0.0}), false}},
                   {},
                   2,
                   {0}},
                  seed);
  }
}

TEST(AutodiffShape, PadGradientRejectsReflectMode) {
  std::mt19937 rng(5);
  Case c{"Pad", {stream({4}, rng), ints({1, 1})}, attr("mode", std::string("reflect"))};
  try {
    std::vector<std::vector<double>> grads;
    evaluate(c, c.inputs, {TensorData::fromDoubles(DataType::DOUBLE, {6}, std::vector<double>(6, 1.0))}, &grads);
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("constant-mode Pad"), std::string::npos) << e.what();
  }
}
