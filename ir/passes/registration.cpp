// registerIrPasses: the ir library's pass families, each registering its passes from its own file.

#include "ir/passes/pass_manager.hpp"

#include <mutex>

namespace popart::ir {

void registerShapeInferencePasses(PassRegistry &r);
void registerDeadCodePasses(PassRegistry &r);
void registerUnrollPasses(PassRegistry &r);
void registerDecompositionPasses(PassRegistry &r);
void registerInferenceDropoutPasses(PassRegistry &r);
void registerMatMulTransposePasses(PassRegistry &r);
void registerMatMulFusionPasses(PassRegistry &r);
void registerReluFusionPasses(PassRegistry &r);
void registerConvFusionPasses(PassRegistry &r);
void registerChannelShufflePasses(PassRegistry &r);
void registerLossFusionPasses(PassRegistry &r);
void registerRecurrentStatePasses(PassRegistry &r);
void registerPrecisionPasses(PassRegistry &r);
void registerRecomputeCastPasses(PassRegistry &r);
void registerPipelineStagePasses(PassRegistry &r);
void registerRecomputePasses(PassRegistry &r);

void registerIrPasses() {
  static std::once_flag once;
  std::call_once(once, [] {
    PassRegistry &r = PassRegistry::instance();
    registerShapeInferencePasses(r);
    registerDeadCodePasses(r);
    registerUnrollPasses(r);
    registerDecompositionPasses(r);
    registerInferenceDropoutPasses(r);
    registerMatMulTransposePasses(r);
    registerMatMulFusionPasses(r);
    registerReluFusionPasses(r);
    registerConvFusionPasses(r);
    registerChannelShufflePasses(r);
    registerLossFusionPasses(r);
    registerRecurrentStatePasses(r);
    registerPrecisionPasses(r);
    registerRecomputeCastPasses(r);
    registerPipelineStagePasses(r);
    registerRecomputePasses(r);
  });
}

} // namespace popart::ir
