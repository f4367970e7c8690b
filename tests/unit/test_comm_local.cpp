// LocalCommunicator: the group of one that unreplicated sessions use (the MPI implementation is
// tested under mpirun in tests/mpi/).

#include "comm/communicator.hpp"
#include "core/half.hpp"
#include "thrown.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

using namespace popart;
using popart::comm::LocalCommunicator;
using popart::comm::ReduceOp;

TEST(CommLocal, IsOneRank) {
  LocalCommunicator comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
}

// With one rank the sum and the mean of each element are the element itself, exactly.
TEST(CommLocal, AllReduceOfOneRankIsTheInput) {
  LocalCommunicator comm;
  std::vector<float> values{1.5f, -2.25f, 3e-8f};
  auto before = values;
  comm.allReduce(values.data(), 3, DataType::FLOAT, ReduceOp::Sum);
  EXPECT_EQ(values, before);
  comm.allReduce(values.data(), 3, DataType::FLOAT, ReduceOp::Mean);
  EXPECT_EQ(values, before);
  std::vector<uint16_t> halves{floatToHalf(0.1f), floatToHalf(-7.0f)};
  auto halvesBefore = halves;
  comm.allReduce(halves.data(), 2, DataType::FLOAT16, ReduceOp::Mean);
  EXPECT_EQ(halves, halvesBefore);
  std::vector<int64_t> counts{5, -3};
  comm.allReduce(counts.data(), 2, DataType::INT64, ReduceOp::Sum);
  EXPECT_EQ(counts, (std::vector<int64_t>{5, -3}));
  std::vector<uint8_t> finite{1, 0};
  comm.allReduce(finite.data(), 2, DataType::BOOL, ReduceOp::And);
  EXPECT_EQ(finite, (std::vector<uint8_t>{1, 0}));
}

TEST(CommLocal, ReduceScatterAndAllGatherCopy) {
  LocalCommunicator comm;
  std::vector<uint16_t> in{floatToBfloat16(1.0f), floatToBfloat16(2.0f)}, out(2);
  comm.reduceScatter(in.data(), out.data(), 2, DataType::BFLOAT16, ReduceOp::Sum);
  EXPECT_EQ(out, in);
  std::vector<int64_t> mine{7, 8, 9}, all(3);
  comm.allGather(mine.data(), all.data(), 3, DataType::INT64);
  EXPECT_EQ(all, mine);
}

TEST(CommLocal, NonBlockingRequestsCompleteAtOnce) {
  LocalCommunicator comm;
  float x = 4.0f;
  auto request = comm.allReduceAsync(&x, 1, DataType::FLOAT, ReduceOp::Sum);
  EXPECT_TRUE(request.test());
  request.wait();
  auto barrier = comm.barrierAsync();
  EXPECT_TRUE(barrier.test());
  comm.broadcast(&x, 1, DataType::FLOAT, 0);
  EXPECT_EQ(x, 4.0f);
}

TEST(CommLocal, RejectsWhatCannotBeCombined) {
  LocalCommunicator comm;
  std::vector<uint8_t> flags(2);
  EXPECT_NE(thrown([&] {
              comm.allReduce(flags.data(), 2, DataType::BOOL, ReduceOp::Sum);
            }).find("all-reduce on rank 0 cannot combine BOOL by Sum"),
            std::string::npos);
  int64_t n = 1;
  EXPECT_NE(thrown([&] { comm.allReduce(&n, 1, DataType::INT64, ReduceOp::Mean); }).find("INT64 by Mean"),
            std::string::npos);
  EXPECT_NE(thrown([&] { comm.allReduce(&n, -1, DataType::INT64, ReduceOp::Sum); }).find("negative count"),
            std::string::npos);
  EXPECT_NE(thrown([&] { comm.broadcast(&n, 1, DataType::INT64, 1); }).find("root 1 is not a rank of this group of 1"),
            std::string::npos);
  EXPECT_NE(thrown([&] { comm.allGather(&n, &n, 1, DataType::STRING); }).find("cannot move STRING"), std::string::npos);
}
