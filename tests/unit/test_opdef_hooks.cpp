// The OpDef hooks that replace op-name checks in central code: FLOPs for the profiler
// (ir::estimateFlops), the random input training seeds (randomInput) and the running statistics
// training writes back (trainingState).

#include "ir/graph.hpp"

#include <gtest/gtest.h>

using namespace popart;

namespace {

ir::Graph &graphWith(ir::Graph &g, const std::vector<std::pair<TensorId, Shape>> &inputs) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 13;
  for (const auto &[id, shape] : inputs) {
    g.addTensor(id, ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, shape));
    g.addInput(id);
  }
  return g;
}

} // namespace

TEST(OpDefHooks, FlopsOfProductsAndConvolutionsCountTwoPerMultiplyAdd) {
  ir::Graph g;
  graphWith(g, {{"a", {5, 2, 3}}, {"b", {3, 4}}, {"at", {3, 2}}, {"x", {1, 2, 6, 6}}, {"w", {8, 2, 3, 3}}});
  ir::Op &mm = g.addOp("MatMul", "", 13, "mm", {}, {"a", "b"}, {"p"});
  ir::Attributes t;
  t.set("transA", int64_t{1});
  ir::Op &gemm = g.addOp("Gemm", "", 13, "gemm", t, {"at", "b"}, {"q"});
  ir::Op &conv = g.addOp("Conv", "", 13, "conv", {}, {"x", "w"}, {"y"});
  ir::Op &relu = g.addOp("Relu", "", 13, "relu", {}, {"y"}, {"r"});
  for (ir::Op *op : g.schedule())
    op->def->setup(*op);
  // [5, 2, 3] · [3, 4]: 5·2·4 results of 3 products each.
  EXPECT_DOUBLE_EQ(ir::estimateFlops(mm), 2.0 * (5 * 2 * 4) * 3);
  // Aᵀ [2, 3] · B [3, 4]: K = 3 read from A's first axis.
  EXPECT_DOUBLE_EQ(ir::estimateFlops(gemm), 2.0 * (2 * 4) * 3);
  // 8 output channels of 4 × 4 pixels (3 × 3 kernel, no padding), each 2 · 3 · 3 products.
  EXPECT_DOUBLE_EQ(ir::estimateFlops(conv), 2.0 * (8 * 4 * 4) * (2 * 3 * 3));
  // Elementwise ops: one per output element.
  EXPECT_DOUBLE_EQ(ir::estimateFlops(relu), 8.0 * 4 * 4);
}

TEST(OpDefHooks, DropoutOfEveryOpsetTakesTheTrainingSeedAndOthersDoNot) {
  ir::registerBuiltinOps();
  const auto &registry = ir::OpRegistry::instance();
  for (int version : {7, 10, 12, 13}) {
    const ir::OpDef *d = registry.find("ai.onnx", "Dropout", version);
    ASSERT_NE(d, nullptr) << version;
    EXPECT_EQ(d->randomInput, 3) << version;
  }
  for (const char *type : {"Relu", "BatchNormalization", "MatMul"}) {
    const ir::OpDef *d = registry.find("ai.onnx", type, 13);
    ASSERT_NE(d, nullptr) << type;
    EXPECT_EQ(d->randomInput, -1) << type;
  }
}

TEST(OpDefHooks, BatchNormalizationKeepsRunningStatisticsOnlyWhenItTrains) {
  for (auto [version, training] : {std::pair{15, 1}, {15, 0}, {9, 1}}) {
    ir::Graph g;
    graphWith(g, {{"x", {2, 3, 4}}, {"s", {3}}, {"b", {3}}, {"m", {3}}, {"v", {3}}});
    g.opsets()["ai.onnx"] = version;
    ir::Attributes a;
    if (version >= 14) a.set("training_mode", int64_t{training});
    ir::Op &bn = g.addOp("BatchNormalization", "", version, "bn", a, {"x", "s", "b", "m", "v"}, {"y"});
    ASSERT_NE(bn.def->trainingState, nullptr);
    auto state = bn.def->trainingState(bn);
    if (version >= 14 && training) {
      ASSERT_EQ(state.size(), 2u);
      EXPECT_EQ(state[0].output, 1); // running mean: input 3 → output 1
      EXPECT_EQ(state[0].input, 3);
      EXPECT_EQ(state[1].output, 2); // running variance: input 4 → output 2
      EXPECT_EQ(state[1].input, 4);
    } else {
      EXPECT_TRUE(state.empty()) << version << " " << training;
    }
  }
  const ir::OpDef *relu = ir::OpRegistry::instance().find("ai.onnx", "Relu", 13);
  ASSERT_NE(relu, nullptr);
  EXPECT_EQ(relu->trainingState, nullptr);
}
