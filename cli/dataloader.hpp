#pragma once
/// \file A host data loader: batches of a data set prepared by a background thread, shuffled by a
/// permutation per epoch that depends only on (seed, epoch), so a resumed run sees the same order,
/// and so that the replicas of a data-parallel job agree on it without talking (DistributedSampler).

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

/// Which of the replicas of a data-parallel job a sampler or loader serves.
struct ReplicaSlice {
  /// The number of replicas (processes) that share each global batch.
  int replicas = 1;
  /// This replica's index, in [0, replicas).
  int rank = 0;
};

/// The sample order of a (possibly data-parallel) run (docs/distributed.md, "The distributed
/// sampler"). Every replica computes the same permutation of epoch e from (seed, e) alone, cuts it
/// into global batches of replicas × samplesPerReplica samples, and takes slice `rank` of each:
/// the replicas' samples are disjoint and together cover the epoch, except for the samples that
/// do not fill a last global batch, which are dropped (a different set each shuffled epoch).
class DistributedSampler {
public:
  /// \p samplesPerReplica samples per step for each of \p slice.replicas replicas out of
  /// \p samples; throws if a global batch needs more samples than there are.
  DistributedSampler(int64_t samples, int64_t samplesPerReplica, bool shuffle, uint64_t seed, ReplicaSlice slice = {});

  /// Samples in the data set.
  int64_t samples() const { return samples_; }
  /// Samples this replica takes per step.
  int64_t samplesPerReplica() const { return samplesPerReplica_; }
  /// Samples all replicas take together per step: replicas × samplesPerReplica.
  int64_t globalBatch() const { return samplesPerReplica_ * slice_.replicas; }
  /// Complete global batches per epoch.
  int64_t stepsPerEpoch() const { return samples_ / globalBatch(); }
  /// Samples of each epoch that no replica sees: samples modulo the global batch.
  int64_t droppedPerEpoch() const { return samples_ % globalBatch(); }
  const ReplicaSlice &slice() const { return slice_; }
  /// The order in which epoch \p epoch visits the samples, the same on every replica.
  std::vector<int64_t> epochOrder(int64_t epoch) const;
  /// This replica's samples of step \p step of the epoch whose order is \p order (from epochOrder)
  /// into \p out (samplesPerReplica of them): positions [step · global + rank · perReplica, +perReplica).
  void sliceOf(const std::vector<int64_t> &order, int64_t step, int64_t *out) const;
  /// This replica's samples of step \p step of epoch \p epoch.
  std::vector<int64_t> indices(int64_t epoch, int64_t step) const;

private:
  int64_t samples_, samplesPerReplica_;
  bool shuffle_;
  uint64_t seed_;
  ReplicaSlice slice_;
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
/// thread fills ahead of the consumer. The last incomplete (global) batch of an epoch is dropped.
class DataLoader {
public:
  /// Takes \p dataset (every array must have the same leading dimension, at least
  /// \p samplesPerBatch × \p slice.replicas); with \p shuffle, epoch e visits the samples in a
  /// permutation that depends only on (\p seed, e). \p prefetchDepth batches are prepared ahead;
  /// \p start is the position of the first batch (to resume a run). With several replicas, each
  /// batch is this replica's slice of a global batch (DistributedSampler).
  DataLoader(Dataset dataset, int64_t samplesPerBatch, bool shuffle, uint64_t seed, int prefetchDepth = 2,
             LoaderPosition start = {}, ReplicaSlice slice = {});
  /// Stops and joins the background thread.
  ~DataLoader();
  DataLoader(const DataLoader &) = delete;
  DataLoader &operator=(const DataLoader &) = delete;

  /// Complete (global) batches per epoch.
  int64_t stepsPerEpoch() const { return stepsPerEpoch_; }
  /// Samples of each batch this loader serves (this replica's share of a global batch).
  int64_t samplesPerBatch() const { return samplesPerBatch_; }
  /// Samples in the data set.
  int64_t samples() const { return samples_; }
  /// The order of the samples, and this replica's share of each step.
  const DistributedSampler &sampler() const { return sampler_; }
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
  /// The order in which epoch \p epoch visits the samples (on every replica).
  std::vector<int64_t> epochOrder(int64_t epoch) const { return sampler_.epochOrder(epoch); }

private:
  void start(LoaderPosition from);
  void stop();
  void produce(LoaderPosition from);
  void fill(Batch &batch, LoaderPosition pos, const std::vector<int64_t> &order) const;

  Dataset dataset_;
  int64_t samplesPerBatch_, samples_ = 0, stepsPerEpoch_ = 0;
  DistributedSampler sampler_;

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
