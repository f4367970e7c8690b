// The fast f32 kernels of the norm and reduce families (backend_cpu/fast/norm.cpp, reduce.cpp)
// against the reference kernels: BatchNormalization and its gradient, ReduceSum and ReduceMean
// over [A, R, B], on the shapes and attributes that select them and their edges (vector
// remainders, empty batches, omitted outputs, the fused Relu, NaN and infinity).

#include "fast_cases.hpp"
#include "kernel_compare.hpp"
#include "op_runner.hpp"

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"
#include "ir/internal_attributes.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace popart;

using backend_cpu::KernelProvider;
using backend_cpu::KernelRegistry;
using op_runner::Input;
using op_runner::randomTensor;
using op_runner::runOp;

POPART_FAST_KERNEL_COMPARED("ai.onnx", "BatchNormalization");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "BatchNormalizationGrad");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "ReduceSum");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "ReduceMean");

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

/// Adds \p type with a stream input of each of \p inputs' infos (null: omitted) and the outputs
/// where \p outputs is true, and sets it up.
ir::Op &addOp(ir::Graph &g, const std::string &type, const std::string &domain, int version,
              const ir::Attributes &attrs, const std::vector<const TensorData *> &inputs,
              const std::vector<bool> &outputs) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = version;
  std::vector<TensorId> ins, outs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ins.push_back(inputs[i] ? "in" + std::to_string(i) : "");
    if (inputs[i]) g.addTensor(ins.back(), ir::TensorKind::Stream, inputs[i]->info());
  }
  for (size_t i = 0; i < outputs.size(); ++i)
    outs.push_back(outputs[i] ? "out" + std::to_string(i) : "");
  ir::Op &op = g.addOp(type, domain, version, "", attrs, ins, outs);
  op.def->setup(op);
  return op;
}

/// Runs \p provider's kernel of \p op on \p inputs (null: omitted); the outputs (empty where
/// omitted) start as garbage, and the kernel runs twice (a second run must not accumulate).
std::vector<TensorData> runKernel(const ir::Op &op, KernelProvider provider,
                                  const std::vector<const TensorData *> &inputs) {
  std::vector<const void *> in;
  for (const TensorData *t : inputs)
    in.push_back(t ? t->data() : nullptr);
  std::vector<TensorData> out;
  std::vector<void *> outp;
  for (size_t i = 0; i < op.outputCount(); ++i) {
    out.emplace_back(op.hasOutput(i) ? op.outInfo(i) : TensorInfo(DataType::FLOAT, {0}));
    for (int64_t k = 0; k < out.back().info().elementCount(); ++k)
      out.back().as<float>()[k] = 1e6f;
    outp.push_back(op.hasOutput(i) ? out.back().data() : nullptr);
  }
  auto kernel = backend_cpu::createKernel(op, provider);
  for (int run = 0; run < 2; ++run)
    kernel->run({in.data(), in.size(), outp.data(), outp.size()});
  return out;
}

/// maxRelDiff, except that a NaN or infinity in \p want must be the same in \p got (any NaN for
/// a NaN) instead of failing; a non-finite \p got where \p want is finite still fails. Counts the
/// non-finite values of \p want into \p nonFinite.
double maxRelDiffSameNonFinite(const TensorData &got, const TensorData &want, int64_t &nonFinite) {
  if (got.info().elementCount() != want.info().elementCount()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (int64_t i = 0; i < want.info().elementCount(); ++i) {
    double g = got.valueAsDouble(i), w = want.valueAsDouble(i);
    if (std::isnan(w) || std::isinf(w)) {
      ++nonFinite;
      bool same = std::isnan(w) ? std::isnan(g) : g == w;
      if (!same) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = kernel_compare::worseOf(worst, kernel_compare::relDiff(g, w));
  }
  return worst;
}

/// Expects the fast kernel to accept \p op and, on \p inputs, to write every output the
/// reference kernel writes within \p tolerance (relative); with \p nonFinite, NaN and infinity
/// must match the reference's and the reference must write at least one.
void expectFastMatchesReference(const ir::Op &op, const std::vector<const TensorData *> &inputs, double tolerance,
                                bool nonFinite = false) {
  backend_cpu::registerBuiltinKernels();
  const backend_cpu::KernelEntry *fast = KernelRegistry::instance().find(op, KernelProvider::Fast);
  ASSERT_NE(fast, nullptr) << op.type << ": the fast kernel declines "
                           << KernelRegistry::instance().choose(op, KernelProvider::Fast).explanation();
  ASSERT_EQ(fast->provider, KernelProvider::Fast);
  std::vector<TensorData> want = runKernel(op, KernelProvider::Reference, inputs);
  std::vector<TensorData> got = runKernel(op, KernelProvider::Fast, inputs);
  int64_t nonFiniteCount = 0;
  for (size_t i = 0; i < op.outputCount(); ++i) {
    if (!op.hasOutput(i)) continue;
    double diff = nonFinite ? maxRelDiffSameNonFinite(got[i], want[i], nonFiniteCount)
                            : kernel_compare::maxRelDiff(got[i], want[i]);
    EXPECT_LE(diff, tolerance) << op.type << " output " << i;
  }
  if (nonFinite) {
    EXPECT_GT(nonFiniteCount, 0) << op.type << ": the reference wrote no NaN or infinity";
  }
}

/// The statistics and parameters of a BatchNormalization over \p x: scale, bias, mean, var.
struct BatchNormInputs {
  TensorData x, scale, bias, mean, var;
  BatchNormInputs(const Shape &shape, std::mt19937 &rng)
      : x(randomTensor(DataType::FLOAT, shape, rng, -2, 3)),
        scale(randomTensor(DataType::FLOAT, {shape[1]}, rng, 0.5, 2)),
        bias(randomTensor(DataType::FLOAT, {shape[1]}, rng, -1, 1)),
        mean(randomTensor(DataType::FLOAT, {shape[1]}, rng, -1, 1)),
        var(randomTensor(DataType::FLOAT, {shape[1]}, rng, 0.5, 2)) {}
  std::vector<Input> streams() const { return {{"x", x}, {"s", scale}, {"b", bias}, {"m", mean}, {"v", var}}; }
  std::vector<const TensorData *> pointers() const { return {&x, &scale, &bias, &mean, &var}; }
};

/// Shapes that take the fast BatchNormalization kernels: (N, C) with one value per plane, planes
/// of 1 to 1000 elements whose sizes leave remainders after every vector width (7, 17, 33), a
/// batch of one, and NCHW-like ones.
const std::vector<Shape> kBatchNormShapes{{2, 4, 7},  {3, 2, 4, 5}, {2, 3, 4, 2, 3}, {4, 16, 9, 9}, {5, 3},
                                          {3, 5, 17}, {2, 3, 33},   {1, 2, 1000},    {1, 1, 1, 1}};

} // namespace

TEST(FastNorm, BatchNormMatchesTheReference) {
  std::mt19937 rng(41);
  for (const Shape &x : kBatchNormShapes) {
    BatchNormInputs in(x, rng);
    for (int training : {0, 1})
      for (float momentum : {0.9f, 0.f}) {
        ir::Attributes a;
        a.set("epsilon", 1e-3f);
        a.set("momentum", momentum);
        a.set("training_mode", int64_t{training});
        size_t outs = training ? 3 : 1;
        auto fast = runOp("BatchNormalization", 15, a, in.streams(), {}, outs, "ai.onnx", KernelProvider::Fast);
        auto ref = runOp("BatchNormalization", 15, a, in.streams(), {}, outs, "ai.onnx", KernelProvider::Reference);
        for (size_t i = 0; i < outs; ++i)
          EXPECT_LE(kernel_compare::maxRelDiff(fast[i], ref[i]), 2e-6)
              << "output " << i << (training ? " training" : " inference") << " momentum " << momentum << ", shape "
              << toString(x);
      }
  }
}

TEST(FastNorm, BatchNormSavedStatisticsAndUnbiasedRunningVarianceMatchTheReference) {
  // Opset 9: training is implied by the running and saved statistics outputs.
  std::mt19937 rng(42);
  for (const Shape &x : std::vector<Shape>{{3, 4, 5}, {2, 3, 17}, {6, 2}})
    for (int64_t unbiased : {0, 1}) {
      BatchNormInputs in(x, rng);
      ir::Attributes a;
      a.set("epsilon", 1e-5f);
      a.set(ir::internal_attr::kUnbiasedRunningVar, unbiased);
      auto fast = runOp("BatchNormalization", 9, a, in.streams(), {}, 5, "ai.onnx", KernelProvider::Fast);
      auto ref = runOp("BatchNormalization", 9, a, in.streams(), {}, 5, "ai.onnx", KernelProvider::Reference);
      for (size_t i = 0; i < 5; ++i)
        EXPECT_LE(kernel_compare::maxRelDiff(fast[i], ref[i]), 2e-6)
            << "output " << i << (unbiased ? " unbiased" : "") << ", shape " << toString(x);
    }
}

TEST(FastNorm, BatchNormOfAnEmptyBatchMatchesTheReference) {
  // No values per channel: the batch statistics are 0 in both, and the running ones decay.
  std::mt19937 rng(43);
  BatchNormInputs in({0, 3, 5}, rng);
  for (int training : {0, 1}) {
    ir::Graph g;
    ir::Attributes a;
    a.set("training_mode", int64_t{training});
    std::vector<bool> outs{true, training != 0, training != 0};
    expectFastMatchesReference(addOp(g, "BatchNormalization", "ai.onnx", 15, a, in.pointers(), outs), in.pointers(),
                               1e-6);
  }
}

TEST(FastNorm, BatchNormWithAFusedReluMatchesTheReference) {
  // fuseBatchNormRelu's Relu, after the affine transform; a NaN stays NaN through it.
  std::mt19937 rng(44);
  for (const Shape &x : std::vector<Shape>{{2, 4, 7}, {3, 3, 33}, {4, 2}})
    for (int training : {0, 1})
      for (bool withNaN : {false, true}) {
        BatchNormInputs in(x, rng);
        if (withNaN) in.x.as<float>()[1] = kNaN;
        ir::Graph g;
        ir::Attributes a;
        a.set("training_mode", int64_t{training});
        std::vector<bool> outs{true, training != 0, training != 0};
        ir::Op &op = addOp(g, "BatchNormalization", "ai.onnx", 15, a, in.pointers(), outs);
        op.fusion.activation.kind = ir::FusedActivation::Kind::Relu;
        SCOPED_TRACE(toString(x) + (training ? " training" : " inference") + (withNaN ? " with a NaN" : ""));
        expectFastMatchesReference(op, in.pointers(), 2e-6, withNaN);
        // The Relu applies: no output is negative.
        for (double y : runKernel(op, KernelProvider::Fast, in.pointers())[0].toDoubleVector())
          ASSERT_FALSE(y < 0) << y;
      }
}

TEST(FastNorm, BatchNormPropagatesNaNAndInfinityAsTheReference) {
  std::mt19937 rng(45);
  BatchNormInputs in({2, 3, 19}, rng);
  in.x.as<float>()[0] = kNaN;                    // channel 0
  in.x.as<float>()[19 + 18] = kInf;              // channel 1, the plane's tail
  in.x.as<float>()[3 * 19 + 2 * 19 + 5] = -kInf; // batch 1, channel 2
  for (int training : {0, 1}) {
    ir::Graph g;
    ir::Attributes a;
    a.set("training_mode", int64_t{training});
    std::vector<bool> outs{true, training != 0, training != 0};
    SCOPED_TRACE(training ? "training" : "inference");
    expectFastMatchesReference(addOp(g, "BatchNormalization", "ai.onnx", 15, a, in.pointers(), outs), in.pointers(),
                               2e-6, true);
  }
  // A NaN running variance: that channel's output is NaN in inference.
  BatchNormInputs nanVar({2, 3, 9}, rng);
  nanVar.var.as<float>()[1] = kNaN;
  ir::Graph g;
  expectFastMatchesReference(addOp(g, "BatchNormalization", "ai.onnx", 15, {}, nanVar.pointers(), {true}),
                             nanVar.pointers(), 2e-6, true);
}

TEST(FastNorm, BatchNormGradMatchesTheReference) {
  std::mt19937 rng(46);
  for (const Shape &x : kBatchNormShapes) {
    BatchNormInputs in(x, rng);
    TensorData dY = randomTensor(DataType::FLOAT, x, rng, -1, 1);
    for (bool given : {false, true})
      for (float eps : {1e-3f, 0.1f}) {
        ir::Attributes a;
        a.set("epsilon", eps);
        std::vector<Input> ins{{"x", in.x}, {"s", in.scale}, {"dy", dY}};
        if (given) ins.insert(ins.end(), {{"m", in.mean}, {"v", in.var}});
        auto fast = runOp("BatchNormalizationGrad", 1, a, ins, {}, 3, "ai.graphcore", KernelProvider::Fast);
        auto ref = runOp("BatchNormalizationGrad", 1, a, ins, {}, 3, "ai.graphcore", KernelProvider::Reference);
        // dScale and dBias are sums of N·spatial products, in double in both kernels but from
        // f32 centred values in the fast one: 1e-5 relative.
        for (size_t i = 0; i < 3; ++i)
          EXPECT_LE(kernel_compare::maxRelDiff(fast[i], ref[i]), 1e-5)
              << "grad output " << i << (given ? " given statistics" : "") << " epsilon " << eps << ", shape "
              << toString(x);
      }
  }
}

TEST(FastNorm, BatchNormGradWithOmittedOutputsOrAnEmptyBatchMatchesTheReference) {
  std::mt19937 rng(47);
  for (const Shape &x : std::vector<Shape>{{3, 4, 17}, {0, 3, 5}})
    for (int variant = 0; variant < 3; ++variant)
      for (bool given : {false, true}) {
        // 0: every output; 1: dX only; 2: dScale and dBias only.
        BatchNormInputs in(x, rng);
        TensorData dY = randomTensor(DataType::FLOAT, x, rng, -1, 1);
        std::vector<const TensorData *> ins{&in.x, &in.scale, &dY};
        if (given) ins.insert(ins.end(), {&in.mean, &in.var});
        ir::Graph g;
        ir::Attributes a;
        a.set("epsilon", 1e-3f);
        SCOPED_TRACE(toString(x) + " variant " + std::to_string(variant) + (given ? " given statistics" : ""));
        expectFastMatchesReference(
            addOp(g, "BatchNormalizationGrad", "ai.graphcore", 1, a, ins, {variant != 2, variant != 1, variant != 1}),
            ins, 1e-5);
      }
}

TEST(FastNorm, BatchNormGradPropagatesNaNAsTheReference) {
  std::mt19937 rng(48);
  BatchNormInputs in({2, 3, 21}, rng);
  TensorData dY = randomTensor(DataType::FLOAT, {2, 3, 21}, rng, -1, 1);
  in.x.as<float>()[4] = kNaN;     // channel 0: every gradient of it
  dY.as<float>()[21 + 20] = kNaN; // channel 1: its sums and dX
  for (bool given : {false, true}) {
    std::vector<const TensorData *> ins{&in.x, &in.scale, &dY};
    if (given) ins.insert(ins.end(), {&in.mean, &in.var});
    ir::Graph g;
    SCOPED_TRACE(given ? "given statistics" : "statistics from X");
    expectFastMatchesReference(addOp(g, "BatchNormalizationGrad", "ai.graphcore", 1, {}, ins, {true, true, true}), ins,
                               1e-5, true);
  }
}

TEST(FastNorm, FastBatchNormKernelsTakeF32AndDeclineTheRest) {
  backend_cpu::registerBuiltinKernels();
  std::mt19937 rng(49);
  BatchNormInputs in({2, 4, 7}, rng);
  TensorData dY = randomTensor(DataType::FLOAT, {2, 4, 7}, rng, -1, 1);
  {
    // NCHW-like f32, where oneDNN has only generic loops: the fast kernels run it by default.
    ir::Graph g, g2;
    ir::Op &fwd = addOp(g, "BatchNormalization", "ai.onnx", 15, {}, in.pointers(), {true});
    ir::Op &grad =
        addOp(g2, "BatchNormalizationGrad", "ai.graphcore", 1, {}, {&in.x, &in.scale, &dY}, {true, true, true});
    EXPECT_EQ(KernelRegistry::instance().find(fwd)->provider, KernelProvider::Fast);
    EXPECT_EQ(KernelRegistry::instance().find(grad)->provider, KernelProvider::Fast);
  }
  {
    // Opset 6's spatial = 0 (statistics per position) is the reference's.
    TensorData perPosition = randomTensor(DataType::FLOAT, {4 * 7}, rng, 0.5, 2);
    ir::Graph g;
    ir::Attributes a;
    a.set("spatial", int64_t{0});
    ir::Op &op = addOp(g, "BatchNormalization", "ai.onnx", 7, a,
                       {&in.x, &perPosition, &perPosition, &perPosition, &perPosition}, {true});
    EXPECT_EQ(KernelRegistry::instance().find(op, KernelProvider::Fast), nullptr);
    EXPECT_NE(KernelRegistry::instance().choose(op).explanation().find("fast declined: spatial = 0"), std::string::npos)
        << KernelRegistry::instance().choose(op).explanation();
  }
  // Other float types: the reference's.
  for (DataType type : {DataType::DOUBLE, DataType::FLOAT16}) {
    auto cast = [&](const TensorData &t) {
      return TensorData::fromDoubles(type, t.info().shape(), t.toDoubleVector());
    };
    TensorData x = cast(in.x), s = cast(in.scale), b = cast(in.bias), m = cast(in.mean), v = cast(in.var),
               dy = cast(dY);
    ir::Graph g, g2;
    ir::Op &fwd = addOp(g, "BatchNormalization", "ai.onnx", 15, {}, {&x, &s, &b, &m, &v}, {true});
    ir::Op &grad = addOp(g2, "BatchNormalizationGrad", "ai.graphcore", 1, {}, {&x, &s, &dy}, {true, true, true});
    EXPECT_EQ(KernelRegistry::instance().find(fwd, KernelProvider::Fast), nullptr) << toString(type);
    EXPECT_EQ(KernelRegistry::instance().find(grad, KernelProvider::Fast), nullptr) << toString(type);
    EXPECT_EQ(KernelRegistry::instance().find(fwd)->provider, KernelProvider::Reference) << toString(type);
  }
}

namespace {

/// A ReduceSum or ReduceMean (opset 18: axes as a constant input) of \p x over \p axes.
std::vector<TensorData> runReduce(const char *type, const TensorData &x, const std::vector<int64_t> &axes,
                                  int64_t keepdims, int64_t noopWithEmptyAxes, KernelProvider provider,
                                  bool axesInput = true) {
  ir::Attributes attrs;
  attrs.set("keepdims", keepdims);
  if (noopWithEmptyAxes) attrs.set("noop_with_empty_axes", noopWithEmptyAxes);
  std::vector<Input> consts;
  if (axesInput) consts.push_back({"axes", TensorData::fromInt64({static_cast<int64_t>(axes.size())}, axes)});
  return runOp(type, 18, attrs, {{"x", x}}, consts, 1, "ai.onnx", provider);
}

struct ReduceCase {
  Shape shape;
  std::vector<int64_t> axes;
};

} // namespace

TEST(FastReduce, SumAndMeanMatchTheReference) {
  std::mt19937 rng(21);
  std::vector<ReduceCase> cases{// B = 1 (row sums), threaded over rows
                                {{64, 3000}, {1}},
                                {{5, 6, 7}, {1, 2}},
                                {{4, 5, 6}, {}},
                                {{4, 5, 6}, {0, 1, 2}},
                                {{4, 5, 6}, {-1}},
                                // A = 1 (column sums), B in one or more 512-column blocks with a tail
                                {{2048, 77}, {0}},
                                {{5, 6, 7}, {0, 1}},
                                {{80, 32}, {0}},
                                {{7, 1025}, {0}},
                                // [A, R, B]
                                {{5, 6, 7}, {1}},
                                {{3, 1, 700, 2}, {2}},
                                {{6, 1100, 3}, {-2}},
                                {{2, 3, 4, 5}, {1, 2}},
                                // [Q, A, R]: a convolution's bias gradient (NCHW over N, H, W)
                                {{8, 64, 28, 28}, {0, 2, 3}},
                                {{4, 5, 6}, {0, 2}},
                                {{3, 1, 7, 1, 9}, {0, 1, 3, 4}},
                                {{2, 16, 1, 1}, {0, 2, 3}},
                                // size-1 axes, reduced or kept, vanish; R may be 1
                                {{1, 1, 9}, {0}},
                                {{4, 1, 6}, {1}},
                                {{1, 5, 1, 6}, {0, 1, 2}},
                                {{3}, {0}},
                                // bias gradients: R cut into slices (fewer than 8 column blocks)
                                {{16, 128, 256}, {0, 1}},
                                {{2048, 1024}, {0}},
                                {{3, 70, 600}, {1}},
                                {{100, 3}, {0}}};
  for (const ReduceCase &c : cases) {
    TensorData x = randomTensor(DataType::FLOAT, c.shape, rng, -3, 3);
    for (const char *type : {"ReduceSum", "ReduceMean"})
      for (int64_t keep : {0, 1}) {
        auto fast = runReduce(type, x, c.axes, keep, 0, KernelProvider::Fast);
        auto ref = runReduce(type, x, c.axes, keep, 0, KernelProvider::Reference);
        ASSERT_EQ(fast[0].info().shape(), ref[0].info().shape()) << type;
        // Both sum in double and round once: at most an ulp of f32 apart.
        EXPECT_LE(kernel_compare::maxRelDiff(fast[0], ref[0]), 1e-6)
            << type << " keepdims " << keep << " over " << c.axes.size() << " axes of " << toString(c.shape);
      }
  }
}

TEST(FastReduce, OlderOpsetsWithAxesAttributesMatchTheReference) {
  // ReduceSum 13 has the axes input, ReduceMean 13 the attribute, which import rewrites to the
  // input; no axes at all reduces everything.
  std::mt19937 rng(22);
  TensorData x = randomTensor(DataType::FLOAT, {6, 40, 9}, rng, -3, 3);
  for (const std::vector<int64_t> &axes : std::vector<std::vector<int64_t>>{{1}, {0, 1}, {}}) {
    ir::Attributes sumAttrs, meanAttrs;
    std::vector<Input> consts;
    if (!axes.empty()) {
      consts.push_back({"axes", TensorData::fromInt64({static_cast<int64_t>(axes.size())}, axes)});
      meanAttrs.set("axes", axes);
    }
    auto sumFast = runOp("ReduceSum", 13, sumAttrs, {{"x", x}}, consts, 1, "ai.onnx", KernelProvider::Fast);
    auto sumRef = runOp("ReduceSum", 13, sumAttrs, {{"x", x}}, consts, 1, "ai.onnx", KernelProvider::Reference);
    auto meanFast = runOp("ReduceMean", 13, meanAttrs, {{"x", x}}, {}, 1, "ai.onnx", KernelProvider::Fast);
    auto meanRef = runOp("ReduceMean", 13, meanAttrs, {{"x", x}}, {}, 1, "ai.onnx", KernelProvider::Reference);
    EXPECT_LE(kernel_compare::maxRelDiff(sumFast[0], sumRef[0]), 1e-6) << axes.size() << " axes";
    EXPECT_LE(kernel_compare::maxRelDiff(meanFast[0], meanRef[0]), 1e-6) << axes.size() << " axes";
  }
}

TEST(FastReduce, SumAndMeanPropagateNaNAndInfinityAsTheReference) {
  std::mt19937 rng(23);
  for (const ReduceCase &c : std::vector<ReduceCase>{{{64, 300}, {1}}, {{300, 64}, {0}}, {{2048, 256}, {0}}}) {
    TensorData x = randomTensor(DataType::FLOAT, c.shape, rng, -3, 3);
    float *p = x.as<float>();
    p[0] = kNaN;
    p[c.shape[1] + 1] = kInf; // with the -inf below: NaN
    p[2 * c.shape[1] + 1] = -kInf;
    p[5 * c.shape[1] + 7] = kInf;
    p[x.info().elementCount() - 1] = -kInf; // the last row's tail
    for (const char *type : {"ReduceSum", "ReduceMean"}) {
      ir::Graph g;
      ir::Attributes a;
      std::vector<const TensorData *> ins{&x};
      ir::Op &op = [&]() -> ir::Op & {
        ir::registerBuiltinOps();
        g.opsets()["ai.onnx"] = 18;
        g.addTensor("x", ir::TensorKind::Stream, x.info());
        g.addConst("axes", TensorData::fromInt64({static_cast<int64_t>(c.axes.size())}, c.axes));
        ir::Op &op = g.addOp(type, "ai.onnx", 18, "", a, {"x", "axes"}, {"y"});
        op.def->setup(op);
        return op;
      }();
      SCOPED_TRACE(std::string(type) + " of " + toString(c.shape));
      expectFastMatchesReference(op, {&x, g.tensor("axes").data().get()}, 1e-6, true);
    }
  }
}

TEST(FastReduce, FastSumAndMeanDeclineWhatTheyDoNotRun) {
  backend_cpu::registerBuiltinKernels();
  std::mt19937 rng(24);
  auto choose = [&](const char *type, DataType dtype, const Shape &shape, const std::vector<int64_t> &axes,
                    int64_t noop) {
    ir::registerBuiltinOps();
    auto g = std::make_unique<ir::Graph>();
    g->opsets()["ai.onnx"] = 18;
    g->addTensor("x", ir::TensorKind::Stream, TensorInfo(dtype, shape));
    std::vector<TensorId> ins{"x"};
    if (!axes.empty() || noop) {
      g->addConst("axes", TensorData::fromInt64({static_cast<int64_t>(axes.size())}, axes));
      ins.push_back("axes");
    }
    ir::Attributes a;
    a.set("noop_with_empty_axes", noop);
    ir::Op &op = g->addOp(type, "ai.onnx", 18, "", a, ins, {"y"});
    op.def->setup(op);
    return std::make_pair(std::move(g), &op);
  };
  for (const char *type : {"ReduceSum", "ReduceMean"}) {
    SCOPED_TRACE(type);
    auto declines = [&](DataType dtype, const Shape &shape, const std::vector<int64_t> &axes, int64_t noop,
                        const char *reason) {
      auto [g, op] = choose(type, dtype, shape, axes, noop);
      EXPECT_EQ(KernelRegistry::instance().find(*op, KernelProvider::Fast), nullptr) << reason;
      std::string why = KernelRegistry::instance().choose(*op, KernelProvider::Fast).explanation();
      EXPECT_NE(why.find(reason), std::string::npos) << why;
    };
    declines(DataType::DOUBLE, {4, 5}, {0}, 0, "not f32");
    declines(DataType::FLOAT, {0, 5}, {0}, 0, "an empty input");
    declines(DataType::FLOAT, {4, 5}, {}, 1, "noop_with_empty_axes");
    declines(DataType::FLOAT, {4, 5, 6, 7}, {0, 2}, 0, "nor both ends");
    declines(DataType::FLOAT, {4, 5, 6, 7}, {1, 3}, 0, "nor both ends");
    declines(DataType::FLOAT, {3, 4, 5, 6, 7}, {0, 2, 4}, 0, "nor both ends");
    // [A, R, B]: the fast kernel, which oneDNN leaves to it where it has only plain C++ loops.
    auto [g, op] = choose(type, DataType::FLOAT, {80, 32}, {0}, 0);
    ASSERT_NE(KernelRegistry::instance().find(*op, KernelProvider::Fast), nullptr);
    EXPECT_NE(KernelRegistry::instance().find(*op)->provider, KernelProvider::Reference);
  }
  // The reference still reduces what the fast kernel declines.
  TensorData x = randomTensor(DataType::FLOAT, {4, 5, 6, 2}, rng, -3, 3);
  auto y = runReduce("ReduceSum", x, {0, 2}, 0, 0, KernelProvider::Any);
  std::vector<double> v = x.toDoubleVector();
  for (int64_t j = 0; j < 5; ++j)
    for (int64_t l = 0; l < 2; ++l) {
      double s = 0;
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t k = 0; k < 6; ++k)
          s += v[static_cast<size_t>(((i * 5 + j) * 6 + k) * 2 + l)];
      EXPECT_NEAR(y[0].valueAsDouble(j * 2 + l), s, 1e-5 * (1 + std::fabs(s))) << j << ", " << l;
    }
}
