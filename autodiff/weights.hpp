#pragma once
// Weight discovery for training: the constants made at import (frozen and shape-deciding float
// initializers), and the passes findLoss and findWeights (which float initializers the loss
// trains, and why each other one is not).

#include "ir/passes/pass_manager.hpp"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace popart::autodiff {

/// Float initializers made constants before shape inference, and why.
struct Constants {
  std::map<TensorId, std::string> frozen;        ///< by SessionOptions::frozenWeights: the entry
  std::map<TensorId, std::string> shapeDeciding; ///< values decide shapes: where
  /// For each shape-deciding one, the tensors it reaches through ops that differentiate it.
  std::map<TensorId, std::set<TensorId>> differentiableReach;
};

/// Makes constants of the float initializers that \p frozenWeights names, of those whose values
/// decide shapes (through value inputs, not through Shape or Size) and of every non-float one.
Constants makeConstants(ir::Graph &g, const std::vector<std::string> &frozenWeights);

/// What happens to a float initializer in training (the roles of popart::WeightStatus).
enum class WeightRole { Trained, Frozen, ShapeConstant, NoGradient, RunningStatistic };

/// One float initializer of the model, its role and why it is not trained ("" when trained).
struct FoundWeight {
  TensorId id;
  WeightRole role = WeightRole::Trained;
  std::string reason;
};

/// What findLoss and findWeights read and fill (PassContext::state).
struct WeightDiscovery {
  const ir::Graph *declared = nullptr; ///< the model as imported: its initializers in model order
  std::string sourceName;              ///< the model's path, for messages
  Constants constants;                 ///< set at import
  std::vector<FoundWeight> weights;    ///< every float initializer, model order (filled)
};

/// \p g's only scalar output; throws naming the model \p sourceName if there is not exactly one.
TensorId onlyScalarOutput(const ir::Graph &g, const std::string &sourceName);

/// Registers findLoss and findWeights; safe to call more than once.
void registerWeightPasses();

} // namespace popart::autodiff
