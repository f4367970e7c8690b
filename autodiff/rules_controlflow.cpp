// If, Loop and Scan have no gradient rule of their own: training unrolls them first
// (ir::unrollControlFlow), so autodiff sees the ops inside. One that reaches autodiff could not be
// unrolled; its rule says why.

#include "autodiff/grad_rules.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

namespace popart::autodiff {

namespace {

void notUnrolled(GradContext &c) {
  const ir::Op &op = c.op();
  // The reason unrollControlFlow recorded when it left the op, else the reason now.
  std::string why = op.attrs.has(ir::internal_attr::kNotUnrolled) ? op.attrs.getString(ir::internal_attr::kNotUnrolled)
                                                                  : ir::unrollObstacle(op);
  if (why.empty()) why = "it was not unrolled before autodiff (ir::unrollControlFlow did not run on it)";
  throw error(op.debugName(), ": cannot differentiate through ", op.type, ": ", why,
              ". Training differentiates an If only with a condition known at compile time, and a Loop or Scan only "
              "with a trip count known at compile time, by unrolling them");
}

} // namespace

void registerControlFlowRules(GradRuleRegistry &r) {
  addOnnxRules(r, {{"If", notUnrolled}, {"Loop", notUnrolled}, {"Scan", notUnrolled}});
}

} // namespace popart::autodiff
