// The Fashion-MNIST example's models: PyTorch's default initialisation, a hand-written forward
// pass of the MLP, the loss wiring, and a short training run on the real data.

#include "cli/fashion_mnist.hpp"

#include <popart/builder.hpp>
#include <popart/session.hpp>

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

using namespace popart;
using namespace popart::cli;

namespace {

std::map<std::string, std::vector<float>> floatInitializers(const std::string &proto,
                                                            std::map<std::string, Shape> *shapes = nullptr) {
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(proto));
  EXPECT_NO_THROW(onnx::checker::check_model(m));
  std::map<std::string, std::vector<float>> out;
  for (const auto &t : m.graph().initializer()) {
    if (t.data_type() != onnx::TensorProto::FLOAT) continue;
    std::vector<float> v(t.raw_data().size() / sizeof(float));
    std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
    out[t.name()] = v;
    if (shapes) shapes->emplace(t.name(), Shape(t.dims().begin(), t.dims().end()));
  }
  return out;
}

/// Mean softmax cross-entropy of [n, 10] logits, in double.
double crossEntropy(const std::vector<float> &logits, const std::vector<int32_t> &labels) {
  double total = 0.0;
  for (size_t i = 0; i < labels.size(); ++i) {
    const float *row = logits.data() + i * 10;
    double mx = *std::max_element(row, row + 10), sum = 0.0;
    for (int c = 0; c < 10; ++c)
      sum += std::exp(row[c] - mx);
    total += -(row[labels[i]] - mx - std::log(sum));
  }
  return total / static_cast<double>(labels.size());
}

struct Forward {
  std::vector<float> logits;
  float loss = 0.0f;
};

Forward runModel(const FashionMnistModel &m, std::vector<uint8_t> pixels, std::vector<int32_t> labels) {
  const int64_t n = static_cast<int64_t>(labels.size());
  SessionOptions so;
  so.batchSize = n;
  auto s = InferenceSession::createFromOnnxModel(m.proto, DataFlow(1, std::vector<TensorId>{m.logits, m.loss}), so);
  Forward f;
  f.logits.assign(static_cast<size_t>(n * 10), 0.0f);
  NDArrayWrapper<uint8_t> image(pixels.data(), {n, 1, 28, 28});
  NDArrayWrapper<int32_t> label(labels.data(), {n});
  NDArrayWrapper<float> logits(f.logits.data(), {n, 10}), loss(&f.loss, {});
  StepIO io({{m.image, image}, {m.label, label}}, {{m.logits, logits}, {m.loss, loss}});
  s->run(io);
  return f;
}

std::vector<uint8_t> testPixels(int64_t n) {
  std::vector<uint8_t> p(static_cast<size_t>(n * 784));
  for (size_t i = 0; i < p.size(); ++i)
    p[i] = static_cast<uint8_t>((i * 37 + i / 784 * 11) % 256);
  return p;
}

} // namespace

TEST(FashionMnist, WeightsFollowPyTorchDefaultInitialisation) {
  for (std::string kind : {"mlp", "cnn"}) {
    std::map<std::string, Shape> shapes;
    auto inits = floatInitializers(buildFashionMnistModel(kind, 11).proto, &shapes);
    int checked = 0;
    for (const auto &[name, v] : inits) {
      if (name.find(".weight") == std::string::npos && name.find(".bias") == std::string::npos) continue;
      // nn.Linear weights are [out, in]; nn.Conv2d weights [out, in, k, k]; a bias shares its weight's fan-in.
      std::string layer = name.substr(0, name.find('.'));
      const Shape &w = shapes.at(layer + ".weight");
      int64_t fanIn = shapeElementCount(w) / w[0];
      double bound = 1.0 / std::sqrt(static_cast<double>(fanIn)), mean = 0, sq = 0;
      for (float x : v) {
        ASSERT_LE(std::fabs(x), bound) << kind << " " << name;
        mean += x;
        sq += x * x;
      }
      mean /= static_cast<double>(v.size());
      sq /= static_cast<double>(v.size());
      if (v.size() >= 1000) { // U(-b, b) has mean 0 and variance b²/3
        EXPECT_NEAR(mean, 0.0, 0.1 * bound) << kind << " " << name;
        EXPECT_NEAR(sq, bound * bound / 3, 0.1 * bound * bound / 3) << kind << " " << name;
      }
      ++checked;
    }
    EXPECT_EQ(checked, kind == "mlp" ? 4 : 8) << kind;
  }
  EXPECT_EQ(buildFashionMnistModel("mlp", 5).proto, buildFashionMnistModel("mlp", 5).proto);
  EXPECT_NE(buildFashionMnistModel("mlp", 5).proto, buildFashionMnistModel("mlp", 6).proto);
  EXPECT_THROW(buildFashionMnistModel("rnn", 0), popart::error);
}

TEST(FashionMnist, MlpMatchesAHandWrittenForwardPass) {
  FashionMnistModel m = buildFashionMnistModel("mlp", 3);
  auto w = floatInitializers(m.proto);
  const int64_t n = 5;
  std::vector<uint8_t> pixels = testPixels(n);
  std::vector<int32_t> labels = {0, 3, 9, 4, 7};
  Forward f = runModel(m, pixels, labels);
  // (p/255 - 0.2860) / 0.3530, then relu(x W1ᵀ + b1) W2ᵀ + b2 with W1 [256, 784], W2 [10, 256].
  const auto &w1 = w.at("fc1.weight"), &b1 = w.at("fc1.bias"), &w2 = w.at("fc2.weight"), &b2 = w.at("fc2.bias");
  ASSERT_EQ(w1.size(), 256u * 784u);
  ASSERT_EQ(w2.size(), 10u * 256u);
  std::vector<float> want(static_cast<size_t>(n * 10));
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> h(256);
    for (int j = 0; j < 256; ++j) {
      double acc = b1[j];
      for (int k = 0; k < 784; ++k)
        acc += (pixels[i * 784 + k] / 255.0 - 0.2860) / 0.3530 * w1[j * 784 + k];
      h[j] = std::max(acc, 0.0);
    }
    for (int c = 0; c < 10; ++c) {
      double acc = b2[c];
      for (int j = 0; j < 256; ++j)
        acc += h[j] * w2[c * 256 + j];
      want[i * 10 + c] = static_cast<float>(acc);
    }
  }
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(f.logits[i], want[i], 1e-3 + 1e-4 * std::fabs(want[i])) << "logit " << i;
  EXPECT_NEAR(f.loss, crossEntropy(f.logits, labels), 1e-5);
}

TEST(FashionMnist, CnnLossIsTheCrossEntropyOfItsLogits) {
  FashionMnistModel m = buildFashionMnistModel("cnn", 4);
  std::vector<int32_t> labels = {1, 8, 2};
  Forward f = runModel(m, testPixels(3), labels);
  ASSERT_EQ(f.logits.size(), 30u);
  EXPECT_NEAR(f.loss, crossEntropy(f.logits, labels), 1e-5);
  // Freshly initialised, the model is close to uniform over the 10 classes.
  EXPECT_NEAR(f.loss, std::log(10.0), 0.5);
}

TEST(FashionMnist, ShortTrainingRunLearns) {
  FashionMnistOptions o;
  if (!std::filesystem::exists(o.dataDir)) GTEST_SKIP() << o.dataDir << " is missing";
  o.steps = 150;
  o.logEvery = 50;
  o.seed = 1;
  testing::internal::CaptureStdout();
  int rc = runFashionMnistExample(o);
  std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << out;
  auto at = out.find("test accuracy: ");
  ASSERT_NE(at, std::string::npos) << out;
  double accuracy = std::stod(out.substr(at + 15));
  // 10% is chance; 150 Adam steps of 64 images reach about 80%.
  EXPECT_GT(accuracy, 70.0) << out;
  EXPECT_NE(out.find("epoch 1/1  step 150/937  loss "), std::string::npos) << out;
}

TEST(FashionMnist, BuilderLossOpsAgree) {
  // softmaxcrossentropyloss(x) and negativeloglikelihoodloss(logsoftmax(x)) are the same loss;
  // ignore_index drops a sample, Sum adds instead of averaging.
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {3, 4}), "x");
  TensorId y = b->addInputTensor(TensorInfo(DataType::INT64, {3}), "y");
  TensorId sce = ai.softmaxcrossentropyloss({x, y}, ReductionType::Sum, 3, "sce");
  TensorId nll = ai.negativeloglikelihoodloss({ai.logsoftmax({x}, 1), y}, ReductionType::Sum, 3, "nll");
  TensorId mean = ai.softmaxcrossentropyloss({x, y}, ReductionType::Mean);
  b->addOutputTensor(sce);
  b->addOutputTensor(nll);
  b->addOutputTensor(mean);
  std::string proto = b->getModelProto();
  floatInitializers(proto); // runs the checker
  auto s = InferenceSession::createFromOnnxModel(proto, DataFlow(1, std::vector<TensorId>{sce, nll, mean}));
  std::vector<float> xv = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, 1.0f, 1.0f, 1.0f, -2.0f, 0.0f, 3.0f, 0.5f};
  std::vector<int64_t> yv = {2, 0, 3};
  float got[3] = {0, 0, 0};
  NDArrayWrapper<float> xa(xv.data(), {3, 4}), o0(&got[0], {}), o1(&got[1], {}), o2(&got[2], {});
  NDArrayWrapper<int64_t> ya(yv.data(), {3});
  StepIO io({{x, xa}, {y, ya}}, {{sce, o0}, {nll, o1}, {mean, o2}});
  s->run(io);
  // Sample 0: -log softmax(x0)[2]; sample 1 (uniform row): log 4; sample 2 has the ignored
  // label 3, which the mean (no ignore_index) counts.
  double e0 = std::exp(0.5) + std::exp(-1.0) + std::exp(2.0) + std::exp(0.0);
  double l0 = -(2.0 - std::log(e0)), l1 = std::log(4.0);
  EXPECT_NEAR(got[0], l0 + l1, 1e-5);
  EXPECT_NEAR(got[1], l0 + l1, 1e-5);
  double e2 = std::exp(-2.0) + std::exp(0.0) + std::exp(3.0) + std::exp(0.5);
  double all = l0 + l1 - (0.5 - std::log(e2));
  EXPECT_NEAR(got[2], all / 3, 1e-5);
}
