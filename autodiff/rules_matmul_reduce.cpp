// Gradient rules: matmul and reduce ops.

#include "autodiff/grad_rules.hpp"

namespace popart::autodiff {

void registerMatMulReduceRules(std::map<std::string, GradRule> &) {}

} // namespace popart::autodiff
