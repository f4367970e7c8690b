// Reference kernels: BatchNormalization, LayerNormalization, InstanceNormalization, LRN,
// MeanVarianceNormalization and ai.graphcore BatchNormalizationGrad: plain loops for every float
// type, statistics accumulated in double (the fast family has the f32 BatchNormalization ones).

#include "ir/ops/norm.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"
#include "core/dispatch.hpp"

#include <cmath>
#include <functional>
#include <utility>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// Stores \p v into element \p i of a floating-point buffer of type \p t.
void storeFloat(void *buf, DataType t, int64_t i, double v) {
  dispatchFloat(t, "normalisation statistics", [&](auto tag) {
    using T = typename decltype(tag)::type;
    static_cast<T *>(buf)[i] = static_cast<T>(static_cast<compute_t<T>>(v));
  });
}

/// Element \p i of a floating-point buffer of type \p t, as double: the FLOAT parameters of a
/// 16-bit normalisation (mixed precision's form) or ones of X's type.
double loadFloat(const void *buf, DataType t, int64_t i) {
  return dispatchFloat(t, "normalisation parameters", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return static_cast<double>(static_cast<compute_t<T>>(static_cast<const T *>(buf)[i]));
  });
}

/// Elements per (batch, channel) plane of a tensor of shape (N, C, spatial...).
int64_t planeSize(const Shape &x) { return shapeElementCount(Shape(x.begin() + 2, x.end())); }

/// The mean of the \p n values at \p p and 1/√(variance + \p eps), in double over two passes
/// (mean 0 and variance 0 for n = 0).
template <typename T> std::pair<double, double> meanAndInvStd(const T *p, int64_t n, double eps) {
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += static_cast<double>(p[i]);
  double mean = n > 0 ? sum / static_cast<double>(n) : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double d = static_cast<double>(p[i]) - mean;
    sq += d * d;
  }
  return {mean, 1.0 / std::sqrt((n > 0 ? sq / static_cast<double>(n) : 0.0) + eps)};
}

/// \p n elements of the floating-point buffer \p buf of type \p t into \p dst, as double.
void readDoubles(const void *buf, DataType t, int64_t n, double *dst) {
  dispatchFloat(t, "normalisation parameters", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < n; ++i)
      dst[i] = static_cast<double>(static_cast<const T *>(buf)[i]);
  });
}

/// The type of input \p i of \p op if present, else FLOAT.
DataType inType(const ir::Op &op, size_t i) { return op.hasInput(i) ? op.inInfo(i).dataType() : DataType::FLOAT; }
/// The type of output \p i of \p op if present, else FLOAT.
DataType outType(const ir::Op &op, size_t i) {
  return op.outputCount() > i && op.hasOutput(i) ? op.outInfo(i).dataType() : DataType::FLOAT;
}

// X and Y are one type; scale, B and the statistics may each be another (a 16-bit X with FLOAT
// parameters and statistics under mixed precision), so they are read into double first.
std::unique_ptr<Kernel> createBatchNorm(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t n = x[0], c = x[1], s = planeSize(x);
  bool perPosition = op.attrs.getInt("spatial", 1) == 0;
  double eps = op.attrs.getFloat("epsilon", 1e-5f);
  double momentum = op.attrs.getFloat("momentum", 0.9f);
  bool training = ir::batchNormTraining(op);
  if (training && perPosition) throw error(op.debugName(), ": training statistics with spatial=0 are not supported");
  double varFactor = training ? ir::runningVarianceFactor(op, n * s) : 1.0;
  int64_t params = perPosition ? c * s : c;
  bool relu = op.fusion.relu(); // fused by fuseBatchNormRelu
  DataType paramTypes[4] = {inType(op, 1), inType(op, 2), inType(op, 3), inType(op, 4)};
  DataType statTypes[4] = {outType(op, 1), outType(op, 2), outType(op, 3), outType(op, 4)};
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    // The batch mean and variance (c each), then scale, B, mean and var (params each).
    auto scratch = std::make_shared<std::vector<double>>(2 * c + 4 * params);
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0);
      T *Y = a.out<T>(0);
      double *bm = scratch->data(), *bv = scratch->data() + c, *param = scratch->data() + 2 * c;
      for (size_t i = 0; i < 4; ++i)
        readDoubles(a.inputs[i + 1], paramTypes[i], params, param + static_cast<int64_t>(i) * params);
      const double *scale = param, *B = param + params, *mean = param + 2 * params, *var = param + 3 * params;
      if (training) {
        double count = static_cast<double>(n * s);
        for (int64_t ch = 0; ch < c; ++ch) {
          double sum = 0, sq = 0;
          for (int64_t b = 0; b < n; ++b)
            for (int64_t i = 0; i < s; ++i) {
              double v = static_cast<double>(X[(b * c + ch) * s + i]);
              sum += v;
              sq += v * v;
            }
          bm[ch] = count > 0 ? sum / count : 0.0;
          bv[ch] = count > 0 ? sq / count - bm[ch] * bm[ch] : 0.0;
        }
      }
      for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < c; ++ch)
          for (int64_t i = 0; i < s; ++i) {
            int64_t p = perPosition ? ch * s + i : ch;
            double m = training ? bm[ch] : mean[p];
            double v = training ? bv[ch] : var[p];
            int64_t e = (b * c + ch) * s + i;
            double r = (static_cast<double>(X[e]) - m) / std::sqrt(v + eps) * scale[p] + B[p];
            if (relu && r < 0) r = 0;
            Y[e] = static_cast<T>(static_cast<compute_t<T>>(r));
          }
      if (!training) return;
      for (int64_t ch = 0; ch < params; ++ch) {
        double stats[4] = {mean[ch] * momentum + bm[ch] * (1 - momentum),
                           var[ch] * momentum + bv[ch] * varFactor * (1 - momentum), bm[ch], bv[ch]};
        for (size_t k = 0; k < 4; ++k)
          if (a.hasOutput(k + 1)) storeFloat(a.outputs[k + 1], statTypes[k], ch, stats[k]);
      }
    });
  });
}

/// dX = γ·r·(dY − mean(dY) − x̂·mean(dY·x̂)), dScale = Σ dY·x̂, dBias = Σ dY over (N, spatial), with
/// the batch statistics given as inputs 3 and 4 or computed from X. X, dY and dX are one type;
/// scale, the statistics, dScale and dBias may be FLOAT beside a 16-bit X.
std::unique_ptr<Kernel> createBatchNormGrad(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t n = x[0], c = x[1], s = planeSize(x);
  double eps = op.attrs.getFloat("epsilon", 1e-5f);
  DataType scaleType = inType(op, 1), statType = inType(op, 3);
  DataType dScaleType = outType(op, 1), dBiasType = outType(op, 2);
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    auto scratch = std::make_shared<std::vector<double>>(3 * c); // scale, given mean, given variance
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0), *dY = a.in<T>(2);
      bool givenStats = a.hasInput(3);
      double *scale = scratch->data(), *givenMean = scale + c, *givenVar = scale + 2 * c;
      readDoubles(a.inputs[1], scaleType, c, scale);
      if (givenStats) {
        readDoubles(a.inputs[3], statType, c, givenMean);
        readDoubles(a.inputs[4], statType, c, givenVar);
      }
      double count = static_cast<double>(n * s);
      auto at = [&](const T *p, int64_t b, int64_t ch, int64_t i) {
        return static_cast<double>(p[(b * c + ch) * s + i]);
      };
      for (int64_t ch = 0; ch < c; ++ch) {
        double mean = 0, var = 0;
        if (givenStats) {
          mean = givenMean[ch];
          var = givenVar[ch];
        } else if (count > 0) {
          for (int64_t b = 0; b < n; ++b)
            for (int64_t i = 0; i < s; ++i)
              mean += at(X, b, ch, i);
          mean /= count;
          for (int64_t b = 0; b < n; ++b)
            for (int64_t i = 0; i < s; ++i)
              var += (at(X, b, ch, i) - mean) * (at(X, b, ch, i) - mean);
          var /= count;
        }
        double r = 1.0 / std::sqrt(var + eps);
        double sumDy = 0, sumDyXhat = 0;
        for (int64_t b = 0; b < n; ++b)
          for (int64_t i = 0; i < s; ++i) {
            double dy = at(dY, b, ch, i);
            sumDy += dy;
            sumDyXhat += dy * (at(X, b, ch, i) - mean) * r;
          }
        if (a.hasOutput(1)) storeFloat(a.outputs[1], dScaleType, ch, sumDyXhat);
        if (a.hasOutput(2)) storeFloat(a.outputs[2], dBiasType, ch, sumDy);
        if (!a.hasOutput(0) || count == 0) continue;
        double gr = scale[ch] * r, meanDy = sumDy / count, meanDyXhat = sumDyXhat / count;
        for (int64_t b = 0; b < n; ++b)
          for (int64_t i = 0; i < s; ++i) {
            double xhat = (at(X, b, ch, i) - mean) * r;
            double dx = gr * (at(dY, b, ch, i) - meanDy - xhat * meanDyXhat);
            a.out<T>(0)[(b * c + ch) * s + i] = static_cast<T>(static_cast<compute_t<T>>(dx));
          }
      }
    });
  });
}

/// For each position of \p norm (row-major), the offset into a tensor of shape \p param
/// broadcast to it.
std::vector<int64_t> broadcastIndex(const Shape &norm, const Shape &param) {
  size_t r = norm.size();
  std::vector<int64_t> strides(r, 0);
  int64_t st = 1;
  for (size_t k = 0; k < param.size(); ++k) {
    size_t pi = param.size() - 1 - k, ni = r - 1 - k;
    strides[ni] = param[pi] == 1 ? 0 : st;
    st *= param[pi];
  }
  int64_t total = shapeElementCount(norm);
  std::vector<int64_t> idx(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) {
    int64_t rem = i, off = 0;
    for (size_t d = r; d-- > 0;) {
      off += (rem % norm[d]) * strides[d];
      rem /= norm[d];
    }
    idx[static_cast<size_t>(i)] = off;
  }
  return idx;
}

std::unique_ptr<Kernel> createLayerNorm(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = op.attrs.getInt("axis", -1);
  if (axis < 0) axis += rank;
  Shape norm(x.begin() + axis, x.end());
  int64_t inner = shapeElementCount(norm), outer = shapeElementCount(Shape(x.begin(), x.begin() + axis));
  double eps = op.attrs.getFloat("epsilon", 1e-5f);
  bool hasB = op.hasInput(2);
  auto scaleIdx = std::make_shared<std::vector<int64_t>>(broadcastIndex(norm, op.inInfo(1).shape()));
  auto biasIdx = std::make_shared<std::vector<int64_t>>(hasB ? broadcastIndex(norm, op.inInfo(2).shape())
                                                             : std::vector<int64_t>{});
  DataType statType = op.hasOutput(1)   ? op.outInfo(1).dataType()
                      : op.hasOutput(2) ? op.outInfo(2).dataType()
                                        : DataType::FLOAT;
  DataType scaleType = op.inInfo(1).dataType(), biasType = hasB ? op.inInfo(2).dataType() : scaleType;
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0);
      const void *S = a.inputs[1], *B = hasB ? a.inputs[2] : nullptr;
      T *Y = a.out<T>(0);
      for (int64_t o = 0; o < outer; ++o) {
        const T *xr = X + o * inner;
        auto [mean, inv] = meanAndInvStd(xr, inner, eps);
        for (int64_t i = 0; i < inner; ++i) {
          double r = (static_cast<double>(xr[i]) - mean) * inv * loadFloat(S, scaleType, (*scaleIdx)[i]);
          if (B) r += loadFloat(B, biasType, (*biasIdx)[i]);
          Y[o * inner + i] = static_cast<T>(static_cast<compute_t<T>>(r));
        }
        if (a.hasOutput(1)) storeFloat(a.outputs[1], statType, o, mean);
        if (a.hasOutput(2)) storeFloat(a.outputs[2], statType, o, inv);
      }
    });
  });
}

std::unique_ptr<Kernel> createInstanceNorm(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t c = x[1], planes = x[0] * x[1], s = planeSize(x);
  double eps = op.attrs.getFloat("epsilon", 1e-5f);
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0), *S = a.in<T>(1), *B = a.in<T>(2);
      T *Y = a.out<T>(0);
      for (int64_t p = 0; p < planes; ++p) {
        const T *xp = X + p * s;
        auto [mean, inv] = meanAndInvStd(xp, s, eps);
        double sc = static_cast<double>(S[p % c]), b = static_cast<double>(B[p % c]);
        for (int64_t i = 0; i < s; ++i)
          Y[p * s + i] = static_cast<T>(static_cast<compute_t<T>>((static_cast<double>(xp[i]) - mean) * inv * sc + b));
      }
    });
  });
}

std::unique_ptr<Kernel> createLRN(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t n = x[0], c = x[1], s = planeSize(x);
  int64_t size = op.attrs.getInt("size");
  double alpha = op.attrs.getFloat("alpha", 1e-4f), beta = op.attrs.getFloat("beta", 0.75f),
         bias = op.attrs.getFloat("bias", 1.f);
  int64_t before = (size - 1) / 2, after = size - 1 - before;
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0);
      T *Y = a.out<T>(0);
      for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < c; ++ch)
          for (int64_t i = 0; i < s; ++i) {
            double sq = 0;
            for (int64_t k = std::max<int64_t>(0, ch - before); k <= std::min(c - 1, ch + after); ++k) {
              double v = static_cast<double>(X[(b * c + k) * s + i]);
              sq += v * v;
            }
            int64_t e = (b * c + ch) * s + i;
            double r = static_cast<double>(X[e]) / std::pow(bias + alpha / static_cast<double>(size) * sq, beta);
            Y[e] = static_cast<T>(static_cast<compute_t<T>>(r));
          }
    });
  });
}

/// (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9) over the given axes, as ONNX's function body.
std::unique_ptr<Kernel> createMVN(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(x.size());
  std::vector<int64_t> axes = op.attrs.getInts("axes", {0, 2, 3});
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  for (int64_t ax : axes)
    reduced[static_cast<size_t>(ax < 0 ? ax + rank : ax)] = true;
  // Strides of each dim in the group index (0 for reduced dims).
  std::vector<int64_t> groupStride(static_cast<size_t>(rank), 0);
  int64_t groups = 1, count = 1;
  for (int64_t d = rank - 1; d >= 0; --d) {
    if (reduced[static_cast<size_t>(d)])
      count *= x[static_cast<size_t>(d)];
    else {
      groupStride[static_cast<size_t>(d)] = groups;
      groups *= x[static_cast<size_t>(d)];
    }
  }
  int64_t total = shapeElementCount(x);
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    auto scratch = std::make_shared<std::vector<double>>(2 * groups);
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0);
      T *Y = a.out<T>(0);
      double *sum = scratch->data(), *sq = scratch->data() + groups;
      std::fill(scratch->begin(), scratch->end(), 0.0);
      auto groupOf = [&](int64_t i) {
        int64_t g = 0;
        for (int64_t d = rank - 1; d >= 0; --d) {
          g += (i % x[static_cast<size_t>(d)]) * groupStride[static_cast<size_t>(d)];
          i /= x[static_cast<size_t>(d)];
        }
        return g;
      };
      for (int64_t i = 0; i < total; ++i) {
        double v = static_cast<double>(X[i]);
        int64_t g = groupOf(i);
        sum[g] += v;
        sq[g] += v * v;
      }
      for (int64_t i = 0; i < total; ++i) {
        int64_t g = groupOf(i);
        double mean = sum[g] / static_cast<double>(count);
        double var = sq[g] / static_cast<double>(count) - mean * mean;
        double r = (static_cast<double>(X[i]) - mean) / (std::sqrt(std::max(var, 0.0)) + 1e-9);
        Y[i] = static_cast<T>(static_cast<compute_t<T>>(r));
      }
    });
  });
}

} // namespace

void registerReferenceNormKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "BatchNormalization", KernelProvider::Reference, nullptr, createBatchNorm});
  r.add({"ai.graphcore", "BatchNormalizationGrad", KernelProvider::Reference, nullptr, createBatchNormGrad});
  r.add({"ai.onnx", "LayerNormalization", KernelProvider::Reference, nullptr, createLayerNorm});
  r.add({"ai.onnx", "InstanceNormalization", KernelProvider::Reference, nullptr, createInstanceNorm});
  r.add({"ai.onnx", "LRN", KernelProvider::Reference, nullptr, createLRN});
  r.add({"ai.onnx", "MeanVarianceNormalization", KernelProvider::Reference, nullptr, createMVN});
}

} // namespace popart::backend_cpu
