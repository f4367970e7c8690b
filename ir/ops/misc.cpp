// Misc ops.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

void registerMiscOps(OpRegistry &) {}

} // namespace popart::ir
