// Builder::getModelProto gives graph outputs the shapes ONNX's inference finds, without a catch
// that would hide a failure: nodes ONNX cannot infer leave the shape unknown.

#include <popart/builder.hpp>

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

using namespace popart;

namespace {
onnx::ModelProto parse(const std::string &bytes) {
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(bytes));
  return m;
}

std::vector<int64_t> outputDims(const onnx::ModelProto &m, int i) {
  std::vector<int64_t> dims;
  const auto &t = m.graph().output(i).type().tensor_type();
  if (!t.has_shape()) return dims;
  for (const auto &d : t.shape().dim())
    dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
  return dims;
}
} // namespace

TEST(BuilderOutputTypes, InferredShapesAreTakenAndUninferableNodesLeaveThemUnknown) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {2, 3, 8, 8}), "x");
  std::vector<float> w(4 * 3 * 3 * 3, 0.5f);
  TensorId c = ai.conv({x, b->addInitializedInputTensor(w, {4, 3, 3, 3})}, {1, 1}, 1, {3, 3}, {1, 1, 1, 1}, {2, 2});
  b->addOutputTensor(c);
  // Reshape to a shape that is not a constant: ONNX cannot infer it, which must not throw.
  TensorId r = ai.reshape({x, b->addInputTensor(TensorInfo(DataType::INT64, {2}), "shape")});
  b->addOutputTensor(r);
  onnx::ModelProto m = parse(b->getModelProto());
  ASSERT_EQ(m.graph().output_size(), 2);
  EXPECT_EQ(outputDims(m, 0), (std::vector<int64_t>{2, 4, 4, 4}));
  EXPECT_EQ(m.graph().output(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
  EXPECT_EQ(m.graph().output(1).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
  for (int64_t d : outputDims(m, 1))
    EXPECT_EQ(d, -1) << "a shape ONNX cannot know";
}
