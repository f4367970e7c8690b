#pragma once
// Recurrent ops (LSTM, GRU, RNN): the saved state that links a forward op to its grad op.

#include "ir/graph.hpp"

#include <functional>

namespace popart::ir {

/// Index of the saved-state output of forward op \p op (after Y_c for LSTM, Y_h otherwise).
size_t recurrentSavedOutput(const Op &op);

/// Gives each LSTM, GRU or RNN op whose grad op (attribute popart_forward) has no saved state
/// an output of \p savedBytes(op) bytes that the grad op reads as input 9, so that a kernel
/// pair can pass what the forward keeps (oneDNN's workspace) instead of recomputing it; ops
/// for which \p savedBytes gives 0 are left alone. Returns how many ops got one.
int saveRecurrentState(Graph &graph, const std::function<int64_t(const Op &)> &savedBytes);

} // namespace popart::ir
