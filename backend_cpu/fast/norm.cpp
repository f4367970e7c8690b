// Fast kernels: BatchNormalization (one statistic per channel) and ai.graphcore
// BatchNormalizationGrad, f32, and FLOAT16 or BFLOAT16 X, Y, dY and dX beside FLOAT parameters and
// statistics (mixed precision). Channels in parallel, each (batch, channel) plane through the
// vectorised loops of vecloops.hpp; statistics and gradient sums in double, as the reference
// kernels'. A 16-bit channel is widened into its thread's f32 scratch (whole when it fits, else
// in chunks, widened again for each pass), computed on by the same f32 loops, and its result
// narrowed once: no f32 copy of a whole tensor is made.

#include "ir/ops/norm.hpp"
#include "backend_cpu/fast/half_blocks.hpp"
#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// Elements per (batch, channel) plane of a tensor of shape (N, C, spatial...).
int64_t planeSize(const Shape &x) { return shapeElementCount(Shape(x.begin() + 2, x.end())); }

/// Why \p op has a tensor other than f32 (empty if it has none): the kernels read every input and
/// write every output as float.
std::string notAllF32(const ir::Op &op) {
  for (size_t i = 0; i < op.inputCount(); ++i)
    if (op.hasInput(i) && op.inInfo(i).dataType() != DataType::FLOAT) return "input " + std::to_string(i) + " not f32";
  for (size_t i = 0; i < op.outputCount(); ++i)
    if (op.hasOutput(i) && op.outInfo(i).dataType() != DataType::FLOAT)
      return "output " + std::to_string(i) + " not f32";
  return {};
}

bool isSixteenBit(DataType t) { return t == DataType::FLOAT16 || t == DataType::BFLOAT16; }

/// Why \p op is not a 16-bit batch normalisation this family runs (empty if it is): X, Y, and
/// for the gradient dY and dX, of one 16-bit type (the tensors of \p sameAsX), every other tensor
/// FLOAT.
std::string notSixteenBitData(const ir::Op &op, std::initializer_list<size_t> sameAsX) {
  const DataType t = op.inInfo(0).dataType();
  if (!isSixteenBit(t)) return "X is " + toString(t);
  for (size_t i = 1; i < op.inputCount(); ++i) {
    if (!op.hasInput(i)) continue;
    bool data = std::find(sameAsX.begin(), sameAsX.end(), i) != sameAsX.end();
    if (op.inInfo(i).dataType() != (data ? t : DataType::FLOAT))
      return "input " + std::to_string(i) + " is " + toString(op.inInfo(i).dataType());
  }
  for (size_t i = 0; i < op.outputCount(); ++i)
    if (op.hasOutput(i) && op.outInfo(i).dataType() != (i == 0 ? t : DataType::FLOAT))
      return "output " + std::to_string(i) + " is " + toString(op.outInfo(i).dataType());
  return {};
}

Support supportsBatchNorm(const ir::Op &op) {
  if (isSixteenBit(op.inInfo(0).dataType())) {
    if (std::string why = notSixteenBitData(op, {}); !why.empty()) return Support::no(why);
  } else if (std::string why = notAllF32(op); !why.empty()) {
    return Support::no(why);
  }
  if (op.attrs.getInt("spatial", 1) == 0) return Support::no("spatial = 0 (statistics per position)");
  return Support::yes();
}

std::unique_ptr<Kernel> createBatchNorm(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t n = x[0], c = x[1], s = planeSize(x);
  double eps = op.attrs.getFloat("epsilon", 1e-5f);
  double momentum = op.attrs.getFloat("momentum", 0.9f);
  bool training = ir::batchNormTraining(op);
  double varFactor = training ? ir::runningVarianceFactor(op, n * s) : 1.0;
  bool relu = op.fusion.relu(); // fused by fuseBatchNormRelu
  auto scratch = std::make_shared<std::vector<double>>(2 * c);
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    const float *X = a.in<float>(0), *scale = a.in<float>(1), *B = a.in<float>(2), *mean = a.in<float>(3),
                *var = a.in<float>(4);
    float *Y = a.out<float>(0);
    double *bm = scratch->data(), *bv = scratch->data() + c;
    const double count = static_cast<double>(n * s);
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < c; ++ch) {
      double m = mean[ch], v = var[ch];
      if (training) {
        double sum = 0, sq = 0;
        for (int64_t b = 0; b < n; ++b)
          sum += vec::sum(X + (b * c + ch) * s, s);
        m = count > 0 ? sum / count : 0.0;
        for (int64_t b = 0; b < n; ++b)
          sq += vec::sumSquaredDiff(X + (b * c + ch) * s, m, s);
        v = count > 0 ? sq / count : 0.0;
        bm[ch] = m;
        bv[ch] = v;
      }
      auto inv = static_cast<float>(1.0 / std::sqrt(v + eps));
      for (int64_t b = 0; b < n; ++b) {
        float *y = Y + (b * c + ch) * s;
        vec::centerScaleShift(X + (b * c + ch) * s, static_cast<float>(m), inv * scale[ch], B[ch], y, s);
        if (relu)
#pragma omp simd
          for (int64_t i = 0; i < s; ++i)
            y[i] = y[i] < 0.f ? 0.f : y[i]; // NaN stays NaN, as ONNX Relu keeps it
      }
    }
    if (!training) return;
    for (int64_t ch = 0; ch < c; ++ch) {
      if (a.hasOutput(1)) a.out<float>(1)[ch] = static_cast<float>(mean[ch] * momentum + bm[ch] * (1 - momentum));
      if (a.hasOutput(2))
        a.out<float>(2)[ch] = static_cast<float>(var[ch] * momentum + bv[ch] * varFactor * (1 - momentum));
      if (a.hasOutput(3)) a.out<float>(3)[ch] = static_cast<float>(bm[ch]);
      if (a.hasOutput(4)) a.out<float>(4)[ch] = static_cast<float>(bv[ch]);
    }
  });
}

Support supportsBatchNormGrad(const ir::Op &op) {
  if (isSixteenBit(op.inInfo(0).dataType())) return Support::unless(notSixteenBitData(op, {2}));
  return Support::unless(notAllF32(op));
}

/// dX = γ·r·(dY − mean(dY) − x̂·mean(dY·x̂)), dScale = Σ dY·x̂, dBias = Σ dY over (N, spatial), with
/// the batch statistics given as inputs 3 and 4 or computed from X.
std::unique_ptr<Kernel> createBatchNormGrad(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t n = x[0], c = x[1], s = planeSize(x);
  double eps = op.attrs.getFloat("epsilon", 1e-5f);
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    const float *X = a.in<float>(0), *scale = a.in<float>(1), *dY = a.in<float>(2);
    const bool givenStats = a.hasInput(3);
    const double count = static_cast<double>(n * s);
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < c; ++ch) {
      double mean = 0, var = 0;
      if (givenStats) {
        mean = a.in<float>(3)[ch];
        var = a.in<float>(4)[ch];
      } else if (count > 0) {
        for (int64_t b = 0; b < n; ++b)
          mean += vec::sum(X + (b * c + ch) * s, s);
        mean /= count;
        for (int64_t b = 0; b < n; ++b)
          var += vec::sumSquaredDiff(X + (b * c + ch) * s, mean, s);
        var /= count;
      }
      double r = 1.0 / std::sqrt(var + eps), sumDy = 0, sumDyXc = 0;
      for (int64_t b = 0; b < n; ++b) {
        sumDy += vec::sum(dY + (b * c + ch) * s, s);
        sumDyXc += vec::sumProductDiff(dY + (b * c + ch) * s, X + (b * c + ch) * s, mean, s);
      }
      double sumDyXhat = sumDyXc * r;
      if (a.hasOutput(1)) a.out<float>(1)[ch] = static_cast<float>(sumDyXhat);
      if (a.hasOutput(2)) a.out<float>(2)[ch] = static_cast<float>(sumDy);
      if (!a.hasOutput(0) || count == 0) continue;
      for (int64_t b = 0; b < n; ++b)
        vec::batchNormBackward(X + (b * c + ch) * s, dY + (b * c + ch) * s, static_cast<float>(mean),
                               static_cast<float>(r), static_cast<float>(scale[ch] * r),
                               static_cast<float>(sumDy / count), static_cast<float>(sumDyXhat / count),
                               a.out<float>(0) + (b * c + ch) * s, s);
    }
  });
}

/// f32 scratch per thread for a 16-bit channel (256 KiB, so that a channel widened once stays in
/// L2 between its passes); a larger channel goes through it in chunks, widened for each pass.
constexpr int64_t kChannelFloats = int64_t{64} * 1024;

/// What the 16-bit kernels share: the (N, C, spatial...) geometry, the conversions of X's type
/// (exact widening, rounding as core/half.hpp) and each thread's part of the scratch, which holds
/// \p tensors f32 runs of a channel (or chunk) side by side.
class SixteenBitBatchNormBase : public Kernel {
public:
  int64_t scratchBytes() const override { return 4 * perThread_ * threads_; }

protected:
  SixteenBitBatchNormBase(const ir::Op &op, const KernelContext &context, int64_t tensors) {
    const Shape &x = op.inInfo(0).shape();
    n_ = x[0];
    c_ = x[1];
    s_ = planeSize(x);
    bf16_ = op.inInfo(0).dataType() == DataType::BFLOAT16;
    // fp16 through F16C where the CPU has it (the conversions of the f16 Conv and MatMul, about
    // twice as fast here as vec's integer ones); bf16 is a shift either way.
    halfLoops_ = half_blocks::halfLoops();
    widen_ = bf16_ ? vec::fromBfloat16 : halfLoops_.widen;
    threads_ = static_cast<int>(std::clamp<int64_t>(context.threads, 1, std::max<int64_t>(c_, 1)));
    const int64_t channel = n_ * s_;
    resident_ = tensors * channel <= kChannelFloats;
    run_ = resident_ ? channel : std::max<int64_t>(1, kChannelFloats / tensors);
    perThread_ = (tensors * run_ + 15) / 16 * 16; // 64-byte aligned parts
  }

  /// The scratch of the run: the plan's, or the kernel's own outside a plan (allocated once).
  float *scratch(const KernelArgs &a) {
    if (a.scratch) return static_cast<float *>(a.scratch);
    if (owned_.empty()) owned_.resize(static_cast<size_t>(perThread_ * threads_));
    return owned_.data();
  }
  /// Calls \p f(b, offset, length) for the runs of one channel: each plane b, cut into runs of
  /// the scratch's length when the channel is not resident.
  template <typename F> void forEachRun(F &&f) const {
    for (int64_t b = 0; b < n_; ++b)
      for (int64_t o = 0; o < s_; o += run_)
        f(b, o, std::min(run_, s_ - o));
  }
  /// Where the f32 elements [o, o + len) of plane \p b of the tensor at \p part of a thread's
  /// scratch are: in place when the channel is resident, else at the start, widened from \p src
  /// (the channel's 16-bit first element) now.
  float *load(float *part, const uint16_t *src, int64_t b, int64_t o, int64_t len) const {
    if (resident_) return part + b * s_ + o;
    widen_(src + b * c_ * s_ + o, part, len);
    return part;
  }
  /// Narrows \p len f32 values of \p src (which may be overwritten) into \p dst, through a Relu
  /// first with \p relu (NaN stays NaN, as ONNX Relu keeps it).
  void narrow(float *src, uint16_t *dst, int64_t len, bool relu) const {
    if (!bf16_) {
      half_blocks::Epilogue e;
      e.relu = relu;
      e.y = dst;
      halfLoops_.epilogue(src, len, e);
      return;
    }
    if (relu)
#pragma omp simd
      for (int64_t i = 0; i < len; ++i)
        src[i] = src[i] < 0.f ? 0.f : src[i];
    vec::toBfloat16(src, dst, len);
  }
  /// Widens the channel at \p src into \p part when it is resident (once, before its passes).
  void widenResident(float *part, const uint16_t *src) const {
    if (!resident_) return;
    for (int64_t b = 0; b < n_; ++b)
      widen_(src + b * c_ * s_, part + b * s_, s_);
  }

  int64_t n_ = 0, c_ = 0, s_ = 0, run_ = 0, perThread_ = 0;
  int threads_ = 1;
  bool resident_ = true, bf16_ = false;
  half_blocks::HalfLoops halfLoops_;
  void (*widen_)(const uint16_t *, float *, int64_t) = nullptr;

private:
  std::vector<float> owned_;
};

/// BatchNormalization of a FLOAT16 or BFLOAT16 X into Y of its type, FLOAT scale, bias and
/// statistics: the f32 kernel's loops on each widened channel, Y narrowed once.
class SixteenBitBatchNormKernel : public SixteenBitBatchNormBase {
public:
  SixteenBitBatchNormKernel(const ir::Op &op, const KernelContext &context) : SixteenBitBatchNormBase(op, context, 1) {
    eps_ = op.attrs.getFloat("epsilon", 1e-5f);
    momentum_ = op.attrs.getFloat("momentum", 0.9f);
    training_ = ir::batchNormTraining(op);
    varFactor_ = training_ ? ir::runningVarianceFactor(op, n_ * s_) : 1.0;
    relu_ = op.fusion.relu(); // fused by fuseBatchNormRelu
    batchStats_.assign(static_cast<size_t>(2 * c_), 0.0);
  }
  std::string choice() const override {
    return resident_ ? "channels widened whole" : "channels widened in runs of " + std::to_string(run_);
  }
  void run(const KernelArgs &a) override {
    const auto *X = a.in<uint16_t>(0);
    auto *Y = a.out<uint16_t>(0);
    const float *scale = a.in<float>(1), *B = a.in<float>(2), *mean = a.in<float>(3), *var = a.in<float>(4);
    float *base = scratch(a);
    double *bm = batchStats_.data(), *bv = batchStats_.data() + c_;
    const double count = static_cast<double>(n_ * s_);
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t ch = 0; ch < c_; ++ch) {
      float *buf = base + perThread_ * omp_get_thread_num();
      const uint16_t *x = X + ch * s_;
      widenResident(buf, x);
      double m = mean[ch], v = var[ch];
      if (training_) {
        double sum = 0, sq = 0;
        forEachRun([&](int64_t b, int64_t o, int64_t len) { sum += vec::sum(load(buf, x, b, o, len), len); });
        m = count > 0 ? sum / count : 0.0;
        forEachRun(
            [&](int64_t b, int64_t o, int64_t len) { sq += vec::sumSquaredDiff(load(buf, x, b, o, len), m, len); });
        v = count > 0 ? sq / count : 0.0;
        bm[ch] = m;
        bv[ch] = v;
      }
      const auto inv = static_cast<float>(1.0 / std::sqrt(v + eps_));
      forEachRun([&](int64_t b, int64_t o, int64_t len) {
        float *y = load(buf, x, b, o, len);
        vec::centerScaleShift(y, static_cast<float>(m), inv * scale[ch], B[ch], y, len);
        narrow(y, Y + (b * c_ + ch) * s_ + o, len, relu_);
      });
    }
    if (!training_) return;
    for (int64_t ch = 0; ch < c_; ++ch) {
      if (a.hasOutput(1)) a.out<float>(1)[ch] = static_cast<float>(mean[ch] * momentum_ + bm[ch] * (1 - momentum_));
      if (a.hasOutput(2))
        a.out<float>(2)[ch] = static_cast<float>(var[ch] * momentum_ + bv[ch] * varFactor_ * (1 - momentum_));
      if (a.hasOutput(3)) a.out<float>(3)[ch] = static_cast<float>(bm[ch]);
      if (a.hasOutput(4)) a.out<float>(4)[ch] = static_cast<float>(bv[ch]);
    }
  }

private:
  double eps_ = 1e-5, momentum_ = 0.9, varFactor_ = 1.0;
  bool training_ = false, relu_ = false;
  std::vector<double> batchStats_; ///< mean, then variance, per channel
};

/// BatchNormalizationGrad of a FLOAT16 or BFLOAT16 X and dY into dX of their type, FLOAT scale,
/// statistics, dScale and dBias: X's and dY's channels widened side by side, the f32 kernel's loops.
class SixteenBitBatchNormGradKernel : public SixteenBitBatchNormBase {
public:
  SixteenBitBatchNormGradKernel(const ir::Op &op, const KernelContext &context)
      : SixteenBitBatchNormBase(op, context, 2) {
    eps_ = op.attrs.getFloat("epsilon", 1e-5f);
  }
  std::string choice() const override {
    return resident_ ? "channels widened whole" : "channels widened in runs of " + std::to_string(run_);
  }
  void run(const KernelArgs &a) override {
    const auto *X = a.in<uint16_t>(0), *dY = a.in<uint16_t>(2);
    const float *scale = a.in<float>(1);
    const bool givenStats = a.hasInput(3);
    float *base = scratch(a);
    const double count = static_cast<double>(n_ * s_);
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t ch = 0; ch < c_; ++ch) {
      float *bufX = base + perThread_ * omp_get_thread_num(), *bufDy = bufX + run_;
      const uint16_t *x = X + ch * s_, *dy = dY + ch * s_;
      widenResident(bufX, x);
      widenResident(bufDy, dy);
      double mean = 0, var = 0;
      if (givenStats) {
        mean = a.in<float>(3)[ch];
        var = a.in<float>(4)[ch];
      } else if (count > 0) {
        forEachRun([&](int64_t b, int64_t o, int64_t len) { mean += vec::sum(load(bufX, x, b, o, len), len); });
        mean /= count;
        forEachRun([&](int64_t b, int64_t o, int64_t len) {
          var += vec::sumSquaredDiff(load(bufX, x, b, o, len), mean, len);
        });
        var /= count;
      }
      double r = 1.0 / std::sqrt(var + eps_), sumDy = 0, sumDyXc = 0;
      forEachRun([&](int64_t b, int64_t o, int64_t len) {
        const float *xr = load(bufX, x, b, o, len), *dyr = load(bufDy, dy, b, o, len);
        sumDy += vec::sum(dyr, len);
        sumDyXc += vec::sumProductDiff(dyr, xr, mean, len);
      });
      const double sumDyXhat = sumDyXc * r;
      if (a.hasOutput(1)) a.out<float>(1)[ch] = static_cast<float>(sumDyXhat);
      if (a.hasOutput(2)) a.out<float>(2)[ch] = static_cast<float>(sumDy);
      if (!a.hasOutput(0) || count == 0) continue;
      forEachRun([&](int64_t b, int64_t o, int64_t len) {
        float *xr = load(bufX, x, b, o, len);
        const float *dyr = load(bufDy, dy, b, o, len);
        // dX overwrites the widened X, element by element after reading it.
        vec::batchNormBackward(xr, dyr, static_cast<float>(mean), static_cast<float>(r),
                               static_cast<float>(scale[ch] * r), static_cast<float>(sumDy / count),
                               static_cast<float>(sumDyXhat / count), xr, len);
        narrow(xr, a.out<uint16_t>(0) + (b * c_ + ch) * s_ + o, len, false);
      });
    }
  }

private:
  double eps_ = 1e-5;
};

std::unique_ptr<Kernel> createAnyBatchNorm(const ir::Op &op, const KernelContext &context) {
  if (isSixteenBit(op.inInfo(0).dataType())) return std::make_unique<SixteenBitBatchNormKernel>(op, context);
  return createBatchNorm(op);
}

std::unique_ptr<Kernel> createAnyBatchNormGrad(const ir::Op &op, const KernelContext &context) {
  if (isSixteenBit(op.inInfo(0).dataType())) return std::make_unique<SixteenBitBatchNormGradKernel>(op, context);
  return createBatchNormGrad(op);
}

} // namespace

void registerFastNormKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "BatchNormalization", KernelProvider::Fast, supportsBatchNorm, createAnyBatchNorm});
  r.add(
      {"ai.graphcore", "BatchNormalizationGrad", KernelProvider::Fast, supportsBatchNormGrad, createAnyBatchNormGrad});
}

} // namespace popart::backend_cpu
