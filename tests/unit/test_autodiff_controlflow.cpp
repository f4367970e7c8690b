// Gradients through control flow: If with a constant condition, Loop with a trip count known at
// compile time and Scan are unrolled (ir::unrollControlFlow) before autodiff. The gradients of the
// unrolled graph are checked against central differences of the original graph, whose If, Loop
// and Scan run as subgraph kernels, so a wrong unrolling fails as well as a wrong gradient.

#include "gradcheck.hpp"

#include "autodiff/autodiff.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cstring>

using namespace popart;

namespace {

const TensorInfo kD2(DataType::DOUBLE, {2});

void input(ir::Graph &g, const TensorId &id, const TensorInfo &info) {
  g.addTensor(id, ir::TensorKind::Stream, info);
  g.addInput(id);
}

std::shared_ptr<ir::Graph> subgraph() {
  // Unrolling specialises subgraphs with the reference folder the kernels register.
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  auto b = std::make_shared<ir::Graph>();
  b->opsets()["ai.onnx"] = 13;
  return b;
}

size_t countOps(const ir::Graph &g, const std::string &type) {
  size_t n = 0;
  for (const auto &op : g.ops())
    n += op->type == type ? 1 : 0;
  return n;
}

/// Unrolls \p type ops and expects none left.
std::function<void(ir::Graph &)> unrollAll(const std::string &type) {
  return [type](ir::Graph &g) {
    EXPECT_GE(ir::unrollControlFlow(g), 1) << type;
    EXPECT_EQ(countOps(g, type), 0u) << type << " left after unrolling:\n" << g.dump();
  };
}

/// If(cond; then: tanh(p·q); else: p − q·q) of the captured streams p, q.
gradcheck::Problem ifProblem(bool cond, bool constantCondition = true) {
  auto thenB = subgraph(), elseB = subgraph();
  for (auto *b : {thenB.get(), elseB.get()}) {
    input(*b, "p", kD2);
    input(*b, "q", kD2);
  }
  thenB->addOp("Mul", "ai.onnx", 13, "", {}, {"p", "q"}, {"xy"});
  thenB->addOp("Tanh", "ai.onnx", 13, "", {}, {"xy"}, {"r"});
  thenB->addOutput("r");
  elseB->addOp("Mul", "ai.onnx", 13, "", {}, {"q", "q"}, {"yy"});
  elseB->addOp("Sub", "ai.onnx", 13, "", {}, {"p", "yy"}, {"r"});
  elseB->addOutput("r");
  ir::Attributes a;
  a.set("then_branch", std::shared_ptr<const ir::Graph>(thenB));
  a.set("else_branch", std::shared_ptr<const ir::Graph>(elseB));
  a.set("popart_captures", std::vector<std::string>{"p", "q"});
  TensorData c = TensorData::fromDoubles(DataType::BOOL, {}, {cond ? 1.0 : 0.0});
  gradcheck::Problem p{
      "If", 13, a, {{"cond", c, !constantCondition}, {"p", TensorData(kD2), true}, {"q", TensorData(kD2), true}}};
  p.beforeGradients = unrollAll("If");
  return p;
}

/// Loop(M, cond, h0; captured w): h ← tanh(h·w) each iteration, scan output h·h + i (the iteration
/// number). With \p stopAfter >= 0 the body's condition is i < stopAfter (folded per iteration)
/// and there is no scan output.
gradcheck::Problem loopProblem(int64_t trips, int stopAfter = -1, bool constantTrips = true) {
  auto body = subgraph();
  input(*body, "i", TensorInfo(DataType::INT64, {}));
  input(*body, "c", TensorInfo(DataType::BOOL, {}));
  input(*body, "h", kD2);
  input(*body, "w", kD2);
  body->addOp("Mul", "ai.onnx", 13, "", {}, {"h", "w"}, {"hw"});
  body->addOp("Tanh", "ai.onnx", 13, "", {}, {"hw"}, {"hn"});
  if (stopAfter >= 0) {
    body->addConst("limit", TensorData::fromInt64({}, {stopAfter}));
    body->addOp("Less", "ai.onnx", 13, "", {}, {"i", "limit"}, {"more"});
    body->addOutput("more");
    body->addOutput("hn");
  } else {
    ir::Attributes toDouble;
    toDouble.set("to", static_cast<int64_t>(DataType::DOUBLE));
    body->addOp("Cast", "ai.onnx", 13, "", toDouble, {"i"}, {"id"});
    body->addOp("Mul", "ai.onnx", 13, "", {}, {"hn", "hn"}, {"sq"});
    body->addOp("Add", "ai.onnx", 13, "", {}, {"sq", "id"}, {"s"});
    body->addOutput("c");
    body->addOutput("hn");
    body->addOutput("s");
  }
  ir::Attributes a;
  a.set("body", std::shared_ptr<const ir::Graph>(body));
  a.set("popart_captures", std::vector<std::string>{"w"});
  gradcheck::Problem p{"Loop",
                       13,
                       a,
                       {{"M", TensorData::fromInt64({}, {trips}), !constantTrips},
                        {"cond", TensorData::fromDoubles(DataType::BOOL, {}, {1.0}), false},
                        {"h0", TensorData(kD2), true},
                        {"w", TensorData(kD2), true}}};
  p.outs = stopAfter >= 0 ? std::vector<TensorId>{"y0"} : std::vector<TensorId>{"y0", "y1"};
  p.loss = gradcheck::weightedSumLoss(p.outs.size());
  p.beforeGradients = unrollAll("Loop");
  return p;
}

/// Loop(M = 3, true, h0; captured w) whose body is If(i == 0; then: h·w; else: tanh(h·w)), the If
/// capturing h from the body and w from the body's own capture.
gradcheck::Problem loopWithIfProblem() {
  gradcheck::Problem p = loopProblem(3, 2);
  auto thenB = subgraph(), elseB = subgraph();
  for (auto *b : {thenB.get(), elseB.get()}) {
    input(*b, "h", kD2);
    input(*b, "w", kD2);
    b->addOp("Mul", "ai.onnx", 13, "", {}, {"h", "w"}, {"hw"});
  }
  thenB->addOutput("hw");
  elseB->addOp("Tanh", "ai.onnx", 13, "", {}, {"hw"}, {"r"});
  elseB->addOutput("r");
  auto body = subgraph();
  input(*body, "i", TensorInfo(DataType::INT64, {}));
  input(*body, "c", TensorInfo(DataType::BOOL, {}));
  input(*body, "h", kD2);
  input(*body, "w", kD2);
  body->addConst("zero", TensorData::fromInt64({}, {0}));
  body->addOp("Equal", "ai.onnx", 13, "", {}, {"i", "zero"}, {"first"});
  ir::Attributes ifAttrs;
  ifAttrs.set("then_branch", std::shared_ptr<const ir::Graph>(thenB));
  ifAttrs.set("else_branch", std::shared_ptr<const ir::Graph>(elseB));
  ifAttrs.set("popart_captures", std::vector<std::string>{"h", "w"});
  body->addOp("If", "ai.onnx", 13, "inner", ifAttrs, {"first", "h", "w"}, {"hn"});
  body->addOutput("c");
  body->addOutput("hn");
  p.attrs.set("body", std::shared_ptr<const ir::Graph>(body));
  p.beforeGradients = [](ir::Graph &g) {
    EXPECT_EQ(ir::unrollControlFlow(g), 4); // the Loop, then one If per iteration
    EXPECT_EQ(countOps(g, "Loop") + countOps(g, "If"), 0u) << g.dump();
    EXPECT_EQ(countOps(g, "Tanh"), 2u) << g.dump();
  };
  return p;
}

/// Scan(s0, X; captured w): s ← tanh(s·w + x_t), scan output s·x_t. \p axis and \p reverse apply to
/// the scan input and the scan output alike.
gradcheck::Problem scanProblem(int64_t axis, bool reverse) {
  auto body = subgraph();
  input(*body, "s", kD2);
  input(*body, "x", kD2);
  input(*body, "w", kD2);
  body->addOp("Mul", "ai.onnx", 13, "", {}, {"s", "w"}, {"sw"});
  body->addOp("Add", "ai.onnx", 13, "", {}, {"sw", "x"}, {"a"});
  body->addOp("Tanh", "ai.onnx", 13, "", {}, {"a"}, {"sn"});
  body->addOp("Mul", "ai.onnx", 13, "", {}, {"sn", "x"}, {"o"});
  body->addOutput("sn");
  body->addOutput("o");
  ir::Attributes a;
  a.set("body", std::shared_ptr<const ir::Graph>(body));
  a.set("popart_captures", std::vector<std::string>{"w"});
  a.set("num_scan_inputs", int64_t{1});
  a.set("scan_input_axes", std::vector<int64_t>{axis});
  a.set("scan_input_directions", std::vector<int64_t>{reverse ? 1 : 0});
  a.set("scan_output_axes", std::vector<int64_t>{axis});
  a.set("scan_output_directions", std::vector<int64_t>{reverse ? 1 : 0});
  Shape xs = axis == 0 ? Shape{4, 2} : Shape{2, 4};
  gradcheck::Problem p{"Scan",
                       13,
                       a,
                       {{"init", TensorData(kD2), true},
                        {"X", TensorData(TensorInfo(DataType::DOUBLE, xs)), true},
                        {"w", TensorData(kD2), true}}};
  p.outs = {"y0", "y1"};
  p.loss = gradcheck::weightedSumLoss(2);
  p.beforeGradients = unrollAll("Scan");
  return p;
}

void check(gradcheck::Problem p, unsigned seed) {
  // Streams after the first in [0.5, 1.5): w there keeps tanh away from saturation, so the gradients are not all tiny.
  gradcheck::fillStreams(p.feeds, seed, [](size_t k, double v) { return k >= 1 ? 1 + v / 4 : v; });
  gradcheck::checkGradient(p, seed);
}

} // namespace

TEST(AutodiffControlFlow, IfWithAConstantConditionDifferentiatesTheTakenBranch) {
  for (bool cond : {true, false})
    for (unsigned seed : {1u, 2u})
      check(ifProblem(cond), seed);
}

TEST(AutodiffControlFlow, LoopWithAStaticTripCountCarriesStateAndScanOutputs) {
  for (int64_t trips : {1, 3})
    for (unsigned seed : {3u, 4u})
      check(loopProblem(trips), seed);
}

TEST(AutodiffControlFlow, LoopConditionComputedFromTheIterationNumberFolds) {
  // M = 10, but the body's condition i < 2 stops it after three iterations.
  gradcheck::Problem p = loopProblem(10, 2);
  check(p, 5);
  std::vector<TensorId> grads;
  auto g = gradcheck::buildGraph(p, &grads);
  EXPECT_EQ(countOps(*g, "Tanh"), 3u);
}

TEST(AutodiffControlFlow, NestedIfInALoopBodyUnrollsOutsideIn) {
  for (unsigned seed : {12u, 13u})
    check(loopWithIfProblem(), seed);
}

TEST(AutodiffControlFlow, ScanOverEitherAxisAndDirection) {
  for (int64_t axis : {0, 1})
    for (bool reverse : {false, true})
      check(scanProblem(axis, reverse), 6 + static_cast<unsigned>(axis) * 2 + (reverse ? 1 : 0));
}

TEST(AutodiffControlFlow, UnrollingKeepsForwardResults) {
  std::vector<gradcheck::Problem> problems{ifProblem(true), loopProblem(3), scanProblem(1, true)};
  for (auto &p : problems) {
    gradcheck::fillStreams(p.feeds, 11);
    p.exposeOutputs = true;
    auto original = gradcheck::buildGraph(p, nullptr);
    auto unrolled = gradcheck::buildGraph(p, nullptr);
    ASSERT_GE(ir::unrollControlFlow(*unrolled), 1) << p.type;
    ir::inferShapes(*unrolled, nullptr);
    backend_cpu::ExecutionPlan a(*original, {}), b(*unrolled, {});
    for (auto *plan : {&a, &b}) {
      for (const auto &f : p.feeds)
        if (f.stream) std::memcpy(plan->address(f.id), f.data.data(), static_cast<size_t>(f.data.byteCount()));
      plan->run();
    }
    for (const auto &o : p.outs) {
      ASSERT_EQ(a.info(o), b.info(o)) << p.type << " " << o;
      const auto *x = static_cast<const double *>(a.address(o));
      const auto *y = static_cast<const double *>(b.address(o));
      for (int64_t i = 0; i < a.info(o).elementCount(); ++i)
        EXPECT_EQ(x[i], y[i]) << p.type << " " << o << "[" << i << "]";
    }
  }
}

TEST(AutodiffControlFlow, RunTimeTripCountOrConditionIsAnErrorNamingTheLoopOrIf) {
  {
    gradcheck::Problem p = loopProblem(3, 2, /*constantTrips=*/false);
    auto g = gradcheck::buildGraph(p, nullptr);
    EXPECT_EQ(ir::unrollControlFlow(*g), 0);
    gradcheck::expectGradientError(*g, g->outputs()[0], {"w"}, "Loop 'op': cannot differentiate");
    gradcheck::expectGradientError(*g, g->outputs()[0], {"w"}, "trip count M ('M') is known only at run time");
  }
  {
    gradcheck::Problem p = ifProblem(true, /*constantCondition=*/false);
    auto g = gradcheck::buildGraph(p, nullptr);
    EXPECT_EQ(ir::unrollControlFlow(*g), 0);
    gradcheck::expectGradientError(*g, g->outputs()[0], {"p"}, "If 'op': cannot differentiate");
    gradcheck::expectGradientError(*g, g->outputs()[0], {"p"}, "condition 'cond' is known only at run time");
  }
}

TEST(AutodiffControlFlow, UnrollingPastTheLimitIsLeftAloneAndNamed) {
  gradcheck::Problem p = loopProblem(100);
  auto g = gradcheck::buildGraph(p, nullptr);
  ir::UnrollOptions small;
  small.maxOps = 50;
  EXPECT_EQ(ir::unrollControlFlow(*g, {}, small), 0);
  EXPECT_EQ(countOps(*g, "Loop"), 1u);
  const ir::Op *loop = nullptr;
  for (const auto &op : g->ops())
    if (op->type == "Loop") loop = op.get();
  std::string why = ir::unrollObstacle(*loop, small);
  EXPECT_NE(why.find("over the limit of 50"), std::string::npos) << why;
  EXPECT_EQ(ir::unrollObstacle(*loop), "");
}

TEST(AutodiffControlFlow, GradientOpThroughALoopUnrollsIt) {
  gradcheck::Problem p = loopProblem(3);
  gradcheck::fillStreams(p.feeds, 14, [](size_t k, double v) { return k >= 1 ? 1 + v / 4 : v; });
  gradcheck::OpNet reference(p, true);
  reference.run(p.feeds);
  auto g = gradcheck::buildGraph(p, nullptr);
  ir::Attributes a;
  a.set("xs", std::vector<std::string>{"h0", "w"});
  a.set("y", g->outputs()[0]);
  g->addOp("Gradient", "ai.onnx.preview.training", 1, "gradient", a, {"h0", "w"}, {"dh0", "dw"});
  g->addOutput("dh0");
  g->addOutput("dw");
  autodiff::expandGradientOps(*g);
  ir::inferShapes(*g, nullptr);
  EXPECT_EQ(countOps(*g, "Loop"), 0u);
  backend_cpu::ExecutionPlan plan(*g, {});
  for (const auto &f : p.feeds)
    if (f.stream) std::memcpy(plan.address(f.id), f.data.data(), static_cast<size_t>(f.data.byteCount()));
  plan.run();
  std::vector<std::vector<double>> expected = reference.gradients();
  for (size_t k = 0; k < 2; ++k) {
    const auto *got = static_cast<const double *>(plan.address(k == 0 ? "dh0" : "dw"));
    for (size_t i = 0; i < expected[k].size(); ++i)
      EXPECT_EQ(got[i], expected[k][i]) << k << " " << i;
  }
}

TEST(AutodiffControlFlow, LoopConditionFromACapturedOuterConstantFolds) {
  // As torch.jit.script exports a for loop: the body's condition is an Identity of an outer
  // `true` that the Loop captures (a Constant node, folded after import).
  gradcheck::Problem p = loopProblem(3, 2);
  auto body = subgraph();
  input(*body, "i", TensorInfo(DataType::INT64, {}));
  input(*body, "c", TensorInfo(DataType::BOOL, {}));
  input(*body, "h", kD2);
  input(*body, "w", kD2);
  input(*body, "yes", TensorInfo(DataType::BOOL, {}));
  body->addOp("Mul", "ai.onnx", 13, "", {}, {"h", "w"}, {"hw"});
  body->addOp("Tanh", "ai.onnx", 13, "", {}, {"hw"}, {"hn"});
  body->addOp("Identity", "ai.onnx", 13, "", {}, {"yes"}, {"more"});
  body->addOutput("more");
  body->addOutput("hn");
  p.attrs.set("body", std::shared_ptr<const ir::Graph>(body));
  p.attrs.set("popart_captures", std::vector<std::string>{"w", "yes"});
  p.feeds.push_back({"yes", TensorData::fromDoubles(DataType::BOOL, {}, {1.0}), false});
  check(p, 15);
  std::vector<TensorId> grads;
  auto g = gradcheck::buildGraph(p, &grads);
  EXPECT_EQ(countOps(*g, "Tanh"), 3u);
}
