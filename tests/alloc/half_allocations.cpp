// Like grad_allocations, for FLOAT16 graphs whose forward and grad ops run on the fast FLOAT16
// block kernels (backend_cpu/fast/half.cpp): Gelu, an activation, Softmax, LayerNormalization and
// Div with their gradients, compiled on two threads and run twice, counting the second run's heap
// allocations per step. The block kernels allocate nothing themselves; where their blocks run on a
// oneDNN f32 primitive, each execution builds oneDNN's small argument map, so a step is allowed
// oneDNN's bookkeeping of each execution (count_allocations.hpp counts them).
// Every step must get the block kernel.
// Usage: half_allocations

#include "count_allocations.hpp"

#include "autodiff/autodiff.hpp"
#include "ir/passes/passes.hpp"
#include "session/session_common.hpp"

#include <iostream>
#include <string>
#include <vector>

using namespace popart;

namespace {

struct Case {
  std::string type, domain = "ai.onnx";
  std::vector<Shape> shapes;
  std::vector<std::pair<std::string, ir::AttributeValue>> attrs = {};
};

/// Returns the number of failures of \p c.
int check(const Case &c) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 17;
  g.opsets()["ai.graphcore"] = 1;
  std::vector<TensorId> xs;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    xs.push_back(std::to_string(i));
    xs.back().insert(xs.back().begin(), 'x');
    g.addTensor(xs.back(), ir::TensorKind::Stream, TensorInfo(DataType::FLOAT16, c.shapes[i]));
    g.addInput(xs.back());
  }
  ir::Attributes a;
  for (const auto &[k, v] : c.attrs)
    a.set(k, v);
  g.addOp(c.type, c.domain, c.domain == "ai.onnx" ? 17 : 1, "fwd", a, xs, {"y"});
  ir::inferShapes(g, nullptr);
  g.addOutput("y"); // so that the forward op stays when its gradient does not read its output
  for (const auto &id : autodiff::buildGradients(g, "y", xs))
    g.addOutput(id);
  ir::inferShapes(g, nullptr);
  session::fuseAfterGradients(g);
  backend_cpu::KernelContext context;
  context.threads = 2;
  backend_cpu::ExecutionPlan plan(g, {}, context);
  plan.run();
  int failures = 0;
  for (size_t s = 0; s < plan.stepCount(); ++s) {
    alloc_count::StepUse use = alloc_count::countStep(plan, s);
    const std::string &step = plan.stepNames()[s];
    const bool fast = plan.stepProviders()[s] == backend_cpu::KernelProvider::Fast;
    if (!fast) {
      std::cout << c.type << ": " << step << " did not get the fast FLOAT16 block kernel\n";
      ++failures;
    }
    if (use.tooMuch()) {
      std::cout << c.type << ": " << step << " allocates " << use.bytes << " bytes per run in " << use.executions
                << " oneDNN executions\n";
      ++failures;
    }
  }
  if (plan.stepCount() < 2) {
    std::cout << c.type << ": fewer than two steps (forward and gradient)\n";
    ++failures;
  }
  return failures;
}

} // namespace

int main() {
  if (!alloc_count::countsEveryForm()) return 1;
  int failures = 0;
  failures += check({"Gelu", "ai.graphcore", {{2, 30000}}});
  failures += check({"Tanh", "ai.onnx", {{2, 30000}}});
  failures += check({"Softmax", "ai.onnx", {{4, 100, 300}}});
  failures += check({"LayerNormalization", "ai.onnx", {{4, 200, 64}, {64}, {64}}});
  failures += check({"Div", "ai.onnx", {{2, 30000}, {2, 30000}}});
  if (failures) std::cout << "FAILED: " << failures << " allocation problems\n";
  return failures ? 1 : 0;
}
