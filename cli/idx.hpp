#pragma once
/// \file Reading IDX files (the format of MNIST and Fashion-MNIST), plain or gzip-compressed.

#include <popart/tensorinfo.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace popart::cli {

/// The contents of one IDX file: element type, dimensions and the elements in host byte order.
struct IdxArray {
  TensorInfo info;
  std::vector<uint8_t> bytes;
};

/// Reads the IDX file \p path; gzip-compressed files are recognised by their content, whatever
/// their name. Throws popart::error naming the file on a bad magic number, an unknown element
/// type or truncated data.
IdxArray readIdx(const std::string &path);

/// \returns "<dir>/<name>" if it exists, else "<dir>/<name>.gz"; throws naming both if neither does.
std::string findIdxFile(const std::string &dir, const std::string &name);

} // namespace popart::cli
