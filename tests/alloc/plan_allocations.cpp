// Checks that running a compiled plan allocates nothing: every ONNX backend node test that
// compiles is run twice and the second run's heap allocations are counted per kernel.
// Our kernels must not allocate at all. oneDNN 2.6 builds a small argument map inside every
// primitive execution (a fixed few hundred bytes, whatever the tensor sizes); oneDNN steps are
// allowed that bookkeeping and nothing more.
// Usage: plan_allocations DATA_ROOT

#include "backend_cpu/plan.hpp"
#include "ir/passes/passes.hpp"
#include "onnx_import/onnx_import.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <new>

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
std::atomic<long> allocatedBytes{0};
} // namespace

void *operator new(size_t n) {
  if (counting.load(std::memory_order_relaxed)) {
    allocations.fetch_add(1, std::memory_order_relaxed);
    allocatedBytes.fetch_add(static_cast<long>(n), std::memory_order_relaxed);
  }
  if (void *p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, size_t) noexcept { std::free(p); }

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
  constexpr long kDnnlBookkeepingBytes = 1024;
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
      for (size_t s = 0; s < plan.stepCount(); ++s) {
        allocations = 0;
        allocatedBytes = 0;
        counting = true;
        plan.runStep(s);
        counting = false;
        bool dnnl = plan.stepProviders()[s] == backend_cpu::KernelProvider::Dnnl;
        maxDnnlBytes = std::max(maxDnnlBytes, dnnl ? allocatedBytes.load() : 0L);
        if (dnnl ? allocatedBytes > kDnnlBookkeepingBytes : allocations > 0) {
          std::string type = plan.stepNames()[s].substr(0, plan.stepNames()[s].find(' '));
          offenders.emplace(type, dir.filename().string());
        }
      }
      ++checked;
    } catch (const std::exception &) {
      counting = false; // models that do not compile here are the backend suite's business
    }
  }
  for (const auto &[type, test] : offenders)
    std::cout << "ALLOCATES " << type << " (e.g. " << test << ")\n";
  std::cout << "largest oneDNN bookkeeping per execution: " << maxDnnlBytes << " bytes\n";
  std::cout << "plan allocations: " << checked << " models checked, " << offenders.size()
            << " op types allocate per run\n";
  return offenders.empty() ? 0 : 1;
}
