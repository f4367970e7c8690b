#pragma once
// PopART's ai.graphcore opset 1 (beside Gelu, which lives with the elementwise ops): GroupNormalization,
// Scale, Subsample, Detach, Init, IdentityLoss, Nll, L1, PrintTensor, and the grad ops that their
// gradients use (GroupNormalizationGrad, SubsampleGrad, NllGrad). Attributes, inputs and outputs
// are PopART's (docs/ops.md, "ai.graphcore opset 1").

#include "ir/op.hpp"

#include <cstdint>
#include <optional>

namespace popart::ir {

/// How a PopART loss reduces its per-element values: the "reduction" attribute, spelt "Sum",
/// "Mean" or "None" as PopART's builder writes it.
enum class LossReduction { Sum, Mean, None };

/// The "reduction" attribute of ai.graphcore loss \p op (IdentityLoss, Nll, L1 and NllGrad);
/// throws naming the op if it is absent or not one of Sum, Mean, None.
LossReduction lossReduction(const Op &op);

/// The class that ai.graphcore Nll (or NllGrad) \p op ignores: its ignoreIndex attribute, if any.
std::optional<int64_t> nllIgnoreIndex(const Op &op);

/// The smallest probability whose log Nll takes (PopART's 1e-7; 6.104e-5 for FLOAT16, whose
/// smallest normal number it is): smaller ones are clamped so that the loss stays finite.
double nllProbabilityFloor(DataType type);

/// Registers the ai.graphcore opset-1 ops above.
void registerGraphcoreOps(OpRegistry &registry);

} // namespace popart::ir
