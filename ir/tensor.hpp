#pragma once
// A tensor of the IR: a typed value with at most one producer and any number of consumers.

#include "core/tensordata.hpp"

#include <memory>
#include <string>
#include <vector>

namespace popart::ir {

class Op;

/// How a tensor gets its value, as in PopART.
enum class TensorKind {
  Stream,   ///< fed from the host each step
  Const,    ///< a constant known at compile time
  Variable, ///< a weight: lives across steps, may be updated
  ActGrad,  ///< produced by an op (activation or gradient)
};

const char *toString(TensorKind kind);
using popart::toString;

/// A tensor of a Graph.
class Tensor {
public:
  Tensor(TensorId id, TensorKind kind, TensorInfo info) : id_(std::move(id)), kind_(kind), info_(std::move(info)) {}

  const TensorId &id() const { return id_; }
  TensorKind kind() const { return kind_; }
  void setKind(TensorKind kind) { kind_ = kind; }
  const TensorInfo &info() const { return info_; }
  void setInfo(const TensorInfo &info) { info_ = info; }

  /// The value of a Const or Variable tensor; null otherwise.
  const std::shared_ptr<TensorData> &data() const { return data_; }
  void setData(std::shared_ptr<TensorData> data) { data_ = std::move(data); }
  /// True for a Const tensor (its value is known at compile time).
  bool isConst() const { return kind_ == TensorKind::Const && data_ != nullptr; }

  Op *producer() const { return producer_; }
  void setProducer(Op *op) { producer_ = op; }
  const std::vector<Op *> &consumers() const { return consumers_; }
  void addConsumer(Op *op) { consumers_.push_back(op); }
  void removeConsumer(Op *op);
  /// A value computed again for the backward pass (ir/passes/recompute.hpp): Graph::schedule()
  /// runs its producer just before its first reader, so that it is not live from the forward pass
  /// on. Kept on the tensor, not the op, so that a rewrite fusing its producer keeps it.
  bool recomputed() const { return recomputed_; }
  void setRecomputed(bool recomputed) { recomputed_ = recomputed; }

private:
  TensorId id_;
  TensorKind kind_;
  TensorInfo info_;
  std::shared_ptr<TensorData> data_;
  Op *producer_ = nullptr;
  std::vector<Op *> consumers_;
  bool recomputed_ = false;
};

} // namespace popart::ir
