// Gradient rules of LSTM, GRU and RNN: one ai.graphcore grad op per forward op (ir/ops/rnn.cpp)
// that gives the gradients of X, W, R, B, initial_h and initial_c at once.
//
// What the backward needs from the forward pass (gate activations, states): oneDNN's backward
// reads a workspace that only its own forward_training writes, in a layout and size that the
// primitive decides, so the IR cannot define it, and a grad kernel may be paired with a forward
// kernel of another provider. So the grad op by itself recomputes the forward pass (one more
// forward per step, as MaxPoolGrad's oneDNN kernel does), and the training session then lets
// the backend size a saved-state output of the forward op (ir::saveRecurrentState, attribute
// popart_forward links the two ops) with contents the kernels define: the oneDNN forward writes
// its workspace there and the oneDNN grad kernel skips the recomputation when it finds it (a
// header says who wrote it). bench/compare's 2-layer LSTM (hidden 256, 64 steps, batch 32, one
// thread, on a loaded machine): best step 90 ms with the saved state, 130 ms recomputing.
//
// Training supports what PyTorch's export writes: default activations, no clip, no input_forget,
// no peepholes, and sequence_lens only when it is a constant holding the full length everywhere.

#include "autodiff/grad_rules.hpp"
#include "ir/internal_attributes.hpp"

#include <popart/error.hpp>

namespace popart::autodiff {

namespace {

std::vector<std::string> defaultActivations(const std::string &type) {
  if (type == "LSTM") return {"Sigmoid", "Tanh", "Tanh"};
  if (type == "GRU") return {"Sigmoid", "Tanh"};
  return {"Tanh"};
}

/// Throws naming the op for every attribute or input whose gradient the grad ops do not compute.
void checkTrainable(const ir::Op &op) {
  auto fail = [&](const std::string &what) {
    throw error(op.debugName(), ": training (the gradient of ", op.type, ") does not support ", what);
  };
  if (op.inInfo(0).dataType() != DataType::FLOAT && op.inInfo(0).dataType() != DataType::DOUBLE)
    fail("type " + toString(op.inInfo(0).dataType()) + " (FLOAT or DOUBLE only)");
  if (op.attrs.has("clip")) fail("the clip attribute");
  if (op.attrs.getInt("input_forget", 0) != 0) fail("input_forget");
  if (op.attrs.has("activation_alpha") || op.attrs.has("activation_beta")) fail("activation_alpha or activation_beta");
  if (op.attrs.has("activations")) {
    std::vector<std::string> given = op.attrs.getStrings("activations"), defaults = defaultActivations(op.type);
    for (size_t i = 0; i < given.size(); ++i)
      if (given[i] != defaults[i % defaults.size()]) fail("activation '" + given[i] + "' (only the defaults)");
  }
  if (op.type == "LSTM" && op.hasInput(7)) fail("peepholes (input P)");
  if (op.hasInput(4)) {
    const ir::Tensor &lens = op.input(4);
    const Shape &x = op.inInfo(0).shape();
    int64_t seq = op.attrs.getInt("layout", 0) != 0 ? x[1] : x[0];
    bool full = lens.isConst();
    if (full)
      for (int64_t v : lens.data()->toInt64Vector())
        full = full && v == seq;
    if (!full) fail("sequence_lens other than a constant holding the full length " + std::to_string(seq));
  }
}

void recurrentRule(GradContext &c) {
  const ir::Op &op = c.op();
  checkTrainable(op);
  bool lstm = op.type == "LSTM";
  std::vector<TensorId> inputs{c.in(0), c.in(1), c.in(2)};
  auto optional = [&](size_t i) { return op.hasInput(i) ? c.in(i) : TensorId(); };
  inputs.push_back(optional(3));
  inputs.push_back(optional(5));
  inputs.push_back(lstm ? optional(6) : TensorId());
  for (size_t i = 0; i < 3; ++i)
    inputs.push_back(i == 2 && !lstm ? TensorId() : c.outGrad(i));
  while (!inputs.empty() && inputs.back().empty())
    inputs.pop_back();

  ir::Graph &g = c.graph();
  std::string base = c.out(0) + "_grad_";
  // Grad op output k is the gradient of forward input forwardIndex[k].
  const size_t forwardIndex[] = {0, 1, 2, 3, 5, 6};
  const char *names[] = {"dX", "dW", "dR", "dB", "dInitialH", "dInitialC"};
  std::vector<TensorId> outs;
  for (size_t k = 0; k < (lstm ? 6u : 5u); ++k)
    outs.push_back(op.hasInput(forwardIndex[k]) ? g.uniqueId(base + names[k]) : TensorId());
  while (!outs.empty() && outs.back().empty())
    outs.pop_back();

  ir::Attributes attrs;
  attrs.set("direction", op.attrs.getString("direction", "forward"));
  attrs.set("hidden_size", c.inShape(2)[2]);
  attrs.set("layout", op.attrs.getInt("layout", 0));
  attrs.set(ir::internal_attr::kForward, op.id);
  if (op.type == "GRU") attrs.set("linear_before_reset", op.attrs.getInt("linear_before_reset", 0));
  ir::Op &grad = g.addOp(op.type + "Grad", "ai.graphcore", 1, "", std::move(attrs), inputs, outs);
  grad.def->setup(grad);
  for (size_t k = 0; k < outs.size(); ++k)
    if (!outs[k].empty()) c.setInGrad(forwardIndex[k], outs[k]);
}

} // namespace

void registerRnnRules(GradRuleRegistry &r) {
  addOnnxRules(r, {{"LSTM", recurrentRule}, {"GRU", recurrentRule}, {"RNN", recurrentRule}});
}

} // namespace popart::autodiff
