// Fast kernels: f32 SoftmaxCrossEntropyLoss over [N, C] scores, rows in parallel with the
// vectorised loops of vecloops.hpp (approximate exp), and the f32 SoftmaxCrossEntropyLossGrad,
// vectorised over contiguous class rows, its class sums added per block of positions while the
// rows are in cache; the same gradient for BFLOAT16 and FLOAT16 scores (mixed precision's logits,
// foldLossCasts) over [N, C] rows, computed in f32. The reference kernels (reference/loss.cpp) are
// the plain loops they are tested against.

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loss_shape.hpp"
#include "core/half.hpp"
#include <popart/error.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// Scores [N, C] in f32 with at least one class: the rows that RowSoftmaxCrossEntropyKernel takes.
Support supportsRowSoftmaxCrossEntropy(const ir::Op &op) {
  const TensorInfo &x = op.inInfo(0);
  if (x.dataType() != DataType::FLOAT) return Support::no("not f32");
  int64_t positions = shapeElementCount(Shape(x.shape().begin() + 2, x.shape().end()));
  if (positions != 1) return Support::no("axes after the classes (the row kernel takes [N, C] only)");
  if (x.dim(1) == 0) return Support::no("no classes");
  return Support::yes();
}

/// f32 SoftmaxCrossEntropyLoss over [N, C]: rows in parallel with vectorised exp, each row's loss
/// kept apart and summed in row order afterwards, so the result does not depend on the thread
/// count. \p L is the labels' type.
template <typename L> class RowSoftmaxCrossEntropyKernel : public Kernel, LossShape {
public:
  explicit RowSoftmaxCrossEntropyKernel(const ir::Op &op)
      : LossShape(op), name_(op.debugName()), hasWeights_(op.hasInput(2)), rowLoss_(static_cast<size_t>(n_)),
        rowWeight_(static_cast<size_t>(n_)) {}

  void run(const KernelArgs &a) override {
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

private:
  /// Weight of \p label at position \p k; throws if it is out of range (and not ignored).
  double labelWeight(L label, int64_t k, const float *w) const {
    auto l = static_cast<int64_t>(label);
    if (ignore_ && l == *ignore_) return 0.0;
    if (l < 0 || l >= c_) throw error(name_, ": label ", l, " at position ", k, " is out of range [0, ", c_, ")");
    return w ? static_cast<double>(w[l]) : 1.0;
  }

  std::string name_;
  bool hasWeights_;
  std::vector<double> rowLoss_, rowWeight_;
};

std::unique_ptr<Kernel> createRowSoftmaxCrossEntropy(const ir::Op &op) {
  if (op.inInfo(1).dataType() == DataType::INT64) return std::make_unique<RowSoftmaxCrossEntropyKernel<int64_t>>(op);
  if (op.inInfo(1).dataType() == DataType::INT32) return std::make_unique<RowSoftmaxCrossEntropyKernel<int32_t>>(op);
  throw error(op.debugName(), ": labels must be INT32 or INT64");
}

Support supportsSoftmaxCrossEntropyGrad(const ir::Op &op) {
  const TensorInfo &x = op.inInfo(0);
  if (x.dataType() == DataType::FLOAT) return Support::yes();
  if (x.dataType() != DataType::BFLOAT16 && x.dataType() != DataType::FLOAT16)
    return Support::no("not f32, f16 or bf16");
  if (shapeElementCount(Shape(x.shape().begin() + 2, x.shape().end())) != 1)
    return Support::no("16-bit scores with axes after the classes (the 16-bit kernel takes [N, C] rows only)");
  if (x.dim(1) == 0) return Support::no("no classes");
  return Support::yes();
}

/// dX = g·w·(softmax(x) − onehot(label)) per position, with w the label's class weight (0 for the
/// ignored class and labels out of range) and g = dY, dY / Σw (mean) or dY[n, d] (none), in f32:
/// positions in parallel, a contiguous class row (D = 1) with vectorised exp. The class sums
/// (output 1) are added per block of kBlock positions while their rows are in cache, the blocks
/// then in order in double, so the result does not depend on the thread count.
class SoftmaxCrossEntropyGradKernel : public Kernel, LossShape {
public:
  explicit SoftmaxCrossEntropyGradKernel(const ir::Op &op)
      : LossShape(op), name_(op.debugName()), labelType_(op.inInfo(1).dataType()), hasWeights_(op.hasInput(2)) {
    if (op.hasOutput(1)) partial_.assign(static_cast<size_t>((n_ * d_ + kBlock - 1) / kBlock * c_), 0.f);
    if (op.hasOutput(2)) positionLoss_.assign(static_cast<size_t>(n_ * d_), 0.0);
  }
  int inPlaceInput() const override { return 0; } // dX over the logits, row by row
  void run(const KernelArgs &a) override {
    const float *x = a.in<float>(0);
    const float *weights = hasWeights_ ? a.in<float>(2) : nullptr;
    const float *dy = a.in<float>(3);
    float *dx = a.out<float>(0);
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
    auto position = [&](int64_t k, float *part) {
      int64_t n = k / d_, i = k % d_;
      const float *xs = x + n * c_ * d_ + i;
      float *out = dx + n * c_ * d_ + i;
      int64_t l = label(k);
      double w = weight(l);
      if (withLoss) positionLoss_[static_cast<size_t>(k)] = 0.0;
      if (w == 0.0) {
        for (int64_t c = 0; c < c_; ++c)
          out[c * d_] = 0.f;
        return;
      }
      double g = (reduction_ == 0 ? static_cast<double>(dy[k]) : static_cast<double>(dy[0])) * w / denom;
      const double xl = static_cast<double>(xs[l * d_]); // read before out overwrites it
      if (d_ == 1) {                                     // contiguous class row: vectorised
        float mx = vec::max(xs, c_);
        float sum = vec::expSubSum(xs, mx, out, c_);
        if (withLoss) // as the forward kernel: -(x_l − log Σ e^x)·w
          positionLoss_[static_cast<size_t>(k)] = -(xl - (mx + std::log(sum))) * w;
        if (part)
          vec::scaleAccumulate(out, static_cast<float>(g) / sum, out, part, c_);
        else
          vec::scale(out, static_cast<float>(g) / sum, out, c_);
        out[l] -= static_cast<float>(g);
        if (part) part[l] -= static_cast<float>(g);
        return;
      }
      float mx = xs[0];
      for (int64_t c = 1; c < c_; ++c)
        mx = std::max(mx, xs[c * d_]);
      float sum = 0;
      for (int64_t c = 0; c < c_; ++c) {
        float e = std::exp(xs[c * d_] - mx);
        out[c * d_] = e;
        sum += e;
      }
      if (withLoss)
        positionLoss_[static_cast<size_t>(k)] =
            -(xl - (static_cast<double>(mx) + std::log(static_cast<double>(sum)))) * w;
      float scale = static_cast<float>(g) / sum;
      for (int64_t c = 0; c < c_; ++c)
        out[c * d_] *= scale;
      out[l * d_] -= static_cast<float>(g);
      if (part)
        for (int64_t c = 0; c < c_; ++c)
          part[c] += out[c * d_];
    };

    if (!a.hasOutput(1)) {
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < positions; ++k)
        position(k, nullptr);
      if (withLoss) writeLoss(a.out<float>(2), denom);
      return;
    }
    const int64_t blocks = (positions + kBlock - 1) / kBlock;
    float *partial = partial_.data();
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      float *part = partial + b * c_;
      std::fill(part, part + c_, 0.f);
      for (int64_t k = b * kBlock; k < std::min(positions, (b + 1) * kBlock); ++k)
        position(k, part);
    }
    float *sums = a.out<float>(1);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < c_; ++c) {
      double s = 0;
      for (int64_t b = 0; b < blocks; ++b)
        s += static_cast<double>(partial[b * c_ + c]);
      sums[c] = static_cast<float>(s);
    }
    if (withLoss) writeLoss(a.out<float>(2), denom);
  }

private:
  /// The forward's loss from the positions' terms, summed in order (as the forward kernel).
  void writeLoss(float *loss, double denom) const {
    double total = 0;
    for (int64_t k = 0; k < n_ * d_; ++k) {
      if (reduction_ == 0) loss[k] = static_cast<float>(positionLoss_[static_cast<size_t>(k)]);
      total += positionLoss_[static_cast<size_t>(k)];
    }
    if (reduction_ == 1) loss[0] = static_cast<float>(total);
    if (reduction_ == 2) loss[0] = static_cast<float>(total / denom);
  }

  static constexpr int64_t kBlock = 32;
  std::string name_;
  DataType labelType_;
  bool hasWeights_;
  std::vector<double> positionLoss_;
  std::vector<float> partial_; ///< per block of kBlock positions: its rows' sum
};

/// SoftmaxCrossEntropyGradKernel for BFLOAT16 or FLOAT16 scores [N, C] (FLOAT dY and loss, FLOAT or
/// 16-bit weights): each row is widened into its thread's f32 row, computed there as the f32 kernel
/// computes it and rounded once into dX (which may be the scores' buffer: inPlaceInput). The class
/// sums add the rounded dX, what a ReduceSum of dX would read, per block of kBlock rows in f32 and
/// the blocks in order in double, so the result does not depend on the thread count.
class SixteenBitSoftmaxCrossEntropyGradKernel : public Kernel, LossShape {
public:
  SixteenBitSoftmaxCrossEntropyGradKernel(const ir::Op &op, const KernelContext &context)
      : LossShape(op), name_(op.debugName()), labelType_(op.inInfo(1).dataType()),
        weightType_(op.hasInput(2) ? op.inInfo(2).dataType() : DataType::FLOAT),
        bf16_(op.inInfo(0).dataType() == DataType::BFLOAT16), hasWeights_(op.hasInput(2)),
        threads_(std::max(1, context.threads)) {
    rows_.assign(static_cast<size_t>(threads_ * c_), 0.f);
    if (op.hasOutput(1)) partial_.assign(static_cast<size_t>((n_ + kBlock - 1) / kBlock * c_), 0.f);
    if (op.hasOutput(2)) positionLoss_.assign(static_cast<size_t>(n_), 0.0);
  }
  int inPlaceInput() const override { return 0; } // a row is widened before its dX is written
  void run(const KernelArgs &a) override {
    const auto *x = a.in<uint16_t>(0);
    const float *dy = a.in<float>(3);
    auto *dx = a.out<uint16_t>(0);
    const bool bf16 = bf16_;
    auto widenMax = bf16 ? vec::fromBfloat16Max : vec::fromHalfMax;
    auto scaleNarrow = bf16 ? vec::scaleToBfloat16 : vec::scaleToHalf;
    auto narrow = bf16 ? floatToBfloat16 : floatToHalf;
    auto widen = bf16 ? bfloat16ToFloat : halfToFloat;
    auto label = [&](int64_t k) -> int64_t {
      return labelType_ == DataType::INT64 ? a.in<int64_t>(1)[k] : a.in<int32_t>(1)[k];
    };
    auto weight = [&](int64_t l) -> double {
      if (l < 0 || l >= c_ || (ignore_ && l == *ignore_)) return 0.0;
      if (!hasWeights_) return 1.0;
      if (weightType_ == DataType::FLOAT) return static_cast<double>(a.in<float>(2)[l]);
      uint16_t w = a.in<uint16_t>(2)[l];
      return static_cast<double>(bf16 ? bfloat16ToFloat(w) : halfToFloat(w));
    };
    double denom = 1.0;
    if (reduction_ == 2) {
      denom = 0.0;
      for (int64_t k = 0; k < n_; ++k)
        denom += weight(label(k));
    }
    const bool withLoss = a.hasOutput(2), withSums = a.hasOutput(1);
    if (withLoss)
      for (int64_t k = 0; k < n_; ++k) {
        int64_t l = label(k);
        if ((l < 0 || l >= c_) && !(ignore_ && l == *ignore_))
          throw error(name_, ": label ", l, " at position ", k, " is out of range [0, ", c_, ")");
      }
    // Row k's gradient through the f32 \p row, added (rounded) to \p part when that is not null.
    auto position = [&](int64_t k, float *row, float *part) {
      const uint16_t *xs = x + k * c_;
      uint16_t *out = dx + k * c_;
      int64_t l = label(k);
      double w = weight(l);
      if (withLoss) positionLoss_[static_cast<size_t>(k)] = 0.0;
      if (w == 0.0) {
        std::fill(out, out + c_, uint16_t{0});
        return;
      }
      double g = (reduction_ == 0 ? static_cast<double>(dy[k]) : static_cast<double>(dy[0])) * w / denom;
      float mx = widenMax(xs, row, c_);
      const auto xl = static_cast<double>(row[l]);
      float sum = vec::expSubSum(row, mx, row, c_);
      if (withLoss) positionLoss_[static_cast<size_t>(k)] = -(xl - (mx + std::log(sum))) * w;
      // dX = e·(g / Σ) rounded, the label's less g: the classes before and after it in one pass each.
      const float scale = static_cast<float>(g) / sum;
      scaleNarrow(row, scale, out, part, l);
      out[l] = narrow(row[l] * scale - static_cast<float>(g));
      if (part) part[l] += widen(out[l]);
      scaleNarrow(row + l + 1, scale, out + l + 1, part ? part + l + 1 : nullptr, c_ - l - 1);
    };
    const int64_t blocks = (n_ + kBlock - 1) / kBlock;
    float *partial = partial_.data();
#pragma omp parallel num_threads(threads_)
    {
      float *row = rows_.data() + static_cast<int64_t>(omp_get_thread_num()) * c_;
      if (!withSums) {
#pragma omp for schedule(static)
        for (int64_t k = 0; k < n_; ++k)
          position(k, row, nullptr);
      } else {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b) {
          float *part = partial + b * c_;
          std::fill(part, part + c_, 0.f);
          for (int64_t k = b * kBlock; k < std::min(n_, (b + 1) * kBlock); ++k)
            position(k, row, part);
        }
      }
    }
    if (withSums) {
      auto *sums = a.out<uint16_t>(1);
#pragma omp parallel for schedule(static)
      for (int64_t c = 0; c < c_; ++c) {
        double s = 0;
        for (int64_t b = 0; b < blocks; ++b)
          s += static_cast<double>(partial[b * c_ + c]);
        sums[c] = bf16 ? floatToBfloat16(static_cast<float>(s)) : floatToHalf(static_cast<float>(s));
      }
    }
    if (withLoss) {
      float *loss = a.out<float>(2);
      double total = 0;
      for (int64_t k = 0; k < n_; ++k) {
        if (reduction_ == 0) loss[k] = static_cast<float>(positionLoss_[static_cast<size_t>(k)]);
        total += positionLoss_[static_cast<size_t>(k)];
      }
      if (reduction_ == 1) loss[0] = static_cast<float>(total);
      if (reduction_ == 2) loss[0] = static_cast<float>(total / denom);
    }
  }

private:
  static constexpr int64_t kBlock = 32;
  std::string name_;
  DataType labelType_, weightType_;
  bool bf16_, hasWeights_;
  int threads_;
  std::vector<float> rows_;    ///< one f32 row of C per thread
  std::vector<float> partial_; ///< per block of kBlock rows: the sum of their rounded dX
  std::vector<double> positionLoss_;
};

std::unique_ptr<Kernel> createSoftmaxCrossEntropyGrad(const ir::Op &op, const KernelContext &context) {
  if (op.inInfo(0).dataType() == DataType::FLOAT) return std::make_unique<SoftmaxCrossEntropyGradKernel>(op);
  return std::make_unique<SixteenBitSoftmaxCrossEntropyGradKernel>(op, context);
}

} // namespace

void registerFastLossKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "SoftmaxCrossEntropyLoss", KernelProvider::Fast, supportsRowSoftmaxCrossEntropy,
         createRowSoftmaxCrossEntropy});
  r.add({"ai.graphcore", "SoftmaxCrossEntropyLossGrad", KernelProvider::Fast, supportsSoftmaxCrossEntropyGrad,
         createSoftmaxCrossEntropyGrad});
}

} // namespace popart::backend_cpu
