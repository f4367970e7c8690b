// Reference kernels of the ai.onnx.preview.training optimiser ops, in double, for tensors of any
// floating type (each stored value rounded once).

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace popart::backend_cpu {

namespace {

/// \p v rounded to the storage type \p T once, to nearest even. For the 16-bit types the double
/// is first rounded to float by rounding to odd (truncated, its last bit set if inexact): float
/// keeps more than two bits beyond fp16's and bfloat16's, so the second rounding is exact, where
/// rounding to nearest twice could land on the other side of a tie.
template <typename T> T roundToStorage(double v) {
  if constexpr (std::is_same_v<compute_t<T>, T>) {
    return static_cast<T>(v);
  } else {
    float f = static_cast<float>(v);
    if (std::isfinite(f) && static_cast<double>(f) != v) {
      if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
      uint32_t bits = 0;
      std::memcpy(&bits, &f, sizeof bits);
      bits |= 1u;
      std::memcpy(&f, &bits, sizeof bits);
    }
    return static_cast<T>(f);
  }
}

class OptimizerKernel : public Kernel {
public:
  explicit OptimizerKernel(const ir::Op &op) : kind_(op.type) {
    groups_ = kind_ == "Adam" ? 4 : 3;
    n_ = (op.inputCount() - 2) / groups_;
    for (size_t i = 0; i < n_; ++i) {
      counts_.push_back(op.inInfo(2 + i).elementCount());
      types_.push_back(op.inInfo(2 + i).dataType());
    }
    rType_ = op.inInfo(0).dataType();
    const auto &a = op.attrs;
    if (kind_ == "Adagrad") {
      decay_ = a.getFloat("decay_factor", 0.f);
      epsilon_ = a.getFloat("epsilon", 1e-6f);
      norm_ = a.getFloat("norm_coefficient", 0.f);
    } else if (kind_ == "Momentum") {
      alpha_ = a.getFloat("alpha");
      beta_ = a.getFloat("beta");
      norm_ = a.getFloat("norm_coefficient");
      std::string mode = a.getString("mode");
      if (mode != "standard" && mode != "nesterov")
        throw error(op.debugName(), ": mode '", mode, "' is not standard or nesterov");
      nesterov_ = mode == "nesterov";
    } else {
      alpha_ = a.getFloat("alpha", 0.9f);
      beta_ = a.getFloat("beta", 0.999f);
      epsilon_ = a.getFloat("epsilon", 1e-6f);
      norm_ = a.getFloat("norm_coefficient", 0.f);
      normPost_ = a.getFloat("norm_coefficient_post", 0.f);
    }
  }

  void run(const KernelArgs &args) override {
    double r = dispatchFloat(rType_, "learning rate", [&](auto tag) {
      using R = typename decltype(tag)::type;
      return static_cast<double>(static_cast<compute_t<R>>(args.in<R>(0)[0]));
    });
    double t = static_cast<double>(args.in<int64_t>(1)[0]);
    for (size_t i = 0; i < n_; ++i)
      dispatchFloat(types_[i], kind_.c_str(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        auto ld = [&](size_t input, int64_t k) {
          return static_cast<double>(static_cast<compute_t<T>>(args.in<T>(input)[k]));
        };
        auto st = [&](size_t output, int64_t k, double v) { args.out<T>(output)[k] = roundToStorage<T>(v); };
        size_t x = 2 + i, g = 2 + n_ + i, s1 = 2 + 2 * n_ + i, s2 = 2 + 3 * n_ + i;
        for (int64_t k = 0; k < counts_[i]; ++k) {
          double xv = ld(x, k), gv = norm_ * xv + ld(g, k);
          if (kind_ == "Adagrad") {
            double rate = r / (1 + t * decay_);
            double h = ld(s1, k) + gv * gv;
            st(i, k, xv - rate * gv / (std::sqrt(h) + epsilon_));
            st(n_ + i, k, h);
          } else if (kind_ == "Momentum") {
            double beta = t > 0 ? beta_ : 1.0;
            double v = alpha_ * ld(s1, k) + beta * gv;
            st(i, k, nesterov_ ? xv - r * (gv + alpha_ * v) : xv - r * v);
            st(n_ + i, k, v);
          } else {
            double v = alpha_ * ld(s1, k) + (1 - alpha_) * gv;
            double h = beta_ * ld(s2, k) + (1 - beta_) * gv * gv;
            double rate = t > 0 ? r * std::sqrt(1 - std::pow(beta_, t)) / (1 - std::pow(alpha_, t)) : r;
            double xn = xv - rate * v / (std::sqrt(h) + epsilon_);
            st(i, k, (1 - normPost_) * xn);
            st(n_ + i, k, v);
            st(2 * n_ + i, k, h);
          }
        }
      });
  }

private:
  std::string kind_;
  size_t groups_, n_;
  std::vector<int64_t> counts_;
  std::vector<DataType> types_;
  DataType rType_;
  double decay_ = 0, epsilon_ = 0, norm_ = 0, alpha_ = 0, beta_ = 0, normPost_ = 0;
  bool nesterov_ = false;
};

} // namespace

void registerReferenceTrainingKernels(KernelRegistry &r) {
  for (const char *t : {"Adagrad", "Momentum", "Adam"})
    r.add({"ai.onnx.preview.training", t, KernelProvider::Reference, nullptr, makeKernel<OptimizerKernel>});
}

} // namespace popart::backend_cpu
