// SessionOptions::enableFloatingPointChecks: the first NaN or inf an op writes stops the run
// with an error naming the op, its output, the step and the element; a clean model computes the
// same bits with the checks on; dynamic loss scaling's expected overflows do not trip them.
// The bad elements are placed by construction (log of a negative input, a division by zero), so
// the expected indices and values are known without running anything.

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

using namespace popart;

namespace {

constexpr int64_t kN = 4;

/// y = Log(x) + x, the Log named "bad_log", in \p type (Casts around it for other than FLOAT).
std::string logModel(TensorId &logOut, const std::string &type = "FLOAT") {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kN}), "x");
  TensorId in = type == "FLOAT" ? x : ai.cast({x}, type);
  logOut = ai.log({in}, "bad_log");
  TensorId back = type == "FLOAT" ? logOut : ai.cast({logOut}, "FLOAT");
  b->addOutputTensor(ai.add({back, x}, "after"));
  return b->getModelProto();
}

std::unique_ptr<InferenceSession> inference(const std::string &model, bool checks) {
  SessionOptions so;
  so.enableFloatingPointChecks = checks;
  auto s = InferenceSession::createFromOnnxModel(model, DataFlow(1, std::vector<TensorId>{}), so);
  return InferenceSession::createFromOnnxModel(model, DataFlow(1, s->getOutputIds()), so);
}

/// Runs \p s on \p x; \returns its only output.
std::vector<float> infer(InferenceSession &s, std::vector<float> x) {
  std::vector<float> y(static_cast<size_t>(kN));
  NDArrayWrapper<float> in(x.data(), {kN}), out(y.data(), {kN});
  StepIO io({{"x", in}}, {{s.getOutputIds().at(0), out}});
  s.run(io);
  return y;
}

/// The message of the error \p f throws; fails the test if it throws none.
template <typename F> std::string errorOf(F f) {
  try {
    f();
  } catch (const error &e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

} // namespace

TEST(NumericChecks, LogOfNegativeNamesOpTensorStepAndElement) {
  TensorId logOut;
  auto s = inference(logModel(logOut), true);
  infer(*s, {1, 2, 3, 4}); // step 1 is clean
  const std::string msg = errorOf([&] { infer(*s, {1, 2, -3, 4}); });
  EXPECT_NE(msg.find("at step 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("output '" + logOut + "' of Log 'bad_log' (Log)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nan at element 2"), std::string::npos) << msg;
  // The session stays usable: the next clean run gives log(x) + x.
  std::vector<float> y = infer(*s, {1, 2, 3, 4});
  for (int64_t i = 0; i < kN; ++i)
    EXPECT_FLOAT_EQ(y[size_t(i)], std::log(float(i + 1)) + float(i + 1));
}

TEST(NumericChecks, WithoutChecksTheNaNFlowsThrough) {
  TensorId logOut;
  auto s = inference(logModel(logOut), false);
  std::vector<float> y = infer(*s, {1, 2, -3, 4});
  EXPECT_TRUE(std::isnan(y[2]));
}

TEST(NumericChecks, DivisionByZeroMidGraph) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kN}), "x");
  TensorId d = b->addInputTensor(TensorInfo(DataType::FLOAT, {kN}), "d");
  TensorId q = ai.div({ai.relu({x}, "first"), d}, "bad_div");
  b->addOutputTensor(ai.mul({q, x}, "last"));
  const std::string model = b->getModelProto();
  SessionOptions so;
  so.enableFloatingPointChecks = true;
  const TensorId out =
      InferenceSession::createFromOnnxModel(model, DataFlow(1, std::vector<TensorId>{}), so)->getOutputIds().at(0);
  auto s = InferenceSession::createFromOnnxModel(model, DataFlow(1, {out}), so);
  std::vector<float> xs{1, 2, 3, 4}, ds{1, 0, 2, 2}, y(kN);
  NDArrayWrapper<float> xa(xs.data(), {kN}), da(ds.data(), {kN}), ya(y.data(), {kN});
  StepIO io({{"x", xa}, {"d", da}}, {{out, ya}});
  const std::string msg = errorOf([&] { s->run(io); });
  EXPECT_NE(msg.find("at step 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("output '" + q + "' of Div 'bad_div' (Div) holds inf at element 1"), std::string::npos) << msg;
  std::cout << "the error reads: " << msg << "\n";
}

class NumericChecksTypes : public ::testing::TestWithParam<const char *> {};

TEST_P(NumericChecksTypes, LogOfNegativeInEachFloatingType) {
  TensorId logOut;
  auto s = inference(logModel(logOut, GetParam()), true);
  const std::string msg = errorOf([&] { infer(*s, {1, -2, 3, 4}); });
  EXPECT_NE(msg.find("output '" + logOut + "' of Log 'bad_log' (Log)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nan at element 1"), std::string::npos) << msg;
  // Infinity too: log(0) = -inf.
  const std::string inf = errorOf([&] { infer(*s, {1, 2, 3, 0}); });
  EXPECT_NE(inf.find("-inf at element 3"), std::string::npos) << inf;
}

INSTANTIATE_TEST_SUITE_P(Types, NumericChecksTypes, ::testing::Values("FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE"));

TEST(NumericChecks, CleanModelComputesTheSameBits) {
  // A small MLP (MatMul, bias, Relu, Softmax): oneDNN kernels, fusions and internal layouts.
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {8, 16}), "x");
  std::vector<float> w1(16 * 32), b1(32), w2(32 * 10);
  for (size_t i = 0; i < w1.size(); ++i)
    w1[i] = static_cast<float>(std::sin(0.37 * double(i)));
  for (size_t i = 0; i < b1.size(); ++i)
    b1[i] = static_cast<float>(0.01 * double(i));
  for (size_t i = 0; i < w2.size(); ++i)
    w2[i] = static_cast<float>(std::cos(0.11 * double(i)));
  TensorId h = ai.relu({ai.add({ai.matmul({x, b->addInitializedInputTensor(w1, {16, 32}, "w1")}),
                                b->addInitializedInputTensor(b1, {32}, "b1")})});
  b->addOutputTensor(ai.softmax({ai.matmul({h, b->addInitializedInputTensor(w2, {32, 10}, "w2")})}, 1));
  const std::string model = b->getModelProto();
  std::vector<float> xs(8 * 16);
  for (size_t i = 0; i < xs.size(); ++i)
    xs[i] = static_cast<float>(std::sin(1.3 * double(i)));
  std::vector<std::vector<float>> results;
  for (bool checks : {false, true}) {
    SessionOptions so;
    so.enableFloatingPointChecks = checks;
    auto probe = InferenceSession::createFromOnnxModel(model, DataFlow(1, std::vector<TensorId>{}), so);
    auto s = InferenceSession::createFromOnnxModel(model, DataFlow(1, probe->getOutputIds()), so);
    std::vector<float> y(8 * 10);
    NDArrayWrapper<float> in(xs.data(), {8, 16}), out(y.data(), {8, 10});
    StepIO io({{"x", in}}, {{s->getOutputIds().at(0), out}});
    s->run(io);
    s->run(io);
    results.push_back(y);
  }
  EXPECT_EQ(results[0], results[1]);
}

namespace {

const std::vector<float> kW0 = {0.5f, -1.0f, 2.0f, 0.25f};

/// loss = sum(Log(w * x)), the Log named "bad_log": NaN where w * x < 0.
std::string logLossModel(TensorId &logOut) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kN}), "x");
  TensorId w = b->addInitializedInputTensor(kW0, {kN}, "w");
  logOut = ai.log({ai.mul({w, x})}, "bad_log");
  b->addOutputTensor(ai.reducesum({logOut}, std::nullopt, 0));
  return b->getModelProto();
}

/// loss = sum(w * x): the gradient of w is x times the loss scale.
std::string linearModel() {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kN}), "x");
  TensorId w = b->addInitializedInputTensor(kW0, {kN}, "w");
  b->addOutputTensor(ai.reducesum({ai.mul({w, x})}, std::nullopt, 0));
  return b->getModelProto();
}

std::unique_ptr<TrainingSession> training(const std::string &model, const SessionOptions &so,
                                          const Optimizer &opt = SGD({{"defaultLearningRate", {0.01f, false}}})) {
  auto s = TrainingSession::createFromOnnxModel(model, DataFlow(1, std::vector<TensorId>{}), "", opt, so);
  s->prepareDevice();
  return s;
}

void step(TrainingSession &s, std::vector<float> x) {
  NDArrayWrapper<float> in(x.data(), {kN});
  StepIO io({{"x", in}}, {});
  s.run(io);
}

std::vector<float> weight(const TrainingSession &s) {
  std::vector<float> v(kN);
  NDArrayWrapper<float> arr(v.data(), {kN});
  WeightsIO io;
  io.insert("w", arr);
  s.readWeights(io);
  return v;
}

} // namespace

TEST(NumericChecks, TrainingNamesTheStepAndLeavesWeightsAsBefore) {
  TensorId logOut;
  SessionOptions so;
  so.enableFloatingPointChecks = true;
  auto s = training(logLossModel(logOut), so);
  step(*s, kW0); // w * x = w² > 0
  const std::vector<float> after1 = weight(*s);
  std::vector<float> bad = kW0;
  bad[3] = -bad[3]; // w * x < 0 at element 3 (w stays positive: it moves by 0.01 / w)
  const std::string msg = errorOf([&] { step(*s, bad); });
  EXPECT_NE(msg.find("at step 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("output '" + logOut + "' of Log 'bad_log' (Log) holds"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nan at element 3"), std::string::npos) << msg;
  // The forward pass stopped: no update, and the session trains on.
  EXPECT_EQ(weight(*s), after1);
  EXPECT_EQ(s->getStepCount(), 1);
  step(*s, kW0);
  EXPECT_EQ(s->getStepCount(), 2);
}

TEST(NumericChecks, TrainingWithChecksComputesTheSameBits) {
  TensorId logOut;
  const std::string model = logLossModel(logOut);
  Adam adam({{"defaultLearningRate", {0.01f, false}}}, AdamMode::Adam);
  std::vector<std::vector<float>> weights;
  for (bool checks : {false, true}) {
    SessionOptions so;
    so.enableFloatingPointChecks = checks;
    auto s = training(model, so, adam);
    for (int k = 0; k < 5; ++k) {
      std::vector<float> x = kW0;
      for (float &v : x)
        v *= 1.0f + 0.1f * float(k);
      step(*s, x);
    }
    weights.push_back(weight(*s));
  }
  EXPECT_EQ(weights[0], weights[1]);
  EXPECT_NE(weights[0], kW0);
}

namespace {
// Finite inputs whose loss is finite (|w * x| ≤ 2e35) but whose gradient, x times the loss scale
// 65536, overflows fp32.
std::vector<float> overflowing() { return {1e35f, 1e35f, 1e35f, 1e35f}; }
} // namespace

class NumericChecksDynamic : public ::testing::TestWithParam<AutomaticLossScalingSettings::Method> {};

TEST_P(NumericChecksDynamic, LossScalingSkipsOverflowWithoutTrippingChecks) {
  SessionOptions so;
  so.enableFloatingPointChecks = true;
  so.automaticLossScalingSettings.enabled = true;
  so.automaticLossScalingSettings.method = GetParam();
  auto s = training(linearModel(), so);
  step(*s, {1, 2, 3, 4});
  EXPECT_NO_THROW(step(*s, overflowing()));
  step(*s, {1, 2, 3, 4});
  EXPECT_NO_THROW(step(*s, overflowing()));
  EXPECT_EQ(s->getSkippedSteps(), 2);
  EXPECT_EQ(s->getStepCount(), 2);
  EXPECT_EQ(s->getSkippedStepNumbers(), (std::vector<int64_t>{2, 4}));
  if (GetParam() == AutomaticLossScalingSettings::Method::GradScaler) {
    EXPECT_EQ(s->getLossScale(), 16384.0f); // halved twice (the histogram method also doubles in between)
  }
  // The forward pass is still checked: an infinite input makes the loss infinite.
  std::vector<float> inf = {1, 2, std::numeric_limits<float>::infinity(), 4};
  const std::string msg = errorOf([&] { step(*s, inf); });
  EXPECT_NE(msg.find("at step 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("inf at element 2"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(Methods, NumericChecksDynamic,
                         ::testing::Values(AutomaticLossScalingSettings::Method::GradScaler,
                                           AutomaticLossScalingSettings::Method::Histogram));

TEST(NumericChecks, StaticLossScalingOverflowIsReported) {
  SessionOptions so;
  so.enableFloatingPointChecks = true;
  auto s =
      training(linearModel(), so, SGD({{"defaultLearningRate", {0.01f, false}}, {"lossScaling", {65536.0f, true}}}));
  const std::string msg = errorOf([&] { step(*s, overflowing()); });
  EXPECT_NE(msg.find("at step 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("holds inf"), std::string::npos) << msg;
  EXPECT_EQ(weight(*s), kW0);
}
