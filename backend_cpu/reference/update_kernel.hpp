#pragma once
// The base of the optimiser-update kernels (reference and fast): an update of n independent
// elements that the plan may run in ranges (merging updates into one parallel step) and that a
// run of its own splits into chunks over the threads. Each element is independent, so the
// result does not depend on the split or the thread count.
//
// Storage types: the weight is FLOAT, FLOAT16 or BFLOAT16; the gradient and the state tensors
// each have the weight's type or FLOAT (ir/ops/varupdate.cpp), the second-order state (PopART's
// accl2) possibly FLOAT beside first-order state of the weight's type. A FLOAT weight may take a
// FLOAT16 or BFLOAT16 gradient (fp16.32's and bf16's master weights), widened in the kernel.
// Kernels are templated on the four (UpdateTypes) and compute in float, rounding each stored
// value once.

#include "backend_cpu/kernel.hpp"
#include "core/dispatch.hpp"

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

namespace popart::backend_cpu {

/// The storage types of one update: weight \p W, gradient \p G, first-order state \p S (SGD's
/// velocity, Adam's m, RMSprop's momentum buffer) and second-order state \p S2 (PopART's accl2:
/// Adam's v, AdaMax's u, RMSprop's square and gradient averages, AdaGrad's sum of squares).
/// \p S2 is \p S or FLOAT: fp16.16 keeps a 16-bit first moment beside an fp32 second moment.
template <typename W, typename G, typename S, typename S2 = S> struct UpdateTypes {
  using Weight = W;
  using Grad = G;
  using State = S;
  using SecondMoment = S2;
};

/// Whether state tensor \p k (input 4 + \p k) of the update op \p op is second-order state:
/// AdamUpdate's second (v, or AdaMax's u), AdaptiveUpdate's first two (the square average or
/// AdaGrad's sum, and centered RMSprop's gradient average). SGDUpdate has none.
inline bool isSecondMomentState(const ir::Op &op, size_t k) {
  if (op.type == "AdamUpdate") return k == 1;
  if (op.type == "AdaptiveUpdate") return k <= 1;
  return false;
}

namespace detail {
/// Calls \p f(TypeTag<W>{}) or f(TypeTag<float>{}): \p type is \p W's or FLOAT.
template <typename W, typename F> decltype(auto) weightTypeOrFloat(DataType type, F &&f) {
  if constexpr (!std::is_same_v<W, float>)
    if (type != DataType::FLOAT) return f(TypeTag<W>{});
  return f(TypeTag<float>{});
}

/// Calls \p f with the tag of the gradient type \p type of a \p W weight: as weightTypeOrFloat,
/// and for a float weight also Half or BFloat16 (a master weight's 16-bit gradient).
template <typename W, typename F> decltype(auto) gradientType(DataType type, F &&f) {
  if constexpr (std::is_same_v<W, float>) {
    if (type == DataType::FLOAT16) return f(TypeTag<Half>{});
    if (type == DataType::BFLOAT16) return f(TypeTag<BFloat16>{});
  }
  return weightTypeOrFloat<W>(type, std::forward<F>(f));
}

/// The DataType of the present state tensors of \p op that are second-order (\p secondOrder) or
/// first-order: \p fallback when there is none, UNDEFINED when they disagree.
inline DataType stateTypeOf(const ir::Op &op, bool secondOrder, DataType fallback) {
  DataType type = DataType::UNDEFINED;
  for (size_t i = 4; i < op.inputCount(); ++i) {
    if (!op.hasInput(i) || isSecondMomentState(op, i - 4) != secondOrder) continue;
    if (type != DataType::UNDEFINED && op.inInfo(i).dataType() != type) return DataType::UNDEFINED;
    type = op.inInfo(i).dataType();
  }
  return type == DataType::UNDEFINED ? fallback : type;
}
} // namespace detail

/// The DataType of an update's first-order state tensors (UpdateTypes::State): that of the
/// present ones, else of the second-order ones, else the weight's; UNDEFINED if they disagree.
inline DataType updateStateType(const ir::Op &op) {
  return detail::stateTypeOf(op, false, detail::stateTypeOf(op, true, op.inInfo(0).dataType()));
}

/// The DataType of an update's second-order state tensors (UpdateTypes::SecondMoment): that of
/// the present ones, else updateStateType's; UNDEFINED if they disagree.
inline DataType updateSecondMomentType(const ir::Op &op) { return detail::stateTypeOf(op, true, updateStateType(op)); }

/// Whether \p op's weight, gradient and state types are ones dispatchUpdateTypes takes: the
/// weight FLOAT, FLOAT16 or BFLOAT16; the gradient the weight's type or FLOAT, or any of the three
/// for a FLOAT weight; the state of each order the weight's type or FLOAT, the second-order state
/// FLOAT unless the first-order state is the weight's type; the hyperparameters and gradient
/// scale FLOAT.
inline bool updateTypesSupported(const ir::Op &op) {
  if (op.inputCount() < 4) return false;
  const DataType w = op.inInfo(0).dataType(), g = op.inInfo(1).dataType(), s = updateStateType(op),
                 s2 = updateSecondMomentType(op);
  auto weightOrFloat = [&](DataType t) { return t == w || t == DataType::FLOAT; };
  const bool masterGradient = w == DataType::FLOAT && (g == DataType::FLOAT16 || g == DataType::BFLOAT16);
  return (w == DataType::FLOAT || w == DataType::FLOAT16 || w == DataType::BFLOAT16) &&
         (weightOrFloat(g) || masterGradient) && weightOrFloat(s) && (s2 == s || s2 == DataType::FLOAT) &&
         op.inInfo(2).dataType() == DataType::FLOAT && op.inInfo(3).dataType() == DataType::FLOAT;
}

/// Calls \p f(UpdateTypes<W, G, S, S2>{}) for \p op's storage types (updateTypesSupported).
/// Every combination is one instantiation of \p f: three for FLOAT weights (one per gradient
/// type), six for each 16-bit type.
template <typename F> decltype(auto) dispatchUpdateTypes(const ir::Op &op, F &&f) {
  if (!updateTypesSupported(op))
    throw error(op.debugName(), ": cannot update weight ", op.inInfo(0).toString(), " with gradient ",
                op.inInfo(1).toString(), ", state ", toString(updateStateType(op)), " and second-order state ",
                toString(updateSecondMomentType(op)),
                " (the weight FLOAT, FLOAT16 or BFLOAT16; gradient and state its type or FLOAT, or a 16-bit "
                "gradient of a FLOAT weight; the state of each order of one type, and the second-order state "
                "FLOAT or the first-order state's type)");
  const DataType g = op.inInfo(1).dataType(), s = updateStateType(op), s2 = updateSecondMomentType(op);
  // (Tags pass through std::decay_t: GCC sees a captured tag parameter as a reference.)
  auto withWeight = [&](auto wTag) -> decltype(auto) {
    using W = typename std::decay_t<decltype(wTag)>::type;
    return detail::gradientType<W>(g, [&](auto gTag) -> decltype(auto) {
      using G = typename std::decay_t<decltype(gTag)>::type;
      return detail::weightTypeOrFloat<W>(s, [&](auto sTag) -> decltype(auto) {
        using S = typename std::decay_t<decltype(sTag)>::type;
        if constexpr (std::is_same_v<S, float>)
          return f(UpdateTypes<W, G, float, float>{});
        else
          return detail::weightTypeOrFloat<W>(s2, [&](auto s2Tag) -> decltype(auto) {
            return f(UpdateTypes<W, G, S, typename std::decay_t<decltype(s2Tag)>::type>{});
          });
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
