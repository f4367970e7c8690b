// Every floating-point initializer of a training session is accounted for: trained, frozen by
// the user, a shape constant, a running statistic, or off every differentiable path to the loss.
// A tensor read only by Shape keeps its weights trainable (it once froze them silently).

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <map>

using namespace popart;

namespace {

constexpr int64_t kBatch = 4, kIn = 3, kHidden = 5, kClasses = 3;

std::vector<float> values(int64_t n, float scale, float phase) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = scale * static_cast<float>(std::sin(0.9 * double(i) + phase));
  return v;
}

/// logits = MatMul(h2, V) with h = MatMul(x, W) and h2 = Reshape(h, Shape(h)) when \p throughShape,
/// h2 = h otherwise; loss = SoftmaxCrossEntropyLoss(logits, y).
std::string twoLayerModel(bool throughShape) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kBatch, kIn}), "x");
  TensorId y = b->addInputTensor(TensorInfo(DataType::INT64, {kBatch}), "y");
  TensorId w = b->addInitializedInputTensor(values(kIn * kHidden, 0.5f, 0.3f), {kIn, kHidden}, "W");
  TensorId v = b->addInitializedInputTensor(values(kHidden * kClasses, 0.4f, 1.1f), {kHidden, kClasses}, "V");
  TensorId h = ai.matmul({x, w});
  if (throughShape) h = ai.reshape({h, ai.shape({h})});
  TensorId loss = ai.softmaxcrossentropyloss({ai.matmul({h, v}), y});
  b->addOutputTensor(loss);
  return b->getModelProto();
}

struct Trained {
  std::map<TensorId, std::vector<float>> weights;
  std::vector<WeightStatus> statuses;
};

Trained train(const std::string &model, int steps, const SessionOptions &so = {},
              const std::vector<std::pair<TensorId, int64_t>> &weights = {{"W", kIn *kHidden},
                                                                          {"V", kHidden *kClasses}}) {
  SGD sgd({{"defaultLearningRate", {0.5f, false}},
           {"defaultMomentum", {0.9f, false}},
           {"defaultWeightDecay", {0.01f, false}}});
  auto s = TrainingSession::createFromOnnxModel(model, DataFlow(1, std::vector<TensorId>{}), "", sgd, so);
  s->prepareDevice();
  s->weightsFromHost();
  std::vector<float> x = values(kBatch * kIn, 1.0f, 0.7f);
  std::vector<int64_t> y = {0, 2, 1, 2};
  NDArrayWrapper<float> xa(x.data(), {kBatch, kIn});
  NDArrayWrapper<int64_t> ya(y.data(), {kBatch});
  for (int i = 0; i < steps; ++i) {
    StepIO io({{"x", xa}, {"y", ya}}, {});
    s->run(io);
  }
  Trained t;
  for (const auto &[id, n] : weights) {
    std::vector<float> w(static_cast<size_t>(n));
    NDArrayWrapper<float> arr(w.data(), {n});
    WeightsIO io;
    io.insert(id, arr);
    s->readWeights(io);
    t.weights[id] = w;
  }
  t.statuses = s->getWeightStatuses();
  return t;
}

const WeightStatus &statusOf(const std::vector<WeightStatus> &statuses, const TensorId &id) {
  for (const auto &st : statuses)
    if (st.id == id) return st;
  throw error("no status for '", id, "'");
}

} // namespace

TEST(WeightAccounting, AWeightReadByShapeTrainsLikeWithoutTheShape) {
  Trained plain = train(twoLayerModel(false), 3);
  Trained shaped = train(twoLayerModel(true), 3);
  for (const char *id : {"W", "V"}) {
    EXPECT_EQ(statusOf(shaped.statuses, id).role, WeightStatus::Role::Trained) << id;
    std::vector<float> initial =
        id == std::string("W") ? values(kIn * kHidden, 0.5f, 0.3f) : values(kHidden * kClasses, 0.4f, 1.1f);
    EXPECT_NE(shaped.weights[id], initial) << id << " was not updated";
    ASSERT_EQ(shaped.weights[id].size(), plain.weights[id].size());
    for (size_t i = 0; i < plain.weights[id].size(); ++i)
      EXPECT_NEAR(shaped.weights[id][i], plain.weights[id][i], 1e-6f) << id << "[" << i << "]";
  }
}

TEST(WeightAccounting, FrozenWeightsByNameOrPatternKeepTheirValues) {
  SessionOptions so;
  so.frozenWeights = {"W"};
  Trained t = train(twoLayerModel(true), 2, so);
  EXPECT_EQ(t.weights["W"], values(kIn * kHidden, 0.5f, 0.3f));
  EXPECT_NE(t.weights["V"], values(kHidden * kClasses, 0.4f, 1.1f));
  EXPECT_EQ(statusOf(t.statuses, "W").role, WeightStatus::Role::Frozen);
  EXPECT_NE(statusOf(t.statuses, "W").reason.find("frozenWeights"), std::string::npos);
  EXPECT_EQ(statusOf(t.statuses, "V").role, WeightStatus::Role::Trained);

  so.frozenWeights = {"[A-Z]"}; // a pattern matching whole names: both weights
  try {
    train(twoLayerModel(true), 1, so);
    FAIL() << "freezing every weight must be an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("no trainable weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'W'"), std::string::npos) << e.what();
  }
}

TEST(WeightAccounting, FreezeEntriesThatMatchNothingOrAreNotPatternsAreErrors) {
  for (const std::string entry : {"w_typo", "(W"}) {
    SessionOptions so;
    so.frozenWeights = {entry};
    try {
      train(twoLayerModel(false), 1, so);
      FAIL() << "frozenWeights entry '" << entry << "' was accepted";
    } catch (const error &e) {
      EXPECT_NE(std::string(e.what()).find("frozenWeights entry '" + entry + "'"), std::string::npos) << e.what();
    }
  }
}

namespace {

/// x [8] reshaped to the shape held by the float initializer S (cast to INT64); with
/// \p lossReadsS the loss also adds sum(S), so that S would have a gradient.
std::string shapeFromWeightModel(bool lossReadsS) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kBatch, kIn}), "x");
  TensorId y = b->addInputTensor(TensorInfo(DataType::INT64, {kBatch}), "y");
  TensorId w = b->addInitializedInputTensor(values(kIn * kHidden, 0.5f, 0.3f), {kIn, kHidden}, "W");
  TensorId s = b->addInitializedInputTensor(std::vector<float>{float(kBatch), float(kHidden)}, {2}, "S");
  TensorId h = ai.reshape({ai.matmul({x, w}), ai.cast({s}, "INT64")});
  TensorId loss = ai.softmaxcrossentropyloss({h, y});
  if (lossReadsS) loss = ai.add({loss, ai.reducesum({s}, std::nullopt, 0)});
  b->addOutputTensor(loss);
  return b->getModelProto();
}

} // namespace

TEST(WeightAccounting, AWeightWhoseValuesDecideAShapeIsAShapeConstant) {
  Trained t = train(shapeFromWeightModel(false), 1, {}, {{"W", kIn * kHidden}, {"S", 2}});
  const WeightStatus &s = statusOf(t.statuses, "S");
  EXPECT_EQ(s.role, WeightStatus::Role::ShapeConstant);
  EXPECT_NE(s.reason.find("Reshape"), std::string::npos) << s.reason;
  EXPECT_EQ(t.weights["S"], (std::vector<float>{float(kBatch), float(kHidden)}));
  EXPECT_EQ(statusOf(t.statuses, "W").role, WeightStatus::Role::Trained);
}

TEST(WeightAccounting, AShapeDecidingWeightTheLossDifferentiatesIsAnErrorUnlessFrozen) {
  try {
    train(shapeFromWeightModel(true), 1, {}, {{"W", kIn * kHidden}, {"S", 2}});
    FAIL() << "a weight both deciding a shape and differentiated by the loss was accepted";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("initializer 'S'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("frozenWeights"), std::string::npos) << e.what();
  }
  SessionOptions so;
  so.frozenWeights = {"S"};
  Trained t = train(shapeFromWeightModel(true), 1, so, {{"W", kIn * kHidden}, {"S", 2}});
  EXPECT_EQ(statusOf(t.statuses, "S").role, WeightStatus::Role::Frozen);
  EXPECT_EQ(statusOf(t.statuses, "W").role, WeightStatus::Role::Trained);
}

TEST(WeightAccounting, WeightsNoGradientReachesAreReportedAndLeftAlone) {
  // U reaches the loss only through ArgMax (no gradient); Z feeds a second output only.
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kBatch, kIn}), "x");
  TensorId y = b->addInputTensor(TensorInfo(DataType::INT64, {kBatch}), "y");
  TensorId w = b->addInitializedInputTensor(values(kIn * kHidden, 0.5f, 0.3f), {kIn, kHidden}, "W");
  TensorId u = b->addInitializedInputTensor(values(kHidden, 1.0f, 0.2f), {kHidden}, "U");
  TensorId z = b->addInitializedInputTensor(values(kIn, 1.0f, 0.5f), {kIn}, "Z");
  TensorId logits = ai.matmul({x, w});
  TensorId picked = ai.cast({ai.argmax({u}, 0, 0)}, "FLOAT");
  TensorId loss =
      ai.add({ai.softmaxcrossentropyloss({logits, y}), ai.mul({picked, ai.reducesum({x}, std::nullopt, 0)})});
  b->addOutputTensor(loss);
  b->addOutputTensor(ai.mul({x, z}));
  SessionOptions so;
  Trained t = train(b->getModelProto(), 2, so, {{"W", kIn * kHidden}, {"U", kHidden}, {"Z", kIn}});
  EXPECT_EQ(statusOf(t.statuses, "W").role, WeightStatus::Role::Trained);
  EXPECT_EQ(statusOf(t.statuses, "U").role, WeightStatus::Role::NoGradient);
  EXPECT_EQ(statusOf(t.statuses, "Z").role, WeightStatus::Role::NoGradient);
  EXPECT_EQ(t.statuses.size(), 3u);
  // Weight decay would move them if they were updated with a zero gradient.
  EXPECT_EQ(t.weights["U"], values(kHidden, 1.0f, 0.2f));
  EXPECT_EQ(t.weights["Z"], values(kIn, 1.0f, 0.5f));
}

TEST(WeightAccounting, WritingAWeightThatIsNotTrainedIsAnErrorNamingWhy) {
  SessionOptions so;
  so.frozenWeights = {"W"};
  SGD sgd({{"defaultLearningRate", {0.1f, false}}});
  auto s = TrainingSession::createFromOnnxModel(twoLayerModel(true), DataFlow(1, std::vector<TensorId>{}), "", sgd, so);
  s->prepareDevice();
  std::vector<float> w(static_cast<size_t>(kIn * kHidden), 1.0f);
  NDArrayWrapper<float> arr(w.data(), {kIn * kHidden});
  WeightsIO io;
  io.insert("W", arr);
  try {
    s->writeWeights(io);
    FAIL() << "writing a frozen weight was accepted";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("weight 'W' is not trained (frozen by SessionOptions::frozenWeights)"),
              std::string::npos)
        << e.what();
  }
  std::vector<float> back(w.size());
  NDArrayWrapper<float> out(back.data(), {kIn * kHidden});
  WeightsIO readIo;
  readIo.insert("W", out);
  s->readWeights(readIo);
  EXPECT_EQ(back, values(kIn * kHidden, 0.5f, 0.3f)); // unchanged by the refused write
}
