#include <popart/dataflow.hpp>
#include <popart/error.hpp>

namespace popart {

AnchorReturnType::AnchorReturnType(const std::string &name, int returnPeriod)
    : returnPeriod_(returnPeriod), name_(name) {
  if (name == "FINAL")
    id_ = AnchorReturnTypeId::Final;
  else if (name == "ALL")
    id_ = AnchorReturnTypeId::All;
  else if (name == "SUM")
    id_ = AnchorReturnTypeId::Sum;
  else if (name == "EVERYN") {
    id_ = AnchorReturnTypeId::EveryN;
    if (returnPeriod <= 0) throw error("AnchorReturnType EVERYN needs a positive return period, got ", returnPeriod);
  } else {
    throw error("unknown anchor return type '", name, "' (expected FINAL, EVERYN, ALL or SUM)");
  }
}

DataFlow::DataFlow(int batchesPerStep, const std::map<TensorId, AnchorReturnType> &anchors)
    : batchesPerStep_(batchesPerStep), anchors_(anchors) {
  if (batchesPerStep <= 0) throw error("DataFlow: batchesPerStep must be positive, got ", batchesPerStep);
  for (const auto &[id, art] : anchors) {
    order_.push_back(id);
    if (art.id() == AnchorReturnTypeId::EveryN && batchesPerStep % art.rp() != 0)
      throw error("DataFlow: anchor '", id, "' returns every ", art.rp(),
                  " batches, which does not divide batchesPerStep ", batchesPerStep);
  }
}

DataFlow::DataFlow(int batchesPerStep, const std::vector<TensorId> &anchors, const AnchorReturnType &art)
    : DataFlow(batchesPerStep, [&] {
        std::map<TensorId, AnchorReturnType> m;
        for (const auto &id : anchors)
          m.emplace(id, art);
        return m;
      }()) {
  order_ = anchors;
}

const AnchorReturnType &DataFlow::art(const TensorId &id) const {
  auto it = anchors_.find(id);
  if (it == anchors_.end()) throw error("tensor '", id, "' is not an anchor of the DataFlow");
  return it->second;
}

int DataFlow::returnedCount(const TensorId &id) const {
  const AnchorReturnType &a = art(id);
  switch (a.id()) {
  case AnchorReturnTypeId::All: return batchesPerStep_;
  case AnchorReturnTypeId::EveryN: return batchesPerStep_ / a.rp();
  default: return 1;
  }
}

} // namespace popart
