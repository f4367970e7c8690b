// Where the schedule puts ops that depend on nothing (a weight's Cast runs just before its first
// reader, within its phase, the same way every time), and recomputeCasts: the backward pass reads
// its own Cast of a master weight, ordered before the update that modifies the weight, and
// training gives the same weights bit for bit with the pass on and off.

#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include "ir/passes/recompute_casts.hpp"
#include "ir/verify.hpp"
#include <popart/builder.hpp>
#include <popart/optimizer.hpp>
#include <popart/session.hpp>
#include <popart/stepio.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

using namespace popart;

namespace {

constexpr int64_t kBfloat16 = 16; // ONNX TensorProto number

ir::Attributes castTo(int64_t to) {
  ir::Attributes a;
  a.set("to", to);
  return a;
}

/// Op names in schedule order.
std::vector<std::string> scheduledNames(const ir::Graph &g) {
  std::vector<std::string> names;
  for (const ir::Op *op : g.schedule())
    names.push_back(op->name);
  return names;
}

size_t positionOf(const std::vector<std::string> &names, const std::string &name) {
  auto it = std::find(names.begin(), names.end(), name);
  EXPECT_NE(it, names.end()) << name << " is not scheduled";
  return static_cast<size_t>(it - names.begin());
}

ir::Op &opNamed(const ir::Graph &g, const std::string &name) {
  for (const auto &op : g.ops())
    if (op->name == name) return *op;
  throw error("no op named '", name, "'");
}

/// x (input) and w (Variable), FLOAT [2, 2]; the Cast of w is added first, so that an
/// insertion-order schedule runs it first; a chain Relu → Neg → Sigmoid of x and then
/// y = chain + Cast(w). With \p resetPhase ≥ 0, a ResetVar (which updates w in place) of that phase.
void castBeforeChain(ir::Graph &g, int resetPhase = -1) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 13;
  const TensorInfo info(DataType::FLOAT, {2, 2});
  g.addTensor("x", ir::TensorKind::Stream, info);
  g.addInput("x");
  g.addTensor("w", ir::TensorKind::Variable, info).setData(std::make_shared<TensorData>(info));
  g.addOp("Cast", "", 13, "cast", castTo(1), {"w"}, {"wc"});
  if (resetPhase >= 0) g.addOp("ResetVar", "ai.graphcore", 1, "reset", {}, {"w"}, {"w_reset"}).phase = resetPhase;
  g.addOp("Relu", "", 13, "relu", {}, {"x"}, {"a"});
  g.addOp("Neg", "", 13, "neg", {}, {"a"}, {"b"});
  g.addOp("Sigmoid", "", 13, "sigmoid", {}, {"b"}, {"c"});
  g.addOp("Add", "", 13, "add", {}, {"c", "wc"}, {"y"});
  g.addOutput("y");
}

} // namespace

TEST(Schedule, AnOpThatDependsOnNothingRunsJustBeforeItsFirstReader) {
  ir::Graph g;
  castBeforeChain(g);
  EXPECT_EQ(scheduledNames(g), (std::vector<std::string>{"relu", "neg", "sigmoid", "cast", "add"}));
}

TEST(Schedule, AnOpThatDependsOnNothingRunsBeforeAnInPlaceUpdateOfWhatItReads) {
  // The update is ready at once and runs before the Add: the Cast must read w before it.
  ir::Graph early;
  castBeforeChain(early, 0);
  auto names = scheduledNames(early);
  EXPECT_EQ(names.front(), "cast");
  EXPECT_EQ(positionOf(names, "reset"), positionOf(names, "cast") + 1);
  // An update of a later phase runs last, and the Cast just before its reader.
  ir::Graph late;
  castBeforeChain(late, 1);
  names = scheduledNames(late);
  EXPECT_EQ(names, (std::vector<std::string>{"relu", "neg", "sigmoid", "cast", "add", "reset"}));
}

TEST(Schedule, OpsThatDependOnNothingStayWithinTheirPhase) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  const TensorInfo info(DataType::FLOAT, {3});
  g.addTensor("x", ir::TensorKind::Stream, info);
  g.addInput("x");
  for (const char *v : {"v0", "v1", "v2"})
    g.addTensor(v, ir::TensorKind::Variable, info).setData(std::make_shared<TensorData>(info));
  // Phase 0: a Cast read only in phase 2 runs at the end of phase 0, not before its reader; a
  // Cast nothing reads runs at the end of its phase too.
  g.addOp("Cast", "", 13, "cast_read_in_phase2", castTo(1), {"v0"}, {"c0"});
  g.addOp("Cast", "", 13, "cast_unread", castTo(1), {"v2"}, {"c2"});
  g.addOp("Relu", "", 13, "relu0", {}, {"x"}, {"a"});
  g.addOp("Neg", "", 13, "neg0", {}, {"a"}, {"b"});
  // Phase 1: a Cast of phase 1 goes just before its phase-1 reader.
  ir::Op &cast1 = g.addOp("Cast", "", 13, "cast_phase1", castTo(1), {"v1"}, {"c1"});
  ir::Op &relu1 = g.addOp("Relu", "", 13, "relu1", {}, {"b"}, {"d"});
  ir::Op &add1 = g.addOp("Add", "", 13, "add1", {}, {"d", "c1"}, {"e"});
  ir::Op &add2 = g.addOp("Add", "", 13, "add2", {}, {"e", "c0"}, {"f"});
  cast1.phase = relu1.phase = add1.phase = 1;
  add2.phase = 2;
  g.addOutput("f");
  g.addOutput("c2");
  const std::vector<ir::Op *> order = g.schedule();
  for (size_t i = 1; i < order.size(); ++i)
    EXPECT_LE(order[i - 1]->phase, order[i]->phase) << order[i]->name << " after " << order[i - 1]->name;
  EXPECT_EQ(scheduledNames(g), (std::vector<std::string>{"relu0", "neg0", "cast_read_in_phase2", "cast_unread", "relu1",
                                                         "cast_phase1", "add1", "add2"}));
  // A source of a later phase than its reader cannot be ordered.
  add1.phase = 0;
  relu1.phase = 0;
  EXPECT_THROW(g.schedule(), error);
}

TEST(Schedule, IsTheSameForTheSameGraphEveryTime) {
  ir::Graph a, b;
  castBeforeChain(a, 1);
  castBeforeChain(b, 1);
  const auto first = scheduledNames(a);
  EXPECT_EQ(scheduledNames(a), first);
  EXPECT_EQ(scheduledNames(b), first);
  auto clone = a.clone();
  EXPECT_EQ(scheduledNames(*clone), first);
}

namespace {

/// Where layerWithBackward computes a tensor [64, 4, 4], 64 times larger than the others.
enum class Big { Nowhere, BetweenTheReaders, AfterTheBackward };

/// A layer's forward and backward around the bf16 copy of a FLOAT master weight w [4, 4]:
/// h = Cast(x) · Cast(w); a chain of \p between ops from h to g; dx = g · Cast(w) (the data
/// gradient, the copy's second reader); then w is updated in place (ResetVar, phase 2). \p big
/// adds a large tensor (an Add broadcasting to [64, 4, 4] and its ReduceSum) to the chain or
/// after dx, which puts the peak of live bytes there.
void layerWithBackward(ir::Graph &g, int between, Big big = Big::Nowhere) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 13;
  const TensorInfo info(DataType::FLOAT, {4, 4});
  g.addTensor("x", ir::TensorKind::Stream, info);
  g.addInput("x");
  g.addTensor("big", ir::TensorKind::Stream, TensorInfo(DataType::BFLOAT16, {64, 4, 4}));
  g.addInput("big");
  g.addConst("axis0", TensorData::fromInt64({1}, {0}));
  g.addTensor("w", ir::TensorKind::Variable, info).setData(std::make_shared<TensorData>(info));
  ir::Attributes noKeep;
  noKeep.set("keepdims", int64_t{0});
  auto addBig = [&](const TensorId &t, const std::string &name) {
    g.addOp("Add", "", 13, name + "_broadcast", {}, {t, "big"}, {name + "_big"});
    g.addOp("ReduceSum", "", 13, name + "_sum", noKeep, {name + "_big", "axis0"}, {name + "_sum"});
    return name + "_sum";
  };
  g.addOp("Cast", "", 13, "cast_x", castTo(kBfloat16), {"x"}, {"xb"});
  g.addOp("Cast", "", 13, "cast_w", castTo(kBfloat16), {"w"}, {"wb"});
  g.addOp("MatMul", "", 13, "forward", {}, {"xb", "wb"}, {"h"});
  TensorId t = "h";
  for (int i = 0; i < between; ++i) {
    TensorId next = "chain" + std::to_string(i);
    g.addOp(i % 2 ? "Neg" : "Relu", "", 13, next, {}, {t}, {next});
    t = next;
    if (big == Big::BetweenTheReaders && i == between / 2) t = addBig(t, "inside");
  }
  // A Cast of an activation (it has a producer) read twice far apart: not recomputed.
  g.addOp("Cast", "", 13, "cast_h", castTo(1), {"h"}, {"hf"});
  g.addOp("Neg", "", 13, "early_hf_reader", {}, {"hf"}, {"hn"});
  g.addOp("MatMul", "", 13, "backward", {}, {t, "wb"}, {"dx"});
  TensorId dx = big == Big::AfterTheBackward ? addBig("dx", "after") : "dx";
  g.addOp("Cast", "", 13, "widen_dx", castTo(1), {dx}, {"dxf"});
  g.addOp("Add", "", 13, "late_hf_reader", {}, {"dxf", "hf"}, {"out"});
  g.addOp("ResetVar", "ai.graphcore", 1, "update", {}, {"w"}, {"w_updated"}).phase = 2;
  g.addOutput("out");
  g.addOutput("hn");
  ir::inferShapes(g, nullptr);
}

ir::RecomputeCastOptions wherever(int maxOpsBetweenReaders) {
  ir::RecomputeCastOptions o;
  o.maxOpsBetweenReaders = maxOpsBetweenReaders;
  o.onlyAcrossThePeak = false;
  return o;
}

} // namespace

TEST(RecomputeCasts, TheBackwardReadsItsOwnCastOfTheMasterWeightBeforeTheUpdate) {
  ir::Graph g;
  layerWithBackward(g, 8, Big::BetweenTheReaders);
  EXPECT_EQ(ir::recomputeCasts(g), 1);
  ir::verifyGraph(g, "after recomputeCasts");
  ir::Op &forward = opNamed(g, "forward"), &backward = opNamed(g, "backward");
  EXPECT_EQ(forward.input(1).id(), "wb");
  ir::Tensor &copy = backward.input(1);
  ASSERT_NE(copy.id(), "wb");
  ASSERT_NE(copy.producer(), nullptr);
  const ir::Op &recast = *copy.producer();
  EXPECT_EQ(recast.type, "Cast");
  EXPECT_EQ(recast.input(0).id(), "w");
  EXPECT_EQ(recast.attrs.getInt("to"), kBfloat16);
  EXPECT_EQ(copy.info(), TensorInfo(DataType::BFLOAT16, {4, 4}));
  EXPECT_EQ(recast.phase, backward.phase);
  // The Cast of the activation and the graph input's single reader are left alone.
  EXPECT_EQ(opNamed(g, "late_hf_reader").input(1).id(), "hf");
  EXPECT_EQ(forward.input(0).id(), "xb");
  // Scheduled just before the backward product, and before the update of the master weight.
  const std::vector<ir::Op *> order = g.schedule();
  auto at = [&](const ir::Op *op) { return std::find(order.begin(), order.end(), op) - order.begin(); };
  EXPECT_EQ(at(&recast) + 1, at(&backward));
  EXPECT_LT(at(&recast), at(&opNamed(g, "update")));
  EXPECT_LT(at(&opNamed(g, "cast_w")) + 1, at(&recast)); // the first copy is no longer held until here
}

TEST(RecomputeCasts, ReadersCloseTogetherShareTheirCast) {
  ir::Graph g;
  layerWithBackward(g, 2);
  // The backward product is 4 ops after the forward one.
  EXPECT_EQ(ir::recomputeCasts(g, wherever(4)), 0);
  EXPECT_EQ(opNamed(g, "backward").input(1).id(), "wb");
  EXPECT_EQ(ir::recomputeCasts(g, wherever(3)), 1);
  EXPECT_NE(opNamed(g, "backward").input(1).id(), "wb");
}

TEST(RecomputeCasts, ACopyHeldOnlyAwayFromThePeakIsKept) {
  ir::Graph g;
  layerWithBackward(g, 8, Big::AfterTheBackward);
  EXPECT_EQ(ir::recomputeCasts(g), 0);
  EXPECT_EQ(opNamed(g, "backward").input(1).id(), "wb");
  EXPECT_EQ(ir::recomputeCasts(g, wherever(4)), 1); // readers far apart all the same
  EXPECT_NE(opNamed(g, "backward").input(1).id(), "wb");
}

namespace {

/// A FLOAT 32-64-64-8 MLP with ReLUs and a mean squared error, batch 16.
struct Mlp {
  std::string model;
  TensorId loss;
  std::vector<float> x, y;
  std::vector<TensorId> weights;
  Mlp() {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    auto random = [&](size_t n, float scale) {
      std::vector<float> v(n);
      for (float &e : v)
        e = d(rng) * scale;
      return v;
    };
    auto b = Builder::create();
    auto ai = b->aiOnnxOpset13();
    TensorId h = b->addInputTensor(TensorInfo(DataType::FLOAT, {16, 32}), "x");
    TensorId target = b->addInputTensor(TensorInfo(DataType::FLOAT, {16, 8}), "y");
    const int64_t sizes[] = {32, 64, 64, 8};
    for (int l = 0; l < 3; ++l) {
      auto w = random(static_cast<size_t>(sizes[l] * sizes[l + 1]), 0.3f);
      auto bias = random(static_cast<size_t>(sizes[l + 1]), 0.1f);
      TensorId tw = b->addInitializedInputTensor(w.data(), TensorInfo(DataType::FLOAT, {sizes[l], sizes[l + 1]}),
                                                 "w" + std::to_string(l));
      TensorId tb = b->addInitializedInputTensor(bias.data(), TensorInfo(DataType::FLOAT, {sizes[l + 1]}),
                                                 "b" + std::to_string(l));
      weights.push_back(tw);
      weights.push_back(tb);
      h = ai.add({ai.matmul({h, tw}), tb});
      if (l < 2) h = ai.relu({h});
    }
    TensorId diff = ai.sub({h, target});
    loss = ai.reducemean({ai.mul({diff, diff})}, std::nullopt, 0);
    b->addOutputTensor(loss);
    model = b->getModelProto();
    x = random(16 * 32, 1.0f);
    y = random(16 * 8, 0.5f);
  }
};

struct Trained {
  std::vector<std::vector<float>> initial, weights;
  std::string ir;
  int64_t arena = 0;
};

Trained train(const Mlp &mlp, const std::string &precision, bool recompute) {
  SessionOptions so;
  so.precision = precision;
  so.verifyIr = true;
  if (!recompute) so.disabledPasses.push_back("recomputeCasts");
  Adam adam(Optimizer::Params{{"defaultLearningRate", {0.01f, false}}, {"defaultWeightDecay", {0.01f, true}}},
            AdamMode::Adam, WeightDecayMode::Decay);
  auto s = TrainingSession::createFromOnnxModel(mlp.model, DataFlow(1, {}, AnchorReturnType("ALL")), "", adam, so);
  s->prepareDevice();
  s->weightsFromHost();
  auto read = [&] {
    std::vector<std::vector<float>> all;
    for (const auto &id : mlp.weights) {
      const TensorInfo info = s->getInfo(id);
      std::vector<float> v(static_cast<size_t>(info.elementCount()));
      NDArrayWrapper<float> arr(v.data(), info.shape());
      WeightsIO io;
      io.insert(id, arr);
      s->readWeights(io);
      all.push_back(std::move(v));
    }
    return all;
  };
  Trained t;
  t.initial = read();
  std::vector<float> x = mlp.x, y = mlp.y;
  for (int step = 0; step < 4; ++step) {
    NDArrayWrapper<float> xa(x.data(), {16, 32}), ya(y.data(), {16, 8});
    StepIO io({{"x", xa}, {"y", ya}}, {});
    s->run(io);
  }
  t.weights = read();
  t.ir = s->dumpIr();
  t.arena = s->plannedArenaBytes();
  return t;
}

/// The inputs of the Casts that recomputeCasts added, from an IR dump.
std::vector<std::string> recomputedInputs(const std::string &ir) {
  std::vector<std::string> inputs;
  const std::string cast = "ai.onnx::Cast-13 (";
  for (size_t at = ir.find(cast); at != std::string::npos; at = ir.find(cast, at + 1)) {
    const size_t open = at + cast.size(), close = ir.find(')', open), end = ir.find('\n', open);
    if (ir.substr(open, end - open).find("_recomputed") != std::string::npos)
      inputs.push_back(ir.substr(open, close - open));
  }
  return inputs;
}

size_t occurrences(const std::string &text, const std::string &what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

} // namespace

TEST(RecomputeCasts, TrainingGivesTheSameWeightsBitForBitWithThePassOnAndOff) {
  const Mlp mlp;
  for (const char *precision : {"bf16", "fp16.32", "fp16.16"}) {
    const Trained on = train(mlp, precision, true), off = train(mlp, precision, false);
    EXPECT_EQ(occurrences(off.ir, "_recomputed"), 0u) << precision;
    // w1's copy is held from its forward product to its data gradient, across the peak at the
    // loss; fp16.16 has no master weights, so no Casts of them (x's Cast may be recomputed in
    // every mode).
    const std::vector<std::string> recast = recomputedInputs(on.ir);
    const bool master = std::string(precision) != "fp16.16";
    EXPECT_EQ(std::count(recast.begin(), recast.end(), "w1"), master ? 1 : 0) << precision << "\n" << on.ir;
    if (!master) {
      for (const auto &input : recast)
        EXPECT_EQ(input, "x") << precision;
    }
    EXPECT_LE(on.arena, off.arena) << precision;
    ASSERT_EQ(on.weights.size(), off.weights.size());
    for (size_t i = 0; i < on.weights.size(); ++i) {
      EXPECT_EQ(on.weights[i], off.weights[i]) << precision << " " << mlp.weights[i];
      EXPECT_NE(on.weights[i], on.initial[i]) << precision << " " << mlp.weights[i] << " did not train";
    }
  }
}
