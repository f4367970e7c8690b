#pragma once
// A kernel runs one op on host buffers; kernels are chosen through a registry keyed by op
// type, with a capability check: oneDNN first, then the fast kernels, the reference kernel as
// fallback.

#include "backend_cpu/kernel_context.hpp"
#include "ir/op.hpp"

#include <deque>
#include <memory>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace popart::backend_cpu {

/// Buffers of one op for one run; null where an optional input or output is omitted.
struct KernelArgs {
  const void *const *inputs = nullptr;
  size_t inputCount = 0;
  void *const *outputs = nullptr;
  size_t outputCount = 0;
  /// The kernel's working memory (Kernel::scratchBytes, 64-byte aligned), planned in the arena
  /// for this step only; null when the kernel runs outside a plan.
  void *scratch = nullptr;

  template <typename T> const T *in(size_t i) const { return static_cast<const T *>(inputs[i]); }
  template <typename T> T *out(size_t i) const { return static_cast<T *>(outputs[i]); }
  bool hasInput(size_t i) const { return i < inputCount && inputs[i] != nullptr; }
  bool hasOutput(size_t i) const { return i < outputCount && outputs[i] != nullptr; }
};

/// One op compiled for fixed shapes. Everything is set up at creation; run() allocates nothing.
/// A layout that two kernels agree on for the tensor between them, instead of plain row-major.
/// Opaque to the plan: \p provider names the kind of descriptor in \p desc (oneDNN's
/// memory::desc for "dnnl"); \p bytes is what it occupies, at most the tensor's plain size.
struct TensorLayout {
  const char *provider = nullptr;
  std::shared_ptr<const void> desc;
  int64_t bytes = 0;
  explicit operator bool() const { return desc != nullptr; }
};

class Kernel {
public:
  virtual ~Kernel() = default;
  virtual void run(const KernelArgs &args) = 0;
  /// The layout this kernel would rather write output \p i in (empty: plain). The plan offers it
  /// to every reader of the tensor (acceptsInputIn) and, if all take it, has them read it so
  /// (readInputIn) and confirms it with writeOutputIn.
  virtual TensorLayout outputLayout(size_t /*i*/) const { return {}; }
  /// Whether this kernel can read input \p i in \p layout (nothing changes).
  virtual bool acceptsInputIn(size_t /*i*/, const TensorLayout & /*layout*/) const { return false; }
  /// From now on reads input \p i in \p layout, which acceptsInputIn accepted.
  virtual void readInputIn(size_t /*i*/, const TensorLayout & /*layout*/) {}
  /// From now on writes output \p i in the layout that outputLayout(i) gave.
  virtual void writeOutputIn(size_t /*i*/) {}
  /// Bytes of working memory run() uses (KernelArgs::scratch). The plan places them in the arena,
  /// live during this step only, so they share memory with tensors that are dead by then. A
  /// kernel given no scratch (run outside a plan) must still work.
  virtual int64_t scratchBytes() const { return 0; }
  /// The input whose buffer output 0 may share (-1: none): the kernel reads each element of it
  /// only before writing the same element of output 0, which has its size. The plan then writes
  /// the output over that input where the input is dead after this step.
  virtual int inPlaceInput() const { return -1; }
  /// Elements of independent work that runRange can do in any sub-ranges, in any order or at
  /// once (0: it cannot). The plan merges adjacent such steps (optimiser updates) into one step
  /// that shares all their elements among the threads in one parallel region.
  virtual int64_t rangeElements() const { return 0; }
  /// Does elements [begin, end) of run() on this thread.
  virtual void runRange(const KernelArgs & /*args*/, int64_t /*begin*/, int64_t /*end*/) {}
  /// What the kernel chose while it was created, for popart-run --explain-kernels ("operands
  /// FlippedB, timed"); empty when there was nothing to choose.
  virtual std::string choice() const { return {}; }
};

/// Which kernel implementations may be chosen. Any prefers oneDNN, then the fast kernels, then
/// the reference ones:
/// - Reference (backend_cpu/reference/): plain loops, every op and type; the oracle the others
///   are tested against (threaded over independent outputs, but no vector code, approximate
///   math or tiling).
/// - Fast (backend_cpu/fast/): vectorised and tiled loops for the f32 hot paths oneDNN lacks
///   or runs slower (vecloops.hpp), each tested against the reference.
/// - Dnnl (backend_cpu/dnnl/): oneDNN primitives.
/// - Plugin: a custom-op library's override of a registered op's kernels
///   (include/popart/custom_op.hpp), preferred to all of the above when the session allows any
///   provider, never chosen when it allows one only.
enum class KernelProvider { Any, Reference, Dnnl, Fast, Plugin };

/// A capability check's verdict: supported, or why not ("oneDNN has no f64 matmul"), for the
/// debug log and popart-run --explain-kernels.
struct Support {
  std::string reason; ///< empty: supported
  explicit operator bool() const { return reason.empty(); }
  static Support yes() { return {}; }
  static Support no(std::string why) { return {why.empty() ? std::string("declined") : std::move(why)}; }
  /// Supported unless \p whyNot says why not.
  static Support unless(std::string whyNot) { return {std::move(whyNot)}; }
};

/// A kernel's capability check: decides from the op's types, shapes and attributes (and, where
/// only oneDNN knows, from a primitive descriptor created without throwing), never by building
/// the kernel. Plain bool checks decline without a reason.
class SupportCheck {
public:
  SupportCheck() = default;
  template <typename F>
  requires std::is_convertible_v<F, Support (*)(const ir::Op &)> || std::is_convertible_v<F, bool (*)(const ir::Op &)>
  SupportCheck(F f) { // NOLINT(google-explicit-constructor): registrations name plain functions
    if constexpr (std::is_convertible_v<F, Support (*)(const ir::Op &)>)
      withReason_ = f;
    else
      yesNo_ = f;
  }
  explicit operator bool() const { return withReason_ || yesNo_; }
  Support operator()(const ir::Op &op) const {
    if (withReason_) return withReason_(op);
    return yesNo_(op) ? Support::yes() : Support::no("its capability check declines this op");
  }

private:
  Support (*withReason_)(const ir::Op &) = nullptr;
  bool (*yesNo_)(const ir::Op &) = nullptr;
};

/// Creates a kernel; a kernel that needs nothing of the session takes the op alone.
class KernelFactory {
public:
  using WithContext = std::unique_ptr<Kernel> (*)(const ir::Op &, const KernelContext &);
  using OpOnly = std::unique_ptr<Kernel> (*)(const ir::Op &);
  KernelFactory() = default;
  template <typename F>
  requires std::is_convertible_v<F, WithContext> || std::is_convertible_v<F, OpOnly>
  KernelFactory(F f) { // NOLINT(google-explicit-constructor): registrations name plain functions
    if constexpr (std::is_convertible_v<F, WithContext>)
      withContext_ = f;
    else
      opOnly_ = f;
  }
  explicit operator bool() const { return withContext_ || opOnly_; }
  std::unique_ptr<Kernel> operator()(const ir::Op &op, const KernelContext &context) const {
    return withContext_ ? withContext_(op, context) : opOnly_(op);
  }

private:
  WithContext withContext_ = nullptr;
  OpOnly opOnly_ = nullptr;
};

/// One way to run an op type.
struct KernelEntry {
  std::string domain; ///< canonical domain, "ai.onnx" by default
  std::string type;
  KernelProvider provider = KernelProvider::Reference;
  /// Whether this implementation handles \p op (dtype, attributes, shapes); empty means always.
  SupportCheck supports;
  KernelFactory create;
};

/// The entry chosen for an op, and why the entries before it in preference were not.
struct KernelChoice {
  const KernelEntry *entry = nullptr;
  /// "oneDNN: no kernel for Gather", "fast declined: ..." for each entry of a provider preferred to
  /// the chosen one (of every provider when none is chosen).
  std::vector<std::string> declined;
  /// "oneDNN", "fast (oneDNN declined: ...)", "reference (oneDNN: no kernel for Gather)".
  std::string explanation() const;
};

/// "oneDNN", "fast" or "reference".
const char *kernelProviderName(KernelProvider provider);
/// \p provider parsed from its name ("any", "reference", "fast", "dnnl"); throws naming the
/// choices otherwise.
KernelProvider kernelProviderFromName(const std::string &name);

/// All kernels, filled once by registerBuiltinKernels(), and by custom-op libraries later (possibly
/// while other threads look kernels up); entries never move once added.
class KernelRegistry {
public:
  static KernelRegistry &instance();
  void add(KernelEntry entry);
  /// The best entry for \p op allowed by \p provider: oneDNN, then fast, then reference. Null if none.
  const KernelEntry *find(const ir::Op &op, KernelProvider provider = KernelProvider::Any) const;
  /// As find, with the reasons of the providers that declined \p op.
  KernelChoice choose(const ir::Op &op, KernelProvider provider = KernelProvider::Any) const;
  /// Every entry; not to be read while another thread adds one.
  const std::deque<KernelEntry> &all() const { return entries_; }

private:
  /// The entries for \p op's domain and type that \p provider allows, taken under the lock; their
  /// checks then run without it (a check may look up another op's kernel).
  std::vector<const KernelEntry *> candidates(const ir::Op &op, KernelProvider provider) const;
  mutable std::shared_mutex mutex_;
  std::deque<KernelEntry> entries_;
};

/// Whether oneDNN itself computes in \p type on this CPU (FLOAT: always): the verdict of the oneDNN
/// kernels' own check (dnnl_util::implementationFor) on a plain 16×16 matmul in \p type, with its
/// reason when not: oneDNN 2.6 has bf16 kernels only from AVX-512 on, so on an AVX2-only CPU this
/// is "oneDNN 2.6 has no bf16 matmul on this CPU" and every bf16 op runs on the fast or reference
/// kernels instead.
Support dnnlComputesIn(DataType type);

/// Registers the reference, fast and oneDNN kernels; safe to call more than once.
void registerBuiltinKernels();

/// Creates the kernel for \p op with \p context; throws naming the op if no implementation
/// supports it, or if the chosen one fails to build after its capability check accepted the op.
std::unique_ptr<Kernel> createKernel(const ir::Op &op, KernelProvider provider = KernelProvider::Any,
                                     const KernelContext &context = KernelContext());
/// Creates \p entry's kernel for \p op, which its check accepted; a failure is an error naming the op.
std::unique_ptr<Kernel> createKernel(const KernelEntry &entry, const ir::Op &op, const KernelContext &context);

/// A kernel's create(): "new K(op, context)", or "new K(op)" for a kernel that needs no context.
template <typename K> std::unique_ptr<Kernel> makeKernel(const ir::Op &op, const KernelContext &context) {
  if constexpr (std::is_constructible_v<K, const ir::Op &, const KernelContext &>)
    return std::make_unique<K>(op, context);
  else
    return std::make_unique<K>(op);
}

} // namespace popart::backend_cpu
