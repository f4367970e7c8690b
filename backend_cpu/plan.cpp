#include "backend_cpu/plan.hpp"
#include "core/half.hpp"
#include "core/log.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <malloc.h>
#include <omp.h>
#include <set>
#include <sstream>

namespace popart::backend_cpu {

namespace {
constexpr int64_t kAlignment = 64;
int64_t alignUp(int64_t v) { return (v + kAlignment - 1) / kAlignment * kAlignment; }
bool planned(const ir::Tensor &t) {
  return (t.kind() == ir::TensorKind::Stream || t.kind() == ir::TensorKind::ActGrad) && t.info().isTensor();
}
} // namespace

MemoryPlan planMemory(const std::vector<ir::Op *> &schedule, const std::vector<TensorId> &pinned,
                      const ir::Graph &graph, const std::map<TensorId, TensorId> &aliases,
                      const std::map<TensorId, TensorId> &views, const std::vector<int64_t> &scratch,
                      const std::map<TensorId, int64_t> &sizes) {
  struct Interval {
    TensorId id;
    int64_t bytes;
    size_t first, last;
    int64_t scratchStep = -1; ///< a step's scratch rather than a tensor
  };
  std::map<TensorId, Interval> live;
  size_t end = schedule.size();
  auto touch = [&](const ir::Tensor &tensor, size_t step) {
    auto view = views.find(tensor.id());
    const ir::Tensor &t = view == views.end() ? tensor : graph.tensor(view->second);
    if (!planned(t) || aliases.count(t.id())) return;
    auto size = sizes.find(t.id());
    int64_t bytes = size == sizes.end() ? t.info().byteCount() : size->second;
    auto [it, inserted] = live.try_emplace(t.id(), Interval{t.id(), alignUp(std::max<int64_t>(bytes, 1)), step, step});
    it->second.first = std::min(it->second.first, step);
    it->second.last = std::max(it->second.last, step);
  };
  for (size_t s = 0; s < schedule.size(); ++s) {
    for (const ir::Tensor *t : schedule[s]->inputs)
      if (t) touch(*t, s);
    for (const ir::Tensor *t : schedule[s]->outputs)
      if (t) touch(*t, s);
  }
  for (const auto &id : pinned) {
    const ir::Tensor &t = graph.tensor(id);
    if (!planned(t) || aliases.count(id)) continue;
    touch(t, 0);
    touch(t, end);
    live.at(id).first = 0;
  }
  std::vector<Interval> order;
  order.reserve(live.size() + scratch.size());
  for (auto &[id, iv] : live)
    order.push_back(iv);
  for (size_t s = 0; s < scratch.size() && s < schedule.size(); ++s)
    if (scratch[s] > 0) order.push_back(Interval{"", alignUp(scratch[s]), s, s, static_cast<int64_t>(s)});
  std::sort(order.begin(), order.end(), [](const Interval &a, const Interval &b) {
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    return a.id != b.id ? a.id < b.id : a.scratchStep < b.scratchStep;
  });
  MemoryPlan plan;
  plan.scratchOffsets.assign(schedule.size(), -1);
  std::vector<std::pair<Interval, int64_t>> placed;
  for (const Interval &iv : order) {
    plan.unsharedBytes += iv.bytes;
    // Blocks of tensors alive at the same time, sorted by offset; take the first gap that fits.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const auto &[other, offset] : placed)
      if (!(other.last < iv.first || iv.last < other.first)) busy.emplace_back(offset, offset + other.bytes);
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto &[b, e] : busy) {
      if (offset + iv.bytes <= b) break;
      offset = std::max(offset, e);
    }
    placed.emplace_back(iv, offset);
    if (iv.scratchStep >= 0)
      plan.scratchOffsets[static_cast<size_t>(iv.scratchStep)] = offset;
    else
      plan.offsets[iv.id] = offset;
    plan.arenaBytes = std::max(plan.arenaBytes, offset + iv.bytes);
  }
  // The step with the most live bytes, by a difference array over the lifetimes (pinned tensors
  // reach one past the last step).
  std::vector<int64_t> delta(end + 2, 0);
  for (const Interval &iv : order) {
    delta[iv.first] += iv.bytes;
    delta[iv.last + 1] -= iv.bytes;
  }
  int64_t liveBytes = 0;
  for (size_t s = 0; s < end; ++s) {
    liveBytes += delta[s];
    if (liveBytes > plan.peakLiveBytes) plan.peakLiveBytes = liveBytes, plan.peakStep = s;
  }
  const std::set<TensorId> pinnedIds(pinned.begin(), pinned.end());
  for (const Interval &iv : order)
    if (iv.first <= plan.peakStep && plan.peakStep <= iv.last)
      plan.peakLive.push_back(LiveBlock{iv.id, iv.bytes, iv.scratchStep, iv.first, iv.last,
                                        iv.scratchStep < 0 && pinnedIds.count(iv.id) != 0});
  // order is already largest first, ties by name
  return plan;
}

std::map<TensorId, TensorId> findViews(const std::vector<ir::Op *> &schedule, const std::vector<TensorId> &pinned,
                                       const std::map<TensorId, TensorId> &aliases) {
  static const std::set<std::string> viewTypes{"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};
  std::set<TensorId> pinnedIds(pinned.begin(), pinned.end());
  std::map<TensorId, TensorId> views;
  for (const ir::Op *op : schedule) {
    if (op->domain != "ai.onnx" || !viewTypes.count(op->type) || !op->hasInput(0) || !op->hasOutput(0)) continue;
    const ir::Tensor &in = op->input(0), &out = op->output(0);
    if (!planned(in) || !planned(out) || pinnedIds.count(out.id())) continue;
    if (aliases.count(in.id()) || aliases.count(out.id())) continue;
    if (in.info().byteCount() != out.info().byteCount() || in.info().dataType() == DataType::STRING) continue;
    auto root = views.find(in.id());
    views[out.id()] = root == views.end() ? in.id() : root->second;
  }
  return views;
}

namespace {
/// The step of a view op: its output already is its input's bytes.
class NoOpKernel : public Kernel {
public:
  void run(const KernelArgs &) override {}
};

/// Adjacent steps whose kernels split into independent ranges (Kernel::rangeElements: the
/// optimiser updates), run as one step: all their elements, end to end, are cut into one
/// contiguous share per thread in one parallel region, so small updates do not run one after
/// another on one thread and each thread streams through memory in order.
class MergedRangesKernel : public Kernel {
public:
  struct Member {
    std::unique_ptr<Kernel> kernel;
    const KernelArgs *args;
  };
  explicit MergedRangesKernel(std::vector<Member> members) : members_(std::move(members)) {
    starts_.push_back(0);
    for (const Member &m : members_)
      starts_.push_back(starts_.back() + m.kernel->rangeElements());
  }
  void run(const KernelArgs &) override {
    const int64_t total = starts_.back();
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t begin = total * t / threads, end = total * (t + 1) / threads;
      // The members overlapping [begin, end), each for its part of it.
      auto m = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1);
      for (; m < members_.size() && starts_[m] < end; ++m) {
        int64_t b = std::max(begin, starts_[m]) - starts_[m], e = std::min(end, starts_[m + 1]) - starts_[m];
        if (b < e) members_[m].kernel->runRange(*members_[m].args, b, e);
      }
    }
  }

private:
  std::vector<Member> members_;
  std::vector<int64_t> starts_; ///< first element of each member in the merged range, then the total
};
} // namespace

namespace {

/// Bytes of heap in use, as glibc counts them (small chunks and mmapped blocks).
int64_t heapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

} // namespace

ExecutionPlan::ExecutionPlan(const ir::Graph &graph, const CompileOptions &options, const KernelContext &context)
    : arena_(alignedBytes(1)), collectives_(context.collectives) {
  const int64_t heapAtStart = heapInUse();
  // A plan whose largest tensor and stored data alone pass the limit is refused before any kernel
  // is made: kernels size their tables and scratch from their tensors (a Tile of 10^18 elements
  // failed in its constructor). The arena holds at least the largest tensor.
  if (options.checkMemory) {
    PlannedMemory lower;
    const int64_t most = std::numeric_limits<int64_t>::max();
    for (const auto &[id, t] : graph.tensors()) {
      if (!t->info().isTensor()) continue;
      if (!planned(*t)) {
        if (t->data())
          (t->kind() == ir::TensorKind::Variable ? lower.variableBytes : lower.constBytes) += t->data()->byteCount();
        continue;
      }
      const Shape &shape = t->info().shape();
      if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; }))
        throw error("tensor '", id, "' has shape ", toString(shape), ": a dimension is unknown (negative) at compile");
      const int64_t n = shapeElementCount(shape);
      const auto width = static_cast<int64_t>(dataTypeSize(t->info().dataType()));
      const int64_t bytes = width > 0 && n > most / width ? most : n * width;
      if (bytes > lower.arenaBytes) {
        lower.arenaBytes = bytes;
        lower.largestTensor = id;
      }
    }
    options.checkMemory(lower);
  }
  std::vector<ir::Op *> schedule = graph.schedule();
  std::vector<TensorId> pinned = graph.inputs();
  pinned.insert(pinned.end(), graph.outputs().begin(), graph.outputs().end());
  // Outputs of in-place updates share their Variable's storage.
  std::map<TensorId, TensorId> aliases;
  for (const ir::Op *op : schedule)
    for (const ir::OpDef::InPlace &m : op->def->modifies) {
      if (!op->hasOutput(static_cast<size_t>(m.output))) continue;
      const ir::Tensor &in = op->input(static_cast<size_t>(m.input));
      auto root = aliases.find(in.id());
      const TensorId &rootId = root == aliases.end() ? in.id() : root->second;
      if (graph.tensor(rootId).kind() != ir::TensorKind::Variable || !graph.tensor(rootId).data())
        throw error(op->debugName(), ": updates tensor '", in.id(), "' in place, which is not a variable");
      aliases[op->output(static_cast<size_t>(m.output)).id()] = rootId;
    }
  const std::map<TensorId, TensorId> views = findViews(schedule, pinned, aliases);
  // Kernels first: the memory plan places their scratch too.
  registerBuiltinKernels();
  std::vector<int64_t> scratch;
  for (const ir::Op *op : schedule) {
    for (const ir::Tensor *t : op->outputs)
      if (t && t->info().dataType() == DataType::STRING)
        throw error(op->debugName(), ": STRING tensors are supported only where they can be computed at compile time");
    Step step;
    const KernelChoice choice = KernelRegistry::instance().choose(*op, options.provider);
    bool isView = op->hasOutput(0) && views.count(op->output(0).id());
    if (!isView && !choice.entry) createKernel(*op, options.provider, context); // throws naming the op
    step.kernel = isView ? std::make_unique<NoOpKernel>() : createKernel(*choice.entry, *op, context);
    if (!choice.declined.empty()) logging::logger().debug("{}: {}", op->debugName(), choice.explanation());
    std::string detail = step.kernel->choice();
    std::string kernelText = isView ? "view of its input (no kernel)" : choice.explanation();
    if (!detail.empty()) kernelText.insert(std::strlen(kernelProviderName(choice.entry->provider)), ", " + detail);
    stepKernels_.push_back(std::move(kernelText));
    scratch.push_back(step.kernel->scratchBytes());
    stepProviders_.push_back(choice.entry ? choice.entry->provider : KernelProvider::Reference);
    stepNames_.push_back(op->debugName());
    stepOps_.push_back(op->debugName());
    stepOutputs_.emplace_back();
    for (const ir::Tensor *t : op->outputs)
      if (t) stepOutputs_.back().push_back(t->id());
    stepPhases_.push_back(op->phase);
    StepInfo info;
    info.name = op->debugName();
    info.type = op->domain == "ai.onnx" ? op->type : op->domain + "." + op->type;
    info.phase = op->phase;
    info.flops = ir::estimateFlops(*op); // the op definition's flops hook
    for (const ir::Tensor *t : op->inputs)
      if (t) info.bytes += t->info().byteCount();
    for (const ir::Tensor *t : op->outputs)
      if (t) info.bytes += t->info().byteCount();
    stepInfos_.push_back(std::move(info));
    steps_.push_back(std::move(step));
  }
  if (context.matmulTuning) tunedMatMulWays_ = context.matmulTuning->entries();
  std::map<TensorId, TensorId> shared = views;
  for (const auto &[out, in] : findInPlace(schedule, pinned, aliases, views))
    shared[out] = in;
  // Every entry names its final root (a view of an in-place output shares the input's bytes).
  for (auto &[id, root] : shared)
    for (auto next = shared.find(root); next != shared.end(); next = shared.find(root))
      root = next->second;
  // Layouts first: a blocked layout may pad the channels, and the memory plan sizes the tensor so.
  std::map<TensorId, int64_t> layoutBytes = agreeLayouts(schedule, pinned, aliases, shared);
  memoryPlan_ = planMemory(schedule, pinned, graph, aliases, shared, scratch, layoutBytes);
  // The kernels' creation (oneDNN's primitive descriptors, the MatMul tuning's trial buffers)
  // leaves freed pages resident in the heap; returned before the arena is touched, they are not
  // counted twice in the peak RSS (BERT-mini training: 90 MB).
  malloc_trim(0);
  for (const auto &[id, t] : graph.tensors())
    if (t->info().isTensor() && !shared.count(id) && !aliases.count(id) && !planned(*t) && t->data())
      (t->kind() == ir::TensorKind::Variable ? variableBytes_ : constBytes_) += t->data()->byteCount();
  if (options.checkMemory)
    options.checkMemory(
        {memoryPlan_.arenaBytes, std::max<int64_t>(0, heapInUse() - heapAtStart), constBytes_, variableBytes_, {}});
  arena_ = alignedBytes(static_cast<size_t>(memoryPlan_.arenaBytes));
  for (const auto &[id, t] : graph.tensors()) {
    if (!t->info().isTensor()) {
      // Sequences and optionals live on the host, one object per tensor, owned by the plan.
      sequences_.push_back(std::make_unique<SequenceData>());
      addresses_[id] = sequences_.back().get();
    } else if (auto v = shared.find(id); v != shared.end()) {
      addresses_[id] = arena_.get() + memoryPlan_.offsets.at(v->second);
    } else if (auto a = aliases.find(id); a != aliases.end()) {
      addresses_[id] = graph.tensor(a->second).data()->data();
    } else if (planned(*t)) {
      auto it = memoryPlan_.offsets.find(id);
      if (it != memoryPlan_.offsets.end()) addresses_[id] = arena_.get() + it->second;
    } else if (t->data()) {
      addresses_[id] = t->data()->data();
      keepAlive_.push_back(t->data());
      constData_[id] = t->data().get();
    }
    infos_[id] = t->info();
  }
  for (size_t s = 0; s < schedule.size(); ++s) {
    Step &step = steps_[s];
    for (const ir::Tensor *t : schedule[s]->inputs)
      step.inputs.push_back(t ? address(t->id()) : nullptr);
    for (const ir::Tensor *t : schedule[s]->outputs)
      step.outputs.push_back(t ? address(t->id()) : nullptr);
  }
  for (const auto &[out, in] : shared)
    if (!views.count(out)) inPlace_.push_back(out);
  roots_ = shared;
  for (const auto &[id, offset] : memoryPlan_.offsets) {
    auto padded = layoutBytes.find(id);
    storedBytes_[id] = padded != layoutBytes.end() ? padded->second : graph.tensor(id).info().byteCount();
  }
  for (size_t s = 0; s < steps_.size(); ++s) {
    Step &step = steps_[s];
    int64_t offset = memoryPlan_.scratchOffsets[s];
    step.args = {step.inputs.data(), step.inputs.size(), step.outputs.data(), step.outputs.size(),
                 offset >= 0 ? arena_.get() + offset : nullptr};
  }
  if (options.mergeUpdates) mergeRangeSteps();
  kernelBytes_ = std::max<int64_t>(0, heapInUse() - heapAtStart - memoryPlan_.arenaBytes);
  logging::logger().debug("compiled {} ops; arena {} bytes ({} without sharing); {} outputs in place; kernels {} bytes",
                          steps_.size(), memoryPlan_.arenaBytes, memoryPlan_.unsharedBytes, inPlace_.size(),
                          kernelBytes_);
}

void ExecutionPlan::mergeRangeSteps() {
  for (size_t first = 0; first < steps_.size();) {
    size_t end = first;
    while (end < steps_.size() && steps_[end].kernel->rangeElements() > 0 && stepPhases_[end] == stepPhases_[first])
      ++end;
    if (end - first < 2) {
      first = std::max(end, first + 1);
      continue;
    }
    std::vector<MergedRangesKernel::Member> members;
    StepInfo &info = stepInfos_[first];
    for (size_t s = first; s < end; ++s) {
      members.push_back({std::move(steps_[s].kernel), &steps_[s].args});
      steps_[s].kernel = std::make_unique<NoOpKernel>();
      if (s > first) {
        info.flops += stepInfos_[s].flops;
        info.bytes += stepInfos_[s].bytes;
        stepInfos_[s].flops = 0;
        stepInfos_[s].bytes = 0;
        stepNames_[s] += " (merged into step " + std::to_string(first) + ")";
        stepInfos_[s].name = stepNames_[s];
      }
    }
    steps_[first].kernel = std::make_unique<MergedRangesKernel>(std::move(members));
    stepNames_[first] = std::to_string(end - first) + " merged updates from " + stepNames_[first];
    info.name = stepNames_[first];
    logging::logger().debug("steps {}-{} run as one: {}", first, end - 1, stepNames_[first]);
    first = end;
  }
}

std::map<TensorId, TensorId> ExecutionPlan::findInPlace(const std::vector<ir::Op *> &schedule,
                                                        const std::vector<TensorId> &pinned,
                                                        const std::map<TensorId, TensorId> &aliases,
                                                        const std::map<TensorId, TensorId> &views) const {
  // An output may take its input's bytes when the kernel allows it and nothing reads the input,
  // or any tensor sharing its bytes (views, earlier in-place outputs), after this step.
  std::map<TensorId, size_t> lastUse;
  for (size_t s = 0; s < schedule.size(); ++s)
    for (const ir::Tensor *t : schedule[s]->inputs)
      if (t) lastUse[t->id()] = s;
  std::set<TensorId> pinnedIds(pinned.begin(), pinned.end());
  std::map<TensorId, TensorId> rootOf = views, inPlace;
  auto root = [&](const TensorId &id) {
    auto it = rootOf.find(id);
    return it == rootOf.end() ? id : it->second;
  };
  std::map<TensorId, std::vector<TensorId>> sharers; // root → every tensor on its bytes
  for (const auto &[view, r] : views)
    sharers[r].push_back(view);
  for (size_t s = 0; s < schedule.size(); ++s) {
    const ir::Op &op = *schedule[s];
    int k = steps_[s].kernel->inPlaceInput();
    if (k < 0 || !op.hasInput(static_cast<size_t>(k)) || !op.hasOutput(0)) continue;
    const ir::Tensor &in = op.input(static_cast<size_t>(k)), &out = op.output(0);
    if (!planned(in) || !planned(out) || in.info().byteCount() != out.info().byteCount()) continue;
    if (std::count(op.inputs.begin(), op.inputs.end(), &in) != 1) continue;
    if (pinnedIds.count(out.id()) || aliases.count(out.id()) || aliases.count(in.id()) || rootOf.count(out.id()))
      continue;
    TensorId r = root(in.id());
    std::vector<TensorId> onBytes = sharers[r];
    onBytes.push_back(r);
    bool free = std::none_of(onBytes.begin(), onBytes.end(), [&](const TensorId &id) {
      auto use = lastUse.find(id);
      return pinnedIds.count(id) || aliases.count(id) || (use != lastUse.end() && use->second > s);
    });
    if (!free) continue;
    rootOf[out.id()] = r;
    inPlace[out.id()] = r;
    sharers[r].push_back(out.id());
  }
  return inPlace;
}

std::map<TensorId, int64_t> ExecutionPlan::agreeLayouts(const std::vector<ir::Op *> &schedule,
                                                        const std::vector<TensorId> &pinned,
                                                        const std::map<TensorId, TensorId> &aliases,
                                                        const std::map<TensorId, TensorId> &views) {
  std::map<TensorId, int64_t> layoutBytes;
  // A tensor that only its producer and its readers see (not pinned, not a view or a view's
  // root, not an alias) may be kept in a layout they all share: a ResNet block's input, read by
  // its first convolution and as the residual of its last.
  std::set<TensorId> hidden(pinned.begin(), pinned.end());
  for (const auto &[view, root] : views) {
    hidden.insert(view);
    hidden.insert(root);
  }
  std::map<const ir::Op *, size_t> stepOf;
  for (size_t s = 0; s < schedule.size(); ++s)
    stepOf[schedule[s]] = s;
  for (size_t s = 0; s < schedule.size(); ++s)
    for (size_t i = 0; i < schedule[s]->outputs.size(); ++i) {
      const ir::Tensor *t = schedule[s]->outputs[i];
      if (!t || !planned(*t) || hidden.count(t->id()) || aliases.count(t->id()) || t->consumers().empty()) continue;
      TensorLayout layout = steps_[s].kernel->outputLayout(i);
      if (!layout) continue;
      std::vector<std::pair<Kernel *, size_t>> readers; // each reader's kernel and input index
      std::string names;
      for (const ir::Op *reader : t->consumers()) {
        if (std::count(reader->inputs.begin(), reader->inputs.end(), t) != 1) break;
        size_t input =
            static_cast<size_t>(std::find(reader->inputs.begin(), reader->inputs.end(), t) - reader->inputs.begin());
        Kernel *k = steps_[stepOf.at(reader)].kernel.get();
        if (!k->acceptsInputIn(input, layout)) break;
        readers.emplace_back(k, input);
        names += (names.empty() ? "" : ", ") + reader->debugName();
      }
      if (readers.size() != t->consumers().size()) continue;
      for (const auto &[k, input] : readers)
        k->readInputIn(input, layout);
      steps_[s].kernel->writeOutputIn(i);
      agreedLayouts_.push_back(t->id());
      if (layout.bytes > t->info().byteCount()) layoutBytes[t->id()] = layout.bytes; // padded channels
      logging::logger().debug("'{}' stays in the {} layout of {} for {}", t->id(), layout.provider,
                              schedule[s]->debugName(), names);
    }
  return layoutBytes;
}

void *ExecutionPlan::address(const TensorId &id) const {
  auto it = addresses_.find(id);
  if (it == addresses_.end()) throw error("tensor '", id, "' has no buffer in the execution plan");
  return it->second;
}

std::pair<void *, int64_t> ExecutionPlan::arenaStorage(const TensorId &id) const {
  auto root = roots_.find(id);
  const TensorId &r = root == roots_.end() ? id : root->second;
  auto bytes = storedBytes_.find(r);
  if (bytes == storedBytes_.end()) return {nullptr, 0};
  return {arena_.get() + memoryPlan_.offsets.at(r), bytes->second};
}

const TensorInfo &ExecutionPlan::info(const TensorId &id) const {
  auto it = infos_.find(id);
  if (it == infos_.end()) throw error("tensor '", id, "' is not in the execution plan");
  return it->second;
}

const TensorData *ExecutionPlan::constData(const TensorId &id) const {
  auto it = constData_.find(id);
  return it == constData_.end() ? nullptr : it->second;
}

void ExecutionPlan::runStep(size_t i) {
  try {
    steps_.at(i).kernel->run(steps_[i].args);
  } catch (const error &e) {
    throw error(stepNames_[i], ": ", e.what());
  }
}

void ExecutionPlan::run() { run(0, steps_.size()); }

std::pair<size_t, size_t> ExecutionPlan::phaseSteps(int phase) const {
  auto begin = std::lower_bound(stepPhases_.begin(), stepPhases_.end(), phase);
  auto end = std::upper_bound(stepPhases_.begin(), stepPhases_.end(), phase);
  return {static_cast<size_t>(begin - stepPhases_.begin()), static_cast<size_t>(end - stepPhases_.begin())};
}

namespace {
// The clock of the collectives' spans, so that both tracks line up.
int64_t nowNs() { return CollectiveRequests::nowNs(); }
} // namespace

void ExecutionPlan::enableProfiling(size_t maxEvents) {
  profiling_ = true;
  profileStart_ = nowNs();
  if (collectives_) collectives_->enableSpans(profileStart_, maxEvents);
  stepTimes_.assign(steps_.size(), {0, 0});
  events_.clear();
  events_.reserve(maxEvents);
}

void ExecutionPlan::run(size_t begin, size_t end) {
  if (profiling_ || numericChecks_) {
    if (numericChecks_) numericFault_.reset();
    for (size_t i = begin; i < end; ++i) {
      const int64_t t0 = profiling_ ? nowNs() : 0;
      runStep(i);
      // Between kernels the collectives in flight advance (MPI progresses only when asked);
      // the time it takes counts to the step that just ran.
      if (collectives_ && collectives_->inFlight()) pollCollectives(i);
      if (profiling_) {
        int64_t t1 = nowNs();
        stepTimes_[i].first += t1 - t0;
        stepTimes_[i].second += 1;
        if (events_.size() < events_.capacity())
          events_.push_back({static_cast<uint32_t>(i), t0 - profileStart_, t1 - t0});
      }
      if (numericChecks_) checkOutputs(i);
    }
    return;
  }
  for (size_t i = begin; i < end; ++i) {
    try {
      steps_[i].kernel->run(steps_[i].args);
    } catch (const error &e) {
      throw error(stepNames_[i], ": ", e.what());
    }
    if (collectives_ && collectives_->inFlight()) pollCollectives(i);
  }
}

std::string NumericFault::describe() const {
  std::ostringstream os;
  os << "output '" << tensor << "' of " << op << " (" << type << ") holds " << value << " at element " << index
     << (internalLayout ? " (of the kernel's internal layout)" : "");
  return os.str();
}

void ExecutionPlan::enableNumericChecks(const std::set<TensorId> &unchecked) {
  checkedOutputs_.clear();
  checkedBegin_.assign(steps_.size() + 1, 0);
  for (size_t s = 0; s < steps_.size(); ++s) {
    checkedBegin_[s] = checkedOutputs_.size();
    // Its outputs are complete only after the AllReduceWait, which is checked.
    if (stepInfos_[s].type.ends_with("AllReduceStart")) continue;
    for (const TensorId &id : stepOutputs_[s]) {
      const TensorInfo &t = info(id);
      if (!t.isTensor() || !isFloatingPoint(t.dataType()) || unchecked.count(id)) continue;
      const bool internal = std::find(agreedLayouts_.begin(), agreedLayouts_.end(), id) != agreedLayouts_.end();
      // A blocked layout's padding is zeros (oneDNN writes it), so all its stored bytes are scanned.
      const int64_t elements =
          internal ? arenaStorage(id).second / static_cast<int64_t>(dataTypeSize(t.dataType())) : t.elementCount();
      if (elements > 0) checkedOutputs_.push_back({&id, t.dataType(), address(id), elements, internal});
    }
  }
  checkedBegin_[steps_.size()] = checkedOutputs_.size();
  numericChecks_ = true;
  numericFault_.reset();
}

namespace {
// The index of the first element of \p data whose exponent bits (\p mask) are all set, which
// makes it NaN or inf in every IEEE format; -1 if none. Bits are read through memcpy: the buffer
// holds floats, and a uint pointer to it would break aliasing rules.
template <typename Bits> int64_t firstNonFinite(const void *data, int64_t elements, Bits mask) {
  const auto *bytes = static_cast<const uint8_t *>(data);
  for (int64_t i = 0; i < elements; ++i) {
    Bits bits;
    std::memcpy(&bits, bytes + i * static_cast<int64_t>(sizeof(Bits)), sizeof(Bits));
    if ((bits & mask) == mask) return i;
  }
  return -1;
}
} // namespace

void ExecutionPlan::checkOutputs(size_t index) {
  for (size_t c = checkedBegin_[index]; c < checkedBegin_[index + 1]; ++c) {
    const CheckedOutput &out = checkedOutputs_[c];
    int64_t bad = -1;
    double value = 0;
    switch (out.type) {
    case DataType::FLOAT:
      bad = firstNonFinite<uint32_t>(out.data, out.elements, 0x7f800000u);
      if (bad >= 0) value = static_cast<const float *>(out.data)[bad];
      break;
    case DataType::DOUBLE:
      bad = firstNonFinite<uint64_t>(out.data, out.elements, 0x7ff0000000000000u);
      if (bad >= 0) value = static_cast<const double *>(out.data)[bad];
      break;
    case DataType::FLOAT16:
      bad = firstNonFinite<uint16_t>(out.data, out.elements, 0x7c00u);
      if (bad >= 0) value = halfToFloat(static_cast<const uint16_t *>(out.data)[bad]);
      break;
    case DataType::BFLOAT16:
      bad = firstNonFinite<uint16_t>(out.data, out.elements, 0x7f80u);
      if (bad >= 0) value = bfloat16ToFloat(static_cast<const uint16_t *>(out.data)[bad]);
      break;
    default: break;
    }
    if (bad < 0) continue;
    NumericFault fault;
    fault.step = index;
    fault.op = stepOps_[index];
    fault.type = stepInfos_[index].type;
    fault.tensor = *out.id;
    fault.index = bad;
    fault.internalLayout = out.internalLayout;
    fault.value = value;
    numericFault_ = fault;
    throw error("numeric check: ", fault.describe());
  }
}

void ExecutionPlan::pollCollectives(size_t after) {
  try {
    collectives_->progress();
  } catch (const error &e) {
    throw error("advancing the collectives in flight after ", stepNames_[after], ": ", e.what());
  }
}

double estimateFlops(const ir::Op &op) { return ir::estimateFlops(op); }

bool ReferenceEvaluator::canEvaluate(const ir::Op &op) const {
  registerBuiltinKernels();
  for (const ir::Tensor *t : op.outputs)
    if (t && (!t->info().isKnown() || !t->info().isTensor())) return false;
  for (const ir::Tensor *t : op.inputs)
    if (t && !t->info().isTensor()) return false;
  return KernelRegistry::instance().find(op, KernelProvider::Reference) != nullptr;
}

std::vector<TensorData> ReferenceEvaluator::evaluate(const ir::Op &op) const {
  auto kernel = createKernel(op, KernelProvider::Reference);
  std::vector<const void *> in;
  // STRING tensors reach kernels as arrays of std::string.
  for (const ir::Tensor *t : op.inputs)
    in.push_back(!t                                         ? nullptr
                 : t->info().dataType() == DataType::STRING ? static_cast<const void *>(t->data()->strings().data())
                                                            : t->data()->data());
  std::vector<TensorData> outs;
  outs.reserve(op.outputs.size());
  std::vector<void *> out;
  for (const ir::Tensor *t : op.outputs) {
    outs.emplace_back(t ? TensorData(t->info()) : TensorData());
    out.push_back(!t                                         ? nullptr
                  : t->info().dataType() == DataType::STRING ? static_cast<void *>(outs.back().strings().data())
                                                             : outs.back().data());
  }
  kernel->run({in.data(), in.size(), out.data(), out.size()});
  return outs;
}

} // namespace popart::backend_cpu
