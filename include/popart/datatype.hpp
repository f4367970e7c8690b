#pragma once
/// \file Element types of tensors; the numbering is ONNX's TensorProto::DataType.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace popart {

/// Element type of a tensor, numbered as ONNX numbers them.
enum class DataType : int {
  UNDEFINED = 0,
  FLOAT = 1,
  UINT8 = 2,
  INT8 = 3,
  UINT16 = 4,
  INT16 = 5,
  INT32 = 6,
  INT64 = 7,
  STRING = 8,
  BOOL = 9,
  FLOAT16 = 10,
  DOUBLE = 11,
  UINT32 = 12,
  UINT64 = 13,
  COMPLEX64 = 14,
  COMPLEX128 = 15,
  BFLOAT16 = 16,
};

/// The DataType of host element type \p T (float → FLOAT, int64_t → INT64, bool → BOOL ...).
template <typename T> constexpr DataType hostDataType() {
  if constexpr (std::is_same_v<T, float>)
    return DataType::FLOAT;
  else if constexpr (std::is_same_v<T, double>)
    return DataType::DOUBLE;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DataType::INT8;
  else if constexpr (std::is_same_v<T, int16_t>)
    return DataType::INT16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DataType::INT32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DataType::INT64;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DataType::UINT8;
  else if constexpr (std::is_same_v<T, uint16_t>)
    return DataType::UINT16;
  else if constexpr (std::is_same_v<T, uint32_t>)
    return DataType::UINT32;
  else if constexpr (std::is_same_v<T, uint64_t>)
    return DataType::UINT64;
  else if constexpr (std::is_same_v<T, bool>)
    return DataType::BOOL;
  else
    static_assert(sizeof(T) == 0, "unsupported element type");
}

/// \returns the size in bytes of one element of \p type (0 for STRING and UNDEFINED).
size_t dataTypeSize(DataType type);
/// \returns the upper-case name of \p type, as ONNX spells it.
std::string toString(DataType type);
/// \returns the type named \p name (case-insensitive); throws popart::error if unknown.
DataType dataTypeFromString(const std::string &name);
/// \returns the type with ONNX number \p onnxType; throws popart::error if out of range.
DataType dataTypeFromOnnx(int onnxType);
/// \returns true for FLOAT, DOUBLE, FLOAT16 and BFLOAT16.
bool isFloatingPoint(DataType type);
/// \returns true for the signed and unsigned integer types.
bool isInteger(DataType type);

} // namespace popart
