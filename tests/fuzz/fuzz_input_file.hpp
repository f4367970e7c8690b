#pragma once
// The readers under test take file names: each fuzz input goes through one temporary file per
// process, removed at exit.

#include <cstddef>
#include <cstdint>
#include <string>

namespace popart {
class error;
}

namespace popart::fuzz {

/// Writes \p size bytes at \p data to this process's input file named \p name; \returns its path.
std::string writeInputFile(const uint8_t *data, size_t size, const std::string &name);

/// The harnesses' handler of popart::error, the expected outcome of bad input: prints it when
/// POPART_FUZZ_VERBOSE is set (to see why an input is refused), else nothing.
void expectedError(const popart::error &e);

} // namespace popart::fuzz
