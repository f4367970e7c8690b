#pragma once
/// \file Options of a session.

#include <popart/tensorinfo.hpp>

#include <map>
#include <string>

namespace popart {

/// Options that change how a session compiles and runs; the defaults suit most models.
struct SessionOptions {
  /// Threads for oneDNN and the reference kernels; 0 uses every core.
  int numThreads = 0;
  /// Sets every unknown (symbolic) leading dimension of the graph inputs; 0 leaves them to
  /// be taken from the first fed tensors.
  int64_t batchSize = 0;
  /// Fold ops whose inputs are all constant at compile time.
  bool constantFolding = true;
  /// "any" (oneDNN where it applies, else reference), "reference" or "dnnl".
  std::string kernels = "any";
  /// Run the ONNX checker on the imported model.
  bool checkModel = true;
};

/// Shapes of graph inputs given explicitly at session creation (PopART's InputShapeInfo).
class InputShapeInfo {
public:
  void add(const TensorId &id, const TensorInfo &info) { infos_[id] = info; }
  bool has(const TensorId &id) const { return infos_.count(id) != 0; }
  const TensorInfo &get(const TensorId &id) const { return infos_.at(id); }
  const std::map<TensorId, TensorInfo> &getAll() const { return infos_; }

private:
  std::map<TensorId, TensorInfo> infos_;
};

} // namespace popart
