// Kernels of the ai.graphcore in-place training ops (ir/ops/varupdate.cpp): optimiser updates,
// gradient accumulation, variable copies, the finiteness check and the gradient histogram of
// automatic loss scaling. The formulas follow
// torch.optim (1.13) step for step; docs/training.md lists the hyperparameter layouts.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/update_kernel.hpp"
#include "comm/communicator.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace popart::backend_cpu {

namespace {

/// A storage value as float (the identity for float).
template <typename T> float ld(T x) { return static_cast<float>(x); }
/// A float rounded to the storage type, to nearest even (the identity for float).
template <typename T> T st(float x) { return static_cast<T>(x); }

/// A member function that updates elements [begin, end) for one set of storage types.
template <typename K> using RangeFn = void (K::*)(const KernelArgs &, int64_t, int64_t);

/// torch.optim.SGD with velocity scaling: hp = [lr, momentum, dampening, weightDecay,
/// velocityScaling, firstStep]. The velocity is stored multiplied by velocityScaling.
class SGDKernel : public UpdateKernel {
public:
  explicit SGDKernel(const ir::Op &op) : UpdateKernel(op), nesterov_(op.attrs.getInt("nesterov", 0) != 0) {
    dispatchUpdateTypes(op, [&](auto types) {
      using T = decltype(types);
      range_ = &SGDKernel::update<T>;
    });
  }
  void runRange(const KernelArgs &a, int64_t begin, int64_t end) override { (this->*range_)(a, begin, end); }

private:
  template <typename T> void update(const KernelArgs &a, int64_t begin, int64_t end) {
    using W = typename T::Weight;
    using G = typename T::Grad;
    using S = typename T::State;
    const float *hp = a.in<float>(2);
    const float lr = hp[0], mom = hp[1], damp = hp[2], wd = hp[3], vs = hp[4];
    const bool first = hp[5] != 0.0f;
    const float gs = *a.in<float>(3);
    const G *g = a.in<G>(1);
    W *w = a.out<W>(0);
    S *v = state<S>(a, 0);
    for (int64_t i = begin; i < end; ++i) {
      const float wi = ld(w[i]);
      float d = ld(g[i]) * gs + wd * wi;
      if (v) {
        const float vi = first ? vs * d : mom * ld(v[i]) + (1.0f - damp) * vs * d;
        v[i] = st<S>(vi);
        const float buf = vi / vs;
        d = nesterov_ ? d + mom * buf : buf;
      }
      w[i] = st<W>(wi - lr * d);
    }
  }

  bool nesterov_;
  RangeFn<SGDKernel> range_ = nullptr;
};

/// The Adam family: hp = [lr, beta1, beta2, eps, weightDecay, 1-beta1^t, 1-beta2^t,
/// maxWeightNorm] (bias corrections are 1 for the NoBias modes). Attribute mode: "adam",
/// "adamax" or "lamb"; decoupled: weight decay as AdamW (1) or as L2 on the gradient (0);
/// normsOverReplicas (LAMB on a shard of its weight, optimizer/sharding.hpp): 1 adds the
/// replicas' sums of squares, so that the trust ratio is that of the whole weight.
class AdamKernel : public UpdateKernel {
public:
  AdamKernel(const ir::Op &op, const KernelContext &context)
      : UpdateKernel(op), mode_(op.attrs.getString("mode", "adam")), decoupled_(op.attrs.getInt("decoupled", 1) != 0) {
    if (mode_ != "adam" && mode_ != "adamax" && mode_ != "lamb")
      throw error(op.debugName(), ": unknown mode '", mode_, "'");
    if (op.attrs.getInt("normsOverReplicas", 0) != 0) {
      if (mode_ != "lamb") throw error(op.debugName(), ": normsOverReplicas applies to mode lamb only, not ", mode_);
      if (!context.communicator)
        throw error(op.debugName(), ": normsOverReplicas needs the session's communicator (a replicated session)");
      communicator_ = context.communicator;
      gathered_.resize(2 * static_cast<size_t>(communicator_->size())); // run() allocates nothing
    }
    if (!op.hasOutput(1) || !op.hasOutput(2))
      throw error(op.debugName(), ": ", mode_, " needs both moments (outputs 1 and 2)");
    dispatchUpdateTypes(op, [&](auto types) {
      using T = decltype(types);
      range_ = mode_ == "adam" ? &AdamKernel::adam<T> : &AdamKernel::adamax<T>;
      lamb_ = &AdamKernel::lamb<T>;
    });
  }
  int64_t rangeElements() const override { return mode_ == "lamb" ? 0 : n_; } // LAMB needs whole norms
  void run(const KernelArgs &a) override {
    if (mode_ == "lamb")
      (this->*lamb_)(a);
    else
      UpdateKernel::run(a);
  }
  void runRange(const KernelArgs &a, int64_t begin, int64_t end) override { (this->*range_)(a, begin, end); }

private:
  /// The hyperparameters, gradient scale and buffers of one run.
  template <typename T> struct Buffers {
    float lr, b1, b2, eps, wd, bc1, bc2, maxNorm, gs, l2;
    const typename T::Grad *g;
    typename T::Weight *w;
    typename T::State *m;
    typename T::SecondMoment *v;
  };
  template <typename T> Buffers<T> buffers(const KernelArgs &a) const {
    const float *hp = a.in<float>(2);
    return {hp[0],
            hp[1],
            hp[2],
            hp[3],
            hp[4],
            hp[5],
            hp[6],
            hp[7],
            *a.in<float>(3),
            decoupled_ ? 0.0f : hp[4],
            a.in<typename T::Grad>(1),
            a.out<typename T::Weight>(0),
            a.out<typename T::State>(1),
            a.out<typename T::SecondMoment>(2)}; // both moments: checked at creation
  }

  template <typename T> void adam(const KernelArgs &a, int64_t begin, int64_t end) {
    using W = typename T::Weight;
    using S = typename T::State;
    using S2 = typename T::SecondMoment;
    const Buffers<T> b = buffers<T>(a);
    const float b1 = b.b1, b2 = b.b2, eps = b.eps, gs = b.gs, l2 = b.l2;
    const float stepSize = b.lr / b.bc1, bc2Sqrt = std::sqrt(b.bc2), decay = decoupled_ ? 1.0f - b.lr * b.wd : 1.0f;
    for (int64_t i = begin; i < end; ++i) {
      const float wi = ld(b.w[i]);
      const float gi = ld(b.g[i]) * gs + l2 * wi;
      const float mi = b1 * ld(b.m[i]) + (1.0f - b1) * gi;
      const float vi = b2 * ld(b.v[i]) + (1.0f - b2) * gi * gi;
      b.m[i] = st<S>(mi);
      b.v[i] = st<S2>(vi);
      b.w[i] = st<W>(wi * decay - stepSize * mi / (std::sqrt(vi) / bc2Sqrt + eps));
    }
  }

  template <typename T> void adamax(const KernelArgs &a, int64_t begin, int64_t end) {
    using W = typename T::Weight;
    using S = typename T::State;
    using S2 = typename T::SecondMoment;
    const Buffers<T> b = buffers<T>(a);
    const float b1 = b.b1, b2 = b.b2, eps = b.eps, gs = b.gs, l2 = b.l2;
    const float stepSize = b.lr / b.bc1, decay = 1.0f - b.lr * b.wd;
    for (int64_t i = begin; i < end; ++i) {
      float wi = ld(b.w[i]);
      const float gi = ld(b.g[i]) * gs + l2 * wi;
      const float mi = b1 * ld(b.m[i]) + (1.0f - b1) * gi;
      const float ui = std::max(b2 * ld(b.v[i]), std::abs(gi) + eps);
      b.m[i] = st<S>(mi);
      b.v[i] = st<S2>(ui);
      if (decoupled_) wi *= decay;
      b.w[i] = st<W>(wi - stepSize * mi / ui);
    }
  }

  /// LAMB: the first pass measures ‖w‖ and ‖u‖ of the new moments, the second applies the trust
  /// ratio and stores the moments. Both compute the new moments from the old ones in float, so
  /// that u is the same in both and never read back rounded to a 16-bit state (a second moment
  /// that underflowed fp16 would make u explode).
  template <typename T> void lamb(const KernelArgs &a) {
    using W = typename T::Weight;
    using S = typename T::State;
    using S2 = typename T::SecondMoment;
    const Buffers<T> b = buffers<T>(a);
    const float lr = b.lr, b1 = b.b1, b2 = b.b2, eps = b.eps, wd = b.wd, bc1 = b.bc1, bc2 = b.bc2, maxNorm = b.maxNorm,
                gs = b.gs, l2 = b.l2;
    const float wdU = decoupled_ ? wd : 0.0f;
    struct Moments {
      float m, v, u;
    };
    auto moments = [&](int64_t i, float wi) {
      const float gi = ld(b.g[i]) * gs + l2 * wi;
      const float mi = b1 * ld(b.m[i]) + (1.0f - b1) * gi;
      const float vi = b2 * ld(b.v[i]) + (1.0f - b2) * gi * gi;
      return Moments{mi, vi, (mi / bc1) / (std::sqrt(vi / bc2) + eps) + wdU * wi};
    };
    double wNorm2 = 0.0, uNorm2 = 0.0;
    for (int64_t i = 0; i < n_; ++i) {
      const float wi = ld(b.w[i]);
      const float u = moments(i, wi).u;
      wNorm2 += double(wi) * wi;
      uNorm2 += double(u) * u;
    }
    if (communicator_) {
      // Gathered and added in rank order rather than all-reduced: the same bits on every rank,
      // in double like the sums themselves.
      const double mine[2] = {wNorm2, uNorm2};
      communicator_->allGather(mine, gathered_.data(), 2, DataType::DOUBLE);
      wNorm2 = uNorm2 = 0.0;
      for (size_t r = 0; r < gathered_.size(); r += 2) {
        wNorm2 += gathered_[r];
        uNorm2 += gathered_[r + 1];
      }
    }
    double wNorm = std::sqrt(wNorm2), uNorm = std::sqrt(uNorm2);
    if (maxNorm > 0.0f) wNorm = std::min(wNorm, double(maxNorm));
    const float ratio = wNorm == 0.0 || uNorm == 0.0 ? 1.0f : static_cast<float>(wNorm / uNorm);
    for (int64_t i = 0; i < n_; ++i) {
      const float wi = ld(b.w[i]);
      const Moments next = moments(i, wi);
      b.m[i] = st<S>(next.m);
      b.v[i] = st<S2>(next.v);
      b.w[i] = st<W>(wi - lr * ratio * next.u);
    }
  }

  std::string mode_;
  bool decoupled_;
  RangeFn<AdamKernel> range_ = nullptr;
  void (AdamKernel::*lamb_)(const KernelArgs &) = nullptr;
  std::shared_ptr<comm::Communicator> communicator_; ///< with normsOverReplicas
  std::vector<double> gathered_;                     ///< every replica's {‖w‖², ‖u‖²}
};

/// RMSprop and AdaGrad: hp = [lr, alpha, momentum, eps, weightDecay, unused]; for AdaGrad lr
/// is already lr / (1 + (t-1)·lrDecay). State: square average (or sum), then the gradient
/// average (centered RMSprop) and the momentum buffer (RMSprop with momentum), each optional.
class AdaptiveKernel : public UpdateKernel {
public:
  explicit AdaptiveKernel(const ir::Op &op) : UpdateKernel(op), mode_(op.attrs.getString("mode", "rmsprop")) {
    dispatchUpdateTypes(op, [&](auto types) {
      using T = decltype(types);
      range_ = &AdaptiveKernel::update<T>;
    });
    if (mode_ != "rmsprop" && mode_ != "centeredrmsprop" && mode_ != "adagrad")
      throw error(op.debugName(), ": unknown mode '", mode_, "'");
  }
  void runRange(const KernelArgs &a, int64_t begin, int64_t end) override { (this->*range_)(a, begin, end); }

private:
  template <typename T> void update(const KernelArgs &a, int64_t begin, int64_t end) {
    using W = typename T::Weight;
    using G = typename T::Grad;
    using S = typename T::State;
    using S2 = typename T::SecondMoment;
    const float *hp = a.in<float>(2);
    const float lr = hp[0], alpha = hp[1], mom = hp[2], eps = hp[3], wd = hp[4];
    const float gs = *a.in<float>(3);
    const G *g = a.in<G>(1);
    W *w = a.out<W>(0);
    S2 *sq = state<S2>(a, 0);
    S2 *ga = state<S2>(a, 1);
    S *buf = state<S>(a, 2);
    if (mode_ == "adagrad") {
      for (int64_t i = begin; i < end; ++i) {
        const float wi = ld(w[i]);
        const float gi = ld(g[i]) * gs + wd * wi;
        const float sqi = ld(sq[i]) + gi * gi;
        sq[i] = st<S2>(sqi);
        w[i] = st<W>(wi - lr * gi / (std::sqrt(sqi) + eps));
      }
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      const float wi = ld(w[i]);
      const float gi = ld(g[i]) * gs + wd * wi;
      const float sqi = alpha * ld(sq[i]) + (1.0f - alpha) * gi * gi;
      sq[i] = st<S2>(sqi);
      float avg;
      if (ga) {
        const float gai = alpha * ld(ga[i]) + (1.0f - alpha) * gi;
        ga[i] = st<S2>(gai);
        avg = std::sqrt(sqi - gai * gai) + eps;
      } else {
        avg = std::sqrt(sqi) + eps;
      }
      if (buf) {
        const float bufi = mom * ld(buf[i]) + gi / avg;
        buf[i] = st<S>(bufi);
        w[i] = st<W>(wi - lr * bufi);
      } else {
        w[i] = st<W>(wi - lr * gi / avg);
      }
    }
  }

  std::string mode_;
  RangeFn<AdaptiveKernel> range_ = nullptr;
};

/// acc += g: of one type, or a 16-bit gradient into a FLOAT accumulator.
class AccumulateKernel : public Kernel {
public:
  explicit AccumulateKernel(const ir::Op &op) : n_(op.inInfo(0).elementCount()) {
    dispatchFloat(op.inInfo(0).dataType(), "Accumulate", [&](auto accTag) {
      using A = typename decltype(accTag)::type;
      dispatchFloat(op.inInfo(1).dataType(), "Accumulate", [&](auto gTag) {
        using G = typename decltype(gTag)::type;
        if constexpr (std::is_same_v<A, G> || std::is_same_v<A, float>)
          accumulate_ = &AccumulateKernel::accumulate<A, G>;
        else
          throw error(op.debugName(), ": cannot accumulate ", op.inInfo(1).toString(), " into ",
                      op.inInfo(0).toString());
      });
    });
  }
  void run(const KernelArgs &a) override { (this->*accumulate_)(a); }

private:
  template <typename A, typename G> void accumulate(const KernelArgs &a) {
    A *acc = a.out<A>(0);
    const G *g = a.in<G>(1);
    for (int64_t i = 0; i < n_; ++i)
      acc[i] = static_cast<A>(static_cast<compute_t<A>>(acc[i]) + static_cast<compute_t<A>>(g[i]));
  }

  int64_t n_;
  void (AccumulateKernel::*accumulate_)(const KernelArgs &) = nullptr;
};

class ResetVarKernel : public Kernel {
public:
  explicit ResetVarKernel(const ir::Op &op) : bytes_(static_cast<size_t>(op.inInfo(0).byteCount())) {}
  void run(const KernelArgs &a) override { std::memset(a.outputs[0], 0, bytes_); }

private:
  size_t bytes_;
};

class CopyVarKernel : public Kernel {
public:
  explicit CopyVarKernel(const ir::Op &op) : bytes_(static_cast<size_t>(op.inInfo(0).byteCount())) {}
  void run(const KernelArgs &a) override {
    if (a.outputs[0] != a.inputs[1]) std::memmove(a.outputs[0], a.inputs[1], bytes_);
  }

private:
  size_t bytes_;
};

/// Whether every element of every input (FLOAT, FLOAT16, BFLOAT16 or DOUBLE) is finite: an fp16
/// gradient that overflowed is an inf like any other.
class AllFiniteKernel : public Kernel {
public:
  explicit AllFiniteKernel(const ir::Op &op) {
    for (const ir::Tensor *t : op.inputs) {
      counts_.push_back(t->info().elementCount());
      types_.push_back(t->info().dataType());
    }
  }
  void run(const KernelArgs &a) override {
    bool finite = true;
    for (size_t k = 0; k < counts_.size() && finite; ++k)
      finite = dispatchFloat(types_[k], "AllFinite", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = compute_t<T>;
        const T *x = a.in<T>(k);
        // Summing is branch-free and vectorises; an inf or NaN anywhere makes the sum non-finite
        // (0 * x turns every finite value into 0 and every inf/NaN into NaN).
        C s = 0;
        for (int64_t i = 0; i < counts_[k]; ++i)
          s += C(0) * static_cast<C>(x[i]);
        return s == C(0);
      });
    *a.out<bool>(0) = finite;
  }

private:
  std::vector<int64_t> counts_;
  std::vector<DataType> types_;
};

/// GradientStatistics: how many elements of the gradients (inputs 1...) have |g| below the
/// `edge` attribute, and how many do not, into the INT64 [2] counts (output 0, in place of input
/// 0). NaN fails every comparison, so it lands in the upper bin with inf.
class GradientStatisticsKernel : public Kernel {
public:
  explicit GradientStatisticsKernel(const ir::Op &op) : edge_(op.attrs.getFloat("edge")) {
    for (size_t k = 1; k < op.inputCount(); ++k) {
      counts_.push_back(op.inInfo(k).elementCount());
      types_.push_back(op.inInfo(k).dataType());
    }
  }
  void run(const KernelArgs &a) override {
    int64_t below = 0, total = 0;
    for (size_t k = 0; k < counts_.size(); ++k) {
      total += counts_[k];
      below += dispatchFloat(types_[k], "GradientStatistics", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = compute_t<T>;
        const T *x = a.in<T>(k + 1);
        const C edge = static_cast<C>(edge_);
        int64_t n = 0;
        for (int64_t i = 0; i < counts_[k]; ++i)
          n += std::fabs(static_cast<C>(x[i])) < edge ? 1 : 0;
        return n;
      });
    }
    int64_t *out = a.out<int64_t>(0);
    out[0] = below;
    out[1] = total - below;
  }

private:
  float edge_;
  std::vector<int64_t> counts_;
  std::vector<DataType> types_;
};

bool isFloating(DataType t) {
  return t == DataType::FLOAT || t == DataType::FLOAT16 || t == DataType::BFLOAT16 || t == DataType::DOUBLE;
}

bool floatingInputs(const ir::Op &op) {
  for (const ir::Tensor *t : op.inputs)
    if (t && !isFloating(t->info().dataType())) return false;
  return true;
}

/// GradientStatistics: INT64 counts, floating gradients.
bool gradientStatisticsTypes(const ir::Op &op) {
  if (op.inputCount() < 2 || op.inInfo(0).dataType() != DataType::INT64) return false;
  for (size_t k = 1; k < op.inputCount(); ++k)
    if (!op.hasInput(k) || !isFloating(op.inInfo(k).dataType())) return false;
  return true;
}

/// Accumulate of one floating type, or a 16-bit gradient into a FLOAT accumulator.
bool accumulateTypes(const ir::Op &op) {
  if (op.inputCount() != 2 || !floatingInputs(op)) return false;
  const DataType acc = op.inInfo(0).dataType(), g = op.inInfo(1).dataType();
  return acc == g || (acc == DataType::FLOAT && g != DataType::DOUBLE);
}

} // namespace

void registerReferenceVarUpdateKernels(KernelRegistry &r) {
  auto add = [&](const char *type, KernelFactory create, bool (*supports)(const ir::Op &)) {
    r.add({"ai.graphcore", type, KernelProvider::Reference, supports, create});
  };
  add("SGDUpdate", makeKernel<SGDKernel>, updateTypesSupported);
  add("AdamUpdate", makeKernel<AdamKernel>, updateTypesSupported);
  add("AdaptiveUpdate", makeKernel<AdaptiveKernel>, updateTypesSupported);
  add("Accumulate", makeKernel<AccumulateKernel>, accumulateTypes);
  add("ResetVar", makeKernel<ResetVarKernel>, nullptr);
  add("CopyVar", makeKernel<CopyVarKernel>, nullptr);
  add("AllFinite", makeKernel<AllFiniteKernel>, floatingInputs);
  add("GradientStatistics", makeKernel<GradientStatisticsKernel>, gradientStatisticsTypes);
}

} // namespace popart::backend_cpu
