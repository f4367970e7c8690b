// SessionOptions::enableFloatingPointChecks must keep runs free of allocation: a plan of FLOAT,
// FLOAT16, BFLOAT16 and DOUBLE elementwise ops (reference kernels, which allocate nothing
// themselves; plan_allocations checks that) runs with the numeric checks on, and its second run
// must allocate nothing. A run that finds a NaN must still stop with the error.
// Usage: check_allocations

#include "count_allocations.hpp"

#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

using namespace popart;

int main() {
  if (!alloc_count::countsEveryForm()) return 1;
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  constexpr int64_t kN = 1000;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {kN}));
  g.addInput("x");
  std::vector<TensorId> outs;
  for (const char *type : {"FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE"}) {
    const std::string t = type;
    ir::Attributes to;
    to.set("to", static_cast<int64_t>(dataTypeFromString(t)));
    g.addOp("Cast", "", 13, "cast_" + t, to, {"x"}, {"in_" + t});
    g.addOp("Log", "", 13, "log_" + t, {}, {"in_" + t}, {"log_" + t});
    g.addOp("Relu", "", 13, "relu_" + t, {}, {"log_" + t}, {"out_" + t});
    outs.push_back("out_" + t);
  }
  ir::inferShapes(g, nullptr);
  for (const auto &id : outs)
    g.addOutput(id);
  ir::inferShapes(g, nullptr);
  backend_cpu::CompileOptions options;
  options.provider = backend_cpu::KernelProvider::Reference;
  backend_cpu::ExecutionPlan plan(g, options);
  plan.enableNumericChecks();
  auto *x = static_cast<float *>(plan.address("x"));
  for (int64_t i = 0; i < kN; ++i)
    x[i] = 1.0f + static_cast<float>(i);
  plan.run();
  alloc_count::allocations = 0;
  alloc_count::counting = true;
  plan.run();
  alloc_count::counting = false;
  const long allocations = alloc_count::allocations.load();
  std::cout << "checked run: " << allocations << " allocations (" << plan.stepCount() << " steps)\n";
  x[kN - 1] = -1.0f;
  std::string message;
  try {
    plan.run();
  } catch (const error &e) {
    message = e.what();
  }
  std::cout << "with a negative input: " << message << "\n";
  const bool named = message.find("of Log 'log_") != std::string::npos &&
                     message.find("element " + std::to_string(kN - 1)) != std::string::npos;
  if (allocations != 0 || !named) {
    std::cout << "FAILED\n";
    return 1;
  }
  std::cout << "check allocations: passed\n";
  return 0;
}
