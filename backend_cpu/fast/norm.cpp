// Fast kernels: f32 BatchNormalization (one statistic per channel) and ai.graphcore
// BatchNormalizationGrad. Channels in parallel, each (batch, channel) plane through the vectorised
// loops of vecloops.hpp; statistics and gradient sums in double, as the reference kernels'.

#include "ir/ops/norm.hpp"
#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"

#include <cmath>
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

Support supportsBatchNorm(const ir::Op &op) {
  if (std::string why = notAllF32(op); !why.empty()) return Support::no(why);
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

Support supportsBatchNormGrad(const ir::Op &op) { return Support::unless(notAllF32(op)); }

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

} // namespace

void registerFastNormKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "BatchNormalization", KernelProvider::Fast, supportsBatchNorm, createBatchNorm});
  r.add({"ai.graphcore", "BatchNormalizationGrad", KernelProvider::Fast, supportsBatchNormGrad, createBatchNormGrad});
}

} // namespace popart::backend_cpu
