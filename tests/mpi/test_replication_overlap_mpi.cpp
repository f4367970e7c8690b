// Bucketed, overlapped gradient all-reduce and the all-reduce of accumulated gradients, under
// mpirun (tests/CMakeLists.txt runs it on 2 and 4 ranks; docs/distributed.md, "Overlapping the
// all-reduce"). Every replicated run is judged against one process that accumulates the same
// micro-batches, and the weights' bits are compared across ranks.

#include "replication_helpers.hpp"

#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

using namespace popart;
using namespace popart::testing;

namespace {

constexpr int64_t kIn = 8, kHidden1 = 32, kHidden2 = 16, kOut = 4, kMicroBatch = 3;
constexpr int kSteps = 3;

/// The MLP of replication_helpers.hpp, 8-32-16-4: six weight gradients of 16 to 1024 bytes, produced
/// last layer first.
std::string mlp() { return popart::testing::mlp({kIn, kHidden1, kHidden2, kOut}, kMicroBatch); }

/// Step \p step's global batch: \p micro micro-batches of kMicroBatch rows of \p width values.
std::vector<float> globalBatch(int step, int micro, int64_t width, uint32_t salt) {
  return randomValues(micro * kMicroBatch * width, 1000u * static_cast<uint32_t>(step) + salt, 1.0f);
}

using Weights = std::vector<std::vector<float>>;

/// What a replicated run leaves for the checks: weights, the IR, the profile's trace and summary.
struct RunResult {
  Weights weights;
  std::string ir, trace, summary;
};

SGD sgd() {
  return SGD({{"defaultLearningRate", {0.05f, false}},
              {"defaultMomentum", {0.9f, true}},
              {"defaultWeightDecay", {0.01f, true}}});
}

std::string readFile(const std::string &path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// kSteps steps replicated over the world, each replica accumulating \p accumulation
/// micro-batches (replica r takes micro-batches r, r + replicas, ...), profiled.
RunResult trainReplicated(const Optimizer &opt, int accumulation, int64_t bucketBytes,
                          const std::string &precision = "fp32", const std::vector<std::string> &disabledPasses = {}) {
  const int n = world()->size(), r = world()->rank(), a = accumulation;
  SessionOptions so;
  so.numThreads = 1;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = n;
  so.enableGradientAccumulation = a > 1;
  so.accumulationFactor = a;
  so.communicator = world();
  so.replicationBucketBytes = bucketBytes;
  so.precision = precision;
  so.disabledPasses = disabledPasses;
  auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", opt, so);
  s->prepareDevice();
  s->enableProfiling();
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> x = microBatches(globalBatch(step, n * a, kIn, 1), kIn, r, n, a, kMicroBatch);
    std::vector<float> t = microBatches(globalBatch(step, n * a, kOut, 2), kOut, r, n, a, kMicroBatch);
    NDArrayWrapper<float> xa(x.data(), batchShape(a, kMicroBatch, kIn)), ta(t.data(), batchShape(a, kMicroBatch, kOut));
    StepIO io({{"x", xa}, {"target", ta}}, {});
    s->run(io);
  }
  RunResult run;
  run.weights = weightsOf(*s);
  run.ir = s->dumpIr();
  const std::string path = "/tmp/popart_overlap_trace_" + std::to_string(getpid()) + ".json";
  s->writeProfileTrace(path);
  run.trace = readFile(path);
  std::remove(path.c_str());
  run.summary = s->profileSummary();
  return run;
}

/// The same samples in one process without a communicator, accumulating every micro-batch of
/// each global batch: the reference.
Weights trainAccumulated(const Optimizer &opt, int accumulation) {
  const int micro = world()->size() * accumulation;
  SessionOptions so;
  so.numThreads = 1;
  so.enableGradientAccumulation = micro > 1;
  so.accumulationFactor = micro;
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

/// \p actual within \p relative of each tensor's largest magnitude in \p expected (0: the bits).
void expectClose(const Weights &actual, const Weights &expected, float relative, const std::string &what) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t k = 0; k < actual.size(); ++k) {
    float largest = 0.0f;
    for (float v : expected[k])
      largest = std::max(largest, std::fabs(v));
    for (size_t i = 0; i < actual[k].size(); ++i)
      ASSERT_NEAR(actual[k][i], expected[k][i], relative * largest)
          << what << ": weight " << k << " element " << i << " on rank " << world()->rank() << " of "
          << world()->size();
  }
}

size_t count(const std::string &text, const std::string &what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size()))
    ++n;
  return n;
}

/// The op lines of the IR dump, in schedule order.
std::vector<std::string> opLines(const std::string &ir) {
  std::vector<std::string> lines;
  std::istringstream in(ir);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("  %", 0) == 0) lines.push_back(line);
  return lines;
}

TEST(ReplicationOverlap, AccumulatedGradientsAreAllReducedOncePerStep) {
  // Each replica accumulates 2 micro-batches: the 6 accumulated gradients are reduced once per
  // update (18 all-reduces in 3 steps), not per micro-batch (36), and the weights are those of
  // one process accumulating all 2N micro-batches. Clipping must see the reduced gradient.
  SGD clipped({{"defaultLearningRate", {0.05f, false}}, {"defaultMomentum", {0.9f, true}}},
              {ClipNormSettings::clipAllWeights(0.05f)});
  for (const Optimizer *opt : std::initializer_list<const Optimizer *>{nullptr, &clipped}) {
    const SGD plain = sgd();
    const Optimizer &o = opt ? *opt : plain;
    const RunResult run = trainReplicated(o, 2, 0);
    expectClose(run.weights, trainAccumulated(o, 2), 1e-6f, "accumulation 2 per replica");
    expectSameOnEveryRank(run.weights);
    EXPECT_EQ(count(run.trace, "\"cat\":\"ai.graphcore.AllReduce\""), size_t(6 * kSteps)) << run.summary;
    EXPECT_EQ(count(run.ir, "::AllReduceStart"), 0u) << "no buckets with accumulation";
  }
  SGD unclipped({{"defaultLearningRate", {0.05f, false}}, {"defaultMomentum", {0.9f, true}}});
  EXPECT_NE(trainAccumulated(unclipped, 2), trainAccumulated(clipped, 2)) << "the clipping norm does not clip";
}

TEST(ReplicationOverlap, BucketsGiveTheWeightsOfOneProcessAndOfTheBlockingAllReduce) {
  const Weights reference = trainAccumulated(sgd(), 1);
  const RunResult blocking = trainReplicated(sgd(), 1, 0);
  EXPECT_EQ(count(blocking.ir, "::AllReduceStart"), 0u);
  EXPECT_EQ(count(blocking.trace, "\"cat\":\"ai.graphcore.AllReduce\""), size_t(6 * kSteps));
  expectClose(blocking.weights, reference, 1e-6f, "blocking");
  // 1 byte: a bucket per gradient; 600: the gradients of 16, 64, 64, 2048, 128, 1024 bytes
  // (production order b3, w3, b2, w2, b1, w1): w2 and w1, half a bucket or more, each go alone
  // (reduced in their own bytes), so b3+w3+b2, w2, b1, w1 (5 if the order differs); 4 MiB: one
  // bucket.
  for (int64_t bucketBytes : {int64_t{1}, int64_t{600}, int64_t{4} << 20}) {
    const std::string what = "buckets of " + std::to_string(bucketBytes) + " bytes";
    const RunResult run = trainReplicated(sgd(), 1, bucketBytes);
    const size_t buckets = count(run.ir, "::AllReduceStart");
    const size_t expectedLow = bucketBytes == 1 ? 6 : bucketBytes == 600 ? 4 : 1;
    const size_t expectedHigh = bucketBytes == 1 ? 6 : bucketBytes == 600 ? 5 : 1;
    EXPECT_GE(buckets, expectedLow) << what << "\n" << run.ir;
    EXPECT_LE(buckets, expectedHigh) << what << "\n" << run.ir;
    EXPECT_EQ(count(run.trace, "\"cat\":\"ai.graphcore.AllReduce\""), 0u) << what << ": no blocking all-reduce";
    expectClose(run.weights, reference, 1e-6f, what);
    // A two-term sum does not depend on where the ring cuts its chunks: on 2 ranks buckets give
    // the blocking all-reduce's bits; on more the order of additions follows the chunks.
    expectClose(run.weights, blocking.weights, world()->size() == 2 ? 0.0f : 1e-6f, what + " against blocking");
    expectSameOnEveryRank(run.weights);
  }
}

TEST(ReplicationOverlap, HalfPrecisionGradientsTravelInBucketsOfTheirOwnType) {
  // fp16.32: FLOAT16 gradients reach the optimiser, so the buckets are FLOAT16 (summed in fp32 by
  // the communicator, rounded once); they must agree with the blocking all-reduce of each.
  const RunResult blocking = trainReplicated(sgd(), 1, 0, "fp16.32");
  const RunResult bucketed = trainReplicated(sgd(), 1, 600, "fp16.32");
  size_t halfBuckets = 0;
  for (const std::string &line : opLines(bucketed.ir))
    if (line.find("::AllReduceStart") != std::string::npos && line.find(": FLOAT16[") != std::string::npos)
      ++halfBuckets;
  EXPECT_GE(halfBuckets, 1u) << bucketed.ir;
  // On 2 ranks each element is a two-term sum in fp32, rounded once: the same bits either way.
  // On more, the fp32 order of additions moves with the bucket boundaries and may flip a rounding.
  expectClose(bucketed.weights, blocking.weights, world()->size() == 2 ? 0.0f : 1e-3f, "fp16.32 buckets");
  expectSameOnEveryRank(bucketed.weights);
}

/// Where the schedule of \p run puts the first AllReduceStart, the first and last AllReduceWait,
/// the first SGDUpdate and the last MatMul or Gemm (indices in its op lines).
struct Placement {
  std::ptrdiff_t firstStart, firstWait, lastWait, firstUpdate, lastMatMul, ops;
};
Placement placement(const RunResult &run) {
  const std::vector<std::string> ops = opLines(run.ir);
  auto first = [&](const std::string &what) {
    return std::find_if(ops.begin(), ops.end(),
                        [&](const std::string &l) { return l.find("::" + what) != std::string::npos; }) -
           ops.begin();
  };
  auto last = [&](const std::vector<std::string> &what) {
    std::ptrdiff_t at = -1;
    for (size_t i = 0; i < ops.size(); ++i)
      for (const std::string &w : what)
        if (ops[i].find("::" + w) != std::string::npos) at = static_cast<std::ptrdiff_t>(i);
    return at;
  };
  return {first("AllReduceStart"), first("AllReduceWait"),   last({"AllReduceWait"}),
          first("SGDUpdate"),      last({"MatMul", "Gemm"}), static_cast<std::ptrdiff_t>(ops.size())};
}

TEST(ReplicationOverlap, EachBucketIsWaitedForJustBeforeItsUpdates) {
  // One bucket per gradient: each Wait just before the update of its weight, so the last
  // buckets' rings advance while the first weights update.
  const Placement p = placement(trainReplicated(sgd(), 1, 1));
  EXPECT_LT(p.firstWait, p.firstUpdate);
  EXPECT_GT(p.lastWait, p.firstUpdate) << "the waits are not interleaved with the updates";
  // Without the pass (and with a finite check, which reads every gradient before any update) the
  // waits all come before the first update.
  const Placement off = placement(trainReplicated(sgd(), 1, 1, "fp32", {"waitForBucketsAtTheirUpdates"}));
  EXPECT_LT(off.lastWait, off.firstUpdate);
}

TEST(ReplicationOverlap, BucketsStartDuringTheBackwardAndAreWaitedForBeforeTheOptimiser) {
  const RunResult run = trainReplicated(sgd(), 1, 1, "fp32", {"waitForBucketsAtTheirUpdates"});
  const std::vector<std::string> ops = opLines(run.ir);
  auto first = [&](const std::string &what) {
    return std::find_if(ops.begin(), ops.end(),
                        [&](const std::string &l) { return l.find("::" + what) != std::string::npos; }) -
           ops.begin();
  };
  const auto firstStart = first("AllReduceStart"), firstWait = first("AllReduceWait"), firstUpdate = first("SGDUpdate"),
             lastMatMul = [&] {
               std::ptrdiff_t last = -1;
               for (size_t i = 0; i < ops.size(); ++i)
                 if (ops[i].find("::MatMul") != std::string::npos || ops[i].find("::Gemm") != std::string::npos)
                   last = static_cast<std::ptrdiff_t>(i);
               return last;
             }();
  ASSERT_LT(firstStart, static_cast<std::ptrdiff_t>(ops.size())) << run.ir;
  // The first bucket (the last layer's gradients) starts while backward products remain to run,
  // and the waits come after the backward, before the first update.
  EXPECT_LT(firstStart, lastMatMul) << run.ir;
  EXPECT_GT(firstWait, lastMatMul) << run.ir;
  EXPECT_LT(firstWait, firstUpdate) << run.ir;
}

TEST(ReplicationOverlap, TheProfileShowsCommunicationOnItsOwnTrackAndTheWaitingShare) {
  const RunResult bucketed = trainReplicated(sgd(), 1, 1);
  // One span per bucket and step on the "communication" track, named after the bucket.
  EXPECT_NE(bucketed.trace.find("\"name\":\"communication\""), std::string::npos);
  EXPECT_EQ(count(bucketed.trace, "\"cat\":\"communication\""), size_t(6 * kSteps)) << bucketed.trace;
  EXPECT_NE(bucketed.trace.find("allreduce_bucket0_start"), std::string::npos);
  EXPECT_NE(bucketed.summary.find("communication: waiting "), std::string::npos) << bucketed.summary;
  EXPECT_NE(bucketed.summary.find("18 collective spans"), std::string::npos) << bucketed.summary;
  EXPECT_NE(bucketed.summary.find("comm "), std::string::npos) << "kernel column of collectives\n" << bucketed.summary;
  const RunResult blocking = trainReplicated(sgd(), 1, 0);
  EXPECT_EQ(count(blocking.trace, "\"cat\":\"communication\""), size_t(6 * kSteps)) << blocking.trace;
  EXPECT_NE(blocking.summary.find("18 collective spans"), std::string::npos) << blocking.summary;
}

TEST(ReplicationOverlap, DynamicLossScalingAgreesWithBuckets) {
  SessionOptions so;
  so.numThreads = 1;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = world()->size();
  so.communicator = world();
  so.replicationBucketBytes = 600;
  so.automaticLossScalingSettings.enabled = true;
  so.automaticLossScalingSettings.initialScale = 1024.0f;
  so.automaticLossScalingSettings.growthInterval = 1;
  auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "",
                                                SGD({{"defaultLearningRate", {0.01f, false}}}), so);
  s->prepareDevice();
  for (int step = 0; step < 2; ++step) {
    // Only the last rank sees an infinite input in step 0: every replica must skip that step.
    std::vector<float> x = randomValues(kMicroBatch * kIn, 77u + static_cast<uint32_t>(world()->rank()), 1.0f);
    std::vector<float> t(kMicroBatch * kOut, 0.0f);
    if (step == 0 && world()->rank() == world()->size() - 1) x[0] = INFINITY;
    NDArrayWrapper<float> xa(x.data(), {kMicroBatch, kIn}), ta(t.data(), {kMicroBatch, kOut});
    StepIO io({{"x", xa}, {"target", ta}}, {});
    s->run(io);
  }
  EXPECT_EQ(s->getSkippedSteps(), 1);
  EXPECT_EQ(s->getStepCount(), 1);
  expectSameOnEveryRank(weightsOf(*s));
}

TEST(ReplicationOverlap, RanksWithDifferentBucketSizesAreNamedAtCreation) {
  // Other buckets would mean other collectives: the ranks would wait for each other's.
  SessionOptions so;
  so.numThreads = 1;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = world()->size();
  so.communicator = world();
  so.replicationBucketBytes = world()->rank() == world()->size() - 1 ? 600 : 0;
  try {
    auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", sgd(), so);
    s->prepareDevice();
    FAIL() << "expected an error on rank " << world()->rank();
  } catch (const popart::error &e) {
    EXPECT_NE(std::string(e.what()).find("replicationBucketBytes"), std::string::npos) << e.what();
  }
}

TEST(ReplicationOverlap, ANegativeBucketSizeIsAnError) {
  SessionOptions so;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = world()->size();
  so.communicator = world();
  so.replicationBucketBytes = -1;
  try {
    auto s = TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", sgd(), so);
    s->prepareDevice();
    FAIL() << "expected an error";
  } catch (const popart::error &e) {
    EXPECT_NE(std::string(e.what()).find("replicationBucketBytes"), std::string::npos) << e.what();
  }
}

} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
