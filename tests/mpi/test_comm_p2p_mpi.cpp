// Point-to-point messages and sub-groups of MpiCommunicator under mpirun (tests/CMakeLists.txt runs
// it on 2 and 4 ranks), for pipelined training: every rank can recompute what any other rank sent,
// so each received element is checked against the sender's values computed here.

#include "comm/mpi_communicator.hpp"
#include "comm_test_helpers.hpp"

#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace popart;
using popart::comm::Communicator;
using popart::comm::MpiCommunicator;
using popart::comm::MpiOptions;
using popart::comm::ReduceOp;
using popart::testing::elementBits;
using popart::testing::testOptions;

namespace {

/// What rank \p rank sends as \p count elements of \p type for \p salt: arbitrary bits per element.
std::vector<uint8_t> payload(int rank, int64_t count, DataType type, int salt) {
  size_t size = dataTypeSize(type);
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * size);
  for (int64_t i = 0; i < count; ++i) {
    uint64_t h = elementBits(rank, i, salt);
    std::memcpy(bytes.data() + static_cast<size_t>(i) * size, &h, size);
  }
  return bytes;
}

/// The first element where \p got differs from \p want (elements of \p elementSize bytes), or -1.
int64_t firstDifference(const std::vector<uint8_t> &got, const std::vector<uint8_t> &want, size_t elementSize) {
  if (got.size() != want.size()) return 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) return static_cast<int64_t>(i / elementSize);
  return -1;
}

std::string thrown(const std::function<void()> &f) {
  try {
    f();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

int right(const Communicator &c) { return (c.rank() + 1) % c.size(); }
int left(const Communicator &c) { return (c.rank() + c.size() - 1) % c.size(); }

} // namespace

// Each rank sends to its right neighbour and receives from its left, for several sizes (none, one,
// beyond the eager limit, over 1 MB) and types; every element is checked against the sender's.
TEST(CommP2P, RingExchangeOfSeveralSizesAndTypes) {
  MpiCommunicator comm(testOptions());
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  const int64_t counts[] = {0, 1, 1001, (1 << 18) + 5}; // (1 << 18) + 5 FLOATs: 1,048,596 bytes
  const DataType types[] = {DataType::FLOAT, DataType::FLOAT16, DataType::DOUBLE, DataType::INT64, DataType::UINT8};
  int salt = 0;
  for (DataType type : types) {
    for (int64_t count : counts) {
      ++salt;
      auto mine = payload(comm.rank(), count, type, salt);
      std::vector<uint8_t> got(mine.size(), 0xee);
      auto sent = comm.sendAsync(mine.data(), count, type, right(comm), salt % 100);
      comm.recv(got.data(), count, type, left(comm), salt % 100);
      sent.wait();
      EXPECT_EQ(firstDifference(got, payload(left(comm), count, type, salt), dataTypeSize(type)), -1)
          << count << " " << popart::toString(type) << " from rank " << left(comm);
    }
  }
}

// Messages from one rank to another with one tag arrive in the order they were sent, even with all
// the receives posted first and waited for last to first; their sizes differ, so a message taken by
// the wrong receive would be an error as well as wrong data.
TEST(CommP2P, ManyMessagesWithOneTagArriveInOrder) {
  MpiCommunicator comm(testOptions());
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  constexpr int kMessages = 60;
  auto countOf = [](int k) { return static_cast<int64_t>(1 + (k % 5) * 20000); };
  std::vector<std::vector<uint8_t>> mine, got;
  std::vector<comm::Request> receives, sends;
  for (int k = 0; k < kMessages; ++k) {
    got.emplace_back(static_cast<size_t>(countOf(k)) * 4);
    receives.push_back(comm.recvAsync(got.back().data(), countOf(k), DataType::FLOAT, left(comm), 9));
  }
  for (int k = 0; k < kMessages; ++k) {
    mine.push_back(payload(comm.rank(), countOf(k), DataType::FLOAT, k));
    sends.push_back(comm.sendAsync(mine.back().data(), countOf(k), DataType::FLOAT, right(comm), 9));
  }
  for (int k = kMessages - 1; k >= 0; --k)
    receives[static_cast<size_t>(k)].wait();
  for (auto &s : sends)
    s.wait();
  for (int k = 0; k < kMessages; ++k)
    EXPECT_EQ(firstDifference(got[static_cast<size_t>(k)], payload(left(comm), countOf(k), DataType::FLOAT, k), 4), -1)
        << "message " << k;
}

// Tags are separate queues: two large messages (beyond the eager limit, so each send completes
// only once received) sent with tags 1 then 2 are received 2 then 1.
TEST(CommP2P, TwoTagsReceivedInTheOppositeOrder) {
  MpiCommunicator comm(testOptions());
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  constexpr int64_t kCount = 200000;
  auto first = payload(comm.rank(), kCount, DataType::INT32, 1);
  auto second = payload(comm.rank(), kCount, DataType::INT32, 2);
  std::vector<uint8_t> gotFirst(first.size()), gotSecond(second.size());
  auto sendFirst = comm.sendAsync(first.data(), kCount, DataType::INT32, right(comm), 1);
  auto sendSecond = comm.sendAsync(second.data(), kCount, DataType::INT32, right(comm), 2);
  comm.recv(gotSecond.data(), kCount, DataType::INT32, left(comm), 2);
  comm.recv(gotFirst.data(), kCount, DataType::INT32, left(comm), 1);
  sendFirst.wait();
  sendSecond.wait();
  EXPECT_EQ(firstDifference(gotFirst, payload(left(comm), kCount, DataType::INT32, 1), 4), -1);
  EXPECT_EQ(firstDifference(gotSecond, payload(left(comm), kCount, DataType::INT32, 2), 4), -1);
}

// Pairs of ranks each start a large send to the other and then block in a receive from it: the
// receive's wait must advance the rank's own send, or both would wait for ever.
TEST(CommP2P, BlockingReceiveWhileOwnLargeSendIsInFlight) {
  MpiCommunicator comm(testOptions());
  if (comm.size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  constexpr int64_t kCount = 1 << 20; // 4 MB of FLOAT
  int partner = comm.rank() ^ 1;
  auto mine = payload(comm.rank(), kCount, DataType::FLOAT, 3);
  std::vector<uint8_t> got(mine.size());
  auto sent = comm.sendAsync(mine.data(), kCount, DataType::FLOAT, partner, 0);
  comm.recv(got.data(), kCount, DataType::FLOAT, partner, 0);
  sent.wait();
  EXPECT_EQ(firstDifference(got, payload(partner, kCount, DataType::FLOAT, 3), 4), -1);
}

// An all-reduce in flight while activations are sent: the all-reduce is the communicator's first
// collective, so its ring uses tag 0, the tag the point-to-point messages use too; they must not
// mix. Even ranks finish the exchange first, odd ranks the all-reduce.
TEST(CommP2P, PointToPointAndAllReduceInFlightTogether) {
  MpiCommunicator comm(testOptions());
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  constexpr int64_t kReduced = 300000, kSent = 250000;
  int n = comm.size();
  std::vector<int64_t> reduced(kReduced);
  for (int64_t i = 0; i < kReduced; ++i)
    reduced[static_cast<size_t>(i)] = (comm.rank() + 1) * (i + 1);
  auto mine = payload(comm.rank(), kSent, DataType::FLOAT, 4);
  std::vector<uint8_t> got(mine.size());
  auto allReduce = comm.allReduceAsync(reduced.data(), kReduced, DataType::INT64, ReduceOp::Sum);
  auto sent = comm.sendAsync(mine.data(), kSent, DataType::FLOAT, right(comm), 0);
  auto received = comm.recvAsync(got.data(), kSent, DataType::FLOAT, left(comm), 0);
  if (comm.rank() % 2 == 0) {
    received.wait();
    sent.wait();
    allReduce.wait();
  } else {
    allReduce.wait();
    received.wait();
    sent.wait();
  }
  EXPECT_EQ(firstDifference(got, payload(left(comm), kSent, DataType::FLOAT, 4), 4), -1);
  const int64_t rankSum = static_cast<int64_t>(n) * (n + 1) / 2;
  for (int64_t i = 0; i < kReduced; ++i)
    ASSERT_EQ(reduced[static_cast<size_t>(i)], rankSum * (i + 1)) << "element " << i;
}

// Pairs that disagree on the size: each receiver's error names both sizes, the peer and the tag,
// whether the message is shorter or longer (truncated) than expected; the longer one is large, and
// its sender still completes. The failed communicator then refuses further work.
TEST(CommP2P, SizeMismatchNamesBothSizes) {
  MpiCommunicator world(testOptions());
  if (world.size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  int me = world.rank(), partner = me ^ 1;
  {
    MpiCommunicator comm(MpiOptions{std::chrono::seconds(20)});
    bool even = me % 2 == 0;
    // Even ranks send 10 FLOATs to a rank expecting 12; odd ranks send 2^18 to a rank expecting 8.
    int64_t sendCount = even ? 10 : 1 << 18, expectCount = even ? 8 : 12;
    std::vector<float> out(static_cast<size_t>(sendCount), 1.0f), in(static_cast<size_t>(expectCount));
    auto sent = comm.sendAsync(out.data(), sendCount, DataType::FLOAT, partner, 7);
    std::string message = thrown([&] { comm.recv(in.data(), expectCount, DataType::FLOAT, partner, 7); });
    int64_t partnerSent = even ? 1 << 18 : 10;
    EXPECT_TRUE(contains(message, "receive from rank " + std::to_string(partner) + " with tag 7 of " +
                                      std::to_string(expectCount * 4) + " bytes (" + std::to_string(expectCount) +
                                      " FLOAT) on rank " + std::to_string(me) + " of " + std::to_string(world.size())))
        << message;
    EXPECT_TRUE(contains(message, "sent " + std::to_string(partnerSent * 4) +
                                      " bytes with tag 7 where this rank "
                                      "expected " +
                                      std::to_string(expectCount * 4)))
        << message;
    EXPECT_NO_THROW(sent.wait());
    EXPECT_TRUE(contains(thrown([&] { comm.send(out.data(), 1, DataType::FLOAT, partner, 7); }), "failed earlier"));
    world.barrier();
  }
}

// The error paths that need no other rank: each names the operation, this rank, the peer and the
// tag, and none of them spoils the communicator.
TEST(CommP2P, BadPeerTagCountAndColorAreErrors) {
  MpiCommunicator comm(testOptions());
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  int me = comm.rank(), n = comm.size();
  float x = 0;
  std::string where = "on rank " + std::to_string(me);
  std::string message = thrown([&] { comm.send(&x, 1, DataType::FLOAT, n, 3); });
  EXPECT_TRUE(contains(message, "send with tag 3 " + where + " of " + std::to_string(n) + ": peer " +
                                    std::to_string(n) + " is not a rank of this group"))
      << message;
  message = thrown([&] { comm.recv(&x, 1, DataType::FLOAT, -1, 3); });
  EXPECT_TRUE(contains(message, "receive with tag 3 " + where) && contains(message, "peer -1 is not a rank"))
      << message;
  message = thrown([&] { comm.send(&x, 1, DataType::FLOAT, me, 3); });
  EXPECT_TRUE(contains(message, "peer " + std::to_string(me) + " is this rank itself")) << message;
  message = thrown([&] { comm.send(&x, 1, DataType::FLOAT, right(comm), 32768); });
  EXPECT_TRUE(contains(message, "send to or from rank " + std::to_string(right(comm)) + " " + where +
                                    ": tag 32768 is outside 0..32767"))
      << message;
  message = thrown([&] { comm.recv(&x, 1, DataType::FLOAT, left(comm), -2); });
  EXPECT_TRUE(contains(message, "tag -2 is outside")) << message;
  message = thrown([&] { comm.recv(&x, -4, DataType::FLOAT, left(comm), 1); });
  EXPECT_TRUE(contains(message, "receive of -4 elements " + where + ": negative count")) << message;
  message = thrown([&] { comm.send(&x, 1, DataType::STRING, right(comm), 1); });
  EXPECT_TRUE(contains(message, "cannot move STRING")) << message;
  message = thrown([&] { comm.split(-1, 0); });
  EXPECT_TRUE(contains(message, "split " + where + " of " + std::to_string(n) + ": color -1 is negative")) << message;
  // Splitting waits in MPI without advancing requests: refused while one is in flight.
  int64_t one = 1;
  auto request = comm.allReduceAsync(&one, 1, DataType::INT64, ReduceOp::Sum);
  message = thrown([&] { comm.split(0, 0); });
  EXPECT_TRUE(contains(message, "split " + where) && contains(message, "1 operation(s) in flight")) << message;
  request.wait();
  EXPECT_EQ(one, n);
  // Still healthy: an exchange round the ring.
  int64_t mine = me, got = -1;
  auto sent = comm.sendAsync(&mine, 1, DataType::INT64, right(comm), 0);
  comm.recv(&got, 1, DataType::INT64, left(comm), 0);
  sent.wait();
  EXPECT_EQ(got, left(comm));
}

// The group of one has no peer, and splits into another group of one.
TEST(CommP2P, LocalCommunicatorHasNoPeer) {
  comm::LocalCommunicator local;
  float x = 0;
  EXPECT_TRUE(contains(thrown([&] { local.send(&x, 1, DataType::FLOAT, 0, 0); }), "a group of one has no peer"));
  EXPECT_TRUE(contains(thrown([&] { local.recv(&x, 1, DataType::FLOAT, 1, 0); }), "a group of one has no peer"));
  auto child = local.split(5, 0);
  ASSERT_NE(std::dynamic_pointer_cast<comm::LocalCommunicator>(child), nullptr);
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->rank(), 0);
  EXPECT_TRUE(contains(thrown([&] { local.split(-1, 0); }), "color -1 is negative"));
}

// Split by stage (color = rank / 2) and by replica (color = rank % 2), as ranks = stages x replicas
// are split for pipelined training, the second ranked in reverse by its key. Each group's size and
// ranks follow MPI_Comm_split's rule, an all-reduce sums over the group alone, and the group
// exchanges point-to-point messages in its own ranks. The children outlive their parent.
TEST(CommP2P, SplitIntoGroups) {
  int n = 0, me = 0;
  std::shared_ptr<Communicator> byStage, byReplica;
  {
    MpiCommunicator parent(testOptions());
    n = parent.size();
    me = parent.rank();
    byStage = parent.split(me / 2, me);
    byReplica = parent.split(me % 2, -me);
  }
  struct Case {
    std::shared_ptr<Communicator> group;
    std::vector<int> members; // world ranks, in the group's rank order
  };
  std::vector<Case> cases(2);
  cases[0].group = byStage;
  cases[1].group = byReplica;
  for (int r = 0; r < n; ++r)
    if (r / 2 == me / 2) cases[0].members.push_back(r);
  for (int r = n - 1; r >= 0; --r) // key -r: the highest world rank first
    if (r % 2 == me % 2) cases[1].members.push_back(r);
  for (size_t c = 0; c < cases.size(); ++c) {
    Communicator &g = *cases[c].group;
    const auto &members = cases[c].members;
    ASSERT_EQ(g.size(), static_cast<int>(members.size())) << "case " << c;
    int expectedRank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
    EXPECT_EQ(g.rank(), expectedRank) << "case " << c;
    int64_t sum = me, expectedSum = 0;
    for (int r : members)
      expectedSum += r;
    g.allReduce(&sum, 1, DataType::INT64, ReduceOp::Sum);
    EXPECT_EQ(sum, expectedSum) << "case " << c;
    float f = static_cast<float>(me);
    g.allReduce(&f, 1, DataType::FLOAT, ReduceOp::Sum);
    EXPECT_EQ(f, static_cast<float>(expectedSum)) << "case " << c;
    if (g.size() < 2) continue;
    // Every group uses the same tag at the same time: only the group's own messages arrive.
    auto mine = payload(me, 5000, DataType::FLOAT, static_cast<int>(c));
    std::vector<uint8_t> got(mine.size());
    auto sent = g.sendAsync(mine.data(), 5000, DataType::FLOAT, right(g), 4);
    g.recv(got.data(), 5000, DataType::FLOAT, left(g), 4);
    sent.wait();
    int sender = members[static_cast<size_t>(left(g))];
    EXPECT_EQ(firstDifference(got, payload(sender, 5000, DataType::FLOAT, static_cast<int>(c)), 4), -1)
        << "case " << c << " from world rank " << sender;
  }
}

// A group keeps its parent's timeout: a receive that nothing answers fails after the parent's 1 s,
// naming what it waited for.
TEST(CommP2P, SplitKeepsTheTimeoutAndAReceiveTimesOut) {
  MpiCommunicator world(testOptions());
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  {
    std::shared_ptr<Communicator> group;
    {
      MpiCommunicator parent(MpiOptions{std::chrono::milliseconds(1000)});
      group = parent.split(0, 0);
    }
    float x = 0;
    int from = left(*group);
    std::string message = thrown([&] { group->recv(&x, 1, DataType::FLOAT, from, 3); });
    EXPECT_TRUE(
        contains(message, "receive from rank " + std::to_string(from) + " with tag 3 of 4 bytes (1 FLOAT) on rank " +
                              std::to_string(group->rank()) + " of " + std::to_string(group->size()) +
                              " timed out after 1000 ms waiting for rank " + std::to_string(from) + " to send it"))
        << message;
    world.barrier();
  }
}

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // MPI is not initialised here: the first MpiCommunicator does it, as in a session.
  return RUN_ALL_TESTS();
}
