// The Fashion-MNIST example: Builder model, TrainingSession fed by a DataLoader, test accuracy.

#include "cli/fashion_mnist.hpp"

#include "cli/dataloader.hpp"
#include "cli/idx.hpp"
#include "cli/train.hpp"

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <numeric>
#include <random>
#include <unistd.h>

namespace popart::cli {

namespace {

// Mean and standard deviation of the Fashion-MNIST training pixels, scaled to [0, 1].
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;
constexpr int64_t kClasses = 10;

/// Adds weights drawn as PyTorch's default initialisation of nn.Linear / nn.Conv2d does:
/// kaiming_uniform_(a=sqrt(5)) for the weight and U(±1/sqrt(fan_in)) for the bias, both of
/// which come to U(±1/sqrt(fan_in)).
class Initialiser {
public:
  Initialiser(Builder &b, uint64_t seed) : b_(b), rng_(seed) {}
  TensorId uniform(const Shape &shape, int64_t fanIn, const std::string &name) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(fanIn));
    std::uniform_real_distribution<float> u(-bound, bound);
    std::vector<float> v(static_cast<size_t>(shapeElementCount(shape)));
    for (auto &x : v)
      x = u(rng_);
    return b_.addInitializedInputTensor(v, shape, name);
  }

private:
  Builder &b_;
  std::mt19937_64 rng_;
};

TensorId scalar(Builder &b, float v, const std::string &name) {
  return b.addInitializedInputTensor(std::vector<float>{v}, {}, name);
}

/// nn.Linear(in, out) on [N, in].
TensorId linear(Builder &b, Initialiser &init, const TensorId &x, int64_t in, int64_t out, const std::string &name) {
  TensorId w = init.uniform({out, in}, in, name + ".weight");
  TensorId bias = init.uniform({out}, in, name + ".bias");
  return b.aiOnnxOpset13().gemm({x, w, bias}, 1.0f, 1.0f, 0, 1, name);
}

/// nn.Conv2d(in, out, k, padding=k/2) on [N, in, H, W].
TensorId conv(Builder &b, Initialiser &init, const TensorId &x, int64_t in, int64_t out, int64_t k,
              const std::string &name) {
  TensorId w = init.uniform({out, in, k, k}, in * k * k, name + ".weight");
  TensorId bias = init.uniform({out}, in * k * k, name + ".bias");
  const int64_t p = k / 2;
  return b.aiOnnxOpset13().conv({x, w, bias}, {1, 1}, 1, {k, k}, {p, p, p, p}, {1, 1}, name);
}

Dataset loadSplit(const std::string &dir, const std::string &prefix, const FashionMnistModel &m) {
  IdxArray images = readIdx(findIdxFile(dir, prefix + "-images-idx3-ubyte"));
  IdxArray labels = readIdx(findIdxFile(dir, prefix + "-labels-idx1-ubyte"));
  const std::string where = "Fashion-MNIST '" + dir + "' (" + prefix + ")";
  if (images.info.dataType() != DataType::UINT8 || images.info.rank() != 3 || images.info.dim(1) != 28 ||
      images.info.dim(2) != 28)
    throw error(where, ": images are ", images.info.toString(), ", expected UINT8[N,28,28]");
  if (labels.info.dataType() != DataType::UINT8 || labels.info.rank() != 1)
    throw error(where, ": labels are ", labels.info.toString(), ", expected UINT8[N]");
  const int64_t n = images.info.dim(0);
  if (labels.info.dim(0) != n) throw error(where, ": ", n, " images but ", labels.info.dim(0), " labels");
  std::vector<uint8_t> label32(static_cast<size_t>(n) * sizeof(int32_t));
  for (int64_t i = 0; i < n; ++i) {
    int32_t v = labels.bytes[static_cast<size_t>(i)];
    if (v >= kClasses) throw error(where, ": label ", i, " is ", v, ", outside [0, ", kClasses, ")");
    std::memcpy(label32.data() + i * sizeof(int32_t), &v, sizeof v);
  }
  Dataset d;
  d.push_back({m.image, TensorInfo(DataType::UINT8, {n, 1, 28, 28}), std::move(images.bytes)});
  d.push_back({m.label, TensorInfo(DataType::INT32, {n}), std::move(label32)});
  return d;
}

/// Fraction of \p data's samples whose largest logit is their label, in batches of \p batch.
double evaluate(InferenceSession &session, const FashionMnistModel &m, Dataset data, int64_t batch) {
  DataLoader loader(std::move(data), batch, false, 0);
  std::vector<float> logits(static_cast<size_t>(batch * kClasses));
  NDArrayWrapper<float> out(logits.data(), {batch, kClasses});
  int64_t correct = 0, seen = 0;
  for (int64_t s = 0; s < loader.stepsPerEpoch(); ++s) {
    Batch &b = loader.next();
    StepIO io(b.arrays(), {{m.logits, out}});
    session.run(io);
    const auto *labels = static_cast<const int32_t *>(b.array(m.label).data());
    for (int64_t i = 0; i < batch; ++i) {
      const float *row = logits.data() + i * kClasses;
      int64_t best = std::max_element(row, row + kClasses) - row;
      correct += best == labels[i];
    }
    seen += batch;
  }
  return static_cast<double>(correct) / static_cast<double>(seen);
}

/// The largest divisor of \p n not above \p limit.
int64_t divisorAtMost(int64_t n, int64_t limit) {
  for (int64_t d = std::min(n, limit); d > 1; --d)
    if (n % d == 0) return d;
  return 1;
}

} // namespace

FashionMnistModel buildFashionMnistModel(const std::string &kind, uint64_t seed) {
  if (kind != "mlp" && kind != "cnn") throw error("Fashion-MNIST: unknown model '", kind, "' (expected mlp or cnn)");
  auto builder = Builder::create();
  Builder &b = *builder;
  auto ai = b.aiOnnxOpset13();
  Initialiser init(b, seed);
  FashionMnistModel m;
  m.image = b.addInputTensor(TensorInfo(DataType::UINT8, {-1, 1, 28, 28}), "image");
  m.label = b.addInputTensor(TensorInfo(DataType::INT32, {-1}), "label");
  // (pixel / 255 - mean) / std, as one multiply and one add.
  TensorId x = ai.cast({m.image}, "FLOAT", "to_float");
  x = ai.mul({x, scalar(b, 1.0f / (255.0f * kPixelStd), "pixel_scale")}, "scale");
  x = ai.add({x, scalar(b, -kPixelMean / kPixelStd, "pixel_shift")}, "normalise");
  if (kind == "mlp") {
    x = ai.flatten({x}, 1, "flatten");
    x = ai.relu({linear(b, init, x, int64_t{28} * 28, 256, "fc1")}, "relu1");
    m.logits = linear(b, init, x, 256, kClasses, "fc2");
  } else {
    x = ai.relu({conv(b, init, x, 1, 16, 3, "conv1")}, "relu1");
    x = ai.maxpool({x}, 1, {2, 2}, {}, {2, 2}, "pool1")[0];
    x = ai.relu({conv(b, init, x, 16, 32, 3, "conv2")}, "relu2");
    x = ai.maxpool({x}, 1, {2, 2}, {}, {2, 2}, "pool2")[0];
    x = ai.flatten({x}, 1, "flatten");
    x = ai.relu({linear(b, init, x, int64_t{32} * 7 * 7, 128, "fc1")}, "relu3");
    m.logits = linear(b, init, x, 128, kClasses, "fc2");
  }
  m.loss = ai.softmaxcrossentropyloss({m.logits, m.label}, ReductionType::Mean, std::nullopt, "loss");
  b.addOutputTensor(m.logits);
  b.addOutputTensor(m.loss);
  m.proto = b.getModelProto();
  return m;
}

int runFashionMnistExample(const FashionMnistOptions &opt) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  const int64_t batch = opt.batch > 0 ? opt.batch : 64;
  const float lr = opt.lr > 0 ? opt.lr : 1e-3f;
  if (opt.epochs < 1) throw error("Fashion-MNIST: --epochs must be at least 1, got ", opt.epochs);
  if (opt.lrSchedule != "cosine" && opt.lrSchedule != "constant")
    throw error("Fashion-MNIST: unknown learning-rate schedule '", opt.lrSchedule, "' (expected cosine or constant)");

  FashionMnistModel m = buildFashionMnistModel(opt.model, opt.seed);
  Dataset train = loadSplit(opt.dataDir, "train", m);
  Dataset test = loadSplit(opt.dataDir, "t10k", m);
  const int64_t trainSamples = train[0].info.dim(0), testSamples = test[0].info.dim(0);
  const Replication &replication = opt.replication;
  const int64_t replicas = replication.slice.replicas;
  DataLoader loader(std::move(train), batch, true, opt.seed, 2, {}, replication.slice);
  const int64_t perEpoch = loader.stepsPerEpoch();
  const int64_t total = opt.steps > 0 ? opt.steps : perEpoch * opt.epochs;
  const int64_t epochs = (total + perEpoch - 1) / perEpoch;
  const int64_t globalBatch = loader.sampler().globalBatch();
  const std::string batchText =
      std::to_string(batch) + (replication.enabled() ? " x " + std::to_string(replicas) + " replicas (global batch " +
                                                           std::to_string(globalBatch) + ")"
                                                     : "");
  std::printf("Fashion-MNIST: %s, %ld training and %ld test images, batch %s, Adam lr %g (%s), %ld step(s)\n",
              opt.model.c_str(), static_cast<long>(trainSamples), static_cast<long>(testSamples), batchText.c_str(), lr,
              opt.lrSchedule.c_str(), static_cast<long>(total));
  std::printf("data: %ld steps per epoch, %ld training images dropped per epoch (the last, incomplete batch)\n",
              static_cast<long>(perEpoch), static_cast<long>(loader.sampler().droppedPerEpoch()));

  SessionOptions so;
  so.numThreads = opt.threads;
  so.batchSize = batch;
  so.kernels = opt.kernels;
  so.precision = opt.precision;
  replication.apply(so);
  Adam adam({{"defaultLearningRate", {lr, false}}}, AdamMode::Adam, WeightDecayMode::L2Regularization);
  auto session = TrainingSession::createFromOnnxModel(m.proto, DataFlow(1, {{m.loss, AnchorReturnType("FINAL")}}),
                                                      m.loss, adam, so);
  session->prepareDevice();

  float loss = 0.0f;
  NDArrayWrapper<float> lossOut(&loss, {});
  const auto trainStart = Clock::now();
  double windowLoss = 0.0;
  int64_t windowSteps = 0;
  auto windowStart = trainStart;
  for (int64_t t = 0; t < total; ++t) {
    Batch &b = loader.next();
    const LoaderPosition pos = b.position();
    if (opt.lrSchedule == "cosine") {
      // Annealed to 0 over the run, as torch.optim.lr_scheduler.CosineAnnealingLR(T_max = steps).
      const double progress = static_cast<double>(t) / static_cast<double>(total);
      const float stepLr = static_cast<float>(lr * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
      Adam next({{"defaultLearningRate", {stepLr, false}}}, AdamMode::Adam, WeightDecayMode::L2Regularization);
      session->updateOptimizerFromHost(&next);
    }
    StepIO io(b.arrays(), {{m.loss, lossOut}});
    session->run(io);
    // The mean over the replicas, the same on every rank, so that all of them stop together.
    const std::vector<double> losses = replication.gather({static_cast<double>(loss)});
    const double stepLoss = std::accumulate(losses.begin(), losses.end(), 0.0) / static_cast<double>(losses.size());
    if (!std::isfinite(stepLoss))
      throw error("Fashion-MNIST: the loss is ", stepLoss, " at epoch ", pos.epoch + 1, " step ", pos.step + 1);
    windowLoss += stepLoss;
    ++windowSteps;
    if ((pos.step + 1) % opt.logEvery == 0 || pos.step + 1 == perEpoch || t + 1 == total) {
      double secs = std::chrono::duration<double>(Clock::now() - windowStart).count();
      std::printf("epoch %ld/%ld  step %ld/%ld  loss %.4f  %.0f samples/s\n", static_cast<long>(pos.epoch + 1),
                  static_cast<long>(epochs), static_cast<long>(pos.step + 1), static_cast<long>(perEpoch),
                  windowLoss / static_cast<double>(windowSteps), static_cast<double>(windowSteps * globalBatch) / secs);
      std::fflush(stdout);
      windowLoss = 0.0;
      windowSteps = 0;
      windowStart = Clock::now();
    }
  }
  const int64_t trainedSamples = total * globalBatch;
  const double trainSecs = std::chrono::duration<double>(Clock::now() - trainStart).count();
  std::printf("trained %ld samples in %.1f s (%.0f samples/s; %.2f s waiting for the data loader)\n",
              static_cast<long>(trainedSamples), trainSecs, static_cast<double>(trainedSamples) / trainSecs,
              loader.waitedSeconds());

  // The replicas hold the same weights: rank 0 alone saves and evaluates them.
  if (!replication.leader()) return 0;
  namespace fs = std::filesystem;
  std::string path = opt.saveModel;
  if (path.empty())
    path = (fs::temp_directory_path() / ("popart-fashion-mnist-" + std::to_string(::getpid()) + ".onnx")).string();
  session->modelToHost(path);
  SessionOptions eo;
  eo.numThreads = opt.threads;
  const int64_t evalBatch = divisorAtMost(test[0].info.dim(0), 1000);
  eo.batchSize = evalBatch;
  double accuracy = 0.0;
  try {
    auto eval = InferenceSession::createFromOnnxModel(path, DataFlow(1, {m.logits}), eo);
    accuracy = evaluate(*eval, m, std::move(test), evalBatch);
  } catch (...) {
    if (opt.saveModel.empty()) fs::remove(path);
    throw;
  }
  if (opt.saveModel.empty()) fs::remove(path);
  std::printf("total time %.1f s\n", std::chrono::duration<double>(Clock::now() - started).count());
  std::printf("test accuracy: %.1f%%\n", 100.0 * accuracy);
  return 0;
}

void addExampleOptions(CLI::App &app, std::string &name, FashionMnistOptions &opt) {
  app.add_option("--example", name,
                 "train and test a built-in example instead of running a model: fashion-mnist (with --model, "
                 "--example-data and the training flags --epochs, --steps, --lr, --lr-schedule, --save)")
      ->check(CLI::IsMember({"fashion-mnist"}));
  app.add_option("--model", opt.model, "--example model: mlp | cnn (default mlp)")
      ->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--example-data", opt.dataDir, "folder of the Fashion-MNIST IDX files (default " + opt.dataDir + ")");
}

FashionMnistOptions exampleOptions(const CLI::App &app, const TrainOptions &train, FashionMnistOptions opt) {
  if (train.train) throw error("--example trains its own model and cannot be combined with --train");
  for (const char *f : {"--data-dir", "--iterations", "--save-outputs", "--rtol", "--atol", "--input", "--dump-ir"})
    if (app.count(f)) throw error(f, " applies to a model file and cannot be combined with --example");
  for (const char *f : {"--loss",
                        "--optimizer",
                        "--momentum",
                        "--dampening",
                        "--nesterov",
                        "--weight-decay",
                        "--beta1",
                        "--beta2",
                        "--eps",
                        "--alpha",
                        "--centered",
                        "--lr-decay",
                        "--initial-accumulator",
                        "--max-weight-norm",
                        "--warmup-steps",
                        "--lr-step-size",
                        "--lr-gamma",
                        "--lr-min",
                        "--loss-scaling",
                        "--clip-norm",
                        "--accumulate",
                        "--checkpoint",
                        "--checkpoint-every",
                        "--resume"})
    if (app.count(f)) throw error(f, " is not supported with --example (it trains with Adam)");
  if (app.count("--epochs")) {
    if (train.epochs != std::floor(train.epochs))
      throw error("--example needs a whole number of --epochs, got ", train.epochs);
    opt.epochs = static_cast<int>(train.epochs);
  }
  if (app.count("--steps")) opt.steps = train.steps;
  if (app.count("--lr")) opt.lr = static_cast<float>(train.lr);
  if (app.count("--lr-schedule")) opt.lrSchedule = train.lrSchedule;
  if (app.count("--save")) opt.saveModel = train.save;
  opt.seed = train.seed;
  opt.threads = train.threads;
  opt.batch = train.batch;
  opt.kernels = train.kernels;
  opt.precision = train.precision;
  opt.replication = train.replication;
  return opt;
}

} // namespace popart::cli
