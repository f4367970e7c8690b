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
  switch (provider) {
  case KernelProvider::Dnnl: return "oneDNN";
  case KernelProvider::Fast: return "fast";
  case KernelProvider::Reference: return "reference";
  case KernelProvider::Any: break;
  }
  return "any";
}

KernelProvider kernelProviderFromName(const std::string &name) {
  for (KernelProvider p : {KernelProvider::Any, KernelProvider::Reference, KernelProvider::Fast, KernelProvider::Dnnl})
    if (name == (p == KernelProvider::Dnnl ? "dnnl" : kernelProviderName(p))) return p;
  throw error("kernels must be any, reference, fast or dnnl, got '", name, "'");
}

std::string KernelChoice::explanation() const {
  std::string s = entry ? kernelProviderName(entry->provider) : "no kernel";
  for (size_t i = 0; i < declined.size(); ++i)
    s += (i == 0 ? " (" : "; ") + declined[i];
  return declined.empty() ? s : s + ")";
}

namespace {

/// Preference among the providers an op's entries come from: oneDNN, fast, reference.
int rank(KernelProvider provider) {
  return provider == KernelProvider::Dnnl ? 0 : provider == KernelProvider::Fast ? 1 : 2;
}

} // namespace

KernelChoice KernelRegistry::choose(const ir::Op &op, KernelProvider provider) const {
  KernelChoice choice;
  bool dnnlEntry = false;
  std::vector<std::pair<KernelProvider, std::string>> declined;
  for (const auto &e : entries_) {
    if (e.type != op.type || e.domain != op.domain) continue;
    if (provider != KernelProvider::Any && e.provider != provider) continue;
    dnnlEntry = dnnlEntry || e.provider == KernelProvider::Dnnl;
    if (e.supports) {
      Support s = e.supports(op);
      if (!s) {
        declined.emplace_back(e.provider, std::string(kernelProviderName(e.provider)) + " declined: " + s.reason);
        continue;
      }
    }
    if (!choice.entry || rank(e.provider) < rank(choice.entry->provider)) choice.entry = &e;
  }
  // Why the chosen kernel runs: the declines of the providers preferred to it (a fast entry for
  // other types does not explain why oneDNN's runs).
  for (auto &[p, why] : declined)
    if (!choice.entry || rank(p) < rank(choice.entry->provider)) choice.declined.push_back(std::move(why));
  if (!dnnlEntry && (provider == KernelProvider::Any || provider == KernelProvider::Dnnl))
    choice.declined.insert(choice.declined.begin(), "oneDNN: no kernel for " + op.type);
  return choice;
}

const KernelEntry *KernelRegistry::find(const ir::Op &op, KernelProvider provider) const {
  const KernelEntry *best = nullptr;
  for (const auto &e : entries_) {
    if (e.type != op.type || e.domain != op.domain) continue;
    if (provider != KernelProvider::Any && e.provider != provider) continue;
    if (best && rank(e.provider) >= rank(best->provider)) continue;
    if (e.supports && !e.supports(op)) continue;
    best = &e;
  }
  return best;
}

void registerBuiltinKernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    KernelRegistry &r = KernelRegistry::instance();
    registerReferenceKernels(r);
    registerFastKernels(r);
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
    if (provider != KernelProvider::Any)
      throw error(op.debugName(), ": no ", kernelProviderName(provider), " kernel supports this op with inputs (",
                  types, "), and the session allows only ", kernelProviderName(provider),
                  " kernels (SessionOptions::kernels, --kernels)");
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
