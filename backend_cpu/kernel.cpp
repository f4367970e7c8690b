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
  std::unique_lock lock(mutex_);
  entries_.push_back(std::move(entry));
}

const char *kernelProviderName(KernelProvider provider) {
  switch (provider) {
  case KernelProvider::Dnnl: return "oneDNN";
  case KernelProvider::Fast: return "fast";
  case KernelProvider::Reference: return "reference";
  case KernelProvider::Plugin: return "plugin";
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

/// Preference among the providers an op's entries come from: a plugin's override, oneDNN, fast,
/// reference.
int rank(KernelProvider provider) {
  switch (provider) {
  case KernelProvider::Plugin: return -1;
  case KernelProvider::Dnnl: return 0;
  case KernelProvider::Fast: return 1;
  case KernelProvider::Reference:
  case KernelProvider::Any: break;
  }
  return 2;
}
int rank(const KernelEntry &e) { return rank(e.provider); }

/// Whether the session's choice \p provider allows \p e.
bool allowed(const KernelEntry &e, KernelProvider provider) {
  return provider == KernelProvider::Any || e.provider == provider;
}

} // namespace

std::vector<const KernelEntry *> KernelRegistry::candidates(const ir::Op &op, KernelProvider provider) const {
  std::vector<const KernelEntry *> found;
  std::shared_lock lock(mutex_);
  for (const auto &e : entries_)
    if (e.type == op.type && e.domain == op.domain && allowed(e, provider)) found.push_back(&e);
  return found;
}

KernelChoice KernelRegistry::choose(const ir::Op &op, KernelProvider provider) const {
  KernelChoice choice;
  bool dnnlEntry = false;
  std::vector<std::pair<int, std::string>> declined;
  for (const KernelEntry *entry : candidates(op, provider)) {
    const KernelEntry &e = *entry;
    dnnlEntry = dnnlEntry || e.provider == KernelProvider::Dnnl;
    if (e.supports) {
      Support s = e.supports(op);
      if (!s) {
        declined.emplace_back(rank(e), std::string(kernelProviderName(e.provider)) + " declined: " + s.reason);
        continue;
      }
    }
    if (!choice.entry || rank(e) < rank(*choice.entry)) choice.entry = &e;
  }
  // Why the chosen kernel runs: the declines of the providers preferred to it (a fast entry for
  // other types does not explain why oneDNN's runs).
  for (auto &[r, why] : declined)
    if (!choice.entry || r < rank(*choice.entry)) choice.declined.push_back(std::move(why));
  if (!dnnlEntry && (provider == KernelProvider::Any || provider == KernelProvider::Dnnl))
    choice.declined.insert(choice.declined.begin(), "oneDNN: no kernel for " + op.type);
  return choice;
}

const KernelEntry *KernelRegistry::find(const ir::Op &op, KernelProvider provider) const {
  const KernelEntry *best = nullptr;
  for (const KernelEntry *entry : candidates(op, provider)) {
    const KernelEntry &e = *entry;
    if (best && rank(e) >= rank(*best)) continue;
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
    // The checks that declined it say why (a custom op's "takes FLOAT or DOUBLE, not INT32").
    std::string why;
    for (const std::string &d : KernelRegistry::instance().choose(op, provider).declined)
      if (d.find(" declined: ") != std::string::npos) why += (why.empty() ? " (" : "; ") + d;
    throw error(op.debugName(), ": no CPU kernel supports this op with inputs (", types, ")",
                why.empty() ? "" : why + ")");
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
