#pragma once
// NumPy .npy files (format versions 1-3, little-endian, C order).

#include "core/tensordata.hpp"

#include <string>

namespace popart::npy {

/// Reads \p path; throws popart::error naming the file for anything unsupported.
TensorData read(const std::string &path);
/// Writes \p data to \p path (format version 1).
void write(const std::string &path, const TensorData &data);

} // namespace popart::npy
