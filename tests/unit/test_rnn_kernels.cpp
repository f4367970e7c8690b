// oneDNN kernels of LSTM, GRU, RNN and their grad ops against the reference kernels on random
// shapes: every cell (GRU with linear_before_reset 0 and 1), direction and layout, with and
// without biases and initial states, and grad ops given only some of the output gradients.

#include "kernel_compare.hpp"

#include "backend_cpu/kernel.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/graph.hpp"
#include "ir/ops/rnn.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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
  op.attrs.erase("activations");
  // sequence_lens: a constant full length is the plain sequence; anything else is not.
  for (int32_t last : {3, 2}) {
    TensorId id = "lens" + std::to_string(last);
    g.addConst(id, TensorData::fromDoubles(DataType::INT32, {2}, {3.0, static_cast<double>(last)}));
    g.setOpInput(op, 4, &g.tensor(id));
    EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(op)->provider,
              last == 3 ? backend_cpu::KernelProvider::Dnnl : backend_cpu::KernelProvider::Reference);
  }
}

namespace {

/// The forward op of \p c and its grad op in one graph (all inputs streams, every output a graph
/// output), with the saved state between them when \p save; fed from \p seed and run with
/// \p provider. Returns the grad op's outputs (dX, dW, dR, dB, d initial_h [, d initial_c]).
std::vector<std::vector<float>> runForwardAndGrad(const Config &c, bool save, backend_cpu::KernelProvider provider,
                                                  unsigned seed, int *saved = nullptr) {
  std::mt19937 rng(seed);
  ir::Graph g;
  ir::Op &fwd = buildOp(g, c, 5, 3, 4, 6, false, rng);
  std::mt19937 gradRng(seed); // the same output-gradient choice every call
  ir::Graph scratch;
  ir::Op &shape = buildOp(scratch, c, 5, 3, 4, 6, true, gradRng);
  std::vector<TensorId> ins;
  for (size_t i = 0; i < shape.inputCount(); ++i) {
    TensorId id = shape.hasInput(i) ? shape.input(i).id() : "";
    if (!id.empty() && !g.hasTensor(id)) g.addTensor(id, ir::TensorKind::Stream, shape.inInfo(i));
    ins.push_back(id);
  }
  std::vector<TensorId> outs;
  for (size_t i = 0; i < shape.outputCount(); ++i)
    outs.push_back(shape.hasOutput(i) ? shape.output(i).id() : "");
  ir::Attributes a = shape.attrs;
  a.set("popart_forward", fwd.id);
  ir::Op &grad = g.addOp(shape.type, "ai.graphcore", 1, "rnn_grad", a, ins, outs);
  grad.def->setup(grad);
  for (const auto &[id, t] : g.tensors())
    if (t->kind() == ir::TensorKind::Stream) g.addInput(id);
  for (const auto *t : fwd.outputs)
    if (t) g.addOutput(t->id());
  for (const auto &o : outs)
    if (!o.empty()) g.addOutput(o);
  int n = save ? ir::saveRecurrentState(g, [](const ir::Op &op) { return backend_cpu::recurrentSavedBytes(op); }) : 0;
  if (saved) *saved = n;
  backend_cpu::ExecutionPlan plan(g, {provider});
  std::uniform_real_distribution<float> value(-1, 1);
  std::mt19937 fill(seed + 1);
  for (const auto &id : g.inputs()) {
    auto *p = static_cast<float *>(plan.address(id));
    for (int64_t k = 0; k < plan.info(id).elementCount(); ++k)
      p[k] = value(fill);
  }
  plan.run();
  plan.run(); // a second run reads the saved state of its own forward
  std::vector<std::vector<float>> result;
  for (const auto &o : outs) {
    if (o.empty()) continue;
    const auto *p = static_cast<const float *>(plan.address(o));
    result.emplace_back(p, p + plan.info(o).elementCount());
  }
  return result;
}

} // namespace

// The oneDNN grad kernels reading the workspace that the oneDNN forward kept (ir::saveRecurrentState)
// give what the reference kernels give.
TEST(RnnKernels, SavedStateMatchesRecomputation) {
  backend_cpu::registerBuiltinKernels();
  unsigned seed = 10;
  for (Config c : {Config{"LSTM", 0, "bidirectional", 0, true, true}, Config{"LSTM", 0, "forward", 1, true, true},
                   Config{"GRU", 1, "reverse", 0, true, false}, Config{"GRU", 0, "bidirectional", 1, false, true},
                   Config{"RNN", 0, "forward", 0, true, true}}) {
    SCOPED_TRACE(describe(c, {5, 3, 4, 6}));
    int saved = 0;
    auto fast = runForwardAndGrad(c, true, backend_cpu::KernelProvider::Any, seed, &saved);
    EXPECT_EQ(saved, 1);
    auto ref = runForwardAndGrad(c, false, backend_cpu::KernelProvider::Reference, seed);
    // Reference kernels given a saved state: the forward marks it unusable, the grad recomputes.
    auto refSaved = runForwardAndGrad(c, true, backend_cpu::KernelProvider::Reference, seed);
    ASSERT_EQ(fast.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i)
      for (size_t k = 0; k < ref[i].size(); ++k) {
        ASSERT_NEAR(fast[i][k], ref[i][k], 1e-4 * (1 + std::fabs(ref[i][k]))) << "output " << i << "[" << k << "]";
        ASSERT_EQ(refSaved[i][k], ref[i][k]) << "output " << i << "[" << k << "]";
      }
    ++seed;
  }
}

// A oneDNN grad kernel given a saved state that the oneDNN forward did not write (a reference
// forward zeroes its header) recomputes the forward pass.
TEST(RnnKernels, DnnlGradRecomputesWithoutItsWorkspace) {
  backend_cpu::registerBuiltinKernels();
  std::mt19937 rng(20);
  ir::Graph g, forwardGraph;
  Config c{"LSTM", 0, "bidirectional", 0, true, true};
  ir::Op &fwd = buildOp(forwardGraph, c, 4, 2, 3, 5, false, rng);
  ir::Op &grad = buildOp(g, c, 4, 2, 3, 5, true, rng);
  int64_t bytes = backend_cpu::recurrentSavedBytes(fwd);
  ASSERT_GT(bytes, 64);
  g.addTensor("saved", ir::TensorKind::Stream, TensorInfo(DataType::UINT8, {bytes}));
  g.setOpInput(grad, 9, &g.tensor("saved"));
  grad.def->setup(grad);
  std::vector<TensorData> inputs;
  std::vector<const void *> in;
  std::uniform_real_distribution<float> value(-1, 1);
  for (size_t i = 0; i < grad.inputCount(); ++i) {
    inputs.emplace_back(grad.hasInput(i) ? grad.inInfo(i) : TensorInfo(DataType::FLOAT, {0}));
    if (i < 9)
      for (int64_t k = 0; k < inputs.back().info().elementCount(); ++k)
        inputs.back().as<float>()[k] = value(rng);
    in.push_back(grad.hasInput(i) ? inputs.back().data() : nullptr);
  }
  std::memset(inputs[9].data(), 0, static_cast<size_t>(bytes)); // no header: garbage otherwise
  std::vector<TensorData> ref, out;
  std::vector<void *> refp, outp;
  for (size_t i = 0; i < grad.outputCount(); ++i) {
    ref.emplace_back(grad.outInfo(i));
    out.emplace_back(grad.outInfo(i));
    refp.push_back(ref.back().data());
    outp.push_back(out.back().data());
  }
  backend_cpu::createKernel(grad, backend_cpu::KernelProvider::Reference)
      ->run({in.data(), in.size(), refp.data(), refp.size()});
  backend_cpu::createKernel(grad, backend_cpu::KernelProvider::Dnnl)
      ->run({in.data(), in.size(), outp.data(), outp.size()});
  for (size_t i = 0; i < grad.outputCount(); ++i)
    EXPECT_LT(kernel_compare::maxRelDiff(out[i], ref[i]), 1e-4) << "output " << i;
}

TEST(RnnFlops, GateProductsOfEveryStepAreCounted) {
  // The profiler's and bench/compare's FLOPs: each of T·N rows multiplies the input (I) and the
  // previous hidden state (H) into gates·H values per direction, 2 FLOPs per multiply-add.
  ir::registerBuiltinOps();
  const int64_t t = 5, n = 3, in = 4, h = 6;
  struct Family {
    const char *type;
    int64_t gates;
  };
  for (Family f : {Family{"LSTM", 4}, Family{"GRU", 3}, Family{"RNN", 1}})
    for (int64_t dirs : {1, 2}) {
      ir::Graph g;
      g.opsets()["ai.onnx"] = 14;
      g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {t, n, in}));
      g.addTensor("w", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {dirs, f.gates * h, in}));
      g.addTensor("r", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {dirs, f.gates * h, h}));
      ir::Attributes a;
      a.set("hidden_size", h);
      if (dirs == 2) a.set("direction", std::string("bidirectional"));
      ir::Op &op = g.addOp(f.type, "ai.onnx", 14, "", a, {"x", "w", "r"}, {"y"});
      op.def->setup(op);
      double macs = 0;
      for (int64_t step = 0; step < t * n * dirs; ++step)
        macs += static_cast<double>(f.gates * h * (in + h));
      EXPECT_EQ(backend_cpu::estimateFlops(op), 2 * macs) << f.type << " directions " << dirs;
    }
}
