#pragma once
// What the softmax cross-entropy kernels (reference and fast, loss and gradient) read from the
// op: scores [N, C, D...] as N·C·D, the reduction and the optional ignored class.

#include "ir/op.hpp"

#include <optional>
#include <string>

namespace popart::backend_cpu {

struct LossShape {
  explicit LossShape(const ir::Op &op) {
    const Shape &s = op.inInfo(0).shape();
    n_ = s[0];
    c_ = s[1];
    for (size_t i = 2; i < s.size(); ++i)
      d_ *= s[i];
    std::string red = op.attrs.getString("reduction", "mean");
    reduction_ = red == "none" ? 0 : red == "sum" ? 1 : 2;
    if (op.attrs.has("ignore_index")) ignore_ = op.attrs.getInt("ignore_index");
  }
  int64_t n_ = 0, c_ = 0, d_ = 1;
  int reduction_ = 2; ///< 0 none, 1 sum, 2 mean
  std::optional<int64_t> ignore_;
};

} // namespace popart::backend_cpu
