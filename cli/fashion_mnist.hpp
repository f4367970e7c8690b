#pragma once
/// \file The Fashion-MNIST example of popart-run: a model built with popart::Builder, trained by a
/// TrainingSession fed from a DataLoader, then evaluated on the 10,000 test images.

#include "cli/replication.hpp"

#include <popart/tensorinfo.hpp>

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace popart::cli {

struct TrainOptions;

/// Settings of the example; zeros choose the model's defaults.
struct FashionMnistOptions {
  /// "mlp" (784-256-10) or "cnn" (two conv+relu+maxpool blocks, then 128-10).
  std::string model = "mlp";
  int epochs = 1;
  /// Samples per batch (0: 64).
  int64_t batch = 0;
  /// Learning rate of Adam (0: 1e-3).
  float lr = 0.0f;
  /// "cosine" (annealed to 0 over all steps of the run) or "constant".
  std::string lrSchedule = "cosine";
  /// Threads of the session (0: every core).
  int threads = 0;
  /// Seeds the weights and the shuffling.
  uint64_t seed = 0;
  /// Folder with the four IDX files (plain or .gz).
  std::string dataDir = "/usr/share/datasets/fashion-mnist";
  /// Weight updates in all (0: epochs × the steps of an epoch); for quick runs.
  int64_t steps = 0;
  /// "any", "reference" or "dnnl" (SessionOptions::kernels).
  std::string kernels = "any";
  /// SessionOptions::precision.
  std::string precision = "fp32";
  /// Print a progress line every this many steps.
  int64_t logEvery = 100;
  /// Also write the trained model here (ONNX).
  std::string saveModel;
  /// Data-parallel replicas: each trains on its slice of every global batch of batch × replicas
  /// images; rank 0 prints, evaluates and saves.
  Replication replication;
};

/// A model of the example: the serialized ModelProto and its tensor names.
struct FashionMnistModel {
  std::string proto;
  /// UINT8 [N, 1, 28, 28] pixels, normalised inside the model.
  TensorId image;
  /// INT32 [N] class indices.
  TensorId label;
  /// FLOAT [N, 10] unnormalised class scores.
  TensorId logits;
  /// FLOAT scalar: the mean softmax cross-entropy.
  TensorId loss;
};

/// Builds model \p kind ("mlp" or "cnn") with a symbolic batch dimension; weights and biases are
/// drawn as PyTorch's nn.Linear and nn.Conv2d initialise them (uniform in ±1/sqrt(fan_in)) from \p seed.
FashionMnistModel buildFashionMnistModel(const std::string &kind, uint64_t seed);

/// Trains, evaluates on the test set and prints "test accuracy: NN.N%"; \returns 0.
int runFashionMnistExample(const FashionMnistOptions &options);

/// Adds `--example NAME`, `--model` and `--example-data` to \p app; \p name stays empty unless
/// --example is given.
void addExampleOptions(CLI::App &app, std::string &name, FashionMnistOptions &options);

/// \p options completed from the training flags of \p app that the example shares with --train
/// (--epochs, --steps, --lr, --lr-schedule, --save) and from --seed, --threads, --batch and
/// --kernels (which the caller copies into \p train); throws naming a flag that does not apply.
FashionMnistOptions exampleOptions(const CLI::App &app, const TrainOptions &train, FashionMnistOptions options);

} // namespace popart::cli
