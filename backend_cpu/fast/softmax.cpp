// Fast kernels: the f32 SoftmaxGrad over the last axis, rows threaded with vectorised sums (the
// reference kernel, reference/actgrad.cpp, is the plain double loop it is tested against).

#include "backend_cpu/kernel_families.hpp"

namespace popart::backend_cpu {

namespace {

/// Whether RowSoftmaxGradKernel takes \p op: f32 over the last axis of a tensor of rank >= 1.
Support supportsRowSoftmaxGrad(const ir::Op &op) {
  const TensorInfo &y = op.inInfo(0);
  if (y.dataType() != DataType::FLOAT) return Support::no("not f32");
  if (y.rank() < 1) return Support::no("a scalar");
  int64_t rank = static_cast<int64_t>(y.rank()), axis = op.attrs.getInt("axis", -1);
  if (axis != -1 && axis != rank - 1) return Support::no("not over the last axis");
  return Support::yes();
}

/// dX = Y·(dY − Σ dY·Y) over rows of n contiguous elements: rows threaded, each summed by one
/// thread in a fixed order, so the result does not depend on the thread count.
class RowSoftmaxGradKernel : public Kernel {
public:
  explicit RowSoftmaxGradKernel(const ir::Op &op) {
    const TensorInfo &y = op.inInfo(0);
    n_ = y.shape().back();
    rows_ = n_ == 0 ? 0 : y.elementCount() / n_;
  }
  void run(const KernelArgs &a) override {
    const float *y = a.in<float>(0), *dy = a.in<float>(1);
    float *dx = a.out<float>(0);
    const int64_t n = n_;
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < rows_; ++o) {
      const float *yr = y + o * n, *gr = dy + o * n;
      float *dr = dx + o * n;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t k = 0; k < n; ++k)
        s += gr[k] * yr[k];
#pragma omp simd
      for (int64_t k = 0; k < n; ++k)
        dr[k] = yr[k] * (gr[k] - s);
    }
  }

private:
  int64_t n_ = 0, rows_ = 0;
};

} // namespace

bool rowSoftmaxGrad(const ir::Op &op) { return op.type == "SoftmaxGrad" && supportsRowSoftmaxGrad(op); }

void registerFastSoftmaxKernels(KernelRegistry &r) {
  r.add(
      {"ai.graphcore", "SoftmaxGrad", KernelProvider::Fast, supportsRowSoftmaxGrad, makeKernel<RowSoftmaxGradKernel>});
}

} // namespace popart::backend_cpu
