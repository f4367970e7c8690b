#pragma once
// An op of the IR: a generic node whose meaning comes from its registered OpDef.

#include "ir/attributes.hpp"
#include "ir/fusion.hpp"
#include "ir/tensor.hpp"

#include <cstdint>
#include <deque>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

namespace popart::ir {

struct OpDef;
class Graph;

class Op;

/// One node of a Graph.
class Op {
public:
  int64_t id = 0;
  std::string type;   ///< ONNX op type, e.g. "Conv"
  std::string domain; ///< "ai.onnx" for the default domain
  int version = 0;    ///< opset version of the domain in the model
  std::string name;   ///< node name from the model (may be empty)
  Attributes attrs;
  /// What the fusion passes folded into this op (typed; see Fusion).
  Fusion fusion;
  std::vector<Tensor *> inputs;  ///< null where an optional input is omitted
  std::vector<Tensor *> outputs; ///< null where an optional output is omitted
  const OpDef *def = nullptr;
  /// When the op runs within a training step: phase 0 runs once per micro-batch; phases 1, 2, ...
  /// run once per step after every micro-batch, in order (gradient clipping, optimiser updates,
  /// resetting accumulators). The schedule places all ops of a phase before those of the next.
  int phase = 0;
  Graph *graph = nullptr;

  /// "Conv 'conv1'" (or "Conv #3" for an unnamed node), for error messages.
  std::string debugName() const;
  size_t inputCount() const { return inputs.size(); }
  size_t outputCount() const { return outputs.size(); }
  bool hasInput(size_t i) const { return i < inputs.size() && inputs[i] != nullptr; }
  bool hasOutput(size_t i) const { return i < outputs.size() && outputs[i] != nullptr; }
  /// Input \p i; throws naming the op if it is absent.
  Tensor &input(size_t i) const;
  Tensor &output(size_t i) const;
  const TensorInfo &inInfo(size_t i) const { return input(i).info(); }
  const TensorInfo &outInfo(size_t i) const { return output(i).info(); }
  /// Sets the info of output \p i if that output is present.
  void setOutInfo(size_t i, const TensorInfo &info);
  /// The value of input \p i, which must be a constant (shape inputs); throws naming the op otherwise.
  const TensorData &constInput(size_t i, const char *role) const;
  /// Like constInput, but null when input \p i is absent.
  const TensorData *optionalConstInput(size_t i, const char *role) const;
};

/// Semantics of one op type over a range of opset versions.
struct OpDef {
  std::string domain; ///< "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "ai.graphcore"
  std::string type;
  int minVersion = 1;
  int maxVersion = 1000;
  /// Sets the infos of the outputs from the inputs (shape inference).
  void (*setup)(Op &op) = nullptr;
  /// Inputs whose values (not only shapes) decide the output shapes: they must be constant
  /// when setup runs, which the session arranges by specialising on fed values.
  std::vector<int> valueInputs;
  /// Value inputs that depend on the op's attributes (Loop's trip count, when it has scan
  /// outputs to size); null for none beyond valueInputs.
  std::vector<int> (*valueInputsOf)(const Op &op) = nullptr;
  /// False for ops that must not be evaluated at compile time (random ops).
  bool foldable = true;
  /// Rewrites an old-opset form into the current one (attributes that became inputs...).
  void (*canonicalize)(Op &op, Graph &graph) = nullptr;
  /// True when every input value decides the output shape (NonZero, Unique, Range...).
  bool allInputsAreValueInputs = false;
  /// Inputs of which the op reads only the type and shape, never the values (Shape, Size,
  /// EyeLike, CastLike's target): a shape computed from them does not make them constants.
  std::vector<int> shapeOnlyInputs;
  /// True for ops that a graph transform replaces before lowering (Gradient): no kernel.
  bool expandedBeforeLowering = false;
  /// Outputs that are inputs updated in place: {output, input}. The output shares the input's
  /// buffer (a Variable), the op runs after every other reader of that input, and dead-code
  /// removal keeps the op (its effect is the update).
  struct InPlace {
    int output;
    int input;
  };
  std::vector<InPlace> modifies;
  /// Floating-point operations of one run of \p op, for the profiler; null: one per output
  /// element.
  double (*flops)(const Op &op) = nullptr;
  /// Random ops: the input through which training connects the {seed, counter} Variable
  /// (autodiff's seedDropout); -1 for ops that draw no random numbers.
  int randomInput = -1;
  /// Ops that keep state across training steps (BatchNormalization's running statistics): the
  /// {input, output} pairs whose output value training writes back into the input Variable
  /// (autodiff's updateBatchNormStatistics); empty for \p op's form when it trains nothing.
  std::vector<InPlace> (*trainingState)(const Op &op) = nullptr;
  /// Internal attributes (named popart_*) that the runtime sets on ops of this definition and
  /// the op reads: the importer refuses them on a model's nodes and the verifier on any op
  /// whose definition does not list them (a misspelt one fails there).
  std::vector<std::string> internalAttributes;
  /// The Fusion fields ops of this definition may carry (bits of FusionField); the verifier
  /// rejects any other.
  uint32_t fusionFields = 0;
  /// The scheduler runs a ready op of this definition only when no other op of its phase is
  /// ready: an AllReduceWait waits as late as its readers allow, so that the communication it
  /// waits for overlaps whatever else can run first.
  bool scheduleLate = false;
  /// True if this definition declares \p field.
  bool declares(FusionField field) const { return (fusionFields & static_cast<uint32_t>(field)) != 0; }
};

/// Floating-point operations of one run of \p op (for the profiler): its OpDef's flops hook,
/// else outputElementCount.
double estimateFlops(const Op &op);
/// Elements of \p op's present outputs: the estimate for ops of about one operation per element.
double outputElementCount(const Op &op);

/// All op definitions, filled once at start-up by registerBuiltinOps(), and by custom-op
/// libraries (session/custom_op.cpp) later. add() and the lookups may run on different threads;
/// definitions never move once added (ops point at them).
class OpRegistry {
public:
  static OpRegistry &instance();
  void add(OpDef def);
  /// The definition of \p type in \p domain valid at \p version; null if none.
  const OpDef *find(const std::string &domain, const std::string &type, int version) const;
  /// True if some version of \p type in \p domain is registered.
  bool knowsType(const std::string &domain, const std::string &type) const;
  /// Every definition; not to be read while another thread adds one.
  const std::deque<OpDef> &all() const { return defs_; }

private:
  mutable std::shared_mutex mutex_;
  std::deque<OpDef> defs_;
};

/// Registers every op family; safe to call more than once.
void registerBuiltinOps();

/// "" and "ai.onnx" are the same domain; returns the canonical spelling.
std::string canonicalDomain(const std::string &domain);

} // namespace popart::ir
