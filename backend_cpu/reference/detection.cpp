// Reference NonMaxSuppression: the IR's algorithm, run on the fed values.

#include "backend_cpu/kernel_families.hpp"
#include "ir/ops/detection.hpp"
#include <popart/error.hpp>

#include <cstring>

namespace popart::backend_cpu {

namespace {

class NmsKernel : public Kernel {
public:
  explicit NmsKernel(const ir::Op &op) : centerPointBox_(op.attrs.getInt("center_point_box", 0) != 0) {
    for (size_t i = 0; i < 5; ++i) infos_.push_back(op.hasInput(i) ? op.inInfo(i) : TensorInfo());
    for (size_t i = 0; i < 5; ++i)
      if (op.hasInput(i)) views_.emplace_back(infos_[i]);
      else views_.emplace_back();
    rows_ = op.outInfo(0).dim(0);
  }
  void run(const KernelArgs &args) override {
    // All inputs are value inputs, so this runs at compile time (constant folding); the copies
    // below are not on a per-step path.
    for (size_t i = 0; i < 5; ++i)
      if (args.hasInput(i)) std::memcpy(views_[i].data(), args.inputs[i], static_cast<size_t>(infos_[i].byteCount()));
    auto selected = ir::nonMaxSuppression(views_[0], views_[1], args.hasInput(2) ? &views_[2] : nullptr,
                                          args.hasInput(3) ? &views_[3] : nullptr, args.hasInput(4) ? &views_[4] : nullptr,
                                          centerPointBox_);
    if (static_cast<int64_t>(selected.size()) != rows_)
      throw error("NonMaxSuppression: input values changed after compilation");
    for (size_t r = 0; r < selected.size(); ++r)
      for (size_t k = 0; k < 3; ++k) args.out<int64_t>(0)[r * 3 + k] = selected[r][k];
  }

private:
  bool centerPointBox_;
  std::vector<TensorInfo> infos_;
  std::vector<TensorData> views_;
  int64_t rows_;
};

} // namespace

void registerReferenceDetectionKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "NonMaxSuppression", KernelProvider::Reference, nullptr, makeKernel<NmsKernel>});
}

} // namespace popart::backend_cpu
