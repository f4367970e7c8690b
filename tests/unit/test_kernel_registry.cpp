// The kernel registry's choice and its reasons: which provider runs an op and why the others
// declined (popart-run --explain-kernels), and a kernel that fails to build after its capability
// check accepted the op being an error that names the op, not a silent fallback.

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <stdexcept>

using namespace popart;
using backend_cpu::KernelProvider;
using backend_cpu::KernelRegistry;

namespace {

/// Op \p type of \p g (opset 13) on FLOAT inputs of \p shapes, named \p name, with \p attrs.
ir::Op &addOp(ir::Graph &g, const std::string &type, const std::vector<Shape> &shapes, const std::string &name,
              const ir::Attributes &attrs = {}) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  g.opsets()["ai.onnx"] = 13;
  std::vector<TensorId> ins;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ins.push_back(name + "_in" + std::to_string(i));
    g.addTensor(ins.back(), ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, shapes[i]));
  }
  ir::Op &op = g.addOp(type, "ai.onnx", 13, name, attrs, ins, {name + "_out"});
  op.def->setup(op);
  return op;
}

} // namespace

TEST(KernelRegistry, ChoiceNamesTheProviderAndWhyOthersDeclined) {
  ir::Graph g;
  // A oneDNN kernel that declines, with its reason.
  ir::Attributes beta;
  beta.set("beta", 2.0f);
  ir::Op &gemm = addOp(g, "Gemm", {{2, 3}, {3, 4}, {2, 4}}, "gm", beta);
  // One that accepts.
  ir::Op &matmul = addOp(g, "MatMul", {{2, 3}, {3, 4}}, "mm");

  auto gemmChoice = KernelRegistry::instance().choose(gemm);
  ASSERT_NE(gemmChoice.entry, nullptr);
  EXPECT_EQ(gemmChoice.entry->provider, KernelProvider::Reference);
  // Every provider preferred to the chosen one says why not (fast's Gemm is fp16.16's).
  EXPECT_EQ(
      gemmChoice.explanation(),
      "reference (fast declined: no fp16.16 partials (kHalfPartials); oneDNN declined: beta other than 1 with C)");
  auto mmChoice = KernelRegistry::instance().choose(matmul);
  ASSERT_NE(mmChoice.entry, nullptr);
  EXPECT_EQ(mmChoice.entry->provider, KernelProvider::Dnnl);
  EXPECT_EQ(mmChoice.explanation(), "oneDNN"); // a decline of a provider after oneDNN's is no reason
  EXPECT_EQ(KernelRegistry::instance().find(matmul), mmChoice.entry);
  EXPECT_EQ(KernelRegistry::instance().find(gemm), gemmChoice.entry);
}

TEST(KernelRegistry, GatherHasNoOneDnnKernel) {
  ir::Graph g;
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("data", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4, 3}));
  g.addTensor("idx", ir::TensorKind::Stream, TensorInfo(DataType::INT64, {2}));
  ir::Op &op = g.addOp("Gather", "ai.onnx", 13, "g", {}, {"data", "idx"}, {"out"});
  op.def->setup(op);
  auto choice = KernelRegistry::instance().choose(op);
  ASSERT_NE(choice.entry, nullptr);
  EXPECT_EQ(choice.explanation(), "reference (oneDNN: no kernel for Gather)");
}

TEST(KernelRegistry, AKernelThatFailsAfterItsCheckAcceptedIsAnErrorNamingTheOp) {
  ir::Graph g;
  ir::Op &op = addOp(g, "Relu", {{3}}, "r1");
  backend_cpu::KernelEntry broken{"ai.onnx", "Relu", KernelProvider::Dnnl, nullptr,
                                  [](const ir::Op &) -> std::unique_ptr<backend_cpu::Kernel> {
                                    throw std::runtime_error("could not create a primitive");
                                  }};
  try {
    backend_cpu::createKernel(broken, op, backend_cpu::KernelContext());
    FAIL() << "no error";
  } catch (const error &e) {
    std::string what = e.what();
    EXPECT_NE(what.find(op.debugName()), std::string::npos) << what;
    EXPECT_NE(what.find("could not create a primitive"), std::string::npos) << what;
    EXPECT_NE(what.find("capability check accepted"), std::string::npos) << what;
  }
}
