// popart-run as one replica of an MPI job, and --replicas N re-executing it under mpirun.

#include "cli/replication.hpp"

#include "comm/mpi_communicator.hpp"

#include <popart/error.hpp>
#include <popart/sessionoptions.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <unistd.h>

namespace popart::cli {

namespace {

/// Environment variable \p name as a count; \p fallback when unset.
int environmentCount(const char *name, int fallback) {
  const char *text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char *end = nullptr;
  errno = 0;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || errno != 0 || value < 0 || value > 1 << 24)
    throw error("environment variable ", name, "='", text, "' is not a count");
  return static_cast<int>(value);
}

} // namespace

MpiEnvironment mpiEnvironment() {
  MpiEnvironment env;
  env.size = environmentCount("OMPI_COMM_WORLD_SIZE", 0);
  env.rank = environmentCount("OMPI_COMM_WORLD_RANK", 0);
  env.localSize = environmentCount("OMPI_COMM_WORLD_LOCAL_SIZE", 0);
  if (env.underMpirun() && env.rank >= env.size)
    throw error("OMPI_COMM_WORLD_RANK is ", env.rank, " but OMPI_COMM_WORLD_SIZE is ", env.size);
  return env;
}

void Replication::apply(SessionOptions &options) const {
  if (!enabled()) return;
  options.enableReplicatedGraphs = true;
  options.replicatedGraphCount = slice.replicas;
  options.communicator = communicator;
}

std::vector<double> Replication::gather(const std::vector<double> &local) const {
  if (!enabled()) return local;
  std::vector<double> all(local.size() * static_cast<size_t>(slice.replicas));
  communicator->allGather(local.data(), all.data(), static_cast<int64_t>(local.size()), DataType::DOUBLE);
  return all;
}

Replication joinReplicas() {
  Replication r;
  r.communicator = std::make_shared<comm::MpiCommunicator>();
  r.slice.replicas = r.communicator->size();
  r.slice.rank = r.communicator->rank();
  return r;
}

int threadsPerRank(int cores, int ranksOnHost) { return std::max(1, cores / std::max(1, ranksOnHost)); }

std::vector<std::string> replicasCommand(const std::string &mpirun, const std::string &self, int replicas,
                                         const std::vector<std::string> &args, int threads, bool addThreadsFlag,
                                         bool root) {
  // Oversubscribed: more replicas than cores must still start (a test of 4 ranks on 2 cores).
  // Not bound: Open MPI binds each of 2 ranks to one core by default, which would pin all of a
  // rank's threads there.
  std::vector<std::string> cmd = {mpirun, "--oversubscribe", "--bind-to", "none"};
  if (root) cmd.emplace_back("--allow-run-as-root");
  cmd.insert(cmd.end(), {"-np", std::to_string(replicas), "-x", "OMP_NUM_THREADS=" + std::to_string(threads), self});
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--replicas") {
      ++i; // and its value
      continue;
    }
    if (args[i].rfind("--replicas=", 0) == 0) continue;
    cmd.push_back(args[i]);
  }
  if (addThreadsFlag) {
    cmd.emplace_back("--threads");
    cmd.push_back(std::to_string(threads));
  }
  return cmd;
}

std::string findOnPath(const std::string &name) {
  const char *path = std::getenv("PATH");
  if (path == nullptr) return "";
  std::string dirs = path;
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::filesystem::path candidate =
        std::filesystem::path(start == end ? "." : dirs.substr(start, end - start)) / name;
    if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate)) return candidate.string();
    start = end + 1;
  }
  return "";
}

void launchReplicas(int replicas, int threads, int argc, char **argv, const char *flag, const char *what) {
  const std::string mpirun = findOnPath("mpirun");
  if (mpirun.empty())
    throw error(flag, " ", replicas, " starts the ", what,
                " with mpirun (Open MPI), which is not on PATH: install the package openmpi-bin "
                "(scripts/install-deps.sh), or start them yourself with mpirun -np ",
                replicas, " popart-run ...");
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec || self.empty()) self = argv[0];
  bool addThreadsFlag = false;
  if (threads <= 0) {
    // The session sets its thread count itself, so OMP_NUM_THREADS reaches it through --threads.
    threads = std::getenv("OMP_NUM_THREADS") ? environmentCount("OMP_NUM_THREADS", 0) : 0;
    if (threads <= 0) threads = threadsPerRank(static_cast<int>(std::thread::hardware_concurrency()), replicas);
    addThreadsFlag = true;
  }
  std::vector<std::string> cmd =
      replicasCommand(mpirun, self, replicas, std::vector<std::string>(argv + 1, argv + argc), threads, addThreadsFlag,
                      ::geteuid() == 0);
  std::string shown;
  for (const auto &a : cmd)
    shown += (shown.empty() ? "" : " ") + a;
  std::printf("popart-run: starting %d %s: %s\n", replicas, what, shown.c_str());
  std::fflush(stdout);
  std::vector<char *> execArgs;
  execArgs.reserve(cmd.size() + 1);
  for (auto &a : cmd)
    execArgs.push_back(a.data());
  execArgs.push_back(nullptr);
  ::execv(mpirun.c_str(), execArgs.data());
  throw error(flag, ": cannot start '", mpirun, "': ", std::strerror(errno));
}

} // namespace popart::cli
