// ai.graphcore MultiConv: import in PopART's node layout, shape inference and its errors, results
// identical to the same convolutions as separate Conv nodes (forward, and weights after SGD
// steps), the concurrent plan, and the gradients against central finite differences.

#include "gradcheck.hpp"
#include "thrown.hpp"

#include "../../bench/multiconv/multiconv_model.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/ops/multiconv.hpp"
#include "session/threads.hpp"
#include <popart/builder.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

using namespace popart;
using Ints = std::vector<int64_t>;
using multiconv_model::ConvSpec;

namespace {

constexpr int64_t kBatch = 4, kSize = 9, kWidth = 2; // x [4, 96, 9, 9]
const Shape kX{kBatch, 192 * kWidth / 4, kSize, kSize};

std::vector<float> input(uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(kX[0] * kX[1] * kX[2] * kX[3]));
  uint32_t s = seed;
  for (float &v : x) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<float>(s >> 8) / 8388608.0f - 1.0f;
  }
  return x;
}

SessionOptions threads(int n) {
  SessionOptions o;
  o.numThreads = n;
  return o;
}

/// y of the Inception-style block (MultiConv or separate Convs) on input(7).
std::vector<float> infer(bool multi, int numThreads, std::string *kernels = nullptr) {
  auto s = InferenceSession::createFromOnnxModel(multiconv_model::inceptionBlock(kBatch, kSize, kWidth, multi),
                                                 DataFlow(1, {"y"}), threads(numThreads));
  s->prepareDevice();
  std::vector<float> x = input(7), y(static_cast<size_t>(kBatch * 256 * kWidth / 4 * kSize * kSize));
  NDArrayWrapper<float> xa(x.data(), kX), ya(y.data(), {kBatch, 256 * kWidth / 4, kSize, kSize});
  StepIO io({{"x", xa}}, {{"y", ya}});
  s->run(io);
  if (kernels) *kernels = s->explainKernels();
  return y;
}

bool bitwiseEqual(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Every weight of the block after \p steps SGD steps on inputs input(1), input(2), ...
std::map<TensorId, std::vector<float>> train(bool multi, int numThreads, int steps) {
  auto s = TrainingSession::createFromOnnxModel(multiconv_model::inceptionBlock(kBatch, kSize, kWidth, multi),
                                                DataFlow(1, {"loss"}), "loss", ConstSGD(0.5f), threads(numThreads));
  s->prepareDevice();
  for (int k = 0; k < steps; ++k) {
    std::vector<float> x = input(static_cast<uint32_t>(k + 1)), loss(1);
    NDArrayWrapper<float> xa(x.data(), kX), la(loss.data(), {});
    StepIO io({{"x", xa}}, {{"loss", la}});
    s->run(io);
  }
  std::map<TensorId, std::vector<float>> weights;
  std::vector<std::unique_ptr<NDArrayWrapper<float>>> arrays;
  WeightsIO io;
  for (const TensorId &id : s->getWeightIds()) {
    TensorInfo info = s->getInfo(id);
    weights[id].resize(static_cast<size_t>(info.elementCount()));
    arrays.push_back(std::make_unique<NDArrayWrapper<float>>(weights[id].data(), info.shape()));
    io.insert(id, *arrays.back());
  }
  s->readWeights(io);
  return weights;
}

} // namespace

TEST(MultiConv, ForwardIsBitwiseTheSeparateConvolutions) {
  for (int n : {1, 2}) {
    SCOPED_TRACE(std::to_string(n) + " threads");
    std::string kernels;
    std::vector<float> multi = infer(true, n, &kernels), separate = infer(false, n);
    EXPECT_TRUE(bitwiseEqual(multi, separate));
    double sum = 0;
    for (float v : multi)
      sum += std::abs(v);
    EXPECT_GT(sum, 0.0); // the block computed something
    // Each Relu after a convolution is its post-op, in the MultiConv as in a separate Conv (fuseRelu).
    EXPECT_EQ(kernels.find("Relu '"), std::string::npos) << kernels;
    if (n == 2) {
      EXPECT_NE(kernels.find("concurrent on 2 threads"), std::string::npos) << kernels;
    }
  }
}

// Concurrent parts are oneDNN primitives made for one thread each. oneDNN's weight gradient made
// for 2 threads splits the batch between them and adds the two halves, so separate ConvWeightGrads
// at 2 threads round differently; at one thread they run the primitives MultiConv's parts run.
TEST(MultiConv, TrainingIsBitwiseTheSeparateConvolutions) {
  auto multi1 = train(true, 1, 3), separate1 = train(false, 1, 3);
  auto multi2 = train(true, 2, 3), separate2 = train(false, 2, 3), initial = train(false, 1, 0);
  ASSERT_EQ(multi1.size(), 12u); // the 6 convolutions' weights and biases
  for (const auto &[id, w] : multi1) {
    SCOPED_TRACE(id);
    ASSERT_TRUE(separate1.count(id) && multi2.count(id) && separate2.count(id));
    EXPECT_TRUE(bitwiseEqual(w, separate1.at(id)));
    EXPECT_TRUE(bitwiseEqual(multi2.at(id), separate1.at(id)));
    double moved = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_NEAR(multi2.at(id)[i], separate2.at(id)[i], 1e-5 * (1 + std::abs(separate2.at(id)[i])));
      moved = std::max(moved, static_cast<double>(std::abs(w[i] - initial.at(id)[i])));
    }
    EXPECT_GT(moved, 1e-4); // SGD trained it
  }
}

namespace {

/// MultiConv of three convolutions of different geometry, in double: conv 0 with strides 2 and
/// asymmetric pads, no bias (its "" in the middle of the inputs); conv 1 grouped (2) with dilation
/// 2 and a bias; conv 2 1-D with a bias.
gradcheck::Problem gradProblem() {
  auto stream = [](const char *id, const Shape &s) {
    return gradcheck::Feed{id, TensorData(TensorInfo(DataType::DOUBLE, s)), true};
  };
  ir::Attributes a = gradcheck::attrs({{"strides", Ints{2, 1, 1, 1, 2}},
                                       {"pads", Ints{1, 0, 0, 1, 1, 1, 1, 1, 1, 0}},
                                       {"dilations", Ints{1, 1, 2, 2, 1}}});
  gradcheck::Problem p{"MultiConv",
                       17,
                       a,
                       {stream("xa", {2, 3, 5, 4}), stream("wa", {4, 3, 3, 2}),
                        gradcheck::Feed{"", TensorData(), false}, stream("xb", {1, 4, 6, 5}),
                        stream("wb", {2, 2, 2, 2}), stream("bb", {2}), stream("xc", {2, 3, 7}), stream("wc", {3, 3, 3}),
                        stream("bc", {3})}};
  p.domain = "ai.graphcore";
  p.outs = {"y0", "y1", "y2"};
  p.loss = gradcheck::weightedSumLoss(3);
  return p;
}

} // namespace

TEST(MultiConv, GradientsMatchFiniteDifferences) {
  for (unsigned seed : {1u, 2u}) {
    gradcheck::Problem p = gradProblem();
    gradcheck::fillStreams(p.feeds, seed);
    gradcheck::checkGradient(p, seed);
  }
}

TEST(MultiConv, GradientOpGroupsEveryConvolution) {
  std::vector<TensorId> grads;
  auto g = gradcheck::buildGraph(gradProblem(), &grads);
  int multiGrads = 0, convGrads = 0;
  for (const auto &op : g->ops()) {
    multiGrads += op->type == "MultiConvGrad";
    convGrads += op->type == "ConvDataGrad" || op->type == "ConvWeightGrad";
  }
  EXPECT_EQ(multiGrads, 1);
  EXPECT_EQ(convGrads, 0);
}

namespace {

/// Shape inference of a MultiConv on x0 [1, 4, 8, 8], w0 [6, 4, 3, 3], x1 [1, 2, 5, 5] and \p w1,
/// with \p attrs; "" if it succeeds, else the error.
std::string setupError(const Shape &w1, const ir::Attributes &attrs, size_t outputs = 2) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.graphcore"] = 1;
  for (const auto &[id, shape] : std::vector<std::pair<TensorId, Shape>>{
           {"x0", {1, 4, 8, 8}}, {"w0", {6, 4, 3, 3}}, {"x1", {1, 2, 5, 5}}, {"w1", w1}})
    g.addTensor(id, ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, shape));
  std::vector<TensorId> outs{"y0", "y1", "y2"};
  outs.resize(outputs);
  ir::Op &op = g.addOp("MultiConv", "ai.graphcore", 1, "mc", attrs, {"x0", "w0", "", "x1", "w1"}, outs);
  return thrown([&] {
    op.def->setup(op);
    EXPECT_EQ(op.outInfo(0).shape(), (Shape{1, 6, 6, 6}));
    EXPECT_EQ(op.outInfo(1).shape(), (Shape{1, 3, 4, 4}));
  });
}

} // namespace

TEST(MultiConv, ShapeInferenceAndErrorsNameTheConvolution) {
  using gradcheck::attrs;
  EXPECT_EQ(setupError({3, 2, 2, 2}, {}), "");
  EXPECT_EQ(setupError({3, 2, 2, 2}, attrs({{"numConvs", int64_t{2}}, {"planType", std::string("parallel")}})), "");
  std::string e = setupError({3, 3, 2, 2}, {});
  EXPECT_NE(e.find("MultiConv 'mc': convolution 1"), std::string::npos) << e;
  e = setupError({3, 2, 7, 7}, {});
  EXPECT_NE(e.find("convolution 1"), std::string::npos) << e;
  EXPECT_NE(e.find("larger than the padded input"), std::string::npos) << e;
  e = setupError({3, 2, 2, 2}, attrs({{"strides", Ints{1, 1, 1}}}));
  EXPECT_NE(e.find("'strides' has 3 values, expected 4"), std::string::npos) << e;
  e = setupError({3, 2, 2, 2}, attrs({{"pads", Ints{0, 0, 0, 0, 0, 0, 0, -1}}}));
  EXPECT_NE(e.find("convolution 1"), std::string::npos) << e;
  EXPECT_NE(e.find("negative"), std::string::npos) << e;
  e = setupError({3, 2, 2, 2}, attrs({{"inDilations", Ints{1, 1, 2, 2}}}));
  EXPECT_NE(e.find("'inDilations' value 2 is not supported"), std::string::npos) << e;
  e = setupError({3, 2, 2, 2}, attrs({{"numConvs", int64_t{3}}}));
  EXPECT_NE(e.find("numConvs is 3 but the op has 2 outputs"), std::string::npos) << e;
  e = setupError({3, 2, 2, 2}, {}, 3);
  EXPECT_NE(e.find("3 outputs need 9 inputs"), std::string::npos) << e;
}

TEST(MultiConv, ImportRefusesABadNodeNamingIt) {
  multiconv_model::OnnxGraph g;
  g.input("x", {1, 4, 6, 6});
  // Conv 1 reads 4 channels with weights of 3.
  multiconv_model::addConvs(g, {ConvSpec{"x", "y0", 4, 2, 3, 1, 1}, ConvSpec{"x", "y1", 3, 2, 1}}, true, 5);
  g.output("y0", {1, 2, 6, 6});
  std::string e =
      thrown([&] { InferenceSession::createFromOnnxModel(g.serialize(), DataFlow(1, {"y0"}))->prepareDevice(); });
  EXPECT_NE(e.find("MultiConv 'y0_MultiConv': convolution 1"), std::string::npos) << e;
}

namespace {

/// The gradients of the streams of an f32 MultiConv (conv 0 large, 3x3, with constant weights, so
/// that only its data gradient is computed; conv 1 small), by a plan of \p threads threads, and the
/// plan's kernel choices.
std::vector<std::vector<float>> f32Gradients(int threads, std::string &kernels) {
  std::mt19937 rng(5);
  auto f32 = [&](const Shape &s) {
    TensorData d = gradcheck::randomDoubles(rng, s);
    std::vector<float> v(d.info().elementCount());
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(static_cast<const double *>(d.data())[i]);
    return TensorData(TensorInfo(DataType::FLOAT, s), v.data());
  };
  gradcheck::Problem p{"MultiConv",
                       17,
                       gradcheck::attrs({{"pads", Ints{1, 1, 1, 1, 0, 0, 0, 0}}}),
                       {{"xa", f32({4, 16, 14, 14}), true},
                        {"wa", f32({16, 16, 3, 3}), false},
                        {"ba", f32({16}), false},
                        {"xb", f32({4, 4, 6, 6}), true},
                        {"wb", f32({4, 4, 1, 1}), true},
                        {"bb", f32({4}), true}}};
  p.domain = "ai.graphcore";
  p.outs = {"y0", "y1"};
  p.loss = gradcheck::weightedSumLoss(2);
  std::vector<TensorId> grads;
  auto g = gradcheck::buildGraph(p, &grads);
  setThreadCount(threads);
  backend_cpu::KernelContext context;
  context.threads = threads;
  backend_cpu::ExecutionPlan plan(*g, {}, context);
  for (const auto &f : p.feeds)
    if (f.stream) std::memcpy(plan.address(f.id), f.data.data(), static_cast<size_t>(f.data.byteCount()));
  plan.run();
  setThreadCount(0);
  kernels.clear();
  for (const auto &k : plan.stepKernels())
    kernels += k + "\n";
  std::vector<std::vector<float>> out;
  for (const auto &id : grads) {
    const auto *v = static_cast<const float *>(plan.address(id));
    out.emplace_back(v, v + plan.info(id).elementCount());
  }
  return out;
}

} // namespace

// A data gradient of most of the FLOPs is split by images between the threads; the concurrent
// parts are the one-thread kernels, so the gradients are those of the one-thread plan, bit for bit.
TEST(MultiConv, ConcurrentGradientsAreTheOneThreadGradients) {
  std::string kernels1, kernels2;
  auto one = f32Gradients(1, kernels1), two = f32Gradients(2, kernels2);
  EXPECT_NE(kernels2.find("concurrent on 2 threads"), std::string::npos) << kernels2;
  EXPECT_NE(kernels2.find("ConvDataGrad 0 [0, 2)"), std::string::npos) << kernels2;
  EXPECT_EQ(kernels2.find("ConvWeightGrad 0"), std::string::npos) << kernels2; // wa is constant
  ASSERT_EQ(one.size(), 4u);                                                   // xa, xb, wb, bb
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_TRUE(bitwiseEqual(one[i], two[i])) << "gradient " << i;
    EXPECT_GT(*std::max_element(one[i].begin(), one[i].end()), 0.0f);
  }
}

/// Builder::aiGraphcoreOpset1().multiconv writes PopART's node layout: two convolutions (the second
/// without bias, strided and padded) give the outputs of the same two ai.onnx Convs, bit for bit.
TEST(MultiConv, TheBuilderWritesANodeThatRunsAsTheSeparateConvolutions) {
  auto run = [](bool multi) {
    auto b = Builder::create();
    auto ai = b->aiOnnxOpset13();
    TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, Shape{2, 3, 7, 7}), "x");
    std::vector<float> w0(4 * 3 * 3 * 3), w1(5 * 3 * 1 * 1), b0(4);
    for (size_t i = 0; i < w0.size(); ++i)
      w0[i] = 0.05f * static_cast<float>(i % 11) - 0.2f;
    for (size_t i = 0; i < w1.size(); ++i)
      w1[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
    for (size_t i = 0; i < b0.size(); ++i)
      b0[i] = 0.25f * static_cast<float>(i);
    TensorId tw0 = b->addInitializedInputTensor(w0, {4, 3, 3, 3}, "w0");
    TensorId tw1 = b->addInitializedInputTensor(w1, {5, 3, 1, 1}, "w1");
    TensorId tb0 = b->addInitializedInputTensor(b0, {4}, "b0");
    std::vector<TensorId> ys;
    if (multi) {
      ys = b->aiGraphcoreOpset1().multiconv({{x, tw0, tb0}, {x, tw1}}, {}, {}, {{1, 1, 1, 1}, {1, 0, 1, 0}}, {},
                                            {{1, 1}, {2, 2}}, {}, {}, std::nullopt, std::nullopt, std::nullopt, {},
                                            "mc");
    } else {
      ys.push_back(ai.conv({x, tw0, tb0}, {}, 1, {}, {1, 1, 1, 1}, {1, 1}));
      ys.push_back(ai.conv({x, tw1}, {}, 1, {}, {1, 0, 1, 0}, {2, 2}));
    }
    for (const TensorId &y : ys)
      b->addOutputTensor(y);
    auto s = InferenceSession::createFromOnnxModel(b->getModelProto(), DataFlow(1, ys), threads(2));
    s->prepareDevice();
    std::vector<float> xv = input(3);
    xv.resize(2 * 3 * 7 * 7);
    std::vector<float> y0(2 * 4 * 7 * 7), y1(2 * 5 * 5 * 4);
    NDArrayWrapper<float> xa(xv.data(), {2, 3, 7, 7}), y0a(y0.data(), {2, 4, 7, 7}), y1a(y1.data(), {2, 5, 5, 4});
    StepIO io({{x, xa}}, {{ys[0], y0a}, {ys[1], y1a}});
    s->run(io);
    y0.insert(y0.end(), y1.begin(), y1.end());
    return y0;
  };
  EXPECT_TRUE(bitwiseEqual(run(true), run(false)));
  auto b = Builder::create();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, Shape{1, 1, 3, 3}), "x");
  const std::string message = thrown([&] { b->aiGraphcoreOpset1().multiconv({{x}}); });
  EXPECT_NE(message.find("convolution 0 has 1 tensors"), std::string::npos) << message;
}
