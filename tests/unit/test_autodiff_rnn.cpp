// Gradients of LSTM, GRU and RNN (LSTMGrad, GRUGrad, RNNGrad): the rules and reference kernels
// checked against central finite differences in double over directions, layouts, biases, initial
// states, linear_before_reset and the outputs the loss reads; the attributes that training does
// not support give errors naming the node.

#include "gradcheck.hpp"

#include "autodiff/autodiff.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>

using namespace popart;

namespace {

struct Rnn {
  std::string type = "LSTM";
  std::string direction = "forward";
  int64_t layout = 0;
  int64_t linearBeforeReset = 0;
  bool bias = true, initialH = true, initialC = true;
  int64_t seq = 3, batch = 2, input = 3, hidden = 2;
  int64_t gates() const { return type == "LSTM" ? 4 : type == "GRU" ? 3 : 1; }
  int64_t dirs() const { return direction == "bidirectional" ? 2 : 1; }
};

ir::Attributes rnnAttrs(const Rnn &r) {
  ir::Attributes a;
  a.set("direction", r.direction);
  a.set("hidden_size", r.hidden);
  if (r.layout) a.set("layout", r.layout);
  if (r.type == "GRU") a.set("linear_before_reset", r.linearBeforeReset);
  return a;
}

/// X, W, R [, B] [, "" (sequence_lens), initial_h [, initial_c]] as DOUBLE streams.
std::vector<gradcheck::Feed> rnnFeeds(const Rnn &r) {
  auto stream = [](const char *id, const Shape &s) {
    return gradcheck::Feed{id, TensorData(TensorInfo(DataType::DOUBLE, s)), true};
  };
  int64_t d = r.dirs(), g = r.gates() * r.hidden;
  std::vector<gradcheck::Feed> f{
      stream("x", r.layout ? Shape{r.batch, r.seq, r.input} : Shape{r.seq, r.batch, r.input}),
      stream("w", {d, g, r.input}), stream("r", {d, g, r.hidden})};
  Shape state = r.layout ? Shape{r.batch, d, r.hidden} : Shape{d, r.batch, r.hidden};
  bool h0 = r.initialH, c0 = r.type == "LSTM" && r.initialC;
  if (r.bias || h0 || c0) f.push_back(r.bias ? stream("b", {d, 2 * g}) : gradcheck::Feed{"", TensorData(), false});
  if (h0 || c0) {
    f.push_back({"", TensorData(), false});
    f.push_back(h0 ? stream("h0", state) : gradcheck::Feed{"", TensorData(), false});
  }
  if (c0) f.push_back(stream("c0", state));
  return f;
}

/// The loss Σ w_k·out_k over the outputs in \p used (indices into Y, Y_h, Y_c).
gradcheck::Loss lossOver(std::vector<size_t> used) {
  return [used](ir::Graph &g, const std::vector<TensorId> &outs, int opset) {
    std::vector<TensorId> picked;
    for (size_t k : used)
      picked.push_back(outs[k]);
    return gradcheck::weightedSumLoss(picked.size())(g, picked, opset);
  };
}

gradcheck::Problem rnnProblem(const Rnn &r, std::vector<size_t> used) {
  gradcheck::Problem p(r.type, 14, rnnAttrs(r), rnnFeeds(r));
  p.outs = r.type == "LSTM" ? std::vector<TensorId>{"y0", "y1", "y2"} : std::vector<TensorId>{"y0", "y1"};
  p.loss = lossOver(std::move(used));
  return p;
}

void check(const Rnn &r, std::vector<size_t> used, unsigned seed) {
  SCOPED_TRACE(r.type + " " + r.direction + " layout " + std::to_string(r.layout) + " lbr " +
               std::to_string(r.linearBeforeReset) + " seed " + std::to_string(seed));
  gradcheck::Problem p = rnnProblem(r, std::move(used));
  // Weights smaller than the inputs, so that the gates do not saturate.
  gradcheck::fillStreams(p.feeds, seed, [](size_t k, double v) { return k == 1 || k == 2 ? 0.5 * v : v; });
  gradcheck::checkGradient(p, seed, 1e-5);
}

} // namespace

TEST(AutodiffRnn, LstmDirectionsAndLayouts) {
  unsigned seed = 1;
  for (const char *dir : {"forward", "reverse", "bidirectional"})
    for (int64_t layout : {0, 1}) {
      Rnn r;
      r.direction = dir;
      r.layout = layout;
      check(r, {0, 1, 2}, seed++);
    }
}

TEST(AutodiffRnn, GruDirectionsLayoutsAndLinearBeforeReset) {
  unsigned seed = 20;
  for (const char *dir : {"forward", "reverse", "bidirectional"})
    for (int64_t layout : {0, 1})
      for (int64_t lbr : {0, 1}) {
        Rnn r;
        r.type = "GRU";
        r.direction = dir;
        r.layout = layout;
        r.linearBeforeReset = lbr;
        check(r, {0, 1}, seed++);
      }
}

TEST(AutodiffRnn, RnnDirectionsAndLayouts) {
  unsigned seed = 40;
  for (const char *dir : {"forward", "reverse", "bidirectional"})
    for (int64_t layout : {0, 1}) {
      Rnn r;
      r.type = "RNN";
      r.direction = dir;
      r.layout = layout;
      check(r, {0, 1}, seed++);
    }
}

TEST(AutodiffRnn, OmittedInputsAndSomeOutputs) {
  Rnn lstm;
  lstm.bias = false;
  lstm.initialH = false;
  lstm.initialC = false;
  check(lstm, {0}, 60);
  lstm.bias = true;
  lstm.initialH = true;
  check(lstm, {2}, 61); // only Y_c, initial_c omitted
  check(lstm, {1}, 62); // only Y_h
  Rnn gru;
  gru.type = "GRU";
  gru.linearBeforeReset = 1;
  gru.initialH = false;
  gru.direction = "bidirectional";
  check(gru, {1}, 63);
  Rnn rnn;
  rnn.type = "RNN";
  rnn.bias = false;
  check(rnn, {1}, 64); // initial_h without B
  Rnn longer;
  longer.seq = 5;
  longer.hidden = 3;
  longer.batch = 1;
  check(longer, {0, 1, 2}, 65);
}

// layout = 1 is layout 0 with X, Y, the states and the initial states transposed (the forward
// kernel read initial_h and initial_c in layout 0's order whatever the layout).
TEST(AutodiffRnn, BatchFirstLayoutMatchesTransposedLayout) {
  for (const char *type : {"LSTM", "GRU", "RNN"}) {
    SCOPED_TRACE(type);
    Rnn r;
    r.type = type;
    r.direction = "bidirectional";
    r.batch = 3;
    Rnn rb = r;
    rb.layout = 1;
    gradcheck::Problem p0 = rnnProblem(r, {0}), p1 = rnnProblem(rb, {0});
    p0.exposeOutputs = p1.exposeOutputs = true;
    gradcheck::fillStreams(p0.feeds, 7);
    gradcheck::fillStreams(p1.feeds, 7);
    // Transpose X [seq, batch, in] -> [batch, seq, in] and the states [dirs, batch, h] -> [batch, dirs, h].
    auto transpose3 = [](const TensorData &from, TensorData &to) {
      const Shape &s = from.info().shape();
      for (int64_t a = 0; a < s[0]; ++a)
        for (int64_t b = 0; b < s[1]; ++b)
          for (int64_t c = 0; c < s[2]; ++c)
            to.as<double>()[(b * s[0] + a) * s[2] + c] = from.as<double>()[(a * s[1] + b) * s[2] + c];
    };
    for (size_t i = 0; i < p0.feeds.size(); ++i)
      if (p0.feeds[i].id == "x" || p0.feeds[i].id == "h0" || p0.feeds[i].id == "c0")
        transpose3(p0.feeds[i].data, p1.feeds[i].data);
      else if (!p0.feeds[i].id.empty())
        p1.feeds[i].data = p0.feeds[i].data;
    gradcheck::OpNet n0(p0, false), n1(p1, false);
    n0.run(p0.feeds);
    n1.run(p1.feeds);
    std::vector<double> y0 = n0.get<double>("y0"), y1 = n1.get<double>("y0");
    int64_t S = r.seq, D = 2, B = r.batch, H = r.hidden;
    for (int64_t t = 0; t < S; ++t)
      for (int64_t d = 0; d < D; ++d)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t j = 0; j < H; ++j)
            ASSERT_NEAR(y1[static_cast<size_t>(((b * S + t) * D + d) * H + j)],
                        y0[static_cast<size_t>(((t * D + d) * B + b) * H + j)], 1e-12);
    std::vector<double> s0 = n0.get<double>("y1"), s1 = n1.get<double>("y1");
    for (int64_t d = 0; d < D; ++d)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < H; ++j)
          ASSERT_NEAR(s1[static_cast<size_t>((b * D + d) * H + j)], s0[static_cast<size_t>((d * B + b) * H + j)],
                      1e-12);
  }
}

TEST(AutodiffRnn, UnsupportedAttributesNameTheNode) {
  auto expectError = [](Rnn r, ir::Attributes extra, const std::string &what, bool peepholes = false) {
    gradcheck::Problem p = rnnProblem(r, {0});
    for (const auto &[k, v] : extra.all())
      p.attrs.set(k, v);
    if (peepholes) p.feeds.push_back({"p", TensorData(TensorInfo(DataType::DOUBLE, {1, 3 * r.hidden})), true});
    auto g = gradcheck::buildGraph(p, nullptr);
    std::vector<TensorId> wrt{"x", "w"};
    gradcheck::expectGradientError(*g, g->outputs().front(), wrt, what);
    gradcheck::expectGradientError(*g, g->outputs().front(), wrt, "op");
  };
  Rnn lstm;
  expectError(lstm, gradcheck::attrs({{"clip", 1.5f}}), "clip");
  expectError(lstm, gradcheck::attrs({{"input_forget", int64_t{1}}}), "input_forget");
  expectError(lstm, gradcheck::attrs({{"activations", std::vector<std::string>{"Sigmoid", "Relu", "Tanh"}}}),
              "activation 'Relu'");
  expectError(lstm, {}, "peepholes", true);
  Rnn rnn;
  rnn.type = "RNN";
  expectError(rnn, gradcheck::attrs({{"activations", std::vector<std::string>{"Relu"}}}), "activation 'Relu'");
  // Explicit default activations are fine.
  Rnn gru;
  gru.type = "GRU";
  gradcheck::Problem p = rnnProblem(gru, {0});
  p.attrs.set("activations", std::vector<std::string>{"Sigmoid", "Tanh"});
  std::vector<TensorId> grads;
  EXPECT_NO_THROW(gradcheck::buildGraph(p, &grads));
}

TEST(AutodiffRnn, SequenceLensOnlyWhenFull) {
  for (int32_t len : {3, 2}) {
    Rnn r;
    r.initialC = false;
    gradcheck::Problem p = rnnProblem(r, {1});
    p.feeds[4] = {"lens", TensorData::fromDoubles(DataType::INT32, {r.batch}, {3.0, static_cast<double>(len)}), false};
    if (len == 3) {
      gradcheck::fillStreams(p.feeds, 80, [](size_t k, double v) { return k == 1 || k == 2 ? 0.5 * v : v; });
      gradcheck::checkGradient(p, 80);
    } else {
      auto g = gradcheck::buildGraph(p, nullptr);
      gradcheck::expectGradientError(*g, g->outputs().front(), {"x"}, "sequence_lens");
    }
  }
}
