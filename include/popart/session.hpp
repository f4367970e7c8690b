#pragma once
/// \file Sessions: compile a model once, then run it step by step.

#include <popart/dataflow.hpp>
#include <popart/sessionoptions.hpp>
#include <popart/stepio.hpp>

#include <memory>
#include <string>
#include <vector>

namespace popart {

/// Runs an ONNX model for inference.
class InferenceSession {
public:
  /// \p model is a path to an .onnx file or a serialized ModelProto.
  static std::unique_ptr<InferenceSession> createFromOnnxModel(const std::string &model, const DataFlow &dataFlow,
                                                               const SessionOptions &options = {});
  /// As above, with explicit shapes for inputs whose shapes the model leaves symbolic.
  static std::unique_ptr<InferenceSession> createFromOnnxModel(const std::string &model, const DataFlow &dataFlow,
                                                               const InputShapeInfo &inputShapes,
                                                               const SessionOptions &options = {});
  ~InferenceSession();

  /// Compiles the execution plan now if every input shape is known; otherwise the first
  /// run() compiles it from the fed shapes.
  void prepareDevice();
  /// Runs batchesPerStep batches from \p stepio's inputs and writes the anchors.
  void run(StepIO &stepio);

  /// The graph inputs fed from the host, in model order.
  std::vector<TensorId> getInputIds() const;
  /// The graph outputs, in model order.
  std::vector<TensorId> getOutputIds() const;
  /// Type and shape of tensor \p id (-1 for dimensions not known until the first run).
  TensorInfo getInfo(const TensorId &id) const;
  /// The IR as text (after compilation if it has happened).
  std::string dumpIr() const;
  /// Bytes of the activation arena of the compiled plan (0 before compilation).
  int64_t plannedArenaBytes() const;

private:
  InferenceSession();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace popart
