// IDX files: plain and gzip-compressed, big-endian elements, and errors that name the file.

#include "cli/idx.hpp"

#include <popart/error.hpp>

#include <gtest/gtest.h>
#include <zlib.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>

using namespace popart;
using namespace popart::cli;
namespace fs = std::filesystem;

namespace {

fs::path tempDir() {
  fs::path d = fs::temp_directory_path() /
               ("popart-idx-test-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::create_directories(d);
  return d;
}

void writeFile(const fs::path &p, const std::vector<uint8_t> &bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char *>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void writeGz(const fs::path &p, const std::vector<uint8_t> &bytes) {
  gzFile f = gzopen(p.string().c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

/// An IDX ubyte file of shape [2, 3, 2]: 0x00 0x00 0x08 0x03, dims 2, 3, 2 (big-endian), 12 bytes.
std::vector<uint8_t> ubyteFile() {
  std::vector<uint8_t> b = {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 2};
  for (uint8_t i = 0; i < 12; ++i)
    b.push_back(static_cast<uint8_t>(200 + i));
  return b;
}

std::string errorOf(const std::string &path) {
  try {
    readIdx(path);
  } catch (const popart::error &e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST(Idx, ReadsUbyteFilesPlainAndGzipped) {
  fs::path d = tempDir();
  writeFile(d / "a-idx3-ubyte", ubyteFile());
  writeGz(d / "b-idx3-ubyte.gz", ubyteFile());
  for (std::string name : {"a-idx3-ubyte", "b-idx3-ubyte"}) {
    IdxArray a = readIdx(findIdxFile(d.string(), name));
    EXPECT_EQ(a.info, TensorInfo(DataType::UINT8, {2, 3, 2})) << name;
    ASSERT_EQ(a.bytes.size(), 12u) << name;
    for (size_t i = 0; i < 12; ++i)
      EXPECT_EQ(a.bytes[i], 200 + i) << name << " element " << i;
  }
  EXPECT_THROW(findIdxFile(d.string(), "missing"), popart::error);
  fs::remove_all(d);
}

TEST(Idx, ConvertsBigEndianElements) {
  fs::path d = tempDir();
  // INT32 [2]: 0x01020304 and -2; FLOAT [1]: 1.5f = 0x3FC00000.
  writeFile(d / "i32", {0, 0, 0x0C, 1, 0, 0, 0, 2, 1, 2, 3, 4, 0xFF, 0xFF, 0xFF, 0xFE});
  writeFile(d / "f32", {0, 0, 0x0D, 1, 0, 0, 0, 1, 0x3F, 0xC0, 0, 0});
  IdxArray i = readIdx((d / "i32").string());
  ASSERT_EQ(i.info, TensorInfo(DataType::INT32, {2}));
  int32_t iv[2];
  std::memcpy(iv, i.bytes.data(), sizeof iv);
  EXPECT_EQ(iv[0], 0x01020304);
  EXPECT_EQ(iv[1], -2);
  IdxArray f = readIdx((d / "f32").string());
  ASSERT_EQ(f.info, TensorInfo(DataType::FLOAT, {1}));
  float fv;
  std::memcpy(&fv, f.bytes.data(), sizeof fv);
  EXPECT_EQ(fv, 1.5f);
  fs::remove_all(d);
}

TEST(Idx, ErrorsNameTheFile) {
  fs::path d = tempDir();
  std::vector<uint8_t> badMagic = ubyteFile();
  badMagic[0] = 0x1F;
  writeFile(d / "badmagic", badMagic);
  std::vector<uint8_t> badType = ubyteFile();
  badType[2] = 0x07;
  writeFile(d / "badtype", badType);
  std::vector<uint8_t> truncated = ubyteFile();
  truncated.resize(truncated.size() - 1);
  writeFile(d / "truncated", truncated);
  writeGz(d / "truncated.gz", truncated);
  writeFile(d / "header", {0, 0, 8, 3, 0, 0});
  std::vector<uint8_t> longer = ubyteFile();
  longer.push_back(0);
  writeFile(d / "longer", longer);

  auto expectError = [&](const std::string &name, const std::string &needle) {
    std::string path = (d / name).string();
    std::string msg = errorOf(path);
    EXPECT_NE(msg.find(path), std::string::npos) << name << ": " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << name << ": " << msg;
  };
  expectError("badmagic", "bad magic");
  expectError("badtype", "element type");
  expectError("truncated", "truncated");
  expectError("truncated.gz", "truncated");
  expectError("header", "truncated");
  expectError("longer", "bytes after");
  expectError("does-not-exist", "cannot be opened");
  fs::remove_all(d);
}

TEST(Idx, FashionMnistHasBalancedClasses) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " is missing (Debian package dataset-fashion-mnist)";
  // The data set's documentation: 60,000 training and 10,000 test images of 28x28 pixels, in
  // ten classes of 6,000 and 1,000 images each.
  for (auto [prefix, n] : {std::pair<std::string, int64_t>{"train", 60000}, {"t10k", 10000}}) {
    IdxArray images = readIdx(findIdxFile(dir, prefix + "-images-idx3-ubyte"));
    IdxArray labels = readIdx(findIdxFile(dir, prefix + "-labels-idx1-ubyte"));
    EXPECT_EQ(images.info, TensorInfo(DataType::UINT8, {n, 28, 28}));
    ASSERT_EQ(labels.info, TensorInfo(DataType::UINT8, {n}));
    std::array<int64_t, 10> counts{};
    for (uint8_t l : labels.bytes) {
      ASSERT_LT(l, 10);
      ++counts[l];
    }
    for (int c = 0; c < 10; ++c)
      EXPECT_EQ(counts[static_cast<size_t>(c)], n / 10) << prefix << " class " << c;
  }
}
