// Recurrent ops: RNN, GRU, LSTM (opsets 7-17, layout attribute from 14), and their gradient ops
// (domain ai.graphcore), created by the autodiff rules of autodiff/rules_rnn.cpp:
//   LSTMGrad / GRUGrad / RNNGrad(X, W, R, B, initial_h, initial_c, dY, dY_h, dY_c)
//     -> dX, dW, dR, dB, d_initial_h, d_initial_c
// with the forward op's attributes. Inputs other than X, W and R and all outputs may be
// omitted; initial_c and dY_c belong to LSTMGrad only. The grad op has no sequence_lens,
// peepholes, clip or activation list.
//
// Saved state (saveRecurrentState): in training the forward op may get one more output after
// Y_c (LSTM) or Y_h (GRU, RNN), UINT8 [popart_saved_bytes], which the grad op reads as input 9.
// Its contents belong to the kernels: one that can reuse what the forward kept (oneDNN's
// workspace) finds it there; any other recomputes the forward pass, so a kernel pair that
// does not match stays correct (see rules_rnn.cpp).

#include "ir/ops/rnn.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

#include <algorithm>
#include <map>

namespace popart::ir {

namespace {

int64_t gateCount(const std::string &type) {
  return type.rfind("LSTM", 0) == 0 ? 4 : type.rfind("GRU", 0) == 0 ? 3 : 1;
}

/// Checks X, W and R (inputs 0-2) and returns the infos of Y and of the states Y_h / Y_c.
std::pair<TensorInfo, TensorInfo> recurrentInfos(const Op &op) {
  const Shape &x = op.inInfo(0).shape(), &w = op.inInfo(1).shape(), &r = op.inInfo(2).shape();
  if (x.size() != 3 || w.size() != 3 || r.size() != 3)
    throw error(op.debugName(), ": X, W and R must be 3-D, got ", toString(x), ", ", toString(w), ", ", toString(r));
  std::string direction = op.attrs.getString("direction", "forward");
  int64_t dirs = direction == "bidirectional" ? 2 : 1;
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    throw error(op.debugName(), ": direction '", direction, "' is not forward, reverse or bidirectional");
  int64_t hidden = op.attrs.getInt("hidden_size", r[2]);
  bool batchFirst = op.attrs.getInt("layout", 0) != 0;
  int64_t seq = batchFirst ? x[1] : x[0], batch = batchFirst ? x[0] : x[1];
  const int64_t gateRows = checkedMul(op, gateCount(op.type), hidden, "the gates' rows, gates times hidden_size,");
  if (w[0] != dirs || w[1] != gateRows || w[2] != x[2])
    throw error(op.debugName(), ": W has shape ", toString(w), ", expected [", dirs, ",", gateRows, ",", x[2], "]");
  if (r[0] != dirs || r[1] != gateRows || r[2] != hidden)
    throw error(op.debugName(), ": R has shape ", toString(r), ", expected [", dirs, ",", gateRows, ",", hidden, "]");
  DataType t = op.inInfo(0).dataType();
  Shape state = batchFirst ? Shape{batch, dirs, hidden} : Shape{dirs, batch, hidden};
  return {TensorInfo(t, batchFirst ? Shape{batch, seq, dirs, hidden} : Shape{seq, dirs, batch, hidden}),
          TensorInfo(t, state)};
}

TensorInfo savedInfo(const Op &op) {
  int64_t bytes = op.attrs.getInt(ir::internal_attr::kSavedBytes, 0);
  if (bytes <= 0) throw error(op.debugName(), ": the saved-state output needs popart_saved_bytes > 0");
  return TensorInfo(DataType::UINT8, {bytes});
}

/// Checks the optional inputs B, sequence_lens, initial_h, initial_c and P against X, W and R: the
/// kernels read them by those shapes (an empty B was read past its end).
void requireRecurrentInputs(const Op &op, const TensorInfo &state) {
  const bool lstm = op.type == "LSTM";
  const DataType t = op.inInfo(0).dataType();
  const int64_t dirs = op.inInfo(1).dim(0), gateRows = op.inInfo(1).dim(1), hidden = op.inInfo(2).dim(2);
  const bool batchFirst = op.attrs.getInt("layout", 0) != 0;
  const int64_t batch = op.inInfo(0).dim(batchFirst ? 0 : 1);
  auto expect = [&](size_t i, const TensorInfo &info, const char *name) {
    if (op.hasInput(i) && op.inInfo(i) != info)
      throw error(op.debugName(), ": ", name, " is ", op.inInfo(i).toString(), ", expected ", info.toString());
  };
  for (size_t i = 1; i < op.inputCount(); ++i)
    if (i != 4 && op.hasInput(i) && op.inInfo(i).dataType() != t)
      throw error(op.debugName(), ": input ", i, " has type ", toString(op.inInfo(i).dataType()), ", expected ",
                  toString(t), " like X");
  expect(3, TensorInfo(t, {dirs, checkedMul(op, gateRows, 2, "B's width, twice the gates' rows,")}), "B");
  if (op.hasInput(4) && op.inInfo(4).dataType() == DataType::INT64)
    expect(4, TensorInfo(DataType::INT64, {batch}), "sequence_lens");
  else
    expect(4, TensorInfo(DataType::INT32, {batch}), "sequence_lens");
  expect(5, state, "initial_h");
  if (lstm) {
    expect(6, state, "initial_c");
    expect(7, TensorInfo(t, {dirs, checkedMul(op, hidden, 3, "P's width, three times hidden_size,")}), "P");
  }
}

void setupRecurrent(Op &op) {
  requireInputCount(op, 3, op.type == "LSTM" ? 8 : 6);
  auto [y, state] = recurrentInfos(op);
  requireRecurrentInputs(op, state);
  op.setOutInfo(0, y);
  op.setOutInfo(1, state);
  if (op.type == "LSTM") op.setOutInfo(2, state);
  size_t saved = recurrentSavedOutput(op);
  if (op.hasOutput(saved)) op.setOutInfo(saved, savedInfo(op));
}

void setupRecurrentGrad(Op &op) {
  requireInputCount(op, 3, 10);
  requireType(op, 0, {DataType::FLOAT, DataType::DOUBLE});
  auto [y, state] = recurrentInfos(op);
  bool lstm = op.type == "LSTMGrad";
  const TensorInfo &w = op.inInfo(1);
  int64_t dirs = w.dim(0);
  TensorInfo bias(w.dataType(), Shape{dirs, 2 * w.dim(1)});
  auto expect = [&](size_t i, const TensorInfo &info, const char *name) {
    if (op.hasInput(i) && op.inInfo(i) != info)
      throw error(op.debugName(), ": ", name, " is ", op.inInfo(i).toString(), ", expected ", info.toString());
  };
  for (size_t i = 1; i < std::min<size_t>(op.inputCount(), 9); ++i)
    if (op.hasInput(i) && op.inInfo(i).dataType() != op.inInfo(0).dataType())
      throw error(op.debugName(), ": input ", i, " has type ", toString(op.inInfo(i).dataType()), ", expected ",
                  toString(op.inInfo(0).dataType()));
  expect(3, bias, "B");
  expect(4, state, "initial_h");
  expect(5, state, "initial_c");
  expect(6, y, "dY");
  expect(7, state, "dY_h");
  expect(8, state, "dY_c");
  if (op.hasInput(9) && (op.inInfo(9).dataType() != DataType::UINT8 || op.inInfo(9).rank() != 1))
    throw error(op.debugName(), ": the saved state is ", op.inInfo(9).toString(), ", expected UINT8 [bytes]");
  if (!lstm && (op.hasInput(5) || op.hasInput(8) || op.hasOutput(5)))
    throw error(op.debugName(), ": only LSTMGrad has a cell state");
  op.setOutInfo(0, op.inInfo(0));
  op.setOutInfo(1, op.inInfo(1));
  op.setOutInfo(2, op.inInfo(2));
  op.setOutInfo(3, bias);
  op.setOutInfo(4, state);
  if (lstm) op.setOutInfo(5, state);
}

} // namespace

size_t recurrentSavedOutput(const Op &op) { return op.type == "LSTM" ? 3 : 2; }

int saveRecurrentState(Graph &graph, const std::function<int64_t(const Op &)> &savedBytes) {
  std::map<int64_t, Op *> byId;
  for (const auto &op : graph.ops())
    byId[op->id] = op.get();
  int count = 0;
  for (const auto &grad : graph.ops()) {
    if (grad->domain != "ai.graphcore" ||
        (grad->type != "LSTMGrad" && grad->type != "GRUGrad" && grad->type != "RNNGrad") || grad->hasInput(9) ||
        !grad->attrs.has(ir::internal_attr::kForward))
      continue;
    auto it = byId.find(grad->attrs.getInt(ir::internal_attr::kForward));
    if (it == byId.end()) continue;
    Op &fwd = *it->second;
    size_t index = recurrentSavedOutput(fwd);
    if (fwd.hasOutput(index)) continue; // a second grad op of the same forward recomputes
    int64_t bytes = savedBytes(fwd);
    if (bytes <= 0) continue;
    fwd.attrs.set(ir::internal_attr::kSavedBytes, bytes);
    while (fwd.outputs.size() <= index)
      fwd.outputs.push_back(nullptr);
    Tensor &saved = graph.addTensor(graph.uniqueId(fwd.outputs[0] ? fwd.outputs[0]->id() + "_saved" : "rnn_saved"),
                                    TensorKind::ActGrad, savedInfo(fwd));
    saved.setProducer(&fwd);
    fwd.outputs[index] = &saved;
    graph.setOpInput(*grad, 9, &saved);
    fwd.def->setup(fwd);
    grad->def->setup(*grad);
    ++count;
  }
  return count;
}

/// The gate products of every time step, 2 · T·N · (gates·H·directions) · (I + H) from X [T, N, I]
/// (or [N, T, I]), W [D, G·H, I] and R [D, G·H, H]; their grad ops (X, W, R first too) twice
/// that, for the data and the weight gradients.
static double recurrentFlops(const Op &op, bool grad) {
  if (!op.hasInput(0) || !op.hasInput(1) || !op.hasInput(2)) return outputElementCount(op);
  const Shape &w = op.inInfo(1).shape(), &r = op.inInfo(2).shape();
  if (w.size() != 3 || r.size() != 3 || w[2] == 0) return 0.0;
  double steps = static_cast<double>(op.inInfo(0).elementCount()) / static_cast<double>(w[2]); // T·N
  double forward = 2.0 * steps * static_cast<double>(w[0] * w[1]) * static_cast<double>(w[2] + r[2]);
  return grad ? 2.0 * forward : forward;
}

void registerRnnOps(OpRegistry &r) {
  for (const char *t : {"RNN", "GRU", "LSTM"}) {
    OpDef d = makeDef(t, 7, 1000, setupRecurrent);
    d.flops = [](const Op &op) { return recurrentFlops(op, false); };
    d.internalAttributes = {ir::internal_attr::kSavedBytes}; // the saved-state output's size (training)
    r.add(d);
  }
  for (const char *t : {"RNNGrad", "GRUGrad", "LSTMGrad"}) {
    OpDef d = makeDef(t, 1, 1000, setupRecurrentGrad);
    d.domain = "ai.graphcore";
    d.flops = [](const Op &op) { return recurrentFlops(op, true); };
    d.internalAttributes = {ir::internal_attr::kForward}; // the forward op's id
    r.add(d);
  }
}

} // namespace popart::ir
