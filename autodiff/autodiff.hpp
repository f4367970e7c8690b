#pragma once
// The backward-graph transform: gradients of a tensor with respect to others, built from
// ordinary IR ops by per-op gradient rules.

#include "ir/graph.hpp"

#include <string>
#include <vector>

namespace popart::autodiff {

/// Adds to \p graph the ops that compute d(sum of y)/dx for every x of \p xs (the infos of
/// the forward graph must be known). \returns one gradient tensor per x; an x that no gradient
/// reaches (\p y does not depend on it, or only through non-differentiable ops) gets a zero
/// constant, or "" when \p zeroForUnreached is false. Throws naming the op when an op on the
/// path has no gradient rule.
std::vector<TensorId> buildGradients(ir::Graph &graph, const TensorId &y, const std::vector<TensorId> &xs,
                                     bool zeroForUnreached = true);

/// Replaces each ai.onnx.preview.training Gradient op by the ops computing its outputs.
void expandGradientOps(ir::Graph &graph);

/// True if \p opType has a gradient rule.
bool hasGradient(const std::string &opType);

} // namespace popart::autodiff
