#pragma once
// Calls a generic lambda with a value of the C++ type that matches a DataType.

#include "core/half.hpp"
#include <popart/datatype.hpp>
#include <popart/error.hpp>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace popart {

template <typename T> struct TypeTag { using type = T; };

/// Calls \p f(TypeTag<T>{}) for every numeric type (not bool: arithmetic); \p what names the
/// caller in errors.
template <typename F> decltype(auto) dispatchNumeric(DataType type, const char *what, F &&f) {
  switch (type) {
  case DataType::FLOAT: return f(TypeTag<float>{});
  case DataType::DOUBLE: return f(TypeTag<double>{});
  case DataType::FLOAT16: return f(TypeTag<Half>{});
  case DataType::BFLOAT16: return f(TypeTag<BFloat16>{});
  case DataType::INT8: return f(TypeTag<int8_t>{});
  case DataType::INT16: return f(TypeTag<int16_t>{});
  case DataType::INT32: return f(TypeTag<int32_t>{});
  case DataType::INT64: return f(TypeTag<int64_t>{});
  case DataType::UINT8: return f(TypeTag<uint8_t>{});
  case DataType::UINT16: return f(TypeTag<uint16_t>{});
  case DataType::UINT32: return f(TypeTag<uint32_t>{});
  case DataType::UINT64: return f(TypeTag<uint64_t>{});
  default: throw error(what, ": data type ", toString(type), " is not supported");
  }
}

/// Like dispatchNumeric, and bool too.
template <typename F> decltype(auto) dispatchAll(DataType type, const char *what, F &&f) {
  if (type == DataType::BOOL) return f(TypeTag<bool>{});
  return dispatchNumeric(type, what, std::forward<F>(f));
}

/// Only the floating-point types.
template <typename F> decltype(auto) dispatchFloat(DataType type, const char *what, F &&f) {
  switch (type) {
  case DataType::FLOAT: return f(TypeTag<float>{});
  case DataType::DOUBLE: return f(TypeTag<double>{});
  case DataType::FLOAT16: return f(TypeTag<Half>{});
  case DataType::BFLOAT16: return f(TypeTag<BFloat16>{});
  default: throw error(what, ": data type ", toString(type), " is not supported (floating point only)");
  }
}

/// The type arithmetic is done in: float for the 16-bit floats, else the type itself.
template <typename T> struct ComputeType { using type = T; };
template <> struct ComputeType<Half> { using type = float; };
template <> struct ComputeType<BFloat16> { using type = float; };
template <typename T> using compute_t = typename ComputeType<T>::type;

/// Floating \p v as integer type \p T, saturated to T's range and NaN as 0 (as Rust and Java define
/// the cast; ONNX leaves it undefined): a value T cannot hold would make the plain cast UB.
template <typename T, typename C> T saturatingCast(C v) {
  static_assert(std::is_integral_v<T> && !std::is_integral_v<C>);
  if (v != v) return T(0);
  if (v <= static_cast<C>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (v >= static_cast<C>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

} // namespace popart
