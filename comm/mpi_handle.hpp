#pragma once
/// \file For callers that use MPI themselves: an `MpiCommunicator` over their own `MPI_Comm`.
/// Includes mpi.h, so only files that already depend on MPI include it.

#include "comm/mpi_communicator.hpp"

#include <mpi.h>

#include <memory>

namespace popart::comm {

/// A communicator over the ranks of \p comm (duplicated, so the caller keeps its own).
inline std::unique_ptr<MpiCommunicator> makeMpiCommunicator(MPI_Comm comm, const MpiOptions &options = {}) {
  return std::make_unique<MpiCommunicator>(static_cast<const void *>(&comm), options);
}

} // namespace popart::comm
