// Replicated tensor sharding of the optimiser state under mpirun (tests/CMakeLists.txt runs it on
// 2 and 4 ranks): N sharded replicas must end with the weights of one process that accumulates
// the same N micro-batches, the same bits on every rank, and 1/N of that process's optimiser
// state each. The MLP's sizes are chosen so that shards need padding: b1 (15), w2 (75) and b2 (5)
// do not split into 2 or 4, and on 4 ranks b2's shards of 2 leave rank 3 padding only, starting
// past the end of the weight.

#include "replication_helpers.hpp"

#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace popart;
using popart::testing::batchShape;
using popart::testing::expectSameOnEveryRank;
using popart::testing::microBatches;
using popart::testing::randomValues;
using popart::testing::weightsOf;
using popart::testing::world;

namespace {

constexpr int64_t kIn = 8, kHidden = 15, kOut = 5, kMicroBatch = 3;
constexpr int kSteps = 3;

/// The MLP of replication_helpers.hpp, 8-15-5, over micro-batches of kMicroBatch samples.
std::string mlp() { return popart::testing::mlp({kIn, kHidden, kOut}, kMicroBatch); }

/// How both sides train.
struct TrainingSetup {
  ReductionType reduction = ReductionType::Mean;
  int accumulation = 1; ///< each replica's accumulation factor
  /// Weights below this many elements keep their whole state (0: every weight sharded).
  int64_t minElements = 0;
  /// Dynamic loss scaling, with an infinite input in the first micro-batch of the first step.
  bool dynamicScalingWithInfinity = false;
  /// After kSteps, every rank writes the same new weights and trains one more step.
  bool writeWeightsAndContinue = false;
  /// SessionOptions::precision.
  std::string precision = "fp32";
};

/// The global batch of step \p step: \p micro micro-batches of kMicroBatch samples of \p width.
std::vector<float> globalBatch(int step, int micro, int64_t width, uint32_t salt, const TrainingSetup &setup) {
  std::vector<float> v = randomValues(micro * kMicroBatch * width, 1000u * static_cast<uint32_t>(step) + salt, 1.0f);
  if (setup.dynamicScalingWithInfinity && step == 0 && salt == 1) v[0] = INFINITY;
  return v;
}

/// What a run ends with.
struct Result {
  std::vector<std::vector<float>> weights;
  int64_t stateBytes = 0; ///< of getOptimizerStateIds(), this replica's
  int64_t skipped = 0;
  std::string profile;
};

/// Trains replicated over the world (sharded or not) or, with \p replicated false, in one process
/// accumulating every replica's micro-batches of each step.
Result train(const Optimizer &opt, const TrainingSetup &setup, bool replicated, bool sharded) {
  const int n = world()->size(), r = world()->rank(), a = setup.accumulation;
  const int micro = replicated ? a : n * a;
  SessionOptions so;
  so.numThreads = 1;
  so.precision = setup.precision;
  so.accumulationAndReplicationReductionType = setup.reduction;
  so.enableGradientAccumulation = micro > 1;
  so.accumulationFactor = micro;
  if (replicated) {
    so.enableReplicatedGraphs = true;
    so.replicatedGraphCount = n;
    so.communicator = world();
  }
  if (sharded) {
    so.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
    so.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = setup.minElements;
  }
  if (setup.dynamicScalingWithInfinity) {
    so.automaticLossScalingSettings.enabled = true;
    so.automaticLossScalingSettings.initialScale = 1024.0f;
    so.automaticLossScalingSettings.growthInterval = 1;
  }
  auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", opt, so);
  s->prepareDevice();
  s->enableProfiling();
  auto step = [&](int k) {
    std::vector<float> x = globalBatch(k, n * a, kIn, 1, setup), t = globalBatch(k, n * a, kOut, 2, setup);
    if (replicated) {
      x = microBatches(x, kIn, r, n, a, kMicroBatch);
      t = microBatches(t, kOut, r, n, a, kMicroBatch);
    }
    NDArrayWrapper<float> xa(x.data(), batchShape(micro, kMicroBatch, kIn)),
        ta(t.data(), batchShape(micro, kMicroBatch, kOut));
    StepIO io({{"x", xa}, {"target", ta}}, {});
    s->run(io);
  };
  for (int k = 0; k < kSteps; ++k)
    step(k);
  if (setup.writeWeightsAndContinue) {
    std::vector<std::vector<float>> fresh = weightsOf(*s);
    WeightsIO io;
    const std::vector<TensorId> ids = s->getWeightIds();
    std::vector<NDArrayWrapper<float>> arrays;
    arrays.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      for (size_t e = 0; e < fresh[i].size(); ++e)
        fresh[i][e] = 0.5f * fresh[i][e] + 0.01f * static_cast<float>(e % 7);
      arrays.emplace_back(fresh[i].data(), s->getInfo(ids[i]).shape());
      io.insert(ids[i], arrays.back());
    }
    s->writeWeights(io);
    step(kSteps);
  }
  Result result;
  result.weights = weightsOf(*s);
  for (const TensorId &id : s->getOptimizerStateIds())
    result.stateBytes += s->getInfo(id).byteCount();
  result.skipped = s->getSkippedSteps();
  result.profile = s->profileSummary();
  return result;
}

/// Checks that sharded replicas end within 1e-6 (of each tensor's largest magnitude) of one
/// process accumulating their micro-batches, with the same bits on every rank; \returns both.
std::pair<Result, Result> checkEquivalent(const Optimizer &opt, const TrainingSetup &setup = {}) {
  const Result sharded = train(opt, setup, true, true);
  const Result accumulated = train(opt, setup, false, false);
  EXPECT_EQ(sharded.skipped, accumulated.skipped);
  EXPECT_EQ(sharded.weights.size(), accumulated.weights.size());
  const auto initial = [] {
    auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", SGD(), {});
    s->prepareDevice();
    return weightsOf(*s);
  }();
  for (size_t k = 0; k < sharded.weights.size() && k < accumulated.weights.size(); ++k) {
    float largest = 0.0f, moved = 0.0f;
    for (size_t i = 0; i < accumulated.weights[k].size(); ++i) {
      largest = std::max(largest, std::fabs(accumulated.weights[k][i]));
      moved = std::max(moved, std::fabs(accumulated.weights[k][i] - initial[k][i]));
    }
    EXPECT_GT(moved, 1e-4f) << "weight " << k << " did not train";
    for (size_t i = 0; i < sharded.weights[k].size(); ++i)
      if (std::fabs(sharded.weights[k][i] - accumulated.weights[k][i]) > 1e-6f * largest) {
        ADD_FAILURE() << "weight " << k << " element " << i << " on rank " << world()->rank() << " of "
                      << world()->size() << ": sharded " << sharded.weights[k][i] << ", accumulated "
                      << accumulated.weights[k][i];
        break; // one element per tensor is enough to see
      }
  }
  expectSameOnEveryRank(sharded.weights);
  return {sharded, accumulated};
}

/// The optimiser state bytes one replica holds when every weight is sharded: each weight's
/// elements rounded up to a multiple of the replicas, divided by them, times \p statesPerWeight.
int64_t shardedStateBytes(int statesPerWeight) {
  const int64_t n = world()->size();
  int64_t elements = 0;
  for (int64_t e : {kIn * kHidden, kHidden, kHidden * kOut, kOut})
    elements += (e + n - 1) / n;
  return elements * statesPerWeight * int64_t(sizeof(float));
}

SGD sgdWithMomentum() {
  return SGD({{"defaultLearningRate", {0.05f, false}},
              {"defaultMomentum", {0.9f, true}},
              {"defaultWeightDecay", {0.01f, true}}});
}

Adam adamW() {
  return Adam(
      {{"defaultLearningRate", {0.01f, false}}, {"defaultWeightDecay", {0.01f, true}}, {"defaultEps", {1e-6f, true}}},
      AdamMode::Adam, WeightDecayMode::Decay);
}

TEST(ReplicationSharding, SgdWithMomentumMatchesAccumulationWithAShardOfTheState) {
  const auto [sharded, accumulated] = checkEquivalent(sgdWithMomentum());
  EXPECT_EQ(sharded.stateBytes, shardedStateBytes(1));
  EXPECT_LE(sharded.stateBytes, accumulated.stateBytes / world()->size() + 4 * 4 * int64_t(sizeof(float)));
  // Reduce-scattered instead of all-reduced, not after it: with Sum a gradient all-reduced
  // first would be summed twice.
  // (The summary's "communication:" line names AllReduceWait whatever ran.)
  std::istringstream lines(sharded.profile);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("communication:", 0) != 0) {
      EXPECT_EQ(line.find("AllReduce"), std::string::npos) << line;
    }
  EXPECT_NE(sharded.profile.find("ReduceScatter"), std::string::npos) << sharded.profile;
  checkEquivalent(sgdWithMomentum(), TrainingSetup{ReductionType::Sum, 1});
}

TEST(ReplicationSharding, AdamWMatchesAccumulationWithAShardOfTheState) {
  const auto [sharded, accumulated] = checkEquivalent(adamW());
  EXPECT_EQ(sharded.stateBytes, shardedStateBytes(2));
  EXPECT_LE(sharded.stateBytes, accumulated.stateBytes / world()->size() + 4 * 4 * 2 * int64_t(sizeof(float)));
  // The memory report names the shards.
  EXPECT_NE(sharded.profile.find("optimiser state (this replica's shards)"), std::string::npos) << sharded.profile;
  EXPECT_NE(sharded.profile.find("weight shards"), std::string::npos) << sharded.profile;
}

TEST(ReplicationSharding, LambMatchesAccumulation) {
  // LAMB's trust ratio takes the norms of the whole weight and update: with the shard's alone
  // the ratios, and so the weights, would differ.
  checkEquivalent(Adam(
      {{"defaultLearningRate", {0.01f, false}}, {"defaultWeightDecay", {0.01f, true}}, {"defaultEps", {1e-6f, true}}},
      AdamMode::Lamb));
}

TEST(ReplicationSharding, CenteredRmsPropAndAdaGradMatchAccumulation) {
  // Three state tensors per weight, and AdaGrad's filled with its initial accumulator (padding too).
  const auto [sharded, accumulated] = checkEquivalent(Adaptive({{"defaultLearningRate", {0.01f, false}},
                                                                {"defaultMomentum", {0.5f, true}},
                                                                {"defaultWeightDecay", {0.01f, true}}},
                                                               AdaptiveMode::CenteredRMSProp));
  EXPECT_EQ(sharded.stateBytes, shardedStateBytes(3));
  checkEquivalent(Adaptive({{"defaultLearningRate", {0.05f, false}}, {"defaultInitialAccumulator", {0.1f, true}}},
                           AdaptiveMode::AdaGrad));
}

TEST(ReplicationSharding, AccumulationClippingAndLossScalingMatchAccumulation) {
  // Each replica accumulates 2 micro-batches, reduce-scattered once per step; the clipping norm
  // (below the gradients') is that of the whole gradients, summed over the shards.
  SGD opt({{"defaultLearningRate", {0.05f, false}}, {"defaultMomentum", {0.9f, true}}, {"lossScaling", {64.0f, true}}},
          {ClipNormSettings::clipAllWeights(0.05f)});
  checkEquivalent(opt, TrainingSetup{ReductionType::Mean, 2});
  checkEquivalent(opt, TrainingSetup{ReductionType::Sum, 2});
  // Unclipped, so that a gradient reduced twice (all-reduced, then reduce-scattered) would show.
  checkEquivalent(sgdWithMomentum(), TrainingSetup{ReductionType::Sum, 2});
  TrainingSetup unclipped;
  EXPECT_NE(train(sgdWithMomentum(), unclipped, false, false).weights,
            train(SGD({{"defaultLearningRate", {0.05f, false}},
                       {"defaultMomentum", {0.9f, true}},
                       {"defaultWeightDecay", {0.01f, true}}},
                      {ClipNormSettings::clipAllWeights(0.05f)}),
                  unclipped, false, false)
                .weights)
      << "the clipping norm does not clip";
}

TEST(ReplicationSharding, ClippedAdamWWithSomeWeightsWholeMatchesAccumulation) {
  // b1 (15) and b2 (5) stay whole and are all-reduced; w1 and w2 are sharded; one clipping
  // group spans both kinds.
  Adam opt(
      {{"defaultLearningRate", {0.01f, false}}, {"defaultWeightDecay", {0.01f, true}}, {"defaultEps", {1e-6f, true}}},
      AdamMode::Adam, WeightDecayMode::Decay, {ClipNormSettings::clipAllWeights(0.1f)});
  TrainingSetup setup;
  setup.minElements = 16;
  const auto [sharded, accumulated] = checkEquivalent(opt, setup);
  const int64_t n = world()->size();
  const int64_t expected =
      2 * int64_t(sizeof(float)) * ((kIn * kHidden + n - 1) / n + (kHidden * kOut + n - 1) / n + kHidden + kOut);
  EXPECT_EQ(sharded.stateBytes, expected);
}

TEST(ReplicationSharding, DynamicLossScalingSkipsTheSameStepsAsAccumulation) {
  // Only replica 0's first micro-batch holds an infinity: every replica must skip that step,
  // as the one process does, and grow its scale alike afterwards.
  TrainingSetup setup;
  setup.dynamicScalingWithInfinity = true;
  const auto [sharded, accumulated] = checkEquivalent(adamW(), setup);
  EXPECT_EQ(sharded.skipped, 1);
}

TEST(ReplicationSharding, WrittenWeightsReachTheShards) {
  // writeWeights replaces the whole weights; the next update must start from them on every
  // shard (each replica takes its shard from the weight every step).
  TrainingSetup setup;
  setup.writeWeightsAndContinue = true;
  checkEquivalent(sgdWithMomentum(), setup);
}

TEST(ReplicationSharding, MixedPrecisionShardsTheMasterWeightsAndTheirState) {
  // fp16.32: fp16 gradients are reduce-scattered in fp16 (summed in fp32 and rounded once, as
  // the all-reduce does), each replica updates its shard of the fp32 master weights and state.
  // One process accumulates fp16 gradients in fp32 instead, so the reference is the unsharded
  // replicated run, whose all-reduce rounds alike.
  TrainingSetup setup;
  setup.precision = "fp16.32";
  setup.dynamicScalingWithInfinity = true;
  const Result sharded = train(adamW(), setup, true, true);
  const Result whole = train(adamW(), setup, true, false);
  EXPECT_EQ(sharded.skipped, 1);
  EXPECT_EQ(whole.skipped, 1);
  EXPECT_EQ(sharded.stateBytes, shardedStateBytes(2));
  ASSERT_EQ(sharded.weights.size(), whole.weights.size());
  for (size_t k = 0; k < whole.weights.size(); ++k) {
    float largest = 0.0f, worst = 0.0f;
    for (size_t i = 0; i < whole.weights[k].size(); ++i) {
      largest = std::max(largest, std::fabs(whole.weights[k][i]));
      worst = std::max(worst, std::fabs(sharded.weights[k][i] - whole.weights[k][i]));
    }
    EXPECT_LE(worst, 1e-6f * largest) << "weight " << k << " on rank " << world()->rank();
  }
  expectSameOnEveryRank(sharded.weights);
}

TEST(ReplicationSharding, TheHistogramMethodOfLossScalingIsRefusedWithAReason) {
  // Its gradient statistics would count this replica's shard alone, and the replicas' scales drift.
  SessionOptions so;
  so.numThreads = 1;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = world()->size();
  so.communicator = world();
  so.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
  so.automaticLossScalingSettings.enabled = true;
  so.automaticLossScalingSettings.method = AutomaticLossScalingSettings::Method::Histogram;
  try {
    auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", adamW(), so);
    s->prepareDevice();
    FAIL() << "expected an error";
  } catch (const popart::error &e) {
    EXPECT_NE(std::string(e.what()).find("histogram method"), std::string::npos) << e.what();
  }
}

// Checkpoints of a sharded session (docs/distributed.md, "One checkpoint for the job"): saving
// gathers the shards and rank 0 writes the whole state, in the format of an unsharded session's
// checkpoint; loading cuts each replica's shard out of it. The references are the same job run
// without interruption, unsharded replicas, and one process accumulating every replica's
// micro-batches.

/// How a checkpoint test trains: sharded replicas, unsharded replicas, or one process.
enum class Run { Sharded, Replicated, OneProcess };

std::unique_ptr<TrainingSession> checkpointSession(const Optimizer &opt, const TrainingSetup &setup, Run run) {
  const int n = world()->size();
  SessionOptions so;
  so.numThreads = 1;
  so.precision = setup.precision;
  const int micro = run == Run::OneProcess ? n * setup.accumulation : setup.accumulation;
  so.enableGradientAccumulation = micro > 1;
  so.accumulationFactor = micro;
  if (run != Run::OneProcess) {
    so.enableReplicatedGraphs = true;
    so.replicatedGraphCount = n;
    so.communicator = world();
  }
  if (run == Run::Sharded) {
    so.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
    so.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = setup.minElements;
  }
  auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", opt, so);
  s->prepareDevice();
  return s;
}

/// Trains steps [\p first, \p last) of the job: this replica's micro-batches of each global
/// batch, or all of them in one process.
void trainSteps(TrainingSession &s, int first, int last, const TrainingSetup &setup, Run run) {
  const int n = world()->size(), r = world()->rank(), a = setup.accumulation;
  const int micro = run == Run::OneProcess ? n * a : a;
  for (int k = first; k < last; ++k) {
    std::vector<float> x = globalBatch(k, n * a, kIn, 1, setup), t = globalBatch(k, n * a, kOut, 2, setup);
    if (run != Run::OneProcess) {
      x = microBatches(x, kIn, r, n, a, kMicroBatch);
      t = microBatches(t, kOut, r, n, a, kMicroBatch);
    }
    NDArrayWrapper<float> xa(x.data(), batchShape(micro, kMicroBatch, kIn)),
        ta(t.data(), batchShape(micro, kMicroBatch, kOut));
    StepIO io({{"x", xa}, {"target", ta}}, {});
    s.run(io);
  }
}

std::string shardedCheckpointPath(const std::string &name) {
  // The same path on every rank: one checkpoint for the job.
  return ::testing::TempDir() + "replication_sharding_" + name + "_np" + std::to_string(world()->size()) + ".ckpt";
}

/// Trains 2 steps as \p writer, checkpoints (on every rank), trains 2 more; \returns the final
/// weights. The checkpoint is readable on every rank when this returns.
std::vector<std::vector<float>> trainAndCheckpoint(const Optimizer &opt, const TrainingSetup &setup, Run writer,
                                                   const std::string &path) {
  auto s = checkpointSession(opt, setup, writer);
  trainSteps(*s, 0, 2, setup, writer);
  // Every process of a one-process run would write the same file: rank 0's stands for them.
  if (writer != Run::OneProcess || world()->rank() == 0) s->saveCheckpoint(path);
  world()->barrier(); // an unsharded session's save returns at once on ranks other than 0
  trainSteps(*s, 2, 4, setup, writer);
  return weightsOf(*s);
}

/// Loads \p path into a new session of kind \p reader and trains steps 2 and 3; \returns the weights.
std::vector<std::vector<float>> resume(const Optimizer &opt, const TrainingSetup &setup, Run reader,
                                       const std::string &path) {
  auto s = checkpointSession(opt, setup, reader);
  s->loadCheckpoint(path);
  EXPECT_EQ(s->getStepCount(), 2);
  trainSteps(*s, 2, 4, setup, reader);
  return weightsOf(*s);
}

/// Expects \p got within 1e-6 of each tensor's largest magnitude in \p expected.
void expectClose(const std::vector<std::vector<float>> &got, const std::vector<std::vector<float>> &expected,
                 const std::string &what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t k = 0; k < expected.size(); ++k) {
    float largest = 0.0f, worst = 0.0f;
    for (size_t i = 0; i < expected[k].size(); ++i) {
      largest = std::max(largest, std::fabs(expected[k][i]));
      worst = std::max(worst, std::fabs(got[k][i] - expected[k][i]));
    }
    EXPECT_LE(worst, 1e-6f * largest) << what << ": weight " << k << " on rank " << world()->rank() << " of "
                                      << world()->size();
  }
}

/// The shards' whole state must be in the file: resumed at the same count, every rank's next
/// updates are those of the uninterrupted run, bit for bit.
void checkShardedResumeIsBitIdentical(const Optimizer &opt, const TrainingSetup &setup, const std::string &name) {
  const std::string path = shardedCheckpointPath(name);
  const auto uninterrupted = trainAndCheckpoint(opt, setup, Run::Sharded, path);
  const auto resumed = resume(opt, setup, Run::Sharded, path);
  EXPECT_EQ(resumed, uninterrupted) << name << ": resumed on rank " << world()->rank();
  expectSameOnEveryRank(resumed);
  // A fresh session that did not load (its state zero) must not match, else the test shows nothing.
  auto fresh = checkpointSession(opt, setup, Run::Sharded);
  trainSteps(*fresh, 2, 4, setup, Run::Sharded);
  EXPECT_NE(weightsOf(*fresh), uninterrupted) << name;
  world()->barrier();
  if (world()->rank() == 0) std::remove(path.c_str());
}

TEST(ReplicationSharding, ACheckpointResumesTheShardedStateBitForBit) {
  checkShardedResumeIsBitIdentical(adamW(), {}, "adamw");
  checkShardedResumeIsBitIdentical(sgdWithMomentum(), TrainingSetup{ReductionType::Mean, 2}, "sgd_accumulated");
  // fp16.32: the optimiser state is fp32 beside fp32 master weights, which the shards are cut from.
  TrainingSetup mixed;
  mixed.precision = "fp16.32";
  checkShardedResumeIsBitIdentical(adamW(), mixed, "adamw_fp16_32");
}

TEST(ReplicationSharding, AShardedCheckpointHoldsTheWholeStateInTheUnshardedFormat) {
  // The file does not depend on the sharding: unsharded replicas and one process accumulating
  // every replica's micro-batches load it and continue as the sharded run does.
  const std::string path = shardedCheckpointPath("whole");
  const auto sharded = trainAndCheckpoint(adamW(), {}, Run::Sharded, path);
  expectClose(resume(adamW(), {}, Run::Replicated, path), sharded, "unsharded replicas resumed");
  expectClose(resume(adamW(), {}, Run::OneProcess, path), sharded, "one process resumed");
  // With some weights whole (b1, b2) the sharded and whole state interleave in the file.
  TrainingSetup someWhole;
  someWhole.minElements = 16;
  const auto mixed = trainAndCheckpoint(adamW(), someWhole, Run::Sharded, path);
  expectClose(resume(adamW(), someWhole, Run::OneProcess, path), mixed, "one process resumed (some weights whole)");
  world()->barrier();
  if (world()->rank() == 0) std::remove(path.c_str());
}

TEST(ReplicationSharding, AnUnshardedCheckpointLoadsIntoShardedReplicas) {
  // Each replica cuts its shard (padding past the weight's end) out of the whole state.
  const std::string path = shardedCheckpointPath("unsharded");
  const auto replicated = trainAndCheckpoint(adamW(), {}, Run::Replicated, path);
  const auto sharded = resume(adamW(), {}, Run::Sharded, path);
  expectClose(sharded, replicated, "sharded replicas resumed from unsharded replicas");
  expectSameOnEveryRank(sharded);
  const auto oneProcess = trainAndCheckpoint(sgdWithMomentum(), {}, Run::OneProcess, path);
  expectClose(resume(sgdWithMomentum(), {}, Run::Sharded, path), oneProcess,
              "sharded replicas resumed from one process");
  world()->barrier();
  if (world()->rank() == 0) std::remove(path.c_str());
}

TEST(ReplicationSharding, ACheckpointRank0CannotWriteFailsOnEveryRankNamingIt) {
  // Saving sharded state is a collective: the ranks that only gathered must not carry on as if the
  // file existed, nor wait for rank 0.
  auto s = checkpointSession(adamW(), {}, Run::Sharded);
  const std::string path = ::testing::TempDir() + "no_such_directory/sharded.ckpt";
  try {
    s->saveCheckpoint(path);
    ADD_FAILURE() << "rank " << world()->rank() << ": expected an error";
  } catch (const popart::error &e) {
    const std::string what = e.what();
    const std::string expected = world()->rank() == 0
                                     ? "rank 0 of " + std::to_string(world()->size()) + ": cannot write"
                                     : "rank 0 could not write '" + path + "'";
    EXPECT_NE(what.find(expected), std::string::npos) << what;
  }
}

} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
