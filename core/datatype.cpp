#include <popart/datatype.hpp>
#include <popart/error.hpp>

#include <algorithm>
#include <array>
#include <cctype>

namespace popart {

namespace {
struct TypeRow {
  DataType type;
  const char *name;
  size_t size;
};
constexpr std::array<TypeRow, 17> kTypes{{
    {DataType::UNDEFINED, "UNDEFINED", 0},
    {DataType::FLOAT, "FLOAT", 4},
    {DataType::UINT8, "UINT8", 1},
    {DataType::INT8, "INT8", 1},
    {DataType::UINT16, "UINT16", 2},
    {DataType::INT16, "INT16", 2},
    {DataType::INT32, "INT32", 4},
    {DataType::INT64, "INT64", 8},
    {DataType::STRING, "STRING", 0},
    {DataType::BOOL, "BOOL", 1},
    {DataType::FLOAT16, "FLOAT16", 2},
    {DataType::DOUBLE, "DOUBLE", 8},
    {DataType::UINT32, "UINT32", 4},
    {DataType::UINT64, "UINT64", 8},
    {DataType::COMPLEX64, "COMPLEX64", 8},
    {DataType::COMPLEX128, "COMPLEX128", 16},
    {DataType::BFLOAT16, "BFLOAT16", 2},
}};
} // namespace

size_t dataTypeSize(DataType type) { return kTypes.at(static_cast<size_t>(type)).size; }

std::string toString(DataType type) {
  auto i = static_cast<size_t>(type);
  if (i >= kTypes.size()) return "INVALID(" + std::to_string(i) + ")";
  return kTypes[i].name;
}

DataType dataTypeFromString(const std::string &name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  if (upper == "FLOAT32") upper = "FLOAT";
  if (upper == "FLOAT64") upper = "DOUBLE";
  for (const auto &row : kTypes)
    if (upper == row.name) return row.type;
  throw error("unknown data type '", name, "'");
}

DataType dataTypeFromOnnx(int onnxType) {
  if (onnxType < 0 || onnxType >= static_cast<int>(kTypes.size()))
    throw error("ONNX data type ", onnxType, " is out of range (0..16)");
  return static_cast<DataType>(onnxType);
}

bool isFloatingPoint(DataType type) {
  return type == DataType::FLOAT || type == DataType::DOUBLE || type == DataType::FLOAT16 || type == DataType::BFLOAT16;
}

bool isInteger(DataType type) {
  switch (type) {
  case DataType::INT8:
  case DataType::INT16:
  case DataType::INT32:
  case DataType::INT64:
  case DataType::UINT8:
  case DataType::UINT16:
  case DataType::UINT32:
  case DataType::UINT64: return true;
  default: return false;
  }
}

} // namespace popart
