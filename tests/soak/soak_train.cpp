// The training program of scripts/soak.sh: trains a small MLP (two MatMuls, Relu, softmax
// cross-entropy, Adam) for STEPS steps on a fixed synthetic dataset, writes each step's loss
// (as C99 hex floats, so that two runs compare bit for bit) to LOSS_FILE, and every
// SAMPLE_EVERY steps prints this process's resident set, open file descriptors and threads as
//   sample STEP RSS_KB FDS THREADS
// Sampling at step boundaries from inside the process measures the same point of every step.
// Usage: soak_train STEPS LOSS_FILE [SAMPLE_EVERY] [THREADS]

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

using namespace popart;

namespace {

constexpr int64_t kBatch = 32, kIn = 64, kHidden = 128, kClasses = 10, kBatches = 16;

std::string mlp(TensorId &loss) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  auto weights = [&](int64_t n) {
    std::vector<float> w(static_cast<size_t>(n));
    for (float &v : w)
      v = normal(rng);
    return w;
  };
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kBatch, kIn}), "x");
  TensorId labels = b->addInputTensor(TensorInfo(DataType::INT32, {kBatch}), "labels");
  TensorId w1 = b->addInitializedInputTensor(weights(kIn * kHidden), {kIn, kHidden}, "w1");
  TensorId b1 = b->addInitializedInputTensor(std::vector<float>(kHidden, 0.0f), {kHidden}, "b1");
  TensorId w2 = b->addInitializedInputTensor(weights(kHidden * kClasses), {kHidden, kClasses}, "w2");
  TensorId h = ai.relu({ai.add({ai.matmul({x, w1}), b1})});
  loss = ai.softmaxcrossentropyloss({ai.matmul({h, w2}), labels});
  b->addOutputTensor(loss);
  return b->getModelProto();
}

int64_t countEntries(const char *dir) {
  int64_t n = 0;
  for ([[maybe_unused]] const auto &e : std::filesystem::directory_iterator(dir))
    ++n;
  return n;
}

int64_t rssKb() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      status >> kb;
      return kb;
    }
    status.ignore(1 << 16, '\n');
  }
  return -1;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::cerr << "usage: soak_train STEPS LOSS_FILE [SAMPLE_EVERY] [THREADS]\n";
    return 2;
  }
  try {
    const int64_t steps = std::stoll(argv[1]);
    const int64_t every = argc > 3 ? std::stoll(argv[3]) : 50;
    if (steps <= 0 || every <= 0) throw error("STEPS and SAMPLE_EVERY must be positive");
    TensorId loss;
    const std::string model = mlp(loss);
    SessionOptions so;
    so.numThreads = argc > 4 ? std::stoi(argv[4]) : 0;
    Adam adam({{"defaultLearningRate", {0.001f, false}}}, AdamMode::Adam);
    auto session = TrainingSession::createFromOnnxModel(model, DataFlow(1, {loss}, AnchorReturnType("FINAL")), loss,
                                                        adam, so);
    session->prepareDevice();
    session->setRandomSeed(1);

    // A fixed dataset whose labels depend on the inputs (so that the loss falls), cycled.
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> xs(static_cast<size_t>(kBatches * kBatch * kIn));
    std::vector<int32_t> ys(static_cast<size_t>(kBatches * kBatch));
    for (size_t s = 0; s < ys.size(); ++s) {
      float best = -1e30f;
      for (int64_t i = 0; i < kIn; ++i) {
        float v = normal(rng);
        xs[s * kIn + size_t(i)] = v;
        if (i < kClasses && v > best) {
          best = v;
          ys[s] = static_cast<int32_t>(i);
        }
      }
    }
    std::FILE *out = std::fopen(argv[2], "w");
    if (!out) throw error("cannot write '", argv[2], "'");
    float value = 0;
    NDArrayWrapper<float> lossOut(&value, {});
    for (int64_t step = 1; step <= steps; ++step) {
      const int64_t k = (step - 1) % kBatches;
      NDArrayWrapper<float> x(xs.data() + k * kBatch * kIn, {kBatch, kIn});
      NDArrayWrapper<int32_t> y(ys.data() + k * kBatch, {kBatch});
      StepIO io({{"x", x}, {"labels", y}}, {{loss, lossOut}});
      session->run(io);
      std::fprintf(out, "%a\n", static_cast<double>(value));
      if (step % every == 0) {
        std::fflush(out);
        std::printf("sample %lld %lld %lld %lld\n", static_cast<long long>(step), static_cast<long long>(rssKb()),
                    static_cast<long long>(countEntries("/proc/self/fd")),
                    static_cast<long long>(countEntries("/proc/self/task")));
        std::fflush(stdout);
      }
    }
    std::fclose(out);
    std::printf("final loss %.6g after %lld steps\n", static_cast<double>(value), static_cast<long long>(steps));
    return 0;
  } catch (const std::exception &e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
