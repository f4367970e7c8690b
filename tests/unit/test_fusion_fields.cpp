// Typed fusion fields (ir::Fusion): the passes set them, Graph::clone and dump carry them, and the
// verifier rejects a field on an op whose definition does not declare it, a value that does not
// fit the op, and any internal (popart_*) attribute its definition does not declare, such as the
// string attribute a field replaced, each time naming the op and the field.

#include "thrown.hpp"

#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include "ir/verify.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

using namespace popart;

namespace {

/// q [2, 3] · k [3, 4] / 8 → y: an attention score that fuseMatMulScale turns into one MatMul.
void scaledProduct(ir::Graph &g) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("q", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3}));
  g.addInput("q");
  g.addTensor("k", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {3, 4}));
  g.addInput("k");
  TensorData eight(TensorInfo(DataType::FLOAT, {}));
  *static_cast<float *>(eight.data()) = 8.f;
  g.addConst("c", eight);
  g.addOp("MatMul", "", 13, "mm", {}, {"q", "k"}, {"s"});
  g.addOp("Div", "", 13, "scale", {}, {"s", "c"}, {"y"});
  g.addOutput("y");
  ir::inferShapes(g, nullptr);
}

ir::Op &only(const ir::Graph &g, const std::string &type) {
  for (const auto &op : g.ops())
    if (op->type == type) return *op;
  throw error("no ", type);
}

} // namespace

TEST(FusionFields, FuseMatMulScaleSetsTheTypedFieldWhichCloneAndDumpCarry) {
  ir::Graph g;
  scaledProduct(g);
  ASSERT_EQ(ir::fuseMatMulScale(g), 1);
  ASSERT_EQ(g.ops().size(), 1u);
  const ir::Op &mm = only(g, "MatMul");
  ASSERT_TRUE(mm.fusion.scale.has_value());
  EXPECT_EQ(*mm.fusion.scale, 1.f / 8.f);
  EXPECT_FALSE(mm.attrs.has("popart_scale"));
  EXPECT_NO_THROW(ir::verifyGraph(g, ""));
  std::string dump = g.dump();
  EXPECT_NE(dump.find("fused{scale=0.125}"), std::string::npos) << dump;
  auto copy = g.clone();
  EXPECT_EQ(only(*copy, "MatMul").fusion, mm.fusion);
  EXPECT_NO_THROW(ir::verifyGraph(*copy, ""));
}

TEST(FusionFields, AFieldTheOpDoesNotDeclareIsAnErrorNamingOpAndField) {
  ir::Graph g;
  scaledProduct(g);
  only(g, "Div").fusion.scale = 0.5f; // Div declares no fusion field
  std::string e = thrown([&] { ir::verifyGraph(g, "after pass 'test'"); });
  EXPECT_NE(e.find("IR verification failed after pass 'test': Div 'scale' carries fusion field 'scale', which "
                   "ai.onnx::Div does not declare"),
            std::string::npos)
      << e;
}

TEST(FusionFields, AValueThatDoesNotFitIsAnErrorNamingOpAndField) {
  for (float bad : {0.f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    ir::Graph g;
    scaledProduct(g);
    only(g, "MatMul").fusion.scale = bad;
    std::string e = thrown([&] { ir::verifyGraph(g, ""); });
    EXPECT_NE(e.find("MatMul 'mm': fusion field 'scale' must be finite and non-zero"), std::string::npos)
        << bad << ": " << e;
  }
}

TEST(FusionFields, TheStringAttributeAFieldReplacedIsAnError) {
  ir::Graph g;
  scaledProduct(g);
  only(g, "MatMul").attrs.set("popart_scale", 0.125f); // what fuseMatMulScale wrote before
  std::string e = thrown([&] { ir::verifyGraph(g, ""); });
  EXPECT_NE(e.find("MatMul 'mm' has internal attribute 'popart_scale', which ai.onnx::MatMul does not declare"),
            std::string::npos)
      << e;
}

TEST(FusionFields, InternalAttributesAreThoseTheDefinitionDeclares) {
  // BatchNormalization declares popart_unbiased_running_var and Dropout popart_salt; a misspelt
  // name, or one on an op that does not declare it, fails naming op, attribute and definition.
  ir::registerBuiltinOps();
  struct Case {
    const char *op, *attribute, *error;
  };
  for (const Case &c : {
           Case{"BatchNormalization", "popart_unbiased_running_var", ""},
           Case{"BatchNormalization", "popart_unbiased_runing_var",
                "BatchNormalization 'op' has internal attribute 'popart_unbiased_runing_var', which "
                "ai.onnx::BatchNormalization does not declare"},
           Case{"Dropout", "popart_salt", ""},
           Case{"Relu", "popart_salt", "Relu 'op' has internal attribute 'popart_salt', which ai.onnx::Relu does not"},
       }) {
    ir::Graph g;
    g.opsets()["ai.onnx"] = 15;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3, 4}));
    g.addInput("x");
    std::vector<TensorId> ins{"x"};
    if (std::string(c.op) == "BatchNormalization") {
      for (const char *p : {"s", "b", "mean", "var"}) {
        g.addConst(p, TensorData(TensorInfo(DataType::FLOAT, {3})));
        ins.emplace_back(p);
      }
    }
    ir::Attributes a;
    a.set(c.attribute, int64_t{1});
    g.addOp(c.op, "", 15, "op", a, ins, {"y"});
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
    std::string e = *c.error ? thrown([&] { ir::verifyGraph(g, ""); }) : "";
    if (!*c.error)
      EXPECT_NO_THROW(ir::verifyGraph(g, "")) << c.op << " " << c.attribute;
    else
      EXPECT_NE(e.find(c.error), std::string::npos) << e;
  }
}

TEST(FusionFields, ActivationAndLayoutFieldsAreDumpedAndDeclared) {
  // MatMul declares transpose and permute; Div declares neither; dump prints both.
  ir::Graph g;
  scaledProduct(g);
  ir::Op &mm = only(g, "MatMul");
  mm.fusion.transB = true;
  mm.fusion.activation.kind = ir::FusedActivation::Kind::Relu;
  EXPECT_NO_THROW(ir::verifyGraph(g, ""));
  EXPECT_NE(g.dump().find("fused{Relu transB}"), std::string::npos) << g.dump();
  mm.fusion.permA = {1, 0, 2}; // q is [2, 3]
  std::string e = thrown([&] { ir::verifyGraph(g, ""); });
  EXPECT_NE(e.find("MatMul 'mm': fusion field 'permA' [1,0,2] is not a permutation of its tensor's axes"),
            std::string::npos)
      << e;
  mm.fusion = {};
  only(g, "Div").fusion.transA = true;
  e = thrown([&] { ir::verifyGraph(g, ""); });
  EXPECT_NE(e.find("Div 'scale' carries fusion field 'transpose', which ai.onnx::Div does not declare"),
            std::string::npos)
      << e;
}

TEST(FusionFields, BiasResidualAndPoolNeedTheirInputsAndADeclaringOp) {
  struct Case {
    const char *op;
    void (*set)(ir::Fusion &);
    const char *error;
  };
  for (const Case &c : {
           Case{"MatMul", [](ir::Fusion &f) { f.bias = true; }, // a MatMul of two inputs
                "MatMul 'mm': fusion field 'bias' needs a bias as input 2, which is missing"},
           Case{"MatMul", [](ir::Fusion &f) { f.residual = true; },
                "MatMul 'mm': fusion field 'residual' needs the residual as input 3, which is missing"},
           Case{"Div", [](ir::Fusion &f) { f.residual = true; },
                "Div 'scale' carries fusion field 'residual', which ai.onnx::Div does not declare"},
           Case{"MatMul",
                [](ir::Fusion &f) {
                  f.pool = ir::FusedPool{{2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 3, 4, 4}};
                },
                "MatMul 'mm' carries fusion field 'pool', which ai.onnx::MatMul does not declare"},
       }) {
    ir::Graph g;
    scaledProduct(g);
    c.set(only(g, c.op).fusion);
    std::string e = thrown([&] { ir::verifyGraph(g, ""); });
    EXPECT_NE(e.find(c.error), std::string::npos) << e;
  }
}

TEST(FusionFields, APoolOfTheWrongRankIsAnErrorNamingOpAndField) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {1, 2, 6, 6}));
  g.addInput("x");
  g.addConst("w", TensorData(TensorInfo(DataType::FLOAT, {3, 2, 3, 3})));
  ir::Op &conv = g.addOp("Conv", "", 13, "conv", {}, {"x", "w"}, {"y"});
  g.addOutput("y");
  ir::inferShapes(g, nullptr);
  conv.fusion.pool = ir::FusedPool{{2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 3, 4, 4}};
  EXPECT_NO_THROW(ir::verifyGraph(g, ""));
  EXPECT_NE(g.dump().find("fused{pool(kernel [2,2] strides [2,2] pads [0,0,0,0] of [1,3,4,4])}"), std::string::npos)
      << g.dump();
  conv.fusion.pool = ir::FusedPool{{2}, {2}, {0, 0}, {1, 3, 4}}; // one spatial axis for a 2-D Conv
  std::string e = thrown([&] { ir::verifyGraph(g, ""); });
  EXPECT_NE(e.find("Conv 'conv': fusion field 'pool' has 1 kernel axes, 1 strides, 2 pads and a rank-3 input shape, "
                   "which do not fit the op's input"),
            std::string::npos)
      << e;
}
