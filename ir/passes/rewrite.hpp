#pragma once
// Helpers shared by the graph rewrites of ir/passes (internal to the ir library).

#include "ir/graph.hpp"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace popart::ir {

/// The types a fused MatMul or Gemm computes in: FLOAT and the 16-bit floats of the precision
/// modes (oneDNN's bf16 matmul takes the same post-ops; the reference kernel takes any).
inline bool isMatMulFusionType(DataType t) {
  return t == DataType::FLOAT || t == DataType::BFLOAT16 || t == DataType::FLOAT16;
}
/// True for an op of ONNX's default domain of type \p type (false for null).
bool isOnnxOp(const Op *op, const char *type);
/// True when \p t is one of \p graph's outputs.
bool isGraphOutput(const Graph &graph, const Tensor &t);
/// Adds an op that replaces part of a rewritten graph: in \p phase, with \p fusion, its outputs
/// set up.
Op &addRewrittenOp(Graph &graph, int phase, const std::string &type, const std::string &domain, int version,
                   const std::string &name, Attributes attrs, const std::vector<TensorId> &inputs,
                   const std::vector<TensorId> &outputs, const Fusion &fusion = {});
/// Replaces \p producer and \p consumer, the only reader of \p producer's output 0, by one op of
/// \p producer's type, domain, version, name and phase, with \p attrs and \p fusion (each caller
/// says what the fused op carries), that reads \p inputs and writes \p consumer's output 0.
/// \p fusion is taken by value: it may be \p producer's own, which this removes.
Op &replacePair(Graph &graph, Op &producer, Op &consumer, Attributes attrs, Fusion fusion,
                const std::vector<TensorId> &inputs);
/// Replaces \p ops, whose outputs other than \p outputs are read only among them, by one op that
/// reads \p inputs and writes \p outputs (existing tensors or new ids), with \p fusion. The new op
/// takes the name and phase of ops[0]. \p fusion is a copy: it may be that of an op removed here.
Op &replaceOps(Graph &graph, const std::vector<Op *> &ops, std::string type, std::string domain, int version,
               Attributes attrs, const std::vector<TensorId> &inputs, const std::vector<TensorId> &outputs,
               Fusion fusion = {});
/// The ids of \p op's inputs ("" where one is omitted).
std::vector<TensorId> inputIds(const Op &op);

/// A graph and the tensors a rewrite must keep: its outputs and \p keep.
struct Kept {
  const Graph &graph;
  const std::vector<TensorId> &keep;
  bool has(const Tensor &t) const {
    return isGraphOutput(graph, t) || std::find(keep.begin(), keep.end(), t.id()) != keep.end();
  }
};
/// The one op that reads \p t, if \p t has exactly one reader and need not be kept.
Op *onlyReader(const Kept &kept, const Tensor &t);
/// The value of a constant with one element.
bool constScalar(const Tensor *t, double &value);
/// The input of the two-input \p op that is not \p known, or null if \p known is not one of them.
Tensor *otherInput(const Op &op, const Tensor &known);
/// True if the two-input \p op reads \p known and a constant scalar within \p tol of \p value.
bool withScalar(const Op *op, const Tensor &known, double value, double tol);

/// An Add or a two-input Sum of two distinct tensors.
bool isTwoInputAdd(const Op *op);
/// An Add or two-input Sum of \p producerOf(one input)'s result and a tensor r of its shape
/// becomes that producer with Fusion::residual and r as input 3 (after an optional bias).
bool foldResidual(Graph &graph, Op &op, const std::function<Op *(const Tensor &)> &producerOf);

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
