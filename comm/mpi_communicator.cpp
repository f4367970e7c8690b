#include "comm/mpi_communicator.hpp"

#include "core/half.hpp"

#include <popart/error.hpp>

#include <cpuid.h>
#include <immintrin.h>
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace popart::comm {

namespace {

// The MPI standard guarantees tags up to 32767; each collective gets its own, so that the
// messages of operations in flight together never match each other's receives.
constexpr uint64_t kTagCount = 32768;

std::string mpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

struct MpiFinaliser {
  ~MpiFinaliser() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_Finalize();
  }
};

} // namespace

bool ensureMpiInitialised() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (finalised) throw error("popart::comm: MPI has been finalised already; a communicator cannot start it again");
  if (initialised) return false;
  // SERIALIZED, not FUNNELED: a later progress thread may drive the requests while the main
  // thread computes, one thread at a time.
  int provided = 0;
  int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  if (code != MPI_SUCCESS) throw error("popart::comm: MPI_Init_thread failed: ", mpiErrorText(code));
  // Errors during start-up of other collectives come back as codes from here on, not aborts.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  static MpiFinaliser finaliser;
  return true;
}

/// A scratch buffer, uninitialised: the ring writes every byte before reading it.
struct Scratch {
  std::unique_ptr<std::byte[]> data;
  size_t capacity = 0;
};

struct MpiCommunicator::State {
  /// The collectives' communicator: every tag belongs to the ring operations.
  MPI_Comm comm = MPI_COMM_NULL;
  /// A duplicate of `comm` for point-to-point messages, whose tags are the caller's: a send can
  /// then never match a ring step's receive, whatever its tag.
  MPI_Comm p2p = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  uint64_t started = 0;
  /// Counts ring steps and operations completed, so that a wait can tell data moving from a wait
  /// for a rank that is still computing.
  uint64_t progress = 0;
  /// The first failure; once set, the ranks no longer agree on what was exchanged.
  std::string failure;
  /// Buffers of abandoned operations, which MPI may still write into or read from.
  std::vector<Scratch> abandoned;
  /// Scratch buffers of completed operations. Training all-reduces the same buckets every step,
  /// so after the first step the collectives allocate nothing (fresh pages cost more than the
  /// copies: a 16 MB FLOAT16 all-reduce on one rank took 89 ms with a new buffer per call).
  std::vector<Scratch> pool;
  /// The operations started and not yet finished, so that waiting for one advances them all.
  std::vector<PendingOperation *> inFlight;
  /// `inFlight` as it was when the running test() began (see `MpiOperation::test`).
  std::vector<PendingOperation *> stepping;

  /// A buffer of at least \p bytes: the smallest pooled one that fits, else a new one.
  Scratch take(size_t bytes) {
    if (bytes == 0) return {};
    auto best = pool.end();
    for (auto it = pool.begin(); it != pool.end(); ++it)
      if (it->capacity >= bytes && (best == pool.end() || it->capacity < best->capacity)) best = it;
    if (best == pool.end()) return Scratch{std::unique_ptr<std::byte[]>(new std::byte[bytes]), bytes};
    Scratch found = std::move(*best);
    pool.erase(best);
    return found;
  }

  /// Returns \p scratch to the pool, which keeps the largest few buffers.
  void give(Scratch scratch) {
    constexpr size_t kPoolSize = 8;
    if (!scratch.data) return;
    pool.push_back(std::move(scratch));
    if (pool.size() > kPoolSize) {
      auto smallest = std::min_element(pool.begin(), pool.end(),
                                       [](const Scratch &a, const Scratch &b) { return a.capacity < b.capacity; });
      pool.erase(smallest);
    }
  }

  ~State() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    // After a failure, other ranks may still send messages of the abandoned operations. Freed,
    // the communicator's context id could be reused by a new communicator that would then match
    // them (Open MPI 4.1.4 crashed so in mca_pml_ob1_add_comm in our tests): so a failed communicator is kept.
    if (!finalised && failure.empty()) {
      if (p2p != MPI_COMM_NULL) MPI_Comm_free(&p2p);
      if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    }
  }

  std::string where() const { return "rank " + std::to_string(rank) + " of " + std::to_string(size); }

  /// Throws a `popart::error` naming \p call, this rank and \p context if \p code is not success.
  void check(int code, const char *call, const std::string &context) const {
    if (code == MPI_SUCCESS) return;
    int errorClass = 0;
    MPI_Error_class(code, &errorClass);
    std::string hint = errorClass == MPI_ERR_TRUNCATE ? " (the ranks called it with different counts or types?)" : "";
    throw error("popart::comm: ", call, " failed on ", where(), " in ", context, ": ", mpiErrorText(code), hint);
  }

  void refuseIfFailed(const char *what) const {
    if (!failure.empty())
      throw error("popart::comm: ", what, " on ", where(), " refused: this communicator failed earlier (", failure,
                  ")");
  }
};

namespace {

using State = MpiCommunicator::State;

/// What every MPI operation shares: the wait with its timeout, and the failure bookkeeping.
class MpiOperation : public PendingOperation {
public:
  MpiOperation(std::shared_ptr<State> state, std::string description)
      : state_(std::move(state)), description_(std::move(description)) {
    state_->inFlight.push_back(this);
  }
  ~MpiOperation() override { leaveInFlight(); }
  MpiOperation(const MpiOperation &) = delete;
  MpiOperation &operator=(const MpiOperation &) = delete;

  // A ring step is posted only when its rank tests the operation: were only the tested request
  // advanced, two ranks waiting for two requests in different orders would each wait for a step
  // the other never posts.
  bool test() override {
    // A copy, since stepping an operation may finish it; into a kept vector, so that polling
    // allocates nothing. Stepping never calls test(), so nothing else uses the copy meanwhile.
    auto &others = state_->stepping;
    others.assign(state_->inFlight.begin(), state_->inFlight.end());
    for (PendingOperation *other : others) {
      if (other == this) continue;
      try {
        static_cast<MpiOperation *>(other)->step();
      } catch (const std::exception &) {
        // Recorded in that operation; its own test or wait throws it.
      }
    }
    return step();
  }

  /// Advances this operation alone; \returns true once complete, throws its failure.
  bool step() {
    if (status_ == Status::Done) return true;
    if (status_ == Status::Failed) throw error(message_);
    try {
      if (advance()) {
        ++state_->progress;
        status_ = Status::Done;
        leaveInFlight();
      }
    } catch (const std::exception &e) {
      fail(e.what());
    }
    return status_ == Status::Done;
  }

  /// The operation, for error messages; built when needed, so that starting one formats nothing.
  virtual std::string description() const { return description_; }

  /// \returns true if this is a receive from \p peer with \p tag that has not matched a message yet.
  virtual bool awaitsMessage(int /*peer*/, int /*tag*/) const { return false; }

  void wait() override {
    using Clock = std::chrono::steady_clock;
    using std::chrono::microseconds;
    // Polling burns a core that, with ranks oversubscribed (4 ranks on 2 cores) or other jobs on
    // the host, a rank still computing its backward needs: the waiting rank then slows the very
    // rank it waits for. Polling with sched_yield for 100 ms, a rank waiting 200 ms for a late one
    // used 32-36% of that in CPU time on a loaded machine; with this loop 3-7%
    // (docs/distributed.md, "How a rank waits").
    // So: poll without pause only while data moves (a ring step or operation completed within
    // the last 50 us: the next step's handshake follows within microseconds on shared memory),
    // then yield for up to 1 ms (a rank a little behind, or a core shared), then sleep, starting
    // at 10 us and doubling up to 200 us. The cap bounds what a late wake-up adds to the wait
    // (with the kernel's default 50 us timer slack, about 0.25 ms, ~1% of the MLP's step); a
    // waiting rank then uses a few percent of a core (comm_wait_mpi tests).
    constexpr microseconds spinFor{50}, yieldFor{1000}, firstNap{10}, longestNap{200};
    auto start = Clock::now(), quietSince = start;
    uint64_t seen = state_->progress;
    microseconds nap = firstNap;
    while (!test()) {
      auto now = Clock::now();
      if (state_->timeout.count() > 0 && now - start >= state_->timeout) {
        fail("popart::comm: " + description() + " on " + state_->where() + " timed out after " +
             std::to_string(state_->timeout.count()) + " ms waiting for " + waitingFor() +
             "; that rank may have died, hung or called a different collective");
      }
      if (state_->progress != seen) {
        seen = state_->progress;
        quietSince = now;
        nap = firstNap;
      }
      auto quiet = now - quietSince;
      if (quiet < spinFor) continue;
      if (quiet < yieldFor) {
        sched_yield();
        continue;
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, longestNap);
    }
  }

  bool finished() const override { return status_ != Status::Running; }

protected:
  /// Makes progress without blocking; \returns true once complete. Throws on an MPI error.
  virtual bool advance() = 0;
  /// The ranks this operation waits for, for the timeout's message.
  virtual std::string waitingFor() const = 0;
  /// Lets go of the MPI requests in flight after a failure, keeping alive what MPI may still use.
  virtual void abandon() = 0;

  std::shared_ptr<State> state_;
  std::string description_;

  /// Runs \p start, turning what it throws into this operation's failure, so that nothing is left
  /// posted into buffers that are about to be freed.
  template <typename F> void guarded(F start) {
    try {
      start();
    } catch (const std::exception &e) {
      fail(e.what());
    }
  }

  [[noreturn]] void fail(const std::string &message) {
    status_ = Status::Failed;
    message_ = message;
    if (state_->failure.empty()) state_->failure = message;
    abandon();
    leaveInFlight();
    throw error(message_);
  }

private:
  void leaveInFlight() {
    auto &all = state_->inFlight;
    all.erase(std::remove(all.begin(), all.end(), static_cast<PendingOperation *>(this)), all.end());
  }

  enum class Status { Running, Done, Failed };
  Status status_ = Status::Running;
  std::string message_;
};

/// The element type that travels and is combined: fp32 for the 16-bit floats, so that they are
/// rounded once, at the end, rather than at each hop.
size_t wireSize(DataType type) {
  switch (type) {
  case DataType::FLOAT:
  case DataType::FLOAT16:
  case DataType::BFLOAT16: return 4;
  case DataType::INT64: return 8;
  case DataType::BOOL: return 1;
  default: return dataTypeSize(type);
  }
}

/// Whether the CPU has F16C (cpuid leaf 1: ecx bit 29, and AVX for the 256-bit registers).
bool hasF16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0 && (c & bit_AVX) != 0;
  }();
  return has;
}

// The F16C conversions round as core/half.hpp does (to nearest even, overflow to infinity) but
// treat NaNs differently (they quieten signalling ones): blocks holding a NaN are converted by
// the scalar code, so that the bits never depend on the CPU.
__attribute__((target("avx,f16c"))) void halfToFloatF16c(const uint16_t *in, float *out, size_t n) {
  size_t i = 0;
  const __m128i magnitude = _mm_set1_epi16(0x7fff), infinity = _mm_set1_epi16(0x7c00);
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(in + i));
    if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, magnitude), infinity)) != 0) {
      for (size_t j = i; j < i + 8; ++j)
        out[j] = halfToFloat(in[j]);
    } else {
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
  }
  for (; i < n; ++i)
    out[i] = halfToFloat(in[i]);
}

__attribute__((target("avx,f16c"))) void floatToHalfF16c(const float *in, uint16_t *out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(in + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (size_t j = i; j < i + 8; ++j)
        out[j] = floatToHalf(in[j]);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i *>(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
  }
  for (; i < n; ++i)
    out[i] = floatToHalf(in[i]);
}

/// \p count elements of \p type at \p from, as wire elements at \p to.
void widen(const void *from, std::byte *to, int64_t count, DataType type) {
  auto n = static_cast<size_t>(count);
  if (type == DataType::FLOAT16 || type == DataType::BFLOAT16) {
    const auto *in = static_cast<const uint16_t *>(from);
    auto *out = reinterpret_cast<float *>(to);
    bool half = type == DataType::FLOAT16;
    if (half && hasF16c()) return halfToFloatF16c(in, out, n);
    for (size_t i = 0; i < n; ++i)
      out[i] = half ? halfToFloat(in[i]) : bfloat16ToFloat(in[i]);
  } else if (type == DataType::BOOL) {
    const auto *in = static_cast<const uint8_t *>(from);
    auto *out = reinterpret_cast<uint8_t *>(to);
    for (size_t i = 0; i < n; ++i)
      out[i] = in[i] != 0 ? 1 : 0;
  } else if (n > 0) { // an empty buffer may be null, which memcpy must not see
    std::memcpy(to, from, n * wireSize(type));
  }
}

/// The inverse of `widen`.
void narrow(const std::byte *from, void *to, int64_t count, DataType type) {
  auto n = static_cast<size_t>(count);
  if (type == DataType::FLOAT16 || type == DataType::BFLOAT16) {
    const auto *in = reinterpret_cast<const float *>(from);
    auto *out = static_cast<uint16_t *>(to);
    bool half = type == DataType::FLOAT16;
    if (half && hasF16c()) return floatToHalfF16c(in, out, n);
    for (size_t i = 0; i < n; ++i)
      out[i] = half ? floatToHalf(in[i]) : floatToBfloat16(in[i]);
  } else if (from != to && n > 0) {
    std::memmove(to, from, n * wireSize(type));
  }
}

/// into[i] = received[i] op into[i]: the received partial sum comes first, always.
void combine(const std::byte *received, std::byte *into, int64_t count, DataType type) {
  auto n = static_cast<size_t>(count);
  if (type == DataType::INT64) {
    const auto *in = reinterpret_cast<const uint64_t *>(received); // unsigned: wraps, never undefined
    auto *out = reinterpret_cast<uint64_t *>(into);
    for (size_t i = 0; i < n; ++i)
      out[i] = in[i] + out[i];
  } else if (type == DataType::BOOL) {
    const auto *in = reinterpret_cast<const uint8_t *>(received);
    auto *out = reinterpret_cast<uint8_t *>(into);
    for (size_t i = 0; i < n; ++i)
      out[i] = (in[i] != 0 && out[i] != 0) ? 1 : 0;
  } else {
    const auto *in = reinterpret_cast<const float *>(received);
    auto *out = reinterpret_cast<float *>(into);
    for (size_t i = 0; i < n; ++i)
      out[i] = in[i] + out[i];
  }
}

int toInt(size_t bytes, const State &state, const std::string &what) {
  if (bytes > static_cast<size_t>(INT_MAX))
    throw error("popart::comm: ", what, " on ", state.where(), ": a message of ", bytes,
                " bytes exceeds MPI's int count; split the tensor into smaller buckets");
  return static_cast<int>(bytes);
}

/// All-reduce, reduce-scatter and all-gather as a ring over point-to-point messages. The ring
/// fixes the order of every sum (see docs/distributed.md, "Determinism"): chunk c starts on rank
/// c+1 and each following rank adds its own elements to the partial sum it receives, ending on
/// rank c, which owns the result; the all-gather phase then copies each owner's chunk to the
/// others, so every rank ends with the same bits whatever the order in which messages arrive.
class RingOperation final : public MpiOperation {
public:
  enum class Kind { AllReduce, ReduceScatter, AllGather };

  RingOperation(std::shared_ptr<State> state, std::string description, Kind kind, DataType type, ReduceOp op)
      : MpiOperation(std::move(state), std::move(description)), kind_(kind), type_(type), op_(op),
        tag_(static_cast<int>(state_->started++ % kTagCount)) {}

  void startAllReduce(void *data, int64_t count) {
    output_ = static_cast<std::byte *>(data);
    for (int c = 0; c <= size(); ++c)
      offsets_.push_back(count * c / size());
    if (wireSize(type_) == dataTypeSize(type_)) {
      work_ = output_; // reduced in place
      if (type_ == DataType::BOOL) widen(data, work_, count, type_);
    } else {
      ownedWork_ = state_->take(static_cast<size_t>(count) * wireSize(type_));
      work_ = ownedWork_.data.get();
      widen(data, work_, count, type_);
    }
    guarded([&] { startReduction(); });
  }

  void startReduceScatter(const void *send, void *recv, int64_t recvCount) {
    output_ = static_cast<std::byte *>(recv);
    for (int c = 0; c <= size(); ++c)
      offsets_.push_back(recvCount * c);
    ownedWork_ = state_->take(static_cast<size_t>(offsets_.back()) * wireSize(type_));
    work_ = ownedWork_.data.get();
    widen(send, work_, offsets_.back(), type_);
    guarded([&] { startReduction(); });
  }

  void startAllGather(const void *send, void *recv, int64_t sendCount) {
    output_ = static_cast<std::byte *>(recv);
    for (int c = 0; c <= size(); ++c)
      offsets_.push_back(sendCount * c);
    size_t es = dataTypeSize(type_);
    if (bytes(rank(), es) > 0) std::memcpy(output_ + offsetBytes(rank(), es), send, bytes(rank(), es));
    guarded([&] {
      checkSizes(es);
      step_ = 0;
      phase_ = size() == 1 ? Phase::Done : Phase::Gather;
      if (phase_ == Phase::Gather) startStep();
    });
  }

protected:
  bool advance() override {
    while (phase_ != Phase::Done) {
      if (!complete(send_) || !complete(recv_)) return false;
      finishStep();
      if (phase_ != Phase::Done) startStep();
    }
    state_->give(std::move(ownedWork_));
    state_->give(std::move(received_));
    return true;
  }

  std::string waitingFor() const override {
    std::string ranks;
    if (recv_ != MPI_REQUEST_NULL) ranks = "rank " + std::to_string(left()) + " (to receive from)";
    if (send_ != MPI_REQUEST_NULL)
      ranks += (ranks.empty() ? "" : " and ") + ("rank " + std::to_string(right()) + " (to send to)");
    int steps = size() - 1;
    int done = phase_ == Phase::Reduce ? step_ : (kind_ == Kind::AllReduce ? steps : 0) + step_;
    int total = kind_ == Kind::AllReduce ? 2 * steps : steps;
    return ranks + " in ring step " + std::to_string(done + 1) + " of " + std::to_string(total);
  }

  void abandon() override {
    if (recv_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&recv_);
      MPI_Request_free(&recv_);
    }
    if (send_ != MPI_REQUEST_NULL) MPI_Request_free(&send_);
    state_->abandoned.push_back(std::move(ownedWork_));
    state_->abandoned.push_back(std::move(received_));
  }

private:
  enum class Phase { Reduce, Gather, Done };

  int rank() const { return state_->rank; }
  int size() const { return state_->size; }
  int left() const { return (rank() + size() - 1) % size(); }
  int right() const { return (rank() + 1) % size(); }
  int chunk(int shift) const { return ((rank() - shift) % size() + size()) % size(); }
  size_t bytes(int c, size_t elementSize) const {
    return static_cast<size_t>(offsets_[c + 1] - offsets_[c]) * elementSize;
  }
  size_t offsetBytes(int c, size_t elementSize) const { return static_cast<size_t>(offsets_[c]) * elementSize; }

  void checkSizes(size_t elementSize) {
    size_t largest = 0;
    for (int c = 0; c < size(); ++c)
      largest = std::max(largest, bytes(c, elementSize));
    toInt(largest, *state_, description_);
  }

  void startReduction() {
    checkSizes(wireSize(type_));
    size_t largest = 0;
    for (int c = 0; c < size(); ++c)
      largest = std::max(largest, bytes(c, wireSize(type_)));
    if (size() > 1) received_ = state_->take(largest);
    phase_ = Phase::Reduce;
    step_ = 0;
    if (size() == 1)
      finishReduction();
    else
      startStep();
  }

  // Step s of the reduction sends chunk r-s-1 and receives chunk r-s-2; step s of the gather
  // sends chunk r-s and receives chunk r-s-1 (indices modulo the size).
  void startStep() {
    bool reducing = phase_ == Phase::Reduce;
    size_t es = reducing ? wireSize(type_) : dataTypeSize(type_);
    int sendChunk = chunk(reducing ? step_ + 1 : step_), recvChunk = chunk(reducing ? step_ + 2 : step_ + 1);
    std::byte *from = (reducing ? work_ : output_) + offsetBytes(sendChunk, es);
    std::byte *into = reducing ? received_.data.get() : output_ + offsetBytes(recvChunk, es);
    expected_ = bytes(recvChunk, es);
    std::string context = description_ + ", ring step " + std::to_string(step_ + 1);
    // The requests complete through MPI_Test in complete(), called from another function (the
    // polling that the timeout needs), which clang's MPI checker does not follow.
    MPI_Request receive = MPI_REQUEST_NULL, send = MPI_REQUEST_NULL;
    state_->check(MPI_Irecv(into, static_cast<int>(expected_), MPI_BYTE, left(), tag_, state_->comm, &receive),
                  "MPI_Irecv", context);
    // NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker)
    recv_ = receive;
    state_->check(MPI_Isend(from, static_cast<int>(bytes(sendChunk, es)), MPI_BYTE, right(), tag_, state_->comm, &send),
                  "MPI_Isend", context);
    // NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker)
    send_ = send;
  }

  /// Tests \p request; \returns true once it has completed (or is null). For a receive, checks
  /// that the sender sent as many bytes as this rank expects.
  bool complete(MPI_Request &request) {
    if (request == MPI_REQUEST_NULL) return true;
    bool receive = &request == &recv_;
    int flag = 0;
    MPI_Status status;
    state_->check(
        MPI_Test(&request, &flag, &status), "MPI_Test",
        description_ + ", ring step " + std::to_string(step_ + 1) + ", " +
            (receive ? "receiving from rank " + std::to_string(left()) : "sending to rank " + std::to_string(right())));
    if (!flag) return false;
    if (receive) {
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      if (static_cast<size_t>(count) != expected_)
        throw error("popart::comm: ", description_, " on ", state_->where(), " received ", count, " bytes from rank ",
                    left(), " in ring step ", step_ + 1, " where it expected ", expected_,
                    ": the ranks called it with different counts or types");
    }
    return true;
  }

  void finishStep() {
    ++state_->progress;
    if (phase_ == Phase::Reduce) {
      size_t es = wireSize(type_);
      int c = chunk(step_ + 2);
      combine(received_.data.get(), work_ + offsetBytes(c, es), offsets_[c + 1] - offsets_[c], type_);
      if (++step_ == size() - 1) finishReduction();
    } else if (++step_ == size() - 1) {
      phase_ = Phase::Done;
    }
  }

  /// The rank's own chunk now holds the sum over all ranks: scale it for a mean, and write it out
  /// in the caller's type.
  void finishReduction() {
    int own = rank();
    int64_t count = offsets_[own + 1] - offsets_[own];
    std::byte *chunkData = work_ + offsetBytes(own, wireSize(type_));
    if (op_ == ReduceOp::Mean) {
      auto *values = reinterpret_cast<float *>(chunkData);
      auto ranks = static_cast<float>(size());
      for (int64_t i = 0; i < count; ++i)
        values[i] = values[i] / ranks;
    }
    if (kind_ == Kind::ReduceScatter) {
      narrow(chunkData, output_, count, type_);
      phase_ = Phase::Done;
      return;
    }
    narrow(chunkData, output_ + offsetBytes(own, dataTypeSize(type_)), count, type_);
    phase_ = size() == 1 ? Phase::Done : Phase::Gather;
    step_ = 0;
    if (phase_ == Phase::Gather) checkSizes(dataTypeSize(type_));
  }

  Kind kind_;
  DataType type_;
  ReduceOp op_;
  int tag_;
  std::vector<int64_t> offsets_;
  std::byte *output_ = nullptr;
  std::byte *work_ = nullptr;
  Scratch ownedWork_;
  Scratch received_;
  size_t expected_ = 0;
  Phase phase_ = Phase::Done;
  int step_ = 0;
  MPI_Request send_ = MPI_REQUEST_NULL;
  MPI_Request recv_ = MPI_REQUEST_NULL;
};

/// A broadcast or barrier: MPI's own non-blocking collective, tested until it completes. Neither
/// computes anything, so MPI's algorithm cannot change a bit of the result.
class CollectiveOperation final : public MpiOperation {
public:
  CollectiveOperation(std::shared_ptr<State> state, std::string description, std::string participants)
      : MpiOperation(std::move(state), std::move(description)), participants_(std::move(participants)) {}
  MPI_Request request = MPI_REQUEST_NULL;

protected:
  bool advance() override {
    int flag = 0;
    state_->check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), "MPI_Test", description_);
    return flag != 0;
  }
  std::string waitingFor() const override { return participants_; }
  // MPI forbids freeing or cancelling a non-blocking collective's request: it is left behind.
  void abandon() override {}

private:
  std::string participants_;
};

/// A send or a receive on the point-to-point communicator. A receive matches its message with
/// MPI_Improbe before receiving it, so that a message of the wrong size is reported with both sizes
/// (MPI_Irecv would report a longer one only as truncated) and drained rather than left to block
/// its sender.
class PointToPointOperation final : public MpiOperation {
public:
  enum class Kind { Send, Receive };

  /// A send of \p send's elements or a receive into \p recv, as \p kind says (the other one null).
  PointToPointOperation(std::shared_ptr<State> state, Kind kind, const void *send, void *recv, int64_t count,
                        DataType type, int peer, int tag)
      : MpiOperation(std::move(state), {}), kind_(kind), send_(send), recv_(recv), count_(count), type_(type),
        peer_(peer), tag_(tag), bytes_(static_cast<size_t>(count) * dataTypeSize(type)) {}

  void start() {
    guarded([&] {
      int bytes = toInt(bytes_, *state_, description());
      if (kind_ == Kind::Receive) return; // matched in advance()
      MPI_Request send = MPI_REQUEST_NULL;
      state_->check(MPI_Isend(send_, bytes, MPI_BYTE, peer_, tag_, state_->p2p, &send), "MPI_Isend", description());
      // Completed through MPI_Test in advance(), which clang's MPI checker does not follow.
      // NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker)
      request_ = send;
    });
  }

  std::string description() const override {
    std::string what = kind_ == Kind::Send ? "send to rank " : "receive from rank ";
    return what + std::to_string(peer_) + " with tag " + std::to_string(tag_) + " of " + std::to_string(bytes_) +
           " bytes (" + std::to_string(count_) + " " + popart::toString(type_) + ")";
  }

  bool awaitsMessage(int peer, int tag) const override {
    return kind_ == Kind::Receive && !matched_ && peer == peer_ && tag == tag_;
  }

protected:
  bool advance() override {
    if (kind_ == Kind::Receive && !matched_ && !match()) return false;
    int flag = 0;
    state_->check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test", description());
    return flag != 0;
  }

  std::string waitingFor() const override {
    if (kind_ == Kind::Send) return "rank " + std::to_string(peer_) + " to receive it";
    return "rank " + std::to_string(peer_) + (matched_ ? " to finish sending it" : " to send it");
  }

  // A send cannot be cancelled (MPI deprecates it) and a matched receive no longer can be: both are
  // freed, and MPI completes them on its own.
  void abandon() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Request_free(&request_);
  }

private:
  /// Matches the next message from the peer with the tag, unless an earlier receive of the same
  /// pair still waits for one (MPI's order between them must hold); \returns true once matched.
  bool match() {
    for (PendingOperation *other : state_->inFlight) {
      if (other == this) break;
      if (static_cast<const MpiOperation *>(other)->awaitsMessage(peer_, tag_)) return false;
    }
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    state_->check(MPI_Improbe(peer_, tag_, state_->p2p, &flag, &message, &status), "MPI_Improbe", description());
    if (flag == 0) return false;
    int sent = 0;
    state_->check(MPI_Get_count(&status, MPI_BYTE, &sent), "MPI_Get_count", description());
    if (static_cast<size_t>(sent) != bytes_) {
      // Received into a buffer kept with the abandoned ones, so that the sender completes.
      Scratch drain = state_->take(static_cast<size_t>(sent));
      MPI_Request drained = MPI_REQUEST_NULL;
      if (MPI_Imrecv(drain.data.get(), sent, MPI_BYTE, &message, &drained) == MPI_SUCCESS) MPI_Request_free(&drained);
      state_->abandoned.push_back(std::move(drain));
      throw error("popart::comm: ", description(), " on ", state_->where(), ": rank ", peer_, " sent ", sent,
                  " bytes with tag ", tag_, " where this rank expected ", bytes_,
                  ": the ranks disagree on the count or type");
    }
    MPI_Request receive = MPI_REQUEST_NULL;
    state_->check(MPI_Imrecv(recv_, sent, MPI_BYTE, &message, &receive), "MPI_Imrecv", description());
    // NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker)
    request_ = receive;
    matched_ = true;
    return true;
  }

  Kind kind_;
  const void *send_;
  void *recv_;
  int64_t count_;
  DataType type_;
  int peer_;
  int tag_;
  size_t bytes_;
  bool matched_ = false;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

std::string describe(const char *what, uint64_t number, int64_t count, DataType type) {
  return std::string(what) + " #" + std::to_string(number) + " (" + std::to_string(count) + " " +
         popart::toString(type) + ")";
}

std::string describe(const char *what, uint64_t number, int64_t count, DataType type, ReduceOp op) {
  return describe(what, number, count, type) + " " + toString(op);
}

/// Completes \p state, whose `comm` has just been created: errors returned, rank, size, and the
/// point-to-point duplicate.
void finishState(State &state, const std::string &context) {
  state.check(MPI_Comm_set_errhandler(state.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", context);
  state.check(MPI_Comm_rank(state.comm, &state.rank), "MPI_Comm_rank", context);
  state.check(MPI_Comm_size(state.comm, &state.size), "MPI_Comm_size", context);
  state.check(MPI_Comm_dup(state.comm, &state.p2p), "MPI_Comm_dup", context + ", its point-to-point duplicate");
}

std::shared_ptr<State> makeState(MPI_Comm from, const MpiOptions &options) {
  if (options.timeout.count() < 0)
    throw error("popart::comm: the collective timeout must not be negative (", options.timeout.count(), " ms)");
  auto state = std::make_shared<State>();
  state->timeout = options.timeout;
  int worldRank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &worldRank);
  std::string context = "creating a communicator (world rank " + std::to_string(worldRank) + ")";
  int code = MPI_Comm_dup(from, &state->comm);
  if (code != MPI_SUCCESS)
    throw error("popart::comm: MPI_Comm_dup failed on world rank ", worldRank, ": ", mpiErrorText(code));
  finishState(*state, context);
  return state;
}

} // namespace

MpiCommunicator::MpiCommunicator(const MpiOptions &options) {
  ensureMpiInitialised();
  state_ = makeState(MPI_COMM_WORLD, options);
}

MpiCommunicator::MpiCommunicator(const void *mpiComm, const MpiOptions &options) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised)
    throw error("popart::comm: an MpiCommunicator over a caller's MPI_Comm needs MPI initialised first");
  if (mpiComm == nullptr) throw error("popart::comm: an MpiCommunicator needs a pointer to an MPI_Comm, not null");
  state_ = makeState(*static_cast<const MPI_Comm *>(mpiComm), options);
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<State> state) : state_(std::move(state)) {}

MpiCommunicator::~MpiCommunicator() = default;

int MpiCommunicator::rank() const { return state_->rank; }
int MpiCommunicator::size() const { return state_->size; }

Request MpiCommunicator::allReduceAsync(void *data, int64_t count, DataType type, ReduceOp op) {
  checkReduction("all-reduce", count, type, op);
  state_->refuseIfFailed("all-reduce");
  // One rank's sum or mean is its input: skip the round trip through fp32 for the 16-bit types.
  if (size() == 1) return {};
  auto operation = std::make_unique<RingOperation>(state_, describe("all-reduce", state_->started, count, type, op),
                                                   RingOperation::Kind::AllReduce, type, op);
  operation->startAllReduce(data, count);
  return Request(std::move(operation));
}

Request MpiCommunicator::reduceScatterAsync(const void *send, void *recv, int64_t recvCount, DataType type,
                                            ReduceOp op) {
  checkReduction("reduce-scatter", recvCount, type, op);
  state_->refuseIfFailed("reduce-scatter");
  auto operation =
      std::make_unique<RingOperation>(state_, describe("reduce-scatter", state_->started, recvCount, type, op),
                                      RingOperation::Kind::ReduceScatter, type, op);
  operation->startReduceScatter(send, recv, recvCount);
  return Request(std::move(operation));
}

Request MpiCommunicator::allGatherAsync(const void *send, void *recv, int64_t sendCount, DataType type) {
  checkCopy("all-gather", sendCount, type);
  state_->refuseIfFailed("all-gather");
  auto operation = std::make_unique<RingOperation>(state_, describe("all-gather", state_->started, sendCount, type),
                                                   RingOperation::Kind::AllGather, type, ReduceOp::Sum);
  operation->startAllGather(send, recv, sendCount);
  return Request(std::move(operation));
}

Request MpiCommunicator::broadcastAsync(void *data, int64_t count, DataType type, int root) {
  checkCopy("broadcast", count, type);
  checkRoot("broadcast", root);
  state_->refuseIfFailed("broadcast");
  std::string description =
      describe("broadcast", state_->started++, count, type) + " from rank " + std::to_string(root);
  auto operation = std::make_unique<CollectiveOperation>(
      state_, description,
      "rank " + std::to_string(root) + " (the root) or another of the " + std::to_string(size()) + " ranks");
  size_t total = static_cast<size_t>(count) * dataTypeSize(type);
  state_->check(MPI_Ibcast(data, toInt(total, *state_, description), MPI_BYTE, root, state_->comm, &operation->request),
                "MPI_Ibcast", description);
  return Request(std::move(operation));
}

Request MpiCommunicator::barrierAsync() {
  state_->refuseIfFailed("barrier");
  std::string description = "barrier #" + std::to_string(state_->started++);
  auto operation = std::make_unique<CollectiveOperation>(
      state_, description, "one of ranks 0-" + std::to_string(size() - 1) + " (MPI does not say which)");
  state_->check(MPI_Ibarrier(state_->comm, &operation->request), "MPI_Ibarrier", description);
  return Request(std::move(operation));
}

namespace {
/// Starts a send of \p send or a receive into \p recv, as \p kind says (the other one null).
Request startPointToPoint(const std::shared_ptr<MpiCommunicator::State> &state, PointToPointOperation::Kind kind,
                          const void *send, void *recv, int64_t count, DataType type, int peer, int tag) {
  state->refuseIfFailed(kind == PointToPointOperation::Kind::Send ? "send" : "receive");
  auto operation = std::make_unique<PointToPointOperation>(state, kind, send, recv, count, type, peer, tag);
  operation->start();
  return Request(std::move(operation));
}
} // namespace

Request MpiCommunicator::sendAsync(const void *data, int64_t count, DataType type, int peer, int tag) {
  checkPointToPoint("send", count, type, peer, tag);
  return startPointToPoint(state_, PointToPointOperation::Kind::Send, data, nullptr, count, type, peer, tag);
}

Request MpiCommunicator::recvAsync(void *data, int64_t count, DataType type, int peer, int tag) {
  checkPointToPoint("receive", count, type, peer, tag);
  return startPointToPoint(state_, PointToPointOperation::Kind::Receive, nullptr, data, count, type, peer, tag);
}

std::shared_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  checkSplit(color);
  state_->refuseIfFailed("split");
  // MPI_Comm_split blocks without a timeout, and ring steps in flight would not be posted meanwhile.
  if (!state_->inFlight.empty())
    throw error("popart::comm: split on ", state_->where(), " with ", state_->inFlight.size(),
                " operation(s) in flight; wait for them first");
  std::string context = "split with color " + std::to_string(color) + " and key " + std::to_string(key);
  // A barrier first, which has the timeout: a rank that never calls split then stops the others here
  // instead of hanging them in MPI_Comm_split.
  barrier();
  auto child = std::make_shared<State>();
  child->timeout = state_->timeout;
  state_->check(MPI_Comm_split(state_->comm, color, key, &child->comm), "MPI_Comm_split", context);
  finishState(*child, context);
  // Not make_shared: the constructor from a state is private.
  return std::shared_ptr<MpiCommunicator>(new MpiCommunicator(std::move(child)));
}

} // namespace popart::comm
