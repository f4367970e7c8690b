// Reference kernels: SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss and
// SoftmaxCrossEntropyLossGrad, plain loops in double (fast/loss.cpp has the vectorised f32 ones).

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loss_shape.hpp"
#include "core/dispatch.hpp"

#include <cmath>
#include <limits>
#include <optional>

namespace popart::backend_cpu {

namespace {

template <typename T> double toDouble(T v) { return static_cast<double>(static_cast<compute_t<T>>(v)); }
template <typename T> T fromDouble(double v) { return static_cast<T>(static_cast<compute_t<T>>(v)); }

/// log(sum_k exp(x[k * stride])) over \p classes values, shifted by their maximum so that exp
/// cannot overflow.
template <typename T> double logSumExp(const T *x, int64_t classes, int64_t stride) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k < classes; ++k)
    m = std::max(m, toDouble(x[k * stride]));
  double sum = 0;
  for (int64_t k = 0; k < classes; ++k)
    sum += std::exp(toDouble(x[k * stride]) - m);
  return m + std::log(sum);
}

class LossKernel : public Kernel, LossShape {
public:
  explicit LossKernel(const ir::Op &op)
      : LossShape(op), name_(op.debugName()), type_(op.inInfo(0).dataType()), labelType_(op.inInfo(1).dataType()),
        softmax_(op.type == "SoftmaxCrossEntropyLoss"), hasWeights_(op.hasInput(2)) {
    logProb_.resize(static_cast<size_t>(softmax_ ? c_ : 0));
  }

  void run(const KernelArgs &a) override {
    dispatchFloat(type_, name_.c_str(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      dispatchAll(labelType_, name_.c_str(), [&](auto ltag) {
        using L = typename decltype(ltag)::type;
        if constexpr (std::is_same_v<L, int32_t> || std::is_same_v<L, int64_t>)
          compute<T, L>(a);
        else
          throw error(name_, ": labels must be INT32 or INT64");
      });
    });
  }

private:
  /// Weight of \p label at position \p k; throws if it is out of range (and not ignored).
  template <typename T, typename L> double labelWeight(L label, int64_t k, const T *w) const {
    auto l = static_cast<int64_t>(label);
    if (ignore_ && l == *ignore_) return 0.0;
    if (l < 0 || l >= c_) throw error(name_, ": label ", l, " at position ", k, " is out of range [0, ", c_, ")");
    return w ? toDouble(w[l]) : 1.0;
  }

  template <typename T, typename L> void compute(const KernelArgs &a) {
    const T *x = a.in<T>(0);
    const L *labels = a.in<L>(1);
    const T *w = hasWeights_ ? a.in<T>(2) : nullptr;
    T *loss = a.out<T>(0);
    T *logProbOut = softmax_ && a.hasOutput(1) ? a.out<T>(1) : nullptr;
    double total = 0, weightSum = 0;
    for (int64_t n = 0; n < n_; ++n)
      for (int64_t d = 0; d < d_; ++d) {
        const T *px = x + n * c_ * d_ + d; // class k at px[k * d_]
        if (softmax_) {
          const double lse = logSumExp(px, c_, d_);
          for (int64_t k = 0; k < c_; ++k) {
            logProb_[k] = toDouble(px[k * d_]) - lse;
            if (logProbOut) logProbOut[n * c_ * d_ + k * d_ + d] = fromDouble<T>(logProb_[k]);
          }
        }
        int64_t label = static_cast<int64_t>(labels[n * d_ + d]);
        double weight = labelWeight(labels[n * d_ + d], n * d_ + d, w), value = 0;
        if (!(ignore_ && label == *ignore_)) value = -(softmax_ ? logProb_[label] : toDouble(px[label * d_])) * weight;
        if (reduction_ == 0) loss[n * d_ + d] = fromDouble<T>(value);
        total += value;
        weightSum += weight;
      }
    if (reduction_ == 1) loss[0] = fromDouble<T>(total);
    if (reduction_ == 2) loss[0] = fromDouble<T>(total / weightSum);
  }

  std::string name_;
  DataType type_, labelType_;
  bool softmax_, hasWeights_;
  std::vector<double> logProb_;
};

/// dX = g·w·(softmax(x) − onehot(label)) per position, with w the label's class weight (0 for the
/// ignored class and labels out of range) and g = dY, dY / Σw (mean) or dY[n, d] (none): the
/// gradient of SoftmaxCrossEntropyLoss in one pass, without materialising the one-hot mask, in
/// double. Optional outputs: the class sums of dX (fuseLossGradClassSums) and the forward's loss
/// (fuseLossWithGradient). \p T is the type of the scores, dX and the class sums, \p W the weights,
/// \p S that of dY and the loss (FLOAT for 16-bit scores, which are computed in double too).
template <typename T, typename W = T, typename S = T> class SoftmaxCrossEntropyGradKernel : public Kernel, LossShape {
public:
  explicit SoftmaxCrossEntropyGradKernel(const ir::Op &op)
      : LossShape(op), name_(op.debugName()), labelType_(op.inInfo(1).dataType()), hasWeights_(op.hasInput(2)) {
    if (op.hasOutput(2)) positionLoss_.assign(static_cast<size_t>(n_ * d_), 0.0);
  }
  int inPlaceInput() const override { return 0; } // each x is read before its dX is written
  void run(const KernelArgs &a) override {
    const T *x = a.in<T>(0);
    const W *weights = hasWeights_ ? a.in<W>(2) : nullptr;
    const S *dy = a.in<S>(3);
    T *dx = a.out<T>(0);
    auto label = [&](int64_t k) -> int64_t {
      return labelType_ == DataType::INT64 ? a.in<int64_t>(1)[k] : a.in<int32_t>(1)[k];
    };
    auto weight = [&](int64_t l) -> double {
      if (l < 0 || l >= c_ || (ignore_ && l == *ignore_)) return 0.0;
      return weights ? toDouble(weights[l]) : 1.0;
    };
    const int64_t positions = n_ * d_;
    double denom = 1.0;
    if (reduction_ == 2) {
      denom = 0.0;
      for (int64_t k = 0; k < positions; ++k)
        denom += weight(label(k));
    }
    const bool withLoss = a.hasOutput(2);
    if (withLoss)
      for (int64_t k = 0; k < positions; ++k) {
        int64_t l = label(k);
        if ((l < 0 || l >= c_) && !(ignore_ && l == *ignore_))
          throw error(name_, ": label ", l, " at position ", k, " is out of range [0, ", c_, ")");
      }
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < positions; ++k) {
      int64_t n = k / d_, i = k % d_;
      const T *xs = x + n * c_ * d_ + i; // class c at xs[c * d_]
      T *out = dx + n * c_ * d_ + i;
      int64_t l = label(k);
      double w = weight(l);
      if (withLoss) positionLoss_[static_cast<size_t>(k)] = 0.0;
      if (w == 0.0) {
        for (int64_t c = 0; c < c_; ++c)
          out[c * d_] = fromDouble<T>(0.0);
        continue;
      }
      double g = toDouble(reduction_ == 0 ? dy[k] : dy[0]) * w / denom;
      const double lse = logSumExp(xs, c_, d_);
      if (withLoss) positionLoss_[static_cast<size_t>(k)] = -(toDouble(xs[l * d_]) - lse) * w;
      for (int64_t c = 0; c < c_; ++c) // x[c] is read before dX[c] overwrites it (in place)
        out[c * d_] = fromDouble<T>(g * (std::exp(toDouble(xs[c * d_]) - lse) - (c == l ? 1.0 : 0.0)));
    }
    if (a.hasOutput(1)) {
      T *sums = a.out<T>(1);
#pragma omp parallel for schedule(static)
      for (int64_t c = 0; c < c_; ++c) {
        double s = 0;
        for (int64_t k = 0; k < positions; ++k)
          s += toDouble(dx[(k / d_) * c_ * d_ + c * d_ + k % d_]);
        sums[c] = fromDouble<T>(s);
      }
    }
    if (withLoss) {
      S *loss = a.out<S>(2);
      double total = 0;
      for (int64_t k = 0; k < positions; ++k) {
        if (reduction_ == 0) loss[k] = fromDouble<S>(positionLoss_[static_cast<size_t>(k)]);
        total += positionLoss_[static_cast<size_t>(k)];
      }
      if (reduction_ == 1) loss[0] = fromDouble<S>(total);
      if (reduction_ == 2) loss[0] = fromDouble<S>(total / denom);
    }
  }

private:
  std::string name_;
  DataType labelType_;
  bool hasWeights_;
  std::vector<double> positionLoss_; ///< each position's term of the forward's loss
};

/// 16-bit scores \p T with FLOAT dY, and weights of type \p T or FLOAT.
template <typename T> std::unique_ptr<Kernel> createSixteenBitSoftmaxCrossEntropyGrad(const ir::Op &op) {
  if (op.hasInput(2) && op.inInfo(2).dataType() != DataType::FLOAT)
    return std::make_unique<SoftmaxCrossEntropyGradKernel<T, T, float>>(op);
  return std::make_unique<SoftmaxCrossEntropyGradKernel<T, float, float>>(op);
}

std::unique_ptr<Kernel> createSoftmaxCrossEntropyGrad(const ir::Op &op) {
  switch (op.inInfo(0).dataType()) {
  case DataType::DOUBLE: return std::make_unique<SoftmaxCrossEntropyGradKernel<double>>(op);
  case DataType::BFLOAT16: return createSixteenBitSoftmaxCrossEntropyGrad<BFloat16>(op);
  case DataType::FLOAT16: return createSixteenBitSoftmaxCrossEntropyGrad<Half>(op);
  default: return std::make_unique<SoftmaxCrossEntropyGradKernel<float>>(op);
  }
}

} // namespace

void registerReferenceLossKernels(KernelRegistry &r) {
  r.add({"ai.graphcore", "SoftmaxCrossEntropyLossGrad", KernelProvider::Reference, nullptr,
         createSoftmaxCrossEntropyGrad});
  r.add({"ai.onnx", "SoftmaxCrossEntropyLoss", KernelProvider::Reference, nullptr, makeKernel<LossKernel>});
  r.add({"ai.onnx", "NegativeLogLikelihoodLoss", KernelProvider::Reference, nullptr, makeKernel<LossKernel>});
}

} // namespace popart::backend_cpu
