#include "comm/communicator.hpp"

#include "core/log.hpp"

#include <popart/error.hpp>

#include <cstring>

namespace popart::comm {

std::string toString(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum: return "Sum";
  case ReduceOp::Mean: return "Mean";
  case ReduceOp::And: return "And";
  }
  return "ReduceOp(" + std::to_string(static_cast<int>(op)) + ")";
}

Request::Request(std::unique_ptr<PendingOperation> operation) : operation_(std::move(operation)) {}

Request &Request::operator=(Request &&other) noexcept {
  if (this != &other) {
    finishQuietly();
    operation_ = std::move(other.operation_);
  }
  return *this;
}

Request::~Request() { finishQuietly(); }

// A destructor cannot throw, yet freeing buffers that MPI may still write into would corrupt
// memory: so a pending request is waited for, and a failure is logged rather than lost.
void Request::finishQuietly() noexcept {
  if (!operation_ || operation_->finished()) return;
  try {
    operation_->wait();
  } catch (const std::exception &e) {
    logging::logger().error("a communication request destroyed before it completed failed: {}", e.what());
  }
}

bool Request::test() { return !operation_ || operation_->test(); }

void Request::wait() {
  if (operation_) operation_->wait();
}

void Communicator::allReduce(void *data, int64_t count, DataType type, ReduceOp op) {
  allReduceAsync(data, count, type, op).wait();
}

void Communicator::reduceScatter(const void *send, void *recv, int64_t recvCount, DataType type, ReduceOp op) {
  reduceScatterAsync(send, recv, recvCount, type, op).wait();
}

void Communicator::allGather(const void *send, void *recv, int64_t sendCount, DataType type) {
  allGatherAsync(send, recv, sendCount, type).wait();
}

void Communicator::broadcast(void *data, int64_t count, DataType type, int root) {
  broadcastAsync(data, count, type, root).wait();
}

void Communicator::barrier() { barrierAsync().wait(); }

void Communicator::send(const void *data, int64_t count, DataType type, int peer, int tag) {
  sendAsync(data, count, type, peer, tag).wait();
}

void Communicator::recv(void *data, int64_t count, DataType type, int peer, int tag) {
  recvAsync(data, count, type, peer, tag).wait();
}

void Communicator::checkReduction(const char *what, int64_t count, DataType type, ReduceOp op) const {
  if (count < 0) throw error("popart::comm: ", what, " of ", count, " elements on rank ", rank(), ": negative count");
  bool ok = false;
  switch (op) {
  case ReduceOp::Sum:
    ok = type == DataType::FLOAT || type == DataType::FLOAT16 || type == DataType::BFLOAT16 || type == DataType::INT64;
    break;
  case ReduceOp::Mean: ok = type == DataType::FLOAT || type == DataType::FLOAT16 || type == DataType::BFLOAT16; break;
  case ReduceOp::And: ok = type == DataType::BOOL; break;
  }
  if (!ok)
    throw error("popart::comm: ", what, " on rank ", rank(), " cannot combine ", popart::toString(type), " by ",
                toString(op), " (Sum: FLOAT, FLOAT16, BFLOAT16, INT64; Mean: the floating types; And: BOOL)");
}

void Communicator::checkCopy(const char *what, int64_t count, DataType type) const {
  if (count < 0) throw error("popart::comm: ", what, " of ", count, " elements on rank ", rank(), ": negative count");
  if (dataTypeSize(type) == 0)
    throw error("popart::comm: ", what, " on rank ", rank(), " cannot move ", popart::toString(type),
                " elements (no fixed size)");
}

void Communicator::checkRoot(const char *what, int root) const {
  if (root < 0 || root >= size())
    throw error("popart::comm: ", what, " on rank ", rank(), ": root ", root, " is not a rank of this group of ",
                size());
}

void Communicator::checkPointToPoint(const char *what, int64_t count, DataType type, int peer, int tag) const {
  if (size() == 1)
    throw error("popart::comm: ", what, " with tag ", tag, " to or from rank ", peer, " on rank ", rank(),
                ": a group of one has no peer");
  if (peer < 0 || peer >= size() || peer == rank())
    throw error("popart::comm: ", what, " with tag ", tag, " on rank ", rank(), " of ", size(), ": peer ", peer,
                peer == rank() ? " is this rank itself" : " is not a rank of this group");
  if (tag < 0 || tag > kMaxTag)
    throw error("popart::comm: ", what, " to or from rank ", peer, " on rank ", rank(), ": tag ", tag,
                " is outside 0..", kMaxTag);
  checkCopy(what, count, type);
}

void Communicator::checkSplit(int color) const {
  if (color < 0)
    throw error("popart::comm: split on rank ", rank(), " of ", size(), ": color ", color,
                " is negative (every rank must pass a color >= 0 and gets a group)");
}

Request LocalCommunicator::allReduceAsync(void *, int64_t count, DataType type, ReduceOp op) {
  checkReduction("all-reduce", count, type, op);
  return {};
}

Request LocalCommunicator::reduceScatterAsync(const void *send, void *recv, int64_t recvCount, DataType type,
                                              ReduceOp op) {
  checkReduction("reduce-scatter", recvCount, type, op);
  if (recvCount > 0) std::memmove(recv, send, static_cast<size_t>(recvCount) * dataTypeSize(type));
  return {};
}

Request LocalCommunicator::allGatherAsync(const void *send, void *recv, int64_t sendCount, DataType type) {
  checkCopy("all-gather", sendCount, type);
  if (sendCount > 0) std::memmove(recv, send, static_cast<size_t>(sendCount) * dataTypeSize(type));
  return {};
}

Request LocalCommunicator::broadcastAsync(void *, int64_t count, DataType type, int root) {
  checkCopy("broadcast", count, type);
  checkRoot("broadcast", root);
  return {};
}

Request LocalCommunicator::barrierAsync() { return {}; }

Request LocalCommunicator::sendAsync(const void *, int64_t count, DataType type, int peer, int tag) {
  checkPointToPoint("send", count, type, peer, tag);
  return {};
}

Request LocalCommunicator::recvAsync(void *, int64_t count, DataType type, int peer, int tag) {
  checkPointToPoint("receive", count, type, peer, tag);
  return {};
}

std::shared_ptr<Communicator> LocalCommunicator::split(int color, int) {
  checkSplit(color);
  return std::make_shared<LocalCommunicator>();
}

} // namespace popart::comm
