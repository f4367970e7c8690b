// Reference kernels: Softmax, LogSoftmax, Hardmax over an [outer, n, inner] view of the input.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

#include <cmath>

namespace popart::backend_cpu {

namespace {

enum class SoftmaxKind { Softmax, LogSoftmax, Hardmax };

template <typename T> class SoftmaxKernel : public Kernel {
  using C = compute_t<T>;

public:
  explicit SoftmaxKernel(const ir::Op &op) {
    const Shape &s = op.inInfo(0).shape();
    int64_t rank = static_cast<int64_t>(s.size());
    int64_t axis = op.attrs.getInt("axis", op.version < 13 ? 1 : -1);
    if (axis < 0) axis += rank;
    outer_ = 1;
    n_ = 1;
    inner_ = 1;
    for (int64_t d = 0; d < axis; ++d)
      outer_ *= s[static_cast<size_t>(d)];
    if (op.version < 13) {
      // Old opsets: the input is a 2-D [outer, rest] matrix, normalised along its rows.
      for (int64_t d = axis; d < rank; ++d)
        n_ *= s[static_cast<size_t>(d)];
    } else {
      n_ = s[static_cast<size_t>(axis)];
      for (int64_t d = axis + 1; d < rank; ++d)
        inner_ *= s[static_cast<size_t>(d)];
    }
    kind_ = op.type == "Softmax"      ? SoftmaxKind::Softmax
            : op.type == "LogSoftmax" ? SoftmaxKind::LogSoftmax
                                      : SoftmaxKind::Hardmax;
  }

  void run(const KernelArgs &args) override {
    const T *x = args.in<T>(0);
    T *y = args.out<T>(0);
    for (int64_t o = 0; o < outer_; ++o)
      for (int64_t i = 0; i < inner_; ++i) {
        int64_t base = o * n_ * inner_ + i;
        auto at = [&](int64_t k) { return base + k * inner_; };
        if (n_ == 0) continue;
        C m = static_cast<C>(x[at(0)]);
        int64_t argmax = 0; // first maximum: Hardmax breaks ties towards the lower index
        for (int64_t k = 1; k < n_; ++k) {
          C v = static_cast<C>(x[at(k)]);
          if (v > m) {
            m = v;
            argmax = k;
          }
        }
        if (kind_ == SoftmaxKind::Hardmax) {
          for (int64_t k = 0; k < n_; ++k)
            y[at(k)] = static_cast<T>(static_cast<C>(k == argmax ? 1 : 0));
          continue;
        }
        double sum = 0;
        for (int64_t k = 0; k < n_; ++k)
          sum += std::exp(static_cast<double>(static_cast<C>(x[at(k)])) - m);
        if (kind_ == SoftmaxKind::Softmax) {
          for (int64_t k = 0; k < n_; ++k)
            y[at(k)] =
                static_cast<T>(static_cast<C>(std::exp(static_cast<double>(static_cast<C>(x[at(k)])) - m) / sum));
        } else {
          double lse = std::log(sum);
          for (int64_t k = 0; k < n_; ++k)
            y[at(k)] = static_cast<T>(static_cast<C>(static_cast<double>(static_cast<C>(x[at(k)])) - m - lse));
        }
      }
  }

private:
  int64_t outer_ = 1, n_ = 1, inner_ = 1;
  SoftmaxKind kind_ = SoftmaxKind::Softmax;
};

std::unique_ptr<Kernel> createSoftmax(const ir::Op &op) {
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<SoftmaxKernel<T>>(op);
  });
}

} // namespace

void registerReferenceSoftmaxKernels(KernelRegistry &r) {
  for (const char *t : {"Softmax", "LogSoftmax", "Hardmax"})
    r.add({"ai.onnx", t, KernelProvider::Reference, nullptr, createSoftmax});
}

} // namespace popart::backend_cpu
