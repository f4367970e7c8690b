// Checkpoint files that are truncated, bit-flipped or extended are refused before anything is
// applied, with a message naming the file and what is wrong; valid ones (format 2, and format 1
// from before the checksum) still load. docs/training.md, "Checkpoints".

#include "checkpoint_test_helpers.hpp"
#include "session/checkpoint_file.hpp"

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/optimizer.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <unistd.h>

using namespace popart;

namespace {

constexpr int64_t kRows = 4, kIn = 8, kHidden = 16, kOut = 4;

/// loss = mean((relu(x·w1)·w2)²), trained with Adam: weights and two moments per weight.
std::string smallMlp() {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kRows, kIn}), "x");
  std::vector<float> w1(static_cast<size_t>(kIn * kHidden)), w2(static_cast<size_t>(kHidden * kOut));
  for (size_t i = 0; i < w1.size(); ++i)
    w1[i] = static_cast<float>(std::sin(0.37 * double(i))) * 0.3f;
  for (size_t i = 0; i < w2.size(); ++i)
    w2[i] = static_cast<float>(std::cos(0.91 * double(i))) * 0.3f;
  TensorId h = ai.relu({ai.matmul({x, b->addInitializedInputTensor(w1, {kIn, kHidden}, "w1")})});
  TensorId y = ai.matmul({h, b->addInitializedInputTensor(w2, {kHidden, kOut}, "w2")});
  b->addOutputTensor(ai.reducemean({ai.mul({y, y})}, std::nullopt, 0));
  return b->getModelProto();
}

std::unique_ptr<TrainingSession> trainer(const std::string &model) {
  Adam adam({{"defaultLearningRate", {0.01f, false}}});
  auto s = TrainingSession::createFromOnnxModel(model, DataFlow(1, std::vector<TensorId>{}), "", adam);
  s->prepareDevice();
  return s;
}

void step(TrainingSession &s, int k) {
  std::vector<float> x(static_cast<size_t>(kRows * kIn));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(std::sin(0.13 * double(i) + 0.7 * double(k)));
  NDArrayWrapper<float> in(x.data(), {kRows, kIn});
  StepIO io({{"x", in}}, {});
  s.run(io);
}

/// Every weight and optimiser state tensor of \p s, back to back.
std::vector<float> state(const TrainingSession &s) {
  std::vector<TensorId> ids = s.getWeightIds();
  for (const auto &id : s.getOptimizerStateIds())
    ids.push_back(id);
  std::vector<float> all;
  for (const auto &id : ids) {
    std::vector<float> v(static_cast<size_t>(s.getInfo(id).elementCount()));
    NDArrayWrapper<float> arr(v.data(), s.getInfo(id).shape());
    WeightsIO io;
    io.insert(id, arr);
    s.readWeights(io);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

class CheckpointIntegrity : public ::testing::Test {
protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_);
    model_ = smallMlp();
    auto a = trainer(model_);
    step(*a, 0);
    step(*a, 1);
    a->saveCheckpoint(good_);
    saved_ = state(*a);
    // The session the bad files are offered to: one step of its own, so that its state differs.
    b_ = trainer(model_);
    step(*b_, 5);
    before_ = state(*b_);
    ASSERT_NE(saved_, before_);
    bytes_ = test::readFileBytes(good_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// Offers \p bytes as a checkpoint: it must be refused with a message holding the file's name
  /// and \p expected, and the session must be left as it was.
  void expectRefused(const std::string &bytes, const std::string &expected, const std::string &what) {
    SCOPED_TRACE(what);
    test::writeFileBytes(bad_, bytes);
    try {
      b_->loadCheckpoint(bad_);
      ADD_FAILURE() << "a checkpoint that is " << what << " was loaded";
    } catch (const error &e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(bad_), std::string::npos) << message;
      EXPECT_NE(message.find(expected), std::string::npos) << "expected '" << expected << "' in: " << message;
    }
    EXPECT_EQ(state(*b_), before_);
    EXPECT_EQ(b_->getStepCount(), 1);
  }

  std::filesystem::path dir_ =
      std::filesystem::temp_directory_path() / ("popart_ckpt_integrity_" + std::to_string(::getpid()));
  std::string good_ = (dir_ / "good.ckpt").string(), bad_ = (dir_ / "bad.ckpt").string();
  std::string model_, bytes_;
  std::unique_ptr<TrainingSession> b_;
  std::vector<float> saved_, before_;
};

} // namespace

TEST(CheckpointChecksum, Fnv1a64MatchesThePublishedTestVectors) {
  // From the FNV reference (Fowler, Noll, Vo: test vectors of FNV-1a 64).
  EXPECT_EQ(session::fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(session::fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(session::fnv1a64("foobar", 6), 0x85944171f73967e8ull);
  // Continued in pieces, as the loader reads a file in chunks.
  EXPECT_EQ(session::fnv1a64("bar", 3, session::fnv1a64("foo", 3)), 0x85944171f73967e8ull);
}

TEST_F(CheckpointIntegrity, AValidCheckpointHasItsSizeAndChecksumAndLoads) {
  ASSERT_GE(bytes_.size(), 40u);
  EXPECT_EQ(bytes_.substr(0, 8), "POPARTCK");
  EXPECT_EQ(test::wordAt(bytes_, 8), 2u); // the format version
  EXPECT_EQ(test::wordAt(bytes_, 16), bytes_.size());
  EXPECT_EQ(test::wordAt(bytes_, bytes_.size() - 8), session::fnv1a64(bytes_.data() + 8, bytes_.size() - 16));
  EXPECT_FALSE(std::filesystem::exists(good_ + ".tmp")); // renamed, not left behind
  b_->loadCheckpoint(good_);
  EXPECT_EQ(state(*b_), saved_);
  EXPECT_EQ(b_->getStepCount(), 2);
}

TEST_F(CheckpointIntegrity, TruncatedFilesAreRefusedNamingWhereTheyEnd) {
  const size_t size = bytes_.size();
  const uint64_t headerEnd = 32 + test::wordAt(bytes_, 24);
  const std::string total = std::to_string(size);
  expectRefused(bytes_.substr(0, 0), "it is empty (0 bytes)", "empty");
  expectRefused(bytes_.substr(0, 5), "truncated at byte 5 of at least 40", "cut in the magic");
  expectRefused(bytes_.substr(0, 20), "truncated at byte 20 of at least 40", "cut in the preamble");
  for (size_t at : {size_t{32}, static_cast<size_t>(headerEnd - 10), static_cast<size_t>(headerEnd + 100),
                    (headerEnd + size) / 2, size - 8, size - 1})
    expectRefused(bytes_.substr(0, at), "truncated at byte " + std::to_string(at) + " of " + total,
                  "cut at byte " + std::to_string(at));
}

TEST_F(CheckpointIntegrity, FlippedBitsAreRefusedAsAChecksumMismatch) {
  const uint64_t headerEnd = 32 + test::wordAt(bytes_, 24);
  auto flipped = [&](size_t at, int bit) {
    std::string b = bytes_;
    b[at] = static_cast<char>(b[at] ^ (1 << bit));
    return b;
  };
  expectRefused(flipped(26, 0), "checksum mismatch", "a flipped bit in the header's length");
  expectRefused(flipped(40, 3), "checksum mismatch", "a flipped bit in the header");
  expectRefused(flipped(static_cast<size_t>(headerEnd) - 2, 6), "checksum mismatch",
                "a flipped bit at the header's end");
  expectRefused(flipped(static_cast<size_t>(headerEnd), 0), "checksum mismatch", "a flipped bit in the first tensor");
  expectRefused(flipped(bytes_.size() - 9, 7), "checksum mismatch", "a flipped bit in the last tensor");
  expectRefused(flipped(bytes_.size() - 3, 2), "checksum mismatch", "a flipped bit in the checksum");
  // The size and version are checked first: a flip there names them.
  expectRefused(flipped(16, 4), "truncated at byte", "a flipped bit in the size that makes it larger");
  expectRefused(flipped(8, 2), "unknown format version 6", "a flipped bit in the version");
  expectRefused(flipped(0, 1), "it is not a checkpoint", "a flipped bit in the magic");
}

TEST_F(CheckpointIntegrity, TrailingBytesAreRefused) {
  expectRefused(bytes_ + "garbage", "7 bytes of trailing data after its end at byte " + std::to_string(bytes_.size()),
                "extended");
  // A second checkpoint appended to the first (an interrupted concatenation, a copy gone wrong).
  expectRefused(bytes_ + bytes_, "bytes of trailing data", "doubled");
}

TEST_F(CheckpointIntegrity, AConsistentFileWithAForgedLayoutIsStillRefused) {
  // A valid checksum over a header that does not fit its tensors (what a fuzzer or another writer
  // may make): refused by the structural checks, the session untouched.
  test::CheckpointParts c = test::readCheckpointParts(good_);
  c.tensors.append(16, '\0');
  expectRefused(test::checkpointBytes(c), "16 bytes after its last tensor", "tensors with extra bytes");
  c = test::readCheckpointParts(good_);
  c.tensors.resize(c.tensors.size() - 4);
  expectRefused(test::checkpointBytes(c), "it is truncated in tensor", "tensors short of bytes");
  c = test::readCheckpointParts(good_);
  c.header["seed"] = "not a number";
  expectRefused(test::checkpointBytes(c), "its seed 'not a number' is not an unsigned 64-bit number",
                "a header with a bad seed");
  c.header["seed"] = "12abc";
  expectRefused(test::checkpointBytes(c), "its seed '12abc'", "a seed with trailing letters");
  c = test::readCheckpointParts(good_);
  c.header["version"] = 3;
  expectRefused(test::checkpointBytes(c), "its header says format version 3, its preamble 2", "versions disagree");
}

TEST_F(CheckpointIntegrity, FormatOneFilesFromBeforeTheChecksumStillLoad) {
  // Format 1: magic, the header's length, the header, the tensors (no size, no checksum).
  test::CheckpointParts c = test::readCheckpointParts(good_);
  c.header["version"] = 1;
  const std::string h = c.header.dump();
  const uint64_t n = h.size();
  std::string v1 = "POPARTCK";
  v1.append(reinterpret_cast<const char *>(&n), sizeof n);
  v1 += h + c.tensors;
  test::writeFileBytes(bad_, v1);
  b_->loadCheckpoint(bad_);
  EXPECT_EQ(state(*b_), saved_);
  EXPECT_EQ(b_->getStepCount(), 2);
  // Unverified, but still checked for its structure.
  auto fresh = trainer(model_);
  test::writeFileBytes(bad_, v1.substr(0, v1.size() - 3));
  EXPECT_THROW(fresh->loadCheckpoint(bad_), error);
  test::writeFileBytes(bad_, v1 + "xy");
  EXPECT_THROW(fresh->loadCheckpoint(bad_), error);
}

TEST_F(CheckpointIntegrity, AValidCheckpointOfAnotherOptimiserLeavesTheSessionAsItWas) {
  SGD sgd({{"defaultLearningRate", {0.01f, false}}, {"defaultMomentum", {0.9f, false}}});
  auto other = TrainingSession::createFromOnnxModel(model_, DataFlow(1, std::vector<TensorId>{}), "", sgd);
  other->prepareDevice();
  step(*other, 5);
  const std::vector<float> mine = state(*other);
  try {
    other->loadCheckpoint(good_);
    ADD_FAILURE() << "an Adam checkpoint was loaded into an SGD session";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("state, the session uses"), std::string::npos) << e.what();
  }
  EXPECT_EQ(state(*other), mine);
  EXPECT_EQ(other->getStepCount(), 1);
}
