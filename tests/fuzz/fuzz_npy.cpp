// libFuzzer target: the .npy reader (session/npy.cpp). popart::error is the expected outcome of
// bad input; anything else escaping, or a sanitizer report, is a finding.

#include "fuzz_input_file.hpp"
#include "session/npy.hpp"

#include <popart/error.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string path = popart::fuzz::writeInputFile(data, size, "input.npy");
  try {
    popart::npy::read(path);
  } catch (const popart::error &e) {
    popart::fuzz::expectedError(e);
  }
  return 0;
}
