// The comparisons that judge kernels (kernel_compare.hpp) must fail on NaN and infinity:
// std::max(worst, NaN) is worst, so a maximum taken that way let a kernel that writes NaN pass.

#include "kernel_compare.hpp"

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace popart;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TensorData values(DataType type, const std::vector<double> &v) {
  return TensorData::fromDoubles(type, {static_cast<int64_t>(v.size())}, v);
}

} // namespace

TEST(KernelCompare, NaNAndInfinityFailEveryTolerance) {
  EXPECT_EQ(std::max(0.5, kNaN), 0.5); // the defect: a NaN difference vanishes from the maximum
  EXPECT_EQ(kernel_compare::worseOf(0.5, kNaN), kInf);
  EXPECT_EQ(kernel_compare::worseOf(0.5, 0.25), 0.5);
  EXPECT_EQ(kernel_compare::worseOf(0.5, 0.75), 0.75);

  for (DataType type : {DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16}) {
    SCOPED_TRACE(toString(type));
    TensorData want = values(type, {1, -2, 3, 0.5});
    EXPECT_EQ(kernel_compare::maxRelDiff(values(type, {1, -2, 3, 0.5}), want), 0.0);
    EXPECT_NEAR(kernel_compare::maxRelDiff(values(type, {1, -2, 3.5, 0.5}), want), 0.125, 1e-3);
    // A kernel that writes NaN or an infinity where the reference has a number, and the reverse.
    for (double bad : {kNaN, kInf, -kInf}) {
      EXPECT_EQ(kernel_compare::maxRelDiff(values(type, {1, -2, bad, 0.5}), want), kInf) << bad;
      EXPECT_EQ(kernel_compare::maxRelDiff(want, values(type, {1, -2, bad, 0.5})), kInf) << bad;
      // Both sides non-finite: the test data was meant to stay finite, so that fails too.
      EXPECT_EQ(kernel_compare::maxRelDiff(values(type, {1, -2, bad, 0.5}), values(type, {1, -2, bad, 0.5})), kInf)
          << bad;
    }
  }
  // Tensors of different sizes never agree.
  EXPECT_EQ(kernel_compare::maxRelDiff(values(DataType::FLOAT, {1, 2}), values(DataType::FLOAT, {1, 2, 3})), kInf);
}

TEST(KernelCompare, ANaNOutputFailsTheOneDnnAgainstReferenceCheck) {
  // NaN in, NaN out of both kernels of Add: the comparison must report a failure, not agreement.
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 14;
  for (const char *id : {"a", "b"})
    g.addTensor(id, ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 8}));
  ir::Op &op = g.addOp("Add", "ai.onnx", 14, "", {}, {"a", "b"}, {"y"});
  op.def->setup(op);
  ASSERT_EQ(backend_cpu::KernelRegistry::instance().find(op)->provider, backend_cpu::KernelProvider::Dnnl);
  std::mt19937 rng(5);
  int drawn = 0;
  auto fill = [&](size_t, std::mt19937 &) { return ++drawn == 7 ? std::numeric_limits<float>::quiet_NaN() : 1.f; };
  EXPECT_NONFATAL_FAILURE(kernel_compare::expectDnnlMatchesReference(op, rng, fill), "Add output 0");
  // The same op on finite data passes: the failure above is the NaN's.
  drawn = 100;
  kernel_compare::expectDnnlMatchesReference(op, rng, fill);
}
