// The pass manager and the IR verifier: passes are registered once by name, pipelines are
// checked (unknown names, needs, passes that must run before a stage), a disabled pass leaves its
// pattern alone, --dump-ir-after's callback sees the IR after that pass, every pass is timed, and
// the verifier names what a broken graph breaks (and which pass broke it).

#include "thrown.hpp"

#include "ir/graph.hpp"
#include "ir/passes/pass_manager.hpp"
#include "ir/verify.hpp"
#include "session/pipelines.hpp"
#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/optimizer.hpp>
#include <popart/session.hpp>
#include <popart/stepio.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

using namespace popart;

namespace {

int countType(const ir::Graph &g, const std::string &type) {
  int n = 0;
  for (const auto &op : g.ops())
    n += op->type == type;
  return n;
}

/// x [2, 3] · W [3, 4] + b [4] → y: a Linear layer that fuseMatMulBias turns into one MatMul.
void linearLayer(ir::Graph &g) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3}));
  g.addInput("x");
  g.addConst("w", TensorData(TensorInfo(DataType::FLOAT, {3, 4})));
  g.addConst("b", TensorData(TensorInfo(DataType::FLOAT, {4})));
  g.addOp("MatMul", "", 13, "mm", {}, {"x", "w"}, {"p"});
  g.addOp("Add", "", 13, "bias", {}, {"p", "b"}, {"y"});
  g.addOutput("y");
}

ir::PipelineOptions verified() {
  ir::PipelineOptions o;
  o.verify = true;
  return o;
}

} // namespace

TEST(PassManager, EveryPipelinePassIsRegisteredOnceAndBothPipelinesCheck) {
  session::registerAllPasses();
  session::registerAllPasses(); // safe twice
  const auto &registry = ir::PassRegistry::instance();
  for (const auto *pipeline : {&session::inferencePipeline(), &session::trainingPipeline()})
    for (const auto &name : *pipeline) {
      const ir::Pass *p = registry.find(name);
      ASSERT_NE(p, nullptr) << name;
      EXPECT_FALSE(p->purpose.empty()) << name;
    }
  auto names = registry.names();
  for (const auto &n : names)
    EXPECT_EQ(std::count(names.begin(), names.end(), n), 1) << n;
  EXPECT_NO_THROW(ir::checkPipeline("inference", session::inferencePipeline(), {}));
  EXPECT_NO_THROW(ir::checkPipeline("training", session::trainingPipeline(), {}));
  ir::Pass again = registry.get("fuseRelu");
  EXPECT_NE(thrown([&] { ir::PassRegistry::instance().add(again); }).find("pass 'fuseRelu' is registered twice"),
            std::string::npos);
  std::string listing = session::describePipelines();
  EXPECT_NE(listing.find("inference pipeline:"), std::string::npos);
  EXPECT_NE(listing.find("training pipeline:"), std::string::npos);
  EXPECT_NE(listing.find("buildGradients (required)"), std::string::npos);
}

TEST(PassManager, UnknownNamesAreErrorsListingTheKnownPasses) {
  session::registerAllPasses();
  std::string e = thrown([] { ir::PassRegistry::instance().get("fuseEverything"); });
  EXPECT_NE(e.find("unknown pass 'fuseEverything' (known passes: "), std::string::npos) << e;
  EXPECT_NE(e.find("fuseMatMulBias"), std::string::npos) << e;
  ir::PipelineOptions o;
  o.disabled = {"fuseEverything"};
  EXPECT_NE(thrown([&] {
              ir::checkPipeline("inference", session::inferencePipeline(), o);
            }).find("unknown pass 'fuseEverything'"),
            std::string::npos);
  o.disabled.clear();
  o.dumpAfter = {"fuseNothing"};
  EXPECT_NE(thrown([&] {
              ir::checkPipeline("inference", session::inferencePipeline(), o);
            }).find("unknown pass 'fuseNothing'"),
            std::string::npos);
  EXPECT_NE(thrown([] {
              ir::checkPipeline("p", {"inferShapes", "fuseReluu"}, {});
            }).find("unknown pass 'fuseReluu'"),
            std::string::npos);
  // A session refuses a misspelt name when it is created, before compiling anything.
  SessionOptions so;
  so.disabledPasses = {"fuseMatmulBias"};
  e = thrown([&] {
    InferenceSession::createFromOnnxModel(POPART_SOURCE_DIR "/examples/mlp.onnx", DataFlow(1, std::vector<TensorId>{}),
                                          so);
  });
  EXPECT_NE(e.find("unknown pass 'fuseMatmulBias'"), std::string::npos) << e;
}

TEST(PassManager, RequiredPassesCannotBeDisabled) {
  session::registerAllPasses();
  ir::PipelineOptions o;
  o.disabled = {"buildGradients"};
  std::string e = thrown([&] { ir::checkPipeline("training", session::trainingPipeline(), o); });
  EXPECT_NE(e.find("pass 'buildGradients' cannot be disabled"), std::string::npos) << e;
}

TEST(PassManager, APassWhoseNeedsDoNotHoldIsAClearError) {
  session::registerAllPasses();
  std::string e = thrown([] { ir::checkPipeline("p", {"fuseMatMulBias"}, {}); });
  EXPECT_NE(e.find("pipeline 'p': pass 'fuseMatMulBias' needs shapes inferred, outputs fixed, which no pass before it "
                   "establishes"),
            std::string::npos)
      << e;
  e = thrown([] { ir::checkPipeline("p", {"inferShapes", "removeDeadCode", "fuseMaxPoolGradRelu"}, {}); });
  EXPECT_NE(e.find("pass 'fuseMaxPoolGradRelu' needs gradients built"), std::string::npos) << e;
  // A fusion whose gradient rule must apply cannot follow autodiff.
  e = thrown([] {
    ir::checkPipeline("p",
                      {"inferShapes", "findLoss", "seedDropout", "updateBatchNormStatistics", "findWeights",
                       "scaleLoss", "buildGradients", "fuseGelu"},
                      {});
  });
  EXPECT_NE(e.find("pass 'fuseGelu' must run before gradients built"), std::string::npos) << e;
  // A pass that invalidates a stage makes the passes after it wait for it again.
  e = thrown([] {
    ir::checkPipeline(
        "p", {"inferShapes", "findLoss", "scaleLoss", "buildGradients", "applyOptimizer", "removeDeadCode"}, {});
  });
  EXPECT_NE(e.find("pass 'removeDeadCode' needs shapes inferred"), std::string::npos) << e;
  // runPipeline checks before it changes anything.
  ir::Graph g;
  linearLayer(g);
  ir::PassContext c;
  e = thrown([&] { ir::runPipeline("p", {"fuseMatMulBias"}, g, c, verified()); });
  EXPECT_NE(e.find("needs shapes inferred"), std::string::npos) << e;
  EXPECT_EQ(countType(g, "Add"), 1);
}

TEST(PassManager, ADisabledPassLeavesItsPatternAndIsRecordedAsSkipped) {
  session::registerAllPasses();
  for (bool disable : {false, true}) {
    ir::Graph g;
    linearLayer(g);
    ir::PassContext c;
    c.keep = {"y"};
    ir::PipelineOptions o = verified();
    if (disable) o.disabled = {"fuseMatMulBias"};
    auto records = ir::runPipeline("inference", session::inferencePipeline(), g, c, o);
    EXPECT_EQ(countType(g, "Add"), disable ? 1 : 0) << disable;
    EXPECT_EQ(countType(g, "MatMul"), 1);
    ASSERT_EQ(records.size(), session::inferencePipeline().size());
    for (size_t i = 0; i < records.size(); ++i) {
      EXPECT_EQ(records[i].name, session::inferencePipeline()[i]);
      EXPECT_GE(records[i].milliseconds, 0.0);
      EXPECT_EQ(records[i].skipped, disable && records[i].name == "fuseMatMulBias") << records[i].name;
      if (records[i].name == "fuseMatMulBias") {
        EXPECT_EQ(records[i].rewrites, disable ? 0 : 1);
      }
    }
  }
  // fuseOps = false (--no-fusion) skips every optional pass, and only those.
  ir::Graph g;
  linearLayer(g);
  ir::PassContext c;
  c.keep = {"y"};
  ir::PipelineOptions o = verified();
  o.skipOptional = true;
  for (const auto &r : ir::runPipeline("inference", session::inferencePipeline(), g, c, o))
    EXPECT_EQ(r.skipped, ir::PassRegistry::instance().get(r.name).optional) << r.name;
  EXPECT_EQ(countType(g, "Add"), 1);
}

TEST(PassManager, DumpIrAfterSeesTheGraphAfterThatPass) {
  session::registerAllPasses();
  ir::Graph g;
  linearLayer(g);
  ir::PassContext c;
  c.keep = {"y"};
  ir::PipelineOptions o = verified();
  o.dumpAfter = {"fuseMatMulScale", "inferShapes"};
  std::vector<std::pair<std::string, std::string>> dumps;
  o.dump = [&](const std::string &pass, const ir::Graph &graph) { dumps.emplace_back(pass, graph.dump()); };
  ir::runPipeline("inference", session::inferencePipeline(), g, c, o);
  ASSERT_EQ(dumps.size(), 2u);
  EXPECT_EQ(dumps[0].first, "inferShapes");
  EXPECT_NE(dumps[0].second.find("Add"), std::string::npos) << dumps[0].second; // not fused yet
  EXPECT_EQ(dumps[1].first, "fuseMatMulScale");
  EXPECT_EQ(dumps[1].second.find("Add"), std::string::npos) << dumps[1].second; // fused by fuseMatMulBias before it
  EXPECT_NE(dumps[1].second.find("fused{bias}"), std::string::npos) << dumps[1].second;
}

TEST(Verifier, AWellFormedGraphPasses) {
  ir::Graph g;
  linearLayer(g);
  ir::inferShapes(g, nullptr);
  ir::VerifyOptions vo;
  vo.outputInfos = true;
  EXPECT_NO_THROW(ir::verifyGraph(g, "here", vo));
}

TEST(Verifier, CatchesLinksThatDisagree) {
  ir::Graph g;
  linearLayer(g);
  ir::Op *add = g.tensor("y").producer();
  add->inputs[1] = &g.tensor("w"); // without telling the tensors
  std::string e = thrown([&] { ir::verifyGraph(g, "after pass 'test'"); });
  EXPECT_NE(e.find("IR verification failed after pass 'test': Add 'bias' reads 'w' 1 time(s) but the tensor lists it "
                   "as a consumer 0 time(s)"),
            std::string::npos)
      << e;
}

TEST(Verifier, CatchesAProducerThatDoesNotWriteItsTensor) {
  ir::Graph g;
  linearLayer(g);
  g.tensor("y").setProducer(g.tensor("p").producer());
  std::string e = thrown([&] { ir::verifyGraph(g, ""); });
  EXPECT_NE(e.find("writes 'y' but the tensor names MatMul 'mm'"), std::string::npos) << e;
}

TEST(Verifier, CatchesATensorReadButNeverProduced) {
  ir::Graph g;
  linearLayer(g);
  g.removeOp(*g.tensor("p").producer());
  std::string e = thrown([&] { ir::verifyGraph(g, ""); });
  EXPECT_NE(e.find("tensor 'p' is read by Add 'bias' but no op produces it"), std::string::npos) << e;
}

TEST(Verifier, CatchesDanglingTensorsMissingOutputsAndUnknownInfos) {
  {
    ir::Graph g;
    linearLayer(g);
    g.addTensor("stray", ir::TensorKind::ActGrad, TensorInfo());
    std::string e = thrown([&] { ir::verifyGraph(g, ""); });
    EXPECT_NE(e.find("tensor 'stray' is dangling"), std::string::npos) << e;
  }
  {
    ir::Graph g;
    linearLayer(g);
    g.addOutput("nowhere");
    std::string e = thrown([&] { ir::verifyGraph(g, ""); });
    EXPECT_NE(e.find("graph output 'nowhere' does not exist"), std::string::npos) << e;
  }
  {
    ir::Graph g;
    linearLayer(g); // shapes not inferred
    ir::VerifyOptions vo;
    vo.outputInfos = true;
    std::string e = thrown([&] { ir::verifyGraph(g, "", vo); });
    EXPECT_NE(e.find("output 'p' of MatMul 'mm' has no inferred type"), std::string::npos) << e;
  }
}

TEST(Verifier, CatchesACycle) {
  ir::Graph g;
  linearLayer(g);
  g.setOpInput(*g.tensor("p").producer(), 0, &g.tensor("y")); // y = p + b, p = y · w
  std::string e = thrown([&] { ir::verifyGraph(g, ""); });
  EXPECT_NE(e.find("IR verification failed"), std::string::npos) << e;
  EXPECT_NE(e.find("cycle"), std::string::npos) << e;
}

TEST(Verifier, NamesThePassThatBrokeTheGraph) {
  session::registerAllPasses();
  if (!ir::PassRegistry::instance().find("test.dropProducer")) {
    ir::Pass breaker;
    breaker.name = "test.dropProducer";
    breaker.purpose = "removes the producer of 'p' and leaves its reader (a broken rewrite)";
    breaker.run = [](ir::Graph &g, ir::PassContext &) {
      g.removeOp(*g.tensor("p").producer());
      return 1;
    };
    ir::PassRegistry::instance().add(breaker);
  }
  ir::Graph g;
  linearLayer(g);
  ir::PassContext c;
  std::string e = thrown([&] { ir::runPipeline("p", {"inferShapes", "test.dropProducer"}, g, c, verified()); });
  EXPECT_NE(e.find("IR verification failed after pass 'test.dropProducer': tensor 'p' is read by Add 'bias'"),
            std::string::npos)
      << e;
  // Without verification the pipeline does not look.
  ir::Graph h;
  linearLayer(h);
  ir::PipelineOptions quiet;
  quiet.verify = false;
  EXPECT_NO_THROW(ir::runPipeline("p", {"inferShapes", "test.dropProducer"}, h, c, quiet));
}

namespace {

/// loss = sum(Relu(x · w)), x [4, 3], w [3, 5].
std::string reluLayerModel() {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {4, 3}), "x");
  std::vector<float> w0;
  for (int i = 0; i < 15; ++i)
    w0.push_back(0.1f * static_cast<float>(i - 7));
  TensorId w = b->addInitializedInputTensor(w0, {3, 5}, "w");
  b->addOutputTensor(ai.reducesum({ai.relu({ai.matmul({x, w})})}, std::nullopt, 0));
  return b->getModelProto();
}

} // namespace

TEST(PassManager, ATrainingSessionRunsItsPipelineVerifiedWithPassesDisabledDumpedAndTimed) {
  std::vector<std::vector<float>> weights;
  for (bool disable : {false, true}) {
    SessionOptions so;
    so.verifyIr = true;
    so.dumpIrAfter = {"buildGradients"};
    if (disable) so.disabledPasses = {"fuseRelu"};
    auto s = TrainingSession::createFromOnnxModel(reluLayerModel(), DataFlow(1, std::vector<TensorId>{}), "",
                                                  ConstSGD(0.1f), so);
    testing::internal::CaptureStdout();
    s->prepareDevice();
    std::string printed = testing::internal::GetCapturedStdout();
    EXPECT_EQ(printed.rfind("IR after pass buildGradients:\n", 0), 0u) << printed;
    EXPECT_NE(printed.find("ActivationGrad"), std::string::npos) << printed;   // the backward graph is there
    EXPECT_EQ(printed.find("IR after pass", 1), std::string::npos) << printed; // and only that dump
    s->weightsFromHost();
    s->enableProfiling();
    std::vector<float> x{1, -2, 3, 0.5f, 1, -1, 2, 2, -0.5f, -3, 1, 1};
    NDArrayWrapper<float> in(x.data(), {4, 3});
    StepIO io({{"x", in}}, {});
    s->run(io);
    std::string ir = s->dumpIr();
    EXPECT_EQ(ir.find("ai.onnx::Relu-") != std::string::npos, disable) << ir;
    std::string summary = s->profileSummary();
    EXPECT_NE(summary.find("compile time per pass"), std::string::npos) << summary;
    EXPECT_NE(summary.find(disable ? "fuseRelu (disabled)" : "fuseRelu (1 rewrites)"), std::string::npos) << summary;
    std::vector<float> w(15);
    NDArrayWrapper<float> arr(w.data(), {3, 5});
    WeightsIO wio;
    wio.insert("w", arr);
    s->readWeights(wio);
    weights.push_back(w);
  }
  EXPECT_EQ(weights[0], weights[1]); // the fusion changes how, not what
}
