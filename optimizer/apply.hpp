#pragma once
// Adds an optimiser to a graph with gradients: per weight its state Variables and one in-place
// update op, plus gradient accumulation, clipping by global norm and the finiteness check of
// dynamic loss scaling, with the gradient statistics of its histogram method. Host-side values
// (hyperparameters per step) come from hyperParameters().

#include "ir/graph.hpp"
#include "optimizer/sharding.hpp"
#include <popart/optimizer.hpp>

#include <string>
#include <utility>
#include <vector>

namespace popart::optimizer {

/// Phases of the training graph (ir::Op::phase): forward, backward and accumulation run per
/// micro-batch; the others once per weight update, in order.
enum Phase : int { MicroBatch = 0, PreUpdate = 1, Update = 2, PostUpdate = 3 };

/// One weight's update: the tensors the host writes or reads.
struct WeightUpdate {
  TensorId weight;
  TensorId hyperParameters;    ///< FLOAT [K] Variable the host writes before each update
  std::vector<TensorId> state; ///< optimiser state Variables (checkpointed)
  TensorId accumulator;        ///< gradient accumulator Variable ("" without accumulation)
  /// This replica's shard of the weight, the Variable its update op updates ("" unless sharded:
  /// the state Variables are then shards too).
  TensorId shard;
};

struct ApplyOptions {
  int accumulationFactor = 1;
  /// Adds an AllFinite op over every gradient (dynamic loss scaling).
  bool checkFinite = false;
  /// Positive: adds a GradientStatistics op over every gradient (the histogram method of
  /// automatic loss scaling), counting elements below and at or above the bin edge, this
  /// proportion (at most 1) of the largest finite value of the narrowest gradient type. 0: none.
  float binEdgeLocation = 0.0f;
  /// The bin edge is a proportion of fp16's largest value (65504) whatever the gradients' type:
  /// the fp16 modes, whose gradients are computed in fp16 even where one reaches the optimiser as
  /// FLOAT (accumulated in fp32, or without keepWeightGradientsLow).
  bool binEdgeOfHalf = false;
  /// Type of the optimiser state (momentum, Adam moments, RMSprop and AdaGrad accumulators) and
  /// of the gradient accumulators of FLOAT16 and BFLOAT16 weights. UNDEFINED: the weight's own
  /// type, as PopART's accumulatorAndMomentumType, accumType and accl1Type set to half (PopTorch's
  /// fp16.16). FLOAT: fp32 state for 16-bit weights. The state of FLOAT weights is FLOAT either
  /// way; hyperparameters, the loss scale and the gradient scale are always FLOAT.
  DataType stateType = DataType::UNDEFINED;
  /// Type of the second-order state, PopART's accl2Type: Adam's, AdamW's and LAMB's v, AdaMax's u,
  /// RMSprop's square average (and centered RMSprop's gradient average), AdaGrad's sum of squares.
  /// UNDEFINED: stateType's rule (stateType if set, else the weight's type). FLOAT keeps it fp32
  /// beside 16-bit weights and first-order state (SGD's velocity, Adam's m, RMSprop's momentum
  /// follow stateType): a squared fp16 gradient below ~2.4e-4 underflows, and Adam's step then
  /// divides m by ε. The session asks for FLOAT (docs/precision.md).
  DataType secondMomentType = DataType::UNDEFINED;
  /// Replicated tensor sharding of the optimiser state (optimizer/sharding.hpp): the weights it
  /// shards have their gradient reduce-scattered (which their gradient must not have been
  /// all-reduced before) and their state and update cut to this replica's shard.
  ShardingOptions sharding;
};

struct AppliedOptimizer {
  std::vector<WeightUpdate> updates;
  /// FLOAT scalar Variable the host sets to 1 / (loss scale · accumulation factor).
  TensorId gradScale;
  /// BOOL scalar, true when every gradient is finite ("" unless checkFinite).
  TensorId allFinite;
  /// INT64 [2] Variable {elements below the edge, elements at or above it (NaN, inf)} of the
  /// last step's gradients, written in the PreUpdate phase ("" unless binEdgeLocation).
  TensorId gradientStatistics;
  /// The bin edge those counts use (0 without them).
  float binEdge = 0.0f;
};

/// Adds the optimiser for \p weightGrads ({weight, gradient of the scaled loss}) to \p graph.
/// Weights are FLOAT, FLOAT16 or BFLOAT16, each gradient of its weight's type or, for a FLOAT
/// (master) weight, FLOAT16 or BFLOAT16: every op here reads such a gradient as it is (clipping
/// squares it in fp32, an accumulator stays FLOAT) and the update widens it in its kernel.
AppliedOptimizer applyOptimizer(ir::Graph &graph, const Optimizer &optimizer,
                                const std::vector<std::pair<TensorId, TensorId>> &weightGrads,
                                const ApplyOptions &options);

/// The hyperparameter tensor of \p weight for the \p step-th update (1-based).
std::vector<float> hyperParameters(const Optimizer &optimizer, const TensorId &weight, int64_t step);
/// \p weight's hyperparameter values in hyperParameterNames() order: looked up once (when the
/// session compiles and on updateOptimizerFromHost) so that the per-step write does no lookups.
std::vector<float> resolveHyperParameters(const Optimizer &optimizer, const TensorId &weight);
/// Writes the hyperparameter tensor of the \p step-th update from \p resolved into \p out
/// (hyperParameterCount floats); allocates nothing.
void writeHyperParameters(const Optimizer &optimizer, const std::vector<float> &resolved, int64_t step, float *out);

/// Throws unless \p next can replace \p current in a compiled session: same kind, same
/// clipping, same const values (naming the first that differs).
void checkReplaceable(const Optimizer &current, const Optimizer &next, const std::vector<TensorId> &weights);

} // namespace popart::optimizer
