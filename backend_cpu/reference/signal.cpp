// Reference window functions.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

#include <algorithm>
#include <cmath>

namespace popart::backend_cpu {

namespace {

class WindowKernel : public Kernel {
public:
  explicit WindowKernel(const ir::Op &op) : type_(op.outInfo(0).dataType()), name_(op.type) {
    length_ = op.outInfo(0).dim(0);
    periodic_ = op.attrs.getInt("periodic", 1) != 0;
  }
  void run(const KernelArgs &args) override {
    double n = static_cast<double>(periodic_ ? length_ : length_ - 1);
    const double pi = 3.14159265358979323846;
    dispatchNumeric(type_, name_.c_str(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (int64_t i = 0; i < length_; ++i) {
        double x = 2 * pi * static_cast<double>(i) / n, v;
        if (name_ == "HannWindow")
          v = 0.5 - 0.5 * std::cos(x);
        else if (name_ == "HammingWindow")
          v = 25.0 / 46.0 - 21.0 / 46.0 * std::cos(x);
        else
          v = 0.42 - 0.5 * std::cos(x) + 0.08 * std::cos(2 * x);
        args.out<T>(0)[i] = static_cast<T>(static_cast<compute_t<T>>(v));
      }
    });
  }

private:
  DataType type_;
  std::string name_;
  int64_t length_;
  bool periodic_;
};

/// Naive O(n²) DFT along one axis, in double; real inputs have a last dimension of 1.
class DftKernel : public Kernel {
public:
  explicit DftKernel(const ir::Op &op) : type_(op.inInfo(0).dataType()) {
    const Shape &in = op.inInfo(0).shape(), &out = op.outInfo(0).shape();
    int64_t axis = op.attrs.getInt("axis", 1);
    if (axis < 0) axis += static_cast<int64_t>(in.size()) - 1;
    inverse_ = op.attrs.getInt("inverse", 0) != 0;
    complexIn_ = in.back() == 2;
    inLen_ = in[static_cast<size_t>(axis)];
    outLen_ = out[static_cast<size_t>(axis)];
    length_ = outLen_;
    if (op.hasInput(1))
      length_ = op.input(1).data()->valueAsInt64(0);
    else
      length_ = inLen_;
    outer_ = 1;
    for (int64_t i = 0; i < axis; ++i)
      outer_ *= in[static_cast<size_t>(i)];
    inner_ = 1;
    for (size_t i = static_cast<size_t>(axis) + 1; i + 1 < in.size(); ++i)
      inner_ *= in[i];
  }
  void run(const KernelArgs &args) override {
    const double pi = 3.14159265358979323846;
    dispatchFloat(type_, "DFT", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T *x = args.in<T>(0);
      T *y = args.out<T>(0);
      int64_t cin = complexIn_ ? 2 : 1;
      double sign = inverse_ ? 1.0 : -1.0;
      for (int64_t o = 0; o < outer_; ++o)
        for (int64_t i = 0; i < inner_; ++i)
          for (int64_t k = 0; k < outLen_; ++k) {
            double re = 0, im = 0;
            for (int64_t n = 0; n < std::min(inLen_, length_); ++n) {
              int64_t idx = ((o * inLen_ + n) * inner_ + i) * cin;
              double a = static_cast<double>(static_cast<compute_t<T>>(x[idx]));
              double b = complexIn_ ? static_cast<double>(static_cast<compute_t<T>>(x[idx + 1])) : 0.0;
              double angle = sign * 2 * pi * static_cast<double>(k * n % length_) / static_cast<double>(length_);
              re += a * std::cos(angle) - b * std::sin(angle);
              im += a * std::sin(angle) + b * std::cos(angle);
            }
            if (inverse_) {
              re /= static_cast<double>(length_);
              im /= static_cast<double>(length_);
            }
            int64_t out = ((o * outLen_ + k) * inner_ + i) * 2;
            y[out] = static_cast<T>(static_cast<compute_t<T>>(re));
            y[out + 1] = static_cast<T>(static_cast<compute_t<T>>(im));
          }
    });
  }

private:
  DataType type_;
  bool inverse_, complexIn_;
  int64_t inLen_, outLen_, length_, outer_, inner_;
};

class StftKernel : public Kernel {
public:
  explicit StftKernel(const ir::Op &op) : type_(op.inInfo(0).dataType()) {
    const Shape &in = op.inInfo(0).shape(), &out = op.outInfo(0).shape();
    batch_ = in[0];
    length_ = in[1];
    complexIn_ = in[2] == 2;
    frames_ = out[1];
    bins_ = out[2];
    step_ = op.input(1).data()->valueAsInt64(0);
    hasWindow_ = op.hasInput(2);
    windowType_ = hasWindow_ ? op.inInfo(2).dataType() : type_;
    frame_ = hasWindow_ ? op.inInfo(2).dim(0) : op.input(3).data()->valueAsInt64(0);
  }
  void run(const KernelArgs &args) override {
    const double pi = 3.14159265358979323846;
    dispatchFloat(type_, "STFT", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T *x = args.in<T>(0);
      const T *w = hasWindow_ ? args.in<T>(2) : nullptr;
      T *y = args.out<T>(0);
      int64_t cin = complexIn_ ? 2 : 1;
      for (int64_t b = 0; b < batch_; ++b)
        for (int64_t f = 0; f < frames_; ++f)
          for (int64_t k = 0; k < bins_; ++k) {
            double re = 0, im = 0;
            for (int64_t n = 0; n < frame_; ++n) {
              int64_t idx = (b * length_ + f * step_ + n) * cin;
              double win = w ? static_cast<double>(static_cast<compute_t<T>>(w[n])) : 1.0;
              double a = win * static_cast<double>(static_cast<compute_t<T>>(x[idx]));
              double c = complexIn_ ? win * static_cast<double>(static_cast<compute_t<T>>(x[idx + 1])) : 0.0;
              double angle = -2 * pi * static_cast<double>(k * n % frame_) / static_cast<double>(frame_);
              re += a * std::cos(angle) - c * std::sin(angle);
              im += a * std::sin(angle) + c * std::cos(angle);
            }
            int64_t out = ((b * frames_ + f) * bins_ + k) * 2;
            y[out] = static_cast<T>(static_cast<compute_t<T>>(re));
            y[out + 1] = static_cast<T>(static_cast<compute_t<T>>(im));
          }
    });
  }

private:
  DataType type_, windowType_;
  bool complexIn_, hasWindow_;
  int64_t batch_, length_, frames_, bins_, step_, frame_;
};

} // namespace

void registerReferenceSignalKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "DFT", KernelProvider::Reference, nullptr, makeKernel<DftKernel>});
  r.add({"ai.onnx", "STFT", KernelProvider::Reference, nullptr, makeKernel<StftKernel>});
  for (const char *t : {"HannWindow", "HammingWindow", "BlackmanWindow"})
    r.add({"ai.onnx", t, KernelProvider::Reference, nullptr, makeKernel<WindowKernel>});
}

} // namespace popart::backend_cpu
