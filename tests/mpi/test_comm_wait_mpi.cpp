// How MpiCommunicator waits, under mpirun (tests/CMakeLists.txt runs it on 2 and 4 ranks): a rank
// waiting for a late rank must leave its core to others (ranks oversubscribed on shared cores,
// other jobs) instead of polling it, and still get the right result once the late rank arrives.

#include "comm/mpi_communicator.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <thread>
#include <vector>

using namespace popart;
using popart::comm::MpiCommunicator;
using popart::comm::MpiOptions;
using popart::comm::ReduceOp;

namespace {

double processCpuMs() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

// Rank 0 sleeps (taking no CPU) before it joins; the others wait inside allReduce. A wait that
// polled for its first 100 ms, as wait() once did, used a whole core for that long here; one that
// sleeps with backoff uses a few percent of the time it waits. The bound is on CPU time, which
// load on the machine can only lower, never on how long anything took.
TEST(CommWait, WaitingRankLeavesItsCoreAndGetsTheSum) {
  MpiCommunicator comm(MpiOptions{std::chrono::seconds(60)});
  const int rank = comm.rank(), size = comm.size();
  constexpr auto late = std::chrono::milliseconds(200);
  constexpr int64_t count = 1024;
  for (int round = 0; round < 2; ++round) {
    std::vector<float> data(count);
    for (int64_t i = 0; i < count; ++i)
      data[static_cast<size_t>(i)] = static_cast<float>(rank + 1) * static_cast<float>(i % 7);
    comm.barrier();
    auto wallStart = std::chrono::steady_clock::now();
    double cpuStart = processCpuMs();
    if (rank == 0) std::this_thread::sleep_for(late);
    comm.allReduce(data.data(), count, DataType::FLOAT, ReduceOp::Sum);
    double cpuMs = processCpuMs() - cpuStart;
    double wallMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wallStart).count();
    // The sum over ranks r of (r + 1) * (i % 7), exact in fp32 at these magnitudes.
    float ranksSum = static_cast<float>(size * (size + 1) / 2);
    for (int64_t i = 0; i < count; ++i)
      ASSERT_EQ(data[static_cast<size_t>(i)], ranksSum * static_cast<float>(i % 7))
          << "element " << i << " on rank " << rank;
    if (rank != 0) {
      ASSERT_GE(wallMs, 0.9 * late.count()) << "rank " << rank << " did not wait for rank 0";
      EXPECT_LT(cpuMs, 0.2 * wallMs) << "rank " << rank << " of " << size << " used " << cpuMs
                                     << " ms of CPU while it waited " << wallMs << " ms for rank 0";
    }
  }
}

} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
