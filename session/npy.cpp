#include "session/npy.hpp"
#include <popart/error.hpp>

#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

namespace popart::npy {

namespace {

const std::map<std::string, DataType> &descrTypes() {
  static const std::map<std::string, DataType> m{
      {"<f4", DataType::FLOAT},  {"<f8", DataType::DOUBLE}, {"<f2", DataType::FLOAT16}, {"|i1", DataType::INT8},
      {"<i2", DataType::INT16},  {"<i4", DataType::INT32},  {"<i8", DataType::INT64},   {"|u1", DataType::UINT8},
      {"<u2", DataType::UINT16}, {"<u4", DataType::UINT32}, {"<u8", DataType::UINT64},  {"|b1", DataType::BOOL}};
  return m;
}

std::string descrOf(DataType t) {
  for (const auto &[d, type] : descrTypes())
    if (type == t) return d;
  throw error(".npy: cannot write data type ", toString(t));
}

std::string field(const std::string &header, const std::string &key, const std::string &path) {
  size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) throw error(".npy file '", path, "': header has no '", key, "'");
  size_t colon = header.find(':', k);
  if (colon == std::string::npos) throw error(".npy file '", path, "': malformed header");
  return header.substr(colon + 1);
}

} // namespace

TensorData read(const std::string &path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw error("cannot open .npy file '", path, "'");
  // Sizes the header announces are checked against the file before anything is allocated.
  const int64_t fileSize = in.tellg();
  in.seekg(0);
  char magic[8];
  if (!in.read(magic, 8) || std::string(magic, 6) != "\x93NUMPY")
    throw error("'", path, "' is not a .npy file (bad magic)");
  uint32_t headerLen = 0;
  if (magic[6] == 1) {
    uint16_t l;
    in.read(reinterpret_cast<char *>(&l), 2);
    headerLen = l;
  } else {
    in.read(reinterpret_cast<char *>(&headerLen), 4);
  }
  if (!in || headerLen > fileSize) throw error(".npy file '", path, "' is truncated in its header");
  std::string header(headerLen, '\0');
  if (!in.read(header.data(), headerLen)) throw error(".npy file '", path, "' is truncated in its header");
  std::string descrPart = field(header, "descr", path);
  size_t q1 = descrPart.find('\''), q2 = q1 == std::string::npos ? q1 : descrPart.find('\'', q1 + 1);
  if (q2 == std::string::npos) throw error(".npy file '", path, "': malformed 'descr' in the header");
  std::string descr = descrPart.substr(q1 + 1, q2 - q1 - 1);
  if (descr == "<b1") descr = "|b1";
  if (descr == "<i1") descr = "|i1";
  if (descr == "<u1") descr = "|u1";
  auto it = descrTypes().find(descr);
  if (it == descrTypes().end()) throw error(".npy file '", path, "': unsupported dtype '", descr, "'");
  std::string fortran = field(header, "fortran_order", path);
  if (fortran.find("True") < fortran.find(',')) throw error(".npy file '", path, "': Fortran order is not supported");
  std::string shapePart = field(header, "shape", path);
  size_t p1 = shapePart.find('('), p2 = shapePart.find(')');
  if (p1 == std::string::npos || p2 == std::string::npos || p2 < p1)
    throw error(".npy file '", path, "': malformed 'shape' in the header");
  std::string dims = shapePart.substr(p1 + 1, p2 - p1 - 1);
  Shape shape;
  std::stringstream ss(dims);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    int64_t d = -1;
    size_t used = 0;
    try {
      d = std::stoll(item, &used);
    } catch (const std::logic_error &) { // not a number, or out of range
    }
    if (d < 0 || item.find_first_not_of(' ', used) != std::string::npos)
      throw error(".npy file '", path, "': bad dimension '", item, "' in shape (", dims, ")");
    shape.push_back(d);
  }
  const TensorInfo info(it->second, shape);
  int64_t count = 0;
  try {
    count = info.elementCount();
  } catch (const error &e) {
    throw error(".npy file '", path, "': ", e.what());
  }
  const int64_t remaining = fileSize - static_cast<int64_t>(in.tellg());
  if (count > remaining / static_cast<int64_t>(dataTypeSize(info.dataType())))
    throw error(".npy file '", path, "' is truncated: ", info.toString(), " needs ", count, " elements, the file has ",
                remaining, " bytes after its header");
  TensorData data{info};
  if (!in.read(static_cast<char *>(data.data()), data.byteCount()))
    throw error(".npy file '", path, "' is truncated: expected ", data.byteCount(), " bytes of data for ",
                data.info().toString());
  return data;
}

void write(const std::string &path, const TensorData &data) {
  std::string shape = "(";
  for (size_t i = 0; i < data.info().shape().size(); ++i)
    shape += std::to_string(data.info().shape()[i]) + ",";
  if (data.info().shape().size() > 1) shape.pop_back();
  shape += ")";
  std::string header =
      "{'descr': '" + descrOf(data.info().dataType()) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw error("cannot write .npy file '", path, "'");
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char *>(&len), 2);
  out << header;
  out.write(static_cast<const char *>(data.data()), data.byteCount());
}

} // namespace popart::npy
