// Fast optimiser updates: the f32 Adam / AdamW step (AdamUpdate in mode "adam") through
// vec::adamStep, built for AVX2 and AVX-512 (sqrt and divide): built for baseline x86-64, as the
// reference is, it ran BERT's AdamW at 13.5 GB/s, compute-bound; this host moves about 34 GB/s.
// Like the reference kernel it splits into ranges (Kernel::rangeElements) that the plan merges
// across weights into one parallel step.

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/update_kernel.hpp"

#include <algorithm>
#include <cmath>

namespace popart::backend_cpu {

namespace {

bool floatInputs(const ir::Op &op) {
  for (const ir::Tensor *t : op.inputs)
    if (t && t->info().dataType() != DataType::FLOAT) return false;
  return true;
}

Support supportsAdam(const ir::Op &op) {
  if (!floatInputs(op)) return Support::no("not f32");
  if (op.attrs.getString("mode", "adam") != "adam") return Support::no("the fast kernel runs mode adam only");
  if (!op.hasOutput(1) || !op.hasOutput(2)) return Support::no("without both moments");
  return Support::yes();
}

/// AdamUpdate in mode "adam": hp = [lr, beta1, beta2, eps, weightDecay, 1-beta1^t, 1-beta2^t,
/// maxWeightNorm]; decoupled: weight decay as AdamW (1) or as L2 on the gradient (0). Large
/// updates are split into chunks over the threads; the plan may merge it with others through
/// runRange.
class FastAdamKernel : public UpdateKernel {
public:
  explicit FastAdamKernel(const ir::Op &op) : UpdateKernel(op), decoupled_(op.attrs.getInt("decoupled", 1) != 0) {}
  void runRange(const KernelArgs &a, int64_t begin, int64_t end) override {
    const float *hp = a.in<float>(2);
    const float lr = hp[0], b1 = hp[1], b2 = hp[2], eps = hp[3], wd = hp[4], bc1 = hp[5], bc2 = hp[6];
    const float gs = *a.in<float>(3), l2 = decoupled_ ? 0.0f : wd;
    const float stepSize = lr / bc1, bc2Sqrt = std::sqrt(bc2), decay = decoupled_ ? 1.0f - lr * wd : 1.0f;
    vec::adamStep(a.in<float>(1) + begin, a.out<float>(0) + begin, a.out<float>(1) + begin, a.out<float>(2) + begin,
                  end - begin, gs, l2, b1, b2, decay, stepSize, bc2Sqrt, eps);
  }

private:
  bool decoupled_;
};

} // namespace

void registerFastVarUpdateKernels(KernelRegistry &r) {
  r.add({"ai.graphcore", "AdamUpdate", KernelProvider::Fast, supportsAdam, makeKernel<FastAdamKernel>});
}

} // namespace popart::backend_cpu
