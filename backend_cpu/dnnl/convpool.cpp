// oneDNN kernels, f32 or bf16: Conv (convolution_forward, in the layouts oneDNN picks,
// reordered from and to the plain buffers inside the kernel; optionally with a fused residual add (binary post-op),
// Relu and max pool, the pool on the convolution's blocked layout, a chunk of images at a
// time: vec::maxPoolBlocked in f32, oneDNN's pooling in bf16), ConvTranspose
// (deconvolution_forward), MaxPool and AveragePool (pooling_v2_forward), on plain layouts.
// Each supports() chooses the primitive descriptors (creating no primitive, throwing nothing)
// and says why it declines.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/dnnl/window.hpp"
#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "core/log.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cstring>
#include <string>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

/// The convolution result per chunk of a fused Conv + MaxPool: half of a 1 MiB L2. The CNN's
/// first Conv + Relu + pool (64 images, [32, 32, 32] result) took 0.97 ms on the whole batch and
/// 0.83-0.93 ms in chunks of 4 images on the AVX2 host. In bytes, whatever the type: a bf16
/// chunk holds twice the images of an f32 one in the same memory.
constexpr int64_t kChunkBytes = int64_t{512} * 1024;

using dnnl_util::makeWindow;
using dnnl_util::Window;

bool spatialRankOk(const ir::Op &op) {
  int64_t r = op.inInfo(0).rank();
  return r >= 3 && r <= 5 && op.outInfo(0).elementCount() > 0 && op.inInfo(0).elementCount() > 0;
}

/// Whether \p op (a Conv) is trained: a ConvWeightGrad reads its image or a ConvDataGrad its
/// weights.
bool trained(const ir::Op &op) {
  auto readBy = [&](size_t i, const char *type) {
    if (!op.hasInput(i)) return false;
    const auto &readers = op.input(i).consumers();
    return std::any_of(readers.begin(), readers.end(), [&](const ir::Op *r) { return r->type == type; });
  };
  return readBy(0, "ConvWeightGrad") || readBy(1, "ConvDataGrad");
}

/// A Conv or ConvTranspose in oneDNN's terms: the primitive descriptors its ConvKernel runs,
/// chosen without creating a primitive or throwing, or why oneDNN cannot run it.
struct ConvSetup {
  std::string whyNot; ///< empty: the descriptors are set
  bool transposed = false, hasBias = false, hasResidual = false, pooled = false;
  Shape y; ///< what the convolution computes; with a fused pool, the pool's input
  Window w;
  memory::desc mdX, mdY, mdW, mdB;
  primitive_attr attr; ///< user scratchpad; the residual (once its layout is known) and activation post-ops
  convolution_forward::primitive_desc pd;
  deconvolution_forward::primitive_desc deconvolution;
  ir::FusedPool pool;
  pooling_v2_forward::primitive_desc poolPd; ///< the fused pool where blockedPool does not run it

  /// The convolution from \p x with weights \p wt into \p y; empty if oneDNN has no
  /// implementation for those layouts.
  convolution_forward::primitive_desc make(const memory::desc &x, const memory::desc &wt, const memory::desc &y) const {
    if (!dnnl_util::forwardConvolutionValid(x, wt, mdB, y, w)) return {};
    convolution_forward::desc d(prop_kind::forward_inference, algorithm::convolution_direct, x, wt, mdB, y, w.strides,
                                w.dilates, w.padL, w.padR);
    convolution_forward::primitive_desc made(d, attr, dnnl_util::engine(), true);
    if (made) dnnl_util::skipBrgconv(made);
    return made;
  }
};

/// The fused max pool from the convolution's result \p src into \p dst by oneDNN (empty if it
/// has no implementation), where blockedPool does not run it.
pooling_v2_forward::primitive_desc fusedPoolPd(const ir::FusedPool &pool, const memory::desc &src,
                                               const memory::desc &dst) {
  size_t nsp = pool.kernel.size();
  Window w;
  w.strides.assign(pool.strides.begin(), pool.strides.end());
  w.kernel.assign(pool.kernel.begin(), pool.kernel.end());
  w.dilates.assign(nsp, 0);
  w.padL.assign(pool.pads.begin(), pool.pads.begin() + static_cast<std::ptrdiff_t>(nsp));
  w.padR.assign(pool.pads.begin() + static_cast<std::ptrdiff_t>(nsp), pool.pads.end());
  if (!dnnl_util::poolingValid(prop_kind::forward_inference, algorithm::pooling_max, src, dst, w)) return {};
  primitive_attr attr;
  attr.set_scratchpad_mode(scratchpad_mode::user);
  pooling_v2_forward::desc d(prop_kind::forward_inference, algorithm::pooling_max, src, dst, w.strides, w.kernel,
                             w.dilates, w.padL, w.padR);
  return pooling_v2_forward::primitive_desc(d, attr, dnnl_util::engine(), true);
}

/// Decides without throwing (ConvKernel and supportsConv).
ConvSetup convSetup(const ir::Op &op) {
  ConvSetup s;
  s.transposed = op.type == "ConvTranspose";
  const Shape &x = op.inInfo(0).shape(), &ws = op.inInfo(1).shape();
  s.y = s.transposed ? op.outInfo(0).shape() : ir::convResultShape(op);
  s.w = makeWindow(op, x, s.y, std::vector<int64_t>(ws.begin() + 2, ws.end()), s.transposed);
  if (s.transposed) {
    // oneDNN's deconvolution has no output_padding: it is less end padding.
    auto outPad = op.attrs.getInts("output_padding", std::vector<int64_t>(x.size() - 2, 0));
    for (size_t i = 0; i < s.w.padR.size(); ++i)
      s.w.padR[i] -= outPad[i];
  }
  for (size_t i = 0; i < s.w.padR.size(); ++i)
    if (s.w.padL[i] < 0 || (!s.transposed && s.w.padR[i] < 0)) {
      s.whyNot = "negative padding";
      return s;
    }
  const memory::data_type type = dnnl_util::dnnlType(op.inInfo(0));
  s.mdX = dnnl_util::plainDesc(x, x.size(), type);
  s.mdY = dnnl_util::plainDesc(s.y, s.y.size(), dnnl_util::dnnlType(op.outInfo(0)));
  s.mdW = dnnl_util::convWeightsDesc(op.inInfo(1).shape(), op.attrs.getInt("group", 1), s.transposed,
                                     dnnl_util::dnnlType(op.inInfo(1)));
  s.hasBias = op.hasInput(2);
  s.mdB = s.hasBias ? memory::desc({s.y[1]}, dnnl_util::dnnlType(op.inInfo(2)), memory::dims{1}) : memory::desc();
  s.attr.set_scratchpad_mode(scratchpad_mode::user); // allocated with the kernel, not per run
  if (s.transposed) {
    if (!dnnl_util::forwardConvolutionValid(s.mdX, s.mdW, s.mdB, s.mdY, s.w, true)) {
      s.whyNot = "oneDNN rejects the deconvolution's parameters";
      return s;
    }
    deconvolution_forward::desc d(prop_kind::forward_inference, algorithm::deconvolution_direct, s.mdX, s.mdW, s.mdB,
                                  s.mdY, s.w.strides, s.w.dilates, s.w.padL, s.w.padR);
    s.deconvolution = deconvolution_forward::primitive_desc(d, s.attr, dnnl_util::engine(), true);
    if (!s.deconvolution) s.whyNot = "no oneDNN deconvolution for it";
    return s;
  }
  // Let oneDNN pick its layouts (its direct convolutions want blocked channels) and reorder
  // to and from the plain buffers around it.
  // Post-ops: the residual (fuseConvResidual: a binary add of it in the result's layout, set
  // once that layout is known), then the Relu (fuseRelu).
  s.hasResidual = op.fusion.residual;
  const ir::FusedActivation act = op.fusion.activation;
  auto setPostOps = [&](const memory::desc *residual) {
    post_ops po;
    if (residual) po.append_binary(algorithm::binary_add, *residual);
    dnnl_util::appendActivation(po, act);
    s.attr.set_post_ops(po);
  };
  setPostOps(nullptr);
  auto isRef = [](const convolution_forward::primitive_desc &pd) { return !pd || dnnl_util::implIs(pd, "ref"); };
  auto pd = s.make(dnnl_util::anyLayout(s.mdX), dnnl_util::anyLayout(s.mdW), dnnl_util::anyLayout(s.mdY));
  s.pooled = ir::fusedPool(op, s.pool);
  if (const int64_t group = op.attrs.getInt("group", 1); group > 1 && ws[1] == 1 && x.size() == 4) {
    // Depthwise: oneDNN 2.6 picks brdgmm on nhwc when left to choose, so the 16-channel
    // blocks of the pointwise convolutions around it were reordered in and out of every
    // one (half of MobileNet v2's time); its jit depthwise kernel runs on those blocks.
    auto blocked = [type](const Shape &shape) {
      return memory::desc(dnnl_util::toDims(shape), type, memory::format_tag::aBcd16b);
    };
    auto onBlocks = s.make(blocked(x), dnnl_util::anyLayout(s.mdW), blocked(s.y));
    if (!isRef(onBlocks)) pd = onBlocks; // else no kernel for those layouts: keep oneDNN's choice
  }
  if (trained(op) && !s.hasResidual && !s.pooled && dnnl_util::pointwiseWeights(ws, op.attrs.getInt("group", 1))) {
    // A trained pointwise convolution: its neighbours (BatchNormalization, activations, the
    // grad ops) read plain layouts, so blocked ones cost a reorder of the image and of the
    // result on every step; on plain layouts oneDNN runs a GEMM per image as fast as jit_1x1.
    auto plain = s.make(s.mdX, s.mdW, s.mdY);
    if (!isRef(plain)) pd = plain;
  }
  if (isRef(pd)) pd = s.make(s.mdX, s.mdW, s.mdY); // no optimised kernel for those layouts
  if (!pd) {
    s.whyNot = "no oneDNN convolution for it";
    return s;
  }
  if (s.hasResidual) {
    // oneDNN's optimised convolutions write blocked channels; a plain result means its
    // reference one, where the reference kernel does as well.
    if (pd.dst_desc() == s.mdY || dnnl_util::implIs(pd, "ref")) {
      s.whyNot = "a residual on a plain result (the reference kernel does as well)";
      return s;
    }
    const memory::desc blocked = pd.dst_desc();
    setPostOps(&blocked);
    pd = s.make(pd.src_desc(), pd.weights_desc(), blocked);
    if (isRef(pd)) {
      s.whyNot = "no optimised oneDNN convolution adds the residual";
      return s;
    }
  }
  s.pd = pd;
  // vec::maxPoolBlocked is f32 code: bf16 pools with oneDNN's pooling on the same layout.
  const bool blockedPool = s.pooled && type == memory::data_type::f32 && dnnl_util::channelBlock(pd.dst_desc()) > 0 &&
                           s.pool.kernel.size() == 2 &&
                           std::all_of(s.pool.pads.begin(), s.pool.pads.end(), [](int64_t p) { return p == 0; });
  if (s.pooled && !blockedPool) {
    s.poolPd = fusedPoolPd(s.pool, pd.dst_desc(),
                           dnnl_util::anyLayout(dnnl_util::plainDesc(op.outInfo(0), op.outInfo(0).rank())));
    if (!s.poolPd) s.whyNot = "no oneDNN pooling for the fused MaxPool on the convolution's layout";
  }
  return s;
}

class ConvKernel : public Kernel {
public:
  explicit ConvKernel(const ir::Op &op, const KernelContext &context = KernelContext()) {
    ConvSetup s = convSetup(op);
    if (!s.whyNot.empty()) throw ::popart::error(op.debugName(), ": oneDNN convolution: ", s.whyNot);
    auto &eng = dnnl_util::engine();
    hasBias_ = s.hasBias;
    hasResidual_ = s.hasResidual;
    if (s.transposed) {
      prim_ = deconvolution_forward(s.deconvolution);
      scratch_ = memory(s.deconvolution.scratchpad_desc(), eng);
    } else {
      const auto &pd = s.pd;
      if (hasResidual_) residual_ = memory(pd.dst_desc(), eng); // the residual reordered to the result's layout
      prim_ = convolution_forward(pd);
      scratch_ = memory(pd.scratchpad_desc(), eng);
      if (pd.src_desc() != s.mdX) inner_[0] = memory(pd.src_desc(), eng);
      weightsDesc_ = pd.weights_desc();
      pooled_ = s.pooled;
      if (pd.dst_desc() != s.mdY || pooled_) inner_[2] = memory(pd.dst_desc(), eng);
      if (pooled_) initPool(op, s, pd.dst_desc(), s.y);
      if (pooled_) initChunks(op, context.convPoolChunk, pd, s);
    }
    x_ = memory(s.mdX, eng, DNNL_MEMORY_NONE);
    w_ = memory(s.mdW, eng, DNNL_MEMORY_NONE);
    y_ = memory(pooled_ ? dnnl_util::plainDesc(op.outInfo(0), s.y.size()) : s.mdY, eng, DNNL_MEMORY_NONE);
    if (hasBias_) b_ = memory(s.mdB, eng, DNNL_MEMORY_NONE);
    if (inner_[0]) toInner_[0] = dnnl_util::userScratchReorder(x_, inner_[0]);
    if (!s.transposed) weights_.init(w_, weightsDesc_, op.input(1).isConst());
    const memory &result = pooled_ ? poolDst_ : inner_[2];
    if (result) fromInner_ = dnnl_util::userScratchReorder(result, y_);
    if (hasResidual_) {
      r_ = memory(s.mdY, eng, DNNL_MEMORY_NONE);
      toInner_[1] = dnnl_util::userScratchReorder(r_, residual_);
    }
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
    if (!parts_.empty()) { // convolution and pool a few images at a time (initChunks)
      runChunks(x, wt, poolDst_ ? poolDst_ : y_, hasBias_ ? args.inputs[2] : nullptr);
      if (poolDst_ && !outputInLayout_)
        dnnl_util::execute(fromInner_, reorderArgs_[2], {{DNNL_ARG_FROM, poolDst_}, {DNNL_ARG_TO, y_}});
      return;
    }
    if (residualInLayout_) { // the binary post-op's addend, in the result's layout
      residual_.set_data_handle(const_cast<void *>(args.inputs[3]));
    } else if (hasResidual_) {
      r_.set_data_handle(const_cast<void *>(args.inputs[3]));
      dnnl_util::execute(toInner_[1], reorderArgs_[1], {{DNNL_ARG_FROM, r_}, {DNNL_ARG_TO, residual_}});
    }
    constexpr int kResidualArg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1;
    if (hasResidual_ && hasBias_) {
      b_.set_data_handle(const_cast<void *>(args.inputs[2]));
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, x},
                          {DNNL_ARG_WEIGHTS, wt},
                          {DNNL_ARG_BIAS, b_},
                          {DNNL_ARG_DST, y},
                          {kResidualArg, residual_},
                          {DNNL_ARG_SCRATCHPAD, scratch_}});
    } else if (hasResidual_) {
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, x},
                          {DNNL_ARG_WEIGHTS, wt},
                          {DNNL_ARG_DST, y},
                          {kResidualArg, residual_},
                          {DNNL_ARG_SCRATCHPAD, scratch_}});
    } else if (hasBias_) {
      b_.set_data_handle(const_cast<void *>(args.inputs[2]));
      dnnl_util::execute(prim_, args_,
                         {{DNNL_ARG_SRC, x},
                          {DNNL_ARG_WEIGHTS, wt},
                          {DNNL_ARG_BIAS, b_},
                          {DNNL_ARG_DST, y},
                          {DNNL_ARG_SCRATCHPAD, scratch_}});
    } else {
      dnnl_util::execute(
          prim_, args_,
          {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_DST, y}, {DNNL_ARG_SCRATCHPAD, scratch_}});
    }
    if (pooled_) {
      const memory &dst = poolDst_ ? poolDst_ : y_;
      if (poolBlock_)
        blockedPool(static_cast<const float *>(inner_[2].get_data_handle()),
                    static_cast<float *>(dst.get_data_handle()));
      else
        dnnl_util::execute(pool_, poolArgs_,
                           {{DNNL_ARG_SRC, inner_[2]}, {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, poolScratch_}});
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
  // The image in the convolution's source layout; the residual in its result's layout (the
  // binary post-op then reads it where it is, with no reorder).
  bool acceptsInputIn(size_t i, const TensorLayout &layout) const override {
    if (std::strcmp(layout.provider, "dnnl") != 0) return false;
    const auto &desc = *static_cast<const memory::desc *>(layout.desc.get());
    if (i == 0) return inner_[0] && desc == inner_[0].get_desc();
    return i == 3 && hasResidual_ && desc == residual_.get_desc();
  }
  void readInputIn(size_t i, const TensorLayout &layout) override {
    if (i == 3) { // read where it is: the reorder's buffer goes
      residual_ = memory(residual_.get_desc(), dnnl_util::engine(), DNNL_MEMORY_NONE);
      residualInLayout_ = true;
      return;
    }
    inner_[0] = memory(*static_cast<const memory::desc *>(layout.desc.get()), dnnl_util::engine(), DNNL_MEMORY_NONE);
    inputInLayout_ = true;
  }

private:
  /// The max pool after the convolution, on the convolution's layout (blocked channels), so that
  /// only the pooled result is reordered to the plain output.
  void initPool(const ir::Op &op, const ConvSetup &s, const memory::desc &src, const Shape &y) {
    const ir::FusedPool &pool = s.pool;
    const Shape &out = op.outInfo(0).shape();
    if (!s.poolPd) { // vec::maxPoolBlocked on the convolution's layout (convSetup)
      // oneDNN 2.6's AVX2 pooling of blocked channels ran the CNN's first pool (8 MB) in 0.83 ms,
      // about 10 GB/s; vec::maxPoolBlocked on the same layout takes 0.3 ms.
      int64_t block = dnnl_util::channelBlock(src);
      poolBlock_ = block;
      poolGeom_ = {src.data.padded_dims[0] * src.data.padded_dims[1] / block,
                   y[2],
                   y[3],
                   out[2],
                   out[3],
                   pool.kernel[0],
                   pool.kernel[1],
                   pool.strides[0],
                   pool.strides[1]};
      if (block > 1) {
        memory::dims dims = dnnl_util::toDims(out);
        poolDst_ = memory(memory::desc(dims, memory::data_type::f32,
                                       block == 8 ? memory::format_tag::aBcd8b : memory::format_tag::aBcd16b),
                          dnnl_util::engine());
      }
      return;
    }
    auto &eng = dnnl_util::engine();
    auto mdOut = dnnl_util::plainDesc(op.outInfo(0), op.outInfo(0).rank());
    pool_ = pooling_v2_forward(s.poolPd);
    poolScratch_ = memory(s.poolPd.scratchpad_desc(), eng);
    if (s.poolPd.dst_desc() != mdOut) poolDst_ = memory(s.poolPd.dst_desc(), eng);
  }

  /// The fused max pool by vec::maxPoolBlocked, threaded over (image, channel block) planes;
  /// \p images of them (default: the batch).
  void blockedPool(const float *src, float *dst, int64_t images = -1) const {
    const PoolGeom &g = poolGeom_;
    int64_t block = poolBlock_, in = g.h * g.w * block, out = g.oh * g.ow * block;
    int64_t planes = images < 0 ? g.planes : g.planes / batch_ * images;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < planes; ++p)
      vec::maxPoolBlocked(src + p * in, dst + p * out, g.h, g.w, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw, block);
  }

  /// \p md (batch outermost, unpadded) with \p mb images; empty if its layout is not like that.
  static memory::desc withBatch(const memory::desc &md, int64_t mb) {
    dnnl_memory_desc_t d = md.data;
    if (d.format_kind != dnnl_blocked || d.padded_dims[0] != d.dims[0] || d.offset0 != 0) return {};
    for (int i = 0; i < d.format_desc.blocking.inner_nblks; ++i)
      if (d.format_desc.blocking.inner_idxs[i] == 0) return {};
    if (d.format_desc.blocking.strides[0] * d.dims[0] * static_cast<int64_t>(memory::data_type_size(md.data_type())) !=
        static_cast<int64_t>(md.get_size()))
      return {};
    d.dims[0] = d.padded_dims[0] = mb;
    return memory::desc(d);
  }

  /// A convolution result that a fused pool reads is written and read through memory when the
  /// whole batch is convolved first. Convolving and pooling a few images at a time keeps it in
  /// cache: chunks of about kChunkBytes of result (KernelContext::convPoolChunk = N forces N
  /// images), with body primitives for the chunk and tail ones for the rest, all
  /// convolving into one small buffer and pooling into their slice of the output (by
  /// blockedPool, or by oneDNN pooling primitives of the chunk's size). Left whole when a layout
  /// pads the batch or does not keep it outermost, or a chunk would take another implementation
  /// or weight layout, or oneDNN has no optimised pooling for it.
  void initChunks(const ir::Op &op, int64_t forcedChunk, const convolution_forward::primitive_desc &full,
                  const ConvSetup &setup) {
    int64_t n = full.src_desc().data.dims[0];
    batch_ = n;
    int64_t chunk = forcedChunk;
    if (chunk <= 0) // enough images for about kChunkBytes of convolution result
      chunk = std::max<int64_t>(1, kChunkBytes / (static_cast<int64_t>(full.dst_desc().get_size()) / n));
    if (chunk >= n) return;
    std::vector<Part> parts;
    for (int64_t mb : {chunk, n % chunk}) {
      if (mb == 0) break;
      memory::desc x = withBatch(full.src_desc(), mb), y = withBatch(full.dst_desc(), mb);
      if (!x || !y) return;
      auto pd = setup.make(x, full.weights_desc(), y);
      if (!pd || pd.weights_desc() != full.weights_desc() || pd.src_desc() != x || pd.dst_desc() != y ||
          dnnl_util::implIs(pd, "ref"))
        return;
      pooling_v2_forward::primitive_desc poolPd;
      if (!poolBlock_) {
        const memory::desc pooled =
            withBatch(poolDst_ ? poolDst_.get_desc() : dnnl_util::plainDesc(op.outInfo(0), op.outInfo(0).rank()), mb);
        if (!pooled) return;
        poolPd = fusedPoolPd(setup.pool, y, pooled);
        if (!poolPd || dnnl_util::implIs(poolPd, "ref")) return;
      }
      auto &eng = dnnl_util::engine();
      Part p;
      p.mb = mb;
      p.conv = convolution_forward(pd);
      p.scratch = memory(pd.scratchpad_desc(), eng);
      p.x = memory(x, eng, DNNL_MEMORY_NONE);
      p.y = parts.empty() ? memory(y, eng) : memory(y, eng, parts[0].y.get_data_handle());
      if (poolPd) {
        p.pool = pooling_v2_forward(poolPd);
        p.poolScratch = memory(poolPd.scratchpad_desc(), eng);
        p.pooled = memory(poolPd.dst_desc(), eng, DNNL_MEMORY_NONE);
      }
      parts.push_back(std::move(p));
    }
    xImageBytes_ = static_cast<int64_t>(full.src_desc().get_size()) / n;
    dstImageBytes_ = (poolDst_ ? static_cast<int64_t>(poolDst_.get_desc().get_size()) : op.outInfo(0).byteCount()) / n;
    pool_ = primitive(); // the chunks' pooling primitives replace the whole batch's
    poolScratch_ = memory();
    parts_ = std::move(parts);
    inner_[2] = memory(); // the chunks' buffer replaces the whole batch's
  }

  void runChunks(const memory &x, const memory &wt, const memory &dst, const void *bias) {
    auto *xBase = static_cast<char *>(x.get_data_handle());
    auto *dstBase = static_cast<char *>(dst.get_data_handle());
    if (bias) b_.set_data_handle(const_cast<void *>(bias));
    for (int64_t start = 0; start < batch_;) {
      Part &p = batch_ - start >= parts_[0].mb ? parts_[0] : parts_[1];
      p.x.set_data_handle(xBase + start * xImageBytes_);
      if (bias)
        dnnl_util::execute(p.conv, p.args,
                           {{DNNL_ARG_SRC, p.x},
                            {DNNL_ARG_WEIGHTS, wt},
                            {DNNL_ARG_BIAS, b_},
                            {DNNL_ARG_DST, p.y},
                            {DNNL_ARG_SCRATCHPAD, p.scratch}});
      else
        dnnl_util::execute(
            p.conv, p.args,
            {{DNNL_ARG_SRC, p.x}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_DST, p.y}, {DNNL_ARG_SCRATCHPAD, p.scratch}});
      if (poolBlock_) {
        blockedPool(static_cast<const float *>(p.y.get_data_handle()),
                    reinterpret_cast<float *>(dstBase + start * dstImageBytes_), p.mb);
      } else {
        p.pooled.set_data_handle(dstBase + start * dstImageBytes_);
        dnnl_util::execute(p.pool, p.poolArgs,
                           {{DNNL_ARG_SRC, p.y}, {DNNL_ARG_DST, p.pooled}, {DNNL_ARG_SCRATCHPAD, p.poolScratch}});
      }
      start += p.mb;
    }
  }

  struct Part {
    int64_t mb = 0;
    primitive conv, pool; ///< pool: oneDNN's, where blockedPool does not run it
    memory x, y, scratch, pooled, poolScratch;
    std::vector<dnnl_exec_arg_t> args, poolArgs;
  };
  std::vector<Part> parts_; ///< body and tail chunk primitives (empty: the whole batch at once)
  int64_t batch_ = 0, xImageBytes_ = 0, dstImageBytes_ = 0;

  struct PoolGeom {
    int64_t planes, h, w, oh, ow, kh, kw, sh, sw;
  };
  int64_t poolBlock_ = 0; ///< > 0: the fused pool runs blockedPool on this channel block
  PoolGeom poolGeom_{};

  bool hasBias_ = false, pooled_ = false, hasResidual_ = false, residualInLayout_ = false;
  bool inputInLayout_ = false, outputInLayout_ = false; ///< agreed with the neighbours (no reorder)
  primitive pool_;
  memory poolDst_, poolScratch_; ///< the pooled result in the convolution's layout (empty: plain)
  std::vector<dnnl_exec_arg_t> poolArgs_;
  memory::desc weightsDesc_;
  dnnl_util::PackedWeights weights_; ///< in oneDNN's chosen layout (constant ones packed once)
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory x_, w_, b_, y_, r_, scratch_; ///< r_: the residual (input 3), plain
  memory residual_;                    ///< the residual in the result's layout (the binary post-op's)
  memory inner_[3];                    ///< [0] src, [2] dst in oneDNN's chosen layout (empty: plain); weights: weights_
  primitive toInner_[2], fromInner_;   ///< [0] src, [1] the residual into dst's layout
  std::vector<dnnl_exec_arg_t> reorderArgs_[3];
};

/// A pooling in oneDNN's terms: its primitive descriptor, or why oneDNN cannot run it.
struct PoolSetup {
  std::string whyNot; ///< empty: pd is set
  memory::desc mdX, mdY;
  pooling_v2_forward::primitive_desc pd;
};

/// Decides without throwing (PoolKernel and supportsPool).
PoolSetup poolSetup(const ir::Op &op) {
  PoolSetup s;
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  Window w = makeWindow(op, x, y, op.attrs.getInts("kernel_shape"), false);
  bool isMax = op.type == "MaxPool";
  bool includePad = !isMax && op.attrs.getInt("count_include_pad", 0) != 0;
  s.whyNot = dnnl_util::extendPadsForCeilMode(x, y, includePad, w);
  if (s.whyNot.empty()) s.whyNot = dnnl_util::negativePadReason(w);
  if (!s.whyNot.empty()) return s;
  algorithm alg = isMax        ? algorithm::pooling_max
                  : includePad ? algorithm::pooling_avg_include_padding
                               : algorithm::pooling_avg_exclude_padding;
  s.mdX = dnnl_util::plainDesc(op.inInfo(0), x.size());
  s.mdY = dnnl_util::plainDesc(op.outInfo(0), y.size());
  if (!dnnl_util::poolingValid(prop_kind::forward_inference, alg, s.mdX, s.mdY, w)) {
    s.whyNot = "oneDNN rejects the window";
    return s;
  }
  pooling_v2_forward::desc d(prop_kind::forward_inference, alg, s.mdX, s.mdY, w.strides, w.kernel, w.dilates, w.padL,
                             w.padR);
  s.pd = pooling_v2_forward::primitive_desc(d, dnnl_util::engine(), true);
  if (!s.pd)
    s.whyNot = s.mdX.data_type() == memory::data_type::f32
                   ? "no oneDNN pooling implementation for it"
                   : dnnl_util::noImplementation("pooling", s.mdX.data_type()).reason;
  if (Support impl = dnnl_util::implementationFor(s.pd, "pooling", s.mdX.data_type()); s.pd && !impl)
    s.whyNot = impl.reason;
  return s;
}

class PoolKernel : public Kernel {
public:
  explicit PoolKernel(const ir::Op &op) {
    PoolSetup s = poolSetup(op);
    if (!s.whyNot.empty()) throw ::popart::error(op.debugName(), ": oneDNN pooling: ", s.whyNot);
    auto &eng = dnnl_util::engine();
    prim_ = pooling_v2_forward(s.pd);
    x_ = memory(s.mdX, eng, DNNL_MEMORY_NONE);
    y_ = memory(s.mdY, eng, DNNL_MEMORY_NONE);
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

/// The shapes and types oneDNN's convolutions and poolings take; "" if it takes \p op's: X, W,
/// Y and a residual of one type, a bias of it or FLOAT.
std::string windowOpShapes(const ir::Op &op) {
  DataType t = op.inInfo(0).dataType();
  if (!dnnl_util::dnnlType(t)) return "X is " + toString(t);
  for (size_t i = 1; i < op.inputCount(); ++i)
    if (op.hasInput(i) && op.inInfo(i).dataType() != t && !(i == 2 && op.inInfo(i).dataType() == DataType::FLOAT))
      return "input " + std::to_string(i) + " is " + toString(op.inInfo(i).dataType()) + " with X " + toString(t);
  if (op.outInfo(0).dataType() != t) return "Y not of X's type";
  if (!spatialRankOk(op)) return "spatial rank other than 1-3, or an empty tensor";
  return {};
}

Support supportsConv(const ir::Op &op) {
  if (std::string why = windowOpShapes(op); !why.empty()) return Support::no(why);
  ConvSetup s = convSetup(op);
  memory::data_type type = dnnl_util::dnnlType(op.inInfo(0));
  if (type != memory::data_type::f32 && s.whyNot.rfind("no oneDNN", 0) == 0)
    return dnnl_util::noImplementation(s.transposed ? "deconvolution" : "convolution", type);
  if (!s.whyNot.empty()) return Support::no(s.whyNot);
  if (type == memory::data_type::f32) return Support::yes();
  if (s.transposed) return dnnl_util::implementationFor(s.deconvolution, "deconvolution", type);
  return dnnl_util::implementationFor(s.pd, "convolution", type);
}

Support supportsPool(const ir::Op &op) {
  if (std::string why = windowOpShapes(op); !why.empty()) return Support::no(why);
  if (op.type == "MaxPool" && op.hasOutput(1)) return Support::no("oneDNN gives no Indices");
  if (tiledMaxPool(op)) return Support::no("tiling windows: the fast kernel's vectorised pass is faster");
  // A dilated window can lie wholly in the padding, where ONNX and oneDNN disagree.
  const Shape &x = op.inInfo(0).shape();
  auto k = op.attrs.getInts("kernel_shape");
  auto pads = op.attrs.getInts("pads", std::vector<int64_t>(2 * k.size(), 0));
  for (size_t i = 0; i < k.size(); ++i)
    if (pads[i] >= k[i] || pads[i + k.size()] >= k[i] || x[i + 2] < 1)
      return Support::no("a window may lie wholly in the padding");
  PoolSetup s = poolSetup(op);
  if (!s.whyNot.empty()) return Support::no(s.whyNot);
  if (separableMaxPool(op) && !dnnl_util::implIs(s.pd, "jit"))
    return Support::no("only oneDNN's generic pooling for plain NCHW: the fast kernel's separable passes are faster");
  return Support::yes();
}

} // namespace

void registerDnnlConvPoolKernels(KernelRegistry &r) {
  for (const char *type : {"Conv", "ConvTranspose"})
    r.add({"ai.onnx", type, KernelProvider::Dnnl, halfConvOr<supportsConv>, makeHalfConvOr<makeKernel<ConvKernel>>});
  r.add({"ai.onnx", "MaxPool", KernelProvider::Dnnl, supportsPool, makeKernel<PoolKernel>});
  r.add({"ai.onnx", "AveragePool", KernelProvider::Dnnl, supportsPool, makeKernel<PoolKernel>});
}

} // namespace popart::backend_cpu
