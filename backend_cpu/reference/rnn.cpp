// Reference RNN, GRU and LSTM, computed in double, with sequence_lens, clip, peepholes,
// bidirectional runs and the activation lists of the ONNX spec.

#include "backend_cpu/kernel_families.hpp"
#include "core/dispatch.hpp"

#include <algorithm>
#include <cmath>

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

class RecurrentKernel : public Kernel {
public:
  explicit RecurrentKernel(const ir::Op &op) : type_(op.inInfo(0).dataType()), kind_(op.type) {
    static const std::vector<std::string> known{"Sigmoid",         "Tanh",       "Relu",        "LeakyRelu",
                                                "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu",
                                                "Softsign",        "Softplus",   "Affine"};
    const Shape &x = op.inInfo(0).shape();
    batchFirst_ = op.attrs.getInt("layout", 0) != 0;
    seq_ = batchFirst_ ? x[1] : x[0];
    batch_ = batchFirst_ ? x[0] : x[1];
    input_ = x[2];
    std::string direction = op.attrs.getString("direction", "forward");
    dirs_ = direction == "bidirectional" ? 2 : 1;
    reverseOnly_ = direction == "reverse";
    hidden_ = op.inInfo(2).dim(2);
    gates_ = kind_ == "LSTM" ? 4 : kind_ == "GRU" ? 3 : 1;
    clip_ = op.attrs.getFloat("clip", 0.f);
    linearBeforeReset_ = op.attrs.getInt("linear_before_reset", 0) != 0;
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

  int64_t xIndex(int64_t t, int64_t b, int64_t i) const {
    return batchFirst_ ? (b * seq_ + t) * input_ + i : (t * batch_ + b) * input_ + i;
  }
  int64_t yIndex(int64_t t, int64_t d, int64_t b, int64_t j) const {
    return batchFirst_ ? ((b * seq_ + t) * dirs_ + d) * hidden_ + j : ((t * dirs_ + d) * batch_ + b) * hidden_ + j;
  }
  int64_t stateIndex(int64_t d, int64_t b, int64_t j) const {
    return batchFirst_ ? (b * dirs_ + d) * hidden_ + j : (d * batch_ + b) * hidden_ + j;
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
          h[j] = h0 ? load(h0, (d * batch_ + b) * hidden_ + j) : 0.0;
          c[j] = c0 ? load(c0, (d * batch_ + b) * hidden_ + j) : 0.0;
        }
        for (int64_t step = 0; step < seq_; ++step) {
          int64_t t = reverse ? len - 1 - step : step;
          if (step >= len) {
            if (y) {
              int64_t tt = reverse ? step : step;
              for (int64_t j = 0; j < hidden_; ++j)
                store(y, yIndex(tt, d, b, j), 0.0);
            }
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
  bool batchFirst_ = false, reverseOnly_ = false, linearBeforeReset_ = false;
  int64_t seq_, batch_, input_, dirs_, hidden_, gates_;
  float clip_;
  bool hasB_, hasLens_, hasH0_, hasC0_, hasP_;
  DataType lensType_;
  std::vector<Activation> activations_;
  std::vector<double> h_, c_, gatesBuf_, hNew_;
};

} // namespace

void registerReferenceRnnKernels(KernelRegistry &r) {
  for (const char *t : {"RNN", "GRU", "LSTM"})
    r.add({"ai.onnx", t, KernelProvider::Reference, nullptr, makeKernel<RecurrentKernel>});
}

} // namespace popart::backend_cpu
