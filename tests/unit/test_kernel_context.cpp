// The session's KernelContext: options that were environment variables, the MatMul ways chosen
// by timing recorded in checkpoints (a resumed run is bit-identical), the kernel report, and the
// seed of random kernels that have none of their own.

#include "backend_cpu/kernel.hpp"
#include "checkpoint_test_helpers.hpp"
#include "ir/graph.hpp"
#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

using namespace popart;

namespace {

constexpr int64_t kRows = 256, kWidth = 512, kOut = 16;

/// loss = mean(relu(x·w1)·w2): x·w1 and its weight gradient xᵀ·dY are 2·256·512·512 = 134
/// MFLOPs, above the 1e8 at which the MatMul kernel times its ways.
std::string largeMlp() {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kRows, kWidth}), "x");
  std::vector<float> w1(static_cast<size_t>(kWidth * kWidth)), w2(static_cast<size_t>(kWidth * kOut));
  for (size_t i = 0; i < w1.size(); ++i)
    w1[i] = static_cast<float>(std::sin(0.37 * double(i))) * 0.05f;
  for (size_t i = 0; i < w2.size(); ++i)
    w2[i] = static_cast<float>(std::cos(0.91 * double(i))) * 0.05f;
  TensorId h = ai.relu({ai.matmul({x, b->addInitializedInputTensor(w1, {kWidth, kWidth}, "w1")})});
  TensorId y = ai.matmul({h, b->addInitializedInputTensor(w2, {kWidth, kOut}, "w2")});
  b->addOutputTensor(ai.reducemean({ai.mul({y, y})}, std::nullopt, 0));
  return b->getModelProto();
}

std::vector<float> batch(int k) {
  std::vector<float> x(static_cast<size_t>(kRows * kWidth));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(std::sin(0.013 * double(i) + 0.7 * double(k)));
  return x;
}

void step(TrainingSession &s, int k) {
  std::vector<float> x = batch(k);
  NDArrayWrapper<float> in(x.data(), {kRows, kWidth});
  StepIO io({{"x", in}}, {});
  s.run(io);
}

std::vector<float> weight(const TrainingSession &s, const TensorId &id, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  NDArrayWrapper<float> arr(v.data(), {n});
  WeightsIO io;
  io.insert(id, arr);
  s.readWeights(io);
  return v;
}

std::unique_ptr<TrainingSession> trainer(const std::string &model, const SessionOptions &options = {}) {
  SGD sgd({{"defaultLearningRate", {0.05f, false}}, {"defaultMomentum", {0.9f, false}}});
  return TrainingSession::createFromOnnxModel(model, DataFlow(1, std::vector<TensorId>{}), "", sgd, options);
}

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("popart_kernelctx_" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
};

} // namespace

TEST(KernelContext, ResumedRunAboveTheTuningThresholdIsBitIdentical) {
  TempDir dir;
  std::string ckpt = (dir.path / "state.ckpt").string(), model = largeMlp();
  auto a = trainer(model);
  a->prepareDevice();
  step(*a, 0);
  step(*a, 1);
  a->saveCheckpoint(ckpt);
  step(*a, 2);
  step(*a, 3);
  // The checkpoint records a way for each timed MatMul configuration.
  test::CheckpointParts c = test::readCheckpointParts(ckpt);
  ASSERT_TRUE(c.header.contains("matmulWays"));
  EXPECT_GE(c.header["matmulWays"].size(), 2u) << c.header["matmulWays"].dump(); // forward and weight gradient
  // Resumed in a new session (which times nothing: it takes the recorded ways).
  auto b = trainer(model);
  b->loadCheckpoint(ckpt);
  step(*b, 2);
  step(*b, 3);
  EXPECT_EQ(weight(*a, "w1", kWidth * kWidth), weight(*b, "w1", kWidth * kWidth));
  EXPECT_EQ(weight(*a, "w2", kWidth * kOut), weight(*b, "w2", kWidth * kOut));
}

TEST(KernelContext, ResumedSessionTakesTheRecordedWaysEvenAfterTimingItsOwn) {
  // A checkpoint whose ways differ from what the session chose: the session recompiles with the
  // recorded ones (FlippedB applies to every product of this model: B is never constant).
  TempDir dir;
  std::string ckpt = (dir.path / "state.ckpt").string(), edited = (dir.path / "edited.ckpt").string();
  std::string model = largeMlp();
  auto a = trainer(model);
  a->prepareDevice();
  step(*a, 0);
  a->saveCheckpoint(ckpt);
  test::CheckpointParts c = test::readCheckpointParts(ckpt);
  std::map<std::string, std::string> wanted;
  for (auto &[key, way] : c.header["matmulWays"].items()) {
    way = way.get<std::string>() == "FlippedB" ? "AsStored" : "FlippedB";
    wanted[key] = way.get<std::string>();
  }
  ASSERT_FALSE(wanted.empty());
  test::writeCheckpointParts(edited, c);
  auto b = trainer(model);
  b->prepareDevice(); // timed its own ways
  b->loadCheckpoint(edited);
  std::string report = b->explainKernels();
  for (const auto &[key, way] : wanted)
    EXPECT_NE(report.find("operands " + way + ", timed"), std::string::npos) << key << " → " << way << "\n" << report;
  for (const char *other : {"FlippedA,", "ShiftedB,", "Pointwise,", "Swapped,", "SwappedCopy,", "Unpermuted,"})
    EXPECT_EQ(report.find(std::string("operands ") + other), std::string::npos) << other << "\n" << report;
  EXPECT_EQ(b->getStepCount(), 1);
  step(*b, 1);
  EXPECT_EQ(b->getStepCount(), 2);
  // A way the runtime does not know is refused naming it.
  c.header["matmulWays"][wanted.begin()->first] = "Sideways";
  test::writeCheckpointParts(edited, c);
  auto d = trainer(model);
  try {
    d->loadCheckpoint(edited);
    FAIL() << "an unknown way was accepted";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("'Sideways' is not a MatMul operand way"), std::string::npos) << e.what();
  }
}

TEST(KernelContext, ForcedWaysAndBadOptionsAreNamed) {
  SessionOptions forced;
  forced.matmulTuning = "b";
  auto s = trainer(largeMlp(), forced);
  s->prepareDevice();
  std::string report = s->explainKernels();
  EXPECT_NE(report.find("operands FlippedB, forced"), std::string::npos) << report;
  EXPECT_EQ(report.find(", timed"), std::string::npos) << report;
  SessionOptions off;
  off.matmulTuning = "0";
  auto t = trainer(largeMlp(), off);
  t->prepareDevice();
  EXPECT_EQ(t->explainKernels().find("operands "), std::string::npos) << t->explainKernels();
  SessionOptions bad;
  bad.matmulTuning = "fast";
  EXPECT_THROW(
      {
        try {
          trainer(largeMlp(), bad);
        } catch (const error &e) {
          EXPECT_NE(std::string(e.what()).find("SessionOptions.matmulTuning"), std::string::npos) << e.what();
          throw;
        }
      },
      error);
  SessionOptions negative;
  negative.convPoolChunk = -2;
  EXPECT_THROW(trainer(largeMlp(), negative), error);
  SessionOptions badSeed;
  badSeed.randomSeed = -2;
  EXPECT_THROW(
      {
        try {
          trainer(largeMlp(), badSeed)->prepareDevice();
        } catch (const error &e) {
          EXPECT_NE(std::string(e.what()).find("SessionOptions.randomSeed must be -1"), std::string::npos) << e.what();
          throw;
        }
      },
      error);
}

TEST(KernelContext, TheSessionSeedDecidesTheMaskOfADropoutWithoutOne) {
  // An inference Dropout with training_mode true and no seed: the same context seed gives the same
  // mask, another seed another; two ops of one session (different salts) differ too.
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4096}));
  g.addConst("ratio", TensorData::fromDoubles(DataType::FLOAT, {}, {0.5}));
  g.addConst("train", TensorData::fromDoubles(DataType::BOOL, {}, {1}));
  ir::Op &a = g.addOp("Dropout", "", 13, "a", {}, {"x", "ratio", "train"}, {"ya"});
  ir::Op &b = g.addOp("Dropout", "", 13, "b", {}, {"x", "ratio", "train"}, {"yb"});
  a.def->setup(a);
  b.def->setup(b);
  std::vector<float> x(4096, 1.f);
  auto run = [&](const ir::Op &op, int64_t seed) {
    backend_cpu::KernelContext context;
    context.randomSeed = seed;
    auto kernel = backend_cpu::createKernel(op, backend_cpu::KernelProvider::Any, context);
    std::vector<float> y(4096);
    std::vector<const void *> in{x.data(), g.tensor("ratio").data()->data(), g.tensor("train").data()->data()};
    std::vector<void *> out{y.data()};
    kernel->run({in.data(), in.size(), out.data(), out.size()});
    return y;
  };
  std::vector<float> first = run(a, 7);
  int dropped = 0;
  for (float v : first)
    dropped += v == 0.f;
  EXPECT_GT(dropped, 1800); // about half of 4096
  EXPECT_LT(dropped, 2300);
  EXPECT_EQ(run(a, 7), first);
  EXPECT_NE(run(a, 8), first);
  EXPECT_NE(run(b, 7), first);
  EXPECT_NE(run(a, -1), first); // drawn from the system: equal with chance 2^-4096
}
