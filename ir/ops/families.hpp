#pragma once
// One registration function per op family (ir/ops/<family>.cpp).

#include "ir/op.hpp"

namespace popart::ir {

void registerElementwiseOps(OpRegistry &registry);
void registerMatMulOps(OpRegistry &registry);
void registerShapeOps(OpRegistry &registry);
void registerReduceOps(OpRegistry &registry);
void registerConvPoolOps(OpRegistry &registry);
void registerNormOps(OpRegistry &registry);
void registerSoftmaxOps(OpRegistry &registry);
void registerGatherScatterOps(OpRegistry &registry);
void registerLossOps(OpRegistry &registry);
void registerMiscOps(OpRegistry &registry);
void registerResizeOps(OpRegistry &registry);
void registerSignalOps(OpRegistry &registry);
void registerRnnOps(OpRegistry &registry);
void registerDetectionOps(OpRegistry &registry);
void registerStringOps(OpRegistry &registry);
void registerTrainingOps(OpRegistry &registry);
void registerVarUpdateOps(OpRegistry &registry);
void registerConvGradOps(OpRegistry &registry);
void registerActGradOps(OpRegistry &registry);
void registerControlFlowOps(OpRegistry &registry);
void registerSequenceOps(OpRegistry &registry);

} // namespace popart::ir
