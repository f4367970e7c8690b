// FLOAT16 Conv, ConvTranspose, ConvDataGrad and ConvWeightGrad on oneDNN's f32 primitives. oneDNN
// 2.6.3 has no f16 convolution on this CPU (only f16 ↔ f32 reorders), and the reference kernels
// run fp16 convolutions at about 1 GFLOP/s, so these kernels compute in fp32 a chunk of images at
// a time, without an fp32 copy of a whole activation: the chunk of the batched fp16 input (X, or
// dY) is widened into the kernel's scratch (Kernel::scratchBytes, planned in the arena) in the
// layout the f32 primitive chose (as the f32 kernels, oneDNN picks: channels blocked by 8 or 16 are
// converted to straight from fp16, other layouts through a plain f32 buffer and a oneDNN reorder),
// convolved, and the chunk's f32 result is narrowed into the output the same way (round to nearest
// even, as core/half.hpp; written as it is for a FLOAT output) with a fused residual and Relu
// applied on the way. The weights are widened once per run, whole. ConvWeightGrad sums its chunks' weight
// gradients in an f32 accumulator in the scratch and narrows the sum once.
//
// Chunks: about kChunkBytesPerThread of f32 per thread for the batched input and output
// together, so that the scratch is small next to the activations and the converted chunk is still
// in L2 when oneDNN reads it; the batch is split
// evenly, and the last chunk, when it has fewer images, runs the same primitive over its images
// and what the buffer holds after them (whose results are dropped; zeros for ConvWeightGrad, so
// that they add nothing), so that one primitive and one weights layout serve every chunk.
//
// Fusions: the bias and an activation run in the f32 primitive (oneDNN post-ops, as the f32
// kernel); a residual is added by the narrowing pass, before a Relu (the only activation taken
// with one). A fused max pool (fuseConvPool) pools each chunk's f32 result in the scratch with
// oneDNN's f32 pooling, so that only the pooled chunk is narrowed and no full-size result exists
// in any type. fp16.16's rounded partials (internal_attr::kHalfPartials) are declined, and stay
// on the reference kernel.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/fast/half_blocks.hpp"
#include "backend_cpu/dnnl/window.hpp"
#include "core/tensordata.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/ops/window.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;
using half_blocks::Epilogue;
using half_blocks::HalfLoops;
using half_blocks::kThreadedElements;

/// f32 bytes of a chunk's batched input and output (and pooled result) together per thread (one
/// image at least). The scratch is planned in the arena at the convolution's step: at 2 MiB per
/// thread the CNN's second convolution held 3.8 MB of it, more than its 16-bit input and output;
/// at 256 KiB the CNN ran as fast (best of four runs at 2 threads on the loaded 2-core host: 3.14
/// against 2.91 ms, within its noise), the conversions and oneDNN's direct convolutions being
/// per-image work.
constexpr int64_t kChunkBytesPerThread = int64_t{256} << 10;
/// Elements per piece of a threaded conversion pass.
constexpr int64_t kPiece = int64_t{1} << 14;
/// Positions per tile of a conversion to or from blocked channels (16 channels of them: 8 KiB).
constexpr int64_t kTile = 128;

int64_t aligned64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

/// Which primitive runs: the forward convolution (Conv, ConvTranspose), backward data
/// (ConvDataGrad: dY, W → dX) or backward weights (ConvWeightGrad: dY, X → dW).
enum class Pass { Forward, Data, Weights };

Pass passOf(const ir::Op &op) {
  if (op.type == "ConvDataGrad") return Pass::Data;
  if (op.type == "ConvWeightGrad") return Pass::Weights;
  return Pass::Forward;
}

/// Why the kernel does not take \p op's types, fusions or shapes ("" if it does).
std::string halfConvObstacle(const ir::Op &op) {
  if (op.attrs.getInt(ir::internal_attr::kHalfPartials, 0) != 0)
    return "its partial sums are rounded to 16 bits (fp16.16), which only the reference kernel does";
  for (size_t i = 0; i < 2; ++i)
    if (op.inInfo(i).dataType() != DataType::FLOAT16)
      return "input " + std::to_string(i) + " is " + toString(op.inInfo(i).dataType()) + ", not FLOAT16";
  if (op.hasInput(2) && op.inInfo(2).dataType() != DataType::FLOAT16 && op.inInfo(2).dataType() != DataType::FLOAT)
    return "the bias is " + toString(op.inInfo(2).dataType());
  DataType y = op.outInfo(0).dataType();
  if (y != DataType::FLOAT16 && y != DataType::FLOAT) return "Y is " + toString(y);
  const int64_t rank = op.inInfo(0).rank();
  if (rank < 3 || rank > 5) return "spatial rank other than 1-3";
  for (size_t i = 0; i < op.inputCount(); ++i)
    if (op.hasInput(i) && op.inInfo(i).elementCount() == 0) return "an empty input";
  if (op.outInfo(0).elementCount() == 0) return "an empty result";
  if (op.fusion.pool && op.type != "Conv") return "a fused max pool on other than a Conv";
  if (op.fusion.pool && op.fusion.residual) return "a fused max pool with a residual";
  if (op.fusion.residual) {
    if (op.fusion.activated() && !op.fusion.relu()) return "a residual with an activation other than Relu";
    if (op.inInfo(3).dataType() != y) return "a residual not in Y's type";
  }
  return {};
}

/// The kernel's decisions, made without creating a primitive or throwing (for the capability
/// check and the kernel): the chunk size, the f32 descriptors of one chunk's operands and the
/// primitive descriptor, or why oneDNN's f32 primitives cannot run it.
struct HalfConvSetup {
  std::string whyNot; ///< empty: the rest is set
  Pass pass = Pass::Forward;
  bool transposed = false;
  int64_t batch = 0, chunk = 0, chunks = 0; ///< images, images per chunk, chunks
  /// Plain f32 descriptors of the roles: [0] a chunk of input 0 (X, or dY), [1] input 1 (W, or a
  /// chunk of X for ConvWeightGrad), [2] output 0 (a chunk of Y or dX, or all of dW); and the
  /// layouts the primitive chose for them.
  std::array<memory::desc, 3> plain, chosen;
  std::array<int, 3> args{};
  memory::desc bias; ///< f32 [M] (Forward with a bias), else empty
  primitive_desc pd;
  /// A fused max pool: the convolution writes a chunk of its result in \p convDst, the pool reads
  /// it and writes role 2 (plain and chosen then describe the pooled chunk).
  bool pooled = false;
  memory::desc convDst;
  pooling_v2_forward::primitive_desc poolPd;

  /// Whether role \p r holds a chunk of images (otherwise the whole operand).
  bool batched(size_t r) const { return r == 0 || (r == 1) == (pass == Pass::Weights); }
};

/// \p threads: the session's, which share a chunk.
HalfConvSetup halfConvSetup(const ir::Op &op, int threads = 1) {
  HalfConvSetup s;
  s.whyNot = halfConvObstacle(op);
  if (!s.whyNot.empty()) return s;
  s.pass = passOf(op);
  s.transposed = op.type == "ConvTranspose";
  const int64_t group = op.attrs.getInt("group", 1);
  ir::FusedPool pool;
  s.pooled = ir::fusedPool(op, pool);
  // Output 0 is the pooled result; the convolution's is pool.input.
  const std::array<Shape, 3> shapes{op.inInfo(0).shape(), op.inInfo(1).shape(),
                                    s.pooled ? pool.input : op.outInfo(0).shape()};
  // X, W and Y (or dX, W, dY) in the primitive's terms.
  const Shape &x = s.pass == Pass::Forward ? shapes[0] : s.pass == Pass::Data ? shapes[2] : shapes[1];
  const Shape &w = s.pass == Pass::Weights ? shapes[2] : shapes[1];
  const Shape &y = s.pass == Pass::Forward ? shapes[2] : shapes[0];
  dnnl_util::Window win = dnnl_util::makeWindow(op, x, y, std::vector<int64_t>(w.begin() + 2, w.end()), s.transposed);
  if (s.transposed) { // oneDNN's deconvolution has no output_padding: it is less end padding
    auto outPad = op.attrs.getInts("output_padding", std::vector<int64_t>(x.size() - 2, 0));
    for (size_t i = 0; i < win.padR.size(); ++i)
      win.padR[i] -= outPad[i];
    for (size_t i = 0; i < win.padR.size(); ++i)
      if (win.padL[i] < 0) s.whyNot = "negative padding";
  } else {
    s.whyNot = dnnl_util::negativePadReason(win);
  }
  if (!s.whyNot.empty()) return s;

  // Chunks of about kChunkBytesPerThread of the batched roles in f32 per thread, the batch split
  // evenly.
  s.batch = shapes[0][0];
  int64_t imageBytes = 0;
  for (size_t r = 0; r < 3; ++r)
    if (s.batched(r)) imageBytes += 4 * shapeElementCount(shapes[r]) / s.batch;
  if (s.pooled) imageBytes += 4 * op.outInfo(0).elementCount() / s.batch;
  const int64_t chunkBytes = kChunkBytesPerThread * std::max(threads, 1);
  s.chunk = std::clamp<int64_t>(chunkBytes / std::max<int64_t>(imageBytes, 1), 1, s.batch);
  s.chunks = (s.batch + s.chunk - 1) / s.chunk;
  s.chunk = (s.batch + s.chunks - 1) / s.chunks;
  for (size_t r = 0; r < 3; ++r) {
    Shape chunkShape = shapes[r];
    if (s.batched(r)) chunkShape[0] = s.chunk;
    s.plain[r] = r == (s.pass == Pass::Weights ? 2u : 1u)
                     ? dnnl_util::convWeightsDesc(shapes[r], group, s.transposed, memory::data_type::f32)
                     : dnnl_util::plainDesc(chunkShape, chunkShape.size(), memory::data_type::f32);
  }
  if (s.pass == Pass::Forward && op.hasInput(2))
    s.bias = memory::desc({shapes[2][1]}, memory::data_type::f32, memory::dims{1});

  primitive_attr attr;
  attr.set_scratchpad_mode(scratchpad_mode::user);      // in the kernel's scratch, not per run
  if (s.pass == Pass::Forward && !op.fusion.residual) { // with a residual, the narrowing pass applies the Relu
    post_ops po;
    dnnl_util::appendActivation(po, op.fusion.activation);
    attr.set_post_ops(po);
  }
  auto &eng = dnnl_util::engine();
  // The primitive on the roles' descriptors \p d; empty if oneDNN has none.
  auto make = [&](const std::array<memory::desc, 3> &d) -> primitive_desc {
    primitive_desc made;
    switch (s.pass) {
    case Pass::Forward:
      if (s.transposed) {
        if (!dnnl_util::forwardConvolutionValid(d[0], d[1], s.bias, d[2], win, true)) return {};
        deconvolution_forward::desc desc(prop_kind::forward_inference, algorithm::deconvolution_direct, d[0], d[1],
                                         s.bias, d[2], win.strides, win.dilates, win.padL, win.padR);
        made = deconvolution_forward::primitive_desc(desc, attr, eng, true);
      } else {
        if (!dnnl_util::forwardConvolutionValid(d[0], d[1], s.bias, d[2], win)) return {};
        convolution_forward::desc desc(prop_kind::forward_inference, algorithm::convolution_direct, d[0], d[1], s.bias,
                                       d[2], win.strides, win.dilates, win.padL, win.padR);
        made = convolution_forward::primitive_desc(desc, attr, eng, true);
      }
      break;
    case Pass::Data:
    case Pass::Weights: {
      // Roles: dY, W, dX (Data) or dY, X, dW (Weights).
      const memory::desc &dx = s.pass == Pass::Data ? d[2] : d[1], &dw = s.pass == Pass::Data ? d[1] : d[2];
      if (!dnnl_util::backwardConvolutionValid(s.pass == Pass::Weights, dx, dw, d[0], win)) return {};
      convolution_forward::desc fd(prop_kind::forward_training, algorithm::convolution_direct, dx, dw, d[0],
                                   win.strides, win.dilates, win.padL, win.padR);
      convolution_forward::primitive_desc hint(fd, eng, true);
      if (!hint) return {};
      if (s.pass == Pass::Data) {
        convolution_backward_data::desc bd(algorithm::convolution_direct, dx, dw, d[0], win.strides, win.dilates,
                                           win.padL, win.padR);
        made = convolution_backward_data::primitive_desc(bd, attr, eng, hint, true);
      } else {
        convolution_backward_weights::desc bd(algorithm::convolution_direct, dx, dw, d[0], win.strides, win.dilates,
                                              win.padL, win.padR);
        made = convolution_backward_weights::primitive_desc(bd, attr, eng, hint, true);
      }
      break;
    }
    }
    if (made) dnnl_util::skipBrgconv(made); // brgconv allocates on every execution in 2.6
    return made;
  };
  auto isRef = [](const primitive_desc &pd) { return !pd || dnnl_util::implIs(pd, "ref"); };
  // Blocked channels where oneDNN's direct kernels want them (reordered in the scratch, in
  // cache), else plain layouts.
  std::array<memory::desc, 3> any{dnnl_util::anyLayout(s.plain[0]), dnnl_util::anyLayout(s.plain[1]),
                                  dnnl_util::anyLayout(s.plain[2])};
  primitive_desc pd = make(any);
  if (isRef(pd)) pd = make(s.plain);
  if (isRef(pd)) {
    s.whyNot = "no optimised oneDNN f32 " +
               std::string(s.transposed              ? "deconvolution"
                           : s.pass == Pass::Forward ? "convolution"
                                                     : "backward convolution") +
               " for it";
    return s;
  }
  s.pd = pd;
  using Q = query;
  const std::array<std::array<Q, 3>, 3> roles{{{Q::src_md, Q::weights_md, Q::dst_md},
                                               {Q::diff_dst_md, Q::weights_md, Q::diff_src_md},
                                               {Q::diff_dst_md, Q::src_md, Q::diff_weights_md}}};
  const std::array<std::array<int, 3>, 3> args{{{DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
                                                {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
                                                {DNNL_ARG_DIFF_DST, DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS}}};
  const auto p = static_cast<size_t>(s.pass);
  for (size_t r = 0; r < 3; ++r) {
    s.chosen[r] = pd.query_md(roles[p][r]);
    s.args[r] = args[p][r];
  }
  if (s.pooled) {
    // On the convolution's layout (blocked channels as a rule), into whatever layout oneDNN's
    // pooling picks for the pooled chunk.
    Shape pooledChunk = op.outInfo(0).shape();
    pooledChunk[0] = s.chunk;
    const size_t nsp = pool.kernel.size();
    const auto half = static_cast<std::ptrdiff_t>(nsp);
    dnnl_util::Window pw;
    pw.kernel.assign(pool.kernel.begin(), pool.kernel.end());
    pw.strides.assign(pool.strides.begin(), pool.strides.end());
    pw.dilates.assign(nsp, 0);
    pw.padL.assign(pool.pads.begin(), pool.pads.begin() + half);
    pw.padR.assign(pool.pads.begin() + half, pool.pads.end());
    const memory::desc plainPooled = dnnl_util::plainDesc(pooledChunk, pooledChunk.size(), memory::data_type::f32);
    const memory::desc anyPooled = dnnl_util::anyLayout(plainPooled);
    if (dnnl_util::poolingValid(prop_kind::forward_inference, algorithm::pooling_max, s.chosen[2], anyPooled, pw)) {
      pooling_v2_forward::desc d(prop_kind::forward_inference, algorithm::pooling_max, s.chosen[2], anyPooled,
                                 pw.strides, pw.kernel, pw.dilates, pw.padL, pw.padR);
      primitive_attr poolAttr; // not the convolution's: its activation ran before the pool
      poolAttr.set_scratchpad_mode(scratchpad_mode::user);
      s.poolPd = pooling_v2_forward::primitive_desc(d, poolAttr, eng, true);
    }
    if (isRef(s.poolPd)) {
      s.whyNot = "no optimised oneDNN f32 pooling for the fused max pool";
      return s;
    }
    s.convDst = s.chosen[2];
    s.plain[2] = plainPooled;
    s.chosen[2] = s.poolPd.dst_desc();
  }
  return s;
}

/// The FLOAT16 convolution in fp32 chunks (see the top of this file).
class HalfConvKernel : public Kernel {
public:
  HalfConvKernel(const ir::Op &op, const KernelContext &context) : loops_(half_blocks::halfLoops()) {
    HalfConvSetup s = halfConvSetup(op, context.threads);
    if (!s.whyNot.empty()) throw ::popart::error(op.debugName(), ": FLOAT16 convolution on oneDNN: ", s.whyNot);
    auto &eng = dnnl_util::engine();
    pass_ = s.pass;
    batch_ = s.batch, chunk_ = s.chunk, chunks_ = s.chunks;
    implementation_ = s.pd.impl_info_str();
    prim_ = primitive(s.pd);
    args_ = s.args;
    for (size_t r = 0; r < 3; ++r) {
      batched_[r] = s.batched(r);
      const Shape &shape = r < 2 ? op.inInfo(r).shape() : op.outInfo(0).shape();
      elements_[r] = batched_[r] ? shapeElementCount(shape) / batch_ : shapeElementCount(shape); // per image if batched
      // A chunk in channels blocked by 8 or 16 is converted straight from and to fp16 (one pass
      // and one parallel region instead of a conversion and a reorder).
      const int64_t block = batched_[r] && s.chosen[r] != s.plain[r] ? dnnl_util::channelBlock(s.chosen[r]) : 0;
      if (block > 1) blocked_[r] = {block, shape[1], s.chosen[r].data.padded_dims[1], elements_[r] / shape[1]};
    }
    // The scratch: each role's plain f32 buffer and, where the primitive chose another layout,
    // its buffer in that layout; ConvWeightGrad's second dW buffer (a chunk's, added into the
    // first); the f32 bias; oneDNN's scratchpad.
    auto place = [&](memory &m, const memory::desc &desc) {
      m = memory(desc, eng, DNNL_MEMORY_NONE);
      offsets_.push_back(scratchBytes_);
      held_.push_back(&m);
      scratchBytes_ += aligned64(static_cast<int64_t>(desc.get_size()));
    };
    for (size_t r = 0; r < 3; ++r) {
      if (s.chosen[r] != s.plain[r]) place(inner_[r], s.chosen[r]);
      if (blocked_[r].block > 0) continue;
      place(plain_[r], s.plain[r]);
      if (inner_[r] && r < 2) toInner_[r] = dnnl_util::userScratchReorder(plain_[r], inner_[r]);
      if (inner_[r] && r == 2) fromInner_ = dnnl_util::userScratchReorder(inner_[r], plain_[r]);
    }
    if (pass_ == Pass::Weights) place(part_, s.chosen[2]);
    if (s.bias) {
      biasHalf_ = op.inInfo(2).dataType() == DataType::FLOAT16;
      if (biasHalf_)
        place(bias_, s.bias);
      else
        bias_ = memory(s.bias, eng, DNNL_MEMORY_NONE);
    }
    if (s.pd.scratchpad_desc().get_size() > 0)
      place(scratchpad_, s.pd.scratchpad_desc());
    else
      scratchpad_ = memory(s.pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
    if (s.pooled) {
      pool_ = pooling_v2_forward(s.poolPd);
      place(convDst_, s.convDst);
      if (s.poolPd.scratchpad_desc().get_size() > 0)
        place(poolScratchpad_, s.poolPd.scratchpad_desc());
      else
        poolScratchpad_ = memory(s.poolPd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
      implementation_ += std::string("; max pool: ") + s.poolPd.impl_info_str();
    }
    yHalf_ = op.outInfo(0).dataType() == DataType::FLOAT16;
    residual_ = op.fusion.residual;
    relu_ = residual_ && op.fusion.relu();
  }

  int64_t scratchBytes() const override { return scratchBytes_; }

  std::string choice() const override {
    return "fp32 chunks of " + std::to_string(chunk_) + " of " + std::to_string(batch_) + " images (" +
           std::to_string(chunks_) + (chunks_ == 1 ? " chunk; " : " chunks; ") + implementation_ + ")";
  }

  void run(const KernelArgs &args) override {
    // In a plan the scratch is the arena's; outside one (tests, constant folding) memory of the
    // kernel's own, made on the first run so that a plan's kernels hold none.
    if (!args.scratch && !owned_) owned_ = alignedBytes(static_cast<size_t>(scratchBytes_));
    auto *base = static_cast<uint8_t *>(args.scratch ? args.scratch : owned_.get());
    for (size_t i = 0; i < held_.size(); ++i)
      held_[i]->set_data_handle(base + offsets_[i]);
    const auto *in0 = static_cast<const uint16_t *>(args.inputs[0]);
    const auto *in1 = static_cast<const uint16_t *>(args.inputs[1]);
    if (!batched_[1]) { // the weights, once per run
      widen(in1, plainData(1), elements_[1]);
      if (inner_[1])
        dnnl_util::execute(toInner_[1], reorderArgs_[1], {{DNNL_ARG_FROM, plain_[1]}, {DNNL_ARG_TO, inner_[1]}});
    }
    if (bias_) {
      if (biasHalf_)
        widen(static_cast<const uint16_t *>(args.inputs[2]), static_cast<float *>(bias_.get_data_handle()),
              bias_.get_desc().get_size() / 4);
      else
        bias_.set_data_handle(const_cast<void *>(args.inputs[2]));
    }
    memory &out = inner_[2] ? inner_[2] : plain_[2];
    void *accumulator = out.get_data_handle();
    for (int64_t c = 0; c < chunks_; ++c) {
      const int64_t first = c * chunk_, images = std::min(chunk_, batch_ - first);
      for (size_t r = 0; r < 2; ++r) {
        if (!batched_[r]) continue;
        const uint16_t *src = (r == 0 ? in0 : in1) + first * elements_[r];
        if (blocked_[r].block > 0) {
          widenBlocked(blocked_[r], src, images, static_cast<float *>(inner_[r].get_data_handle()));
          continue;
        }
        widen(src, plainData(r), images * elements_[r]);
        // ConvWeightGrad sums over the images: those after the last chunk's must add nothing.
        if (images < chunk_ && pass_ == Pass::Weights)
          std::memset(plainData(r) + images * elements_[r], 0,
                      static_cast<size_t>((chunk_ - images) * elements_[r]) * sizeof(float));
        if (inner_[r])
          dnnl_util::execute(toInner_[r], reorderArgs_[r], {{DNNL_ARG_FROM, plain_[r]}, {DNNL_ARG_TO, inner_[r]}});
      }
      if (pass_ == Pass::Weights) out.set_data_handle(c == 0 ? accumulator : part_.get_data_handle());
      const memory &a0 = inner_[0] ? inner_[0] : plain_[0], &a1 = inner_[1] ? inner_[1] : plain_[1];
      const memory &result = pool_ ? convDst_ : out;
      if (bias_)
        dnnl_util::execute(prim_, primArgs_,
                           {{args_[0], a0},
                            {args_[1], a1},
                            {DNNL_ARG_BIAS, bias_},
                            {args_[2], result},
                            {DNNL_ARG_SCRATCHPAD, scratchpad_}});
      else
        dnnl_util::execute(prim_, primArgs_,
                           {{args_[0], a0}, {args_[1], a1}, {args_[2], result}, {DNNL_ARG_SCRATCHPAD, scratchpad_}});
      if (pool_)
        dnnl_util::execute(pool_, poolArgs_,
                           {{DNNL_ARG_SRC, convDst_}, {DNNL_ARG_DST, out}, {DNNL_ARG_SCRATCHPAD, poolScratchpad_}});
      if (pass_ == Pass::Weights) {
        if (c > 0) accumulate(static_cast<float *>(accumulator), static_cast<const float *>(part_.get_data_handle()));
        continue;
      }
      if (blocked_[2].block > 0) {
        narrowBlocked(static_cast<const float *>(inner_[2].get_data_handle()), first, images, args);
        continue;
      }
      if (inner_[2])
        dnnl_util::execute(fromInner_, reorderArgs_[2], {{DNNL_ARG_FROM, inner_[2]}, {DNNL_ARG_TO, plain_[2]}});
      narrow(plainData(2), first * elements_[2], images * elements_[2], args);
    }
    if (pass_ == Pass::Weights) {
      out.set_data_handle(accumulator);
      if (inner_[2])
        dnnl_util::execute(fromInner_, reorderArgs_[2], {{DNNL_ARG_FROM, inner_[2]}, {DNNL_ARG_TO, plain_[2]}});
      narrow(plainData(2), 0, elements_[2], args);
    }
  }

private:
  /// A batched role whose chunk the primitive takes in channels blocked by 8 or 16: the block,
  /// channels, channels padded to blocks, positions per channel (block 0: through plain f32).
  struct Blocked {
    int64_t block = 0, channels = 0, padded = 0, spatial = 0;
  };

  float *plainData(size_t r) const { return static_cast<float *>(plain_[r].get_data_handle()); }

  /// \p n fp16 values into f32, in pieces shared among threads when there are many.
  void widen(const uint16_t *src, float *dst, int64_t n) const {
    const int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (n >= kThreadedElements)
    for (int64_t p = 0; p < pieces; ++p)
      loops_.widen(src + p * kPiece, dst + p * kPiece, std::min(kPiece, n - p * kPiece));
  }

  /// \p n f32 results from \p acc into output 0 from element \p at: Y's type, with the fused
  /// residual (input 3, same elements) and Relu.
  void narrow(const float *acc, int64_t at, int64_t n, const KernelArgs &args) const {
    const int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (n >= kThreadedElements)
    for (int64_t p = 0; p < pieces; ++p)
      loops_.epilogue(acc + p * kPiece, std::min(kPiece, n - p * kPiece), epilogueAt(at + p * kPiece, args));
  }

  /// The epilogue of the run of output 0 from element \p at: Y's type, the fused residual (input
  /// 3, same elements) added before the Relu.
  Epilogue epilogueAt(int64_t at, const KernelArgs &args) const {
    const auto offset = static_cast<size_t>(at) * (yHalf_ ? 2 : 4);
    Epilogue e;
    e.relu = relu_;
    if (residual_) { // as the addend: before the Relu
      e.addend = static_cast<const uint8_t *>(args.inputs[3]) + offset;
      e.addendHalf = yHalf_;
      e.addendStride = 1;
    }
    e.y = static_cast<uint8_t *>(args.outputs[0]) + offset;
    e.yHalf = yHalf_;
    return e;
  }

  /// \p images images of fp16 \p src (plain) into \p dst in the blocked layout \p b, the padding
  /// channels zero; for ConvWeightGrad the rest of the chunk zero too (it must add nothing).
  void widenBlocked(const Blocked &b, const uint16_t *src, int64_t images, float *dst) const {
    const int64_t groups = b.padded / b.block, tiles = (b.spatial + kTile - 1) / kTile;
    const int64_t work = images * groups * tiles;
#pragma omp parallel for schedule(static) if (images * b.padded * b.spatial >= kThreadedElements)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t n = w / (groups * tiles), g = w / tiles % groups, hw = w % tiles * kTile;
      const int64_t len = std::min(kTile, b.spatial - hw);
      alignas(64) std::array<float, 16 * kTile> rows; // [channel of the block][position]
      for (int64_t c = 0; c < b.block; ++c) {
        const int64_t channel = g * b.block + c;
        if (channel < b.channels)
          loops_.widen(src + (n * b.channels + channel) * b.spatial + hw, rows.data() + c * kTile, len);
        else
          std::fill_n(rows.data() + c * kTile, len, 0.f);
      }
      float *out = dst + ((n * groups + g) * b.spatial + hw) * b.block;
      for (int64_t i = 0; i < len; ++i)
        for (int64_t c = 0; c < b.block; ++c)
          out[i * b.block + c] = rows[static_cast<size_t>(c * kTile + i)];
    }
    if (images < chunk_ && pass_ == Pass::Weights)
      std::fill_n(dst + images * b.padded * b.spatial, (chunk_ - images) * b.padded * b.spatial, 0.f);
  }

  /// The chunk's f32 result \p src in the blocked layout of output 0 into its \p images images
  /// from image \p first, through the epilogue.
  void narrowBlocked(const float *src, int64_t first, int64_t images, const KernelArgs &args) const {
    const Blocked &b = blocked_[2];
    const int64_t groups = b.padded / b.block, tiles = (b.spatial + kTile - 1) / kTile;
    const int64_t work = images * groups * tiles;
#pragma omp parallel for schedule(static) if (images * b.padded * b.spatial >= kThreadedElements)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t n = w / (groups * tiles), g = w / tiles % groups, hw = w % tiles * kTile;
      const int64_t len = std::min(kTile, b.spatial - hw), channels = std::min(b.block, b.channels - g * b.block);
      alignas(64) std::array<float, 16 * kTile> rows; // [channel of the block][position]
      const float *in = src + ((n * groups + g) * b.spatial + hw) * b.block;
      for (int64_t i = 0; i < len; ++i)
        for (int64_t c = 0; c < channels; ++c)
          rows[static_cast<size_t>(c * kTile + i)] = in[i * b.block + c];
      for (int64_t c = 0; c < channels; ++c)
        loops_.epilogue(rows.data() + c * kTile, len,
                        epilogueAt(((first + n) * b.channels + g * b.block + c) * b.spatial + hw, args));
    }
  }

  /// ConvWeightGrad: \p part (a chunk's dW, in the primitive's layout) added into \p sum.
  void accumulate(float *sum, const float *part) const {
    const auto n = static_cast<int64_t>(part_.get_desc().get_size() / sizeof(float));
#pragma omp parallel for simd schedule(static) if (n >= kThreadedElements)
    for (int64_t i = 0; i < n; ++i)
      sum[i] += part[i];
  }

  Pass pass_ = Pass::Forward;
  HalfLoops loops_;
  int64_t batch_ = 0, chunk_ = 0, chunks_ = 0;
  std::array<bool, 3> batched_{};
  std::array<int64_t, 3> elements_{}; ///< per image of a batched role, else all
  std::array<Blocked, 3> blocked_{};
  primitive prim_, pool_;                                             ///< pool_: the fused max pool (empty: none)
  std::array<int, 3> args_{};                                         ///< the primitive's argument of each role
  std::vector<dnnl_exec_arg_t> primArgs_, poolArgs_, reorderArgs_[3]; ///< dnnl_util::execute's caches
  memory plain_[3], inner_[3], part_, bias_, scratchpad_;
  memory convDst_, poolScratchpad_; ///< with a fused pool: a chunk of the convolution's result
  primitive toInner_[2], fromInner_;
  std::vector<memory *> held_;   ///< the memories placed in the scratch ...
  std::vector<int64_t> offsets_; ///< ... and where
  int64_t scratchBytes_ = 0;
  bool biasHalf_ = false, yHalf_ = true, residual_ = false, relu_ = false;
  std::string implementation_;
  std::unique_ptr<uint8_t, void (*)(uint8_t *)> owned_{nullptr, nullptr};
};

} // namespace

Support supportsHalfConv(const ir::Op &op) {
  if (op.inInfo(0).dataType() != DataType::FLOAT16) return Support::no("X is not FLOAT16");
  return Support::unless(halfConvSetup(op).whyNot);
}

std::unique_ptr<Kernel> createHalfConv(const ir::Op &op, const KernelContext &context) {
  return std::make_unique<HalfConvKernel>(op, context);
}

} // namespace popart::backend_cpu
