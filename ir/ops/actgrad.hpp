#pragma once
// Shared by ir/ops/actgrad.cpp, the activation gradient rules and the ActivationGrad kernels.

#include <string>

namespace popart::ir {

/// True if ActivationGrad supports activation \p act; then \p takesOutput says whether its input
/// 0 is the forward output Y (else the forward input X).
bool activationGradForm(const std::string &act, bool &takesOutput);

} // namespace popart::ir
