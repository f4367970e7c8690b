// Reading and writing checkpoint files in tests that edit them: format 2 (docs/training.md,
// "Checkpoints"), with the checksum recomputed over the edited bytes.

#pragma once

#include "session/checkpoint_file.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

namespace popart::test {

/// A format-2 checkpoint's JSON header, and the tensors' bytes after it.
struct CheckpointParts {
  nlohmann::json header;
  std::string tensors;
};

inline std::string readFileBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

inline void writeFileBytes(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline uint64_t wordAt(const std::string &bytes, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

inline CheckpointParts readCheckpointParts(const std::string &path) {
  const std::string bytes = readFileBytes(path);
  const uint64_t n = wordAt(bytes, 24);
  return {nlohmann::json::parse(bytes.substr(32, n)), bytes.substr(32 + n, bytes.size() - 32 - n - 8)};
}

/// The bytes of a format-2 file holding \p c, with its size and checksum.
inline std::string checkpointBytes(const CheckpointParts &c) {
  const std::string h = c.header.dump();
  const uint64_t words[3] = {2, 32 + h.size() + c.tensors.size() + 8, h.size()};
  std::string bytes = "POPARTCK";
  bytes.append(reinterpret_cast<const char *>(words), sizeof words);
  bytes += h;
  bytes += c.tensors;
  const uint64_t sum = session::fnv1a64(bytes.data() + 8, bytes.size() - 8);
  bytes.append(reinterpret_cast<const char *>(&sum), sizeof sum);
  return bytes;
}

inline void writeCheckpointParts(const std::string &path, const CheckpointParts &c) {
  writeFileBytes(path, checkpointBytes(c));
}

} // namespace popart::test
