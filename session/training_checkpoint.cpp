// TrainingSession's checkpoints: every persistent tensor and the host-side step state in one
// file (a JSON header after a magic and its length, then the raw bytes), written atomically and
// read back only after everything in it has been checked.
//
// A replicated job writes one checkpoint: every replica holds the same weights, running
// statistics (unless each replica keeps its own, ReplicatedStatistics::Local, when rank 0's are
// saved) and optimiser state, so rank 0 writes it and the other ranks skip. The header records the
// replica count. The random state is {seed, counter}: each replica's stream is derived from the
// seed, its replica index and the counter (session::replicaSeed), so those two resume every
// replica, and a checkpoint loads with any replica count.
//
// With replicated tensor sharding each replica holds only its shard of the optimiser state, so
// saving is a collective: the shards are all-gathered and rank 0 writes the whole state, in the
// weight's shape, exactly as an unsharded session would. Loading cuts each replica's shard out of
// the whole state again, so the file does not depend on the replica count or on sharding.

#include "backend_cpu/kernel_families.hpp"
#include "comm/communicator.hpp"
#include "core/log.hpp"
#include "optimizer/sharding.hpp"
#include "session/training_impl.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

namespace popart {

namespace {
constexpr char kCheckpointMagic[8] = {'P', 'O', 'P', 'A', 'R', 'T', 'C', 'K'};
constexpr int kCheckpointVersion = 1;

/// 64-bit FNV-1a of the model bytes: a checkpoint belongs to one model.
uint64_t fingerprint(const std::string &bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

/// The precision mode of \p options as checkpoints record it ("fp32", "fp16.32"...).
std::string precisionMode(const SessionOptions &options) {
  std::string mode = options.precision;
  std::transform(mode.begin(), mode.end(), mode.begin(), [](unsigned char c) { return std::tolower(c); });
  return mode == "fp32.32" ? "fp32" : mode;
}

/// The MatMul and Gemm ways \p plan's timing chose, by configuration, for a checkpoint header.
nlohmann::json tunedWaysToJson(const backend_cpu::ExecutionPlan &plan) {
  nlohmann::json ways = nlohmann::json::object();
  for (const auto &[key, way] : plan.tunedMatMulWays())
    ways[key] = backend_cpu::matMulOperandsName(way);
  return ways;
}

/// \p id without the "__<n>" that ir::Graph::uniqueId appends: the numbers count the tensors the
/// passes made before it, which differ between a replicated graph (its AllReduce ops) and one
/// process's, or with other options, while the name and the position in the checkpoint do not.
std::string withoutUniqueSuffix(const std::string &id) {
  const size_t mark = id.rfind("__");
  if (mark == std::string::npos || mark + 2 == id.size()) return id;
  for (size_t i = mark + 2; i < id.size(); ++i)
    if (id[i] < '0' || id[i] > '9') return id;
  return id.substr(0, mark);
}

/// Writes into \p out this replica's shard (\p l) of the whole state \p whole: its elements
/// [begin, begin + shard), and past the weight's end what \p initial (the state's value at
/// compile; null: zeros) holds there: the padding's gradient is always zero, so its state keeps
/// its initial value (AdaGrad's initial accumulator, zero for the rest) in a run never resumed.
void cutShard(const TensorData &whole, const optimizer::ShardLayout &l, const TensorData *initial, TensorData &out) {
  const auto size = static_cast<int64_t>(dataTypeSize(out.info().dataType()));
  const int64_t inside = std::clamp<int64_t>(l.elements - l.begin, 0, l.shard);
  auto *dst = static_cast<char *>(out.data());
  if (inside > 0)
    std::memcpy(dst, static_cast<const char *>(whole.data()) + l.begin * size, static_cast<size_t>(inside * size));
  const size_t padding = static_cast<size_t>((l.shard - inside) * size);
  if (padding == 0) return;
  if (initial)
    std::memcpy(dst + inside * size, static_cast<const char *>(initial->data()) + inside * size, padding);
  else
    std::memset(dst + inside * size, 0, padding);
}

} // namespace

std::map<TensorId, session::StateShard> TrainingSession::Impl::shardedState() const {
  std::map<TensorId, session::StateShard> sharded;
  for (const auto &u : applied.updates) {
    if (u.shard.empty()) continue;
    optimizer::ShardingOptions options;
    options.replicas = kernelContext.communicator->size();
    options.rank = kernelContext.communicator->rank();
    const TensorInfo &weight = graph->tensor(u.weight).info();
    const optimizer::ShardLayout layout = optimizer::shardLayout(weight.elementCount(), options);
    for (const auto &s : u.state) {
      if (variable(s).info().elementCount() != layout.shard)
        throw error("checkpoint: optimiser state '", s, "' has ", variable(s).info().elementCount(),
                    " elements, expected a shard of ", layout.shard, " of weight '", u.weight, "'");
      sharded[s] = {layout, weight.shape()};
    }
  }
  return sharded;
}

void TrainingSession::saveCheckpoint(const std::string &path) const {
  const Impl &m = *impl_;
  if (!m.plan) throw error("saveCheckpoint: call prepareDevice() first");
  if (m.pipelineGroups)
    throw error("saveCheckpoint: checkpoints of pipelined sessions are not supported yet (each stage holds its own "
                "weights; readWeights gives them per stage)");
  const auto &communicator = m.kernelContext.communicator;
  const std::map<TensorId, session::StateShard> sharded = m.shardedState();
  const bool writer = !communicator || communicator->rank() == 0;
  // Without shards this is not a collective: a caller that reads the file on other ranks
  // synchronises them after this. With shards every rank takes part in the gathers.
  if (!writer && sharded.empty()) return;
  const std::vector<TensorId> ids = m.persistentIds();
  auto savedInfo = [&](const TensorId &id) {
    const TensorInfo &info = m.variable(id).info();
    auto shard = sharded.find(id);
    return shard == sharded.end() ? info : TensorInfo(info.dataType(), shard->second.wholeShape);
  };
  nlohmann::json header;
  header["version"] = kCheckpointVersion;
  header["model"] = std::to_string(fingerprint(m.model.bytes));
  header["optimizer"] = m.optimizer->name();
  header["precision"] = precisionMode(m.options);
  header["step"] = m.step;
  header["skipped"] = m.skipped;
  header["goodSteps"] = m.goodSteps;
  header["lossScale"] = m.lossScale;
  header["histogramBelow"] = m.histogramBelow;
  header["histogramUpper"] = m.histogramUpper;
  header["periodSteps"] = m.periodSteps;
  header["seed"] = std::to_string(m.seed);
  header["rngCounter"] = m.rngCounter;
  header["replicas"] = communicator ? communicator->size() : 1;
  header["matmulWays"] = tunedWaysToJson(*m.plan);
  int64_t offset = 0;
  for (const auto &id : ids) {
    const TensorInfo info = savedInfo(id);
    header["tensors"].push_back({{"id", id},
                                 {"type", toString(info.dataType())},
                                 {"shape", info.shape()},
                                 {"offset", offset},
                                 {"bytes", info.byteCount()}});
    offset += info.byteCount();
  }
  const std::string h = header.dump();
  const std::string tmp = path + ".tmp";
  // The writer streams the tensors out, gathering each sharded one when its turn comes (one
  // whole state tensor in memory at a time, on every rank: an all-gather). A failure on the writer does not leave the
  // gathers: the other ranks would wait in them; it is reported once they are done.
  std::string failure;
  std::ofstream out;
  if (writer) {
    out.open(tmp, std::ios::binary | std::ios::trunc);
    if (!out) failure = "cannot write '" + tmp + "'";
    const uint64_t n = h.size();
    out.write(kCheckpointMagic, sizeof kCheckpointMagic);
    out.write(reinterpret_cast<const char *>(&n), sizeof n);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
  }
  for (const auto &id : ids) {
    const TensorData &d = m.variable(id);
    auto shard = sharded.find(id);
    if (shard == sharded.end()) {
      if (writer) out.write(static_cast<const char *>(d.data()), static_cast<std::streamsize>(d.byteCount()));
      continue;
    }
    const optimizer::ShardLayout &l = shard->second.layout;
    TensorData gathered(TensorInfo(d.info().dataType(), {l.padded}));
    communicator->allGather(d.data(), gathered.data(), l.shard, d.info().dataType());
    if (writer) // the padding past the weight's end is left out
      out.write(static_cast<const char *>(gathered.data()),
                static_cast<std::streamsize>(l.elements * static_cast<int64_t>(dataTypeSize(d.info().dataType()))));
  }
  if (writer) {
    if (failure.empty() && !out.flush()) failure = "writing '" + tmp + "' failed (disk full?)";
    out.close();
    std::error_code ec;
    if (failure.empty()) std::filesystem::rename(tmp, path, ec);
    if (ec) failure = "cannot rename '" + tmp + "' to '" + path + "': " + ec.message();
  }
  if (sharded.empty()) {
    if (!failure.empty()) throw error("saveCheckpoint: ", failure);
    return;
  }
  // A collective ends alike on every rank: all of them learn whether rank 0 wrote the file (and,
  // on a shared file system, may read it once this returns).
  int32_t written = failure.empty() ? 1 : 0;
  communicator->broadcast(&written, 1, DataType::INT32, 0);
  if (writer && !failure.empty()) throw error("saveCheckpoint: rank 0 of ", communicator->size(), ": ", failure);
  if (!written)
    throw error("saveCheckpoint: rank ", communicator->rank(), " of ", communicator->size(),
                ": rank 0 could not write '", path, "'");
}

void TrainingSession::loadCheckpoint(const std::string &path) {
  Impl &m = *impl_;
  if (m.pipelineGroups) throw error("loadCheckpoint: checkpoints of pipelined sessions are not supported yet");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw error("loadCheckpoint: cannot open '", path, "'");
  const auto fileSize = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  char magic[sizeof kCheckpointMagic];
  uint64_t n = 0;
  in.read(magic, sizeof magic);
  in.read(reinterpret_cast<char *>(&n), sizeof n);
  // A header length past the end of the file is refused before it is allocated.
  if (!in || std::memcmp(magic, kCheckpointMagic, sizeof magic) != 0 || n > (1u << 30) ||
      n > fileSize - sizeof magic - sizeof n)
    throw error("loadCheckpoint: '", path, "' is not a checkpoint");
  std::string h(n, '\0');
  in.read(h.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h);
  } catch (const std::exception &e) {
    throw error("loadCheckpoint: '", path, "' has a corrupt header: ", e.what());
  }
  try {
    m.adoptTunedWays(header);
  } catch (const std::exception &e) {
    throw error("loadCheckpoint: '", path, "' has malformed MatMul ways: ", e.what());
  }
  prepareDevice();
  try {
    if (header.at("version").get<int>() != kCheckpointVersion)
      throw error("version ", header.at("version").get<int>(), " (expected ", kCheckpointVersion, ")");
    if (header.at("model").get<std::string>() != std::to_string(fingerprint(m.model.bytes)))
      throw error("it was written for a different model");
    if (header.at("optimizer").get<std::string>() != m.optimizer->name())
      throw error("it holds ", header.at("optimizer").get<std::string>(), " state, the session uses ",
                  m.optimizer->name());
    // Checkpoints from before the precision modes are fp32 ones.
    std::string precision = header.value("precision", std::string("fp32"));
    if (precision != precisionMode(m.options))
      throw error("it was written in precision mode ", precision, ", the session uses ", precisionMode(m.options),
                  " (its weights and optimiser state have other types; resume in ", precision,
                  ", or start a new run from the model modelToHost wrote)");
    // Checkpoints from before replication are those of one process.
    const int written = header.value("replicas", 1);
    const int replicas = m.kernelContext.communicator ? m.kernelContext.communicator->size() : 1;
    // The file holds whole optimiser state whatever wrote it: a sharded session cuts its shard out.
    const std::map<TensorId, session::StateShard> sharded = m.shardedState();
    std::vector<TensorId> ids = m.persistentIds();
    const auto &tensors = header.at("tensors");
    if (tensors.size() != ids.size())
      throw error("it holds ", tensors.size(), " tensors, the session has ", ids.size());
    std::vector<TensorData> values;
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto &t = tensors[i];
      const TensorData &d = m.variable(ids[i]);
      auto shard = sharded.find(ids[i]);
      const TensorInfo whole =
          shard == sharded.end() ? d.info() : TensorInfo(d.info().dataType(), shard->second.wholeShape);
      const std::string saved = t.at("id").get<std::string>();
      if (saved != ids[i] && withoutUniqueSuffix(saved) != withoutUniqueSuffix(ids[i]))
        throw error("tensor ", i, " is '", t.at("id").get<std::string>(), "', expected '", ids[i], "'");
      if (t.at("shape").get<Shape>() != whole.shape() || t.at("type").get<std::string>() != toString(whole.dataType()))
        throw error("tensor '", ids[i], "' is ", t.at("type").get<std::string>(), " ",
                    toString(t.at("shape").get<Shape>()), ", the session has ", whole.toString());
      TensorData v(whole);
      in.read(static_cast<char *>(v.data()), static_cast<std::streamsize>(v.byteCount()));
      if (!in) throw error("it is truncated in tensor '", ids[i], "'");
      if (shard != sharded.end()) {
        TensorData cut(d.info());
        auto initial = m.initialValues.find(ids[i]);
        cutShard(v, shard->second.layout, initial == m.initialValues.end() ? nullptr : initial->second.get(), cut);
        v = std::move(cut);
      }
      values.push_back(std::move(v));
    }
    // The step state too is read and checked before anything changes.
    const auto step = header.at("step").get<int64_t>();
    const auto skipped = header.at("skipped").get<int64_t>();
    const auto goodSteps = header.at("goodSteps").get<int64_t>();
    const auto lossScale = header.at("lossScale").get<float>();
    // Checkpoints from before the histogram method of loss scaling start a new period.
    const auto histogramBelow = header.value("histogramBelow", int64_t{0});
    const auto histogramUpper = header.value("histogramUpper", int64_t{0});
    const auto periodSteps = header.value("periodSteps", int64_t{0});
    const auto seedText = header.at("seed").get<std::string>();
    const auto rngCounter = header.at("rngCounter").get<int64_t>();
    uint64_t seed = 0;
    const auto parsed = std::from_chars(seedText.data(), seedText.data() + seedText.size(), seed);
    if (parsed.ec != std::errc() || parsed.ptr != seedText.data() + seedText.size())
      throw error("its seed '", seedText, "' is not an unsigned 64-bit integer");
    // Everything read and checked: only now change the session.
    for (size_t i = 0; i < ids.size(); ++i)
      std::memcpy(m.variable(ids[i]).data(), values[i].data(), static_cast<size_t>(values[i].byteCount()));
    m.step = step;
    m.skipped = skipped;
    m.goodSteps = goodSteps;
    m.lossScale = lossScale;
    m.histogramBelow = histogramBelow;
    m.histogramUpper = histogramUpper;
    m.periodSteps = periodSteps;
    m.seed = seed;
    m.rngCounter = rngCounter;
    if (written != replicas)
      logging::logger().info("loadCheckpoint: '{}' was written by {} replica(s) and resumes on {}: the weights, "
                             "running statistics and optimiser state are whole (a sharded session cuts its shards) and "
                             "carry over; each replica draws "
                             "from its own stream from the same seed and counter on",
                             path, written, replicas);
  } catch (const nlohmann::json::exception &e) {
    throw error("loadCheckpoint: '", path, "' has a malformed header: ", e.what());
  } catch (const error &e) {
    throw error("loadCheckpoint: '", path, "': ", e.what());
  }
}

void TrainingSession::Impl::adoptTunedWays(const nlohmann::json &header) {
  auto recorded = header.find("matmulWays");
  if (recorded == header.end() || kernelContext.matmulOperands != backend_cpu::MatMulOperands::Auto) return;
  if (header.value("model", std::string()) != std::to_string(fingerprint(model.bytes))) return; // refused later
  std::map<std::string, backend_cpu::MatMulOperands> ways;
  for (const auto &[key, name] : recorded->items())
    ways[key] = backend_cpu::matMulOperandsNamed(name.get<std::string>());
  bool differs = false;
  if (plan)
    for (const auto &[key, way] : ways) {
      auto taken = plan->tunedMatMulWays().find(key);
      differs = differs || (taken != plan->tunedMatMulWays().end() && taken->second != way);
    }
  kernelContext.matmulTuning->preset(ways);
  if (!differs) return;
  logging::logger().info("recompiling with the MatMul ways the checkpoint recorded");
  plan.reset();
  runningStats.clear(); // compile() finds them again
  compile();
  resetState();
}

} // namespace popart
