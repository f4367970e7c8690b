// foldLossCasts (ir/passes/loss_fusions.cpp): in mixed precision the fp32 loss reads a Cast of the
// 16-bit logits and its gradient is cast back; after fuseLossWithGradient the pass lets
// SoftmaxCrossEntropyLossGrad read and write the 16-bit tensors itself, and fuseLossGradClassSums
// then folds the bias gradient's ReduceSum in the 16-bit type. The folded graph computes the loss
// and gradients of the unfused one within the 16-bit type's rounding, with every kernel provider.

#include "backend_cpu/kernel.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/graph.hpp"
#include "ir/passes/pass_manager.hpp"
#include "kernel_compare.hpp"
#include "op_runner.hpp"
#include "session/pipelines.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace popart;

namespace {

int onnxNumber(DataType t) { return t == DataType::FLOAT ? 1 : (t == DataType::FLOAT16 ? 10 : 16); }

/// What the training pipeline leaves around the loss of a model in a 16-bit \p low type: logits
/// xb [N, C] cast to FLOAT for SoftmaxCrossEntropyLoss and its gradient (seed dy), the gradient
/// cast back to \p low and its ReduceSum over the rows (the head's bias gradient). With
/// \p fp32Reader another op reads the FLOAT logits too, with \p fp32Gradient the FLOAT gradient.
void buildLossGraph(ir::Graph &g, DataType low, int64_t n, int64_t c, bool fp32Reader = false,
                    bool fp32Gradient = false) {
  ir::registerBuiltinOps();
  g.opsets()["ai.onnx"] = 18;
  g.addTensor("xb", ir::TensorKind::Stream, TensorInfo(low, {n, c}));
  g.addTensor("labels", ir::TensorKind::Stream, TensorInfo(DataType::INT64, {n}));
  g.addTensor("dy", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {}));
  for (const char *in : {"xb", "labels", "dy"})
    g.addInput(in);
  g.addConst("axes", TensorData::fromInt64({1}, {0}));
  ir::Attributes toFloat, toLow, keep, mean;
  toFloat.set("to", int64_t{onnxNumber(DataType::FLOAT)});
  toLow.set("to", int64_t{onnxNumber(low)});
  keep.set("keepdims", int64_t{0});
  mean.set("reduction", std::string("mean"));
  g.addOp("Cast", "ai.onnx", 18, "widen", toFloat, {"xb"}, {"xf"});
  g.addOp("SoftmaxCrossEntropyLoss", "ai.onnx", 18, "loss", mean, {"xf", "labels"}, {"loss"});
  g.addOp("SoftmaxCrossEntropyLossGrad", "ai.graphcore", 1, "loss_grad", mean, {"xf", "labels", "", "dy"}, {"dxf"});
  g.addOp("Cast", "ai.onnx", 18, "narrow", toLow, {"dxf"}, {"dx"});
  g.addOp("ReduceSum", "ai.onnx", 18, "bias_grad", keep, {"dx", "axes"}, {"db"});
  std::vector<TensorId> outputs{"loss", "dx", "db"};
  if (fp32Reader) {
    g.addOp("Neg", "ai.onnx", 18, "other_reader", {}, {"xf"}, {"negx"});
    outputs.emplace_back("negx");
  }
  if (fp32Gradient) {
    g.addOp("Neg", "ai.onnx", 18, "gradient_reader", {}, {"dxf"}, {"negdx"});
    outputs.emplace_back("negdx");
  }
  for (const auto &o : outputs)
    g.addOutput(o);
  ir::inferShapes(g, nullptr);
}

/// Runs the loss passes of the training pipeline, in its order, on \p g.
void runLossPasses(ir::Graph &g) {
  session::registerAllPasses();
  ir::PassContext context;
  context.keep = g.outputs();
  context.training = true;
  ir::PipelineOptions options;
  options.entryStages = ir::ShapesInferred | ir::ControlFlowUnrolled | ir::TrainingPrepared | ir::GradientsBuilt |
                        ir::OptimizerApplied | ir::OutputsFixed;
  options.verify = true;
  ir::runPipeline("loss", {"fuseLossWithGradient", "foldLossCasts", "fuseLossGradClassSums"}, g, context, options);
}

int count(const ir::Graph &g, const std::string &type) {
  int k = 0;
  for (const auto &op : g.ops())
    k += op->type == type;
  return k;
}

const ir::Op &only(const ir::Graph &g, const std::string &type) {
  for (const auto &op : g.ops())
    if (op->type == type) return *op;
  throw std::runtime_error("no " + type);
}

/// The graph's outputs for \p inputs, with \p provider's kernels.
std::map<TensorId, TensorData> execute(const ir::Graph &g, const std::map<TensorId, TensorData> &inputs,
                                       backend_cpu::KernelProvider provider) {
  backend_cpu::registerBuiltinKernels();
  backend_cpu::ExecutionPlan plan(g, {provider});
  for (const auto &[id, data] : inputs)
    std::memcpy(plan.address(id), data.data(), static_cast<size_t>(data.byteCount()));
  plan.run();
  std::map<TensorId, TensorData> out;
  for (const auto &o : g.outputs())
    out.emplace(o, TensorData(plan.info(o), plan.address(o)));
  return out;
}

TEST(LossCastFolding, TheLossReadsAndWritesTheSixteenBitTensorsAndFoldsTheBiasGradient) {
  for (DataType low : {DataType::BFLOAT16, DataType::FLOAT16}) {
    SCOPED_TRACE(toString(low));
    const int64_t n = 64, c = 300;
    ir::Graph unfused, folded;
    buildLossGraph(unfused, low, n, c);
    buildLossGraph(folded, low, n, c);
    runLossPasses(folded);
    // No Cast, no forward loss, no ReduceSum: one loss op on the 16-bit tensors.
    EXPECT_EQ(count(folded, "Cast"), 0);
    EXPECT_EQ(count(folded, "SoftmaxCrossEntropyLoss"), 0);
    EXPECT_EQ(count(folded, "ReduceSum"), 0);
    const ir::Op &grad = only(folded, "SoftmaxCrossEntropyLossGrad");
    EXPECT_EQ(grad.input(0).id(), "xb");
    EXPECT_EQ(grad.output(0).id(), "dx");
    ASSERT_TRUE(grad.hasOutput(1) && grad.hasOutput(2));
    EXPECT_EQ(grad.outInfo(1).dataType(), low);
    EXPECT_EQ(grad.output(2).id(), "loss");
    EXPECT_EQ(grad.outInfo(2).dataType(), DataType::FLOAT);
    EXPECT_EQ(folded.tensor("db").info(), unfused.tensor("db").info());

    std::mt19937 rng(17);
    std::uniform_int_distribution<int64_t> label(0, c - 1);
    std::vector<int64_t> labels(static_cast<size_t>(n));
    for (auto &l : labels)
      l = label(rng);
    std::map<TensorId, TensorData> inputs{{"xb", op_runner::randomTensor(low, {n, c}, rng, -6, 6)},
                                          {"labels", TensorData::fromInt64({n}, labels)},
                                          {"dy", TensorData::scalarFloat(0.75f)}};
    auto want = execute(unfused, inputs, backend_cpu::KernelProvider::Reference);
    const double eps = kernel_compare::unitRoundoff(low);
    for (auto provider : {backend_cpu::KernelProvider::Any, backend_cpu::KernelProvider::Reference}) {
      SCOPED_TRACE(backend_cpu::kernelProviderName(provider));
      auto got = execute(folded, inputs, provider);
      EXPECT_LE(kernel_compare::maxRelDiff(got.at("loss"), want.at("loss")), 1e-6);
      // The gradient rounded once either way; the bias gradient sums n of them.
      EXPECT_LE(kernel_compare::maxRelDiff(got.at("dx"), want.at("dx")), 2 * eps);
      EXPECT_LE(kernel_compare::maxRelDiff(got.at("db"), want.at("db")), kernel_compare::sixteenBitTolerance(low, n));
    }
    // And the unfused graph on the fast and oneDNN kernels, as the session would run it.
    auto unfusedAny = execute(unfused, inputs, backend_cpu::KernelProvider::Any);
    EXPECT_LE(kernel_compare::maxRelDiff(unfusedAny.at("dx"), want.at("dx")), 2 * eps);
  }
}

TEST(LossCastFolding, CastsThatOthersReadStay) {
  // Another reader of the FLOAT logits: the widening Cast stays, and with it the FLOAT loss.
  ir::Graph reader;
  buildLossGraph(reader, DataType::BFLOAT16, 8, 10, true, false);
  runLossPasses(reader);
  EXPECT_EQ(count(reader, "Cast"), 2);
  EXPECT_EQ(only(reader, "SoftmaxCrossEntropyLossGrad").inInfo(0).dataType(), DataType::FLOAT);
  // A FLOAT reader of the gradient: it would get the gradient rounded, so nothing folds.
  ir::Graph gradient;
  buildLossGraph(gradient, DataType::BFLOAT16, 8, 10, false, true);
  runLossPasses(gradient);
  EXPECT_EQ(count(gradient, "Cast"), 2);
  EXPECT_EQ(only(gradient, "SoftmaxCrossEntropyLossGrad").outInfo(0).dataType(), DataType::FLOAT);
  // In fp32 there is nothing to fold; the class sums fold as before.
  ir::Graph fp32;
  ir::registerBuiltinOps();
  fp32.opsets()["ai.onnx"] = 18;
  fp32.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {8, 10}));
  fp32.addTensor("labels", ir::TensorKind::Stream, TensorInfo(DataType::INT64, {8}));
  fp32.addTensor("dy", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {}));
  fp32.addConst("axes", TensorData::fromInt64({1}, {0}));
  ir::Attributes keep;
  keep.set("keepdims", int64_t{0});
  fp32.addOp("SoftmaxCrossEntropyLoss", "ai.onnx", 18, "loss", {}, {"x", "labels"}, {"loss"});
  fp32.addOp("SoftmaxCrossEntropyLossGrad", "ai.graphcore", 1, "grad", {}, {"x", "labels", "", "dy"}, {"dx"});
  fp32.addOp("ReduceSum", "ai.onnx", 18, "bias_grad", keep, {"dx", "axes"}, {"db"});
  for (const char *o : {"loss", "dx", "db"})
    fp32.addOutput(o);
  ir::inferShapes(fp32, nullptr);
  runLossPasses(fp32);
  EXPECT_EQ(count(fp32, "ReduceSum"), 0);
  EXPECT_EQ(count(fp32, "SoftmaxCrossEntropyLoss"), 0);
  EXPECT_EQ(only(fp32, "SoftmaxCrossEntropyLossGrad").outputCount(), 3u);
}

} // namespace
