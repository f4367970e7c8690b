// oneDNN kernels of LSTM, GRU and RNN (f32) and of their grad ops: lstm_forward / lstm_backward,
// gru_* (linear_before_reset = 0), lbr_gru_* (linear_before_reset = 1) and vanilla_rnn_* (Tanh),
// one layer, both directions at once (bidirectional_concat). In training the forward kernel runs
// forward_training into the op's saved state (ir::saveRecurrentState) and the grad kernel only
// the backward primitive; without a saved state that the oneDNN forward wrote, the grad kernel
// runs forward_training itself first (autodiff/rules_rnn.cpp says why).
//
// ONNX and oneDNN differ in three ways that the kernels bridge:
//  - gate order: ONNX LSTM has i, o, f, c and oneDNN i, f, c~, o; GRU z, r, h is oneDNN's u, r, o
//    (same order). W [dirs, gates·H, I] is oneDNN's ldgoi once the gates are in oneDNN's order;
//    the kernel permutes them into its own buffer and reorders that into the primitive's layout,
//    once for constant weights (inference), every run otherwise;
//  - biases: ONNX keeps Wb and Rb apart, oneDNN adds them (one bias per gate), except the
//    linear-before-reset GRU, whose fourth oneDNN gate is the Rb_h inside r ⊙ (R_h h + Rb_h);
//  - layouts: Y [T, dirs, N, H] against oneDNN's [T, N, dirs·H], and layout = 1 (batch first) for
//    X, Y and the states: the kernel copies through buffers of its own where they differ (Y of
//    one direction and layout 0, X and the states of layout 0 are used in place).
// supports() chooses the primitive descriptors (creating no primitive, throwing nothing) and says
// why it declines.

#include "ir/ops/rnn.hpp"
#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/kernel_families.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <array>
#include <cstring>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;
using tag = memory::format_tag;

enum class Cell { Lstm, Gru, LbrGru, Rnn };

struct Geometry {
  Cell cell = Cell::Lstm;
  int64_t T = 0, N = 0, I = 0, H = 0, D = 1;
  int64_t gates = 4;     ///< ONNX (and oneDNN weight) gates
  int64_t biasGates = 4; ///< oneDNN bias gates (the LBR GRU has one more)
  bool batchFirst = false;
  rnn_direction direction = rnn_direction::unidirectional_left2right;
  /// ONNX gate of oneDNN gate k.
  std::array<int64_t, 4> onnxGate{0, 1, 2, 3};
};

Geometry geometryOf(const ir::Op &op) {
  Geometry g;
  std::string type = op.type.substr(0, op.type.size() - (op.domain == "ai.graphcore" ? 4 : 0));
  bool lbr = op.attrs.getInt("linear_before_reset", 0) != 0;
  g.cell = type == "LSTM" ? Cell::Lstm : type == "GRU" ? (lbr ? Cell::LbrGru : Cell::Gru) : Cell::Rnn;
  const Shape &x = op.inInfo(0).shape();
  g.batchFirst = op.attrs.getInt("layout", 0) != 0;
  g.T = g.batchFirst ? x[1] : x[0];
  g.N = g.batchFirst ? x[0] : x[1];
  g.I = x[2];
  g.H = op.inInfo(2).dim(2);
  std::string dir = op.attrs.getString("direction", "forward");
  g.D = dir == "bidirectional" ? 2 : 1;
  g.direction = dir == "bidirectional" ? rnn_direction::bidirectional_concat
                : dir == "reverse"     ? rnn_direction::unidirectional_right2left
                                       : rnn_direction::unidirectional_left2right;
  g.gates = g.cell == Cell::Lstm ? 4 : g.cell == Cell::Rnn ? 1 : 3;
  g.biasGates = g.cell == Cell::LbrGru ? 4 : g.gates;
  if (g.cell == Cell::Lstm) g.onnxGate = {0, 2, 3, 1};
  return g;
}

/// What the oneDNN cells compute: default activations, no clip, input_forget, peepholes or
/// sequence lengths other than a constant full length.
bool plainCell(const ir::Op &op) {
  bool grad = op.domain == "ai.graphcore";
  for (size_t i = 0; i < std::min<size_t>(op.inputCount(), 9); ++i) // the grad op's input 9: its saved state
    if (op.hasInput(i) && (grad || i != 4) && op.inInfo(i).dataType() != DataType::FLOAT) return false;
  if (op.attrs.has("clip") || op.attrs.has("activation_alpha") || op.attrs.has("activation_beta")) return false;
  if (op.attrs.getInt("input_forget", 0) != 0) return false;
  bool lstm = op.type.rfind("LSTM", 0) == 0, gru = op.type.rfind("GRU", 0) == 0;
  if (op.attrs.has("activations")) {
    std::vector<std::string> want = lstm  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                    : gru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                          : std::vector<std::string>{"Tanh"};
    std::vector<std::string> given = op.attrs.getStrings("activations");
    for (size_t i = 0; i < given.size(); ++i)
      if (given[i] != want[i % want.size()]) return false;
  }
  if (op.domain != "ai.graphcore") {
    if (lstm && op.hasInput(7)) return false;
    if (op.hasInput(4)) {
      const ir::Tensor &lens = op.input(4);
      if (!lens.isConst()) return false;
      Geometry g = geometryOf(op);
      for (int64_t v : lens.data()->toInt64Vector())
        if (v != g.T) return false;
    }
  }
  return op.inInfo(0).elementCount() > 0;
}

/// Whether the weights of \p op are constants (inference: packed once in oneDNN's layout).
bool constWeights(const ir::Op &op) {
  return op.input(1).isConst() && op.input(2).isConst() && (!op.hasInput(3) || op.input(3).isConst());
}

memory::desc f32(const memory::dims &dims, tag t) { return memory::desc(dims, memory::data_type::f32, t); }

/// The memory descriptors of one layer in oneDNN's terms (weights left to the primitive).
struct Descs {
  memory::desc srcLayer, srcIter, srcIterC, weightsLayer, weightsIter, bias, dstLayer, dstIter, dstIterC;
  memory::desc userWeightsLayer, userWeightsIter, plainWeightsLayer, plainWeightsIter, anyWeightsLayer, anyWeightsIter;
};

/// \p packed: the forward's weights in the layout oneDNN prefers (packed for its gemm), which
/// costs a reorder whenever they change; else ldigo, which the kernel writes from ONNX's directly.
Descs descsOf(const Geometry &g, bool packed) {
  Descs d;
  d.srcLayer = f32({g.T, g.N, g.I}, tag::tnc);
  d.srcIter = f32({1, g.D, g.N, g.H}, tag::ldnc);
  d.srcIterC = g.cell == Cell::Lstm ? d.srcIter : memory::desc();
  d.anyWeightsLayer = f32({1, g.D, g.I, g.gates, g.H}, tag::any);
  d.anyWeightsIter = f32({1, g.D, g.H, g.gates, g.H}, tag::any);
  d.userWeightsLayer = f32({1, g.D, g.I, g.gates, g.H}, tag::ldgoi);
  d.userWeightsIter = f32({1, g.D, g.H, g.gates, g.H}, tag::ldgoi);
  d.plainWeightsLayer = f32({1, g.D, g.I, g.gates, g.H}, tag::ldigo);
  d.plainWeightsIter = f32({1, g.D, g.H, g.gates, g.H}, tag::ldigo);
  d.weightsLayer = packed ? d.anyWeightsLayer : d.plainWeightsLayer;
  d.weightsIter = packed ? d.anyWeightsIter : d.plainWeightsIter;
  d.bias = f32({1, g.D, g.biasGates, g.H}, tag::ldgo);
  d.dstLayer = f32({g.T, g.N, g.D * g.H}, tag::tnc);
  d.dstIter = d.srcIter;
  d.dstIterC = d.srcIterC;
  return d;
}

primitive_attr userScratchpad() {
  primitive_attr a;
  a.set_scratchpad_mode(scratchpad_mode::user);
  return a;
}

/// The forward primitive descriptor (\p training: forward_training, with a workspace) and, with
/// \p backward, the backward one; empty where oneDNN has no implementation (nothing throws).
std::pair<rnn_primitive_desc_base, rnn_primitive_desc_base> makePds(const Geometry &g, const Descs &d, bool training,
                                                                    bool backward) {
  auto &eng = dnnl_util::engine();
  prop_kind prop = training ? prop_kind::forward_training : prop_kind::forward_inference;
  primitive_attr attr = userScratchpad();
  // Backward: diff tensors plain (oneDNN 2.6 takes diff weights as ldigo only).
  const memory::desc &dwl = d.plainWeightsLayer, &dwi = d.plainWeightsIter;
  switch (g.cell) {
  case Cell::Lstm: {
    lstm_forward::primitive_desc f(lstm_forward::desc(prop, g.direction, d.srcLayer, d.srcIter, d.srcIterC,
                                                      d.weightsLayer, d.weightsIter, d.bias, d.dstLayer, d.dstIter,
                                                      d.dstIterC),
                                   attr, eng, true);
    if (!f || !backward) return {f, {}};
    lstm_backward::primitive_desc b(
        lstm_backward::desc(prop_kind::backward, g.direction, d.srcLayer, d.srcIter, d.srcIterC, d.anyWeightsLayer,
                            d.anyWeightsIter, d.bias, d.dstLayer, d.dstIter, d.dstIterC, d.srcLayer, d.srcIter,
                            d.srcIterC, dwl, dwi, d.bias, d.dstLayer, d.dstIter, d.dstIterC),
        attr, eng, f, true);
    return {f, b};
  }
  case Cell::Gru: {
    gru_forward::primitive_desc f(gru_forward::desc(prop, g.direction, d.srcLayer, d.srcIter, d.weightsLayer,
                                                    d.weightsIter, d.bias, d.dstLayer, d.dstIter),
                                  attr, eng, true);
    if (!f || !backward) return {f, {}};
    gru_backward::primitive_desc b(gru_backward::desc(prop_kind::backward, g.direction, d.srcLayer, d.srcIter,
                                                      d.anyWeightsLayer, d.anyWeightsIter, d.bias, d.dstLayer,
                                                      d.dstIter, d.srcLayer, d.srcIter, dwl, dwi, d.bias, d.dstLayer,
                                                      d.dstIter),
                                   attr, eng, f, true);
    return {f, b};
  }
  case Cell::LbrGru: {
    lbr_gru_forward::primitive_desc f(lbr_gru_forward::desc(prop, g.direction, d.srcLayer, d.srcIter, d.weightsLayer,
                                                            d.weightsIter, d.bias, d.dstLayer, d.dstIter),
                                      attr, eng, true);
    if (!f || !backward) return {f, {}};
    lbr_gru_backward::primitive_desc b(lbr_gru_backward::desc(prop_kind::backward, g.direction, d.srcLayer, d.srcIter,
                                                              d.anyWeightsLayer, d.anyWeightsIter, d.bias, d.dstLayer,
                                                              d.dstIter, d.srcLayer, d.srcIter, dwl, dwi, d.bias,
                                                              d.dstLayer, d.dstIter),
                                       attr, eng, f, true);
    return {f, b};
  }
  case Cell::Rnn: {
    vanilla_rnn_forward::primitive_desc f(vanilla_rnn_forward::desc(prop, algorithm::eltwise_tanh, g.direction,
                                                                    d.srcLayer, d.srcIter, d.weightsLayer,
                                                                    d.weightsIter, d.bias, d.dstLayer, d.dstIter),
                                          attr, eng, true);
    if (!f || !backward) return {f, {}};
    vanilla_rnn_backward::primitive_desc b(
        vanilla_rnn_backward::desc(prop_kind::backward, algorithm::eltwise_tanh, g.direction, d.srcLayer, d.srcIter,
                                   d.anyWeightsLayer, d.anyWeightsIter, d.bias, d.dstLayer, d.dstIter, d.srcLayer,
                                   d.srcIter, dwl, dwi, d.bias, d.dstLayer, d.dstIter),
        attr, eng, f, true);
    return {f, b};
  }
  }
  throw ::popart::error("unknown recurrent cell");
}

/// A reorder into a primitive's weight layout (a packed one may need a scratchpad: its own).
struct WeightReorder {
  reorder prim;
  memory scratch;
  std::vector<dnnl_exec_arg_t> args;
  explicit operator bool() const { return static_cast<bool>(prim); }
  void init(const memory &from, const memory &to) {
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    reorder::primitive_desc pd(from, to, attr);
    prim = reorder(pd);
    scratch = memory(pd.scratchpad_desc(), dnnl_util::engine());
  }
  void run(const memory &from, const memory &to) {
    dnnl_util::execute(prim, args, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}, {DNNL_ARG_SCRATCHPAD, scratch}});
  }
};

/// Memory of the kernel's own for \p md.
memory owned(const memory::desc &md) {
  memory m(md, dnnl_util::engine());
  if (md.get_size() > 0) std::memset(m.get_data_handle(), 0, md.get_size());
  return m;
}

/// The saved state of a recurrent op (ir::saveRecurrentState) as the oneDNN kernels use it:
/// a header, oneDNN's workspace, and the two forward results the backward reads besides it
/// (dst_layer in oneDNN's layout and, for LSTM, dst_iter_c), each at a 64-byte offset.
struct SavedLayout {
  int64_t wsBytes = 0, wsOffset = 64, dstOffset = 0, cOffset = 0, total = 0;
};
constexpr uint64_t kSavedMagic = 0x6c6e6e726e6e6464ULL; // written by the oneDNN forward only

int64_t round64(int64_t v) { return (v + 63) / 64 * 64; }

SavedLayout savedLayout(const Geometry &g, const rnn_primitive_desc_base &fwdTraining) {
  SavedLayout s;
  s.wsBytes = static_cast<int64_t>(fwdTraining.workspace_desc().get_size());
  s.dstOffset = s.wsOffset + round64(s.wsBytes);
  s.cOffset = s.dstOffset + round64(4 * g.T * g.N * g.D * g.H);
  s.total = s.cOffset + (g.cell == Cell::Lstm ? round64(4 * g.D * g.N * g.H) : 0);
  return s;
}

/// What both kernels share: geometry, descriptors, the weights and bias in oneDNN's order and
/// layouts, and the copies between ONNX's layouts and oneDNN's.
class RecurrentBase : public Kernel {
protected:
  RecurrentBase(const ir::Op &op, bool backward, bool training)
      : g_(geometryOf(op)), constWeights_(constWeights(op)), d_(descsOf(g_, constWeights_ && !backward && !training)) {
    auto [f, b] = makePds(g_, d_, training || backward, backward);
    saved_ = savedLayout(g_, f);
    fwdPd_ = f;
    bwdPd_ = b;
    fwd_ = primitive(fwdPd_);
    if (backward) bwd_ = primitive(bwdPd_);
    size_t scratch = fwdPd_.scratchpad_desc().get_size();
    if (backward) scratch = std::max(scratch, bwdPd_.scratchpad_desc().get_size());
    scratch_ =
        memory(f32({static_cast<memory::dim>((scratch + 3) / 4 + 1)}, tag::a), dnnl_util::engine(), DNNL_MEMORY_NONE);
    userWl_ = owned(d_.userWeightsLayer);
    userWi_ = owned(d_.userWeightsIter);
    bias_ = owned(d_.bias);
    directFwd_ =
        fwdPd_.weights_layer_desc() == d_.plainWeightsLayer && fwdPd_.weights_iter_desc() == d_.plainWeightsIter;
    if (directFwd_) {
      fwdWl_ = owned(d_.plainWeightsLayer);
      fwdWi_ = owned(d_.plainWeightsIter);
    } else {
      initWeights(fwdWl_, fwdWi_, reorderFwdWl_, reorderFwdWi_, fwdPd_);
    }
    if (backward) initWeights(bwdWl_, bwdWi_, reorderBwdWl_, reorderBwdWi_, bwdPd_);
    xLayer_ = memory(d_.srcLayer, dnnl_util::engine(), DNNL_MEMORY_NONE);
    if (g_.batchFirst) xCopy_ = owned(d_.srcLayer);
  }

  void initWeights(memory &wl, memory &wi, WeightReorder &rl, WeightReorder &ri, const rnn_primitive_desc_base &pd) {
    wl = userWl_;
    wi = userWi_;
    if (pd.weights_layer_desc() != d_.userWeightsLayer) {
      wl = owned(pd.weights_layer_desc());
      rl.init(userWl_, wl);
    }
    if (pd.weights_iter_desc() != d_.userWeightsIter) {
      wi = owned(pd.weights_iter_desc());
      ri.init(userWi_, wi);
    }
  }

  /// oneDNN's scratchpads (43 MB for a training LSTM of hidden 256 over 64 steps of 32) live in
  /// the plan's arena for this step only, shared with the other steps' dead tensors.
  int64_t scratchBytes() const override { return static_cast<int64_t>(scratch_.get_desc().get_size()); }

  /// Points the scratchpad at the plan's scratch, or outside a plan at memory of the kernel's own
  /// (made on the first such run).
  void bindScratch(const KernelArgs &a) {
    void *p = a.scratch;
    if (!p) {
      if (!ownScratch_) ownScratch_ = memory(scratch_.get_desc(), dnnl_util::engine());
      p = ownScratch_.get_data_handle();
    }
    scratch_.set_data_handle(p);
  }

  /// Permutes W, R (gates into oneDNN's order) and the biases into the kernel's buffers and
  /// reorders the weights into the primitives' layouts (the forward's unless \p forward is false
  /// and the weights are not constant); skipped for constant weights already done.
  void prepareWeights(const KernelArgs &a, bool backward, bool forward = true) {
    if (constWeights_ && preparedFrom_ == a.inputs[1]) return;
    forward = forward || constWeights_;
    const float *w = a.in<float>(1), *r = a.in<float>(2), *b = a.hasInput(3) ? a.in<float>(3) : nullptr;
    float *uwl = static_cast<float *>(userWl_.get_data_handle()),
          *uwi = static_cast<float *>(userWi_.get_data_handle());
    int64_t G = g_.gates, H = g_.H;
    if (!directFwd_ || backward)
      for (int64_t d = 0; d < g_.D; ++d)
        for (int64_t k = 0; k < G; ++k) {
          int64_t q = g_.onnxGate[static_cast<size_t>(k)];
          std::memcpy(uwl + (d * G + k) * H * g_.I, w + (d * G + q) * H * g_.I, sizeof(float) * H * g_.I);
          std::memcpy(uwi + (d * G + k) * H * H, r + (d * G + q) * H * H, sizeof(float) * H * H);
        }
    if (directFwd_ && forward) {
      // ONNX [D, G·H, in] -> ldigo [D, in, G, H], gates into oneDNN's order.
      auto ldigo = [&](const float *from, int64_t in, float *to) {
        for (int64_t d = 0; d < g_.D; ++d)
          for (int64_t k = 0; k < G; ++k) {
            int64_t q = g_.onnxGate[static_cast<size_t>(k)];
            for (int64_t h = 0; h < H; ++h) {
              const float *row = from + ((d * G + q) * H + h) * in;
              float *col = to + (d * in * G + k) * H + h;
              for (int64_t i = 0; i < in; ++i)
                col[i * G * H] = row[i];
            }
          }
      };
      ldigo(w, g_.I, static_cast<float *>(fwdWl_.get_data_handle()));
      ldigo(r, g_.H, static_cast<float *>(fwdWi_.get_data_handle()));
    }
    float *bias = static_cast<float *>(bias_.get_data_handle());
    for (int64_t d = 0; d < g_.D; ++d) {
      const float *wb = b ? b + d * 2 * G * H : nullptr, *rb = wb ? wb + G * H : nullptr;
      float *bd = bias + d * g_.biasGates * H;
      for (int64_t k = 0; k < G; ++k) {
        int64_t q = g_.onnxGate[static_cast<size_t>(k)];
        bool lbrHidden = g_.cell == Cell::LbrGru && k == 2;
        for (int64_t j = 0; j < H; ++j)
          bd[k * H + j] = wb ? wb[q * H + j] + (lbrHidden ? 0.f : rb[q * H + j]) : 0.f;
      }
      if (g_.cell == Cell::LbrGru)
        for (int64_t j = 0; j < H; ++j)
          bd[3 * H + j] = rb ? rb[2 * H + j] : 0.f;
    }
    if (reorderFwdWl_ && forward) reorderFwdWl_.run(userWl_, fwdWl_);
    if (reorderFwdWi_ && forward) reorderFwdWi_.run(userWi_, fwdWi_);
    if (backward) {
      if (reorderBwdWl_) reorderBwdWl_.run(userWl_, bwdWl_);
      if (reorderBwdWi_) reorderBwdWi_.run(userWi_, bwdWi_);
    }
    preparedFrom_ = a.inputs[1];
  }

  /// X as oneDNN's [T, N, I]: the input itself (layout 0) or a transposed copy.
  void prepareX(const KernelArgs &a) {
    const float *x = a.in<float>(0);
    if (!g_.batchFirst) {
      xLayer_.set_data_handle(const_cast<float *>(x));
      return;
    }
    float *to = static_cast<float *>(xCopy_.get_data_handle());
    for (int64_t n = 0; n < g_.N; ++n)
      for (int64_t t = 0; t < g_.T; ++t)
        std::memcpy(to + (t * g_.N + n) * g_.I, x + (n * g_.T + t) * g_.I, sizeof(float) * g_.I);
    xLayer_.set_data_handle(xCopy_.get_data_handle());
  }

  /// Copies a state between ONNX's layout (\p onnx; [N, D, H] if batch first) and oneDNN's
  /// [D, N, H] (\p dnnl), in the direction \p toDnnl.
  void copyState(float *onnx, float *dnnlState, bool toDnnl) const {
    int64_t H = g_.H;
    for (int64_t d = 0; d < g_.D; ++d)
      for (int64_t n = 0; n < g_.N; ++n) {
        float *o = onnx + (n * g_.D + d) * H, *p = dnnlState + (d * g_.N + n) * H;
        std::memcpy(toDnnl ? p : o, toDnnl ? o : p, sizeof(float) * H);
      }
  }

  /// Copies between ONNX's Y ([T, D, N, H] or [N, T, D, H]) and oneDNN's [T, N, D·H].
  void copySequence(float *onnx, float *dnnlSeq, bool toDnnl) const {
    int64_t H = g_.H;
    for (int64_t t = 0; t < g_.T; ++t)
      for (int64_t d = 0; d < g_.D; ++d)
        for (int64_t n = 0; n < g_.N; ++n) {
          float *o = onnx + (g_.batchFirst ? ((n * g_.T + t) * g_.D + d) * H : ((t * g_.D + d) * g_.N + n) * H);
          float *p = dnnlSeq + (t * g_.N + n) * g_.D * H + d * H;
          std::memcpy(toDnnl ? p : o, toDnnl ? o : p, sizeof(float) * H);
        }
  }

  /// Whether a sequence tensor (Y, dY) is oneDNN's layout as it is.
  bool sequenceInPlace() const { return g_.D == 1 && !g_.batchFirst; }

  /// Whether the saved state at \p p holds what this kernel's forward_training wrote.
  bool savedValid(const void *p) const {
    const auto *h = static_cast<const uint64_t *>(p);
    return h[0] == kSavedMagic && h[1] == static_cast<uint64_t>(saved_.wsBytes) &&
           h[2] == static_cast<uint64_t>(saved_.total);
  }
  void markSaved(void *p) const {
    auto *h = static_cast<uint64_t *>(p);
    h[0] = kSavedMagic;
    h[1] = static_cast<uint64_t>(saved_.wsBytes);
    h[2] = static_cast<uint64_t>(saved_.total);
  }

  Geometry g_;
  bool constWeights_ = false;
  Descs d_;
  SavedLayout saved_;
  rnn_primitive_desc_base fwdPd_, bwdPd_;
  primitive fwd_, bwd_;
  memory scratch_, ownScratch_, userWl_, userWi_, bias_, fwdWl_, fwdWi_, bwdWl_, bwdWi_, xLayer_, xCopy_;
  WeightReorder reorderFwdWl_, reorderFwdWi_, reorderBwdWl_, reorderBwdWi_;
  bool directFwd_ = false; ///< the forward reads ldigo weights that prepareWeights writes itself
  const void *preparedFrom_ = nullptr;
};

/// Runs \p prim with the arguments in \p args (built once, their memories re-pointed per run).
void runPrimitive(const primitive &prim, const std::vector<std::pair<int, memory *>> &args,
                  std::vector<dnnl_exec_arg_t> &cache) {
  if (cache.empty())
    for (const auto &[arg, mem] : args)
      cache.push_back({arg, mem->get()});
  dnnl::error::wrap_c_api(
      dnnl_primitive_execute(prim.get(), dnnl_util::stream().get(), static_cast<int>(cache.size()), cache.data()),
      "could not execute a recurrent primitive");
  dnnl_util::stream().wait();
}

/// LSTM, GRU, RNN forward: X, W, R, B, -, initial_h, initial_c -> Y, Y_h, Y_c [, saved state].
/// With a saved-state output it runs forward_training and keeps the workspace, dst_layer and
/// dst_iter_c there for the grad kernel; else forward_inference.
class RecurrentKernel : public RecurrentBase {
public:
  explicit RecurrentKernel(const ir::Op &op)
      : RecurrentBase(op, false, op.hasOutput(ir::recurrentSavedOutput(op))), savedIndex_(ir::recurrentSavedOutput(op)),
        keep_(op.hasOutput(savedIndex_)) {
    lstm_ = g_.cell == Cell::Lstm;
    if (keep_ && op.outInfo(savedIndex_).elementCount() != saved_.total)
      throw ::popart::error(op.debugName(), ": the saved state has ", op.outInfo(savedIndex_).elementCount(),
                            " bytes, oneDNN's forward keeps ", saved_.total);
    auto &eng = dnnl_util::engine();
    h0_ = owned(d_.srcIter);
    h0Zero_ = owned(d_.srcIter);
    hN_ = owned(d_.dstIter);
    if (lstm_) {
      c0_ = owned(d_.srcIterC);
      c0Zero_ = owned(d_.srcIterC);
      cN_ = owned(d_.dstIterC);
    }
    y_ = memory(d_.dstLayer, eng, DNNL_MEMORY_NONE);
    yCopy_ = owned(d_.dstLayer);
    h0Arg_ = memory(d_.srcIter, eng, DNNL_MEMORY_NONE);
    hNArg_ = memory(d_.dstIter, eng, DNNL_MEMORY_NONE);
    if (keep_) ws_ = memory(fwdPd_.workspace_desc(), eng, DNNL_MEMORY_NONE);
    std::vector<std::pair<int, memory *>> args{{DNNL_ARG_SRC_LAYER, &xLayer_},    {DNNL_ARG_SRC_ITER, &h0Arg_},
                                               {DNNL_ARG_WEIGHTS_LAYER, &fwdWl_}, {DNNL_ARG_WEIGHTS_ITER, &fwdWi_},
                                               {DNNL_ARG_BIAS, &bias_},           {DNNL_ARG_DST_LAYER, &y_},
                                               {DNNL_ARG_DST_ITER, &hNArg_},      {DNNL_ARG_SCRATCHPAD, &scratch_}};
    if (lstm_) {
      c0Arg_ = memory(d_.srcIterC, eng, DNNL_MEMORY_NONE);
      cNArg_ = memory(d_.dstIterC, eng, DNNL_MEMORY_NONE);
      args.push_back({DNNL_ARG_SRC_ITER_C, &c0Arg_});
      args.push_back({DNNL_ARG_DST_ITER_C, &cNArg_});
    }
    if (keep_) args.push_back({DNNL_ARG_WORKSPACE, &ws_});
    args_ = std::move(args);
  }

  void run(const KernelArgs &a) override {
    bindScratch(a);
    prepareWeights(a, false);
    prepareX(a);
    // Initial states: the inputs (layout 0), copies (layout 1) or zeros.
    auto initial = [&](size_t input, memory &arg, memory &copy, memory &zero) {
      if (!a.hasInput(input)) {
        arg.set_data_handle(zero.get_data_handle());
      } else if (!g_.batchFirst) {
        arg.set_data_handle(const_cast<void *>(a.inputs[input]));
      } else {
        copyState(const_cast<float *>(a.in<float>(input)), static_cast<float *>(copy.get_data_handle()), true);
        arg.set_data_handle(copy.get_data_handle());
      }
    };
    initial(5, h0Arg_, h0_, h0Zero_);
    if (lstm_) initial(6, c0Arg_, c0_, c0Zero_);
    char *saved = keep_ ? static_cast<char *>(a.outputs[savedIndex_]) : nullptr;
    // dst_layer and dst_iter_c go where the grad kernel reads them when there is a saved state.
    bool yDirect = !keep_ && a.hasOutput(0) && sequenceInPlace();
    y_.set_data_handle(keep_ ? saved + saved_.dstOffset : yDirect ? a.outputs[0] : yCopy_.get_data_handle());
    bool hDirect = a.hasOutput(1) && !g_.batchFirst, cDirect = !keep_ && lstm_ && a.hasOutput(2) && !g_.batchFirst;
    hNArg_.set_data_handle(hDirect ? a.outputs[1] : hN_.get_data_handle());
    if (lstm_) cNArg_.set_data_handle(keep_ ? saved + saved_.cOffset : cDirect ? a.outputs[2] : cN_.get_data_handle());
    if (keep_) ws_.set_data_handle(saved + saved_.wsOffset);
    runPrimitive(fwd_, args_, cache_);
    if (a.hasOutput(0) && !yDirect) {
      auto *from = static_cast<float *>(y_.get_data_handle());
      if (sequenceInPlace())
        std::memcpy(a.outputs[0], from, d_.dstLayer.get_size());
      else
        copySequence(a.out<float>(0), from, false);
    }
    if (a.hasOutput(1) && !hDirect) copyState(a.out<float>(1), static_cast<float *>(hN_.get_data_handle()), false);
    if (lstm_ && a.hasOutput(2) && !cDirect) {
      auto *from = static_cast<float *>(cNArg_.get_data_handle());
      if (!g_.batchFirst)
        std::memcpy(a.outputs[2], from, d_.dstIterC.get_size());
      else
        copyState(a.out<float>(2), from, false);
    }
    if (keep_) markSaved(saved);
  }

private:
  size_t savedIndex_;
  bool keep_ = false, lstm_ = false;
  memory h0_, h0Zero_, hN_, c0_, c0Zero_, cN_, y_, yCopy_, h0Arg_, hNArg_, c0Arg_, cNArg_, ws_;
  std::vector<std::pair<int, memory *>> args_;
  std::vector<dnnl_exec_arg_t> cache_;
};

/// LSTMGrad, GRUGrad, RNNGrad: X, W, R, B, initial_h, initial_c, dY, dY_h, dY_c [, saved state]
/// -> dX, dW, dR, dB, d initial_h, d initial_c. With a saved state that the oneDNN forward wrote,
/// only the backward primitive runs; else forward_training first, into buffers of its own.
class RecurrentGradKernel : public RecurrentBase {
public:
  explicit RecurrentGradKernel(const ir::Op &op) : RecurrentBase(op, true, true) {
    lstm_ = g_.cell == Cell::Lstm;
    savedBytesIn_ = op.hasInput(9) ? op.inInfo(9).elementCount() : 0;
    if (savedBytesIn_ != 0 && savedBytesIn_ != saved_.total)
      throw ::popart::error(op.debugName(), ": the saved state has ", savedBytesIn_, " bytes, oneDNN's keeps ",
                            saved_.total);
    if (bwdPd_.workspace_desc() != fwdPd_.workspace_desc())
      throw ::popart::error(op.debugName(), ": oneDNN's backward wants another workspace");
    auto &eng = dnnl_util::engine();
    if (savedBytesIn_ == 0) { // else a recomputed forward goes into the saved state (run())
      ownWs_ = owned(fwdPd_.workspace_desc());
      ownY_ = owned(d_.dstLayer);
      if (lstm_) ownCN_ = owned(d_.dstIterC);
    }
    ws_ = memory(fwdPd_.workspace_desc(), eng, DNNL_MEMORY_NONE);
    y_ = memory(d_.dstLayer, eng, DNNL_MEMORY_NONE);
    h0_ = owned(d_.srcIter);
    hN_ = owned(d_.dstIter);
    dy_ = owned(d_.dstLayer);
    dhN_ = owned(d_.dstIter);
    dx_ = owned(d_.srcLayer);
    dh0_ = owned(d_.srcIter);
    dwl_ = owned(bwdPd_.diff_weights_layer_desc());
    dwi_ = owned(bwdPd_.diff_weights_iter_desc());
    db_ = owned(bwdPd_.diff_bias_desc());
    if (dwl_.get_desc() != d_.plainWeightsLayer || dwi_.get_desc() != d_.plainWeightsIter ||
        db_.get_desc() != d_.bias || bwdPd_.diff_src_layer_desc() != d_.srcLayer ||
        bwdPd_.diff_dst_layer_desc() != d_.dstLayer)
      throw ::popart::error(op.debugName(), ": oneDNN chose other layouts for the gradients");
    std::vector<std::pair<int, memory *>> fwd{
        {DNNL_ARG_SRC_LAYER, &xLayer_},   {DNNL_ARG_SRC_ITER, &h0_},  {DNNL_ARG_WEIGHTS_LAYER, &fwdWl_},
        {DNNL_ARG_WEIGHTS_ITER, &fwdWi_}, {DNNL_ARG_BIAS, &bias_},    {DNNL_ARG_DST_LAYER, &y_},
        {DNNL_ARG_DST_ITER, &hN_},        {DNNL_ARG_WORKSPACE, &ws_}, {DNNL_ARG_SCRATCHPAD, &scratch_}};
    std::vector<std::pair<int, memory *>> bwd{{DNNL_ARG_SRC_LAYER, &xLayer_},
                                              {DNNL_ARG_SRC_ITER, &h0_},
                                              {DNNL_ARG_WEIGHTS_LAYER, &bwdWl_},
                                              {DNNL_ARG_WEIGHTS_ITER, &bwdWi_},
                                              {DNNL_ARG_BIAS, &bias_},
                                              {DNNL_ARG_DST_LAYER, &y_},
                                              {DNNL_ARG_DST_ITER, &hN_},
                                              {DNNL_ARG_DIFF_SRC_LAYER, &dx_},
                                              {DNNL_ARG_DIFF_SRC_ITER, &dh0_},
                                              {DNNL_ARG_DIFF_WEIGHTS_LAYER, &dwl_},
                                              {DNNL_ARG_DIFF_WEIGHTS_ITER, &dwi_},
                                              {DNNL_ARG_DIFF_BIAS, &db_},
                                              {DNNL_ARG_DIFF_DST_LAYER, &dy_},
                                              {DNNL_ARG_DIFF_DST_ITER, &dhN_},
                                              {DNNL_ARG_WORKSPACE, &ws_},
                                              {DNNL_ARG_SCRATCHPAD, &scratch_}};
    if (lstm_) {
      c0_ = owned(d_.srcIterC);
      cN_ = memory(d_.dstIterC, eng, DNNL_MEMORY_NONE);
      dcN_ = owned(d_.dstIterC);
      dc0_ = owned(d_.srcIterC);
      fwd.push_back({DNNL_ARG_SRC_ITER_C, &c0_});
      fwd.push_back({DNNL_ARG_DST_ITER_C, &cN_});
      bwd.push_back({DNNL_ARG_SRC_ITER_C, &c0_});
      bwd.push_back({DNNL_ARG_DST_ITER_C, &cN_});
      bwd.push_back({DNNL_ARG_DIFF_SRC_ITER_C, &dc0_});
      bwd.push_back({DNNL_ARG_DIFF_DST_ITER_C, &dcN_});
    }
    fwdArgList_ = std::move(fwd);
    bwdArgList_ = std::move(bwd);
  }

  void run(const KernelArgs &a) override {
    // The saved state is this op's alone (ir::saveRecurrentState makes it for this grad op), so
    // when the forward kernel did not fill it (another provider), the recomputed forward pass
    // is written into it rather than into a second workspace of the kernel's own.
    char *saved = savedBytesIn_ != 0 ? static_cast<char *>(const_cast<void *>(a.inputs[9])) : nullptr;
    bool reuse = saved && savedValid(saved);
    bindScratch(a);
    prepareWeights(a, true, !reuse);
    prepareX(a);
    auto stateIn = [&](size_t input, memory &to) {
      float *p = static_cast<float *>(to.get_data_handle());
      if (!a.hasInput(input))
        std::memset(p, 0, sizeof(float) * g_.D * g_.N * g_.H);
      else if (!g_.batchFirst)
        std::memcpy(p, a.inputs[input], sizeof(float) * g_.D * g_.N * g_.H);
      else
        copyState(const_cast<float *>(a.in<float>(input)), p, true);
    };
    stateIn(4, h0_);
    stateIn(7, dhN_);
    if (lstm_) {
      stateIn(5, c0_);
      stateIn(8, dcN_);
    }
    float *dy = static_cast<float *>(dy_.get_data_handle());
    if (!a.hasInput(6))
      std::memset(dy, 0, d_.dstLayer.get_size());
    else if (sequenceInPlace())
      std::memcpy(dy, a.inputs[6], d_.dstLayer.get_size());
    else
      copySequence(const_cast<float *>(a.in<float>(6)), dy, true);
    ws_.set_data_handle(saved ? saved + saved_.wsOffset : ownWs_.get_data_handle());
    y_.set_data_handle(saved ? saved + saved_.dstOffset : ownY_.get_data_handle());
    if (lstm_) cN_.set_data_handle(saved ? saved + saved_.cOffset : ownCN_.get_data_handle());
    if (!reuse) runPrimitive(fwd_, fwdArgList_, fwdArgs_);
    // The backward primitive adds into the weight and bias gradients.
    std::memset(dwl_.get_data_handle(), 0, dwl_.get_desc().get_size());
    std::memset(dwi_.get_data_handle(), 0, dwi_.get_desc().get_size());
    std::memset(db_.get_data_handle(), 0, db_.get_desc().get_size());
    runPrimitive(bwd_, bwdArgList_, bwdArgs_);
    writeGradients(a);
  }

private:
  void writeGradients(const KernelArgs &a) {
    const float *dx = static_cast<const float *>(dx_.get_data_handle());
    if (a.hasOutput(0)) {
      float *out = a.out<float>(0);
      if (!g_.batchFirst)
        std::memcpy(out, dx, d_.srcLayer.get_size());
      else
        for (int64_t n = 0; n < g_.N; ++n)
          for (int64_t t = 0; t < g_.T; ++t)
            std::memcpy(out + (n * g_.T + t) * g_.I, dx + (t * g_.N + n) * g_.I, sizeof(float) * g_.I);
    }
    int64_t G = g_.gates, H = g_.H;
    // ldigo [D, in, G, H] with oneDNN's gates -> ONNX [D, G·H, in] with ONNX's.
    auto weights = [&](const memory &from, int64_t in, float *to) {
      const float *p = static_cast<const float *>(from.get_data_handle());
      for (int64_t d = 0; d < g_.D; ++d)
        for (int64_t k = 0; k < G; ++k) {
          int64_t q = g_.onnxGate[static_cast<size_t>(k)];
          for (int64_t h = 0; h < H; ++h) {
            float *row = to + ((d * G + q) * H + h) * in;
            const float *col = p + (d * in * G + k) * H + h;
            for (int64_t i = 0; i < in; ++i)
              row[i] = col[i * G * H];
          }
        }
    };
    if (a.hasOutput(1)) weights(dwl_, g_.I, a.out<float>(1));
    if (a.hasOutput(2)) weights(dwi_, g_.H, a.out<float>(2));
    if (a.hasOutput(3)) {
      const float *db = static_cast<const float *>(db_.get_data_handle());
      float *out = a.out<float>(3);
      for (int64_t d = 0; d < g_.D; ++d) {
        const float *bd = db + d * g_.biasGates * H;
        float *wb = out + d * 2 * G * H, *rb = wb + G * H;
        for (int64_t k = 0; k < G; ++k) {
          int64_t q = g_.onnxGate[static_cast<size_t>(k)];
          bool lbrHidden = g_.cell == Cell::LbrGru && k == 2;
          for (int64_t j = 0; j < H; ++j) {
            wb[q * H + j] = bd[k * H + j];
            rb[q * H + j] = lbrHidden ? bd[3 * H + j] : bd[k * H + j];
          }
        }
      }
    }
    auto stateOut = [&](size_t output, const memory &from) {
      if (!a.hasOutput(output)) return;
      float *p = static_cast<float *>(from.get_data_handle());
      if (!g_.batchFirst)
        std::memcpy(a.outputs[output], p, sizeof(float) * g_.D * g_.N * g_.H);
      else
        copyState(a.out<float>(output), p, false);
    };
    stateOut(4, dh0_);
    if (lstm_) stateOut(5, dc0_);
  }

  bool lstm_ = false;
  int64_t savedBytesIn_ = 0;
  memory ownWs_, ownY_, ownCN_, ws_, y_, h0_, hN_, c0_, cN_, dy_, dhN_, dcN_, dx_, dh0_, dc0_, dwl_, dwi_, db_;
  std::vector<std::pair<int, memory *>> fwdArgList_, bwdArgList_;
  std::vector<dnnl_exec_arg_t> fwdArgs_, bwdArgs_;
};

/// Why oneDNN cannot run \p op (LSTM, GRU or RNN; \p backward: their grad op) as RecurrentKernel
/// or RecurrentGradKernel do ("" if it can); creates no primitive and throws nothing.
std::string recurrentWhyNot(const ir::Op &op, bool backward) {
  if (!plainCell(op)) return "not f32, or an activation, clip, peephole or sequence length oneDNN's cells lack";
  Geometry g = geometryOf(op);
  const size_t savedOutput = backward ? 0 : ir::recurrentSavedOutput(op);
  const bool training = backward || op.hasOutput(savedOutput);
  Descs d = descsOf(g, constWeights(op) && !training);
  auto [f, b] = makePds(g, d, training, backward);
  if (!f || (backward && !b)) return "no oneDNN implementation for this cell";
  SavedLayout saved = savedLayout(g, f);
  if (!backward) {
    if (training && op.outInfo(savedOutput).elementCount() != saved.total)
      return "the saved state's size is not what oneDNN's forward keeps";
    return {};
  }
  const int64_t savedIn = op.hasInput(9) ? op.inInfo(9).elementCount() : 0;
  if (savedIn != 0 && savedIn != saved.total) return "the saved state's size is not what oneDNN keeps";
  if (b.workspace_desc() != f.workspace_desc()) return "oneDNN's backward wants another workspace";
  if (b.diff_weights_layer_desc() != d.plainWeightsLayer || b.diff_weights_iter_desc() != d.plainWeightsIter ||
      b.diff_bias_desc() != d.bias || b.diff_src_layer_desc() != d.srcLayer || b.diff_dst_layer_desc() != d.dstLayer)
    return "oneDNN chose other layouts for the gradients";
  return {};
}

} // namespace

int64_t recurrentSavedBytes(const ir::Op &op) {
  if (op.domain != "ai.onnx" || !plainCell(op)) return 0;
  Geometry g = geometryOf(op);
  Descs d = descsOf(g, false);
  auto forward = makePds(g, d, true, false).first;
  return forward ? savedLayout(g, forward).total : 0;
}

void registerDnnlRnnKernels(KernelRegistry &r) {
  for (const char *t : {"RNN", "GRU", "LSTM"})
    r.add({"ai.onnx", t, KernelProvider::Dnnl,
           [](const ir::Op &op) { return Support::unless(recurrentWhyNot(op, false)); }, makeKernel<RecurrentKernel>});
  for (const char *t : {"RNNGrad", "GRUGrad", "LSTMGrad"})
    r.add({"ai.graphcore", t, KernelProvider::Dnnl,
           [](const ir::Op &op) { return Support::unless(recurrentWhyNot(op, true)); },
           makeKernel<RecurrentGradKernel>});
}

} // namespace popart::backend_cpu
