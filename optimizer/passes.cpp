// applyOptimizer as a pass: the update ops of every weight buildGradients found a gradient for.

#include "optimizer/passes.hpp"
#include <popart/error.hpp>

#include <mutex>

namespace popart::optimizer {

void registerOptimizerPasses() {
  static std::once_flag once;
  std::call_once(once, [] {
    ir::PassRegistry::instance().add({
        .name = "applyOptimizer",
        .purpose = "per trained weight its state Variables and in-place update op; accumulation, clipping and the "
                   "finiteness check of dynamic loss scaling",
        .needs = ir::GradientsBuilt,
        .before = ir::OptimizerApplied,
        .establishes = ir::OptimizerApplied,
        .invalidates = ir::ShapesInferred, // shapes are inferred once more after it
        .run =
            [](ir::Graph &g, ir::PassContext &c) {
              OptimizerPassState &s = c.state<OptimizerPassState>();
              if (!s.optimizer) throw error("applyOptimizer: no optimiser given to the pipeline");
              const auto &weightGrads = c.state<ir::TrainingTensors>().weightGrads;
              s.applied = applyOptimizer(g, *s.optimizer, weightGrads, s.options);
              if (!s.applied.allFinite.empty()) c.keep.push_back(s.applied.allFinite);
              return static_cast<int>(s.applied.updates.size());
            },
    });
  });
}

} // namespace popart::optimizer
