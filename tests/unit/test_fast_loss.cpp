// The fast loss and softmax-gradient kernels (backend_cpu/fast/loss.cpp, fast/softmax.cpp)
// against the reference kernels: f32 SoftmaxCrossEntropyLoss over [N, C] rows,
// SoftmaxCrossEntropyLossGrad with and without its fused class sums and loss, and the f32
// SoftmaxGrad row pass over the last axis; the cases each fast kernel takes and declines.

#include "fast_cases.hpp"
#include "kernel_compare.hpp"
#include "op_runner.hpp"

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>

using namespace popart;

using backend_cpu::KernelProvider;
using op_runner::Input;
using op_runner::randomTensor;
using op_runner::runOp;

POPART_FAST_KERNEL_COMPARED("ai.onnx", "SoftmaxCrossEntropyLoss");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "SoftmaxCrossEntropyLossGrad");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "SoftmaxGrad");

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

/// Fails unless \p got and \p want have the same elements within \p tolerance (relDiff), where
/// a NaN must meet a NaN and an infinity the same infinity (maxRelDiff fails for both).
void expectSameWithNonFinite(const TensorData &got, const TensorData &want, double tolerance, const std::string &what) {
  ASSERT_EQ(got.info().elementCount(), want.info().elementCount()) << what;
  for (int64_t i = 0; i < want.info().elementCount(); ++i) {
    double g = got.valueAsDouble(i), w = want.valueAsDouble(i);
    if (std::isnan(w) || std::isnan(g)) {
      EXPECT_TRUE(std::isnan(w) && std::isnan(g)) << what << " element " << i << ": " << g << " against " << w;
    } else if (std::isinf(w) || std::isinf(g)) {
      EXPECT_EQ(g, w) << what << " element " << i;
    } else {
      EXPECT_LE(kernel_compare::relDiff(g, w), tolerance) << what << " element " << i << ": " << g << " against " << w;
    }
  }
}

/// The expected error of \p run: a message containing \p text.
template <typename F> void expectError(F run, const std::string &text, const std::string &what) {
  try {
    run();
    ADD_FAILURE() << what << ": expected an error";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << what << ": " << e.what();
  }
}

/// Labels for \p positions positions of \p classes classes, uniform.
std::vector<int64_t> randomLabels(int64_t positions, int64_t classes, std::mt19937 &rng) {
  std::uniform_int_distribution<int64_t> d(0, std::max<int64_t>(classes - 1, 0));
  std::vector<int64_t> labels(static_cast<size_t>(positions));
  for (auto &l : labels)
    l = d(rng);
  return labels;
}

TensorData labelTensor(DataType type, const Shape &shape, const std::vector<int64_t> &labels) {
  TensorData t = TensorData::fromInt64(shape, labels);
  if (type == DataType::INT64) return t;
  TensorData narrow(TensorInfo(DataType::INT32, shape));
  for (size_t i = 0; i < labels.size(); ++i)
    narrow.as<int32_t>()[i] = static_cast<int32_t>(labels[i]);
  return narrow;
}

/// A one-op graph holding \p type with inputs of \p infos ("" for an omitted one) and outputs
/// \p outputs ("" for an omitted one), set up.
struct OneOp {
  OneOp(const std::string &type, const std::string &domain, int version, ir::Attributes attrs,
        const std::vector<std::optional<TensorInfo>> &infos, const std::vector<TensorId> &outputs) {
    ir::registerBuiltinOps();
    backend_cpu::registerBuiltinKernels();
    g.opsets()["ai.onnx"] = 13;
    std::vector<TensorId> ins;
    for (size_t i = 0; i < infos.size(); ++i) {
      ins.push_back(infos[i] ? "in" + std::to_string(i) : "");
      if (infos[i]) g.addTensor(ins.back(), ir::TensorKind::Stream, *infos[i]);
    }
    op = &g.addOp(type, domain, version, "op", std::move(attrs), ins, outputs);
    op->def->setup(*op);
  }
  const backend_cpu::KernelEntry *find(KernelProvider provider) const {
    return backend_cpu::KernelRegistry::instance().find(*op, provider);
  }
  ir::Graph g;
  ir::Op *op = nullptr;
};

/// Runs \p op's kernel of \p provider on \p inputs (an empty TensorData for an omitted input);
/// outputs start as garbage, the kernel runs twice (a second run must not accumulate), and with
/// \p inPlace output 0 is written over a copy of input 0 (Kernel::inPlaceInput).
std::vector<TensorData> runKernel(const ir::Op &op, KernelProvider provider, const std::vector<TensorData> &inputs,
                                  bool inPlace = false) {
  auto kernel = backend_cpu::createKernel(op, provider); // throws if provider has no kernel for op
  if (inPlace) {
    EXPECT_EQ(kernel->inPlaceInput(), 0) << backend_cpu::kernelProviderName(provider);
  }
  std::vector<TensorData> outs;
  std::vector<void *> outp;
  for (size_t i = 0; i < op.outputCount(); ++i) {
    outs.emplace_back(op.hasOutput(i) ? op.outInfo(i) : TensorInfo(DataType::FLOAT, {0}));
    for (int64_t k = 0; k < outs.back().info().elementCount(); ++k)
      outs.back().as<float>()[k] = 1e6f; // f32 outputs only
    outp.push_back(op.hasOutput(i) ? outs.back().data() : nullptr);
  }
  std::vector<const void *> in;
  for (size_t i = 0; i < inputs.size(); ++i)
    in.push_back(op.hasInput(i) ? inputs[i].data() : nullptr);
  for (int pass = 0; pass < 2; ++pass) {
    if (inPlace) { // the plan's in-place step: output 0 holds input 0 when the kernel starts
      std::memcpy(outs[0].data(), inputs[0].data(), static_cast<size_t>(inputs[0].byteCount()));
      in[0] = outs[0].data();
    }
    kernel->run({in.data(), in.size(), outp.data(), outp.size()});
  }
  return outs;
}

} // namespace

TEST(FastLoss, SoftmaxCrossEntropyMatchesTheReference) {
  // [N, C] f32 rows: every reduction, with and without weights, ignore_index and log_prob, both
  // label types, class counts that leave vector remainders, a single class and a single row.
  std::mt19937 rng(22);
  struct Case {
    int64_t n, classes;
  };
  for (Case c : {Case{37, 1001}, Case{5, 1}, Case{1, 17}, Case{9, 7}, Case{3, 64}}) {
    std::vector<int64_t> labels = randomLabels(c.n, c.classes, rng);
    labels[0] = 0; // ignored below
    TensorData x = randomTensor(DataType::FLOAT, {c.n, c.classes}, rng, -8, 8);
    TensorData w = randomTensor(DataType::FLOAT, {c.classes}, rng, 0.1, 2);
    for (DataType labelType : {DataType::INT64, DataType::INT32})
      for (const char *reduction : {"mean", "sum", "none"})
        for (bool weighted : {false, true})
          for (bool ignore : {false, true})
            for (size_t outputs : {1u, 2u}) {
              ir::Attributes attrs;
              attrs.set("reduction", std::string(reduction));
              if (ignore) attrs.set("ignore_index", int64_t{0});
              std::vector<Input> in{{"x", x}, {"l", labelTensor(labelType, {c.n}, labels)}};
              if (weighted) in.push_back({"w", w});
              auto want = runOp("SoftmaxCrossEntropyLoss", 13, attrs, in, {}, outputs);
              auto got = runOp("SoftmaxCrossEntropyLoss", 13, attrs, in, {}, outputs, "ai.onnx", KernelProvider::Fast);
              std::string what = std::to_string(c.n) + "x" + std::to_string(c.classes) + " " + reduction +
                                 (weighted ? " weighted" : "") + (ignore ? " ignoring" : "") +
                                 (labelType == DataType::INT32 ? " int32" : "");
              // The same tolerance the fast path met against the f64 kernel before: the row sums
              // of approximate exponentials (3 ulp) in f32 against exact ones in double.
              // (A mean over ignored labels alone is 0/0, NaN in both.)
              expectSameWithNonFinite(got[0], want[0], 2e-6, what);
              if (outputs == 2) expectSameWithNonFinite(got[1], want[1], 2e-6, "log_prob, " + what);
            }
  }
}

TEST(FastLoss, SoftmaxCrossEntropyPropagatesNaNAndInfinityAsTheReference) {
  // A row holding a NaN, one with +inf (inf − inf: NaN), one with −inf away from its label (no
  // weight: a finite loss) and one with −inf at its label (an infinite loss).
  const int64_t n = 6, classes = 19;
  std::mt19937 rng(5);
  TensorData x = randomTensor(DataType::FLOAT, {n, classes}, rng, -4, 4);
  std::vector<int64_t> labels{1, 2, 3, 4, 5, 6};
  x.as<float>()[0 * classes + 7] = static_cast<float>(kNaN);
  x.as<float>()[1 * classes + 0] = static_cast<float>(kInf);
  x.as<float>()[2 * classes + 18] = static_cast<float>(-kInf);
  x.as<float>()[3 * classes + 4] = static_cast<float>(-kInf);
  ir::Attributes attrs;
  attrs.set("reduction", std::string("none"));
  std::vector<Input> in{{"x", x}, {"l", TensorData::fromInt64({n}, labels)}};
  auto want = runOp("SoftmaxCrossEntropyLoss", 13, attrs, in, {}, 2);
  auto got = runOp("SoftmaxCrossEntropyLoss", 13, attrs, in, {}, 2, "ai.onnx", KernelProvider::Fast);
  EXPECT_TRUE(std::isnan(want[0].valueAsDouble(0)) && std::isinf(want[0].valueAsDouble(3)) &&
              std::isfinite(want[0].valueAsDouble(2)))
      << "the reference's losses are not the ones this test is about";
  expectSameWithNonFinite(got[0], want[0], 2e-6, "loss");
  expectSameWithNonFinite(got[1], want[1], 2e-6, "log_prob");
}

TEST(FastLoss, SoftmaxCrossEntropyLabelOutOfRangeIsAnErrorForBothProviders) {
  const int64_t n = 37, classes = 1001;
  std::mt19937 rng(23);
  TensorData x = randomTensor(DataType::FLOAT, {n, classes}, rng, -8, 8);
  for (KernelProvider provider : {KernelProvider::Fast, KernelProvider::Reference})
    for (int64_t bad : {classes, int64_t{-1}}) {
      std::vector<int64_t> labels = randomLabels(n, classes, rng);
      labels[5] = bad;
      std::string text = "label " + std::to_string(bad) + " at position 5 is out of range [0, 1001)";
      expectError(
          [&] {
            runOp("SoftmaxCrossEntropyLoss", 13, {}, {{"x", x}, {"l", TensorData::fromInt64({n}, labels)}}, {}, 1,
                  "ai.onnx", provider);
          },
          text, backend_cpu::kernelProviderName(provider));
    }
}

TEST(FastLoss, SoftmaxCrossEntropyFastKernelTakesOnlyF32Rows) {
  auto take = [](DataType type, const Shape &shape) {
    Shape labels = shape;
    labels.erase(labels.begin() + 1);
    OneOp o("SoftmaxCrossEntropyLoss", "ai.onnx", 13, {},
            {TensorInfo(type, shape), TensorInfo(DataType::INT64, labels)}, {"y", "p"});
    const auto *e = o.find(KernelProvider::Fast);
    return e != nullptr && e->provider == KernelProvider::Fast;
  };
  EXPECT_TRUE(take(DataType::FLOAT, {4, 10}));
  EXPECT_TRUE(take(DataType::FLOAT, {4, 10, 1})); // D = 1: still rows
  EXPECT_FALSE(take(DataType::FLOAT, {4, 10, 3}));
  EXPECT_FALSE(take(DataType::FLOAT, {4, 10, 0}));
  EXPECT_FALSE(take(DataType::FLOAT, {4, 0}));
  EXPECT_FALSE(take(DataType::DOUBLE, {4, 10}));
  // With Any, f32 rows take the fast kernel and the rest the reference (oneDNN has none).
  OneOp rows("SoftmaxCrossEntropyLoss", "ai.onnx", 13, {},
             {TensorInfo(DataType::FLOAT, {4, 10}), TensorInfo(DataType::INT64, {4})}, {"y"});
  EXPECT_EQ(rows.find(KernelProvider::Any)->provider, KernelProvider::Fast);
  OneOp spatial("SoftmaxCrossEntropyLoss", "ai.onnx", 13, {},
                {TensorInfo(DataType::FLOAT, {4, 10, 3}), TensorInfo(DataType::INT64, {4, 3})}, {"y"});
  EXPECT_EQ(spatial.find(KernelProvider::Any)->provider, KernelProvider::Reference);
}

TEST(FastLoss, SoftmaxCrossEntropyGradMatchesTheReference) {
  // Contiguous class rows (D = 1, vectorised) and strided ones (D > 1); position counts that
  // leave a partial block of the class sums (32 positions); every reduction, with and without
  // weights, ignore_index, the class sums and the fused loss, both label types, and in place.
  std::mt19937 rng(31);
  for (Shape shape :
       {Shape{37, 1001}, Shape{70, 10}, Shape{1, 1}, Shape{5, 7, 3}, Shape{3, 4, 2, 5}, Shape{33, 3, 1}}) {
    Shape labelShape = shape;
    labelShape.erase(labelShape.begin() + 1);
    int64_t positions = shapeElementCount(labelShape), classes = shape[1];
    std::vector<int64_t> labels = randomLabels(positions, classes, rng);
    labels[0] = 0; // ignored where ignore_index is set
    TensorData x = randomTensor(DataType::FLOAT, shape, rng, -8, 8);
    TensorData w = randomTensor(DataType::FLOAT, {classes}, rng, 0.1, 2);
    for (const char *reduction : {"mean", "sum", "none"}) {
      Shape dyShape = std::string(reduction) == "none" ? labelShape : Shape{};
      TensorData dy = randomTensor(DataType::FLOAT, dyShape, rng, -1.5, 1.5);
      for (DataType labelType : {DataType::INT64, DataType::INT32})
        for (bool weighted : {false, true})
          for (bool ignore : {false, true})
            for (bool sums : {false, true})
              for (bool withLoss : {false, true})
                for (bool inPlace : {false, true}) {
                  if (inPlace && labelType == DataType::INT32) continue; // in place once is enough
                  ir::Attributes attrs;
                  attrs.set("reduction", std::string(reduction));
                  if (ignore) attrs.set("ignore_index", int64_t{0});
                  OneOp o("SoftmaxCrossEntropyLossGrad", "ai.graphcore", 1, attrs,
                          {TensorInfo(DataType::FLOAT, shape), TensorInfo(labelType, labelShape),
                           weighted ? std::optional<TensorInfo>(w.info()) : std::nullopt, dy.info()},
                          {"dx", sums ? "sums" : "", withLoss ? "loss" : ""});
                  std::vector<TensorData> in{x, labelTensor(labelType, labelShape, labels), weighted ? w : TensorData(),
                                             dy};
                  auto want = runKernel(*o.op, KernelProvider::Reference, in, inPlace);
                  auto got = runKernel(*o.op, KernelProvider::Fast, in, inPlace);
                  std::string what = toString(shape) + " " + reduction + (weighted ? " weighted" : "") +
                                     (ignore ? " ignoring" : "") + (sums ? " with sums" : "") +
                                     (withLoss ? " with loss" : "") + (inPlace ? " in place" : "") +
                                     (labelType == DataType::INT32 ? " int32" : "");
                  // dX is O(1) (|dY|·w < 3), so relDiff is about absolute: a few f32 ulps of it
                  // from the approximate exponentials. The class sums add up to 70 positions in
                  // f32 per block of 32 (the reference in double): up to ~32 roundings of terms
                  // below 3, hence 1e-5. (A mean over ignored labels alone is 0/0, NaN in both.)
                  expectSameWithNonFinite(got[0], want[0], 2e-6, "dX, " + what);
                  if (sums) expectSameWithNonFinite(got[1], want[1], 1e-5, "class sums, " + what);
                  if (withLoss) expectSameWithNonFinite(got[2], want[2], 2e-6, "loss, " + what);
                }
    }
  }
}

TEST(FastLoss, SoftmaxCrossEntropyGradEdgeCasesMatchTheReference) {
  std::mt19937 rng(32);
  // No positions: an empty dX, zero class sums and a mean over no weight (0/0: NaN) in both.
  // Labels out of range without the fused loss: a zero gradient for that position.
  // NaN and ±inf among the scores, in rows and strided (D > 1).
  for (Shape shape : {Shape{0, 5}, Shape{8, 19}, Shape{4, 19, 3}}) {
    Shape labelShape = shape;
    labelShape.erase(labelShape.begin() + 1);
    int64_t positions = shapeElementCount(labelShape), classes = shape[1];
    int64_t d = shapeElementCount(Shape(shape.begin() + 2, shape.end()));
    auto at = [&](int64_t k, int64_t c) { return (k / d) * classes * d + c * d + k % d; }; // score c of position k
    std::vector<int64_t> labels = randomLabels(positions, classes, rng);
    TensorData x = randomTensor(DataType::FLOAT, shape, rng, -4, 4);
    if (positions >= 4) {
      labels[1] = classes; // out of range: no gradient
      labels[2] = -3;
      x.as<float>()[at(0, 7)] = static_cast<float>(kNaN);
      x.as<float>()[at(3, 0)] = static_cast<float>(kInf);
      labels[3] = 5;
      if (positions > 5) {
        x.as<float>()[at(5, (labels[5] + 1) % classes)] = static_cast<float>(-kInf);
        x.as<float>()[at(6, labels[6])] = static_cast<float>(-kInf);
      }
    }
    for (const char *reduction : {"mean", "sum", "none"})
      for (bool sums : {false, true}) {
        ir::Attributes attrs;
        attrs.set("reduction", std::string(reduction));
        Shape dyShape = std::string(reduction) == "none" ? labelShape : Shape{};
        TensorData dy = randomTensor(DataType::FLOAT, dyShape, rng, -1.5, 1.5);
        OneOp o("SoftmaxCrossEntropyLossGrad", "ai.graphcore", 1, attrs,
                {TensorInfo(DataType::FLOAT, shape), TensorInfo(DataType::INT64, labelShape), std::nullopt, dy.info()},
                {"dx", sums ? "sums" : ""});
        std::vector<TensorData> in{x, TensorData::fromInt64(labelShape, labels), TensorData(), dy};
        auto want = runKernel(*o.op, KernelProvider::Reference, in);
        auto got = runKernel(*o.op, KernelProvider::Fast, in);
        std::string what = toString(shape) + " " + reduction + (sums ? " with sums" : "");
        if (positions >= 4) {
          for (int64_t c = 0; c < classes; ++c)
            EXPECT_EQ(want[0].valueAsDouble(at(1, c)), 0.0) << what;
          EXPECT_TRUE(std::isnan(want[0].valueAsDouble(at(0, 0)))) << "the reference's NaN row, " << what;
        }
        expectSameWithNonFinite(got[0], want[0], 2e-6, "dX, " + what);
        if (sums) expectSameWithNonFinite(got[1], want[1], 1e-5, "class sums, " + what);
      }
  }
}

TEST(FastLoss, SoftmaxCrossEntropyGradLabelOutOfRangeIsAnErrorWithTheLoss) {
  // With the forward's loss fused in, a label out of range is an error, as in the forward.
  Shape shape{6, 10, 2};
  std::mt19937 rng(33);
  std::vector<int64_t> labels = randomLabels(12, 10, rng);
  labels[5] = 10;
  TensorData x = randomTensor(DataType::FLOAT, shape, rng, -4, 4), dy = TensorData::scalarFloat(1.f);
  for (Shape s : {shape, Shape{12, 10}}) {
    Shape labelShape = s;
    labelShape.erase(labelShape.begin() + 1);
    x.reshape(s);
    OneOp o("SoftmaxCrossEntropyLossGrad", "ai.graphcore", 1, {},
            {TensorInfo(DataType::FLOAT, s), TensorInfo(DataType::INT64, labelShape), std::nullopt, dy.info()},
            {"dx", "", "loss"});
    for (KernelProvider provider : {KernelProvider::Fast, KernelProvider::Reference})
      expectError(
          [&] {
            runKernel(*o.op, provider, {x, TensorData::fromInt64(labelShape, labels), TensorData(), dy});
          },
          "label 10 at position 5 is out of range [0, 10)", backend_cpu::kernelProviderName(provider));
  }
}

TEST(FastLoss, SoftmaxCrossEntropyGradFastKernelTakesF32) {
  OneOp f32("SoftmaxCrossEntropyLossGrad", "ai.graphcore", 1, {},
            {TensorInfo(DataType::FLOAT, {4, 10, 3}), TensorInfo(DataType::INT64, {4, 3}), std::nullopt,
             TensorInfo(DataType::FLOAT, {})},
            {"dx"});
  EXPECT_EQ(f32.find(KernelProvider::Any)->provider, KernelProvider::Fast);
  OneOp f64("SoftmaxCrossEntropyLossGrad", "ai.graphcore", 1, {},
            {TensorInfo(DataType::DOUBLE, {4, 10}), TensorInfo(DataType::INT64, {4}), std::nullopt,
             TensorInfo(DataType::DOUBLE, {})},
            {"dx"});
  EXPECT_EQ(f64.find(KernelProvider::Fast), nullptr);
  EXPECT_EQ(f64.find(KernelProvider::Any)->provider, KernelProvider::Reference);
}

TEST(FastSoftmaxGrad, RowPassMatchesTheReference) {
  // f32 over the last axis (given as -1 or as rank - 1): rows of lengths that leave vector
  // remainders, a single element, and empty tensors.
  std::mt19937 rng(71);
  for (Shape shape : {Shape{3, 4, 128}, Shape{7, 33}, Shape{5}, Shape{4, 1}, Shape{3, 17}, Shape{2, 0}, Shape{0, 6}})
    for (bool negative : {true, false}) {
      TensorData y = randomTensor(DataType::FLOAT, shape, rng, 0.0, 1.0);
      TensorData g = randomTensor(DataType::FLOAT, shape, rng, -1.0, 1.0);
      ir::Attributes attrs;
      attrs.set("axis", negative ? int64_t{-1} : static_cast<int64_t>(shape.size()) - 1);
      auto want = runOp("SoftmaxGrad", 13, attrs, {{"y", y}, {"g", g}}, {}, 1, "ai.graphcore");
      auto got = runOp("SoftmaxGrad", 13, attrs, {{"y", y}, {"g", g}}, {}, 1, "ai.graphcore", KernelProvider::Fast);
      // As the row pass met against the f64 loop before: an f32 dot product of the row.
      EXPECT_LE(kernel_compare::maxRelDiff(got[0], want[0]), 2e-6) << toString(shape);
    }
}

TEST(FastSoftmaxGrad, RowPassPropagatesNaNAndInfinityAsTheReference) {
  // Row 0 holds a NaN, row 1 an infinite Y (Σ dY·Y infinite: ∓inf, and NaN where Y is 0), row 2 an
  // infinite dY.
  std::mt19937 rng(72);
  Shape shape{4, 9};
  TensorData y = randomTensor(DataType::FLOAT, shape, rng, 0.0, 1.0);
  TensorData g = randomTensor(DataType::FLOAT, shape, rng, 0.5, 1.0);
  y.as<float>()[3] = static_cast<float>(kNaN);
  y.as<float>()[9 + 2] = static_cast<float>(kInf);
  y.as<float>()[9 + 4] = 0.f;
  g.as<float>()[18 + 5] = static_cast<float>(-kInf);
  ir::Attributes attrs;
  attrs.set("axis", int64_t{-1});
  auto want = runOp("SoftmaxGrad", 13, attrs, {{"y", y}, {"g", g}}, {}, 1, "ai.graphcore");
  auto got = runOp("SoftmaxGrad", 13, attrs, {{"y", y}, {"g", g}}, {}, 1, "ai.graphcore", KernelProvider::Fast);
  EXPECT_TRUE(std::isnan(want[0].valueAsDouble(0)) && std::isinf(want[0].valueAsDouble(9)) &&
              std::isnan(want[0].valueAsDouble(9 + 4)) && std::isfinite(want[0].valueAsDouble(27)))
      << "the reference's results are not the ones this test is about";
  expectSameWithNonFinite(got[0], want[0], 2e-6, "dX");
}

TEST(FastSoftmaxGrad, FastKernelTakesTheLastAxisInF32AndOneDnnTheRest) {
  // f32 over the last axis takes the fast row pass (oneDNN declines it); another axis stays with
  // oneDNN; LogSoftmaxGrad and f64 have no fast kernel.
  auto op = [](const char *type, DataType dtype, const Shape &shape, int64_t axis) {
    ir::Attributes attrs;
    attrs.set("axis", axis);
    return std::make_unique<OneOp>(
        type, "ai.graphcore", 1, attrs,
        std::vector<std::optional<TensorInfo>>{TensorInfo(dtype, shape), TensorInfo(dtype, shape)},
        std::vector<TensorId>{"dx"});
  };
  auto last = op("SoftmaxGrad", DataType::FLOAT, {2, 3, 4}, 2);
  auto negative = op("SoftmaxGrad", DataType::FLOAT, {2, 3, 4}, -1);
  auto middle = op("SoftmaxGrad", DataType::FLOAT, {2, 3, 4}, 1);
  EXPECT_EQ(last->find(KernelProvider::Any)->provider, KernelProvider::Fast);
  EXPECT_EQ(negative->find(KernelProvider::Any)->provider, KernelProvider::Fast);
  EXPECT_EQ(middle->find(KernelProvider::Any)->provider, KernelProvider::Dnnl);
  EXPECT_EQ(middle->find(KernelProvider::Fast), nullptr);
  auto choice = backend_cpu::KernelRegistry::instance().choose(*last->op);
  EXPECT_NE(choice.explanation().find("the fast kernel's row pass is faster"), std::string::npos)
      << choice.explanation();
  EXPECT_EQ(op("LogSoftmaxGrad", DataType::FLOAT, {2, 3, 4}, -1)->find(KernelProvider::Fast), nullptr);
  EXPECT_EQ(op("SoftmaxGrad", DataType::DOUBLE, {2, 3, 4}, -1)->find(KernelProvider::Fast), nullptr);
}
