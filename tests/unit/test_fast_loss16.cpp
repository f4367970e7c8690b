// SoftmaxCrossEntropyLossGrad with BFLOAT16 and FLOAT16 scores (foldLossCasts' form: FLOAT dY and
// loss, FLOAT or 16-bit weights): the fast kernel (backend_cpu/fast/loss.cpp) against the
// reference kernel on the same 16-bit data, both against the fp32 reference on the data widened,
// in place, on several threads, and what the op's setup accepts.

#include "fast_cases.hpp"
#include "kernel_compare.hpp"

#include "backend_cpu/kernel.hpp"
#include "core/half.hpp"
#include "ir/graph.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace popart;

using backend_cpu::KernelProvider;

POPART_FAST_KERNEL_COMPARED("ai.graphcore", "SoftmaxCrossEntropyLossGrad");

namespace {

struct GradCase {
  int64_t n, classes;
  const char *reduction;
  DataType weights; ///< UNDEFINED: no weights
  bool ignore;
  bool sums, loss;
};

/// The op of \p c with scores of \p type, set up.
struct GradGraph {
  GradGraph(DataType type, const GradCase &c) {
    ir::registerBuiltinOps();
    backend_cpu::registerBuiltinKernels();
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(type, {c.n, c.classes}));
    g.addTensor("labels", ir::TensorKind::Stream, TensorInfo(DataType::INT64, {c.n}));
    if (c.weights != DataType::UNDEFINED) g.addTensor("w", ir::TensorKind::Stream, TensorInfo(c.weights, {c.classes}));
    bool none = std::string(c.reduction) == "none";
    g.addTensor("dy", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, none ? Shape{c.n} : Shape{}));
    ir::Attributes a;
    a.set("reduction", std::string(c.reduction));
    if (c.ignore) a.set("ignore_index", int64_t{1});
    op = &g.addOp("SoftmaxCrossEntropyLossGrad", "ai.graphcore", 1, "grad", std::move(a),
                  {"x", "labels", c.weights != DataType::UNDEFINED ? "w" : "", "dy"},
                  {"dx", c.sums ? "sums" : "", c.loss ? "loss" : ""});
    op->def->setup(*op);
  }
  ir::Graph g;
  ir::Op *op = nullptr;
};

/// Input i of the op: scores in [-6, 6], labels in range (1, the ignored one, now and then), weights
/// in [0.25, 2], dY in [0.5, 1.5].
float fill(size_t i, std::mt19937 &rng, int64_t classes) {
  switch (i) {
  case 0: return std::uniform_real_distribution<float>(-6, 6)(rng);
  case 1: return static_cast<float>(std::uniform_int_distribution<int64_t>(0, classes - 1)(rng));
  case 2: return std::uniform_real_distribution<float>(0.25f, 2)(rng);
  default: return std::uniform_real_distribution<float>(0.5f, 1.5f)(rng);
  }
}

void setValue(TensorData &t, int64_t k, float v) {
  switch (t.info().dataType()) {
  case DataType::BFLOAT16: t.as<uint16_t>()[k] = floatToBfloat16(v); break;
  case DataType::FLOAT16: t.as<uint16_t>()[k] = floatToHalf(v); break;
  case DataType::INT64: t.as<int64_t>()[k] = static_cast<int64_t>(v); break;
  default: t.as<float>()[k] = v;
  }
}

/// Runs \p op with \p provider's kernel (\p threads threads) on \p inputs, twice, outputs started as
/// garbage; with \p inPlace dX is written over a copy of the scores.
std::vector<TensorData> run(const ir::Op &op, KernelProvider provider, const std::vector<TensorData> &inputs,
                            int threads = 1, bool inPlace = false) {
  backend_cpu::KernelContext context;
  context.threads = threads;
  auto kernel = backend_cpu::createKernel(op, provider, context);
  std::vector<TensorData> outs;
  std::vector<void *> outp;
  for (size_t i = 0; i < op.outputCount(); ++i) {
    outs.emplace_back(op.hasOutput(i) ? op.outInfo(i) : TensorInfo(DataType::FLOAT, {0}));
    std::memset(outs.back().data(), 0x5a, static_cast<size_t>(outs.back().byteCount()));
    outp.push_back(op.hasOutput(i) ? outs.back().data() : nullptr);
  }
  std::vector<const void *> in;
  for (size_t i = 0; i < inputs.size(); ++i)
    in.push_back(op.hasInput(i) ? inputs[i].data() : nullptr);
  for (int pass = 0; pass < 2; ++pass) {
    if (inPlace) {
      EXPECT_EQ(kernel->inPlaceInput(), 0);
      std::memcpy(outs[0].data(), inputs[0].data(), static_cast<size_t>(inputs[0].byteCount()));
      in[0] = outs[0].data();
    }
    kernel->run({in.data(), in.size(), outp.data(), outp.size()});
  }
  return outs;
}

std::vector<GradCase> cases() {
  using DT = DataType;
  return {{37, 1001, "mean", DT::UNDEFINED, false, true, true}, {64, 300, "mean", DT::FLOAT, true, true, true},
          {5, 17, "sum", DT::UNDEFINED, false, false, true},    {9, 7, "none", DT::FLOAT, false, true, true},
          {100, 64, "mean", DT::UNDEFINED, true, true, false},  {3, 1, "mean", DT::UNDEFINED, false, true, true},
          {33, 129, "none", DT::UNDEFINED, true, false, false}, {40, 250, "sum", DT::FLOAT, false, true, false}};
}

TEST(FastLoss16, SoftmaxCrossEntropyGradOfSixteenBitScoresMatchesTheReferences) {
  std::mt19937 rng(41);
  for (DataType type : {DataType::BFLOAT16, DataType::FLOAT16})
    for (GradCase c : cases())
      for (bool sameTypeWeights : {false, true}) {
        if (sameTypeWeights && c.weights == DataType::UNDEFINED) continue;
        if (sameTypeWeights) c.weights = type;
        GradGraph graph(type, c);
        const ir::Op &op = *graph.op;
        std::string what = toString(type) + " " + std::to_string(c.n) + "x" + std::to_string(c.classes) + " " +
                           c.reduction + (c.weights != DataType::UNDEFINED ? " weights " + toString(c.weights) : "") +
                           (c.ignore ? " ignoring" : "") + (c.sums ? " sums" : "") + (c.loss ? " loss" : "");
        ASSERT_NE(backend_cpu::KernelRegistry::instance().find(op, KernelProvider::Fast), nullptr) << what;
        EXPECT_EQ(op.outInfo(0).dataType(), type);
        if (c.sums) {
          EXPECT_EQ(op.outInfo(1).dataType(), type);
        }
        if (c.loss) {
          EXPECT_EQ(op.outInfo(2).dataType(), DataType::FLOAT);
        }
        std::vector<TensorData> inputs;
        for (size_t i = 0; i < op.inputCount(); ++i) {
          inputs.emplace_back(op.hasInput(i) ? op.inInfo(i) : TensorInfo(DataType::FLOAT, {0}));
          for (int64_t k = 0; k < inputs.back().info().elementCount(); ++k)
            setValue(inputs.back(), k, fill(i, rng, c.classes));
        }
        auto ref = run(op, KernelProvider::Reference, inputs);
        auto fast = run(op, KernelProvider::Fast, inputs);
        // dX: both round an f32 (fast, approximate exp) or double value once: an ulp apart at most.
        const double ulp = 2 * kernel_compare::unitRoundoff(type);
        EXPECT_LE(kernel_compare::maxRelDiff(fast[0], ref[0]), ulp) << "dX, " << what;
        // Class sums of dX's rounded values, which may differ by an ulp here and there.
        if (c.sums) {
          EXPECT_LE(kernel_compare::maxRelDiff(fast[1], ref[1]), ulp) << "class sums, " << what;
        }
        if (c.loss) {
          EXPECT_LE(kernel_compare::maxRelDiff(fast[2], ref[2]), 2e-6) << "loss, " << what;
        }
        // The same bits on two threads and in place.
        auto threaded = run(op, KernelProvider::Fast, inputs, 2);
        auto inPlace = run(op, KernelProvider::Fast, inputs, 2, true);
        for (size_t i = 0; i < fast.size(); ++i)
          if (op.hasOutput(i)) {
            EXPECT_EQ(std::memcmp(threaded[i].data(), fast[i].data(), static_cast<size_t>(fast[i].byteCount())), 0)
                << "output " << i << " on two threads, " << what;
            EXPECT_EQ(std::memcmp(inPlace[i].data(), fast[i].data(), static_cast<size_t>(fast[i].byteCount())), 0)
                << "output " << i << " in place, " << what;
          }
        // Against the fp32 reference on the widened data: dX and the loss as rounded once, the class
        // sums as the sum of N rounded terms.
        for (KernelProvider provider : {KernelProvider::Fast, KernelProvider::Reference}) {
          SCOPED_TRACE(what + (provider == KernelProvider::Fast ? " fast" : " reference"));
          kernel_compare::expectSixteenBitMatchesFp32Reference(
              provider, op, rng, [&](size_t i, std::mt19937 &r) { return fill(i, r, c.classes); },
              kernel_compare::sixteenBitTolerance(type, c.n));
        }
      }
}

TEST(FastLoss16, SetupTakesSixteenBitScoresWithAFloatSeed) {
  ir::registerBuiltinOps();
  auto setUp = [](DataType x, DataType w, DataType dy) {
    ir::Graph g;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(x, {4, 10}));
    g.addTensor("l", ir::TensorKind::Stream, TensorInfo(DataType::INT64, {4}));
    g.addTensor("w", ir::TensorKind::Stream, TensorInfo(w, {10}));
    g.addTensor("dy", ir::TensorKind::Stream, TensorInfo(dy, {}));
    ir::Op &op = g.addOp("SoftmaxCrossEntropyLossGrad", "ai.graphcore", 1, "grad", {}, {"x", "l", "w", "dy"},
                         {"dx", "sums", "loss"});
    op.def->setup(op);
    return std::vector<DataType>{op.outInfo(0).dataType(), op.outInfo(1).dataType(), op.outInfo(2).dataType()};
  };
  using DT = DataType;
  EXPECT_EQ(setUp(DT::BFLOAT16, DT::FLOAT, DT::FLOAT), (std::vector<DT>{DT::BFLOAT16, DT::BFLOAT16, DT::FLOAT}));
  EXPECT_EQ(setUp(DT::FLOAT16, DT::FLOAT16, DT::FLOAT), (std::vector<DT>{DT::FLOAT16, DT::FLOAT16, DT::FLOAT}));
  EXPECT_EQ(setUp(DT::FLOAT, DT::FLOAT, DT::FLOAT), (std::vector<DT>{DT::FLOAT, DT::FLOAT, DT::FLOAT}));
  EXPECT_THROW(setUp(DT::BFLOAT16, DT::FLOAT, DT::BFLOAT16), error); // the seed is FLOAT
  EXPECT_THROW(setUp(DT::BFLOAT16, DT::FLOAT16, DT::FLOAT), error);  // weights of a third type
  EXPECT_THROW(setUp(DT::FLOAT, DT::BFLOAT16, DT::FLOAT), error);    // 16-bit weights of FLOAT scores
  EXPECT_THROW(setUp(DT::FLOAT, DT::FLOAT, DT::DOUBLE), error);
}

TEST(FastLoss16, FastKernelTakesSixteenBitRowsOnly) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  ir::Graph g;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::BFLOAT16, {4, 10, 3}));
  g.addTensor("l", ir::TensorKind::Stream, TensorInfo(DataType::INT64, {4, 3}));
  g.addTensor("dy", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {}));
  ir::Op &op = g.addOp("SoftmaxCrossEntropyLossGrad", "ai.graphcore", 1, "grad", {}, {"x", "l", "", "dy"}, {"dx"});
  op.def->setup(op);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(op, KernelProvider::Fast), nullptr);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(op)->provider, KernelProvider::Reference);
  GradGraph rows(DataType::BFLOAT16, {8, 10, "mean", DataType::UNDEFINED, false, true, true});
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*rows.op)->provider, KernelProvider::Fast);
}

} // namespace
