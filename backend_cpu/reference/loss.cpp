// Reference kernels: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/fast/vecloops.hpp"
#include "core/dispatch.hpp"

#include <cmath>
#include <limits>
#include <optional>

namespace popart::backend_cpu {

namespace {

template <typename T> double toDouble(T v) { return static_cast<double>(static_cast<compute_t<T>>(v)); }
template <typename T> T fromDouble(double v) { return static_cast<T>(static_cast<compute_t<T>>(v)); }

/// What both loss kernels read from the op: scores [N, C, D...] as N·C·D, the reduction
/// (0 none, 1 sum, 2 mean) and the optional ignored class.
struct LossShape {
  explicit LossShape(const ir::Op &op) {
    const Shape &s = op.inInfo(0).shape();
    n_ = s[0];
    c_ = s[1];
    for (size_t i = 2; i < s.size(); ++i)
      d_ *= s[i];
    std::string red = op.attrs.getString("reduction", "mean");
    reduction_ = red == "none" ? 0 : red == "sum" ? 1 : 2;
    if (op.attrs.has("ignore_index")) ignore_ = op.attrs.getInt("ignore_index");
  }
  int64_t n_ = 0, c_ = 0, d_ = 1;
  int reduction_ = 2;
  std::optional<int64_t> ignore_;
};

class LossKernel : public Kernel, LossShape {
public:
  explicit LossKernel(const ir::Op &op)
      : LossShape(op), name_(op.debugName()), type_(op.inInfo(0).dataType()), labelType_(op.inInfo(1).dataType()),
        softmax_(op.type == "SoftmaxCrossEntropyLoss"), hasWeights_(op.hasInput(2)) {
    logProb_.resize(static_cast<size_t>(softmax_ ? c_ : 0));
    rowsF32_ = softmax_ && d_ == 1 && type_ == DataType::FLOAT;
    if (rowsF32_) {
      rowLoss_.resize(static_cast<size_t>(n_));
      rowWeight_.resize(static_cast<size_t>(n_));
    }
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

  /// f32 scores [N, C]: rows in parallel with vectorised exp, each row's loss kept apart and
  /// summed in row order afterwards, so the result does not depend on the thread count.
  template <typename L> void computeRowsF32(const KernelArgs &a) {
    const float *x = a.in<float>(0);
    const L *labels = a.in<L>(1);
    const float *w = hasWeights_ ? a.in<float>(2) : nullptr;
    float *loss = a.out<float>(0);
    float *logProbOut = a.hasOutput(1) ? a.out<float>(1) : nullptr;
    for (int64_t n = 0; n < n_; ++n)
      rowWeight_[n] = labelWeight(labels[n], n, w);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < n_; ++n) {
      const float *row = x + n * c_;
      float m = vec::max(row, c_);
      float lse = m + std::log(vec::expSubSum(row, m, nullptr, c_));
      if (logProbOut) vec::addScalar(row, -lse, logProbOut + n * c_, c_);
      auto label = static_cast<int64_t>(labels[n]); // in range unless ignored (checked above)
      rowLoss_[n] = ignore_ && label == *ignore_ ? 0.0 : -(static_cast<double>(row[label]) - lse) * rowWeight_[n];
    }
    double total = 0, weightSum = 0;
    for (int64_t n = 0; n < n_; ++n) {
      if (reduction_ == 0) loss[n] = static_cast<float>(rowLoss_[n]);
      total += rowLoss_[n];
      weightSum += rowWeight_[n];
    }
    if (reduction_ == 1) loss[0] = static_cast<float>(total);
    if (reduction_ == 2) loss[0] = static_cast<float>(total / weightSum);
  }

  template <typename T, typename L> void compute(const KernelArgs &a) {
    if constexpr (std::is_same_v<T, float>)
      if (rowsF32_) return computeRowsF32<L>(a);
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
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t k = 0; k < c_; ++k)
            m = std::max(m, toDouble(px[k * d_]));
          double sum = 0;
          for (int64_t k = 0; k < c_; ++k)
            sum += std::exp(toDouble(px[k * d_]) - m);
          double lse = m + std::log(sum);
          for (int64_t k = 0; k < c_; ++k) {
            logProb_[k] = toDouble(px[k * d_]) - lse;
            if (logProbOut) logProbOut[n * c_ * d_ + k * d_ + d] = fromDouble<T>(logProb_[k]);
          }
        }
        int64_t label = static_cast<int64_t>(labels[n * d_ + d]);
        double weight = labelWeight(labels[n * d_ + d], n * d_ + d, w), value = 0;
        if (!(ignore_ && label == *ignore_))
          value = -(softmax_ ? logProb_[label] : toDouble(px[label * d_])) * weight;
        if (reduction_ == 0) loss[n * d_ + d] = fromDouble<T>(value);
        total += value;
        weightSum += weight;
      }
    if (reduction_ == 1) loss[0] = fromDouble<T>(total);
    if (reduction_ == 2) loss[0] = fromDouble<T>(total / weightSum);
  }

  std::string name_;
  DataType type_, labelType_;
  bool softmax_, hasWeights_, rowsF32_ = false;
  std::vector<double> logProb_;
  std::vector<double> rowLoss_, rowWeight_;
};


/// dX = g·w·(softmax(x) − onehot(label)) per position, with w the label's class weight (0 for the
/// ignored class and labels out of range) and g = dY, dY / Σw (mean) or dY[n, d] (none): the
/// gradient of SoftmaxCrossEntropyLoss in one pass, without materialising the one-hot mask.
template <typename T> class SoftmaxCrossEntropyGradKernel : public Kernel, LossShape {
public:
  explicit SoftmaxCrossEntropyGradKernel(const ir::Op &op)
      : LossShape(op), labelType_(op.inInfo(1).dataType()), hasWeights_(op.hasInput(2)) {
    if (op.hasOutput(1)) partial_.assign(static_cast<size_t>((n_ * d_ + kBlock - 1) / kBlock * c_), T(0));
    if (op.hasOutput(2)) positionLoss_.assign(static_cast<size_t>(n_ * d_), 0.0);
    name_ = op.debugName();
  }
  int inPlaceInput() const override { return 0; } // dX over the logits, row by row
  void run(const KernelArgs &a) override {
    const T *x = a.in<T>(0);
    const T *weights = hasWeights_ ? a.in<T>(2) : nullptr;
    const T *dy = a.in<T>(3);
    T *dx = a.out<T>(0);
    auto label = [&](int64_t k) -> int64_t {
      return labelType_ == DataType::INT64 ? a.in<int64_t>(1)[k] : a.in<int32_t>(1)[k];
    };
    auto weight = [&](int64_t l) -> double {
      if (l < 0 || l >= c_ || (ignore_ && l == *ignore_)) return 0.0;
      return weights ? static_cast<double>(weights[l]) : 1.0;
    };
    double denom = 1.0;
    if (reduction_ == 2) {
      denom = 0.0;
      for (int64_t k = 0; k < n_ * d_; ++k)
        denom += weight(label(k));
    }
    const int64_t positions = n_ * d_;
    const bool withLoss = a.hasOutput(2); // fuseLossWithGradient: the forward's loss too
    if (withLoss)
      for (int64_t k = 0; k < positions; ++k) {
        int64_t l = label(k);
        if ((l < 0 || l >= c_) && !(ignore_ && l == *ignore_))
          throw error(name_, ": label ", l, " at position ", k, " is out of range [0, ", c_, ")");
      }
    // Position k's gradient (a row of C classes, strided by D), written over x when the plan
    // runs this kernel in place (inPlaceInput), and added to \p part when that is not null.
    auto position = [&](int64_t k, T *part) {
      int64_t n = k / d_, i = k % d_;
      const T *xs = x + n * c_ * d_ + i;
      T *out = dx + n * c_ * d_ + i;
      int64_t l = label(k);
      double w = weight(l);
      if (withLoss) positionLoss_[static_cast<size_t>(k)] = 0.0;
      if (w == 0.0) {
        for (int64_t c = 0; c < c_; ++c)
          out[c * d_] = T(0);
        return;
      }
      double g = (reduction_ == 0 ? static_cast<double>(dy[k]) : static_cast<double>(dy[0])) * w / denom;
      const double xl = static_cast<double>(xs[l * d_]); // read before out overwrites it
      if constexpr (std::is_same_v<T, float>) {
        if (d_ == 1) { // contiguous class row: vectorised
          float mx = vec::max(xs, c_);
          float sum = vec::expSubSum(xs, mx, out, c_);
          if (withLoss) // as the forward kernel: -(x_l − log Σ e^x)·w
            positionLoss_[static_cast<size_t>(k)] = -(xl - (mx + std::log(sum))) * w;
          if (part) vec::scaleAccumulate(out, static_cast<float>(g) / sum, out, part, c_);
          else vec::scale(out, static_cast<float>(g) / sum, out, c_);
          out[l] -= static_cast<float>(g);
          if (part) part[l] -= static_cast<float>(g);
          return;
        }
      }
      T mx = xs[0];
      for (int64_t c = 1; c < c_; ++c)
        mx = std::max(mx, xs[c * d_]);
      T sum = 0;
      for (int64_t c = 0; c < c_; ++c) {
        T e = std::exp(xs[c * d_] - mx);
        out[c * d_] = e;
        sum += e;
      }
      if (withLoss)
        positionLoss_[static_cast<size_t>(k)] =
            -(xl - (static_cast<double>(mx) + std::log(static_cast<double>(sum)))) * w;
      T scale = static_cast<T>(g) / sum;
      for (int64_t c = 0; c < c_; ++c)
        out[c * d_] *= scale;
      out[l * d_] -= static_cast<T>(g);
      if (part)
        for (int64_t c = 0; c < c_; ++c)
          part[c] += out[c * d_];
    };

    if (!a.hasOutput(1)) {
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < positions; ++k)
        position(k, nullptr);
      if (withLoss) writeLoss(a.out<T>(2), denom);
      return;
    }
    // With the class sums (fuseLossGradClassSums): each block of kBlock positions sums its rows
    // while they are in cache, then the blocks are added in order in double, so the result does
    // not depend on the thread count.
    const int64_t blocks = (positions + kBlock - 1) / kBlock;
    T *partial = partial_.data();
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      T *part = partial + b * c_;
      std::fill(part, part + c_, T(0));
      for (int64_t k = b * kBlock; k < std::min(positions, (b + 1) * kBlock); ++k)
        position(k, part);
    }
    T *sums = a.out<T>(1);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < c_; ++c) {
      double s = 0;
      for (int64_t b = 0; b < blocks; ++b)
        s += static_cast<double>(partial[b * c_ + c]);
      sums[c] = static_cast<T>(s);
    }
    if (withLoss) writeLoss(a.out<T>(2), denom);
  }

private:
  /// The forward's loss from the positions' terms, summed in order (as the forward kernel).
  void writeLoss(T *loss, double denom) const {
    double total = 0;
    for (int64_t k = 0; k < n_ * d_; ++k) {
      if (reduction_ == 0) loss[k] = static_cast<T>(positionLoss_[static_cast<size_t>(k)]);
      total += positionLoss_[static_cast<size_t>(k)];
    }
    if (reduction_ == 1) loss[0] = static_cast<T>(total);
    if (reduction_ == 2) loss[0] = static_cast<T>(total / denom);
  }

  static constexpr int64_t kBlock = 32;
  std::string name_;
  std::vector<double> positionLoss_;
  DataType labelType_;
  bool hasWeights_;
  std::vector<T> partial_; ///< per block of kBlock positions: its rows' sum
};

std::unique_ptr<Kernel> createSoftmaxCrossEntropyGrad(const ir::Op &op) {
  if (op.inInfo(0).dataType() == DataType::DOUBLE) return std::make_unique<SoftmaxCrossEntropyGradKernel<double>>(op);
  return std::make_unique<SoftmaxCrossEntropyGradKernel<float>>(op);
}

} // namespace

void registerReferenceLossKernels(KernelRegistry &r) {
  r.add({"ai.graphcore", "SoftmaxCrossEntropyLossGrad", KernelProvider::Reference, nullptr,
         createSoftmaxCrossEntropyGrad});
  r.add({"ai.onnx", "SoftmaxCrossEntropyLoss", KernelProvider::Reference, nullptr, makeKernel<LossKernel>});
  r.add({"ai.onnx", "NegativeLogLikelihoodLoss", KernelProvider::Reference, nullptr, makeKernel<LossKernel>});
}

} // namespace popart::backend_cpu
