// TrainingSession and the optimisers. The optimiser tests use a loss linear in the weight,
// loss = sum(w * x), whose gradient is exactly x, so each update can be checked against the
// torch.optim formulas evaluated here in double. (tests/parity compares with PyTorch itself.)

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>
#include <cstring>
#include <map>
#include <regex>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

using namespace popart;

namespace {

constexpr int64_t kN = 6;

/// loss = sum(w * x) (+ sum(u * x) with a second weight u).
std::string linearModel(bool twoWeights = false, bool extraScalarOutput = false) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kN}), "x");
  std::vector<float> w0 = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f};
  TensorId w = b->addInitializedInputTensor(w0, {kN}, "w");
  TensorId loss = ai.reducesum({ai.mul({w, x})}, std::nullopt, 0);
  if (twoWeights) {
    std::vector<float> u0 = {1.0f, 2.0f, -3.0f, 0.5f, 0.0f, -0.5f};
    TensorId u = b->addInitializedInputTensor(u0, {kN}, "u");
    loss = ai.add({loss, ai.reducesum({ai.mul({u, x})}, std::nullopt, 0)});
  }
  b->addOutputTensor(loss);
  if (extraScalarOutput) b->addOutputTensor(ai.reducemean({x}, std::nullopt, 0));
  return b->getModelProto();
}

std::vector<float> readWeight(const TrainingSession &s, const TensorId &id, int64_t n = kN) {
  std::vector<float> v(static_cast<size_t>(n));
  NDArrayWrapper<float> arr(v.data(), {n});
  WeightsIO io;
  io.insert(id, arr);
  s.readWeights(io);
  return v;
}

/// Runs one step with gradient data \p x.
void step(TrainingSession &s, std::vector<float> x) {
  NDArrayWrapper<float> in(x.data(), {kN});
  StepIO io({{"x", in}}, {});
  s.run(io);
}

std::vector<float> data(int k) {
  std::vector<float> x(kN);
  for (int64_t i = 0; i < kN; ++i)
    x[size_t(i)] = static_cast<float>(std::sin(0.7 * double(i + 1) * double(k + 1)) * (1.0 + 0.3 * double(i)));
  return x;
}

const std::vector<double> kW0 = {0.5, -1.0, 2.0, 0.25, -0.75, 1.5};

std::unique_ptr<TrainingSession> session(const Optimizer &opt, const SessionOptions &so = {},
                                         const std::string &model = linearModel()) {
  auto s = TrainingSession::createFromOnnxModel(model, DataFlow(1, {}, AnchorReturnType("ALL")), "", opt, so);
  s->prepareDevice();
  s->weightsFromHost();
  return s;
}

/// Runs \p steps steps of \p opt and of \p reference (which updates w in double from g and the
/// 1-based step number) and compares the weights after each.
void compareWithReference(const Optimizer &opt,
                          const std::function<void(std::vector<double> &w, const std::vector<double> &g, int t)> &ref,
                          int steps = 4) {
  auto s = session(opt);
  std::vector<double> w = kW0;
  for (int t = 1; t <= steps; ++t) {
    std::vector<float> x = data(t);
    step(*s, x);
    ref(w, std::vector<double>(x.begin(), x.end()), t);
    std::vector<float> got = readWeight(*s, "w");
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_NEAR(got[i], w[i], 2e-5 * (1.0 + std::abs(w[i]))) << opt.name() << " step " << t << " element " << i;
  }
}

} // namespace

TEST(Optimizers, SgdMomentumDampeningWeightDecay) {
  SGD opt({{"defaultLearningRate", {0.1f, false}},
           {"defaultMomentum", {0.9f, true}},
           {"defaultDampening", {0.2f, true}},
           {"defaultWeightDecay", {0.01f, true}}});
  std::vector<double> buf(kN);
  compareWithReference(opt, [&](std::vector<double> &w, const std::vector<double> &g, int t) {
    for (size_t i = 0; i < w.size(); ++i) {
      double d = g[i] + 0.01 * w[i];
      buf[i] = t == 1 ? d : 0.9 * buf[i] + 0.8 * d;
      w[i] -= 0.1 * buf[i];
    }
  });
}

TEST(Optimizers, SgdNesterovWithVelocityScaling) {
  SGD opt({{"defaultLearningRate", {0.05f, false}},
           {"defaultMomentum", {0.8f, true}},
           {"defaultVelocityScaling", {4.0f, true}},
           {"defaultNesterov", {1.0f, true}}});
  std::vector<double> buf(kN);
  compareWithReference(opt, [&](std::vector<double> &w, const std::vector<double> &g, int t) {
    for (size_t i = 0; i < w.size(); ++i) {
      buf[i] = t == 1 ? g[i] : 0.8 * buf[i] + g[i];
      w[i] -= 0.05 * (g[i] + 0.8 * buf[i]);
    }
  });
}

TEST(Optimizers, AdamWithL2AndAdamW) {
  for (WeightDecayMode mode : {WeightDecayMode::L2Regularization, WeightDecayMode::Decay}) {
    Adam opt({{"defaultLearningRate", {0.01f, false}},
              {"defaultBeta1", {0.8f, true}},
              {"defaultBeta2", {0.9f, true}},
              {"defaultEps", {1e-3f, true}},
              {"defaultWeightDecay", {0.1f, true}}},
             AdamMode::Adam, mode);
    std::vector<double> m(kN), v(kN);
    compareWithReference(opt, [&](std::vector<double> &w, const std::vector<double> &g0, int t) {
      for (size_t i = 0; i < w.size(); ++i) {
        double g = g0[i];
        if (mode == WeightDecayMode::L2Regularization)
          g += 0.1 * w[i];
        else
          w[i] *= 1.0 - 0.01 * 0.1;
        m[i] = 0.8 * m[i] + 0.2 * g;
        v[i] = 0.9 * v[i] + 0.1 * g * g;
        double bc1 = 1 - std::pow(0.8, t), bc2 = 1 - std::pow(0.9, t);
        w[i] -= 0.01 / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + 1e-3);
      }
    });
  }
}

TEST(Optimizers, AdaMax) {
  Adam opt({{"defaultLearningRate", {0.02f, false}}, {"defaultWeightDecay", {0.05f, true}}}, AdamMode::AdaMax,
           WeightDecayMode::L2Regularization);
  std::vector<double> m(kN), u(kN);
  compareWithReference(opt, [&](std::vector<double> &w, const std::vector<double> &g0, int t) {
    for (size_t i = 0; i < w.size(); ++i) {
      double g = g0[i] + 0.05 * w[i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      u[i] = std::max(0.999 * u[i], std::abs(g) + 1e-8);
      w[i] -= 0.02 / (1 - std::pow(0.9, t)) * m[i] / u[i];
    }
  });
}

TEST(Optimizers, LambAndLambNoBiasWithMaxWeightNorm) {
  for (AdamMode mode : {AdamMode::Lamb, AdamMode::LambNoBias})
    for (float maxNorm : {0.0f, 1.0f}) {
      Adam opt({{"defaultLearningRate", {0.01f, false}},
                {"defaultWeightDecay", {0.02f, true}},
                {"defaultEps", {1e-6f, true}},
                {"maxWeightNorm", {maxNorm, true}}},
               mode);
      std::vector<double> m(kN), v(kN);
      compareWithReference(opt, [&](std::vector<double> &w, const std::vector<double> &g, int t) {
        bool bias = mode == AdamMode::Lamb;
        double bc1 = bias ? 1 - std::pow(0.9, t) : 1, bc2 = bias ? 1 - std::pow(0.999, t) : 1;
        std::vector<double> u(kN);
        double wn = 0, un = 0;
        for (size_t i = 0; i < w.size(); ++i) {
          m[i] = 0.9 * m[i] + 0.1 * g[i];
          v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
          u[i] = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + 1e-6) + 0.02 * w[i];
          wn += w[i] * w[i];
          un += u[i] * u[i];
        }
        wn = std::sqrt(wn);
        if (maxNorm > 0) wn = std::min(wn, double(maxNorm));
        double ratio = wn == 0 || un == 0 ? 1 : wn / std::sqrt(un);
        for (size_t i = 0; i < w.size(); ++i)
          w[i] -= 0.01 * ratio * u[i];
      });
    }
}

TEST(Optimizers, RmspropPlainCenteredAndMomentum) {
  for (AdaptiveMode mode : {AdaptiveMode::RMSProp, AdaptiveMode::CenteredRMSProp})
    for (float momentum : {0.0f, 0.5f}) {
      Adaptive opt({{"defaultLearningRate", {0.01f, false}},
                    {"defaultAlpha", {0.9f, true}},
                    {"defaultMomentum", {momentum, true}},
                    {"defaultWeightDecay", {0.1f, true}}},
                   mode);
      std::vector<double> sq(kN), ga(kN), buf(kN);
      compareWithReference(opt, [&](std::vector<double> &w, const std::vector<double> &g0, int) {
        for (size_t i = 0; i < w.size(); ++i) {
          double g = g0[i] + 0.1 * w[i];
          sq[i] = 0.9 * sq[i] + 0.1 * g * g;
          double avg;
          if (mode == AdaptiveMode::CenteredRMSProp) {
            ga[i] = 0.9 * ga[i] + 0.1 * g;
            avg = std::sqrt(sq[i] - ga[i] * ga[i]) + 1e-8;
          } else {
            avg = std::sqrt(sq[i]) + 1e-8;
          }
          if (momentum > 0) {
            buf[i] = momentum * buf[i] + g / avg;
            w[i] -= 0.01 * buf[i];
          } else {
            w[i] -= 0.01 * g / avg;
          }
        }
      });
    }
}

TEST(Optimizers, AdaGradWithDecayAndInitialAccumulator) {
  Adaptive opt({{"defaultLearningRate", {0.1f, false}},
                {"defaultLearningRateDecay", {0.5f, true}},
                {"defaultInitialAccumulator", {0.25f, true}},
                {"defaultWeightDecay", {0.01f, true}}},
               AdaptiveMode::AdaGrad);
  std::vector<double> sum(kN, 0.25);
  compareWithReference(opt, [&](std::vector<double> &w, const std::vector<double> &g0, int t) {
    double clr = 0.1 / (1 + (t - 1) * 0.5);
    for (size_t i = 0; i < w.size(); ++i) {
      double g = g0[i] + 0.01 * w[i];
      sum[i] += g * g;
      w[i] -= clr * g / (std::sqrt(sum[i]) + 1e-10);
    }
  });
}

TEST(Optimizers, UnknownHyperparameterIsNamed) {
  try {
    SGD opt({{"defaultLearningRat", {0.1f, false}}});
    FAIL();
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("defaultLearningRat"), std::string::npos) << e.what();
  }
  SGD opt;
  EXPECT_THROW(opt.insertSpecific("w", {{"beta1", {0.9f, true}}}), error);
  EXPECT_THROW(session(SGD({{"defaultNesterov", {1.0f, true}}})), error); // Nesterov without momentum
}

TEST(TrainingSession, PerWeightOverridesAndUpdateFromHost) {
  SGD opt({{"defaultLearningRate", {0.1f, false}}});
  opt.insertSpecific("u", {{"learningRate", {0.0f, false}}});
  auto s = session(opt, {}, linearModel(true));
  step(*s, data(0));
  std::vector<float> u = readWeight(*s, "u"), w = readWeight(*s, "w");
  EXPECT_EQ(u[0], 1.0f); // frozen by its lr of 0
  EXPECT_NEAR(w[0], 0.5 - 0.1 * data(0)[0], 1e-6);
  SGD next({{"defaultLearningRate", {0.2f, false}}});
  s->updateOptimizerFromHost(&next); // u's override is gone: it trains now
  step(*s, data(1));
  EXPECT_NEAR(readWeight(*s, "u")[0], 1.0 - 0.2 * data(1)[0], 1e-6);
  EXPECT_NEAR(readWeight(*s, "w")[0], w[0] - 0.2 * data(1)[0], 1e-6);
  SGD constChange({{"defaultLearningRate", {0.2f, false}}, {"defaultWeightDecay", {0.1f, true}}});
  EXPECT_THROW(s->updateOptimizerFromHost(&constChange), error);
  Adam other;
  EXPECT_THROW(s->updateOptimizerFromHost(&other), error);
}

TEST(TrainingSession, LossSelection) {
  SGD opt;
  EXPECT_THROW(session(opt, {}, linearModel(false, true)), error); // two scalar outputs, none named
  auto s = TrainingSession::createFromOnnxModel(linearModel(), DataFlow(1, std::vector<TensorId>{}), "nonexistent", opt);
  try {
    s->prepareDevice();
    FAIL();
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("nonexistent"), std::string::npos);
  }
  auto x = TrainingSession::createFromOnnxModel(linearModel(), DataFlow(1, std::vector<TensorId>{}), "x", opt);
  EXPECT_THROW(x->prepareDevice(), error); // not a scalar
}

TEST(TrainingSession, AccumulationUsesTheMeanOfTheMicroBatches) {
  SessionOptions so;
  so.enableGradientAccumulation = true;
  so.accumulationFactor = 2;
  SGD opt({{"defaultLearningRate", {0.1f, false}}});
  auto s = session(opt, so);
  std::vector<float> x = data(0), y = data(1), both = x;
  both.insert(both.end(), y.begin(), y.end());
  NDArrayWrapper<float> in(both.data(), {2, kN});
  std::vector<float> losses(2);
  NDArrayWrapper<float> out(losses.data(), {2});
  StepIO io({{"x", in}}, {});
  s->run(io);
  std::vector<float> w = readWeight(*s, "w");
  for (size_t i = 0; i < kN; ++i)
    EXPECT_NEAR(w[i], kW0[i] - 0.1 * (x[i] + y[i]) / 2, 1e-6);
  EXPECT_EQ(s->getStepCount(), 1);
  SessionOptions bad;
  bad.accumulationFactor = 2;
  EXPECT_THROW(session(opt, bad), error);
  NDArrayWrapper<float> wrong(both.data(), {kN * 2});
  StepIO badIo({{"x", wrong}}, {});
  EXPECT_THROW(s->run(badIo), error);
}

TEST(TrainingSession, ClippingByGlobalNorm) {
  SGD opt({{"defaultLearningRate", {1.0f, false}}}, {ClipNormSettings::clipAllWeights(0.5f)});
  auto s = session(opt, {}, linearModel(true));
  std::vector<float> x = data(2);
  step(*s, x);
  double norm = 0;
  for (float v : x)
    norm += 2.0 * v * v; // both weights have gradient x
  norm = std::sqrt(norm);
  double coef = std::min(1.0, 0.5 / (norm + 1e-6));
  ASSERT_LT(coef, 1.0);
  std::vector<float> w = readWeight(*s, "w");
  for (size_t i = 0; i < kN; ++i)
    EXPECT_NEAR(w[i], kW0[i] - coef * x[i], 1e-6);
}

TEST(TrainingSession, StaticLossScalingIsUndoneByTheUpdate) {
  SGD scaled({{"defaultLearningRate", {0.1f, false}}, {"lossScaling", {1024.0f, true}}});
  auto s = session(scaled);
  step(*s, data(0));
  std::vector<float> w = readWeight(*s, "w");
  for (size_t i = 0; i < kN; ++i)
    EXPECT_NEAR(w[i], kW0[i] - 0.1 * data(0)[i], 1e-6);
}

TEST(TrainingSession, DynamicLossScalingSkipsNonFiniteSteps) {
  SessionOptions so;
  so.automaticLossScalingSettings.enabled = true;
  so.automaticLossScalingSettings.growthInterval = 2;
  SGD opt({{"defaultLearningRate", {0.1f, false}}});
  auto s = session(opt, so);
  EXPECT_EQ(s->getLossScale(), 65536.0f);
  std::vector<float> bad = data(0);
  bad[2] = std::numeric_limits<float>::infinity();
  step(*s, bad);
  EXPECT_EQ(s->getStepCount(), 0);
  EXPECT_EQ(s->getSkippedSteps(), 1);
  EXPECT_EQ(s->getLossScale(), 32768.0f);
  EXPECT_EQ(readWeight(*s, "w")[0], 0.5f);
  step(*s, data(1));
  step(*s, data(2));
  EXPECT_EQ(s->getStepCount(), 2);
  EXPECT_EQ(s->getLossScale(), 65536.0f); // grown after growthInterval finite steps
  std::vector<float> w = readWeight(*s, "w");
  EXPECT_NEAR(w[0], 0.5 - 0.1 * (data(1)[0] + data(2)[0]), 1e-6);
}

TEST(TrainingSession, CheckpointResumeIsBitIdentical) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("popart_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string ckpt = (dir / "state.ckpt").string();
  Adam opt({{"defaultLearningRate", {0.01f, false}}}, AdamMode::Adam);
  auto a = session(opt);
  step(*a, data(0));
  step(*a, data(1));
  a->saveCheckpoint(ckpt);
  EXPECT_FALSE(fs::exists(ckpt + ".tmp"));
  step(*a, data(2));
  step(*a, data(3));
  auto b = session(opt);
  b->loadCheckpoint(ckpt);
  EXPECT_EQ(b->getStepCount(), 2);
  step(*b, data(2));
  step(*b, data(3));
  EXPECT_EQ(readWeight(*a, "w"), readWeight(*b, "w"));
  for (const auto &id : a->getOptimizerStateIds())
    EXPECT_EQ(readWeight(*a, id), readWeight(*b, id)) << id;

  // A truncated checkpoint is refused and leaves the session as it was.
  std::string bytes;
  {
    std::ifstream in(ckpt, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string broken = (dir / "broken.ckpt").string();
  std::ofstream(broken, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size() - 8));
  std::vector<float> before = readWeight(*b, "w");
  try {
    b->loadCheckpoint(broken);
    FAIL();
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_EQ(readWeight(*b, "w"), before);
  // A checkpoint of another model or optimiser is refused.
  auto c = session(opt, {}, linearModel(true));
  EXPECT_THROW(c->loadCheckpoint(ckpt), error);
  auto d = session(SGD());
  EXPECT_THROW(d->loadCheckpoint(ckpt), error);
  fs::remove_all(dir);
}

TEST(TrainingSession, ModelToHostRunsInInferenceSession) {
  namespace fs = std::filesystem;
  std::string path = (fs::temp_directory_path() / ("popart_trained_" + std::to_string(::getpid()) + ".onnx")).string();
  auto s = session(SGD({{"defaultLearningRate", {0.1f, false}}}));
  step(*s, data(0));
  s->modelToHost(path);
  std::vector<float> w = readWeight(*s, "w");
  auto inf = InferenceSession::createFromOnnxModel(path, DataFlow(1, {s->getLossId()}));
  std::vector<float> x = data(5);
  NDArrayWrapper<float> in(x.data(), {kN});
  float loss = 0;
  NDArrayWrapper<float> out(&loss, {});
  StepIO io({{"x", in}}, {{s->getLossId(), out}});
  inf->run(io);
  double expected = 0;
  for (size_t i = 0; i < kN; ++i)
    expected += double(w[i]) * x[i];
  EXPECT_NEAR(loss, expected, 1e-5);
  fs::remove(path);
}

TEST(TrainingSession, WriteWeightsAndErrors) {
  auto s = session(SGD());
  std::vector<float> v(kN, 3.0f);
  NDArrayWrapper<float> arr(v.data(), {kN});
  WeightsIO io;
  io.insert("w", arr);
  s->writeWeights(io);
  EXPECT_EQ(readWeight(*s, "w"), v);
  WeightsIO unknown;
  unknown.insert("nope", arr);
  EXPECT_THROW(s->writeWeights(unknown), error);
  std::vector<float> small(2);
  NDArrayWrapper<float> smallArr(small.data(), {2});
  WeightsIO wrong;
  wrong.insert("w", smallArr);
  EXPECT_THROW(s->readWeights(wrong), error);
  s->weightsFromHost(); // back to the model's initializers
  EXPECT_EQ(readWeight(*s, "w")[0], 0.5f);
}

TEST(TrainingSession, WeightsFromHostRestartsTrainingFromTheModelAndZeroState) {
  // Adam's moments start at zero and the step counter at 0; after weightsFromHost the same
  // steps must give the same weights and state, bit for bit, as the first time.
  Adam opt({{"defaultLearningRate", {0.05f, false}}}, AdamMode::Adam);
  auto s = session(opt);
  const std::vector<TensorId> stateIds = s->getOptimizerStateIds();
  ASSERT_FALSE(stateIds.empty());
  std::vector<std::vector<float>> first[2];
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      s->weightsFromHost();
      EXPECT_EQ(readWeight(*s, "w")[2], 2.0f);
    }
    for (int k = 0; k < 3; ++k)
      step(*s, data(k));
    first[pass].push_back(readWeight(*s, "w"));
    for (const auto &id : stateIds) {
      TensorInfo info = s->getInfo(id);
      if (info.dataType() == DataType::FLOAT) first[pass].push_back(readWeight(*s, id, info.elementCount()));
    }
  }
  EXPECT_NE(first[0][0], std::vector<float>(kW0.begin(), kW0.end()));
  EXPECT_EQ(first[0], first[1]);
}

TEST(TrainingSession, MemoryReportsThePlannedPeakAsTheSumOfItsParts) {
  auto s = session(Adam({{"defaultLearningRate", {0.05f, false}}}, AdamMode::Adam));
  s->enableProfiling();
  step(*s, data(0));
  const std::string summary = s->profileSummary();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(summary, m, std::regex(R"(memory: planned peak ([0-9.]+) MB: ([^\n]*))"))) << summary;
  const double peak = std::stod(m[1].str());
  const std::string rest = m[2].str();
  std::map<std::string, double> parts;
  double sum = 0;
  const std::regex partRe(R"(([a-z][a-z ]*) ([0-9.]+) MB)");
  for (auto it = std::sregex_iterator(rest.begin(), rest.end(), partRe); it != std::sregex_iterator(); ++it) {
    parts[(*it)[1].str()] = std::stod((*it)[2].str());
    sum += std::stod((*it)[2].str());
  }
  for (const char *part : {"activation arena", "kernels", "weights", "optimiser state"})
    EXPECT_TRUE(parts.count(part)) << part << " missing from: " << summary;
  EXPECT_NEAR(peak, sum, 0.01 * double(parts.size())) << summary; // each part rounded to 0.01 MB
}

TEST(TrainingSession, BatchesPerStepRunsOneUpdatePerBatchAndReturnsEveryLoss) {
  SGD opt({{"defaultLearningRate", {0.1f, false}}, {"defaultMomentum", {0.5f, true}}});
  auto one = session(opt);
  for (int k = 0; k < 3; ++k)
    step(*one, data(k));
  std::string model = linearModel();
  auto probe = session(opt, {}, model);
  TensorId loss = probe->getLossId();
  auto three = TrainingSession::createFromOnnxModel(model, DataFlow(3, {loss}, AnchorReturnType("ALL")), loss, opt);
  three->prepareDevice();
  std::vector<float> x;
  for (int k = 0; k < 3; ++k) {
    std::vector<float> d = data(k);
    x.insert(x.end(), d.begin(), d.end());
  }
  NDArrayWrapper<float> in(x.data(), {3, kN});
  std::vector<float> losses(3);
  NDArrayWrapper<float> out(losses.data(), {3});
  StepIO io({{"x", in}}, {{loss, out}});
  three->run(io);
  EXPECT_EQ(three->getStepCount(), 3);
  EXPECT_EQ(readWeight(*three, "w"), readWeight(*one, "w"));
  // The loss of batch k is computed with the weights after k updates: sum(w_k * x_k).
  auto replay = session(opt);
  for (int k = 0; k < 3; ++k) {
    std::vector<float> w = readWeight(*replay, "w"), d = data(k);
    double expected = 0;
    for (size_t i = 0; i < kN; ++i)
      expected += double(w[i]) * d[i];
    EXPECT_NEAR(losses[size_t(k)], expected, 1e-5) << "batch " << k;
    step(*replay, d);
  }
  NDArrayWrapper<float> wrongOut(losses.data(), {2});
  StepIO bad({{"x", in}}, {{loss, wrongOut}});
  EXPECT_THROW(three->run(bad), error);
}

TEST(TrainingSession, ConflictingSettingsAreRefusedByName) {
  SessionOptions dynamic;
  dynamic.automaticLossScalingSettings.enabled = true;
  try {
    session(SGD({{"lossScaling", {8.0f, true}}}), dynamic);
    FAIL();
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("lossScaling"), std::string::npos) << e.what();
  }
  try {
    session(SGD({}, {ClipNormSettings::clipWeights({"nope"}, 1.0f)}));
    FAIL();
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos) << e.what();
  }
}

TEST(TrainingSession, MergedUpdatesMatchUpdatesOpByOp) {
  // Weights of 100003, 7 and 40000 elements: the merged update's per-thread shares cut through
  // them; each optimiser gives bit-identical weights with the updates merged (fuseOps) or not.
  const std::vector<int64_t> sizes{100003, 7, 40000};
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId loss;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<float> w0(static_cast<size_t>(sizes[k]));
    for (size_t i = 0; i < w0.size(); ++i)
      w0[i] = static_cast<float>(std::sin(0.37 * double(i) + double(k)));
    TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {sizes[k]}), "x" + std::to_string(k));
    TensorId w = b->addInitializedInputTensor(w0, {sizes[k]}, "w" + std::to_string(k));
    TensorId part = ai.reducesum({ai.mul({w, x})}, std::nullopt, 0);
    loss = loss.empty() ? part : ai.add({loss, part});
  }
  b->addOutputTensor(loss);
  std::string model = b->getModelProto();
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  optimizers.push_back(std::make_unique<SGD>(
      SGD({{"defaultLearningRate", {0.1f, false}}, {"defaultMomentum", {0.9f, true}}, {"defaultWeightDecay", {0.01f, true}}})));
  optimizers.push_back(std::make_unique<Adam>(Adam({{"defaultLearningRate", {0.01f, false}},
                                                    {"defaultWeightDecay", {0.1f, true}}},
                                                   AdamMode::Adam, WeightDecayMode::Decay)));
  optimizers.push_back(std::make_unique<Adaptive>(Adaptive(
      {{"defaultLearningRate", {0.01f, false}}, {"defaultMomentum", {0.5f, true}}}, AdaptiveMode::CenteredRMSProp)));
  for (const auto &opt : optimizers) {
    std::vector<std::vector<float>> weights[2];
    for (int merged = 0; merged < 2; ++merged) {
      SessionOptions so;
      so.fuseOps = merged != 0;
      auto s = TrainingSession::createFromOnnxModel(model, DataFlow(1, {}, AnchorReturnType("ALL")), "", *opt, so);
      s->prepareDevice();
      s->weightsFromHost();
      s->enableProfiling();
      std::vector<std::vector<float>> xs(sizes.size());
      for (int t = 0; t < 2; ++t) {
        for (size_t k = 0; k < sizes.size(); ++k) {
          xs[k].resize(static_cast<size_t>(sizes[k]));
          for (size_t i = 0; i < xs[k].size(); ++i)
            xs[k][i] = static_cast<float>(std::cos(0.11 * double(i) * double(t + 1) + double(k)));
        }
        NDArrayWrapper<float> x0(xs[0].data(), {sizes[0]}), x1(xs[1].data(), {sizes[1]}), x2(xs[2].data(), {sizes[2]});
        StepIO step({{"x0", x0}, {"x1", x1}, {"x2", x2}}, {});
        s->run(step);
      }
      for (size_t k = 0; k < sizes.size(); ++k)
        weights[merged].push_back(readWeight(*s, "w" + std::to_string(k), sizes[k]));
      bool reportsMerged = s->profileSummary().find("3 merged updates") != std::string::npos;
      EXPECT_EQ(reportsMerged, merged != 0) << opt->name();
    }
    for (size_t k = 0; k < sizes.size(); ++k)
      ASSERT_EQ(weights[0][k], weights[1][k]) << opt->name() << " weight " << k;
  }
}
