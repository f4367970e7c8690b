#pragma once
// One op in a graph of its own, set up and ready for createKernel: how the kernel tests build the op
// they compare providers on.

#include "core/tensordata.hpp"
#include "ir/attributes.hpp"
#include "ir/graph.hpp"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace popart::test_ops {

struct OneOp {
  std::unique_ptr<ir::Graph> graph = std::make_unique<ir::Graph>();
  ir::Op *op = nullptr;
};

/// Op \p type of \p domain at \p opset over stream inputs of \p ins (an input of shape {-1} is
/// omitted; inputs in \p consts are those constants instead), with \p outputs outputs (those listed
/// in \p omittedOutputs omitted); \p prepare edits the op (fusion fields, internal attributes)
/// before its setup. Registers the built-in ops and kernels.
OneOp makeOneOp(const std::string &type, const std::string &domain, int opset, const std::vector<TensorInfo> &ins,
                ir::Attributes attrs = {}, size_t outputs = 1, const std::map<size_t, TensorData> &consts = {},
                const std::function<void(ir::Op &)> &prepare = {}, const std::vector<size_t> &omittedOutputs = {});

/// \p values as a 1-D tensor of \p type (rounded to nearest even for the 16-bit types).
TensorData tensorOf(DataType type, const std::vector<float> &values);

} // namespace popart::test_ops
