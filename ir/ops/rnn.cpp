// Recurrent ops: RNN, GRU, LSTM (opsets 7-17, layout attribute from 14).

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

int64_t gateCount(const std::string &type) { return type == "LSTM" ? 4 : type == "GRU" ? 3 : 1; }

void setupRecurrent(Op &op) {
  requireInputCount(op, 3, op.type == "LSTM" ? 8 : 6);
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
  int64_t gates = gateCount(op.type);
  if (w[0] != dirs || w[1] != gates * hidden || w[2] != x[2])
    throw error(op.debugName(), ": W has shape ", toString(w), ", expected [", dirs, ",", gates * hidden, ",", x[2],
                "]");
  if (r[0] != dirs || r[1] != gates * hidden || r[2] != hidden)
    throw error(op.debugName(), ": R has shape ", toString(r), ", expected [", dirs, ",", gates * hidden, ",", hidden,
                "]");
  DataType t = op.inInfo(0).dataType();
  op.setOutInfo(0, TensorInfo(t, batchFirst ? Shape{batch, seq, dirs, hidden} : Shape{seq, dirs, batch, hidden}));
  Shape state = batchFirst ? Shape{batch, dirs, hidden} : Shape{dirs, batch, hidden};
  op.setOutInfo(1, TensorInfo(t, state));
  if (op.type == "LSTM") op.setOutInfo(2, TensorInfo(t, state));
}

} // namespace

void registerRnnOps(OpRegistry &r) {
  for (const char *t : {"RNN", "GRU", "LSTM"})
    r.add(makeDef(t, 7, 1000, setupRecurrent));
}

} // namespace popart::ir
