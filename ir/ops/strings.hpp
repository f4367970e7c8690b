#pragma once
// String ops, whose output shapes depend on the strings.

#include "ir/attributes.hpp"

#include <string>
#include <vector>

namespace popart::ir {

/// StringNormalizer: removes stop words, then changes case; an all-removed input yields {""}.
std::vector<std::string> normalizeStrings(const std::vector<std::string> &in, const Attributes &attrs);

} // namespace popart::ir
