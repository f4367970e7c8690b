#pragma once
// Helpers shared by the graph rewrites of ir/passes (internal to the ir library).

#include "ir/graph.hpp"

#include <string>
#include <vector>

namespace popart::ir {

/// True for an op of ONNX's default domain of type \p type (false for null).
bool isOnnxOp(const Op *op, const char *type);
/// True when \p t is one of \p graph's outputs.
bool isGraphOutput(const Graph &graph, const Tensor &t);
/// Adds an op that replaces part of a rewritten graph: in \p phase, its outputs set up.
Op &addRewrittenOp(Graph &graph, int phase, const std::string &type, const std::string &domain, int version,
                   const std::string &name, Attributes attrs, const std::vector<TensorId> &inputs,
                   const std::vector<TensorId> &outputs);

/// Calls \p tryAt on the ops in schedule order, starting again after every rewrite, until none
/// rewrites; returns the number of rewrites.
template <typename F> int rewriteAll(Graph &graph, F tryAt) {
  int rewritten = 0;
  for (bool changed = true; changed;) {
    changed = false;
    for (Op *op : graph.schedule())
      if (tryAt(*op)) {
        ++rewritten;
        changed = true;
        break;
      }
  }
  return rewritten;
}

} // namespace popart::ir
