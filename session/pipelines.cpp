// The two pipelines, as lists of pass names (adding a pass: its file, and one line here).

#include "session/pipelines.hpp"
#include "autodiff/training_passes.hpp"
#include "autodiff/weights.hpp"
#include "optimizer/passes.hpp"
#include "optimizer/replication.hpp"

#include <iostream>
#include <sstream>

namespace popart::session {

const std::vector<std::string> &inferencePipeline() {
  static const std::vector<std::string> pipeline{
      "inferShapes",
      "expandGradientOps",
      "removeDeadCode",
      "inferenceDropoutAsIdentity",
      "assignPipelineStages", // pipelining: each op's stage, before the fusions join ops
      "splitPipelineStages",  // pipelining: this process's stage alone
      "fuseLayerNorm",
      "fuseGelu",
      "foldTransposesIntoMatMul",
      "fuseMatMulBias",
      "fuseMatMulScale",
      "foldBatchNormIntoConv", // first of the Conv fusions
      "fuseBatchNormRelu",
      "fuseConvResidual", // before fuseRelu: relu(conv + r)
      "fuseRelu",
      "fuseConvActivation", // ReLU6, hard swish, SiLU ... as Conv post-ops
      "fuseHardSwish",      // the hard swishes left
      "fuseChannelShuffle",
      "fuseMatMulResidual", // after bias, scale and Relu, which cannot follow it
      "convertPrecision",   // after the fusions, which match fp32 patterns (BatchNorm into Conv...)
      "fuseConvPool",       // after it: a 16-bit Conv keeps its pool apart (the pooled kernel is fp32)
      "foldCastIntoMatMul",
      "markHalfPartials",
  };
  return pipeline;
}

const std::vector<std::string> &trainingPipeline() {
  static const std::vector<std::string> pipeline{
      "inferShapes",
      "findLoss",
      "unrollControlFlow",
      "fuseLayerNorm", // before autodiff, so that the fused ops' gradient rules apply
      "fuseGelu",
      "convertPrecision", // before autodiff: gradients take the types of the forward tensors
      "seedDropout",
      "updateBatchNormStatistics",
      "findWeights",
      "scaleLoss",
      "assignPipelineStages", // pipelining: the forward ops' stages, which autodiff gives their gradients
      "buildGradients",
      "recompute",              // right after autodiff: it tells the forward ops from the backward ops by their ids
      "keepWeightGradientsLow", // before the optimiser: its update ops read the 16-bit gradients
      "splitPipelineStages",    // pipelining: this process's stage alone, before its weights get updates
      "allReduceGradients",     // after keepWeightGradientsLow: 16-bit gradients travel at their size
      "applyOptimizer",
      "allReduceAccumulatedGradients", // with accumulation: once per update, not per micro-batch
      "agreeAllFinite",
      "waitForBucketsAtTheirUpdates", // after agreeAllFinite, which decides whether Update may be skipped
      "inferShapes",
      "markHalfPartials", // after autodiff: the gradient products too
      "removeDeadCode",
      "foldTransposesIntoMatMul",
      "fuseMaxPoolGradRelu",
      "fuseBatchNormRelu",
      "fuseMatMulBias",
      "fuseMatMulScale",
      "fuseRelu",           // after the bias and scale; training Convs keep their plain kernels
      "fuseMatMulResidual", // last of the MatMul fusions, which cannot follow it
      "foldCastIntoMatMul",
      "fuseLossWithGradient",
      "foldLossCasts",         // after the loss joins its gradient, so that its Cast goes too
      "fuseLossGradClassSums", // after foldLossCasts: the class sums in the logits' type
      "saveRecurrentState",
      "recomputeCasts",      // it splits readers by their distance in the final schedule
      "markPipelineForward", // last: the forward ops as the other passes left them
  };
  return pipeline;
}

void registerAllPasses() {
  ir::registerIrPasses();
  autodiff::registerTrainingPasses();
  optimizer::registerOptimizerPasses();
  optimizer::registerReplicationPasses();
  autodiff::registerWeightPasses();
}

ir::PipelineOptions pipelineOptions(const SessionOptions &options) {
  ir::PipelineOptions po;
  po.disabled.insert(options.disabledPasses.begin(), options.disabledPasses.end());
  po.dumpAfter.insert(options.dumpIrAfter.begin(), options.dumpIrAfter.end());
  po.skipOptional = !options.fuseOps;
  if (options.verifyIr) po.verify = true;
  po.dump = [](const std::string &pass, const ir::Graph &graph) {
    std::cout << "IR after pass " << pass << ":\n" << graph.dump() << std::flush;
  };
  return po;
}

void checkPassOptions(const std::string &pipelineName, const std::vector<std::string> &pipeline,
                      const SessionOptions &options) {
  registerAllPasses();
  ir::checkPipeline(pipelineName, pipeline, pipelineOptions(options));
}

std::string describePipelines() {
  registerAllPasses();
  std::ostringstream os;
  auto describe = [&](const char *title, const std::vector<std::string> &pipeline) {
    os << title << " pipeline:\n";
    int i = 0;
    for (const auto &name : pipeline) {
      const ir::Pass &p = ir::PassRegistry::instance().get(name);
      os << "  " << ++i << ". " << name << (p.optional ? "" : " (required)") << ": " << p.purpose;
      if (p.needs) os << " [needs " << ir::stageNames(p.needs) << "]";
      if (p.before) os << " [before " << ir::stageNames(p.before) << "]";
      os << "\n";
    }
  };
  describe("inference", inferencePipeline());
  describe("training", trainingPipeline());
  return os.str();
}

} // namespace popart::session
