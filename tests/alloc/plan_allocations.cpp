// Checks that running a compiled plan allocates nothing: every ONNX backend node test that
// compiles is compiled as InferenceSession compiles it (shape inference with folding, dead code
// removed, the session's fusions and plan options, so that fused kernels are counted), run
// twice, and the second run's heap allocations are counted per kernel (see count_allocations.hpp
// for what oneDNN steps are allowed). A model that does not compile is skipped (the backend
// suite judges those); one that compiles but fails to run is an error, and so is checking fewer
// than MIN_CHECKED models, so that a change which stops models compiling here cannot pass by
// checking none.
// Usage: plan_allocations DATA_ROOT MIN_CHECKED

#include "count_allocations.hpp"

#include "autodiff/autodiff.hpp"
#include "ir/passes/passes.hpp"
#include "onnx_import/onnx_import.hpp"
#include "session/session_common.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

namespace fs = std::filesystem;
using namespace popart;

namespace {

/// A node test's model compiled as InferenceSession compiles it, with the first data set's inputs
/// copied in.
struct Compiled {
  std::unique_ptr<ir::Graph> graph;
  std::unique_ptr<backend_cpu::ExecutionPlan> plan;
};

Compiled compile(const fs::path &dir) {
  Compiled c;
  c.graph = onnx_import::importModelFile((dir / "model.onnx").string());
  ir::Graph &g = *c.graph;
  // Inputs from the first data set: their shapes specialise the graph, their values are copied in.
  auto inputs = g.inputs();
  std::vector<TensorData> data;
  for (size_t i = 0; i < inputs.size(); ++i) {
    data.push_back(
        onnx_import::readTensorProtoFile((dir / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb")).string()));
    g.tensor(inputs[i]).setInfo(data.back().info());
  }
  backend_cpu::ReferenceEvaluator folder;
  ir::inferShapes(g, &folder);
  bool gradientOps = false;
  for (const auto &op : g.ops())
    gradientOps = gradientOps || op->def->expandedBeforeLowering;
  if (gradientOps) {
    autodiff::expandGradientOps(g);
    ir::inferShapes(g, &folder);
  }
  ir::removeDeadCode(g);
  // The one call that ties this check to the session's pipeline.
  session::fuseForInference(g);
  c.plan = std::make_unique<backend_cpu::ExecutionPlan>(g, session::compileOptions(SessionOptions()));
  for (size_t i = 0; i < inputs.size(); ++i)
    if (data[i].info().dataType() != DataType::STRING)
      std::memcpy(c.plan->address(inputs[i]), data[i].data(), static_cast<size_t>(data[i].byteCount()));
  return c;
}

/// Steps whose allocations are not the kernel's own: sequence and optional values are host
/// objects whose elements are made per run (docs/architecture.md, "Subgraphs and sequences"), and
/// a subgraph op (If, Loop, Scan) runs its nested plan's oneDNN steps once per iteration, each
/// with the bookkeeping allowed per oneDNN execution, more times than one outer step allows (its
/// own code allocates nothing; tests/unit test_controlflow covers the values).
bool exempt(const ir::Op &op) {
  for (const auto *list : {&op.inputs, &op.outputs})
    for (const ir::Tensor *t : *list)
      if (t && !t->info().isTensor()) return true;
  for (const auto &[name, value] : op.attrs.all())
    if (std::holds_alternative<std::shared_ptr<const ir::Graph>>(value)) return true;
  return false;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::cerr << "usage: plan_allocations DATA_ROOT MIN_CHECKED\n";
    return 2;
  }
  if (!alloc_count::countsEveryForm()) return 1;
  const int minChecked = std::stoi(argv[2]);
  if (!fs::is_directory(fs::path(argv[1]) / "node")) {
    std::cerr << "plan_allocations: no folder " << (fs::path(argv[1]) / "node").string() << "\n";
    return 2;
  }
  std::map<std::string, std::string> offenders; // step's op type -> first test seen
  std::vector<std::string> runErrors;
  int checked = 0, skipped = 0;
  long maxDnnlBytes = 0;
  for (const auto &entry : fs::directory_iterator(fs::path(argv[1]) / "node")) {
    fs::path dir = entry.path();
    std::string test = dir.filename().string();
    Compiled c;
    try {
      c = compile(dir);
    } catch (const std::exception &) {
      ++skipped;
      continue;
    }
    try {
      c.plan->run();
      std::vector<ir::Op *> schedule = c.graph->schedule();
      for (size_t s = 0; s < c.plan->stepCount(); ++s) {
        if (exempt(*schedule[s])) continue;
        alloc_count::StepUse use = alloc_count::countStep(*c.plan, s);
        maxDnnlBytes = std::max(maxDnnlBytes, use.dnnl ? use.bytes : 0L);
        if (use.tooMuch()) {
          const std::string &name = c.plan->stepNames()[s];
          offenders.emplace(name.substr(0, name.find(' ')), test);
        }
      }
      ++checked;
    } catch (const std::exception &e) {
      alloc_count::counting = false;
      runErrors.push_back(test + ": " + e.what());
    }
  }
  for (const auto &[type, test] : offenders)
    std::cout << "ALLOCATES " << type << " (e.g. " << test << ")\n";
  for (const auto &e : runErrors)
    std::cout << "RUN FAILED " << e << "\n";
  std::cout << "largest oneDNN bookkeeping per execution: " << maxDnnlBytes << " bytes\n";
  std::cout << "plan allocations: " << checked << " models checked (" << skipped << " do not compile here), "
            << offenders.size() << " op types allocate per run, " << runErrors.size() << " runs failed\n";
  if (checked < minChecked) {
    std::cout << "FAILED: fewer than " << minChecked << " models checked\n";
    return 1;
  }
  return offenders.empty() && runErrors.empty() ? 0 : 1;
}
