// Training through control flow: a weight used only inside a Loop body is trained, exactly as the
// same model written out iteration by iteration; a Loop whose trip count is known only at run time
// is an error naming it.

#include <popart/error.hpp>
#include <popart/session.hpp>

#include <onnx/onnx_pb.h>

#include <gtest/gtest.h>

#include <cmath>
#include <map>

using namespace popart;

namespace {

constexpr int64_t kBatch = 4, kWidth = 3, kOut = 2, kTrips = 3;

std::vector<float> values(int64_t n, float scale, float phase) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = scale * static_cast<float>(std::sin(0.9 * double(i) + phase));
  return v;
}

void setType(onnx::ValueInfoProto *v, const std::string &name, int type, const std::vector<int64_t> &shape) {
  v->set_name(name);
  auto *t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(type);
  auto *s = t->mutable_shape();
  for (int64_t d : shape)
    s->add_dim()->set_dim_value(d);
}

onnx::NodeProto *node(onnx::GraphProto *g, const std::string &type, const std::vector<std::string> &ins,
                      const std::vector<std::string> &outs) {
  auto *n = g->add_node();
  n->set_op_type(type);
  n->set_name(outs[0] + "_node");
  for (const auto &i : ins)
    n->add_input(i);
  for (const auto &o : outs)
    n->add_output(o);
  return n;
}

void floatInit(onnx::GraphProto *g, const std::string &name, const std::vector<int64_t> &shape,
               const std::vector<float> &v) {
  auto *t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : shape)
    t->add_dims(d);
  for (float x : v)
    t->add_float_data(x);
}

/// h = x; kTrips times h = tanh(h · W); loss = mean((h · V)²). With \p loop the repetition is a Loop
/// (trip count an initializer, or a graph input when \p runTimeTrips) whose body reads W from the
/// outer graph; otherwise the model repeats the two ops. Without \p weightInBody the Loop's body is
/// h = tanh(h) and h · W follows the Loop.
std::string model(bool loop, bool runTimeTrips = false, bool weightInBody = true) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto *g = m.mutable_graph();
  g->set_name("controlflow");
  setType(g->add_input(), "x", onnx::TensorProto::FLOAT, {kBatch, kWidth});
  floatInit(g, "W", {kWidth, kWidth}, values(kWidth * kWidth, 0.8f, 0.3f));
  floatInit(g, "V", {kWidth, kOut}, values(kWidth * kOut, 0.6f, 1.1f));
  std::string h = "x";
  if (loop) {
    if (runTimeTrips) {
      setType(g->add_input(), "M", onnx::TensorProto::INT64, {});
    } else {
      auto *t = g->add_initializer();
      t->set_name("M");
      t->set_data_type(onnx::TensorProto::INT64);
      t->add_int64_data(kTrips);
    }
    auto *c = g->add_initializer();
    c->set_name("cond");
    c->set_data_type(onnx::TensorProto::BOOL);
    c->add_int32_data(1);
    auto *n = node(g, "Loop", {"M", "cond", "x"}, {"h_loop"});
    auto *a = n->add_attribute();
    a->set_name("body");
    a->set_type(onnx::AttributeProto::GRAPH);
    auto *b = a->mutable_g();
    b->set_name("body");
    setType(b->add_input(), "i", onnx::TensorProto::INT64, {});
    setType(b->add_input(), "c_in", onnx::TensorProto::BOOL, {});
    setType(b->add_input(), "h_in", onnx::TensorProto::FLOAT, {kBatch, kWidth});
    if (weightInBody) {
      node(b, "MatMul", {"h_in", "W"}, {"hw"});
      node(b, "Tanh", {"hw"}, {"h_out"});
    } else {
      node(b, "Tanh", {"h_in"}, {"h_out"});
    }
    node(b, "Identity", {"c_in"}, {"c_out"});
    setType(b->add_output(), "c_out", onnx::TensorProto::BOOL, {});
    setType(b->add_output(), "h_out", onnx::TensorProto::FLOAT, {kBatch, kWidth});
    h = "h_loop";
    if (!weightInBody) {
      node(g, "MatMul", {h, "W"}, {"hw_after"});
      h = "hw_after";
    }
  } else {
    for (int k = 0; k < kTrips; ++k) {
      std::string hw = "hw" + std::to_string(k), next = "h" + std::to_string(k);
      node(g, "MatMul", {h, "W"}, {hw});
      node(g, "Tanh", {hw}, {next});
      h = next;
    }
  }
  node(g, "MatMul", {h, "V"}, {"y"});
  node(g, "Mul", {"y", "y"}, {"sq"});
  auto *mean = node(g, "ReduceMean", {"sq"}, {"loss"});
  auto *keep = mean->add_attribute();
  keep->set_name("keepdims");
  keep->set_type(onnx::AttributeProto::INT);
  keep->set_i(0);
  setType(g->add_output(), "loss", onnx::TensorProto::FLOAT, {});
  return m.SerializeAsString();
}

struct Result {
  std::map<TensorId, std::vector<float>> weights;
  std::vector<WeightStatus> statuses;
};

Result train(const std::string &bytes, int steps, const SessionOptions &options = {}, int64_t trips = -1) {
  SGD sgd({{"defaultLearningRate", {0.3f, false}}, {"defaultMomentum", {0.9f, false}}});
  auto s = TrainingSession::createFromOnnxModel(bytes, DataFlow(1, std::vector<TensorId>{}), "loss", sgd, options);
  s->prepareDevice();
  s->weightsFromHost();
  std::vector<float> x = values(kBatch * kWidth, 1.0f, 0.7f);
  NDArrayWrapper<float> xa(x.data(), {kBatch, kWidth});
  NDArrayWrapper<int64_t> ma(&trips, {});
  for (int i = 0; i < steps; ++i) {
    StepIO io(trips >= 0 ? std::map<TensorId, IArray &>{{"x", xa}, {"M", ma}} : std::map<TensorId, IArray &>{{"x", xa}},
              {});
    s->run(io);
  }
  Result r;
  for (const auto &[id, n] : std::map<TensorId, int64_t>{{"W", kWidth * kWidth}, {"V", kWidth * kOut}}) {
    std::vector<float> w(static_cast<size_t>(n));
    NDArrayWrapper<float> arr(w.data(), {n});
    WeightsIO io;
    io.insert(id, arr);
    s->readWeights(io);
    r.weights[id] = w;
  }
  r.statuses = s->getWeightStatuses();
  return r;
}

} // namespace

TEST(TrainingControlFlow, AWeightUsedOnlyInsideALoopIsTrainedAsInTheUnrolledModel) {
  Result looped = train(model(true), 4);
  Result unrolled = train(model(false), 4);
  ASSERT_EQ(looped.statuses.size(), 2u);
  for (const auto &st : looped.statuses)
    EXPECT_EQ(st.role, WeightStatus::Role::Trained) << st.id << ": " << st.reason;
  EXPECT_NE(looped.weights["W"], values(kWidth * kWidth, 0.8f, 0.3f)) << "W did not move";
  EXPECT_NE(looped.weights["V"], values(kWidth * kOut, 0.6f, 1.1f)) << "V did not move";
  EXPECT_EQ(looped.weights["W"], unrolled.weights["W"]);
  EXPECT_EQ(looped.weights["V"], unrolled.weights["V"]);
}

TEST(TrainingControlFlow, ALoopWithARunTimeTripCountIsAnErrorNamingIt) {
  try {
    train(model(true, true), 1);
    FAIL() << "expected an error";
  } catch (const error &e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("Loop 'h_loop_node'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("trip count M ('M') is known only at run time"), std::string::npos) << msg;
  }
}

TEST(TrainingControlFlow, ALoopPastTheUnrollLimitIsAnErrorNamingTheLimit) {
  SessionOptions so;
  so.maxUnrolledOps = 4; // each iteration counts 3 (MatMul, Tanh, one for its condition)
  try {
    train(model(true), 1, so);
    FAIL() << "expected an error";
  } catch (const error &e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("Loop 'h_loop_node'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("over the limit of 4 (UnrollOptions::maxOps, SessionOptions::maxUnrolledOps)"),
              std::string::npos)
        << msg;
  }
  so.maxUnrolledOps = 9; // all three iterations
  EXPECT_NO_THROW(train(model(true), 1, so));
}

TEST(TrainingControlFlow, ALoopOverTheInputAloneNeedsNoGradientEvenWithARunTimeTripCount) {
  // No weight lies before the Loop, so autodiff never reaches it: it runs forward only.
  Result r = train(model(true, true, false), 2, {}, kTrips);
  for (const auto &st : r.statuses)
    EXPECT_EQ(st.role, WeightStatus::Role::Trained) << st.id << ": " << st.reason;
  EXPECT_NE(r.weights["W"], values(kWidth * kWidth, 0.8f, 0.3f)) << "W did not move";
}
