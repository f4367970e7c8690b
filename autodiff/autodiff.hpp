#pragma once
// The backward-graph transform: gradients of a tensor with respect to others, built from
// ordinary IR ops by per-op gradient rules.

#include "ir/graph.hpp"

#include <string>
#include <utility>
#include <vector>

namespace popart::autodiff {

/// Adds to \p graph the ops that compute d(sum of y)/dx for every x of \p xs (the infos of
/// the forward graph must be known). \returns one gradient tensor per x; an x that no gradient
/// reaches (\p y does not depend on it, or only through non-differentiable ops) gets a zero
/// constant, or "" when \p zeroForUnreached is false. Only ops between some x and \p y get
/// gradients; throws naming the op when such an op has no gradient rule.
std::vector<TensorId> buildGradients(ir::Graph &graph, const TensorId &y, const std::vector<TensorId> &xs,
                                     bool zeroForUnreached = true);

/// Replaces each ai.onnx.preview.training Gradient op by the ops computing its outputs.
void expandGradientOps(ir::Graph &graph);

/// True if a gradient rule covers \p type in \p domain ("" is ai.onnx) at opset \p version.
bool hasGradient(const std::string &domain, const std::string &type, int version);

/// The gradient column of docs/ops.md for \p type in \p domain over the opset ranges \p opsets
/// ([min, max], 1000 for no upper bound): "yes" if rules cover them all, "no" if none, "opsets a-b"
/// for the covered part otherwise, and "unrolled" for If, Loop and Scan, which training
/// differentiates after ir::unrollControlFlow where it can unroll them.
std::string gradientSupport(const std::string &domain, const std::string &type,
                            const std::vector<std::pair<int, int>> &opsets);

} // namespace popart::autodiff
