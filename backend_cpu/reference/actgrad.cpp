// Reference kernels of the ai.graphcore gradient ops SoftmaxGrad, LogSoftmaxGrad,
// LayerNormalizationGrad and ActivationGrad (ir/ops/actgrad.cpp). Sums are accumulated in double.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"
#include "core/dispatch.hpp"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

namespace popart::backend_cpu {

namespace {

template <typename T> T fromDouble(double v) { return static_cast<T>(static_cast<compute_t<T>>(v)); }

/// The [outer, n, inner] view of a single-axis softmax over \p op's input 0.
void softmaxView(const ir::Op &op, int64_t &outer, int64_t &n, int64_t &inner) {
  const Shape &s = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(s.size()), axis = op.attrs.getInt("axis", -1);
  if (axis < 0) axis += rank;
  outer = shapeElementCount(Shape(s.begin(), s.begin() + axis));
  n = s[static_cast<size_t>(axis)];
  inner = shapeElementCount(Shape(s.begin() + axis + 1, s.end()));
}

std::unique_ptr<Kernel> createSoftmaxGrad(const ir::Op &op) {
  int64_t outer = 0, n = 0, inner = 0;
  softmaxView(op, outer, n, inner);
  bool log = op.type == "LogSoftmaxGrad";
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *y = a.in<T>(0), *dy = a.in<T>(1);
      T *dx = a.out<T>(0);
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
          int64_t base = o * n * inner + i;
          auto Y = [&](int64_t k) { return static_cast<double>(y[base + k * inner]); };
          auto dY = [&](int64_t k) { return static_cast<double>(dy[base + k * inner]); };
          double s = 0;
          for (int64_t k = 0; k < n; ++k)
            s += log ? dY(k) : dY(k) * Y(k);
          for (int64_t k = 0; k < n; ++k)
            dx[base + k * inner] = fromDouble<T>(log ? dY(k) - std::exp(Y(k)) * s : Y(k) * (dY(k) - s));
        }
    });
  });
}

/// dX = r·(g − mean(g) − x̂·mean(g·x̂)) for g = dY·γ per row, dScale = Σ dY·x̂, dBias = Σ dY over rows.
std::unique_ptr<Kernel> createLayerNormGrad(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(x.size()), axis = op.attrs.getInt("axis", -1);
  if (axis < 0) axis += rank;
  int64_t outer = shapeElementCount(Shape(x.begin(), x.begin() + axis));
  int64_t inner = shapeElementCount(Shape(x.begin() + axis, x.end()));
  double eps = op.attrs.getFloat("epsilon", 1e-5f);
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    auto sums = std::make_shared<std::vector<double>>(2 * inner);
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *X = a.in<T>(0), *scale = a.in<T>(1), *dY = a.in<T>(2);
      bool givenStats = a.hasInput(3);
      double *dScale = sums->data(), *dBias = sums->data() + inner;
      std::fill(sums->begin(), sums->end(), 0.0);
      double count = static_cast<double>(inner);
      for (int64_t o = 0; o < outer; ++o) {
        const T *xr = X + o * inner, *dyr = dY + o * inner;
        double mean = 0, r = 0;
        if (givenStats) {
          mean = static_cast<double>(a.in<T>(3)[o]);
          r = static_cast<double>(a.in<T>(4)[o]);
        } else {
          for (int64_t i = 0; i < inner; ++i)
            mean += static_cast<double>(xr[i]);
          mean = inner > 0 ? mean / count : 0.0;
          double var = 0;
          for (int64_t i = 0; i < inner; ++i)
            var += (static_cast<double>(xr[i]) - mean) * (static_cast<double>(xr[i]) - mean);
          r = 1.0 / std::sqrt((inner > 0 ? var / count : 0.0) + eps);
        }
        double sumG = 0, sumGXhat = 0;
        for (int64_t i = 0; i < inner; ++i) {
          double dy = static_cast<double>(dyr[i]), xhat = (static_cast<double>(xr[i]) - mean) * r;
          double g = dy * static_cast<double>(scale[i]);
          sumG += g;
          sumGXhat += g * xhat;
          dScale[i] += dy * xhat;
          dBias[i] += dy;
        }
        if (!a.hasOutput(0)) continue;
        for (int64_t i = 0; i < inner; ++i) {
          double xhat = (static_cast<double>(xr[i]) - mean) * r;
          double g = static_cast<double>(dyr[i]) * static_cast<double>(scale[i]);
          a.out<T>(0)[o * inner + i] = fromDouble<T>(r * (g - sumG / count - xhat * sumGXhat / count));
        }
      }
      for (int64_t i = 0; i < inner; ++i) {
        if (a.hasOutput(1)) a.out<T>(1)[i] = fromDouble<T>(dScale[i]);
        if (a.hasOutput(2)) a.out<T>(2)[i] = fromDouble<T>(dBias[i]);
      }
    });
  });
}

enum class Act { Relu, Elu, Tanh, Sigmoid, Exp, Sqrt, LeakyRelu, Abs, Clip, Gelu };

std::unique_ptr<Kernel> createActivationGrad(const ir::Op &op) {
  const std::string act = op.attrs.getString("activation");
  static const std::pair<const char *, Act> names[] = {
      {"Relu", Act::Relu}, {"Elu", Act::Elu},   {"Tanh", Act::Tanh},           {"Sigmoid", Act::Sigmoid},
      {"Exp", Act::Exp},   {"Sqrt", Act::Sqrt}, {"LeakyRelu", Act::LeakyRelu}, {"Abs", Act::Abs},
      {"Clip", Act::Clip}, {"Gelu", Act::Gelu}};
  Act kind = Act::Relu;
  bool found = false;
  for (const auto &[name, k] : names)
    if (act == name) {
      kind = k;
      found = true;
    }
  if (!found) throw error(op.debugName(), ": unknown activation '", act, "'");
  double inf = std::numeric_limits<double>::infinity();
  double alpha = op.attrs.getFloat("alpha", kind == Act::LeakyRelu ? 0.01f : kind == Act::Clip ? -INFINITY : 1.f);
  double beta = op.attrs.getFloat("beta", static_cast<float>(inf));
  int64_t count = op.inInfo(0).elementCount();
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *in = a.in<T>(0), *dy = a.in<T>(1);
      T *dx = a.out<T>(0);
      for (int64_t i = 0; i < count; ++i) {
        double v = static_cast<double>(in[i]), g = static_cast<double>(dy[i]), r = 0;
        switch (kind) {
        case Act::Relu: r = v > 0 ? g : 0.0; break;
        case Act::Elu: r = v > 0 ? g : g * (v + alpha); break;
        case Act::Tanh: r = g * (1 - v * v); break;
        case Act::Sigmoid: r = g * v * (1 - v); break;
        case Act::Exp: r = g * v; break;
        case Act::Sqrt: r = g / (2 * v); break;
        case Act::LeakyRelu: r = v > 0 ? g : g * alpha; break;
        case Act::Abs: r = v > 0 ? g : v < 0 ? -g : 0.0; break;
        case Act::Clip: r = v >= alpha && v <= beta ? g : 0.0; break;
        case Act::Gelu: // Φ(v) + v·φ(v)
          r = g * (0.5 * (1 + std::erf(v * M_SQRT1_2)) + v * std::exp(-0.5 * v * v) * (0.5 * M_2_SQRTPI * M_SQRT1_2));
          break;
        }
        dx[i] = fromDouble<T>(r);
      }
    });
  });
}

} // namespace

void registerReferenceActGradKernels(KernelRegistry &r) {
  r.add({"ai.graphcore", "SoftmaxGrad", KernelProvider::Reference, nullptr, createSoftmaxGrad});
  r.add({"ai.graphcore", "LogSoftmaxGrad", KernelProvider::Reference, nullptr, createSoftmaxGrad});
  r.add({"ai.graphcore", "LayerNormalizationGrad", KernelProvider::Reference, nullptr, createLayerNormGrad});
  r.add({"ai.graphcore", "ActivationGrad", KernelProvider::Reference, nullptr, createActivationGrad});
}

} // namespace popart::backend_cpu
