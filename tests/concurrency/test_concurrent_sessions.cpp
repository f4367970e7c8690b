// Concurrent sessions (docs/threads.md): sessions created, compiled and run on their own threads at
// the same time give bit for bit the results of the same sessions run one after the other. Built
// with -fsanitize=thread as well (POPART_SANITIZE=thread, scripts/test.sh; two OpenMP threads per
// session on LLVM's libomp with Archer), where any data race between the sessions (registries,
// caches, logging, random state, oneDNN's engine) or inside a kernel's parallel loop is a failure.

#include <popart/builder.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <latch>
#include <map>
#include <random>
#include <thread>

using namespace popart;

namespace {

constexpr int kSteps = 4;
constexpr int64_t kBatch = 4;
/// The Builder names a node's outputs "<node name>:<index>".
const TensorId kInferenceOutput = "probabilities:0";

std::vector<float> uniform(int64_t n, uint32_t seed, float scale = 0.5f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float &x : v)
    x = u(rng);
  return v;
}

/// A small CNN for classification: Conv, Relu, MaxPool, Dropout, Gemm, softmax cross-entropy.
std::string cnnModel() {
  auto b = Builder::create();
  auto onnx = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kBatch, 2, 8, 8}), "image");
  TensorId label = b->addInputTensor(TensorInfo(DataType::INT32, {kBatch}), "label");
  TensorId w = b->addInitializedInputTensor(uniform(4 * 2 * 3 * 3, 1), {4, 2, 3, 3}, "conv.w");
  TensorId c = onnx.relu({onnx.conv({x, w}, {}, 1, {}, {1, 1, 1, 1})});
  TensorId p = onnx.maxpool({c}, 1, {2, 2}, {}, {2, 2})[0];
  TensorId d = onnx.dropout({onnx.flatten({p})}, 1, 0.25f)[0];
  TensorId fw = b->addInitializedInputTensor(uniform(64 * 3, 2), {64, 3}, "fc.w");
  TensorId fb = b->addInitializedInputTensor(uniform(3, 3), {3}, "fc.b");
  TensorId logits = onnx.gemm({d, fw, fb});
  TensorId loss = onnx.softmaxcrossentropyloss({logits, label});
  b->addOutputTensor(loss);
  return b->getModelProto();
}

/// A small MLP regressing onto a target: Gemm, Tanh, MatMul, squared error.
std::string mlpModel() {
  auto b = Builder::create();
  auto onnx = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kBatch, 16}), "x");
  TensorId target = b->addInputTensor(TensorInfo(DataType::FLOAT, {kBatch, 4}), "target");
  TensorId w1 = b->addInitializedInputTensor(uniform(16 * 8, 4), {16, 8}, "w1");
  TensorId b1 = b->addInitializedInputTensor(uniform(8, 5), {8}, "b1");
  TensorId w2 = b->addInitializedInputTensor(uniform(8 * 4, 6), {8, 4}, "w2");
  TensorId h = onnx.tanh({onnx.gemm({x, w1, b1})});
  TensorId diff = onnx.sub({onnx.matmul({h, w2}), target});
  TensorId loss = onnx.reducemean({onnx.mul({diff, diff})}, std::nullopt, 0);
  b->addOutputTensor(loss);
  return b->getModelProto();
}

/// An inference model: Conv, BatchNormalization, GlobalAveragePool, Softmax.
std::string inferenceModel() {
  auto b = Builder::create();
  auto onnx = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kBatch, 3, 8, 8}), "x");
  TensorId w = b->addInitializedInputTensor(uniform(5 * 3 * 3 * 3, 7), {5, 3, 3, 3}, "w");
  TensorId scale = b->addInitializedInputTensor(uniform(5, 8, 0.2f), {5}, "scale");
  TensorId bias = b->addInitializedInputTensor(uniform(5, 9), {5}, "bias");
  TensorId mean = b->addInitializedInputTensor(uniform(5, 10), {5}, "mean");
  std::vector<float> var(5, 1.5f);
  TensorId varId = b->addInitializedInputTensor(var, {5}, "var");
  TensorId bn = onnx.batchnormalization({onnx.conv({x, w}), scale, bias, mean, varId}, 1)[0];
  TensorId y = onnx.softmax({onnx.flatten({onnx.globalaveragepool({bn})})}, -1, "probabilities");
  b->addOutputTensor(y);
  return b->getModelProto();
}

SessionOptions options() {
  SessionOptions o;
  // OpenMP threads per session: POPART_TEST_SESSION_THREADS, 2 if unset. Under ThreadSanitizer
  // scripts/test.sh runs the OpenMP runtime that TSan understands (LLVM's, with its Archer tool;
  // docs/threads.md): Debian's libgomp is not built for TSan, whose thread pool's hand-offs it
  // would report as races in the kernels' loops.
  const char *threads = std::getenv("POPART_TEST_SESSION_THREADS");
  o.numThreads = threads ? std::atoi(threads) : 2;
  o.verifyIr = true;
  return o;
}

/// What a session leaves behind: every weight (training) or every output of every step (inference).
using Result = std::map<TensorId, std::vector<float>>;

/// Trains \p model for kSteps steps on inputs drawn from \p seed; \returns the weights.
/// \p start, if given, is waited for just before the session is created, so that several
/// sessions import and compile at the same time.
Result train(const std::string &model, const Optimizer &optimizer, uint32_t seed, std::latch *start) {
  if (start) start->arrive_and_wait();
  auto session =
      TrainingSession::createFromOnnxModel(model, DataFlow(1, std::vector<TensorId>{}), "", optimizer, options());
  session->prepareDevice();
  session->setRandomSeed(seed);
  std::mt19937 rng(seed);
  std::map<TensorId, std::vector<float>> floats;
  std::map<TensorId, std::vector<int32_t>> labels;
  std::vector<std::unique_ptr<IArray>> arrays;
  std::map<TensorId, IArray &> inputs;
  for (const TensorId &id : session->getInputIds()) {
    TensorInfo info = session->getInfo(id);
    if (info.dataType() == DataType::INT32) {
      auto &v = labels[id];
      v.resize(static_cast<size_t>(info.elementCount()));
      arrays.push_back(std::make_unique<NDArrayWrapper<int32_t>>(v.data(), info.shape()));
    } else {
      auto &v = floats[id];
      v.resize(static_cast<size_t>(info.elementCount()));
      arrays.push_back(std::make_unique<NDArrayWrapper<float>>(v.data(), info.shape()));
    }
    inputs.emplace(id, *arrays.back());
  }
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int step = 0; step < kSteps; ++step) {
    for (auto &[id, v] : floats)
      for (float &x : v)
        x = u(rng);
    for (auto &[id, v] : labels)
      for (int32_t &x : v)
        x = static_cast<int32_t>(rng() % 3);
    StepIO io(inputs, {});
    session->run(io);
  }
  Result weights;
  WeightsIO wio;
  std::vector<NDArrayWrapper<float>> wrappers;
  std::vector<TensorId> ids = session->getWeightIds();
  for (const TensorId &id : session->getOptimizerStateIds())
    ids.push_back(id);
  wrappers.reserve(ids.size());
  for (const TensorId &id : ids) {
    TensorInfo info = session->getInfo(id);
    weights[id].resize(static_cast<size_t>(info.elementCount()));
    wrappers.emplace_back(weights[id].data(), info.shape());
    wio.insert(id, wrappers.back());
  }
  session->readWeights(wio);
  return weights;
}

/// Runs \p model for kSteps steps of inference on inputs drawn from \p seed; \returns the outputs.
Result infer(const std::string &model, uint32_t seed, std::latch *start) {
  if (start) start->arrive_and_wait();
  auto session =
      InferenceSession::createFromOnnxModel(model, DataFlow(1, std::vector<TensorId>{kInferenceOutput}), options());
  const TensorId &out = kInferenceOutput;
  session->prepareDevice();
  TensorId in = session->getInputIds().at(0);
  TensorInfo inInfo = session->getInfo(in);
  TensorInfo outInfo = session->getInfo(out);
  std::vector<float> x(static_cast<size_t>(inInfo.elementCount()));
  std::vector<float> y(static_cast<size_t>(outInfo.elementCount()));
  NDArrayWrapper<float> xa(x.data(), inInfo.shape());
  NDArrayWrapper<float> ya(y.data(), outInfo.shape());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Result outputs;
  for (int step = 0; step < kSteps; ++step) {
    for (float &v : x)
      v = u(rng);
    StepIO io({{in, xa}}, {{out, ya}});
    session->run(io);
    outputs[out + "@" + std::to_string(step)] = y;
  }
  return outputs;
}

void expectBitwiseEqual(const Result &sequential, const Result &concurrent, const std::string &what) {
  ASSERT_EQ(sequential.size(), concurrent.size()) << what;
  for (const auto &[id, values] : sequential) {
    auto it = concurrent.find(id);
    ASSERT_NE(it, concurrent.end()) << what << ": " << id;
    ASSERT_EQ(values.size(), it->second.size()) << what << ": " << id;
    EXPECT_EQ(std::memcmp(values.data(), it->second.data(), values.size() * sizeof(float)), 0)
        << what << ": tensor '" << id << "' differs from the sequential run";
  }
}

/// Runs each job once in turn, then all of them at once on their own threads (started together by
/// a latch), and compares each job's results bitwise.
void compareSequentialAndConcurrent(
    const std::vector<std::pair<std::string, std::function<Result(std::latch *)>>> &jobs) {
  std::vector<Result> sequential;
  for (const auto &[name, job] : jobs)
    sequential.push_back(job(nullptr));
  std::vector<Result> concurrent(jobs.size());
  std::vector<std::string> errors(jobs.size());
  std::latch start(static_cast<std::ptrdiff_t>(jobs.size()));
  {
    std::vector<std::jthread> threads;
    for (size_t i = 0; i < jobs.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          concurrent[i] = jobs[i].second(&start);
        } catch (const std::exception &e) {
          errors[i] = e.what();
        }
      });
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_EQ(errors[i], "") << jobs[i].first;
    ASSERT_FALSE(sequential[i].empty()) << jobs[i].first;
    expectBitwiseEqual(sequential[i], concurrent[i], jobs[i].first);
  }
}

TEST(ConcurrentSessions, TrainingAndInferenceOnThreeThreads) {
  const std::string cnn = cnnModel(), mlp = mlpModel(), inference = inferenceModel();
  compareSequentialAndConcurrent({
      {"cnn sgd",
       [&](std::latch *s) {
         return train(cnn, SGD({{"defaultMomentum", {0.9f, true}}}), 11, s);
       }},
      {"mlp adam", [&](std::latch *s) { return train(mlp, Adam(), 12, s); }},
      {"inference", [&](std::latch *s) { return infer(inference, 13, s); }},
  });
}

// The same model in both sessions: whatever the sessions share (primitive caches keyed by shape,
// registries) is looked up with the same keys at the same time.
TEST(ConcurrentSessions, SameModelOnTwoThreads) {
  const std::string cnn = cnnModel();
  compareSequentialAndConcurrent({
      {"cnn seed 21", [&](std::latch *s) { return train(cnn, Adam(), 21, s); }},
      {"cnn seed 22", [&](std::latch *s) { return train(cnn, Adam(), 22, s); }},
  });
}

} // namespace
