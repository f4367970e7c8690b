// DistributedSampler: the replicas' slices of every global batch are disjoint, cover the epoch
// but its remainder, follow one order on every rank, and change order each shuffled epoch; the
// DataLoader serves them. Also the mpirun command line of popart-run --replicas.

#include "cli/dataloader.hpp"
#include "cli/replication.hpp"
#include "thrown.hpp"

#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <set>

using namespace popart;
using namespace popart::cli;

namespace {

/// Every replica's samples of every step of \p epoch, by rank.
std::vector<std::vector<int64_t>> epochByRank(int64_t samples, int64_t perReplica, int replicas, bool shuffle,
                                              uint64_t seed, int64_t epoch) {
  std::vector<std::vector<int64_t>> byRank(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler s(samples, perReplica, shuffle, seed, {replicas, r});
    for (int64_t step = 0; step < s.stepsPerEpoch(); ++step) {
      std::vector<int64_t> part = s.indices(epoch, step);
      byRank[static_cast<size_t>(r)].insert(byRank[static_cast<size_t>(r)].end(), part.begin(), part.end());
    }
  }
  return byRank;
}

} // namespace

TEST(DistributedSampler, SlicesAreDisjointAndCoverTheEpochButItsRemainder) {
  for (int replicas : {1, 2, 3, 4}) {
    for (bool shuffle : {false, true}) {
      const int64_t samples = 42, perReplica = 4, global = perReplica * replicas;
      DistributedSampler s(samples, perReplica, shuffle, 11, {replicas, 0});
      EXPECT_EQ(s.globalBatch(), global);
      EXPECT_EQ(s.stepsPerEpoch(), samples / global);
      EXPECT_EQ(s.droppedPerEpoch(), samples % global);
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        std::set<int64_t> seen;
        size_t taken = 0;
        for (const auto &mine : epochByRank(samples, perReplica, replicas, shuffle, 11, epoch)) {
          EXPECT_EQ(static_cast<int64_t>(mine.size()), s.stepsPerEpoch() * perReplica);
          taken += mine.size();
          seen.insert(mine.begin(), mine.end());
        }
        EXPECT_EQ(seen.size(), taken) << replicas << " replicas, epoch " << epoch << ": a sample went to two";
        // What nobody took is exactly the tail of the epoch's order that does not fill a global batch.
        std::vector<int64_t> order = s.epochOrder(epoch);
        std::set<int64_t> dropped(order.end() - s.droppedPerEpoch(), order.end());
        for (int64_t i = 0; i < samples; ++i)
          EXPECT_NE(seen.count(i) > 0, dropped.count(i) > 0)
              << replicas << " replicas, epoch " << epoch << ", sample " << i;
        EXPECT_EQ(static_cast<int64_t>(taken), samples - samples % global);
      }
    }
  }
}

TEST(DistributedSampler, RanksInOrderMakeTheGlobalBatchOfOneProcess) {
  // One process with a batch of replicas × B must see the same samples per step as the replicas
  // together: rank 0's slice first (the order in which it accumulates its micro-batches).
  const int replicas = 3;
  const int64_t samples = 50, perReplica = 4;
  DistributedSampler single(samples, perReplica * replicas, true, 5);
  for (int64_t epoch = 0; epoch < 2; ++epoch)
    for (int64_t step = 0; step < single.stepsPerEpoch(); ++step) {
      std::vector<int64_t> joined;
      for (int r = 0; r < replicas; ++r) {
        std::vector<int64_t> part =
            DistributedSampler(samples, perReplica, true, 5, {replicas, r}).indices(epoch, step);
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, single.indices(epoch, step)) << "epoch " << epoch << " step " << step;
    }
}

TEST(DistributedSampler, EveryRankComputesTheSameOrderAndEpochsAreReshuffled) {
  const int64_t samples = 64;
  std::vector<int64_t> identity(samples);
  std::iota(identity.begin(), identity.end(), int64_t(0));
  DistributedSampler rank0(samples, 8, true, 3, {4, 0});
  for (int r = 1; r < 4; ++r)
    for (int64_t epoch = 0; epoch < 3; ++epoch)
      EXPECT_EQ(DistributedSampler(samples, 8, true, 3, {4, r}).epochOrder(epoch), rank0.epochOrder(epoch))
          << "rank " << r << ", epoch " << epoch;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> order = rank0.epochOrder(epoch);
    EXPECT_NE(order, identity) << "epoch " << epoch << " is not shuffled";
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, identity) << "epoch " << epoch << " is not a permutation";
  }
  EXPECT_NE(rank0.epochOrder(0), rank0.epochOrder(1));
  EXPECT_NE(rank0.epochOrder(1), rank0.epochOrder(2));
  EXPECT_NE(rank0.epochOrder(0), DistributedSampler(samples, 8, true, 4, {4, 0}).epochOrder(0)) << "seed ignored";
  // The sampler of a run without replication draws the same permutation.
  EXPECT_EQ(rank0.epochOrder(2), DistributedSampler(samples, 8, true, 3).epochOrder(2));
  EXPECT_EQ(DistributedSampler(samples, 8, false, 3, {4, 2}).epochOrder(1), identity);
}

TEST(DistributedSampler, LoaderServesThisRanksSliceAcrossEpochs) {
  const int64_t samples = 21, perReplica = 3;
  const int replicas = 2; // global batch 6: 3 steps per epoch, 3 samples dropped
  std::vector<uint8_t> bytes(samples * sizeof(int32_t));
  for (int32_t i = 0; i < samples; ++i)
    std::memcpy(bytes.data() + i * sizeof i, &i, sizeof i);
  for (int r = 0; r < replicas; ++r) {
    DataLoader loader({{"x", TensorInfo(DataType::INT32, {samples}), bytes}}, perReplica, true, 9, 2, {0, 2},
                      {replicas, r});
    EXPECT_EQ(loader.stepsPerEpoch(), 3);
    EXPECT_EQ(loader.sampler().droppedPerEpoch(), 3);
    DistributedSampler reference(samples, perReplica, true, 9, {replicas, r});
    for (LoaderPosition want : {LoaderPosition{0, 2}, {1, 0}, {1, 1}, {1, 2}, {2, 0}}) {
      Batch &b = loader.next();
      EXPECT_EQ(b.position(), want);
      std::vector<int64_t> expected = reference.indices(want.epoch, want.step);
      EXPECT_EQ(b.indices(), expected);
      const auto *x = static_cast<const int32_t *>(b.array("x").data());
      for (int64_t i = 0; i < perReplica; ++i)
        EXPECT_EQ(x[i], expected[static_cast<size_t>(i)]) << "rank " << r << " epoch " << want.epoch;
    }
  }
}

TEST(DistributedSampler, Errors) {
  EXPECT_NE(thrown([] { DistributedSampler(10, 2, false, 0, {2, 2}); }).find("replica 2 of 2"), std::string::npos);
  EXPECT_NE(thrown([] { DistributedSampler(10, 2, false, 0, {0, 0}); }).find("replica 0 of 0"), std::string::npos);
  std::string tooBig = thrown([] { DistributedSampler(10, 6, false, 0, {2, 0}); });
  EXPECT_NE(tooBig.find("samplesPerBatch must be in [1, 5] (the 10 samples of the data set shared by 2 replicas)"),
            std::string::npos)
      << tooBig;
  DistributedSampler s(10, 2, false, 0, {2, 1});
  EXPECT_NE(thrown([&] { s.indices(0, 2); }).find("step 2 is outside the epoch's 2 steps"), std::string::npos);
}

TEST(ReplicasCommand, ForwardsTheArgumentsWithoutReplicasAndSharesTheCores) {
  std::vector<std::string> cmd =
      replicasCommand("/usr/bin/mpirun", "/bin/popart-run", 4,
                      {"m.onnx", "--train", "--replicas", "4", "--input", "x=a.npy", "--replicas=4"}, 2, true, true);
  std::vector<std::string> want = {"/usr/bin/mpirun",
                                   "--oversubscribe",
                                   "--bind-to",
                                   "none",
                                   "--allow-run-as-root",
                                   "-np",
                                   "4",
                                   "-x",
                                   "OMP_NUM_THREADS=2",
                                   "/bin/popart-run",
                                   "m.onnx",
                                   "--train",
                                   "--input",
                                   "x=a.npy",
                                   "--threads",
                                   "2"};
  EXPECT_EQ(cmd, want);
  cmd = replicasCommand("mpirun", "p", 2, {"--threads", "3", "--replicas", "2"}, 3, false, false);
  want = {"mpirun", "--oversubscribe",   "--bind-to", "none",      "-np", "2",
          "-x",     "OMP_NUM_THREADS=3", "p",         "--threads", "3"};
  EXPECT_EQ(cmd, want);
  EXPECT_EQ(threadsPerRank(2, 2), 1);
  EXPECT_EQ(threadsPerRank(2, 4), 1);
  EXPECT_EQ(threadsPerRank(16, 3), 5);
  EXPECT_EQ(threadsPerRank(8, 0), 8);
}

TEST(ReplicasCommand, MpiEnvironmentFromOpenMpisVariables) {
  const char *names[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
  std::vector<std::string> saved;
  for (const char *n : names)
    saved.push_back(std::getenv(n) ? std::getenv(n) : "");
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  MpiEnvironment env = mpiEnvironment();
  EXPECT_TRUE(env.underMpirun());
  EXPECT_EQ(env.size, 4);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.localSize, 2);
  ::setenv("OMPI_COMM_WORLD_RANK", "x", 1);
  EXPECT_NE(thrown([] { mpiEnvironment(); }).find("OMPI_COMM_WORLD_RANK='x' is not a count"), std::string::npos);
  for (const char *n : names)
    ::unsetenv(n);
  EXPECT_FALSE(mpiEnvironment().underMpirun());
  for (size_t i = 0; i < saved.size(); ++i)
    if (!saved[i].empty()) ::setenv(names[i], saved[i].c_str(), 1);
}
