// oneDNN kernels, f32: BatchNormalization (inference with global statistics, and training with
// batch statistics and the running-statistics update), ai.graphcore BatchNormalizationGrad, and
// LayerNormalization (Y only; the normalised dims are flattened into oneDNN's last dim).

#include "ir/ops/norm.hpp"
#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/dnnl/norm_grad.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

using dnnl_util::allFloat;

/// Whether oneDNN would normalise plain \p x with its generic C++ loops (ncsp_bnorm, bnorm_ref: 2.6
/// on NCHW); our fast kernel (backend_cpu/fast/norm.cpp) is several times faster there.
bool genericBatchNorm(const Shape &x) {
  if (x.size() < 3) return false; // (N, C): one value per plane, where our loops gain nothing
  auto md = dnnl_util::plainDesc(x, x.size());
  batch_normalization_forward::desc d(prop_kind::forward_training, md, 1e-5f,
                                      normalization_flags::use_scale | normalization_flags::use_shift);
  batch_normalization_forward::primitive_desc pd(d, dnnl_util::engine(), true);
  if (!pd) return true; // no oneDNN implementation at all: ours
  std::string impl = pd.impl_info_str();
  return impl.rfind("ncsp", 0) == 0 || impl.find("ref") != std::string::npos;
}

Support supportsBatchNorm(const ir::Op &op) {
  if (!allFloat(op)) return Support::no("not f32");
  if (op.outInfo(0).elementCount() == 0) return Support::no("an empty result");
  int64_t r = op.inInfo(0).rank();
  if (r < 2 || r > 5) return Support::no("rank other than 2-5");
  if (op.attrs.getInt("spatial", 1) == 0) return Support::no("spatial = 0");
  if (op.fusion.activated()) return Support::no("a fused activation (the fast and reference kernels')");
  for (size_t i = 1; i < op.outputCount(); ++i)
    if (op.hasOutput(i) && op.outInfo(i).dataType() != DataType::FLOAT) return Support::no("statistics not f32");
  if (genericBatchNorm(op.inInfo(0).shape()))
    return Support::no("only oneDNN's generic loops for this layout, slower than ours");
  return Support::yes();
}

class BatchNormKernel : public Kernel {
public:
  explicit BatchNormKernel(const ir::Op &op) {
    const Shape &x = op.inInfo(0).shape();
    auto mdX = dnnl_util::plainDesc(x, x.size());
    memory::desc mdC({x[1]}, memory::data_type::f32, memory::dims{1});
    auto &eng = dnnl_util::engine();
    training_ = ir::batchNormTraining(op);
    channels_ = x[1];
    momentum_ = op.attrs.getFloat("momentum", 0.9f);
    auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
    if (!training_)
      flags = flags | normalization_flags::use_global_stats;
    else
      varFactor_ = static_cast<float>(ir::runningVarianceFactor(op, op.inInfo(0).elementCount() / x[1]));
    batch_normalization_forward::desc d(training_ ? prop_kind::forward_training : prop_kind::forward_inference, mdX,
                                        op.attrs.getFloat("epsilon", 1e-5f), flags);
    prim_ = batch_normalization_forward(batch_normalization_forward::primitive_desc(d, eng));
    x_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    y_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    for (auto *m : {&scale_, &shift_})
      *m = memory(mdC, eng, DNNL_MEMORY_NONE);
    // In training the batch statistics are oneDNN outputs: kept in memories of their own, from
    // which the running statistics (and opset 9-13's saved statistics) are computed.
    mean_ = training_ ? memory(mdC, eng) : memory(mdC, eng, DNNL_MEMORY_NONE);
    var_ = training_ ? memory(mdC, eng) : memory(mdC, eng, DNNL_MEMORY_NONE);
  }
  void run(const KernelArgs &args) override {
    x_.set_data_handle(const_cast<void *>(args.inputs[0]));
    scale_.set_data_handle(const_cast<void *>(args.inputs[1]));
    shift_.set_data_handle(const_cast<void *>(args.inputs[2]));
    if (!training_) {
      mean_.set_data_handle(const_cast<void *>(args.inputs[3]));
      var_.set_data_handle(const_cast<void *>(args.inputs[4]));
    }
    y_.set_data_handle(args.outputs[0]);
    dnnl_util::execute(prim_, args_,
                       {{DNNL_ARG_SRC, x_},
                        {DNNL_ARG_SCALE, scale_},
                        {DNNL_ARG_SHIFT, shift_},
                        {DNNL_ARG_MEAN, mean_},
                        {DNNL_ARG_VARIANCE, var_},
                        {DNNL_ARG_DST, y_}});
    if (!training_) return;
    const auto *bm = static_cast<const float *>(mean_.get_data_handle());
    const auto *bv = static_cast<const float *>(var_.get_data_handle());
    const float *rm = args.in<float>(3), *rv = args.in<float>(4);
    for (int64_t c = 0; c < channels_; ++c) {
      if (args.hasOutput(1)) args.out<float>(1)[c] = rm[c] * momentum_ + bm[c] * (1 - momentum_);
      if (args.hasOutput(2)) args.out<float>(2)[c] = rv[c] * momentum_ + bv[c] * varFactor_ * (1 - momentum_);
      if (args.hasOutput(3)) args.out<float>(3)[c] = bm[c];
      if (args.hasOutput(4)) args.out<float>(4)[c] = bv[c];
    }
  }

private:
  bool training_ = false;
  int64_t channels_ = 0;
  float momentum_ = 0.9f, varFactor_ = 1.f;
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory x_, y_, scale_, shift_, mean_, var_;
};

bool supportsBatchNormGrad(const ir::Op &op) {
  if (!allFloat(op) || op.outInfo(0).elementCount() == 0) return false;
  int64_t r = op.inInfo(0).rank();
  return r >= 2 && r <= 5 && !genericBatchNorm(op.inInfo(0).shape());
}

/// oneDNN's backward pass needs the batch mean and variance: given as inputs 3 and 4, or computed
/// first by a statistics-only forward pass whose normalised output lands in dX's buffer (dX is
/// overwritten by the backward pass right after), so nothing X-sized is allocated.
class BatchNormGradKernel : public dnnl_util::NormGradKernel {
public:
  explicit BatchNormGradKernel(const ir::Op &op) : givenStats_(op.hasInput(3)) {
    const Shape &x = op.inInfo(0).shape();
    auto mdX = dnnl_util::plainDesc(x, x.size());
    memory::desc mdC({x[1]}, memory::data_type::f32, memory::dims{1});
    auto &eng = dnnl_util::engine();
    float eps = op.attrs.getFloat("epsilon", 1e-5f);
    auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
    batch_normalization_forward::desc fd(prop_kind::forward_training, mdX, eps, flags);
    batch_normalization_forward::primitive_desc fpd(fd, eng);
    batch_normalization_backward::desc bd(prop_kind::backward, mdX, mdX, eps, flags);
    backward_ = batch_normalization_backward(batch_normalization_backward::primitive_desc(bd, eng, fpd));
    if (!givenStats_) {
      batch_normalization_forward::desc sd(prop_kind::forward_training, mdX, eps, normalization_flags::none);
      stats_ = batch_normalization_forward(batch_normalization_forward::primitive_desc(sd, eng));
    }
    makeMemories(op, mdX, mdC);
    // Owned buffers where the op does not provide the statistics.
    mean_ = givenStats_ ? memory(mdC, eng, DNNL_MEMORY_NONE) : memory(mdC, eng);
    var_ = givenStats_ ? memory(mdC, eng, DNNL_MEMORY_NONE) : memory(mdC, eng);
  }
  void run(const KernelArgs &args) override {
    bind(args);
    if (givenStats_) {
      mean_.set_data_handle(const_cast<void *>(args.inputs[3]));
      var_.set_data_handle(const_cast<void *>(args.inputs[4]));
    } else {
      computeStatistics();
    }
    runBackward();
  }

private:
  bool givenStats_;
};

/// Sizes before and from the normalisation axis.
std::pair<int64_t, int64_t> layerNormSplit(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(x.size()), axis = op.attrs.getInt("axis", -1);
  if (axis < 0) axis += rank;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < rank; ++i)
    (i < axis ? outer : inner) *= x[static_cast<size_t>(i)];
  return {outer, inner};
}

bool supportsLayerNorm(const ir::Op &op) {
  if (!allFloat(op) || op.outInfo(0).elementCount() == 0) return false;
  auto [outer, inner] = layerNormSplit(op);
  for (size_t i : {1, 2}) // Mean and InvStdDev: one float per normalised row
    if (op.hasOutput(i) && (op.outInfo(i).elementCount() != outer || op.outInfo(i).dataType() != DataType::FLOAT))
      return false;
  // oneDNN's scale and shift span the whole normalised extent: no broadcasting.
  if (op.inInfo(1).elementCount() != inner) return false;
  if (op.hasInput(2) && op.inInfo(2).elementCount() != inner) return false;
  return true;
}

class LayerNormKernel : public Kernel {
public:
  explicit LayerNormKernel(const ir::Op &op) {
    auto [outer, inner] = layerNormSplit(op);
    memory::desc mdX({outer, inner}, memory::data_type::f32, memory::dims{inner, 1});
    memory::desc mdC({inner}, memory::data_type::f32, memory::dims{1});
    hasShift_ = op.hasInput(2);
    statistics_ = op.hasOutput(1) || op.hasOutput(2);
    eps_ = op.attrs.getFloat("epsilon", 1e-5f);
    auto flags = normalization_flags::use_scale;
    if (hasShift_) flags = flags | normalization_flags::use_shift;
    auto &eng = dnnl_util::engine();
    auto kind = statistics_ ? prop_kind::forward_training : prop_kind::forward_inference;
    layer_normalization_forward::desc d(kind, mdX, eps_, flags);
    prim_ = layer_normalization_forward(layer_normalization_forward::primitive_desc(d, eng));
    x_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    y_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    scale_ = memory(mdC, eng, DNNL_MEMORY_NONE);
    if (hasShift_) shift_ = memory(mdC, eng, DNNL_MEMORY_NONE);
    if (statistics_) {
      // oneDNN writes the mean and the variance; the op's output 2 is 1/√(variance + ε), so the
      // variance goes to a buffer of the kernel's own (and the mean too when output 1 is absent).
      rows_ = outer;
      memory::desc mdS({outer}, memory::data_type::f32, memory::dims{1});
      ownStats_.assign(static_cast<size_t>(2 * outer), 0.f);
      mean_ = memory(mdS, eng, ownStats_.data());
      var_ = memory(mdS, eng, ownStats_.data() + outer);
    }
  }
  void run(const KernelArgs &args) override {
    x_.set_data_handle(const_cast<void *>(args.inputs[0]));
    scale_.set_data_handle(const_cast<void *>(args.inputs[1]));
    y_.set_data_handle(args.outputs[0]);
    // Without a shift, DNNL_ARG_SHIFT gets the scale's memory, which the primitive ignores.
    if (hasShift_) shift_.set_data_handle(const_cast<void *>(args.inputs[2]));
    const memory &shift = hasShift_ ? shift_ : scale_;
    if (!statistics_) {
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, x_}, {DNNL_ARG_SCALE, scale_}, {DNNL_ARG_SHIFT, shift}, {DNNL_ARG_DST, y_}});
      return;
    }
    mean_.set_data_handle(args.hasOutput(1) ? args.outputs[1] : ownStats_.data());
    dnnl_util::execute(prim_, args_,
                       {{DNNL_ARG_SRC, x_},
                        {DNNL_ARG_SCALE, scale_},
                        {DNNL_ARG_SHIFT, shift},
                        {DNNL_ARG_DST, y_},
                        {DNNL_ARG_MEAN, mean_},
                        {DNNL_ARG_VARIANCE, var_}});
    if (args.hasOutput(2)) {
      const float *var = ownStats_.data() + rows_;
      auto *inv = static_cast<float *>(args.outputs[2]);
      for (int64_t r = 0; r < rows_; ++r)
        inv[r] = 1.f / std::sqrt(var[r] + eps_);
    }
  }

private:
  bool hasShift_ = false, statistics_ = false;
  float eps_ = 1e-5f;
  int64_t rows_ = 0;
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory x_, y_, scale_, shift_, mean_, var_;
  std::vector<float> ownStats_;
};

} // namespace

void registerDnnlNormKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "BatchNormalization", KernelProvider::Dnnl, supportsBatchNorm, makeKernel<BatchNormKernel>});
  r.add({"ai.graphcore", "BatchNormalizationGrad", KernelProvider::Dnnl, supportsBatchNormGrad,
         makeKernel<BatchNormGradKernel>});
  r.add({"ai.onnx", "LayerNormalization", KernelProvider::Dnnl, supportsLayerNorm, makeKernel<LayerNormKernel>});
}

} // namespace popart::backend_cpu
