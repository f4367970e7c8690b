// Reference kernels of PopART's ai.graphcore opset 1 (ir/ops/graphcore.hpp): GroupNormalization and
// its grad op, Scale, Subsample and its grad op, Detach, Init, IdentityLoss, Nll and its grad op, L1
// and PrintTensor. Plain loops; statistics and sums accumulated in double.

#include "ir/ops/graphcore.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"
#include "core/dispatch.hpp"
#include "core/log.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace popart::backend_cpu {

namespace {

template <typename T> double toDouble(T v) { return static_cast<double>(static_cast<compute_t<T>>(v)); }
template <typename T> T fromDouble(double v) { return static_cast<T>(static_cast<compute_t<T>>(v)); }

/// The shape of GroupNormalization(Grad) \p op's X [N, C, ...] as (N, G, channels per group,
/// elements per channel).
struct GroupShape {
  explicit GroupShape(const ir::Op &op) {
    const Shape &x = op.inInfo(0).shape();
    batch = x[0];
    groups = op.attrs.getInt("num_groups");
    channelsPerGroup = x[1] / groups;
    plane = shapeElementCount(Shape(x.begin() + 2, x.end()));
  }
  int64_t batch, groups, channelsPerGroup, plane;
  int64_t groupSize() const { return channelsPerGroup * plane; }
  int64_t channels() const { return groups * channelsPerGroup; }
};

/// Mean and 1/√(variance + eps) of the \p n values at \p p, two passes in double.
template <typename T> std::pair<double, double> groupStatistics(const T *p, int64_t n, double eps) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += toDouble(p[i]);
  const double mean = n > 0 ? sum / static_cast<double>(n) : 0.0;
  double sq = 0;
  for (int64_t i = 0; i < n; ++i)
    sq += (toDouble(p[i]) - mean) * (toDouble(p[i]) - mean);
  return {mean, 1.0 / std::sqrt((n > 0 ? sq / static_cast<double>(n) : 0.0) + eps)};
}

/// Y = (X − μ)·r·scale[c] + bias[c] per (sample, group); Mean and InvStdDev outputs optional.
class GroupNormKernel : public Kernel, GroupShape {
public:
  explicit GroupNormKernel(const ir::Op &op)
      : GroupShape(op), name_(op.debugName()), type_(op.inInfo(0).dataType()),
        eps_(op.attrs.getFloat("epsilon", 1e-5f)) {}
  void run(const KernelArgs &a) override {
    dispatchFloat(type_, name_.c_str(), [&](auto tag) { compute<typename decltype(tag)::type>(a); });
  }

private:
  template <typename T> void compute(const KernelArgs &a) const {
    const T *x = a.in<T>(0), *scale = a.in<T>(1), *bias = a.in<T>(2);
    T *y = a.out<T>(0);
    T *mean = a.hasOutput(1) ? a.out<T>(1) : nullptr, *invStd = a.hasOutput(2) ? a.out<T>(2) : nullptr;
    const int64_t count = batch * groups, size = groupSize();
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < count; ++k) {
      const auto [m, r] = groupStatistics(x + k * size, size, eps_);
      if (mean) mean[k] = fromDouble<T>(m);
      if (invStd) invStd[k] = fromDouble<T>(r);
      for (int64_t ci = 0; ci < channelsPerGroup; ++ci) {
        const int64_t c = (k % groups) * channelsPerGroup + ci, base = k * size + ci * plane;
        const double s = toDouble(scale[c]), b = toDouble(bias[c]);
        for (int64_t i = 0; i < plane; ++i)
          y[base + i] = fromDouble<T>((toDouble(x[base + i]) - m) * r * s + b);
      }
    }
  }

  std::string name_;
  DataType type_;
  double eps_;
};

/// dX = r·(g − mean(g) − x̂·mean(g·x̂)) per group for g = dY·scale[c], x̂ = (X − μ)·r;
/// dScale[c] = Σ dY·x̂, dBias[c] = Σ dY over samples and positions.
class GroupNormGradKernel : public Kernel, GroupShape {
public:
  explicit GroupNormGradKernel(const ir::Op &op)
      : GroupShape(op), name_(op.debugName()), type_(op.inInfo(0).dataType()),
        eps_(op.attrs.getFloat("epsilon", 1e-5f)), stats_(static_cast<size_t>(2 * batch * groups)) {}
  void run(const KernelArgs &a) override {
    dispatchFloat(type_, name_.c_str(), [&](auto tag) { compute<typename decltype(tag)::type>(a); });
  }

private:
  template <typename T> void compute(const KernelArgs &a) {
    const T *x = a.in<T>(0), *scale = a.in<T>(1), *dy = a.in<T>(4);
    const int64_t count = batch * groups, size = groupSize();
    double *mean = stats_.data(), *invStd = stats_.data() + count;
    for (int64_t k = 0; k < count; ++k)
      if (a.hasInput(2)) {
        mean[k] = toDouble(a.in<T>(2)[k]);
        invStd[k] = toDouble(a.in<T>(3)[k]);
      } else {
        std::tie(mean[k], invStd[k]) = groupStatistics(x + k * size, size, eps_);
      }
    if (a.hasOutput(0)) {
      T *dx = a.out<T>(0);
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < count; ++k) {
        const double m = mean[k], r = invStd[k];
        double sumG = 0, sumGX = 0;
        for (int64_t i = 0; i < size; ++i) {
          const int64_t c = (k % groups) * channelsPerGroup + i / plane, e = k * size + i;
          const double g = toDouble(dy[e]) * toDouble(scale[c]);
          sumG += g;
          sumGX += g * (toDouble(x[e]) - m) * r;
        }
        const double meanG = sumG / static_cast<double>(size), meanGX = sumGX / static_cast<double>(size);
        for (int64_t i = 0; i < size; ++i) {
          const int64_t c = (k % groups) * channelsPerGroup + i / plane, e = k * size + i;
          const double xhat = (toDouble(x[e]) - m) * r;
          dx[e] = fromDouble<T>(r * (toDouble(dy[e]) * toDouble(scale[c]) - meanG - xhat * meanGX));
        }
      }
    }
    T *dScale = a.hasOutput(1) ? a.out<T>(1) : nullptr, *dBias = a.hasOutput(2) ? a.out<T>(2) : nullptr;
    const int64_t channelCount = channels();
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < channelCount; ++c) {
      double sumDyX = 0, sumDy = 0;
      for (int64_t n = 0; n < batch; ++n) {
        const int64_t k = n * groups + c / channelsPerGroup, base = k * size + (c % channelsPerGroup) * plane;
        for (int64_t i = 0; i < plane; ++i) {
          const double d = toDouble(dy[base + i]);
          sumDy += d;
          sumDyX += d * (toDouble(x[base + i]) - mean[k]) * invStd[k];
        }
      }
      if (dScale) dScale[c] = fromDouble<T>(sumDyX);
      if (dBias) dBias[c] = fromDouble<T>(sumDy);
    }
  }

  std::string name_;
  DataType type_;
  double eps_;
  std::vector<double> stats_; ///< the means then the inverse standard deviations, per (sample, group)
};

std::unique_ptr<Kernel> createScale(const ir::Op &op) {
  const DataType type = op.inInfo(0).dataType();
  const double factor = op.attrs.getFloat("scale", 1.0f);
  const int64_t n = op.inInfo(0).elementCount();
  std::string name = op.debugName();
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    dispatchFloat(type, name.c_str(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const T *x = a.in<T>(0);
      T *y = a.out<T>(0);
      for (int64_t i = 0; i < n; ++i)
        y[i] = static_cast<T>(static_cast<C>(x[i]) * static_cast<C>(factor));
    });
  });
}

/// For each element of the subsampled shape \p small, in order, calls \p f(offset in the full tensor
/// of \p stride-strided shape, offset in the small one); the full tensor is row-major over \p full.
template <typename F>
void forEachSubsampled(const Shape &full, const Shape &small, const std::vector<int64_t> &strides, F &&f) {
  const size_t rank = full.size();
  std::vector<int64_t> fullStride(rank, 1), index(rank, 0);
  for (size_t d = rank; d-- > 1;)
    fullStride[d - 1] = fullStride[d] * full[d];
  const int64_t count = shapeElementCount(small);
  int64_t offset = 0;
  for (int64_t k = 0; k < count; ++k) {
    f(offset, k);
    // Next index of the small shape, carrying; offset follows in the full one.
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < small[d]) {
        offset += strides[d] * fullStride[d];
        break;
      }
      offset -= (small[d] - 1) * strides[d] * fullStride[d];
      index[d] = 0;
    }
  }
}

std::unique_ptr<Kernel> createSubsample(const ir::Op &op) {
  const Shape full = op.inInfo(0).shape(), small = op.outInfo(0).shape();
  const std::vector<int64_t> strides = op.attrs.getInts("strides");
  const size_t bytes = dataTypeSize(op.inInfo(0).dataType());
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    const auto *x = a.in<char>(0);
    auto *y = a.out<char>(0);
    forEachSubsampled(full, small, strides, [&](int64_t from, int64_t to) {
      std::memcpy(y + to * static_cast<int64_t>(bytes), x + from * static_cast<int64_t>(bytes), bytes);
    });
  });
}

std::unique_ptr<Kernel> createSubsampleGrad(const ir::Op &op) {
  const Shape full = op.outInfo(0).shape(), small = op.inInfo(0).shape();
  const std::vector<int64_t> strides = op.attrs.getInts("strides");
  const size_t bytes = dataTypeSize(op.inInfo(0).dataType());
  const auto total = static_cast<size_t>(op.outInfo(0).byteCount());
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    const auto *dy = a.in<char>(0);
    auto *dx = a.out<char>(0);
    std::memset(dx, 0, total); // all-zero bytes are 0 in every float type
    forEachSubsampled(full, small, strides, [&](int64_t to, int64_t from) {
      std::memcpy(dx + to * static_cast<int64_t>(bytes), dy + from * static_cast<int64_t>(bytes), bytes);
    });
  });
}

/// Values of \p n elements at \p p of \p type as text: "[1 2 3]", or the first and last \p edge
/// elements around "..." when there are more than \p threshold (0: never summarised).
std::string formatElements(const void *p, DataType type, int64_t n, int64_t threshold, int64_t edge) {
  std::ostringstream s;
  s.precision(8);
  s << '[';
  const bool summarise = threshold > 0 && n > threshold && 2 * edge < n;
  dispatchAll(type, "PrintTensor", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *v = static_cast<const T *>(p);
    for (int64_t i = 0; i < n; ++i) {
      if (summarise && i == edge) {
        s << " ...";
        i = n - edge - 1;
        continue;
      }
      if (i > 0) s << ' ';
      if constexpr (std::is_floating_point_v<compute_t<T>>)
        s << toDouble(v[i]);
      else
        s << static_cast<int64_t>(v[i]);
    }
  });
  s << ']';
  return s.str();
}

/// The identity, which logs its input at info level (formatting only when info is logged).
std::unique_ptr<Kernel> createPrintTensor(const ir::Op &op) {
  const TensorInfo info = op.inInfo(0);
  std::string title = op.attrs.getString("title", "");
  if (title.empty()) title = op.input(0).id();
  const int64_t threshold = op.attrs.getInt("summariseThreshold", 1000), edge = op.attrs.getInt("edgeItems", 3);
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    if (a.inputs[0] != a.outputs[0]) std::memcpy(a.outputs[0], a.inputs[0], static_cast<size_t>(info.byteCount()));
    auto &log = logging::logger();
    if (!log.should_log(spdlog::level::info)) return;
    log.info("{} {}: {}", title, info.toString(),
             formatElements(a.inputs[0], info.dataType(), info.elementCount(), threshold, edge));
  });
}

std::unique_ptr<Kernel> createCopy(const ir::Op &op) {
  const auto bytes = static_cast<size_t>(op.inInfo(0).byteCount());
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    if (a.inputs[0] != a.outputs[0]) std::memcpy(a.outputs[0], a.inputs[0], bytes);
  });
}

std::unique_ptr<Kernel> createInit(const ir::Op &op) {
  const auto bytes = static_cast<size_t>(op.outInfo(0).byteCount());
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) { std::memset(a.outputs[0], 0, bytes); });
}

/// IdentityLoss and L1: the element terms x (IdentityLoss) or λ·|x| (L1), reduced.
std::unique_ptr<Kernel> createElementLoss(const ir::Op &op) {
  const DataType type = op.inInfo(0).dataType();
  const int64_t n = op.inInfo(0).elementCount();
  const ir::LossReduction reduction = ir::lossReduction(op);
  const bool l1 = op.type == "L1";
  const double lambda = l1 ? op.attrs.getFloat("lambda") : 1.0;
  std::string name = op.debugName();
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    dispatchFloat(type, name.c_str(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T *x = a.in<T>(0);
      T *y = a.out<T>(0);
      double total = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double term = l1 ? lambda * std::abs(toDouble(x[i])) : toDouble(x[i]);
        if (reduction == ir::LossReduction::None) y[i] = fromDouble<T>(term);
        total += term;
      }
      if (reduction == ir::LossReduction::Sum) y[0] = fromDouble<T>(total);
      if (reduction == ir::LossReduction::Mean) y[0] = fromDouble<T>(n > 0 ? total / static_cast<double>(n) : 0.0);
    });
  });
}

/// Nll and NllGrad: probabilities [positions, classes] (classes last) and a label per position.
class NllKernel : public Kernel {
public:
  explicit NllKernel(const ir::Op &op)
      : name_(op.debugName()), type_(op.inInfo(0).dataType()), labelType_(op.inInfo(1).dataType()),
        reduction_(ir::lossReduction(op)), ignore_(ir::nllIgnoreIndex(op)),
        logProbabilities_(op.attrs.getInt("inputIsLogProbability", 0) != 0), grad_(op.type == "NllGrad"),
        floor_(ir::nllProbabilityFloor(type_)), classes_(op.inInfo(0).shape().back()),
        positions_(op.inInfo(1).elementCount()), labels_(static_cast<size_t>(positions_)) {}

  void run(const KernelArgs &a) override {
    dispatchNumeric(labelType_, name_.c_str(), [&](auto ltag) {
      using L = typename decltype(ltag)::type;
      if constexpr (std::is_integral_v<L>) readLabels(a.in<L>(1));
    });
    dispatchFloat(type_, name_.c_str(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      grad_ ? backward<T>(a) : forward<T>(a);
    });
  }

private:
  /// The labels as int64 (−1 where ignored); throws naming the position of one out of range.
  template <typename L> void readLabels(const L *labels) {
    active_ = 0;
    for (int64_t k = 0; k < positions_; ++k) {
      const auto l = static_cast<int64_t>(labels[k]);
      if (ignore_ && l == *ignore_) {
        labels_[static_cast<size_t>(k)] = -1;
        continue;
      }
      if (l < 0 || l >= classes_)
        throw error(name_, ": label ", l, " at position ", k, " is out of range [0, ", classes_, ")");
      labels_[static_cast<size_t>(k)] = l;
      ++active_;
    }
  }

  /// Mean divides by the positions not ignored (at least 1, so all ignored gives 0), as PopART.
  double denominator() const {
    return reduction_ == ir::LossReduction::Mean ? static_cast<double>(std::max<int64_t>(active_, 1)) : 1.0;
  }

  template <typename T> void forward(const KernelArgs &a) const {
    const T *p = a.in<T>(0);
    T *loss = a.out<T>(0);
    double total = 0;
    for (int64_t k = 0; k < positions_; ++k) {
      const int64_t l = labels_[static_cast<size_t>(k)];
      double value = 0;
      if (l >= 0) {
        const double v = toDouble(p[k * classes_ + l]);
        value = logProbabilities_ ? -v : -std::log(std::max(v, floor_));
      }
      if (reduction_ == ir::LossReduction::None) loss[k] = fromDouble<T>(value);
      total += value;
    }
    if (reduction_ != ir::LossReduction::None) loss[0] = fromDouble<T>(total / denominator());
  }

  /// The derivative of forward's term: −1 (log-probabilities) or −1/p (0 where p is clamped).
  template <typename T> void backward(const KernelArgs &a) const {
    const T *p = a.in<T>(0), *dy = a.in<T>(2);
    T *dp = a.out<T>(0);
    const double denom = denominator();
    for (int64_t k = 0; k < positions_; ++k) {
      for (int64_t c = 0; c < classes_; ++c)
        dp[k * classes_ + c] = fromDouble<T>(0.0);
      const int64_t l = labels_[static_cast<size_t>(k)];
      if (l < 0) continue;
      const double g = toDouble(reduction_ == ir::LossReduction::None ? dy[k] : dy[0]) / denom;
      const double v = toDouble(p[k * classes_ + l]);
      dp[k * classes_ + l] = fromDouble<T>(logProbabilities_ ? -g : (v > floor_ ? -g / v : 0.0));
    }
  }

  std::string name_;
  DataType type_, labelType_;
  ir::LossReduction reduction_;
  std::optional<int64_t> ignore_;
  bool logProbabilities_, grad_;
  double floor_;
  int64_t classes_, positions_, active_ = 0;
  std::vector<int64_t> labels_;
};

} // namespace

void registerReferenceGraphcoreKernels(KernelRegistry &r) {
  r.add({"ai.graphcore", "GroupNormalization", KernelProvider::Reference, nullptr, makeKernel<GroupNormKernel>});
  r.add(
      {"ai.graphcore", "GroupNormalizationGrad", KernelProvider::Reference, nullptr, makeKernel<GroupNormGradKernel>});
  r.add({"ai.graphcore", "Scale", KernelProvider::Reference, nullptr, createScale});
  r.add({"ai.graphcore", "Subsample", KernelProvider::Reference, nullptr, createSubsample});
  r.add({"ai.graphcore", "SubsampleGrad", KernelProvider::Reference, nullptr, createSubsampleGrad});
  r.add({"ai.graphcore", "Detach", KernelProvider::Reference, nullptr, createCopy});
  r.add({"ai.graphcore", "Init", KernelProvider::Reference, nullptr, createInit});
  r.add({"ai.graphcore", "IdentityLoss", KernelProvider::Reference, nullptr, createElementLoss});
  r.add({"ai.graphcore", "L1", KernelProvider::Reference, nullptr, createElementLoss});
  r.add({"ai.graphcore", "Nll", KernelProvider::Reference, nullptr, makeKernel<NllKernel>});
  r.add({"ai.graphcore", "NllGrad", KernelProvider::Reference, nullptr, makeKernel<NllKernel>});
  r.add({"ai.graphcore", "PrintTensor", KernelProvider::Reference, nullptr, createPrintTensor});
}

} // namespace popart::backend_cpu
