#pragma once
// Heap allocations counted per step of a compiled plan: replaces the global operator new and
// delete (plain and aligned), so include it in one file of a program only. Our kernels must not allocate at all;
// oneDNN 2.6 builds a small argument map inside every primitive execution (a fixed few hundred
// bytes, whatever the tensor sizes), and oneDNN steps are allowed that bookkeeping only. The
// executions are counted too (this file also stands in for oneDNN's dnnl_primitive_execute), so
// that a kernel running many primitives per step (the FLOAT16 MatMul, one per block) is allowed
// the bookkeeping of each and nothing more.

#include "backend_cpu/plan.hpp"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>
#include <new>

namespace alloc_count {
inline std::atomic<bool> counting{false};
inline std::atomic<long> allocations{0};
inline std::atomic<long> allocatedBytes{0};
inline std::atomic<long> executions{0}; ///< oneDNN primitive executions while counting

inline void count(size_t n) {
  if (counting.load(std::memory_order_relaxed)) {
    allocations.fetch_add(1, std::memory_order_relaxed);
    allocatedBytes.fetch_add(static_cast<long>(n), std::memory_order_relaxed);
  }
}
} // namespace alloc_count

// The plain and the aligned form: libstdc++'s array and nothrow forms call these two.
void *operator new(size_t n) {
  alloc_count::count(n);
  if (void *p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void *operator new(size_t n, std::align_val_t alignment) {
  alloc_count::count(n);
  size_t a = static_cast<size_t>(alignment);
  if (void *p = std::aligned_alloc(a, (n + a - 1) / a * a + (n ? 0 : a))) return p;
  throw std::bad_alloc();
}
// The replaced new and delete pair malloc with free; once GCC 12 inlines both into one caller it
// sees free() of an operator-new pointer and warns falsely.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, size_t) noexcept { std::free(p); }
void operator delete(void *p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void *p, size_t, std::align_val_t) noexcept { std::free(p); }

// The executable's definition takes the place of libdnnl's for every caller in it (our kernels
// are linked in statically), and passes each call on to libdnnl's after counting it.
extern "C" dnnl_status_t dnnl_primitive_execute(const_dnnl_primitive_t primitive, dnnl_stream_t stream, int nargs,
                                                const dnnl_exec_arg_t *args) {
  using Execute = dnnl_status_t (*)(const_dnnl_primitive_t, dnnl_stream_t, int, const dnnl_exec_arg_t *);
  static const auto next = reinterpret_cast<Execute>(dlsym(RTLD_NEXT, "dnnl_primitive_execute"));
  if (!next) {
    std::fprintf(stderr, "allocation counter: libdnnl's dnnl_primitive_execute not found\n");
    std::abort();
  }
  if (alloc_count::counting.load(std::memory_order_relaxed))
    alloc_count::executions.fetch_add(1, std::memory_order_relaxed);
  return next(primitive, stream, nargs, args);
}

namespace alloc_count {

/// oneDNN's execution bookkeeping allowed per primitive execution, in bytes: each builds an
/// argument map of about 350 bytes.
constexpr long kDnnlBookkeepingBytesPerExecution = 512;
/// ... and per step at least: a step runs up to three primitives (a convolution with reorders
/// into and out of the layouts it chose).
constexpr long kDnnlBookkeepingBytes = 3 * kDnnlBookkeepingBytesPerExecution;

/// The heap use of one run of a plan step.
struct StepUse {
  long allocations = 0, bytes = 0;
  long executions = 0; ///< oneDNN primitives the step executed
  bool dnnl = false;   ///< the step runs a oneDNN kernel
  /// What the step may allocate: the bookkeeping of each oneDNN execution it made (a oneDNN step
  /// at least a step's, kDnnlBookkeepingBytes), whichever provider's kernel made them (the fast
  /// FLOAT16 block kernels run oneDNN's f32 primitives on their blocks).
  long allowance() const {
    const long perExecution = kDnnlBookkeepingBytesPerExecution * executions;
    return dnnl ? std::max(kDnnlBookkeepingBytes, perExecution) : perExecution;
  }
  /// More than the step may allocate: anything for a step that runs no oneDNN primitive, more than
  /// oneDNN's bookkeeping otherwise.
  bool tooMuch() const { return !dnnl && executions == 0 ? allocations > 0 : bytes > allowance(); }
};

/// Where the self-check's allocations go, so that the compiler cannot drop them.
inline void *volatile sink = nullptr;

/// True if the counter sees each form of operator new once: plain, array, nothrow, aligned and
/// aligned array (an over-aligned type, as kernels and oneDNN allocate).
inline bool countsEveryForm() {
  struct alignas(64) Aligned {
    float v[16];
  };
  bool ok = true;
  auto once = [&](const char *form, auto allocate) {
    allocations = 0;
    counting = true;
    allocate();
    counting = false;
    if (allocations.load() != 1) {
      std::fprintf(stderr, "allocation counter: operator new (%s) counted %ld times, not once\n", form,
                   allocations.load());
      ok = false;
    }
  };
  once("plain", [] { sink = new int(1); });
  delete static_cast<int *>(sink);
  once("array", [] { sink = new int[3]; });
  delete[] static_cast<int *>(sink);
  once("nothrow", [] { sink = new (std::nothrow) int(1); });
  delete static_cast<int *>(sink);
  once("aligned", [] { sink = new Aligned; });
  delete static_cast<Aligned *>(sink);
  once("aligned array", [] { sink = new Aligned[2]; });
  delete[] static_cast<Aligned *>(sink);
  return ok;
}

/// Runs step \p s of \p plan once, counting its allocations.
inline StepUse countStep(popart::backend_cpu::ExecutionPlan &plan, size_t s) {
  allocations = 0;
  allocatedBytes = 0;
  executions = 0;
  counting = true;
  plan.runStep(s);
  counting = false;
  return {allocations.load(), allocatedBytes.load(), executions.load(),
          plan.stepProviders()[s] == popart::backend_cpu::KernelProvider::Dnnl};
}

} // namespace alloc_count
