// saveRecurrentState as a pass (the transform lives with the recurrent ops, ir/ops/rnn.cpp): the
// backend says how many bytes each forward op keeps for its grad op.

#include "ir/ops/rnn.hpp"
#include "ir/passes/pass_manager.hpp"

namespace popart::ir {

void registerRecurrentStatePasses(PassRegistry &r) {
  r.add(optionalPass("saveRecurrentState",
                     "LSTM, GRU and RNN keep oneDNN's workspace for their grad ops instead of recomputing the forward",
                     OutputsFixed | GradientsBuilt, [](Graph &g, PassContext &c) {
                       return c.recurrentSavedBytes ? saveRecurrentState(g, c.recurrentSavedBytes) : 0;
                     }));
}

} // namespace popart::ir
