// popart-run: run an ONNX model from the shell.

#include "autodiff/autodiff.hpp"
#include "backend_cpu/kernel.hpp"
#include "cli/fashion_mnist.hpp"
#include "cli/replication.hpp"
#include "cli/train.hpp"
#include "core/dispatch.hpp"
#include "ir/op.hpp"
#include "onnx_import/onnx_import.hpp"
#include "session/npy.hpp"
#include "session/pipelines.hpp"
#include <popart/custom_op.hpp>
#include <popart/error.hpp>
#include <popart/logging.hpp>
#include <popart/session.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace popart;

namespace {

struct Options {
  std::string model;
  std::vector<std::string> inputs;
  std::string dataDir;
  std::string saveOutputs;
  int iterations = 0;
  int threads = 0;
  int64_t batch = 0;
  bool dumpIr = false;
  double rtol = 1e-3;
  double atol = 1e-7;
  unsigned seed = 0;
  std::string kernels = "any";
  std::string precision = "fp32";
  bool noFusion = false;
  std::vector<std::string> disabledPasses;
  std::vector<std::string> dumpIrAfter;
  bool verifyIr = false;
  std::string matmulTuning = "auto";
  int64_t convPoolChunk = 0;
  bool explainKernels = false;
  bool checkNumerics = false; ///< SessionOptions::enableFloatingPointChecks
  std::string profile;
  int64_t memoryLimit = 0; ///< SessionOptions::memoryLimitBytes
};

TensorData randomTensor(const TensorInfo &info, std::mt19937 &rng) {
  TensorData t(info);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<int> small(0, 3);
  dispatchAll(info.dataType(), "random input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < info.elementCount(); ++i) {
      if constexpr (std::is_same_v<T, bool>)
        t.as<T>()[i] = small(rng) & 1;
      else if constexpr (std::is_integral_v<T>)
        t.as<T>()[i] = static_cast<T>(small(rng));
      else
        t.as<T>()[i] = static_cast<T>(static_cast<compute_t<T>>(real(rng)));
    }
  });
  return t;
}

std::string firstValues(const TensorData &t, int64_t count = 8) {
  std::string s = "[";
  int64_t n = std::min(count, t.info().elementCount());
  if (t.info().dataType() == DataType::STRING) {
    for (int64_t i = 0; i < n; ++i)
      s += (i ? ", \"" : "\"") + t.strings()[static_cast<size_t>(i)] + "\"";
    return s + (t.info().elementCount() > n ? ", ...]" : "]");
  }
  for (int64_t i = 0; i < n; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", t.valueAsDouble(i));
    s += (i ? ", " : "") + std::string(buf);
  }
  if (t.info().elementCount() > n) s += ", ...";
  return s + "]";
}

struct Comparison {
  double worstAbs = 0, worstRel = 0;
  int64_t mismatches = 0;
};

Comparison compare(const TensorData &got, const TensorData &want, double rtol, double atol) {
  Comparison c;
  for (int64_t i = 0; i < want.info().elementCount(); ++i) {
    double g = got.valueAsDouble(i), w = want.valueAsDouble(i);
    if (std::isnan(w) && std::isnan(g)) continue;
    if (std::isinf(w) && g == w) continue;
    double diff = std::fabs(g - w);
    if (std::isnan(diff)) diff = INFINITY;
    c.worstAbs = std::max(c.worstAbs, diff);
    if (w != 0) c.worstRel = std::max(c.worstRel, diff / std::fabs(w));
    if (!(diff <= atol + rtol * std::fabs(w))) ++c.mismatches;
  }
  return c;
}

/// Where an IArray over \p t points: its bytes, or its std::string array for STRING tensors.
void *hostData(TensorData &t) {
  return t.info().dataType() == DataType::STRING ? static_cast<void *>(t.strings().data()) : t.data();
}

/// Runs the model once on \p feeds and returns every graph output.
std::map<TensorId, TensorData> runOnce(InferenceSession &session, std::map<TensorId, TensorData> &feeds) {
  std::vector<std::unique_ptr<RawArray>> arrays;
  std::map<TensorId, IArray &> in, out;
  for (auto &[id, t] : feeds) {
    arrays.push_back(std::make_unique<RawArray>(hostData(t), t.info().dataType(), t.info().shape()));
    in.emplace(id, *arrays.back());
  }
  // Shapes are known after the first run: run once with no outputs to compile.
  StepIO probe(in, {});
  session.run(probe);
  std::map<TensorId, TensorData> results;
  for (const auto &id : session.getOutputIds())
    results.emplace(id, TensorData(session.getInfo(id)));
  for (auto &[id, t] : results) {
    arrays.push_back(std::make_unique<RawArray>(hostData(t), t.info().dataType(), t.info().shape()));
    out.emplace(id, *arrays.back());
  }
  StepIO io(in, out);
  session.run(io);
  return results;
}

int runDataSet(InferenceSession &session, const fs::path &dir, const Options &opt) {
  std::map<TensorId, TensorData> feeds;
  auto inputs = session.getInputIds();
  for (size_t i = 0; i < inputs.size(); ++i) {
    fs::path p = dir / ("input_" + std::to_string(i) + ".pb");
    if (!fs::exists(p))
      throw error("test data folder '", dir.string(), "' has no ", p.filename().string(), " for input '", inputs[i],
                  "'");
    TensorData t = onnx_import::readTensorProtoFile(p.string());
    // ONNX 1.12's test data stores bfloat16 tensors as UINT16.
    if (t.info().dataType() == DataType::UINT16 && session.getInfo(inputs[i]).dataType() == DataType::BFLOAT16)
      t.reinterpretAs(DataType::BFLOAT16);
    feeds.emplace(inputs[i], std::move(t));
  }
  auto results = runOnce(session, feeds);
  auto outputs = session.getOutputIds();
  int status = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const TensorData &got = results.at(outputs[i]);
    std::cout << outputs[i] << ": " << got.info().toString() << " " << firstValues(got) << "\n";
    fs::path p = dir / ("output_" + std::to_string(i) + ".pb");
    if (!fs::exists(p)) continue;
    TensorData want = onnx_import::readTensorProtoFile(p.string());
    if (want.info().dataType() == DataType::UINT16 && got.info().dataType() == DataType::BFLOAT16)
      want.reinterpretAs(DataType::BFLOAT16);
    if (want.info() != got.info()) {
      std::cout << "  MISMATCH: expected " << want.info().toString() << ", got " << got.info().toString() << "\n";
      status = 1;
      continue;
    }
    if (want.info().dataType() == DataType::STRING) {
      bool same = want.strings() == got.strings();
      std::cout << (same ? "  strings equal  ok\n" : "  MISMATCH: strings differ\n");
      status |= same ? 0 : 1;
      continue;
    }
    Comparison c = compare(got, want, opt.rtol, opt.atol);
    std::cout << "  worst abs error " << c.worstAbs << ", worst rel error " << c.worstRel;
    if (c.mismatches) {
      std::cout << "  MISMATCH in " << c.mismatches << " of " << want.info().elementCount() << " elements (rtol "
                << opt.rtol << ", atol " << opt.atol << ")\n";
      status = 1;
    } else {
      std::cout << "  ok\n";
    }
  }
  return status;
}

int run(const Options &opt) {
  SessionOptions so;
  so.numThreads = opt.threads;
  so.batchSize = opt.batch;
  so.kernels = opt.kernels;
  so.precision = opt.precision;
  so.fuseOps = !opt.noFusion;
  so.disabledPasses = opt.disabledPasses;
  so.dumpIrAfter = opt.dumpIrAfter;
  so.verifyIr = opt.verifyIr;
  so.matmulTuning = opt.matmulTuning;
  so.convPoolChunk = opt.convPoolChunk;
  so.enableFloatingPointChecks = opt.checkNumerics;
  so.memoryLimitBytes = opt.memoryLimit;
  // The outputs' names come from a first session, gone before the one that runs is made (both
  // alive at once doubled the peak RSS).
  const std::vector<TensorId> outputs =
      InferenceSession::createFromOnnxModel(opt.model, DataFlow(1, std::vector<TensorId>{}), so)->getOutputIds();
  auto session = InferenceSession::createFromOnnxModel(opt.model, DataFlow(1, outputs), so);
  if (!opt.dataDir.empty()) {
    fs::path dir(opt.dataDir);
    if (!fs::is_directory(dir)) throw error("--data-dir '", opt.dataDir, "' is not a folder");
    std::vector<fs::path> sets;
    if (fs::exists(dir / "input_0.pb") || session->getInputIds().empty())
      sets.push_back(dir);
    else
      for (const auto &e : fs::directory_iterator(dir))
        if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
    std::sort(sets.begin(), sets.end());
    if (sets.empty()) throw error("--data-dir '", opt.dataDir, "' has neither input_0.pb nor test_data_set_* folders");
    int status = 0;
    for (const auto &s : sets) {
      std::cout << "data set " << s.string() << "\n";
      status |= runDataSet(*session, s, opt);
    }
    if (opt.dumpIr) std::cout << session->dumpIr();
    if (opt.explainKernels) std::cout << session->explainKernels();
    std::cout << (status ? "FAILED: outputs differ from the expected values\n" : "PASSED\n");
    return status;
  }
  std::map<TensorId, TensorData> feeds;
  for (const auto &spec : opt.inputs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) throw error("--input '", spec, "' must be NAME=FILE");
    std::string name = spec.substr(0, eq);
    auto ids = session->getInputIds();
    if (std::find(ids.begin(), ids.end(), name) == ids.end())
      throw error("--input names '", name, "', which is not an input of the model");
    feeds.emplace(name, cli::loadTensorFile(spec.substr(eq + 1), session->getInfo(name).dataType()));
  }
  std::mt19937 rng(opt.seed);
  for (const auto &id : session->getInputIds()) {
    if (feeds.count(id)) continue;
    TensorInfo info = session->getInfo(id);
    if (!info.isKnown())
      throw error("input '", id, "' has symbolic shape ", toString(info.shape()),
                  ": give it with --input or set --batch");
    feeds.emplace(id, randomTensor(info, rng));
  }
  auto results = runOnce(*session, feeds);
  if (opt.dumpIr) std::cout << session->dumpIr();
  if (opt.explainKernels) std::cout << session->explainKernels();
  for (const auto &id : session->getOutputIds()) {
    const TensorData &t = results.at(id);
    std::cout << id << ": " << toString(t.info().dataType()) << " " << toString(t.info().shape()) << " "
              << firstValues(t) << "\n";
    if (!opt.saveOutputs.empty()) {
      fs::create_directories(opt.saveOutputs);
      std::string safe = id;
      std::replace_if(
          safe.begin(), safe.end(),
          [](char c) { return !std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.'; }, '_');
      npy::write((fs::path(opt.saveOutputs) / (safe + ".npy")).string(), t);
    }
  }
  if (!opt.profile.empty()) {
    // The runs after the first (which compiled the plan) are profiled.
    session->enableProfiling();
    if (opt.iterations == 0) runOnce(*session, feeds);
  }
  if (opt.iterations > 0) {
    std::vector<std::unique_ptr<RawArray>> arrays;
    std::map<TensorId, IArray &> in, out;
    for (auto &[id, t] : feeds) {
      arrays.push_back(std::make_unique<RawArray>(hostData(t), t.info().dataType(), t.info().shape()));
      in.emplace(id, *arrays.back());
    }
    for (auto &[id, t] : results) {
      arrays.push_back(std::make_unique<RawArray>(hostData(t), t.info().dataType(), t.info().shape()));
      out.emplace(id, *arrays.back());
    }
    StepIO io(in, out);
    std::vector<double> ms;
    for (int i = 0; i < opt.iterations; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      session->run(io);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    double median = ms[ms.size() / 2];
    int64_t batch = 1;
    if (!session->getInputIds().empty()) {
      const Shape &s = feeds.at(session->getInputIds().front()).info().shape();
      if (!s.empty()) batch = s[0];
    }
    std::printf("latency: median %.3f ms, min %.3f ms, max %.3f ms over %d iterations\n", median, ms.front(), ms.back(),
                opt.iterations);
    std::printf("throughput: %.1f samples/s\n", batch * 1000.0 / median);
  }
  if (!opt.profile.empty()) {
    session->writeProfileTrace(opt.profile);
    std::cout << session->profileSummary() << "trace: " << opt.profile << "\n";
  }
  return 0;
}

/// The ai.graphcore opset-1 section after the table of docs/ops.md.
constexpr const char *kGraphcoreOpset1Notes =
    "\n## ai.graphcore opset 1\n\n"
    "PopART's own operators, imported from nodes of domain `ai.graphcore` (opset 1) with PopART's op "
    "types and attributes, and written by `Builder::aiGraphcoreOpset1()` (`groupnormalization`, "
    "`gelu`, `scale`, `subsample`, `detach`, `init`, `identityloss`, `nllloss`, `l1loss`, "
    "`printtensor`). Each has a gradient but Init (no inputs); the `*Grad` rows are the grad ops "
    "those gradients use.\n\n"
    "- `GroupNormalization` (X [N, C, ...], Scale [C], Bias [C]; `num_groups`, `epsilon` = 1e-5) -> Y, "
    "Mean and InvStdDev [N·num_groups]; group g holds channels [g·C/G, (g+1)·C/G) (PopART's default, "
    "torch.nn.GroupNorm's). Only Y is differentiable.\n"
    "- `Gelu`: the exact form 0.5·x·(1 + erf(x/√2)). PopART's Gelu is the tanh approximation (its "
    "GeluErf is the exact one); they differ by up to about 5e-4.\n"
    "- `Scale` (`scale`): x·scale. `Subsample` (`strides`, one per dimension): every strides[d]-th "
    "element from the first, ⌈n/stride⌉ of each dimension. `Detach`: the identity; no gradient flows "
    "through it.\n"
    "- `Init` (`shape`, `data_type`, `tensor_type`, `init_type`, optional `batch_axis`): a zero tensor. "
    "`data_type` is a popart::DataType value, which here are ONNX's numbers (FLOAT = 1), not PopART's "
    "enum; NoInit (0) gives zeros too, and the output is an ordinary tensor whatever its `tensor_type`.\n"
    "- Losses, `reduction` = `Sum`, `Mean` or `None` (PopART's spelling; `nllloss` and `l1loss` write "
    "PopART's node types `Nll` and `L1`): `IdentityLoss` (x itself), "
    "`L1` (`lambda`·|x|; Mean over every element), `Nll` (probabilities [..., C] with the classes last, "
    "integer labels [...]; −log(max(p, 1e-7)), or −p with `inputIsLogProbability`; labels equal to "
    "`ignoreIndex` count 0 and Mean divides by the labels not ignored, at least 1; a label out of range "
    "is an error naming its position).\n"
    "- `PrintTensor` (`print_gradient` = 1, `title`, `summariseThreshold` = 1000, `edgeItems` = 3): the "
    "identity, which logs its input at info level (`POPART_LOG_LEVEL=info`) as \"title TYPE[shape]: "
    "[values]\", and its gradient under \"title_gradient\" when `print_gradient` is 1. PopART's other "
    "format attributes are accepted and not used.\n";

/// The supported ops as a Markdown table, from the op and kernel registries (docs/ops.md).
void printOps() {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  std::map<std::pair<std::string, std::string>, std::vector<const ir::OpDef *>> byType;
  for (const auto &d : ir::OpRegistry::instance().all())
    byType[{d.domain, d.type}].push_back(&d);
  std::cout << "# Supported ops\n\nGenerated by `popart-run --list-ops` from the op, kernel and gradient "
               "registries; the `ops_doc` test fails when this file is out of date.\n\n"
               "- kernels: the forward kernels. oneDNN runs where its capability check accepts the shapes, "
               "types and attributes; else a fast kernel (vectorised f32 loops, `backend_cpu/fast/`) where "
               "one exists and accepts them; the reference kernel (plain loops, the oracle the others are "
               "tested against) runs otherwise, and under `--kernels reference`. An op listed with "
               "`reference` alone runs reference code in production (`popart-run --explain-kernels` "
               "shows what runs for a given model).\n"
               "- gradient: `yes` if training can differentiate through the op (autodiff has a rule). An op "
               "with `no` is forward-only: training stops with an error naming it when the loss needs a "
               "gradient through it. Ops whose outputs are integers or booleans (Shape, ArgMax, comparisons) "
               "need none; the ai.graphcore gradient and update ops are the backward pass itself. `unrolled`: "
               "training replaces the op by the ops it runs (an If with a constant condition, a Loop with a "
               "trip count known at compile time, a Scan) and differentiates those; otherwise it stops with an "
               "error naming the op and why (docs/training.md, \"Control flow\").\n\n"
               "| domain | op | opsets | kernels | gradient |\n| --- | --- | --- | --- | --- |\n";
  for (const auto &[key, defs] : byType) {
    std::string ranges;
    std::vector<std::pair<int, int>> opsets;
    for (const auto *d : defs) {
      ranges += (ranges.empty() ? "" : ", ") + std::to_string(d->minVersion) +
                (d->maxVersion >= 1000 ? "+" : "-" + std::to_string(d->maxVersion));
      opsets.emplace_back(d->minVersion, d->maxVersion);
    }
    std::string kernels;
    for (auto p : {backend_cpu::KernelProvider::Plugin, backend_cpu::KernelProvider::Dnnl,
                   backend_cpu::KernelProvider::Fast, backend_cpu::KernelProvider::Reference}) {
      bool has = false;
      for (const auto &k : backend_cpu::KernelRegistry::instance().all())
        has = has || (k.domain == key.first && k.type == key.second && k.provider == p);
      if (has) kernels += (kernels.empty() ? "" : ", ") + std::string(backend_cpu::kernelProviderName(p));
    }
    std::cout << "| " << key.first << " | " << key.second << " | " << ranges << " | " << kernels << " | "
              << autodiff::gradientSupport(key.first, key.second, opsets) << " |\n";
  }
  std::cout << kGraphcoreOpset1Notes;
}

/// Sends this process's standard output to /dev/null: the replicas other than rank 0 print
/// nothing but their errors (on stderr, naming the rank).
void silenceStandardOutput() {
  std::fflush(stdout);
  int null = ::open("/dev/null", O_WRONLY);
  if (null < 0) return;
  ::dup2(null, STDOUT_FILENO);
  ::close(null);
}

/// Threads for each replica of an MPI job without --threads: OMP_NUM_THREADS if set (the session
/// would otherwise take every core, ignoring it), else the host's cores shared out among the ranks
/// that mpirun put on it.
int replicaThreads(const cli::MpiEnvironment &env, int worldSize) {
  if (const char *omp = std::getenv("OMP_NUM_THREADS"); omp != nullptr && std::atoi(omp) > 0) return std::atoi(omp);
  return cli::threadsPerRank(static_cast<int>(std::thread::hardware_concurrency()),
                             env.localSize > 0 ? env.localSize : worldSize);
}

} // namespace

static int runMain(int argc, char **argv) {
  CLI::App app{"popart-run: run an ONNX model on the CPU (oneDNN)"};
  Options opt;
  bool listOps = false;
  app.add_option("model", opt.model, "ONNX model file");
  app.add_flag("--list-ops", listOps, "print the supported ops as a Markdown table and exit");
  std::vector<std::string> customOpLibs;
  app.add_option("--custom-op-lib", customOpLibs,
                 "load the custom-op library FILE before anything else; repeat for more (docs/custom-ops.md)");
  app.add_option("--input", opt.inputs, "NAME=FILE (.npy or TensorProto .pb); repeat for each input");
  app.add_option("--data-dir", opt.dataDir, "ONNX test-data folder: input_<i>.pb in, output_<i>.pb compared");
  app.add_option("--save-outputs", opt.saveOutputs, "write each output as DIR/<name>.npy");
  app.add_option("--iterations", opt.iterations, "run N more times and report latency and throughput")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", opt.threads, "threads (default: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", opt.batch, "value for symbolic leading (batch) dimensions")->check(CLI::NonNegativeNumber);
  app.add_flag("--dump-ir", opt.dumpIr, "print the IR after compilation");
  app.add_option("--rtol", opt.rtol, "relative tolerance for --data-dir (default 1e-3)");
  app.add_option("--atol", opt.atol, "absolute tolerance for --data-dir (default 1e-7)");
  app.add_option("--seed", opt.seed, "seed for random inputs");
  app.add_option("--kernels", opt.kernels,
                 "any (default: oneDNN, else a fast kernel, else the reference) | reference | fast | dnnl: "
                 "the only kernels allowed")
      ->check(CLI::IsMember({"any", "reference", "fast", "dnnl"}));
  app.add_option("--precision", opt.precision,
                 "fp32 (default: the model's types) | fp16.32 | fp16.16 | bf16: mixed precision as PopTorch names it "
                 "(SessionOptions::precision, docs/precision.md)")
      ->check(CLI::IsMember({"fp32", "fp16.32", "fp16.16", "bf16"}));
  app.add_flag("--no-fusion", opt.noFusion,
               "run the graph op by op: disables every optional pass of the pipeline (the fusions; see --passes) "
               "and merged optimiser updates");
  bool listPasses = false;
  app.add_flag("--passes", listPasses, "print the inference and training pipelines (each pass and its needs) and exit");
  app.add_option("--disable-pass", opt.disabledPasses,
                 "do not run the optional pass NAME (repeat for more; see --passes)");
  app.add_option("--dump-ir-after", opt.dumpIrAfter, "print the IR after pass NAME (repeat for more; see --passes)");
  app.add_flag("--verify-ir", opt.verifyIr, "check the IR after every pass (always on in debug builds)");
  app.add_option("--matmul-tuning", opt.matmulTuning,
                 "how large MatMul/Gemm products run: auto (timed at compile time), 0 (as stored), or one way forced: "
                 "a, b, s, p, t, tc, ap, u (SessionOptions::matmulTuning)")
      ->check(CLI::IsMember({"auto", "1", "0", "a", "b", "s", "p", "t", "tc", "ap", "u"}));
  app.add_option("--convpool-chunk", opt.convPoolChunk,
                 "images per chunk of a fused Conv + MaxPool (default 0: about 512 KiB of result per chunk)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--memory-limit", opt.memoryLimit,
                 "refuse a compiled plan (arena, kernels, weights, optimiser state) above this size: bytes, or "
                 "with a unit, 512M, 2G (K, M, G: powers of 1024; default: the available RAM; "
                 "SessionOptions::memoryLimitBytes)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Validator(
          [](const std::string &bytes) {
            return bytes.empty() || bytes[0] == '-' || bytes == "0" ? "must be a size above 0, such as 512M or 2G" : "";
          },
          "SIZE"));
  app.add_flag(
      "--explain-kernels", opt.explainKernels,
      "print the kernel that runs each op (oneDNN or reference, and what it chose) and why the others declined");
  app.add_flag("--check-numerics", opt.checkNumerics,
               "after each op, check its floating-point outputs for NaN and inf and stop at the first, naming the "
               "op, tensor, step and element (under dynamic loss scaling, gradients are left to its skipping)");
  app.add_option("--profile", opt.profile,
                 "write a Chrome trace of the op runs to FILE.json and print the per-op summary and memory report");
  cli::TrainOptions train;
  cli::addTrainOptions(app, train);
  std::string example;
  cli::FashionMnistOptions exampleOpt;
  cli::addExampleOptions(app, example, exampleOpt);
  int replicas = 0;
  bool replicatedFlag = false;
  app.add_option(
         "--replicas", replicas,
         "train N data-parallel replicas on this host: runs popart-run again under mpirun --oversubscribe -np N "
         "(docs/distributed.md); --batch and the model's batch are per replica")
      ->check(CLI::PositiveNumber);
  app.add_flag("--replicated", replicatedFlag,
               "be one replica of an MPI job (automatic under Open MPI's mpirun; for other launchers)");
  // Known before parsing, so that only rank 0 prints --help and the parse errors, which every
  // rank meets alike.
  std::string rankPrefix;
  cli::MpiEnvironment env;
  try {
    env = cli::mpiEnvironment();
  } catch (const std::exception &e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  if (env.underMpirun()) rankPrefix = "rank " + std::to_string(env.rank) + " of " + std::to_string(env.size) + ": ";
  if (env.underMpirun() && env.rank != 0) silenceStandardOutput();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    std::ostringstream quiet;
    int code = env.rank == 0 ? app.exit(e) : app.exit(e, quiet, quiet);
    return code == 0 ? 0 : 2;
  }
  bool replicated = false;
  try {
    for (const auto &lib : customOpLibs)
      loadCustomOpLibrary(lib);
    if (listOps) {
      printOps();
      return 0;
    }
    if (listPasses) {
      std::cout << session::describePipelines();
      return 0;
    }
    const bool training = train.train || !example.empty();
    if (app.count("--replicas") && !env.underMpirun() && !replicatedFlag) {
      if (!training) throw error("--replicas trains replicas of a model: it needs --train or --example");
      if (replicas > 1) cli::launchReplicas(replicas, opt.threads, argc, argv);
    }
    if (train.pipelineStages > 0) {
      if (!train.train) throw error("--pipeline-stages trains a model in stages: it needs --train");
      cli::checkTrainFlags(app, train); // before starting the stages, which would all say the same
      if (!env.underMpirun())
        cli::launchReplicas(train.pipelineStages, opt.threads, argc, argv, "--pipeline-stages", "pipeline stages");
      if (env.size != train.pipelineStages)
        throw error("--pipeline-stages ", train.pipelineStages, " but mpirun started ", env.size,
                    " processes: one per stage");
      // The session makes the stages' communicators over MPI_COMM_WORLD; rank 0 (stage 0) prints,
      // the loss coming from the last stage.
      replicated = true;
      if (env.rank != 0 && std::getenv("POPART_LOG_LEVEL") == nullptr) logging::setLogLevel(logging::Level::Err);
      if (!app.count("--threads")) opt.threads = replicaThreads(env, env.size);
    } else if (env.underMpirun() || replicatedFlag) {
      if (!training)
        throw error("popart-run runs as one replica of an MPI job",
                    env.underMpirun() ? " of " + std::to_string(env.size) + " processes" : std::string(),
                    ", and replicates training only: give --train or --example, or run inference without mpirun");
      train.replication = cli::joinReplicas();
      replicated = true;
      const cli::ReplicaSlice &slice = train.replication.slice;
      rankPrefix = "rank " + std::to_string(slice.rank) + " of " + std::to_string(slice.replicas) + ": ";
      if (!train.replication.leader()) {
        silenceStandardOutput();
        if (std::getenv("POPART_LOG_LEVEL") == nullptr) logging::setLogLevel(logging::Level::Err);
      }
      if (app.count("--replicas") && replicas != slice.replicas)
        throw error("--replicas ", replicas, " but mpirun started ", slice.replicas,
                    " processes: leave --replicas out under mpirun");
      if (!app.count("--threads")) opt.threads = replicaThreads(env, slice.replicas);
    }
    if (!example.empty()) {
      train.seed = opt.seed;
      train.threads = opt.threads;
      train.batch = opt.batch;
      train.kernels = opt.kernels;
      train.precision = opt.precision;
      return cli::runFashionMnistExample(cli::exampleOptions(app, train, exampleOpt));
    }
    if (opt.model.empty()) throw error("no model given (usage: popart-run MODEL.onnx [options]; see --help)");
    if (train.train) {
      for (const char *f : {"--data-dir", "--iterations", "--save-outputs", "--rtol", "--atol"})
        if (app.count(f)) throw error(f, " applies to inference and cannot be combined with --train");
      cli::checkTrainFlags(app, train);
      train.inputs = opt.inputs;
      train.seed = opt.seed;
      train.threads = opt.threads;
      train.batch = opt.batch;
      train.kernels = opt.kernels;
      train.precision = opt.precision;
      train.fuseOps = !opt.noFusion;
      train.disabledPasses = opt.disabledPasses;
      train.dumpIrAfter = opt.dumpIrAfter;
      train.verifyIr = opt.verifyIr;
      train.matmulTuning = opt.matmulTuning;
      train.convPoolChunk = opt.convPoolChunk;
      train.memoryLimit = opt.memoryLimit;
      train.profile = opt.profile;
      train.dumpIr = opt.dumpIr;
      train.explainKernels = opt.explainKernels;
      train.checkNumerics = opt.checkNumerics;
      return cli::runTraining(opt.model, train);
    }
    if (std::string f = cli::trainOnlyFlagGiven(app); !f.empty()) throw error(f, " needs --train");
    return run(opt);
  } catch (const std::exception &e) {
    std::string msg = cli::cliWording(e.what());
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    // One write, so that the lines of several ranks do not interleave.
    std::cerr << ("error: " + rankPrefix + msg + "\n") << std::flush;
    if (replicated) {
      // Leaving without MPI_Finalize makes mpirun end the other ranks now. MPI_Finalize is
      // collective (MPI standard), so it could wait for ranks that wait for this one in an
      // all-reduce until their timeout.
      std::cout.flush();
      std::cerr.flush();
      std::fflush(nullptr);
      ::_exit(2);
    }
    return 2;
  }
}

int main(int argc, char **argv) {
  try {
    return runMain(argc, argv);
  } catch (const std::exception &e) { // setting up the command line itself failed
    std::cerr << "error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "error: unknown exception\n";
  }
  return 2;
}
