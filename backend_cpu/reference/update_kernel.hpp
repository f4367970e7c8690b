#pragma once
// The base of the optimiser-update kernels (reference and fast): an update of n independent
// elements that the plan may run in ranges (merging updates into one parallel step) and that a
// run of its own splits into chunks over the threads. Each element is independent, so the
// result does not depend on the split or the thread count.
//
// Storage types: the weight is FLOAT, FLOAT16 or BFLOAT16; the gradient and the state tensors
// each have the weight's type or FLOAT (ir/ops/varupdate.cpp). Kernels are templated on the
// three and compute in float, rounding each stored value once.

#include "backend_cpu/kernel.hpp"
#include "core/dispatch.hpp"

#include <algorithm>
#include <vector>

namespace popart::backend_cpu {

/// The storage types of one update: weight \p W, gradient \p G, state \p S.
template <typename W, typename G, typename S> struct UpdateTypes {
  using Weight = W;
  using Grad = G;
  using State = S;
};

namespace detail {
/// Calls \p f(TypeTag<W>{}) or f(TypeTag<float>{}): \p type is \p W's or FLOAT.
template <typename W, typename F> decltype(auto) weightTypeOrFloat(DataType type, F &&f) {
  if constexpr (!std::is_same_v<W, float>)
    if (type != DataType::FLOAT) return f(TypeTag<W>{});
  return f(TypeTag<float>{});
}
} // namespace detail

/// The DataType of an update's state tensors: the first present among inputs 4.. of \p op, or
/// the weight's when it has none (a kernel with several state tensors requires them to agree).
inline DataType updateStateType(const ir::Op &op) {
  DataType type = op.inInfo(0).dataType();
  bool found = false;
  for (size_t i = 4; i < op.inputCount(); ++i)
    if (op.hasInput(i)) {
      if (found && op.inInfo(i).dataType() != type) return DataType::UNDEFINED;
      type = op.inInfo(i).dataType();
      found = true;
    }
  return type;
}

/// Whether \p op's weight, gradient and state types are ones dispatchUpdateTypes takes: the
/// weight FLOAT, FLOAT16 or BFLOAT16, the gradient and every state tensor the weight's type or
/// FLOAT (all state the same), the hyperparameters and gradient scale FLOAT.
inline bool updateTypesSupported(const ir::Op &op) {
  if (op.inputCount() < 4) return false;
  const DataType w = op.inInfo(0).dataType(), g = op.inInfo(1).dataType(), s = updateStateType(op);
  auto weightOrFloat = [&](DataType t) { return t == w || t == DataType::FLOAT; };
  return (w == DataType::FLOAT || w == DataType::FLOAT16 || w == DataType::BFLOAT16) && weightOrFloat(g) &&
         weightOrFloat(s) && op.inInfo(2).dataType() == DataType::FLOAT && op.inInfo(3).dataType() == DataType::FLOAT;
}

/// Calls \p f(UpdateTypes<W, G, S>{}) for \p op's storage types (updateTypesSupported); \p what
/// names the caller in errors. Every combination is one instantiation of \p f.
template <typename F> decltype(auto) dispatchUpdateTypes(const ir::Op &op, F &&f) {
  if (!updateTypesSupported(op))
    throw error(op.debugName(), ": cannot update weight ", op.inInfo(0).toString(), " with gradient ",
                op.inInfo(1).toString(), " and state ", toString(updateStateType(op)),
                " (the weight FLOAT, FLOAT16 or BFLOAT16; gradient and state its type or FLOAT)");
  const DataType g = op.inInfo(1).dataType(), s = updateStateType(op);
  auto withWeight = [&](auto wTag) -> decltype(auto) {
    using W = typename decltype(wTag)::type;
    return detail::weightTypeOrFloat<W>(g, [&](auto gTag) -> decltype(auto) {
      return detail::weightTypeOrFloat<W>(s, [&](auto sTag) -> decltype(auto) {
        return f(UpdateTypes<W, typename decltype(gTag)::type, typename decltype(sTag)::type>{});
      });
    });
  };
  switch (op.inInfo(0).dataType()) {
  case DataType::FLOAT16: return withWeight(TypeTag<Half>{});
  case DataType::BFLOAT16: return withWeight(TypeTag<BFloat16>{});
  default: return withWeight(TypeTag<float>{});
  }
}

class UpdateKernel : public Kernel {
public:
  /// Updates of weights with more elements than this are split across threads.
  static constexpr int64_t kParallelElements = 1 << 16;

  explicit UpdateKernel(const ir::Op &op) : n_(op.inInfo(0).elementCount()) {
    for (size_t i = 4; i < op.inputCount(); ++i)
      hasState_.push_back(op.hasInput(i));
  }

  int64_t rangeElements() const override { return n_; }
  void run(const KernelArgs &a) override {
    if (n_ <= kParallelElements) {
      runRange(a, 0, n_);
      return;
    }
    const int64_t chunks = (n_ + kParallelElements - 1) / kParallelElements;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c)
      runRange(a, c * kParallelElements, std::min(n_, (c + 1) * kParallelElements));
  }

protected:
  int64_t n_;
  std::vector<bool> hasState_;
  /// State tensor \p k (input 4 + k, updated in place through output 1 + k); null if absent.
  template <typename S = float> static S *state(const KernelArgs &a, size_t k) {
    return a.hasOutput(1 + k) ? a.out<S>(1 + k) : nullptr;
  }
};

} // namespace popart::backend_cpu
