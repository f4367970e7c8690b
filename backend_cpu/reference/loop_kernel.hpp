#pragma once
// A reference kernel that is one loop, chosen (with its types and shapes) at creation.

#include "backend_cpu/kernel.hpp"

#include <functional>

namespace popart::backend_cpu {

using Loop = std::function<void(const KernelArgs &)>;

/// Runs the loop it was created with; the loop captures everything it needs by value.
class LoopKernel : public Kernel {
public:
  explicit LoopKernel(Loop loop) : loop_(std::move(loop)) {}
  void run(const KernelArgs &args) override { loop_(args); }

private:
  Loop loop_;
};

} // namespace popart::backend_cpu
