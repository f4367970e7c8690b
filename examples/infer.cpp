// The README's C++ example: run examples/mlp.onnx on one batch.
// Build: part of the CMake project (target example_infer). Run: build/example_infer examples/mlp.onnx

#include <popart/session.hpp>

#include <iostream>
#include <vector>

int main(int argc, char **argv) try {
  std::string model = argc > 1 ? argv[1] : "examples/mlp.onnx";
  popart::SessionOptions options;
  options.batchSize = 4; // the model's batch dimension is symbolic
  auto session = popart::InferenceSession::createFromOnnxModel(model, popart::DataFlow(1, {"probs"}), options);
  session->prepareDevice();

  std::vector<float> image(size_t{4} * 784, 0.5f), probs(size_t{4} * 10);
  popart::NDArrayWrapper<float> in(image.data(), {4, 784}), out(probs.data(), {4, 10});
  popart::StepIO stepio({{"image", in}}, {{"probs", out}});
  session->run(stepio);

  for (int c = 0; c < 10; ++c)
    std::cout << probs[c] << (c < 9 ? " " : "\n");
  return 0;
} catch (const popart::error &e) {
  std::cerr << "error: " << e.what() << "\n";
  return 2;
}
