// TrainingSession's checkpoints: every persistent tensor and the host-side step state in one
// file, written durably (temporary file, fsync, rename, fsync of the folder) and read back only
// after everything in it has been checked.
//
// Format 2, integers as little-endian uint64:
//   [0, 8)        magic "POPARTCK"
//   [8, 16)       format version (2; in format 1 this was the header's length, always > 2)
//   [16, 24)      M, the file's size in bytes
//   [24, 32)      n, the JSON header's length
//   [32, 32 + n)  the JSON header (step state, and each tensor's id, type, shape, offset, bytes)
//   then          the tensors' raw bytes, back to back in the header's order
//   [M - 8, M)    64-bit FNV-1a of bytes [8, M - 8): every byte after the magic
// The size and the checksum are checked before the header is parsed, so a truncated, extended or
// corrupted file is refused as such before anything in it is believed. Format 1 (magic, n, header,
// tensors: no size, no checksum) is still read.
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
#include "session/checkpoint_file.hpp"
#include "session/training_impl.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

namespace popart {

namespace {
constexpr char kCheckpointMagic[8] = {'P', 'O', 'P', 'A', 'R', 'T', 'C', 'K'};
constexpr int kCheckpointVersion = 2;
/// Format 2's fixed part: magic, version, file size, header length.
constexpr uint64_t kPreambleBytes = 32;
constexpr uint64_t kChecksumBytes = 8;
/// The largest JSON header a loader accepts (a malformed length must not allocate gigabytes).
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 30;

/// A hash of the model bytes: a checkpoint belongs to one model. FNV-1a 64 from a start value that
/// lacks the offset basis's last digit: kept, as the header's "model" of every checkpoint written
/// so far is this value.
uint64_t fingerprint(const std::string &bytes) {
  constexpr uint64_t kModelHashStart = 1469598103934665603ull;
  return session::fnv1a64(bytes.data(), bytes.size(), kModelHashStart);
}

uint64_t readWord(const char *at) {
  uint64_t v = 0;
  std::memcpy(&v, at, sizeof v);
  return v;
}

/// Where a checked checkpoint file's parts are.
struct CheckpointLayout {
  int version = 0;
  uint64_t headerOffset = 0, headerBytes = 0;
  uint64_t dataEnd = 0; ///< one past the last tensor byte
};

/// Checks \p path's magic, version, size and (format 2) checksum, before anything in it is parsed;
/// throws popart::error saying what is wrong (the caller adds the file's name).
CheckpointLayout checkFraming(const std::string &path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw error("cannot read its size: ", ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error("cannot open it");
  char preamble[kPreambleBytes] = {};
  in.read(preamble, static_cast<std::streamsize>(std::min<uint64_t>(size, kPreambleBytes)));
  if (size == 0) throw error("it is empty (0 bytes)");
  const size_t magicSeen = static_cast<size_t>(std::min<uint64_t>(size, sizeof kCheckpointMagic));
  if (std::memcmp(preamble, kCheckpointMagic, magicSeen) != 0)
    throw error("it is not a checkpoint (it does not start with the magic 'POPARTCK')");
  if (size < 16) throw error("it is truncated at byte ", size, " of at least ", kPreambleBytes + kChecksumBytes);
  CheckpointLayout layout;
  const uint64_t word = readWord(preamble + 8);
  if (word == static_cast<uint64_t>(kCheckpointVersion)) {
    layout.version = kCheckpointVersion;
    if (size < kPreambleBytes)
      throw error("it is truncated at byte ", size, " of at least ", kPreambleBytes + kChecksumBytes);
    const uint64_t expected = readWord(preamble + 16);
    if (size < expected) throw error("it is truncated at byte ", size, " of ", expected);
    if (size > expected)
      throw error("it has ", size - expected, " bytes of trailing data after its end at byte ", expected, " (it holds ",
                  size, ")");
    if (expected < kPreambleBytes + kChecksumBytes)
      throw error("its preamble records an impossible size of ", expected, " bytes (a corrupt file)");
    // Every byte after the magic, in chunks: a checkpoint may be larger than the memory to spare.
    std::vector<char> chunk(size_t{1} << 20);
    uint64_t hash = session::kFnv1a64Start;
    in.seekg(8);
    for (uint64_t left = expected - 8 - kChecksumBytes; left > 0;) {
      const auto take = static_cast<std::streamsize>(std::min<uint64_t>(left, chunk.size()));
      if (!in.read(chunk.data(), take)) throw error("reading it failed at byte ", expected - kChecksumBytes - left);
      hash = session::fnv1a64(chunk.data(), static_cast<size_t>(take), hash);
      left -= static_cast<uint64_t>(take);
    }
    char stored[kChecksumBytes];
    if (!in.read(stored, sizeof stored)) throw error("reading its checksum failed");
    if (readWord(stored) != hash)
      throw error("checksum mismatch: the ", expected - 8, " bytes after the magic hash to ", hash,
                  ", the file records ", readWord(stored), " (a corrupt file: a flipped bit, or an interrupted copy)");
    layout.headerOffset = kPreambleBytes;
    layout.headerBytes = readWord(preamble + 24);
    layout.dataEnd = expected - kChecksumBytes;
    if (layout.headerBytes > layout.dataEnd - layout.headerOffset)
      throw error("its header of ", layout.headerBytes, " bytes does not fit in its ", expected, " bytes");
    return layout;
  }
  // Format 1: the header's length where format 2 has its version, the header right after it.
  if (word > 2 && word <= kMaxHeaderBytes && size > 16 && preamble[16] == '{') {
    if (word > size - 16)
      throw error("it is truncated at byte ", size, ": its format-1 header alone needs ", 16 + word);
    logging::logger().warn("loadCheckpoint: '{}' is in format 1, which has no checksum: it is read unverified (a "
                           "new checkpoint is written in format {})",
                           path, kCheckpointVersion);
    return {1, 16, word, size};
  }
  throw error("it has an unknown format version ", word, " (this build reads formats 1 and ", kCheckpointVersion,
              "; or the file is corrupt)");
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

/// \p value, named \p what in the error, if it is an integer in [lo, hi]. nlohmann's get<int>()
/// converts whatever number the field holds, and a float out of the target's range makes that cast
/// undefined behaviour (a fuzzed header held 4.6e60).
int64_t integerValue(const nlohmann::json &value, const std::string &what, int64_t lo, int64_t hi) {
  bool inRange = false;
  int64_t v = 0;
  if (value.is_number_unsigned()) {
    const auto u = value.get<uint64_t>();
    inRange = u <= static_cast<uint64_t>(hi);
    v = inRange ? static_cast<int64_t>(u) : 0;
  } else if (value.is_number_integer()) {
    v = value.get<int64_t>();
    inRange = true;
  }
  if (!inRange || v < lo || v > hi)
    throw error("its ", what, " is ", value.dump(), ", expected an integer in [", lo, ", ", hi, "]");
  return v;
}

int64_t headerInteger(const nlohmann::json &header, const std::string &key, int64_t lo = 0,
                      int64_t hi = std::numeric_limits<int64_t>::max()) {
  auto found = header.find(key);
  if (found == header.end()) throw error("its field '", key, "' is missing");
  return integerValue(*found, "field '" + key + "'", lo, hi);
}

/// The loss scale \p key of \p header: a positive number a float holds (a double past float's range
/// would make the conversion undefined behaviour).
float headerFloat(const nlohmann::json &header, const std::string &key) {
  auto found = header.find(key);
  if (found == header.end()) throw error("its field '", key, "' is missing");
  const double v = found->is_number() ? found->get<double>() : -1.0;
  if (!(v > 0.0 && v <= static_cast<double>(std::numeric_limits<float>::max())))
    throw error("its field '", key, "' is ", found->dump(), ", expected a positive number a float holds");
  return static_cast<float>(v);
}

/// The shape \p value of tensor \p id: an array of dimensions, each a non-negative integer.
Shape headerShape(const nlohmann::json &value, const std::string &id) {
  if (!value.is_array()) throw error("the shape of tensor '", id, "' is ", value.dump(), ", not an array");
  Shape shape;
  for (const auto &d : value)
    shape.push_back(integerValue(d, "tensor '" + id + "' dimension " + std::to_string(shape.size()), 0,
                                 std::numeric_limits<int64_t>::max()));
  return shape;
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
  const uint64_t fileBytes = kPreambleBytes + h.size() + static_cast<uint64_t>(offset) + kChecksumBytes;
  // The writer streams the tensors out, gathering each sharded one when its turn comes (one
  // whole state tensor in memory at a time, on every rank: an all-gather). A failure on the writer does not leave the
  // gathers: the other ranks would wait in them; it is reported once they are done.
  std::string failure;
  std::ofstream out;
  uint64_t checksum = session::kFnv1a64Start;
  // Every byte after the magic goes into the checksum.
  auto put = [&](const void *bytes, uint64_t size) {
    checksum = session::fnv1a64(bytes, static_cast<size_t>(size), checksum);
    out.write(static_cast<const char *>(bytes), static_cast<std::streamsize>(size));
  };
  if (writer) {
    out.open(tmp, std::ios::binary | std::ios::trunc);
    if (!out) failure = "cannot write '" + tmp + "'";
    out.write(kCheckpointMagic, sizeof kCheckpointMagic);
    const uint64_t preamble[3] = {static_cast<uint64_t>(kCheckpointVersion), fileBytes, h.size()};
    put(preamble, sizeof preamble);
    put(h.data(), h.size());
  }
  for (const auto &id : ids) {
    const TensorData &d = m.variable(id);
    auto shard = sharded.find(id);
    if (shard == sharded.end()) {
      if (writer) put(d.data(), static_cast<uint64_t>(d.byteCount()));
      continue;
    }
    const optimizer::ShardLayout &l = shard->second.layout;
    TensorData gathered(TensorInfo(d.info().dataType(), {l.padded}));
    communicator->allGather(d.data(), gathered.data(), l.shard, d.info().dataType());
    if (writer) // the padding past the weight's end is left out
      put(gathered.data(), static_cast<uint64_t>(l.elements) * dataTypeSize(d.info().dataType()));
  }
  if (writer) {
    const uint64_t sum = checksum;
    out.write(reinterpret_cast<const char *>(&sum), sizeof sum);
    if (failure.empty() && !out.flush()) failure = "writing '" + tmp + "' failed (disk full?)";
    out.close();
    // Synced before the rename, and the folder after it: after a crash or a kill the path holds
    // the previous checkpoint or this one, whole, never a part of either.
    if (failure.empty()) {
      try {
        session::syncFile(tmp);
        session::renameDurably(tmp, path);
      } catch (const error &e) {
        failure = e.what();
      }
    }
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
  CheckpointLayout layout;
  try {
    layout = checkFraming(path);
  } catch (const error &e) {
    throw error("loadCheckpoint: '", path, "': ", e.what());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error("loadCheckpoint: cannot open '", path, "'");
  in.seekg(static_cast<std::streamoff>(layout.headerOffset));
  std::string h(layout.headerBytes, '\0');
  if (!in.read(h.data(), static_cast<std::streamsize>(h.size())))
    throw error("loadCheckpoint: '", path, "': cannot read its header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h);
  } catch (const std::exception &e) {
    throw error("loadCheckpoint: '", path, "' has a corrupt header: ", e.what());
  }
  if (!header.is_object()) throw error("loadCheckpoint: '", path, "' has a corrupt header: not a JSON object");
  // Every failure below names the file; json's own exceptions mean a malformed header.
  auto withFileNamed = [&](const auto &body) {
    try {
      body();
    } catch (const nlohmann::json::exception &e) {
      throw error("loadCheckpoint: '", path, "' has a malformed header: ", e.what());
    } catch (const error &e) {
      throw error("loadCheckpoint: '", path, "': ", e.what());
    } catch (const std::exception &e) {
      throw error("loadCheckpoint: '", path, "' has a malformed header: ", e.what());
    }
  };
  // What the file is for, checked before the session recompiles for its MatMul ways (which resets
  // its state): a checkpoint of another model, optimiser or precision leaves the session as it was.
  withFileNamed([&] {
    const int64_t version = headerInteger(header, "version");
    if (version != layout.version)
      throw error("its header says format version ", version, ", its preamble ", layout.version);
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
  });
  try {
    m.adoptTunedWays(header);
  } catch (const std::exception &e) {
    throw error("loadCheckpoint: '", path, "' has malformed MatMul ways: ", e.what());
  }
  prepareDevice();
  withFileNamed([&] {
    // Checkpoints from before replication are those of one process.
    const int64_t written =
        header.contains("replicas") ? headerInteger(header, "replicas", 1, std::numeric_limits<int>::max()) : 1;
    const int replicas = m.kernelContext.communicator ? m.kernelContext.communicator->size() : 1;
    // The file holds whole optimiser state whatever wrote it: a sharded session cuts its shard out.
    const std::map<TensorId, session::StateShard> sharded = m.shardedState();
    std::vector<TensorId> ids = m.persistentIds();
    const auto &tensors = header.at("tensors");
    if (tensors.size() != ids.size())
      throw error("it holds ", tensors.size(), " tensors, the session has ", ids.size());
    std::vector<TensorData> values;
    uint64_t at = layout.headerOffset + layout.headerBytes;
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto &t = tensors[i];
      const TensorData &d = m.variable(ids[i]);
      auto shard = sharded.find(ids[i]);
      const TensorInfo whole =
          shard == sharded.end() ? d.info() : TensorInfo(d.info().dataType(), shard->second.wholeShape);
      const std::string saved = t.at("id").get<std::string>();
      if (saved != ids[i] && withoutUniqueSuffix(saved) != withoutUniqueSuffix(ids[i]))
        throw error("tensor ", i, " is '", t.at("id").get<std::string>(), "', expected '", ids[i], "'");
      const Shape shape = headerShape(t.at("shape"), ids[i]);
      const std::string type = t.at("type").get<std::string>();
      if (shape != whole.shape() || type != toString(whole.dataType()))
        throw error("tensor '", ids[i], "' is ", type, " ", toString(shape), ", the session has ", whole.toString());
      TensorData v(whole);
      const auto bytes = static_cast<uint64_t>(v.byteCount());
      if (bytes > layout.dataEnd - at)
        throw error("it is truncated in tensor '", ids[i], "': it needs bytes [", at, ", ", at + bytes,
                    "), the data ends at byte ", layout.dataEnd);
      in.read(static_cast<char *>(v.data()), static_cast<std::streamsize>(bytes));
      if (!in) throw error("reading tensor '", ids[i], "' failed");
      at += bytes;
      if (shard != sharded.end()) {
        TensorData cut(d.info());
        auto initial = m.initialValues.find(ids[i]);
        cutShard(v, shard->second.layout, initial == m.initialValues.end() ? nullptr : initial->second.get(), cut);
        v = std::move(cut);
      }
      values.push_back(std::move(v));
    }
    if (at != layout.dataEnd)
      throw error("it has ", layout.dataEnd - at, " bytes after its last tensor (which ends at byte ", at, ")");
    // The step state, read whole before any of it is applied.
    const int64_t step = headerInteger(header, "step");
    const int64_t skipped = headerInteger(header, "skipped");
    const int64_t goodSteps = headerInteger(header, "goodSteps");
    const float lossScale = headerFloat(header, "lossScale");
    // Checkpoints from before the histogram method of loss scaling start a new period.
    auto optionalInteger = [&](const char *key) { return header.contains(key) ? headerInteger(header, key) : 0; };
    const int64_t histogramBelow = optionalInteger("histogramBelow");
    const int64_t histogramUpper = optionalInteger("histogramUpper");
    const int64_t periodSteps = optionalInteger("periodSteps");
    const std::string seedText = header.at("seed").get<std::string>();
    uint64_t seed = 0;
    const auto parsed = std::from_chars(seedText.data(), seedText.data() + seedText.size(), seed);
    if (parsed.ec != std::errc() || parsed.ptr != seedText.data() + seedText.size())
      throw error("its seed '", seedText, "' is not an unsigned 64-bit number");
    const int64_t rngCounter = headerInteger(header, "rngCounter");
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
  });
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
