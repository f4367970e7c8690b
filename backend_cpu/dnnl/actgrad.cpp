// oneDNN kernels, f32 or bf16, of the ai.graphcore gradient ops of ir/ops/actgrad.cpp: SoftmaxGrad and
// LogSoftmaxGrad (softmax_v2_backward on an [outer, n, inner] view), LayerNormalizationGrad
// (layer_normalization_backward on [rows, normalised]) and ActivationGrad (eltwise_backward, from
// the forward output where oneDNN has a use_dst algorithm).

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/dnnl/norm_grad.hpp"
#include "backend_cpu/kernel_families.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

/// Why oneDNN does not take \p op's tensors: not all of one floating-point type it knows, or
/// empty ("" if it does).
std::string notFloatOrEmpty(const ir::Op &op) {
  if (std::string why = dnnl_util::notOneFloatType(op); !why.empty()) return why;
  if (op.inInfo(0).elementCount() == 0) return "empty input";
  return "";
}

/// One backward primitive reading input 0 as \p dataArg (DST or SRC) and input 1 as DIFF_DST,
/// writing output 0 as DIFF_SRC.
class DiffKernel : public Kernel {
public:
  /// \p inPlace: diff_src may be written over diff_dst (oneDNN's eltwise backward).
  DiffKernel(primitive prim, int dataArg, const memory::desc &md, bool inPlace = false)
      : prim_(std::move(prim)), dataArg_(dataArg), inPlace_(inPlace) {
    auto &eng = dnnl_util::engine();
    data_ = memory(md, eng, DNNL_MEMORY_NONE);
    diffDst_ = memory(md, eng, DNNL_MEMORY_NONE);
    diffSrc_ = memory(md, eng, DNNL_MEMORY_NONE);
  }
  void run(const KernelArgs &args) override {
    data_.set_data_handle(const_cast<void *>(args.inputs[0]));
    diffDst_.set_data_handle(const_cast<void *>(args.inputs[1]));
    diffSrc_.set_data_handle(args.outputs[0]);
    dnnl_util::execute(prim_, args_, {{dataArg_, data_}, {DNNL_ARG_DIFF_DST, diffDst_}, {DNNL_ARG_DIFF_SRC, diffSrc_}});
  }
  int inPlaceInput() const override { return inPlace_ ? 1 : -1; }

private:
  primitive prim_;
  int dataArg_;
  bool inPlace_;
  std::vector<dnnl_exec_arg_t> args_;
  memory data_, diffDst_, diffSrc_;
};

/// The [outer, n, inner] view of \p op's input over its axis, in its type.
memory::desc softmaxGradDesc(const ir::Op &op) {
  const Shape &s = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(s.size()), axis = op.attrs.getInt("axis", -1);
  if (axis < 0) axis += rank;
  memory::dims dims{shapeElementCount(Shape(s.begin(), s.begin() + axis)), s[static_cast<size_t>(axis)],
                    shapeElementCount(Shape(s.begin() + axis + 1, s.end()))};
  return memory::desc(dims, dnnl_util::dnnlType(op.inInfo(0)), dnnl_util::plainStrides(dims));
}

Support supportsSoftmaxGrad(const ir::Op &op) {
  if (std::string why = notFloatOrEmpty(op); !why.empty()) return Support::no(why);
  if (rowSoftmaxGrad(op)) return Support::no("f32 over the last axis: the fast kernel's row pass is faster");
  memory::data_type type = dnnl_util::dnnlType(op.inInfo(0));
  if (type == memory::data_type::f32) return Support::yes();
  memory::desc md = softmaxGradDesc(op);
  algorithm alg = op.type == "LogSoftmaxGrad" ? algorithm::softmax_log : algorithm::softmax_accurate;
  auto &eng = dnnl_util::engine();
  softmax_v2_forward::primitive_desc hint(softmax_v2_forward::desc(prop_kind::forward_training, alg, md, md, 1), eng,
                                          true);
  if (!hint) return dnnl_util::noImplementation("softmax", type);
  softmax_v2_backward::primitive_desc pd(softmax_v2_backward::desc(alg, md, md, md, 1), eng, hint, true);
  return dnnl_util::implementationFor(pd, "softmax backward", type);
}

std::unique_ptr<Kernel> createSoftmaxGrad(const ir::Op &op) {
  memory::desc md = softmaxGradDesc(op);
  algorithm alg = op.type == "LogSoftmaxGrad" ? algorithm::softmax_log : algorithm::softmax_accurate;
  auto &eng = dnnl_util::engine();
  softmax_v2_forward::primitive_desc hint(softmax_v2_forward::desc(prop_kind::forward_training, alg, md, md, 1), eng);
  softmax_v2_backward::primitive_desc pd(softmax_v2_backward::desc(alg, md, md, md, 1), eng, hint);
  return std::make_unique<DiffKernel>(softmax_v2_backward(pd), DNNL_ARG_DST, md);
}

/// The [rows, normalised] view of LayerNormalizationGrad's X.
std::pair<int64_t, int64_t> layerNormGradSplit(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(x.size()), axis = op.attrs.getInt("axis", -1);
  if (axis < 0) axis += rank;
  return {shapeElementCount(Shape(x.begin(), x.begin() + axis)), shapeElementCount(Shape(x.begin() + axis, x.end()))};
}

Support supportsLayerNormGrad(const ir::Op &op) {
  // X, dY and dX of one type; the scale, the statistics, dScale and dBias in it or FLOAT.
  if (!dnnl_util::dnnlType(op.inInfo(0).dataType())) return Support::no("X is " + toString(op.inInfo(0).dataType()));
  if (op.inInfo(0).elementCount() == 0) return Support::no("empty input");
  DataType t = op.inInfo(0).dataType();
  if (op.inInfo(2).dataType() != t || (op.hasOutput(0) && op.outInfo(0).dataType() != t))
    return Support::no("dY or dX not of X's type");
  for (size_t i : {1, 3, 4})
    if (op.inputCount() > i && op.hasInput(i) && op.inInfo(i).dataType() != t &&
        op.inInfo(i).dataType() != DataType::FLOAT)
      return Support::no("input " + std::to_string(i) + " is " + toString(op.inInfo(i).dataType()));
  for (size_t i : {1, 2})
    if (op.hasOutput(i) && op.outInfo(i).dataType() != t && op.outInfo(i).dataType() != DataType::FLOAT)
      return Support::no("output " + std::to_string(i) + " is " + toString(op.outInfo(i).dataType()));
  memory::data_type type = dnnl_util::dnnlType(op.inInfo(0));
  if (type == memory::data_type::f32) return Support::yes();
  auto [rows, inner] = layerNormGradSplit(op);
  memory::desc mdX({rows, inner}, type, memory::dims{inner, 1});
  memory::desc mdStat({rows}, memory::data_type::f32, memory::dims{1});
  auto &eng = dnnl_util::engine();
  auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
  layer_normalization_forward::primitive_desc hint(
      layer_normalization_forward::desc(prop_kind::forward_training, mdX, mdStat, 1e-5f, flags), eng, true);
  if (!hint) return dnnl_util::noImplementation("layer normalization", type);
  layer_normalization_backward::primitive_desc pd(
      layer_normalization_backward::desc(prop_kind::backward, mdX, mdX, mdStat, 1e-5f, flags), eng, hint, true);
  return dnnl_util::implementationFor(pd, "layer normalization backward", type);
}

/// oneDNN's backward pass wants the row mean and variance. Given the forward's Mean and InvStdDev,
/// the variance is 1/InvStdDev² − ε (oneDNN adds ε back); else a statistics-only forward pass
/// computes both, its normalised output landing in dX's buffer, which the backward pass then
/// overwrites. Buffers for omitted outputs are owned, allocated at creation.
class LayerNormGradKernel : public dnnl_util::NormGradKernel {
public:
  explicit LayerNormGradKernel(const ir::Op &op) : givenStats_(op.hasInput(3)) {
    auto [rows, inner] = layerNormGradSplit(op);
    rows_ = rows;
    eps_ = op.attrs.getFloat("epsilon", 1e-5f);
    memory::desc mdX({rows_, inner}, dnnl_util::dnnlType(op.inInfo(0)), memory::dims{inner, 1});
    memory::desc mdStat({rows_}, memory::data_type::f32, memory::dims{1});
    memory::desc mdC({inner}, memory::data_type::f32, memory::dims{1});
    auto &eng = dnnl_util::engine();
    auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
    layer_normalization_forward::primitive_desc hint(
        layer_normalization_forward::desc(prop_kind::forward_training, mdX, mdStat, eps_, flags), eng);
    layer_normalization_backward::desc bd(prop_kind::backward, mdX, mdX, mdStat, eps_, flags);
    backward_ = layer_normalization_backward(layer_normalization_backward::primitive_desc(bd, eng, hint));
    if (!givenStats_) {
      layer_normalization_forward::desc sd(prop_kind::forward_training, mdX, mdStat, eps_, normalization_flags::none);
      stats_ = layer_normalization_forward(layer_normalization_forward::primitive_desc(sd, eng));
    }
    makeMemories(op, mdX, mdC);
    mean_ = givenStats_ ? memory(mdStat, eng, DNNL_MEMORY_NONE) : memory(mdStat, eng);
    var_ = memory(mdStat, eng);
    if (givenStats_) {
      meanStaging_ = dnnl_util::F32Staging(op.inInfo(3).dataType(), rows_);
      invStaging_ = dnnl_util::F32Staging(op.inInfo(4).dataType(), rows_);
    }
  }
  void run(const KernelArgs &args) override {
    bind(args);
    if (givenStats_) {
      mean_.set_data_handle(meanStaging_.widen(args.inputs[3]));
      const float *inv = invStaging_.widen(args.inputs[4]);
      auto *var = static_cast<float *>(var_.get_data_handle());
      for (int64_t r = 0; r < rows_; ++r)
        var[r] = 1.f / (inv[r] * inv[r]) - eps_;
    } else {
      computeStatistics();
    }
    runBackward();
    narrowOutputs(args);
  }

private:
  bool givenStats_;
  dnnl_util::F32Staging meanStaging_, invStaging_;
  int64_t rows_ = 0;
  float eps_ = 1e-5f;
};

struct EltwiseGradSpec {
  algorithm alg = algorithm::undef;
  float alpha = 0, beta = 0;
  bool fromDst = false;
};

/// oneDNN's algorithm for \p op's activation, with parameters giving exactly the op's formula.
bool eltwiseGradSpec(const ir::Op &op, EltwiseGradSpec &spec) {
  std::string act = op.attrs.getString("activation", "");
  float alpha = op.attrs.getFloat("alpha", act == "LeakyRelu" ? 0.01f : 1.f);
  if (act == "Relu")
    spec = {algorithm::eltwise_relu_use_dst_for_bwd, 0.f, 0.f, true};
  else if (act == "Elu")
    spec = {algorithm::eltwise_elu_use_dst_for_bwd, alpha, 0.f, true};
  else if (act == "Tanh")
    spec = {algorithm::eltwise_tanh_use_dst_for_bwd, 0.f, 0.f, true};
  else if (act == "Sigmoid")
    spec = {algorithm::eltwise_logistic_use_dst_for_bwd, 0.f, 0.f, true};
  else if (act == "Exp")
    spec = {algorithm::eltwise_exp_use_dst_for_bwd, 0.f, 0.f, true};
  else if (act == "Sqrt")
    spec = {algorithm::eltwise_sqrt_use_dst_for_bwd, 0.f, 0.f, true};
  else if (act == "LeakyRelu")
    spec = {algorithm::eltwise_relu, alpha, 0.f, false};
  else if (act == "Abs")
    spec = {algorithm::eltwise_abs, 0.f, 0.f, false};
  else if (act == "Gelu")
    spec = {algorithm::eltwise_gelu_erf, 0.f, 0.f, false};
  else if (act == "Clip") {
    // oneDNN passes dY where alpha < x <= beta; the op where lo <= x <= hi. For float x,
    // lo <= x is x > the float below lo; without a lower bound (lo = −inf) no alpha gives x = −inf
    // its gradient, so that case is declined.
    float lo = op.attrs.getFloat("alpha", -INFINITY), hi = op.attrs.getFloat("beta", INFINITY);
    if (std::isinf(lo) && lo < 0) return false;
    if (std::isnan(lo) || std::isnan(hi) || lo > hi) return false; // oneDNN wants alpha <= beta
    spec = {algorithm::eltwise_clip, std::nextafter(lo, -INFINITY), hi, false};
  } else
    return false;
  return true;
}

Support supportsActivationGrad(const ir::Op &op) {
  if (std::string why = notFloatOrEmpty(op); !why.empty()) return Support::no(why);
  EltwiseGradSpec spec;
  if (!eltwiseGradSpec(op, spec))
    return Support::no("no oneDNN eltwise backward for activation " + op.attrs.getString("activation", "?"));
  memory::data_type type = dnnl_util::dnnlType(op.inInfo(0));
  if (type == memory::data_type::f32) return Support::yes();
  auto md = dnnl_util::plainDesc(op.inInfo(0), 1);
  auto &eng = dnnl_util::engine();
  eltwise_forward::primitive_desc hint(
      eltwise_forward::desc(prop_kind::forward_training, spec.alg, md, spec.alpha, spec.beta), eng, true);
  if (!hint) return dnnl_util::noImplementation("eltwise", type);
  eltwise_backward::primitive_desc pd(eltwise_backward::desc(spec.alg, md, md, spec.alpha, spec.beta), eng, hint, true);
  return dnnl_util::implementationFor(pd, "eltwise backward", type);
}

std::unique_ptr<Kernel> createActivationGrad(const ir::Op &op) {
  EltwiseGradSpec spec;
  eltwiseGradSpec(op, spec);
  auto md = dnnl_util::plainDesc(op.inInfo(0), 1);
  auto &eng = dnnl_util::engine();
  eltwise_forward::primitive_desc hint(
      eltwise_forward::desc(prop_kind::forward_training, spec.alg, md, spec.alpha, spec.beta), eng);
  eltwise_backward::primitive_desc pd(eltwise_backward::desc(spec.alg, md, md, spec.alpha, spec.beta), eng, hint);
  return std::make_unique<DiffKernel>(eltwise_backward(pd), spec.fromDst ? DNNL_ARG_DST : DNNL_ARG_SRC, md, true);
}

} // namespace

void registerDnnlActGradKernels(KernelRegistry &r) {
  for (const char *t : {"SoftmaxGrad", "LogSoftmaxGrad"})
    r.add({"ai.graphcore", t, KernelProvider::Dnnl, supportsSoftmaxGrad, createSoftmaxGrad});
  r.add({"ai.graphcore", "LayerNormalizationGrad", KernelProvider::Dnnl, supportsLayerNormGrad,
         makeKernel<LayerNormGradKernel>});
  r.add({"ai.graphcore", "ActivationGrad", KernelProvider::Dnnl, supportsActivationGrad, createActivationGrad});
}

} // namespace popart::backend_cpu
