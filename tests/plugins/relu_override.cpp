// Overrides the kernel of the built-in ai.onnx Relu for FLOAT (other types keep the built-in
// kernels), counting its runs so that a test can see that it ran.

#include <popart/custom_op.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace {

std::atomic<int64_t> runs{0};

class CountingRelu final : public popart::CustomKernel {
public:
  void run(const popart::CustomKernelRun &r) override {
    auto x = r.input<float>(0);
    auto y = r.output<float>(0);
    r.parallelFor(x.size, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        y[i] = x[i] > 0 ? x[i] : 0.0f;
    });
    ++runs;
  }
};

} // namespace

/// How often the override ran.
extern "C" __attribute__((visibility("default"))) int64_t relu_override_runs() { return runs.load(); }

POPART_CUSTOM_OP_LIBRARY(r) {
  popart::CustomKernelOverride k;
  k.domain = "ai.onnx";
  k.type = "Relu";
  k.supports = [](const popart::CustomOpNode &node) -> std::string {
    return node.inputs[0].dataType() == popart::DataType::FLOAT ? "" : "FLOAT only";
  };
  k.kernel = [](const popart::CustomOpNode &) -> std::unique_ptr<popart::CustomKernel> {
    return std::make_unique<CountingRelu>();
  };
  r.overrideKernel(k);
}
