// libFuzzer target: an ONNX model through import (parsing, the checker, opset handling, shape
// inference) and InferenceSession::prepareDevice (the passes and the compile of the plan).
//
// Models whose tensors are large are skipped before the session is made: the fuzzer's memory limit
// would report them as findings, and refusing large models is issue 23's item 6, not the
// importer's job.

#include "fuzz_input_file.hpp"
#include "ir/graph.hpp"
#include "ir/tensor.hpp"
#include "onnx_import/onnx_import.hpp"

#include <popart/error.hpp>
#include <popart/session.hpp>

#include <filesystem>

namespace {

constexpr int64_t kMaxElements = int64_t{1} << 22; // per tensor
constexpr int64_t kMaxTotalBytes = int64_t{1} << 28;

/// Elements of \p shape, or -1 when a dimension is unknown or the count exceeds kMaxElements.
int64_t cappedElementCount(const popart::Shape &shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > kMaxElements / d) return kMaxElements + 1;
    n *= d;
  }
  return n;
}

/// True if every tensor of \p g is small enough to plan and run within the fuzzer's memory limit.
bool smallEnough(const popart::ir::Graph &g) {
  int64_t total = 0;
  for (const auto &[id, t] : g.tensors()) {
    const popart::TensorInfo &info = t->info();
    if (!info.isTensor()) continue;
    int64_t n = cappedElementCount(info.shape());
    if (n > kMaxElements) return false;
    total += std::max<int64_t>(n, 0) * static_cast<int64_t>(popart::dataTypeSize(info.dataType()));
    if (total > kMaxTotalBytes) return false;
  }
  return true;
}

/// An empty folder for external data: fuzzed models must not read the files around them.
const std::string &emptyDir() {
  static const std::string dir = [] {
    auto p = std::filesystem::temp_directory_path() / "popart-fuzz-model-empty";
    std::filesystem::create_directories(p);
    return p.string();
  }();
  return dir;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string bytes(reinterpret_cast<const char *>(data), size);
  try {
    auto graph = popart::onnx_import::importModelBytes(bytes, emptyDir(), {}, "fuzz input");
    if (!smallEnough(*graph)) return 0;
    popart::SessionOptions options;
    options.numThreads = 1;
    options.maxUnrolledOps = 256;
    // Shapes known only after shape inference at compile (a Tile of a folded constant) can still
    // be large: the plan is refused by the memory limit (item 6) before its arena is allocated.
    options.memoryLimitBytes = int64_t{1} << 30;
    std::vector<popart::TensorId> anchors(graph->outputs().begin(), graph->outputs().end());
    auto session = popart::InferenceSession::createFromOnnxModel(bytes, popart::DataFlow(1, anchors), options);
    session->prepareDevice();
  } catch (const popart::error &e) {
    popart::fuzz::expectedError(e);
  }
  return 0;
}
