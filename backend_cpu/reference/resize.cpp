// Reference Resize / Upsample: separable N-D interpolation (nearest, linear, cubic) with every
// coordinate transformation mode. Taps and weights are computed per axis at creation.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

#include <algorithm>
#include <cmath>

namespace popart::backend_cpu {

namespace {

struct Tap {
  int64_t index;
  double weight;
};

class ResizeKernel : public Kernel {
public:
  explicit ResizeKernel(const ir::Op &op) : type_(op.outInfo(0).dataType()) {
    in_ = op.inInfo(0).shape();
    out_ = op.outInfo(0).shape();
    bool legacy = op.type == "Upsample" || op.version < 11;
    std::string mode = op.attrs.getString("mode", "nearest");
    if (mode == "bilinear") mode = "linear";
    std::string transform = legacy ? "asymmetric" : op.attrs.getString("coordinate_transformation_mode", "half_pixel");
    std::string nearestMode = legacy ? "floor" : op.attrs.getString("nearest_mode", "round_prefer_floor");
    double cubicA = op.attrs.getFloat("cubic_coeff_a", -0.75f);
    bool excludeOutside = op.attrs.getInt("exclude_outside", 0) != 0;
    extrapolation_ = op.attrs.getFloat("extrapolation_value", 0.f);
    size_t rank = in_.size();
    std::vector<double> scales(rank), roi(2 * rank);
    for (size_t i = 0; i < rank; ++i) {
      roi[i] = 0;
      roi[rank + i] = 1;
    }
    int scalesIndex = legacy ? 1 : 2;
    const TensorData *s = op.hasInput(static_cast<size_t>(scalesIndex))
                              ? op.input(static_cast<size_t>(scalesIndex)).data().get()
                              : nullptr;
    bool haveScales = s && s->info().elementCount() > 0;
    for (size_t i = 0; i < rank; ++i)
      scales[i] = haveScales ? static_cast<double>(static_cast<float>(s->valueAsDouble(static_cast<int64_t>(i))))
                             : static_cast<double>(out_[i]) / static_cast<double>(in_[i]);
    if (!legacy && op.hasInput(1) && op.input(1).data() &&
        op.input(1).data()->info().elementCount() == static_cast<int64_t>(2 * rank))
      roi = op.input(1).data()->toDoubleVector();
    taps_.resize(rank);
    outside_.resize(rank);
    for (size_t axis = 0; axis < rank; ++axis) {
      double lenIn = static_cast<double>(in_[axis]), scale = scales[axis];
      // ONNX measures the resized length as in × scale, unrounded, when scales are given.
      double lenOut = haveScales ? lenIn * scale : static_cast<double>(out_[axis]);
      for (int64_t x = 0; x < out_[axis]; ++x) {
        double xo;
        double xr = static_cast<double>(x);
        if (transform == "half_pixel")
          xo = (xr + 0.5) / scale - 0.5;
        else if (transform == "pytorch_half_pixel")
          xo = lenOut > 1 ? (xr + 0.5) / scale - 0.5 : 0.0;
        else if (transform == "align_corners")
          xo = lenOut == 1 ? 0.0 : xr * (lenIn - 1) / (lenOut - 1);
        else if (transform == "asymmetric")
          xo = xr / scale;
        else if (transform == "tf_half_pixel_for_nn")
          xo = (xr + 0.5) / scale;
        else if (transform == "tf_crop_and_resize") {
          double start = roi[axis], end = roi[rank + axis];
          xo = lenOut > 1 ? start * (lenIn - 1) + xr * (end - start) * (lenIn - 1) / (lenOut - 1)
                          : 0.5 * (start + end) * (lenIn - 1);
        } else {
          throw error(op.debugName(), ": coordinate_transformation_mode '", transform, "' is not supported");
        }
        outside_[axis].push_back(transform == "tf_crop_and_resize" && (xo < 0 || xo > lenIn - 1));
        // A coordinate far outside the input (a roi or scale of 1e30, or NaN) has the same taps as
        // one just outside it: clamped, the index casts below stay defined.
        xo = std::isnan(xo) ? 0.0 : std::clamp(xo, -4.0, lenIn + 4.0);
        std::vector<Tap> taps;
        auto clampIndex = [&](int64_t i) { return std::min<int64_t>(std::max<int64_t>(i, 0), in_[axis] - 1); };
        if (mode == "nearest") {
          double f = std::floor(xo), frac = xo - f;
          int64_t i;
          if (nearestMode == "round_prefer_floor")
            i = static_cast<int64_t>(frac <= 0.5 ? f : f + 1);
          else if (nearestMode == "round_prefer_ceil")
            i = static_cast<int64_t>(frac < 0.5 ? f : f + 1);
          else if (nearestMode == "floor")
            i = static_cast<int64_t>(f);
          else if (nearestMode == "ceil")
            i = static_cast<int64_t>(std::ceil(xo));
          else
            throw error(op.debugName(), ": nearest_mode '", nearestMode, "' is not supported");
          taps.push_back({clampIndex(i), 1.0});
        } else if (mode == "linear") {
          double c = std::min(std::max(xo, 0.0), lenIn - 1);
          int64_t i0 = static_cast<int64_t>(std::floor(c));
          double frac = c - static_cast<double>(i0);
          taps.push_back({clampIndex(i0), 1.0 - frac});
          if (frac > 0) taps.push_back({clampIndex(i0 + 1), frac});
        } else { // cubic
          double f = std::floor(xo), t = xo - f;
          double a = cubicA;
          double w[4] = {((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
                         ((a + 2) * t - (a + 3)) * t * t + 1, ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
                         ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a};
          double total = 0;
          for (int k = 0; k < 4; ++k) {
            int64_t i = static_cast<int64_t>(f) - 1 + k;
            if (excludeOutside && (i < 0 || i >= in_[axis])) w[k] = 0;
            total += w[k];
          }
          for (int k = 0; k < 4; ++k) {
            int64_t i = static_cast<int64_t>(f) - 1 + k;
            if (w[k] != 0) taps.push_back({clampIndex(i), excludeOutside ? w[k] / total : w[k]});
          }
        }
        taps_[axis].push_back(std::move(taps));
      }
    }
    inStrides_.assign(rank, 1);
    for (int64_t i = static_cast<int64_t>(rank) - 2; i >= 0; --i)
      inStrides_[i] = inStrides_[i + 1] * in_[i + 1];
    index_.assign(rank, 0);
  }

  void run(const KernelArgs &args) override {
    dispatchNumeric(type_, "Resize", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T *x = args.in<T>(0);
      T *y = args.out<T>(0);
      int64_t n = shapeElementCount(out_);
      size_t rank = out_.size();
      std::fill(index_.begin(), index_.end(), 0);
      for (int64_t o = 0; o < n; ++o) {
        bool outside = false;
        for (size_t a = 0; a < rank; ++a)
          outside = outside || outside_[a][static_cast<size_t>(index_[a])];
        y[o] = outside ? static_cast<T>(static_cast<compute_t<T>>(extrapolation_))
                       : static_cast<T>(static_cast<compute_t<T>>(accumulate(x, 0, 0, 1.0)));
        for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
          if (++index_[d] < out_[d]) break;
          index_[d] = 0;
        }
      }
    });
  }

private:
  /// Sum over the taps of axes [axis, rank) of weight × input, for the current output index.
  template <typename T> double accumulate(const T *x, size_t axis, int64_t offset, double weight) const {
    if (axis == out_.size()) return weight * static_cast<double>(static_cast<compute_t<T>>(x[offset]));
    double sum = 0;
    for (const Tap &t : taps_[axis][static_cast<size_t>(index_[axis])])
      sum += accumulate(x, axis + 1, offset + t.index * inStrides_[axis], weight * t.weight);
    return sum;
  }

  DataType type_;
  Shape in_, out_;
  double extrapolation_ = 0;
  std::vector<std::vector<std::vector<Tap>>> taps_; // [axis][output coordinate] -> taps
  std::vector<std::vector<bool>> outside_;
  std::vector<int64_t> inStrides_;
  std::vector<int64_t> index_;
};

} // namespace

void registerReferenceResizeKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "Resize", KernelProvider::Reference, nullptr, makeKernel<ResizeKernel>});
  r.add({"ai.onnx", "Upsample", KernelProvider::Reference, nullptr, makeKernel<ResizeKernel>});
}

} // namespace popart::backend_cpu
