#pragma once
// The parsed form of an Einsum equation, shared by shape inference and the kernel.

#include "ir/op.hpp"

#include <vector>

namespace popart::ir {

/// Label of each dimension of each operand and of the output, after expanding "..."; labels
/// 0..51 are letters, 52+ are the dimensions covered by the ellipsis (right-aligned).
struct EinsumSpec {
  std::vector<std::vector<int>> inputs;
  std::vector<int> output;
};

/// Parses and validates \p op's equation against its input ranks; throws naming the op.
EinsumSpec parseEinsum(const Op &op);

} // namespace popart::ir
