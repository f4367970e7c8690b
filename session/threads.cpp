#include "session/threads.hpp"

#include <omp.h>
#include <thread>

namespace popart {
void setThreadCount(int threads) {
  int n = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(n);
}
int threadCount() { return omp_get_max_threads(); }
} // namespace popart
