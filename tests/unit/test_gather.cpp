// Indexing, loss and misc ops: setup errors, out-of-range indices, and reference kernels
// against direct computations.

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace popart;
using namespace popart::ir;
using backend_cpu::KernelProvider;

namespace {

/// A one-op graph whose inputs are constants (so value inputs are known to setup).
struct OneOp {
  Graph graph;
  Op *op = nullptr;
  std::vector<TensorData> inputs;

  OneOp(const std::string &type, std::vector<TensorData> ins, Attributes attrs, size_t outputs = 1, int version = 13)
      : inputs(std::move(ins)) {
    registerBuiltinOps();
    backend_cpu::registerBuiltinKernels();
    std::vector<TensorId> inIds, outIds;
    for (size_t i = 0; i < inputs.size(); ++i) {
      inIds.push_back("in" + std::to_string(i));
      graph.addConst(inIds.back(), inputs[i]);
    }
    for (size_t i = 0; i < outputs; ++i)
      outIds.push_back("out" + std::to_string(i));
    op = &graph.addOp(type, "", version, "op", std::move(attrs), inIds, outIds);
    inferShapes(graph, nullptr);
  }

  std::vector<TensorData> run() {
    auto kernel = backend_cpu::createKernel(*op, KernelProvider::Reference);
    std::vector<const void *> in;
    for (auto &t : inputs)
      in.push_back(t.data());
    std::vector<TensorData> outs;
    for (size_t i = 0; i < op->outputCount(); ++i)
      outs.emplace_back(op->outInfo(i));
    std::vector<void *> out;
    for (auto &t : outs)
      out.push_back(t.data());
    kernel->run({in.data(), in.size(), out.data(), out.size()});
    return outs;
  }
};

TensorData floats(const Shape &shape, const std::vector<double> &v) {
  return TensorData::fromDoubles(DataType::FLOAT, shape, v);
}

TensorData randomFloats(const Shape &shape, std::mt19937 &rng) {
  TensorData t(TensorInfo(DataType::FLOAT, shape));
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  for (int64_t i = 0; i < t.info().elementCount(); ++i)
    t.as<float>()[i] = d(rng);
  return t;
}

Attributes attrs(std::initializer_list<std::pair<const char *, AttributeValue>> list) {
  Attributes a;
  for (auto &[k, v] : list)
    a.set(k, v);
  return a;
}

} // namespace

TEST(Gather, NegativeIndicesAndOutOfRangeError) {
  OneOp g("Gather", {floats({3, 2}, {1, 2, 3, 4, 5, 6}), TensorData::fromInt64({2}, {-1, 0})}, {});
  EXPECT_EQ(g.op->outInfo(0).shape(), (Shape{2, 2}));
  EXPECT_EQ(g.run()[0].toDoubleVector(), (std::vector<double>{5, 6, 1, 2}));
  g.inputs[1] = TensorData::fromInt64({2}, {3, 0});
  try {
    g.run();
    FAIL() << "index 3 of a dimension of size 3 was accepted";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("Gather 'op'"), std::string::npos) << e.what();
  }
}

TEST(Gather, GatherNDRejectsBadBatchDims) {
  EXPECT_THROW(OneOp("GatherND", {floats({2, 2}, {1, 2, 3, 4}), TensorData::fromInt64({2, 1}, {0, 1})},
                     attrs({{"batch_dims", int64_t{2}}})),
               error);
  OneOp g("GatherND", {floats({2, 2}, {1, 2, 3, 4}), TensorData::fromInt64({2, 1}, {1, -1})},
          attrs({{"batch_dims", int64_t{1}}}));
  EXPECT_EQ(g.run()[0].toDoubleVector(), (std::vector<double>{2, 4}));
}

TEST(Gather, ScatterElementsAddAccumulatesDuplicates) {
  OneOp s("ScatterElements",
          {floats({1, 4}, {1, 1, 1, 1}), TensorData::fromInt64({1, 3}, {1, 1, -1}), floats({1, 3}, {2, 3, 4})},
          attrs({{"axis", int64_t{1}}, {"reduction", std::string("add")}}), 1, 16);
  EXPECT_EQ(s.run()[0].toDoubleVector(), (std::vector<double>{1, 6, 1, 5}));
  EXPECT_THROW(OneOp("ScatterElements", {floats({4}, {1, 1, 1, 1}), TensorData::fromInt64({1}, {0}), floats({1}, {2})},
                     attrs({{"reduction", std::string("avg")}}), 1, 16),
               error);
}

TEST(Gather, UniqueUnsortedKeepsFirstOccurrenceOrder) {
  OneOp u("Unique", {floats({6}, {2, 1, 1, 3, 4, 3})}, attrs({{"sorted", int64_t{0}}}), 4, 11);
  auto out = u.run();
  EXPECT_EQ(out[0].toDoubleVector(), (std::vector<double>{2, 1, 3, 4}));
  EXPECT_EQ(out[1].toInt64Vector(), (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(out[2].toInt64Vector(), (std::vector<int64_t>{0, 1, 1, 2, 3, 2}));
  EXPECT_EQ(out[3].toInt64Vector(), (std::vector<int64_t>{1, 2, 2, 1}));
}

TEST(Loss, SetupRejectsBadLabelsAndReduction) {
  TensorData x = floats({2, 3}, {0, 1, 2, 3, 4, 5});
  EXPECT_THROW(OneOp("SoftmaxCrossEntropyLoss", {x, TensorData::fromInt64({3}, {0, 1, 2})}, {}), error);
  EXPECT_THROW(OneOp("SoftmaxCrossEntropyLoss", {x, TensorData::fromInt64({2}, {0, 1})},
                     attrs({{"reduction", std::string("avg")}})),
               error);
  OneOp l("NegativeLogLikelihoodLoss", {x, TensorData::fromInt64({2}, {2, 7})}, {});
  EXPECT_THROW(l.run(), error); // label 7 is not a class
  l.inputs[1] = TensorData::fromInt64({2}, {2, 0});
  EXPECT_FLOAT_EQ(l.run()[0].as<float>()[0], -2.5f);
}

TEST(Loss, SoftmaxCrossEntropyMatchesDirectFormula) {
  for (unsigned seed = 0; seed < 3; ++seed) {
    std::mt19937 rng(seed);
    TensorData x = randomFloats({2, 4, 3}, rng);
    std::vector<int64_t> labels(6);
    for (auto &v : labels)
      v = static_cast<int64_t>(rng() % 4);
    labels[1] = -100; // ignored
    OneOp l("SoftmaxCrossEntropyLoss", {x, TensorData::fromInt64({2, 3}, labels)},
            attrs({{"ignore_index", int64_t{-100}}}), 2);
    auto out = l.run();
    double total = 0;
    int counted = 0;
    for (int n = 0; n < 2; ++n)
      for (int d = 0; d < 3; ++d) {
        int64_t y = labels[n * 3 + d];
        if (y == -100) continue;
        double sum = 0;
        for (int c = 0; c < 4; ++c)
          sum += std::exp(x.as<float>()[(n * 4 + c) * 3 + d]);
        total -= x.as<float>()[(n * 4 + y) * 3 + d] - std::log(sum);
        ++counted;
      }
    EXPECT_NEAR(out[0].as<float>()[0], total / counted, 1e-5) << "seed " << seed;
  }
}

TEST(Misc, EinsumBatchMatMulMatchesLoops) {
  for (unsigned seed = 0; seed < 3; ++seed) {
    std::mt19937 rng(seed);
    int64_t b = 1 + rng() % 3, m = 1 + rng() % 4, k = 1 + rng() % 4, n = 1 + rng() % 4;
    TensorData x = randomFloats({b, m, k}, rng), y = randomFloats({b, k, n}, rng);
    OneOp e("Einsum", {x, y}, attrs({{"equation", std::string("bij, bjk -> bik")}}), 1, 12);
    ASSERT_EQ(e.op->outInfo(0).shape(), (Shape{b, m, n})) << "seed " << seed;
    auto out = e.run()[0];
    for (int64_t p = 0; p < b; ++p)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t q = 0; q < k; ++q)
            acc += x.as<float>()[(p * m + i) * k + q] * y.as<float>()[(p * k + q) * n + j];
          EXPECT_NEAR(out.as<float>()[(p * m + i) * n + j], acc, 1e-5) << "seed " << seed;
        }
  }
}

TEST(Misc, EinsumImplicitOutputAndDiagonal) {
  OneOp trace("Einsum", {floats({2, 2}, {1, 2, 3, 4})}, attrs({{"equation", std::string("ii")}}), 1, 12);
  EXPECT_EQ(trace.op->outInfo(0).shape(), Shape{});
  EXPECT_EQ(trace.run()[0].toDoubleVector(), (std::vector<double>{5}));
  OneOp t("Einsum", {floats({2, 3}, {1, 2, 3, 4, 5, 6})}, attrs({{"equation", std::string("ji")}}), 1, 12);
  EXPECT_EQ(t.op->outInfo(0).shape(), (Shape{3, 2}));
  EXPECT_THROW(OneOp("Einsum", {floats({2, 3}, {1, 2, 3, 4, 5, 6})}, attrs({{"equation", std::string("i->i")}}), 1, 12),
               error);
}

TEST(Misc, DetOfKnownMatrices) {
  OneOp d("Det", {floats({2, 3, 3}, {2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 1, 0, 1, 0, 0, 0, 0, 1})}, {}, 1, 11);
  auto out = d.run()[0].toDoubleVector();
  EXPECT_NEAR(out[0], 24, 1e-6);
  EXPECT_NEAR(out[1], -1, 1e-6);
}

TEST(Misc, QuantizeRoundsHalfToEvenAndSaturates) {
  OneOp q("QuantizeLinear",
          {floats({4}, {0.5, 1.5, 300, -3}), floats({}, {1}), TensorData::fromDoubles(DataType::UINT8, {}, {0})}, {});
  EXPECT_EQ(q.run()[0].toInt64Vector(), (std::vector<int64_t>{0, 2, 255, 0}));
}
