#pragma once
// Which axes a Reduce* op reduces, for the reduce kernels (reference and fast).

#include "ir/op.hpp"

#include <vector>

namespace popart::backend_cpu {

/// Which axes of input 0 a Reduce* op reduces (axes a constant input 1); \p identity is set when
/// it reduces none because of noop_with_empty_axes. Mirrors the op's setup().
inline std::vector<bool> reducedAxes(const ir::Op &op, bool &identity) {
  size_t rank = op.inInfo(0).rank();
  std::vector<int64_t> axes;
  if (const TensorData *a = op.optionalConstInput(1, "axes")) axes = a->toInt64Vector();
  identity = axes.empty() && op.attrs.getInt("noop_with_empty_axes", 0) != 0;
  std::vector<bool> reduced(rank, axes.empty() && !identity);
  for (int64_t a : axes)
    reduced[static_cast<size_t>(a < 0 ? a + static_cast<int64_t>(rank) : a)] = true;
  return reduced;
}

} // namespace popart::backend_cpu
