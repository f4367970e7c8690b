// Custom ops (include/popart/custom_op.hpp): loading plugin libraries, checking their definitions,
// and bridging them into the registries the built-in ops use: ir::OpRegistry (shape inference),
// backend_cpu::KernelRegistry (kernels and overrides) and autodiff::GradRuleRegistry (gradients).

#include <popart/custom_op.hpp>

#include "autodiff/grad_rules.hpp"
#include "backend_cpu/kernel.hpp"
#include "core/log.hpp"
#include "ir/graph.hpp"
#include "ir/op.hpp"

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

namespace popart {

namespace {

/// A custom op's definition and the library (or program) that added it.
struct CustomOpEntry {
  CustomOpDef def;
  std::string origin;
};

/// A kernel override and the library that added it.
struct OverrideEntry {
  CustomKernelOverride def;
  std::string origin;
};

/// The custom definitions, looked up by the bridges below (which the registries call on any
/// thread). Entries are shared so that a definition replaced by an override stays alive for a
/// compile that is using it.
class CustomOpTable {
public:
  static CustomOpTable &instance() {
    static CustomOpTable table;
    return table;
  }

  /// Held while a library loads and registers, so that registration is one step at a time.
  std::mutex &loadMutex() { return loadMutex_; }

  std::shared_ptr<const CustomOpEntry> find(const std::string &domain, const std::string &type, int version) const {
    std::lock_guard lock(mutex_);
    for (const auto &e : ops_)
      if (e->def.domain == domain && e->def.type == type && version >= e->def.minOpset && version <= e->def.maxOpset)
        return e;
    return nullptr;
  }
  /// The entry of \p op; throws naming it if there is none (the registries called a bridge for an
  /// op that no custom definition covers, which is a bug).
  std::shared_ptr<const CustomOpEntry> of(const ir::Op &op) const {
    auto e = find(op.domain, op.type, op.version);
    if (!e)
      throw error(op.debugName(), ": no custom definition of ", op.domain, "::", op.type, " at opset ", op.version);
    return e;
  }
  std::shared_ptr<const OverrideEntry> findOverride(const std::string &domain, const std::string &type) const {
    std::lock_guard lock(mutex_);
    auto it = overrides_.find({domain, type});
    return it == overrides_.end() ? nullptr : it->second;
  }
  /// Adds \p entry, or replaces the entry of the same domain, type and opsets.
  void put(std::shared_ptr<const CustomOpEntry> entry) {
    std::lock_guard lock(mutex_);
    for (auto &e : ops_)
      if (e->def.domain == entry->def.domain && e->def.type == entry->def.type &&
          e->def.minOpset == entry->def.minOpset && e->def.maxOpset == entry->def.maxOpset) {
        e = std::move(entry);
        return;
      }
    ops_.push_back(std::move(entry));
  }
  void putOverride(std::shared_ptr<const OverrideEntry> entry) {
    std::lock_guard lock(mutex_);
    overrides_[{entry->def.domain, entry->def.type}] = std::move(entry);
  }
  /// Whether \p path (canonical) was loaded; records it if not.
  bool loaded(const std::string &path) const { return libraries_.count(path) != 0; }
  void recordLibrary(const std::string &path, void *handle) { libraries_[path] = handle; }

private:
  std::mutex loadMutex_;
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const CustomOpEntry>> ops_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<const OverrideEntry>> overrides_;
  std::map<std::string, void *> libraries_; // guarded by loadMutex_; never closed once loaded
};

const char *kindName(CustomAttributeKind kind) {
  switch (kind) {
  case CustomAttributeKind::Int: return "int";
  case CustomAttributeKind::Float: return "float";
  case CustomAttributeKind::String: return "string";
  case CustomAttributeKind::Ints: return "ints";
  case CustomAttributeKind::Floats: return "floats";
  case CustomAttributeKind::Strings: return "strings";
  }
  return "?";
}

/// An ir attribute as a custom attribute value (they share the first six alternatives); empty for
/// tensors and subgraphs, which custom ops cannot take.
std::optional<CustomAttributeValue> toCustom(const ir::AttributeValue &v) {
  return std::visit(
      [](const auto &x) -> std::optional<CustomAttributeValue> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_constructible_v<CustomAttributeValue, T> && !std::is_pointer_v<T>)
          return CustomAttributeValue(x);
        else
          return std::nullopt;
      },
      v);
}

ir::Attributes toIr(const CustomAttributes &attributes) {
  ir::Attributes a;
  for (const auto &[name, value] : attributes)
    std::visit([&, &key = name](const auto &x) { a.set(key, x); }, value);
  return a;
}

/// The node of \p op as the plugin sees it: the declared attributes checked and completed with
/// their defaults (\p spec null: an override, which takes every attribute as it is).
CustomOpNode nodeOf(const ir::Op &op, const std::vector<CustomAttributeSpec> *spec, const std::string &origin,
                    bool withOutputs, int threads) {
  CustomOpNode node;
  node.name = op.debugName();
  node.domain = op.domain;
  node.type = op.type;
  node.opset = op.version;
  node.threads = threads;
  for (const ir::Tensor *t : op.inputs)
    node.inputs.push_back(t ? t->info() : TensorInfo());
  if (withOutputs)
    for (const ir::Tensor *t : op.outputs)
      node.outputs.push_back(t ? t->info() : TensorInfo());
  for (const auto &[name, value] : op.attrs.all()) {
    if (name.rfind("__", 0) == 0 || name.rfind("popart_", 0) == 0) continue; // annotations, runtime's own
    std::optional<CustomAttributeValue> v = toCustom(value);
    if (!spec) {
      if (v) node.attributes[name] = std::move(*v);
      continue;
    }
    auto s =
        std::find_if(spec->begin(), spec->end(), [&key = name](const CustomAttributeSpec &a) { return a.name == key; });
    if (s == spec->end())
      throw error(node.name, ": ", op.domain, "::", op.type, " (", origin, ") has no attribute '", name, "'");
    // ONNX writes alpha=1 as an int; a float attribute takes it.
    if (v && s->kind == CustomAttributeKind::Float && v->index() == static_cast<size_t>(CustomAttributeKind::Int))
      v = static_cast<float>(std::get<int64_t>(*v));
    if (!v || v->index() != static_cast<size_t>(s->kind))
      throw error(node.name, ": attribute '", name, "' of ", op.domain, "::", op.type, " must be ", kindName(s->kind));
    node.attributes[name] = std::move(*v);
  }
  if (spec)
    for (const auto &s : *spec)
      if (!node.attributes.count(s.name)) {
        if (!s.defaultValue)
          throw error(node.name, ": ", op.domain, "::", op.type, " (", origin, ") needs attribute '", s.name, "' (",
                      kindName(s.kind), ")");
        node.attributes[s.name] = *s.defaultValue;
      }
  return node;
}

CustomOpNode nodeOf(const ir::Op &op, const CustomOpEntry &e, bool withOutputs, int threads = 1) {
  return nodeOf(op, &e.def.attributes, e.origin, withOutputs, threads);
}

/// Calls the plugin's \p f, turning what it throws into an error naming \p op, the library and \p what.
template <typename F> auto callPlugin(const ir::Op &op, const std::string &origin, const char *what, F &&f) {
  try {
    return f();
  } catch (const std::exception &e) {
    throw error(op.debugName(), ": the ", what, " of ", op.domain, "::", op.type, " (", origin, ") failed: ", e.what());
  }
}

/// OpDef::setup of every custom op: checks the inputs and outputs, runs the plugin's inference.
void customSetup(ir::Op &op) {
  auto e = CustomOpTable::instance().of(op);
  const CustomOpDef &d = e->def;
  auto inputs = static_cast<int>(op.inputCount());
  if (inputs < d.minInputs || inputs > d.maxInputs)
    throw error(op.debugName(), ": ", op.domain, "::", op.type, " takes ", d.minInputs,
                d.maxInputs == d.minInputs ? "" : " to " + std::to_string(d.maxInputs), " inputs, got ", inputs);
  for (int i = 0; i < d.minInputs; ++i)
    if (!op.hasInput(static_cast<size_t>(i)))
      throw error(op.debugName(), ": input ", i, " of ", op.domain, "::", op.type, " is required but missing");
  if (op.outputCount() > static_cast<size_t>(d.outputs))
    throw error(op.debugName(), ": ", op.domain, "::", op.type, " has ", d.outputs, " outputs, the node names ",
                op.outputCount());
  CustomOpNode node = nodeOf(op, *e, false);
  std::vector<TensorInfo> infos = callPlugin(op, e->origin, "shape inference", [&] { return d.inferShapes(node); });
  if (infos.size() != static_cast<size_t>(d.outputs))
    throw error(op.debugName(), ": the shape inference of ", op.domain, "::", op.type, " (", e->origin, ") gave ",
                infos.size(), " output infos for ", d.outputs, " outputs");
  for (size_t i = 0; i < op.outputCount(); ++i)
    op.setOutInfo(i, infos[i]);
}

/// Runs a plugin's kernel: typed views over the plan's buffers, the session's threads (OpenMP's
/// pool, which the built-in kernels use too).
class CustomKernelAdapter final : public backend_cpu::Kernel, private CustomThreadPool {
public:
  CustomKernelAdapter(const ir::Op &op, const CustomOpNode &node, std::shared_ptr<const void> keepAlive,
                      std::unique_ptr<CustomKernel> kernel)
      : name_(op.debugName()), inputs_(node.inputs), outputs_(node.outputs), threads_(std::max(1, node.threads)),
        keepAlive_(std::move(keepAlive)), kernel_(std::move(kernel)) {
    if (!kernel_) throw error(name_, ": the kernel factory of ", op.domain, "::", op.type, " returned no kernel");
  }

  void run(const backend_cpu::KernelArgs &a) override {
    CustomKernelRun run(name_.c_str(), a.inputs, inputs_.data(), std::min(a.inputCount, inputs_.size()), a.outputs,
                        outputs_.data(), std::min(a.outputCount, outputs_.size()), a.scratch, *this);
    kernel_->run(run);
  }
  int64_t scratchBytes() const override { return kernel_->scratchBytes(); }

private:
  int threadCount() const override { return threads_; }
  void parallelFor(int64_t n, void (*body)(void *, int64_t, int64_t), void *context) const override {
    if (n <= 0) return;
    int threads = static_cast<int>(std::min<int64_t>(threads_, n));
    if (threads <= 1) {
      body(context, 0, n);
      return;
    }
    // An exception must not leave an OpenMP region: the first one is rethrown after it.
    std::exception_ptr failure;
#pragma omp parallel num_threads(threads)
    {
      int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
      int64_t begin = n * t / count, end = n * (t + 1) / count;
      try {
        if (begin < end) body(context, begin, end);
      } catch (...) {
#pragma omp critical(popart_custom_parallel_for)
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
  }

  std::string name_;
  std::vector<TensorInfo> inputs_;
  std::vector<TensorInfo> outputs_;
  int threads_;
  std::shared_ptr<const void> keepAlive_; // the definition whose factory made kernel_
  std::unique_ptr<CustomKernel> kernel_;
};

backend_cpu::Support supportOf(const ir::Op &op, const CustomSupportCheck &check, const CustomOpNode &node,
                               const std::string &origin) {
  if (!check) return backend_cpu::Support::yes();
  return backend_cpu::Support::unless(callPlugin(op, origin, "capability check", [&] { return check(node); }));
}

backend_cpu::Support customSupports(const ir::Op &op) {
  auto e = CustomOpTable::instance().of(op);
  return supportOf(op, e->def.supports, nodeOf(op, *e, true), e->origin);
}

std::unique_ptr<backend_cpu::Kernel> createCustomKernel(const ir::Op &op, const backend_cpu::KernelContext &context) {
  auto e = CustomOpTable::instance().of(op);
  CustomOpNode node = nodeOf(op, *e, true, context.threads);
  auto kernel = callPlugin(op, e->origin, "kernel factory", [&] { return e->def.kernel(node); });
  return std::make_unique<CustomKernelAdapter>(op, node, e, std::move(kernel));
}

std::shared_ptr<const OverrideEntry> overrideOf(const ir::Op &op) {
  auto e = CustomOpTable::instance().findOverride(op.domain, op.type);
  if (!e) throw error(op.debugName(), ": no kernel override for ", op.domain, "::", op.type);
  return e;
}

backend_cpu::Support overrideSupports(const ir::Op &op) {
  auto e = overrideOf(op);
  return supportOf(op, e->def.supports, nodeOf(op, nullptr, e->origin, true, 1), e->origin);
}

std::unique_ptr<backend_cpu::Kernel> createOverrideKernel(const ir::Op &op, const backend_cpu::KernelContext &context) {
  auto e = overrideOf(op);
  CustomOpNode node = nodeOf(op, nullptr, e->origin, true, context.threads);
  auto kernel = callPlugin(op, e->origin, "kernel override", [&] { return e->def.kernel(node); });
  return std::make_unique<CustomKernelAdapter>(op, node, e, std::move(kernel));
}

/// The backward graph as a plugin's gradient sees it.
class GradBuilder final : public CustomGradBuilder {
public:
  GradBuilder(autodiff::GradContext &c, const CustomOpEntry &e) : c_(c), node_(nodeOf(c.op(), e, true)) {}
  const CustomOpNode &node() const override { return node_; }
  TensorId input(size_t i) const override { return c_.in(i); }
  TensorId output(size_t i) const override { return c_.out(i); }
  TensorId outputGrad(size_t i) const override { return c_.outGrad(i); }
  std::vector<TensorId> addOp(const std::string &type, const std::vector<TensorId> &inputs,
                              const CustomAttributes &attributes, const std::string &domain, int opset,
                              size_t outputs) override {
    ir::Graph &g = c_.graph();
    std::string dom = ir::canonicalDomain(domain);
    auto known = g.opsets().find(dom);
    int version = known != g.opsets().end() ? known->second : opset > 0 ? opset : dom == "ai.onnx" ? 17 : 0;
    if (version <= 0)
      throw error(c_.op().debugName(), ": its gradient adds ", dom, "::", type,
                  " but the model imports no opset of that domain: give the op's opset");
    const ir::Tensor *first = c_.op().outputs.empty() ? nullptr : c_.op().outputs[0];
    std::vector<TensorId> outs;
    for (size_t i = 0; i < std::max<size_t>(outputs, 1); ++i)
      outs.push_back(g.uniqueId(first ? first->id() + "_grad_" + type : type));
    ir::Op &added = g.addOp(type, dom, version, "", toIr(attributes), inputs, outs);
    added.def->setup(added);
    return outs;
  }
  TensorId scalar(double value) override { return c_.scalar(value); }
  void setInputGrad(size_t i, const TensorId &grad) override {
    if (i >= c_.op().inputCount() || !c_.op().hasInput(i))
      throw error(c_.op().debugName(), ": its gradient sets the gradient of input ", i, ", which the node lacks");
    c_.setInGrad(i, grad);
  }

private:
  autodiff::GradContext &c_;
  CustomOpNode node_;
};

void customGradient(autodiff::GradContext &c) {
  auto e = CustomOpTable::instance().of(c.op());
  if (!e->def.gradient)
    throw error("no gradient rule for ", c.op().domain, " ", c.op().type, " at opset ", c.op().version, " (",
                c.op().debugName(), "; ", e->origin, " defines none)");
  GradBuilder builder(c, *e);
  callPlugin(c.op(), e->origin, "gradient", [&] {
    e->def.gradient(builder);
    return 0;
  });
}

/// The library's registrations, kept until they are checked and committed together.
class StagingRegistrar final : public CustomOpRegistrar {
public:
  void addOp(CustomOpDef def) override { ops.push_back(std::move(def)); }
  void overrideKernel(CustomKernelOverride kernel) override { overrides.push_back(std::move(kernel)); }
  std::vector<CustomOpDef> ops;
  std::vector<CustomKernelOverride> overrides;
};

bool reservedDomain(const std::string &domain) {
  static const std::set<std::string> reserved = {"ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "ai.graphcore"};
  return reserved.count(ir::canonicalDomain(domain)) != 0;
}

bool overlap(int a0, int a1, int b0, int b1) { return !(a1 < b0 || a0 > b1); }

/// Why \p d is malformed; empty if it is not.
std::string malformed(const CustomOpDef &d) {
  if (d.domain.empty() || reservedDomain(d.domain))
    return "its domain must be the library's own, not '" + d.domain + "' (a built-in op's kernel can be overridden)";
  if (d.type.empty()) return "it has no type";
  if (d.minOpset < 1 || d.minOpset > d.maxOpset)
    return "its opsets " + std::to_string(d.minOpset) + "-" + std::to_string(d.maxOpset) + " are not a range from 1";
  if (d.minInputs < 0 || d.minInputs > d.maxInputs)
    return "its inputs " + std::to_string(d.minInputs) + " to " + std::to_string(d.maxInputs) + " are not a range";
  if (d.outputs < 1) return "it has no outputs";
  if (!d.inferShapes) return "it has no shape inference (inferShapes)";
  if (!d.kernel) return "it has no kernel factory (kernel)";
  std::set<std::string> names;
  for (const auto &a : d.attributes) {
    if (a.name.empty()) return "an attribute has no name";
    if (!names.insert(a.name).second) return "attribute '" + a.name + "' is declared twice";
    if (a.defaultValue && a.defaultValue->index() != static_cast<size_t>(a.kind))
      return "the default of attribute '" + a.name + "' is not a " + kindName(a.kind);
  }
  return {};
}

std::string describe(const std::string &domain, const std::string &type, int lo, int hi) {
  return domain + "::" + type + " (opsets " + std::to_string(lo) + (hi >= 1000 ? "+" : "-" + std::to_string(hi)) + ")";
}

/// Checks everything \p staged adds, then registers it all; \p origin names it. Called with the
/// load mutex held, which every registration by this module takes, so the registries' lists
/// read here do not change meanwhile.
void commit(const std::string &origin, StagingRegistrar &staged) {
  ir::registerBuiltinOps();
  autodiff::registerBuiltinRules();
  backend_cpu::registerBuiltinKernels();
  CustomOpTable &table = CustomOpTable::instance();
  auto fail = [&](const std::string &what, const auto &...args) { throw error(origin, ": ", what, args...); };

  std::vector<bool> replaces(staged.ops.size(), false);
  for (size_t i = 0; i < staged.ops.size(); ++i) {
    const CustomOpDef &d = staged.ops[i];
    std::string name = describe(d.domain, d.type, d.minOpset, d.maxOpset);
    if (std::string why = malformed(d); !why.empty()) fail("op ", name, " is malformed: ", why);
    for (size_t j = 0; j < i; ++j)
      if (staged.ops[j].domain == d.domain && staged.ops[j].type == d.type &&
          overlap(d.minOpset, d.maxOpset, staged.ops[j].minOpset, staged.ops[j].maxOpset))
        fail("op ", name, " is defined twice");
    for (const ir::OpDef &existing : ir::OpRegistry::instance().all()) {
      if (existing.domain != d.domain || existing.type != d.type ||
          !overlap(d.minOpset, d.maxOpset, existing.minVersion, existing.maxVersion))
        continue;
      auto custom = table.find(d.domain, d.type, std::max(d.minOpset, existing.minVersion));
      if (!custom) fail("op ", name, " is a built-in op: a library may override its kernel, not its definition");
      if (!d.override)
        fail("op ", name, " is already registered by ", custom->origin, " (set CustomOpDef::override to replace it)");
      if (custom->def.minOpset != d.minOpset || custom->def.maxOpset != d.maxOpset)
        fail("op ", name, " overrides a definition of other opsets (",
             describe(d.domain, d.type, custom->def.minOpset, custom->def.maxOpset), " by ", custom->origin, ")");
      replaces[i] = true;
    }
  }
  for (size_t i = 0; i < staged.overrides.size(); ++i) {
    const CustomKernelOverride &k = staged.overrides[i];
    std::string name = k.domain + "::" + k.type;
    if (k.domain.empty()) fail("kernel override of ", k.type, " names no domain ('ai.onnx' for the default one)");
    if (!k.kernel) fail("kernel override of ", name, " is malformed: it has no kernel factory");
    bool stagedOp = std::any_of(staged.ops.begin(), staged.ops.end(),
                                [&](const CustomOpDef &d) { return d.domain == k.domain && d.type == k.type; });
    if (!stagedOp && !ir::OpRegistry::instance().knowsType(k.domain, k.type))
      fail("kernel override of ", name, ": no registered op has that domain and type");
    for (size_t j = 0; j < i; ++j)
      if (staged.overrides[j].domain == k.domain && staged.overrides[j].type == k.type)
        fail("kernel override of ", name, " is given twice");
    if (auto existing = table.findOverride(ir::canonicalDomain(k.domain), k.type); existing && !k.override)
      fail("kernel override of ", name, " is already registered by ", existing->origin,
           " (set CustomKernelOverride::override to replace it)");
  }

  // Checked: register. Nothing below refuses what the checks above accepted.
  for (size_t i = 0; i < staged.ops.size(); ++i) {
    auto entry = std::make_shared<CustomOpEntry>(CustomOpEntry{std::move(staged.ops[i]), origin});
    const CustomOpDef &d = entry->def;
    bool needsRule = d.gradient && autodiff::GradRuleRegistry::instance().find(d.domain, d.type, d.minOpset) == nullptr;
    std::string domain = d.domain, type = d.type;
    int lo = d.minOpset, hi = d.maxOpset;
    table.put(std::move(entry));
    if (!replaces[i]) {
      ir::OpDef def;
      def.domain = domain;
      def.type = type;
      def.minVersion = lo;
      def.maxVersion = hi;
      def.setup = customSetup;
      ir::OpRegistry::instance().add(std::move(def));
      backend_cpu::KernelRegistry::instance().add(
          {domain, type, backend_cpu::KernelProvider::Reference, customSupports, createCustomKernel});
    }
    if (needsRule) autodiff::GradRuleRegistry::instance().add({domain, type, lo, hi, customGradient});
    logging::logger().debug("custom op {}::{} opsets {}-{} registered by {}", domain, type, lo, hi, origin);
  }
  for (auto &k : staged.overrides) {
    k.domain = ir::canonicalDomain(k.domain);
    bool first = table.findOverride(k.domain, k.type) == nullptr;
    std::string domain = k.domain, type = k.type;
    table.putOverride(std::make_shared<OverrideEntry>(OverrideEntry{std::move(k), origin}));
    if (first)
      backend_cpu::KernelRegistry::instance().add(
          {domain, type, backend_cpu::KernelProvider::Plugin, overrideSupports, createOverrideKernel});
    logging::logger().debug("kernel of {}::{} overridden by {}", domain, type, origin);
  }
}

} // namespace

void registerCustomOps(const std::string &origin, const std::function<void(CustomOpRegistrar &)> &registration) {
  std::lock_guard lock(CustomOpTable::instance().loadMutex());
  StagingRegistrar staged;
  try {
    registration(staged);
  } catch (const std::exception &e) {
    throw error(origin, ": registration failed: ", e.what());
  }
  commit(origin, staged);
}

void loadCustomOpLibrary(const std::string &path) {
  CustomOpTable &table = CustomOpTable::instance();
  std::lock_guard lock(table.loadMutex());
  std::string canonical = path;
  if (char *real = realpath(path.c_str(), nullptr)) {
    canonical = real;
    free(real); // NOLINT(cppcoreguidelines-no-malloc): realpath's buffer
  }
  if (table.loaded(canonical)) return;
  std::string origin = "custom op library '" + path + "'";
  void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *why = dlerror();
    throw error(origin, ": cannot load it: ", why ? why : "unknown dlopen error");
  }
  // Closes the library unless it registered: nothing of it may outlive a failure (the staged
  // definitions, which hold its code, are destroyed before this).
  struct Closer {
    void *handle;
    ~Closer() {
      if (handle) dlclose(handle);
    }
  } closer{handle};
  {
    StagingRegistrar staged;
    auto *abi = reinterpret_cast<int (*)()>(dlsym(handle, POPART_CUSTOM_OP_ABI_SYMBOL));
    if (!abi)
      throw error(origin, ": it exports no ", POPART_CUSTOM_OP_ABI_SYMBOL,
                  " (define its entry point with POPART_CUSTOM_OP_LIBRARY from popart/custom_op.hpp)");
    if (int version = abi(); version != POPART_CUSTOM_OP_ABI_VERSION)
      throw error(origin, ": it was built for custom-op ABI version ", version, ", this runtime has version ",
                  POPART_CUSTOM_OP_ABI_VERSION, ": rebuild it against this runtime's headers");
    auto *entry = reinterpret_cast<void (*)(CustomOpRegistrar &)>(dlsym(handle, POPART_CUSTOM_OP_ENTRY_SYMBOL));
    if (!entry)
      throw error(origin, ": it exports no ", POPART_CUSTOM_OP_ENTRY_SYMBOL,
                  " (define it with POPART_CUSTOM_OP_LIBRARY from popart/custom_op.hpp)");
    try {
      entry(staged);
    } catch (const std::exception &e) {
      throw error(origin, ": its registration failed: ", e.what());
    }
    commit(origin, staged);
  }
  table.recordLibrary(canonical, handle);
  closer.handle = nullptr;
  logging::logger().info("loaded {}", origin);
}

} // namespace popart
