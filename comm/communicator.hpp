#pragma once
/// \file The collective-communication interface that replicated training runs on.
///
/// Kept free of MPI headers: sessions and kernels see only this interface, so that another
/// engine (Gloo, say) can be added beside `MpiCommunicator` without touching them.

#include <popart/datatype.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace popart::comm {

/// How an all-reduce or reduce-scatter combines the ranks' elements.
enum class ReduceOp {
  Sum,  ///< FLOAT, FLOAT16, BFLOAT16 (summed in fp32) and INT64.
  Mean, ///< The sum divided by the number of ranks; FLOAT, FLOAT16 and BFLOAT16.
  And,  ///< Logical and of BOOL elements (the replicas' all-finite decision).
};

/// "Sum", "Mean" or "And".
std::string toString(ReduceOp op);

/// An operation started by a non-blocking call; a `Request` drives it to completion.
class PendingOperation {
public:
  virtual ~PendingOperation() = default;
  /// Advances the operation without blocking; \returns true once it has completed.
  virtual bool test() = 0;
  /// Blocks until the operation completes, or throws once the communicator's timeout passes.
  virtual void wait() = 0;
  /// \returns true if the operation has completed or failed, so that nothing uses its buffers any more
  /// on this rank's behalf unless MPI itself still holds them (see `MpiCommunicator`).
  virtual bool finished() const = 0;
};

/// The handle of a non-blocking collective. Its buffers must stay alive, and untouched, until
/// `test()` has returned true or `wait()` has returned; destroying a pending request waits for it.
class Request {
public:
  /// A request that has already completed.
  Request() = default;
  /// A request for \p operation, which is in flight.
  explicit Request(std::unique_ptr<PendingOperation> operation);
  Request(Request &&) noexcept = default;
  /// Waits for the request this one had before taking \p other's.
  Request &operator=(Request &&other) noexcept;
  Request(const Request &) = delete;
  Request &operator=(const Request &) = delete;
  ~Request();

  /// Advances the operation, and the others in flight on its communicator (communication makes
  /// progress only inside `test` and `wait`); \returns true once it has completed. Throws the
  /// operation's error.
  bool test();
  /// Blocks until the operation completes; throws a `popart::error` on a communication failure
  /// or when the communicator's timeout passes first.
  void wait();

private:
  void finishQuietly() noexcept;
  std::unique_ptr<PendingOperation> operation_;
};

/// A group of ranks (processes) that run collectives together. Every rank must call the same
/// collectives in the same order with the same counts, types and ops. All results are
/// bit-identical on every rank and from run to run for a given number of ranks (see
/// docs/distributed.md, "Determinism").
class Communicator {
public:
  virtual ~Communicator() = default;

  /// This process's index in the group, from 0.
  virtual int rank() const = 0;
  /// The number of ranks in the group.
  virtual int size() const = 0;

  /// Starts combining \p count elements of \p type at \p data with the other ranks' by \p op,
  /// in place: afterwards every rank holds the same result.
  virtual Request allReduceAsync(void *data, int64_t count, DataType type, ReduceOp op) = 0;
  /// Starts a reduce-scatter: \p send holds size() blocks of \p recvCount elements; rank r receives
  /// in \p recv block r combined over all ranks by \p op. \p send and \p recv must not overlap.
  virtual Request reduceScatterAsync(const void *send, void *recv, int64_t recvCount, DataType type, ReduceOp op) = 0;
  /// Starts an all-gather: every rank's \p sendCount elements at \p send land in block r (of
  /// size() blocks) of \p recv on every rank. \p send and \p recv must not overlap.
  virtual Request allGatherAsync(const void *send, void *recv, int64_t sendCount, DataType type) = 0;
  /// Starts copying \p count elements at \p data on rank \p root to \p data on every rank.
  virtual Request broadcastAsync(void *data, int64_t count, DataType type, int root) = 0;
  /// Starts a barrier: it completes once every rank has started it.
  virtual Request barrierAsync() = 0;

  /// `allReduceAsync`, waited for.
  void allReduce(void *data, int64_t count, DataType type, ReduceOp op);
  /// `reduceScatterAsync`, waited for.
  void reduceScatter(const void *send, void *recv, int64_t recvCount, DataType type, ReduceOp op);
  /// `allGatherAsync`, waited for.
  void allGather(const void *send, void *recv, int64_t sendCount, DataType type);
  /// `broadcastAsync`, waited for.
  void broadcast(void *data, int64_t count, DataType type, int root);
  /// `barrierAsync`, waited for.
  void barrier();

  /// Starts sending \p count elements of \p type at \p data to rank \p peer with \p tag (0 <= tag < 2^15). Messages
  /// from one rank to another with the same tag arrive in the order they were sent. \p data must stay untouched until
  /// the request completes. Point-to-point messages never match the collectives' own, so both may be in flight at once.
  virtual Request sendAsync(const void *data, int64_t count, DataType type, int peer, int tag) = 0;
  /// Starts receiving \p count elements of \p type from rank \p peer with \p tag into \p data. A message of another
  /// size is an error naming both sizes, the peer and the tag.
  virtual Request recvAsync(void *data, int64_t count, DataType type, int peer, int tag) = 0;
  /// `sendAsync`, waited for.
  void send(const void *data, int64_t count, DataType type, int peer, int tag);
  /// `recvAsync`, waited for.
  void recv(void *data, int64_t count, DataType type, int peer, int tag);

  /// Collective over this group: the ranks that pass the same \p color (>= 0) form a new group, ranked by \p key (ties
  /// by rank here). Every rank gets its own group. The new group's traffic never matches this one's, and it stays
  /// usable after this communicator is destroyed. Call it with no request of this group in flight.
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  /// The largest tag a point-to-point message may carry (the MPI standard's guaranteed minimum).
  static constexpr int kMaxTag = 32767;

protected:
  /// Throws a `popart::error` naming \p what (the collective) if \p op cannot combine \p type, or if
  /// \p count is negative.
  void checkReduction(const char *what, int64_t count, DataType type, ReduceOp op) const;
  /// Throws if \p count is negative or \p type has no fixed element size.
  void checkCopy(const char *what, int64_t count, DataType type) const;
  /// Throws if \p root is not a rank of the group.
  void checkRoot(const char *what, int root) const;
  /// Throws a `popart::error` naming \p what ("send" or "receive"), this rank, \p peer and \p tag if \p peer is not
  /// another rank of the group, \p tag is outside [0, kMaxTag], or the elements cannot be moved (see `checkCopy`).
  void checkPointToPoint(const char *what, int64_t count, DataType type, int peer, int tag) const;
  /// Throws if \p color is negative (every rank must get a group).
  void checkSplit(int color) const;
};

/// The group of one: what a process that is not replicated uses. Every collective completes at
/// once; with one rank a sum or mean is the input itself.
class LocalCommunicator final : public Communicator {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Request allReduceAsync(void *data, int64_t count, DataType type, ReduceOp op) override;
  Request reduceScatterAsync(const void *send, void *recv, int64_t recvCount, DataType type, ReduceOp op) override;
  Request allGatherAsync(const void *send, void *recv, int64_t sendCount, DataType type) override;
  Request broadcastAsync(void *data, int64_t count, DataType type, int root) override;
  Request barrierAsync() override;
  /// Throws: a group of one has no peer.
  Request sendAsync(const void *data, int64_t count, DataType type, int peer, int tag) override;
  /// Throws: a group of one has no peer.
  Request recvAsync(void *data, int64_t count, DataType type, int peer, int tag) override;
  /// A new `LocalCommunicator`.
  std::shared_ptr<Communicator> split(int color, int key) override;
};

} // namespace popart::comm
