#include "ir/ops/collectives.hpp"
#include "ir/ops/families.hpp"
#include "ir/ops/multiconv.hpp"
#include "ir/ops/graphcore.hpp"

#include <mutex>

namespace popart::ir {

void registerBuiltinOps() {
  static std::once_flag once;
  std::call_once(once, [] {
    OpRegistry &r = OpRegistry::instance();
    registerElementwiseOps(r);
    registerMatMulOps(r);
    registerShapeOps(r);
    registerReduceOps(r);
    registerConvPoolOps(r);
    registerNormOps(r);
    registerSoftmaxOps(r);
    registerGatherScatterOps(r);
    registerLossOps(r);
    registerMiscOps(r);
    registerResizeOps(r);
    registerSignalOps(r);
    registerRnnOps(r);
    registerDetectionOps(r);
    registerStringOps(r);
    registerTrainingOps(r);
    registerVarUpdateOps(r);
    registerConvGradOps(r);
    registerActGradOps(r);
    registerControlFlowOps(r);
    registerSequenceOps(r);
    registerCollectiveOps(r);
    registerMultiConvOps(r);
    registerGraphcoreOps(r);
  });
}

} // namespace popart::ir
