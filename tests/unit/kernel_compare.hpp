#pragma once
// oneDNN and fast kernels checked against the reference kernels of the same op on random fp32 data.

#include "backend_cpu/kernel.hpp"
#include "ir/op.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

namespace popart::kernel_compare {

/// |got − want| / (1 + |want|): relative, absolute near 0. NaN if either is NaN or an infinity.
inline double relDiff(double got, double want) { return std::fabs(got - want) / (1.0 + std::fabs(want)); }

/// The larger of \p worst and \p diff, where a NaN \p diff (a NaN or infinite value compared) is
/// infinitely large: std::max(worst, NaN) returns worst, so a kernel writing NaN would pass.
inline double worseOf(double worst, double diff) {
  return std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(worst, diff);
}

/// max relDiff(a, b) over two tensors of any floating-point type; infinite if any element of either
/// is NaN or infinite, or if their element counts differ, so that every comparison against a
/// tolerance fails then.
double maxRelDiff(const TensorData &a, const TensorData &b);

/// Runs \p op (set up, fp32; omitted inputs and outputs are null) with the reference kernel and with \p provider's
/// (oneDNN's or a fast one) on the same inputs, input i's values drawn by \p fill(i, rng); the tested kernel runs
/// twice (a second run must not accumulate) and both kernels' outputs start as garbage. Expects every output to
/// agree within \p tolerance relative; fails if \p provider has no kernel that accepts the op.
void expectProviderMatchesReference(backend_cpu::KernelProvider provider, const ir::Op &op, std::mt19937 &rng,
                                    const std::function<float(size_t input, std::mt19937 &rng)> &fill,
                                    double tolerance = 1e-4);

/// expectProviderMatchesReference for oneDNN.
inline void expectDnnlMatchesReference(const ir::Op &op, std::mt19937 &rng,
                                       const std::function<float(size_t input, std::mt19937 &rng)> &fill) {
  expectProviderMatchesReference(backend_cpu::KernelProvider::Dnnl, op, rng, fill);
}

} // namespace popart::kernel_compare
