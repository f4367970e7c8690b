// DataLoader: batch order with and without shuffling, reproducibility per (seed, epoch), resuming,
// the ring of prefetched batches, and errors for inconsistent data sets.

#include "cli/dataloader.hpp"

#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

using namespace popart;
using namespace popart::cli;

namespace {

/// "x": INT32 [n, 2] with row i = {i, 1000 + i}; "y": FLOAT [n] with y[i] = i / 2.
Dataset makeDataset(int64_t n) {
  std::vector<uint8_t> x(static_cast<size_t>(n) * 2 * sizeof(int32_t)), y(static_cast<size_t>(n) * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    int32_t row[2] = {static_cast<int32_t>(i), static_cast<int32_t>(1000 + i)};
    float v = static_cast<float>(i) / 2.0f;
    std::memcpy(x.data() + i * sizeof row, row, sizeof row);
    std::memcpy(y.data() + i * sizeof v, &v, sizeof v);
  }
  Dataset d;
  d.push_back({"x", TensorInfo(DataType::INT32, {n, 2}), std::move(x)});
  d.push_back({"y", TensorInfo(DataType::FLOAT, {n}), std::move(y)});
  return d;
}

/// The samples of \p b read back from its buffers (its "x" rows), checking every array agrees
/// with the indices the batch reports.
std::vector<int64_t> samplesOf(Batch &b) {
  IArray &x = b.array("x");
  IArray &y = b.array("y");
  EXPECT_EQ(x.dataType(), DataType::INT32);
  EXPECT_EQ(y.dataType(), DataType::FLOAT);
  const int64_t n = x.shape()[0];
  EXPECT_EQ(y.shape(), (Shape{n}));
  EXPECT_EQ(x.shape(), (Shape{n, 2}));
  const auto *xv = static_cast<const int32_t *>(x.data());
  const auto *yv = static_cast<const float *>(y.data());
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(xv[2 * i]);
    EXPECT_EQ(xv[2 * i + 1], 1000 + xv[2 * i]) << "sample " << i;
    EXPECT_EQ(yv[i], static_cast<float>(xv[2 * i]) / 2.0f) << "sample " << i;
    EXPECT_EQ(b.indices()[static_cast<size_t>(i)], xv[2 * i]) << "sample " << i;
  }
  return out;
}

/// The sample order of the next \p steps batches.
std::vector<std::vector<int64_t>> take(DataLoader &l, int64_t steps) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = 0; s < steps; ++s)
    out.push_back(samplesOf(l.next()));
  return out;
}

} // namespace

TEST(DataLoader, InOrderWithoutShuffleAndDropsTheLastIncompleteBatch) {
  DataLoader l(makeDataset(10), 3, false, 7);
  EXPECT_EQ(l.stepsPerEpoch(), 3);
  EXPECT_EQ(l.samples(), 10);
  std::vector<std::vector<int64_t>> want = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {0, 1, 2}, {3, 4, 5}};
  for (size_t s = 0; s < want.size(); ++s) {
    LoaderPosition expected{static_cast<int64_t>(s) / 3, static_cast<int64_t>(s) % 3};
    EXPECT_EQ(l.position(), expected) << "before batch " << s;
    Batch &b = l.next();
    EXPECT_EQ(b.position(), expected) << "batch " << s;
    EXPECT_EQ(samplesOf(b), want[s]) << "batch " << s;
  }
  EXPECT_EQ(l.position(), (LoaderPosition{1, 2}));
}

TEST(DataLoader, ShuffleIsAPermutationPerEpochThatDiffersBetweenEpochs) {
  const int64_t n = 60, batch = 6;
  DataLoader l(makeDataset(n), batch, true, 123);
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> seen;
    for (auto &b : take(l, l.stepsPerEpoch()))
      seen.insert(seen.end(), b.begin(), b.end());
    std::vector<int64_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      all[static_cast<size_t>(i)] = i;
    EXPECT_EQ(sorted, all) << "epoch " << e << " is not a permutation";
    EXPECT_EQ(seen, l.epochOrder(e)) << "epoch " << e;
    epochs.push_back(seen);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  EXPECT_NE(epochs[0], l.epochOrder(3)); // a later epoch differs too
  std::vector<int64_t> identity = DataLoader(makeDataset(n), batch, false, 123).epochOrder(0);
  EXPECT_NE(epochs[0], identity);
}

TEST(DataLoader, ShuffleDependsOnlyOnSeedAndEpoch) {
  DataLoader a(makeDataset(50), 5, true, 42, 1);
  DataLoader b(makeDataset(50), 5, true, 42, 3);
  DataLoader c(makeDataset(50), 5, true, 43);
  auto ta = take(a, 30), tb = take(b, 30), tc = take(c, 30);
  EXPECT_EQ(ta, tb) << "prefetch depth must not change the order";
  EXPECT_NE(ta, tc) << "another seed must give another order";
  // The order of an epoch is the same whether or not earlier epochs were read.
  DataLoader d(makeDataset(50), 5, true, 42);
  EXPECT_EQ(d.epochOrder(2), a.epochOrder(2));
}

TEST(DataLoader, SeekAndStartPositionReproduceTheSameBatches) {
  DataLoader ref(makeDataset(40), 4, true, 9);
  auto all = take(ref, 30); // three epochs of 10 steps
  // Resume from a saved position in a new loader.
  DataLoader resumed(makeDataset(40), 4, true, 9, 2, {1, 3});
  EXPECT_EQ(resumed.position(), (LoaderPosition{1, 3}));
  auto rest = take(resumed, 17);
  EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(all.begin() + 13, all.end()));
  // Seek backwards and forwards in the same loader, with prefetched batches dropped.
  DataLoader l(makeDataset(40), 4, true, 9);
  take(l, 5);
  l.seek(0, 1);
  EXPECT_EQ(l.position(), (LoaderPosition{0, 1}));
  EXPECT_EQ(take(l, 3), std::vector<std::vector<int64_t>>(all.begin() + 1, all.begin() + 4));
  l.seek(2, 8);
  EXPECT_EQ(take(l, 2), std::vector<std::vector<int64_t>>(all.begin() + 28, all.begin() + 30));
  // position() after some batches resumes exactly there.
  DataLoader p(makeDataset(40), 4, true, 9);
  take(p, 12);
  DataLoader q(makeDataset(40), 4, true, 9, 2, p.position());
  EXPECT_EQ(take(q, 8), take(p, 8));
}

TEST(DataLoader, HeldBatchIsNotOverwrittenByPrefetching) {
  for (int depth : {1, 2, 4}) {
    DataLoader l(makeDataset(64), 4, true, 5, depth);
    for (int s = 0; s < 40; ++s) {
      Batch &b = l.next();
      std::vector<int64_t> first = samplesOf(b);
      // Give the worker time to fill every free slot; the held batch must stay intact.
      std::this_thread::sleep_for(std::chrono::microseconds(s % 4 == 0 ? 2000 : 0));
      EXPECT_EQ(samplesOf(b), first) << "depth " << depth << " step " << s;
      LoaderPosition pos{s / 16, s % 16};
      EXPECT_EQ(b.position(), pos);
      std::vector<int64_t> order = l.epochOrder(pos.epoch);
      EXPECT_EQ(first, std::vector<int64_t>(order.begin() + pos.step * 4, order.begin() + pos.step * 4 + 4));
    }
  }
}

TEST(DataLoader, ArraysFeedAStepIO) {
  DataLoader l(makeDataset(8), 2, false, 0);
  Batch &b = l.next();
  auto arrays = b.arrays();
  ASSERT_EQ(arrays.size(), 2u);
  EXPECT_EQ(&arrays.at("x"), &b.array("x"));
  EXPECT_THROW(b.array("z"), popart::error);
}

TEST(DataLoader, DestroysCleanlyWhetherOrNotBatchesWereRead) {
  for (int i = 0; i < 20; ++i) {
    DataLoader l(makeDataset(16), 2, true, static_cast<uint64_t>(i), 1 + i % 3);
    if (i % 2) l.next();
    if (i % 4 == 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(DataLoader, RejectsInconsistentDataSets) {
  auto expectError = [](Dataset d, int64_t batch, const std::string &needle, LoaderPosition start = {}) {
    try {
      DataLoader l(std::move(d), batch, false, 0, 2, start);
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const popart::error &e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Dataset mismatched = makeDataset(10);
  mismatched[1] = {"y", TensorInfo(DataType::FLOAT, {9}), std::vector<uint8_t>(9 * sizeof(float))};
  expectError(mismatched, 2, "'y' has 9 samples");
  Dataset shortBytes = makeDataset(10);
  shortBytes[0].bytes.resize(10);
  expectError(shortBytes, 2, "'x'");
  Dataset duplicate = makeDataset(10);
  duplicate[1].name = "x";
  expectError(duplicate, 2, "two arrays are named 'x'");
  Dataset scalar = makeDataset(10);
  scalar[1] = {"s", TensorInfo(DataType::FLOAT, {}), std::vector<uint8_t>(sizeof(float))};
  expectError(scalar, 2, "'s'");
  expectError(makeDataset(10), 11, "samplesPerBatch");
  expectError(makeDataset(10), 0, "samplesPerBatch");
  expectError(Dataset{}, 1, "no arrays");
  expectError(makeDataset(10), 2, "start position", {0, 5});
  DataLoader l(makeDataset(10), 2, false, 0);
  EXPECT_THROW(l.seek(0, 5), popart::error);
  EXPECT_THROW(l.seek(-1, 0), popart::error);
  EXPECT_EQ(samplesOf(l.next()), (std::vector<int64_t>{0, 1})) << "a failed seek leaves the loader as it was";
}
