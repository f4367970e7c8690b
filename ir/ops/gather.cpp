// GatherScatter ops.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

void registerGatherScatterOps(OpRegistry &) {}

} // namespace popart::ir
