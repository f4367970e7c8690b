#pragma once
// oneDNN kernels checked against the reference kernels of the same op on random fp32 data.

#include "ir/op.hpp"

#include <functional>
#include <random>

namespace popart::kernel_compare {

/// max |a − b| / (1 + |b|) over two FLOAT tensors of the same size.
double maxRelDiff(const TensorData &a, const TensorData &b);

/// Runs \p op (set up, fp32; omitted inputs and outputs are null) with the reference kernel and with oneDNN's on the same inputs, input
/// i's values drawn by \p fill(i, rng); oneDNN runs twice (a second run must not accumulate) and
/// both kernels' outputs start as garbage. Expects every output to agree within 1e-4 relative.
void expectDnnlMatchesReference(const ir::Op &op, std::mt19937 &rng,
                                const std::function<float(size_t input, std::mt19937 &rng)> &fill);

} // namespace popart::kernel_compare
