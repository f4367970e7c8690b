// Reference kernels: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

#include <cmath>
#include <limits>
#include <optional>

namespace popart::backend_cpu {

namespace {

template <typename T> double toDouble(T v) { return static_cast<double>(static_cast<compute_t<T>>(v)); }
template <typename T> T fromDouble(double v) { return static_cast<T>(static_cast<compute_t<T>>(v)); }

class LossKernel : public Kernel {
public:
  explicit LossKernel(const ir::Op &op)
      : name_(op.debugName()), type_(op.inInfo(0).dataType()), labelType_(op.inInfo(1).dataType()),
        softmax_(op.type == "SoftmaxCrossEntropyLoss"), hasWeights_(op.hasInput(2)) {
    const Shape &s = op.inInfo(0).shape();
    n_ = s[0];
    c_ = s[1];
    d_ = 1;
    for (size_t i = 2; i < s.size(); ++i)
      d_ *= s[i];
    std::string red = op.attrs.getString("reduction", "mean");
    reduction_ = red == "none" ? 0 : red == "sum" ? 1 : 2;
    if (op.attrs.has("ignore_index")) ignore_ = op.attrs.getInt("ignore_index");
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
        double value = 0, weight = 0;
        if (!(ignore_ && label == *ignore_)) {
          if (label < 0 || label >= c_)
            throw error(name_, ": label ", label, " at position ", n * d_ + d, " is out of range [0, ", c_, ")");
          double lp = softmax_ ? logProb_[label] : toDouble(px[label * d_]);
          weight = w ? toDouble(w[label]) : 1.0;
          value = -lp * weight;
        }
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
  int64_t n_, c_, d_;
  int reduction_;
  std::optional<int64_t> ignore_;
  std::vector<double> logProb_;
};

} // namespace

void registerReferenceLossKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "SoftmaxCrossEntropyLoss", KernelProvider::Reference, nullptr, makeKernel<LossKernel>});
  r.add({"ai.onnx", "NegativeLogLikelihoodLoss", KernelProvider::Reference, nullptr, makeKernel<LossKernel>});
}

} // namespace popart::backend_cpu
