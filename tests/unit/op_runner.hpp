#pragma once
// Runs one op as a one-op graph on the execution plan, with the kernels of one provider: for
// comparing a fast or oneDNN kernel with the reference through the real plan (scratch, threads).

#include "backend_cpu/kernel.hpp"
#include "core/tensordata.hpp"
#include "ir/attributes.hpp"

#include <random>
#include <string>
#include <vector>

namespace popart::op_runner {

struct Input {
  TensorId id;
  TensorData data;
};

/// Runs \p type (opset \p opset of \p domain, attributes \p attrs) on stream inputs \p ins and
/// constant inputs \p consts (in that order) with \p provider's kernels; returns its \p outputs
/// outputs.
std::vector<TensorData> runOp(const std::string &type, int opset, ir::Attributes attrs, const std::vector<Input> &ins,
                              const std::vector<Input> &consts, size_t outputs = 1,
                              const std::string &domain = "ai.onnx",
                              backend_cpu::KernelProvider provider = backend_cpu::KernelProvider::Reference);

/// A tensor of \p type and \p shape, uniform in [lo, hi) (values representable in f32, so that
/// the same draw in f32 and f64 holds the same numbers).
TensorData randomTensor(DataType type, const Shape &shape, std::mt19937 &rng, double lo, double hi);

/// Runs an optimiser update \p kernel in place: inputs {weight, gradient, hyperparameters, gradient
/// scale, state...} and outputs {weight, state...}, where \p buffers holds the weight then the state
/// (updated in place). run() if \p cuts is empty, else runRange over the ranges of [0, \p n) between
/// the cuts, last range first (the plan may run them in any order).
void runUpdateStep(backend_cpu::Kernel &kernel, const std::vector<void *> &buffers, const void *gradient,
                   const void *hyperParameters, const float &gradScale, int64_t n, const std::vector<int64_t> &cuts);

} // namespace popart::op_runner
