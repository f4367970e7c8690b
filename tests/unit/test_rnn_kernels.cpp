// oneDNN kernels of LSTM, GRU, RNN and their grad ops against the reference kernels on random
// shapes: every cell (GRU with linear_before_reset 0 and 1), direction and layout, with and
// without biases and initial states, and grad ops given only some of the output gradients.

#include "kernel_compare.hpp"

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"

#include <gtest/gtest.h>

#include <random>

using namespace popart;

namespace {

struct Config {
  std::string type; // LSTM, GRU, RNN
  int64_t lbr = 0;
  std::string direction;
  int64_t layout = 0;
  bool bias = true, initial = true;
};

std::string describe(const Config &c, const Shape &dims) {
  return c.type + " lbr " + std::to_string(c.lbr) + " " + c.direction + " layout " + std::to_string(c.layout) +
         (c.bias ? " B" : "") + (c.initial ? " initial" : "") + " T,N,I,H " + toString(dims);
}

/// Builds the forward op of \p c (grad = false) or its grad op in \p g and returns it.
ir::Op &buildOp(ir::Graph &g, const Config &c, int64_t T, int64_t N, int64_t I, int64_t H, bool grad,
                std::mt19937 &rng) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 14;
  int64_t D = c.direction == "bidirectional" ? 2 : 1, G = c.type == "LSTM" ? 4 : c.type == "GRU" ? 3 : 1;
  bool lstm = c.type == "LSTM";
  auto stream = [&](const std::string &id, const Shape &s) {
    g.addTensor(id, ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, s));
    return id;
  };
  Shape x = c.layout ? Shape{N, T, I} : Shape{T, N, I}, state = c.layout ? Shape{N, D, H} : Shape{D, N, H};
  Shape y = c.layout ? Shape{N, T, D, H} : Shape{T, D, N, H};
  std::vector<TensorId> ins{stream("x", x), stream("w", {D, G * H, I}), stream("r", {D, G * H, H})};
  std::string b = c.bias ? stream("b", {D, 2 * G * H}) : "";
  std::string h0 = c.initial ? stream("h0", state) : "", c0 = c.initial && lstm ? stream("c0", state) : "";
  ir::Attributes a;
  a.set("direction", c.direction);
  a.set("hidden_size", H);
  a.set("layout", c.layout);
  if (c.type == "GRU") a.set("linear_before_reset", c.lbr);
  if (!grad) {
    ins.insert(ins.end(), {b, "", h0});
    if (lstm) ins.push_back(c0);
    std::vector<TensorId> outs{"y", "yh"};
    if (lstm) outs.push_back("yc");
    ir::Op &op = g.addOp(c.type, "ai.onnx", 14, "rnn", a, ins, outs);
    op.def->setup(op);
    return op;
  }
  // Output gradients: each present with probability 2/3, at least one.
  std::bernoulli_distribution some(2.0 / 3);
  bool dy = some(rng), dyh = some(rng), dyc = lstm && some(rng);
  if (!dy && !dyh && !dyc) dy = true;
  ins.insert(ins.end(),
             {b, h0, c0, dy ? stream("dy", y) : "", dyh ? stream("dyh", state) : "", dyc ? stream("dyc", state) : ""});
  std::vector<TensorId> outs{"dx", "dw", "dr", c.bias ? "db" : "", c.initial ? "dh0" : ""};
  if (lstm) outs.push_back(c.initial ? "dc0" : "");
  ir::Op &op = g.addOp(c.type + "Grad", "ai.graphcore", 1, "rnn_grad", a, ins, outs);
  op.def->setup(op);
  return op;
}

void compareOnRandomShapes(bool grad, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> len(1, 5), batch(1, 4), in(1, 7), hidden(1, 9);
  std::uniform_real_distribution<float> value(-1, 1);
  for (const char *type : {"LSTM", "GRU", "RNN"})
    for (int64_t lbr : {0, 1}) {
      if (lbr && std::string(type) != "GRU") continue;
      for (const char *dir : {"forward", "reverse", "bidirectional"})
        for (int64_t layout : {0, 1})
          for (int variant = 0; variant < 2; ++variant) {
            Config c{type, lbr, dir, layout, variant == 0, variant == 0};
            int64_t T = len(rng), N = batch(rng), I = in(rng), H = hidden(rng);
            SCOPED_TRACE(std::string(grad ? "grad " : "forward ") + describe(c, {T, N, I, H}) + " seed " +
                         std::to_string(seed));
            ir::Graph g;
            ir::Op &op = buildOp(g, c, T, N, I, H, grad, rng);
            kernel_compare::expectDnnlMatchesReference(op, rng, [&](size_t, std::mt19937 &r) { return value(r); });
          }
    }
}

} // namespace

TEST(RnnKernels, DnnlForwardMatchesReference) {
  backend_cpu::registerBuiltinKernels();
  compareOnRandomShapes(false, 1);
  compareOnRandomShapes(false, 2);
}

TEST(RnnKernels, DnnlGradMatchesReference) {
  backend_cpu::registerBuiltinKernels();
  compareOnRandomShapes(true, 3);
  compareOnRandomShapes(true, 4);
}

TEST(RnnKernels, DnnlDeclinesWhatItDoesNotCompute) {
  backend_cpu::registerBuiltinKernels();
  std::mt19937 rng(5);
  ir::Graph g;
  ir::Op &op = buildOp(g, {"LSTM", 0, "forward", 0, true, true}, 3, 2, 4, 5, false, rng);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(op)->provider, backend_cpu::KernelProvider::Dnnl);
  op.attrs.set("clip", 2.f);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(op)->provider, backend_cpu::KernelProvider::Reference);
  op.attrs.erase("clip");
  op.attrs.set("activations", std::vector<std::string>{"Sigmoid", "Relu", "Tanh"});
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(op)->provider, backend_cpu::KernelProvider::Reference);
}
