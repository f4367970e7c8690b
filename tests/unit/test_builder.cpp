// popart::Builder: models built in code pass the ONNX checker and run with the right numbers.

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

using namespace popart;

namespace {

onnx::ModelProto parseAndCheck(const std::string &bytes) {
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(bytes));
  EXPECT_NO_THROW(onnx::checker::check_model(m));
  return m;
}

} // namespace

TEST(Builder, MlpMatchesHandComputedValues) {
  auto builder = Builder::create();
  auto ai = builder->aiOnnxOpset13();
  std::vector<float> w = {0.1f, 0.2f, 0.3f, -0.4f, 0.5f, 0.6f}; // [3,2]
  std::vector<float> b = {0.05f, -0.1f};
  TensorId x = builder->addInputTensor(TensorInfo(DataType::FLOAT, {2, 3}), "x");
  TensorId wId = builder->addInitializedInputTensor(w, {3, 2}, "w");
  TensorId bId = builder->addInitializedInputTensor(b.data(), TensorInfo(DataType::FLOAT, {2}), "b");
  TensorId h = ai.relu({ai.add({ai.matmul({x, wId}), bId})});
  TensorId probs = ai.softmax({h}, 1);
  builder->addOutputTensor(probs);

  std::string bytes = builder->getModelProto();
  onnx::ModelProto m = parseAndCheck(bytes);
  std::set<std::string> names;
  for (const auto &n : m.graph().node())
    EXPECT_TRUE(names.insert(n.name()).second) << "duplicate node name " << n.name();

  std::vector<float> xv = {1, 2, 3, -1, 0, -2};
  // Row 0: [1*0.1+2*0.3+3*0.5+0.05, 1*0.2-2*0.4+3*0.6-0.1] = [2.25, 1.1]
  // Row 1: [-0.1-1.0+0.05, -0.2-1.2-0.1] = [-1.05, -1.5] -> relu [0, 0]
  const float e0 = std::exp(2.25f), e1 = std::exp(1.1f);
  std::vector<float> expected = {e0 / (e0 + e1), e1 / (e0 + e1), 0.5f, 0.5f};

  auto session = InferenceSession::createFromOnnxModel(bytes, DataFlow(1, {probs}));
  std::vector<float> out(4, -1.0f);
  NDArrayWrapper<float> in(xv.data(), {2, 3}), outArr(out.data(), {2, 2});
  StepIO io({{x, in}}, {{probs, outArr}});
  session->run(io);
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_NEAR(out[i], expected[i], 1e-5) << "element " << i;
}

TEST(Builder, ConvMaxPoolOutputShape) {
  auto builder = Builder::create();
  auto ai = builder->aiOnnxOpset13();
  TensorId x = builder->addInputTensor(TensorInfo(DataType::FLOAT, {1, 1, 6, 6}), "image");
  std::vector<float> w(2 * 9, 1.0f);
  TensorId wId = builder->addInitializedInputTensor(w, {2, 1, 3, 3});
  TensorId c = ai.conv({x, wId}, {1, 1}, 1, {3, 3}, {0, 0, 0, 0}, {1, 1});
  TensorId p = ai.maxpool({c}, 1, {2, 2}, {}, {2, 2})[0];
  builder->addOutputTensor(p);
  std::string bytes = builder->getModelProto();
  onnx::ModelProto m = parseAndCheck(bytes);
  ASSERT_EQ(m.graph().output_size(), 1);

  auto session = InferenceSession::createFromOnnxModel(bytes, DataFlow(1, {p}));
  session->prepareDevice();
  EXPECT_EQ(session->getInfo(p).shape(), (Shape{1, 2, 2, 2}));
  std::vector<float> xv(36);
  for (size_t i = 0; i < xv.size(); ++i)
    xv[i] = static_cast<float>(i);
  std::vector<float> out(8, 0.0f);
  NDArrayWrapper<float> in(xv.data(), {1, 1, 6, 6}), outArr(out.data(), {1, 2, 2, 2});
  StepIO io({{x, in}}, {{p, outArr}});
  session->run(io);
  // The 3x3 box sum at (r, c) is 9 * x[r+1][c+1]; its maximum over a 2x2 window is at the bottom right.
  EXPECT_FLOAT_EQ(out[0], 9.0f * (2 * 6 + 2));
  EXPECT_FLOAT_EQ(out[3], 9.0f * (4 * 6 + 4));
}

TEST(Builder, LossesAndManyOpsPassChecker) {
  auto builder = Builder::create();
  auto ai = builder->aiOnnxOpset13();
  TensorId x = builder->addInputTensor(TensorInfo(DataType::FLOAT, {2, 4}), "x");
  TensorId label = builder->addInputTensor(TensorInfo(DataType::INT32, {2}), "label");
  std::vector<int64_t> shape = {4, 2};
  TensorId s = builder->addInitializedInputTensor(shape, {2});
  TensorId r = ai.transpose({ai.reshape({x, s})}, {1, 0});
  TensorId g = ai.gemm({x, r}, 0.5f, 1.0f, 0, 1);
  TensorId d = ai.dropout({ai.tanh({ai.sigmoid({g})})}, 1, 0.1f)[0];
  TensorId rs = ai.reducesum({d}, std::vector<int64_t>{1}, 0);
  TensorId rm = ai.reducemean({ai.cast({rs}, "FLOAT")}, std::nullopt, 0);
  TensorId probs = ai.softmax({x}, 1);
  TensorId nll = builder->nllloss({probs, label}, ReductionType::Sum, -100);
  TensorId l1 = builder->l1loss(x, 0.1f, ReductionType::Mean);
  TensorId il = builder->identityloss(ai.logsoftmax({x}), ReductionType::NoReduction);
  for (const auto &o : {rm, nll, l1, il})
    builder->addOutputTensor(o);
  std::string bytes = builder->getModelProto();
  parseAndCheck(bytes);

  std::vector<float> xv = {1, 2, 3, 4, -1, 0, 1, 0.5f};
  std::vector<int32_t> lv = {3, 0};
  auto session = InferenceSession::createFromOnnxModel(bytes, DataFlow(1, std::vector<TensorId>{nll, l1}));
  float nllOut = 0, l1Out = 0;
  NDArrayWrapper<float> in(xv.data(), {2, 4}), nllArr(&nllOut, {}), l1Arr(&l1Out, {});
  NDArrayWrapper<int32_t> lab(lv.data(), {2});
  StepIO io({{x, in}, {label, lab}}, {{nll, nllArr}, {l1, l1Arr}});
  session->run(io);
  auto lse = [](const float *v) {
    double s = 0;
    for (int i = 0; i < 4; ++i)
      s += std::exp(v[i]);
    return std::log(s);
  };
  const double expectedNll = (lse(&xv[0]) - xv[3]) + (lse(&xv[4]) - xv[4]);
  EXPECT_NEAR(nllOut, expectedNll, 1e-4);
  double absSum = 0;
  for (float v : xv)
    absSum += std::fabs(v);
  EXPECT_NEAR(l1Out, 0.1 * absSum / 8, 1e-5);
}

TEST(Builder, ErrorsNameOpAndTensor) {
  auto builder = Builder::create();
  auto ai = builder->aiOnnxOpset13();
  TensorId x = builder->addInputTensor(TensorInfo(DataType::FLOAT, {2}), "x");
  try {
    ai.add({x, "nope"});
    FAIL() << "expected popart::error";
  } catch (const popart::error &e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("Add"), std::string::npos) << msg;
    EXPECT_NE(msg.find("nope"), std::string::npos) << msg;
  }
  EXPECT_THROW(builder->addOutputTensor("missing"), popart::error);
  EXPECT_THROW(ai.relu({x, x}), popart::error);
  EXPECT_THROW(builder->addInitializedInputTensor(std::vector<float>{1, 2, 3}, {2, 2}), popart::error);
  // Same debug name twice still yields distinct ids.
  TensorId y = builder->addInputTensor(TensorInfo(DataType::FLOAT, {2}), "x");
  EXPECT_NE(x, y);
}

TEST(Builder, SaveModelProtoWritesLoadableFile) {
  auto builder = Builder::create();
  auto ai = builder->aiOnnxOpset13();
  TensorId x = builder->addInputTensor(TensorInfo(DataType::FLOAT, {3}), "x");
  builder->addOutputTensor(ai.identity({x}));
  auto path = std::filesystem::temp_directory_path() / "popart_builder_test.onnx";
  builder->saveModelProto(path.string());
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes, builder->getModelProto());
  std::filesystem::remove(path);
  EXPECT_THROW(builder->saveModelProto("/nonexistent_dir/x.onnx"), popart::error);
}
