// oneDNN kernels, f32: BatchNormalization (inference, global statistics) and
// LayerNormalization (Y only; the normalised dims are flattened into oneDNN's last dim).

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

bool allFloat(const ir::Op &op) {
  for (size_t i = 0; i < op.inputCount(); ++i)
    if (op.hasInput(i) && op.inInfo(i).dataType() != DataType::FLOAT) return false;
  return op.outInfo(0).dataType() == DataType::FLOAT;
}

bool supportsBatchNorm(const ir::Op &op) {
  if (!allFloat(op) || op.outInfo(0).elementCount() == 0) return false;
  int64_t r = op.inInfo(0).rank();
  if (r < 2 || r > 5) return false;
  if (op.attrs.getInt("spatial", 1) == 0) return false;
  for (size_t i = 1; i < op.outputCount(); ++i)
    if (op.hasOutput(i)) return false; // training statistics
  return !(op.version >= 14 && op.attrs.getInt("training_mode", 0) != 0);
}

class BatchNormKernel : public Kernel {
public:
  explicit BatchNormKernel(const ir::Op &op) {
    const Shape &x = op.inInfo(0).shape();
    auto mdX = dnnl_util::plainDesc(x, x.size());
    memory::desc mdC({x[1]}, memory::data_type::f32, memory::dims{1});
    auto &eng = dnnl_util::engine();
    batch_normalization_forward::desc d(prop_kind::forward_inference, mdX, op.attrs.getFloat("epsilon", 1e-5f),
                                        normalization_flags::use_global_stats | normalization_flags::use_scale |
                                            normalization_flags::use_shift);
    prim_ = batch_normalization_forward(batch_normalization_forward::primitive_desc(d, eng));
    x_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    y_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    for (auto *m : {&scale_, &shift_, &mean_, &var_})
      *m = memory(mdC, eng, DNNL_MEMORY_NONE);
  }
  void run(const KernelArgs &args) override {
    x_.set_data_handle(const_cast<void *>(args.inputs[0]));
    scale_.set_data_handle(const_cast<void *>(args.inputs[1]));
    shift_.set_data_handle(const_cast<void *>(args.inputs[2]));
    mean_.set_data_handle(const_cast<void *>(args.inputs[3]));
    var_.set_data_handle(const_cast<void *>(args.inputs[4]));
    y_.set_data_handle(args.outputs[0]);
    dnnl_util::execute(prim_, args_,
                       {{DNNL_ARG_SRC, x_},
                        {DNNL_ARG_SCALE, scale_},
                        {DNNL_ARG_SHIFT, shift_},
                        {DNNL_ARG_MEAN, mean_},
                        {DNNL_ARG_VARIANCE, var_},
                        {DNNL_ARG_DST, y_}});
  }

private:
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory x_, y_, scale_, shift_, mean_, var_;
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
  if (op.hasOutput(1) || op.hasOutput(2)) return false; // oneDNN gives variance, not 1/stddev
  auto [outer, inner] = layerNormSplit(op);
  (void)outer;
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
    auto flags = normalization_flags::use_scale;
    if (hasShift_) flags = flags | normalization_flags::use_shift;
    auto &eng = dnnl_util::engine();
    layer_normalization_forward::desc d(prop_kind::forward_inference, mdX, op.attrs.getFloat("epsilon", 1e-5f), flags);
    prim_ = layer_normalization_forward(layer_normalization_forward::primitive_desc(d, eng));
    x_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    y_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    scale_ = memory(mdC, eng, DNNL_MEMORY_NONE);
    if (hasShift_) shift_ = memory(mdC, eng, DNNL_MEMORY_NONE);
  }
  void run(const KernelArgs &args) override {
    x_.set_data_handle(const_cast<void *>(args.inputs[0]));
    scale_.set_data_handle(const_cast<void *>(args.inputs[1]));
    y_.set_data_handle(args.outputs[0]);
    if (hasShift_) {
      shift_.set_data_handle(const_cast<void *>(args.inputs[2]));
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, x_}, {DNNL_ARG_SCALE, scale_}, {DNNL_ARG_SHIFT, shift_}, {DNNL_ARG_DST, y_}});
    } else {
      dnnl_util::execute(prim_, args_, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_SCALE, scale_}, {DNNL_ARG_DST, y_}});
    }
  }

private:
  bool hasShift_ = false;
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory x_, y_, scale_, shift_;
};

} // namespace

void registerDnnlNormKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "BatchNormalization", KernelProvider::Dnnl, supportsBatchNorm, makeKernel<BatchNormKernel>});
  r.add({"ai.onnx", "LayerNormalization", KernelProvider::Dnnl, supportsLayerNorm, makeKernel<LayerNormKernel>});
}

} // namespace popart::backend_cpu
