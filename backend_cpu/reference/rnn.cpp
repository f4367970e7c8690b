// Reference RNN, GRU and LSTM, computed in double, with sequence_lens, clip, peepholes,
// bidirectional runs and the activation lists of the ONNX spec.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace popart::backend_cpu {

namespace {

struct Activation {
  std::string name;
  double alpha = 0, beta = 0;
  double operator()(double x) const {
    if (name == "Sigmoid") return 1 / (1 + std::exp(-x));
    if (name == "Tanh") return std::tanh(x);
    if (name == "Relu") return std::max(0.0, x);
    if (name == "LeakyRelu") return x >= 0 ? x : alpha * x;
    if (name == "ThresholdedRelu") return x > alpha ? x : 0;
    if (name == "ScaledTanh") return alpha * std::tanh(beta * x);
    if (name == "HardSigmoid") return std::max(0.0, std::min(1.0, alpha * x + beta));
    if (name == "Elu") return x >= 0 ? x : alpha * (std::exp(x) - 1);
    if (name == "Softsign") return x / (1 + std::fabs(x));
    if (name == "Softplus") return std::log1p(std::exp(x));
    return alpha * x + beta; // Affine
  }
};

Activation makeActivation(const std::string &name, double alpha, bool hasAlpha, double beta, bool hasBeta) {
  Activation a{name, alpha, beta};
  if (!hasAlpha) a.alpha = name == "LeakyRelu" ? 0.01 : name == "HardSigmoid" ? 0.2 : 1.0;
  if (!hasBeta) a.beta = name == "HardSigmoid" ? 0.5 : name == "ScaledTanh" ? 1.0 : 0.0;
  return a;
}

/// The sizes and layout of a recurrent op (LSTM, GRU, RNN or their grad ops): where time step t,
/// direction d and batch row b sit in X, Y and the state tensors.
struct RecurrentGeometry {
  explicit RecurrentGeometry(const ir::Op &op) {
    const Shape &x = op.inInfo(0).shape();
    batchFirst_ = op.attrs.getInt("layout", 0) != 0;
    seq_ = batchFirst_ ? x[1] : x[0];
    batch_ = batchFirst_ ? x[0] : x[1];
    input_ = x[2];
    std::string direction = op.attrs.getString("direction", "forward");
    dirs_ = direction == "bidirectional" ? 2 : 1;
    reverseOnly_ = direction == "reverse";
    hidden_ = op.inInfo(2).dim(2);
    gates_ = op.type.rfind("LSTM", 0) == 0 ? 4 : op.type.rfind("GRU", 0) == 0 ? 3 : 1;
    linearBeforeReset_ = op.attrs.getInt("linear_before_reset", 0) != 0;
  }

  int64_t xIndex(int64_t t, int64_t b, int64_t i) const {
    return batchFirst_ ? (b * seq_ + t) * input_ + i : (t * batch_ + b) * input_ + i;
  }
  int64_t yIndex(int64_t t, int64_t d, int64_t b, int64_t j) const {
    return batchFirst_ ? ((b * seq_ + t) * dirs_ + d) * hidden_ + j : ((t * dirs_ + d) * batch_ + b) * hidden_ + j;
  }
  int64_t stateIndex(int64_t d, int64_t b, int64_t j) const {
    return batchFirst_ ? (b * dirs_ + d) * hidden_ + j : (d * batch_ + b) * hidden_ + j;
  }

  bool batchFirst_ = false, reverseOnly_ = false, linearBeforeReset_ = false;
  int64_t seq_, batch_, input_, dirs_, hidden_, gates_;
};

class RecurrentKernel : public Kernel, RecurrentGeometry {
public:
  explicit RecurrentKernel(const ir::Op &op) : RecurrentGeometry(op), type_(op.inInfo(0).dataType()), kind_(op.type) {
    static const std::vector<std::string> known{"Sigmoid",         "Tanh",       "Relu",        "LeakyRelu",
                                                "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu",
                                                "Softsign",        "Softplus",   "Affine"};
    clip_ = op.attrs.getFloat("clip", 0.f);
    if (op.attrs.getInt("input_forget", 0) != 0) throw error(op.debugName(), ": input_forget is not supported");
    std::vector<std::string> names = op.attrs.getStrings("activations");
    std::vector<float> alphas = op.attrs.getFloats("activation_alpha", {}),
                       betas = op.attrs.getFloats("activation_beta", {});
    size_t perDir = kind_ == "LSTM" ? 3 : kind_ == "GRU" ? 2 : 1;
    std::vector<std::string> defaults = kind_ == "RNN"   ? std::vector<std::string>{"Tanh"}
                                        : kind_ == "GRU" ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                         : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
    for (size_t i = 0; i < perDir * static_cast<size_t>(dirs_); ++i) {
      std::string n = i < names.size() ? names[i] : defaults[i % perDir];
      if (std::find(known.begin(), known.end(), n) == known.end())
        throw error(op.debugName(), ": activation '", n, "' is not supported");
      activations_.push_back(makeActivation(n, i < alphas.size() ? alphas[i] : 0, i < alphas.size(),
                                            i < betas.size() ? betas[i] : 0, i < betas.size()));
    }
    hasB_ = op.hasInput(3);
    hasLens_ = op.hasInput(4);
    hasH0_ = op.hasInput(5);
    hasC0_ = kind_ == "LSTM" && op.hasInput(6);
    hasP_ = kind_ == "LSTM" && op.hasInput(7);
    lensType_ = hasLens_ ? op.inInfo(4).dataType() : DataType::INT32;
    h_.resize(static_cast<size_t>(batch_ * hidden_));
    c_.resize(h_.size());
    gatesBuf_.resize(static_cast<size_t>(gates_ * hidden_));
    hNew_.resize(static_cast<size_t>(hidden_));
  }

  void run(const KernelArgs &args) override {
    dispatchFloat(type_, kind_.c_str(), [&](auto tag) { runTyped<typename decltype(tag)::type>(args); });
  }

private:
  template <typename T> double load(const T *p, int64_t i) const {
    return static_cast<double>(static_cast<compute_t<T>>(p[i]));
  }
  template <typename T> void store(T *p, int64_t i, double v) const {
    p[i] = static_cast<T>(static_cast<compute_t<T>>(v));
  }
  double clip(double v) const {
    return clip_ > 0 ? std::max(-static_cast<double>(clip_), std::min(static_cast<double>(clip_), v)) : v;
  }

  template <typename T> void runTyped(const KernelArgs &args) {
    const T *x = args.in<T>(0);
    const T *w = args.in<T>(1);
    const T *r = args.in<T>(2);
    const T *bias = hasB_ ? args.in<T>(3) : nullptr;
    const T *h0 = hasH0_ ? args.in<T>(5) : nullptr;
    const T *c0 = hasC0_ ? args.in<T>(6) : nullptr;
    const T *p = hasP_ ? args.in<T>(7) : nullptr;
    T *y = args.hasOutput(0) ? args.out<T>(0) : nullptr;
    T *yh = args.hasOutput(1) ? args.out<T>(1) : nullptr;
    T *yc = args.hasOutput(2) ? args.out<T>(2) : nullptr;
    // A saved-state output (ir::saveRecurrentState) gets a header that no grad kernel accepts:
    // they recompute the forward pass.
    if (size_t saved = kind_ == "LSTM" ? 3 : 2; args.hasOutput(saved)) std::memset(args.outputs[saved], 0, 64);
    int64_t G = gates_ * hidden_;
    for (int64_t d = 0; d < dirs_; ++d) {
      bool reverse = reverseOnly_ || d == 1;
      const T *wd = w + d * G * input_;
      const T *rd = r + d * G * hidden_;
      const T *bd = bias ? bias + d * 2 * G : nullptr;
      const T *pd = p ? p + d * 3 * hidden_ : nullptr;
      const Activation *act = &activations_[static_cast<size_t>(d) * (kind_ == "LSTM" ? 3 : kind_ == "GRU" ? 2 : 1)];
      for (int64_t b = 0; b < batch_; ++b) {
        int64_t len = seq_;
        if (hasLens_)
          len = static_cast<int64_t>(lensType_ == DataType::INT64 ? args.in<int64_t>(4)[b] : args.in<int32_t>(4)[b]);
        if (len < 0 || len > seq_)
          throw error(kind_, ": sequence_lens[", b, "] = ", len, " is outside [0, ", seq_, "]");
        double *h = h_.data() + b * hidden_;
        double *c = c_.data() + b * hidden_;
        for (int64_t j = 0; j < hidden_; ++j) {
          h[j] = h0 ? load(h0, stateIndex(d, b, j)) : 0.0;
          c[j] = c0 ? load(c0, stateIndex(d, b, j)) : 0.0;
        }
        for (int64_t step = 0; step < seq_; ++step) {
          int64_t t = reverse ? len - 1 - step : step;
          if (step >= len) {
            if (y) // steps at and after the sequence's length are zero in either direction
              for (int64_t j = 0; j < hidden_; ++j)
                store(y, yIndex(step, d, b, j), 0.0);
            continue;
          }
          // gates = W x_t + R h (+ biases); for GRU the hidden gate's R h is kept apart.
          for (int64_t g = 0; g < G; ++g) {
            double acc = bd ? load(bd, g) : 0.0;
            for (int64_t i = 0; i < input_; ++i)
              acc += load(wd, g * input_ + i) * load(x, xIndex(t, b, i));
            bool gruHidden = kind_ == "GRU" && g >= 2 * hidden_;
            if (!gruHidden) {
              if (bd) acc += load(bd, G + g);
              for (int64_t k = 0; k < hidden_; ++k)
                acc += load(rd, g * hidden_ + k) * h[k];
            }
            gatesBuf_[static_cast<size_t>(g)] = acc;
          }
          if (kind_ == "RNN") {
            for (int64_t j = 0; j < hidden_; ++j)
              hNew_[static_cast<size_t>(j)] = act[0](clip(gatesBuf_[static_cast<size_t>(j)]));
          } else if (kind_ == "GRU") {
            for (int64_t j = 0; j < hidden_; ++j) {
              double z = act[0](clip(gatesBuf_[static_cast<size_t>(j)]));
              double rr = act[0](clip(gatesBuf_[static_cast<size_t>(hidden_ + j)]));
              int64_t g = 2 * hidden_ + j;
              double rh = 0;
              if (linearBeforeReset_) {
                double lin = bd ? load(bd, G + g) : 0.0;
                for (int64_t k = 0; k < hidden_; ++k)
                  lin += load(rd, g * hidden_ + k) * h[k];
                rh = rr * lin;
              } else {
                for (int64_t k = 0; k < hidden_; ++k)
                  rh += load(rd, g * hidden_ + k) * rr_h(rr, h, k, j);
                if (bd) rh += load(bd, G + g);
              }
              double hh = act[1](clip(gatesBuf_[static_cast<size_t>(g)] + rh));
              hNew_[static_cast<size_t>(j)] = (1 - z) * hh + z * h[j];
            }
          } else { // LSTM, gates i, o, f, c
            for (int64_t j = 0; j < hidden_; ++j) {
              double gi = gatesBuf_[static_cast<size_t>(j)], go = gatesBuf_[static_cast<size_t>(hidden_ + j)];
              double gf = gatesBuf_[static_cast<size_t>(2 * hidden_ + j)],
                     gc = gatesBuf_[static_cast<size_t>(3 * hidden_ + j)];
              if (pd) {
                gi += load(pd, j) * c[j];
                gf += load(pd, 2 * hidden_ + j) * c[j];
              }
              double it = act[0](clip(gi)), ft = act[0](clip(gf)), ct = act[1](clip(gc));
              double cNew = ft * c[j] + it * ct;
              if (pd) go += load(pd, hidden_ + j) * cNew;
              double ot = act[0](clip(go));
              c[j] = cNew;
              hNew_[static_cast<size_t>(j)] = ot * act[2](cNew);
            }
          }
          for (int64_t j = 0; j < hidden_; ++j) {
            h[j] = hNew_[static_cast<size_t>(j)];
            if (y) store(y, yIndex(t, d, b, j), h[j]);
          }
        }
        for (int64_t j = 0; j < hidden_; ++j) {
          if (yh) store(yh, stateIndex(d, b, j), h[j]);
          if (yc) store(yc, stateIndex(d, b, j), c[j]);
        }
      }
    }
  }

  // r_t ⊙ H_{t-1}, element k (the reset gate of element k is needed, not of j).
  double rr_h(double, const double *h, int64_t k, int64_t) const { return resetGate(k) * h[k]; }
  double resetGate(int64_t k) const {
    // Recomputed from the pre-activations kept in gatesBuf_.
    return activations_[0](clip(gatesBuf_[static_cast<size_t>(hidden_ + k)]));
  }

  DataType type_;
  std::string kind_;
  float clip_;
  bool hasB_, hasLens_, hasH0_, hasC0_, hasP_;
  DataType lensType_;
  std::vector<Activation> activations_;
  std::vector<double> h_, c_, gatesBuf_, hNew_;
};

/// LSTMGrad, GRUGrad and RNNGrad (ir/ops/rnn.cpp): per direction and batch row, the forward pass
/// again (default activations, no clip), keeping each step's previous state and gate
/// activations, then back through time. Sums in double.
class RecurrentGradKernel : public Kernel, RecurrentGeometry {
public:
  explicit RecurrentGradKernel(const ir::Op &op) : RecurrentGeometry(op), type_(op.inInfo(0).dataType()) {
    kind_ = op.type == "LSTMGrad" ? Kind::Lstm : op.type == "GRUGrad" ? Kind::Gru : Kind::Rnn;
    const Shape &x = op.inInfo(0).shape();
    size_t G = static_cast<size_t>(gates_ * hidden_), H = static_cast<size_t>(hidden_), T = static_cast<size_t>(seq_);
    w_.resize(static_cast<size_t>(dirs_) * G * static_cast<size_t>(input_));
    r_.resize(static_cast<size_t>(dirs_) * G * H);
    b_.assign(static_cast<size_t>(dirs_) * 2 * G, 0.0);
    dw_.resize(w_.size());
    dr_.resize(r_.size());
    db_.resize(b_.size());
    dx_.resize(static_cast<size_t>(shapeElementCount(x)));
    hs_.resize((T + 1) * H);
    cs_.resize((T + 1) * H);
    acts_.resize(T * G);
    lin_.resize(T * H);
    xt_.resize(static_cast<size_t>(input_));
    dh_.resize(H);
    dc_.resize(H);
    da_.resize(G);
    dq_.resize(H);
  }

  void run(const KernelArgs &args) override {
    dispatchFloat(type_, "RecurrentGrad", [&](auto tag) { runTyped<typename decltype(tag)::type>(args); });
  }

private:
  enum class Kind { Lstm, Gru, Rnn };
  static double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

  template <typename T> void runTyped(const KernelArgs &args) {
    auto load = [](const T *p, size_t n, std::vector<double> &to) {
      for (size_t i = 0; i < n; ++i)
        to[i] = static_cast<double>(p[i]);
    };
    load(args.in<T>(1), w_.size(), w_);
    load(args.in<T>(2), r_.size(), r_);
    if (args.hasInput(3)) load(args.in<T>(3), b_.size(), b_);
    const T *x = args.in<T>(0);
    const T *h0 = args.hasInput(4) ? args.in<T>(4) : nullptr;
    const T *c0 = args.hasInput(5) ? args.in<T>(5) : nullptr;
    const T *dy = args.hasInput(6) ? args.in<T>(6) : nullptr;
    const T *dyh = args.hasInput(7) ? args.in<T>(7) : nullptr;
    const T *dyc = args.hasInput(8) ? args.in<T>(8) : nullptr;
    T *dh0 = args.hasOutput(4) ? args.out<T>(4) : nullptr;
    T *dc0 = args.hasOutput(5) ? args.out<T>(5) : nullptr;
    std::fill(dw_.begin(), dw_.end(), 0.0);
    std::fill(dr_.begin(), dr_.end(), 0.0);
    std::fill(db_.begin(), db_.end(), 0.0);
    std::fill(dx_.begin(), dx_.end(), 0.0);
    const int64_t H = hidden_, G = gates_ * hidden_, I = input_;
    for (int64_t d = 0; d < dirs_; ++d) {
      bool reverse = reverseOnly_ || d == 1;
      const double *w = w_.data() + d * G * I, *r = r_.data() + d * G * H, *wb = b_.data() + d * 2 * G, *rb = wb + G;
      double *dw = dw_.data() + d * G * I, *dr = dr_.data() + d * G * H, *dwb = db_.data() + d * 2 * G, *drb = dwb + G;
      for (int64_t b = 0; b < batch_; ++b) {
        // Forward: hs_[s] / cs_[s] are the states before step s, acts_[s] the gate activations.
        for (int64_t j = 0; j < H; ++j) {
          hs_[static_cast<size_t>(j)] = h0 ? static_cast<double>(h0[stateIndex(d, b, j)]) : 0.0;
          cs_[static_cast<size_t>(j)] = c0 ? static_cast<double>(c0[stateIndex(d, b, j)]) : 0.0;
        }
        for (int64_t s = 0; s < seq_; ++s) {
          int64_t t = reverse ? seq_ - 1 - s : s;
          for (int64_t i = 0; i < I; ++i)
            xt_[static_cast<size_t>(i)] = static_cast<double>(x[xIndex(t, b, i)]);
          const double *h = &hs_[static_cast<size_t>(s * H)];
          double *a = &acts_[static_cast<size_t>(s * G)];
          for (int64_t g = 0; g < G; ++g) {
            double acc = wb[g];
            for (int64_t i = 0; i < I; ++i)
              acc += w[g * I + i] * xt_[static_cast<size_t>(i)];
            if (kind_ != Kind::Gru || g < 2 * H) {
              acc += rb[g];
              for (int64_t k = 0; k < H; ++k)
                acc += r[g * H + k] * h[k];
            }
            a[g] = acc;
          }
          double *hn = &hs_[static_cast<size_t>((s + 1) * H)];
          if (kind_ == Kind::Rnn) {
            for (int64_t j = 0; j < H; ++j)
              hn[j] = a[j] = std::tanh(a[j]);
          } else if (kind_ == Kind::Gru) {
            for (int64_t j = 0; j < 2 * H; ++j)
              a[j] = sigmoid(a[j]);
            double *lin = &lin_[static_cast<size_t>(s * H)];
            for (int64_t j = 0; j < H; ++j) {
              int64_t g = 2 * H + j;
              double acc = rb[g];
              for (int64_t k = 0; k < H; ++k)
                acc += r[g * H + k] * (linearBeforeReset_ ? h[k] : a[H + k] * h[k]);
              lin[j] = acc;
            }
            for (int64_t j = 0; j < H; ++j) {
              double z = a[j], rr = a[H + j];
              double n = std::tanh(a[2 * H + j] + (linearBeforeReset_ ? rr * lin[j] : lin[j]));
              a[2 * H + j] = n;
              hn[j] = (1 - z) * n + z * h[j];
            }
          } else {
            const double *c = &cs_[static_cast<size_t>(s * H)];
            double *cn = &cs_[static_cast<size_t>((s + 1) * H)];
            for (int64_t j = 0; j < H; ++j) {
              double gi = sigmoid(a[j]), go = sigmoid(a[H + j]), gf = sigmoid(a[2 * H + j]),
                     gc = std::tanh(a[3 * H + j]);
              a[j] = gi;
              a[H + j] = go;
              a[2 * H + j] = gf;
              a[3 * H + j] = gc;
              cn[j] = gf * c[j] + gi * gc;
              hn[j] = go * std::tanh(cn[j]);
            }
          }
        }
        // Backward through time.
        for (int64_t j = 0; j < H; ++j) {
          dh_[static_cast<size_t>(j)] = dyh ? static_cast<double>(dyh[stateIndex(d, b, j)]) : 0.0;
          dc_[static_cast<size_t>(j)] = dyc ? static_cast<double>(dyc[stateIndex(d, b, j)]) : 0.0;
        }
        for (int64_t s = seq_ - 1; s >= 0; --s) {
          int64_t t = reverse ? seq_ - 1 - s : s;
          if (dy)
            for (int64_t j = 0; j < H; ++j)
              dh_[static_cast<size_t>(j)] += static_cast<double>(dy[yIndex(t, d, b, j)]);
          const double *h = &hs_[static_cast<size_t>(s * H)];
          const double *a = &acts_[static_cast<size_t>(s * G)];
          double *da = da_.data();
          // da: gradients of the pre-activations; dq_: of what R multiplies in the GRU's hidden gate.
          if (kind_ == Kind::Rnn) {
            for (int64_t j = 0; j < H; ++j)
              da[j] = dh_[static_cast<size_t>(j)] * (1 - a[j] * a[j]);
            std::fill(dh_.begin(), dh_.end(), 0.0);
          } else if (kind_ == Kind::Gru) {
            const double *lin = &lin_[static_cast<size_t>(s * H)];
            for (int64_t j = 0; j < H; ++j) {
              double z = a[j], rr = a[H + j], n = a[2 * H + j], g = dh_[static_cast<size_t>(j)];
              double dn = g * (1 - z) * (1 - n * n);
              da[j] = g * (h[j] - n) * z * (1 - z);
              da[2 * H + j] = dn;
              // lbr: the hidden gate adds r ⊙ lin, lin = R_h h + Rb_h; else R_h (r ⊙ h) + Rb_h.
              dq_[static_cast<size_t>(j)] = linearBeforeReset_ ? dn * rr : dn;
              if (linearBeforeReset_) da[H + j] = dn * lin[j] * rr * (1 - rr);
              dh_[static_cast<size_t>(j)] = g * z;
            }
            // dq_ reaches R_h, Rb_h and (through r ⊙ h or h) h and r.
            for (int64_t j = 0; j < H; ++j) {
              int64_t g = 2 * H + j;
              double dq = dq_[static_cast<size_t>(j)];
              drb[g] += dq;
              for (int64_t k = 0; k < H; ++k)
                dr[g * H + k] += dq * (linearBeforeReset_ ? h[k] : a[H + k] * h[k]);
            }
            if (!linearBeforeReset_)
              for (int64_t k = 0; k < H; ++k) {
                double acc = 0;
                for (int64_t j = 0; j < H; ++j)
                  acc += r[(2 * H + j) * H + k] * dq_[static_cast<size_t>(j)];
                double rr = a[H + k];
                da[H + k] = acc * h[k] * rr * (1 - rr);
                dh_[static_cast<size_t>(k)] += acc * rr;
              }
            else
              for (int64_t k = 0; k < H; ++k) {
                double acc = 0;
                for (int64_t j = 0; j < H; ++j)
                  acc += r[(2 * H + j) * H + k] * dq_[static_cast<size_t>(j)];
                dh_[static_cast<size_t>(k)] += acc;
              }
          } else {
            const double *c = &cs_[static_cast<size_t>(s * H)];
            const double *cn = &cs_[static_cast<size_t>((s + 1) * H)];
            for (int64_t j = 0; j < H; ++j) {
              double gi = a[j], go = a[H + j], gf = a[2 * H + j], gc = a[3 * H + j];
              double tc = std::tanh(cn[j]), g = dh_[static_cast<size_t>(j)];
              double dc = dc_[static_cast<size_t>(j)] + g * go * (1 - tc * tc);
              da[j] = dc * gc * gi * (1 - gi);
              da[H + j] = g * tc * go * (1 - go);
              da[2 * H + j] = dc * c[j] * gf * (1 - gf);
              da[3 * H + j] = dc * gi * (1 - gc * gc);
              dc_[static_cast<size_t>(j)] = dc * gf;
            }
            std::fill(dh_.begin(), dh_.end(), 0.0);
          }
          // The gates through W, R and the biases (the GRU's hidden gate's R part is done above).
          int64_t recurrentGates = kind_ == Kind::Gru ? 2 * H : G;
          for (int64_t i = 0; i < I; ++i)
            xt_[static_cast<size_t>(i)] = static_cast<double>(x[xIndex(t, b, i)]);
          for (int64_t g = 0; g < G; ++g) {
            double v = da[g];
            dwb[g] += v;
            for (int64_t i = 0; i < I; ++i) {
              dw[g * I + i] += v * xt_[static_cast<size_t>(i)];
              dx_[static_cast<size_t>(xIndex(t, b, i))] += v * w[g * I + i];
            }
            if (g < recurrentGates) {
              drb[g] += v;
              for (int64_t k = 0; k < H; ++k) {
                dr[g * H + k] += v * h[k];
                dh_[static_cast<size_t>(k)] += v * r[g * H + k];
              }
            }
          }
        }
        for (int64_t j = 0; j < H; ++j) {
          if (dh0) dh0[stateIndex(d, b, j)] = static_cast<T>(dh_[static_cast<size_t>(j)]);
          if (dc0) dc0[stateIndex(d, b, j)] = static_cast<T>(dc_[static_cast<size_t>(j)]);
        }
      }
    }
    auto store = [](const std::vector<double> &from, T *to) {
      if (to)
        for (size_t i = 0; i < from.size(); ++i)
          to[i] = static_cast<T>(from[i]);
    };
    store(dx_, args.hasOutput(0) ? args.out<T>(0) : nullptr);
    store(dw_, args.hasOutput(1) ? args.out<T>(1) : nullptr);
    store(dr_, args.hasOutput(2) ? args.out<T>(2) : nullptr);
    store(db_, args.hasOutput(3) ? args.out<T>(3) : nullptr);
  }

  DataType type_;
  Kind kind_;
  std::vector<double> w_, r_, b_, dw_, dr_, db_, dx_, hs_, cs_, acts_, lin_, xt_, dh_, dc_, da_, dq_;
};

} // namespace

void registerReferenceRnnKernels(KernelRegistry &r) {
  for (const char *t : {"RNN", "GRU", "LSTM"})
    r.add({"ai.onnx", t, KernelProvider::Reference, nullptr, makeKernel<RecurrentKernel>});
  for (const char *t : {"RNNGrad", "GRUGrad", "LSTMGrad"})
    r.add({"ai.graphcore", t, KernelProvider::Reference, nullptr, makeKernel<RecurrentGradKernel>});
}

} // namespace popart::backend_cpu
