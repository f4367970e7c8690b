#pragma once
// The profiler's outputs from a plan that ran with profiling on: a Chrome trace (one span per
// op run, for chrome://tracing or Perfetto), a text summary per op and per op type, and the
// compile time of each pass.

#include "backend_cpu/plan.hpp"
#include "ir/passes/pass_manager.hpp"

#include <string>
#include <utility>
#include <vector>

namespace popart::session {

/// \p bytes as "12.34 MB" (10^6 bytes), as the memory report prints sizes.
std::string megabytes(int64_t bytes);

/// Writes the recorded spans of \p plan as a Chrome trace JSON file, atomically.
void writeChromeTrace(const backend_cpu::ExecutionPlan &plan, const std::string &path);

/// The per-op table (share of time, time per run, GFLOP/s, GB/s), the per-type table and the
/// memory report: the planned peak (the sum of \p memory) and its parts ({label, bytes}), then
/// what is live at the arena's peak (arenaPeak).
std::string profileSummary(const backend_cpu::ExecutionPlan &plan,
                           const std::vector<std::pair<std::string, int64_t>> &memory, size_t topOps = 25);

/// What is live at the arena's peak (MemoryPlan::peakLive): the step, then the \p topBlocks
/// largest tensors and scratch blocks with their type, shape, bytes and lifetime, and the sum of
/// the rest. Part of profileSummary's memory report; needs no profile.
std::string arenaPeak(const backend_cpu::ExecutionPlan &plan, size_t topBlocks = 10);

/// The wall time and rewrites of each pass of the last compile, a line each.
std::string passTimes(const std::vector<ir::PassRecord> &records);

} // namespace popart::session
