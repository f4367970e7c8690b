// oneDNN kernels of the grad ops, f32 or bf16, on plain buffers: ConvDataGrad
// (convolution_backward_data), ConvWeightGrad (convolution_backward_weights), AveragePoolGrad
// and MaxPoolGrad (pooling_v2_backward; MaxPoolGrad first reruns the forward to get oneDNN's
// workspace). Primitives are made at creation; MaxPoolGrad owns its scratchpads and workspace,
// the others place theirs and their reorder buffers in the step's scratch (Kernel::scratchBytes);
// supports() chooses the primitive descriptors (creating no primitive, throwing nothing) and
// says why it declines.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/dnnl/window.hpp"
#include "backend_cpu/kernel_families.hpp"
#include <popart/error.hpp>

#include <array>
#include <cstdint>
#include <string>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

using dnnl_util::Window;

/// The window of a grad op in oneDNN's terms (dnnl_util::negativePadReason tells whether oneDNN
/// takes it).
Window makeWindow(const ir::Op &op, const Shape &x, const Shape &y, const std::vector<int64_t> &kernel) {
  return dnnl_util::makeWindow(op, x, y, kernel, false);
}

primitive_attr userScratchpad() {
  primitive_attr a;
  a.set_scratchpad_mode(scratchpad_mode::user);
  return a;
}

/// Runs one backward primitive on three roles (or two): input 0, input 1, output 0. A role
/// whose primitive layout differs from the plain buffer goes through an owned buffer in that
/// layout, reordered into before the primitive (inputs) or out of after it (the output).
class BackwardKernel : public Kernel {
public:
  /// The scratchpad and the buffers in the primitive's layouts live in the plan's arena for this
  /// step only (in MobileNet v2's training they were 190 MB of kernel memory, one set per op).
  int64_t scratchBytes() const override { return scratchBytes_; }

  void run(const KernelArgs &args) override {
    auto *base = static_cast<uint8_t *>(args.scratch);
    if (!base && scratchBytes_ > 0) { // outside a plan: memory of the kernel's own, made once
      if (ownScratch_.empty()) ownScratch_.resize(static_cast<size_t>(scratchBytes_ + kAlign));
      auto at = reinterpret_cast<uintptr_t>(ownScratch_.data());
      base = ownScratch_.data() + (kAlign - at % kAlign) % kAlign;
    }
    memory *held[] = {&scratch_, &inner0_, &inner1_, &innerOut_};
    for (size_t i = 0; i < 4; ++i)
      if (offsets_[i] >= 0) held[i]->set_data_handle(base + offsets_[i]);
    in0_.set_data_handle(const_cast<void *>(args.inputs[0]));
    if (twoInputs_) in1_.set_data_handle(const_cast<void *>(args.inputs[1]));
    out_.set_data_handle(args.outputs[0]);
    if (inner0_) dnnl_util::execute(reorder0_, reorderArgs_[0], {{DNNL_ARG_FROM, in0_}, {DNNL_ARG_TO, inner0_}});
    if (inner1_) dnnl_util::execute(reorder1_, reorderArgs_[1], {{DNNL_ARG_FROM, in1_}, {DNNL_ARG_TO, inner1_}});
    const memory &a = inner0_ ? inner0_ : in0_, &b = inner1_ ? inner1_ : in1_, &y = innerOut_ ? innerOut_ : out_;
    if (twoInputs_)
      dnnl_util::execute(prim_, args_, {{arg0_, a}, {arg1_, b}, {argOut_, y}, {DNNL_ARG_SCRATCHPAD, scratch_}});
    else
      dnnl_util::execute(prim_, args_, {{arg0_, a}, {argOut_, y}, {DNNL_ARG_SCRATCHPAD, scratch_}});
    if (innerOut_) dnnl_util::execute(reorderOut_, reorderArgs_[2], {{DNNL_ARG_FROM, innerOut_}, {DNNL_ARG_TO, out_}});
  }

protected:
  /// Sets the primitive, its scratchpad and the memories; \p arg1 < 0 means one input. Each
  /// role's primitive layout is the matching \p chosen desc (null: the plain desc itself).
  void init(primitive prim, const memory::desc &scratchpad, int arg0, const memory::desc &md0, int arg1,
            const memory::desc &md1, int argOut, const memory::desc &mdOut,
            const std::array<memory::desc, 3> &chosen = {}) {
    auto &eng = dnnl_util::engine();
    prim_ = std::move(prim);
    // Each buffer is placed in the step's scratch (run); offsets_ -1: none.
    auto place = [&](memory &m, const memory::desc &desc, size_t slot) {
      m = memory(desc, eng, DNNL_MEMORY_NONE);
      if (desc.get_size() == 0) return;
      offsets_[slot] = scratchBytes_;
      scratchBytes_ += (static_cast<int64_t>(desc.get_size()) + kAlign - 1) / kAlign * kAlign;
    };
    place(scratch_, scratchpad, 0);
    arg0_ = arg0, arg1_ = arg1, argOut_ = argOut;
    twoInputs_ = arg1 >= 0;
    in0_ = memory(md0, eng, DNNL_MEMORY_NONE);
    if (twoInputs_) in1_ = memory(md1, eng, DNNL_MEMORY_NONE);
    out_ = memory(mdOut, eng, DNNL_MEMORY_NONE);
    auto differs = [](const memory::desc &c, const memory::desc &plain) { return c && c != plain; };
    if (differs(chosen[0], md0)) place(inner0_, chosen[0], 1), reorder0_ = dnnl_util::userScratchReorder(in0_, inner0_);
    if (twoInputs_ && differs(chosen[1], md1))
      place(inner1_, chosen[1], 2), reorder1_ = dnnl_util::userScratchReorder(in1_, inner1_);
    if (differs(chosen[2], mdOut))
      place(innerOut_, chosen[2], 3), reorderOut_ = dnnl_util::userScratchReorder(innerOut_, out_);
  }

private:
  primitive prim_, reorder0_, reorder1_, reorderOut_;
  std::vector<dnnl_exec_arg_t> args_, reorderArgs_[3];
  memory in0_, in1_, out_, scratch_, inner0_, inner1_, innerOut_;
  int arg0_ = 0, arg1_ = -1, argOut_ = 0;
  bool twoInputs_ = false;
  static constexpr int64_t kAlign = 64;
  int64_t offsets_[4] = {-1, -1, -1, -1}; ///< of scratch_, inner0_, inner1_, innerOut_ in the scratch
  int64_t scratchBytes_ = 0;
  std::vector<uint8_t> ownScratch_;
};

/// What both conv backward primitives are made from: the window between X (shape \p xs) and dY
/// (\p dys), the descriptors of X, dY and the weights (\p ws), and the forward hint.
struct ConvDescs {
  ConvDescs(const ir::Op &op, const Shape &xs, const Shape &dys, const Shape &ws)
      : win(makeWindow(op, xs, dys, Shape(ws.begin() + 2, ws.end()))),
        x(dnnl_util::plainDesc(xs, xs.size(), dnnl_util::dnnlType(op.inInfo(0)))),
        y(dnnl_util::plainDesc(dys, dys.size(), dnnl_util::dnnlType(op.inInfo(0)))),
        w(dnnl_util::convWeightsDesc(ws, op.attrs.getInt("group", 1), false, dnnl_util::dnnlType(op.inInfo(0)))) {}
  /// The forward convolution both backward primitives take as a hint, on \p x, \p w, \p y;
  /// empty if oneDNN has none.
  convolution_forward::primitive_desc forward(const memory::desc &x, const memory::desc &w,
                                              const memory::desc &y) const {
    if (!dnnl_util::forwardConvolutionValid(x, w, memory::desc(), y, win)) return {};
    convolution_forward::desc d(prop_kind::forward_training, algorithm::convolution_direct, x, w, y, win.strides,
                                win.dilates, win.padL, win.padR);
    return convolution_forward::primitive_desc(d, dnnl_util::engine(), true);
  }
  Window win;
  memory::desc x, y, w;
};

/// ConvDataGrad (\p weights false: convolution_backward_data, dY and W to dX) or ConvWeightGrad
/// (\p weights true: convolution_backward_weights, dY and X to dW).
/// oneDNN picks the layouts (its direct kernels want blocked channels; the kernel reorders from
/// and to the plain buffers), skipping brgconv, which allocates on every execution in 2.6, and
/// falling back to plain layouts where only the reference implementation would take its choice.
/// The backward primitive descriptor of a ConvDataGrad or ConvWeightGrad, chosen without
/// creating a primitive or throwing, or why oneDNN cannot run it.
template <typename Backward> struct ConvGradSetup {
  std::string whyNot; ///< empty: pd is set
  memory::desc x, y, w;
  typename Backward::primitive_desc pd;
};

template <typename Backward, bool weights> ConvGradSetup<Backward> convGradSetup(const ir::Op &op) {
  ConvGradSetup<Backward> s;
  const Shape &in1 = op.inInfo(1).shape(), &out = op.outInfo(0).shape();
  ConvDescs d(op, weights ? in1 : out, op.inInfo(0).shape(), weights ? out : in1);
  s.x = d.x, s.y = d.y, s.w = d.w;
  s.whyNot = dnnl_util::negativePadReason(d.win);
  if (!s.whyNot.empty()) return s;
  auto make = [&](const memory::desc &x, const memory::desc &w, const memory::desc &y) ->
      typename Backward::primitive_desc {
        if (!dnnl_util::backwardConvolutionValid(weights, x, w, y, d.win)) return {};
        auto hint = d.forward(x, w, y);
        if (!hint) return {};
        typename Backward::desc bd(algorithm::convolution_direct, x, w, y, d.win.strides, d.win.dilates, d.win.padL,
                                   d.win.padR);
        typename Backward::primitive_desc pd(bd, userScratchpad(), dnnl_util::engine(), hint, true);
        if (pd) dnnl_util::skipBrgconv(pd);
        return pd;
      };
  auto isRef = [](const typename Backward::primitive_desc &pd) { return !pd || dnnl_util::implIs(pd, "ref"); };
  // Pointwise: on plain layouts oneDNN runs one GEMM per image (no im2col) at the speed of its
  // blocked jit_1x1 kernel, without the reorders of dY, X and the result around it, which
  // took more time than the convolution itself (MobileNet v2 training, batch 8, 224x224).
  auto pd = make(dnnl_util::anyLayout(d.x), dnnl_util::anyLayout(d.w), dnnl_util::anyLayout(d.y));
  if (dnnl_util::pointwiseWeights(weights ? out : in1, op.attrs.getInt("group", 1))) {
    auto plain = make(d.x, d.w, d.y);
    if (!isRef(plain)) pd = plain;
  }
  if (isRef(pd)) pd = make(d.x, d.w, d.y);
  s.pd = pd;
  if (!pd)
    s.whyNot = d.x.data_type() == memory::data_type::f32
                   ? "no oneDNN backward convolution for it"
                   : dnnl_util::noImplementation("backward convolution", d.x.data_type()).reason;
  if (Support impl = dnnl_util::implementationFor(pd, "backward convolution", d.x.data_type()); pd && !impl)
    s.whyNot = impl.reason;
  return s;
}

/// oneDNN picks the layouts (its direct kernels want blocked channels; the kernel reorders from
/// and to the plain buffers), skipping brgconv, which allocates on every execution in 2.6, and
/// falling back to plain layouts where only the reference implementation would take its choice.
template <typename Backward, bool weights> class ConvGradKernel : public BackwardKernel {
public:
  explicit ConvGradKernel(const ir::Op &op) {
    ConvGradSetup<Backward> s = setup(op);
    if (!s.whyNot.empty()) throw ::popart::error(op.debugName(), ": oneDNN backward convolution: ", s.whyNot);
    const auto &pd = s.pd;
    if constexpr (weights)
      init(Backward(pd), pd.scratchpad_desc(), DNNL_ARG_DIFF_DST, s.y, DNNL_ARG_SRC, s.x, DNNL_ARG_DIFF_WEIGHTS, s.w,
           {pd.diff_dst_desc(), pd.src_desc(), pd.diff_weights_desc()});
    else
      init(Backward(pd), pd.scratchpad_desc(), DNNL_ARG_DIFF_DST, s.y, DNNL_ARG_WEIGHTS, s.w, DNNL_ARG_DIFF_SRC, s.x,
           {pd.diff_dst_desc(), pd.weights_desc(), pd.diff_src_desc()});
  }
  static ConvGradSetup<Backward> setup(const ir::Op &op) { return convGradSetup<Backward, weights>(op); }
  static std::string whyNot(const ir::Op &op) { return setup(op).whyNot; }
};

using ConvDataGradKernel = ConvGradKernel<convolution_backward_data, false>;
using ConvWeightGradKernel = ConvGradKernel<convolution_backward_weights, true>;

/// AveragePoolGrad's pooling_v2_backward descriptor, chosen without throwing, or why oneDNN
/// cannot run it.
struct AveragePoolGradSetup {
  std::string whyNot;
  memory::desc mdX, mdY;
  pooling_v2_backward::primitive_desc pd;
};

AveragePoolGradSetup averagePoolGradSetup(const ir::Op &op) {
  AveragePoolGradSetup s;
  const Shape &dy = op.inInfo(0).shape(), &x = op.outInfo(0).shape();
  Window win = makeWindow(op, x, dy, op.attrs.getInts("kernel_shape"));
  bool includePad = op.attrs.getInt("count_include_pad", 0) != 0;
  // A window wholly in the padding: ONNX counts nothing, oneDNN would divide by zero.
  for (size_t i = 0; i < win.padR.size(); ++i)
    if (win.padL[i] >= win.kernel[i] || win.padR[i] >= win.kernel[i]) {
      s.whyNot = "pads as large as the kernel";
      return s;
    }
  s.whyNot = dnnl_util::negativePadReason(win);
  if (s.whyNot.empty()) s.whyNot = dnnl_util::extendPadsForCeilMode(x, dy, includePad, win);
  if (!s.whyNot.empty()) return s;
  algorithm alg = includePad ? algorithm::pooling_avg_include_padding : algorithm::pooling_avg_exclude_padding;
  s.mdX = dnnl_util::plainDesc(op.outInfo(0), x.size());
  s.mdY = dnnl_util::plainDesc(op.inInfo(0), dy.size());
  auto &eng = dnnl_util::engine();
  if (!dnnl_util::poolingValid(prop_kind::forward_training, alg, s.mdX, s.mdY, win, true)) {
    s.whyNot = "oneDNN rejects the window";
    return s;
  }
  pooling_v2_forward::desc fd(prop_kind::forward_training, alg, s.mdX, s.mdY, win.strides, win.kernel, win.dilates,
                              win.padL, win.padR);
  pooling_v2_forward::primitive_desc fpd(fd, eng, true);
  if (fpd) {
    pooling_v2_backward::desc d(alg, s.mdX, s.mdY, win.strides, win.kernel, win.dilates, win.padL, win.padR);
    s.pd = pooling_v2_backward::primitive_desc(d, userScratchpad(), eng, fpd, true);
  }
  if (!s.pd)
    s.whyNot = s.mdX.data_type() == memory::data_type::f32
                   ? "no oneDNN pooling backward for it"
                   : dnnl_util::noImplementation("pooling backward", s.mdX.data_type()).reason;
  if (Support impl = dnnl_util::implementationFor(s.pd, "pooling backward", s.mdX.data_type()); s.pd && !impl)
    s.whyNot = impl.reason;
  return s;
}

class AveragePoolGradKernel : public BackwardKernel {
public:
  explicit AveragePoolGradKernel(const ir::Op &op) {
    AveragePoolGradSetup s = averagePoolGradSetup(op);
    if (!s.whyNot.empty()) throw ::popart::error(op.debugName(), ": oneDNN pooling backward: ", s.whyNot);
    init(pooling_v2_backward(s.pd), s.pd.scratchpad_desc(), DNNL_ARG_DIFF_DST, s.mdY, -1, memory::desc(),
         DNNL_ARG_DIFF_SRC, s.mdX);
  }
  static std::string whyNot(const ir::Op &op) { return averagePoolGradSetup(op).whyNot; }
};

/// MaxPoolGrad: pooling_v2_forward (forward_training) of X into a scratch dst and workspace,
/// then pooling_v2_backward from dY through the workspace. oneDNN takes the first maximum in
/// window order, as our MaxPool does (the tests check ties on its jit, simple_nchw and ref
/// implementations); they may differ only on NaN and -inf inputs (a window whose first tap is
/// NaN, or that holds only -inf), which this kernel does not look for.
/// MaxPoolGrad's forward and backward descriptors, chosen without throwing, or why oneDNN
/// cannot run it.
struct MaxPoolGradSetup {
  std::string whyNot;
  memory::desc mdX, mdY;
  pooling_v2_forward::primitive_desc fpd;
  pooling_v2_backward::primitive_desc bpd;
};

MaxPoolGradSetup maxPoolGradSetup(const ir::Op &op) {
  MaxPoolGradSetup s;
  const Shape &x = op.inInfo(0).shape(), &dy = op.inInfo(1).shape();
  Window win = makeWindow(op, x, dy, op.attrs.getInts("kernel_shape"));
  s.whyNot = dnnl_util::negativePadReason(win);
  if (!s.whyNot.empty()) return s;
  for (size_t i = 0; i < win.padR.size(); ++i) {
    int64_t in = x[i + 2], out = dy[i + 2], d = win.dilates[i] + 1, dk = (win.kernel[i] - 1) * d + 1;
    // A window with no tap inside the input takes nothing in ONNX; oneDNN would pick a tap.
    for (int64_t o = 0; o < out; ++o) {
      int64_t base = o * win.strides[i] - win.padL[i];
      bool hit = false;
      for (int64_t j = 0; j < win.kernel[i] && !hit; ++j)
        hit = base + j * d >= 0 && base + j * d < in;
      if (!hit) {
        s.whyNot = "a window wholly in the padding";
        return s;
      }
    }
    // ceil_mode: extend the end padding so that oneDNN's floor formula gives the ceil size
    // (the padding is -inf to both).
    if ((in + win.padL[i] + win.padR[i] - dk) / win.strides[i] + 1 != out)
      win.padR[i] = (out - 1) * win.strides[i] + dk - in - win.padL[i];
  }
  s.mdX = dnnl_util::plainDesc(op.inInfo(0), x.size());
  s.mdY = dnnl_util::plainDesc(op.inInfo(1), dy.size());
  auto &eng = dnnl_util::engine();
  if (!dnnl_util::poolingValid(prop_kind::forward_training, algorithm::pooling_max, s.mdX, s.mdY, win, true)) {
    s.whyNot = "oneDNN rejects the window";
    return s;
  }
  pooling_v2_forward::desc fd(prop_kind::forward_training, algorithm::pooling_max, s.mdX, s.mdY, win.strides,
                              win.kernel, win.dilates, win.padL, win.padR);
  s.fpd = pooling_v2_forward::primitive_desc(fd, userScratchpad(), eng, true);
  if (s.fpd) {
    pooling_v2_backward::desc bd(algorithm::pooling_max, s.mdX, s.mdY, win.strides, win.kernel, win.dilates, win.padL,
                                 win.padR);
    s.bpd = pooling_v2_backward::primitive_desc(bd, userScratchpad(), eng, s.fpd, true);
  }
  if (!s.bpd)
    s.whyNot = s.mdX.data_type() == memory::data_type::f32
                   ? "no oneDNN max pooling backward for it"
                   : dnnl_util::noImplementation("max pooling backward", s.mdX.data_type()).reason;
  else if (s.fpd.dst_desc() != s.mdY || s.bpd.diff_src_desc() != s.mdX || s.bpd.diff_dst_desc() != s.mdY ||
           s.bpd.workspace_desc() != s.fpd.workspace_desc())
    s.whyNot = "oneDNN chose other layouts";
  else if (Support impl = dnnl_util::implementationFor(s.bpd, "max pooling backward", s.mdX.data_type()); !impl)
    s.whyNot = impl.reason;
  return s;
}

class MaxPoolGradKernel : public Kernel {
public:
  explicit MaxPoolGradKernel(const ir::Op &op) {
    MaxPoolGradSetup s = maxPoolGradSetup(op);
    if (!s.whyNot.empty()) throw ::popart::error(op.debugName(), ": oneDNN max pooling backward: ", s.whyNot);
    auto &eng = dnnl_util::engine();
    const auto &fpd = s.fpd;
    const auto &bpd = s.bpd;
    fwd_ = pooling_v2_forward(fpd);
    bwd_ = pooling_v2_backward(bpd);
    // Owned buffers, allocated now.
    fwdScratch_ = memory(fpd.scratchpad_desc(), eng);
    bwdScratch_ = memory(bpd.scratchpad_desc(), eng);
    y_ = memory(fpd.dst_desc(), eng);
    ws_ = memory(fpd.workspace_desc(), eng);
    x_ = memory(s.mdX, eng, DNNL_MEMORY_NONE);
    dy_ = memory(s.mdY, eng, DNNL_MEMORY_NONE);
    dx_ = memory(s.mdX, eng, DNNL_MEMORY_NONE);
  }
  static std::string whyNot(const ir::Op &op) { return maxPoolGradSetup(op).whyNot; }
  void run(const KernelArgs &args) override {
    x_.set_data_handle(const_cast<void *>(args.inputs[0]));
    dy_.set_data_handle(const_cast<void *>(args.inputs[1]));
    dx_.set_data_handle(args.outputs[0]);
    dnnl_util::execute(
        fwd_, fwdArgs_,
        {{DNNL_ARG_SRC, x_}, {DNNL_ARG_DST, y_}, {DNNL_ARG_WORKSPACE, ws_}, {DNNL_ARG_SCRATCHPAD, fwdScratch_}});
    dnnl_util::execute(bwd_, bwdArgs_,
                       {{DNNL_ARG_DIFF_DST, dy_},
                        {DNNL_ARG_WORKSPACE, ws_},
                        {DNNL_ARG_DIFF_SRC, dx_},
                        {DNNL_ARG_SCRATCHPAD, bwdScratch_}});
  }

private:
  primitive fwd_, bwd_;
  std::vector<dnnl_exec_arg_t> fwdArgs_, bwdArgs_;
  memory x_, dy_, dx_, y_, ws_, fwdScratch_, bwdScratch_;
};

bool shapesOk(const ir::Op &op) {
  int64_t r = op.outInfo(0).rank();
  if (r < 3 || r > 5 || op.outInfo(0).elementCount() == 0) return false;
  for (size_t i = 0; i < op.inputCount(); ++i)
    if (op.inInfo(i).elementCount() == 0) return false;
  return true;
}

/// Whether oneDNN runs \p K for \p op: one type (f32, or bf16 where it has more than its
/// reference code), spatial rank 1-3, and descriptors it has.
template <typename K> Support supports(const ir::Op &op) {
  if (std::string why = dnnl_util::notOneFloatType(op); !why.empty()) return Support::no(why);
  if (!shapesOk(op)) return Support::no("spatial rank other than 1-3, or an empty tensor");
  return Support::unless(K::whyNot(op));
}

Support supportsWeightGrad(const ir::Op &op) {
  if (depthwiseWeightGrad(op)) return Support::no("depthwise: the fast kernel is faster");
  return supports<ConvWeightGradKernel>(op);
}

} // namespace

void registerDnnlConvGradKernels(KernelRegistry &r) {
  r.add({"ai.graphcore", "ConvDataGrad", KernelProvider::Dnnl, halfConvOr<supports<ConvDataGradKernel>>,
         makeHalfConvOr<makeKernel<ConvDataGradKernel>>});
  r.add({"ai.graphcore", "ConvWeightGrad", KernelProvider::Dnnl, halfConvOr<supportsWeightGrad>,
         makeHalfConvOr<makeKernel<ConvWeightGradKernel>>});
  r.add({"ai.graphcore", "AveragePoolGrad", KernelProvider::Dnnl, supports<AveragePoolGradKernel>,
         makeKernel<AveragePoolGradKernel>});
  r.add({"ai.graphcore", "MaxPoolGrad", KernelProvider::Dnnl,
         [](const ir::Op &op) {
           // Tiling windows: the fast family's vectorised kernel is one pass, without rerunning
           // the forward; a fused Relu gradient only it and the reference apply.
           if (tiledMaxPoolGrad(op)) return Support::no("tiling windows: the fast kernel's one pass is faster");
           if (op.fusion.activated()) return Support::no("a fused Relu gradient");
           return supports<MaxPoolGradKernel>(op);
         },
         makeKernel<MaxPoolGradKernel>});
}

} // namespace popart::backend_cpu
