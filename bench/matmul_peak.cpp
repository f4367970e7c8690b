// Measures the fp32 matmul rate of oneDNN on this machine: an N x N x N dnnl::matmul (default
// 2048), one warm-up run, then the median of R timed runs (default 10).
//
// Usage: matmul_peak [--size N] [--reps R] [--threads T]   (T = 0: OpenMP's default)
// Prints "matmul N^3 fp32: median X ms over R runs, Y GFLOP/s (T threads)".
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

static int runMain(int argc, char **argv) {
  long n = 2048, reps = 10, threads = 0;
  for (int i = 1; i < argc; ++i) {
    auto value = [&](const char *flag) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "matmul_peak: %s needs a value\n", flag);
        std::exit(2);
      }
      return std::strtol(argv[++i], nullptr, 10);
    };
    if (!std::strcmp(argv[i], "--size")) n = value("--size");
    else if (!std::strcmp(argv[i], "--reps")) reps = value("--reps");
    else if (!std::strcmp(argv[i], "--threads")) threads = value("--threads");
    else {
      std::fprintf(stderr, "usage: matmul_peak [--size N] [--reps R] [--threads T]\n");
      return 2;
    }
  }
  if (n <= 0 || reps <= 0 || threads < 0) {
    std::fprintf(stderr, "matmul_peak: --size and --reps must be positive, --threads >= 0\n");
    return 2;
  }
  if (threads > 0) omp_set_num_threads(static_cast<int>(threads));

  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  dnnl::memory::desc md({n, n}, dt::f32, tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), engine);
  dnnl::matmul mm(pd);

  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (long i = 0; i < n * n; ++i) {
    a[i] = float(i % 7) * 0.25f - 0.75f;
    b[i] = float(i % 5) * 0.5f - 1.0f;
  }
  dnnl::memory ma(md, engine, a.data()), mb(md, engine, b.data()), mc(md, engine, c.data());
  auto run = [&] {
    mm.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    stream.wait();
  };
  run();  // warm-up: page faults, JIT, thread pool start
  std::vector<double> ms;
  for (long r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  double median = reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
  double gflops = 2.0 * double(n) * double(n) * double(n) / (median * 1e-3) / 1e9;
  std::printf("matmul %ld^3 fp32: median %.3f ms over %ld runs, %.2f GFLOP/s (%d threads)\n", n, median, reps, gflops,
              omp_get_max_threads());
  return 0;
}

int main(int argc, char **argv) {
  try {
    return runMain(argc, argv);
  } catch (const std::exception &e) { // oneDNN refused the primitive or memory ran out
    std::fprintf(stderr, "matmul_peak: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "matmul_peak: unknown exception\n");
  }
  return 1;
}
