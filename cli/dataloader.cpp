// DataLoader: one worker thread fills a ring of prefetchDepth + 1 batches; the consumer holds the
// batch last returned by next() until it asks for another. DistributedSampler: which samples.

#include "cli/dataloader.hpp"

#include <popart/error.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

namespace popart::cli {

namespace {

/// SplitMix64's finaliser: spreads (seed, epoch) over the whole 64-bit seed of the generator.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A uniform integer in [0, bound) by rejection; std::uniform_int_distribution is not specified
/// bit for bit, and the order must not depend on the standard library.
uint64_t below(std::mt19937_64 &rng, uint64_t bound) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  for (;;) {
    uint64_t r = rng();
    if (r < limit) return r % bound;
  }
}

} // namespace

IArray &Batch::array(const std::string &name) {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return views_[i];
  throw error("Batch: the data set has no array '", name, "'");
}

std::map<TensorId, IArray &> Batch::arrays() {
  std::map<TensorId, IArray &> m;
  for (size_t i = 0; i < names_.size(); ++i)
    m.emplace(names_[i], views_[i]);
  return m;
}

namespace {

/// The samples of \p dataset after checking that its arrays agree on them.
int64_t checkedSamples(const Dataset &dataset) {
  if (dataset.empty()) throw error("DataLoader: the data set has no arrays");
  std::set<std::string> names;
  for (const auto &a : dataset) {
    if (!names.insert(a.name).second) throw error("DataLoader: two arrays are named '", a.name, "'");
    if (a.info.rank() < 1 || !a.info.isKnown() || dataTypeSize(a.info.dataType()) == 0)
      throw error("DataLoader: array '", a.name, "' is ", a.info.toString(),
                  "; it needs a numeric type and a known shape whose leading dimension counts samples");
    if (static_cast<int64_t>(a.bytes.size()) != a.info.byteCount())
      throw error("DataLoader: array '", a.name, "' is ", a.info.toString(), " (", a.info.byteCount(),
                  " bytes) but has ", a.bytes.size(), " bytes");
  }
  const int64_t samples = dataset[0].info.dim(0);
  for (const auto &a : dataset)
    if (a.info.dim(0) != samples)
      throw error("DataLoader: array '", a.name, "' has ", a.info.dim(0), " samples (leading dimension of ",
                  a.info.toString(), ") but '", dataset[0].name, "' has ", samples);
  return samples;
}

} // namespace

DistributedSampler::DistributedSampler(int64_t samples, int64_t samplesPerReplica, bool shuffle, uint64_t seed,
                                       ReplicaSlice slice)
    : samples_(samples), samplesPerReplica_(samplesPerReplica), shuffle_(shuffle), seed_(seed), slice_(slice) {
  if (slice_.replicas < 1 || slice_.rank < 0 || slice_.rank >= slice_.replicas)
    throw error("DistributedSampler: replica ", slice_.rank, " of ", slice_.replicas,
                " is not a replica (the rank must be in [0, replicas), replicas at least 1)");
  const int64_t most = samples_ / slice_.replicas;
  if (samplesPerReplica_ < 1 || samplesPerReplica_ > most)
    throw error("DistributedSampler: samplesPerBatch must be in [1, ", most, "] (the ", samples_,
                " samples of the data set",
                slice_.replicas > 1 ? " shared by " + std::to_string(slice_.replicas) + " replicas" : std::string(),
                "), got ", samplesPerReplica_);
}

std::vector<int64_t> DistributedSampler::epochOrder(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(samples_));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (!shuffle_) return order;
  // The permutation must not depend on the replica: every rank draws the same one.
  std::mt19937_64 rng(mix(mix(seed_) ^ static_cast<uint64_t>(epoch)));
  for (size_t i = order.size() - 1; i > 0; --i)
    std::swap(order[i], order[below(rng, i + 1)]);
  return order;
}

void DistributedSampler::sliceOf(const std::vector<int64_t> &order, int64_t step, int64_t *out) const {
  if (step < 0 || step >= stepsPerEpoch())
    throw error("DistributedSampler: step ", step, " is outside the epoch's ", stepsPerEpoch(), " steps");
  const int64_t first = step * globalBatch() + slice_.rank * samplesPerReplica_;
  std::copy_n(order.begin() + first, samplesPerReplica_, out);
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch, int64_t step) const {
  std::vector<int64_t> out(static_cast<size_t>(samplesPerReplica_));
  sliceOf(epochOrder(epoch), step, out.data());
  return out;
}

DataLoader::DataLoader(Dataset dataset, int64_t samplesPerBatch, bool shuffle, uint64_t seed, int prefetchDepth,
                       LoaderPosition start, ReplicaSlice slice)
    : dataset_(std::move(dataset)), samplesPerBatch_(samplesPerBatch),
      sampler_(checkedSamples(dataset_), samplesPerBatch, shuffle, seed, slice) {
  if (prefetchDepth < 1) throw error("DataLoader: prefetchDepth must be at least 1, got ", prefetchDepth);
  samples_ = sampler_.samples();
  stepsPerEpoch_ = sampler_.stepsPerEpoch();
  if (start.epoch < 0 || start.step < 0 || start.step >= stepsPerEpoch_)
    throw error("DataLoader: start position (epoch ", start.epoch, ", step ", start.step, ") is outside the epochs of ",
                stepsPerEpoch_, " steps");

  slots_.resize(static_cast<size_t>(prefetchDepth) + 1);
  for (auto &slot : slots_) {
    slot.indices_.resize(static_cast<size_t>(samplesPerBatch_));
    for (const auto &a : dataset_) {
      Shape shape = a.info.shape();
      shape[0] = samplesPerBatch_;
      slot.names_.push_back(a.name);
      slot.buffers_.emplace_back(static_cast<size_t>(TensorInfo(a.info.dataType(), shape).byteCount()));
      slot.views_.emplace_back(slot.buffers_.back().data(), a.info.dataType(), shape);
    }
  }
  this->start(start);
}

DataLoader::~DataLoader() { stop(); }

LoaderPosition DataLoader::position() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_;
}

double DataLoader::waitedSeconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waited_;
}

void DataLoader::fill(Batch &batch, LoaderPosition pos, const std::vector<int64_t> &order) const {
  batch.position_ = pos;
  sampler_.sliceOf(order, pos.step, batch.indices_.data());
  for (size_t k = 0; k < dataset_.size(); ++k) {
    const size_t sampleBytes = dataset_[k].bytes.size() / static_cast<size_t>(samples_);
    const uint8_t *src = dataset_[k].bytes.data();
    uint8_t *dst = batch.buffers_[k].data();
    for (size_t i = 0; i < batch.indices_.size(); ++i)
      std::memcpy(dst + i * sampleBytes, src + static_cast<size_t>(batch.indices_[i]) * sampleBytes, sampleBytes);
  }
}

void DataLoader::produce(LoaderPosition pos) {
  try {
    std::vector<int64_t> order;
    int64_t orderEpoch = -1;
    for (;;) {
      size_t slot;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || ready_ + (holding_ ? 1 : 0) < slots_.size(); });
        if (stopping_) return;
        // The consumer moves head_ and ready_ together, so this slot stays ours while we fill it.
        slot = (head_ + ready_) % slots_.size();
      }
      if (pos.epoch != orderEpoch) {
        order = epochOrder(pos.epoch);
        orderEpoch = pos.epoch;
      }
      fill(slots_[slot], pos, order);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++ready_;
      }
      cv_.notify_all();
      if (++pos.step == stepsPerEpoch_) pos = {pos.epoch + 1, 0};
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = std::current_exception();
    cv_.notify_all();
  }
}

Batch &DataLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  holding_ = false;
  cv_.notify_all();
  if (ready_ == 0 && !failure_) {
    auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lock, [&] { return ready_ > 0 || failure_; });
    waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (failure_ && ready_ == 0) std::rethrow_exception(failure_);
  Batch &batch = slots_[head_];
  head_ = (head_ + 1) % slots_.size();
  --ready_;
  holding_ = true;
  if (++next_.step == stepsPerEpoch_) next_ = {next_.epoch + 1, 0};
  return batch;
}

void DataLoader::seek(int64_t epoch, int64_t step) {
  if (epoch < 0 || step < 0 || step >= stepsPerEpoch_)
    throw error("DataLoader::seek: position (epoch ", epoch, ", step ", step, ") is outside the epochs of ",
                stepsPerEpoch_, " steps");
  stop();
  start({epoch, step});
}

void DataLoader::start(LoaderPosition from) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    head_ = 0;
    ready_ = 0;
    holding_ = false;
    stopping_ = false;
    failure_ = nullptr;
    next_ = from;
  }
  worker_ = std::thread([this, from] { produce(from); });
}

void DataLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

} // namespace popart::cli
