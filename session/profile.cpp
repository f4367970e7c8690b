#include "session/profile.hpp"
#include <popart/error.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

namespace popart::session {

namespace {

/// Collectives hand their buffers to the communicator and compute nothing: their kernel column
/// says so rather than naming the reference provider their kernels are registered under.
bool isCollective(const std::string &type) {
  return type == "ai.graphcore.AllReduce" || type == "ai.graphcore.ReduceScatter" || type == "ai.graphcore.AllGather" ||
         type == "ai.graphcore.AllReduceStart" || type == "ai.graphcore.AllReduceWait";
}

/// Time spent blocked on communication: in the waits of bucketed all-reduces and in the
/// blocking collectives (their whole run, as they block until the ranks have exchanged).
bool isCommunicationWait(const std::string &type) {
  return isCollective(type) && type != "ai.graphcore.AllReduceStart";
}

const char *kernelLabel(const backend_cpu::ExecutionPlan &plan, size_t step) {
  return isCollective(plan.stepInfos()[step].type) ? "comm"
                                                   : backend_cpu::kernelProviderName(plan.stepProviders()[step]);
}

} // namespace

std::string megabytes(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

void writeChromeTrace(const backend_cpu::ExecutionPlan &plan, const std::string &path) {
  if (!plan.profiling()) throw error("no profile recorded: profiling was not enabled before running");
  const auto &infos = plan.stepInfos();
  nlohmann::json events = nlohmann::json::array();
  for (const auto &e : plan.profileEvents()) {
    const auto &info = infos[e.step];
    events.push_back({{"name", info.name},
                      {"cat", info.type},
                      {"ph", "X"},
                      {"ts", static_cast<double>(e.startNs) / 1e3},
                      {"dur", static_cast<double>(e.durationNs) / 1e3},
                      {"pid", 1},
                      {"tid", 1},
                      {"args",
                       {{"provider", kernelLabel(plan, e.step)},
                        {"phase", info.phase},
                        {"flops", info.flops},
                        {"bytes", info.bytes}}}});
  }
  // With collectives, a second track: each collective from its start to the moment this rank saw
  // it complete, overlapping the kernels that ran meanwhile. After the ops' spans, so that a trace
  // without communication is unchanged.
  const backend_cpu::CollectiveRequests *collectives = plan.collectives();
  if (collectives && !collectives->spans().empty()) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", 1}, {"args", {{"name", "ops"}}}});
    events.push_back(
        {{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", 2}, {"args", {{"name", "communication"}}}});
    for (const auto &span : collectives->spans())
      events.push_back({{"name", collectives->label(span.id)},
                        {"cat", "communication"},
                        {"ph", "X"},
                        {"ts", static_cast<double>(span.startNs) / 1e3},
                        {"dur", static_cast<double>(span.durationNs) / 1e3},
                        {"pid", 1},
                        {"tid", 2}});
  }
  nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw error("cannot write profile trace '", tmp, "'");
    out << trace.dump();
    if (!out.flush()) throw error("writing profile trace '", tmp, "' failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw error("cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

std::string profileSummary(const backend_cpu::ExecutionPlan &plan,
                           const std::vector<std::pair<std::string, int64_t>> &memory, size_t topOps) {
  if (!plan.profiling()) throw error("no profile recorded: profiling was not enabled before running");
  const auto &infos = plan.stepInfos();
  const auto &times = plan.stepTimes();
  int64_t totalNs = 0, runs = 0;
  for (const auto &[ns, count] : times) {
    totalNs += ns;
    runs = std::max(runs, count);
  }
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "profile: %zu ops, up to %lld runs each, %.3f ms in ops\n", infos.size(),
                static_cast<long long>(runs), static_cast<double>(totalNs) / 1e6);
  s += line;
  auto rates = [](double ns, double flops, double bytes, int64_t count, char *out, size_t n) {
    double sec = ns / 1e9;
    std::snprintf(out, n, "%9.3f ms %9.2f %8.2f", count ? ns / 1e6 / double(count) : 0.0,
                  sec > 0 ? flops * double(count) / sec / 1e9 : 0.0, sec > 0 ? bytes * double(count) / sec / 1e9 : 0.0);
  };
  std::vector<size_t> order(infos.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return times[a].first > times[b].first; });
  s += "  share     per run    GFLOP/s     GB/s  kernel     op\n";
  for (size_t k = 0; k < order.size() && k < topOps; ++k) {
    size_t i = order[k];
    char r[96];
    rates(double(times[i].first), infos[i].flops, double(infos[i].bytes), times[i].second, r, sizeof r);
    std::snprintf(line, sizeof line, "  %5.1f%% %s  %-9s  %s\n",
                  totalNs ? 100.0 * double(times[i].first) / double(totalNs) : 0.0, r, kernelLabel(plan, i),
                  infos[i].name.c_str());
    s += line;
  }
  if (order.size() > topOps) s += "  ... " + std::to_string(order.size() - topOps) + " more ops\n";
  struct Agg {
    int64_t ns = 0;
    double flops = 0, bytes = 0;
    int ops = 0;
  };
  std::map<std::string, Agg> byType;
  for (size_t i = 0; i < infos.size(); ++i) {
    Agg &a = byType[infos[i].type];
    a.ns += times[i].first;
    a.flops += infos[i].flops * double(times[i].second);
    a.bytes += double(infos[i].bytes) * double(times[i].second);
    a.ops += 1;
  }
  std::vector<std::pair<std::string, Agg>> types(byType.begin(), byType.end());
  std::sort(types.begin(), types.end(), [](const auto &a, const auto &b) { return a.second.ns > b.second.ns; });
  s += "by op type:\n  share      total    GFLOP/s     GB/s  ops  type\n";
  for (const auto &[type, a] : types) {
    double sec = double(a.ns) / 1e9;
    std::snprintf(line, sizeof line, "  %5.1f%% %9.3f ms %9.2f %8.2f %4d  %s\n",
                  totalNs ? 100.0 * double(a.ns) / double(totalNs) : 0.0, double(a.ns) / 1e6,
                  sec > 0 ? a.flops / sec / 1e9 : 0.0, sec > 0 ? a.bytes / sec / 1e9 : 0.0, a.ops, type.c_str());
    s += line;
  }
  // Reference code in production: the op types whose plain-loop kernels ran, by time.
  std::map<std::string, int64_t> referenceNs;
  int64_t referenceTotal = 0;
  for (size_t i = 0; i < infos.size(); ++i)
    if (plan.stepProviders()[i] == backend_cpu::KernelProvider::Reference && !isCollective(infos[i].type)) {
      referenceNs[infos[i].type] += times[i].first;
      referenceTotal += times[i].first;
    }
  std::vector<std::pair<std::string, int64_t>> reference(referenceNs.begin(), referenceNs.end());
  std::sort(reference.begin(), reference.end(), [](const auto &a, const auto &b) { return a.second > b.second; });
  std::snprintf(line, sizeof line, "reference kernels: %.1f%% of op time",
                totalNs ? 100.0 * double(referenceTotal) / double(totalNs) : 0.0);
  s += line;
  for (size_t k = 0; k < reference.size(); ++k) {
    std::snprintf(line, sizeof line, "%s%s %.1f%%", k ? ", " : " (", reference[k].first.c_str(),
                  totalNs ? 100.0 * double(reference[k].second) / double(totalNs) : 0.0);
    s += line;
  }
  s += reference.empty() ? "\n" : ")\n";
  int64_t waitNs = 0, startNs = 0;
  bool anyCollective = false;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (isCommunicationWait(infos[i].type)) waitNs += times[i].first;
    if (infos[i].type == "ai.graphcore.AllReduceStart") startNs += times[i].first;
    anyCollective = anyCollective || isCollective(infos[i].type);
  }
  if (anyCollective) {
    int64_t spanNs = 0;
    size_t spans = 0;
    if (const backend_cpu::CollectiveRequests *collectives = plan.collectives()) {
      spans = collectives->spans().size();
      for (const auto &span : collectives->spans())
        spanNs += span.durationNs;
    }
    std::snprintf(line, sizeof line,
                  "communication: waiting %.1f%% of op time (%.3f ms in AllReduceWait and blocking collectives, "
                  "%.3f ms packing and starting buckets); %zu collective spans, %.3f ms in flight\n",
                  totalNs ? 100.0 * double(waitNs) / double(totalNs) : 0.0, double(waitNs) / 1e6, double(startNs) / 1e6,
                  spans, double(spanNs) / 1e6);
    s += line;
  }
  int64_t total = 0;
  for (const auto &part : memory)
    total += part.second;
  s += "memory: planned peak " + megabytes(total) + ":";
  for (size_t i = 0; i < memory.size(); ++i)
    s += (i ? "; " : " ") + memory[i].first + " " + megabytes(memory[i].second);
  s += "\n";
  s += arenaPeak(plan);
  return s;
}

std::string arenaPeak(const backend_cpu::ExecutionPlan &plan, size_t topBlocks) {
  const backend_cpu::MemoryPlan &mp = plan.memoryPlan();
  if (mp.peakLive.empty()) return "arena peak: nothing planned\n";
  const auto &names = plan.stepNames();
  auto stepName = [&](size_t step) { return step < names.size() ? names[step] : std::string("the end"); };
  std::string s = "arena peak: " + megabytes(mp.peakLiveBytes) + " live at step " + std::to_string(mp.peakStep) + " (" +
                  stepName(mp.peakStep) + ") of the " + megabytes(mp.arenaBytes) +
                  " arena (the rest: gaps between lifetimes); largest:\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %10s  %-8s  %-18s  %-11s  %s\n", "bytes", "type", "shape", "live steps",
                "tensor");
  s += line;
  int64_t restBytes = 0;
  for (size_t k = 0; k < mp.peakLive.size(); ++k) {
    const backend_cpu::LiveBlock &b = mp.peakLive[k];
    if (k >= topBlocks) {
      restBytes += b.bytes;
      continue;
    }
    std::string type = "-", shape = "-", what;
    if (b.scratchStep >= 0) {
      what = "scratch of " + stepName(static_cast<size_t>(b.scratchStep));
    } else {
      const TensorInfo &info = plan.info(b.id);
      type = toString(info.dataType());
      shape = toString(info.shape());
      what = b.id + (b.pinned ? " (graph input or output)" : "");
    }
    std::string steps = b.pinned ? "all" : std::to_string(b.first) + "-" + std::to_string(b.last);
    std::snprintf(line, sizeof line, "  %10s  %-8s  %-18s  %-11s  %s\n", megabytes(b.bytes).c_str(), type.c_str(),
                  shape.c_str(), steps.c_str(), what.c_str());
    s += line;
  }
  if (mp.peakLive.size() > topBlocks)
    s += "  " + megabytes(restBytes) + " in " + std::to_string(mp.peakLive.size() - topBlocks) + " more\n";
  return s;
}

std::string passTimes(const std::vector<ir::PassRecord> &records) {
  double total = 0;
  for (const auto &r : records)
    total += r.milliseconds;
  char line[256];
  std::snprintf(line, sizeof line, "compile time per pass (%.3f ms in all):\n", total);
  std::string s = line;
  for (const auto &r : records) {
    if (r.skipped)
      std::snprintf(line, sizeof line, "  %10s  %s (disabled)\n", "-", r.name.c_str());
    else
      std::snprintf(line, sizeof line, "  %7.3f ms  %s (%d rewrites)\n", r.milliseconds, r.name.c_str(), r.rewrites);
    s += line;
  }
  return s;
}

} // namespace popart::session
