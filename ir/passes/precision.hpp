#pragma once
// convertPrecision: PopART's convertFloatsToHalfs / PopTorch's model.half() with an fp32 list, for
// the precision modes of SessionOptions::precision (docs/precision.md).

#include "ir/graph.hpp"

#include <map>
#include <string>
#include <vector>

namespace popart::ir {

/// What convertPrecision does; the session fills it (PassContext::state<PrecisionPolicy>()).
struct PrecisionPolicy {
  /// The type float tensors are stored in: FLOAT16 or BFLOAT16; UNDEFINED (fp32 mode) converts nothing.
  DataType low = DataType::UNDEFINED;
  /// FLOAT Variables stay FLOAT (the master copy the optimiser updates) and the forward pass reads
  /// them through one Cast each; false converts them in place (fp16.16: no master copy).
  bool masterWeights = true;
  /// fp16.16: MatMul and Gemm of 16-bit operands round their partial sums to 16 bits after every
  /// addition (PopART's partialsType half; markHalfPartials), instead of accumulating in fp32.
  bool halfPartials = false;
  /// The graph's inputs read only in the low type, and its outputs and anchors that a low op writes,
  /// are kept in the low type on the device; the session converts them from and to their declared
  /// type as it copies them (StreamTypes), instead of a Cast op and a FLOAT copy in the arena. The
  /// values are the same either way: the conversions round as the Casts do.
  bool lowStreams = true;
};

/// What convertPrecision left in the low type of the graph's inputs and kept tensors, with the type
/// the user passes or receives (their declared one); PassContext::state<StreamTypes>().
struct StreamTypes {
  std::map<TensorId, DataType> host;
};

/// How convertPrecision treats an op type (docs/precision.md lists them).
enum class PrecisionClass {
  Low,     ///< the products (kLowOps): float inputs in the low type; the kernel accumulates in fp32
  Fp32,    ///< fp32Ops(): float inputs cast to FLOAT; the op computes and writes fp32
  LowData, ///< fp32Ops() marked lowData: X (input 0) low, the other float inputs FLOAT; statistics in fp32
  Follow,  ///< every other op: low if any float input is 16-bit, else left as it is
};

/// The ops that always compute in the low type: the products, where half precision pays.
inline constexpr const char *kLowOps[] = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"};

/// The op types kept in fp32, with the reason for each, in the order docs/precision.md lists them.
struct Fp32Op {
  const char *type;
  const char *reason;
  /// Only when each output reduces more than kLargeReduction elements.
  bool onlyLargeReductions;
  /// Only the parameters and statistics: X (input 0) and Y in the low type, every other float
  /// input FLOAT, the statistics computed in fp32 (PrecisionClass::LowData).
  bool lowData = false;
};
const std::vector<Fp32Op> &fp32Ops();
/// Reductions over more elements than this per output stay in fp32 (their sums overflow fp16).
constexpr int64_t kLargeReduction = 4096;

/// The class of \p op under convertPrecision.
PrecisionClass precisionClass(const Op &op);

/// Converts the float tensors of \p graph to \p policy.low: the ops of kLowOps read their float
/// inputs in the low type, those of fp32Ops() read FLOAT (the lowData ones all but X, which is
/// low), and every other op follows its inputs (low
/// if any is 16-bit), so that everything computed from a product is low and what only the loss
/// feeds stays fp32. Each tensor is cast once per type it is read in (constants are converted, not
/// cast), and the tensors in \p keep and the graph's outputs keep their types (a Cast writes them).
/// Tensors that decide shapes are left alone. With \p policy.lowStreams and \p streams, the
/// graph's inputs and kept tensors go without those Casts where they can (PrecisionPolicy::lowStreams),
/// all but \p loss, and \p streams records them. Returns the number of casts and conversions made.
int convertPrecision(Graph &graph, const PrecisionPolicy &policy, const std::vector<TensorId> &keep,
                     StreamTypes *streams = nullptr, const TensorId &loss = {});

struct TrainingTensors;

/// fp16.32 and bf16 (a \p policy with a low type and master weights): each FLOAT weight of
/// \p training whose gradient is a Cast of a FLOAT16 or BFLOAT16 gradient (the master copy's Cast,
/// differentiated) takes that 16-bit gradient instead, and the Cast goes, unless \p keep or the
/// graph's outputs name its result. The optimiser then reads the gradient in the low type and
/// widens it in its kernels onto the master weight: half the memory, the same values. Returns
/// how many gradients it changed.
int keepWeightGradientsLow(Graph &graph, const PrecisionPolicy &policy, TrainingTensors &training,
                           const std::vector<TensorId> &keep);

/// With \p policy.halfPartials, marks every MatMul and Gemm of 16-bit operands (forward and
/// gradient ones alike) with internal_attr::kHalfPartials; returns how many.
int markHalfPartials(Graph &graph, const PrecisionPolicy &policy);

} // namespace popart::ir
