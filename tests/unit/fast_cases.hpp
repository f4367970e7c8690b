#pragma once
// Which fast kernels (KernelProvider::Fast) the unit tests compare with the reference kernels:
// each test file that does declares the op types it covers with POPART_FAST_KERNEL_COMPARED,
// and FastProvider.EveryFastKernelIsComparedWithTheReference fails for a registered fast kernel
// that no file declares.

#include <set>
#include <string>
#include <utility>

namespace popart::fast_cases {

/// The (domain, type) pairs declared so far.
std::set<std::pair<std::string, std::string>> &compared();

inline bool declare(const char *domain, const char *type) {
  compared().emplace(domain, type);
  return true;
}

} // namespace popart::fast_cases

#define POPART_FAST_CASE_CAT2(a, b) a##b
#define POPART_FAST_CASE_CAT(a, b) POPART_FAST_CASE_CAT2(a, b)
/// Declares that this file's tests compare the fast kernel of \p domain::\p type with the
/// reference (ExpectProviderMatchesReference or the equivalent through a plan).
#define POPART_FAST_KERNEL_COMPARED(domain, type)                                                                      \
  [[maybe_unused]] static const bool POPART_FAST_CASE_CAT(popartFastCase, __LINE__) =                                  \
      ::popart::fast_cases::declare(domain, type)
