// If, Loop, Scan and the sequence ops: IR setup and reference kernels through ExecutionPlan,
// with expected values computed here from the ops' definitions; bad subgraph signatures.

#include "backend_cpu/plan.hpp"
#include "ir/ops/controlflow.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cstring>

using namespace popart;
using namespace popart::ir;

namespace {

const TensorInfo kF2(DataType::FLOAT, {2});

void setup() {
  registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
}

Tensor &input(Graph &g, const TensorId &id, const TensorInfo &info) {
  Tensor &t = g.addTensor(id, TensorKind::Stream, info);
  g.addInput(id);
  return t;
}

/// Compiles \p g (shapes inferred), feeds \p feeds and runs it.
std::unique_ptr<backend_cpu::ExecutionPlan> compileAndRun(Graph &g, const std::map<TensorId, TensorData> &feeds) {
  backend_cpu::ReferenceEvaluator folder;
  inferShapes(g, &folder);
  auto plan = std::make_unique<backend_cpu::ExecutionPlan>(g, backend_cpu::CompileOptions{});
  for (const auto &[id, data] : feeds)
    std::memcpy(plan->address(id), data.data(), static_cast<size_t>(data.byteCount()));
  plan->run();
  return plan;
}

std::vector<float> floats(const backend_cpu::ExecutionPlan &plan, const TensorId &id) {
  const float *p = static_cast<const float *>(plan.address(id));
  return std::vector<float>(p, p + plan.info(id).elementCount());
}

TensorData f2(float a, float b) { return TensorData::fromDoubles(DataType::FLOAT, {2}, {a, b}); }
TensorData boolean(bool v) { return TensorData::fromDoubles(DataType::BOOL, {}, {v ? 1.0 : 0.0}); }

/// A branch computing \p type(x, y) of the outer tensors x and y (captured).
std::shared_ptr<const Graph> branch(const std::string &type) {
  auto b = std::make_shared<Graph>();
  b->opsets()["ai.onnx"] = 13;
  input(*b, "x", kF2);
  input(*b, "y", kF2);
  b->addOp(type, "ai.onnx", 13, type, {}, {"x", "y"}, {"r"});
  b->addOutput("r");
  return b;
}

} // namespace

TEST(ControlFlow, IfRunsTheChosenBranchWithCapturedTensors) {
  setup();
  for (bool c : {true, false}) {
    Graph g;
    input(g, "cond", TensorInfo(DataType::BOOL, {}));
    input(g, "x", kF2);
    input(g, "y", kF2);
    Attributes a;
    a.set("then_branch", branch("Add"));
    a.set("else_branch", branch("Sub"));
    a.set("popart_captures", std::vector<std::string>{"x", "y"});
    g.addOp("If", "ai.onnx", 13, "if", a, {"cond", "x", "y"}, {"out"});
    g.addOutput("out");
    auto plan = compileAndRun(g, {{"cond", boolean(c)}, {"x", f2(5, 7)}, {"y", f2(1, 2)}});
    EXPECT_EQ(floats(*plan, "out"), c ? std::vector<float>({6, 9}) : std::vector<float>({4, 5}));
  }
}

TEST(ControlFlow, IfBranchWithWrongOutputCountIsNamed) {
  setup();
  Graph g;
  input(g, "cond", TensorInfo(DataType::BOOL, {}));
  input(g, "x", kF2);
  input(g, "y", kF2);
  Attributes a;
  a.set("then_branch", branch("Add"));
  a.set("else_branch", branch("Sub"));
  a.set("popart_captures", std::vector<std::string>{"x", "y"});
  g.addOp("If", "ai.onnx", 13, "bad_if", a, {"cond", "x", "y"}, {"out", "extra"});
  try {
    inferShapes(g, nullptr);
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("bad_if"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("subgraph 'then_branch' has 1 outputs, expected 2"), std::string::npos)
        << e.what();
  }
}

namespace {
/// Loop body: acc_out = acc_in + x (x captured), scan = acc_out, cond passed through.
std::shared_ptr<const Graph> accumulateBody(bool withIteration = true) {
  auto b = std::make_shared<Graph>();
  b->opsets()["ai.onnx"] = 13;
  if (withIteration) input(*b, "i", TensorInfo(DataType::INT64, {}));
  input(*b, "c", TensorInfo(DataType::BOOL, {}));
  input(*b, "acc", kF2);
  input(*b, "x", kF2);
  b->addOp("Identity", "ai.onnx", 13, "", {}, {"c"}, {"c_out"});
  b->addOp("Add", "ai.onnx", 13, "", {}, {"acc", "x"}, {"acc_out"});
  b->addOp("Identity", "ai.onnx", 13, "", {}, {"acc_out"}, {"scan"});
  b->addOutput("c_out");
  b->addOutput("acc_out");
  b->addOutput("scan");
  return b;
}
} // namespace

TEST(ControlFlow, LoopCarriesStateAndStacksScanOutputs) {
  setup();
  Graph g;
  g.addConst("M", TensorData::fromInt64({}, {4}));
  input(g, "init", kF2);
  input(g, "x", kF2);
  Attributes a;
  a.set("body", accumulateBody());
  a.set("popart_captures", std::vector<std::string>{"x"});
  g.addOp("Loop", "ai.onnx", 13, "loop", a, {"M", "", "init", "x"}, {"final", "stacked"});
  g.addOutput("final");
  g.addOutput("stacked");
  auto plan = compileAndRun(g, {{"init", f2(1, -1)}, {"x", f2(0.5f, 2)}});
  EXPECT_EQ(plan->info("stacked").shape(), (Shape{4, 2}));
  EXPECT_EQ(floats(*plan, "final"), std::vector<float>({1 + 4 * 0.5f, -1 + 4 * 2.f}));
  std::vector<float> want;
  for (int k = 1; k <= 4; ++k) {
    want.push_back(1 + k * 0.5f);
    want.push_back(-1 + k * 2.f);
  }
  EXPECT_EQ(floats(*plan, "stacked"), want);
}

TEST(ControlFlow, LoopBodyWithWrongInputCountIsNamed) {
  setup();
  Graph g;
  g.addConst("M", TensorData::fromInt64({}, {4}));
  input(g, "init", kF2);
  input(g, "x", kF2);
  Attributes a;
  a.set("body", accumulateBody(false)); // no iteration-number input
  a.set("popart_captures", std::vector<std::string>{"x"});
  g.addOp("Loop", "ai.onnx", 13, "short_loop", a, {"M", "", "init", "x"}, {"final", "stacked"});
  try {
    inferShapes(g, nullptr);
    FAIL() << "expected an error";
  } catch (const error &e) {
    std::string m = e.what();
    EXPECT_NE(m.find("short_loop"), std::string::npos) << m;
    EXPECT_NE(m.find("subgraph 'body' takes 2 inputs, expected 3"), std::string::npos) << m;
  }
}

TEST(ControlFlow, LoopSpecialisesABodyWhoseShapesDependOnTheIteration) {
  // out_i = sum(x[0 : i + 1]) through Slice(x, 0, i + 1): the slice's shape depends on i, so the
  // body is specialised per iteration number; the scan output has the same shape every time.
  setup();
  auto b = std::make_shared<Graph>();
  b->opsets()["ai.onnx"] = 13;
  input(*b, "i", TensorInfo(DataType::INT64, {}));
  input(*b, "c", TensorInfo(DataType::BOOL, {}));
  input(*b, "x", TensorInfo(DataType::FLOAT, {3}));
  b->addConst("zero", TensorData::fromInt64({1}, {0}));
  b->addConst("one", TensorData::fromInt64({}, {1}));
  b->addConst("axes0", TensorData::fromInt64({1}, {0}));
  b->addOp("Identity", "ai.onnx", 13, "", {}, {"c"}, {"c_out"});
  b->addOp("Add", "ai.onnx", 13, "", {}, {"i", "one"}, {"end0"});
  b->addOp("Unsqueeze", "ai.onnx", 13, "", {}, {"end0", "axes0"}, {"end"});
  b->addOp("Slice", "ai.onnx", 13, "", {}, {"x", "zero", "end"}, {"part"});
  Attributes keep;
  keep.set("keepdims", int64_t{1});
  b->addOp("ReduceSum", "ai.onnx", 13, "", keep, {"part", "axes0"}, {"s"});
  b->addOutput("c_out");
  b->addOutput("s");
  Graph g;
  g.addConst("M", TensorData::fromInt64({}, {3}));
  input(g, "x", TensorInfo(DataType::FLOAT, {3}));
  Attributes a;
  a.set("body", std::shared_ptr<const Graph>(b));
  a.set("popart_captures", std::vector<std::string>{"x"});
  g.addOp("Loop", "ai.onnx", 13, "loop", a, {"M", "", "x"}, {"sums"});
  g.addOutput("sums");
  // The body's output types, as a model declares them (the importer keeps them).
  b->tensor("c_out").setInfo(TensorInfo(DataType::BOOL, {}));
  b->tensor("s").setInfo(TensorInfo(DataType::FLOAT, {1}));
  auto plan = compileAndRun(g, {{"x", TensorData::fromDoubles(DataType::FLOAT, {3}, {1, 10, 100})}});
  EXPECT_EQ(floats(*plan, "sums"), std::vector<float>({1, 11, 111}));
  plan->run(); // the cached specialisations again
  EXPECT_EQ(floats(*plan, "sums"), std::vector<float>({1, 11, 111}));
}

TEST(ControlFlow, ScanRunsOverAnAxisInEitherDirection) {
  setup();
  for (int64_t reverse : {0, 1}) {
    auto b = std::make_shared<Graph>();
    b->opsets()["ai.onnx"] = 13;
    input(*b, "s", kF2);
    input(*b, "row", kF2);
    b->addOp("Add", "ai.onnx", 13, "", {}, {"s", "row"}, {"s_out"});
    b->addOp("Identity", "ai.onnx", 13, "", {}, {"s_out"}, {"y"});
    b->addOutput("s_out");
    b->addOutput("y");
    Graph g;
    input(g, "init", kF2);
    input(g, "xs", TensorInfo(DataType::FLOAT, {3, 2}));
    Attributes a;
    a.set("body", std::shared_ptr<const Graph>(b));
    a.set("num_scan_inputs", int64_t{1});
    a.set("scan_input_directions", std::vector<int64_t>{reverse});
    g.addOp("Scan", "ai.onnx", 11, "scan", a, {"init", "xs"}, {"total", "partial"});
    g.addOutput("total");
    g.addOutput("partial");
    std::vector<double> xs{1, 2, 3, 4, 5, 6};
    auto plan = compileAndRun(g, {{"init", f2(0, 100)}, {"xs", TensorData::fromDoubles(DataType::FLOAT, {3, 2}, xs)}});
    EXPECT_EQ(floats(*plan, "total"), std::vector<float>({9, 112}));
    std::vector<float> want;
    float s0 = 0, s1 = 100;
    for (int t = 0; t < 3; ++t) {
      int row = reverse ? 2 - t : t;
      s0 += static_cast<float>(xs[static_cast<size_t>(2 * row)]);
      s1 += static_cast<float>(xs[static_cast<size_t>(2 * row + 1)]);
      want.push_back(s0);
      want.push_back(s1);
    }
    EXPECT_EQ(floats(*plan, "partial"), want);
  }
}

TEST(ControlFlow, Scan8InputsAndStatesOfAnotherBatchSizeAreNamed) {
  // Scan-8 carries a batch axis first in every state and scan input; the body sees neither it nor
  // the scan axis. Inputs of two batch sizes, or a state without the batch axis, are refused.
  setup();
  auto body = std::make_shared<Graph>();
  body->opsets()["ai.onnx"] = 13;
  input(*body, "s", kF2);
  input(*body, "row", kF2);
  input(*body, "zrow", kF2);
  body->addOp("Sum", "ai.onnx", 13, "", {}, {"s", "row", "zrow"}, {"s_out"});
  body->addOutput("s_out");
  auto scan = [&](const Shape &init, const Shape &zs) {
    Graph g;
    input(g, "init", TensorInfo(DataType::FLOAT, init));
    input(g, "xs", TensorInfo(DataType::FLOAT, {1, 3, 2}));
    input(g, "zs", TensorInfo(DataType::FLOAT, zs));
    Attributes a;
    a.set("body", std::shared_ptr<const Graph>(body));
    a.set("num_scan_inputs", int64_t{2});
    g.addOp("Scan", "ai.onnx", 8, "scan8", a, {"", "init", "xs", "zs"}, {"total"});
    try {
      inferShapes(g, nullptr);
    } catch (const error &e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(scan({1, 2}, {1, 3, 2}), ""); // the consistent layout is accepted
  std::string m = scan({1, 2}, {2, 3, 2});
  EXPECT_NE(m.find("scan8"), std::string::npos) << m;
  EXPECT_NE(m.find("scan inputs have different batch sizes (1 and 2)"), std::string::npos) << m;
  m = scan({2}, {1, 3, 2});
  EXPECT_NE(m.find("state 0 is FLOAT[2], expected the batch axis (1) first"), std::string::npos) << m;
}

TEST(Sequences, ConstructInsertEraseAtLengthConcat) {
  setup();
  Graph g;
  input(g, "a", TensorInfo(DataType::FLOAT, {1, 2}));
  input(g, "b", TensorInfo(DataType::FLOAT, {2, 2}));
  input(g, "c", TensorInfo(DataType::FLOAT, {3, 2}));
  g.addConst("p0", TensorData::fromInt64({}, {0}));
  g.addConst("pLast", TensorData::fromInt64({}, {-1}));
  g.addOp("SequenceConstruct", "ai.onnx", 13, "", {}, {"a", "b"}, {"s1"});
  g.addOp("SequenceInsert", "ai.onnx", 13, "", {}, {"s1", "c", "p0"}, {"s2"}); // [c, a, b]
  g.addOp("SequenceErase", "ai.onnx", 13, "", {}, {"s2", "pLast"}, {"s3"});    // [c, a]
  g.addOp("SequenceAt", "ai.onnx", 13, "", {}, {"s3", "p0"}, {"first"});       // c
  g.addOp("SequenceLength", "ai.onnx", 13, "", {}, {"s2"}, {"n"});
  Attributes axis0;
  axis0.set("axis", int64_t{0});
  g.addOp("ConcatFromSequence", "ai.onnx", 13, "", axis0, {"s3"}, {"cat"});
  g.addOutput("first");
  g.addOutput("n");
  g.addOutput("cat");
  auto plan = compileAndRun(g, {{"a", TensorData::fromDoubles(DataType::FLOAT, {1, 2}, {1, 2})},
                                {"b", TensorData::fromDoubles(DataType::FLOAT, {2, 2}, {3, 4, 5, 6})},
                                {"c", TensorData::fromDoubles(DataType::FLOAT, {3, 2}, {7, 8, 9, 10, 11, 12})}});
  EXPECT_EQ(plan->info("first").shape(), (Shape{3, 2}));
  EXPECT_EQ(floats(*plan, "first"), std::vector<float>({7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(*static_cast<const int64_t *>(plan->address("n")), 3);
  EXPECT_EQ(floats(*plan, "cat"), std::vector<float>({7, 8, 9, 10, 11, 12, 1, 2}));
}

TEST(Sequences, SplitToSequenceWithRuntimeSizes) {
  setup();
  Graph g;
  input(g, "x", TensorInfo(DataType::FLOAT, {2, 3}));
  input(g, "sizes", TensorInfo(DataType::INT64, {2}));
  Attributes a;
  a.set("axis", int64_t{1});
  g.addOp("SplitToSequence", "ai.onnx", 13, "", a, {"x", "sizes"}, {"seq"});
  g.addOp("SequenceLength", "ai.onnx", 13, "", {}, {"seq"}, {"n"});
  g.addOutput("seq");
  g.addOutput("n");
  auto plan = compileAndRun(g, {{"x", TensorData::fromDoubles(DataType::FLOAT, {2, 3}, {1, 2, 3, 4, 5, 6})},
                                {"sizes", TensorData::fromInt64({2}, {1, 2})}});
  EXPECT_EQ(*static_cast<const int64_t *>(plan->address("n")), 2);
  const auto &seq = *static_cast<const SequenceData *>(plan->address("seq"));
  ASSERT_EQ(seq.items.size(), 2u);
  EXPECT_EQ(seq.items[0].info(), TensorInfo(DataType::FLOAT, {2, 1}));
  EXPECT_EQ(seq.items[1].toDoubleVector(), (std::vector<double>{2, 3, 5, 6}));
}

TEST(Sequences, PositionOutOfRangeIsNamed) {
  setup();
  Graph g;
  input(g, "a", kF2);
  g.addConst("p", TensorData::fromInt64({}, {3}));
  g.addOp("SequenceConstruct", "ai.onnx", 13, "", {}, {"a", "a"}, {"s"});
  g.addOp("SequenceAt", "ai.onnx", 13, "at", {}, {"s", "p"}, {"e"});
  try {
    inferShapes(g, nullptr);
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("position 3 is out of range for a sequence of 2"), std::string::npos)
        << e.what();
  }
}

TEST(Sequences, OptionalHoldsAValueOrNone) {
  setup();
  Graph g;
  input(g, "a", kF2);
  g.addOp("Optional", "ai.onnx", 15, "", {}, {"a"}, {"o"});
  g.addOp("OptionalHasElement", "ai.onnx", 15, "", {}, {"o"}, {"has"});
  g.addOp("OptionalGetElement", "ai.onnx", 15, "", {}, {"o"}, {"back"});
  Attributes t;
  t.set("type",
        std::vector<int64_t>{static_cast<int64_t>(ValueKind::Tensor), static_cast<int64_t>(DataType::FLOAT), 2});
  g.addOp("Optional", "ai.onnx", 15, "", t, {}, {"none"});
  g.addOp("OptionalHasElement", "ai.onnx", 15, "", {}, {"none"}, {"hasNone"});
  for (const char *o : {"has", "back", "hasNone"})
    g.addOutput(o);
  auto plan = compileAndRun(g, {{"a", f2(3, 4)}});
  EXPECT_TRUE(*static_cast<const bool *>(plan->address("has")));
  EXPECT_FALSE(*static_cast<const bool *>(plan->address("hasNone")));
  EXPECT_EQ(floats(*plan, "back"), std::vector<float>({3, 4}));
}

TEST(Graphs, CloneCopiesOpsAndInfosWithoutSharingTensors) {
  setup();
  auto b = branch("Add");
  auto c = b->clone();
  EXPECT_EQ(c->ops().size(), 1u);
  EXPECT_EQ(c->inputs(), b->inputs());
  c->tensor("x").setInfo(TensorInfo(DataType::FLOAT, {7}));
  EXPECT_EQ(b->tensor("x").info(), kF2);
}
