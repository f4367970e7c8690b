// Reference NonMaxSuppression: the IR's algorithm, run on the fed values.

#include "ir/ops/detection.hpp"
#include "backend_cpu/kernel_families.hpp"
#include <popart/error.hpp>

#include <cstring>

namespace popart::backend_cpu {

namespace {

class NmsKernel : public Kernel {
public:
  explicit NmsKernel(const ir::Op &op) : centerPointBox_(op.attrs.getInt("center_point_box", 0) != 0) {
    for (size_t i = 0; i < 5; ++i)
      infos_.push_back(op.hasInput(i) ? op.inInfo(i) : TensorInfo());
    for (size_t i = 0; i < 5; ++i)
      if (op.hasInput(i))
        views_.emplace_back(infos_[i]);
      else
        views_.emplace_back();
    rows_ = op.outInfo(0).dim(0);
  }
  void run(const KernelArgs &args) override {
    // All inputs are value inputs, so this runs at compile time (constant folding); the copies
    // below are not on a per-step path.
    for (size_t i = 0; i < 5; ++i)
      if (args.hasInput(i)) std::memcpy(views_[i].data(), args.inputs[i], static_cast<size_t>(infos_[i].byteCount()));
    auto selected = ir::nonMaxSuppression(views_[0], views_[1], args.hasInput(2) ? &views_[2] : nullptr,
                                          args.hasInput(3) ? &views_[3] : nullptr,
                                          args.hasInput(4) ? &views_[4] : nullptr, centerPointBox_);
    if (static_cast<int64_t>(selected.size()) != rows_)
      throw error("NonMaxSuppression: input values changed after compilation");
    for (size_t r = 0; r < selected.size(); ++r)
      for (size_t k = 0; k < 3; ++k)
        args.out<int64_t>(0)[r * 3 + k] = selected[r][k];
  }

private:
  bool centerPointBox_;
  std::vector<TensorInfo> infos_;
  std::vector<TensorData> views_;
  int64_t rows_;
};

/// Scatters X into a zeroed output at the flat positions given by the indices.
class MaxUnpoolKernel : public Kernel {
public:
  explicit MaxUnpoolKernel(const ir::Op &op)
      : size_(dataTypeSize(op.outInfo(0).dataType())), count_(op.inInfo(0).elementCount()),
        outCount_(op.outInfo(0).elementCount()), indexType_(op.inInfo(1).dataType()) {
    // Indices address the unpooled shape the attributes imply; an explicit, larger
    // output_shape keeps each element at the same coordinates.
    const Shape &x = op.inInfo(0).shape();
    out_ = op.outInfo(0).shape();
    implied_ = x;
    size_t spatial = x.size() - 2;
    std::vector<int64_t> kernel = op.attrs.getInts("kernel_shape");
    std::vector<int64_t> strides = op.attrs.getInts("strides", std::vector<int64_t>(spatial, 1));
    std::vector<int64_t> pads = op.attrs.getInts("pads", std::vector<int64_t>(2 * spatial, 0));
    for (size_t i = 0; i < spatial; ++i)
      implied_[i + 2] = (x[i + 2] - 1) * strides[i] + kernel[i] - pads[i] - pads[spatial + i];
  }
  void run(const KernelArgs &args) override {
    auto *y = static_cast<uint8_t *>(args.outputs[0]);
    const auto *x = static_cast<const uint8_t *>(args.inputs[0]);
    std::memset(y, 0, static_cast<size_t>(outCount_) * size_);
    for (int64_t i = 0; i < count_; ++i) {
      int64_t j = indexType_ == DataType::INT32 ? args.in<int32_t>(1)[i] : args.in<int64_t>(1)[i];
      if (j < 0 || j >= shapeElementCount(implied_))
        throw error("MaxUnpool: index ", j, " is outside the unpooled shape ", toString(implied_));
      int64_t o = 0, rest = j, stride = shapeElementCount(implied_);
      for (size_t d = 0; d < implied_.size(); ++d) {
        stride /= implied_[d];
        int64_t coord = rest / stride;
        rest %= stride;
        if (coord >= out_[d]) {
          o = -1;
          break;
        }
        o = o * out_[d] + coord;
      }
      if (o >= 0) std::memcpy(y + o * static_cast<int64_t>(size_), x + i * static_cast<int64_t>(size_), size_);
    }
  }

private:
  size_t size_;
  int64_t count_, outCount_;
  DataType indexType_;
  Shape out_, implied_;
};

} // namespace

void registerReferenceDetectionKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "MaxUnpool", KernelProvider::Reference, nullptr, makeKernel<MaxUnpoolKernel>});
  r.add({"ai.onnx", "NonMaxSuppression", KernelProvider::Reference, nullptr, makeKernel<NmsKernel>});
}

} // namespace popart::backend_cpu
