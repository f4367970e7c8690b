// f32 kernels of our own that read oneDNN's blocked channel layouts, registered with the oneDNN
// ones: GlobalAveragePool (and ReduceMean over H and W) and the Mul of a feature map [N, C, H, W] by per-channel gates
// [N or 1, C, 1, 1], so that a squeeze-excitation block (GlobalAveragePool → Conv → act → Conv →
// gate → Mul with the feature map) keeps the feature map in the convolutions' 16-channel blocks.
// (Broadcast Add/Sub/Mul/Div where oneDNN's binary declines are the fast family's:
// backend_cpu/fast/broadcast.cpp.)

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/fast/vecloops.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

/// Below this many elements a kernel runs on one thread: a parallel region costs more than the
/// loop (and waits for every thread of the team, which a shared machine may not be running).
constexpr int64_t kThreadedElements = 32768;

/// The channel block of \p layout for a tensor of \p shape [N, C, H, W]: 8 or 16 for oneDNN's
/// aBcd8b / aBcd16b (channels may be padded to the block), 0 for anything else.
int64_t blockOf(const TensorLayout &layout, const Shape &shape) {
  if (std::strcmp(layout.provider, "dnnl") != 0 || shape.size() != 4) return 0;
  const auto &md = *static_cast<const memory::desc *>(layout.desc.get());
  for (int i = 0; i < 4; ++i)
    if (md.data.dims[i] != shape[static_cast<size_t>(i)]) return 0;
  int64_t block = dnnl_util::channelBlock(md);
  return block > 1 ? block : 0; // plain is not a blocked layout
}

/// GlobalAveragePool of [N, C, H, W], plain or in blocked channels; writes plain [N, C, 1, 1].
class GlobalAveragePoolKernel : public Kernel {
public:
  explicit GlobalAveragePoolKernel(const ir::Op &op) : shape_(op.inInfo(0).shape()) {}
  void run(const KernelArgs &args) override {
    const auto *x = static_cast<const float *>(args.inputs[0]);
    auto *y = static_cast<float *>(args.outputs[0]);
    const int64_t n = shape_[0], c = shape_[1], hw = shape_[2] * shape_[3];
    const float inv = 1.f / static_cast<float>(hw);
    const bool threads = n * c * hw > kThreadedElements;
    if (block_ == 0) {
#pragma omp parallel for schedule(static) if (threads)
      for (int64_t p = 0; p < n * c; ++p)
        y[p] = static_cast<float>(vec::sum(x + p * hw, hw)) * inv;
      return;
    }
    const int64_t blocks = (c + block_ - 1) / block_;
#pragma omp parallel for schedule(static) if (threads)
    for (int64_t p = 0; p < n * blocks; ++p) {
      float acc[16] = {};
      vec::sumBlocked(x + p * hw * block_, acc, hw, block_);
      const int64_t b = p % blocks, first = b * block_, img = p / blocks;
      for (int64_t j = 0; j < block_ && first + j < c; ++j)
        y[img * c + first + j] = acc[j] * inv;
    }
  }
  bool acceptsInputIn(size_t i, const TensorLayout &layout) const override {
    return i == 0 && blockOf(layout, shape_) > 0;
  }
  void readInputIn(size_t, const TensorLayout &layout) override { block_ = blockOf(layout, shape_); }

private:
  Shape shape_;
  int64_t block_ = 0; ///< 0: plain NCHW
};

Support supportsGlobalAveragePool(const ir::Op &op) {
  if (op.inInfo(0).dataType() != DataType::FLOAT) return Support::no("input not f32");
  if (op.inInfo(0).rank() != 4) return Support::no("input not 4-D");
  if (op.inInfo(0).elementCount() == 0) return Support::no("empty input");
  if (op.type == "GlobalAveragePool") return Support::yes();
  // ReduceMean over the spatial axes (x.mean([2, 3]) in MNASNet and ShuffleNet): the same.
  const ir::Tensor *axes = op.inputCount() > 1 && op.hasInput(1) ? &op.input(1) : nullptr;
  if (!axes || !axes->isConst() || axes->info().dataType() != DataType::INT64)
    return Support::no("axes not a constant input");
  std::vector<int64_t> a = axes->data()->toInt64Vector();
  for (auto &v : a)
    v = v < 0 ? v + 4 : v;
  std::sort(a.begin(), a.end());
  if (a != std::vector<int64_t>{2, 3} || op.attrs.getInt("noop_with_empty_axes", 0) != 0)
    return Support::no("not a mean over H and W");
  return Support::yes();
}

/// Mul of [N, C, H, W] by [N or 1, C, 1, 1] (either order): plain, or with the feature map in
/// blocked channels and the product written in the same layout.
class ChannelScaleKernel : public Kernel {
public:
  explicit ChannelScaleKernel(const ir::Op &op)
      : shape_(op.outInfo(0).shape()), map_(op.inInfo(0).shape() == op.outInfo(0).shape() ? 0 : 1),
        perImage_(op.inInfo(1 - map_).dim(0) != 1) {}
  void run(const KernelArgs &args) override {
    const auto *x = static_cast<const float *>(args.inputs[map_]);
    const auto *s = static_cast<const float *>(args.inputs[1 - map_]);
    auto *y = static_cast<float *>(args.outputs[0]);
    const int64_t n = shape_[0], c = shape_[1], hw = shape_[2] * shape_[3];
    const bool threads = n * c * hw > kThreadedElements;
    if (!layout_) {
#pragma omp parallel for schedule(static) if (threads)
      for (int64_t p = 0; p < n * c; ++p)
        vec::scale(x + p * hw, s[perImage_ ? p : p % c], y + p * hw, hw);
      return;
    }
    const int64_t blocks = (c + block_ - 1) / block_;
#pragma omp parallel for schedule(static) if (threads)
    for (int64_t p = 0; p < n * blocks; ++p) {
      const int64_t b = p % blocks, img = p / blocks, first = b * block_;
      float gate[16] = {}; // padded channels: 0 · 0
      for (int64_t j = 0; j < block_ && first + j < c; ++j)
        gate[j] = s[(perImage_ ? img * c : 0) + first + j];
      vec::scaleBlocked(x + p * hw * block_, gate, y + p * hw * block_, hw, block_);
    }
  }
  bool acceptsInputIn(size_t i, const TensorLayout &layout) const override {
    return i == map_ && blockOf(layout, shape_) > 0;
  }
  void readInputIn(size_t, const TensorLayout &layout) override {
    layout_ = layout;
    block_ = blockOf(layout, shape_);
  }
  // The product in the feature map's layout, when that is blocked.
  TensorLayout outputLayout(size_t i) const override { return i == 0 ? layout_ : TensorLayout{}; }

private:
  Shape shape_;
  size_t map_;    ///< the input of the output's shape
  bool perImage_; ///< gates [N, C, 1, 1] rather than [1, C, 1, 1]
  TensorLayout layout_;
  int64_t block_ = 0;
};

Support supportsChannelScale(const ir::Op &op) {
  if (op.inputCount() != 2 || !dnnl_util::allFloat(op)) return Support::no("not two f32 inputs");
  if (op.outInfo(0).rank() != 4 || op.outInfo(0).elementCount() == 0) return Support::no("output not 4-D or empty");
  const Shape &y = op.outInfo(0).shape();
  size_t map = op.inInfo(0).shape() == y ? 0 : 1;
  const Shape &x = op.inInfo(map).shape(), &s = op.inInfo(1 - map).shape();
  bool gates = x == y && s.size() == 4 && (s[0] == 1 || s[0] == y[0]) && s[1] == y[1] && s[2] == 1 && s[3] == 1 &&
               (y[2] * y[3] > 1 || s == y);
  return Support::unless(gates ? "" : "not a feature map times per-channel gates");
}

} // namespace

void registerDnnlChannelwiseKernels(KernelRegistry &r) {
  for (const char *t : {"GlobalAveragePool", "ReduceMean"})
    r.add({"ai.onnx", t, KernelProvider::Dnnl, supportsGlobalAveragePool, makeKernel<GlobalAveragePoolKernel>});
  r.add({"ai.onnx", "Mul", KernelProvider::Dnnl, supportsChannelScale, makeKernel<ChannelScaleKernel>});
}

} // namespace popart::backend_cpu
