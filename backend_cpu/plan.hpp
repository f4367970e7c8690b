#pragma once
// A scheduled graph compiled once into kernels and one buffer plan, then run many times.

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace popart::backend_cpu {

/// One block of the arena live at the plan's peak: a tensor, or a step's scratch.
struct LiveBlock {
  TensorId id;                ///< the tensor (the root of views and in-place outputs); empty for scratch
  int64_t bytes = 0;          ///< as planned: aligned to 64 bytes, padded layouts included
  int64_t scratchStep = -1;   ///< the step whose Kernel::scratchBytes this is; -1 for a tensor
  size_t first = 0, last = 0; ///< the steps of its lifetime (last is the step count for pinned tensors)
  bool pinned = false;        ///< a graph input or output, live for the whole run
};

/// Offsets of the tensors that share the arena, from liveness over the schedule.
struct MemoryPlan {
  std::map<TensorId, int64_t> offsets;
  /// Offset of each step's scratch (Kernel::scratchBytes), -1 where a step has none.
  std::vector<int64_t> scratchOffsets;
  int64_t arenaBytes = 0;
  /// Sum of the sizes of all planned tensors, as if none shared memory.
  int64_t unsharedBytes = 0;
  /// The first step at which the most bytes are live at once (tensors and that step's scratch).
  size_t peakStep = 0;
  /// The bytes live at peakStep: the arena's lower bound (arenaBytes less the gaps placement left).
  int64_t peakLiveBytes = 0;
  /// Everything live at peakStep, largest first (ties by tensor name), summing to peakLiveBytes.
  std::vector<LiveBlock> peakLive;
};

/// Plans \p schedule: tensors whose lifetimes do not overlap share bytes. Tensors in
/// \p pinned (graph inputs and outputs) stay live for the whole run; tensors in \p aliases
/// (outputs of in-place updates) get no bytes of their own. Tensors in \p views (outputs of
/// Reshape-like ops, mapped to the planned tensor whose bytes they reinterpret) get no bytes
/// either, and each use of a view keeps its root alive. \p scratch (bytes per step, if given)
/// is working memory live during its step only. \p sizes gives the bytes of tensors kept in a
/// layout larger than their plain one (blocked channels padded to the block). The plan also
/// records what is live at the step with the most live bytes (MemoryPlan::peakLive), for the
/// memory report.
MemoryPlan planMemory(const std::vector<ir::Op *> &schedule, const std::vector<TensorId> &pinned,
                      const ir::Graph &graph, const std::map<TensorId, TensorId> &aliases = {},
                      const std::map<TensorId, TensorId> &views = {}, const std::vector<int64_t> &scratch = {},
                      const std::map<TensorId, int64_t> &sizes = {});

/// Outputs of ops that only reinterpret their input's bytes (Reshape, Flatten, Squeeze,
/// Unsqueeze, Identity) mapped to the root tensor they share storage with. Only activations
/// qualify: roots and views are Stream or ActGrad tensors, views are not in \p pinned, and
/// neither is an output of an in-place update (\p aliases).
std::map<TensorId, TensorId> findViews(const std::vector<ir::Op *> &schedule, const std::vector<TensorId> &pinned,
                                       const std::map<TensorId, TensorId> &aliases);

/// What the profiler knows of one step, fixed at compile time.
struct StepInfo {
  std::string name; ///< "Conv 'conv1'"
  std::string type; ///< "Conv", "ai.graphcore.ConvDataGrad"
  int phase = 0;
  double flops = 0;  ///< floating-point operations of one run (estimate, see ir::estimateFlops)
  int64_t bytes = 0; ///< bytes read and written (inputs + outputs)
};

/// Floating-point operations of \p op, from its definition's flops hook (ir::estimateFlops: 2·M·N·K
/// for MatMul/Gemm, 2·MACs for convolutions, the gate products of LSTM, GRU and RNN, and their
/// gradients; one per output element for everything else).
double estimateFlops(const ir::Op &op);

/// One recorded run of one step (ns since profiling started).
struct ProfileEvent {
  uint32_t step;
  int64_t startNs;
  int64_t durationNs;
};

/// The first NaN or inf that the numeric checks found (ExecutionPlan::enableNumericChecks).
struct NumericFault {
  size_t step = 0;             ///< the plan step whose output held it
  std::string op;              ///< the op that wrote it: "Log 'log1'"
  std::string type;            ///< its type: "Log", "ai.graphcore.ConvDataGrad"
  TensorId tensor;             ///< the output
  int64_t index = 0;           ///< flat index of the first bad element
  bool internalLayout = false; ///< the index is in a kernel's internal layout (agreedLayouts()), not row-major
  double value = 0;            ///< NaN, inf or -inf
  /// "output 'y' of Log 'log1' (Log) holds nan at element 3".
  std::string describe() const;
};

/// What a plan will hold, known once its kernels exist and its memory is planned, before its
/// arena is allocated (the parts of profileSummary's "planned peak").
struct PlannedMemory {
  int64_t arenaBytes = 0;    ///< the activation arena (MemoryPlan::arenaBytes)
  int64_t kernelBytes = 0;   ///< heap the kernels took as they were created (see kernelBytes())
  int64_t constBytes = 0;    ///< Const tensors, read where they are
  int64_t variableBytes = 0; ///< Variable tensors (weights, optimiser state...), read where they are
  /// Set in the check before the kernels are made: arenaBytes is then this tensor's size alone (the
  /// arena's lower bound) and kernelBytes 0.
  TensorId largestTensor;
};

struct CompileOptions {
  KernelProvider provider = KernelProvider::Any;
  /// Runs adjacent optimiser updates (kernels with Kernel::rangeElements) as one step.
  bool mergeUpdates = true;
  /// Called before the arena is allocated; throws to refuse the plan (SessionOptions::memoryLimitBytes).
  /// Also called once before the kernels are made, with the largest planned tensor as the arena.
  std::function<void(const PlannedMemory &)> checkMemory = nullptr;
};

/// The compiled form of a graph: kernels in schedule order with their buffer addresses.
class ExecutionPlan {
public:
  /// Compiles \p graph, whose infos must all be known, creating its kernels with \p context (the
  /// session's). Const and Variable tensors are not copied: the plan keeps references to their data.
  ExecutionPlan(const ir::Graph &graph, const CompileOptions &options, const KernelContext &context = KernelContext());

  /// Address of tensor \p id's bytes (arena, constant or variable storage); for a sequence or
  /// optional, its SequenceData, which the plan owns.
  void *address(const TensorId &id) const;
  const TensorInfo &info(const TensorId &id) const;
  /// The bytes that hold tensor \p id's value in the arena: those of the tensor it shares storage
  /// with (a view's or an in-place output's root), padded layouts included. {null, 0} for
  /// tensors outside the arena. What a pipeline stage saves of a micro-batch's activations.
  std::pair<void *, int64_t> arenaStorage(const TensorId &id) const;
  /// The value of a Const or Variable tensor (STRING outputs are only ever constants); null otherwise.
  const TensorData *constData(const TensorId &id) const;
  /// Runs every kernel once; allocates nothing.
  void run();
  /// Runs kernel \p index alone (for profiling and tests).
  void runStep(size_t index);
  /// Runs the kernels of steps [begin, end).
  void run(size_t begin, size_t end);
  /// The steps [begin, end) of the ops of phase \p phase (see ir::Op::phase); empty if none.
  std::pair<size_t, size_t> phaseSteps(int phase) const;
  const MemoryPlan &memoryPlan() const { return memoryPlan_; }
  size_t stepCount() const { return steps_.size(); }
  /// The op of each step ("Conv 'conv1'"), for errors, tests and the profiler.
  const std::vector<std::string> &stepNames() const { return stepNames_; }
  /// The provider of each step's kernel.
  const std::vector<KernelProvider> &stepProviders() const { return stepProviders_; }
  const std::vector<StepInfo> &stepInfos() const { return stepInfos_; }
  /// Which kernel runs each step and why ("oneDNN, operands FlippedB, timed (reference ...)"),
  /// for popart-run --explain-kernels.
  const std::vector<std::string> &stepKernels() const { return stepKernels_; }
  /// The ways the MatMul and Gemm kernels' timing chose, per configuration (the session's record
  /// after this compile, MatMulTuningCache): what checkpoints save so that a resumed run computes
  /// the same bits.
  const std::map<std::string, MatMulOperands> &tunedMatMulWays() const { return tunedMatMulWays_; }

  /// Starts timing every step: totals per step, and spans (up to \p maxEvents, reserved now so
  /// that profiled runs allocate nothing either).
  void enableProfiling(size_t maxEvents = size_t{1} << 20);
  bool profiling() const { return profiling_; }
  /// Total ns and run count per step since enableProfiling.
  const std::vector<std::pair<int64_t, int64_t>> &stepTimes() const { return stepTimes_; }
  const std::vector<ProfileEvent> &profileEvents() const { return events_; }
  /// Checks, after each step, its FLOAT, FLOAT16, BFLOAT16 and DOUBLE outputs (except those in
  /// \p unchecked, and those of AllReduceStart, still in flight) for NaN and inf: the first
  /// found stops the run with an error naming the op, the tensor and the element, and is kept in
  /// numericFault(). The table of what to check is made now: checked runs allocate nothing.
  void enableNumericChecks(const std::set<TensorId> &unchecked = {});
  bool numericChecks() const { return numericChecks_; }
  /// What stopped the last run, if a numeric check did (reset by each run that checks).
  const std::optional<NumericFault> &numericFault() const { return numericFault_; }

  /// The collectives of the plan's kernels: requests in flight between kernels and, while
  /// profiling, their spans (the profile's communication track). Null if the context had none.
  const CollectiveRequests *collectives() const { return collectives_.get(); }
  /// Bytes of the plan's Const and Variable tensors (not in the arena).
  int64_t constBytes() const { return constBytes_; }
  /// Tensors kept in a layout their producer and reader agreed on (not plain row-major): their
  /// bytes in address() are not the plain tensor.
  const std::vector<TensorId> &agreedLayouts() const { return agreedLayouts_; }
  int64_t variableBytes() const { return variableBytes_; }
  /// Heap the kernels and the plan's tables took while compiling, net of the arena: oneDNN
  /// primitives and their JIT code, scratchpads, workspaces, packed weights (glibc's count of
  /// bytes in use, before and after; 0 where malloc is replaced, as under AddressSanitizer).
  int64_t kernelBytes() const { return kernelBytes_; }
  /// Outputs written over an input that was dead after their step (Kernel::inPlaceInput).
  const std::vector<TensorId> &inPlace() const { return inPlace_; }

private:
  /// Checks the outputs of step \p index (enableNumericChecks); throws on the first NaN or inf.
  void checkOutputs(size_t index);
  /// Advances the collectives in flight after step \p after (errors say where the run was).
  void pollCollectives(size_t after);
  /// Replaces each run of two or more adjacent steps of one phase whose kernels split into ranges
  /// by one step that runs them all (the first; the others become no-ops named after it).
  void mergeRangeSteps();
  /// Outputs that may share an input's bytes, mapped to the root they then share (see inPlace()).
  std::map<TensorId, TensorId> findInPlace(const std::vector<ir::Op *> &schedule, const std::vector<TensorId> &pinned,
                                           const std::map<TensorId, TensorId> &aliases,
                                           const std::map<TensorId, TensorId> &views) const;
  /// Lets a kernel and every reader of its output keep that tensor in a shared internal layout
  /// (Kernel::outputLayout, acceptsInputIn, readInputIn, writeOutputIn) where no other step or
  /// the caller sees it. \returns the bytes of agreed tensors whose layout is larger than their
  /// plain size (channels padded to a block), for the memory plan.
  std::map<TensorId, int64_t> agreeLayouts(const std::vector<ir::Op *> &schedule, const std::vector<TensorId> &pinned,
                                           const std::map<TensorId, TensorId> &aliases,
                                           const std::map<TensorId, TensorId> &views);

  struct Step {
    std::unique_ptr<Kernel> kernel;
    std::vector<const void *> inputs;
    std::vector<void *> outputs;
    KernelArgs args;
  };
  std::unique_ptr<uint8_t, void (*)(uint8_t *)> arena_;
  std::shared_ptr<CollectiveRequests> collectives_;
  std::vector<Step> steps_;
  std::vector<std::string> stepNames_;
  std::vector<KernelProvider> stepProviders_;
  std::vector<int> stepPhases_;
  std::vector<StepInfo> stepInfos_;
  std::vector<std::string> stepKernels_;
  std::map<std::string, MatMulOperands> tunedMatMulWays_;
  bool profiling_ = false;
  int64_t profileStart_ = 0;
  std::vector<std::pair<int64_t, int64_t>> stepTimes_;
  std::vector<ProfileEvent> events_;
  /// One floating-point output that the numeric checks scan.
  struct CheckedOutput {
    const TensorId *id;
    DataType type;
    const void *data;
    int64_t elements;
    bool internalLayout;
  };
  bool numericChecks_ = false;
  std::vector<CheckedOutput> checkedOutputs_; ///< by step
  std::vector<size_t> checkedBegin_;          ///< each step's first entry in checkedOutputs_, then the end
  std::optional<NumericFault> numericFault_;
  std::vector<std::vector<TensorId>> stepOutputs_; ///< each step's outputs (present ones)
  std::vector<std::string> stepOps_;               ///< each step's op, as debugName (merging renames stepNames_)
  int64_t constBytes_ = 0, variableBytes_ = 0, kernelBytes_ = 0;
  std::vector<TensorId> agreedLayouts_, inPlace_;
  std::map<TensorId, void *> addresses_;
  std::map<TensorId, TensorId> roots_;      ///< arena tensors sharing another's bytes, to that root
  std::map<TensorId, int64_t> storedBytes_; ///< bytes of the arena roots
  std::map<TensorId, TensorInfo> infos_;
  std::vector<std::shared_ptr<TensorData>> keepAlive_;
  std::vector<std::unique_ptr<SequenceData>> sequences_; ///< values of sequence and optional tensors
  std::map<TensorId, const TensorData *> constData_;
  MemoryPlan memoryPlan_;
};

/// Evaluates constant ops with the reference kernels, for ir::inferShapes.
class ReferenceEvaluator : public ir::ConstEvaluator {
public:
  /// Registers the kernels first (and so the subgraph folder, ir::setSubgraphFolder), unless
  /// \p registerKernels is false (the folder itself, made while registering).
  explicit ReferenceEvaluator(bool registerKernels = true) {
    if (registerKernels) registerBuiltinKernels();
  }
  bool canEvaluate(const ir::Op &op) const override;
  std::vector<TensorData> evaluate(const ir::Op &op) const override;
};

} // namespace popart::backend_cpu
