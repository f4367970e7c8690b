// Norm ops.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

void registerNormOps(OpRegistry &) {}

} // namespace popart::ir
