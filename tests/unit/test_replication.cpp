// Replicated training in one process (docs/distributed.md, "Replicated training"): the session's
// replication options, the collective ops and their kernels over a LocalCommunicator, and the
// passes that all-reduce the gradients. tests/mpi/test_replication_mpi.cpp runs several replicas.

#include "thrown.hpp"

#include "backend_cpu/kernel.hpp"
#include "backend_cpu/kernel_context.hpp"
#include "comm/communicator.hpp"
#include "core/tensordata.hpp"
#include "ir/graph.hpp"
#include "ir/passes/pass_manager.hpp"
#include "optimizer/passes.hpp"
#include "optimizer/replication.hpp"
#include "session/pipelines.hpp"

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <tuple>
#include <vector>

using namespace popart;

namespace {

constexpr int64_t kN = 6;

/// loss = sum(w · x) + sum(u · x)²: w's gradient is x, u's depends on u.
std::string model() {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {kN}), "x");
  TensorId w = b->addInitializedInputTensor(std::vector<float>{0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f}, {kN}, "w");
  TensorId u = b->addInitializedInputTensor(std::vector<float>{0.1f, 0.2f, -0.3f, 0.05f, 0.0f, -0.05f}, {kN}, "u");
  TensorId ux = ai.reducesum({ai.mul({u, x})}, std::nullopt, 0);
  b->addOutputTensor(ai.add({ai.reducesum({ai.mul({w, x})}, std::nullopt, 0), ai.mul({ux, ux})}));
  return b->getModelProto();
}

std::vector<float> data(int k) {
  std::vector<float> x(kN);
  for (int64_t i = 0; i < kN; ++i)
    x[size_t(i)] = static_cast<float>(std::sin(0.7 * double(i + 1) * double(k + 1)));
  return x;
}

std::unique_ptr<TrainingSession> makeSession(const Optimizer &opt, const SessionOptions &so) {
  auto s = TrainingSession::createFromOnnxModel(model(), DataFlow(1, std::vector<TensorId>{}), "", opt, so);
  s->prepareDevice();
  return s;
}

/// Runs \p steps steps with \p perStep samples each (the accumulation factor's leading dimension).
void train(TrainingSession &s, int steps, int perStep) {
  for (int t = 0; t < steps; ++t) {
    std::vector<float> x;
    for (int a = 0; a < perStep; ++a) {
      std::vector<float> one = data(t * perStep + a);
      x.insert(x.end(), one.begin(), one.end());
    }
    Shape shape{kN};
    if (perStep > 1) shape.insert(shape.begin(), perStep);
    NDArrayWrapper<float> in(x.data(), shape);
    StepIO io({{"x", in}}, {});
    s.run(io);
  }
}

std::vector<float> weight(const TrainingSession &s, const TensorId &id) {
  std::vector<float> v(kN);
  NDArrayWrapper<float> arr(v.data(), {kN});
  WeightsIO io;
  io.insert(id, arr);
  s.readWeights(io);
  return v;
}

SessionOptions replicated(int count) {
  SessionOptions so;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = count;
  so.communicator = std::make_shared<comm::LocalCommunicator>();
  return so;
}

} // namespace

TEST(ReplicationOptions, ACountOtherThanTheCommunicatorsSizeIsAnErrorNamingBoth) {
  std::string e = thrown([] { makeSession(SGD(), replicated(2)); });
  EXPECT_NE(e.find("replicatedGraphCount is 2 but the communicator has 1 ranks"), std::string::npos) << e;
}

TEST(ReplicationOptions, ReplicationSettingsWithoutEnableReplicatedGraphsAreErrors) {
  SessionOptions so;
  so.replicatedGraphCount = 2;
  std::string e = thrown([&] { makeSession(SGD(), so); });
  EXPECT_NE(e.find("replicatedGraphCount is 2 but enableReplicatedGraphs is false"), std::string::npos) << e;
  so = replicated(1);
  so.enableReplicatedGraphs = false;
  e = thrown([&] { makeSession(SGD(), so); });
  EXPECT_NE(e.find("communicator is set but enableReplicatedGraphs is false"), std::string::npos) << e;
  so = {};
  so.accumulationAndReplicationReductionType = ReductionType::NoReduction;
  e = thrown([&] { makeSession(SGD(), so); });
  EXPECT_NE(e.find("accumulationAndReplicationReductionType must be Mean or Sum, got NoReduction"), std::string::npos)
      << e;
}

TEST(ReplicationOptions, OneReplicaTrainsAsTheUnreplicatedSessionAndHasIndexZero) {
  // A mean or sum over one rank is its input, bit for bit, so the AllReduce kernels that the
  // replicated plan runs must leave the fp32 session's results exactly as they are.
  SGD opt({{"defaultLearningRate", {0.05f, false}}, {"defaultMomentum", {0.9f, true}}});
  for (ReductionType reduction : {ReductionType::Mean, ReductionType::Sum}) {
    SessionOptions so = replicated(1);
    so.accumulationAndReplicationReductionType = reduction;
    auto one = makeSession(opt, so);
    auto plain = makeSession(opt, {});
    EXPECT_EQ(one->getReplicationIndex(), 0);
    EXPECT_EQ(plain->getReplicationIndex(), 0);
    EXPECT_NE(one->dumpIr().find("AllReduce"), std::string::npos);
    EXPECT_EQ(plain->dumpIr().find("AllReduce"), std::string::npos);
    train(*one, 3, 1);
    train(*plain, 3, 1);
    for (const TensorId id : {"w", "u"})
      EXPECT_EQ(weight(*one, id), weight(*plain, id)) << id;
  }
}

TEST(ReplicationOptions, SumAccumulatesTheGradientsWithoutDividingByTheFactor) {
  // Plain SGD is linear in the gradient: summing two micro-batches' gradients at lr is averaging
  // them at 2·lr (scaling by a power of two is exact, so the bits agree).
  SessionOptions sum;
  sum.enableGradientAccumulation = true;
  sum.accumulationFactor = 2;
  sum.accumulationAndReplicationReductionType = ReductionType::Sum;
  SessionOptions mean = sum;
  mean.accumulationAndReplicationReductionType = ReductionType::Mean;
  auto summed = makeSession(SGD({{"defaultLearningRate", {0.01f, false}}}), sum);
  auto averaged = makeSession(SGD({{"defaultLearningRate", {0.02f, false}}}), mean);
  train(*summed, 2, 2);
  train(*averaged, 2, 2);
  for (const TensorId id : {"w", "u"})
    EXPECT_EQ(weight(*summed, id), weight(*averaged, id)) << id;
  // Step 1 of w from the formula: w -= lr · (x0 + x1) (w's gradient is x).
  auto fresh = makeSession(SGD({{"defaultLearningRate", {0.01f, false}}}), sum);
  train(*fresh, 1, 2);
  const std::vector<float> w = weight(*fresh, "w"), x0 = data(0), x1 = data(1);
  const double w0[] = {0.5, -1.0, 2.0, 0.25, -0.75, 1.5};
  for (size_t i = 0; i < size_t(kN); ++i)
    EXPECT_NEAR(w[i], w0[i] - 0.01 * (double(x0[i]) + double(x1[i])), 1e-6) << i;
}

// ---------------------------------------------------------------------------------------------
// The passes

namespace {

/// Weights w [4] and u [2, 3] with stream gradients gw and gu, as buildGradients leaves them,
/// through allReduceGradients (with \p bucketBytes), applyOptimizer (with \p sharding) and agreeAllFinite.
struct GradientGraph {
  ir::Graph graph;
  ir::PassContext context;
  SGD opt{{{"defaultLearningRate", {0.1f, false}}}};
  explicit GradientGraph(bool enabled, const optimizer::ShardingOptions &sharding = {}, int64_t bucketBytes = 0) {
    ir::registerBuiltinOps();
    popart::session::registerAllPasses();
    graph.opsets()["ai.onnx"] = 17;
    for (const auto &[w, gw, shape] : {std::tuple{"w", "gw", Shape{4}}, std::tuple{"u", "gu", Shape{2, 3}}}) {
      TensorInfo info(DataType::FLOAT, shape);
      graph.addTensor(w, ir::TensorKind::Variable, info).setData(std::make_shared<TensorData>(info));
      graph.addTensor(gw, ir::TensorKind::Stream, info);
      graph.addInput(gw);
      context.state<ir::TrainingTensors>().weightGrads.emplace_back(w, gw);
    }
    auto &opt_state = context.state<optimizer::OptimizerPassState>();
    opt_state.optimizer = &opt;
    opt_state.options.checkFinite = true;
    opt_state.options.sharding = sharding;
    context.state<optimizer::ReplicationPassOptions>().enabled = enabled;
    context.state<optimizer::ReplicationPassOptions>().bucketBytes = bucketBytes;
    context.training = true;
    ir::PipelineOptions po;
    po.entryStages = ir::ShapesInferred | ir::GradientsBuilt;
    po.verify = true;
    ir::runPipeline("replication", {"allReduceGradients", "applyOptimizer", "agreeAllFinite"}, graph, context, po);
  }
  std::vector<const ir::Op *> ops(const std::string &type) const {
    std::vector<const ir::Op *> found;
    for (const auto &op : graph.ops())
      if (op->type == type) found.push_back(op.get());
    return found;
  }
};

} // namespace

TEST(ReplicationPass, EachWeightGradientIsAllReducedBeforeTheOptimiserReadsIt) {
  GradientGraph g(true);
  EXPECT_EQ(g.ops("AllReduce").size(), 3u); // two gradients and the all-finite flag
  const auto updates = g.ops("SGDUpdate");
  ASSERT_EQ(updates.size(), 2u);
  std::set<TensorId> reduced;
  for (const ir::Op *update : updates) {
    const ir::Op *producer = update->input(1).producer();
    ASSERT_NE(producer, nullptr) << update->debugName();
    EXPECT_EQ(producer->type, "AllReduce") << update->debugName();
    EXPECT_EQ(producer->attrs.getString("op"), "Mean");
    reduced.insert(producer->input(0).id());
  }
  EXPECT_EQ(reduced, (std::set<TensorId>{"gw", "gu"}));
  // The finite check reads the reduced gradients, and its flag is agreed by And.
  const auto finite = g.ops("AllFinite");
  ASSERT_EQ(finite.size(), 1u);
  for (const ir::Tensor *t : finite[0]->inputs)
    EXPECT_EQ(t->producer()->type, "AllReduce");
  const TensorId agreed = g.context.state<optimizer::OptimizerPassState>().applied.allFinite;
  const ir::Op *and_ = g.graph.tensor(agreed).producer();
  ASSERT_NE(and_, nullptr);
  EXPECT_EQ(and_->type, "AllReduce");
  EXPECT_EQ(and_->attrs.getString("op"), "And");
  EXPECT_EQ(and_->input(0).producer(), finite[0]);
  EXPECT_EQ(and_->phase, optimizer::PreUpdate);
}

TEST(ReplicationPass, ShardedWeightsGradientsAreReduceScatteredAndNotAllReduced) {
  // u (6 elements) is sharded over 2 replicas; w (4, below minElements) stays whole. Only gw is
  // all-reduced, blocking or in a bucket: gu all-reduced before its reduce-scatter would be
  // summed twice with Sum.
  optimizer::ShardingOptions sharding;
  sharding.replicas = 2;
  sharding.minElements = 5;
  for (int64_t bucketBytes : {0, 1024}) {
    GradientGraph g(true, sharding, bucketBytes);
    std::set<TensorId> allReduced;
    for (const char *type : {"AllReduce", "AllReduceStart"})
      for (const ir::Op *op : g.ops(type))
        for (const ir::Tensor *t : op->inputs)
          allReduced.insert(t->id());
    EXPECT_EQ(allReduced.count("gw"), 1u) << "bucketBytes " << bucketBytes;
    EXPECT_EQ(allReduced.count("gu"), 0u) << "bucketBytes " << bucketBytes;
    const auto scatters = g.ops("ReduceScatter");
    ASSERT_EQ(scatters.size(), 1u) << "bucketBytes " << bucketBytes;
    const ir::Op *flatten = scatters[0]->input(0).producer(); // gu flattened (6 elements need no padding)
    ASSERT_NE(flatten, nullptr);
    EXPECT_EQ(flatten->input(0).id(), "gu");
  }
}

TEST(ReplicationPass, WithoutReplicationNothingIsInserted) {
  GradientGraph g(false);
  EXPECT_TRUE(g.ops("AllReduce").empty());
  for (const ir::Op *update : g.ops("SGDUpdate"))
    EXPECT_FALSE(update->input(1).producer()) << update->debugName();
}

// ---------------------------------------------------------------------------------------------
// The collective ops

namespace {

struct OneOp {
  ir::Graph graph;
  ir::Op *op = nullptr;
  OneOp(const std::string &type, ir::Attributes attrs, const TensorInfo &in) {
    ir::registerBuiltinOps();
    backend_cpu::registerBuiltinKernels();
    graph.addTensor("x", ir::TensorKind::Stream, in);
    graph.addInput("x");
    op = &graph.addOp(type, "ai.graphcore", 1, "c", std::move(attrs), {"x"}, {"y"});
    op->def->setup(*op);
  }
};

ir::Attributes attrs(const std::string &reduction, int64_t replicas = 0) {
  ir::Attributes a;
  if (!reduction.empty()) a.set("op", reduction);
  if (replicas) a.set("replicas", replicas);
  return a;
}

/// Runs \p one's kernel with \p context on \p x; \returns its output.
std::vector<float> run(const OneOp &one, const backend_cpu::KernelContext &context, std::vector<float> x) {
  auto kernel = backend_cpu::createKernel(*one.op, backend_cpu::KernelProvider::Any, context);
  std::vector<float> y(size_t(one.op->outInfo(0).elementCount()), NAN);
  const void *in[] = {x.data()};
  void *out[] = {y.data()};
  backend_cpu::KernelArgs a;
  a.inputs = in;
  a.inputCount = 1;
  a.outputs = out;
  a.outputCount = 1;
  kernel->run(a);
  return y;
}

} // namespace

TEST(CollectiveOps, ShapesAndTypesAreChecked) {
  OneOp gather("AllGather", attrs("", 3), TensorInfo(DataType::FLOAT16, {2, 5}));
  EXPECT_EQ(gather.op->outInfo(0), TensorInfo(DataType::FLOAT16, {3, 2, 5}));
  OneOp scatter("ReduceScatter", attrs("Sum", 4), TensorInfo(DataType::FLOAT, {2, 6}));
  EXPECT_EQ(scatter.op->outInfo(0), TensorInfo(DataType::FLOAT, {3}));
  std::string e = thrown([] { OneOp("ReduceScatter", attrs("Sum", 4), TensorInfo(DataType::FLOAT, {6})); });
  EXPECT_NE(e.find("6 elements, which do not split into 4 equal blocks"), std::string::npos) << e;
  e = thrown([] { OneOp("AllReduce", attrs("Mean"), TensorInfo(DataType::INT64, {6})); });
  EXPECT_NE(e.find("cannot combine INT64 by Mean"), std::string::npos) << e;
  e = thrown([] { OneOp("AllReduce", attrs("Max"), TensorInfo(DataType::FLOAT, {6})); });
  EXPECT_NE(e.find("attribute op must be Sum, Mean or And, got 'Max'"), std::string::npos) << e;
}

TEST(CollectiveOps, KernelsRunOverTheContextsCommunicator) {
  backend_cpu::KernelContext context;
  context.communicator = std::make_shared<comm::LocalCommunicator>();
  const std::vector<float> x{1.5f, -2.0f, 3.25f, 0.0f};
  // Over one rank every collective returns its input.
  EXPECT_EQ(run(OneOp("AllReduce", attrs("Mean"), TensorInfo(DataType::FLOAT, {4})), context, x), x);
  EXPECT_EQ(run(OneOp("ReduceScatter", attrs("Sum", 1), TensorInfo(DataType::FLOAT, {4})), context, x), x);
  EXPECT_EQ(run(OneOp("AllGather", attrs("", 1), TensorInfo(DataType::FLOAT, {4})), context, x), x);
  std::string e = thrown([&] { run(OneOp("AllGather", attrs("", 2), TensorInfo(DataType::FLOAT, {4})), context, x); });
  EXPECT_NE(e.find("shapes are for 2 replicas, but the communicator has 1 ranks"), std::string::npos) << e;
  e = thrown([&] { run(OneOp("AllReduce", attrs("Sum"), TensorInfo(DataType::FLOAT, {4})), {}, x); });
  EXPECT_NE(e.find("needs the session's communicator"), std::string::npos) << e;
}
