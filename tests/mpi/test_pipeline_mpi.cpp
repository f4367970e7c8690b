// Pipelined training under mpirun (tests/CMakeLists.txt runs it on 2 and 4 ranks: one stage per
// rank, or 2 stages x 2 replicas): each stage must end with the weights that one unpipelined
// process gets with the same accumulation, every weight of the model on exactly one stage, and the
// loss anchor on every rank equal to that process's.

#include "replication_helpers.hpp"
#include "session/pipeline_run.hpp"

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace popart;
using popart::testing::microBatches;
using popart::testing::randomValues;
using popart::testing::weightsOf;
using popart::testing::world;

namespace {

constexpr int64_t kRows = 4; ///< samples per micro-batch
constexpr int kSteps = 3;

/// A model, its input widths and how to train it.
struct Model {
  std::string proto;
  int64_t inWidth = 0, outWidth = 0;
  Shape inShape, outShape;            ///< of one micro-batch
  std::vector<TensorId> layerOutputs; ///< the MLP's hidden layers' outputs (Relu), in order
  TensorId loss;
};

/// loss = mean((MLP(x) - target)^2): kLayers MatMul + bias (+ Relu) layers, layer l annotated with
/// pipeline stage l * stages / kLayers when \p stages > 0.
Model mlp(int stages) {
  constexpr int kLayers = 8;
  constexpr int64_t kWidth = 12;
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  Model m;
  m.inWidth = kWidth;
  m.outWidth = 6;
  m.inShape = {kRows, kWidth};
  m.outShape = {kRows, 6};
  TensorId h = b->addInputTensor(TensorInfo(DataType::FLOAT, m.inShape), "x");
  TensorId target = b->addInputTensor(TensorInfo(DataType::FLOAT, m.outShape), "target");
  for (int l = 0; l < kLayers; ++l) {
    const int64_t out = l + 1 == kLayers ? m.outWidth : kWidth;
    const auto seed = static_cast<uint32_t>(10 * l);
    TensorId w = b->addInitializedInputTensor(randomValues(kWidth * out, seed + 1, 0.4f), {kWidth, out},
                                              "w" + std::to_string(l));
    TensorId bias = b->addInitializedInputTensor(randomValues(out, seed + 2, 0.1f), {out}, "b" + std::to_string(l));
    std::vector<TensorId> outputs{ai.matmul({h, w})};
    outputs.push_back(ai.add({outputs.back(), bias}));
    if (l + 1 < kLayers) {
      outputs.push_back(ai.relu({outputs.back()}));
      m.layerOutputs.push_back(outputs.back());
    }
    if (stages > 0)
      for (const TensorId &t : outputs)
        b->pipelineStage(t, l * stages / kLayers);
    h = outputs.back();
  }
  TensorId d = ai.sub({h, target});
  TensorId sq = ai.mul({d, d});
  TensorId loss = m.loss = ai.reducemean({sq}, std::nullopt, 0);
  if (stages > 0) {
    b->pipelineStage(d, stages - 1);
    b->pipelineStage(sq, stages - 1);
    b->pipelineStage(loss, stages - 1);
  }
  b->addOutputTensor(loss);
  m.proto = b->getModelProto();
  return m;
}

/// A transformer encoder layer on [kRows, kTokens, kModel] inputs, unannotated: single-head
/// attention with a residual, LayerNorm (decomposed), a feed-forward block with a sigmoid-GELU and
/// a residual, LayerNorm again, a linear head; loss = mean((head - target)^2).
Model transformer() {
  constexpr int64_t kTokens = 5, kModel = 8, kHidden = 16, kOut = 3;
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  Model m;
  m.inShape = {kRows, kTokens, kModel};
  m.outShape = {kRows, kTokens, kOut};
  m.inWidth = kTokens * kModel;
  m.outWidth = kTokens * kOut;
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, m.inShape), "x");
  TensorId target = b->addInputTensor(TensorInfo(DataType::FLOAT, m.outShape), "target");
  uint32_t seed = 100;
  auto weight = [&](int64_t rows, int64_t cols, const std::string &name) {
    return b->addInitializedInputTensor(randomValues(rows * cols, ++seed, 0.3f), {rows, cols}, name);
  };
  auto vec = [&](int64_t n, float scale, float offset, const std::string &name) {
    std::vector<float> v = randomValues(n, ++seed, scale);
    for (float &e : v)
      e += offset;
    return b->addInitializedInputTensor(v, {n}, name);
  };
  auto scalar = [&](float v, const std::string &name) {
    return b->addInitializedInputTensor(std::vector<float>{v}, {}, name);
  };
  const TensorId gelu = scalar(1.702f, "gelu_scale"), scale = scalar(1.0f / std::sqrt(float(kModel)), "attn_scale");
  // Initializers are trained weights, which may not be shared across stages: each LayerNorm has its own.
  auto layerNorm = [&](const TensorId &in, const std::string &name) {
    const TensorId eps = scalar(1e-5f, name + "_eps"), minusHalf = scalar(-0.5f, name + "_minus_half");
    TensorId d = ai.sub({in, ai.reducemean({in}, std::vector<int64_t>{-1})});
    TensorId var = ai.reducemean({ai.mul({d, d})}, std::vector<int64_t>{-1});
    TensorId rstd = ai.exp({ai.mul({ai.log({ai.add({var, eps})}), minusHalf})});
    return ai.add({ai.mul({ai.mul({d, rstd}), vec(kModel, 0.1f, 1.0f, name + "_gamma")}),
                   vec(kModel, 0.1f, 0.0f, name + "_beta")});
  };
  TensorId q = ai.matmul({x, weight(kModel, kModel, "wq")});
  TensorId k = ai.matmul({x, weight(kModel, kModel, "wk")});
  TensorId v = ai.matmul({x, weight(kModel, kModel, "wv")});
  TensorId scores = ai.mul({ai.matmul({q, ai.transpose({k}, {0, 2, 1})}), scale});
  TensorId attn = ai.matmul({ai.softmax({scores}, -1), v});
  TensorId h1 = layerNorm(ai.add({x, ai.matmul({attn, weight(kModel, kModel, "wo")})}), "ln1");
  TensorId f = ai.add({ai.matmul({h1, weight(kModel, kHidden, "w_ff1")}), vec(kHidden, 0.1f, 0.0f, "b_ff1")});
  f = ai.mul({f, ai.sigmoid({ai.mul({f, gelu})})});
  f = ai.add({ai.matmul({f, weight(kHidden, kModel, "w_ff2")}), vec(kModel, 0.1f, 0.0f, "b_ff2")});
  TensorId h2 = layerNorm(ai.add({h1, f}), "ln2");
  TensorId head = ai.add({ai.matmul({h2, weight(kModel, kOut, "w_head")}), vec(kOut, 0.1f, 0.0f, "b_head")});
  TensorId d = ai.sub({head, target});
  m.loss = ai.reducemean({ai.mul({d, d})}, std::nullopt, 0);
  b->addOutputTensor(m.loss);
  m.proto = b->getModelProto();
  return m;
}

/// How the pipelined side cuts the model.
struct Cut {
  VirtualGraphMode mode = VirtualGraphMode::Manual;
  std::vector<std::string> splitAt;
  /// The pipelined side's SessionOptions::autoRecomputation (the unpipelined one recomputes nothing).
  RecomputationType recompute = RecomputationType::None;
};

/// What a run ends with: this process's weights by name, and the loss anchor of every micro-batch.
struct Result {
  std::map<TensorId, std::vector<float>> weights;
  std::vector<float> losses;
};

/// The global batch of step \p step: \p micro micro-batches of kRows samples of \p width values.
std::vector<float> globalBatch(int step, int micro, int64_t width, uint32_t salt) {
  return randomValues(micro * kRows * width, 1000u * static_cast<uint32_t>(step) + salt, 1.0f);
}

Shape withPrefix(int micro, const Shape &shape) {
  Shape s{micro};
  s.insert(s.end(), shape.begin(), shape.end());
  return s;
}

/// Trains \p model for kSteps with \p accumulation micro-batches per replica: pipelined over the
/// world (stages = world size / \p replicas) when \p pipelined, else in one process accumulating
/// every replica's micro-batches.
Result train(const Model &model, const Optimizer &opt, int accumulation, bool pipelined, int replicas = 1,
             const Cut &cut = {}) {
  const int micro = pipelined ? accumulation : replicas * accumulation;
  const int replica = pipelined ? world()->rank() % replicas : 0;
  SessionOptions so;
  so.numThreads = 1;
  so.enableGradientAccumulation = true;
  so.accumulationFactor = micro;
  if (pipelined) {
    so.enablePipelining = true;
    so.virtualGraphMode = cut.mode;
    so.pipelineSplit = cut.splitAt;
    so.autoRecomputation = cut.recompute;
    so.communicator = world();
    if (replicas > 1) {
      so.enableReplicatedGraphs = true;
      so.replicatedGraphCount = replicas;
    }
  }
  auto s = TrainingSession::createFromOnnxModel(model.proto, DataFlow(1, {model.loss}), model.loss, opt, so);
  s->prepareDevice();
  const TensorId &loss = model.loss;
  Result r;
  r.losses.resize(static_cast<size_t>(kSteps * micro));
  for (int k = 0; k < kSteps; ++k) {
    std::vector<float> x = globalBatch(k, replicas * accumulation, model.inWidth, 1),
                       t = globalBatch(k, replicas * accumulation, model.outWidth, 2);
    if (pipelined && replicas > 1) {
      x = microBatches(x, model.inWidth, replica, replicas, accumulation, kRows);
      t = microBatches(t, model.outWidth, replica, replicas, accumulation, kRows);
    }
    NDArrayWrapper<float> xa(x.data(), withPrefix(micro, model.inShape)),
        ta(t.data(), withPrefix(micro, model.outShape));
    NDArrayWrapper<float> la(r.losses.data() + k * micro, {micro});
    StepIO io({{"x", xa}, {"target", ta}}, {{loss, la}});
    s->run(io);
  }
  const std::vector<TensorId> ids = s->getWeightIds();
  std::vector<std::vector<float>> values = weightsOf(*s);
  for (size_t i = 0; i < ids.size(); ++i)
    r.weights[ids[i]] = std::move(values[i]);
  return r;
}

/// The largest difference between \p a and \p b relative to \p b's largest magnitude.
double relativeDifference(const std::vector<float> &a, const std::vector<float> &b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

/// Pipelined against unpipelined: each stage's weights within 1e-6, every weight on exactly one
/// stage, every weight moved, the losses of every micro-batch on every rank.
void checkEquivalent(const Model &model, const Optimizer &opt, int accumulation, int replicas = 1,
                     const Cut &cut = {}) {
  const Result piped = train(model, opt, accumulation, true, replicas, cut);
  const Result whole = train(model, opt, accumulation, false, replicas);
  ASSERT_FALSE(piped.weights.empty()) << "rank " << world()->rank() << " holds no weights";
  for (const auto &[id, w] : piped.weights) {
    auto it = whole.weights.find(id);
    ASSERT_NE(it, whole.weights.end()) << id;
    EXPECT_LE(relativeDifference(w, it->second), 1e-6) << "weight " << id << " on rank " << world()->rank();
  }
  // Each weight on one stage: the stages of one replica hold them all, once.
  int64_t mine = replicas > 1 && world()->rank() % replicas != 0 ? 0 : int64_t(piped.weights.size());
  world()->allReduce(&mine, 1, DataType::INT64, comm::ReduceOp::Sum);
  EXPECT_EQ(mine, int64_t(whole.weights.size()));
  // The losses: the last stage computes them, every rank receives them; with replicas, each
  // replica's micro-batches are every replicas-th of the unpipelined run's.
  const int micro = accumulation;
  const int replica = world()->rank() % replicas;
  for (int k = 0; k < kSteps; ++k)
    for (int i = 0; i < micro; ++i) {
      const float expected = whole.losses[size_t(k * micro * replicas + replica + i * replicas)];
      EXPECT_NEAR(piped.losses[size_t(k * micro + i)], expected, 1e-5f * std::fabs(expected))
          << "step " << k << " micro-batch " << i;
    }
}

SGD sgdWithMomentum(float lossScaling = 1.0f) {
  return SGD({{"defaultLearningRate", {0.05f, false}},
              {"defaultMomentum", {0.9f, true}},
              {"defaultWeightDecay", {0.01f, true}},
              {"lossScaling", {lossScaling, true}}});
}

Adam adamW(float lossScaling = 1.0f) {
  return Adam({{"defaultLearningRate", {0.01f, false}},
               {"defaultWeightDecay", {0.01f, true}},
               {"defaultEps", {1e-6f, true}},
               {"lossScaling", {lossScaling, true}}},
              AdamMode::Adam, WeightDecayMode::Decay);
}

TEST(Pipeline, TrainingOrderIsOneForwardOneBackward) {
  // 3 stages, 4 micro-batches: stage 0 runs 2 forwards ahead, the last stage none.
  using Order = std::vector<std::pair<bool, int>>;
  EXPECT_EQ(session::PipelineRun::trainingOrder(3, 0, 4),
            (Order{{true, 0}, {true, 1}, {true, 2}, {false, 0}, {true, 3}, {false, 1}, {false, 2}, {false, 3}}));
  EXPECT_EQ(session::PipelineRun::trainingOrder(3, 2, 2), (Order{{true, 0}, {false, 0}, {true, 1}, {false, 1}}));
  // Fewer micro-batches than stages ahead: all forwards first.
  EXPECT_EQ(session::PipelineRun::trainingOrder(4, 0, 2), (Order{{true, 0}, {true, 1}, {false, 0}, {false, 1}}));
}

TEST(Pipeline, MlpAnnotatedSgdMomentum) { checkEquivalent(mlp(world()->size()), sgdWithMomentum(), 6); }

TEST(Pipeline, MlpAnnotatedAdamWWithLossScaling) { checkEquivalent(mlp(world()->size()), adamW(8.0f), 5); }

TEST(Pipeline, MlpSplitAtTensorsSgdWithLossScaling) {
  // Unannotated; stage k starts after the hidden layer k * 8 / stages - 1 (of 8 layers).
  const Model m = mlp(0);
  const int stages = world()->size();
  Cut cut{VirtualGraphMode::Auto, {}};
  for (int k = 1; k < stages; ++k)
    cut.splitAt.push_back(m.layerOutputs[size_t(k * 8 / stages - 1)]);
  checkEquivalent(m, sgdWithMomentum(16.0f), 4, 1, cut);
}

TEST(Pipeline, TransformerBalancedSgdMomentum) {
  checkEquivalent(transformer(), sgdWithMomentum(4.0f), 6, 1, {VirtualGraphMode::Auto, {}});
}

TEST(Pipeline, TransformerBalancedAdamW) {
  checkEquivalent(transformer(), adamW(), 4, 1, {VirtualGraphMode::Auto, {}});
}

TEST(Pipeline, TransformerWithPipelineRecomputation) {
  // Each stage recomputes its forward in the backward from what crosses the stages: the same weights.
  checkEquivalent(transformer(), adamW(4.0f), 4, 1, {VirtualGraphMode::Auto, {}, RecomputationType::Pipeline});
}

TEST(Pipeline, ReplicatedTwoByTwo) {
  if (world()->size() != 4) GTEST_SKIP() << "2 stages x 2 replicas needs 4 ranks";
  checkEquivalent(mlp(2), adamW(), 3, 2);
  checkEquivalent(transformer(), sgdWithMomentum(2.0f), 4, 2, {VirtualGraphMode::Auto, {}});
}

TEST(Pipeline, InferenceMatchesUnpipelined) {
  // 4 batches per step flow through the stages; the loss (last stage) and the first hidden layer
  // (stage 0) reach every rank.
  const Model m = mlp(world()->size());
  constexpr int kBatches = 4;
  const TensorId hidden = m.layerOutputs.front();
  auto infer = [&](bool pipelined) {
    SessionOptions so;
    so.numThreads = 1;
    if (pipelined) {
      so.enablePipelining = true;
      so.virtualGraphMode = VirtualGraphMode::Manual;
      so.communicator = world();
    }
    auto s =
        InferenceSession::createFromOnnxModel(m.proto, DataFlow(kBatches, std::vector<TensorId>{m.loss, hidden}), so);
    std::vector<float> x = globalBatch(7, kBatches, m.inWidth, 1), t = globalBatch(7, kBatches, m.outWidth, 2);
    std::vector<float> losses(kBatches), h(size_t(kBatches * kRows * 12));
    NDArrayWrapper<float> xa(x.data(), withPrefix(kBatches, m.inShape)), ta(t.data(), withPrefix(kBatches, m.outShape));
    NDArrayWrapper<float> la(losses.data(), {kBatches}), ha(h.data(), {kBatches, kRows, 12});
    StepIO io({{"x", xa}, {"target", ta}}, {{m.loss, la}, {hidden, ha}});
    s->run(io);
    losses.insert(losses.end(), h.begin(), h.end());
    return losses;
  };
  const std::vector<float> piped = infer(true), whole = infer(false);
  EXPECT_LE(relativeDifference(piped, whole), 1e-6) << "rank " << world()->rank();
}

TEST(Pipeline, BadOptionsAreErrors) {
  const Model m = mlp(world()->size());
  SessionOptions so;
  so.enablePipelining = true;
  so.communicator = world();
  so.enableGradientAccumulation = true;
  so.accumulationFactor = 2;
  auto create = [&] {
    auto s = TrainingSession::createFromOnnxModel(m.proto, DataFlow(1, std::vector<TensorId>{}), "", SGD(), so);
    s->prepareDevice();
  };
  so.virtualGraphMode = VirtualGraphMode::Off;
  EXPECT_THROW(create(), error);
  so.virtualGraphMode = VirtualGraphMode::Manual;
  so.enableGradientAccumulation = false;
  so.accumulationFactor = 1;
  EXPECT_THROW(create(), error);
  so.enableGradientAccumulation = true;
  so.accumulationFactor = 2;
  // Annotated for twice as many stages as there are ranks.
  const Model tooMany = mlp(2 * world()->size());
  try {
    auto s = TrainingSession::createFromOnnxModel(tooMany.proto, DataFlow(1, std::vector<TensorId>{}), "", SGD(), so);
    s->prepareDevice();
    ADD_FAILURE() << "stages out of range were accepted";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("but the pipeline has"), std::string::npos) << e.what();
  }
}

/// Runs \p body, which must throw a popart::error whose message contains \p expected.
template <typename Body> void expectError(const Body &body, const std::string &expected, const char *what) {
  try {
    body();
    ADD_FAILURE() << what << ": accepted";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << what << ": " << e.what();
  }
}

/// The MLP with its first layer's weight read again by the last stage's loss: a trained weight of
/// two stages.
std::string mlpWithTiedWeight(int stages) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, Shape{kRows, 4}), "x");
  TensorId w = b->addInitializedInputTensor(randomValues(16, 1, 0.4f), {4, 4}, "tied");
  TensorId h = ai.relu({ai.matmul({x, w})});
  b->pipelineStage(h, 0);
  TensorId y = ai.matmul({h, w});
  TensorId loss = ai.reducemean({ai.mul({y, y})}, std::nullopt, 0);
  b->pipelineStage(y, stages - 1);
  b->pipelineStage(loss, stages - 1);
  b->addOutputTensor(loss);
  return b->getModelProto();
}

TEST(Pipeline, WhatPipeliningDoesNotTakeIsAnErrorNamingIt) {
  const int stages = world()->size();
  const Model m = mlp(stages), plain = mlp(0);
  SessionOptions so;
  so.enablePipelining = true;
  so.communicator = world();
  so.enableGradientAccumulation = true;
  so.accumulationFactor = 2;
  so.virtualGraphMode = VirtualGraphMode::Manual;
  auto prepared = [&](const std::string &proto, const SessionOptions &options, const SGD &sgd = SGD()) {
    auto s = TrainingSession::createFromOnnxModel(proto, DataFlow(1, std::vector<TensorId>{}), "", sgd, options);
    s->prepareDevice();
    return s;
  };
  SessionOptions dynamic = so;
  dynamic.automaticLossScalingSettings.enabled = true;
  expectError([&] { prepared(m.proto, dynamic); }, "does not take dynamic loss scaling", "dynamic loss scaling");
  expectError([&] { prepared(m.proto, so, SGD({}, {ClipNormSettings::clipAllWeights(1.0f)})); },
              "does not take gradient clipping", "clipping");
  expectError([&] { prepared(mlpWithTiedWeight(stages), so); }, "weight 'tied' is read on pipeline stages 0 and",
              "a weight of two stages");
  // pipelineSplit: one tensor too many, and the right count out of forward order.
  SessionOptions split = so;
  split.virtualGraphMode = VirtualGraphMode::Auto;
  split.pipelineSplit.assign(m.layerOutputs.begin(), m.layerOutputs.begin() + stages);
  expectError([&] { prepared(plain.proto, split); }, "pipeline stages need " + std::to_string(stages - 1),
              "pipelineSplit's count");
  split.pipelineSplit.assign(m.layerOutputs.rbegin(), m.layerOutputs.rbegin() + (stages - 1));
  if (stages > 2) {
    expectError([&] { prepared(plain.proto, split); }, "list the tensors in forward order", "pipelineSplit's order");
  }
  // A session that trains refuses what needs every stage's weights in one process.
  auto s = prepared(m.proto, so);
  const std::string path = ::testing::TempDir() + "pipelined_rank" + std::to_string(world()->rank());
  expectError([&] { s->modelToHost(path + ".onnx"); }, "modelToHost: pipelined sessions", "modelToHost");
  expectError([&] { s->saveCheckpoint(path + ".ckpt"); }, "checkpoints of pipelined sessions are not supported",
              "saveCheckpoint");
  expectError([&] { s->loadCheckpoint(path + ".ckpt"); }, "checkpoints of pipelined sessions are not supported",
              "loadCheckpoint");
}

} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
