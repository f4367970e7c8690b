#pragma once
/// \file The Open MPI implementation of `Communicator`. Includes no MPI header: callers that
/// hold an `MPI_Comm` of their own pass it through comm/mpi_handle.hpp.

#include "comm/communicator.hpp"

#include <chrono>
#include <memory>

namespace popart::comm {

/// Settings of an `MpiCommunicator`.
struct MpiOptions {
  /// How long `Request::wait` waits for a collective before it throws an error naming the
  /// operation and the rank it waits for; zero waits forever. A rank that died or took another
  /// path then stops the others instead of hanging them.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

/// Collectives over MPI point-to-point messages on a private duplicate of a communicator, so that
/// they never match the caller's own messages; `sendAsync`/`recvAsync` use a second duplicate, so
/// that they never match the collectives'. MPI is initialised on first use if the caller has
/// not done it (and finalised at exit); errors come back as `popart::error` naming the MPI call
/// and the rank, never as an abort. After a failure (an MPI error or a timeout) the communicator
/// refuses further collectives: the ranks no longer agree on what has been exchanged.
///
/// Use one communicator from one thread at a time.
class MpiCommunicator final : public Communicator {
public:
  /// A communicator over all the processes of the job (MPI_COMM_WORLD).
  explicit MpiCommunicator(const MpiOptions &options = {});
  /// A communicator over the group of \p mpiComm, which must point to an `MPI_Comm` (see
  /// `makeMpiCommunicator` in comm/mpi_handle.hpp); MPI must be initialised already.
  MpiCommunicator(const void *mpiComm, const MpiOptions &options);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator &) = delete;
  MpiCommunicator &operator=(const MpiCommunicator &) = delete;

  int rank() const override;
  int size() const override;
  Request allReduceAsync(void *data, int64_t count, DataType type, ReduceOp op) override;
  Request reduceScatterAsync(const void *send, void *recv, int64_t recvCount, DataType type, ReduceOp op) override;
  Request allGatherAsync(const void *send, void *recv, int64_t sendCount, DataType type) override;
  Request broadcastAsync(void *data, int64_t count, DataType type, int root) override;
  Request barrierAsync() override;
  Request sendAsync(const void *data, int64_t count, DataType type, int peer, int tag) override;
  Request recvAsync(void *data, int64_t count, DataType type, int peer, int tag) override;
  /// MPI_Comm_split of this group, after a barrier that bounds the wait by the timeout; the new
  /// group has this one's options and owns its own MPI communicators.
  std::shared_ptr<Communicator> split(int color, int key) override;

  /// The state shared by the communicator and its operations in flight.
  struct State;

private:
  /// The group of \p state, which is complete (see `split`).
  explicit MpiCommunicator(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
};

/// Initialises MPI unless it already is (thread level MPI_THREAD_SERIALIZED); the process then
/// finalises it at exit. \returns true if this call initialised it.
bool ensureMpiInitialised();

} // namespace popart::comm
