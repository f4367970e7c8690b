// Gradient rules of shape ops checked against central finite differences, in double.
// The loss is sum(w · y) with random weights w, so that a gradient routed to the wrong element fails.

#include "gradcheck.hpp"

#include <popart/error.hpp>

#include <gtest/gtest.h>

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

Input stream(const Shape &s, std::mt19937 &rng) { return {gradcheck::randomDoubles(rng, s), true}; }
Input ints(const std::vector<int64_t> &v) {
  return {TensorData::fromInt64({static_cast<int64_t>(v.size())}, v), false};
}
Input intTensor(const Shape &s, const std::vector<int64_t> &v) { return {TensorData::fromInt64(s, v), false}; }

ir::Attributes attr(const char *name, ir::AttributeValue v) {
  ir::Attributes a;
  a.set(name, std::move(v));
  return a;
}

/// The graph a → op → Cast(double) → ·w → flattened and concatenated → loss, with random weights
/// w from \p seed.
gradcheck::Problem problem(const Case &c, unsigned seed) {
  gradcheck::Problem p{c.type, 17, c.attrs};
  for (size_t i = 0; i < c.inputs.size(); ++i)
    p.feeds.push_back({gradcheck::named("in", i), c.inputs[i].value, c.inputs[i].stream});
  p.outs.clear();
  for (size_t k = 0; k < c.outputs; ++k)
    p.outs.push_back(gradcheck::named("y", k));
  p.loss = [lossOutputs = c.lossOutputs, seed](ir::Graph &g, const std::vector<TensorId> &outs, int opset) {
    std::mt19937 rng(seed * 7919 + 1);
    std::vector<TensorData> weights;
    for (const auto &o : outs)
      weights.push_back(stream(g.tensor(o).info().shape(), rng).value);
    std::vector<TensorId> terms;
    for (size_t k : lossOutputs) {
      ir::Attributes to;
      to.set("to", static_cast<int64_t>(DataType::DOUBLE));
      TensorId yd = gradcheck::named("yd", k), w = gradcheck::named("w", k), t = gradcheck::named("t", k);
      g.addOp("Cast", "", opset, "", to, {outs[k]}, {yd});
      g.addConst(w, weights[k]);
      g.addOp("Mul", "", opset, "", {}, {yd, w}, {t});
      terms.push_back(t);
    }
    // The terms may differ in shape: flatten and concatenate them; the seed gradient of ones sums them.
    std::vector<TensorId> flat;
    g.addConst("minus1", TensorData::fromInt64({1}, {-1}));
    for (const auto &t : terms) {
      flat.push_back(t + "_flat");
      g.addOp("Reshape", "", opset, "", {}, {t, "minus1"}, {flat.back()});
    }
    g.addOp("Concat", "", opset, "", attr("axis", int64_t{0}), flat, {"loss"});
    return TensorId("loss");
  };
  return p;
}

void checkGradient(const Case &c, unsigned seed, double tol = 1e-5) {
  gradcheck::checkGradient(problem(c, seed), seed, tol);
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
    // Axis 0 (an embedding table: one ScatterND row per index), repeated and negative indices.
    std::uniform_int_distribution<int64_t> row(-s[0], s[0] - 1);
    std::vector<int64_t> rows(6);
    for (auto &v : rows)
      v = row(rng);
    rows[4] = rows[1];
    checkGradient({"Gather", {stream(s, rng), intTensor({3, 2}, rows)}, {}}, seed);
    TensorData rows32 = TensorData::fromDoubles(DataType::INT32, {2, 3}, std::vector<double>(rows.begin(), rows.end()));
    checkGradient({"Gather", {stream(s, rng), Input{rows32, false}}, {}}, seed);
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
    std::vector<TensorId> grads;
    gradcheck::buildGraph(problem(c, 5), &grads);
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("constant-mode Pad"), std::string::npos) << e.what();
  }
}
