// Recomputation (ir/passes/recompute.hpp, SessionOptions::autoRecomputation): the weights after
// several training steps in every mode equal those without recomputation bit for bit (an MLP
// with Dropout, a small transformer, a small CNN with BatchNorm, and the per-op annotation alone);
// the planned activation arena shrinks where recomputation frees activations; and the schedule
// runs a recomputing op just before its first reader.

#include "ir/annotations.hpp"
#include "ir/passes/passes.hpp"

#include <popart/error.hpp>
#include <popart/session.hpp>

#include <onnx/onnx_pb.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

using namespace popart;

namespace {

/// A model written node by node (opset 17), with deterministic random initializers.
class Proto {
public:
  Proto() {
    m_.set_ir_version(8);
    m_.add_opset_import()->set_version(17);
    g_ = m_.mutable_graph();
    g_->set_name("recompute");
  }
  void input(const std::string &name, const std::vector<int64_t> &shape) {
    auto *v = g_->add_input();
    v->set_name(name);
    auto *t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : shape)
      t->mutable_shape()->add_dim()->set_dim_value(d);
    inputs_[name] = shape;
  }
  /// A FLOAT initializer of uniform values in [offset - scale, offset + scale].
  std::string weight(const std::string &name, const std::vector<int64_t> &shape, float scale, float offset = 0) {
    auto *t = g_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    int64_t n = 1;
    for (int64_t d : shape) {
      t->add_dims(d);
      n *= d;
    }
    std::uniform_real_distribution<float> u(-scale, scale);
    for (int64_t i = 0; i < n; ++i)
      t->add_float_data(offset + u(rng_));
    return name;
  }
  std::string ints(const std::string &name, const std::vector<int64_t> &values) {
    auto *t = g_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values)
      t->add_int64_data(v);
    return name;
  }
  std::string scalar(const std::string &name, float value) {
    auto *t = g_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_float_data(value);
    return name;
  }
  std::string boolean(const std::string &name, bool value) {
    auto *t = g_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::BOOL);
    t->add_int32_data(value ? 1 : 0);
    return name;
  }
  /// Adds a node named after its first output; \returns that output.
  std::string node(const std::string &type, const std::vector<std::string> &ins, const std::string &out,
                   const std::map<std::string, int64_t> &intAttrs = {},
                   const std::map<std::string, std::vector<int64_t>> &listAttrs = {}) {
    auto *n = g_->add_node();
    n->set_op_type(type);
    n->set_name(out);
    for (const auto &i : ins)
      n->add_input(i);
    n->add_output(out);
    for (const auto &[k, v] : intAttrs) {
      auto *a = n->add_attribute();
      a->set_name(k);
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(v);
    }
    for (const auto &[k, v] : listAttrs) {
      auto *a = n->add_attribute();
      a->set_name(k);
      a->set_type(onnx::AttributeProto::INTS);
      for (int64_t x : v)
        a->add_ints(x);
    }
    return out;
  }
  /// The mean squared difference of \p y and a new input "target" of \p shape, as output "loss".
  void mseLoss(const std::string &y, const std::vector<int64_t> &shape) {
    input("target", shape);
    std::string d = node("Sub", {y, "target"}, "diff");
    node("ReduceMean", {node("Mul", {d, d}, "squared")}, "loss", {{"keepdims", 0}});
    auto *v = g_->add_output();
    v->set_name("loss");
    v->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    v->mutable_type()->mutable_tensor_type()->mutable_shape(); // a scalar
  }
  /// Annotates every node with the pipeline stage \p stageOf its name.
  void stages(const std::function<int64_t(const std::string &)> &stageOf) {
    for (auto &n : *g_->mutable_node()) {
      auto *a = n.add_attribute();
      a->set_name(ir::kPipelineStageAttribute);
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(stageOf(n.name()));
    }
  }
  std::string bytes() const { return m_.SerializeAsString(); }
  const std::map<std::string, std::vector<int64_t>> &inputs() const { return inputs_; }

private:
  onnx::ModelProto m_;
  onnx::GraphProto *g_ = nullptr;
  std::map<std::string, std::vector<int64_t>> inputs_;
  std::mt19937 rng_{7};
};

/// x [512, 64] -> 3 x (MatMul, Add bias, Relu, Dropout 0.25) at width 256 -> MatMul to 16 -> MSE.
/// With \p annotate, the second layer's ops are annotated Recompute and the last Dropout
/// Checkpoint. With \p stages, the first layer is pipeline stage 0 and the rest stage 1.
Proto mlp(bool annotate = false, bool stages = false) {
  Proto p;
  p.input("x", {512, 64});
  std::string h = "x";
  const std::string ratio = p.scalar("ratio", 0.25f), on = p.boolean("training", true);
  for (int l = 0; l < 3; ++l) {
    const std::string s = std::to_string(l);
    std::map<std::string, int64_t> attrs;
    if (annotate && l == 1) attrs[ir::kRecomputeAttribute] = 2;
    h = p.node("MatMul", {h, p.weight("w" + s, {l == 0 ? 64 : 256, 256}, 0.1f)}, "mm" + s, attrs);
    h = p.node("Add", {h, p.weight("b" + s, {256}, 0.1f)}, "biased" + s, attrs);
    h = p.node("Relu", {h}, "relu" + s, attrs);
    if (annotate && l == 2) attrs[ir::kRecomputeAttribute] = 1;
    h = p.node("Dropout", {h, ratio, on}, "dropout" + s, attrs);
  }
  h = p.node("MatMul", {h, p.weight("w3", {256, 16}, 0.05f)}, "y");
  p.mseLoss(h, {512, 16});
  if (stages) p.stages([](const std::string &node) { return node.back() == '0' ? 0 : 1; });
  return p;
}

/// Two post-LN encoder layers: 2-head self-attention with Dropout on the probabilities and on the
/// projection, Add & LayerNormalization, a GELU (erf form, which fuseGelu fuses) feed-forward,
/// Add & LayerNormalization. x [4, 16, 32] -> MSE against a target of that shape.
Proto transformer() {
  Proto p;
  const int64_t b = 4, s = 16, d = 32, heads = 2, dh = d / heads, ffn = 64;
  p.input("x", {b, s, d});
  const std::string ratio = p.scalar("ratio", 0.1f), on = p.boolean("training", true);
  const std::string split = p.ints("split_shape", {b, s, heads, dh}), merge = p.ints("merge_shape", {b, s, d});
  const std::string scale = p.scalar("scale", 1.0f / std::sqrt(static_cast<float>(dh)));
  const std::string sqrt2 = p.scalar("sqrt2", std::sqrt(2.0f)), one = p.scalar("one", 1.0f),
                    half = p.scalar("half", 0.5f);
  std::string x = "x";
  for (int l = 0; l < 2; ++l) {
    const std::string L = std::to_string(l) + "_";
    auto linear = [&](const std::string &in, const std::string &name, int64_t from, int64_t to) {
      std::string mm = p.node("MatMul", {in, p.weight(L + name + "_w", {from, to}, 0.2f)}, L + name + "_mm");
      return p.node("Add", {mm, p.weight(L + name + "_b", {to}, 0.05f)}, L + name);
    };
    auto heads4 = [&](const std::string &t, const std::vector<int64_t> &perm) {
      return p.node("Transpose", {p.node("Reshape", {t, split}, t + "_split")}, t + "_heads", {}, {{"perm", perm}});
    };
    const std::string q = heads4(linear(x, "q", d, d), {0, 2, 1, 3});
    const std::string k = heads4(linear(x, "k", d, d), {0, 2, 3, 1});
    const std::string v = heads4(linear(x, "v", d, d), {0, 2, 1, 3});
    std::string att = p.node("Mul", {p.node("MatMul", {q, k}, L + "scores"), scale}, L + "scaled");
    att = p.node("Softmax", {att}, L + "probs", {{"axis", -1}});
    att = p.node("Dropout", {att, ratio, on}, L + "probs_dropped");
    std::string y = p.node("MatMul", {att, v}, L + "context");
    y = p.node("Reshape", {p.node("Transpose", {y}, L + "context_t", {}, {{"perm", {0, 2, 1, 3}}}), merge},
               L + "context_merged");
    y = p.node("Dropout", {linear(y, "o", d, d), ratio, on}, L + "o_dropped");
    auto layerNorm = [&](const std::string &in, const std::string &name) {
      return p.node("LayerNormalization",
                    {in, p.weight(L + name + "_scale", {d}, 0.1f, 1.0f), p.weight(L + name + "_bias", {d}, 0.1f)},
                    L + name, {{"axis", -1}});
    };
    x = layerNorm(p.node("Add", {x, y}, L + "residual1"), "ln1");
    const std::string f = linear(x, "ff1", d, ffn);
    std::string gelu = p.node("Erf", {p.node("Div", {f, sqrt2}, L + "gelu_div")}, L + "gelu_erf");
    gelu = p.node("Mul", {f, p.node("Add", {gelu, one}, L + "gelu_add")}, L + "gelu_mul");
    gelu = p.node("Mul", {gelu, half}, L + "gelu");
    x = layerNorm(p.node("Add", {x, linear(gelu, "ff2", ffn, d)}, L + "residual2"), "ln2");
  }
  p.mseLoss(x, {b, s, d});
  return p;
}

/// x [16, 3, 16, 16] -> 3 x (Conv 3x3 pad 1, BatchNormalization, Relu) at 8, 16, 16 channels, the
/// last BatchNormalization's output pooled (MaxPool 2x2, whose gradient reads it) before its Relu
/// -> Flatten -> MatMul to 10 -> MSE.
Proto cnn() {
  Proto p;
  p.input("x", {16, 3, 16, 16});
  std::string h = "x";
  int64_t channels = 3;
  for (int l = 0; l < 3; ++l) {
    const std::string s = std::to_string(l);
    const int64_t out = l == 0 ? 8 : 16;
    h = p.node("Conv",
               {h, p.weight("conv" + s + "_w", {out, channels, 3, 3}, 0.3f), p.weight("conv" + s + "_b", {out}, 0.1f)},
               "conv" + s, {}, {{"pads", {1, 1, 1, 1}}, {"kernel_shape", {3, 3}}});
    h = p.node("BatchNormalization",
               {h, p.weight("bn" + s + "_scale", {out}, 0.1f, 1.0f), p.weight("bn" + s + "_bias", {out}, 0.1f),
                p.weight("bn" + s + "_mean", {out}, 0.0f), p.weight("bn" + s + "_var", {out}, 0.0f, 1.0f)},
               "bn" + s);
    if (l == 2) h = p.node("MaxPool", {h}, "pool", {}, {{"kernel_shape", {2, 2}}, {"strides", {2, 2}}});
    h = p.node("Relu", {h}, "relu" + s);
    channels = out;
  }
  h = p.node("Flatten", {h}, "flat", {{"axis", 1}});
  h = p.node("MatMul", {h, p.weight("fc_w", {16 * 8 * 8, 10}, 0.05f)}, "y");
  p.mseLoss(h, {16, 10});
  return p;
}

struct Trained {
  std::map<TensorId, std::vector<float>> weights;
  int64_t arena = 0;
  std::string ir;
  float loss = 0;
};

/// Trains \p model for 3 steps (SGD with momentum) on fixed data with \p type, fixed seed.
Trained train(const Proto &model, RecomputationType type) {
  SessionOptions so;
  so.autoRecomputation = type;
  so.verifyIr = true;
  SGD sgd({{"defaultLearningRate", {0.05f, false}}, {"defaultMomentum", {0.9f, false}}});
  auto s = TrainingSession::createFromOnnxModel(model.bytes(), DataFlow(1, {"loss"}), "loss", sgd, so);
  s->prepareDevice();
  s->weightsFromHost();
  s->setRandomSeed(1234);
  std::map<std::string, std::vector<float>> data;
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (const auto &[name, shape] : model.inputs()) {
    int64_t count = 1;
    for (int64_t d : shape)
      count *= d;
    std::vector<float> v(static_cast<size_t>(count));
    for (float &e : v)
      e = n(rng);
    data[name] = std::move(v);
  }
  Trained t;
  for (int step = 0; step < 3; ++step) {
    std::vector<NDArrayWrapper<float>> arrays;
    arrays.reserve(data.size() + 1);
    std::map<TensorId, IArray &> inputs;
    for (auto &[name, v] : data) {
      arrays.emplace_back(v.data(), model.inputs().at(name));
      inputs.emplace(name, arrays.back());
    }
    arrays.emplace_back(&t.loss, Shape{});
    std::map<TensorId, IArray &> outputs{{"loss", arrays.back()}};
    StepIO io(inputs, outputs);
    s->run(io);
  }
  for (const auto &id : s->getWeightIds()) {
    const TensorInfo info = s->getInfo(id);
    std::vector<float> w(static_cast<size_t>(info.elementCount()));
    NDArrayWrapper<float> arr(w.data(), info.shape());
    WeightsIO io;
    io.insert(id, arr);
    s->readWeights(io);
    t.weights[id] = std::move(w);
  }
  t.arena = s->plannedArenaBytes();
  t.ir = s->dumpIr();
  return t;
}

/// The number of ops of the IR dump \p ir whose node names end in "_recomputed" and start with
/// \p prefix (every clone when empty).
int clonesOf(const std::string &ir, const std::string &prefix = "") {
  int n = 0;
  for (size_t at = ir.find("_recomputed'"); at != std::string::npos; at = ir.find("_recomputed'", at + 1)) {
    const size_t open = ir.rfind('\'', at - 1);
    if (open != std::string::npos && ir.compare(open + 1, prefix.size(), prefix) == 0) ++n;
  }
  return n;
}

/// Every weight of \p got equals \p want's bit for bit.
void expectSameBits(const Trained &want, const Trained &got, const std::string &what) {
  ASSERT_EQ(want.weights.size(), got.weights.size()) << what;
  for (const auto &[id, w] : want.weights) {
    const std::vector<float> &g = got.weights.at(id);
    ASSERT_EQ(w.size(), g.size()) << what << " " << id;
    size_t differ = 0;
    for (size_t i = 0; i < w.size(); ++i)
      differ += std::memcmp(&w[i], &g[i], sizeof(float)) != 0 ? 1 : 0;
    EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << w.size() << " elements of '" << id << "' differ";
  }
  EXPECT_EQ(std::memcmp(&want.loss, &got.loss, sizeof(float)), 0)
      << what << ": loss " << want.loss << " vs " << got.loss;
}

} // namespace

TEST(Recompute, TheScheduleRunsARecomputingOpJustBeforeItsFirstReader) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4}));
  g.addInput("x");
  g.addOp("Relu", "", 13, "a", {}, {"x"}, {"a"});
  g.addOp("Neg", "", 13, "again", {}, {"a"}, {"again"}); // the "clone", reading a forward tensor
  g.addOp("Exp", "", 13, "b", {}, {"a"}, {"b"});
  g.addOp("Exp", "", 13, "c", {}, {"b"}, {"c"});
  g.addOp("Add", "", 13, "d", {}, {"c", "again"}, {"d"});
  g.addOutput("d");
  ir::inferShapes(g, nullptr);
  auto names = [&] {
    std::vector<std::string> order;
    for (const ir::Op *op : g.schedule())
      order.push_back(op->name);
    return order;
  };
  // Ready right after a, it runs there when it is an ordinary op...
  EXPECT_EQ(names(), (std::vector<std::string>{"a", "again", "b", "c", "d"}));
  // ... and just before its reader when it recomputes.
  g.tensor("again").setRecomputed(true);
  EXPECT_EQ(names(), (std::vector<std::string>{"a", "b", "c", "again", "d"}));
}

TEST(Recompute, AnMlpWithDropoutTrainsBitForBitAsWithoutRecomputation) {
  const Proto model = mlp(), staged = mlp(false, true);
  const Trained none = train(model, RecomputationType::None);
  EXPECT_EQ(clonesOf(none.ir), 0);
  for (auto [type, name] : {std::pair{RecomputationType::Standard, "Standard"},
                            std::pair{RecomputationType::RecomputeAll, "RecomputeAll"}}) {
    const Trained r = train(model, type);
    expectSameBits(none, r, name);
    EXPECT_GT(clonesOf(r.ir, "dropout"), 0) << name << ": the Dropouts are recomputed\n" << r.ir;
    if (type == RecomputationType::Standard) {
      EXPECT_LT(r.arena, none.arena) << name;
    }
  }
  // Pipeline: the stage-0 layer's output crosses to stage 1 and is kept; the rest is recomputed.
  const Trained stagedNone = train(staged, RecomputationType::None);
  const Trained pipeline = train(staged, RecomputationType::Pipeline);
  expectSameBits(stagedNone, pipeline, "Pipeline");
  EXPECT_EQ(clonesOf(pipeline.ir, "dropout0"), 0) << pipeline.ir;
  EXPECT_GT(clonesOf(pipeline.ir, "dropout1"), 0) << pipeline.ir;
}

TEST(Recompute, ASmallTransformerTrainsBitForBitAsWithoutRecomputation) {
  const Proto model = transformer();
  const Trained none = train(model, RecomputationType::None);
  for (auto [type, name] :
       {std::pair{RecomputationType::Standard, "Standard"}, std::pair{RecomputationType::NormOnly, "NormOnly"},
        std::pair{RecomputationType::RecomputeAll, "RecomputeAll"}}) {
    const Trained r = train(model, type);
    expectSameBits(none, r, name);
    EXPECT_GT(clonesOf(r.ir), 0) << name << "\n" << r.ir;
    if (type == RecomputationType::NormOnly) {
      // The LayerNormalizations alone, but the last, which the backward pass reads first (kept so
      // that the backward pass depends on the forward pass).
      EXPECT_EQ(clonesOf(r.ir), 3) << r.ir;
      EXPECT_EQ(clonesOf(r.ir, "1_ln2"), 0) << r.ir;
      EXPECT_EQ(clonesOf(r.ir, "0_ln1"), 1) << r.ir;
    } else if (type == RecomputationType::Standard) {
      EXPECT_GT(clonesOf(r.ir, "0_probs"), 0) << "the first layer's attention probabilities\n" << r.ir;
      EXPECT_LT(r.arena, none.arena);
    }
  }
}

TEST(Recompute, ASmallCnnWithBatchNormTrainsBitForBitAsWithoutRecomputation) {
  const Proto model = cnn();
  const Trained none = train(model, RecomputationType::None);
  for (auto [type, name] :
       {std::pair{RecomputationType::Standard, "Standard"}, std::pair{RecomputationType::NormOnly, "NormOnly"},
        std::pair{RecomputationType::RecomputeAll, "RecomputeAll"}}) {
    const Trained r = train(model, type);
    expectSameBits(none, r, name);
    EXPECT_GT(clonesOf(r.ir, "bn2"), 0) << name << ": the pool's input\n" << r.ir;
    if (type == RecomputationType::Standard) {
      EXPECT_LT(r.arena, none.arena);
    }
  }
}

TEST(Recompute, TheAnnotationAloneRecomputesTheAnnotatedOpsAndKeepsCheckpoints) {
  const Trained none = train(mlp(), RecomputationType::None);
  const Proto annotated = mlp(true);
  const Trained r = train(annotated, RecomputationType::None);
  expectSameBits(none, r, "annotated Relus");
  // The second layer's ops are annotated Recompute: they get clones (the MatMul's takes the bias
  // and the Relu in, as the forward's does), and nothing else does.
  EXPECT_EQ(clonesOf(r.ir, "dropout1"), 1) << r.ir;
  EXPECT_EQ(clonesOf(r.ir, "mm1"), 1) << r.ir;
  for (const char *other : {"mm0", "dropout0", "mm2", "dropout2", "y"})
    EXPECT_EQ(clonesOf(r.ir, other), 0) << other << "\n" << r.ir;
  EXPECT_LT(r.arena, none.arena);
  // RecomputeAll recomputes all but dropout2, annotated Checkpoint.
  const Trained all = train(annotated, RecomputationType::RecomputeAll);
  expectSameBits(none, all, "RecomputeAll with a checkpoint");
  EXPECT_EQ(clonesOf(all.ir, "dropout2"), 0) << all.ir;
  EXPECT_GT(clonesOf(all.ir, "dropout1"), 0) << all.ir;
}
