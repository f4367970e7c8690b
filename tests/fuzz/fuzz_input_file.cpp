#include "fuzz_input_file.hpp"

#include <popart/error.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace popart::fuzz {

namespace {

/// A folder of its own for this process (parallel fuzzing jobs must not share files).
struct InputDir {
  std::filesystem::path path;
  InputDir() : path(std::filesystem::temp_directory_path() / ("popart-fuzz-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~InputDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  InputDir(const InputDir &) = delete;
  InputDir &operator=(const InputDir &) = delete;
};

} // namespace

std::string writeInputFile(const uint8_t *data, size_t size, const std::string &name) {
  static const InputDir dir;
  std::filesystem::path p = dir.path / name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(data), static_cast<std::streamsize>(size));
  if (!out) throw std::runtime_error("fuzz harness: cannot write " + p.string());
  return p.string();
}

void expectedError(const popart::error &e) {
  static const bool verbose = std::getenv("POPART_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "popart::error: %s\n", e.what());
}

} // namespace popart::fuzz
