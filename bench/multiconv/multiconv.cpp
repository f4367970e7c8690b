// bench/multiconv: an Inception-style block (bench/multiconv/multiconv_model.hpp) with each stage
// of convolutions as one ai.graphcore MultiConv against the same convolutions as separate Conv
// nodes, forward (inference) and training step (SGD), on the same threads. The two run
// interleaved, run by run, and the medians are compared. Prints the CPU, the plans MultiConv's
// kernels chose, both times and the ratio; asserts nothing about time.
//
// The bound lines put the ratio in context: the separate Convs' block also runs on one thread
// (interleaved with the others), and T1 / threads is what a perfect split of that work would take;
// cores do not give a perfect split, so the machine's own speed-up S on compute-bound work (one
// large convolution, 1 thread against --threads) bounds it too: speed-ups above (separate time) /
// (T1 / S) need more than scheduling the same kernels better (the block's other ops included).
// --profile prints each variant's per-op profile.
//
//   multiconv [--threads 2] [--batch 8] [--size 28] [--width 4] [--runs 30] [--profile] [--tiny]

#include "multiconv_model.hpp"

#include <popart/session.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace popart;

namespace {

struct Options {
  int threads = 2, runs = 30;
  bool profile = false;
  int64_t batch = 8, size = 28, width = 4;
};

/// "model name" of /proc/cpuinfo, the vector extensions oneDNN uses, and the CPU count.
std::string cpuSummary() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU", flags;
  int cpus = 0;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 && cpus++ == 0) model = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = line + " ";
  }
  std::string ext;
  for (const char *f : {"avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"})
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) ext += std::string(ext.empty() ? "" : " ") + f;
  return model + ", " + std::to_string(cpus) + " CPUs, " + (ext.empty() ? "no AVX2" : ext);
}

double medianMs(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// The explainKernels lines of the MultiConv ops.
std::string multiConvPlans(const std::string &explained) {
  std::istringstream in(explained);
  std::string line, out;
  while (std::getline(in, line))
    if (line.find("MultiConv") != std::string::npos) out += "  " + line + "\n";
  return out;
}

/// One variant's session, fed the same input each run.
struct Variant {
  std::unique_ptr<InferenceSession> infer;
  std::unique_ptr<TrainingSession> train;
  std::vector<float> x, y, loss;
  Shape xShape, yShape;
  std::vector<double> times;

  Variant(const Options &o, bool multi, bool training, int threads) {
    std::string model = multiconv_model::inceptionBlock(o.batch, o.size, o.width, multi);
    SessionOptions so;
    so.numThreads = threads;
    xShape = {o.batch, 192 * o.width / 4, o.size, o.size};
    yShape = {o.batch, 256 * o.width / 4, o.size, o.size};
    x.resize(static_cast<size_t>(xShape[0] * xShape[1] * xShape[2] * xShape[3]));
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<float>((i * 7919) % 2001) / 1000.0f - 1.0f;
    y.resize(static_cast<size_t>(yShape[0] * yShape[1] * yShape[2] * yShape[3]));
    loss.resize(1);
    if (training) {
      train = TrainingSession::createFromOnnxModel(model, DataFlow(1, {"loss"}), "loss", ConstSGD(0.001f), so);
      train->prepareDevice();
    } else {
      infer = InferenceSession::createFromOnnxModel(model, DataFlow(1, {"y"}), so);
      infer->prepareDevice();
    }
  }
  /// The large convolution of multiconv_model::largeConvolution on \p threads threads.
  Variant(const Options &o, int threads) {
    SessionOptions so;
    so.numThreads = threads;
    xShape = yShape = {o.batch, 256, 28, 28};
    x.assign(static_cast<size_t>(o.batch * 256 * 28 * 28), 0.5f);
    y.resize(x.size());
    infer = InferenceSession::createFromOnnxModel(multiconv_model::largeConvolution(o.batch), DataFlow(1, {"y"}), so);
    infer->prepareDevice();
  }
  double run() {
    NDArrayWrapper<float> xa(x.data(), xShape), ya(y.data(), yShape), la(loss.data(), {});
    auto start = std::chrono::steady_clock::now();
    if (train) {
      StepIO io({{"x", xa}}, {{"loss", la}});
      train->run(io);
    } else {
      StepIO io({{"x", xa}}, {{"y", ya}});
      infer->run(io);
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  std::string explain() const { return train ? train->explainKernels() : infer->explainKernels(); }
};

void compare(const Options &o, bool training, double scaling) {
  Variant multi(o, true, training, o.threads), separate(o, false, training, o.threads);
  Variant one(o, false, training, 1); // the bound's one-thread run
  std::vector<Variant *> variants{&multi, &separate};
  if (o.threads > 1) variants.push_back(&one);
  for (int w = 0; w < 3; ++w) // warm-up: first-touch of the arena, oneDNN's jit caches
    for (Variant *v : variants)
      v->run();
  for (int r = 0; r < o.runs; ++r) // interleaved, so that all see the same machine
    for (Variant *v : variants)
      v->times.push_back(v->run());
  double m = medianMs(multi.times), s = medianMs(separate.times);
  if (o.profile)
    for (Variant *v : {&multi, &separate}) {
      if (v->train)
        v->train->enableProfiling();
      else
        v->infer->enableProfiling();
      for (int r = 0; r < o.runs; ++r)
        v->run();
      std::printf("%s profile:\n%s\n", v == &multi ? "MultiConv" : "separate Convs",
                  (v->train ? v->train->profileSummary() : v->infer->profileSummary()).c_str());
    }
  std::printf("%s plans:\n%s", training ? "training" : "forward", multiConvPlans(multi.explain()).c_str());
  std::printf("| %s | %.2f | %.2f | %.2fx |\n", training ? "training" : "forward", s, m, s / m);
  if (o.threads > 1) {
    double t1 = medianMs(one.times);
    std::printf("bound: separate Convs on 1 thread %.2f ms, %.2fx faster on %d; a perfect split of that work would "
                "take %.2f ms: at most %.2fx over the separate Convs from scheduling alone\n",
                t1, t1 / s, o.threads, t1 / o.threads, s / (t1 / o.threads));
    if (scaling > 0)
      std::printf("bound at this machine's %.2fx on %d threads: %.2f ms, at most %.2fx\n", scaling, o.threads,
                  t1 / scaling, s / (t1 / scaling));
  }
  if (!training)
    std::printf("forward outputs %s\n",
                std::memcmp(multi.y.data(), separate.y.data(), multi.y.size() * sizeof(float)) == 0
                    ? "bitwise identical"
                    : "DIFFER");
  else
    std::printf("training losses %.9g (MultiConv) %.9g (separate)\n", static_cast<double>(multi.loss[0]),
                static_cast<double>(separate.loss[0]));
}

} // namespace

int main(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> int64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "multiconv: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::stoll(argv[++i]);
    };
    if (a == "--threads")
      o.threads = static_cast<int>(next());
    else if (a == "--runs")
      o.runs = static_cast<int>(next());
    else if (a == "--batch")
      o.batch = next();
    else if (a == "--size")
      o.size = next();
    else if (a == "--width")
      o.width = next();
    else if (a == "--profile")
      o.profile = true;
    else if (a == "--tiny") {
      o.runs = 2;
      o.batch = 2;
      o.size = 8;
      o.width = 1;
    } else {
      std::fprintf(stderr, "multiconv: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  std::printf("CPU: %s\n", cpuSummary().c_str());
  // Times on a machine that others load say little: print what the load was.
  std::ifstream loadavg("/proc/loadavg");
  std::string load;
  std::getline(loadavg, load);
  std::printf("load average (1, 5, 15 min): %s\n",
              load.substr(0, load.find(' ', load.find(' ', load.find(' ') + 1) + 1)).c_str());
  std::printf("Inception-style block: x [%lld, %lld, %lld, %lld], %d threads, median of %d interleaved runs\n",
              static_cast<long long>(o.batch), static_cast<long long>(192 * o.width / 4),
              static_cast<long long>(o.size), static_cast<long long>(o.size), o.threads, o.runs);
  std::printf("| step | separate Convs ms | MultiConv ms | speed-up |\n");
  try {
    double scaling = 0;
    if (o.threads > 1) { // the machine's speed-up on compute-bound work, interleaved as the rest
      Variant large1(o, 1), largeN(o, o.threads);
      for (int r = 0; r < std::max(3, o.runs / 3) + 1; ++r)
        for (Variant *v : {&large1, &largeN})
          if (r > 0) // the first run warms up
            v->times.push_back(v->run());
          else
            v->run();
      scaling = medianMs(large1.times) / medianMs(largeN.times);
      std::printf("machine: one 3x3 convolution [%lld, 256, 28, 28] -> 256 channels, %.2f ms on 1 thread, %.2f ms "
                  "on %d: %.2fx\n",
                  static_cast<long long>(o.batch), medianMs(large1.times), medianMs(largeN.times), o.threads, scaling);
    }
    compare(o, false, scaling);
    compare(o, true, scaling);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "multiconv: failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
