// ConvPool ops.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

void registerConvPoolOps(OpRegistry &) {}

} // namespace popart::ir
