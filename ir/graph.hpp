#pragma once
// A graph of ops and tensors, with its inputs, outputs and opset versions.

#include "ir/op.hpp"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace popart::ir {

/// The IR of one model.
class Graph {
public:
  Graph() = default;
  Graph(const Graph &) = delete;
  Graph &operator=(const Graph &) = delete;

  /// Adds a tensor; throws if \p id exists.
  Tensor &addTensor(const TensorId &id, TensorKind kind, const TensorInfo &info);
  /// Adds a Const tensor holding \p data.
  Tensor &addConst(const TensorId &id, TensorData data);
  /// The tensor \p id; throws naming it if absent.
  Tensor &tensor(const TensorId &id) const;
  /// The tensor \p id, or null.
  Tensor *findTensor(const TensorId &id) const;
  bool hasTensor(const TensorId &id) const { return tensors_.count(id) != 0; }
  /// Removes a tensor that nothing produces or consumes.
  void removeTensor(const TensorId &id);

  /// Adds an op whose inputs exist ("" for an omitted optional input) and whose outputs are
  /// new ActGrad tensors of unknown info ("" for an omitted optional output). The OpDef is
  /// looked up in the registry; throws if the type or version is unsupported.
  Op &addOp(const std::string &type, const std::string &domain, int version, const std::string &name, Attributes attrs,
            const std::vector<TensorId> &inputs, const std::vector<TensorId> &outputs);
  /// Removes \p op and disconnects it (its outputs stay, without producer).
  void removeOp(Op &op);
  /// Replaces input \p index of \p op by \p tensor (may be null).
  void setOpInput(Op &op, size_t index, Tensor *tensor);
  /// Makes \p op write \p tensor (which has no producer) as output \p index; the tensor it wrote
  /// before keeps no producer.
  void setOpOutput(Op &op, size_t index, Tensor *tensor);
  const std::vector<std::unique_ptr<Op>> &ops() const { return ops_; }
  /// The id the next added op gets: ops added from now on have ids at least this (and sit at the
  /// end of ops()).
  int64_t nextOpId() const { return nextOpId_; }
  const std::map<TensorId, std::unique_ptr<Tensor>> &tensors() const { return tensors_; }

  const std::vector<TensorId> &inputs() const { return inputs_; }
  const std::vector<TensorId> &outputs() const { return outputs_; }
  void addInput(const TensorId &id) { inputs_.push_back(id); }
  void addOutput(const TensorId &id) { outputs_.push_back(id); }
  void setOutputs(std::vector<TensorId> ids) { outputs_ = std::move(ids); }
  /// The model's initializers in model order (weights are reported in this order).
  const std::vector<TensorId> &initializers() const { return initializers_; }
  void addInitializer(const TensorId &id) { initializers_.push_back(id); }

  /// Opset version per domain ("ai.onnx" → 13).
  std::map<std::string, int> &opsets() { return opsets_; }
  const std::map<std::string, int> &opsets() const { return opsets_; }

  /// A tensor id not yet used, starting with \p prefix.
  TensorId uniqueId(const std::string &prefix);

  /// Ops in an order where every producer comes before its consumers; throws on a cycle,
  /// naming a tensor on it. Ops that read no op's output, and ops writing a Tensor::recomputed
  /// tensor, run just before their first reader.
  std::vector<Op *> schedule() const;
  /// Checks every consumed tensor is a graph input, a constant/variable or produced by an op.
  void checkConnected() const;
  /// A copy of this graph: tensors (Const and Variable data shared, not copied), ops with
  /// their attributes, fusions, inputs, outputs and opsets. Subgraph attributes are shared too (nothing
  /// edits them). Used to specialise subgraphs for the infos they are run with.
  std::unique_ptr<Graph> clone() const;
  /// A text dump: inputs, tensors with kinds and infos, ops in schedule order (with their
  /// attributes and fused{...} fields).
  std::string dump() const;

private:
  std::map<TensorId, std::unique_ptr<Tensor>> tensors_;
  std::vector<std::unique_ptr<Op>> ops_;
  std::vector<TensorId> inputs_;
  std::vector<TensorId> outputs_;
  std::vector<TensorId> initializers_;
  std::map<std::string, int> opsets_;
  int64_t nextOpId_ = 0;
  int64_t nextUniqueId_ = 0;
};

} // namespace popart::ir
