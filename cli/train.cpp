#include "cli/train.hpp"
#include "cli/dataloader.hpp"
#include "onnx_import/onnx_import.hpp"
#include "session/checkpoint_file.hpp"
#include "session/npy.hpp"
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <unistd.h>

namespace fs = std::filesystem;

namespace popart::cli {

namespace {

/// The trained weights as they are now, to count at the end the elements training never changed
/// (an fp16 gradient that underflowed, a frozen path, a bug): every weight is accounted for.
std::map<TensorId, TensorData> readTrainedWeights(const TrainingSession &session) {
  std::map<TensorId, TensorData> weights;
  std::vector<RawArray> arrays;
  std::vector<TensorId> ids = session.getWeightIds();
  arrays.reserve(ids.size());
  WeightsIO io;
  for (const auto &id : ids) {
    TensorData &t = weights.emplace(id, TensorData(session.getInfo(id))).first->second;
    arrays.emplace_back(t.data(), t.info().dataType(), t.info().shape());
    io.insert(id, arrays.back());
  }
  session.readWeights(io);
  return weights;
}

/// "weights: all 1234 elements changed", or how many did not and where most of them are.
std::string unchangedReport(const std::map<TensorId, TensorData> &before, const std::map<TensorId, TensorData> &after) {
  int64_t total = 0, unchanged = 0, worstCount = 0;
  TensorId worst;
  for (const auto &[id, b] : before) {
    const TensorData &a = after.at(id);
    const size_t size = dataTypeSize(b.info().dataType());
    const auto *pb = static_cast<const uint8_t *>(b.data());
    const auto *pa = static_cast<const uint8_t *>(a.data());
    int64_t n = b.info().elementCount(), same = 0;
    for (int64_t i = 0; i < n; ++i)
      same += std::memcmp(pb + size_t(i) * size, pa + size_t(i) * size, size) == 0 ? 1 : 0;
    total += n;
    unchanged += same;
    if (same > worstCount) {
      worstCount = same;
      worst = id + " (" + std::to_string(same) + " of " + std::to_string(n) + ")";
    }
  }
  if (unchanged == 0) return "weights: all " + std::to_string(total) + " elements changed";
  char share[32];
  std::snprintf(share, sizeof share, "%.1f%%", 100.0 * double(unchanged) / double(std::max<int64_t>(total, 1)));
  return "weights: " + std::to_string(unchanged) + " of " + std::to_string(total) + " elements (" + share +
         ") never changed, most in " + worst;
}

const char *const kTrainOnly[] = {"--loss",
                                  "--optimizer",
                                  "--lr",
                                  "--momentum",
                                  "--dampening",
                                  "--nesterov",
                                  "--weight-decay",
                                  "--beta1",
                                  "--beta2",
                                  "--eps",
                                  "--alpha",
                                  "--centered",
                                  "--lr-decay",
                                  "--initial-accumulator",
                                  "--max-weight-norm",
                                  "--lr-schedule",
                                  "--warmup-steps",
                                  "--lr-step-size",
                                  "--lr-gamma",
                                  "--lr-min",
                                  "--loss-scaling",
                                  "--als-bin-edge",
                                  "--als-threshold",
                                  "--als-update-period",
                                  "--clip-norm",
                                  "--accumulate",
                                  "--bucket-bytes",
                                  "--recompute",
                                  "--replica-bn-stats",
                                  "--shard-optimizer-state",
                                  "--shard-min-elements",
                                  "--pipeline-stages",
                                  "--pipeline-split",
                                  "--pipeline-cut",
                                  "--steps",
                                  "--epochs",
                                  "--shuffle",
                                  "--save",
                                  "--save-precision",
                                  "--checkpoint",
                                  "--checkpoint-every",
                                  "--resume",
                                  "--freeze"};

bool given(const CLI::App &app, const char *flag) { return app.count(flag) > 0; }

/// Whether --loss-scaling names a method of automatic loss scaling rather than a static scale.
bool automaticLossScaling(const TrainOptions &o) { return o.lossScaling == "dynamic" || o.lossScaling == "histogram"; }

/// The learning rate of step \p step (0-based) of \p total under the schedule.
double scheduledLr(const TrainOptions &o, double base, int64_t step, int64_t total) {
  double lr = base;
  if (o.lrSchedule == "step") {
    int64_t decays = step / std::max<int64_t>(o.lrStepSize, 1); // whole steps of the schedule
    lr = base * std::pow(o.lrGamma, static_cast<double>(decays));
  } else if (o.lrSchedule == "cosine") {
    int64_t span = std::max<int64_t>(total - o.warmupSteps, 1);
    double p = std::clamp(double(step - o.warmupSteps) / double(span), 0.0, 1.0);
    lr = o.lrMin + (base - o.lrMin) * 0.5 * (1.0 + std::cos(M_PI * p));
  }
  if (o.warmupSteps > 0 && step < o.warmupSteps) lr = base * double(step + 1) / double(o.warmupSteps);
  return lr;
}

std::unique_ptr<Optimizer> makeOptimizer(const TrainOptions &o, double lr) {
  std::vector<ClipNormSettings> clip;
  if (o.clipNorm > 0) clip.push_back(ClipNormSettings::clipAllWeights(float(o.clipNorm)));
  float ls = 1.0f;
  if (!o.lossScaling.empty() && !automaticLossScaling(o)) ls = std::stof(o.lossScaling);
  auto f = [](double v) { return float(v); };
  Optimizer::Params p{{"defaultLearningRate", {f(lr), false}}, {"lossScaling", {ls, true}}};
  const std::string &n = o.optimizer;
  if (n == "sgd") {
    p["defaultMomentum"] = {f(o.momentum), true};
    p["defaultDampening"] = {f(o.dampening), true};
    p["defaultWeightDecay"] = {f(o.weightDecay), true};
    p["defaultNesterov"] = {o.nesterov ? 1.0f : 0.0f, true};
    return std::make_unique<SGD>(p, clip);
  }
  if (n == "adam" || n == "adamw" || n == "adamax" || n == "lamb" || n == "lambnobias") {
    p["defaultBeta1"] = {f(o.beta1), true};
    p["defaultBeta2"] = {f(o.beta2), true};
    p["defaultEps"] = {o.eps >= 0 ? f(o.eps) : (n == "lamb" || n == "lambnobias" ? 1e-6f : 1e-8f), true};
    p["defaultWeightDecay"] = {f(o.weightDecay), true};
    p["maxWeightNorm"] = {f(o.maxWeightNorm), true};
    AdamMode mode = n == "adamax"       ? AdamMode::AdaMax
                    : n == "lamb"       ? AdamMode::Lamb
                    : n == "lambnobias" ? AdamMode::LambNoBias
                                        : AdamMode::Adam;
    WeightDecayMode wd =
        n == "adamw" || n == "lamb" || n == "lambnobias" ? WeightDecayMode::Decay : WeightDecayMode::L2Regularization;
    return std::make_unique<Adam>(p, mode, wd, clip);
  }
  p["defaultWeightDecay"] = {f(o.weightDecay), true};
  p["defaultEps"] = {o.eps >= 0 ? f(o.eps) : (n == "adagrad" ? 1e-10f : 1e-8f), true};
  if (n == "rmsprop") {
    p["defaultAlpha"] = {f(o.alpha), true};
    p["defaultMomentum"] = {f(o.momentum), true};
    return std::make_unique<Adaptive>(p, o.centered ? AdaptiveMode::CenteredRMSProp : AdaptiveMode::RMSProp, clip);
  }
  p["defaultLearningRateDecay"] = {f(o.lrDecay), true};
  p["defaultInitialAccumulator"] = {f(o.initialAccumulator), true};
  return std::make_unique<Adaptive>(p, AdaptiveMode::AdaGrad, clip);
}

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = std::llround(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(s / 3600), (long long)(s / 60 % 60),
                  (long long)(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", (long long)(s / 60), (long long)(s % 60));
  return buf;
}

/// The --input files: per input, the samples back to back.
struct InputFiles {
  std::map<TensorId, TensorData> arrays;
  int64_t samples = -1;
};

/// Where a run is, saved next to the checkpoint so that a resumed run takes the same batches.
/// progress.txt is the folder's manifest: it names the checkpoint that goes with it (layout 2:
/// checkpoint-<step>.ckpt), and it is replaced only once that checkpoint is on disk, and old
/// checkpoints are deleted only once it is. A kill at any moment leaves a progress.txt whose
/// checkpoint exists and holds the weights of the same step.
struct Progress {
  int64_t step = 0;
  uint64_t seed = 0;
  bool shuffle = false;
  int64_t samples = 0, batch = 0; ///< batch: the samples of a step, over all replicas
  int64_t replicas = 1;
  int64_t layout = 2; ///< 1: the checkpoint is checkpoint.ckpt, replaced in place (before format 2)
};

constexpr int64_t kProgressLayout = 2;

/// The checkpoint file of a folder whose progress.txt reads \p p.
std::string checkpointName(const Progress &p) {
  return p.layout >= 2 ? "checkpoint-" + std::to_string(p.step) + ".ckpt" : "checkpoint.ckpt";
}

/// Deletes the checkpoints (and temporary files of interrupted writes) in \p dir other than \p keep.
void removeStaleCheckpoints(const fs::path &dir, const std::string &keep) {
  std::error_code ec;
  for (const auto &entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name == keep) continue;
    if (name.ends_with(".tmp")) name.resize(name.size() - 4);
    // Only the names this code writes: checkpoint.ckpt and checkpoint-<step>.ckpt.
    std::string step = name.starts_with("checkpoint-") && name.ends_with(".ckpt") ? name.substr(11, name.size() - 16)
                                                                                  : std::string("x");
    const bool ours =
        name == "checkpoint.ckpt" ||
        (!step.empty() && std::all_of(step.begin(), step.end(), [](char c) { return c >= '0' && c <= '9'; }));
    if (ours) fs::remove(entry.path(), ec); // a leftover costs disk, not correctness
  }
}

std::string progressText(const Progress &p) {
  return "step " + std::to_string(p.step) + "\nseed " + std::to_string(p.seed) + "\nshuffle " +
         std::to_string(p.shuffle ? 1 : 0) + "\nsamples " + std::to_string(p.samples) + "\nbatch " +
         std::to_string(p.batch) + "\nreplicas " + std::to_string(p.replicas) + "\nlayout " + std::to_string(p.layout) +
         "\n";
}

Progress readProgress(const fs::path &path) {
  std::ifstream in(path);
  if (!in) throw error("--resume: '", path.string(), "' is missing");
  Progress p;
  std::string key;
  int64_t v = 0;
  std::map<std::string, int64_t> kv;
  while (in >> key >> v)
    kv[key] = v;
  for (const char *k : {"step", "seed", "shuffle", "samples", "batch"})
    if (!kv.count(k)) throw error("--resume: '", path.string(), "' has no '", k, "' entry");
  p.step = kv["step"];
  p.seed = static_cast<uint64_t>(kv["seed"]);
  p.shuffle = kv["shuffle"] != 0;
  p.samples = kv["samples"];
  p.batch = kv["batch"];
  // Written before replication existed: one process.
  p.replicas = kv.count("replicas") ? kv["replicas"] : 1;
  // Written before the manifest layout: checkpoint.ckpt.
  p.layout = kv.count("layout") ? kv["layout"] : 1;
  if (p.layout != 1 && p.layout != kProgressLayout)
    throw error("--resume: '", path.string(), "' has an unknown layout ", p.layout, " (this build reads 1 and ",
                kProgressLayout, ")");
  return p;
}

} // namespace

std::string cliWording(std::string message) {
  static const std::pair<const char *, const char *> kFlags[] = {
      {"set SessionOptions::batchSize or an InputShapeInfo", "give --batch N"},
      {"SessionOptions::batchSize", "--batch"},
      {"SessionOptions::frozenWeights entry", "--freeze"},
      {"SessionOptions::frozenWeights", "--freeze"},
      {"SessionOptions.kernels", "--kernels"},
      {"SessionOptions.matmulTuning", "--matmul-tuning"},
      {"SessionOptions.convPoolChunk", "--convpool-chunk"},
      {"SessionOptions::enableFloatingPointChecks", "--check-numerics"},
      {"SessionOptions.memoryLimitBytes (popart-run --memory-limit)", "--memory-limit"},
  };
  for (const auto &[api, flag] : kFlags)
    for (size_t at = message.find(api); at != std::string::npos; at = message.find(api, at + std::strlen(flag)))
      message.replace(at, std::strlen(api), flag);
  return message;
}

void addTrainOptions(CLI::App &app, TrainOptions &o) {
  app.add_flag("--train", o.train, "train the model (its scalar loss output) on the --input datasets");
  app.add_option("--loss", o.loss, "loss tensor (default: the model's only scalar output)");
  app.add_option("--freeze", o.freeze,
                 "keep this initializer as it is: a name or a regular expression matching whole names (repeatable)");
  app.add_option("--optimizer", o.optimizer, "sgd | adam | adamw | adamax | lamb | lambnobias | rmsprop | adagrad")
      ->check(CLI::IsMember({"sgd", "adam", "adamw", "adamax", "lamb", "lambnobias", "rmsprop", "adagrad"}));
  app.add_option("--lr", o.lr, "learning rate (default: sgd/rmsprop/adagrad 0.01, adam family 0.001)");
  app.add_option("--momentum", o.momentum, "momentum (sgd, rmsprop)");
  app.add_option("--dampening", o.dampening, "dampening (sgd)");
  app.add_flag("--nesterov", o.nesterov, "Nesterov momentum (sgd)");
  app.add_option("--weight-decay", o.weightDecay,
                 "weight decay: L2 for sgd/adam/adamax/rmsprop/adagrad, decoupled for adamw/lamb");
  app.add_option("--beta1", o.beta1, "first moment decay (adam family, default 0.9)");
  app.add_option("--beta2", o.beta2, "second moment decay (adam family, default 0.999)");
  app.add_option("--eps", o.eps, "epsilon (default: 1e-8; lamb 1e-6; adagrad 1e-10)");
  app.add_option("--alpha", o.alpha, "square average decay (rmsprop, default 0.99)");
  app.add_flag("--centered", o.centered, "centered RMSprop");
  app.add_option("--lr-decay", o.lrDecay, "adagrad: lr / (1 + (t-1) * decay)");
  app.add_option("--initial-accumulator", o.initialAccumulator, "adagrad: initial value of the square sum");
  app.add_option("--max-weight-norm", o.maxWeightNorm, "clamp of ||w|| in the LAMB trust ratio (0: none)");
  app.add_option("--lr-schedule", o.lrSchedule, "constant | cosine | step (each with optional --warmup-steps)")
      ->check(CLI::IsMember({"constant", "cosine", "step"}));
  app.add_option("--warmup-steps", o.warmupSteps, "linear learning-rate warm-up over N steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr-step-size", o.lrStepSize, "step schedule: multiply the lr by --lr-gamma every N steps");
  app.add_option("--lr-gamma", o.lrGamma, "step schedule factor (default 0.1)");
  app.add_option("--lr-min", o.lrMin, "cosine schedule: final learning rate (default 0)");
  app.add_option("--loss-scaling", o.lossScaling,
                 "static loss scale S; 'dynamic' (GradScaler-style: halve on inf/NaN, double after 2000 good "
                 "steps); or 'histogram' (PopART's automatic loss scaling: halve or double every --als-update-period "
                 "steps from the gradients' counts at or above a bin edge); both start at 65536");
  app.add_option("--als-bin-edge", o.alsBinEdge,
                 "histogram loss scaling: the bin edge as a proportion of the largest fp16 value (fp16 modes; else "
                 "of the gradients' type), in (0, 1] (default 0.5)");
  app.add_option("--als-threshold", o.alsThreshold,
                 "histogram loss scaling: halve the scale when more than this proportion of gradient elements is at "
                 "or above the edge, else double it (default 1e-7)");
  app.add_option("--als-update-period", o.alsUpdatePeriod,
                 "histogram loss scaling: steps whose counts are summed per change of the scale (default 1)");
  app.add_option("--clip-norm", o.clipNorm, "clip gradients by their global L2 norm")->check(CLI::PositiveNumber);
  app.add_option("--accumulate", o.accumulate, "micro-batches per weight update (mean of their gradients)")
      ->check(CLI::PositiveNumber);
  app.add_option("--replica-bn-stats", o.replicaBnStats,
                 "replicated training: BatchNormalization running statistics per replica (local, the default; "
                 "rank 0's are saved) or averaged over the replicas every step (mean)")
      ->check(CLI::IsMember({"local", "mean"}));
  app.add_flag(
      "--shard-optimizer-state", o.shardOptimizerState,
      "replicated: each replica keeps and updates 1/N of the optimiser state of the weights of at least "
      "8192 elements (reduce-scatter, update, all-gather; replicatedTensorSharding); no effect on one process");
  app.add_option("--shard-min-elements", o.shardMinElements,
                 "--shard-optimizer-state: weights of fewer elements keep their whole state on every replica (default "
                 "8192; SessionOptions::optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--bucket-bytes", o.bucketBytes,
                 "replicated: all-reduce the gradients in buckets of this many bytes overlapping the backward "
                 "(default 4194304; 0: one blocking all-reduce per gradient; SessionOptions::replicationBucketBytes)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--pipeline-stages", o.pipelineStages,
                 "pipelined training over K processes, one stage each (docs/distributed.md, \"Pipelining\"): under "
                 "mpirun -np K, or started by popart-run itself; --accumulate sets the micro-batches that flow "
                 "through the stages")
      ->check(CLI::Range(2, 4096));
  app.add_option("--pipeline-split", o.pipelineSplit,
                 "--pipeline-stages: start a stage after each of these tensors (K-1 of them, in forward order, "
                 "comma-separated; default: stages balanced by the ops' FLOP and memory estimates)")
      ->delimiter(',');
  app.add_option("--pipeline-cut", o.pipelineCut,
                 "--pipeline-stages: auto (the default: --pipeline-split, else balanced) or annotations (the "
                 "model's __pipeline_stage / __ipu_number node attributes, as PopART's Builder writes them)")
      ->check(CLI::IsMember({"auto", "annotations"}));
  app.add_option("--recompute", o.recompute,
                 "none (default) | standard | normonly | all | pipeline: forward activations the backward pass "
                 "recomputes instead of keeping them (SessionOptions::autoRecomputation, docs/training.md)")
      ->check(CLI::IsMember({"none", "standard", "normonly", "all", "pipeline"}));
  app.add_option("--steps", o.steps, "weight updates to run (default: one epoch)")->check(CLI::PositiveNumber);
  app.add_option("--epochs", o.epochs, "epochs to run")->check(CLI::PositiveNumber);
  app.add_flag("--shuffle", o.shuffle, "shuffle the samples every epoch (seeded by --seed)");
  app.add_option("--save", o.save, "write the trained model (ONNX) here");
  app.add_option("--save-precision", o.savePrecision,
                 "training (default: each weight as the forward pass reads it, 16-bit in a precision mode) | fp32 "
                 "(the fp32 master weights)")
      ->check(CLI::IsMember({"training", "fp32"}));
  app.add_option("--checkpoint", o.checkpoint, "write checkpoints into this folder");
  app.add_option("--checkpoint-every", o.checkpointEvery, "checkpoint every N steps (default: at the end)")
      ->check(CLI::PositiveNumber);
  app.add_option("--resume", o.resume, "resume from the checkpoint folder DIR");
}

TensorData loadTensorFile(const std::string &path, DataType wanted) {
  std::string ext = fs::path(path).extension().string();
  TensorData t;
  if (ext == ".npy")
    t = npy::read(path);
  else if (ext == ".pb")
    t = onnx_import::readTensorProtoFile(path);
  else
    throw error("input file '", path, "' must be .npy or a serialized TensorProto .pb");
  if (t.info().dataType() == DataType::UINT16 && wanted == DataType::BFLOAT16) t.reinterpretAs(DataType::BFLOAT16);
  return t;
}

std::string trainOnlyFlagGiven(const CLI::App &app) {
  for (const char *f : kTrainOnly)
    if (given(app, f)) return f;
  return "";
}

namespace {
// "steps 3, 9, 12" (the first ten, then how many more), from the session's record.
std::string skippedStepList(const TrainingSession &session) {
  constexpr size_t kShown = 10;
  const std::vector<int64_t> numbers = session.getSkippedStepNumbers();
  std::string list = numbers.size() == 1 ? "step " : "steps ";
  for (size_t i = 0; i < numbers.size() && i < kShown; ++i)
    list += (i ? ", " : "") + std::to_string(numbers[i]);
  if (const int64_t more = session.getSkippedSteps() - static_cast<int64_t>(std::min(numbers.size(), kShown)); more > 0)
    list += numbers.empty() ? "not recorded" : " and " + std::to_string(more) + " more";
  return list;
}
} // namespace

int runTraining(const std::string &modelPath, const TrainOptions &o) {
  InputFiles data;
  for (const auto &spec : o.inputs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) throw error("--input '", spec, "' must be NAME=FILE (.npy or .pb)");
    TensorId name = spec.substr(0, eq);
    TensorData t = loadTensorFile(spec.substr(eq + 1));
    if (t.info().shape().empty()) throw error("--input ", name, ": a dataset needs a leading sample dimension");
    int64_t n = t.info().shape()[0];
    if (data.samples >= 0 && n != data.samples)
      throw error("--input ", name, " has ", n, " samples, the other inputs have ", data.samples);
    data.samples = n;
    data.arrays.emplace(name, std::move(t));
  }
  if (data.arrays.empty()) throw error("--train needs the training data: --input NAME=FILE.npy for each model input");

  SessionOptions so;
  so.numThreads = o.threads;
  so.batchSize = o.batch;
  so.kernels = o.kernels;
  so.precision = o.precision;
  so.fuseOps = o.fuseOps;
  const std::map<std::string, RecomputationType> recomputation{{"none", RecomputationType::None},
                                                               {"standard", RecomputationType::Standard},
                                                               {"normonly", RecomputationType::NormOnly},
                                                               {"all", RecomputationType::RecomputeAll},
                                                               {"pipeline", RecomputationType::Pipeline}};
  so.autoRecomputation = recomputation.at(o.recompute);
  so.disabledPasses = o.disabledPasses;
  so.dumpIrAfter = o.dumpIrAfter;
  so.verifyIr = o.verifyIr;
  so.enableFloatingPointChecks = o.checkNumerics;
  so.matmulTuning = o.matmulTuning;
  so.convPoolChunk = o.convPoolChunk;
  so.memoryLimitBytes = o.memoryLimit;
  so.frozenWeights = o.freeze;
  so.replicatedBatchNormStatistics =
      o.replicaBnStats == "mean" ? ReplicatedStatistics::Mean : ReplicatedStatistics::Local;
  if (o.accumulate > 1 || o.pipelineStages > 0) {
    so.enableGradientAccumulation = true;
    so.accumulationFactor = o.accumulate;
  }
  if (automaticLossScaling(o)) {
    AutomaticLossScalingSettings &als = so.automaticLossScalingSettings;
    als.enabled = true;
    if (o.lossScaling == "histogram") {
      als.method = AutomaticLossScalingSettings::Method::Histogram;
      als.binEdgeLocation = static_cast<float>(o.alsBinEdge);
      als.thresholdUpperCountProportion = static_cast<float>(o.alsThreshold);
      als.updatePeriod = o.alsUpdatePeriod;
    }
  }
  double baseLr = o.lr >= 0                                                                        ? o.lr
                  : (o.optimizer == "sgd" || o.optimizer == "rmsprop" || o.optimizer == "adagrad") ? 0.01
                                                                                                   : 0.001;
  auto optimizer = makeOptimizer(o, baseLr);

  // The loss is anchored, so its name is needed first: the model's only declared scalar output,
  // else a session without anchors finds it from the inferred shapes (no plan is compiled). These
  // probes are not replicas: made with the options before replication.
  TensorId lossId = o.loss;
  const SessionOptions probe = so;
  const Replication &replication = o.replication;
  const int64_t replicas = replication.slice.replicas;
  replication.apply(so);
  if (o.pipelineStages > 0) {
    so.enablePipelining = true;
    so.virtualGraphMode = o.pipelineCut == "annotations" ? VirtualGraphMode::Manual : VirtualGraphMode::Auto;
    so.pipelineSplit = o.pipelineSplit;
  }
  if (o.bucketBytes >= 0) so.replicationBucketBytes = o.bucketBytes;
  if (o.shardOptimizerState)
    so.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
  if (o.shardMinElements >= 0)
    so.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = o.shardMinElements;
  if (lossId.empty()) {
    auto declared = InferenceSession::createFromOnnxModel(modelPath, DataFlow(1, std::vector<TensorId>{}), probe);
    std::vector<TensorId> scalars;
    for (const auto &id : declared->getOutputIds())
      if (TensorInfo info = declared->getInfo(id); info.isKnown() && info.elementCount() == 1) scalars.push_back(id);
    if (scalars.size() == 1) {
      lossId = scalars[0];
    } else {
      lossId =
          TrainingSession::createFromOnnxModel(modelPath, DataFlow(1, std::vector<TensorId>{}), "", *optimizer, probe)
              ->getLossId();
    }
  }
  auto session = TrainingSession::createFromOnnxModel(modelPath, DataFlow(1, {lossId}, AnchorReturnType("ALL")), lossId,
                                                      *optimizer, so);
  session->prepareDevice();
  if (o.dumpIr) std::cout << session->dumpIr();
  if (o.explainKernels) std::cout << session->explainKernels();
  std::vector<TensorId> inputIds = session->getInputIds();
  std::map<TensorId, TensorInfo> infos;
  for (const auto &id : inputIds)
    infos[id] = session->getInfo(id);

  int64_t batch = -1;
  for (const auto &id : inputIds) {
    auto it = data.arrays.find(id);
    if (it == data.arrays.end()) throw error("model input '", id, "' has no dataset: give --input ", id, "=FILE.npy");
    const TensorInfo &info = infos.at(id);
    const TensorInfo &have = it->second.info();
    Shape sample(have.shape().begin() + 1, have.shape().end());
    Shape want(info.shape().begin() + 1, info.shape().end());
    if (have.dataType() == DataType::UINT16 && info.dataType() == DataType::BFLOAT16) { // bf16 bit patterns
      it->second.reinterpretAs(DataType::BFLOAT16);
    } else if (have.dataType() != info.dataType())
      throw error("--input ", id, " is ", toString(have.dataType()), ", the model input is ",
                  toString(info.dataType()));
    if (info.shape().empty() || sample != want)
      throw error("--input ", id, " has samples of shape ", toString(sample), ", the model input ", info.toString(),
                  " needs ", toString(want), " after its batch dimension");
    if (batch >= 0 && info.shape()[0] != batch)
      throw error("model inputs disagree on the batch size (", batch, " and ", info.shape()[0], ")");
    batch = info.shape()[0];
  }
  for (const auto &[id, t] : data.arrays)
    if (!infos.count(id)) throw error("--input names '", id, "', which is not an input of the model");
  // Each replica takes perStep samples of each global batch of perStep x replicas.
  const int64_t perStep = batch * o.accumulate;
  const int64_t globalPerStep = perStep * replicas;
  const int64_t stepsPerEpoch = data.samples / globalPerStep;
  if (stepsPerEpoch == 0)
    throw error("the dataset has ", data.samples, " samples, fewer than one step needs (batch ", batch,
                " x accumulation ", o.accumulate, replicas > 1 ? " x " + std::to_string(replicas) + " replicas" : "",
                ")");
  int64_t total = o.steps > 0    ? o.steps
                  : o.epochs > 0 ? std::max<int64_t>(1, std::llround(o.epochs * double(stepsPerEpoch)))
                                 : stepsPerEpoch;

  int64_t start = 0;
  fs::path resumeFrom;
  if (!o.resume.empty()) {
    fs::path dir(o.resume);
    Progress p = readProgress(dir / "progress.txt");
    resumeFrom = dir / checkpointName(p);
    // Another replica count resumes where the global batch is the same (replicas x batch x
    // accumulation): the sampler then hands out the same samples per step from the same position.
    if (p.samples != data.samples || p.batch != globalPerStep || p.shuffle != o.shuffle || p.seed != o.seed)
      throw error("--resume: the checkpoint in '", o.resume, "' was made with ", p.samples, " samples, ", p.batch,
                  " samples per step (over ", p.replicas, " replica(s)), shuffle ", p.shuffle, ", seed ", p.seed,
                  "; this run differs (", data.samples, " samples, ", globalPerStep, " per step over ", replicas,
                  " replica(s), shuffle ", o.shuffle, ", seed ", o.seed, ")");
    if (p.replicas != replicas && replication.leader())
      std::printf("resuming a checkpoint of %lld replica(s) on %lld: the global batch of %lld is the same\n",
                  static_cast<long long>(p.replicas), static_cast<long long>(replicas),
                  static_cast<long long>(globalPerStep));
    start = p.step;
    if (start >= total)
      throw error("--resume: the checkpoint is at step ", start, ", at or past the last step ", total);
  }
  session->setRandomSeed(o.seed);
  // The checkpoint holds weights, optimiser state, loss scale and the random state.
  if (!o.resume.empty()) session->loadCheckpoint(resumeFrom.string());

  // Batches of B·N samples (this replica's share of the step) come from a prefetching loader;
  // each step views them as [N, B, ...].
  Dataset dataset;
  for (const auto &id : inputIds) {
    TensorData &t = data.arrays.at(id);
    const auto *bytes = static_cast<const uint8_t *>(t.data());
    dataset.push_back({id, t.info(), std::vector<uint8_t>(bytes, bytes + t.byteCount())});
    t = TensorData();
  }
  DataLoader loader(std::move(dataset), perStep, o.shuffle, o.seed, 2, {start / stepsPerEpoch, start % stepsPerEpoch},
                    replication.slice);
  std::vector<double> losses(static_cast<size_t>(o.accumulate));
  Shape lossShape;
  if (o.accumulate > 1) lossShape.push_back(o.accumulate);
  TensorInfo lossInfo = session->getInfo(lossId);
  if (!isFloatingPoint(lossInfo.dataType()))
    throw error("the loss '", lossId, "' is ", toString(lossInfo.dataType()),
                "; the CLI reports floating-point losses");
  lossShape.insert(lossShape.end(), lossInfo.shape().begin(), lossInfo.shape().end());
  // The loss in its own type (a model.half() model's is FLOAT16), read as doubles after each step.
  TensorData lossValues(TensorInfo(lossInfo.dataType(), lossShape));
  RawArray lossArr(lossValues.data(), lossInfo.dataType(), lossShape);
  std::map<TensorId, Shape> stepShapes;
  for (const auto &id : inputIds) {
    Shape s = infos.at(id).shape();
    if (o.accumulate > 1) s.insert(s.begin(), o.accumulate);
    stepShapes[id] = s;
  }
  std::vector<RawArray> views;
  views.reserve(inputIds.size());
  auto runStep = [&] {
    Batch &b = loader.next();
    views.clear();
    std::map<TensorId, IArray &> in;
    for (const auto &id : inputIds) {
      views.emplace_back(b.array(id).data(), infos.at(id).dataType(), stepShapes.at(id));
      in.emplace(id, views.back());
    }
    StepIO io(in, {{lossId, lossArr}});
    session->run(io);
    std::vector<double> mine(static_cast<size_t>(o.accumulate));
    for (size_t i = 0; i < mine.size(); ++i)
      mine[i] = lossValues.valueAsDouble(static_cast<int64_t>(i));
    // Every replica's losses, in the order of the samples in the global batch: their mean is
    // the mean that one process accumulating all of them would print.
    losses = replication.gather(mine);
  };

  // One checkpoint for the job, which rank 0 writes. Every rank calls saveCheckpoint: with the
  // optimiser state sharded it gathers the shards from all of them (otherwise it returns at once
  // on the other ranks).
  auto saveCheckpoint = [&](int64_t stepsDone) {
    fs::path dir(o.checkpoint);
    // A new folder's own entry is made durable too, or a power cut could lose it with everything in it.
    if (replication.leader() && fs::create_directories(dir)) {
      fs::path full = fs::absolute(dir).lexically_normal();
      if (!full.has_filename()) full = full.parent_path(); // "ckpt/"
      session::syncDirectory(full.parent_path());
    }
    Progress p{stepsDone, o.seed, o.shuffle, data.samples, globalPerStep, replicas, kProgressLayout};
    // The checkpoint first, under a name of its own; then the manifest that points at it; then
    // the old checkpoints (see Progress).
    session->saveCheckpoint((dir / checkpointName(p)).string());
    if (!replication.leader()) return;
    session::writeFileDurably(dir / "progress.txt", progressText(p));
    removeStaleCheckpoints(dir, checkpointName(p));
  };

  // mpirun hands rank 0 a pseudo-terminal whatever its own output is: replicas print lines.
  const bool tty = isatty(STDOUT_FILENO) != 0 && !replication.enabled();
  std::vector<WeightStatus> statuses = session->getWeightStatuses();
  std::string batchText = std::to_string(batch);
  if (o.accumulate > 1) batchText += " x " + std::to_string(o.accumulate) + " accumulated";
  if (replication.enabled())
    batchText += " x " + std::to_string(replicas) + " replicas (global batch " + std::to_string(globalPerStep) + ")";
  std::printf("training %s: trained %zu of %zu weights, %s, batch %s, %lld steps (%lld per epoch)%s\n",
              modelPath.c_str(), session->getWeightIds().size(), statuses.size(), o.optimizer.c_str(),
              batchText.c_str(), (long long)total, (long long)stepsPerEpoch,
              start > 0 ? (", resuming at step " + std::to_string(start)).c_str() : "");
  // The remainder of an epoch that does not fill a (global) batch is dropped (docs/distributed.md).
  const int64_t dropped = loader.sampler().droppedPerEpoch();
  if (replication.enabled())
    std::printf("data: %lld samples, %lld global batches of %lld per epoch (each replica takes its slice of %lld), "
                "%lld dropped per epoch\n",
                (long long)data.samples, (long long)stepsPerEpoch, (long long)globalPerStep, (long long)perStep,
                (long long)dropped);
  else if (dropped > 0)
    std::printf("data: %lld samples, %lld steps of %lld per epoch, %lld dropped per epoch\n", (long long)data.samples,
                (long long)stepsPerEpoch, (long long)globalPerStep, (long long)dropped);
  // The weights not trained, one line per reason.
  std::vector<std::pair<std::string, std::vector<TensorId>>> byReason;
  for (const auto &st : statuses) {
    if (st.role == WeightStatus::Role::Trained) continue;
    std::string reason = cliWording(st.reason);
    auto it = std::find_if(byReason.begin(), byReason.end(), [&](const auto &r) { return r.first == reason; });
    if (it == byReason.end()) it = byReason.insert(byReason.end(), {reason, {}});
    it->second.push_back(st.id);
  }
  // A long group (a BatchNorm model's running statistics) is cut short; the log at level info
  // lists every name.
  constexpr size_t kNamesShown = 6;
  for (const auto &[reason, ids] : byReason) {
    std::string names;
    for (size_t i = 0; i < ids.size() && (ids.size() <= kNamesShown + 2 || i < kNamesShown); ++i)
      names += (names.empty() ? "" : ", ") + ids[i];
    if (ids.size() > kNamesShown + 2)
      names += " and " + std::to_string(ids.size() - kNamesShown) + " more (POPART_LOG_LEVEL=info lists them)";
    std::printf("  not trained: %s (%s)\n", names.c_str(), reason.c_str());
  }
  std::fflush(stdout);
  using clock = std::chrono::steady_clock;
  const std::map<TensorId, TensorData> weightsBefore = readTrainedWeights(*session);
  // Pipelined, every stage profiles (the summary gathers their times); stage 0 prints and writes the trace.
  const bool pipelined = o.pipelineStages > 0;
  if (!o.profile.empty() && (replication.leader() || pipelined)) session->enableProfiling();
  auto t0 = clock::now();
  std::vector<double> stepMs;
  double lastLoss = NAN;
  int64_t reportEvery = std::max<int64_t>(1, (total - start) / 20);
  for (int64_t step = start; step < total; ++step) {
    if (o.lrSchedule != "constant" || o.warmupSteps > 0) {
      auto next = makeOptimizer(o, scheduledLr(o, baseLr, step, total));
      session->updateOptimizerFromHost(next.get());
    }
    auto s0 = clock::now();
    runStep();
    stepMs.push_back(std::chrono::duration<double, std::milli>(clock::now() - s0).count());
    lastLoss = std::accumulate(losses.begin(), losses.end(), 0.0) / double(losses.size());
    if (!std::isfinite(lastLoss) && !automaticLossScaling(o))
      throw error("the loss became ", lastLoss, " at step ", step + 1, " (try a smaller --lr or --clip-norm)");
    int64_t done = step + 1;
    double elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    double rate = double((done - start) * globalPerStep) / std::max(elapsed, 1e-9);
    double eta = double(total - done) * globalPerStep / std::max(rate, 1e-9);
    if (tty) {
      int width = 24, filled = static_cast<int>(width * done / total);
      std::printf("\rstep %lld/%lld [%s%s] loss %.5g  %.1f samples/s  ETA %s   ", (long long)done, (long long)total,
                  std::string(size_t(filled), '#').c_str(), std::string(size_t(width - filled), '.').c_str(), lastLoss,
                  rate, formatDuration(eta).c_str());
      std::fflush(stdout);
    } else if (done % reportEvery == 0 || done == total) {
      std::printf("step %lld/%lld loss %.6g %.1f samples/s ETA %s\n", (long long)done, (long long)total, lastLoss, rate,
                  formatDuration(eta).c_str());
      std::fflush(stdout);
    }
    if (!o.checkpoint.empty() && o.checkpointEvery > 0 && done % o.checkpointEvery == 0 && done < total)
      saveCheckpoint(done);
  }
  if (tty) std::printf("\n");
  double elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  if (session->getSkippedSteps() > 0) {
    // The list on a line of its own: the line before is what scripts parse.
    std::printf("skipped %lld steps with non-finite gradients; loss scale now %g\n",
                (long long)session->getSkippedSteps(), session->getLossScale());
    std::printf("skipped %s\n", skippedStepList(*session).c_str());
  } else if (automaticLossScaling(o))
    std::printf("loss scale now %g\n", session->getLossScale());
  std::printf("final loss: %.6g%s\n", lastLoss,
              replication.enabled() ? (" (mean over " + std::to_string(replicas) + " replicas)").c_str() : "");
  std::printf("%s\n", unchangedReport(weightsBefore, readTrainedWeights(*session)).c_str());
  if (!o.checkpoint.empty()) saveCheckpoint(total);
  if (!o.save.empty() && replication.leader()) {
    session->modelToHost(o.save, o.savePrecision);
    std::printf("saved %s\n", o.save.c_str());
  }
  if (stepMs.size() > 1) {
    // The first step warms caches and oneDNN's lazily initialised state: left out of the median.
    std::vector<double> sorted(stepMs.begin() + 1, stepMs.end());
    std::sort(sorted.begin(), sorted.end());
    std::printf("step time: median %.3f ms, min %.3f ms, max %.3f ms over %zu steps (first step %.3f ms excluded)\n",
                sorted[sorted.size() / 2], sorted.front(), sorted.back(), sorted.size(), stepMs.front());
  }
  std::printf("throughput: %.1f samples/s%s\n", double((total - start) * globalPerStep) / std::max(elapsed, 1e-9),
              replication.enabled() ? " (all replicas)" : "");
  if (!o.profile.empty() && pipelined) {
    const std::string summary = session->profileSummary();
    if (session->getPipelineStage() == 0) {
      session->writeProfileTrace(o.profile);
      std::printf("%strace (stage 0): %s\n", summary.c_str(), o.profile.c_str());
    }
  } else if (!o.profile.empty() && replication.leader()) {
    session->writeProfileTrace(o.profile);
    std::printf("%strace: %s\n", session->profileSummary().c_str(), o.profile.c_str());
  }
  return 0;
}

void checkTrainFlags(const CLI::App &app, const TrainOptions &o) {
  auto only = [&](const char *flag, std::initializer_list<const char *> optimizers) {
    if (!given(app, flag)) return;
    for (const char *n : optimizers)
      if (o.optimizer == n) return;
    std::string list;
    for (const char *n : optimizers)
      list += (list.empty() ? "" : ", ") + std::string(n);
    throw error(flag, " does not apply to --optimizer ", o.optimizer, " (only to ", list, ")");
  };
  only("--momentum", {"sgd", "rmsprop"});
  only("--dampening", {"sgd"});
  only("--nesterov", {"sgd"});
  only("--beta1", {"adam", "adamw", "adamax", "lamb", "lambnobias"});
  only("--beta2", {"adam", "adamw", "adamax", "lamb", "lambnobias"});
  only("--alpha", {"rmsprop"});
  only("--centered", {"rmsprop"});
  only("--max-weight-norm", {"lamb", "lambnobias"});
  only("--lr-decay", {"adagrad"});
  only("--initial-accumulator", {"adagrad"});
  if (given(app, "--steps") && given(app, "--epochs")) throw error("--steps and --epochs exclude each other");
  if (given(app, "--save-precision") && o.save.empty()) throw error("--save-precision needs --save FILE");
  if (given(app, "--checkpoint-every") && o.checkpoint.empty())
    throw error("--checkpoint-every needs --checkpoint DIR");
  for (const char *f : {"--pipeline-split", "--pipeline-cut"})
    if (given(app, f) && o.pipelineStages == 0) throw error(f, " needs --pipeline-stages K");
  if (given(app, "--pipeline-split") && o.pipelineCut == "annotations")
    throw error("--pipeline-split cuts the model itself: it excludes --pipeline-cut annotations");
  if (o.pipelineStages > 0)
    for (const char *f : {"--save", "--checkpoint", "--resume", "--replicas", "--shard-optimizer-state"})
      if (given(app, f))
        throw error(f, " is not supported with --pipeline-stages yet (each stage's process holds its own weights)");
  if (given(app, "--shard-min-elements") && !o.shardOptimizerState)
    throw error("--shard-min-elements needs --shard-optimizer-state");
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    throw error("--nesterov needs a positive --momentum and no --dampening");
  if (o.lrSchedule == "step" && o.lrStepSize <= 0) throw error("--lr-schedule step needs --lr-step-size N > 0");
  if ((given(app, "--lr-step-size") || given(app, "--lr-gamma")) && o.lrSchedule != "step")
    throw error("--lr-step-size and --lr-gamma need --lr-schedule step");
  if (given(app, "--lr-min") && o.lrSchedule != "cosine") throw error("--lr-min needs --lr-schedule cosine");
  if (!o.lossScaling.empty() && !automaticLossScaling(o)) {
    char *end = nullptr;
    double v = std::strtod(o.lossScaling.c_str(), &end);
    if (end == o.lossScaling.c_str() || *end != '\0' || !(v > 0))
      throw error("--loss-scaling must be a positive number, 'dynamic' or 'histogram', got '", o.lossScaling, "'");
  }
  for (const char *flag : {"--als-bin-edge", "--als-threshold", "--als-update-period"})
    if (given(app, flag) && o.lossScaling != "histogram") throw error(flag, " needs --loss-scaling histogram");
  if (!(o.alsBinEdge > 0 && o.alsBinEdge <= 1))
    throw error("--als-bin-edge is a proportion of the largest representable value, in (0, 1]; got ", o.alsBinEdge);
  if (!(o.alsThreshold >= 0 && o.alsThreshold <= 1))
    throw error("--als-threshold is a proportion of the gradient elements, in [0, 1]; got ", o.alsThreshold);
  if (o.alsUpdatePeriod < 1) throw error("--als-update-period must be at least 1 step, got ", o.alsUpdatePeriod);
}

} // namespace popart::cli
