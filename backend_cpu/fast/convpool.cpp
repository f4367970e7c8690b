// Fast kernels: MaxPool over tiling windows (to be moved here from backend_cpu/reference/convpool.cpp).

#include "backend_cpu/kernel_families.hpp"

namespace popart::backend_cpu {

void registerFastConvPoolKernels(KernelRegistry &r) { (void)r; }

} // namespace popart::backend_cpu
