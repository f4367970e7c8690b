#pragma once
// What a session hands every kernel it creates: its settings and its per-session state, so that
// kernels keep no process-wide mutable state and read no environment variables.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace popart::comm {
class Communicator;
class Request;
} // namespace popart::comm

namespace popart::backend_cpu {

/// How the oneDNN MatMul kernel presents a large 2-D product of non-constant operands to oneDNN:
/// as stored, or with A or B first reordered into its other layout (row-major ↔ transposed, in
/// the kernel's scratch). oneDNN 2.6's AVX2 f32 gemm runs some shape and layout pairs at half
/// speed (weight gradients Xᵀ·dY with a long K), and takes a faster path for some when B is not
/// 64-byte aligned (ShiftedB: B copied 16 bytes off alignment; [256, 1024]·[1024, 1024] in 3.2 ms
/// instead of 5.8). Pointwise runs a product whose A is row-major (and whose B is one matrix) as
/// a 1×1 convolution over A's rows, which oneDNN's AVX2 jit_1x1 kernel runs 5-17% faster than its
/// gemm; it applies to MatMul and Gemm, with constant B too (packed once). Auto times the ways
/// that apply once per shape and configuration, on aligned buffers as in the plan, and keeps the
/// fastest if it gains 8% (Pointwise: 2%, as it needs no copy of A); the others force one (where
/// it applies), for tests and A/B runs. Swapped computes Yᵀ = Bᵀ·Aᵀ into the scratch and
/// transposes it into Y (SwappedCopy: with Bᵀ first copied row-major): the head's weight gradient
/// [8000, 2048]ᵀ·[2048, 256] runs as [256, 2048]·[2048, 8000] at 170 GFLOP/s, not 140.
/// FlippedPointwise copies a transposed A row-major, then runs Pointwise (weight gradients).
/// Unpermuted copies the operands a MatMul reads through Fusion::permA/B (attention's head
/// split) into plain layouts and writes a Fusion::permY result through a plain buffer: as fast
/// on AVX2's gemm as the strided product, but oneDNN's AVX-512 brgemm ran strided heads 50-70%
/// slower, so the tuning decides.
enum class MatMulOperands {
  Auto,
  AsStored,
  FlippedA,
  FlippedB,
  ShiftedB,
  Pointwise,
  Swapped,
  SwappedCopy,
  FlippedPointwise,
  Unpermuted
};

/// The way SessionOptions::matmulTuning names: "auto" or "1" Auto, "0" AsStored; "a", "b", "s",
/// "p", "t", "tc", "ap", "u" force FlippedA, FlippedB, ShiftedB, Pointwise, Swapped, SwappedCopy,
/// FlippedPointwise, Unpermuted. Throws naming the value otherwise.
MatMulOperands parseMatMulTuning(const std::string &mode);
/// The name of \p way ("AsStored", "FlippedA"...), as checkpoints record it.
const char *matMulOperandsName(MatMulOperands way);
/// The way named \p name by matMulOperandsName; throws naming it if none is.
MatMulOperands matMulOperandsNamed(const std::string &name);

/// The ways that Auto chose by timing, per MatMul or Gemm configuration (shapes, layouts, fused
/// parts: the key), in one session. The timing runs once per configuration; a session resumed
/// from a checkpoint is given the recorded ways (preset) so that it computes the same bits.
class MatMulTuningCache {
public:
  /// The way recorded for \p key, or \p decide()'s, then recorded.
  MatMulOperands choose(const std::string &key, const std::function<MatMulOperands()> &decide);
  /// Every recorded way.
  std::map<std::string, MatMulOperands> entries() const;
  /// Records \p ways, replacing those of the same keys: compiles take them without timing.
  void preset(const std::map<std::string, MatMulOperands> &ways);

private:
  mutable std::mutex mutex_;
  std::map<std::string, MatMulOperands> chosen_;
};

/// The collectives of a plan that are in flight between kernels (AllReduceStart to AllReduceWait),
/// and, while profiling, the span of every collective from its start to its completion as this
/// rank observes it. Communication advances only when a request is tested or waited for, so the
/// plan calls progress() between kernels. Slots are made when kernels are created; running
/// allocates nothing here.
class CollectiveRequests {
public:
  /// One collective's observed lifetime (ns since enableSpans's origin).
  struct Span {
    int id;
    int64_t startNs;
    int64_t durationNs;
  };
  CollectiveRequests();
  ~CollectiveRequests();
  CollectiveRequests(const CollectiveRequests &) = delete;
  CollectiveRequests &operator=(const CollectiveRequests &) = delete;

  /// A slot for the collective of the kernel named \p label; \returns its id.
  int add(std::string label);
  /// \p id's collective started on \p buffer, in flight as \p request (moved in).
  void start(int id, const void *buffer, comm::Request &&request);
  /// Blocks until the collective in flight on \p buffer completes; throws naming \p waiter if
  /// none is (the plan ran a wait without its start).
  void wait(const void *buffer, const std::string &waiter);
  /// Advances the collectives in flight; a load and a branch when there are none.
  void progress() {
    if (inFlight_ > 0) advance();
  }
  /// Whether any collective is in flight and not yet seen complete.
  bool inFlight() const { return inFlight_ > 0; }
  /// Records \p id's span of a blocking collective that ran from \p startNs to \p endNs
  /// (steady_clock ns), if spans are on.
  void recordSpan(int id, int64_t startNs, int64_t endNs);
  /// Records spans from now on, up to \p maxSpans (reserved now), relative to \p originNs.
  void enableSpans(int64_t originNs, size_t maxSpans);
  const std::vector<Span> &spans() const { return spans_; }
  /// The label \p id was added with.
  const std::string &label(int id) const;
  /// steady_clock now, in ns: the clock of every span.
  static int64_t nowNs();

private:
  void advance();
  struct Slot;
  std::vector<std::unique_ptr<Slot>> slots_;
  int inFlight_ = 0;
  bool spansOn_ = false;
  int64_t originNs_ = 0;
  std::vector<Span> spans_;
};

/// Settings and state of the session that creates a kernel. Kernels read it while they are
/// created and keep no reference to it (collective kernels keep a share of its communicator).
struct KernelContext {
  /// Threads the session runs kernels on (its SessionOptions::numThreads, resolved).
  int threads = 1;
  /// SessionOptions::matmulTuning: Auto times the ways of large products, others force one.
  MatMulOperands matmulOperands = MatMulOperands::Auto;
  /// SessionOptions::convPoolChunk: images per chunk of a Conv with a fused MaxPool (0: sized to
  /// about 512 KiB of convolution result).
  int64_t convPoolChunk = 0;
  /// Ways Auto chose, shared by the session's compiles; null: timed for each kernel, not kept.
  std::shared_ptr<MatMulTuningCache> matmulTuning;
  /// SessionOptions::randomSeed: the seed of random kernels that have none of their own (mixed
  /// with each op's salt, so that two such ops differ); -1 draws one from the system per kernel.
  int64_t randomSeed = -1;
  /// The replicas' group that collective ops (AllReduce...) run over; null without replication,
  /// and a collective kernel then refuses to be created.
  std::shared_ptr<comm::Communicator> communicator;
  /// The collectives in flight between the kernels of the session's plans; the plan polls them.
  std::shared_ptr<CollectiveRequests> collectives = std::make_shared<CollectiveRequests>();
};

} // namespace popart::backend_cpu
