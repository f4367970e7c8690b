#pragma once
// The base of the optimiser-update kernels (reference and fast): an update of n independent
// elements that the plan may run in ranges (merging updates into one parallel step) and that a
// run of its own splits into chunks over the threads. Each element is independent, so the
// result does not depend on the split or the thread count.

#include "backend_cpu/kernel.hpp"

#include <algorithm>
#include <vector>

namespace popart::backend_cpu {

class UpdateKernel : public Kernel {
public:
  /// Updates of weights with more elements than this are split across threads.
  static constexpr int64_t kParallelElements = 1 << 16;

  explicit UpdateKernel(const ir::Op &op) : n_(op.inInfo(0).elementCount()) {
    for (size_t i = 4; i < op.inputCount(); ++i)
      hasState_.push_back(op.hasInput(i));
  }

  int64_t rangeElements() const override { return n_; }
  void run(const KernelArgs &a) override {
    if (n_ <= kParallelElements) {
      runRange(a, 0, n_);
      return;
    }
    const int64_t chunks = (n_ + kParallelElements - 1) / kParallelElements;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c)
      runRange(a, c * kParallelElements, std::min(n_, (c + 1) * kParallelElements));
  }

protected:
  int64_t n_;
  std::vector<bool> hasState_;
  /// State tensor \p k (input 4 + k, updated in place through output 1 + k); null if absent.
  static float *state(const KernelArgs &a, size_t k) { return a.hasOutput(1 + k) ? a.out<float>(1 + k) : nullptr; }
};

} // namespace popart::backend_cpu
