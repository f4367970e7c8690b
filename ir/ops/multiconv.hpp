#pragma once
// ai.graphcore MultiConv (opset 1): several independent convolutions in one op, as PopART's
// builder makes it, and its gradient op MultiConvGrad. Kernels and the gradient rule see each
// convolution as an ordinary Conv (or ConvDataGrad / ConvWeightGrad) op of a graph of its own.
//
//   MultiConv(x0, w0, b0, x1, w1, b1, ...) -> y0, y1, ...      b_i "" when conv i has no bias
//   MultiConvGrad(dy0, x0, w0, dy1, x1, w1, ...) -> dx0, dw0, dx1, dw1, ...
//
// Attributes (both ops): strides, pads, dilations, each the per-convolution lists concatenated in
// convolution order (pads: begin values then end values of each convolution); absent: ONNX's
// defaults. The group of convolution i is X_i's channels over W_i's input channels. numConvs, if
// present, must equal the number of outputs; inDilations and outPads must keep their defaults; the
// IPU planning options (planType, availableMemoryProportions, partialsTypes, ...) are accepted and
// have no meaning on the CPU.

#include "ir/graph.hpp"

#include <map>
#include <memory>
#include <vector>

namespace popart::ir {

/// The MultiConv attribute fuseRelu sets: the indices of the convolutions whose output is passed
/// through a Relu (oneDNN's post-op, as a Conv's fused Relu). Not PopART's: made by the pass only.
constexpr const char *kMultiConvReluAttr = "fusedRelu";

/// The convolutions of a MultiConv or MultiConvGrad as ordinary ops of a graph of their own.
struct UnpackedMultiConv {
  std::unique_ptr<Graph> graph;
  /// Per convolution: its Conv (MultiConv) or its ConvDataGrad and ConvWeightGrad (MultiConvGrad,
  /// or a trained MultiConv with \p withGradients), null where absent.
  std::vector<Op *> conv, dataGrad, weightGrad;
  /// The op's input and output index of each unpacked tensor that is one of the op's.
  std::map<TensorId, size_t> opInput, opOutput;
};

/// The number of convolutions of MultiConv or MultiConvGrad \p op.
size_t multiConvCount(const Op &op);

/// Convolution \p i's strides, pads, dilations and group as Conv attributes (all explicit) of
/// MultiConv or MultiConvGrad \p op; throws naming the op and the convolution when the flattened
/// attributes do not fit the inputs' ranks.
Attributes multiConvAttributes(const Op &op, size_t i);

/// \p op's convolutions unpacked. A MultiConv gives Conv ops reading x<i>, w<i>, b<i> (of the
/// infos, kinds and constant values of the op's inputs) and writing y<i>, each with its fused Relu
/// (kMultiConvReluAttr); with \p withGradients
/// also the grad ops the gradient rule makes of each (so that kernels choose as for a trained
/// Conv). A MultiConvGrad gives ConvDataGrad(dy<i>, w<i>) -> dx<i> and ConvWeightGrad(dy<i>,
/// x<i>) -> dw<i> where dy<i> is present. Output infos are set (setup run); an invalid
/// convolution throws naming \p op and its index.
UnpackedMultiConv unpackMultiConv(const Op &op, bool withGradients = false);

/// Registers MultiConv and MultiConvGrad (ai.graphcore, opset 1).
void registerMultiConvOps(OpRegistry &registry);

} // namespace popart::ir
