// oneDNN kernels, f32 or bf16 X (scale, shift and statistics f32 or of X's type: oneDNN 2.6 takes
// them in f32, so 16-bit ones go through f32 memory of the kernel's own): BatchNormalization (inference with global
// statistics, and training with batch statistics and the running-statistics update), ai.graphcore
// BatchNormalizationGrad, and LayerNormalization (Y only; the normalised dims are flattened into oneDNN's last dim).

#include "ir/ops/norm.hpp"
#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/dnnl/norm_grad.hpp"

#include "core/half.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

using dnnl_util::F32Staging;

/// Stores \p v as element \p i of \p data, a FLOAT, BFLOAT16 or FLOAT16 buffer.
void storeFloat(void *data, DataType type, int64_t i, float v) {
  if (type == DataType::FLOAT)
    static_cast<float *>(data)[i] = v;
  else
    static_cast<uint16_t *>(data)[i] = type == DataType::BFLOAT16 ? floatToBfloat16(v) : floatToHalf(v);
}

/// Why oneDNN's normalisations do not take \p op: X (input 0), output 0 and the inputs in \p sameAsX
/// not of one type oneDNN knows, or the other present tensors neither of it nor FLOAT ("" if they
/// are).
std::string notNormTypes(const ir::Op &op, std::initializer_list<size_t> sameAsX) {
  DataType t = op.inInfo(0).dataType();
  if (!dnnl_util::dnnlType(t)) return "X is " + toString(t);
  if (op.hasOutput(0) && op.outInfo(0).dataType() != t) return "Y not of X's type";
  for (size_t i : sameAsX)
    if (op.hasInput(i) && op.inInfo(i).dataType() != t) return "input " + std::to_string(i) + " not of X's type";
  for (size_t i = 1; i < op.inputCount(); ++i)
    if (op.hasInput(i) && op.inInfo(i).dataType() != t && op.inInfo(i).dataType() != DataType::FLOAT)
      return "input " + std::to_string(i) + " is " + toString(op.inInfo(i).dataType());
  for (size_t i = 1; i < op.outputCount(); ++i)
    if (op.hasOutput(i) && op.outInfo(i).dataType() != t && op.outInfo(i).dataType() != DataType::FLOAT)
      return "output " + std::to_string(i) + " is " + toString(op.outInfo(i).dataType());
  return "";
}

/// The generic C++ implementation with which oneDNN would normalise plain \p x (2.6 on NCHW:
/// ncsp_bnorm or bnorm_ref), "" if it has a better one; our fast kernel (backend_cpu/fast/norm.cpp)
/// is several times faster than the generic ones. Asked for f32, and for bf16 X where the fast
/// kernel takes the op (FLOAT parameters and statistics).
std::string genericBatchNorm(const TensorInfo &info) {
  const Shape &x = info.shape();
  if (info.dataType() != DataType::FLOAT && info.dataType() != DataType::BFLOAT16) return "";
  if (x.size() < 3) return ""; // (N, C): one value per plane, where our loops gain nothing
  auto md = dnnl_util::plainDesc(info, x.size());
  batch_normalization_forward::desc d(prop_kind::forward_training, md, 1e-5f,
                                      normalization_flags::use_scale | normalization_flags::use_shift);
  batch_normalization_forward::primitive_desc pd(d, dnnl_util::engine(), true);
  if (!pd) return "none"; // no oneDNN implementation at all: ours
  std::string impl = pd.impl_info_str();
  return impl.rfind("ncsp", 0) == 0 || impl.find("ref") != std::string::npos ? impl : "";
}

/// Why oneDNN leaves \p op to the fast kernel: its implementation for X's layout is generic.
std::string genericDecline(const std::string &impl) {
  if (impl == "none") return "oneDNN 2.6 has no bf16 batch normalization on this CPU";
  return "only oneDNN's generic loops (" + impl + ") for this layout, slower than the fast kernel";
}

/// Whether the fast kernel takes 16-bit \p op: FLOAT parameters and statistics (mixed precision's
/// form), inputs from \p first on and outputs from 1 on.
bool floatParameters(const ir::Op &op, size_t first) {
  for (size_t i = first; i < op.inputCount(); ++i)
    if (op.hasInput(i) && op.inInfo(i).dataType() != DataType::FLOAT) return false;
  for (size_t i = 1; i < op.outputCount(); ++i)
    if (op.hasOutput(i) && op.outInfo(i).dataType() != DataType::FLOAT) return false;
  return true;
}

/// Whether oneDNN has batch normalisation (forward, and backward with \p backward) of \p op's X.
Support batchNormImplemented(const ir::Op &op, bool backward) {
  memory::data_type type = dnnl_util::dnnlType(op.inInfo(0));
  if (type == memory::data_type::f32) return Support::yes();
  auto md = dnnl_util::plainDesc(op.inInfo(0), op.inInfo(0).rank());
  auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
  auto &eng = dnnl_util::engine();
  batch_normalization_forward::primitive_desc fpd(
      batch_normalization_forward::desc(prop_kind::forward_training, md, 1e-5f, flags), eng, true);
  if (!fpd || !backward) return dnnl_util::implementationFor(fpd, "batch normalization", type);
  batch_normalization_backward::primitive_desc pd(
      batch_normalization_backward::desc(prop_kind::backward, md, md, 1e-5f, flags), eng, fpd, true);
  return dnnl_util::implementationFor(pd, "batch normalization backward", type);
}

Support supportsBatchNorm(const ir::Op &op) {
  if (std::string why = notNormTypes(op, {}); !why.empty()) return Support::no(why);
  if (op.outInfo(0).elementCount() == 0) return Support::no("an empty result");
  int64_t r = op.inInfo(0).rank();
  if (r < 2 || r > 5) return Support::no("rank other than 2-5");
  if (op.attrs.getInt("spatial", 1) == 0) return Support::no("spatial = 0");
  if (op.fusion.activated()) return Support::no("a fused activation (the fast and reference kernels')");
  // In bf16 (training and inference) the fast kernel takes FLOAT parameters and statistics:
  // oneDNN 2.6 normalises plain NCHW bf16 in ncsp_bnorm's generic loops.
  DataType t = op.inInfo(0).dataType();
  if (t == DataType::FLOAT || (t == DataType::BFLOAT16 && floatParameters(op, 1)))
    if (std::string impl = genericBatchNorm(op.inInfo(0)); !impl.empty()) return Support::no(genericDecline(impl));
  return batchNormImplemented(op, false);
}

class BatchNormKernel : public Kernel {
public:
  explicit BatchNormKernel(const ir::Op &op) {
    const Shape &x = op.inInfo(0).shape();
    auto mdX = dnnl_util::plainDesc(op.inInfo(0), x.size());
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
    for (size_t i = 1; i < 5; ++i)
      staging_[i - 1] = F32Staging(op.inInfo(i).dataType(), channels_);
    for (size_t i = 1; i < 5; ++i)
      outTypes_[i - 1] = op.outputCount() > i && op.hasOutput(i) ? op.outInfo(i).dataType() : DataType::FLOAT;
  }
  void run(const KernelArgs &args) override {
    x_.set_data_handle(const_cast<void *>(args.inputs[0]));
    scale_.set_data_handle(staging_[0].widen(args.inputs[1]));
    shift_.set_data_handle(staging_[1].widen(args.inputs[2]));
    if (!training_) {
      mean_.set_data_handle(staging_[2].widen(args.inputs[3]));
      var_.set_data_handle(staging_[3].widen(args.inputs[4]));
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
    const float *rm = staging_[2].widen(args.inputs[3]), *rv = staging_[3].widen(args.inputs[4]);
    for (int64_t c = 0; c < channels_; ++c) {
      if (args.hasOutput(1)) storeFloat(args.outputs[1], outTypes_[0], c, rm[c] * momentum_ + bm[c] * (1 - momentum_));
      if (args.hasOutput(2))
        storeFloat(args.outputs[2], outTypes_[1], c, rv[c] * momentum_ + bv[c] * varFactor_ * (1 - momentum_));
      if (args.hasOutput(3)) storeFloat(args.outputs[3], outTypes_[2], c, bm[c]);
      if (args.hasOutput(4)) storeFloat(args.outputs[4], outTypes_[3], c, bv[c]);
    }
  }

private:
  bool training_ = false;
  int64_t channels_ = 0;
  float momentum_ = 0.9f, varFactor_ = 1.f;
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory x_, y_, scale_, shift_, mean_, var_;
  F32Staging staging_[4]; ///< scale, shift, mean, variance
  DataType outTypes_[4] = {DataType::FLOAT, DataType::FLOAT, DataType::FLOAT, DataType::FLOAT};
};

Support supportsBatchNormGrad(const ir::Op &op) {
  if (std::string why = notNormTypes(op, {2}); !why.empty()) return Support::no(why);
  if (op.outInfo(0).elementCount() == 0) return Support::no("an empty result");
  int64_t r = op.inInfo(0).rank();
  if (r < 2 || r > 5) return Support::no("rank other than 2-5");
  // In bf16 the fast kernel takes FLOAT scale and statistics (mixed precision's form): oneDNN's
  // loops took about 4x its time for the CNN's [32, 32, 32, 32] gradient.
  bool fastTakes =
      op.inInfo(0).dataType() == DataType::FLOAT ||
      (op.inInfo(1).dataType() == DataType::FLOAT && (!op.hasInput(3) || op.inInfo(3).dataType() == DataType::FLOAT));
  if (fastTakes)
    if (std::string impl = genericBatchNorm(op.inInfo(0)); !impl.empty()) return Support::no(genericDecline(impl));
  return batchNormImplemented(op, true);
}

/// oneDNN's backward pass needs the batch mean and variance: given as inputs 3 and 4, or computed
/// first by a statistics-only forward pass whose normalised output lands in dX's buffer (dX is
/// overwritten by the backward pass right after), so nothing X-sized is allocated.
class BatchNormGradKernel : public dnnl_util::NormGradKernel {
public:
  explicit BatchNormGradKernel(const ir::Op &op) : givenStats_(op.hasInput(3)) {
    const Shape &x = op.inInfo(0).shape();
    auto mdX = dnnl_util::plainDesc(op.inInfo(0), x.size());
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
    if (givenStats_) {
      meanStaging_ = F32Staging(op.inInfo(3).dataType(), x[1]);
      varStaging_ = F32Staging(op.inInfo(4).dataType(), x[1]);
    }
  }
  void run(const KernelArgs &args) override {
    bind(args);
    if (givenStats_) {
      mean_.set_data_handle(meanStaging_.widen(args.inputs[3]));
      var_.set_data_handle(varStaging_.widen(args.inputs[4]));
    } else {
      computeStatistics();
    }
    runBackward();
    narrowOutputs(args);
  }

private:
  bool givenStats_;
  F32Staging meanStaging_, varStaging_;
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

Support supportsLayerNorm(const ir::Op &op) {
  if (std::string why = notNormTypes(op, {}); !why.empty()) return Support::no(why);
  if (op.outInfo(0).elementCount() == 0) return Support::no("an empty result");
  auto [outer, inner] = layerNormSplit(op);
  for (size_t i : {1, 2}) // Mean and InvStdDev: one value per normalised row
    if (op.hasOutput(i) && op.outInfo(i).elementCount() != outer) return Support::no("statistics not one per row");
  // oneDNN's scale and shift span the whole normalised extent: no broadcasting.
  if (op.inInfo(1).elementCount() != inner) return Support::no("the scale broadcasts");
  if (op.hasInput(2) && op.inInfo(2).elementCount() != inner) return Support::no("the bias broadcasts");
  memory::data_type type = dnnl_util::dnnlType(op.inInfo(0));
  if (type == memory::data_type::f32) return Support::yes();
  memory::desc mdX({outer, inner}, type, memory::dims{inner, 1});
  layer_normalization_forward::primitive_desc pd(
      layer_normalization_forward::desc(prop_kind::forward_training, mdX, 1e-5f,
                                        normalization_flags::use_scale | normalization_flags::use_shift),
      dnnl_util::engine(), true);
  return dnnl_util::implementationFor(pd, "layer normalization", type);
}

class LayerNormKernel : public Kernel {
public:
  explicit LayerNormKernel(const ir::Op &op) {
    auto [outer, inner] = layerNormSplit(op);
    memory::desc mdX({outer, inner}, dnnl_util::dnnlType(op.inInfo(0)), memory::dims{inner, 1});
    memory::desc mdC({inner}, memory::data_type::f32, memory::dims{1});
    hasShift_ = op.hasInput(2);
    scaleStaging_ = F32Staging(op.inInfo(1).dataType(), inner);
    if (hasShift_) shiftStaging_ = F32Staging(op.inInfo(2).dataType(), inner);
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
      if (op.hasOutput(1)) meanStaging_ = F32Staging(op.outInfo(1).dataType(), outer);
      if (op.hasOutput(2)) invType_ = op.outInfo(2).dataType();
    }
  }
  void run(const KernelArgs &args) override {
    x_.set_data_handle(const_cast<void *>(args.inputs[0]));
    scale_.set_data_handle(scaleStaging_.widen(args.inputs[1]));
    y_.set_data_handle(args.outputs[0]);
    // Without a shift, DNNL_ARG_SHIFT gets the scale's memory, which the primitive ignores.
    if (hasShift_) shift_.set_data_handle(shiftStaging_.widen(args.inputs[2]));
    const memory &shift = hasShift_ ? shift_ : scale_;
    if (!statistics_) {
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, x_}, {DNNL_ARG_SCALE, scale_}, {DNNL_ARG_SHIFT, shift}, {DNNL_ARG_DST, y_}});
      return;
    }
    mean_.set_data_handle(args.hasOutput(1) ? meanStaging_.target(args.outputs[1]) : ownStats_.data());
    dnnl_util::execute(prim_, args_,
                       {{DNNL_ARG_SRC, x_},
                        {DNNL_ARG_SCALE, scale_},
                        {DNNL_ARG_SHIFT, shift},
                        {DNNL_ARG_DST, y_},
                        {DNNL_ARG_MEAN, mean_},
                        {DNNL_ARG_VARIANCE, var_}});
    if (args.hasOutput(1)) meanStaging_.narrow(args.outputs[1]);
    if (args.hasOutput(2)) {
      const float *var = ownStats_.data() + rows_;
      for (int64_t r = 0; r < rows_; ++r)
        storeFloat(args.outputs[2], invType_, r, 1.f / std::sqrt(var[r] + eps_));
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
  F32Staging scaleStaging_, shiftStaging_, meanStaging_;
  DataType invType_ = DataType::FLOAT;
};

} // namespace

void registerDnnlNormKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "BatchNormalization", KernelProvider::Dnnl, supportsBatchNorm, makeKernel<BatchNormKernel>});
  r.add({"ai.graphcore", "BatchNormalizationGrad", KernelProvider::Dnnl, supportsBatchNormGrad,
         makeKernel<BatchNormGradKernel>});
  r.add({"ai.onnx", "LayerNormalization", KernelProvider::Dnnl, supportsLayerNorm, makeKernel<LayerNormKernel>});
}

} // namespace popart::backend_cpu
