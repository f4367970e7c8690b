// Registers the passes of the ir library with the pass manager: name, purpose and needs.

#include "core/log.hpp"
#include "ir/ops/rnn.hpp"
#include "ir/passes/pass_manager.hpp"
#include <popart/error.hpp>

#include <mutex>

namespace popart::ir {

namespace {

/// An optional rewrite of the fused-kernel kind, run where its needs hold.
Pass fusion(std::string name, std::string purpose, unsigned needs, std::function<int(Graph &, PassContext &)> run) {
  Pass p;
  p.name = std::move(name);
  p.purpose = std::move(purpose);
  p.needs = ShapesInferred | needs;
  p.optional = true;
  p.run = std::move(run);
  return p;
}

} // namespace

void registerIrPasses() {
  static std::once_flag once;
  std::call_once(once, [] {
    PassRegistry &r = PassRegistry::instance();
    Pass infer;
    infer.name = "inferShapes";
    infer.purpose = "runs every op's setup in schedule order, folding ops whose inputs are all constant";
    infer.establishes = ShapesInferred;
    infer.run = [](Graph &g, PassContext &c) {
      inferShapes(g, c.folder);
      return 0;
    };
    r.add(infer);

    Pass dead;
    dead.name = "removeDeadCode";
    dead.purpose = "removes ops nothing kept reads and makes the kept tensors (outputs, anchors, loss) the outputs";
    dead.needs = ShapesInferred;
    dead.establishes = OutputsFixed;
    dead.run = [](Graph &g, PassContext &c) {
      for (const auto &id : c.keep)
        if (!g.hasTensor(id)) throw error("removeDeadCode: kept tensor '", id, "' is not a tensor of the graph");
      size_t before = g.ops().size();
      // Outputs first, so that a model output nothing keeps goes with its producer.
      if (!c.keep.empty()) g.setOutputs(c.keep); // anchors keep their buffers to the end of the run
      removeDeadCode(g, c.keep);
      return static_cast<int>(before - g.ops().size());
    };
    r.add(dead);

    Pass unroll;
    unroll.name = "unrollControlFlow";
    unroll.purpose = "replaces the If, Loop and Scan ops the loss depends on by the ops they run, where it can";
    unroll.needs = ShapesInferred;
    unroll.before = GradientsBuilt;
    unroll.establishes = ControlFlowUnrolled;
    unroll.run = [](Graph &g, PassContext &c) {
      if (c.loss.empty() || !g.hasTensor(c.loss)) return 0;
      int unrolled = unrollControlFlow(g, {c.loss}, c.state<UnrollOptions>());
      if (unrolled > 0) {
        logging::logger().info("unrolled {} If, Loop and Scan ops for the backward graph", unrolled);
        inferShapes(g, c.folder);
      }
      return unrolled;
    };
    r.add(unroll);

    // Before autodiff, so that the fused ops' gradient rules apply.
    Pass ln = fusion("fuseLayerNorm", "the LayerNorm decomposition of opsets < 17 as one LayerNormalization", 0,
                     [](Graph &g, PassContext &c) { return fuseLayerNorm(g, c.training, c.keep); });
    ln.before = GradientsBuilt;
    r.add(ln);
    Pass gelu = fusion("fuseGelu", "exact GELU's Div/Erf/Add/Mul/Mul as one ai.graphcore Gelu", 0,
                       [](Graph &g, PassContext &c) { return fuseGelu(g, c.keep); });
    gelu.before = GradientsBuilt;
    r.add(gelu);
    Pass dropout = fusion("inferenceDropoutAsIdentity",
                          "a Dropout that does not train and whose mask nothing reads becomes an Identity (a view)", 0,
                          [](Graph &g, PassContext &) { return inferenceDropoutAsIdentity(g); });
    dropout.before = TrainingPrepared;
    r.add(dropout);

    // After autodiff in training (dead code removed then), on the final graph in inference.
    r.add(fusion("foldTransposesIntoMatMul",
                 "MatMuls read transposed operands and write transposed products through "
                 "strides (popart_transA/B, popart_permA/B/Y)",
                 OutputsFixed, [](Graph &g, PassContext &) { return foldTransposesIntoMatMul(g); }));
    r.add(fusion("fuseMaxPoolGradRelu", "MaxPoolGrad applies the gradient of the Relu its pool read",
                 OutputsFixed | GradientsBuilt, [](Graph &g, PassContext &) { return fuseMaxPoolGradRelu(g); }));
    r.add(fusion("fuseMatMulBias", "a MatMul adds the [N] bias of the Add that is its only reader (popart_bias)",
                 OutputsFixed, [](Graph &g, PassContext &) { return fuseMatMulBias(g); }));
    r.add(fusion("fuseMatMulScale", "a MatMul applies a constant Mul or Div of its product (popart_scale)",
                 OutputsFixed, [](Graph &g, PassContext &) { return fuseMatMulScale(g); }));
    r.add(fusion("foldBatchNormIntoConv",
                 "inference BatchNormalization with constant statistics folded into the Conv before it", OutputsFixed,
                 [](Graph &g, PassContext &) { return foldBatchNormIntoConv(g); }));
    r.add(fusion("fuseBatchNormRelu", "BatchNormalization applies the Relu that is its only reader", OutputsFixed,
                 [](Graph &g, PassContext &) { return fuseBatchNormRelu(g); }));
    r.add(fusion("fuseConvResidual", "a Conv adds the other input of the Add that is its only reader (before fuseRelu)",
                 OutputsFixed, [](Graph &g, PassContext &) { return fuseConvResidual(g); }));
    r.add(fusion("fuseRelu", "a MatMul or Gemm (and in inference a Conv) applies the Relu that is its only reader",
                 OutputsFixed, [](Graph &g, PassContext &c) { return fuseRelu(g, !c.training); }));
    r.add(fusion("fuseConvActivation", "a Conv applies ReLU6, HardSigmoid, HardSwish, Sigmoid or SiLU as post-ops",
                 OutputsFixed, [](Graph &g, PassContext &) { return fuseConvActivation(g); }));
    r.add(fusion("fuseHardSwish", "x·HardSigmoid(x; 1/6, 1/2) as one HardSwish", OutputsFixed,
                 [](Graph &g, PassContext &) { return fuseHardSwish(g); }));
    r.add(fusion("fuseChannelShuffle",
                 "ShuffleNet's Concat/Reshape/Transpose/Reshape (and chunks) as one ChannelShuffle", OutputsFixed,
                 [](Graph &g, PassContext &) { return fuseChannelShuffle(g); }));
    r.add(fusion("fuseMatMulResidual",
                 "a MatMul adds the other input of the Add or Sum that is its only reader (last MatMul fusion)",
                 OutputsFixed, [](Graph &g, PassContext &) { return fuseMatMulResidual(g); }));
    r.add(fusion("fuseConvPool", "a Conv pools its result with the MaxPool that is its only reader", OutputsFixed,
                 [](Graph &g, PassContext &) { return fuseConvPool(g); }));
    r.add(fusion("fuseLossGradClassSums",
                 "SoftmaxCrossEntropyLossGrad also writes the class sums of its gradient (the output bias gradient)",
                 OutputsFixed | GradientsBuilt, [](Graph &g, PassContext &) { return fuseLossGradClassSums(g); }));
    r.add(fusion("fuseLossWithGradient",
                 "SoftmaxCrossEntropyLossGrad also writes the loss, so the forward loss op goes",
                 OutputsFixed | GradientsBuilt, [](Graph &g, PassContext &) { return fuseLossWithGradient(g); }));
    r.add(fusion("saveRecurrentState",
                 "LSTM, GRU and RNN keep oneDNN's workspace for their grad ops instead of recomputing the forward",
                 OutputsFixed | GradientsBuilt, [](Graph &g, PassContext &c) {
                   return c.recurrentSavedBytes ? saveRecurrentState(g, c.recurrentSavedBytes) : 0;
                 }));
  });
}

} // namespace popart::ir
