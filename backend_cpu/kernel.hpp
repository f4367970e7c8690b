#pragma once
// A kernel runs one op on host buffers; kernels are chosen through a registry keyed by op
// type, with a capability check, oneDNN first and the reference kernel as fallback.

#include "ir/op.hpp"

#include <memory>
#include <string>
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
};

/// Which kernel implementations may be chosen.
enum class KernelProvider { Any, Reference, Dnnl };

/// One way to run an op type.
struct KernelEntry {
  std::string domain; ///< canonical domain, "ai.onnx" by default
  std::string type;
  KernelProvider provider = KernelProvider::Reference;
  /// True if this implementation handles \p op (dtype, attributes, shapes); null means always.
  bool (*supports)(const ir::Op &op) = nullptr;
  std::unique_ptr<Kernel> (*create)(const ir::Op &op) = nullptr;
};

/// All kernels, filled once by registerBuiltinKernels().
class KernelRegistry {
public:
  static KernelRegistry &instance();
  void add(KernelEntry entry);
  /// The best entry for \p op allowed by \p provider: oneDNN before reference. Null if none.
  const KernelEntry *find(const ir::Op &op, KernelProvider provider = KernelProvider::Any) const;
  const std::vector<KernelEntry> &all() const { return entries_; }

private:
  std::vector<KernelEntry> entries_;
};

/// Registers the reference and oneDNN kernels; safe to call more than once.
void registerBuiltinKernels();

/// Creates the kernel for \p op; throws naming the op if no implementation supports it.
std::unique_ptr<Kernel> createKernel(const ir::Op &op, KernelProvider provider = KernelProvider::Any);

/// Helper for kernels whose create() is "new K(op)".
template <typename K> std::unique_ptr<Kernel> makeKernel(const ir::Op &op) { return std::make_unique<K>(op); }

} // namespace popart::backend_cpu
