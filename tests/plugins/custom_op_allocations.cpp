// The example plugins' kernels allocate nothing per run (made at compile, run many): y =
// Cube(LeakyRelu(x)) with its gradients (LeakyReluGrad, the Mul ops of Cube's), compiled on two
// threads and run twice; the second run's heap allocations are counted per step.
// Usage: custom_op_allocations LEAKY_RELU_LIB CUBE_LIB

#include "../alloc/count_allocations.hpp"

#include "autodiff/autodiff.hpp"
#include "ir/passes/passes.hpp"
#include <popart/custom_op.hpp>

#include <iostream>

using namespace popart;

int main(int argc, char **argv) try {
  if (argc != 3) throw error("usage: custom_op_allocations LEAKY_RELU_LIB CUBE_LIB");
  if (!alloc_count::countsEveryForm()) return 1;
  loadCustomOpLibrary(argv[1]);
  loadCustomOpLibrary(argv[2]);
  ir::Graph g;
  g.opsets()["ai.onnx"] = 17;
  g.opsets()["com.example"] = 1;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {10007}));
  g.addInput("x");
  ir::Attributes alpha, scale;
  alpha.set("alpha", 0.2f);
  scale.set("scale", 0.5f);
  g.addOp("LeakyRelu", "com.example", 1, "act", alpha, {"x"}, {"h"});
  g.addOp("Cube", "com.example", 1, "cube", scale, {"h"}, {"y"});
  ir::inferShapes(g, nullptr);
  for (const auto &id : autodiff::buildGradients(g, "y", {"x"}))
    g.addOutput(id);
  ir::inferShapes(g, nullptr);
  backend_cpu::KernelContext context;
  context.threads = 2;
  backend_cpu::ExecutionPlan plan(g, {}, context);
  plan.run();
  int failures = 0;
  bool sawGradOp = false, sawCube = false;
  for (size_t s = 0; s < plan.stepCount(); ++s) {
    alloc_count::StepUse use = alloc_count::countStep(plan, s);
    const std::string &step = plan.stepNames()[s];
    sawGradOp = sawGradOp || step.find("LeakyReluGrad") != std::string::npos;
    sawCube = sawCube || step.find("Cube") != std::string::npos;
    std::cout << step << ": " << use.allocations << " allocations\n";
    if (use.tooMuch()) {
      std::cout << "FAIL: " << step << " allocates " << use.bytes << " bytes per run\n";
      ++failures;
    }
  }
  if (!sawGradOp || !sawCube) {
    std::cout << "FAIL: the plan has no LeakyReluGrad or no Cube step\n";
    ++failures;
  }
  std::cout << (failures ? "FAILED" : "custom kernels allocate nothing per run") << "\n";
  return failures ? 1 : 0;
} catch (const std::exception &e) {
  std::cerr << "error: " << e.what() << "\n";
  return 2;
}
