// Fast kernels: f32 ReduceSum and ReduceMean over the middle of [A kept, R reduced, B kept] (bias
// gradients, row sums, means over one axis), summed in double with the vectorised loops of
// vecloops.hpp, threaded over outputs (and over slices of R when there are few outputs).

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/reduced_axes.hpp"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// The [A, R, B] element counts of \p shape, if it is [A kept, R reduced, B kept] once size-1 axes
/// are dropped and neighbours of the same kind merged; false otherwise (two runs of reduced axes,
/// or two of kept ones around a reduced run).
bool splitKeptReducedKept(const Shape &shape, const std::vector<bool> &reduced, int64_t &a, int64_t &r, int64_t &b) {
  std::vector<std::pair<bool, int64_t>> groups; // (reduced, elements)
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!groups.empty() && groups.back().first == reduced[d])
      groups.back().second *= shape[d];
    else
      groups.emplace_back(reduced[d], shape[d]);
  }
  a = r = b = 1;
  size_t g = 0;
  if (g < groups.size() && !groups[g].first) a = groups[g++].second;
  if (g < groups.size() && groups[g].first) r = groups[g++].second;
  if (g < groups.size() && !groups[g].first) b = groups[g++].second;
  return g == groups.size();
}

Support supportsSumOrMean(const ir::Op &op) {
  const TensorInfo &in = op.inInfo(0);
  if (in.dataType() != DataType::FLOAT) return Support::no("not f32");
  if (in.elementCount() == 0) return Support::no("an empty input");
  if (op.hasInput(1) && !op.input(1).isConst()) return Support::no("axes not constant");
  bool identity = false;
  std::vector<bool> reduced = reducedAxes(op, identity);
  if (identity) return Support::no("no axes with noop_with_empty_axes (an identity)");
  int64_t a = 1, r = 1, b = 1;
  if (!splitKeptReducedKept(in.shape(), reduced, a, r, b))
    return Support::no("the reduced axes are not one run between kept ones ([A, R, B])");
  return Support::yes();
}

/// Sum or mean over R of [A, R, B], in double: each output is summed in a fixed order, B in
/// blocks of kBlock columns so that the accumulators stay in registers/L1. When that leaves
/// fewer than kMinTasks blocks (a bias gradient: [2048, 256] is one block), R is cut into
/// slices too, each summed into its own partial row, and the slices are added in order: the
/// cut depends on the shape only, so the result does not depend on the thread count.
class SumOrMeanKernel : public Kernel {
public:
  explicit SumOrMeanKernel(const ir::Op &op) : inCount_(op.inInfo(0).elementCount()) {
    bool identity = false;
    splitKeptReducedKept(op.inInfo(0).shape(), reducedAxes(op, identity), a_, r_, b_);
    div_ = op.type == "ReduceMean" ? static_cast<double>(r_) : 1.0;
    const int64_t blocks = (b_ + kBlock - 1) / kBlock;
    if (b_ > 1 && a_ * blocks < kMinTasks)
      slices_ = std::min<int64_t>(kMinTasks / (a_ * blocks), std::max<int64_t>(1, r_ / 64));
    if (slices_ > 1) partial_.assign(static_cast<size_t>(slices_ * a_ * b_), 0.0);
  }

  void run(const KernelArgs &args) override {
    const float *x = args.in<float>(0);
    float *y = args.out<float>(0);
    const double div = div_;
    if (b_ == 1) {
#pragma omp parallel for schedule(static) if (a_ > 1 && inCount_ > 32768)
      for (int64_t a = 0; a < a_; ++a)
        y[a] = static_cast<float>(vec::sum(x + a * r_, r_) / div);
      return;
    }
    const int64_t blocks = (b_ + kBlock - 1) / kBlock, slices = slices_;
    const int64_t sliceRows = (r_ + slices - 1) / slices;
    double *partial = partial_.data();
#pragma omp parallel for schedule(static) if (inCount_ > 32768)
    for (int64_t t = 0; t < a_ * blocks * slices; ++t) {
      int64_t s = t % slices, ab = t / slices;
      int64_t a = ab / blocks, b0 = (ab % blocks) * kBlock, len = std::min(kBlock, b_ - b0);
      double local[kBlock] = {};
      double *acc = slices > 1 ? partial + (s * a_ + a) * b_ + b0 : local;
      if (slices > 1) std::fill(acc, acc + len, 0.0);
      const float *base = x + a * r_ * b_ + b0;
      for (int64_t r = s * sliceRows; r < std::min(r_, (s + 1) * sliceRows); ++r)
        vec::accumulate(base + r * b_, acc, len);
      if (slices == 1)
        for (int64_t j = 0; j < len; ++j)
          y[a * b_ + b0 + j] = static_cast<float>(acc[j] / div);
    }
    if (slices == 1) return;
#pragma omp parallel for schedule(static) if (a_ * b_ > 4096)
    for (int64_t o = 0; o < a_ * b_; ++o) {
      double sum = 0;
      for (int64_t s = 0; s < slices; ++s)
        sum += partial[s * a_ * b_ + o];
      y[o] = static_cast<float>(sum / div);
    }
  }

private:
  static constexpr int64_t kBlock = 512, kMinTasks = 8;
  int64_t inCount_ = 0, a_ = 1, r_ = 1, b_ = 1, slices_ = 1;
  double div_ = 1.0;
  std::vector<double> partial_;
};

std::unique_ptr<Kernel> createSumOrMean(const ir::Op &op) { return std::make_unique<SumOrMeanKernel>(op); }

} // namespace

void registerFastReduceKernels(KernelRegistry &r) {
  for (const char *t : {"ReduceSum", "ReduceMean"})
    r.add({"ai.onnx", t, KernelProvider::Fast, supportsSumOrMean, createSumOrMean});
}

} // namespace popart::backend_cpu
