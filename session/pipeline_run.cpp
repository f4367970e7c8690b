#include "session/pipeline_run.hpp"
#include "comm/mpi_communicator.hpp"
#include "core/log.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

namespace popart::session {

namespace {
/// Adds the time from its construction to its destruction to \p total, when \p on.
class Timer {
public:
  Timer(bool on, int64_t &total) : total_(on ? &total : nullptr) {
    if (total_) start_ = std::chrono::steady_clock::now();
  }
  ~Timer() {
    if (total_)
      *total_ +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  }
  Timer(const Timer &) = delete;
  Timer &operator=(const Timer &) = delete;

private:
  int64_t *total_;
  std::chrono::steady_clock::time_point start_;
};
} // namespace

PipelineGroups pipelineGroups(const SessionOptions &options) {
  if (options.virtualGraphMode != VirtualGraphMode::Manual && options.virtualGraphMode != VirtualGraphMode::Auto)
    throw error("SessionOptions.enablePipelining needs virtualGraphMode Manual (the model's __pipeline_stage or "
                "__ipu_number annotations) or Auto (pipelineSplit, else balanced stages)");
  if (!options.pipelineSplit.empty() && options.virtualGraphMode != VirtualGraphMode::Auto)
    throw error("SessionOptions.pipelineSplit cuts the model itself: it needs virtualGraphMode Auto");
  const int replicas = options.enableReplicatedGraphs ? options.replicatedGraphCount : 1;
  if (replicas < 1) throw error("SessionOptions.replicatedGraphCount must be at least 1, got ", replicas);
  PipelineGroups g;
  g.world = options.communicator ? options.communicator : std::make_shared<comm::MpiCommunicator>();
  const int size = g.world->size();
  if (size % replicas != 0)
    throw error("pipelining with replicatedGraphCount ", replicas, " needs a multiple of ", replicas,
                " processes (stages x replicas), got ", size);
  g.stageCount = size / replicas;
  g.stage = g.world->rank() / replicas;
  g.replica = g.world->rank() % replicas;
  g.stages = g.world->split(g.replica, g.stage);
  if (replicas > 1) g.replicas = g.world->split(g.stage, g.replica);
  return g;
}

ir::PipelineSettings pipelineSettings(const PipelineGroups &groups, const SessionOptions &options) {
  ir::PipelineSettings s;
  s.stages = groups.stageCount;
  s.stage = groups.stage;
  if (options.virtualGraphMode == VirtualGraphMode::Auto)
    s.cut = options.pipelineSplit.empty() ? ir::PipelineSettings::Cut::Balanced : ir::PipelineSettings::Cut::AtTensors;
  s.splitAt = options.pipelineSplit;
  return s;
}

PipelineRun::PipelineRun(PipelineGroups groups, ir::PipelineStages stages, const ir::Graph &graph,
                         const backend_cpu::ExecutionPlan &plan, int stashDepth)
    : groups_(std::move(groups)), stages_(std::move(stages)), stashDepth_(stashDepth) {
  const int stageCount = groups_.stageCount;
  for (const ir::StageMessage &m : stages_.receives) {
    void *address = plan.address(m.tensor);
    incoming_[m.forward() ? 1 : 0].emplace_back(address, plan.info(m.tensor).byteCount());
    incomingMessages_[m.forward() ? 1 : 0].push_back(&m);
  }
  for (const ir::StageMessage &m : stages_.sends) {
    Outgoing o;
    o.message = m;
    o.source = plan.address(m.tensor);
    o.bytes = plan.info(m.tensor).byteCount();
    // A stage runs ahead of the one it sends to by at most the micro-batches in flight.
    o.slots.resize(static_cast<size_t>(o.bytes) * static_cast<size_t>(stageCount));
    o.requests.resize(static_cast<size_t>(stageCount));
    outgoing_.push_back(std::move(o));
  }
  if (stashDepth_ > 0) {
    // What the backward reads of the forward: outputs of forward ops, the graph inputs (data and
    // received activations), and what is sent back to earlier stages from the forward.
    std::set<const void *> seen;
    auto save = [&](const TensorId &id) {
      auto [address, bytes] = plan.arenaStorage(id);
      if (address && seen.insert(address).second) saved_.emplace_back(address, bytes);
    };
    const std::set<TensorId> inputs(graph.inputs().begin(), graph.inputs().end());
    for (const auto &[id, t] : graph.tensors()) {
      const bool fromForward =
          t->producer() ? t->producer()->phase == ir::kPipelineForwardPhase : inputs.count(id) != 0;
      if (!fromForward) continue;
      const auto &readers = t->consumers();
      if (std::any_of(readers.begin(), readers.end(), [](const ir::Op *op) { return op->phase == 0; })) save(id);
    }
    for (const ir::StageMessage &m : stages_.sends)
      if (!m.forward()) save(m.tensor);
    for (const auto &[address, bytes] : saved_)
      savedBytes_ += bytes;
    stash_.resize(static_cast<size_t>(savedBytes_) * static_cast<size_t>(stashDepth_));
  }
  logging::logger().info("pipeline stage {} of {} (replica {}): {} tensors received, {} sent per micro-batch; "
                         "{} bytes of activations held per micro-batch in flight, {} at most",
                         groups_.stage, stageCount, groups_.replica, stages_.receives.size(), stages_.sends.size(),
                         savedBytes_, stash_.size());
}

PipelineRun::~PipelineRun() {
  try {
    finishSends();
  } catch (const std::exception &e) {
    logging::logger().warn("pipeline stage {}: a send failed while the session closed: {}", groups_.stage, e.what());
  }
}

std::vector<std::pair<bool, int>> PipelineRun::trainingOrder(int stages, int stage, int microBatches) {
  std::vector<std::pair<bool, int>> order;
  order.reserve(2 * static_cast<size_t>(std::max(microBatches, 0)));
  const int warmUp = std::min(stages - stage - 1, microBatches);
  for (int i = 0; i < warmUp; ++i)
    order.emplace_back(true, i);
  for (int i = 0; i < microBatches; ++i) {
    if (warmUp + i < microBatches) order.emplace_back(true, warmUp + i);
    order.emplace_back(false, i);
  }
  return order;
}

void PipelineRun::receive(bool forward) {
  const Timer timer(counting_, times_.receiving);
  const auto &buffers = incoming_[forward ? 1 : 0];
  const auto &messages = incomingMessages_[forward ? 1 : 0];
  for (size_t i = 0; i < buffers.size(); ++i)
    groups_.stages->recv(buffers[i].first, buffers[i].second, DataType::UINT8, messages[i]->from, messages[i]->tag);
}

void PipelineRun::send(bool forward) {
  const Timer timer(counting_, times_.copying);
  for (Outgoing &o : outgoing_) {
    if (o.message.forward() != forward) continue;
    const size_t slot = static_cast<size_t>(o.sent++ % static_cast<int64_t>(o.requests.size()));
    o.requests[slot].wait(); // the slot's previous message has left
    uint8_t *copy = o.slots.data() + slot * static_cast<size_t>(o.bytes);
    std::memcpy(copy, o.source, static_cast<size_t>(o.bytes));
    o.requests[slot] = groups_.stages->sendAsync(copy, o.bytes, DataType::UINT8, o.message.to, o.message.tag);
  }
}

void PipelineRun::stash(int microBatch) {
  if (stashDepth_ == 0) return;
  const Timer timer(counting_, times_.copying);
  uint8_t *to = stash_.data() + static_cast<size_t>(microBatch % stashDepth_) * static_cast<size_t>(savedBytes_);
  for (const auto &[address, bytes] : saved_) {
    std::memcpy(to, address, static_cast<size_t>(bytes));
    to += bytes;
  }
}

void PipelineRun::restore(int microBatch) {
  if (stashDepth_ == 0) return;
  const Timer timer(counting_, times_.copying);
  const uint8_t *from =
      stash_.data() + static_cast<size_t>(microBatch % stashDepth_) * static_cast<size_t>(savedBytes_);
  for (const auto &[address, bytes] : saved_) {
    std::memcpy(address, from, static_cast<size_t>(bytes));
    from += bytes;
  }
}

void PipelineRun::finishSends() {
  for (Outgoing &o : outgoing_)
    for (comm::Request &r : o.requests)
      r.wait();
}

void PipelineRun::shareAnchors(const std::map<TensorId, IArray &> &outputs) {
  for (const auto &[id, arr] : outputs) {
    auto it = stages_.producerStage.find(id);
    if (it == stages_.producerStage.end()) continue;
    const int64_t bytes = arr.nelms() * static_cast<int64_t>(dataTypeSize(arr.dataType()));
    groups_.stages->broadcast(arr.data(), bytes, DataType::UINT8, it->second);
  }
}

} // namespace popart::session
