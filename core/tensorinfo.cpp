#include <popart/error.hpp>
#include <popart/tensorinfo.hpp>

#include <algorithm>
#include <ostream>

namespace popart {

int64_t shapeElementCount(const Shape &shape) {
  // Shapes come from files and models: a product past int64 is an error, not a wrapped count. An
  // empty shape is held to it too (the product of its other dimensions): the strides and the
  // outer/inner sizes that kernels take from partial products of a shape then never overflow.
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  int64_t n = 1;
  for (int64_t d : shape)
    if (d != 0 && __builtin_mul_overflow(n, d, &n))
      throw error("shape ", toString(shape),
                  empty ? " is empty, but its other dimensions multiply past 2^63"
                        : " has too many elements (more than 2^63)");
  return empty ? 0 : n;
}

std::vector<int64_t> rowMajorStrides(const Shape &shape) {
  (void)shapeElementCount(shape); // refuses dimensions that multiply past int64: no stride below overflows
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;)
    s[i - 1] = s[i] * shape[i];
  return s;
}

std::string toString(const Shape &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += shape[i] < 0 ? std::string("?") : std::to_string(shape[i]);
  }
  return s + "]";
}

bool isShapeKnown(const Shape &shape) {
  for (int64_t d : shape)
    if (d < 0) return false;
  return true;
}

int64_t TensorInfo::dim(int64_t i) const {
  int64_t r = rank();
  if (i < -r || i >= r) throw error("dimension ", i, " is out of range for ", toString());
  return shape_[static_cast<size_t>(i < 0 ? i + r : i)];
}

std::string TensorInfo::toString() const {
  std::string element = popart::toString(dataType_) + popart::toString(shape_);
  switch (kind_) {
  case ValueKind::Tensor: return element;
  case ValueKind::OptionalTensor: return "optional(" + element + ")";
  case ValueKind::Sequence:
  case ValueKind::OptionalSequence: {
    std::string s = "seq(" + element + (elementsKnown_ ? " x" + std::to_string(elements_.size()) : "") + ")";
    return kind_ == ValueKind::Sequence ? s : "optional(" + s + ")";
  }
  }
  return element;
}

void TensorInfo::setElements(std::vector<TensorInfo> elements) {
  elements_ = std::move(elements);
  elementsKnown_ = true;
}

Shape mergeShapes(const Shape &a, const Shape &b) {
  if (a.size() != b.size()) return {-1};
  Shape s = a;
  for (size_t i = 0; i < s.size(); ++i)
    if (a[i] != b[i]) s[i] = -1;
  return s;
}

TensorInfo sequenceInfoOf(const std::vector<TensorInfo> &elements, DataType type) {
  Shape shape = elements.empty() ? Shape{-1} : elements[0].shape();
  for (const TensorInfo &e : elements)
    shape = mergeShapes(shape, e.shape());
  TensorInfo info(ValueKind::Sequence, elements.empty() ? type : elements[0].dataType(), shape);
  info.setElements(elements);
  return info;
}

std::ostream &operator<<(std::ostream &os, const TensorInfo &info) { return os << info.toString(); }
std::ostream &operator<<(std::ostream &os, DataType type) { return os << toString(type); }

} // namespace popart
