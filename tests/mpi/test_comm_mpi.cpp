// MpiCommunicator under mpirun (tests/CMakeLists.txt runs it on 2 and 4 ranks). Every rank can
// recompute every other rank's input, so each result is checked against sums computed here: in
// the order that docs/distributed.md promises (exactly), and in double (within rounding).

#include "comm/mpi_handle.hpp"
#include "comm_test_helpers.hpp"
#include "core/half.hpp"

#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace popart;
using popart::comm::MpiCommunicator;
using popart::comm::MpiOptions;
using popart::comm::ReduceOp;
using popart::testing::elementBits;
using popart::testing::mix;
using popart::testing::testOptions;

namespace {

/// Rank \p rank's element \p i: signed, with magnitudes over a wide range so that the order of a
/// sum changes its rounding.
float input(int rank, int64_t i, int salt = 0) {
  uint64_t h = elementBits(rank, i, salt);
  double unit = static_cast<double>(h % 2000001) / 1e6 - 1.0;
  return static_cast<float>(std::ldexp(unit, static_cast<int>((h >> 40) % 12) - 6));
}

int64_t chunkStart(int64_t count, int c, int ranks) { return count * c / ranks; }

/// The fp32 sum of \p values[rank] for element \p i in the ring's documented order: chunk c's sum
/// starts with rank c+1's element and adds ranks c+2, ..., c in turn.
float ringSum(const std::vector<std::vector<float>> &values, int64_t i, int64_t count) {
  int ranks = static_cast<int>(values.size());
  int c = 0;
  while (c + 1 < ranks && i >= chunkStart(count, c + 1, ranks))
    ++c;
  float sum = values[static_cast<size_t>((c + 1) % ranks)][static_cast<size_t>(i)];
  for (int k = 2; k <= ranks; ++k)
    sum = sum + values[static_cast<size_t>((c + k) % ranks)][static_cast<size_t>(i)];
  return sum;
}

double exactSum(const std::vector<std::vector<float>> &values, int64_t i, double *magnitude) {
  double sum = 0, abs = 0;
  for (const auto &v : values) {
    sum += v[static_cast<size_t>(i)];
    abs += std::fabs(v[static_cast<size_t>(i)]);
  }
  *magnitude = abs;
  return sum;
}

uint64_t fnv1a(const void *data, size_t bytes) {
  uint64_t h = 1469598103934665603ULL;
  const auto *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < bytes; ++i)
    h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

/// Checks through an all-gather that \p bytes at \p data hash the same on every rank.
void expectSameOnEveryRank(MpiCommunicator &comm, const void *data, size_t bytes, const std::string &what) {
  auto mine = static_cast<int64_t>(fnv1a(data, bytes));
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  comm.allGather(&mine, all.data(), 1, DataType::INT64);
  for (int r = 0; r < comm.size(); ++r)
    EXPECT_EQ(all[static_cast<size_t>(r)], all[0]) << what << ": rank " << r << "'s result differs from rank 0's";
}

std::string thrown(const std::function<void()> &f) {
  try {
    f();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "";
}

const int64_t kCounts[] = {0, 1, 3, 1001, 1 << 17}; // 1 << 17 floats: beyond the eager-message limit

} // namespace

TEST(CommMpi, AllReduceFloatFollowsTheRingOrder) {
  MpiCommunicator comm(testOptions());
  int n = comm.size();
  for (int64_t count : kCounts) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
      std::vector<std::vector<float>> all(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < count; ++i)
          all[static_cast<size_t>(r)].push_back(input(r, i));
      auto data = all[static_cast<size_t>(comm.rank())];
      comm.allReduce(data.data(), count, DataType::FLOAT, op);
      for (int64_t i = 0; i < count; ++i) {
        float expected = ringSum(all, i, count);
        if (op == ReduceOp::Mean) expected = expected / static_cast<float>(n);
        ASSERT_EQ(data[static_cast<size_t>(i)], expected) << "count " << count << " element " << i;
        double magnitude = 0, exact = exactSum(all, i, &magnitude);
        if (op == ReduceOp::Mean) exact /= n, magnitude /= n;
        ASSERT_NEAR(data[static_cast<size_t>(i)], exact, n * 1.2e-7 * magnitude + 1e-30);
      }
      expectSameOnEveryRank(comm, data.data(), data.size() * 4, "all-reduce FLOAT " + std::to_string(count));
    }
  }
}

// FLOAT16 and BFLOAT16 sums are taken in fp32 and rounded once, at the end.
TEST(CommMpi, AllReduceHalfTypesSumInFp32) {
  MpiCommunicator comm(testOptions());
  int n = comm.size();
  for (DataType type : {DataType::FLOAT16, DataType::BFLOAT16}) {
    bool isHalf = type == DataType::FLOAT16;
    auto toBits = [&](float f) { return isHalf ? floatToHalf(f) : floatToBfloat16(f); };
    auto toFloat = [&](uint16_t b) { return isHalf ? halfToFloat(b) : bfloat16ToFloat(b); };
    for (int64_t count : {int64_t{5}, int64_t{1001}, int64_t{1} << 16}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
        std::vector<std::vector<float>> all(static_cast<size_t>(n)); // the 16-bit inputs, as floats
        for (int r = 0; r < n; ++r)
          for (int64_t i = 0; i < count; ++i)
            all[static_cast<size_t>(r)].push_back(toFloat(toBits(input(r, i, 1))));
        std::vector<uint16_t> data;
        for (float f : all[static_cast<size_t>(comm.rank())])
          data.push_back(toBits(f));
        comm.allReduce(data.data(), count, type, op);
        for (int64_t i = 0; i < count; ++i) {
          float sum = ringSum(all, i, count);
          if (op == ReduceOp::Mean) sum = sum / static_cast<float>(n);
          ASSERT_EQ(data[static_cast<size_t>(i)], toBits(sum)) << toString(type) << " element " << i;
          double magnitude = 0, exact = exactSum(all, i, &magnitude);
          if (op == ReduceOp::Mean) exact /= n, magnitude /= n;
          double ulp = isHalf ? 1.0 / 1024 : 1.0 / 128;
          ASSERT_NEAR(toFloat(data[static_cast<size_t>(i)]), exact, ulp * (std::fabs(exact) + magnitude * 1e-3) + 1e-7);
        }
        expectSameOnEveryRank(comm, data.data(), data.size() * 2, "all-reduce " + toString(type));
      }
    }
  }
}

// FLOAT16 over its whole range: random finite bit patterns (subnormals included), sums that
// overflow to infinity or stay subnormal, a NaN and opposite infinities; bit for bit as the
// scalar conversions of core/half.hpp give them, whichever conversion code the CPU runs.
TEST(CommMpi, AllReduceFloat16OverItsWholeRange) {
  MpiCommunicator comm(testOptions());
  int n = comm.size();
  const int64_t count = 4099; // blocks of 8 and a tail
  std::vector<std::vector<uint16_t>> bits(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < count; ++i) {
      auto h = static_cast<uint16_t>(mix(static_cast<uint64_t>(r * count + i) + 99));
      if ((h & 0x7c00) == 0x7c00) h &= 0xbfff; // finite: NaNs and infinities are placed below
      bits[static_cast<size_t>(r)].push_back(h);
    }
  bits[0][0] = 0x7d01;                                           // a signalling NaN on rank 0
  bits[0][1] = 0x7c00;                                           // +inf on rank 0 ...
  bits[static_cast<size_t>(n - 1)][1] = n > 1 ? 0xfc00 : 0x7c00; // ... -inf on the last: NaN
  for (int r = 0; r < n; ++r) {
    bits[static_cast<size_t>(r)][2] = 0x7bff; // 65504 on every rank: overflows
    bits[static_cast<size_t>(r)][3] = 0x0001; // the smallest subnormal
  }
  std::vector<std::vector<float>> values(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (uint16_t h : bits[static_cast<size_t>(r)])
      values[static_cast<size_t>(r)].push_back(halfToFloat(h));
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
    auto data = bits[static_cast<size_t>(comm.rank())];
    comm.allReduce(data.data(), count, DataType::FLOAT16, op);
    for (int64_t i = 0; i < count; ++i) {
      float sum = ringSum(values, i, count);
      if (op == ReduceOp::Mean) sum = sum / static_cast<float>(n);
      // One rank's result is its input untouched (a signalling NaN stays one).
      uint16_t expected = n == 1 ? bits[0][static_cast<size_t>(i)] : floatToHalf(sum);
      ASSERT_EQ(data[static_cast<size_t>(i)], expected) << toString(op) << " element " << i;
    }
    expectSameOnEveryRank(comm, data.data(), data.size() * 2, "FLOAT16 whole range");
  }
}

TEST(CommMpi, AllReduceInt64SumsAndBoolAnds) {
  MpiCommunicator comm(testOptions());
  int n = comm.size(), me = comm.rank();
  std::vector<int64_t> counts{me + 1, -3 * me, int64_t{1} << 40};
  comm.allReduce(counts.data(), 3, DataType::INT64, ReduceOp::Sum);
  EXPECT_EQ(counts[0], int64_t{n} * (n + 1) / 2);
  EXPECT_EQ(counts[1], -3 * int64_t{n} * (n - 1) / 2);
  EXPECT_EQ(counts[2], int64_t{n} << 40);
  // Element r is false on rank r only; the last is true everywhere: the all-finite decision.
  std::vector<uint8_t> finite(static_cast<size_t>(n) + 1, 1);
  finite[static_cast<size_t>(me)] = 0;
  comm.allReduce(finite.data(), n + 1, DataType::BOOL, ReduceOp::And);
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(finite[static_cast<size_t>(i)], 0) << i;
  EXPECT_EQ(finite[static_cast<size_t>(n)], 1);
}

TEST(CommMpi, ReduceScatterGivesEachRankItsBlock) {
  MpiCommunicator comm(testOptions());
  int n = comm.size(), me = comm.rank();
  for (int64_t block : {int64_t{0}, int64_t{1}, int64_t{777}}) {
    int64_t count = block * n;
    std::vector<std::vector<float>> all(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < count; ++i)
        all[static_cast<size_t>(r)].push_back(input(r, i, 2));
    std::vector<float> mine(static_cast<size_t>(block));
    comm.reduceScatter(all[static_cast<size_t>(me)].data(), mine.data(), block, DataType::FLOAT, ReduceOp::Sum);
    for (int64_t j = 0; j < block; ++j)
      ASSERT_EQ(mine[static_cast<size_t>(j)], ringSum(all, me * block + j, count)) << "element " << j;
    // BFLOAT16 mean: the same sums, divided and rounded once.
    std::vector<uint16_t> send, recv(static_cast<size_t>(block));
    std::vector<std::vector<float>> rounded(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      for (float f : all[static_cast<size_t>(r)])
        rounded[static_cast<size_t>(r)].push_back(bfloat16ToFloat(floatToBfloat16(f)));
    for (float f : rounded[static_cast<size_t>(me)])
      send.push_back(floatToBfloat16(f));
    comm.reduceScatter(send.data(), recv.data(), block, DataType::BFLOAT16, ReduceOp::Mean);
    for (int64_t j = 0; j < block; ++j)
      ASSERT_EQ(recv[static_cast<size_t>(j)],
                floatToBfloat16(ringSum(rounded, me * block + j, count) / static_cast<float>(n)));
  }
}

TEST(CommMpi, AllGatherCollectsEveryRanksBlock) {
  MpiCommunicator comm(testOptions());
  int n = comm.size(), me = comm.rank();
  std::vector<int64_t> mine{me * 10, me * 10 + 1, -me};
  std::vector<int64_t> all(3 * static_cast<size_t>(n));
  comm.allGather(mine.data(), all.data(), 3, DataType::INT64);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(all[3 * static_cast<size_t>(r)], r * 10);
    EXPECT_EQ(all[3 * static_cast<size_t>(r) + 1], r * 10 + 1);
    EXPECT_EQ(all[3 * static_cast<size_t>(r) + 2], -r);
  }
  std::vector<uint16_t> halves(5000), gathered(5000 * static_cast<size_t>(n));
  for (size_t i = 0; i < halves.size(); ++i)
    halves[i] = floatToHalf(input(me, static_cast<int64_t>(i)));
  comm.allGather(halves.data(), gathered.data(), 5000, DataType::FLOAT16);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < 5000; ++i)
      ASSERT_EQ(gathered[static_cast<size_t>(r) * 5000 + i], floatToHalf(input(r, static_cast<int64_t>(i))));
}

TEST(CommMpi, BroadcastFromEveryRoot) {
  MpiCommunicator comm(testOptions());
  for (int root = 0; root < comm.size(); ++root) {
    std::vector<float> data(3000);
    for (size_t i = 0; i < data.size(); ++i)
      data[i] = input(comm.rank(), static_cast<int64_t>(i), 3);
    comm.broadcast(data.data(), 3000, DataType::FLOAT, root);
    for (size_t i = 0; i < data.size(); ++i)
      ASSERT_EQ(data[i], input(root, static_cast<int64_t>(i), 3));
  }
  comm.barrier();
}

// Several collectives in flight at once, waited for in another order than started, and in a
// different order on odd and even ranks: each has its own tag, so their messages never mix, and
// waiting for one advances the others, which the other ranks may be waiting for.
TEST(CommMpi, NonBlockingCollectivesInFlightTogether) {
  MpiCommunicator comm(testOptions());
  int n = comm.size();
  std::vector<std::vector<float>> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < 20000; ++i) {
      a[static_cast<size_t>(r)].push_back(input(r, i, 4));
      b[static_cast<size_t>(r)].push_back(input(r, i, 5));
    }
  auto x = a[static_cast<size_t>(comm.rank())], y = b[static_cast<size_t>(comm.rank())];
  int64_t one = 1;
  auto requestX = comm.allReduceAsync(x.data(), 20000, DataType::FLOAT, ReduceOp::Sum);
  auto requestOne = comm.allReduceAsync(&one, 1, DataType::INT64, ReduceOp::Sum);
  auto requestY = comm.allReduceAsync(y.data(), 20000, DataType::FLOAT, ReduceOp::Mean);
  auto barrier = comm.barrierAsync();
  if (comm.rank() % 2 == 0) {
    while (!requestY.test()) {
    }
    requestOne.wait();
    requestX.wait();
  } else {
    requestX.wait();
    requestOne.wait();
    requestY.wait();
  }
  barrier.wait();
  EXPECT_EQ(one, n);
  for (int64_t i = 0; i < 20000; ++i) {
    ASSERT_EQ(x[static_cast<size_t>(i)], ringSum(a, i, 20000));
    ASSERT_EQ(y[static_cast<size_t>(i)], ringSum(b, i, 20000) / static_cast<float>(n));
  }
}

// A request dropped before it completed is waited for, so its buffer holds the result afterwards
// (and MPI never writes into freed memory).
TEST(CommMpi, DroppingAPendingRequestWaitsForIt) {
  MpiCommunicator comm(testOptions());
  std::vector<int64_t> values(50000, comm.rank() + 1);
  { auto request = comm.allReduceAsync(values.data(), 50000, DataType::INT64, ReduceOp::Sum); }
  int64_t n = comm.size();
  for (int64_t v : values)
    ASSERT_EQ(v, n * (n + 1) / 2);
}

// The same all-reduce twice gives the same bits: nothing depends on the order messages arrive in.
TEST(CommMpi, RepeatedAllReduceIsBitIdentical) {
  MpiCommunicator comm(testOptions());
  std::vector<float> first(300001), second;
  for (size_t i = 0; i < first.size(); ++i)
    first[i] = input(comm.rank(), static_cast<int64_t>(i), 6);
  second = first;
  comm.allReduce(first.data(), 300001, DataType::FLOAT, ReduceOp::Mean);
  comm.allReduce(second.data(), 300001, DataType::FLOAT, ReduceOp::Mean);
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * 4), 0);
  expectSameOnEveryRank(comm, first.data(), first.size() * 4, "all-reduce of 300001 FLOAT");
}

// A rank that never joins: the others throw within the timeout, naming the operation, themselves
// and the rank they wait for, instead of hanging; the communicator then refuses further work.
TEST(CommMpi, TimeoutNamesTheOperationAndTheRanks) {
  MpiCommunicator world(testOptions());
  int n = world.size(), me = world.rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  int64_t ok = 1;
  {
    // Destroyed only after the agreement below, so that the late rank still has it when the
    // messages that the others sent before giving up arrive.
    MpiCommunicator comm(MpiOptions{std::chrono::milliseconds(1000)});
    if (me != n - 1) {
      std::vector<float> data(100, 1.0f);
      auto start = std::chrono::steady_clock::now();
      std::string message = thrown([&] { comm.allReduce(data.data(), 100, DataType::FLOAT, ReduceOp::Sum); });
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::string where = "on rank " + std::to_string(me) + " of " + std::to_string(n);
      EXPECT_NE(message.find("all-reduce #0 (100 FLOAT) Sum " + where + " timed out after 1000 ms waiting for rank"),
                std::string::npos)
          << message;
      // Rank 0 waits for the missing rank itself: its left neighbour in the ring.
      if (me == 0) {
        EXPECT_NE(message.find("rank " + std::to_string(n - 1) + " (to receive from)"), std::string::npos);
      }
      std::printf("rank %d threw after %.2f s: %s\n", me, seconds, message.c_str());
      std::fflush(stdout);
      EXPECT_NE(thrown([&] { comm.barrier(); }).find("failed earlier"), std::string::npos);
      ok = message.empty() ? 0 : 1;
    }
    // Back on a healthy communicator, every rank agrees that the others saw the error.
    world.allReduce(&ok, 1, DataType::INT64, ReduceOp::Sum);
  }
  EXPECT_EQ(ok, n);
}

// The ranks disagree on the count: each throws a popart::error that names its own rank.
TEST(CommMpi, MismatchedCountsNameTheRank) {
  MpiCommunicator world(testOptions());
  int n = world.size(), me = world.rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  {
    MpiCommunicator comm(MpiOptions{std::chrono::milliseconds(2000)});
    int64_t count = me == n - 1 ? 8 : 4;
    std::vector<float> mine(8, 1.0f), all(8 * static_cast<size_t>(n));
    std::string message = thrown([&] { comm.allGather(mine.data(), all.data(), count, DataType::FLOAT); });
    EXPECT_NE(message.find("on rank " + std::to_string(me) + " of " + std::to_string(n)), std::string::npos) << message;
    std::printf("rank %d: %s\n", me, message.c_str());
    std::fflush(stdout);
    if (me == n - 1) {
      EXPECT_NE(message.find("different counts or types"), std::string::npos) << message;
    }
    world.barrier();
  }
}

// MPI was initialised by the first communicator, once; a communicator can also run over a group
// the caller made (here the even and the odd ranks).
TEST(CommMpi, CommunicatorOverTheCallersGroup) {
  MpiCommunicator world(testOptions());
  int initialised = 0;
  MPI_Initialized(&initialised);
  EXPECT_TRUE(initialised);
  EXPECT_FALSE(popart::comm::ensureMpiInitialised());
  MPI_Comm half;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, world.rank() % 2, world.rank(), &half), MPI_SUCCESS);
  {
    auto comm = popart::comm::makeMpiCommunicator(half, testOptions());
    int parity = world.rank() % 2;
    EXPECT_EQ(comm->size(), (world.size() - parity + 1) / 2);
    EXPECT_EQ(comm->rank(), world.rank() / 2);
    int64_t sumOfWorldRanks = world.rank();
    comm->allReduce(&sumOfWorldRanks, 1, DataType::INT64, ReduceOp::Sum);
    int64_t expected = 0;
    for (int r = parity; r < world.size(); r += 2)
      expected += r;
    EXPECT_EQ(sumOfWorldRanks, expected);
  }
  MPI_Comm_free(&half);
}

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // MPI is not initialised here: the first MpiCommunicator does it, as in a session.
  return RUN_ALL_TESTS();
}
