// Like plan_allocations, for backward graphs, which the ONNX node tests do not contain: fp32
// Conv, ConvTranspose, AveragePool, MaxPool, (Log)Softmax, LayerNormalization, activation and recurrent graphs with
// their gradients, after the training pipeline's fusions (session::fuseAfterGradients, so that
// fused kernels such as MaxPoolGrad applying a Relu's gradient are counted), are compiled and run twice,
// and the second run's heap allocations are counted per kernel. The grad-op steps must be
// oneDNN's (this checks their supports() too; except where a case says otherwise), with at most
// oneDNN's execution bookkeeping. And an fp16.32 MLP with its gradients, whose FLOAT16 products run
// many oneDNN executions per step.
// Usage: grad_allocations

#include "count_allocations.hpp"

#include "autodiff/autodiff.hpp"
#include "ir/passes/passes.hpp"
#include "ir/passes/precision.hpp"
#include "session/session_common.hpp"

#include <algorithm>
#include <iostream>

using namespace popart;
using Ints = std::vector<int64_t>;

namespace {

struct Case {
  std::string type;
  std::vector<Shape> shapes;
  std::vector<std::pair<std::string, ir::AttributeValue>> attrs;
  std::vector<float> consts = {}; ///< scalar constant inputs after the streamed ones (Clip's bounds)
  size_t outputs = 1;             ///< outputs of the op; only the first is differentiated
  int opset = 17;
  /// The grad ops run on oneDNN; false where the fast kernel's vectorised pass is preferred
  /// (a last-axis f32 SoftmaxGrad, rowSoftmaxGrad), which must allocate nothing either.
  bool dnnlGrads = true;
  /// oneDNN bookkeeping beyond the argument maps that a oneDNN step may allocate per run. oneDNN
  /// 2.6's RNN primitives allocate per execution in proportion to the sequence length (measured:
  /// an LSTM forward 1976 bytes at 5 steps and 5816 at 20, the same for 8× the batch and 16× the
  /// hidden size; forward_training and backward together about 750 bytes per step).
  long extraDnnlBytes = 0;
  /// A unary op applied to the first input before the op (Relu before MaxPool: the training
  /// fusion fuseMaxPoolGradRelu), and one applied to its first output after it (Relu after
  /// MatMul: fuseRelu); null for none.
  const char *before = nullptr;
  const char *after = nullptr;
  /// A training fusion the case is about: fails if the fused graph has no op carrying it.
  bool expectFusedRelu = false;
};

/// Returns the number of failures of \p c.
int check(const Case &c) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = c.opset;
  std::vector<TensorId> xs;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    xs.push_back(std::to_string(i));
    xs.back().insert(xs.back().begin(), 'x'); // not "x" + ...: GCC 12 warns falsely (-Wrestrict)
    g.addTensor(xs.back(), ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, c.shapes[i]));
    g.addInput(xs.back());
  }
  ir::Attributes a;
  for (const auto &[k, v] : c.attrs)
    a.set(k, v);
  std::vector<TensorId> ins = xs, outs{"y"};
  for (size_t i = 0; i < c.consts.size(); ++i) {
    ins.push_back(std::to_string(i));
    ins.back().insert(ins.back().begin(), 'c'); // not "c" + ...: GCC 12 warns falsely (-Wrestrict)
    g.addConst(ins.back(), TensorData::fromDoubles(DataType::FLOAT, {}, {c.consts[i]}));
  }
  for (size_t i = 1; i < c.outputs; ++i) {
    outs.push_back(std::to_string(i));
    outs.back().insert(outs.back().begin(), 'y');
  }
  if (c.before) {
    g.addOp(c.before, "", c.opset, "before", {}, {ins[0]}, {"pre"});
    ins[0] = "pre";
  }
  if (c.after) outs[0] = "mid";
  g.addOp(c.type, "", c.opset, "fwd", a, ins, outs);
  if (c.after) g.addOp(c.after, "", c.opset, "after", {}, {"mid"}, {"y"});
  ir::inferShapes(g, nullptr);
  for (const auto &id : autodiff::buildGradients(g, "y", xs))
    g.addOutput(id);
  ir::inferShapes(g, nullptr);
  session::fuseAfterGradients(g);
  if (c.expectFusedRelu) {
    bool fused = false;
    for (const auto &op : g.ops())
      fused = fused || op->fusion.relu();
    if (!fused) {
      std::cout << c.type << ": the training fusions left no op applying a Relu\n";
      return 1;
    }
  }
  backend_cpu::ExecutionPlan plan(g, {});
  plan.run();
  int failures = 0, gradSteps = 0;
  for (size_t s = 0; s < plan.stepCount(); ++s) {
    alloc_count::StepUse use = alloc_count::countStep(plan, s);
    const std::string &step = plan.stepNames()[s];
    bool gradOp = step.find("Grad ") != std::string::npos;
    gradSteps += gradOp;
    if (gradOp && !use.dnnl && c.dnnlGrads) {
      std::cout << c.type << ": " << step << " did not get the oneDNN kernel\n";
      ++failures;
    }
    if (use.dnnl ? use.bytes > use.allowance() + c.extraDnnlBytes : use.tooMuch()) {
      std::cout << c.type << ": " << step << " allocates " << use.bytes << " bytes per run\n";
      ++failures;
    }
  }
  if (gradSteps == 0) {
    std::cout << c.type << ": no grad-op step\n";
    ++failures;
  }
  return failures;
}

/// An MLP (x · w1 + b1, Relu, · w2) with FLOAT master weights, converted as fp16.32 converts it
/// (ir::convertPrecision before the gradients, the training fusions after), compiled and run
/// twice: the second run's FLOAT16 products, forward and gradient, must be the f16 kernel cut into
/// several blocks each (each block one oneDNN execution) and allocate no more than each
/// execution's bookkeeping; every other step as in check(). \returns the number of failures.
int checkHalfMlp() {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 17;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {1100, 512}));
  g.addInput("x");
  std::vector<TensorId> weights{"w1", "b1", "w2"};
  // B of the first product is more than the 4 MiB of f32 the kernel widens whole, and every product
  // (forward and gradient) more than one block of rows or columns.
  std::vector<Shape> shapes{{512, 2100}, {2100}, {2100, 10}};
  for (size_t i = 0; i < weights.size(); ++i) {
    ir::Tensor &w = g.addTensor(weights[i], ir::TensorKind::Variable, TensorInfo(DataType::FLOAT, shapes[i]));
    auto data = std::make_shared<TensorData>(TensorInfo(DataType::FLOAT, shapes[i]));
    for (int64_t e = 0; e < data->info().elementCount(); ++e)
      data->as<float>()[e] = static_cast<float>((e * 37 % 101) - 50) / 500.f;
    w.setData(std::move(data));
  }
  g.addOp("MatMul", "", 17, "mm1", {}, {"x", "w1"}, {"h"});
  g.addOp("Add", "", 17, "bias1", {}, {"h", "b1"}, {"hb"});
  g.addOp("Relu", "", 17, "relu1", {}, {"hb"}, {"r"});
  g.addOp("MatMul", "", 17, "mm2", {}, {"r", "w2"}, {"y"});
  g.addOutput("y");
  ir::inferShapes(g, nullptr);
  ir::PrecisionPolicy policy;
  policy.low = DataType::FLOAT16;
  ir::convertPrecision(g, policy, g.outputs());
  ir::inferShapes(g, nullptr);
  for (const auto &id : autodiff::buildGradients(g, "y", weights))
    g.addOutput(id);
  ir::inferShapes(g, nullptr);
  session::fuseAfterGradients(g);
  backend_cpu::ExecutionPlan plan(g, {});
  for (int64_t e = 0; e < 1100 * 512; ++e)
    static_cast<float *>(plan.address("x"))[e] = static_cast<float>(e % 13) / 13.f;
  plan.run();
  int failures = 0, halfProducts = 0;
  long mostExecutions = 0, mostBytes = 0;
  for (size_t s = 0; s < plan.stepCount(); ++s) {
    alloc_count::StepUse use = alloc_count::countStep(plan, s);
    const std::string &step = plan.stepNames()[s];
    if (plan.stepKernels()[s].find("fp32 blocks of") != std::string::npos) {
      ++halfProducts;
      mostExecutions = std::max(mostExecutions, use.executions);
      mostBytes = std::max(mostBytes, use.bytes);
      if (use.executions < 2) {
        std::cout << "fp16.32 MLP: " << step << " ran " << use.executions
                  << " oneDNN executions, expected several blocks (" << plan.stepKernels()[s] << ")\n";
        ++failures;
      }
    }
    if (use.tooMuch()) {
      std::cout << "fp16.32 MLP: " << step << " allocates " << use.bytes << " bytes in " << use.allocations
                << " allocations per run (" << use.executions << " oneDNN executions)\n";
      ++failures;
    }
  }
  std::cout << "fp16.32 MLP: " << halfProducts << " FLOAT16 product steps, up to " << mostExecutions
            << " oneDNN executions and " << mostBytes << " bytes allocated per step\n";
  // mm1 and mm2 forward, and the gradients of w1, w2 and r.
  if (halfProducts < 5) {
    std::cout << "fp16.32 MLP: " << halfProducts << " steps on the FLOAT16 MatMul kernel, expected at least 5\n";
    ++failures;
  }
  return failures;
}

} // namespace

int main() {
  if (!alloc_count::countsEveryForm()) return 1;
  int failures = 0;
  failures += check({"Conv", {{4, 8, 12, 12}, {16, 8, 3, 3}, {16}}, {{"pads", Ints{1, 1, 1, 1}}}});
  failures += check({"Conv", {{2, 6, 9, 8}, {6, 2, 3, 2}}, {{"group", int64_t{3}}, {"strides", Ints{2, 1}}}});
  failures +=
      check({"ConvTranspose", {{2, 4, 5, 5}, {4, 3, 3, 3}}, {{"strides", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}}});
  failures += check({"AveragePool",
                     {{2, 3, 9, 10}},
                     {{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}}});
  failures += check({"MaxPool",
                     {{2, 3, 9, 10}},
                     {{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}}});
  failures += check({"MaxPool", {{2, 3, 9}}, {{"kernel_shape", Ints{2}}, {"dilations", Ints{2}}}});
  for (const char *t : {"Softmax", "LogSoftmax"}) {
    failures += check({t, {{8, 10, 12}}, {{"axis", int64_t{1}}}});
    // Opset 11 flattens to 2-D: the gradient is over the last axis, a row pass for SoftmaxGrad.
    failures += check({t, {{8, 10, 12}}, {{"axis", int64_t{1}}}, {}, 1, 11, std::string(t) == "LogSoftmax"});
    failures += check({t, {{8, 10, 12}}, {{"axis", int64_t{-1}}}, {}, 1, 17, std::string(t) == "LogSoftmax"});
  }
  failures += check({"LayerNormalization", {{4, 6, 32}, {32}, {32}}, {}});
  failures += check({"LayerNormalization", {{4, 6, 32}, {6, 32}}, {{"axis", int64_t{1}}}, {}, 3}); // saved stats
  for (const char *t : {"Relu", "Elu", "Tanh", "Sigmoid", "Exp", "Sqrt", "LeakyRelu", "Abs"})
    failures += check({t, {{4, 8, 9}}, {}});
  failures += check({"Clip", {{4, 8, 9}}, {}, {-0.5f, 0.75f}});
  // Recurrent ops (X, W, R, B): the grad kernel runs forward_training and backward. 5 steps,
  // so up to 1024 bytes per step more (see extraDnnlBytes).
  const long rnnBytes = 5 * 1024;
  failures += check({"LSTM",
                     {{5, 3, 4}, {2, 24, 4}, {2, 24, 6}, {2, 48}},
                     {{"direction", std::string("bidirectional")}},
                     {},
                     3,
                     14,
                     true,
                     rnnBytes});
  failures += check({"GRU",
                     {{3, 5, 4}, {1, 18, 4}, {1, 18, 6}, {1, 36}},
                     {{"linear_before_reset", int64_t{1}}, {"layout", int64_t{1}}},
                     {},
                     2,
                     14,
                     true,
                     rnnBytes});
  failures += check({"GRU", {{5, 3, 4}, {1, 18, 4}, {1, 18, 6}, {1, 36}}, {}, {}, 2, 14, true, rnnBytes});
  failures += check({"RNN",
                     {{5, 3, 4}, {1, 6, 4}, {1, 6, 6}, {1, 12}},
                     {{"direction", std::string("reverse")}},
                     {},
                     2,
                     14,
                     true,
                     rnnBytes});
  // Training fusions: MaxPoolGrad applies the gradient of the Relu its pool read (a fast kernel
  // for tiling windows, so not oneDNN's); a MatMul applies the Relu after it.
  Case reluPool{"MaxPool", {{2, 4, 8, 8}}, {{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}}};
  reluPool.before = "Relu";
  reluPool.dnnlGrads = false;
  reluPool.expectFusedRelu = true;
  failures += check(reluPool);
  Case matmulRelu{"MatMul", {{6, 8}, {8, 5}}, {}};
  matmulRelu.after = "Relu";
  matmulRelu.expectFusedRelu = true;
  failures += check(matmulRelu);
  failures += checkHalfMlp();
  std::cout << "grad allocations: " << failures << " failures\n";
  return failures == 0 ? 0 : 1;
}
