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

/// Element type and shape of a tensor.
class TensorInfo {
public:
  TensorInfo() = default;
  TensorInfo(DataType type, Shape shape) : dataType_(type), shape_(std::move(shape)) {}

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
  /// Number of bytes of the data.
  int64_t byteCount() const { return elementCount() * static_cast<int64_t>(dataTypeSize(dataType_)); }
  /// True when the type is set and every dimension is known.
  bool isKnown() const { return dataType_ != DataType::UNDEFINED && isShapeKnown(shape_); }
  /// "FLOAT[2,3]".
  std::string toString() const;

  void setDataType(DataType type) { dataType_ = type; }
  void setShape(Shape shape) { shape_ = std::move(shape); }

  bool operator==(const TensorInfo &o) const { return dataType_ == o.dataType_ && shape_ == o.shape_; }
  bool operator!=(const TensorInfo &o) const { return !(*this == o); }

private:
  DataType dataType_ = DataType::UNDEFINED;
  Shape shape_;
};

std::ostream &operator<<(std::ostream &os, const TensorInfo &info);
std::ostream &operator<<(std::ostream &os, DataType type);

} // namespace popart
