// oneDNN Sum/Mean (sum primitive) and Pow with a constant exponent (eltwise_pow) against the
// reference kernels, and the cases they must leave to the reference.

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"
#include "kernel_compare.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <numeric>

using namespace popart;

namespace {

ir::Op &addOp(ir::Graph &g, const std::string &type, const std::vector<Shape> &shapes, const TensorData *exponent) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  g.opsets()["ai.onnx"] = 13;
  std::vector<TensorId> ins;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ins.push_back("x" + std::to_string(i));
    g.addTensor(ins.back(), ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, shapes[i]));
  }
  if (exponent) {
    ins.push_back("e");
    g.addConst("e", *exponent);
  }
  ir::Op &op = g.addOp(type, "ai.onnx", 13, "", {}, ins, {"y"});
  op.def->setup(op);
  return op;
}

backend_cpu::KernelProvider chosen(const ir::Op &op) {
  return backend_cpu::KernelRegistry::instance().find(op)->provider;
}

} // namespace

TEST(DnnlSumPow, SumAndMeanMatchReference) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  for (const char *type : {"Sum", "Mean"})
    for (size_t n : {2u, 3u, 5u}) {
      ir::Graph g;
      ir::Op &op = addOp(g, type, std::vector<Shape>(n, Shape{7, 33}), nullptr);
      ASSERT_EQ(chosen(op), backend_cpu::KernelProvider::Dnnl) << type << " of " << n;
      kernel_compare::expectDnnlMatchesReference(op, rng, [&](size_t, std::mt19937 &r) { return d(r); });
    }
  ir::Graph g; // broadcasting Sum stays on the reference kernel
  EXPECT_EQ(chosen(addOp(g, "Sum", {{7, 33}, {33}}, nullptr)), backend_cpu::KernelProvider::Reference);
}

TEST(DnnlSumPow, PowWithConstantExponentMatchesReference) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> d(0.1f, 3.f);
  for (float e : {2.0f, 0.5f, 3.0f, -1.0f}) {
    TensorData exponent = TensorData::scalarFloat(e);
    ir::Graph g;
    ir::Op &op = addOp(g, "Pow", {{5, 64}}, &exponent);
    ASSERT_EQ(chosen(op), backend_cpu::KernelProvider::Dnnl) << "exponent " << e;
    // The reference reads the exponent from its input buffer: give it the same value.
    kernel_compare::expectDnnlMatchesReference(op, rng, [&](size_t i, std::mt19937 &r) { return i == 1 ? e : d(r); });
  }
  ir::Graph g; // a fed exponent stays on the reference kernel
  EXPECT_EQ(chosen(addOp(g, "Pow", {{5, 64}, {}}, nullptr)), backend_cpu::KernelProvider::Reference);
}

TEST(DnnlTranspose, MatchesReferenceOnRandomPermutations) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  int onDnnl = 0;
  for (int trial = 0; trial < 30; ++trial) {
    size_t rank = 2 + rng() % 4;
    Shape shape;
    for (size_t i = 0; i < rank; ++i)
      shape.push_back(1 + static_cast<int64_t>(rng() % 9));
    std::vector<int64_t> perm(rank);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    ir::Graph g;
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, shape));
    ir::Attributes a;
    a.set("perm", perm);
    ir::Op &op = g.addOp("Transpose", "ai.onnx", 13, "", a, {"x"}, {"y"});
    op.def->setup(op);
    if (backend_cpu::KernelRegistry::instance().find(op, backend_cpu::KernelProvider::Dnnl) == nullptr) continue;
    ++onDnnl;
    kernel_compare::expectDnnlMatchesReference(op, rng, [&](size_t, std::mt19937 &r) { return d(r); });
  }
  // The weight transposes of exported Linear layers: [out, in] -> [in, out].
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("w", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {1024, 256}));
  ir::Op &op = g.addOp("Transpose", "ai.onnx", 13, "", {}, {"w"}, {"wt"});
  op.def->setup(op);
  ASSERT_EQ(chosen(op), backend_cpu::KernelProvider::Dnnl);
  kernel_compare::expectDnnlMatchesReference(op, rng, [&](size_t, std::mt19937 &r) { return d(r); });
  std::cout << onDnnl << " of 30 random transposes ran on oneDNN\n";
}
