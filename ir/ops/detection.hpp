#pragma once
// Detection algorithms whose output shape depends on the data, so shape inference and the
// kernel share them.

#include "core/tensordata.hpp"

#include <array>
#include <vector>

namespace popart::ir {

/// NonMaxSuppression: the selected [batch, class, box] triples, in ONNX's order (per batch and
/// class, by descending score). \p boxes [B,N,4], \p scores [B,C,N]; the optional scalars may be null.
std::vector<std::array<int64_t, 3>> nonMaxSuppression(const TensorData &boxes, const TensorData &scores,
                                                      const TensorData *maxPerClass, const TensorData *iouThreshold,
                                                      const TensorData *scoreThreshold, bool centerPointBox);

} // namespace popart::ir
