#pragma once
/// \file PopART's model-parallel node annotations, as ONNX node attributes (docs/distributed.md,
/// "Annotations"): `__ipu_number` (the virtual graph), `__pipeline_stage` and
/// `__recompute_output_in_backward_pass`. The importer keeps them among an op's attributes like
/// any other (the ONNX checker lets attributes named `__*` through on every op).

#include "ir/graph.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace popart::ir {

inline constexpr const char *kVirtualGraphAttribute = "__ipu_number";
inline constexpr const char *kPipelineStageAttribute = "__pipeline_stage";
inline constexpr const char *kRecomputeAttribute = "__recompute_output_in_backward_pass";

/// True if \p attribute is one of the annotations above.
bool isAnnotation(const std::string &attribute);

/// \p op's virtual graph, if annotated.
std::optional<int64_t> virtualGraphOf(const Op &op);
/// \p op's pipeline stage, if annotated.
std::optional<int64_t> pipelineStageOf(const Op &op);
/// \p op's recomputation annotation: PopART's RecomputeType (0 Undefined, 1 Checkpoint,
/// 2 Recompute, 3 Recomputed); 0 if not annotated.
int64_t recomputeOf(const Op &op);

/// Throws naming the op and the annotation unless every annotation of \p g is in range (virtual
/// graphs and stages from 0, recomputation 0-3) and no op of a stage reads a tensor that a later
/// stage produces.
void checkAnnotations(const Graph &g);

} // namespace popart::ir
