// The fast ReduceSum and ReduceMean (backend_cpu/fast/reduce.cpp) on FLOAT16 and BFLOAT16 input
// over [A, R, B] (mixed precision's bias gradients): against the reference kernel on the same
// 16-bit data, and against the fp32 reference kernel on the data widened.

#include "fast_cases.hpp"
#include "kernel_compare.hpp"
#include "op_runner.hpp"

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

using namespace popart;

using backend_cpu::KernelProvider;

POPART_FAST_KERNEL_COMPARED("ai.onnx", "ReduceSum");
POPART_FAST_KERNEL_COMPARED("ai.onnx", "ReduceMean");

namespace {

/// A ReduceSum or ReduceMean-18 of a \p type tensor of \p shape over constant \p axes, set up.
struct ReduceGraph {
  ReduceGraph(const char *type, DataType dtype, const Shape &shape, const std::vector<int64_t> &axes, int64_t keep) {
    ir::registerBuiltinOps();
    backend_cpu::registerBuiltinKernels();
    g.opsets()["ai.onnx"] = 18;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(dtype, shape));
    g.addConst("axes", TensorData::fromInt64({static_cast<int64_t>(axes.size())}, axes));
    ir::Attributes a;
    a.set("keepdims", keep);
    op = &g.addOp(type, "ai.onnx", 18, "reduce", std::move(a), {"x", "axes"}, {"y"});
    op->def->setup(*op);
  }
  ir::Graph g;
  ir::Op *op = nullptr;
};

TensorData runKernel(const ir::Op &op, KernelProvider provider, const TensorData &x) {
  auto kernel = backend_cpu::createKernel(op, provider);
  TensorData y(op.outInfo(0));
  for (int64_t i = 0; i < y.info().elementCount(); ++i)
    y.as<uint16_t>()[i] = 0x7777; // garbage: a second run must not accumulate
  const void *in[] = {x.data(), op.input(1).data()->data()};
  void *out = y.data();
  kernel->run({in, 2, &out, 1});
  kernel->run({in, 2, &out, 1});
  return y;
}

TEST(FastReduce16, SumAndMeanOfSixteenBitTypesMatchTheReferences) {
  std::mt19937 rng(31);
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
  };
  std::vector<Case> cases{{{2048, 300}, {0}},            // a bias gradient, one block: R cut into slices
                          {{512, 1100}, {0}},            // three blocks, the last one a tail
                          {{16, 128, 256}, {0, 1}},      // leading axes of a [batch, sequence, features] gradient
                          {{4, 96, 700}, {1}},           // [A, R, B]
                          {{64, 3000}, {1}},             // row sums (B = 1)
                          {{7, 5}, {0, 1}},              // everything, small
                          {{2, 9000, 3}, {1}},           // many rows, few columns
                          {{1, 1, 37}, {0}},             // nothing reduced but size-1 axes
                          {{8, 32, 14, 14}, {0, 2, 3}}}; // a convolution's bias gradient ([Q, A, R])
  for (DataType type : {DataType::BFLOAT16, DataType::FLOAT16})
    for (const Case &c : cases)
      for (const char *opType : {"ReduceSum", "ReduceMean"})
        for (int64_t keep : {0, 1}) {
          ReduceGraph r(opType, type, c.shape, c.axes, keep);
          std::string what = std::string(opType) + " of " + toString(type) + " " + toString(c.shape) + " keepdims " +
                             std::to_string(keep);
          ASSERT_NE(backend_cpu::KernelRegistry::instance().find(*r.op, KernelProvider::Fast), nullptr) << what;
          TensorData x = op_runner::randomTensor(type, c.shape, rng, -3, 3);
          TensorData fast = runKernel(*r.op, KernelProvider::Fast, x);
          TensorData ref = runKernel(*r.op, KernelProvider::Reference, x);
          ASSERT_EQ(fast.info(), ref.info()) << what;
          // Both round a sum of exact values once (f32 against double): an ulp of the type apart
          // at most.
          EXPECT_LE(kernel_compare::maxRelDiff(fast, ref), 2 * kernel_compare::unitRoundoff(type)) << what;
          int64_t reduced =
              c.shape.empty() ? 1 : x.info().elementCount() / std::max<int64_t>(1, fast.info().elementCount());
          kernel_compare::expectSixteenBitMatchesFp32Reference(
              KernelProvider::Fast, *r.op, rng,
              [](size_t, std::mt19937 &g) { return std::uniform_real_distribution<float>(-3, 3)(g); },
              kernel_compare::sixteenBitTolerance(type, reduced));
        }
}

TEST(FastReduce16, DeclinesOtherTypesAndShapes) {
  ReduceGraph twoRuns("ReduceSum", DataType::BFLOAT16, {4, 5, 6, 7}, {1, 3}, 0);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*twoRuns.op, KernelProvider::Fast), nullptr);
  ReduceGraph ints("ReduceSum", DataType::INT32, {4, 5}, {0}, 0);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*ints.op, KernelProvider::Fast), nullptr);
  // The bias gradient oneDNN 2.6 declines in bf16 runs on the fast kernel.
  ReduceGraph bias("ReduceSum", DataType::BFLOAT16, {2048, 8000}, {0}, 0);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*bias.op)->provider, KernelProvider::Fast);
}

} // namespace
