#pragma once
// The pass manager: every graph transformation is a named Pass registered once with its purpose
// and what it needs before it; a pipeline is a list of pass names that runPipeline checks and runs,
// verifying the IR after each pass when asked, timing each one and dumping the IR after those named.

#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <typeindex>
#include <vector>

namespace popart::ir {

/// Facts about a graph that passes establish and later passes rely on (bit flags).
enum Stage : unsigned {
  ShapesInferred = 1u << 0,      ///< every op's outputs have infos (inferShapes ran since the last change)
  ControlFlowUnrolled = 1u << 1, ///< training: the If/Loop/Scan ops the loss needs are unrolled where possible
  TrainingPrepared = 1u << 2,    ///< training: seeds, BatchNorm statistics, weights and the scaled loss are set
  GradientsBuilt = 1u << 3,      ///< training: the backward graph exists (after autodiff)
  OptimizerApplied = 1u << 4,    ///< training: the update ops exist
  OutputsFixed = 1u << 5,        ///< dead code removed: the graph's outputs are what the session reads
};

/// "shapes inferred, after autodiff" for the bits of \p stages.
std::string stageNames(unsigned stages);

/// What the session knows when a pipeline runs, shared by its passes. Modules other than ir keep
/// their own state in it (state<T>()), so that a pass of one library can hand tensors to the next.
class PassContext {
public:
  /// Constant folding during shape inference (null: off).
  const ConstEvaluator *folder = nullptr;
  /// Tensors rewrites must keep and dead-code removal starts from (outputs, anchors, the loss).
  std::vector<TensorId> keep;
  /// True for the training pipeline (LayerNorm keeps its statistics, training Convs stay plain).
  bool training = false;
  /// Training: the loss, the root of unrolling and of the backward graph.
  TensorId loss;
  /// Bytes of the saved state a recurrent op's kernels pass to its grad op (the backend's
  /// answer); null when no kernel pair uses it.
  std::function<int64_t(const Op &)> recurrentSavedBytes;
  /// The state of type \p T that passes share, made on first use.
  template <typename T> T &state() {
    std::shared_ptr<void> &p = states_[std::type_index(typeid(T))];
    if (!p) p = std::make_shared<T>();
    return *static_cast<T *>(p.get());
  }

private:
  std::map<std::type_index, std::shared_ptr<void>> states_;
};

/// The training pipeline's tensors: its passes fill them in order, the session reads them.
struct TrainingTensors {
  /// The weights to differentiate (found before autodiff); after buildGradients, those trained.
  std::vector<TensorId> weights;
  /// Float initializers not trained and why ("'id' (reason)"), for messages.
  std::vector<std::string> untrained;
  size_t floatInitializers = 0;
  /// Weights that no gradient reached (buildGradients).
  std::vector<TensorId> unreached;
  /// {weight, gradient of the scaled loss} for each trained weight.
  std::vector<std::pair<TensorId, TensorId>> weightGrads;
  std::vector<TensorId> runningStats; ///< BatchNormalization running statistics updated in place
  TensorId rngState;                  ///< INT64 [2] Variable {seed, counter} of the random ops
  TensorId lossScale;                 ///< FLOAT scalar Variable multiplying the loss
  TensorId scaledLoss;                ///< what the gradients are of
};

/// One named graph transformation.
struct Pass {
  std::string name;
  /// One line: what it does.
  std::string purpose;
  /// Stages that must hold before it runs.
  unsigned needs = 0;
  /// Stages that must not hold yet (e.g. GradientsBuilt for a fusion whose gradient rule must apply).
  unsigned before = 0;
  /// Stages that hold after it.
  unsigned establishes = 0;
  /// Stages that no longer hold after it (it adds ops without infos...).
  unsigned invalidates = 0;
  /// A rewrite for speed only: the graph means the same without it, so it may be disabled
  /// (SessionOptions::disabledPasses, --disable-pass; fuseOps = false disables them all).
  bool optional = false;
  /// Transforms the graph; returns how many rewrites it made (for the log and the profile).
  std::function<int(Graph &, PassContext &)> run;
};

/// An optional pass (a rewrite for speed) that needs shapes inferred and \p needs.
Pass optionalPass(std::string name, std::string purpose, unsigned needs,
                  std::function<int(Graph &, PassContext &)> run);

/// Every pass, registered once at start-up.
class PassRegistry {
public:
  static PassRegistry &instance();
  /// Adds \p pass; throws if its name is taken.
  void add(Pass pass);
  /// The pass named \p name; throws listing the known names if there is none.
  const Pass &get(const std::string &name) const;
  const Pass *find(const std::string &name) const;
  /// Names in registration order.
  std::vector<std::string> names() const;

private:
  std::vector<Pass> passes_;
};

/// Registers the passes of the ir library (inferShapes, removeDeadCode, the fusions...); safe to
/// call more than once.
void registerIrPasses();

/// How runPipeline runs a pipeline.
struct PipelineOptions {
  /// Stages that hold before the first pass: a pipeline's tail run on a graph that its head's
  /// work already prepared (stagesAfter gives them).
  unsigned entryStages = 0;
  /// Optional passes to skip (names; an unknown or non-optional name is an error).
  std::set<std::string> disabled;
  /// Skip every optional pass (SessionOptions::fuseOps = false, --no-fusion).
  bool skipOptional = false;
  /// Passes after which \p dump is called (names; an unknown name is an error).
  std::set<std::string> dumpAfter;
  /// Receives the IR after each pass of dumpAfter.
  std::function<void(const std::string &pass, const Graph &graph)> dump;
  /// Run verifyGraph after every pass (on by default in debug builds).
  bool verify =
#ifdef NDEBUG
      false;
#else
      true;
#endif
};

/// What one pass of a pipeline did.
struct PassRecord {
  std::string name;
  double milliseconds = 0; ///< wall time (0 when skipped)
  int rewrites = 0;
  bool skipped = false; ///< disabled
};

/// Throws unless every name of \p pipeline is a registered pass whose needs hold and whose
/// "before" stages do not yet hold at its place, and \p options names only passes of it
/// (disabled ones optional). \p pipelineName is for messages.
void checkPipeline(const std::string &pipelineName, const std::vector<std::string> &pipeline,
                   const PipelineOptions &options);

/// The stages that hold after the passes of \p pipeline run in order from none.
unsigned stagesAfter(const std::vector<std::string> &pipeline);

/// Checks and runs \p pipeline on \p graph. \returns one record per pass, in order.
std::vector<PassRecord> runPipeline(const std::string &pipelineName, const std::vector<std::string> &pipeline,
                                    Graph &graph, PassContext &context, const PipelineOptions &options);

} // namespace popart::ir
