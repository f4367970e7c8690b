#pragma once
// The session library's passes of the training pipeline: findLoss and findWeights (which float
// initializers are trained, and why each other one is not), with the constants they start from.

#include "ir/passes/pass_manager.hpp"
#include <popart/session.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace popart::session {

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

/// What findLoss and findWeights read and fill (PassContext::state).
struct WeightDiscovery {
  const ir::Graph *declared = nullptr; ///< the model as imported: its initializers in model order
  std::string sourceName;              ///< the model's path, for messages
  Constants constants;
  std::vector<WeightStatus> statuses; ///< every float initializer, model order (filled)
};

/// \p g's only scalar output; throws naming the model \p sourceName if there is not exactly one.
TensorId onlyScalarOutput(const ir::Graph &g, const std::string &sourceName);

/// Registers findLoss and findWeights; safe to call more than once.
void registerSessionPasses();

} // namespace popart::session
