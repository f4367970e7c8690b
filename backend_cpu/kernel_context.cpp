#include "backend_cpu/kernel_context.hpp"
#include "comm/communicator.hpp"
#include <popart/error.hpp>

#include <chrono>

#include <array>
#include <utility>

namespace popart::backend_cpu {

namespace {
struct WayName {
  MatMulOperands way;
  const char *name;
  const char *option; ///< SessionOptions::matmulTuning's value forcing it
};
constexpr std::array<WayName, 10> kWays{{{MatMulOperands::Auto, "Auto", "auto"},
                                         {MatMulOperands::AsStored, "AsStored", "0"},
                                         {MatMulOperands::FlippedA, "FlippedA", "a"},
                                         {MatMulOperands::FlippedB, "FlippedB", "b"},
                                         {MatMulOperands::ShiftedB, "ShiftedB", "s"},
                                         {MatMulOperands::Pointwise, "Pointwise", "p"},
                                         {MatMulOperands::Swapped, "Swapped", "t"},
                                         {MatMulOperands::SwappedCopy, "SwappedCopy", "tc"},
                                         {MatMulOperands::FlippedPointwise, "FlippedPointwise", "ap"},
                                         {MatMulOperands::Unpermuted, "Unpermuted", "u"}}};
} // namespace

MatMulOperands parseMatMulTuning(const std::string &mode) {
  if (mode == "1") return MatMulOperands::Auto;
  for (const WayName &w : kWays)
    if (mode == w.option) return w.way;
  throw error("SessionOptions.matmulTuning must be auto (or 1), 0, a, b, s, p, t, tc, ap or u, got '", mode, "'");
}

const char *matMulOperandsName(MatMulOperands way) {
  for (const WayName &w : kWays)
    if (w.way == way) return w.name;
  return "?";
}

MatMulOperands matMulOperandsNamed(const std::string &name) {
  for (const WayName &w : kWays)
    if (name == w.name) return w.way;
  throw error("'", name, "' is not a MatMul operand way");
}

MatMulOperands MatMulTuningCache::choose(const std::string &key, const std::function<MatMulOperands()> &decide) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = chosen_.find(key);
  if (it != chosen_.end()) return it->second;
  return chosen_[key] = decide();
}

std::map<std::string, MatMulOperands> MatMulTuningCache::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return chosen_;
}

void MatMulTuningCache::preset(const std::map<std::string, MatMulOperands> &ways) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto &[key, way] : ways)
    chosen_[key] = way;
}

struct CollectiveRequests::Slot {
  std::string label;
  const void *buffer = nullptr;
  comm::Request request;
  bool pending = false; ///< started, not yet waited for
  bool done = false;    ///< seen complete by progress() (counted out of inFlight_)
  int64_t startNs = 0;
};

CollectiveRequests::CollectiveRequests() = default;
CollectiveRequests::~CollectiveRequests() = default;

int CollectiveRequests::add(std::string label) {
  slots_.push_back(std::make_unique<Slot>());
  slots_.back()->label = std::move(label);
  return static_cast<int>(slots_.size() - 1);
}

const std::string &CollectiveRequests::label(int id) const { return slots_.at(static_cast<size_t>(id))->label; }

int64_t CollectiveRequests::nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void CollectiveRequests::start(int id, const void *buffer, comm::Request &&request) {
  Slot &slot = *slots_.at(static_cast<size_t>(id));
  if (slot.pending) throw error(slot.label, ": started again before its previous all-reduce was waited for");
  slot.request = std::move(request);
  slot.buffer = buffer;
  slot.pending = true;
  slot.done = false;
  slot.startNs = nowNs();
  ++inFlight_;
}

void CollectiveRequests::wait(const void *buffer, const std::string &waiter) {
  for (auto &slot : slots_)
    if (slot->pending && slot->buffer == buffer) {
      slot->pending = false; // a failed wait leaves nothing in flight to poll again
      if (!slot->done) --inFlight_;
      slot->request.wait();
      if (!slot->done) recordSpan(static_cast<int>(&slot - slots_.data()), slot->startNs, nowNs());
      return;
    }
  throw error(waiter, ": no collective is in flight on its input (its AllReduceStart did not run first)");
}

void CollectiveRequests::advance() {
  // Testing one request advances all of its communicator's, but the completion of each is only
  // observed through its own test: the spans end where this rank first sees them done.
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot &slot = *slots_[i];
    if (!slot.pending || slot.done) continue;
    if (slot.request.test()) {
      recordSpan(static_cast<int>(i), slot.startNs, nowNs());
      slot.done = true;
      --inFlight_;
    }
  }
}

void CollectiveRequests::recordSpan(int id, int64_t startNs, int64_t endNs) {
  if (!spansOn_ || spans_.size() >= spans_.capacity()) return;
  spans_.push_back({id, startNs - originNs_, endNs - startNs});
}

void CollectiveRequests::enableSpans(int64_t originNs, size_t maxSpans) {
  spansOn_ = true;
  originNs_ = originNs;
  spans_.clear();
  // A plan without collectives records none: no need to reserve for them.
  spans_.reserve(slots_.empty() ? 0 : maxSpans);
}

} // namespace popart::backend_cpu
