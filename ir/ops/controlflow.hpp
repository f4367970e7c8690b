#pragma once
// Subgraph ops (If, Loop, Scan, SequenceMap): how a subgraph's inputs map to the op's inputs, and
// how a subgraph is specialised for the infos (and values) it runs with. Shared by the ops' setup
// and the backend's kernels, which compile the specialised subgraphs into nested plans.

#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"

#include <memory>
#include <optional>
#include <vector>

namespace popart::ir {

/// The folder subgraph specialisation uses (the backend registers its reference evaluator at
/// start-up, as the IR cannot run kernels); null until then, which only disables folding.
void setSubgraphFolder(const ConstEvaluator *folder);
const ConstEvaluator *subgraphFolder();

/// Where each input of subgraph attribute \p attr of \p op comes from: -1 for a formal input
/// (the op's semantics give it: Loop's iteration number, a Scan slice ...), else the index of the
/// op input holding the outer-scope tensor it captures (the importer appends captured tensors
/// after the op's own inputs and names them in internal_attr::kCaptures).
std::vector<int> subgraphInputSources(const Op &op, const Graph &body);
/// Number of formal (not captured) inputs of \p body.
size_t formalInputCount(const Op &op, const Graph &body);
/// Number of the op's own inputs, before the captured ones.
size_t ownInputCount(const Op &op);

/// A clone of \p body whose inputs have \p infos (formal inputs in order, then captured ones,
/// as the subgraph lists them), with the values in \p values (non-null entries) baked in as
/// constants, and shapes inferred (folding with subgraphFolder()). Errors name the op (\p opName,
/// its debugName) and \p attr.
std::unique_ptr<Graph> specialiseSubgraph(const std::string &opName, const char *attr, const Graph &body,
                                          const std::vector<TensorInfo> &infos,
                                          const std::vector<const TensorData *> &values = {});

/// The infos of \p body's inputs for \p op: \p formal followed by the captured op inputs' infos.
std::vector<TensorInfo> subgraphInputInfos(const Op &op, const Graph &body, const std::vector<TensorInfo> &formal);

/// Infos of \p body's outputs: inferred from \p formal if \p body specialises for them, else the
/// types the model declares for its outputs; null if neither gives known infos.
std::optional<std::vector<TensorInfo>> subgraphOutputInfos(const Op &op, const char *attr, const Graph &body,
                                                           const std::vector<TensorInfo> &formal);

/// The info of a value that is \p a in some runs (iterations, branches) and \p b in others: the
/// same kind and type, dimensions that differ unknown, element lists only where equal.
TensorInfo mergeInfos(const TensorInfo &a, const TensorInfo &b);

/// Scan's layout: number of state variables, scan inputs and scan outputs, and the axes.
struct ScanLayout {
  bool batched = false;  ///< opset 8: input 0 is sequence_lens; axis 0 is a batch axis
  size_t states = 0;     ///< N
  size_t scanInputs = 0; ///< M
  size_t scanOutputs = 0;
  size_t firstState = 0; ///< op input index of the first state (1 for opset 8)
  std::vector<int64_t> inputAxes, inputReverse, outputAxes, outputReverse;
  int64_t length = 0; ///< iterations (the scan axis' size)
  int64_t batch = 1;
};
ScanLayout scanLayout(const Op &op);

} // namespace popart::ir
