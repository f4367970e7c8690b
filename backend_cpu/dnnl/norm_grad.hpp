#pragma once
// What the oneDNN batch- and layer-normalisation grad kernels share: a backward primitive with
// use_scale | use_shift reading X, scale and dY (inputs 0 to 2) and writing dX, dScale and dBias
// (outputs 0 to 2, owned buffers for the omitted ones), after an optional statistics-only forward
// pass whose normalised output lands in dX's buffer (the backward pass overwrites it right after).
// X, dY and dX may be bf16; oneDNN 2.6 takes scale, dScale, dBias and the statistics in f32
// only, so 16-bit ones go through f32 memory of the kernel's own (F32Staging).

#include "backend_cpu/dnnl/dnnl_common.hpp"

#include <algorithm>

namespace popart::backend_cpu::dnnl_util {

class NormGradKernel : public Kernel {
protected:
  /// Memories of X, dY and dX (\p mdX) and of scale, dScale and dBias (\p mdC, f32), and a zero shift,
  /// which oneDNN 2.6 wants when use_shift asks it for dBias, though dX does not depend on it.
  /// The primitives and the mean and variance memories are the subclass's.
  void makeMemories(const ir::Op &op, const dnnl::memory::desc &mdX, const dnnl::memory::desc &mdC) {
    using dnnl::memory;
    auto &eng = engine();
    x_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    dy_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    scale_ = memory(mdC, eng, DNNL_MEMORY_NONE);
    int64_t channels = mdC.dims()[0];
    scaleStaging_ = F32Staging(op.inInfo(1).dataType(), channels);
    for (size_t i = 0; i < 3; ++i)
      hasOut_[i] = op.hasOutput(i);
    if (hasOut_[1]) dScaleStaging_ = F32Staging(op.outInfo(1).dataType(), channels);
    if (hasOut_[2]) dBiasStaging_ = F32Staging(op.outInfo(2).dataType(), channels);
    dx_ = hasOut_[0] ? memory(mdX, eng, DNNL_MEMORY_NONE) : memory(mdX, eng);
    dScale_ = hasOut_[1] ? memory(mdC, eng, DNNL_MEMORY_NONE) : memory(mdC, eng);
    dBias_ = hasOut_[2] ? memory(mdC, eng, DNNL_MEMORY_NONE) : memory(mdC, eng);
    shift_ = memory(mdC, eng);
    std::fill_n(static_cast<float *>(shift_.get_data_handle()), mdC.get_size() / sizeof(float), 0.f);
  }
  /// Points X, scale, dY and the outputs present at \p args.
  void bind(const KernelArgs &args) {
    x_.set_data_handle(const_cast<void *>(args.inputs[0]));
    scale_.set_data_handle(scaleStaging_.widen(args.inputs[1]));
    dy_.set_data_handle(const_cast<void *>(args.inputs[2]));
    if (hasOut_[0]) dx_.set_data_handle(args.outputs[0]);
    if (hasOut_[1]) dScale_.set_data_handle(dScaleStaging_.target(args.outputs[1]));
    if (hasOut_[2]) dBias_.set_data_handle(dBiasStaging_.target(args.outputs[2]));
  }
  /// Stores 16-bit dScale and dBias from their f32 staging (after runBackward).
  void narrowOutputs(const KernelArgs &args) const {
    if (hasOut_[1]) dScaleStaging_.narrow(args.outputs[1]);
    if (hasOut_[2]) dBiasStaging_.narrow(args.outputs[2]);
  }
  /// The statistics-only forward pass: mean and variance of X.
  void computeStatistics() {
    execute(stats_, statsArgs_,
            {{DNNL_ARG_SRC, x_}, {DNNL_ARG_DST, dx_}, {DNNL_ARG_MEAN, mean_}, {DNNL_ARG_VARIANCE, var_}});
  }
  void runBackward() {
    execute(backward_, args_,
            {{DNNL_ARG_SRC, x_},
             {DNNL_ARG_MEAN, mean_},
             {DNNL_ARG_VARIANCE, var_},
             {DNNL_ARG_DIFF_DST, dy_},
             {DNNL_ARG_SCALE, scale_},
             {DNNL_ARG_SHIFT, shift_},
             {DNNL_ARG_DIFF_SRC, dx_},
             {DNNL_ARG_DIFF_SCALE, dScale_},
             {DNNL_ARG_DIFF_SHIFT, dBias_}});
  }

  dnnl::primitive backward_, stats_;
  dnnl::memory mean_, var_;

private:
  bool hasOut_[3] = {};
  std::vector<dnnl_exec_arg_t> args_, statsArgs_;
  dnnl::memory x_, dy_, dx_, scale_, shift_, dScale_, dBias_;
  F32Staging scaleStaging_, dScaleStaging_, dBiasStaging_;
};

} // namespace popart::backend_cpu::dnnl_util
