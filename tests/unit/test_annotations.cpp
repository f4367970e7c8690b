// PopART's model-parallel annotations (ir/annotations.hpp): the Builder writes them as PopART
// does, the importer keeps them on the ops (the ONNX checker lets `__*` attributes through), and
// bad ones are named.

#include "ir/annotations.hpp"
#include "onnx_import/onnx_import.hpp"

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

using namespace popart;

namespace {

struct Annotated {
  std::string model;
  TensorId h, y;
};

/// y = relu(x · w) + 1, the MatMul in stage/virtual graph 0, the Relu in 1, the Add in \p addStage.
Annotated model(int64_t addStage = 1) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {2, 3}), "x");
  TensorId w = b->addInitializedInputTensor(std::vector<float>(12, 0.5f), {3, 4}, "w");
  TensorId one = b->addInitializedInputTensor(std::vector<float>{1.0f}, {1}, "one");
  TensorId m = ai.matmul({x, w}, "mm");
  TensorId h = ai.relu({m}, "act");
  TensorId y = ai.add({h, one}, "out");
  b->addOutputTensor(y);
  b->virtualGraph(m, 0);
  b->pipelineStage(m, 0);
  b->virtualGraph(h, 1);
  b->pipelineStage(h, 1);
  b->recomputeOutputInBackwardPass(h);
  b->pipelineStage(y, addStage);
  return {b->getModelProto(), h, y};
}

std::string importError(const std::string &bytes) {
  try {
    onnx_import::importModelBytes(bytes, "", {}, "annotated");
  } catch (const popart::error &e) {
    return e.what();
  }
  return "no error";
}

/// \p bytes with INT attribute \p name of node \p node set to \p value (or made a FLOAT).
std::string withAttribute(const std::string &bytes, int node, const std::string &name, int64_t value,
                          bool asFloat = false) {
  onnx::ModelProto m;
  m.ParseFromString(bytes);
  onnx::AttributeProto *a = m.mutable_graph()->mutable_node(node)->add_attribute();
  a->set_name(name);
  if (asFloat) {
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(1.0f);
  } else {
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(value);
  }
  return m.SerializeAsString();
}

} // namespace

TEST(Annotations, TheBuilderWritesPopartsAttributesAndTheImporterKeepsThem) {
  const Annotated a = model();
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(a.model));
  const onnx::NodeProto &relu = proto.graph().node(1);
  std::vector<std::string> names;
  for (const auto &attr : relu.attribute())
    names.push_back(attr.name() + "=" + std::to_string(attr.i()));
  EXPECT_EQ(names, (std::vector<std::string>{"__ipu_number=1", "__pipeline_stage=1",
                                             "__recompute_output_in_backward_pass=2"}));
  // The checker (on by default) accepts them; the ops keep them.
  auto g = onnx_import::importModelBytes(a.model, "", {}, "annotated");
  const ir::Op *mm = g->tensor(a.h).producer()->inputs[0]->producer();
  const ir::Op *act = g->tensor(a.h).producer();
  EXPECT_EQ(ir::pipelineStageOf(*mm), 0);
  EXPECT_EQ(ir::virtualGraphOf(*act), 1);
  EXPECT_EQ(ir::pipelineStageOf(*act), 1);
  EXPECT_EQ(ir::recomputeOf(*act), 2);
  EXPECT_EQ(ir::recomputeOf(*mm), 0);
  EXPECT_FALSE(ir::virtualGraphOf(*g->tensor(a.y).producer()));
  // And a session runs the model as if unannotated.
  auto session = InferenceSession::createFromOnnxModel(a.model, DataFlow(1, {a.y}));
  std::vector<float> x(6, 1.0f), y(8);
  NDArrayWrapper<float> xa(x.data(), {2, 3}), ya(y.data(), {2, 4});
  StepIO io({{"x", xa}}, {{a.y, ya}});
  session->run(io);
  for (float v : y)
    EXPECT_FLOAT_EQ(v, 2.5f); // relu(3 × 0.5) + 1
}

TEST(Annotations, AStageReadingALaterStagesOutputIsNamed) {
  const std::string m = importError(model(0).model);
  EXPECT_NE(m.find("Add 'out' of pipeline stage 0 reads tensor"), std::string::npos) << m;
  EXPECT_NE(m.find("Relu 'act' of the later stage 1"), std::string::npos) << m;
}

TEST(Annotations, OutOfRangeOrMistypedAnnotationsAreNamed) {
  const std::string base = model().model;
  std::string m = importError(withAttribute(base, 2, "__ipu_number", -1));
  EXPECT_NE(m.find("__ipu_number is -1"), std::string::npos) << m;
  m = importError(withAttribute(base, 0, "__recompute_output_in_backward_pass", 7));
  EXPECT_NE(m.find("__recompute_output_in_backward_pass is 7"), std::string::npos) << m;
  m = importError(withAttribute(base, 2, "__ipu_number", 0, true));
  EXPECT_NE(m.find("annotation '__ipu_number' must be an INT attribute"), std::string::npos) << m;
  auto b = Builder::create();
  EXPECT_THROW(b->pipelineStage("nowhere", 0), popart::error);
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {2}), "x");
  TensorId r = ai.relu({x});
  EXPECT_THROW(b->virtualGraph(r, -2), popart::error);
}
