// Reference kernels: Dropout, Einsum, MatMulInteger, (De)QuantizeLinear, DynamicQuantizeLinear, Det.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/broadcast.hpp"
#include "core/dispatch.hpp"
#include "ir/ops/dropout.hpp"
#include "ir/ops/einsum.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

namespace popart::backend_cpu {

namespace {

template <typename T> double toDouble(T v) { return static_cast<double>(static_cast<compute_t<T>>(v)); }
template <typename T> T fromDouble(double v) { return static_cast<T>(static_cast<compute_t<T>>(v)); }

/// Dropout. With the (seed, counter) input 3 the mask is the counter-based one of
/// ir/ops/dropout.hpp; without it, the seed attribute's MT19937 stream as before (see run()).
class DropoutKernel : public Kernel {
public:
  DropoutKernel(const ir::Op &op, const KernelContext &context)
      : type_(op.inInfo(0).dataType()), maskType_(op.hasOutput(1) ? op.outInfo(1).dataType() : DataType::BOOL),
        n_(op.inInfo(0).elementCount()), ratio_(op.attrs.getFloat("ratio", 0.5f)),
        ratioType_(op.hasInput(1) ? op.inInfo(1).dataType() : DataType::FLOAT), seeded_(op.attrs.has("seed")),
        seed_(static_cast<std::mt19937::result_type>(op.attrs.getInt("seed", 0))),
        rng_(seeded_ ? seed_ : unseeded(op, context)), counterBased_(op.hasInput(3)),
        salt_(static_cast<uint64_t>(ir::dropoutSalt(op))), trainsWithoutInput_(ir::dropoutTraining(op, false)),
        trainsWithInput_(ir::dropoutTraining(op, true)) {}

  /// The MT19937 seed of an op without a seed attribute: the session's randomSeed mixed with the
  /// op's salt, or one from the system when the session has none.
  static std::mt19937::result_type unseeded(const ir::Op &op, const KernelContext &context) {
    if (context.randomSeed < 0) return std::random_device{}();
    uint64_t h =
        static_cast<uint64_t>(context.randomSeed) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(ir::dropoutSalt(op));
    h ^= h >> 29;
    return static_cast<std::mt19937::result_type>(h ^ (h >> 32));
  }

  void run(const KernelArgs &a) override {
    float ratio = ratio_;
    if (a.hasInput(1))
      ratio = dispatchFloat(ratioType_, "Dropout ratio", [&](auto tag) {
        using R = typename std::decay_t<decltype(tag)>::type;
        return static_cast<float>(a.in<R>(1)[0]);
      });
    // Before opset 12 there is no training_mode input: an inference session treats the op as
    // identity even where opset 1-6's is_test=0 asked for training, like other runtimes do, unless
    // the session connects the (seed, counter) input.
    bool training = a.hasInput(2) && a.in<bool>(2)[0] ? trainsWithInput_ : trainsWithoutInput_;
    if (training && (ratio < 0 || ratio >= 1)) throw error("Dropout: ratio ", ratio, " must be in [0, 1)");
    if (!training) ratio = 0;
    uint64_t key = 0;
    if (counterBased_)
      key =
          ir::dropoutKey(static_cast<uint64_t>(a.in<int64_t>(3)[0]), static_cast<uint64_t>(a.in<int64_t>(3)[1]), salt_);
    // With a seed attribute the mask is a function of the seed alone, as in the ONNX reference
    // (numpy's legacy MT19937 seeding equals std::mt19937's, and random_sample() takes 53 bits
    // from two draws); without one, the generator runs on across steps.
    if (seeded_ && !counterBased_) rng_.seed(seed_);
    auto uniform = [&](int64_t i) {
      if (counterBased_) return ir::dropoutUniform(key, static_cast<uint64_t>(i));
      double hi = static_cast<double>(rng_() >> 5), lo = static_cast<double>(rng_() >> 6);
      return (hi * 67108864.0 + lo) / 9007199254740992.0;
    };
    float scale = 1.f / (1.f - ratio);
    dispatchFloat(type_, "Dropout", [&](auto tag) {
      using T = typename std::decay_t<decltype(tag)>::type;
      const T *x = a.in<T>(0);
      T *y = a.out<T>(0);
      for (int64_t i = 0; i < n_; ++i) {
        bool keep = ratio == 0 || uniform(i) >= static_cast<double>(ratio);
        y[i] =
            keep ? (ratio == 0 ? x[i] : static_cast<T>(static_cast<compute_t<T>>(x[i]) * scale)) : static_cast<T>(0.f);
        if (a.hasOutput(1)) {
          if (maskType_ == DataType::BOOL)
            a.out<bool>(1)[i] = keep;
          else
            a.out<T>(1)[i] = static_cast<T>(keep ? 1.f : 0.f);
        }
      }
    });
  }

private:
  DataType type_, maskType_;
  int64_t n_;
  float ratio_;
  DataType ratioType_;
  bool seeded_;
  std::mt19937::result_type seed_;
  std::mt19937 rng_;
  bool counterBased_;
  uint64_t salt_;
  bool trainsWithoutInput_, trainsWithInput_;
};

/// Sums the product of the operands over every label missing from the output.
class EinsumKernel : public Kernel {
public:
  explicit EinsumKernel(const ir::Op &op) : type_(op.outInfo(0).dataType()), operands_(op.inputCount()) {
    ir::EinsumSpec spec = ir::parseEinsum(op);
    const std::vector<std::vector<int>> &inputs = spec.inputs;
    const std::vector<int> &output = spec.output;
    std::map<int, int64_t> sizes;
    for (size_t t = 0; t < inputs.size(); ++t)
      for (size_t d = 0; d < inputs[t].size(); ++d) {
        int64_t s = op.inInfo(t).shape()[d];
        if (!sizes.count(inputs[t][d]) || sizes[inputs[t][d]] == 1) sizes[inputs[t][d]] = s;
      }
    std::vector<int> labels = output;
    for (auto [l, s] : sizes)
      if (std::find(output.begin(), output.end(), l) == output.end()) labels.push_back(l);
    outLabels_ = output.size();
    for (int l : labels)
      dims_.push_back(sizes[l]);
    // strides_[t][j]: step in operand t for label j; repeated labels (diagonals) add up,
    // broadcast dimensions of size 1 stay 0.
    strides_.assign(operands_, std::vector<int64_t>(labels.size(), 0));
    for (size_t t = 0; t < inputs.size(); ++t) {
      std::vector<int64_t> rs = rowMajorStrides(op.inInfo(t).shape());
      for (size_t d = 0; d < inputs[t].size(); ++d) {
        size_t j = static_cast<size_t>(std::find(labels.begin(), labels.end(), inputs[t][d]) - labels.begin());
        if (op.inInfo(t).shape()[d] != 1 || dims_[j] == 1) strides_[t][j] += rs[d];
      }
    }
    pos_.resize(labels.size());
    offsets_.resize(operands_);
    total_ = shapeElementCount(dims_);
    outCount_ = shapeElementCount(Shape(dims_.begin(), dims_.begin() + static_cast<int64_t>(outLabels_)));
  }

  void run(const KernelArgs &a) override {
    dispatchNumeric(type_, "Einsum", [&](auto tag) {
      using T = typename std::decay_t<decltype(tag)>::type;
      using C = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, int64_t>;
      T *y = a.out<T>(0);
      int64_t outCount = outCount_;
      int64_t inner = outCount == 0 ? 0 : total_ / outCount;
      std::fill(pos_.begin(), pos_.end(), 0);
      std::fill(offsets_.begin(), offsets_.end(), 0);
      // The odometer runs over output labels (outer) then summed labels (inner), so each
      // output element's terms are consecutive.
      for (int64_t o = 0; o < outCount; ++o) {
        C acc = 0;
        for (int64_t s = 0; s < inner; ++s) {
          C prod = 1;
          for (size_t t = 0; t < operands_; ++t)
            prod *= static_cast<C>(static_cast<compute_t<T>>(a.in<T>(t)[offsets_[t]]));
          acc += prod;
          step();
        }
        if (inner == 0) step0();
        y[o] = static_cast<T>(static_cast<compute_t<T>>(acc));
      }
      if (outCount == 0) return;
    });
  }

private:
  void step() {
    for (size_t d = dims_.size(); d-- > 0;) {
      for (size_t t = 0; t < operands_; ++t)
        offsets_[t] += strides_[t][d];
      if (++pos_[d] < dims_[d]) return;
      for (size_t t = 0; t < operands_; ++t)
        offsets_[t] -= strides_[t][d] * pos_[d];
      pos_[d] = 0;
    }
  }
  /// Advances over the output labels only (when a summed label has size 0).
  void step0() {
    for (size_t d = outLabels_; d-- > 0;) {
      for (size_t t = 0; t < operands_; ++t)
        offsets_[t] += strides_[t][d];
      if (++pos_[d] < dims_[d]) return;
      for (size_t t = 0; t < operands_; ++t)
        offsets_[t] -= strides_[t][d] * pos_[d];
      pos_[d] = 0;
    }
  }

  DataType type_;
  size_t operands_;
  size_t outLabels_;
  Shape dims_;
  std::vector<std::vector<int64_t>> strides_;
  std::vector<int64_t> pos_, offsets_;
  int64_t total_;
  int64_t outCount_ = 0;
};

/// MatMulInteger (int32 output) and QLinearMatMul (requantised output) on 8-bit inputs.
class MatMulIntegerKernel : public Kernel {
public:
  explicit MatMulIntegerKernel(const ir::Op &op) : qlinear_(op.type == "QLinearMatMul") {
    // Input positions: MatMulInteger (A, B, a_zp, b_zp); QLinearMatMul (A, a_scale, a_zp, B,
    // b_scale, b_zp, y_scale, y_zp).
    a_ = 0;
    b_ = qlinear_ ? 3 : 1;
    aZero_ = 2;
    bZero_ = qlinear_ ? 5 : 3;
    aType_ = op.inInfo(a_).dataType();
    bType_ = op.inInfo(b_).dataType();
    aZeroCount_ = op.hasInput(aZero_) ? op.inInfo(aZero_).elementCount() : 0;
    bZeroCount_ = op.hasInput(bZero_) ? op.inInfo(bZero_).elementCount() : 0;
    if (qlinear_) {
      aScaleCount_ = op.inInfo(1).elementCount();
      bScaleCount_ = op.inInfo(4).elementCount();
      outType_ = op.outInfo(0).dataType();
    }
    Shape a = op.inInfo(a_).shape(), b = op.inInfo(b_).shape();
    if (a.size() == 1) a.insert(a.begin(), 1);
    if (b.size() == 1) b.push_back(1);
    m_ = a[a.size() - 2];
    k_ = a.back();
    n_ = b.back();
    Shape batchA(a.begin(), a.end() - 2), batchB(b.begin(), b.end() - 2);
    size_t rank = std::max(batchA.size(), batchB.size());
    while (batchA.size() < rank)
      batchA.insert(batchA.begin(), 1);
    while (batchB.size() < rank)
      batchB.insert(batchB.begin(), 1);
    Shape batch(rank);
    for (size_t i = 0; i < rank; ++i)
      batch[i] = std::max(batchA[i], batchB[i]);
    int64_t batches = shapeElementCount(batch);
    BroadcastWalker w(batch, {batchA, batchB});
    for (int64_t i = 0; i < batches; ++i, w.next()) {
      offsetA_.push_back(w.offset(0) * m_ * k_);
      offsetB_.push_back(w.offset(1) * k_ * n_);
    }
  }

  void run(const KernelArgs &a) override {
    auto value = [](DataType t, const void *p, int64_t i) -> int32_t {
      return t == DataType::UINT8 ? static_cast<const uint8_t *>(p)[i] : static_cast<const int8_t *>(p)[i];
    };
    for (size_t bi = 0; bi < offsetA_.size(); ++bi)
      for (int64_t i = 0; i < m_; ++i) {
        int32_t za = aZeroCount_ ? value(aType_, a.inputs[aZero_], aZeroCount_ == 1 ? 0 : i) : 0;
        for (int64_t j = 0; j < n_; ++j) {
          int32_t zb = bZeroCount_ ? value(bType_, a.inputs[bZero_], bZeroCount_ == 1 ? 0 : j) : 0;
          int32_t acc = 0;
          for (int64_t p = 0; p < k_; ++p)
            acc += (value(aType_, a.inputs[a_], offsetA_[bi] + i * k_ + p) - za) *
                   (value(bType_, a.inputs[b_], offsetB_[bi] + p * n_ + j) - zb);
          int64_t o = static_cast<int64_t>(bi) * m_ * n_ + i * n_ + j;
          if (!qlinear_) {
            a.out<int32_t>(0)[o] = acc;
            continue;
          }
          double scale = static_cast<double>(a.in<float>(1)[aScaleCount_ == 1 ? 0 : i]) *
                         static_cast<double>(a.in<float>(4)[bScaleCount_ == 1 ? 0 : j]) /
                         static_cast<double>(a.in<float>(6)[0]);
          double q = std::nearbyint(static_cast<double>(acc) * scale) + value(outType_, a.inputs[7], 0);
          if (outType_ == DataType::UINT8)
            a.out<uint8_t>(0)[o] = saturate<uint8_t>(q);
          else
            a.out<int8_t>(0)[o] = saturate<int8_t>(q);
        }
      }
  }

private:
  template <typename Q> static Q saturate(double v) {
    double lo = static_cast<double>(std::numeric_limits<Q>::min()),
           hi = static_cast<double>(std::numeric_limits<Q>::max());
    return static_cast<Q>(std::min(hi, std::max(lo, v)));
  }

  bool qlinear_;
  size_t a_, b_, aZero_, bZero_;
  DataType aType_, bType_, outType_ = DataType::INT32;
  int64_t aZeroCount_, bZeroCount_, aScaleCount_ = 1, bScaleCount_ = 1;
  int64_t m_, k_, n_;
  std::vector<int64_t> offsetA_, offsetB_;
};

/// Per-tensor or per-axis parameters: element i uses parameter (i / inner) % channels.
struct QuantLayout {
  int64_t n = 0, channels = 1, inner = 1;
  explicit QuantLayout(const ir::Op &op) : n(op.inInfo(0).elementCount()) {
    if (op.inInfo(1).elementCount() == 1) return;
    const Shape &s = op.inInfo(0).shape();
    int64_t axis = op.attrs.getInt("axis", 1);
    auto ax = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(s.size()) : axis);
    channels = s[ax];
    for (size_t i = ax + 1; i < s.size(); ++i)
      inner *= s[i];
  }
  int64_t channel(int64_t i) const { return channels == 1 ? 0 : (i / inner) % channels; }
};

template <typename Q> Q saturate(double v) {
  double lo = static_cast<double>(std::numeric_limits<Q>::min()),
         hi = static_cast<double>(std::numeric_limits<Q>::max());
  return static_cast<Q>(std::min(hi, std::max(lo, v)));
}

class QuantizeLinearKernel : public Kernel {
public:
  explicit QuantizeLinearKernel(const ir::Op &op)
      : layout_(op), xType_(op.inInfo(0).dataType()), scaleType_(op.inInfo(1).dataType()),
        outType_(op.outInfo(0).dataType()) {}
  void run(const KernelArgs &a) override {
    dispatchNumeric(xType_, "QuantizeLinear input", [&](auto xt) {
      using X = typename std::decay_t<decltype(xt)>::type;
      dispatchNumeric(scaleType_, "QuantizeLinear scale", [&](auto st) {
        using S = typename std::decay_t<decltype(st)>::type;
        dispatchNumeric(outType_, "QuantizeLinear output", [&](auto qt) {
          using Q = typename std::decay_t<decltype(qt)>::type;
          if constexpr (std::is_integral_v<Q> && sizeof(Q) <= 2) {
            const X *x = a.in<X>(0);
            const S *scale = a.in<S>(1);
            const Q *zp = a.hasInput(2) ? a.in<Q>(2) : nullptr;
            Q *y = a.out<Q>(0);
            for (int64_t i = 0; i < layout_.n; ++i) {
              int64_t c = layout_.channel(i);
              // Division in float as the spec's reference does; ties round to even.
              float q = static_cast<float>(static_cast<compute_t<X>>(x[i])) /
                        static_cast<float>(static_cast<compute_t<S>>(scale[c]));
              double v = std::nearbyint(static_cast<double>(q)) + (zp ? static_cast<double>(zp[c]) : 0.0);
              y[i] = saturate<Q>(v);
            }
          } else {
            throw error("QuantizeLinear: output type ", toString(outType_), " is not supported");
          }
        });
      });
    });
  }

private:
  QuantLayout layout_;
  DataType xType_, scaleType_, outType_;
};

class DequantizeLinearKernel : public Kernel {
public:
  explicit DequantizeLinearKernel(const ir::Op &op)
      : layout_(op), xType_(op.inInfo(0).dataType()), outType_(op.outInfo(0).dataType()) {}
  void run(const KernelArgs &a) override {
    dispatchNumeric(xType_, "DequantizeLinear input", [&](auto xt) {
      using X = typename std::decay_t<decltype(xt)>::type;
      dispatchFloat(outType_, "DequantizeLinear output", [&](auto st) {
        using S = typename std::decay_t<decltype(st)>::type;
        const X *x = a.in<X>(0);
        const X *zp = a.hasInput(2) ? a.in<X>(2) : nullptr;
        const S *scale = a.in<S>(1);
        S *y = a.out<S>(0);
        for (int64_t i = 0; i < layout_.n; ++i) {
          int64_t c = layout_.channel(i);
          double v = static_cast<double>(static_cast<compute_t<X>>(x[i])) -
                     (zp ? static_cast<double>(static_cast<compute_t<X>>(zp[c])) : 0.0);
          y[i] = static_cast<S>(static_cast<compute_t<S>>(static_cast<float>(v) *
                                                          static_cast<float>(static_cast<compute_t<S>>(scale[c]))));
        }
      });
    });
  }

private:
  QuantLayout layout_;
  DataType xType_, outType_;
};

class DynamicQuantizeLinearKernel : public Kernel {
public:
  explicit DynamicQuantizeLinearKernel(const ir::Op &op) : n_(op.inInfo(0).elementCount()) {}
  void run(const KernelArgs &a) override {
    const float *x = a.in<float>(0);
    float lo = 0, hi = 0; // the range always includes 0
    for (int64_t i = 0; i < n_; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    float scale = (hi - lo) / 255.f;
    float zpf = scale == 0 ? 0.f : std::nearbyint(std::min(255.f, std::max(0.f, -lo / scale)));
    auto zp = static_cast<uint8_t>(zpf);
    for (int64_t i = 0; i < n_; ++i) {
      double v = scale == 0 ? zpf : std::nearbyint(static_cast<double>(x[i] / scale)) + zpf;
      a.out<uint8_t>(0)[i] = saturate<uint8_t>(v);
    }
    if (a.hasOutput(1)) a.out<float>(1)[0] = scale;
    if (a.hasOutput(2)) a.out<uint8_t>(2)[0] = zp;
  }

private:
  int64_t n_;
};

class DetKernel : public Kernel {
public:
  explicit DetKernel(const ir::Op &op) : type_(op.inInfo(0).dataType()) {
    m_ = op.inInfo(0).dim(-1);
    count_ = op.outInfo(0).elementCount();
    lu_.resize(static_cast<size_t>(m_ * m_));
  }
  void run(const KernelArgs &a) override {
    dispatchFloat(type_, "Det", [&](auto tag) {
      using T = typename std::decay_t<decltype(tag)>::type;
      for (int64_t b = 0; b < count_; ++b) {
        const T *x = a.in<T>(0) + b * m_ * m_;
        for (int64_t i = 0; i < m_ * m_; ++i)
          lu_[i] = toDouble(x[i]);
        // Gaussian elimination with partial pivoting.
        double det = 1;
        for (int64_t c = 0; c < m_ && det != 0; ++c) {
          int64_t p = c;
          for (int64_t r = c + 1; r < m_; ++r)
            if (std::fabs(lu_[r * m_ + c]) > std::fabs(lu_[p * m_ + c])) p = r;
          if (lu_[p * m_ + c] == 0) {
            det = 0;
            break;
          }
          if (p != c) {
            for (int64_t j = 0; j < m_; ++j)
              std::swap(lu_[p * m_ + j], lu_[c * m_ + j]);
            det = -det;
          }
          double pivot = lu_[c * m_ + c];
          det *= pivot;
          for (int64_t r = c + 1; r < m_; ++r) {
            double f = lu_[r * m_ + c] / pivot;
            for (int64_t j = c; j < m_; ++j)
              lu_[r * m_ + j] -= f * lu_[c * m_ + j];
          }
        }
        a.out<T>(0)[b] = fromDouble<T>(det);
      }
    });
  }

private:
  DataType type_;
  int64_t m_, count_;
  std::vector<double> lu_;
};

/// Samples (N, C, H, W) at grid locations with PyTorch's grid_sample conventions, which the
/// ONNX spec follows.
class GridSampleKernel : public Kernel {
public:
  explicit GridSampleKernel(const ir::Op &op)
      : type_(op.inInfo(0).dataType()), gridType_(op.inInfo(1).dataType()),
        alignCorners_(op.attrs.getInt("align_corners", 0) != 0) {
    const Shape &x = op.inInfo(0).shape(), &g = op.inInfo(1).shape();
    n_ = x[0];
    c_ = x[1];
    h_ = x[2];
    w_ = x[3];
    ho_ = g[1];
    wo_ = g[2];
    std::string mode = op.attrs.getString("mode", "bilinear"), pad = op.attrs.getString("padding_mode", "zeros");
    mode_ = mode == "nearest" ? 0 : (mode == "bicubic" || mode == "cubic") ? 2 : 1;
    padding_ = pad == "zeros" ? 0 : pad == "border" ? 1 : 2;
  }

  void run(const KernelArgs &a) override {
    dispatchFloat(type_, "GridSample", [&](auto tag) {
      using T = typename std::decay_t<decltype(tag)>::type;
      dispatchFloat(gridType_, "GridSample grid", [&](auto gtag) {
        using G = typename std::decay_t<decltype(gtag)>::type;
        const T *x = a.in<T>(0);
        const G *grid = a.in<G>(1);
        T *y = a.out<T>(0);
        for (int64_t n = 0; n < n_; ++n)
          for (int64_t i = 0; i < ho_; ++i)
            for (int64_t j = 0; j < wo_; ++j) {
              const G *g = grid + ((n * ho_ + i) * wo_ + j) * 2;
              double gx = unnormalize(toDouble(g[0]), w_), gy = unnormalize(toDouble(g[1]), h_);
              for (int64_t c = 0; c < c_; ++c) {
                const T *plane = x + (n * c_ + c) * h_ * w_;
                y[((n * c_ + c) * ho_ + i) * wo_ + j] = fromDouble<T>(sample(plane, gx, gy));
              }
            }
      });
    });
  }

private:
  double unnormalize(double v, int64_t size) const {
    return alignCorners_ ? (v + 1) / 2 * static_cast<double>(size - 1) : ((v + 1) * static_cast<double>(size) - 1) / 2;
  }
  static double reflect(double v, double twiceLow, double twiceHigh) {
    if (twiceLow == twiceHigh) return 0;
    double lo = twiceLow / 2, span = (twiceHigh - twiceLow) / 2;
    v = std::fabs(v - lo);
    double extra = std::fmod(v, span);
    // The parity of the number of flips, without converting a count past int64 (or NaN) to one.
    const bool even = std::fmod(std::floor(v / span), 2.0) == 0;
    return even ? extra + lo : span - extra + lo;
  }
  /// Border and reflection padding move a coordinate inside [0, size - 1].
  double pad(double v, int64_t size) const {
    double hi = static_cast<double>(size - 1);
    if (padding_ == 1) return std::clamp(v, 0.0, hi);
    if (padding_ == 2) {
      v = alignCorners_ ? reflect(v, 0, 2 * hi) : reflect(v, -1, 2 * hi + 1);
      return std::clamp(v, 0.0, hi);
    }
    return v;
  }
  template <typename T> double at(const T *plane, int64_t yi, int64_t xi) const {
    if (yi < 0 || yi >= h_ || xi < 0 || xi >= w_) return 0;
    return toDouble(plane[yi * w_ + xi]);
  }
  /// A tap coordinate as an index; far-away (or NaN) coordinates map to a value that is
  /// out of bounds but safe to convert.
  static int64_t index(double v, int64_t size) {
    if (!(v >= -4)) return -4;
    return v > static_cast<double>(size + 4) ? size + 4 : static_cast<int64_t>(v);
  }
  static double cubic1(double t) { return ((-0.75 + 2) * t - (-0.75 + 3)) * t * t + 1; }
  static double cubic2(double t) { return ((-0.75 * t + 5 * 0.75) * t - 8 * 0.75) * t + 4 * 0.75; }

  template <typename T> double sample(const T *plane, double gx, double gy) const {
    if (mode_ == 2) {
      // Bicubic pads each of the 4x4 taps rather than the sample point.
      double fx = std::floor(gx), fy = std::floor(gy), tx = gx - fx, ty = gy - fy;
      double wx[4] = {cubic2(tx + 1), cubic1(tx), cubic1(1 - tx), cubic2(2 - tx)};
      double wy[4] = {cubic2(ty + 1), cubic1(ty), cubic1(1 - ty), cubic2(2 - ty)};
      double acc = 0;
      for (int p = 0; p < 4; ++p)
        for (int q = 0; q < 4; ++q) {
          double yy = pad(fy - 1 + p, h_), xx = pad(fx - 1 + q, w_);
          acc += wy[p] * wx[q] * at(plane, index(yy, h_), index(xx, w_));
        }
      return acc;
    }
    gx = pad(gx, w_);
    gy = pad(gy, h_);
    if (mode_ == 0) return at(plane, index(std::nearbyint(gy), h_), index(std::nearbyint(gx), w_));
    double fx = std::floor(gx), fy = std::floor(gy), tx = gx - fx, ty = gy - fy;
    int64_t x0 = index(fx, w_), y0 = index(fy, h_);
    return (1 - ty) * ((1 - tx) * at(plane, y0, x0) + tx * at(plane, y0, x0 + 1)) +
           ty * ((1 - tx) * at(plane, y0 + 1, x0) + tx * at(plane, y0 + 1, x0 + 1));
  }

  DataType type_, gridType_;
  bool alignCorners_;
  int64_t n_, c_, h_, w_, ho_, wo_;
  int mode_, padding_;
};

} // namespace

void registerReferenceMiscKernels(KernelRegistry &r) {
  auto add = [&](const char *type, KernelFactory create) {
    r.add({"ai.onnx", type, KernelProvider::Reference, nullptr, create});
  };
  add("Dropout", makeKernel<DropoutKernel>);
  add("Einsum", makeKernel<EinsumKernel>);
  add("MatMulInteger", makeKernel<MatMulIntegerKernel>);
  add("QLinearMatMul", makeKernel<MatMulIntegerKernel>);
  add("QuantizeLinear", makeKernel<QuantizeLinearKernel>);
  add("DequantizeLinear", makeKernel<DequantizeLinearKernel>);
  add("DynamicQuantizeLinear", makeKernel<DynamicQuantizeLinearKernel>);
  add("Det", makeKernel<DetKernel>);
  add("GridSample", makeKernel<GridSampleKernel>);
}

} // namespace popart::backend_cpu
