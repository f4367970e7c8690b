// The memory report's arena peak: which step planMemory finds at the peak and what is live there,
// checked against byte counts worked out by hand from the shapes, and the text of the report. And
// what the report showed at fp16.32's peaks: the FLOAT16 MatMul's scratch, bounded by its operands.

#include "kernel_compare.hpp"

#include "backend_cpu/plan.hpp"
#include "ir/passes/passes.hpp"
#include "session/profile.hpp"

#include <gtest/gtest.h>

#include <random>

using namespace popart;
using namespace popart::ir;

namespace {

/// x [256, 64] -> MatMul(w [64, 128]) -> a -> Relu -> b -> MatMul(w2 [128, 10]) -> c -> Relu -> y,
/// steps 0 to 3; x is the graph input and y its output.
void buildChain(Graph &g) {
  registerBuiltinOps();
  g.addTensor("x", TensorKind::Stream, TensorInfo(DataType::FLOAT, {256, 64}));
  g.addInput("x");
  for (auto [id, shape] : {std::pair<const char *, Shape>{"w", {64, 128}}, {"w2", {128, 10}}}) {
    Tensor &w = g.addTensor(id, TensorKind::Variable, TensorInfo(DataType::FLOAT, shape));
    w.setData(std::make_shared<TensorData>(TensorInfo(DataType::FLOAT, shape)));
  }
  g.addOp("MatMul", "", 13, "mm1", {}, {"x", "w"}, {"a"});
  g.addOp("Relu", "", 13, "relu1", {}, {"a"}, {"b"});
  g.addOp("MatMul", "", 13, "mm2", {}, {"b", "w2"}, {"c"});
  g.addOp("Relu", "", 13, "relu2", {}, {"c"}, {"y"});
  g.addOutput("y");
  inferShapes(g, nullptr);
}

} // namespace

TEST(MemoryReport, PlanFindsThePeakStepAndWhatIsLiveThere) {
  Graph g;
  buildChain(g);
  std::vector<Op *> schedule = g.schedule();
  ASSERT_EQ(schedule.size(), 4u);
  std::vector<TensorId> pinned{"x", "y"};
  // 1000 bytes of scratch in step 1 (planned as 1024, aligned to 64), none elsewhere.
  backend_cpu::MemoryPlan mp = backend_cpu::planMemory(schedule, pinned, g, {}, {}, {0, 1000, 0, 0});
  const int64_t x = 256 * 64 * 4, a = 256 * 128 * 4, b = a, c = 256 * 10 * 4, y = c, scratch = 1024;
  // Live per step: 0 {x, a, y}; 1 {x, a, b, y, scratch}; 2 {x, b, c, y}; 3 {x, c, y}.
  EXPECT_EQ(mp.peakStep, 1u);
  EXPECT_EQ(mp.peakLiveBytes, x + a + b + y + scratch);
  EXPECT_LE(mp.peakLiveBytes, mp.arenaBytes);
  ASSERT_EQ(mp.peakLive.size(), 5u);
  // Largest first, ties by name.
  EXPECT_EQ(mp.peakLive[0].id, "a");
  EXPECT_EQ(mp.peakLive[0].bytes, a);
  EXPECT_EQ(mp.peakLive[0].first, 0u);
  EXPECT_EQ(mp.peakLive[0].last, 1u);
  EXPECT_EQ(mp.peakLive[1].id, "b");
  EXPECT_EQ(mp.peakLive[1].bytes, b);
  EXPECT_EQ(mp.peakLive[2].id, "x");
  EXPECT_EQ(mp.peakLive[2].bytes, x);
  EXPECT_TRUE(mp.peakLive[2].pinned);
  EXPECT_EQ(mp.peakLive[3].id, "y");
  EXPECT_EQ(mp.peakLive[3].bytes, y);
  EXPECT_TRUE(mp.peakLive[3].pinned);
  EXPECT_EQ(mp.peakLive[4].scratchStep, 1);
  EXPECT_EQ(mp.peakLive[4].bytes, scratch);
  EXPECT_FALSE(mp.peakLive[0].pinned);
  int64_t sum = 0;
  for (const auto &block : mp.peakLive)
    sum += block.bytes;
  EXPECT_EQ(sum, mp.peakLiveBytes);
}

TEST(MemoryReport, ScratchLargerThanTheTensorsMovesThePeak) {
  Graph g;
  buildChain(g);
  // 1 MB of scratch in step 3 outweighs step 1's tensors.
  backend_cpu::MemoryPlan mp = backend_cpu::planMemory(g.schedule(), {"x", "y"}, g, {}, {}, {0, 0, 0, 1 << 20});
  EXPECT_EQ(mp.peakStep, 3u);
  EXPECT_EQ(mp.peakLiveBytes, (1 << 20) + 256 * 64 * 4 + 2 * 256 * 10 * 4); // scratch, x, c, y
  ASSERT_FALSE(mp.peakLive.empty());
  EXPECT_EQ(mp.peakLive[0].scratchStep, 3);
  EXPECT_TRUE(mp.peakLive[0].id.empty());
}

TEST(MemoryReport, ArenaPeakListsTypeShapeAndBytesOfTheLargest) {
  Graph g;
  buildChain(g);
  backend_cpu::ExecutionPlan plan(g, {backend_cpu::KernelProvider::Reference});
  const backend_cpu::MemoryPlan &mp = plan.memoryPlan();
  // The reference kernels run nothing in place and take no scratch: x, a, b and y at step 1.
  EXPECT_EQ(mp.peakLiveBytes, 256 * 64 * 4 + 2 * 256 * 128 * 4 + 256 * 10 * 4);
  const std::string report = session::arenaPeak(plan, 2);
  SCOPED_TRACE(report);
  EXPECT_NE(report.find("arena peak: 0.34 MB live at step 1 (Relu 'relu1')"), std::string::npos);
  EXPECT_NE(report.find("0.13 MB  FLOAT     [256,128]           0-1          a\n"), std::string::npos);
  EXPECT_NE(report.find("[256,128]           1-2          b\n"), std::string::npos);
  // x (65536 bytes) and y (10240) are the rest.
  EXPECT_NE(report.find("0.08 MB in 2 more"), std::string::npos);
  EXPECT_EQ(report.find("[256,64]"), std::string::npos);
  const std::string all = session::arenaPeak(plan);
  EXPECT_NE(all.find("[256,64]            all          x (graph input or output)"), std::string::npos) << all;
}

// What fp16.32's peaks showed: the FLOAT16 MatMul writing an fp32 weight gradient
// (Fusion::outputType) kept an f32 block of the result in its scratch as large as the result
// (the MLP's first weight gradient, [784, 1024]: 3.2 of its 5.1 MB of scratch, at the arena's
// peak) before copying it out. oneDNN now writes such a result in place: the scratch holds only the
// widened operands, and the result is the fp32 reference's, whether the product is one block or many.
TEST(MemoryReport, HalfMatMulWritesAFloatResultInPlaceOfAScratchBlock) {
  registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  struct Case {
    Shape a, b;
  };
  for (const Case &c : std::vector<Case>{
           {{784, 256}, {256, 1024}}, {{3000, 700}, {700, 80}}, {{300, 1100}, {1100, 1000}}, {{4, 96}, {96, 80}}}) {
    for (bool floatOutput : {false, true}) {
      Graph g;
      g.opsets()["ai.onnx"] = 13;
      g.addTensor("a", TensorKind::Stream, TensorInfo(DataType::FLOAT16, c.a));
      g.addTensor("b", TensorKind::Stream, TensorInfo(DataType::FLOAT16, c.b));
      Op &op = g.addOp("MatMul", "ai.onnx", 13, "mm", {}, {"a", "b"}, {"y"});
      if (floatOutput) op.fusion.outputType = DataType::FLOAT;
      op.def->setup(op);
      SCOPED_TRACE(toString(c.a) + " x " + toString(c.b) + (floatOutput ? " to FLOAT" : " to FLOAT16"));
      auto kernel = backend_cpu::createKernel(op, backend_cpu::KernelProvider::Dnnl);
      // The widened operands (A's block of rows, B or its panel of columns), and Y's block.
      const int64_t k = c.a[1], n = c.b[1];
      const int64_t operandsF32 = 4 * (c.a[0] * k + k * n);
      // With a FLOAT output, less than a block of Y beyond the operands (and oneDNN's scratchpad,
      // a few hundred bytes for the smallest).
      if (floatOutput)
        EXPECT_LT(kernel->scratchBytes(), operandsF32 + 4 * std::min<int64_t>(c.a[0], 16) * n) << "no block of Y";
      else
        EXPECT_GT(kernel->scratchBytes(), 4 * std::min<int64_t>(c.a[0], 16) * n) << "Y's block";
      std::mt19937 rng(7);
      kernel_compare::expectSixteenBitMatchesFp32Reference(
          backend_cpu::KernelProvider::Dnnl, op, rng,
          [](size_t, std::mt19937 &r) { return std::uniform_real_distribution<float>(-2, 2)(r); },
          kernel_compare::sixteenBitTolerance(DataType::FLOAT16, k));
    }
  }
}
