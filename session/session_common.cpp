#include "session/session_common.hpp"
#include "backend_cpu/convert.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "comm/mpi_communicator.hpp"
#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "ir/passes/passes.hpp"
#include "session/pipelines.hpp"
#include "session/profile.hpp"
#include "session/threads.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace popart::session {

namespace fs = std::filesystem;

namespace {

/// The first integer in file \p path, or -1 if it holds none ("max" in cgroup v2's memory.max).
int64_t readInteger(const fs::path &path) {
  std::ifstream in(path);
  int64_t value = -1;
  if (!(in >> value)) return -1;
  return value;
}

/// What the cgroup of this process may still allocate, or -1 if it sets no limit (or we cannot tell).
int64_t cgroupRoomBytes() {
  // /proc/self/cgroup names the group: "0::/path" (v2) or "N:memory:/path" (v1).
  std::ifstream groups("/proc/self/cgroup");
  std::string line;
  while (std::getline(groups, line)) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const bool v2 = controllers.empty();
    if (!v2 && controllers.find("memory") == std::string::npos) continue;
    const fs::path root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const char *limitFile = v2 ? "memory.max" : "memory.limit_in_bytes";
    const char *usageFile = v2 ? "memory.current" : "memory.usage_in_bytes";
    // Inside a container the group's own folder is usually mounted as the root itself.
    for (const fs::path &dir : {root / fs::path(line.substr(second + 1)).relative_path(), root})
      if (int64_t limit = readInteger(dir / limitFile); limit >= 0)
        return std::max<int64_t>(0, limit - std::max<int64_t>(0, readInteger(dir / usageFile)));
  }
  return -1;
}

} // namespace

int64_t availableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  int64_t kilobytes = -1;
  std::string line;
  while (std::getline(meminfo, line))
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream(line.substr(13)) >> kilobytes;
      break;
    }
  if (kilobytes < 0) return -1;
  int64_t available = kilobytes * 1024;
  if (int64_t room = cgroupRoomBytes(); room >= 0) available = std::min(available, room);
  return available;
}

backend_cpu::PlannedMemory plannedMemory(const backend_cpu::ExecutionPlan &plan) {
  return {plan.memoryPlan().arenaBytes, plan.kernelBytes(), plan.constBytes(), plan.variableBytes(), {}};
}

std::string arenaPartName(const backend_cpu::PlannedMemory &planned) {
  if (planned.largestTensor.empty()) return "activation arena";
  return "tensor '" + planned.largestTensor + "' alone (the activation arena's least)";
}

void checkMemoryLimit(const MemoryParts &parts, const backend_cpu::PlannedMemory &planned,
                      const SessionOptions &options, const std::string &model) {
  const int64_t held = planned.kernelBytes + planned.constBytes + planned.variableBytes;
  if (options.memoryLimitBytes < 0)
    throw error("SessionOptions.memoryLimitBytes must be 0 (the available RAM) or a byte count, got ",
                options.memoryLimitBytes);
  int64_t total = 0; // saturating: a tensor's size can be near 2^63
  for (const auto &part : parts)
    if (__builtin_add_overflow(total, part.second, &total)) total = std::numeric_limits<int64_t>::max();
  std::string limit;
  if (options.memoryLimitBytes > 0) {
    if (total <= options.memoryLimitBytes) return;
    limit = "the limit of " + megabytes(options.memoryLimitBytes) + " (" + std::to_string(options.memoryLimitBytes) +
            " bytes) set by SessionOptions.memoryLimitBytes (popart-run --memory-limit)";
  } else {
    const int64_t available = availableMemoryBytes();
    if (available < 0 || total <= available + held) return; // nothing known to compare with
    limit = "the default limit, the available RAM: " + megabytes(available) +
            " (MemAvailable, or the cgroup's memory.max) plus the " + megabytes(held) +
            " already allocated; SessionOptions.memoryLimitBytes (popart-run --memory-limit) sets another";
  }
  std::string list;
  for (const auto &part : parts)
    if (part.second > 0) list += (list.empty() ? "" : "; ") + part.first + " " + megabytes(part.second);
  throw error("prepareDevice: the plan of '", model, "' needs ", megabytes(total), " (", total, " bytes: ", list,
              "), above ", limit);
}

ModelSource loadModel(const std::string &model) {
  ModelSource m;
  std::error_code ec;
  bool isPath = model.size() < 4096 && model.find('\0') == std::string::npos && fs::is_regular_file(model, ec);
  if (isPath) {
    std::ifstream in(model, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    m.bytes = ss.str();
    m.sourceName = model;
    std::string dir = fs::path(model).parent_path().string();
    m.baseDir = dir.empty() ? "." : dir;
    return m;
  }
  if (model.size() < 4096 && (model.size() > 5 && model.substr(model.size() - 5) == ".onnx"))
    throw error("model file '", model, "' does not exist");
  m.bytes = model;
  m.sourceName = "<model bytes>";
  m.baseDir = ".";
  return m;
}

TensorInfo resolvedInputInfo(const ir::Graph &declared, const TensorId &id, const InputShapeInfo &shapes,
                             const SessionOptions &options) {
  if (shapes.has(id)) return shapes.get(id);
  TensorInfo info = declared.tensor(id).info();
  Shape s = info.shape();
  if (options.batchSize > 0 && !s.empty() && s[0] < 0) s[0] = options.batchSize;
  info.setShape(s);
  return info;
}

backend_cpu::CompileOptions compileOptions(const SessionOptions &options) {
  backend_cpu::CompileOptions co;
  try {
    co.provider = backend_cpu::kernelProviderFromName(options.kernels);
  } catch (const error &e) {
    throw error("SessionOptions.", e.what());
  }
  co.mergeUpdates = options.fuseOps; // --no-fusion runs the updates op by op too
  return co;
}

ir::PrecisionPolicy precisionPolicy(const SessionOptions &options, bool training) {
  std::string mode = options.precision;
  std::transform(mode.begin(), mode.end(), mode.begin(), [](unsigned char c) { return std::tolower(c); });
  ir::PrecisionPolicy policy;
  if (mode == "fp32" || mode == "fp32.32") return policy;
  if (mode == "fp16.32" || mode == "fp16.16")
    policy.low = DataType::FLOAT16;
  else if (mode == "bf16")
    policy.low = DataType::BFLOAT16;
  else
    throw error("SessionOptions.precision is '", options.precision, "'; expected fp32, fp16.32, fp16.16 or bf16");
  // Inference has no optimiser: its weights are constants, converted where they are read.
  policy.masterWeights = training && mode != "fp16.16";
  policy.halfPartials = mode == "fp16.16";
  return policy;
}

void fuseForInference(ir::Graph &g) {
  registerAllPasses();
  ir::PassContext context;
  context.keep = g.outputs();
  ir::runPipeline("inference", inferencePipeline(), g, context, pipelineOptions(SessionOptions()));
}

void fuseAfterGradients(ir::Graph &g) {
  registerAllPasses();
  const std::vector<std::string> &pipeline = trainingPipeline();
  auto tail = std::find(pipeline.begin(), pipeline.end(), "applyOptimizer");
  if (tail == pipeline.end()) throw error("the training pipeline has no applyOptimizer pass");
  ir::PassContext context;
  context.keep = g.outputs();
  context.training = true;
  context.recurrentSavedBytes = [](const ir::Op &op) { return backend_cpu::recurrentSavedBytes(op); };
  ir::PipelineOptions options = pipelineOptions(SessionOptions());
  options.entryStages = ir::stagesAfter({pipeline.begin(), tail + 1});
  ir::runPipeline("training", {tail + 1, pipeline.end()}, g, context, options);
}

backend_cpu::KernelContext kernelContext(const SessionOptions &options) {
  backend_cpu::KernelContext context;
  context.threads = threadCount();
  context.matmulOperands = backend_cpu::parseMatMulTuning(options.matmulTuning);
  if (options.convPoolChunk < 0)
    throw error("SessionOptions.convPoolChunk must be 0 (automatic) or an image count, got ", options.convPoolChunk);
  context.convPoolChunk = options.convPoolChunk;
  if (options.randomSeed < -1)
    throw error("SessionOptions.randomSeed must be -1 (drawn from the system) or a seed, got ", options.randomSeed);
  context.randomSeed = options.randomSeed;
  context.matmulTuning = std::make_shared<backend_cpu::MatMulTuningCache>();
  return context;
}

std::string kernelReport(const backend_cpu::ExecutionPlan &plan) {
  std::string s;
  for (size_t i = 0; i < plan.stepCount(); ++i)
    s += plan.stepNames()[i] + ": " + plan.stepKernels()[i] + "\n";
  return s;
}

uint64_t replicaSeed(uint64_t seed, int replica) {
  if (replica == 0) return seed;
  // SplitMix64's finaliser over the replica index, then over its sum with the seed: neighbouring
  // seeds and neighbouring replicas land far apart.
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(seed + mix(static_cast<uint64_t>(replica) * 0x9e3779b97f4a7c15ULL));
}

std::string joinIds(const std::vector<TensorId> &ids) {
  std::string s;
  for (const auto &i : ids)
    s += (s.empty() ? "" : ", ") + i;
  return s;
}

void checkInputArray(const TensorId &id, const IArray &arr, const TensorInfo &info, const Shape &prefix) {
  if (arr.dataType() != info.dataType())
    throw error("input '", id, "' has type ", toString(arr.dataType()), " but the model expects ",
                toString(info.dataType()));
  Shape expected = prefix;
  expected.insert(expected.end(), info.shape().begin(), info.shape().end());
  if (arr.shape() != expected)
    throw error("input '", id, "' has shape ", toString(arr.shape()), " but the step needs ", toString(expected),
                prefix.empty() ? "" : " (leading dimensions: batches per step, accumulation factor)");
}

Shape anchorShape(const AnchorReturnType &art, const TensorInfo &info, const Shape &prefix, int count) {
  Shape s;
  switch (art.id()) {
  case AnchorReturnTypeId::All: s = prefix; break;
  case AnchorReturnTypeId::EveryN:
    if (count / art.rp() > 1) s = {count / art.rp()};
    break;
  case AnchorReturnTypeId::Final:
  case AnchorReturnTypeId::Sum: break;
  }
  s.insert(s.end(), info.shape().begin(), info.shape().end());
  return s;
}

TensorInfo Streams::hostInfo(const TensorId &id, const TensorInfo &device) const {
  auto it = host.find(id);
  return it == host.end() ? device : TensorInfo(it->second, device.shape());
}

void Streams::copyIn(const TensorId &id, const TensorInfo &device, const void *src, void *dst) const {
  auto it = host.find(id);
  if (it == host.end())
    std::memcpy(dst, src, static_cast<size_t>(device.byteCount()));
  else
    backend_cpu::convertElements(it->second, src, device.dataType(), dst, device.elementCount());
}

void writeAnchor(const AnchorReturnType &art, const TensorInfo &info, DataType deviceType, const void *src, IArray &arr,
                 int b, int count) {
  int64_t bytes = info.byteCount();
  if (bytes == 0) return; // empty anchors: the user's buffer may be null
  auto *dst = static_cast<uint8_t *>(arr.data());
  const int64_t n = info.elementCount();
  auto copy = [&](uint8_t *to) { backend_cpu::convertElements(deviceType, src, info.dataType(), to, n); };
  switch (art.id()) {
  case AnchorReturnTypeId::All: copy(dst + b * bytes); break;
  case AnchorReturnTypeId::Final:
    if (b == count - 1) copy(dst);
    break;
  case AnchorReturnTypeId::EveryN:
    if ((b + 1) % art.rp() == 0) copy(dst + ((b + 1) / art.rp() - 1) * bytes);
    break;
  case AnchorReturnTypeId::Sum:
    if (b == 0) {
      copy(dst);
      break;
    }
    if (deviceType != info.dataType()) { // a 16-bit device value summed into a FLOAT host buffer
      auto *d = reinterpret_cast<float *>(dst);
      const auto *s = static_cast<const uint16_t *>(src);
      for (int64_t i = 0; i < n; ++i)
        d[i] += deviceType == DataType::BFLOAT16 ? bfloat16ToFloat(s[i]) : halfToFloat(s[i]);
      break;
    }
    dispatchNumeric(info.dataType(), "SUM anchor", [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto *d = reinterpret_cast<T *>(dst);
      const auto *s = static_cast<const T *>(src);
      for (int64_t i = 0; i < n; ++i)
        d[i] = static_cast<T>(static_cast<compute_t<T>>(d[i]) + static_cast<compute_t<T>>(s[i]));
    });
    break;
  }
}

std::shared_ptr<comm::Communicator> replicationCommunicator(const SessionOptions &options) {
  const ReductionType reduction = options.accumulationAndReplicationReductionType;
  if (reduction != ReductionType::Mean && reduction != ReductionType::Sum)
    throw error("SessionOptions.accumulationAndReplicationReductionType must be Mean or Sum, got ",
                reduction == ReductionType::NoReduction ? "NoReduction" : "an unknown value");
  if (!options.enableReplicatedGraphs) {
    if (options.replicatedGraphCount != 1)
      throw error("SessionOptions.replicatedGraphCount is ", options.replicatedGraphCount,
                  " but enableReplicatedGraphs is false");
    if (options.communicator) throw error("SessionOptions.communicator is set but enableReplicatedGraphs is false");
    return nullptr;
  }
  if (options.replicatedGraphCount < 1)
    throw error("SessionOptions.replicatedGraphCount must be at least 1, got ", options.replicatedGraphCount);
  std::shared_ptr<comm::Communicator> communicator =
      options.communicator ? options.communicator : std::make_shared<comm::MpiCommunicator>();
  if (communicator->size() != options.replicatedGraphCount)
    throw error("SessionOptions.replicatedGraphCount is ", options.replicatedGraphCount, " but the communicator has ",
                communicator->size(), " ranks",
                options.communicator ? "" : " (MPI_COMM_WORLD: start one process per replica, mpirun -np <count>)");
  return communicator;
}

void throwIfNumericFault(const backend_cpu::ExecutionPlan &plan, int64_t step) {
  const std::optional<backend_cpu::NumericFault> &fault = plan.numericFault();
  if (fault)
    throw error("floating-point check failed at step ", step, ": ", fault->describe(),
                " (SessionOptions::enableFloatingPointChecks)");
}

} // namespace popart::session
