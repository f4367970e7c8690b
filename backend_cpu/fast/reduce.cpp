// Fast kernels: ReduceSum and ReduceMean over the middle of [A kept, R reduced, B kept] (bias
// gradients, row sums, means over one axis), and over both ends of [Q reduced, A kept, R reduced]
// (a convolution's bias gradient: NCHW summed over N, H and W) with the vectorised loops of
// vecloops.hpp, threaded over outputs (and over slices of R when there are few outputs): f32
// summed in double, FLOAT16 and BFLOAT16 (mixed precision's bias gradients) widened and summed in
// f32, each output rounded once to its type.

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/reduced_axes.hpp"
#include "core/half.hpp"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// The [Q, A, R, B] element counts of \p shape, if it is [Q reduced, A kept, R reduced, B kept]
/// once size-1 axes are dropped and neighbours of the same kind merged, with Q or B 1; false
/// otherwise (more runs).
bool splitReducedKeptReducedKept(const Shape &shape, const std::vector<bool> &reduced, int64_t &q, int64_t &a,
                                 int64_t &r, int64_t &b) {
  std::vector<std::pair<bool, int64_t>> groups; // (reduced, elements)
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!groups.empty() && groups.back().first == reduced[d])
      groups.back().second *= shape[d];
    else
      groups.emplace_back(reduced[d], shape[d]);
  }
  q = a = r = b = 1;
  size_t g = 0;
  // [Q, A, R]: a leading reduced run only before a kept one and a reduced one ([R, B] is [A, R, B]
  // with A = 1, summed by columns).
  if (groups.size() == 3 && groups[0].first) q = groups[g++].second;
  if (g < groups.size() && !groups[g].first) a = groups[g++].second;
  if (g < groups.size() && groups[g].first) r = groups[g++].second;
  if (g < groups.size() && !groups[g].first) b = groups[g++].second;
  return g == groups.size();
}

Support supportsSumOrMean(const ir::Op &op) {
  const TensorInfo &in = op.inInfo(0);
  DataType type = in.dataType(), out = op.outInfo(0).dataType();
  if (type != DataType::FLOAT && type != DataType::FLOAT16 && type != DataType::BFLOAT16)
    return Support::no("not f32, f16 or bf16");
  if (out != type && out != DataType::FLOAT) return Support::no("an output of another type than the input's or FLOAT");
  if (in.elementCount() == 0) return Support::no("an empty input");
  if (op.hasInput(1) && !op.input(1).isConst()) return Support::no("axes not constant");
  bool identity = false;
  std::vector<bool> reduced = reducedAxes(op, identity);
  if (identity) return Support::no("no axes with noop_with_empty_axes (an identity)");
  int64_t q = 1, a = 1, r = 1, b = 1;
  if (!splitReducedKeptReducedKept(in.shape(), reduced, q, a, r, b))
    return Support::no("the reduced axes are neither one run between kept ones ([A, R, B]) nor both ends ([Q, A, R])");
  return Support::yes();
}

/// Sum or mean over R of [A, R, B], in double (f32) or f32 (16-bit types): each output is summed
/// in a fixed order, B in blocks of kBlock columns so that the accumulators stay in registers/L1.
/// When that leaves fewer than kMinTasks blocks (a bias gradient: [2048, 256] is one block), R is
/// cut into slices too, each summed into its own partial row, and the slices are added in order:
/// the cut depends on the shape only, so the result does not depend on the thread count.
class SumOrMeanKernel : public Kernel {
public:
  explicit SumOrMeanKernel(const ir::Op &op)
      : inCount_(op.inInfo(0).elementCount()), type_(op.inInfo(0).dataType()), outType_(op.outInfo(0).dataType()) {
    bool identity = false;
    splitReducedKeptReducedKept(op.inInfo(0).shape(), reducedAxes(op, identity), q_, a_, r_, b_);
    div_ = op.type == "ReduceMean" ? static_cast<double>(q_ * r_) : 1.0;
    const int64_t blocks = (b_ + kBlock - 1) / kBlock;
    if (b_ > 1 && a_ * blocks < kMinTasks)
      slices_ = std::min<int64_t>(kMinTasks / (a_ * blocks), std::max<int64_t>(1, r_ / 64));
    if (slices_ > 1) {
      if (type_ == DataType::FLOAT)
        partial_.assign(static_cast<size_t>(slices_ * a_ * b_), 0.0);
      else
        partialSixteen_.assign(static_cast<size_t>(slices_ * a_ * b_), 0.f);
    }
  }

  void run(const KernelArgs &args) override {
    if (type_ == DataType::FLOAT)
      runFloat(args);
    else if (type_ == DataType::BFLOAT16)
      runSixteen(args, vec::accumulateBfloat16);
    else
      runSixteen(args, vec::accumulateHalf);
  }

private:
  void runFloat(const KernelArgs &args) {
    const float *x = args.in<float>(0);
    float *y = args.out<float>(0);
    const double div = div_;
    if (b_ == 1) { // row sums; with Q, the rows a, a + A, ... added in order
#pragma omp parallel for schedule(static) if (a_ > 1 && inCount_ > 32768)
      for (int64_t a = 0; a < a_; ++a) {
        double sum = 0;
        for (int64_t q = 0; q < q_; ++q)
          sum += vec::sum(x + (q * a_ + a) * r_, r_);
        y[a] = static_cast<float>(sum / div);
      }
      return;
    }
    sumColumns(x, y, div, vec::accumulate, partial_.data());
  }

  /// Output \p o = \p v, rounded to the output's type.
  void store(void *y, int64_t o, double v) const {
    auto f = static_cast<float>(v);
    if (outType_ == DataType::FLOAT)
      static_cast<float *>(y)[o] = f;
    else
      static_cast<uint16_t *>(y)[o] = outType_ == DataType::BFLOAT16 ? floatToBfloat16(f) : floatToHalf(f);
  }

  /// The 16-bit input: rows widened and added into f32 accumulators by \p accumulate.
  void runSixteen(const KernelArgs &args, void (*accumulate)(const uint16_t *, float *, int64_t)) {
    const auto *x = args.in<uint16_t>(0);
    void *y = args.outputs[0];
    const double div = div_;
    if (b_ == 1) { // row sums: each row (each of Q's) in chunks of kBlock lanes, the lanes added in order
#pragma omp parallel for schedule(static) if (a_ > 1 && inCount_ > 32768)
      for (int64_t a = 0; a < a_; ++a) {
        float lanes[kBlock] = {};
        const int64_t width = std::min(kBlock, r_);
        for (int64_t q = 0; q < q_; ++q)
          for (int64_t r0 = 0; r0 < r_; r0 += width)
            accumulate(x + (q * a_ + a) * r_ + r0, lanes, std::min(width, r_ - r0));
        double sum = 0;
        for (int64_t j = 0; j < width; ++j)
          sum += static_cast<double>(lanes[j]);
        store(y, a, sum / div);
      }
      return;
    }
    sumColumns(x, y, div, accumulate, partialSixteen_.data());
  }

  /// The sums over R of [A, R, B] with B > 1: blocks of kBlock columns, each summed by \p accumulate
  /// into accumulators of type Acc (double for f32, f32 for the 16-bit types), in slices of R into
  /// \p partial when there are slices, the slices then added in order.
  template <typename T, typename Acc>
  void sumColumns(const T *x, void *y, double div, void (*accumulate)(const T *, Acc *, int64_t), Acc *partial) const {
    const int64_t blocks = (b_ + kBlock - 1) / kBlock, slices = slices_;
    const int64_t sliceRows = (r_ + slices - 1) / slices;
#pragma omp parallel for schedule(static) if (inCount_ > 32768)
    for (int64_t t = 0; t < a_ * blocks * slices; ++t) {
      int64_t s = t % slices, ab = t / slices;
      int64_t a = ab / blocks, b0 = (ab % blocks) * kBlock, len = std::min(kBlock, b_ - b0);
      Acc local[kBlock] = {};
      Acc *acc = slices > 1 ? partial + (s * a_ + a) * b_ + b0 : local;
      if (slices > 1) std::fill(acc, acc + len, Acc{0});
      const T *base = x + a * r_ * b_ + b0;
      for (int64_t r = s * sliceRows; r < std::min(r_, (s + 1) * sliceRows); ++r)
        accumulate(base + r * b_, acc, len);
      if (slices == 1)
        for (int64_t j = 0; j < len; ++j)
          store(y, a * b_ + b0 + j, static_cast<double>(acc[j]) / div);
    }
    if (slices == 1) return;
#pragma omp parallel for schedule(static) if (a_ * b_ > 4096)
    for (int64_t o = 0; o < a_ * b_; ++o) {
      double sum = 0;
      for (int64_t s = 0; s < slices; ++s)
        sum += static_cast<double>(partial[s * a_ * b_ + o]);
      store(y, o, sum / div);
    }
  }

  static constexpr int64_t kBlock = 512, kMinTasks = 8;
  int64_t inCount_ = 0, q_ = 1, a_ = 1, r_ = 1, b_ = 1, slices_ = 1;
  DataType type_, outType_;
  double div_ = 1.0;
  std::vector<double> partial_;
  std::vector<float> partialSixteen_;
};

std::unique_ptr<Kernel> createSumOrMean(const ir::Op &op) { return std::make_unique<SumOrMeanKernel>(op); }

} // namespace

void registerFastReduceKernels(KernelRegistry &r) {
  for (const char *t : {"ReduceSum", "ReduceMean"})
    r.add({"ai.onnx", t, KernelProvider::Fast, supportsSumOrMean, createSumOrMean});
}

} // namespace popart::backend_cpu
