// Measures the matmul rates of oneDNN on this machine: an N x N x N dnnl::matmul (default 2048),
// one warm-up run, then the median of R timed runs (default 10), in fp32, then with bf16 operands
// into bf16 and into f32, and with f16 operands (fp32 accumulation inside oneDNN for 16-bit).
//
// Usage: matmul_peak [--size N] [--reps R] [--threads T]   (T = 0: OpenMP's default)
// Prints a header naming the CPU (lscpu's model name and its 16-bit ISA flags) and the oneDNN
// version, then one line per type, fp32 first (bench/compare reads the first GFLOP/s):
// "matmul N^3 fp32: median X ms over R runs, Y GFLOP/s (T threads) [implementation]", and for a
// type oneDNN has no implementation of, "matmul N^3 f16->f16: no oneDNN implementation".
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

/// "Model name" from lscpu, and which of the 16-bit matmul ISA flags the CPU has.
static std::string cpuDescription() {
  std::string model = "unknown CPU", flags;
  if (std::unique_ptr<FILE, int (*)(FILE *)> p(popen("lscpu 2>/dev/null", "r"), pclose); p) {
    char line[8192];
    while (std::fgets(line, sizeof line, p.get())) {
      std::string l(line);
      auto value = [&] {
        std::string v = l.substr(l.find(':') + 1);
        v.erase(0, v.find_first_not_of(" \t"));
        while (!v.empty() && (v.back() == '\n' || v.back() == ' '))
          v.pop_back();
        return v;
      };
      if (l.rfind("Model name:", 0) == 0) model = value();
      if (l.rfind("Flags:", 0) == 0) flags = " " + value() + " ";
    }
  }
  std::string isa;
  for (const char *f : {"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"})
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) isa += std::string(isa.empty() ? "" : ", ") + f;
  return model + " (" + (isa.empty() ? "no 16-bit matmul ISA flags" : isa) + ")";
}

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
    if (!std::strcmp(argv[i], "--size"))
      n = value("--size");
    else if (!std::strcmp(argv[i], "--reps"))
      reps = value("--reps");
    else if (!std::strcmp(argv[i], "--threads"))
      threads = value("--threads");
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
  const dnnl_version_t *v = dnnl_version();
  std::printf("# CPU: %s; oneDNN %d.%d.%d\n", cpuDescription().c_str(), v->major, v->minor, v->patch);

  std::vector<float> a(n * n), b(n * n);
  for (long i = 0; i < n * n; ++i) {
    a[i] = float(i % 7) * 0.25f - 0.75f;
    b[i] = float(i % 5) * 0.5f - 1.0f;
  }
  struct Way {
    const char *name;
    dt in, out;
  };
  for (const Way &way :
       {Way{"fp32", dt::f32, dt::f32}, Way{"bf16->bf16", dt::bf16, dt::bf16}, Way{"bf16->f32", dt::bf16, dt::f32},
        Way{"f16->f16", dt::f16, dt::f16}, Way{"f16->f32", dt::f16, dt::f32}}) {
    dnnl::memory::desc mdIn({n, n}, way.in, tag::ab), mdOut({n, n}, way.out, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(mdIn, mdIn, mdOut), engine, true);
    if (!pd) {
      std::printf("matmul %ld^3 %s: no oneDNN implementation\n", n, way.name);
      continue;
    }
    dnnl::matmul mm(pd);
    // The operands converted to the measured type by oneDNN's own reorders.
    dnnl::memory::desc mdF32({n, n}, dt::f32, tag::ab);
    dnnl::memory fa(mdF32, engine, a.data()), fb(mdF32, engine, b.data());
    dnnl::memory ma(mdIn, engine), mb(mdIn, engine), mc(mdOut, engine);
    dnnl::reorder(fa, ma).execute(stream, fa, ma);
    dnnl::reorder(fb, mb).execute(stream, fb, mb);
    stream.wait();
    auto run = [&] {
      mm.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
      stream.wait();
    };
    run(); // warm-up: page faults, JIT, thread pool start
    std::vector<double> ms;
    for (long r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      run();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    double median = reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
    double gflops = 2.0 * double(n) * double(n) * double(n) / (median * 1e-3) / 1e9;
    std::printf("matmul %ld^3 %s: median %.3f ms over %ld runs, %.2f GFLOP/s (%d threads) [%s]\n", n, way.name, median,
                reps, gflops, omp_get_max_threads(), pd.impl_info_str());
    std::fflush(stdout);
  }
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
