#pragma once
// The profiler's outputs from a plan that ran with profiling on: a Chrome trace (one span per
// op run, for chrome://tracing or Perfetto) and a text summary per op and per op type.

#include "backend_cpu/plan.hpp"

#include <string>
#include <utility>
#include <vector>

namespace popart::session {

/// Writes the recorded spans of \p plan as a Chrome trace JSON file, atomically.
void writeChromeTrace(const backend_cpu::ExecutionPlan &plan, const std::string &path);

/// The per-op table (share of time, time per run, GFLOP/s, GB/s), the per-type table and the
/// memory report: the planned peak (the sum of \p memory) and its parts ({label, bytes}).
std::string profileSummary(const backend_cpu::ExecutionPlan &plan,
                           const std::vector<std::pair<std::string, int64_t>> &memory, size_t topOps = 25);

} // namespace popart::session
