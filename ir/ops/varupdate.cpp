// ai.graphcore ops that update Variables in place during training: the optimiser updates
// (SGDUpdate, AdamUpdate, AdaptiveUpdate), gradient accumulation (Accumulate, ResetVar),
// copies into a variable (CopyVar: BatchNormalization running statistics), AllFinite (the
// inf/NaN check of dynamic loss scaling) and GradientStatistics (the two-bin histogram of
// gradient magnitudes that the histogram method of automatic loss scaling reads).
//
// Update ops take [weight, gradient, hyperparameters (FLOAT [K]), gradient scale (FLOAT scalar),
// state...] and output the weight and state updated in place. The gradient is multiplied by the
// gradient scale first (1 / (loss scale · accumulation factor), times the clipping factor).
// The weight is FLOAT, FLOAT16 or BFLOAT16; the gradient and each state tensor have its shape and
// either its type or FLOAT (fp32 optimiser state, or a gradient accumulated in fp32), each on its
// own: fp16.16 keeps fp16 first-order state beside FLOAT second moments (optimizer/apply.hpp). A
// FLOAT weight may also take a 16-bit gradient: fp16.32's and bf16's master weights, whose
// gradients stay in the low type until the update widens them.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

#include <cmath>

namespace popart::ir {

namespace {

/// Hyperparameter count of each update op (layouts: docs/training.md).
size_t hyperParameterCount(const std::string &type) {
  if (type == "SGDUpdate") return 6;
  if (type == "AdamUpdate") return 8;
  return 6; // AdaptiveUpdate
}

/// Whether \p t (gradient or state) may go with weight \p w: the same shape, and the weight's type or FLOAT.
bool matchesWeight(const TensorInfo &t, const TensorInfo &w) {
  return t.shape() == w.shape() && (t.dataType() == w.dataType() || t.dataType() == DataType::FLOAT);
}

void setupUpdate(Op &op) {
  if (op.inputCount() < 4) throw error(op.debugName(), ": expected weight, gradient, hyperparameters, gradient scale");
  const TensorInfo &w = op.inInfo(0);
  requireType(op, 0, {DataType::FLOAT, DataType::FLOAT16, DataType::BFLOAT16});
  const DataType g = op.inInfo(1).dataType();
  const bool lowGradient = w.dataType() == DataType::FLOAT && (g == DataType::FLOAT16 || g == DataType::BFLOAT16) &&
                           op.inInfo(1).shape() == w.shape();
  if (!matchesWeight(op.inInfo(1), w) && !lowGradient)
    throw error(op.debugName(), ": gradient ", op.inInfo(1).toString(), " does not match weight ", w.toString(),
                " (expected its shape, and its type, FLOAT, or a 16-bit type for a FLOAT weight)");
  if (op.inInfo(2).dataType() != DataType::FLOAT ||
      op.inInfo(2).elementCount() != int64_t(hyperParameterCount(op.type)))
    throw error(op.debugName(), ": expected ", hyperParameterCount(op.type), " FLOAT hyperparameters, got ",
                op.inInfo(2).toString());
  if (op.inInfo(3).dataType() != DataType::FLOAT || op.inInfo(3).elementCount() != 1)
    throw error(op.debugName(), ": the gradient scale must be a FLOAT scalar, got ", op.inInfo(3).toString());
  op.setOutInfo(0, w);
  for (size_t i = 4; i < op.inputCount(); ++i) {
    if (!op.hasInput(i)) continue;
    if (!matchesWeight(op.inInfo(i), w))
      throw error(op.debugName(), ": state input ", i, " is ", op.inInfo(i).toString(), ", expected ", w.toString(),
                  " or FLOAT of that shape");
    op.setOutInfo(i - 3, op.inInfo(i));
  }
}

/// acc += g: g has acc's info, or is a 16-bit gradient accumulated into a FLOAT accumulator.
void setupAccumulate(Op &op) {
  requireInputCount(op, 2, 2);
  const TensorInfo &acc = op.inInfo(0), &g = op.inInfo(1);
  const bool widening =
      acc.dataType() == DataType::FLOAT && (g.dataType() == DataType::FLOAT16 || g.dataType() == DataType::BFLOAT16);
  if (g.shape() != acc.shape() || (g.dataType() != acc.dataType() && !widening))
    throw error(op.debugName(), ": cannot accumulate ", op.inInfo(1).toString(), " into ", op.inInfo(0).toString());
  op.setOutInfo(0, op.inInfo(0));
}

void setupCopyVar(Op &op) {
  requireInputCount(op, 2, 2);
  if (op.inInfo(1) != op.inInfo(0))
    throw error(op.debugName(), ": cannot copy ", op.inInfo(1).toString(), " into ", op.inInfo(0).toString());
  op.setOutInfo(0, op.inInfo(0));
}

void setupAllFinite(Op &op) {
  if (op.inputCount() == 0) throw error(op.debugName(), ": needs at least one input");
  op.setOutInfo(0, TensorInfo(DataType::BOOL, {}));
}

/// GradientStatistics(counts, g1, g2...) -> counts: writes into the INT64 [2] Variable `counts`
/// how many elements of the gradients have |g| below the attribute `edge` and how many not
/// (NaN and inf among them). It updates a Variable in place rather than making a new tensor so
/// that its result outlives the step's arena for the host to read, and dead-code removal keeps it.
void setupGradientStatistics(Op &op) {
  if (op.inputCount() < 2) throw error(op.debugName(), ": expected the counts Variable and at least one gradient");
  if (op.inInfo(0) != TensorInfo(DataType::INT64, {2}))
    throw error(op.debugName(), ": the counts must be INT64 [2], got ", op.inInfo(0).toString());
  for (size_t i = 1; i < op.inputCount(); ++i)
    requireType(op, i, {DataType::FLOAT, DataType::FLOAT16, DataType::BFLOAT16, DataType::DOUBLE});
  const float edge = op.attrs.getFloat("edge");
  if (!(edge > 0.0f) || !std::isfinite(edge))
    throw error(op.debugName(), ": the bin edge must be a positive finite value, got ", edge);
  op.setOutInfo(0, op.inInfo(0));
}

OpDef def(const char *type, void (*setup)(Op &), std::vector<OpDef::InPlace> modifies) {
  OpDef d = makeDef(type, 1, 1000, setup);
  d.domain = "ai.graphcore";
  d.foldable = false;
  d.modifies = std::move(modifies);
  return d;
}

} // namespace

void registerVarUpdateOps(OpRegistry &r) {
  r.add(def("SGDUpdate", setupUpdate, {{0, 0}, {1, 4}}));
  r.add(def("AdamUpdate", setupUpdate, {{0, 0}, {1, 4}, {2, 5}}));
  r.add(def("AdaptiveUpdate", setupUpdate, {{0, 0}, {1, 4}, {2, 5}, {3, 6}}));
  r.add(def("Accumulate", setupAccumulate, {{0, 0}}));
  r.add(def("ResetVar", setupSameAsInput0, {{0, 0}}));
  r.add(def("CopyVar", setupCopyVar, {{0, 0}}));
  r.add(def("AllFinite", setupAllFinite, {}));
  r.add(def("GradientStatistics", setupGradientStatistics, {{0, 0}}));
}

} // namespace popart::ir
