#pragma once
// Shared by the BatchNormalization kernels and its gradient rule.

#include "ir/internal_attributes.hpp"
#include "ir/op.hpp"
#include <popart/error.hpp>

namespace popart::ir {

/// True if BatchNormalization \p op normalises with batch statistics: training_mode=1 from
/// opset 14; before that, any of the statistics outputs being present.
inline bool batchNormTraining(const Op &op) {
  if (op.version >= 14) return op.attrs.getInt("training_mode", 0) != 0;
  for (size_t i = 1; i < op.outputCount(); ++i)
    if (op.hasOutput(i)) return true;
  return false;
}

/// The factor applied to the population batch variance before it enters running_var: 1 by the
/// ONNX spec, N/(N−1) with popart_unbiased_running_var=1 (PyTorch); \p count is N, the number of
/// values per channel. Throws naming \p op if the unbiased variance is asked for with N = 1.
inline double runningVarianceFactor(const Op &op, int64_t count) {
  if (op.attrs.getInt(ir::internal_attr::kUnbiasedRunningVar, 0) == 0) return 1.0;
  if (count < 2)
    throw error(op.debugName(), ": popart_unbiased_running_var needs more than one value per channel, got ", count);
  return static_cast<double>(count) / static_cast<double>(count - 1);
}

} // namespace popart::ir
