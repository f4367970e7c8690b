// The state that replicas do not simply share, under mpirun (tests/CMakeLists.txt runs it on 2 and
// 4 ranks; docs/distributed.md, "Replica state"): each replica's Dropout masks, BatchNorm running
// statistics kept per replica or averaged, the check that every rank was created alike, and one
// checkpoint for the job that resumes with the same or another replica count. The references are
// single-process sessions fed one replica's micro-batches.

#include "replication_helpers.hpp"
#include "session/session_common.hpp"

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace popart;
using namespace popart::testing;

namespace {

constexpr int64_t kBatch = 4, kIn = 6, kHidden = 8, kOut = 3;
constexpr uint64_t kSeed = 7;

void addValue(onnx::ValueInfoProto *v, const std::string &name, const std::vector<int64_t> &dims) {
  v->set_name(name);
  auto *tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims)
    tt->mutable_shape()->add_dim()->set_dim_value(d);
}

void addInitializer(onnx::GraphProto *g, const std::string &name, const std::vector<int64_t> &dims,
                    const std::vector<float> &values) {
  onnx::TensorProto *t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims)
    t->add_dims(d);
  for (float v : values)
    t->add_float_data(v);
}

onnx::NodeProto *addNode(onnx::GraphProto *g, const std::string &type, const std::vector<std::string> &inputs,
                         const std::vector<std::string> &outputs) {
  onnx::NodeProto *n = g->add_node();
  n->set_op_type(type);
  n->set_name(outputs[0] + "_node");
  for (const auto &i : inputs)
    n->add_input(i);
  for (const auto &o : outputs)
    n->add_output(o);
  return n;
}

/// A scalar Constant node \p name of type \p type holding \p value.
void addConstant(onnx::GraphProto *g, const std::string &name, onnx::TensorProto::DataType type, float value) {
  onnx::NodeProto *n = addNode(g, "Constant", {}, {name});
  onnx::AttributeProto *a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  onnx::TensorProto *t = a->mutable_t();
  t->set_data_type(type);
  if (type == onnx::TensorProto::BOOL)
    t->add_int32_data(value != 0.0f ? 1 : 0);
  else
    t->add_float_data(value);
}

/// loss = mean((Dropout(relu(BatchNorm(x·W1))), 0.5)·W2 - target)²), with the BatchNorm in training
/// mode (running statistics bn_mean and bn_var, momentum 0.9) and the Dropout's output anchored as
/// "dropped". \p w1Seed changes the initial W1.
std::string model(uint32_t w1Seed = 1) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto *opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(15);
  onnx::GraphProto *g = m.mutable_graph();
  g->set_name("replica_state");
  addValue(g->add_input(), "x", {kBatch, kIn});
  addValue(g->add_input(), "target", {kBatch, kOut});
  addInitializer(g, "w1", {kIn, kHidden}, randomValues(kIn * kHidden, w1Seed, 0.5f));
  addInitializer(g, "bn_scale", {kHidden}, randomValues(kHidden, 2, 0.1f, 1.0f));
  addInitializer(g, "bn_bias", {kHidden}, randomValues(kHidden, 3, 0.1f));
  addInitializer(g, "bn_mean", {kHidden}, std::vector<float>(kHidden, 0.0f));
  addInitializer(g, "bn_var", {kHidden}, std::vector<float>(kHidden, 1.0f));
  addInitializer(g, "w2", {kHidden, kOut}, randomValues(kHidden * kOut, 4, 0.4f));
  addNode(g, "MatMul", {"x", "w1"}, {"h"});
  onnx::NodeProto *bn = addNode(g, "BatchNormalization", {"h", "bn_scale", "bn_bias", "bn_mean", "bn_var"},
                                {"normed", "bn_mean_out", "bn_var_out"});
  onnx::AttributeProto *training = bn->add_attribute();
  training->set_name("training_mode");
  training->set_type(onnx::AttributeProto::INT);
  training->set_i(1);
  onnx::AttributeProto *momentum = bn->add_attribute();
  momentum->set_name("momentum");
  momentum->set_type(onnx::AttributeProto::FLOAT);
  momentum->set_f(0.9f);
  addNode(g, "Relu", {"normed"}, {"activated"});
  addConstant(g, "ratio", onnx::TensorProto::FLOAT, 0.5f);
  addConstant(g, "train", onnx::TensorProto::BOOL, 1.0f);
  addNode(g, "Dropout", {"activated", "ratio", "train"}, {"dropped"});
  addNode(g, "MatMul", {"dropped", "w2"}, {"out"});
  addNode(g, "Sub", {"out", "target"}, {"diff"});
  addNode(g, "Mul", {"diff", "diff"}, {"squared"});
  onnx::NodeProto *mean = addNode(g, "ReduceMean", {"squared"}, {"loss"});
  onnx::AttributeProto *keep = mean->add_attribute();
  keep->set_name("keepdims");
  keep->set_type(onnx::AttributeProto::INT);
  keep->set_i(0);
  onnx::ValueInfoProto *loss = g->add_output();
  loss->set_name("loss");
  loss->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  loss->mutable_type()->mutable_tensor_type()->mutable_shape();
  return m.SerializeAsString();
}

SGD sgd(float lr = 0.05f) { return SGD({{"defaultLearningRate", {lr, false}}, {"defaultMomentum", {0.9f, true}}}); }

struct SessionSetup {
  bool replicated = true;
  ReplicatedStatistics statistics = ReplicatedStatistics::Local;
  float lr = 0.05f;
};

std::unique_ptr<TrainingSession> makeSession(const SessionSetup &setup, uint32_t w1Seed = 1) {
  SessionOptions so;
  so.numThreads = 1;
  so.replicatedBatchNormStatistics = setup.statistics;
  if (setup.replicated) {
    so.enableReplicatedGraphs = true;
    so.replicatedGraphCount = world()->size();
    so.communicator = world();
  }
  auto s = TrainingSession::createFromOnnxModel(model(w1Seed), DataFlow(1, std::vector<TensorId>{"dropped"}), "loss",
                                                sgd(setup.lr), so);
  s->prepareDevice();
  s->setRandomSeed(kSeed);
  return s;
}

/// Replica \p replica's micro-batch of step \p step.
std::vector<float> inputs(int step, int replica, int64_t width, uint32_t salt) {
  return randomValues(kBatch * width, 1000u * static_cast<uint32_t>(step) + 10u * static_cast<uint32_t>(replica) + salt,
                      1.0f, 0.5f);
}

/// Runs one step on \p replica's micro-batch; \returns the anchored Dropout output.
std::vector<float> step(TrainingSession &s, int stepIndex, int replica) {
  std::vector<float> x = inputs(stepIndex, replica, kIn, 1), t = inputs(stepIndex, replica, kOut, 2);
  std::vector<float> dropped(kBatch * kHidden);
  NDArrayWrapper<float> xa(x.data(), {kBatch, kIn}), ta(t.data(), {kBatch, kOut});
  NDArrayWrapper<float> da(dropped.data(), {kBatch, kHidden});
  StepIO io({{"x", xa}, {"target", ta}}, {{"dropped", da}});
  s.run(io);
  return dropped;
}

std::vector<float> valuesOf(const TrainingSession &s, const TensorId &id) {
  const TensorInfo info = s.getInfo(id);
  std::vector<float> v(static_cast<size_t>(info.elementCount()));
  NDArrayWrapper<float> arr(v.data(), info.shape());
  WeightsIO io;
  io.insert(id, arr);
  s.readWeights(io);
  return v;
}

/// The trained weights, then the running statistics.
std::vector<std::vector<float>> stateOf(const TrainingSession &s) {
  std::vector<std::vector<float>> all;
  for (const TensorId &id : s.getWeightIds())
    all.push_back(valuesOf(s, id));
  all.push_back(valuesOf(s, "bn_mean"));
  all.push_back(valuesOf(s, "bn_var"));
  return all;
}

std::string checkpointPath(const std::string &name) {
  // The same path on every rank: one checkpoint for the job, which rank 0 writes.
  return ::testing::TempDir() + "replication_state_" + name + "_np" + std::to_string(world()->size()) + ".ckpt";
}

TEST(ReplicaState, DropoutMasksDifferPerReplicaAndFollowTheReplicaSeed) {
  const int r = world()->rank(), n = world()->size();
  auto replicated = makeSession({});
  // Every replica gets the same micro-batch: only the masks can make the outputs differ.
  const std::vector<float> mine = step(*replicated, 0, 0);
  const std::vector<uint64_t> hashes = hashesOnAllRanks({mine});
  for (int q = 0; q < n; ++q)
    if (q != r) {
      EXPECT_NE(hashes[size_t(q)], hashes[size_t(r)]) << "ranks " << r << " and " << q << " drew one mask";
    }

  // One process whose seed is replica r's draws rank r's masks; replica 0's seed is the seed itself.
  auto single = makeSession({false});
  single->setRandomSeed(session::replicaSeed(kSeed, r));
  EXPECT_EQ(step(*single, 0, 0), mine) << "rank " << r;
  auto unreplicated = makeSession({false});
  const std::vector<float> plain = step(*unreplicated, 0, 0);
  if (r == 0) {
    EXPECT_EQ(plain, mine) << "replica 0 must draw the masks of an unreplicated session";
  } else {
    EXPECT_NE(plain, mine) << "rank " << r;
  }
}

TEST(ReplicaState, BatchNormStatisticsArePerReplicaByDefault) {
  const int r = world()->rank(), n = world()->size();
  // No learning: the running statistics of later steps see the same weights in every session.
  auto replicated = makeSession({true, ReplicatedStatistics::Local, 0.0f});
  auto single = makeSession({false, ReplicatedStatistics::Local, 0.0f});
  for (int k = 0; k < 2; ++k) {
    step(*replicated, k, r);
    step(*single, k, r);
  }
  for (const TensorId id : {"bn_mean", "bn_var"}) {
    const std::vector<float> mine = valuesOf(*replicated, id);
    EXPECT_EQ(mine, valuesOf(*single, id)) << id << " on rank " << r;
    const std::vector<uint64_t> hashes = hashesOnAllRanks({mine});
    for (int q = 0; q < n; ++q)
      if (q != r) {
        EXPECT_NE(hashes[size_t(q)], hashes[size_t(r)]) << id << ": ranks " << r << " and " << q;
      }
  }
}

TEST(ReplicaState, MeanBatchNormStatisticsAverageTheReplicas) {
  const int r = world()->rank(), n = world()->size();
  auto replicated = makeSession({true, ReplicatedStatistics::Mean, 0.0f});
  for (int k = 0; k < 2; ++k)
    step(*replicated, k, r);
  // The reference: the mean, in double, of the statistics of one process per replica's micro-batches.
  std::vector<std::vector<double>> expected(2, std::vector<double>(kHidden, 0.0));
  for (int q = 0; q < n; ++q) {
    auto single = makeSession({false, ReplicatedStatistics::Local, 0.0f});
    for (int k = 0; k < 2; ++k)
      step(*single, k, q);
    for (size_t s = 0; s < 2; ++s) {
      const std::vector<float> v = valuesOf(*single, s == 0 ? "bn_mean" : "bn_var");
      for (size_t i = 0; i < v.size(); ++i)
        expected[s][i] += v[i] / n;
    }
  }
  std::vector<std::vector<float>> mine;
  for (size_t s = 0; s < 2; ++s) {
    mine.push_back(valuesOf(*replicated, s == 0 ? "bn_mean" : "bn_var"));
    for (size_t i = 0; i < mine[s].size(); ++i)
      EXPECT_NEAR(mine[s][i], expected[s][i], 2e-6 * std::max(1.0, std::fabs(expected[s][i])))
          << (s == 0 ? "bn_mean" : "bn_var") << " element " << i << " on rank " << r;
  }
  expectSameOnEveryRank(mine, "averaged statistics");
}

/// Creates a replicated session whose rank \p odd gets \p oddOptions (or W1 seed \p oddW1) and
/// \returns the error every rank must get.
std::string creationError(int odd, const std::function<void(SessionOptions &)> &oddOptions, uint32_t oddW1 = 1) {
  const int r = world()->rank();
  SessionOptions so;
  so.numThreads = 1;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = world()->size();
  so.communicator = world();
  if (r == odd) oddOptions(so);
  try {
    TrainingSession::createFromOnnxModel(model(r == odd ? oddW1 : 1), DataFlow(1, std::vector<TensorId>{}), "loss",
                                         sgd(), so);
  } catch (const popart::error &e) {
    return e.what();
  }
  return "no error";
}

TEST(ReplicaState, RanksCreatedDifferentlyAllGetAnErrorNamingTheRankAndWhat) {
  const int last = world()->size() - 1;
  const std::string differs = "rank " + std::to_string(last) + " differs from rank 0 in ";
  std::string m =
      creationError(last, [](SessionOptions &so) { so.accumulationFactor = 2, so.enableGradientAccumulation = true; });
  EXPECT_NE(m.find(differs + "gradient accumulation"), std::string::npos) << m;
  EXPECT_NE(m.find("rank " + std::to_string(world()->rank()) + " of "), std::string::npos) << m;
  m = creationError(last, [](SessionOptions &so) { so.precision = "bf16"; });
  EXPECT_NE(m.find(differs + "precision"), std::string::npos) << m;
  m = creationError(last, [](SessionOptions &so) { so.replicatedBatchNormStatistics = ReplicatedStatistics::Mean; });
  EXPECT_NE(m.find(differs + "replication options"), std::string::npos) << m;
  m = creationError(last, [](SessionOptions &so) { so.matmulTuning = "0"; });
  EXPECT_NE(m.find(differs + "compilation options"), std::string::npos) << m;
  m = creationError(
      last, [](SessionOptions &) {}, 99);
  EXPECT_NE(m.find(differs + "the model"), std::string::npos) << m;
  EXPECT_EQ(m.find("optimiser"), std::string::npos) << m;
  // Another optimiser on one rank, the options alike.
  SessionOptions so;
  so.numThreads = 1;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = world()->size();
  so.communicator = world();
  try {
    TrainingSession::createFromOnnxModel(model(), DataFlow(1, std::vector<TensorId>{}), "loss",
                                         sgd(world()->rank() == last ? 0.1f : 0.05f), so);
    m = "no error";
  } catch (const popart::error &e) {
    m = e.what();
  }
  EXPECT_NE(m.find(differs + "the optimiser"), std::string::npos) << m;
  // Alike: no error, and the communicator still works.
  EXPECT_NO_THROW(makeSession({}));
}

/// Trains 2 steps, checkpoints, trains 2 more, and checks that a session resumed from the checkpoint
/// ends with the same bits: weights and running statistics with \p statistics Mean; with Local
/// the checkpoint holds rank 0's statistics, so the weights alone.
void checkResumedBitIdentical(ReplicatedStatistics statistics) {
  const int r = world()->rank();
  const std::string path = checkpointPath("same");
  const SessionSetup setup{true, statistics, 0.05f};
  auto uninterrupted = makeSession(setup);
  for (int k = 0; k < 2; ++k)
    step(*uninterrupted, k, r);
  // One checkpoint for the job: only rank 0 writes, even where each rank names its own file.
  const std::string own = checkpointPath("rank" + std::to_string(r));
  uninterrupted->saveCheckpoint(own);
  EXPECT_EQ(std::ifstream(own).good(), r == 0) << own;
  std::remove(own.c_str());
  uninterrupted->saveCheckpoint(path);
  world()->barrier(); // rank 0 has renamed the file into place
  for (int k = 2; k < 4; ++k)
    step(*uninterrupted, k, r);

  auto resumed = makeSession(setup);
  resumed->setRandomSeed(kSeed + 1); // the checkpoint's random state replaces it
  resumed->loadCheckpoint(path);
  EXPECT_EQ(resumed->getStepCount(), 2);
  for (int k = 2; k < 4; ++k)
    step(*resumed, k, r);
  const bool mean = statistics == ReplicatedStatistics::Mean;
  const auto compared = [&](const TrainingSession &s) { return mean ? stateOf(s) : weightsOf(s); };
  EXPECT_EQ(compared(*resumed), compared(*uninterrupted)) << "rank " << r;
  expectSameOnEveryRank(compared(*resumed));
  world()->barrier();
  if (r == 0) std::remove(path.c_str());
}

TEST(ReplicaState, ResumingWithTheSameReplicaCountIsBitIdentical) {
  checkResumedBitIdentical(ReplicatedStatistics::Mean);
  checkResumedBitIdentical(ReplicatedStatistics::Local);
}

TEST(ReplicaState, CheckpointsResumeWithAnotherReplicaCount) {
  const int r = world()->rank();
  // One process to N replicas: every rank computes the one process's state itself; rank 0 saves it.
  const std::string fromOne = checkpointPath("from_one");
  auto single = makeSession({false});
  for (int k = 0; k < 2; ++k)
    step(*single, k, 0);
  if (r == 0) single->saveCheckpoint(fromOne);
  world()->barrier();
  auto replicas = makeSession({true, ReplicatedStatistics::Mean});
  replicas->loadCheckpoint(fromOne);
  EXPECT_EQ(stateOf(*replicas), stateOf(*single)) << "rank " << r;
  EXPECT_EQ(replicas->getStepCount(), 2);
  step(*replicas, 2, r); // and trains on, alike on every rank
  EXPECT_EQ(replicas->getStepCount(), 3);
  expectSameOnEveryRank(stateOf(*replicas), "weights and statistics");

  // N replicas to one process: the replicas' checkpoint, written by rank 0 alone, on every rank.
  const std::string fromMany = checkpointPath("from_many");
  replicas->saveCheckpoint(fromMany);
  world()->barrier();
  auto resumed = makeSession({false});
  resumed->loadCheckpoint(fromMany);
  EXPECT_EQ(stateOf(*resumed), stateOf(*replicas)) << "rank " << r;
  EXPECT_EQ(resumed->getStepCount(), 3);
  world()->barrier();
  if (r == 0) {
    std::remove(fromOne.c_str());
    std::remove(fromMany.c_str());
  }
}

/// Products of 1e8 FLOPs or more are timed at compile time (SessionOptions::matmulTuning auto), and
/// a rank's timing on a shared host may choose other ways than rank 0's: every rank must run rank
/// 0's, so that the replicas run the same kernels. The kernels each rank explains must be the same.
TEST(ReplicaState, EveryRankRunsRank0sTimedMatMulWays) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  const int64_t rows = 256, inner = 512, cols = 512; // 1.3e8 FLOPs forward, twice that backward
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {rows, inner}), "x");
  TensorId w = b->addInitializedInputTensor(randomValues(inner * cols, 5, 0.05f), {inner, cols}, "w");
  TensorId y = ai.matmul({x, w});
  b->addOutputTensor(ai.reducemean({ai.mul({y, y})}, std::nullopt, 0));
  SessionOptions so;
  so.numThreads = 1;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = world()->size();
  so.communicator = world();
  auto session = TrainingSession::createFromOnnxModel(b->getModelProto(), DataFlow(1, std::vector<TensorId>{}), "",
                                                      ConstSGD(0.01f), so);
  session->prepareDevice();
  const std::string kernels = session->explainKernels();
  EXPECT_NE(kernels.find("timed"), std::string::npos) << kernels; // the products were timed
  for (uint64_t other : valuesOnAllRanks(std::hash<std::string>{}(kernels)))
    EXPECT_EQ(other, std::hash<std::string>{}(kernels)) << "rank " << world()->rank() << ":\n" << kernels;
}

/// An inference session takes the replication options too: each replica runs its own inputs,
/// knows its index, and a replica count other than the communicator's is an error.
TEST(ReplicaState, InferenceSessionsAreReplicasToo) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {2, 3}), "x");
  TensorId y = ai.relu({x});
  b->addOutputTensor(y);
  SessionOptions so;
  so.numThreads = 1;
  so.enableReplicatedGraphs = true;
  so.replicatedGraphCount = world()->size();
  so.communicator = world();
  auto session = InferenceSession::createFromOnnxModel(b->getModelProto(), DataFlow(1, {y}), so);
  EXPECT_EQ(session->getReplicationIndex(), world()->rank());
  so.replicatedGraphCount = world()->size() + 1;
  try {
    InferenceSession::createFromOnnxModel(b->getModelProto(), DataFlow(1, {y}), so);
    ADD_FAILURE() << "no error for a replica count the communicator does not have";
  } catch (const popart::error &e) {
    EXPECT_NE(std::string(e.what()).find("replicatedGraphCount is " + std::to_string(world()->size() + 1) +
                                         " but the communicator has " + std::to_string(world()->size())),
              std::string::npos)
        << e.what();
  }
}

} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
