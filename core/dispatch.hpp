#pragma once
// Calls a generic lambda with a value of the C++ type that matches a DataType.

#include "core/half.hpp"
#include <popart/datatype.hpp>
#include <popart/error.hpp>

#include <cstdint>

namespace popart {

template <typename T> struct TypeTag { using type = T; };

/// C++ type of each DataType (bool is stored as one byte).
template <DataType D> struct CppType;
template <> struct CppType<DataType::FLOAT> { using type = float; };
template <> struct CppType<DataType::DOUBLE> { using type = double; };
template <> struct CppType<DataType::FLOAT16> { using type = Half; };
template <> struct CppType<DataType::BFLOAT16> { using type = BFloat16; };
template <> struct CppType<DataType::INT8> { using type = int8_t; };
template <> struct CppType<DataType::INT16> { using type = int16_t; };
template <> struct CppType<DataType::INT32> { using type = int32_t; };
template <> struct CppType<DataType::INT64> { using type = int64_t; };
template <> struct CppType<DataType::UINT8> { using type = uint8_t; };
template <> struct CppType<DataType::UINT16> { using type = uint16_t; };
template <> struct CppType<DataType::UINT32> { using type = uint32_t; };
template <> struct CppType<DataType::UINT64> { using type = uint64_t; };
template <> struct CppType<DataType::BOOL> { using type = bool; };

template <typename T> constexpr DataType dataTypeOf();
template <> constexpr DataType dataTypeOf<float>() { return DataType::FLOAT; }
template <> constexpr DataType dataTypeOf<double>() { return DataType::DOUBLE; }
template <> constexpr DataType dataTypeOf<Half>() { return DataType::FLOAT16; }
template <> constexpr DataType dataTypeOf<BFloat16>() { return DataType::BFLOAT16; }
template <> constexpr DataType dataTypeOf<int8_t>() { return DataType::INT8; }
template <> constexpr DataType dataTypeOf<int16_t>() { return DataType::INT16; }
template <> constexpr DataType dataTypeOf<int32_t>() { return DataType::INT32; }
template <> constexpr DataType dataTypeOf<int64_t>() { return DataType::INT64; }
template <> constexpr DataType dataTypeOf<uint8_t>() { return DataType::UINT8; }
template <> constexpr DataType dataTypeOf<uint16_t>() { return DataType::UINT16; }
template <> constexpr DataType dataTypeOf<uint32_t>() { return DataType::UINT32; }
template <> constexpr DataType dataTypeOf<uint64_t>() { return DataType::UINT64; }
template <> constexpr DataType dataTypeOf<bool>() { return DataType::BOOL; }

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

} // namespace popart
