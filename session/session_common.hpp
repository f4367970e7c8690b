#pragma once
// Parts shared by InferenceSession and TrainingSession: reading the model argument, resolving
// input shapes, and copying anchors into the host buffers.

#include "backend_cpu/plan.hpp"
#include "ir/graph.hpp"
#include "ir/passes/precision.hpp"
#include <popart/dataflow.hpp>
#include <popart/sessionoptions.hpp>
#include <popart/stepio.hpp>

#include <map>
#include <memory>
#include <string>

namespace popart::session {

/// A model given as a path or as serialized bytes.
struct ModelSource {
  std::string bytes;
  std::string baseDir;    ///< where external data is resolved
  std::string sourceName; ///< the path, or "<model bytes>", for messages
};

/// The parts of a plan's memory, {label, bytes} (profileSummary's "planned peak" and the limit).
using MemoryParts = std::vector<std::pair<std::string, int64_t>>;

/// Bytes the system can still give this process: MemAvailable from /proc/meminfo, or what the
/// cgroup's memory.max leaves above memory.current if that is less (cgroup v2, else v1's
/// memory.limit_in_bytes and memory.usage_in_bytes). -1 if /proc/meminfo cannot be read.
int64_t availableMemoryBytes();

/// The memory of compiled \p plan as its compilation planned it.
backend_cpu::PlannedMemory plannedMemory(const backend_cpu::ExecutionPlan &plan);

/// The name of the arena's part of \p planned: "activation arena", or, in the check made before the
/// kernels, "tensor 'T' alone (the arena's least)".
std::string arenaPartName(const backend_cpu::PlannedMemory &planned);
/// Throws a popart::error if the sum of \p parts (of \p planned) is above
/// SessionOptions::memoryLimitBytes or, when that is 0, above availableMemoryBytes() plus what of
/// \p planned is already allocated (kernels, weights and constants). The message names \p model,
/// the planned size, its parts and the limit.
void checkMemoryLimit(const MemoryParts &parts, const backend_cpu::PlannedMemory &planned,
                      const SessionOptions &options, const std::string &model);

/// Reads \p model, a path to an .onnx file or a serialized ModelProto.
ModelSource loadModel(const std::string &model);

/// The shape input \p id will have: InputShapeInfo's, else the declared one with an unknown
/// leading dimension set to options.batchSize.
TensorInfo resolvedInputInfo(const ir::Graph &declared, const TensorId &id, const InputShapeInfo &shapes,
                             const SessionOptions &options);

/// The plan options SessionOptions asks for (kernels any / reference / dnnl).
backend_cpu::CompileOptions compileOptions(const SessionOptions &options);

/// What convertPrecision does for SessionOptions::precision in a training or an inference session;
/// throws naming the option if its value is none of the modes.
ir::PrecisionPolicy precisionPolicy(const SessionOptions &options, bool training);

/// Runs InferenceSession's pipeline on \p g (shapes inferred again without folding, dead code
/// removed keeping its outputs, then the fusions that SessionOptions::fuseOps turns on, in the
/// session's order); tests/alloc/plan_allocations compiles through it too.
void fuseForInference(ir::Graph &g);

/// Runs the part of TrainingSession's pipeline that follows the optimiser (dead code removed
/// keeping \p g's outputs, the training fusions, recurrent state saving) on \p g, a graph whose
/// gradients were built by hand; tests/alloc/grad_allocations compiles through it, so that the
/// kernels it counts are the fused ones training runs.
void fuseAfterGradients(ir::Graph &g);

/// The kernel context of a session with \p options: its settings, and a MatMul tuning record of
/// its own. Throws naming an option with a value it does not take.
backend_cpu::KernelContext kernelContext(const SessionOptions &options);

/// One line per step of \p plan: the op, the kernel that runs it and why (explainKernels).
std::string kernelReport(const backend_cpu::ExecutionPlan &plan);

/// The seed of replica \p replica's random stream in a training session seeded \p seed: \p seed
/// itself for replica 0 (so an unreplicated run and replica 0 draw the masks they always did),
/// else \p seed and \p replica mixed, so that each replica draws its own Dropout masks. A
/// replica's stream is then a function of (seed, replica, counter) alone: what a checkpoint
/// records (seed and counter) resumes every replica, with any replica count.
uint64_t replicaSeed(uint64_t seed, int replica);

/// The replicas' communicator of a session with \p options: null without replication, else the one
/// given or one over MPI_COMM_WORLD, checked against replicatedGraphCount (errors name the option).
std::shared_ptr<comm::Communicator> replicationCommunicator(const SessionOptions &options);

/// With SessionOptions::enableFloatingPointChecks: if \p plan's last run stopped on a NaN or inf,
/// throws the error users see, naming the op, tensor, element and \p step (1-based, counting
/// every step the session ran, skipped ones included); returns otherwise.
void throwIfNumericFault(const backend_cpu::ExecutionPlan &plan, int64_t step);

/// "a, b, c".
std::string joinIds(const std::vector<TensorId> &ids);

/// Checks \p arr holds \p prefix (batches per step, accumulation...; dimensions of 1 omitted)
/// followed by \p info's shape, of its type; throws naming input \p id otherwise.
void checkInputArray(const TensorId &id, const IArray &arr, const TensorInfo &info, const Shape &prefix);

/// The shape an anchor's host buffer needs when a step runs \p count micro-batches whose
/// shape as a prefix is \p prefix.
Shape anchorShape(const AnchorReturnType &art, const TensorInfo &info, const Shape &prefix, int count);

/// The graph inputs and anchors that the device keeps in another type than the user's
/// (ir::StreamTypes: 16-bit on the device, FLOAT for the user), converted as they are copied.
struct Streams {
  std::map<TensorId, DataType> host;

  /// \p id as the user sees it: \p device with the host type.
  TensorInfo hostInfo(const TensorId &id, const TensorInfo &device) const;
  /// Copies input \p id's values for one run from \p src (its host type) to \p dst (\p device).
  void copyIn(const TensorId &id, const TensorInfo &device, const void *src, void *dst) const;
};

/// Writes the value \p src of an anchor after micro-batch \p index (0-based) of \p count; \p info
/// is its host info, \p deviceType the type of \p src (converted when they differ).
void writeAnchor(const AnchorReturnType &art, const TensorInfo &info, DataType deviceType, const void *src, IArray &dst,
                 int index, int count);

} // namespace popart::session
