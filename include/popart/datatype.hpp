#pragma once
/// \file Element types of tensors; the numbering is ONNX's TensorProto::DataType.

#include <cstddef>
#include <cstdint>
#include <string>

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
