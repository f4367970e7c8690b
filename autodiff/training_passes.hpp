#pragma once
// The training pipeline's passes of the autodiff library: Dropout seeds, BatchNorm running
// statistics, the scaled loss ("prepareTraining") and the backward graph itself.

#include "ir/passes/pass_manager.hpp"

namespace popart::autodiff {

/// Options of the training passes that the session sets (PassContext::state).
struct TrainingPassOptions {
  /// BatchNormalization updates running_var with the unbiased batch variance (PyTorch's way).
  bool unbiasedRunningVariance = true;
  /// Replication with ReplicatedStatistics::Mean: each updated running statistic goes through an
  /// AllReduce Mean before it is written back, so that every replica keeps the same.
  bool averageRunningStatistics = false;
};

/// Registers seedDropout, updateBatchNormStatistics, scaleLoss, buildGradients and
/// expandGradientOps; safe to call more than once.
void registerTrainingPasses();

} // namespace popart::autodiff
