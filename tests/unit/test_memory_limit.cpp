// SessionOptions::memoryLimitBytes: prepareDevice refuses a plan above the limit, before its arena is
// allocated, with the planned size and its parts in the message; the default limit (the available
// RAM) lets normal models through.

#include "backend_cpu/kernel.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/graph.hpp"
#include "ir/op.hpp"
#include "ir/tensor.hpp"
#include "session/session_common.hpp"
#include "thrown.hpp"

#include <popart/builder.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <unistd.h>

using namespace popart;

namespace {

/// A convolution over a batch of images: its activations (not its 5 KB of weights) dominate.
std::string convModel() {
  auto b = Builder::create();
  auto onnx = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {8, 8, 64, 64}), "x");
  TensorId w = b->addInitializedInputTensor(std::vector<float>(16 * 8 * 3 * 3, 0.01f), {16, 8, 3, 3}, "w");
  TensorId y = onnx.relu({onnx.conv({x, w}, {}, 1, {}, {1, 1, 1, 1})}, "y");
  b->addOutputTensor(y);
  return b->getModelProto();
}

/// A one-layer regression trained with Adam: weights and two moments each.
std::string mlpModel() {
  auto b = Builder::create();
  auto onnx = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {4, 256}), "x");
  TensorId t = b->addInputTensor(TensorInfo(DataType::FLOAT, {4, 256}), "t");
  TensorId w = b->addInitializedInputTensor(std::vector<float>(256 * 256, 0.01f), {256, 256}, "w");
  TensorId d = onnx.sub({onnx.matmul({x, w}), t});
  b->addOutputTensor(onnx.reducemean({onnx.mul({d, d})}, std::nullopt, 0, "loss"));
  return b->getModelProto();
}

std::unique_ptr<InferenceSession> convSession(int64_t limit) {
  SessionOptions o;
  o.memoryLimitBytes = limit;
  return InferenceSession::createFromOnnxModel(convModel(), DataFlow(1, std::vector<TensorId>{"y:0"}), o);
}

TEST(MemoryLimit, InferencePlanAboveTheLimitIsRefusedWithItsSize) {
  auto unlimited = convSession(0);
  unlimited->prepareDevice();
  const int64_t arena = unlimited->plannedArenaBytes();
  // The output alone is 8*16*64*64 floats: the arena holds at least that.
  ASSERT_GE(arena, int64_t{8} * 16 * 64 * 64 * 4);

  // Above the output and the weights alone (the check made before the kernels), below the plan.
  // (The kernels' part is left out of the message where it is 0: under AddressSanitizer the heap
  // the kernels take is not measured.)
  const int64_t limit = int64_t{8} * 16 * 64 * 64 * 4 + 16 * 8 * 3 * 3 * 4 + 1024;
  ASSERT_LT(limit, arena);
  auto limited = convSession(limit);
  const std::string msg = thrown([&] { limited->prepareDevice(); });
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(msg, m,
                        std::regex(R"(prepareDevice: the plan of '<model bytes>' needs [0-9.]+ MB \(([0-9]+) bytes: )"
                                   R"(activation arena ([0-9.]+) MB(?:; kernels [0-9.]+ MB)?; weights and constants )"
                                   R"([0-9.]+ MB\), above the limit of [0-9.]+ MB \(([0-9]+) bytes\) set by )"
                                   R"(SessionOptions.memoryLimitBytes)")))
      << msg;
  EXPECT_GE(std::stoll(m[1].str()), arena + 16 * 8 * 3 * 3 * 4) << msg; // at least the arena and the weights
  EXPECT_NEAR(std::stod(m[2].str()), static_cast<double>(arena) / 1e6, 0.006) << msg;
  EXPECT_EQ(std::stoll(m[3].str()), limit) << msg;
  // Refused before compiling: nothing planned, and the session is not left half compiled.
  EXPECT_EQ(limited->plannedArenaBytes(), 0);
}

TEST(MemoryLimit, ATensorAboveTheLimitIsRefusedBeforeTheKernelsAreMade) {
  // The output alone, 8*16*64*64 floats, is above the limit: refused naming it, before any kernel.
  auto limited = convSession(int64_t{1} << 20);
  const std::string msg = thrown([&] { limited->prepareDevice(); });
  EXPECT_NE(msg.find("needs 2.10 MB (2101760 bytes: tensor 'y:0' alone (the activation arena's least) 2.10 MB; "
                     "weights and constants 0.00 MB), above the limit of 1.05 MB (1048576 bytes)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(limited->plannedArenaBytes(), 0);
}

TEST(MemoryLimit, TrainingPlanNamesItsParts) {
  SessionOptions o;
  o.memoryLimitBytes = 100000; // below the 256 KB of the weight alone
  auto s = TrainingSession::createFromOnnxModel(mlpModel(), DataFlow(1, std::vector<TensorId>{}), "", Adam(), o);
  const std::string msg = thrown([&] { s->prepareDevice(); });
  // The weight is 0.26 MB and Adam's two moments 0.52 MB.
  EXPECT_NE(msg.find("; weights 0.26 MB; optimiser state 0.52 MB;"), std::string::npos) << msg;
  EXPECT_NE(msg.find("above the limit of 0.10 MB (100000 bytes)"), std::string::npos) << msg;
}

TEST(MemoryLimit, PlanWithinTheLimitRuns) {
  auto unlimited = convSession(0);
  unlimited->prepareDevice();
  auto generous = convSession(unlimited->plannedArenaBytes() + (int64_t{64} << 20));
  EXPECT_NO_THROW(generous->prepareDevice());
  EXPECT_EQ(generous->plannedArenaBytes(), unlimited->plannedArenaBytes());
}

TEST(MemoryLimit, NegativeLimitIsAnError) {
  auto s = convSession(-1);
  EXPECT_NE(thrown([&] {
              s->prepareDevice();
            }).find("SessionOptions.memoryLimitBytes must be 0 (the available RAM) or a byte count, got -1"),
            std::string::npos);
}

TEST(MemoryLimit, DefaultIsTheAvailableMemory) {
  const int64_t available = session::availableMemoryBytes();
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  EXPECT_GT(available, 0);
  EXPECT_LE(available, physical);
  // MemAvailable as the kernel reports it, read here independently: the default is never above it.
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kb = -1;
  while (meminfo >> key)
    if (key == "MemAvailable:" && (meminfo >> kb)) break;
  ASSERT_GT(kb, 0);
  // Other processes allocate and free meanwhile: allow them 256 MB.
  EXPECT_LE(available, kb * 1024 + (int64_t{256} << 20));
}

TEST(MemoryLimit, ATensorWhoseShapeIsStillUnknownAtCompileIsRefusedByName) {
  // The sessions' passes leave no unknown dimension; the planner still refuses one by name rather
  // than sizing the arena from a negative count (a safeguard, reached here by a graph made by hand).
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3}));
  g.addOp("Relu", "", 13, "relu", {}, {"x"}, {"y"});
  g.tensor("y").setInfo(TensorInfo(DataType::FLOAT, {-1, 3}));
  g.addInput("x");
  g.addOutput("y");
  backend_cpu::CompileOptions options;
  int checks = 0;
  options.checkMemory = [&](const backend_cpu::PlannedMemory &) { ++checks; };
  EXPECT_EQ(thrown([&] { backend_cpu::ExecutionPlan plan(g, options); }),
            "tensor 'y' has shape [?,3]: a dimension is unknown (negative) at compile");
  EXPECT_EQ(checks, 0);
}

} // namespace
