#pragma once
/// \file Data-parallel training from popart-run (docs/distributed.md, "popart-run on many
/// processes"): joining the job that `mpirun -np N popart-run ...` started, and `--replicas N`,
/// which starts one on this host.

#include "cli/dataloader.hpp"

#include <memory>
#include <string>
#include <vector>

namespace popart {
struct SessionOptions;
namespace comm {
class Communicator;
} // namespace comm
} // namespace popart

namespace popart::cli {

/// What Open MPI's launcher tells the processes it starts, through their environment.
struct MpiEnvironment {
  /// OMPI_COMM_WORLD_SIZE: the processes of the job; 0 when mpirun did not start this one.
  int size = 0;
  /// OMPI_COMM_WORLD_RANK.
  int rank = 0;
  /// OMPI_COMM_WORLD_LOCAL_SIZE: the processes of the job on this host (0 if unknown).
  int localSize = 0;
  /// Whether mpirun started this process.
  bool underMpirun() const { return size > 0; }
};

/// Reads the MpiEnvironment of this process; throws naming a variable that is not a count.
MpiEnvironment mpiEnvironment();

/// This process's place among the replicas of a data-parallel run.
struct Replication {
  /// The replicas' communicator; null when the run is not replicated.
  std::shared_ptr<comm::Communicator> communicator;
  /// This replica's index and the number of replicas (the data loader's share).
  ReplicaSlice slice;

  /// Whether this process is one of several replicas (or was asked to be one).
  bool enabled() const { return communicator != nullptr; }
  /// Whether this process prints, writes --save and checkpoints: rank 0.
  bool leader() const { return slice.rank == 0; }
  /// Turns \p options into those of this replica (enableReplicatedGraphs, replicatedGraphCount,
  /// the communicator); leaves them as they are when not replicated.
  void apply(SessionOptions &options) const;
  /// \p local from every replica, rank after rank; \p local itself when not replicated. A
  /// collective: every replica must call it at the same point with as many values.
  std::vector<double> gather(const std::vector<double> &local) const;
};

/// Joins the replicas of the MPI job (MPI_COMM_WORLD), initialising MPI.
Replication joinReplicas();

/// Threads for each of \p ranksOnHost processes sharing \p cores cores: max(1, cores / ranks).
int threadsPerRank(int cores, int ranksOnHost);

/// The command line of `--replicas N`: \p mpirun with --oversubscribe (and --allow-run-as-root
/// when \p root), -np \p replicas, OMP_NUM_THREADS=\p threads exported, then \p self and \p args
/// without their --replicas flag, plus `--threads` \p threads when \p addThreadsFlag.
std::vector<std::string> replicasCommand(const std::string &mpirun, const std::string &self, int replicas,
                                         const std::vector<std::string> &args, int threads, bool addThreadsFlag,
                                         bool root);

/// The path of executable \p name on $PATH; "" if there is none.
std::string findOnPath(const std::string &name);

/// Replaces this process by `mpirun ... -np \p replicas <this program> <argv without --replicas>`.
/// \p threads is --threads as given (0: not given: OMP_NUM_THREADS if set, else the cores shared
/// out). Throws if mpirun is missing (naming the package openmpi-bin) or cannot be started. \p flag
/// is the flag that asked for the processes and \p what they are ("replicas", "pipeline stages").
[[noreturn]] void launchReplicas(int replicas, int threads, int argc, char **argv, const char *flag = "--replicas",
                                 const char *what = "replicas");

} // namespace popart::cli
