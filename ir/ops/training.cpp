// ai.onnx.preview.training optimiser ops: Adagrad, Momentum, Adam (one update of n tensors).

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

/// Number of state tensors per optimised tensor after X and G.
size_t stateCount(const std::string &type) { return type == "Adam" ? 2 : 1; }

void setupOptimizerOp(Op &op) {
  size_t groups = 2 + stateCount(op.type); // X, G, states
  if (op.inputCount() < 2 + groups || (op.inputCount() - 2) % groups != 0)
    throw error(op.debugName(), ": expected R, T and ", groups, " inputs per optimised tensor, got ", op.inputCount(),
                " inputs");
  size_t n = (op.inputCount() - 2) / groups;
  if (op.outputCount() != n * (groups - 1))
    throw error(op.debugName(), ": expected ", n * (groups - 1), " outputs for ", n, " tensors, got ",
                op.outputCount());
  if (op.inInfo(0).elementCount() != 1 || op.inInfo(1).elementCount() != 1)
    throw error(op.debugName(), ": R and T must be scalars");
  requireType(op, 1, {DataType::INT64});
  for (size_t i = 0; i < n; ++i) {
    const TensorInfo &x = op.inInfo(2 + i);
    for (size_t g = 1; g < groups; ++g)
      if (op.inInfo(2 + g * n + i).shape() != x.shape())
        throw error(op.debugName(), ": input ", 2 + g * n + i, " has shape ",
                    toString(op.inInfo(2 + g * n + i).shape()), ", expected ", toString(x.shape()), " like X", i + 1);
    for (size_t g = 0; g + 1 < groups; ++g)
      op.setOutInfo(g * n + i, x);
  }
}

/// Gradient's outputs are the gradients of y with respect to each of xs: shaped like them.
void setupGradient(Op &op) {
  std::vector<std::string> xs = op.attrs.getStrings("xs");
  if (!op.attrs.has("y")) throw error(op.debugName(), ": attribute y is required");
  if (xs.size() != op.outputCount())
    throw error(op.debugName(), ": ", xs.size(), " names in xs but ", op.outputCount(), " outputs");
  for (size_t i = 0; i < xs.size(); ++i)
    op.setOutInfo(i, op.graph->tensor(xs[i]).info());
}

} // namespace

void registerTrainingOps(OpRegistry &r) {
  OpDef gradient = makeDef("Gradient", 1, 1000, setupGradient);
  gradient.domain = "ai.onnx.preview.training";
  gradient.foldable = false;
  gradient.expandedBeforeLowering = true;
  r.add(gradient);
  for (const char *t : {"Adagrad", "Momentum", "Adam"}) {
    OpDef d = makeDef(t, 1, 1000, setupOptimizerOp);
    d.domain = "ai.onnx.preview.training";
    r.add(d);
  }
}

} // namespace popart::ir
