#pragma once
// ONNX ModelProto → ir::Graph. This header includes no onnx or protobuf header.

#include "core/tensordata.hpp"
#include "ir/graph.hpp"

#include <map>
#include <memory>
#include <string>

namespace popart::onnx_import {

struct ImportOptions {
  /// Initializers become Variable tensors (weights that training updates) instead of Const.
  bool initializersAsVariables = false;
  /// Run onnx::checker on the model.
  bool check = true;
  /// Const initializers take their data from this graph's tensor of the same name and info
  /// (shared, not copied) where it has one: a second import of the same model, as a session's
  /// recompile does. Nothing writes a Const's data, so the two graphs can share it.
  const ir::Graph *initializersFrom = nullptr;
};

/// Loads the model in file \p path; external data is resolved relative to its folder.
std::unique_ptr<ir::Graph> importModelFile(const std::string &path, const ImportOptions &options = {});
/// Loads a serialized ModelProto; external data is resolved relative to \p baseDir.
std::unique_ptr<ir::Graph> importModelBytes(const std::string &bytes, const std::string &baseDir,
                                            const ImportOptions &options = {},
                                            const std::string &sourceName = "<bytes>");
/// Reads a serialized TensorProto file (the ONNX test-data input_<i>.pb format).
TensorData readTensorProtoFile(const std::string &path);
/// Reads a serialized SequenceProto (\p kind Sequence) or OptionalProto (OptionalTensor,
/// OptionalSequence) file, as the ONNX test data stores sequence and optional values.
SequenceData readSequenceProtoFile(const std::string &path, ValueKind kind);
/// Serializes \p data as a TensorProto named \p name.
std::string serializeTensorProto(const TensorData &data, const std::string &name);
/// The model \p modelBytes with the initializers named in \p values replaced by those values
/// (stored inline; external data references of replaced initializers are dropped). Throws
/// naming a value that is not an initializer of the model.
/// A value whose type differs from its initializer's declared one is widened to the declared type
/// (a FLOAT16 weight of fp16.16 into a FLOAT initializer) unless \p keepValueTypes: then it is
/// stored as it is under "<name>_<type>" and a Cast at the start of the graph gives the declared
/// type back to the readers of <name>, so that the model stays valid at half the size.
std::string withInitializers(const std::string &modelBytes, const std::map<TensorId, const TensorData *> &values,
                             bool keepValueTypes = false);
/// True if \p bytes parse as a ModelProto (to tell a model from a file name).
bool looksLikeModelProto(const std::string &bytes);

} // namespace popart::onnx_import
