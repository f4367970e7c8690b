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

const char *kernelProviderName(KernelProvider provider) {
  return provider == KernelProvider::Dnnl ? "oneDNN" : provider == KernelProvider::Reference ? "reference" : "any";
}

std::string KernelChoice::explanation() const {
  std::string s = entry ? kernelProviderName(entry->provider) : "no kernel";
  for (size_t i = 0; i < declined.size(); ++i)
    s += (i == 0 ? " (" : "; ") + declined[i];
  return declined.empty() ? s : s + ")";
}

KernelChoice KernelRegistry::choose(const ir::Op &op, KernelProvider provider) const {
  KernelChoice choice;
  const KernelEntry *fallback = nullptr;
  bool dnnlEntry = false;
  std::vector<std::string> declined;
  for (const auto &e : entries_) {
    if (e.type != op.type || e.domain != op.domain) continue;
    if (provider != KernelProvider::Any && e.provider != provider) continue;
    dnnlEntry = dnnlEntry || e.provider == KernelProvider::Dnnl;
    if (e.supports) {
      Support s = e.supports(op);
      if (!s) {
        declined.push_back(std::string(kernelProviderName(e.provider)) + " declined: " + s.reason);
        continue;
      }
    }
    if (e.provider == KernelProvider::Dnnl) {
      choice.entry = &e;
      break;
    }
    if (!fallback) fallback = &e;
  }
  if (!choice.entry) choice.entry = fallback;
  if (!dnnlEntry && provider != KernelProvider::Reference)
    declined.insert(declined.begin(), "oneDNN: no kernel for " + op.type);
  choice.declined = std::move(declined);
  return choice;
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

std::unique_ptr<Kernel> createKernel(const ir::Op &op, KernelProvider provider, const KernelContext &context) {
  registerBuiltinKernels();
  const KernelEntry *e = KernelRegistry::instance().find(op, provider);
  if (!e) {
    std::string types;
    for (const auto *t : op.inputs)
      types += (types.empty() ? "" : ", ") + (t ? t->info().toString() : std::string("-"));
    throw error(op.debugName(), ": no CPU kernel supports this op with inputs (", types, ")");
  }
  return createKernel(*e, op, context);
}

std::unique_ptr<Kernel> createKernel(const KernelEntry &entry, const ir::Op &op, const KernelContext &context) {
  try {
    return entry.create(op, context);
  } catch (const error &) {
    throw;
  } catch (const std::exception &e) { // oneDNN's: its check accepted the op, so this is a bug
    throw error(op.debugName(), ": the ", kernelProviderName(entry.provider),
                " kernel failed to build after its capability check accepted the op: ", e.what());
  }
}

} // namespace popart::backend_cpu
