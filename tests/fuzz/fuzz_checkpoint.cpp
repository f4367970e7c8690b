// libFuzzer target: TrainingSession::loadCheckpoint, on a session of a small MLP with SGD and
// momentum (so the checkpoint holds optimiser state too). The loader checks the model's
// fingerprint first: the seed corpus holds a real checkpoint of this session, which
// POPART_FUZZ_WRITE_CHECKPOINT=<path> makes the target write at start-up.

#include "fuzz_input_file.hpp"

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/optimizer.hpp>
#include <popart/session.hpp>

#include <cstdlib>
#include <vector>

namespace {

std::string mlpModel() {
  auto b = popart::Builder::create();
  auto ai = b->aiOnnxOpset13();
  using popart::TensorInfo;
  const auto f = popart::DataType::FLOAT;
  std::vector<float> w1(12), b1(3), w2(6), b2(2);
  for (size_t i = 0; i < w1.size(); ++i)
    w1[i] = 0.1f * static_cast<float>(i) - 0.5f;
  for (size_t i = 0; i < w2.size(); ++i)
    w2[i] = 0.5f - 0.2f * static_cast<float>(i);
  popart::TensorId x = b->addInputTensor(TensorInfo(f, {2, 4}), "x");
  popart::TensorId y = b->addInputTensor(TensorInfo(f, {2, 2}), "y");
  popart::TensorId tw1 = b->addInitializedInputTensor(w1.data(), TensorInfo(f, {4, 3}), "w1");
  popart::TensorId tb1 = b->addInitializedInputTensor(b1.data(), TensorInfo(f, {3}), "b1");
  popart::TensorId tw2 = b->addInitializedInputTensor(w2.data(), TensorInfo(f, {3, 2}), "w2");
  popart::TensorId tb2 = b->addInitializedInputTensor(b2.data(), TensorInfo(f, {2}), "b2");
  popart::TensorId h = ai.relu({ai.add({ai.matmul({x, tw1}), tb1})});
  popart::TensorId diff = ai.sub({ai.add({ai.matmul({h, tw2}), tb2}), y});
  b->addOutputTensor(ai.reducemean({ai.mul({diff, diff})}, std::nullopt, 0));
  return b->getModelProto();
}

popart::TrainingSession &session() {
  static const std::unique_ptr<popart::TrainingSession> s = [] {
    popart::SGD sgd({{"defaultLearningRate", {0.1f, false}}, {"defaultMomentum", {0.9f, true}}});
    popart::SessionOptions options;
    options.numThreads = 1;
    auto made = popart::TrainingSession::createFromOnnxModel(
        mlpModel(), popart::DataFlow(1, std::vector<popart::TensorId>{}), "", sgd, options);
    made->prepareDevice();
    made->weightsFromHost();
    return made;
  }();
  return *s;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int * /*argc*/, char *** /*argv*/) {
  if (const char *seed = std::getenv("POPART_FUZZ_WRITE_CHECKPOINT")) session().saveCheckpoint(seed);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string path = popart::fuzz::writeInputFile(data, size, "input.ckpt");
  try {
    session().loadCheckpoint(path);
  } catch (const popart::error &e) {
    popart::fuzz::expectedError(e);
  }
  return 0;
}
