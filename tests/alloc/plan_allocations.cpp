// Checks that running a compiled plan allocates nothing: every ONNX backend node test that
// compiles is run twice and the second run's heap allocations are counted per kernel (see
// count_allocations.hpp for what oneDNN steps are allowed).
// Usage: plan_allocations DATA_ROOT

#include "count_allocations.hpp"

#include "ir/passes/passes.hpp"
#include "onnx_import/onnx_import.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>

namespace fs = std::filesystem;
using namespace popart;

int main(int argc, char **argv) {
  if (argc < 2) {
    std::cerr << "usage: plan_allocations DATA_ROOT\n";
    return 2;
  }
  std::map<std::string, std::string> offenders; // op type -> first test seen
  int checked = 0;
  long maxDnnlBytes = 0;
  for (const auto &entry : fs::directory_iterator(fs::path(argv[1]) / "node")) {
    fs::path dir = entry.path();
    try {
      auto graph = onnx_import::importModelFile((dir / "model.onnx").string());
      // Inputs from the first data set, fed as constants' shapes; values do not matter here
      // except for value inputs, which become constants as the session would make them.
      auto inputs = graph->inputs();
      std::vector<TensorData> data;
      for (size_t i = 0; i < inputs.size(); ++i) {
        data.push_back(onnx_import::readTensorProtoFile(
            (dir / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb")).string()));
        graph->tensor(inputs[i]).setInfo(data.back().info());
      }
      backend_cpu::ReferenceEvaluator folder;
      ir::inferShapes(*graph, &folder);
      ir::removeDeadCode(*graph);
      backend_cpu::ExecutionPlan plan(*graph, {});
      for (size_t i = 0; i < inputs.size(); ++i)
        if (data[i].info().dataType() != DataType::STRING)
          std::memcpy(plan.address(inputs[i]), data[i].data(), static_cast<size_t>(data[i].byteCount()));
      plan.run();
      std::vector<ir::Op *> schedule = graph->schedule();
      for (size_t s = 0; s < plan.stepCount(); ++s) {
        // Sequence and optional values are host objects whose elements are made per run
        // (docs/architecture.md, "Subgraphs and sequences"): steps that touch one may allocate.
        bool sequences = false;
        for (const auto *list : {&schedule[s]->inputs, &schedule[s]->outputs})
          for (const ir::Tensor *t : *list)
            sequences = sequences || (t && !t->info().isTensor());
        // A subgraph op (If, Loop, Scan) runs its nested plan's oneDNN steps once per iteration;
        // each of those executions has the bookkeeping allocation allowed per oneDNN execution,
        // more times than one outer step allows. Its own code allocates nothing (tests/unit
        // test_controlflow covers the values).
        bool subgraph = false;
        for (const auto &[name, value] : schedule[s]->attrs.all())
          subgraph = subgraph || std::holds_alternative<std::shared_ptr<const ir::Graph>>(value);
        if (sequences || subgraph) continue;
        alloc_count::StepUse use = alloc_count::countStep(plan, s);
        maxDnnlBytes = std::max(maxDnnlBytes, use.dnnl ? use.bytes : 0L);
        if (use.tooMuch()) {
          std::string type = plan.stepNames()[s].substr(0, plan.stepNames()[s].find(' '));
          offenders.emplace(type, dir.filename().string());
        }
      }
      ++checked;
    } catch (const std::exception &) {
      alloc_count::counting = false; // models that do not compile here are the backend suite's business
    }
  }
  for (const auto &[type, test] : offenders)
    std::cout << "ALLOCATES " << type << " (e.g. " << test << ")\n";
  std::cout << "largest oneDNN bookkeeping per execution: " << maxDnnlBytes << " bytes\n";
  std::cout << "plan allocations: " << checked << " models checked, " << offenders.size()
            << " op types allocate per run\n";
  return offenders.empty() ? 0 : 1;
}
