#pragma once
// Sliding-window geometry of Conv, ConvTranspose, the pools and their gradient ops: ONNX's
// auto_pad, output_shape and default rules resolved once into explicit per-axis values. Shared
// by the gradient rules (which write the result into the grad ops' attributes) and by the
// reference and oneDNN kernels.

#include "ir/op.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace popart::ir {

/// One value per spatial axis. padBegin / padEnd are ONNX's pads; for ConvTranspose they are
/// the pads of the output (the convolution it is the transpose of), without output_padding.
struct WindowGeometry {
  std::vector<int64_t> in, out, kernel, strides, dilations, padBegin, padEnd;
  size_t spatialRank() const { return in.size(); }
  /// Extent of the dilated kernel on axis \p i.
  int64_t dilatedKernel(size_t i) const { return (kernel[i] - 1) * dilations[i] + 1; }
  /// padBegin followed by padEnd: ONNX's pads attribute.
  std::vector<int64_t> pads() const;
};

/// The geometry of \p op with full input shape \p x (N, C, spatial...), output shape \p y and
/// spatial kernel sizes \p kernel. \p transposed selects ConvTranspose's padding rules, where
/// SAME and output_shape derive the pads from the output. Attributes absent take ONNX's defaults.
WindowGeometry resolveWindow(const Op &op, const Shape &x, const Shape &y, const std::vector<int64_t> &kernel,
                             bool transposed);

/// Why the 2-D windows of pool (or pool gradient) \p op do not tile its NCHW input X (input 0):
/// overlap (a stride below the kernel), padding, dilation, or one of the \p windows windows (Y's
/// or dY's shape) reaching past X; empty if they tile. The fast pool kernels take only tiling
/// windows, and fuseMaxPoolGradRelu fuses a 16-bit MaxPoolGrad only where they would.
std::string whyWindowsDoNotTile(const Op &op, const Shape &windows);

/// The pool fused into Conv \p op (Fusion::pool, ir::FusedPool); false if it has none.
bool fusedPool(const Op &op, FusedPool &pool);

/// The shape Conv \p op convolves to: its output's, or with a fused pool that pool's input.
Shape convResultShape(const Op &op);

} // namespace popart::ir
