#pragma once
/// \file A host data loader: batches of a data set prepared by a background thread, shuffled by a
/// permutation per epoch that depends only on (seed, epoch), so a resumed run sees the same order.

#include <popart/stepio.hpp>
#include <popart/tensorinfo.hpp>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace popart::cli {

/// One named array of a data set; the leading dimension of \p info counts samples.
struct DatasetArray {
  std::string name;
  TensorInfo info;
  std::vector<uint8_t> bytes;
};

/// Named arrays with the same number of samples.
using Dataset = std::vector<DatasetArray>;

/// Where a loader is: the epoch and the step (batch) within it of the next batch.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t step = 0;
  bool operator==(const LoaderPosition &o) const { return epoch == o.epoch && step == o.step; }
};

/// One batch: a contiguous buffer per array of the data set, with shape [samplesPerBatch, ...].
class Batch {
public:
  /// The epoch and step this batch belongs to.
  LoaderPosition position() const { return position_; }
  /// The batch's buffer of array \p name, as an IArray for a StepIO; throws for an unknown name.
  IArray &array(const std::string &name);
  /// The data set indices of the samples in this batch, in order.
  const std::vector<int64_t> &indices() const { return indices_; }
  /// Every array by name, for a StepIO's inputs.
  std::map<TensorId, IArray &> arrays();

private:
  friend class DataLoader;
  LoaderPosition position_;
  std::vector<int64_t> indices_;
  std::vector<std::vector<uint8_t>> buffers_;
  std::vector<RawArray> views_;
  std::vector<std::string> names_;
};

/// Serves batches of a data set in order (or shuffled) from a ring of batches that a background
/// thread fills ahead of the consumer. The last incomplete batch of an epoch is dropped.
class DataLoader {
public:
  /// Takes \p dataset (every array must have the same leading dimension, at least
  /// \p samplesPerBatch); with \p shuffle, epoch e visits the samples in a permutation that depends
  /// only on (\p seed, e). \p prefetchDepth batches are prepared ahead; \p start is the position of
  /// the first batch (to resume a run).
  DataLoader(Dataset dataset, int64_t samplesPerBatch, bool shuffle, uint64_t seed, int prefetchDepth = 2,
             LoaderPosition start = {});
  /// Stops and joins the background thread.
  ~DataLoader();
  DataLoader(const DataLoader &) = delete;
  DataLoader &operator=(const DataLoader &) = delete;

  /// Complete batches per epoch.
  int64_t stepsPerEpoch() const { return stepsPerEpoch_; }
  int64_t samplesPerBatch() const { return samplesPerBatch_; }
  /// Samples in the data set.
  int64_t samples() const { return samples_; }
  const Dataset &dataset() const { return dataset_; }
  /// The position of the batch the next call to next() returns.
  LoaderPosition position() const;
  /// The next batch; it stays valid until the next call to next() or seek(). Blocks only when
  /// the background thread has not prepared it yet.
  Batch &next();
  /// Makes (\p epoch, \p step) the position of the next batch, dropping prefetched batches.
  void seek(int64_t epoch, int64_t step);
  /// Seconds next() has spent waiting for the background thread so far.
  double waitedSeconds() const;
  /// The order in which epoch \p epoch visits the samples.
  std::vector<int64_t> epochOrder(int64_t epoch) const;

private:
  void start(LoaderPosition from);
  void stop();
  void produce(LoaderPosition from);
  void fill(Batch &batch, LoaderPosition pos, const std::vector<int64_t> &order) const;

  Dataset dataset_;
  int64_t samplesPerBatch_, samples_ = 0, stepsPerEpoch_ = 0;
  bool shuffle_;
  uint64_t seed_;

  // The ring: slot (consumed_ + i) % size holds the i-th batch ahead once ready_ counts it.
  std::vector<Batch> slots_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  size_t head_ = 0;      ///< slot of the next batch to hand out
  size_t ready_ = 0;     ///< slots filled and not yet handed out
  bool holding_ = false; ///< the slot before head_ is held by the consumer
  bool stopping_ = false;
  std::exception_ptr failure_;
  double waited_ = 0.0;
  LoaderPosition next_;
  std::thread worker_;
};

} // namespace popart::cli
