#include "kernel_compare.hpp"

#include "backend_cpu/kernel.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace popart::kernel_compare {

double maxRelDiff(const TensorData &a, const TensorData &b) {
  if (a.info().elementCount() != b.info().elementCount()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (int64_t i = 0; i < a.info().elementCount(); ++i)
    worst = worseOf(worst, relDiff(a.valueAsDouble(i), b.valueAsDouble(i)));
  return worst;
}

void expectProviderMatchesReference(backend_cpu::KernelProvider provider, const ir::Op &op, std::mt19937 &rng,
                                    const std::function<float(size_t input, std::mt19937 &rng)> &fill,
                                    double tolerance) {
  using backend_cpu::KernelProvider;
  std::vector<TensorData> inputs;
  std::vector<const void *> in;
  for (size_t i = 0; i < op.inputCount(); ++i) {
    inputs.emplace_back(op.hasInput(i) ? op.inInfo(i) : TensorInfo(DataType::FLOAT, {0}));
    for (int64_t k = 0; k < inputs.back().info().elementCount(); ++k)
      inputs.back().as<float>()[k] = fill(i, rng);
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    in.push_back(op.hasInput(i) ? inputs[i].data() : nullptr);
  std::vector<TensorData> ref, out;
  std::vector<void *> refp, outp;
  for (size_t i = 0; i < op.outputCount(); ++i) {
    if (!op.hasOutput(i)) { // omitted
      ref.emplace_back(TensorInfo(DataType::FLOAT, {0}));
      out.emplace_back(TensorInfo(DataType::FLOAT, {0}));
      refp.push_back(nullptr);
      outp.push_back(nullptr);
      continue;
    }
    ref.emplace_back(op.outInfo(i));
    out.emplace_back(op.outInfo(i));
    // Stale output values must not leak into the result: fill both with garbage first.
    for (int64_t k = 0; k < ref.back().info().elementCount(); ++k)
      ref.back().as<float>()[k] = out.back().as<float>()[k] = 1e6f;
    refp.push_back(ref.back().data());
    outp.push_back(out.back().data());
  }
  backend_cpu::createKernel(op, KernelProvider::Reference)->run({in.data(), in.size(), refp.data(), refp.size()});
  auto kernel = backend_cpu::createKernel(op, provider);
  kernel->run({in.data(), in.size(), outp.data(), outp.size()});
  kernel->run({in.data(), in.size(), outp.data(), outp.size()}); // a second run must not accumulate
  for (size_t i = 0; i < op.outputCount(); ++i)
    if (op.hasOutput(i)) {
      EXPECT_LT(maxRelDiff(out[i], ref[i]), tolerance)
          << op.type << " output " << i << " (" << backend_cpu::kernelProviderName(provider) << ")";
    }
}

} // namespace popart::kernel_compare
