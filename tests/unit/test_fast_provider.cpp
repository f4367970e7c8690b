// The fast kernel provider as a whole: it ranks between oneDNN and the reference, and every fast
// kernel is compared with the reference by some test (fast_cases.hpp). The comparisons themselves
// live with their families (test_fast_kernels.cpp and the files that declare their cases).

#include "fast_cases.hpp"

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <tuple>

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

TEST(FastProvider, AnyPrefersOneDnnThenFastThenReference) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  using backend_cpu::KernelProvider;
  auto chosen = [](const std::string &type, DataType t, const std::vector<Shape> &shapes) {
    ir::Graph g;
    g.opsets()["ai.onnx"] = 13;
    std::vector<TensorId> ins;
    for (size_t i = 0; i < shapes.size(); ++i) {
      ins.push_back(std::string(1, static_cast<char>('a' + i)));
      g.addTensor(ins.back(), ir::TensorKind::Stream, TensorInfo(t, shapes[i]));
    }
    ir::Op &op = g.addOp(type, "ai.onnx", 13, "", {}, ins, {"y"});
    op.def->setup(op);
    const auto &registry = backend_cpu::KernelRegistry::instance();
    bool fast = registry.find(op, KernelProvider::Fast) != nullptr;
    bool dnnl = registry.find(op, KernelProvider::Dnnl) != nullptr;
    return std::tuple{registry.find(op)->provider, fast, dnnl};
  };
  // Same-shape f32 Add: oneDNN's binary and the fast broadcast loop both take it; oneDNN runs it.
  auto [provider, fast, dnnl] = chosen("Add", DataType::FLOAT, {{4, 8}, {4, 8}});
  EXPECT_TRUE(fast && dnnl);
  EXPECT_EQ(provider, KernelProvider::Dnnl);
  // Both inputs broadcast: oneDNN declines, the fast loop runs it before the reference.
  std::tie(provider, fast, dnnl) = chosen("Add", DataType::FLOAT, {{4, 1}, {1, 8}});
  EXPECT_TRUE(fast && !dnnl);
  EXPECT_EQ(provider, KernelProvider::Fast);
  // f64: only the reference.
  std::tie(provider, fast, dnnl) = chosen("Add", DataType::DOUBLE, {{4, 1}, {1, 8}});
  EXPECT_TRUE(!fast && !dnnl);
  EXPECT_EQ(provider, KernelProvider::Reference);
}
