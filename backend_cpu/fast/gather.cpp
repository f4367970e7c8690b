// Fast kernels of the indexing family: none. The reference's one vectorised loop, the add of
// ScatterND / ScatterElements rows (the embedding gradient), vectorises as well without the
// `omp simd` it had: GCC versions it for aliasing, and BERT-mini's embedding-gradient ScatterND
// took 1.10 ms either way (bench/ab_profile, shortest of 15 steps each).

#include "backend_cpu/kernel_families.hpp"

namespace popart::backend_cpu {

void registerFastGatherKernels(KernelRegistry &r) { (void)r; }

} // namespace popart::backend_cpu
