#pragma once
// One thread pool (OpenMP's, which oneDNN also uses) for every kernel.

namespace popart {
/// Sets the number of threads; 0 means every core.
void setThreadCount(int threads);
/// The number of threads kernels use.
int threadCount();
} // namespace popart
