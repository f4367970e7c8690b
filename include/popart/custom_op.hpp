#pragma once
/// \file Custom ops: define an op (its shape inference, CPU kernel and gradient) in a plugin
/// library, loaded with loadCustomOpLibrary or `popart-run --custom-op-lib`. A custom op goes
/// through the registries the built-in ops use, keyed by (domain, type, opset). See
/// docs/custom-ops.md.
///
/// Everything a plugin calls in the runtime is a virtual function of an object the runtime hands
/// it, so a plugin needs this header (and those it includes) only.

#include <popart/error.hpp>
#include <popart/tensorinfo.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

/// The custom-op ABI this header describes. Bumped whenever a type of this header changes its
/// layout or meaning: the runtime refuses a library built for another version.
#define POPART_CUSTOM_OP_ABI_VERSION 1

namespace popart {

/// One attribute value of a custom op node: int, float, string, or a list of ints, floats or strings.
using CustomAttributeValue =
    std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>, std::vector<std::string>>;
/// The attributes of a custom op node (or of an op a gradient adds), by name.
using CustomAttributes = std::map<std::string, CustomAttributeValue>;

/// The kinds of CustomAttributeValue, in its order.
enum class CustomAttributeKind { Int, Float, String, Ints, Floats, Strings };

/// An attribute a custom op accepts. Nodes may give only declared attributes, of the declared
/// kind; an absent attribute takes \p defaultValue, and is an error when it has none.
struct CustomAttributeSpec {
  std::string name;
  CustomAttributeKind kind = CustomAttributeKind::Float;
  std::optional<CustomAttributeValue> defaultValue;
};

/// A node of a custom op, as its shape inference, capability check and kernel factory see it.
struct CustomOpNode {
  /// "LeakyRelu 'act1'" (the node name, or "#id" when unnamed), for error messages.
  std::string name;
  std::string domain;
  std::string type;
  /// The opset version of the op's domain that the model imports.
  int opset = 1;
  /// The infos of the inputs; DataType::UNDEFINED where an optional input is omitted.
  std::vector<TensorInfo> inputs;
  /// The infos of the outputs: empty during shape inference, known when the kernel is created.
  std::vector<TensorInfo> outputs;
  /// Every declared attribute: the node's value, else the declared default.
  CustomAttributes attributes;
  /// The threads the session runs kernels on (kernel creation only; 1 during shape inference).
  int threads = 1;

  /// Attribute \p key as a \p T (int64_t, float, std::string, std::vector of those).
  template <typename T> const T &attribute(const std::string &key) const {
    auto it = attributes.find(key);
    if (it == attributes.end()) throw error(name, ": no attribute '", key, "'");
    const T *v = std::get_if<T>(&it->second);
    if (v == nullptr) throw error(name, ": attribute '", key, "' has another type");
    return *v;
  }
  /// Whether input \p i is present.
  bool hasInput(size_t i) const { return i < inputs.size() && inputs[i].dataType() != DataType::UNDEFINED; }
};

/// A typed view of one tensor of a kernel run: its elements in row-major order, and its shape.
template <typename T> struct CustomTensorView {
  T *data = nullptr;
  const Shape *shape = nullptr;
  int64_t size = 0;

  T &operator[](int64_t i) const { return data[i]; }
  T *begin() const { return data; }
  T *end() const { return data + size; }
  /// Size of dimension \p d.
  int64_t dim(size_t d) const { return (*shape)[d]; }
};

/// The threads of the session that runs a kernel. The runtime implements it.
class CustomThreadPool {
public:
  virtual ~CustomThreadPool() = default;
  /// The number of threads.
  virtual int threadCount() const = 0;
  /// Calls \p body(\p context, begin, end) on the session's threads for disjoint ranges that
  /// cover [0, \p n), one contiguous range per thread; returns when all have returned.
  virtual void parallelFor(int64_t n, void (*body)(void *context, int64_t begin, int64_t end), void *context) const = 0;
};

/// The buffers of one run of a custom kernel: typed views of the plan's input and output
/// buffers (no copies), the kernel's scratch memory, and the session's threads.
class CustomKernelRun {
public:
  /// Made by the runtime for each run (nothing in it allocates).
  CustomKernelRun(const char *node, const void *const *inputs, const TensorInfo *inputInfos, size_t inputCount,
                  void *const *outputs, const TensorInfo *outputInfos, size_t outputCount, void *scratch,
                  const CustomThreadPool &threads)
      : node_(node), inputs_(inputs), inputInfos_(inputInfos), inputCount_(inputCount), outputs_(outputs),
        outputInfos_(outputInfos), outputCount_(outputCount), scratch_(scratch), threads_(threads) {}

  /// Whether input \p i is present (optional inputs may be omitted).
  bool hasInput(size_t i) const { return i < inputCount_ && inputs_[i] != nullptr; }
  /// Input \p i, whose element type must be \p T.
  template <typename T> CustomTensorView<const T> input(size_t i) const {
    if (!hasInput(i)) throw error(node_, ": input ", i, " is missing");
    check<T>(inputInfos_[i], "input", i);
    return {static_cast<const T *>(inputs_[i]), &inputInfos_[i].shape(), inputInfos_[i].elementCount()};
  }
  /// Output \p i, whose element type must be \p T.
  template <typename T> CustomTensorView<T> output(size_t i) const {
    if (i >= outputCount_ || outputs_[i] == nullptr) throw error(node_, ": output ", i, " is missing");
    check<T>(outputInfos_[i], "output", i);
    return {static_cast<T *>(outputs_[i]), &outputInfos_[i].shape(), outputInfos_[i].elementCount()};
  }
  /// The kernel's working memory (CustomKernel::scratchBytes, 64-byte aligned); null if it asked for none.
  void *scratch() const { return scratch_; }
  /// The number of threads of the session.
  int threadCount() const { return threads_.threadCount(); }
  /// Runs \p body(begin, end) on the session's threads over disjoint ranges covering [0, \p n).
  template <typename F> void parallelFor(int64_t n, F &&body) const {
    threads_.parallelFor(
        n, [](void *c, int64_t begin, int64_t end) { (*static_cast<std::remove_reference_t<F> *>(c))(begin, end); },
        const_cast<void *>(static_cast<const void *>(&body))); // NOLINT(cppcoreguidelines-pro-type-const-cast)
  }

private:
  template <typename T> void check(const TensorInfo &info, const char *what, size_t i) const {
    if (info.dataType() != hostDataType<std::remove_const_t<T>>())
      throw error(node_, ": ", what, " ", i, " is ", info.toString(), ", not ",
                  toString(hostDataType<std::remove_const_t<T>>()));
  }
  const char *node_;
  const void *const *inputs_;
  const TensorInfo *inputInfos_;
  size_t inputCount_;
  void *const *outputs_;
  const TensorInfo *outputInfos_;
  size_t outputCount_;
  void *scratch_;
  const CustomThreadPool &threads_;
};

/// A custom op compiled for fixed shapes: made once when the session compiles, then run for
/// every step. Allocate in the constructor (or ask for scratch), never in run().
class CustomKernel {
public:
  virtual ~CustomKernel() = default;
  /// Computes the outputs from the inputs.
  virtual void run(const CustomKernelRun &run) = 0;
  /// Bytes of working memory run() wants in CustomKernelRun::scratch (placed in the plan's arena).
  virtual int64_t scratchBytes() const { return 0; }
};

/// Shape and type inference: the infos of the outputs of \p node (whose inputs are known).
using CustomShapeInference = std::function<std::vector<TensorInfo>(const CustomOpNode &node)>;
/// Creates the kernel of \p node (inputs and outputs known); may throw popart::error.
using CustomKernelFactory = std::function<std::unique_ptr<CustomKernel>(const CustomOpNode &node)>;
/// Whether a kernel handles \p node: empty if it does, else why not ("only FLOAT").
using CustomSupportCheck = std::function<std::string(const CustomOpNode &node)>;

/// What a gradient sees of the backward graph: the forward node's tensors and the gradients
/// arriving at its outputs, and a way to add ops. The runtime implements it. Tensors are named
/// by their ids.
class CustomGradBuilder {
public:
  virtual ~CustomGradBuilder() = default;
  /// The forward node (attributes with defaults filled in).
  virtual const CustomOpNode &node() const = 0;
  /// Forward input \p i.
  virtual TensorId input(size_t i) const = 0;
  /// Forward output \p i.
  virtual TensorId output(size_t i) const = 0;
  /// The gradient arriving at output \p i; "" if none does.
  virtual TensorId outputGrad(size_t i) const = 0;
  /// Adds an op of \p type in \p domain ("ai.onnx": at the model's opset; another domain: at
  /// the model's opset of it, else \p opset) with \p outputs outputs; \returns their ids.
  virtual std::vector<TensorId> addOp(const std::string &type, const std::vector<TensorId> &inputs,
                                      const CustomAttributes &attributes, const std::string &domain, int opset,
                                      size_t outputs) = 0;
  /// A scalar constant \p value of the type of forward input 0.
  virtual TensorId scalar(double value) = 0;
  /// Sets the gradient of forward input \p i (summed over broadcast dimensions to its shape).
  virtual void setInputGrad(size_t i, const TensorId &grad) = 0;

  /// Adds a one-output ai.onnx op (Mul, Add, Exp...).
  TensorId add(const std::string &type, const std::vector<TensorId> &inputs, const CustomAttributes &attributes = {}) {
    return addOp(type, inputs, attributes, "ai.onnx", 0, 1)[0];
  }
};

/// A gradient: builds the input gradients of one node from its output gradients.
using CustomGradient = std::function<void(CustomGradBuilder &builder)>;

/// The definition of a custom op.
struct CustomOpDef {
  /// The op's domain: not one of the runtime's ("", "ai.onnx", "ai.onnx.ml",
  /// "ai.onnx.preview.training", "ai.graphcore"); models import it with their opset_import.
  std::string domain;
  std::string type;
  /// The opsets of the domain this definition covers.
  int minOpset = 1;
  int maxOpset = 1000;
  /// Inputs a node may have (trailing ones optional beyond minInputs) and outputs it has.
  int minInputs = 1;
  int maxInputs = 1;
  int outputs = 1;
  std::vector<CustomAttributeSpec> attributes;
  /// Required: the outputs' infos.
  CustomShapeInference inferShapes;
  /// Required: the CPU kernel.
  CustomKernelFactory kernel;
  /// Optional: which nodes the kernel handles; a declined node fails to compile with the reason.
  CustomSupportCheck supports;
  /// Optional: the gradient. Without one, training through the op stops with "no gradient rule".
  /// It may compose existing ops or add a grad op (a custom op of its own with its own kernel).
  CustomGradient gradient;
  /// Replace an earlier custom definition of the same domain, type and opsets (not a built-in op).
  bool override = false;
};

/// A kernel that replaces a registered op's kernels (built-in or custom) for \p domain and
/// \p type: chosen first wherever \p supports accepts the node (the session's kernel choice
/// "any"); elsewhere the op's own kernels run.
struct CustomKernelOverride {
  /// The op's domain, named explicitly ("ai.onnx" for the default domain).
  std::string domain;
  std::string type;
  CustomKernelFactory kernel;
  CustomSupportCheck supports;
  /// Replace an earlier override of the same op.
  bool override = false;
};

/// What a library's registration entry point adds definitions through. The runtime implements
/// it; it checks everything when the entry point returns and registers all or nothing.
class CustomOpRegistrar {
public:
  virtual ~CustomOpRegistrar() = default;
  /// Adds \p def.
  virtual void addOp(CustomOpDef def) = 0;
  /// Adds \p kernel as an override.
  virtual void overrideKernel(CustomKernelOverride kernel) = 0;
};

/// Loads the custom-op library at \p path (dlopen with RTLD_NOW | RTLD_LOCAL) and registers its
/// ops. Thread-safe; loading a library already loaded does nothing. Throws popart::error naming
/// the library and the fault: unreadable, no ABI version or entry point, another ABI version, a
/// malformed definition, or an op that is already registered (without override).
void loadCustomOpLibrary(const std::string &path);

/// Registers the ops that \p registration adds, as a library would, for a program that defines
/// custom ops itself; \p origin names it in errors.
void registerCustomOps(const std::string &origin, const std::function<void(CustomOpRegistrar &)> &registration);

} // namespace popart

/// The registration entry point's symbol, and the ABI version's.
#define POPART_CUSTOM_OP_ENTRY_SYMBOL "popart_register_custom_ops"
#define POPART_CUSTOM_OP_ABI_SYMBOL "popart_custom_op_abi_version"

/// Defines a library's two exported symbols: its ABI version, and the registration entry point
/// whose body follows, with \p registrar a popart::CustomOpRegistrar&:
///   POPART_CUSTOM_OP_LIBRARY(r) { r.addOp(myDef()); }
#define POPART_CUSTOM_OP_LIBRARY(registrar)                                                                            \
  extern "C" __attribute__((visibility("default"))) int popart_custom_op_abi_version() {                               \
    return POPART_CUSTOM_OP_ABI_VERSION;                                                                               \
  }                                                                                                                    \
  extern "C" __attribute__((visibility("default"))) void popart_register_custom_ops(                                   \
      popart::CustomOpRegistrar &registrar) // NOLINT(bugprone-macro-parentheses): the parameter's name
