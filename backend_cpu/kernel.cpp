#include "backend_cpu/kernel.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/ops/controlflow.hpp"
#include <popart/error.hpp>

#include <mutex>

namespace popart::backend_cpu {

KernelRegistry &KernelRegistry::instance() {
  static KernelRegistry registry;
  return registry;
}

void KernelRegistry::add(KernelEntry entry) {
  entry.domain = ir::canonicalDomain(entry.domain);
  entries_.push_back(std::move(entry));
}

const KernelEntry *KernelRegistry::find(const ir::Op &op, KernelProvider provider) const {
  const KernelEntry *fallback = nullptr;
  for (const auto &e : entries_) {
    if (e.type != op.type || e.domain != op.domain) continue;
    if (provider != KernelProvider::Any && e.provider != provider) continue;
    if (e.supports && !e.supports(op)) continue;
    if (e.provider == KernelProvider::Dnnl) return &e;
    if (!fallback) fallback = &e;
  }
  return fallback;
}

void registerBuiltinKernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    KernelRegistry &r = KernelRegistry::instance();
    registerReferenceKernels(r);
    registerDnnlKernels(r);
    // Subgraph ops fold constants in their subgraphs with the reference kernels too.
    static ReferenceEvaluator folder(false);
    ir::setSubgraphFolder(&folder);
  });
}

std::unique_ptr<Kernel> createKernel(const ir::Op &op, KernelProvider provider) {
  registerBuiltinKernels();
  const KernelEntry *e = KernelRegistry::instance().find(op, provider);
  if (!e) {
    std::string types;
    for (const auto *t : op.inputs)
      types += (types.empty() ? "" : ", ") + (t ? t->info().toString() : std::string("-"));
    throw error(op.debugName(), ": no CPU kernel supports this op with inputs (", types, ")");
  }
  return e->create(op);
}

} // namespace popart::backend_cpu
