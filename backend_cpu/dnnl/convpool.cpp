// oneDNN kernels, f32: Conv (convolution_forward, in the layouts oneDNN picks, reordered from
// and to the plain buffers inside the kernel; optionally with a fused Relu), ConvTranspose
// (deconvolution_forward), MaxPool and AveragePool (pooling_v2_forward), on plain layouts.
// Each supports() builds the primitive descriptor once and declines if oneDNN refuses it.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/dnnl/window.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cstring>
#include <string>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

using dnnl_util::makeWindow;
using dnnl_util::Window;

using dnnl_util::allFloat;

bool spatialRankOk(const ir::Op &op) {
  int64_t r = op.inInfo(0).rank();
  return r >= 3 && r <= 5 && op.outInfo(0).elementCount() > 0 && op.inInfo(0).elementCount() > 0;
}

/// Weights of Conv / ConvTranspose as oneDNN's (g, oc, ic, spatial...) over ONNX's buffer.
memory::desc weightsDesc(const ir::Op &op, bool transposed) {
  const Shape &w = op.inInfo(1).shape();
  int64_t group = op.attrs.getInt("group", 1);
  int64_t k = 1;
  for (size_t i = 2; i < w.size(); ++i)
    k *= w[i];
  memory::dims spatial(w.begin() + 2, w.end());
  memory::dims spatialStrides = dnnl_util::plainStrides(spatial);
  memory::dims dims, strides;
  if (!transposed) {
    // ONNX (M, C/g, k...) is already (g, M/g, C/g, k...) row-major.
    int64_t oc = w[0] / group, ic = w[1];
    if (group > 1)
      dims = {group, oc, ic}, strides = {oc * ic * k, ic * k, k};
    else
      dims = {oc, ic}, strides = {ic * k, k};
  } else {
    // ONNX (C, M/g, k...) is (g, C/g, M/g, k...): oneDNN's oc and ic axes are swapped.
    int64_t ic = w[0] / group, oc = w[1];
    if (group > 1)
      dims = {group, oc, ic}, strides = {oc * ic * k, k, oc * k};
    else
      dims = {oc, ic}, strides = {k, oc * k};
  }
  dims.insert(dims.end(), spatial.begin(), spatial.end());
  strides.insert(strides.end(), spatialStrides.begin(), spatialStrides.end());
  return memory::desc(dims, memory::data_type::f32, strides);
}

class ConvKernel : public Kernel {
public:
  explicit ConvKernel(const ir::Op &op) {
    bool transposed = op.type == "ConvTranspose";
    // y: what the convolution computes; with a fused pool (fuseConvPool), the pool's input.
    const Shape &x = op.inInfo(0).shape(), y = transposed ? op.outInfo(0).shape() : ir::convResultShape(op),
                &ws = op.inInfo(1).shape();
    Window w = makeWindow(op, x, y, std::vector<int64_t>(ws.begin() + 2, ws.end()), transposed);
    if (transposed) {
      // oneDNN's deconvolution has no output_padding: it is less end padding.
      auto outPad = op.attrs.getInts("output_padding", std::vector<int64_t>(x.size() - 2, 0));
      for (size_t i = 0; i < w.padR.size(); ++i)
        w.padR[i] -= outPad[i];
    }
    for (size_t i = 0; i < w.padR.size(); ++i)
      if (w.padL[i] < 0 || (!transposed && w.padR[i] < 0))
        throw ::popart::error(op.debugName(), ": negative padding is left to the reference kernel");
    auto mdX = dnnl_util::plainDesc(x, x.size()), mdY = dnnl_util::plainDesc(y, y.size());
    auto mdW = weightsDesc(op, transposed);
    hasBias_ = op.hasInput(2);
    memory::desc mdB = hasBias_ ? memory::desc({y[1]}, memory::data_type::f32, memory::dims{1}) : memory::desc();
    auto &eng = dnnl_util::engine();
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user); // allocated here, not per run
    if (transposed) {
      deconvolution_forward::desc d(prop_kind::forward_inference, algorithm::deconvolution_direct, mdX, mdW, mdB, mdY,
                                    w.strides, w.dilates, w.padL, w.padR);
      deconvolution_forward::primitive_desc pd(d, attr, eng);
      prim_ = deconvolution_forward(pd);
      scratch_ = memory(pd.scratchpad_desc(), eng);
    } else {
      // Let oneDNN pick its layouts (its direct convolutions want blocked channels) and reorder
      // to and from the plain buffers around it.
      if (op.attrs.getString("popart_activation", "") == "Relu") { // fused by fuseRelu
        post_ops po;
        po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
        attr.set_post_ops(po);
      }
      auto make = [&](const memory::desc &x, const memory::desc &wt, const memory::desc &y) {
        convolution_forward::desc d(prop_kind::forward_inference, algorithm::convolution_direct, x, wt, mdB, y,
                                    w.strides, w.dilates, w.padL, w.padR);
        convolution_forward::primitive_desc pd(d, attr, eng);
        dnnl_util::skipBrgconv(pd);
        return pd;
      };
      auto pd = make(dnnl_util::anyLayout(mdX), dnnl_util::anyLayout(mdW), dnnl_util::anyLayout(mdY));
      if (dnnl_util::implIs(pd, "ref")) pd = make(mdX, mdW, mdY); // no optimised kernel for those layouts
      prim_ = convolution_forward(pd);
      scratch_ = memory(pd.scratchpad_desc(), eng);
      if (pd.src_desc() != mdX) inner_[0] = memory(pd.src_desc(), eng);
      weightsDesc_ = pd.weights_desc();
      ir::FusedPool pool;
      pooled_ = ir::fusedPool(op, pool);
      if (pd.dst_desc() != mdY || pooled_) inner_[2] = memory(pd.dst_desc(), eng);
      if (pooled_) initPool(op, pool, pd.dst_desc());
    }
    x_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    w_ = memory(mdW, eng, DNNL_MEMORY_NONE);
    y_ = memory(pooled_ ? dnnl_util::plainDesc(op.outInfo(0).shape(), y.size()) : mdY, eng, DNNL_MEMORY_NONE);
    if (hasBias_) b_ = memory(mdB, eng, DNNL_MEMORY_NONE);
    if (inner_[0]) toInner_[0] = dnnl_util::userScratchReorder(x_, inner_[0]);
    if (!transposed) weights_.init(w_, weightsDesc_, op.input(1).isConst());
    const memory &result = pooled_ ? poolDst_ : inner_[2];
    if (result) fromInner_ = dnnl_util::userScratchReorder(result, y_);
  }
  void run(const KernelArgs &args) override {
    x_.set_data_handle(const_cast<void *>(args.inputs[0]));
    w_.set_data_handle(const_cast<void *>(args.inputs[1]));
    y_.set_data_handle(args.outputs[0]);
    if (inner_[0] && inputInLayout_) // the producer wrote it in this layout (readInputIn)
      inner_[0].set_data_handle(const_cast<void *>(args.inputs[0]));
    else if (inner_[0])
      dnnl_util::execute(toInner_[0], reorderArgs_[0], {{DNNL_ARG_FROM, x_}, {DNNL_ARG_TO, inner_[0]}});
    if (outputInLayout_) (pooled_ ? poolDst_ : inner_[2]).set_data_handle(args.outputs[0]);
    const memory &wt = weights_ ? weights_.get(w_, args.inputs[1]) : w_;
    const memory &x = inner_[0] ? inner_[0] : x_, &y = inner_[2] ? inner_[2] : y_;
    if (hasBias_) {
      b_.set_data_handle(const_cast<void *>(args.inputs[2]));
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_BIAS, b_}, {DNNL_ARG_DST, y},
                          {DNNL_ARG_SCRATCHPAD, scratch_}});
    } else {
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_DST, y}, {DNNL_ARG_SCRATCHPAD, scratch_}});
    }
    if (pooled_) {
      const memory &dst = poolDst_ ? poolDst_ : y_;
      dnnl_util::execute(pool_, poolArgs_, {{DNNL_ARG_SRC, inner_[2]}, {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, poolScratch_}});
      if (poolDst_ && !outputInLayout_)
        dnnl_util::execute(fromInner_, reorderArgs_[2], {{DNNL_ARG_FROM, poolDst_}, {DNNL_ARG_TO, y_}});
    } else if (inner_[2] && !outputInLayout_) {
      dnnl_util::execute(fromInner_, reorderArgs_[2], {{DNNL_ARG_FROM, inner_[2]}, {DNNL_ARG_TO, y_}});
    }
  }

  // Conv chains: the result stays in the convolution's (or its pool's) blocked layout when the
  // next kernel reads that layout, and a convolution reads its input in its own layout.
  TensorLayout outputLayout(size_t i) const override {
    const memory &result = pooled_ ? poolDst_ : inner_[2];
    if (i != 0 || !result) return {};
    auto desc = std::make_shared<const memory::desc>(result.get_desc());
    return {"dnnl", desc, static_cast<int64_t>(desc->get_size())};
  }
  void writeOutputIn(size_t i) override {
    if (i != 0) return;
    memory &result = pooled_ ? poolDst_ : inner_[2];
    result = memory(result.get_desc(), dnnl_util::engine(), DNNL_MEMORY_NONE); // the output's bytes now
    outputInLayout_ = true;
  }
  bool readInputIn(size_t i, const TensorLayout &layout) override {
    if (i != 0 || !inner_[0] || std::strcmp(layout.provider, "dnnl") != 0) return false;
    const auto &desc = *static_cast<const memory::desc *>(layout.desc.get());
    if (desc != inner_[0].get_desc()) return false;
    inner_[0] = memory(desc, dnnl_util::engine(), DNNL_MEMORY_NONE);
    inputInLayout_ = true;
    return true;
  }

private:
  /// The max pool after the convolution, on the convolution's layout (blocked channels), so that
  /// only the pooled result is reordered to the plain output.
  void initPool(const ir::Op &op, const ir::FusedPool &pool, const memory::desc &src) {
    size_t nsp = pool.kernel.size();
    memory::dims strides(pool.strides.begin(), pool.strides.end()), kernel(pool.kernel.begin(), pool.kernel.end());
    memory::dims padL(pool.pads.begin(), pool.pads.begin() + static_cast<std::ptrdiff_t>(nsp));
    memory::dims padR(pool.pads.begin() + static_cast<std::ptrdiff_t>(nsp), pool.pads.end());
    auto mdOut = dnnl_util::plainDesc(op.outInfo(0).shape(), op.outInfo(0).rank());
    auto &eng = dnnl_util::engine();
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    pooling_v2_forward::desc d(prop_kind::forward_inference, algorithm::pooling_max, src, dnnl_util::anyLayout(mdOut),
                               strides, kernel, memory::dims(nsp, 0), padL, padR);
    pooling_v2_forward::primitive_desc pd(d, attr, eng);
    pool_ = pooling_v2_forward(pd);
    poolScratch_ = memory(pd.scratchpad_desc(), eng);
    if (pd.dst_desc() != mdOut) poolDst_ = memory(pd.dst_desc(), eng);
  }

  bool hasBias_ = false, pooled_ = false;
  bool inputInLayout_ = false, outputInLayout_ = false; ///< agreed with the neighbours (no reorder)
  primitive pool_;
  memory poolDst_, poolScratch_; ///< the pooled result in the convolution's layout (empty: plain)
  std::vector<dnnl_exec_arg_t> poolArgs_;
  memory::desc weightsDesc_;
  dnnl_util::PackedWeights weights_; ///< in oneDNN's chosen layout (constant ones packed once)
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory x_, w_, b_, y_, scratch_;
  memory inner_[3];           ///< [0] src, [2] dst in oneDNN's chosen layout (empty: plain); weights: weights_
  primitive toInner_[1], fromInner_;
  std::vector<dnnl_exec_arg_t> reorderArgs_[3];
};

class PoolKernel : public Kernel {
public:
  explicit PoolKernel(const ir::Op &op) {
    const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
    Window w = makeWindow(op, x, y, op.attrs.getInts("kernel_shape"), false);
    bool isMax = op.type == "MaxPool";
    bool includePad = !isMax && op.attrs.getInt("count_include_pad", 0) != 0;
    dnnl_util::extendPadsForCeilMode(op, x, y, includePad, w);
    dnnl_util::rejectNegativePads(op, w);
    algorithm alg = isMax        ? algorithm::pooling_max
                    : includePad ? algorithm::pooling_avg_include_padding
                                 : algorithm::pooling_avg_exclude_padding;
    auto mdX = dnnl_util::plainDesc(x, x.size()), mdY = dnnl_util::plainDesc(y, y.size());
    auto &eng = dnnl_util::engine();
    pooling_v2_forward::desc d(prop_kind::forward_inference, alg, mdX, mdY, w.strides, w.kernel, w.dilates, w.padL,
                               w.padR);
    prim_ = pooling_v2_forward(pooling_v2_forward::primitive_desc(d, eng));
    x_ = memory(mdX, eng, DNNL_MEMORY_NONE);
    y_ = memory(mdY, eng, DNNL_MEMORY_NONE);
  }
  void run(const KernelArgs &args) override {
    x_.set_data_handle(const_cast<void *>(args.inputs[0]));
    y_.set_data_handle(args.outputs[0]);
    dnnl_util::execute(prim_, args_, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_DST, y_}});
  }

private:
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory x_, y_;
};

/// True if \p K can be built for \p op; oneDNN's refusal (or ours) means "use the reference".
template <typename K> bool buildable(const ir::Op &op) {
  try {
    K k(op);
    return true;
  } catch (const std::exception &) { // dnnl::error or our own refusal
    return false;
  }
}

bool supportsConv(const ir::Op &op) { return allFloat(op) && spatialRankOk(op) && buildable<ConvKernel>(op); }

bool supportsPool(const ir::Op &op) {
  if (!allFloat(op) || !spatialRankOk(op)) return false;
  if (op.type == "MaxPool" && op.hasOutput(1)) return false; // no Indices from oneDNN
  if (tiledMaxPool(op)) return false;                          // the reference's vectorised pass
  // A dilated window can lie wholly in the padding, where ONNX and oneDNN disagree.
  const Shape &x = op.inInfo(0).shape();
  auto k = op.attrs.getInts("kernel_shape");
  auto pads = op.attrs.getInts("pads", std::vector<int64_t>(2 * k.size(), 0));
  for (size_t i = 0; i < k.size(); ++i)
    if (pads[i] >= k[i] || pads[i + k.size()] >= k[i] || x[i + 2] < 1) return false;
  return buildable<PoolKernel>(op);
}

} // namespace

void registerDnnlConvPoolKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "Conv", KernelProvider::Dnnl, supportsConv, makeKernel<ConvKernel>});
  r.add({"ai.onnx", "ConvTranspose", KernelProvider::Dnnl, supportsConv, makeKernel<ConvKernel>});
  r.add({"ai.onnx", "MaxPool", KernelProvider::Dnnl, supportsPool, makeKernel<PoolKernel>});
  r.add({"ai.onnx", "AveragePool", KernelProvider::Dnnl, supportsPool, makeKernel<PoolKernel>});
}

} // namespace popart::backend_cpu
