#pragma once
/// \file DataFlow: how many batches a step runs and which tensors come back to the host.

#include <popart/tensorinfo.hpp>

#include <map>
#include <string>
#include <vector>

namespace popart {

/// How an anchor returns its values over the batches of one step.
enum class AnchorReturnTypeId {
  Final,  ///< only the last batch's value
  EveryN, ///< the value of every N-th batch
  All,    ///< every batch's value
  Sum,    ///< the sum over the batches
};

/// An anchor's return type, built from PopART's strings "FINAL", "EVERYN", "ALL", "SUM".
class AnchorReturnType {
public:
  /// \p name is one of FINAL, EVERYN, ALL, SUM; \p returnPeriod is N for EVERYN.
  explicit AnchorReturnType(const std::string &name = "ALL", int returnPeriod = 0);
  AnchorReturnTypeId id() const { return id_; }
  /// N for EVERYN.
  int rp() const { return returnPeriod_; }
  const std::string &str() const { return name_; }

private:
  AnchorReturnTypeId id_;
  int returnPeriod_;
  std::string name_;
};

/// Batches per step and the anchored tensors.
class DataFlow {
public:
  DataFlow() = default;
  /// \p anchors maps each anchored tensor to its return type.
  DataFlow(int batchesPerStep, const std::map<TensorId, AnchorReturnType> &anchors);
  /// Every tensor of \p anchors with the same return type \p art.
  DataFlow(int batchesPerStep, const std::vector<TensorId> &anchors,
           const AnchorReturnType &art = AnchorReturnType("ALL"));

  int batchesPerStep() const { return batchesPerStep_; }
  const std::vector<TensorId> &anchors() const { return order_; }
  bool isAnchored(const TensorId &id) const { return anchors_.count(id) != 0; }
  const AnchorReturnType &art(const TensorId &id) const;
  /// How many values an anchor returns per step (bps for ALL, bps/N for EVERYN, else 1).
  int returnedCount(const TensorId &id) const;

private:
  int batchesPerStep_ = 1;
  std::map<TensorId, AnchorReturnType> anchors_;
  std::vector<TensorId> order_;
};

} // namespace popart
