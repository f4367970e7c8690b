#pragma once
/// \file Host buffers for one step: inputs read and anchors written by Session::run.

#include <popart/datatype.hpp>
#include <popart/error.hpp>
#include <popart/tensorinfo.hpp>

#include <cstdint>
#include <map>
#include <vector>
#include <type_traits>

namespace popart {

/// A typed view of host memory (not owned).
class IArray {
public:
  virtual ~IArray() = default;
  virtual void *data() = 0;
  virtual DataType dataType() const = 0;
  virtual const Shape &shape() const = 0;
  int64_t nelms() const { return shapeElementCount(shape()); }
};

/// An IArray over a typed pointer, as PopART's NDArrayWrapper.
template <typename T> class NDArrayWrapper : public IArray {
public:
  NDArrayWrapper(T *data, Shape shape) : data_(data), shape_(std::move(shape)) {}
  void *data() override { return data_; }
  DataType dataType() const override { return hostDataType<T>(); }
  const Shape &shape() const override { return shape_; }

private:
  T *data_;
  Shape shape_;
};

/// An IArray over untyped bytes with an explicit type (fp16 data, data read from files).
class RawArray : public IArray {
public:
  RawArray(void *data, DataType type, Shape shape) : data_(data), type_(type), shape_(std::move(shape)) {}
  void *data() override { return data_; }
  DataType dataType() const override { return type_; }
  const Shape &shape() const override { return shape_; }

private:
  void *data_;
  DataType type_;
  Shape shape_;
};

/// The value of a sequence or optional input (ValueKind other than Tensor): its elements in
/// order, not owned. An optional tensor has one element; present = false is an empty optional.
struct SequenceInput {
  std::vector<IArray *> elements;
  bool present = true;
};

/// The value of a sequence or optional output after a run: its elements, copied.
struct SequenceOutput {
  bool present = true;
  std::vector<TensorInfo> infos;
  std::vector<std::vector<uint8_t>> bytes; ///< each element's row-major bytes
};

/// The host buffers of one run: inputs by tensor id, and the anchors' output buffers.
class StepIO {
public:
  StepIO(std::map<TensorId, IArray &> inputs, std::map<TensorId, IArray &> outputs)
      : inputs_(std::move(inputs)), outputs_(std::move(outputs)) {}
  const std::map<TensorId, IArray &> &inputs() const { return inputs_; }
  const std::map<TensorId, IArray &> &outputs() const { return outputs_; }
  /// Feeds the sequence or optional input \p id (InferenceSession; batchesPerStep 1).
  void setSequenceInput(const TensorId &id, SequenceInput value) { sequenceInputs_[id] = std::move(value); }
  const std::map<TensorId, SequenceInput> &sequenceInputs() const { return sequenceInputs_; }

private:
  std::map<TensorId, IArray &> inputs_;
  std::map<TensorId, IArray &> outputs_;
  std::map<TensorId, SequenceInput> sequenceInputs_;
};

/// Host buffers for weights, by tensor id (PopART's WeightsIO): TrainingSession::readWeights
/// fills them, writeWeights reads them.
class WeightsIO {
public:
  void insert(const TensorId &id, IArray &array) {
    if (!arrays_.emplace(id, array).second) throw error("WeightsIO already holds '", id, "'");
  }
  bool contains(const TensorId &id) const { return arrays_.count(id) != 0; }
  IArray &weight(const TensorId &id) const {
    auto it = arrays_.find(id);
    if (it == arrays_.end()) throw error("WeightsIO holds no buffer for '", id, "'");
    return it->second;
  }
  const std::map<TensorId, IArray &> &all() const { return arrays_; }

private:
  std::map<TensorId, IArray &> arrays_;
};

} // namespace popart
