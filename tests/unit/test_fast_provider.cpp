// The fast kernel provider as a whole: it ranks between oneDNN and the reference, and every fast
// kernel is compared with the reference by some test (fast_cases.hpp). The comparisons themselves
// live with their families (test_fast_kernels.cpp and the files that declare their cases).

#include "fast_cases.hpp"

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

using namespace popart;

namespace popart::fast_cases {
std::set<std::pair<std::string, std::string>> &compared() {
  static std::set<std::pair<std::string, std::string>> s;
  return s;
}
} // namespace popart::fast_cases

TEST(FastProvider, EveryFastKernelIsComparedWithTheReference) {
  backend_cpu::registerBuiltinKernels();
  int fast = 0;
  for (const auto &e : backend_cpu::KernelRegistry::instance().all()) {
    if (e.provider != backend_cpu::KernelProvider::Fast) continue;
    ++fast;
    EXPECT_TRUE(fast_cases::compared().count({e.domain, e.type}))
        << "the fast " << e.domain << "::" << e.type
        << " kernel is compared with the reference by no test (POPART_FAST_KERNEL_COMPARED)";
    bool reference = false;
    for (const auto &r : backend_cpu::KernelRegistry::instance().all())
      reference = reference ||
                  (r.provider == backend_cpu::KernelProvider::Reference && r.domain == e.domain && r.type == e.type);
    EXPECT_TRUE(reference) << "the fast " << e.domain << "::" << e.type << " kernel has no reference kernel";
  }
  EXPECT_GT(fast, 0) << "no fast kernels registered";
}

TEST(FastProvider, KernelProvidersParseByNameAndRejectOthers) {
  using backend_cpu::KernelProvider;
  EXPECT_EQ(backend_cpu::kernelProviderFromName("fast"), KernelProvider::Fast);
  EXPECT_EQ(backend_cpu::kernelProviderFromName("dnnl"), KernelProvider::Dnnl);
  EXPECT_EQ(backend_cpu::kernelProviderFromName("reference"), KernelProvider::Reference);
  EXPECT_EQ(backend_cpu::kernelProviderFromName("any"), KernelProvider::Any);
  try {
    backend_cpu::kernelProviderFromName("onednn");
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("kernels must be any, reference, fast or dnnl, got 'onednn'"),
              std::string::npos)
        << e.what();
  }
}
