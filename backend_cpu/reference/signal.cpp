// Reference window functions.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

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
        if (name_ == "HannWindow") v = 0.5 - 0.5 * std::cos(x);
        else if (name_ == "HammingWindow") v = 25.0 / 46.0 - 21.0 / 46.0 * std::cos(x);
        else v = 0.42 - 0.5 * std::cos(x) + 0.08 * std::cos(2 * x);
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

} // namespace

void registerReferenceSignalKernels(KernelRegistry &r) {
  for (const char *t : {"HannWindow", "HammingWindow", "BlackmanWindow"})
    r.add({"ai.onnx", t, KernelProvider::Reference, nullptr, makeKernel<WindowKernel>});
}

} // namespace popart::backend_cpu
