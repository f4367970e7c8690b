#pragma once
// Small helpers of the replicated-training tests under mpirun: the world communicator, seeded
// values, the weights of a session and a hash of them compared across ranks.

#include "comm/mpi_communicator.hpp"

#include <popart/session.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

namespace popart::testing {

/// MPI_COMM_WORLD, with a 60 s collective timeout so that a broken test fails rather than hangs.
inline std::shared_ptr<comm::Communicator> world() {
  static auto communicator = std::make_shared<comm::MpiCommunicator>(comm::MpiOptions{std::chrono::seconds(60)});
  return communicator;
}

/// \p n normal values of standard deviation \p scale drawn from \p seed.
inline std::vector<float> randomValues(int64_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float &x : v)
    x = normal(gen);
  return v;
}

/// Every weight of \p s (getWeightIds() order), read through readWeights.
inline std::vector<std::vector<float>> weightsOf(const TrainingSession &s) {
  std::vector<std::vector<float>> all;
  for (const TensorId &id : s.getWeightIds()) {
    const TensorInfo info = s.getInfo(id);
    std::vector<float> v(static_cast<size_t>(info.elementCount()));
    NDArrayWrapper<float> arr(v.data(), info.shape());
    WeightsIO io;
    io.insert(id, arr);
    s.readWeights(io);
    all.push_back(std::move(v));
  }
  return all;
}

/// FNV-1a over the bytes of \p weights.
inline uint64_t hashOf(const std::vector<std::vector<float>> &weights) {
  uint64_t h = 1469598103934665603ULL;
  for (const auto &w : weights) {
    const auto *bytes = reinterpret_cast<const uint8_t *>(w.data());
    for (size_t i = 0; i < w.size() * sizeof(float); ++i)
      h = (h ^ bytes[i]) * 1099511628211ULL;
  }
  return h;
}

/// Every rank's hash of \p weights, gathered in rank order.
inline std::vector<uint64_t> hashesOnAllRanks(const std::vector<std::vector<float>> &weights) {
  const uint64_t mine = hashOf(weights);
  std::vector<uint64_t> hashes(static_cast<size_t>(world()->size()));
  world()->allGather(&mine, hashes.data(), 1, DataType::INT64);
  return hashes;
}

/// Micro-batches first, first + stride, ... (\p count of them) of \p global, each \p rows rows of
/// \p width values: one replica's share of a global batch (replica r of n takes r, r + n, ...).
inline std::vector<float> microBatches(const std::vector<float> &global, int64_t width, int first, int stride,
                                       int count, int64_t rows) {
  std::vector<float> out;
  for (int k = 0; k < count; ++k) {
    auto begin = global.begin() + (first + k * stride) * rows * width;
    out.insert(out.end(), begin, begin + rows * width);
  }
  return out;
}

/// The input shape of \p accumulation micro-batches of \p rows rows of \p width values.
inline Shape batchShape(int accumulation, int64_t rows, int64_t width) {
  if (accumulation == 1) return {rows, width};
  return {accumulation, rows, width};
}

} // namespace popart::testing
