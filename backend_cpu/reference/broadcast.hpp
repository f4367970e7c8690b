#pragma once
// Index arithmetic for numpy broadcasting in reference kernels.

#include <popart/tensorinfo.hpp>

#include <vector>

namespace popart::backend_cpu {

/// Strides (in elements) of \p in when broadcast to \p out: 0 along broadcast dimensions.
std::vector<int64_t> broadcastStrides(const Shape &in, const Shape &out);

/// Walks the elements of an output shape, keeping the matching offset of each input.
class BroadcastWalker {
public:
  BroadcastWalker(const Shape &out, const std::vector<Shape> &ins);
  /// Offset of input \p i for the current output element.
  int64_t offset(size_t i) const { return offsets_[i]; }
  /// Moves to the next output element.
  void next();
  /// Back to the first output element (no allocation).
  void reset();

private:
  Shape out_;
  std::vector<std::vector<int64_t>> strides_;
  std::vector<int64_t> index_;
  std::vector<int64_t> offsets_;
};

} // namespace popart::backend_cpu
