// Kernels of the ai.graphcore in-place training ops (ir/ops/varupdate.cpp): optimiser updates,
// gradient accumulation, variable copies and the finiteness check. The formulas follow
// torch.optim (1.13) step for step; docs/training.md lists the hyperparameter layouts.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/update_kernel.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace popart::backend_cpu {

namespace {

/// torch.optim.SGD with velocity scaling: hp = [lr, momentum, dampening, weightDecay,
/// velocityScaling, firstStep]. The velocity is stored multiplied by velocityScaling.
class SGDKernel : public UpdateKernel {
public:
  explicit SGDKernel(const ir::Op &op) : UpdateKernel(op), nesterov_(op.attrs.getInt("nesterov", 0) != 0) {}
  void runRange(const KernelArgs &a, int64_t begin, int64_t end) override {
    const float *hp = a.in<float>(2);
    const float lr = hp[0], mom = hp[1], damp = hp[2], wd = hp[3], vs = hp[4];
    const bool first = hp[5] != 0.0f;
    const float gs = *a.in<float>(3);
    const float *g = a.in<float>(1);
    float *w = a.out<float>(0);
    float *v = state(a, 0);
    for (int64_t i = begin; i < end; ++i) {
      float d = g[i] * gs + wd * w[i];
      if (v) {
        v[i] = first ? vs * d : mom * v[i] + (1.0f - damp) * vs * d;
        float buf = v[i] / vs;
        d = nesterov_ ? d + mom * buf : buf;
      }
      w[i] -= lr * d;
    }
  }

private:
  bool nesterov_;
};

/// The Adam family: hp = [lr, beta1, beta2, eps, weightDecay, 1-beta1^t, 1-beta2^t,
/// maxWeightNorm] (bias corrections are 1 for the NoBias modes). Attribute mode: "adam",
/// "adamax" or "lamb"; decoupled: weight decay as AdamW (1) or as L2 on the gradient (0).
class AdamKernel : public UpdateKernel {
public:
  explicit AdamKernel(const ir::Op &op)
      : UpdateKernel(op), mode_(op.attrs.getString("mode", "adam")), decoupled_(op.attrs.getInt("decoupled", 1) != 0) {
    if (mode_ != "adam" && mode_ != "adamax" && mode_ != "lamb")
      throw error(op.debugName(), ": unknown mode '", mode_, "'");
    if (!op.hasOutput(1) || !op.hasOutput(2))
      throw error(op.debugName(), ": ", mode_, " needs both moments (outputs 1 and 2)");
  }
  int64_t rangeElements() const override { return mode_ == "lamb" ? 0 : n_; } // LAMB needs whole norms
  void run(const KernelArgs &a) override {
    if (mode_ == "lamb")
      lamb(a);
    else
      UpdateKernel::run(a);
  }
  void runRange(const KernelArgs &a, int64_t begin, int64_t end) override {
    const Buffers b = buffers(a);
    const float lr = b.lr, b1 = b.b1, b2 = b.b2, eps = b.eps, wd = b.wd, bc1 = b.bc1, bc2 = b.bc2, gs = b.gs, l2 = b.l2;
    const float *g = b.g;
    float *w = b.w, *m = b.m, *v = b.v;
    if (mode_ == "adam") {
      const float stepSize = lr / bc1, bc2Sqrt = std::sqrt(bc2), decay = decoupled_ ? 1.0f - lr * wd : 1.0f;
      for (int64_t i = begin; i < end; ++i) {
        float gi = g[i] * gs + l2 * w[i];
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        w[i] = w[i] * decay - stepSize * m[i] / (std::sqrt(v[i]) / bc2Sqrt + eps);
      }
    } else { // adamax
      const float stepSize = lr / bc1, decay = 1.0f - lr * wd;
      for (int64_t i = begin; i < end; ++i) {
        float gi = g[i] * gs + l2 * w[i];
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = std::max(b2 * v[i], std::abs(gi) + eps);
        if (decoupled_) w[i] *= decay;
        w[i] -= stepSize * m[i] / v[i];
      }
    }
  }

private:
  /// The hyperparameters, gradient scale and buffers of one run.
  struct Buffers {
    float lr, b1, b2, eps, wd, bc1, bc2, maxNorm, gs, l2;
    const float *g;
    float *w, *m, *v;
  };
  Buffers buffers(const KernelArgs &a) const {
    const float *hp = a.in<float>(2);
    return {hp[0],          hp[1],           hp[2],           hp[3],           hp[4],
            hp[5],          hp[6],           hp[7],           *a.in<float>(3), decoupled_ ? 0.0f : hp[4],
            a.in<float>(1), a.out<float>(0), a.out<float>(1), a.out<float>(2)}; // both moments: checked at creation
  }

  /// LAMB: the first pass updates the moments and measures ‖w‖ and ‖u‖, the second applies the
  /// trust ratio; u is recomputed rather than stored.
  void lamb(const KernelArgs &a) {
    const Buffers b = buffers(a);
    const float lr = b.lr, b1 = b.b1, b2 = b.b2, eps = b.eps, wd = b.wd, bc1 = b.bc1, bc2 = b.bc2, maxNorm = b.maxNorm,
                gs = b.gs, l2 = b.l2;
    const float *g = b.g;
    float *w = b.w, *m = b.m, *v = b.v;
    {
      const float wdU = decoupled_ ? wd : 0.0f;
      double wNorm2 = 0.0, uNorm2 = 0.0;
      for (int64_t i = 0; i < n_; ++i) {
        float gi = g[i] * gs + l2 * w[i];
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        float u = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps) + wdU * w[i];
        wNorm2 += double(w[i]) * w[i];
        uNorm2 += double(u) * u;
      }
      double wNorm = std::sqrt(wNorm2), uNorm = std::sqrt(uNorm2);
      if (maxNorm > 0.0f) wNorm = std::min(wNorm, double(maxNorm));
      const float ratio = wNorm == 0.0 || uNorm == 0.0 ? 1.0f : static_cast<float>(wNorm / uNorm);
      for (int64_t i = 0; i < n_; ++i) {
        float u = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps) + wdU * w[i];
        w[i] -= lr * ratio * u;
      }
    }
  }

  std::string mode_;
  bool decoupled_;
};

/// RMSprop and AdaGrad: hp = [lr, alpha, momentum, eps, weightDecay, unused]; for AdaGrad lr
/// is already lr / (1 + (t-1)·lrDecay). State: square average (or sum), then the gradient
/// average (centered RMSprop) and the momentum buffer (RMSprop with momentum), each optional.
class AdaptiveKernel : public UpdateKernel {
public:
  explicit AdaptiveKernel(const ir::Op &op) : UpdateKernel(op), mode_(op.attrs.getString("mode", "rmsprop")) {
    if (mode_ != "rmsprop" && mode_ != "centeredrmsprop" && mode_ != "adagrad")
      throw error(op.debugName(), ": unknown mode '", mode_, "'");
  }
  void runRange(const KernelArgs &a, int64_t begin, int64_t end) override {
    const float *hp = a.in<float>(2);
    const float lr = hp[0], alpha = hp[1], mom = hp[2], eps = hp[3], wd = hp[4];
    const float gs = *a.in<float>(3);
    const float *g = a.in<float>(1);
    float *w = a.out<float>(0);
    float *sq = state(a, 0);
    float *ga = state(a, 1);
    float *buf = state(a, 2);
    if (mode_ == "adagrad") {
      for (int64_t i = begin; i < end; ++i) {
        float gi = g[i] * gs + wd * w[i];
        sq[i] += gi * gi;
        w[i] -= lr * gi / (std::sqrt(sq[i]) + eps);
      }
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      float gi = g[i] * gs + wd * w[i];
      sq[i] = alpha * sq[i] + (1.0f - alpha) * gi * gi;
      float avg;
      if (ga) {
        ga[i] = alpha * ga[i] + (1.0f - alpha) * gi;
        avg = std::sqrt(sq[i] - ga[i] * ga[i]) + eps;
      } else {
        avg = std::sqrt(sq[i]) + eps;
      }
      if (buf) {
        buf[i] = mom * buf[i] + gi / avg;
        w[i] -= lr * buf[i];
      } else {
        w[i] -= lr * gi / avg;
      }
    }
  }

private:
  std::string mode_;
};

/// acc += g (any float type the plan gives; FLOAT here).
class AccumulateKernel : public Kernel {
public:
  explicit AccumulateKernel(const ir::Op &op) : n_(op.inInfo(0).elementCount()) {}
  void run(const KernelArgs &a) override {
    float *acc = a.out<float>(0);
    const float *g = a.in<float>(1);
    for (int64_t i = 0; i < n_; ++i)
      acc[i] += g[i];
  }

private:
  int64_t n_;
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

class AllFiniteKernel : public Kernel {
public:
  explicit AllFiniteKernel(const ir::Op &op) {
    for (const ir::Tensor *t : op.inputs)
      counts_.push_back(t->info().elementCount());
  }
  void run(const KernelArgs &a) override {
    bool finite = true;
    for (size_t k = 0; k < counts_.size() && finite; ++k) {
      const float *x = a.in<float>(k);
      // Summing is branch-free and vectorises; an inf or NaN anywhere makes the sum non-finite
      // (0 * x turns every finite value into 0 and every inf/NaN into NaN).
      float s = 0.0f;
      for (int64_t i = 0; i < counts_[k]; ++i)
        s += 0.0f * x[i];
      finite = s == 0.0f;
    }
    *a.out<bool>(0) = finite;
  }

private:
  std::vector<int64_t> counts_;
};

bool floatInputs(const ir::Op &op) {
  for (const ir::Tensor *t : op.inputs)
    if (t && t->info().dataType() != DataType::FLOAT) return false;
  return true;
}

} // namespace

void registerReferenceVarUpdateKernels(KernelRegistry &r) {
  auto add = [&](const char *type, KernelFactory create, bool (*supports)(const ir::Op &)) {
    r.add({"ai.graphcore", type, KernelProvider::Reference, supports, create});
  };
  add("SGDUpdate", makeKernel<SGDKernel>, floatInputs);
  add("AdamUpdate", makeKernel<AdamKernel>, floatInputs);
  add("AdaptiveUpdate", makeKernel<AdaptiveKernel>, floatInputs);
  add("Accumulate", makeKernel<AccumulateKernel>, floatInputs);
  add("ResetVar", makeKernel<ResetVarKernel>, nullptr);
  add("CopyVar", makeKernel<CopyVarKernel>, nullptr);
  add("AllFinite", makeKernel<AllFiniteKernel>, floatInputs);
}

} // namespace popart::backend_cpu
