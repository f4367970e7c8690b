#pragma once
// Helpers of the communicator tests under mpirun (test_comm_mpi.cpp, test_comm_p2p_mpi.cpp).

#include "comm/mpi_communicator.hpp"

#include <chrono>
#include <cstdint>

namespace popart::testing {

/// Long enough for a loaded machine, short enough that a broken exchange fails instead of running
/// into ctest's timeout.
inline comm::MpiOptions testOptions() { return comm::MpiOptions{std::chrono::seconds(60)}; }

/// A 64-bit mixing function (splitmix's finaliser): arbitrary, reproducible bits per element.
inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

/// The seed of element \p i of rank \p rank for \p salt, mixed.
inline uint64_t elementBits(int rank, int64_t i, int salt) {
  return mix(static_cast<uint64_t>(rank) * 1000003ULL + static_cast<uint64_t>(i) * 7919ULL +
             static_cast<uint64_t>(salt) * 104729ULL + 1);
}

} // namespace popart::testing
