// The session's record of the MatMul and Gemm ways chosen by timing.

#include "backend_cpu/dnnl/matmul_tuning.hpp"

namespace popart::backend_cpu::matmul_tuning {

MatMulOperands tunedWay(const KernelContext &context, const std::string &key,
                        const std::function<MatMulOperands()> &decide) {
  return context.matmulTuning ? context.matmulTuning->choose(key, decide) : decide();
}

bool unblocked(const dnnl::memory::desc &md) {
  return md.data.format_kind == dnnl_blocked && md.data.format_desc.blocking.inner_nblks == 0;
}

} // namespace popart::backend_cpu::matmul_tuning
