// Mixed precision (docs/precision.md): the convertPrecision pass on small graphs — which tensors
// become fp16/bf16, the fp32 list, one Cast per tensor and type, constants converted, outputs and
// shape inputs left alone, master weights — and the modes through the sessions, against fp32.

#include "thrown.hpp"

#include "backend_cpu/kernel.hpp"

#include "core/half.hpp"
#include "ir/graph.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/passes/passes.hpp"
#include "ir/passes/precision.hpp"
#include "ir/verify.hpp"
#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>

using namespace popart;

namespace {

TensorData filled(DataType type, const Shape &shape, float start) {
  TensorInfo info(DataType::FLOAT, shape);
  std::vector<double> v;
  for (int64_t i = 0; i < info.elementCount(); ++i)
    v.push_back(start + 0.1 * static_cast<double>(i % 7) - 0.3);
  return TensorData::fromDoubles(type, shape, v);
}

/// x [4, 8] · w [8, 8] → Relu → r; r · 0.5 → m; Softmax(m) → out; CumSum(r) twice (fp32 ops) → c1,
/// c2; x also read by an Add; Resize(x, scales) → big, whose scales must stay FLOAT.
void buildGraph(ir::Graph &g) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4, 8}));
  g.addInput("x");
  ir::Tensor &w = g.addTensor("w", ir::TensorKind::Variable, TensorInfo(DataType::FLOAT, {8, 8}));
  w.setData(std::make_shared<TensorData>(filled(DataType::FLOAT, {8, 8}, 0.123f)));
  g.addInitializer("w");
  g.addConst("half", TensorData::scalarFloat(0.5f));
  g.addConst("axis", TensorData::fromInt64({}, {1}));
  g.addConst("scales", TensorData::fromDoubles(DataType::FLOAT, {4}, {1, 1, 2, 2}));
  g.addConst("roi", TensorData::fromDoubles(DataType::FLOAT, {0}, {}));
  g.addOp("MatMul", "", 13, "mm", {}, {"x", "w"}, {"h"});
  g.addOp("Relu", "", 13, "relu", {}, {"h"}, {"r"});
  g.addOp("Mul", "", 13, "scale", {}, {"r", "half"}, {"m"});
  g.addOp("Softmax", "", 13, "softmax", {}, {"m"}, {"out"});
  g.addOp("CumSum", "", 13, "cumsum1", {}, {"r", "axis"}, {"c1"});
  g.addOp("CumSum", "", 13, "cumsum2", {}, {"r", "axis"}, {"c2"});
  g.addOp("Add", "", 13, "addx", {}, {"x", "m"}, {"xm"});
  g.addOp("Reshape", "", 13, "to4d", {}, {"xm", "shape4"}, {"x4"});
  g.addOp("Resize", "", 13, "resize", {}, {"x4", "roi", "scales"}, {"big"});
  for (const char *o : {"out", "c1", "c2", "big"})
    g.addOutput(o);
}

void addShape4(ir::Graph &g) { g.addConst("shape4", TensorData::fromInt64({4}, {1, 1, 4, 8})); }

ir::Op &opNamed(const ir::Graph &g, const std::string &name) {
  for (const auto &op : g.ops())
    if (op->name == name) return *op;
  throw error("no op ", name);
}

DataType inType(const ir::Graph &g, const std::string &op, size_t i) { return opNamed(g, op).inInfo(i).dataType(); }

} // namespace

TEST(Precision, FloatTensorsBecomeLowExceptAroundTheFp32OpsWithOneCastPerTensor) {
  for (DataType low : {DataType::FLOAT16, DataType::BFLOAT16}) {
    ir::Graph g;
    addShape4(g);
    buildGraph(g);
    ir::inferShapes(g, nullptr);
    ir::PrecisionPolicy policy;
    policy.low = low;
    EXPECT_GT(ir::convertPrecision(g, policy, {}), 0);
    ir::verifyGraph(g, "");
    EXPECT_EQ(inType(g, "mm", 0), low);
    EXPECT_EQ(inType(g, "mm", 1), low);
    EXPECT_EQ(opNamed(g, "mm").outInfo(0).dataType(), low);
    EXPECT_EQ(inType(g, "scale", 1), low) << "a constant is converted";
    EXPECT_TRUE(opNamed(g, "scale").input(1).isConst()) << "converted in place of a Cast";
    EXPECT_EQ(inType(g, "cumsum1", 0), DataType::FLOAT) << "CumSum is on the fp32 list";
    EXPECT_EQ(&opNamed(g, "cumsum1").input(0), &opNamed(g, "cumsum2").input(0)) << "one Cast for both readers";
    EXPECT_EQ(inType(g, "addx", 0), low);
    EXPECT_EQ(&opNamed(g, "addx").input(0), &opNamed(g, "mm").input(0)) << "x is cast once for both readers";
    EXPECT_EQ(inType(g, "resize", 0), low);
    EXPECT_EQ(inType(g, "resize", 2), DataType::FLOAT) << "Resize's scales decide the shape";
    EXPECT_EQ(g.tensor("w").info().dataType(), DataType::FLOAT) << "the master weight stays FLOAT";
    for (const auto &id : g.outputs())
      EXPECT_EQ(g.tensor(id).info().dataType(), DataType::FLOAT) << id << " keeps its type";
    // One Cast per (tensor, type).
    std::set<std::pair<std::string, int64_t>> casts;
    for (const auto &op : g.ops())
      if (op->type == "Cast") {
        EXPECT_TRUE(casts.emplace(op->input(0).id(), op->attrs.getInt("to")).second)
            << op->input(0).id() << " cast twice to " << op->attrs.getInt("to");
      }
    // x, w, r → FLOAT for the CumSums, and out, big back to FLOAT.
    EXPECT_EQ(casts.size(), 5u) << g.dump();
  }
}

TEST(Precision, WithoutMasterWeightsAVariableReadOnlyInTheLowTypeIsConverted) {
  ir::Graph g;
  addShape4(g);
  buildGraph(g);
  ir::inferShapes(g, nullptr);
  const TensorData before = *g.tensor("w").data();
  ir::PrecisionPolicy policy;
  policy.low = DataType::FLOAT16;
  policy.masterWeights = false;
  ir::convertPrecision(g, policy, {});
  ir::verifyGraph(g, "");
  const ir::Tensor &w = g.tensor("w");
  ASSERT_EQ(w.info().dataType(), DataType::FLOAT16);
  ASSERT_EQ(w.data()->info().dataType(), DataType::FLOAT16);
  for (int64_t i = 0; i < 64; ++i)
    EXPECT_EQ(w.data()->as<Half>()[i].bits, floatToHalf(before.as<float>()[i])) << "element " << i;
  EXPECT_EQ(&opNamed(g, "mm").input(1), &w) << "no Cast between the weight and its reader";
}

TEST(Precision, Fp32ModeAndTheUndefinedTypeChangeNothing) {
  ir::Graph g;
  addShape4(g);
  buildGraph(g);
  ir::inferShapes(g, nullptr);
  std::string before = g.dump();
  EXPECT_EQ(ir::convertPrecision(g, ir::PrecisionPolicy{}, {}), 0);
  EXPECT_EQ(g.dump(), before);
}

TEST(Precision, LargeReductionsStayFp32AndSmallOnesDoNot) {
  for (int64_t n : {int64_t{64}, ir::kLargeReduction + 1}) {
    ir::Graph g;
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = 13;
    // A 16-bit input: the Relu that follows it is low.
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT16, {2, n}));
    g.addInput("x");
    g.addOp("Relu", "", 13, "relu", {}, {"x"}, {"r"});
    g.addConst("axes", TensorData::fromInt64({1}, {1}));
    g.addOp("ReduceSum", "", 13, "sum", {}, {"r", "axes"}, {"s"});
    g.addOutput("s");
    ir::inferShapes(g, nullptr);
    ir::PrecisionPolicy policy;
    policy.low = DataType::BFLOAT16;
    ir::convertPrecision(g, policy, {});
    EXPECT_EQ(inType(g, "sum", 0), n > ir::kLargeReduction ? DataType::FLOAT : DataType::BFLOAT16) << n;
  }
}

TEST(Precision, OpsThatFollowTheirInputsStayFp32WhereOnlyFp32TensorsFeedThem) {
  // x → Relu → MatMul(w) → logits → SoftmaxCrossEntropyLoss → · 2^-20 → loss: the Relu before the
  // product reads only fp32 and stays fp32; the Mul after the loss likewise, so that a loss scale
  // of 65536 never meets fp16's range in the loss's own gradient.
  ir::Graph g;
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4, 8}));
  g.addInput("x");
  g.addTensor("y", ir::TensorKind::Stream, TensorInfo(DataType::INT64, {4}));
  g.addInput("y");
  g.addConst("w", filled(DataType::FLOAT, {8, 3}, 0.2f));
  g.addConst("small", TensorData::scalarFloat(1.0f / 1048576));
  g.addOp("Relu", "", 13, "relu", {}, {"x"}, {"r"});
  g.addOp("MatMul", "", 13, "mm", {}, {"r", "w"}, {"logits"});
  g.addOp("SoftmaxCrossEntropyLoss", "", 13, "sce", {}, {"logits", "y"}, {"l"});
  g.addOp("Mul", "", 13, "scale", {}, {"l", "small"}, {"loss"});
  g.addOutput("loss");
  ir::inferShapes(g, nullptr);
  ir::PrecisionPolicy policy;
  policy.low = DataType::FLOAT16;
  ir::convertPrecision(g, policy, {});
  ir::verifyGraph(g, "");
  EXPECT_EQ(inType(g, "relu", 0), DataType::FLOAT);
  EXPECT_EQ(inType(g, "mm", 0), DataType::FLOAT16);
  EXPECT_EQ(inType(g, "sce", 0), DataType::FLOAT);
  EXPECT_EQ(inType(g, "scale", 0), DataType::FLOAT);
  EXPECT_EQ(inType(g, "scale", 1), DataType::FLOAT) << "2^-20 is subnormal in fp16";
  EXPECT_EQ(opNamed(g, "scale").outInfo(0).dataType(), DataType::FLOAT);
}

namespace {

/// A function (rows, cols, name) → an initializer of \p b in \p type, normal(0, \p sd) values
/// drawn from one generator seeded with \p seed (rounded to \p type, so the same in every type).
auto randomWeights(Builder &b, DataType type, unsigned seed, float sd) {
  return [&b, type, rng = std::mt19937(seed), n = std::normal_distribution<float>(0.0f, sd)](int64_t rows, int64_t cols,
                                                                                             const char *name) mutable {
    std::vector<double> v(static_cast<size_t>(rows * cols));
    for (auto &e : v)
      e = n(rng);
    TensorData t = TensorData::fromDoubles(type, {rows, cols}, v);
    return b.addInitializedInputTensor(t.data(), t.info(), name);
  };
}

/// x [16, 32] → Gemm(32→24) → Relu → Gemm(24→4) → SoftmaxCrossEntropyLoss with labels y.
/// ... in \p type: FLOAT16 is a model exported after model.half(), its logits cast to FLOAT for the
/// loss as `.float()` would.
std::string mlp(TensorId *lossId = nullptr, DataType type = DataType::FLOAT) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(type, {16, 32}), "x");
  TensorId y = b->addInputTensor(TensorInfo(DataType::INT64, {16}), "y");
  auto weights = randomWeights(*b, type, 7, 0.2f);
  TensorId h = ai.relu({ai.gemm({x, weights(32, 24, "w1"), weights(1, 24, "b1")})});
  TensorId logits = ai.gemm({h, weights(24, 4, "w2"), weights(1, 4, "b2")});
  if (type != DataType::FLOAT) logits = ai.cast({logits}, "FLOAT");
  TensorId loss = ai.softmaxcrossentropyloss({logits, y}, ReductionType::Mean);
  b->addOutputTensor(loss);
  if (lossId) *lossId = loss;
  return b->getModelProto();
}

struct Batch {
  std::vector<float> x;
  std::vector<int64_t> y;
};

Batch batch(int k) {
  Batch b;
  std::mt19937 rng(100 + k);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int i = 0; i < 16 * 32; ++i)
    b.x.push_back(n(rng));
  for (int i = 0; i < 16; ++i) // a learnable rule: the class of the largest of four features
    b.y.push_back(std::max_element(b.x.begin() + i * 32, b.x.begin() + i * 32 + 4) - (b.x.begin() + i * 32));
  return b;
}

struct Trained {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> weights;
};

std::unique_ptr<TrainingSession> session(const std::string &model, const TensorId &lossId,
                                         const std::string &precision) {
  SessionOptions so;
  so.precision = precision;
  so.numThreads = 1;
  so.verifyIr = true;
  auto s = TrainingSession::createFromOnnxModel(model, DataFlow(1, {lossId}, AnchorReturnType("FINAL")), lossId,
                                                SGD({{"defaultLearningRate", {0.1f, true}}}), so);
  s->prepareDevice();
  s->weightsFromHost();
  return s;
}

/// Runs \p steps steps of batch(first), batch(first + 1)... with x in \p xType; returns the losses.
std::vector<float> runSteps(TrainingSession &s, int steps, DataType xType = DataType::FLOAT, int first = 0) {
  std::vector<float> losses;
  for (int k = first; k < first + steps; ++k) {
    Batch b = batch(k);
    TensorData x = TensorData::fromDoubles(xType, {16, 32}, std::vector<double>(b.x.begin(), b.x.end()));
    RawArray xa(x.data(), xType, {16, 32});
    NDArrayWrapper<int64_t> ya(b.y.data(), {16});
    float loss = 0;
    NDArrayWrapper<float> la(&loss, {});
    StepIO io({{"x", xa}, {"y", ya}}, {{s.getLossId(), la}});
    s.run(io);
    losses.push_back(loss);
  }
  return losses;
}

const std::map<std::string, int64_t> kMlpWeights{{"w1", 32 * 24}, {"b1", 24}, {"w2", 24 * 4}, {"b2", 4}};

/// The MLP's weights (named with \p suffix), read into FLOAT buffers.
std::map<std::string, std::vector<float>> readAll(const TrainingSession &s, const std::string &suffix = "") {
  std::map<std::string, std::vector<float>> weights;
  for (auto [id, n] : kMlpWeights) {
    std::vector<float> v(static_cast<size_t>(n));
    NDArrayWrapper<float> arr(v.data(), s.getInfo(id + suffix).shape());
    WeightsIO io;
    io.insert(id + suffix, arr);
    s.readWeights(io);
    weights[id] = v;
  }
  return weights;
}

Trained train(const std::string &precision, int steps) {
  TensorId lossId;
  std::string model = mlp(&lossId);
  auto s = session(model, lossId, precision);
  Trained t;
  t.losses = runSteps(*s, steps);
  for (const auto &[id, n] : kMlpWeights)
    EXPECT_EQ(s->getInfo(id).dataType(), DataType::FLOAT) << precision << ": " << id << " is the fp32 master copy";
  t.weights = readAll(*s);
  return t;
}

} // namespace

TEST(Precision, Fp16And32AndBf16TrainLikeFp32WithFp32MasterWeights) {
  const int steps = 8;
  Trained ref = train("fp32", steps);
  ASSERT_LT(ref.losses.back(), ref.losses.front()) << "the fp32 run must learn for the comparison to mean anything";
  for (const char *mode : {"fp16.32", "bf16"}) {
    Trained got = train(mode, steps);
    const double eps = std::string(mode) == "bf16" ? 1.0 / 256 : 1.0 / 2048;
    for (int k = 0; k < steps; ++k)
      EXPECT_NEAR(got.losses[size_t(k)], ref.losses[size_t(k)], 0.01 * ref.losses[size_t(k)]) << mode << " step " << k;
    for (const auto &[id, want] : ref.weights) {
      const std::vector<float> &w = got.weights.at(id);
      double worst = 0, scale = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        worst = std::max(worst, std::fabs(double(w[i]) - want[i]));
        scale = std::max(scale, std::fabs(double(want[i])));
      }
      // The products round their inputs to the low type: a few units of its epsilon per step.
      EXPECT_LT(worst, 20 * eps * std::max(1.0, scale)) << mode << " " << id;
      EXPECT_NE(w, ref.weights.at(id)) << mode << " " << id << ": identical to fp32, so no low precision ran";
    }
  }
}

namespace {

/// The inputs of each op of \p type in \p ir (Graph::dump's "%N domain::Type-V 'name' (a, -, b) -> (...)").
std::vector<std::vector<TensorId>> inputsOfOps(const std::string &ir, const std::string &type) {
  std::vector<std::vector<TensorId>> all;
  std::istringstream lines(ir);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("::" + type + "-") == std::string::npos) continue;
    const size_t close = line.find(") -> (");
    const size_t open = line.rfind(" (", close);
    if (close == std::string::npos || open == std::string::npos) continue;
    std::vector<TensorId> inputs;
    std::istringstream list(line.substr(open + 2, close - open - 2));
    std::string id;
    while (std::getline(list, id, ','))
      inputs.push_back(id.substr(id.find_first_not_of(' ')));
    all.push_back(inputs);
  }
  return all;
}

} // namespace

TEST(Precision, UpdatesReadTheMasterWeightsGradientsInTheLowTypeInFp16And32AndBf16) {
  // fp16.32 and bf16 store the gradients of the FLOAT master weights in the low type, as their
  // other gradients; the update widens them. What reads a gradient before it (the histogram of
  // loss scaling, the finiteness check, the Cast before the clipping norm, the FLOAT accumulator)
  // reads the 16-bit one too. fp32 mode keeps FLOAT gradients.
  TensorId lossId;
  const std::string model = mlp(&lossId);
  for (const auto &[mode, low] : std::vector<std::pair<std::string, DataType>>{
           {"fp32", DataType::FLOAT}, {"fp16.32", DataType::FLOAT16}, {"bf16", DataType::BFLOAT16}})
    for (int accumulation : {1, 2}) {
      const std::string what = mode + " accumulation " + std::to_string(accumulation);
      SessionOptions so;
      so.precision = mode;
      so.numThreads = 1;
      so.verifyIr = true;
      so.enableGradientAccumulation = accumulation > 1;
      so.accumulationFactor = accumulation;
      so.automaticLossScalingSettings.enabled = true;
      so.automaticLossScalingSettings.method = AutomaticLossScalingSettings::Method::Histogram;
      Adam adam({{"defaultLearningRate", {1e-3f, true}}}, AdamMode::Adam, WeightDecayMode::Decay,
                {ClipNormSettings::clipAllWeights(1.0f)});
      auto s = TrainingSession::createFromOnnxModel(model, DataFlow(1, {lossId}, AnchorReturnType("FINAL")), lossId,
                                                    adam, so);
      s->prepareDevice();
      const std::string ir = s->dumpIr();
      std::set<TensorId> gradients; // as the optimiser's first readers see them
      for (const auto &in : inputsOfOps(ir, accumulation > 1 ? "Accumulate" : "AdamUpdate")) {
        ASSERT_GE(in.size(), 2u) << what;
        gradients.insert(in[1]);
        EXPECT_EQ(s->getInfo(in[1]).dataType(), low) << what << ": " << in[1];
        EXPECT_EQ(s->getInfo(in[0]).dataType(), DataType::FLOAT) << what << ": " << in[0];
      }
      EXPECT_EQ(gradients.size(), kMlpWeights.size()) << what << "\n" << ir;
      for (const auto &in : inputsOfOps(ir, "AdamUpdate")) {
        EXPECT_EQ(s->getInfo(in[0]).dataType(), DataType::FLOAT) << what << ": the master weight " << in[0];
        const DataType read = s->getInfo(in[1]).dataType();
        EXPECT_EQ(read, accumulation > 1 ? DataType::FLOAT : low) << what << ": " << in[1];
        for (size_t k = 4; k < in.size(); ++k)
          EXPECT_EQ(s->getInfo(in[k]).dataType(), DataType::FLOAT) << what << ": state " << in[k];
      }
      if (accumulation == 1) {
        for (const char *reader : {"AllFinite", "GradientStatistics"}) {
          const auto readers = inputsOfOps(ir, reader);
          ASSERT_EQ(readers.size(), 1u) << what << " " << reader;
          std::set<TensorId> read(readers[0].begin() + (std::string(reader) == "AllFinite" ? 0 : 1), readers[0].end());
          EXPECT_EQ(read, gradients) << what << " " << reader;
        }
        for (const auto &in : inputsOfOps(ir, "ReduceSumSquare"))
          EXPECT_EQ(s->getInfo(in[0]).dataType(), DataType::FLOAT) << what << ": the clipping norm sums in fp32";
      }
      s->weightsFromHost();
      if (accumulation == 1) {
        const std::vector<float> losses = runSteps(*s, 3);
        for (float l : losses)
          EXPECT_TRUE(std::isfinite(l)) << what;
      }
    }
}

TEST(Precision, InferenceKeepsTheOutputTypeAndAnUnknownModeIsNamed) {
  SessionOptions so;
  so.precision = "fp8";
  EXPECT_NE(thrown([&] {
              InferenceSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), so);
            }).find("SessionOptions.precision is 'fp8'"),
            std::string::npos);
  EXPECT_NE(thrown([&] {
              TrainingSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), "", SGD(), so);
            }).find("expected fp32, fp16.32, fp16.16 or bf16"),
            std::string::npos);
  so.precision = "bf16";
  auto s = InferenceSession::createFromOnnxModel(mlp(), DataFlow(1, std::vector<TensorId>{}), so);
  s->prepareDevice();
  EXPECT_EQ(s->getInfo(s->getOutputIds().at(0)).dataType(), DataType::FLOAT);
}

TEST(Precision, StreamsLeaveInputsReadOnlyInTheLowTypeAndOutputsOfLowOpsLowButNotTheLoss) {
  for (DataType low : {DataType::FLOAT16, DataType::BFLOAT16}) {
    for (const TensorId loss : {"", "out"}) {
      ir::Graph g;
      addShape4(g);
      buildGraph(g);
      ir::inferShapes(g, nullptr);
      ir::PrecisionPolicy policy;
      policy.low = low;
      ir::StreamTypes streams;
      ir::convertPrecision(g, policy, {}, &streams, loss);
      ir::verifyGraph(g, "");
      EXPECT_EQ(g.tensor("x").info().dataType(), low) << "x is read only in the low type (MatMul, Add)";
      EXPECT_EQ(&opNamed(g, "mm").input(0), &g.tensor("x")) << "no Cast between x and its readers";
      std::map<TensorId, DataType> expected{{"x", DataType::FLOAT}, {"big", DataType::FLOAT}};
      if (loss.empty()) expected["out"] = DataType::FLOAT;
      EXPECT_EQ(streams.host, expected);
      EXPECT_EQ(g.tensor("big").info().dataType(), low);
      EXPECT_EQ(g.tensor("out").info().dataType(), loss.empty() ? low : DataType::FLOAT) << "the loss stays FLOAT";
      EXPECT_EQ(g.tensor("c1").info().dataType(), DataType::FLOAT) << "an fp32 op's output is FLOAT anyway";
      // An input that an fp32 op reads too keeps its type.
      ir::Graph g2;
      addShape4(g2);
      buildGraph(g2);
      g2.addOp("CumSum", "", 13, "cumx", {}, {"x", "axis"}, {"cx"});
      g2.addOutput("cx");
      ir::inferShapes(g2, nullptr);
      ir::StreamTypes streams2;
      ir::convertPrecision(g2, policy, {}, &streams2, loss);
      EXPECT_EQ(g2.tensor("x").info().dataType(), DataType::FLOAT);
      EXPECT_FALSE(streams2.host.count("x"));
    }
  }
}

namespace {

/// x [8, 12] → Gemm(12→16) → Relu → h → Gemm(16→5) → logits, all in \p type; the weights are the
/// same values rounded to \p type.
struct SmallNet {
  std::string model;
  TensorId h, logits;
};

SmallNet smallNet(DataType type) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(type, {8, 12}), "x");
  auto weights = randomWeights(*b, type, 11, 0.3f);
  TensorId h = ai.relu({ai.gemm({x, weights(12, 16, "w1"), weights(1, 16, "b1")})});
  TensorId logits = ai.gemm({h, weights(16, 5, "w2"), weights(1, 5, "b2")});
  b->addOutputTensor(logits);
  return {b->getModelProto(), h, logits};
}

} // namespace

TEST(Precision, StreamedInputsAndAnchorsGiveTheValuesOfALowModelAndTheUserKeepsFloat) {
  for (const char *mode : {"bf16", "fp16.32"}) {
    const DataType low = std::string(mode) == "bf16" ? DataType::BFLOAT16 : DataType::FLOAT16;
    std::vector<double> xs(2 * 8 * 12);
    std::mt19937 rng(5);
    std::normal_distribution<double> n(0.0, 1.0);
    for (auto &v : xs)
      v = n(rng);
    SessionOptions so;
    so.precision = mode;
    so.numThreads = 1;
    // The FLOAT model, fed FLOAT: x narrowed and h, logits widened by the session.
    const SmallNet net = smallNet(DataType::FLOAT);
    const TensorId &h = net.h, &lg = net.logits;
    auto s = InferenceSession::createFromOnnxModel(
        net.model, DataFlow(2, {{lg, AnchorReturnType("ALL")}, {h, AnchorReturnType("SUM")}}), so);
    s->prepareDevice();
    EXPECT_EQ(s->getInfo("x").dataType(), DataType::FLOAT);
    EXPECT_EQ(s->getInfo(lg).dataType(), DataType::FLOAT);
    EXPECT_EQ(s->getInfo(h).dataType(), DataType::FLOAT);
    EXPECT_EQ(s->dumpIr().find("Cast"), std::string::npos) << "the session converts, not Cast ops:\n" << s->dumpIr();
    std::vector<float> x(xs.begin(), xs.end()), logits(2 * 8 * 5), hSum(8 * 16);
    NDArrayWrapper<float> xa(x.data(), {2, 8, 12}), la(logits.data(), {2, 8, 5}), ha(hSum.data(), {8, 16});
    StepIO io({{"x", xa}}, {{lg, la}, {h, ha}});
    s->run(io);
    // The same model in the low type, fed low values: no conversion anywhere but the user's.
    const SmallNet net16 = smallNet(low);
    ASSERT_EQ(net16.h, h);
    ASSERT_EQ(net16.logits, lg);
    auto s16 = InferenceSession::createFromOnnxModel(
        net16.model, DataFlow(2, {{lg, AnchorReturnType("ALL")}, {h, AnchorReturnType("ALL")}}), so);
    s16->prepareDevice();
    ASSERT_EQ(s16->getInfo("x").dataType(), low);
    TensorData x16 = TensorData::fromDoubles(low, {2, 8, 12}, xs);
    TensorData l16(TensorInfo(low, {2, 8, 5})), h16(TensorInfo(low, {2, 8, 16}));
    RawArray xa16(x16.data(), low, {2, 8, 12}), la16(l16.data(), low, {2, 8, 5}), ha16(h16.data(), low, {2, 8, 16});
    StepIO io16({{"x", xa16}}, {{lg, la16}, {h, ha16}});
    s16->run(io16);
    const std::vector<double> want = l16.toDoubleVector(), hs = h16.toDoubleVector();
    for (size_t i = 0; i < logits.size(); ++i)
      ASSERT_EQ(logits[i], static_cast<float>(want[i])) << mode << " logits " << i;
    for (size_t i = 0; i < hSum.size(); ++i) // the SUM anchor adds the widened values in FLOAT
      ASSERT_EQ(hSum[i], static_cast<float>(hs[i]) + static_cast<float>(hs[i + hSum.size()])) << mode << " h " << i;
    // A low buffer for a streamed input is refused, naming the type the user passes.
    TensorData wrong(TensorInfo(low, {2, 8, 12}));
    RawArray wa(wrong.data(), low, {2, 8, 12});
    StepIO bad({{"x", wa}}, {{lg, la}, {h, ha}});
    EXPECT_NE(thrown([&] { s->run(bad); }).find("FLOAT"), std::string::npos);
  }
}

TEST(Precision, DocsListEveryFp32Op) {
  std::ifstream in(std::string(POPART_SOURCE_DIR) + "/docs/precision.md");
  ASSERT_TRUE(in) << "docs/precision.md";
  std::stringstream doc;
  doc << in.rdbuf();
  std::string text = doc.str();
  for (const ir::Fp32Op &op : ir::fp32Ops()) {
    // Each op is named in a table row of the fp32 list, with the reason the code gives.
    std::string type = op.type;
    size_t row = text.find("| " + type);
    if (row == std::string::npos) row = text.find(", " + type + " ");
    if (row == std::string::npos) row = text.find(", " + type + ",");
    EXPECT_NE(row, std::string::npos) << type << " is kept in fp32 but docs/precision.md does not list it";
    if (row == std::string::npos) continue;
    std::string line = text.substr(row, text.find('\n', row) - row);
    if (!op.onlyLargeReductions) {
      EXPECT_NE(line.find(op.reason), std::string::npos) << line;
    }
  }
}

TEST(Precision, FoldCastIntoMatMulWritesTheProductInFp32WithOneRounding) {
  for (DataType low : {DataType::BFLOAT16, DataType::FLOAT16}) {
    ir::Graph g;
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = 13;
    const int64_t m = 5, k = 64, n = 7;
    g.addTensor("a", ir::TensorKind::Stream, TensorInfo(low, {m, k}));
    g.addInput("a");
    g.addTensor("b", ir::TensorKind::Stream, TensorInfo(low, {k, n}));
    g.addInput("b");
    g.addOp("MatMul", "", 13, "mm", {}, {"a", "b"}, {"p"});
    ir::Attributes to;
    to.set("to", static_cast<int64_t>(DataType::FLOAT));
    g.addOp("Cast", "", 13, "cast", to, {"p"}, {"y"});
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
    ASSERT_EQ(ir::foldCastIntoMatMul(g), 1);
    ASSERT_EQ(g.ops().size(), 1u);
    const ir::Op &mm = *g.ops()[0];
    ASSERT_EQ(mm.fusion.outputType, DataType::FLOAT);
    EXPECT_EQ(mm.outInfo(0).dataType(), DataType::FLOAT);
    EXPECT_NE(g.dump().find("out=FLOAT"), std::string::npos) << g.dump();
    ir::verifyGraph(g, "");

    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    TensorData a(TensorInfo(low, {m, k})), b(TensorInfo(low, {k, n}));
    std::vector<double> av, bv;
    auto fill = [&](TensorData &t, std::vector<double> &v) {
      for (int64_t i = 0; i < t.info().elementCount(); ++i) {
        float f = u(rng);
        uint16_t bits = low == DataType::BFLOAT16 ? floatToBfloat16(f) : floatToHalf(f);
        static_cast<uint16_t *>(t.data())[i] = bits;
        v.push_back(low == DataType::BFLOAT16 ? bfloat16ToFloat(bits) : halfToFloat(bits));
      }
    };
    fill(a, av);
    fill(b, bv);
    for (auto provider : {backend_cpu::KernelProvider::Reference, backend_cpu::KernelProvider::Any}) {
      backend_cpu::registerBuiltinKernels();
      auto kernel = backend_cpu::createKernel(mm, provider);
      std::vector<float> y(static_cast<size_t>(m * n), 1e6f);
      const void *ins[] = {a.data(), b.data()};
      void *outs[] = {y.data()};
      kernel->run({ins, 2, outs, 1});
      int roundedAway = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double want = 0;
          for (int64_t p = 0; p < k; ++p)
            want += av[size_t(i * k + p)] * bv[size_t(p * n + j)];
          float got = y[size_t(i * n + j)];
          EXPECT_NEAR(got, want, 1e-5 * (1 + std::fabs(want))) << toString(low) << " [" << i << "," << j << "]";
          float viaLow = low == DataType::BFLOAT16 ? bfloat16ToFloat(floatToBfloat16(float(want)))
                                                   : halfToFloat(floatToHalf(float(want)));
          roundedAway += std::fabs(got - viaLow) > 1e-6 ? 1 : 0;
        }
      EXPECT_GT(roundedAway, m * n / 2) << "the product was rounded to 16 bits before FLOAT";
    }
  }
}

TEST(Precision, TheVerifierRefusesAnOutputTypeOnAnFp32MatMul) {
  ir::Graph g;
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("a", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {3, 3}));
  g.addInput("a");
  g.addOp("MatMul", "", 13, "mm", {}, {"a", "a"}, {"p"});
  g.ops()[0]->fusion.outputType = DataType::FLOAT;
  g.addOutput("p");
  std::string message = thrown([&] {
    ir::inferShapes(g, nullptr);
    ir::verifyGraph(g, "here");
  });
  EXPECT_NE(message.find("fusion field 'outputType' FLOAT must be FLOAT, for 16-bit operands"), std::string::npos)
      << message;
}

TEST(Precision, ModelToHostWritesTheTrainingPrecisionOrTheFp32MasterWeights) {
  TensorId lossId;
  std::string model = mlp(&lossId);
  auto s = session(model, lossId, "bf16");
  runSteps(*s, 3);
  const auto masters = readAll(*s);
  std::string dir = ::testing::TempDir();
  s->modelToHost(dir + "/bf16.onnx");
  s->modelToHost(dir + "/fp32.onnx", "fp32");
  EXPECT_NE(thrown([&] { s->modelToHost(dir + "/x.onnx", "bf16"); }).find("expected training or fp32"),
            std::string::npos);
  // Both run (the bf16 one through a Cast per weight), and hold what they say.
  for (const char *name : {"bf16", "fp32"}) {
    auto back = TrainingSession::createFromOnnxModel(dir + "/" + name + ".onnx",
                                                     DataFlow(1, {lossId}, AnchorReturnType("FINAL")), lossId,
                                                     SGD({{"defaultLearningRate", {0.1f, true}}}));
    back->prepareDevice();
    back->weightsFromHost();
    // The bf16 model's initializers are "<name>_bf16", read through FLOAT buffers.
    const auto saved = readAll(*back, std::string(name) == "bf16" ? "_bf16" : "");
    for (const auto &[id, master] : masters)
      for (size_t i = 0; i < master.size(); ++i) {
        float want = std::string(name) == "bf16" ? bfloat16ToFloat(floatToBfloat16(master[i])) : master[i];
        ASSERT_EQ(saved.at(id)[i], want) << name << " " << id << "[" << i << "]";
      }
  }
}

TEST(Precision, AHalfModelTrainsAsItIsInFp32ModeAndWithFp32MastersInFp16And32) {
  TensorId lossId;
  std::string model = mlp(&lossId, DataType::FLOAT16);
  auto plain = session(model, lossId, "fp32");
  EXPECT_EQ(plain->getInfo("w1").dataType(), DataType::FLOAT16) << "PyTorch's model.half(): fp16 weights";
  auto master = session(model, lossId, "fp16.32");
  EXPECT_EQ(master->getInfo("w1").dataType(), DataType::FLOAT) << "fp16.32: an fp32 master copy";
  const auto before = readAll(*master);
  for (auto *s : {plain.get(), master.get()}) {
    std::vector<float> losses = runSteps(*s, 8, DataType::FLOAT16);
    EXPECT_LT(losses.back(), losses.front());
  }
  const auto after = readAll(*master);
  for (const auto &[id, w] : after)
    EXPECT_NE(w, before.at(id)) << id << " did not move";
  // The master copy reads and writes through fp16 buffers, as the model declares the weight.
  std::vector<uint16_t> half(static_cast<size_t>(kMlpWeights.at("b1")));
  RawArray arr(half.data(), DataType::FLOAT16, {1, 24});
  WeightsIO io;
  io.insert("b1", arr);
  master->readWeights(io);
  for (size_t i = 0; i < half.size(); ++i)
    EXPECT_EQ(half[i], floatToHalf(after.at("b1")[i]));
  std::string dir = ::testing::TempDir();
  master->modelToHost(dir + "/half.onnx");
  std::ifstream in(dir + "/half.onnx", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.find("w1_fp16"), std::string::npos) << "an fp16 weight is stored as the model declares it";
}

TEST(Precision, CheckpointsResumeBitIdenticallyInEveryModeAndRefuseAnotherMode) {
  TensorId lossId;
  std::string model = mlp(&lossId);
  std::string dir = ::testing::TempDir();
  for (const char *mode : {"fp32", "fp16.32", "fp16.16", "bf16"}) {
    auto first = session(model, lossId, mode);
    runSteps(*first, 2);
    std::string path = dir + "/" + mode + ".ckpt";
    first->saveCheckpoint(path);
    std::vector<float> want = runSteps(*first, 3, DataType::FLOAT, 2);
    auto resumed = session(model, lossId, mode);
    resumed->loadCheckpoint(path);
    std::vector<float> got = runSteps(*resumed, 3, DataType::FLOAT, 2);
    EXPECT_EQ(got, want) << mode;
    EXPECT_EQ(readAll(*resumed), readAll(*first)) << mode << ": the weights after resuming differ";
  }
  auto other = session(model, lossId, "bf16");
  EXPECT_NE(thrown([&] {
              other->loadCheckpoint(dir + "/fp16.32.ckpt");
            }).find("it was written in precision mode fp16.32, the session uses bf16"),
            std::string::npos);
}

TEST(Precision, HalfPartialsRoundEveryPartialSumInFp16And16) {
  // A sum of 4096 products 1 · 2^-11: with fp32 partials it is 2; rounded to fp16 after every
  // addition it stalls at 1, where 1 + 2^-11 is a tie that rounds back to 1 (fp16 has 10 bits).
  const int64_t k = 4096;
  ir::Graph g;
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("a", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT16, {1, k}));
  g.addInput("a");
  g.addTensor("b", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT16, {k, 1}));
  g.addInput("b");
  g.addOp("MatMul", "", 13, "mm", {}, {"a", "b"}, {"y"});
  g.addOutput("y");
  ir::inferShapes(g, nullptr);
  ir::PrecisionPolicy policy;
  policy.low = DataType::FLOAT16;
  EXPECT_EQ(ir::markHalfPartials(g, policy), 0) << "only fp16.16 rounds its partials";
  policy.halfPartials = true;
  ASSERT_EQ(ir::markHalfPartials(g, policy), 1);
  ir::verifyGraph(g, "");
  std::vector<uint16_t> a(static_cast<size_t>(k), floatToHalf(1.0f)),
      b(static_cast<size_t>(k), floatToHalf(1.0f / 2048));
  backend_cpu::registerBuiltinKernels();
  auto run = [&](const ir::Op &op, backend_cpu::KernelProvider provider) {
    uint16_t y = 0;
    const void *ins[] = {a.data(), b.data()};
    void *outs[] = {&y};
    backend_cpu::createKernel(op, provider)->run({ins, 2, outs, 1});
    return halfToFloat(y);
  };
  ir::Op &mm = *g.ops()[0];
  EXPECT_EQ(run(mm, backend_cpu::KernelProvider::Any), 1.0f) << "fp16 partials stall at 1";
  mm.attrs.set(ir::internal_attr::kHalfPartials, int64_t{0});
  EXPECT_EQ(run(mm, backend_cpu::KernelProvider::Any), 2.0f) << "fp32 partials reach 2";
}

TEST(Precision, Fp16And16MarksTheForwardAndGradientProducts) {
  TensorId lossId;
  std::string model = mlp(&lossId);
  for (const char *mode : {"fp16.16", "fp16.32"}) {
    auto s = session(model, lossId, mode);
    std::string ir = s->dumpIr();
    size_t marked = 0, pos = 0;
    while ((pos = ir.find("popart_half_partials=1", pos)) != std::string::npos) {
      ++marked;
      ++pos;
    }
    // Two Gemms forward; their gradients: two weight products and one data product.
    if (std::string(mode) == "fp16.16")
      EXPECT_GE(marked, 5u) << ir;
    else
      EXPECT_EQ(marked, 0u) << ir;
  }
}

TEST(Precision, A16BitConvFusesItsMaxPool) {
  // oneDNN's bf16 convolution and the FLOAT16 one's f32 chunks pool as they convolve (unfused,
  // the 16-bit convolution result was a full-size arena tensor).
  for (DataType type : {DataType::FLOAT, DataType::BFLOAT16, DataType::FLOAT16}) {
    ir::Graph g;
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(type, {1, 2, 8, 8}));
    g.addInput("x");
    g.addConst("w", TensorData::fromDoubles(type, {4, 2, 3, 3}, std::vector<double>(72, 0.1)));
    g.addOp("Conv", "", 13, "conv", {}, {"x", "w"}, {"c"});
    ir::Attributes pool;
    pool.set("kernel_shape", std::vector<int64_t>{2, 2});
    pool.set("strides", std::vector<int64_t>{2, 2});
    g.addOp("MaxPool", "", 13, "pool", pool, {"c"}, {"y"});
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
    ASSERT_EQ(ir::fuseConvPool(g), 1) << toString(type);
    backend_cpu::registerBuiltinKernels();
    const ir::Op &conv = *g.ops().front();
    // Where oneDNN computes no bf16 (an AVX2-only CPU), the fused bf16 op is the reference kernel's,
    // oneDNN saying why (its values: DnnlConvPool16.Bf16FusedPoolMatchesTheUnfusedFp32Reference).
    backend_cpu::KernelChoice choice = backend_cpu::KernelRegistry::instance().choose(conv);
    ASSERT_NE(choice.entry, nullptr) << toString(type) << ": " << choice.explanation();
    if (type == DataType::BFLOAT16 && !backend_cpu::dnnlComputesIn(type)) {
      EXPECT_EQ(choice.entry->provider, backend_cpu::KernelProvider::Reference) << choice.explanation();
      EXPECT_NE(choice.explanation().find("no bf16 convolution on this CPU"), std::string::npos)
          << choice.explanation();
      continue;
    }
    EXPECT_EQ(choice.entry->provider, backend_cpu::KernelProvider::Dnnl)
        << toString(type) << ": " << choice.explanation();
  }
}
