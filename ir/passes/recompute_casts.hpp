#pragma once
// recomputeCasts: the 16-bit copy of a master weight (or of a graph input) is cast again for the
// backward pass instead of being held from the forward pass to the backward pass.

#include "ir/graph.hpp"

namespace popart::ir {

/// How recomputeCasts splits a Cast's readers (PassContext::state<RecomputeCastOptions>()).
struct RecomputeCastOptions {
  /// Readers with more than this many ops between them in the schedule are far apart: the later
  /// one starts a cluster of readers that reads a Cast of its own.
  int maxOpsBetweenReaders = 4;
  /// Split only where the copy would be held across the peak of the live tensors' bytes (as the
  /// schedule's producers and last readers estimate it, repeated as the peak moves): elsewhere it
  /// costs no arena memory, and a second Cast would only cost time. False: split wherever
  /// readers are far apart.
  bool onlyAcrossThePeak = true;
};

/// For each Cast whose input has no producer (a Variable such as a master weight, a graph input,
/// a constant: live for the whole step anyway), splits its op readers in schedule order into
/// clusters where two consecutive readers are more than \p options.maxOpsBetweenReaders ops
/// apart (and, with \p options.onlyAcrossThePeak, the copy is held across the peak), and gives
/// every cluster after the first a Cast of its own of the same input (same type, phase of the
/// cluster's first reader), which Graph::schedule() places just before that reader: the copy is
/// then live only around its readers. The new Cast reads the input before any op that updates
/// it in place, as the original does (the schedule's in-place edges). Casts whose output is
/// modified in place, or read by an op with subgraph captures, are left alone. Returns how many
/// Casts it added.
int recomputeCasts(Graph &graph, const RecomputeCastOptions &options = {});

} // namespace popart::ir
