#pragma once
// The IR verifier: checks that a graph is well formed, so that a pass that breaks it is named at
// once (the pass manager runs it after every pass in debug builds and in tests).

#include "ir/graph.hpp"

#include <string>

namespace popart::ir {

/// What verifyGraph checks beyond the links.
struct VerifyOptions {
  /// Every present op output has a known type (after shape inference).
  bool outputInfos = false;
};

/// Throws popart::error naming the first problem found, prefixed by \p context ("after pass
/// 'fuseRelu'"): an op without a definition or owned by another graph, input/output links that
/// disagree with the tensors' producer and consumer lists (counted per input slot), a tensor
/// linked to an op not in the graph, a consumed tensor that nothing produces and that is no graph
/// input, constant or variable, an activation that nothing produces or reads and that is no graph
/// input or output (dangling), a Fusion field the op's definition does not declare or whose value
/// does not fit the op (naming the op and the field), an op output without a known type (with \p options.outputInfos),
/// a graph input or output that does not exist, or a cycle.
void verifyGraph(const Graph &graph, const std::string &context, const VerifyOptions &options = {});

} // namespace popart::ir
