#pragma once
// Small helpers of the replicated-training tests under mpirun: the world communicator, seeded
// values, the MLP most of them train, the weights of a session and a hash of them compared
// across ranks.

#include "comm/mpi_communicator.hpp"

#include <popart/builder.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace popart::testing {

/// MPI_COMM_WORLD, with a 60 s collective timeout so that a broken test fails rather than hangs.
inline std::shared_ptr<comm::Communicator> world() {
  static auto communicator = std::make_shared<comm::MpiCommunicator>(comm::MpiOptions{std::chrono::seconds(60)});
  return communicator;
}

/// \p n normal values of mean \p offset and standard deviation \p scale drawn from \p seed.
inline std::vector<float> randomValues(int64_t n, uint32_t seed, float scale, float offset = 0.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(offset, scale);
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

/// Every rank's \p mine, gathered in rank order.
inline std::vector<uint64_t> valuesOnAllRanks(uint64_t mine) {
  std::vector<uint64_t> all(static_cast<size_t>(world()->size()));
  world()->allGather(&mine, all.data(), 1, DataType::INT64);
  return all;
}

/// Every rank's hash of \p weights, gathered in rank order.
inline std::vector<uint64_t> hashesOnAllRanks(const std::vector<std::vector<float>> &weights) {
  return valuesOnAllRanks(hashOf(weights));
}

/// Expects \p values (\p what, for the message) to have the same bits on every rank.
inline void expectSameOnEveryRank(const std::vector<std::vector<float>> &values, const std::string &what = "weights") {
  const std::vector<uint64_t> hashes = hashesOnAllRanks(values);
  const int mine = world()->rank();
  for (int r = 0; r < world()->size(); ++r)
    EXPECT_EQ(hashes[size_t(r)], hashes[size_t(mine)])
        << "rank " << r << "'s " << what << " differ from rank " << mine << "'s";
}

/// loss = mean((relu(...relu(x·W1 + b1)...)·Wn + bn - target)²) over micro-batches of \p rows rows:
/// inputs "x" and "target", and a layer per pair of \p widths (the input's, the hidden layers', the
/// output's), ReLU after all but the last. Layer k's "wk" and "bk" are drawn from seeds 2k - 1 and 2k,
/// of standard deviation 0.4 (w1), 0.3 (the other weights) and 0.1 (the biases).
inline std::string mlp(const std::vector<int64_t> &widths, int64_t rows) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId h = b->addInputTensor(TensorInfo(DataType::FLOAT, {rows, widths.front()}), "x");
  const TensorId target = b->addInputTensor(TensorInfo(DataType::FLOAT, {rows, widths.back()}), "target");
  std::vector<TensorId> weights, biases;
  for (size_t k = 1; k < widths.size(); ++k) {
    const int64_t in = widths[k - 1], out = widths[k];
    const auto seed = static_cast<uint32_t>(2 * k);
    const std::string layer = std::to_string(k);
    weights.push_back(
        b->addInitializedInputTensor(randomValues(in * out, seed - 1, k == 1 ? 0.4f : 0.3f), {in, out}, "w" + layer));
    biases.push_back(b->addInitializedInputTensor(randomValues(out, seed, 0.1f), {out}, "b" + layer));
  }
  for (size_t k = 0; k < weights.size(); ++k) {
    h = ai.add({ai.matmul({h, weights[k]}), biases[k]});
    if (k + 1 < weights.size()) h = ai.relu({h});
  }
  const TensorId d = ai.sub({h, target});
  b->addOutputTensor(ai.reducemean({ai.mul({d, d})}, std::nullopt, 0));
  return b->getModelProto();
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
