// libFuzzer target: the IDX reader (cli/idx.cpp), plain and gzip-compressed.

#include "cli/idx.hpp"
#include "fuzz_input_file.hpp"

#include <popart/error.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string path = popart::fuzz::writeInputFile(data, size, "input.idx");
  try {
    popart::cli::readIdx(path);
  } catch (const popart::error &e) {
    popart::fuzz::expectedError(e);
  }
  return 0;
}
