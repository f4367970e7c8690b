// Replicated training under mpirun (tests/CMakeLists.txt runs it on 2 and 4 ranks): N replicas,
// each training a small MLP on its own micro-batch, must end with the weights of one process that
// accumulates the same N micro-batches (PopART's semantics: the global batch is replicas ×
// micro-batch × accumulation), and with the same bits on every rank.

#include "replication_helpers.hpp"

#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace popart;
using namespace popart::testing;

namespace {

constexpr int64_t kIn = 8, kHidden = 16, kOut = 4, kMicroBatch = 3;
constexpr int kSteps = 3;

/// The MLP of replication_helpers.hpp, 8-16-4, over micro-batches of kMicroBatch samples.
std::string mlp() { return popart::testing::mlp({kIn, kHidden, kOut}, kMicroBatch); }

/// The global batch of step \p step: replicas × kMicroBatch samples of \p width values each,
/// replica r's micro-batch at rows [r · kMicroBatch, (r + 1) · kMicroBatch).
std::vector<float> globalBatch(int step, int replicas, int64_t width, uint32_t salt) {
  return randomValues(replicas * kMicroBatch * width, 1000u * static_cast<uint32_t>(step) + salt, 1.0f);
}

/// How both sides train: the reduction, and each replica's accumulation factor.
struct TrainingSetup {
  ReductionType reduction = ReductionType::Mean;
  int accumulation = 1;
};

/// Trains kSteps steps replicated over the world. Each step's global batch holds replicas ×
/// accumulation micro-batches; replica r accumulates micro-batches r, r + replicas, ...
std::vector<std::vector<float>> trainReplicated(const Optimizer &opt, const TrainingSetup &setup,
                                                int *index = nullptr) {
  const int n = world()->size(), r = world()->rank(), a = setup.accumulation;
  SessionOptions so;
  so.numThreads = 1;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = n;
  so.accumulationAndReplicationReductionType = setup.reduction;
  so.enableGradientAccumulation = a > 1;
  so.accumulationFactor = a;
  so.communicator = world();
  auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", opt, so);
  s->prepareDevice();
  if (index) *index = s->getReplicationIndex();
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> x = microBatches(globalBatch(step, n * a, kIn, 1), kIn, r, n, a, kMicroBatch);
    std::vector<float> t = microBatches(globalBatch(step, n * a, kOut, 2), kOut, r, n, a, kMicroBatch);
    NDArrayWrapper<float> xa(x.data(), batchShape(a, kMicroBatch, kIn)), ta(t.data(), batchShape(a, kMicroBatch, kOut));
    StepIO io({{"x", xa}, {"target", ta}}, {});
    s->run(io);
  }
  return weightsOf(*s);
}

/// The same samples in one process, without a communicator: one replica accumulating all the
/// micro-batches of each global batch.
std::vector<std::vector<float>> trainAccumulated(const Optimizer &opt, const TrainingSetup &setup) {
  const int micro = world()->size() * setup.accumulation;
  SessionOptions so;
  so.numThreads = 1;
  so.enableGradientAccumulation = micro > 1;
  so.accumulationFactor = micro;
  so.accumulationAndReplicationReductionType = setup.reduction;
  auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", opt, so);
  s->prepareDevice();
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> x = globalBatch(step, micro, kIn, 1), t = globalBatch(step, micro, kOut, 2);
    NDArrayWrapper<float> xa(x.data(), batchShape(micro, kMicroBatch, kIn)),
        ta(t.data(), batchShape(micro, kMicroBatch, kOut));
    StepIO io({{"x", xa}, {"target", ta}}, {});
    s->run(io);
  }
  return weightsOf(*s);
}

/// Checks the replicated weights against the accumulated ones (within 1e-6 of each tensor's
/// largest magnitude; exactly on 2 ranks), that training moved them, and that every rank holds the same bits.
void checkEquivalent(const Optimizer &opt, const TrainingSetup &setup = {}) {
  int index = -1;
  const auto replicated = trainReplicated(opt, setup, &index);
  const auto accumulated = trainAccumulated(opt, setup);
  EXPECT_EQ(index, world()->rank());
  ASSERT_EQ(replicated.size(), accumulated.size());
  const std::vector<std::vector<float>> initial = [] {
    auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", SGD(), {});
    s->prepareDevice();
    return weightsOf(*s);
  }();
  for (size_t k = 0; k < replicated.size(); ++k) {
    float largest = 0.0f, moved = 0.0f;
    for (size_t i = 0; i < accumulated[k].size(); ++i) {
      largest = std::max(largest, std::fabs(accumulated[k][i]));
      moved = std::max(moved, std::fabs(accumulated[k][i] - initial[k][i]));
    }
    EXPECT_GT(moved, 1e-4f) << "weight " << k << " did not train";
    // Two gradients sum alike in either order (and halving is exact), so 2 replicas without
    // accumulation must give the accumulated bits; more sum in another order than one accumulator.
    const bool exact = world()->size() == 2 && setup.accumulation == 1;
    const float tolerance = exact ? 0.0f : 1e-6f * largest;
    for (size_t i = 0; i < replicated[k].size(); ++i)
      ASSERT_NEAR(replicated[k][i], accumulated[k][i], tolerance)
          << "weight " << k << " element " << i << " on rank " << world()->rank() << " of " << world()->size();
  }
  expectSameOnEveryRank(replicated);
}

TEST(Replication, SgdWithMomentumMatchesAccumulation) {
  checkEquivalent(SGD({{"defaultLearningRate", {0.05f, false}},
                       {"defaultMomentum", {0.9f, true}},
                       {"defaultWeightDecay", {0.01f, true}}}));
}

TEST(Replication, AdamWMatchesAccumulation) {
  checkEquivalent(Adam(
      {{"defaultLearningRate", {0.01f, false}}, {"defaultWeightDecay", {0.01f, true}}, {"defaultEps", {1e-6f, true}}},
      AdamMode::Adam, WeightDecayMode::Decay));
}

TEST(Replication, LambMatchesAccumulation) {
  checkEquivalent(Adam(
      {{"defaultLearningRate", {0.01f, false}}, {"defaultWeightDecay", {0.01f, true}}, {"defaultEps", {1e-6f, true}}},
      AdamMode::Lamb));
}

TEST(Replication, SumReductionMatchesSummedAccumulation) {
  checkEquivalent(SGD({{"defaultLearningRate", {0.02f, false}}, {"defaultMomentum", {0.9f, true}}}),
                  TrainingSetup{ReductionType::Sum, 1});
}

TEST(Replication, AccumulationClippingAndLossScalingMatchAccumulation) {
  // Each replica accumulates 2 micro-batches; clipping (to a norm below the gradients') must see
  // the global gradient, and a static loss scale must cancel alike on both sides.
  SGD opt({{"defaultLearningRate", {0.05f, false}}, {"defaultMomentum", {0.9f, true}}, {"lossScaling", {64.0f, true}}},
          {ClipNormSettings::clipAllWeights(0.05f)});
  checkEquivalent(opt, TrainingSetup{ReductionType::Mean, 2});
  checkEquivalent(opt, TrainingSetup{ReductionType::Sum, 2});
  SGD unclipped(
      {{"defaultLearningRate", {0.05f, false}}, {"defaultMomentum", {0.9f, true}}, {"lossScaling", {64.0f, true}}});
  EXPECT_NE(trainAccumulated(unclipped, {}), trainAccumulated(opt, {})) << "the clipping norm does not clip";
}

TEST(Replication, DynamicLossScalingAgreesAcrossReplicas) {
  SessionOptions so;
  so.numThreads = 1;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = world()->size();
  so.communicator = world();
  so.automaticLossScalingSettings.enabled = true;
  so.automaticLossScalingSettings.initialScale = 1024.0f;
  so.automaticLossScalingSettings.growthInterval = 1;
  auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "",
                                                SGD({{"defaultLearningRate", {0.01f, false}}}), so);
  s->prepareDevice();
  for (int step = 0; step < 2; ++step) {
    // Only rank 0 sees an infinite input in step 0: every replica must skip that step.
    std::vector<float> x = randomValues(kMicroBatch * kIn, 77u + static_cast<uint32_t>(world()->rank()), 1.0f);
    std::vector<float> t(kMicroBatch * kOut, 0.0f);
    if (step == 0 && world()->rank() == 0) x[0] = INFINITY;
    NDArrayWrapper<float> xa(x.data(), {kMicroBatch, kIn}), ta(t.data(), {kMicroBatch, kOut});
    StepIO io({{"x", xa}, {"target", ta}}, {});
    s->run(io);
  }
  EXPECT_EQ(s->getSkippedSteps(), 1);
  EXPECT_EQ(s->getStepCount(), 1);
  const float scale = s->getLossScale();
  std::vector<float> scales(static_cast<size_t>(world()->size()));
  world()->allGather(&scale, scales.data(), 1, DataType::FLOAT);
  for (float other : scales)
    EXPECT_EQ(other, scale);
}

TEST(Replication, ACountOtherThanTheWorldSizeIsAnErrorNamingBoth) {
  SessionOptions so;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = world()->size() + 1;
  try {
    TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", SGD(), so);
    FAIL() << "expected an error";
  } catch (const popart::error &e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("replicatedGraphCount is " + std::to_string(world()->size() + 1)), std::string::npos) << m;
    EXPECT_NE(m.find("has " + std::to_string(world()->size()) + " ranks"), std::string::npos) << m;
  }
}

} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
