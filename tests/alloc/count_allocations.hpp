#pragma once
// Heap allocations counted per step of a compiled plan: replaces the global operator new and
// delete, so include it in one file of a program only. Our kernels must not allocate at all;
// oneDNN 2.6 builds a small argument map inside every primitive execution (a fixed few hundred
// bytes, whatever the tensor sizes), and oneDNN steps are allowed that bookkeeping only.

#include "backend_cpu/plan.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace alloc_count {
inline std::atomic<bool> counting{false};
inline std::atomic<long> allocations{0};
inline std::atomic<long> allocatedBytes{0};
} // namespace alloc_count

void *operator new(size_t n) {
  if (alloc_count::counting.load(std::memory_order_relaxed)) {
    alloc_count::allocations.fetch_add(1, std::memory_order_relaxed);
    alloc_count::allocatedBytes.fetch_add(static_cast<long>(n), std::memory_order_relaxed);
  }
  if (void *p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// The replaced new and delete pair malloc with free; once GCC 12 inlines both into one caller it
// sees free() of an operator-new pointer and warns falsely.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, size_t) noexcept { std::free(p); }

namespace alloc_count {

/// oneDNN's execution bookkeeping allowed per step, in bytes: each primitive execution builds
/// an argument map of about 350 bytes, and a step runs up to three primitives (a convolution
/// with reorders into and out of the layouts it chose), so 512 bytes for each of three.
constexpr long kDnnlBookkeepingBytes = 3 * 512;

/// The heap use of one run of a plan step.
struct StepUse {
  long allocations = 0, bytes = 0;
  bool dnnl = false; ///< the step runs a oneDNN kernel
  /// More than the step may allocate: anything for our kernels, more than the bookkeeping for oneDNN's.
  bool tooMuch() const { return dnnl ? bytes > kDnnlBookkeepingBytes : allocations > 0; }
};

/// Runs step \p s of \p plan once, counting its allocations.
inline StepUse countStep(popart::backend_cpu::ExecutionPlan &plan, size_t s) {
  allocations = 0;
  allocatedBytes = 0;
  counting = true;
  plan.runStep(s);
  counting = false;
  return {allocations.load(), allocatedBytes.load(),
          plan.stepProviders()[s] == popart::backend_cpu::KernelProvider::Dnnl};
}

} // namespace alloc_count
