#pragma once
// The optimizer library's pass of the training pipeline: applyOptimizer as a named pass.

#include "ir/passes/pass_manager.hpp"
#include "optimizer/apply.hpp"

namespace popart::optimizer {

/// What the applyOptimizer pass reads and makes (PassContext::state).
struct OptimizerPassState {
  const Optimizer *optimizer = nullptr; ///< set by the session
  ApplyOptions options;                 ///< set by the session
  AppliedOptimizer applied;             ///< filled by the pass
};

/// Registers applyOptimizer; safe to call more than once.
void registerOptimizerPasses();

} // namespace popart::optimizer
