#pragma once
/// \file Shapes and the (type, shape) pair that describes a tensor.

#include <popart/datatype.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace popart {

/// Dimensions of a tensor; -1 marks a dimension not yet known.
using Shape = std::vector<int64_t>;
/// The name of a tensor in a model.
using TensorId = std::string;

/// \returns the number of elements of \p shape (1 for a scalar).
int64_t shapeElementCount(const Shape &shape);
/// \returns the row-major strides of \p shape, in elements (the last axis has stride 1).
std::vector<int64_t> rowMajorStrides(const Shape &shape);
/// \returns "[d0,d1,...]".
std::string toString(const Shape &shape);
/// \returns true when no dimension is negative.
bool isShapeKnown(const Shape &shape);

/// What kind of value a tensor of a model holds: a tensor, or an ONNX sequence or optional of
/// tensors. Sequences and optionals live on the host outside the activation arena.
enum class ValueKind : int { Tensor = 0, Sequence = 1, OptionalTensor = 2, OptionalSequence = 3 };

/// Element type and shape of a tensor. For a sequence or optional, the type and shape of its
/// elements (-1 in a dimension where elements differ or are not known before running).
class TensorInfo {
public:
  TensorInfo() = default;
  TensorInfo(DataType type, Shape shape) : dataType_(type), shape_(std::move(shape)) {}
  /// A sequence or optional (\p kind) of elements of \p type and \p shape.
  TensorInfo(ValueKind kind, DataType type, Shape shape) : dataType_(type), shape_(std::move(shape)), kind_(kind) {}

  /// Element type.
  DataType dataType() const { return dataType_; }
  /// Dimensions.
  const Shape &shape() const { return shape_; }
  /// Number of dimensions.
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  /// Size of dimension \p i; negative \p i counts from the end.
  int64_t dim(int64_t i) const;
  /// Number of elements.
  int64_t elementCount() const { return shapeElementCount(shape_); }
  /// Number of bytes of the data (0 for a sequence or optional, which is not in the arena).
  int64_t byteCount() const {
    return isTensor() ? elementCount() * static_cast<int64_t>(dataTypeSize(dataType_)) : 0;
  }
  /// True when the type is set and every dimension is known (for a sequence or optional: the
  /// element type is set; element shapes may vary).
  bool isKnown() const {
    return dataType_ != DataType::UNDEFINED && (!isTensor() || isShapeKnown(shape_));
  }
  /// Tensor, sequence or optional.
  ValueKind valueKind() const { return kind_; }
  bool isTensor() const { return kind_ == ValueKind::Tensor; }
  bool isSequence() const { return kind_ == ValueKind::Sequence || kind_ == ValueKind::OptionalSequence; }
  /// The infos of a sequence's elements in order, when their number is known before running.
  const std::vector<TensorInfo> &elements() const { return elements_; }
  bool elementsKnown() const { return elementsKnown_; }
  /// Records the elements of a sequence (their number and infos known before running).
  void setElements(std::vector<TensorInfo> elements);
  /// Forgets the element list (their number is only known at run time).
  void clearElements() {
    elements_.clear();
    elementsKnown_ = false;
  }
  /// The info of one element: a tensor of this info's type and shape.
  TensorInfo elementInfo() const { return TensorInfo(dataType_, shape_); }
  /// "FLOAT[2,3]".
  std::string toString() const;

  void setDataType(DataType type) { dataType_ = type; }
  void setShape(Shape shape) { shape_ = std::move(shape); }

  bool operator==(const TensorInfo &o) const {
    return dataType_ == o.dataType_ && shape_ == o.shape_ && kind_ == o.kind_ && elementsKnown_ == o.elementsKnown_ &&
           elements_ == o.elements_;
  }
  bool operator!=(const TensorInfo &o) const { return !(*this == o); }

private:
  DataType dataType_ = DataType::UNDEFINED;
  Shape shape_;
  ValueKind kind_ = ValueKind::Tensor;
  bool elementsKnown_ = false;
  std::vector<TensorInfo> elements_;
};

/// The info of a sequence of \p elements: their common type, the shape they share (-1 where
/// they differ), and the list itself. \p type is used when the list is empty.
TensorInfo sequenceInfoOf(const std::vector<TensorInfo> &elements, DataType type);
/// The common element shape of \p a and \p b (-1 where they differ; rank-0 unknown: {-1}).
Shape mergeShapes(const Shape &a, const Shape &b);

std::ostream &operator<<(std::ostream &os, const TensorInfo &info);
std::ostream &operator<<(std::ostream &os, DataType type);

} // namespace popart
