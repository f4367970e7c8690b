// MultiConv and MultiConvGrad: each convolution (or each data and weight gradient) is an ordinary
// Conv, ConvDataGrad or ConvWeightGrad kernel of its own, created at compile from the op's
// unpacked form (ir::unpackMultiConv), and the kernel runs them concurrently.
//
// oneDNN here runs on OpenMP (Debian's libdnnl links libgomp) and runs a primitive on one thread
// when it is called inside a parallel region; its jit kernels also split their work for the
// thread count they were created with. So the parts are created for one thread each, and one
// parallel region of the session's threads runs them: each thread runs its list of parts,
// planned at compile by longest-processing-time-first on their FLOPs. A convolution or data
// gradient of more FLOPs than a thread's even share is split by images into parts of about that
// share (each image's result is computed as in the whole batch; a weight gradient sums over the
// images, so it is not split). Where the plan would still leave threads idle for long (fewer
// parts than threads), the parts are created for all threads instead and run one after another,
// as separate Conv ops would.

#include "ir/ops/multiconv.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// The concurrent plan is taken when its longest thread has at most this much more work than an
/// even share of all the work.
constexpr double kMaxImbalance = 1.25;

/// One convolution or gradient of the op, on its own kernel.
struct Part {
  std::unique_ptr<Kernel> kernel;
  std::vector<int> inputs;       ///< the op's input index of each of the kernel's inputs (-1: omitted)
  std::vector<int64_t> inOffset; ///< bytes into that input (the first image of a batch slice)
  size_t output = 0;             ///< the op's output index of the kernel's output 0
  int64_t outOffset = 0;
  int64_t scratchOffset = 0;
  double flops = 0;
  std::string label;
  std::vector<const void *> in; ///< this run's input buffers
  std::array<void *, 1> out{};
};

/// Whether output \p i of \p op is read by anything (an op or as a graph output). The gradient
/// rule makes a dX for every convolution; one that no gradient needs (of the model's input) is
/// left uncomputed, as dead code removal would drop a separate ConvDataGrad.
bool outputRead(const ir::Op &op, size_t i) {
  if (!op.hasOutput(i)) return false;
  const ir::Tensor &t = op.output(i);
  if (!t.consumers().empty() || op.graph == nullptr) return true;
  const auto &outs = op.graph->outputs();
  return std::find(outs.begin(), outs.end(), t.id()) != outs.end();
}

/// One run of an unpacked op: on images [begin, begin + count) of its batch (all: count 0).
struct Work {
  const ir::Op *op = nullptr;
  int64_t begin = 0, count = 0;
  double flops = 0;
};

/// Whether \p op's images are independent: a Conv's or ConvDataGrad's, whose input 0 and output
/// are batched; a ConvWeightGrad sums over them.
bool splitsByImage(const ir::Op &op) { return op.type == "Conv" || op.type == "ConvDataGrad"; }

/// Bytes of one image of \p t.
int64_t imageBytes(const ir::Tensor &t) { return t.info().byteCount() / std::max<int64_t>(1, t.info().shape()[0]); }

/// Each of \p ops as one Work, or split by images into parts of about \p share FLOPs.
std::vector<Work> divide(const std::vector<const ir::Op *> &ops, double share) {
  std::vector<Work> work;
  for (const ir::Op *op : ops) {
    const double flops = ir::estimateFlops(*op);
    const int64_t images = op->inInfo(0).shape()[0];
    int64_t parts = 1;
    if (splitsByImage(*op) && share > 0 && flops > share)
      parts = std::min<int64_t>(images, static_cast<int64_t>(std::ceil(flops / share - 1e-9)));
    if (parts <= 1) {
      work.push_back({op, 0, 0, flops});
      continue;
    }
    for (int64_t p = 0, begin = 0; p < parts; ++p) { // counts differ by at most one
      int64_t count = images / parts + (p < images % parts ? 1 : 0);
      work.push_back({op, begin, count, flops * static_cast<double>(count) / static_cast<double>(images)});
      begin += count;
    }
  }
  return work;
}

/// The op of \p w in \p g: \p w.op itself, or a copy on its batch slice (input 0 and output 0 of
/// \p w.count images, sharing the other inputs and the fusion, so that kernels choose as for the
/// whole).
const ir::Op &sliceOp(ir::Graph &g, const Work &w) {
  if (w.count == 0) return *w.op;
  const ir::Op &op = *w.op;
  auto sliced = [&](const ir::Tensor &t) {
    TensorId id = t.id() + "@" + std::to_string(w.begin);
    Shape shape = t.info().shape();
    shape[0] = w.count;
    if (!g.hasTensor(id)) g.addTensor(id, ir::TensorKind::Stream, TensorInfo(t.info().dataType(), shape));
    return id;
  };
  std::vector<TensorId> inputs{sliced(op.input(0))};
  for (size_t i = 1; i < op.inputCount(); ++i)
    inputs.push_back(op.hasInput(i) ? op.input(i).id() : "");
  ir::Attributes attrs = op.attrs;
  if (op.type == "ConvDataGrad") {
    std::vector<int64_t> shape = attrs.getInts("input_shape");
    shape[0] = w.count;
    attrs.set("input_shape", shape);
  }
  TensorId out = op.output(0).id() + "@" + std::to_string(w.begin);
  ir::Op &copy = g.addOp(op.type, op.domain, op.version, op.name, attrs, inputs, {out});
  copy.fusion = op.fusion; // a fused Relu (kMultiConvReluAttr)
  copy.def->setup(copy);
  return copy;
}

/// Longest processing time first: \p flops assigned to \p bins threads; \returns each thread's parts.
std::vector<std::vector<size_t>> planTeam(const std::vector<double> &flops, size_t bins, double &makespan) {
  std::vector<size_t> order(flops.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return flops[a] > flops[b]; });
  std::vector<std::vector<size_t>> team(bins);
  std::vector<double> load(bins, 0.0);
  for (size_t p : order) {
    size_t t = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    team[t].push_back(p);
    load[t] += flops[p];
  }
  for (auto &parts : team)
    std::sort(parts.begin(), parts.end()); // in convolution order within a thread
  makespan = *std::max_element(load.begin(), load.end());
  return team;
}

/// planTeam of \p work on up to \p threads threads (none for fewer than 2 parts).
std::vector<std::vector<size_t>> plan(const std::vector<Work> &work, int threads, double &makespan) {
  const size_t bins = std::min(static_cast<size_t>(threads), work.size());
  if (bins < 2) return {};
  std::vector<double> flops(work.size());
  std::transform(work.begin(), work.end(), flops.begin(), [](const Work &w) { return w.flops; });
  return planTeam(flops, bins, makespan);
}

class MultiConvKernel : public Kernel {
public:
  MultiConvKernel(const ir::Op &op, const KernelContext &context, KernelProvider provider) {
    const bool grad = op.type == "MultiConvGrad";
    ir::UnpackedMultiConv u = ir::unpackMultiConv(op, true);
    std::vector<const ir::Op *> subOps;
    for (size_t i = 0; i < ir::multiConvCount(op); ++i) {
      if (!grad && op.hasOutput(i)) subOps.push_back(u.conv[i]);
      if (grad && u.dataGrad[i] && outputRead(op, 2 * i)) subOps.push_back(u.dataGrad[i]);
      if (grad && u.weightGrad[i] && outputRead(op, 2 * i + 1)) subOps.push_back(u.weightGrad[i]);
    }
    const int threads = std::max(1, context.threads);
    double total = 0;
    for (const ir::Op *sub : subOps)
      total += ir::estimateFlops(*sub);
    // The plan of the whole parts, and of parts split to a thread's share where that is shorter.
    std::vector<Work> work = divide(subOps, 0.0);
    double makespan = total;
    if (threads >= 2) {
      team_ = plan(work, threads, makespan);
      std::vector<Work> split = divide(subOps, total / threads);
      double splitMakespan = total;
      auto splitTeam = plan(split, threads, splitMakespan);
      if (split.size() > work.size() && splitMakespan < 0.99 * makespan) {
        work = std::move(split);
        team_ = std::move(splitTeam);
        makespan = splitMakespan;
      }
    }
    const bool concurrent = team_.size() >= 2 && makespan <= kMaxImbalance * total / threads;
    if (!concurrent) {
      team_.clear();
      work = divide(subOps, 0.0); // whole, on all threads
    }

    // Parts run concurrently are made for one thread (see the file comment).
    KernelContext partContext = context;
    const int savedThreads = omp_get_max_threads();
    if (concurrent) {
      partContext.threads = 1;
      omp_set_num_threads(1);
    }
    try {
      for (const Work &w : work) {
        const ir::Op &sub = sliceOp(*u.graph, w);
        Part part;
        part.kernel = createKernel(sub, provider, partContext);
        part.flops = w.flops;
        for (size_t j = 0; j < sub.inputCount(); ++j) {
          const ir::Tensor *t = w.op->hasInput(j) ? &w.op->input(j) : nullptr;
          part.inputs.push_back(t ? static_cast<int>(u.opInput.at(t->id())) : -1);
          part.inOffset.push_back(j == 0 ? w.begin * imageBytes(*t) : 0);
        }
        part.output = u.opOutput.at(w.op->output(0).id());
        part.outOffset = w.begin * imageBytes(w.op->output(0));
        part.in.resize(part.inputs.size());
        part.label = sub.type + " " + std::to_string(grad ? part.output / 2 : part.output);
        if (w.count > 0) part.label += " [" + std::to_string(w.begin) + ", " + std::to_string(w.begin + w.count) + ")";
        const int64_t bytes = (part.kernel->scratchBytes() + 63) / 64 * 64;
        if (concurrent) {
          part.scratchOffset = scratchBytes_;
          scratchBytes_ += bytes;
        } else {
          scratchBytes_ = std::max(scratchBytes_, bytes);
        }
        parts_.push_back(std::move(part));
      }
    } catch (...) {
      omp_set_num_threads(savedThreads);
      throw;
    }
    omp_set_num_threads(savedThreads);
    describe(concurrent, threads, makespan, total);
  }

  void run(const KernelArgs &args) override {
    for (Part &p : parts_) {
      for (size_t j = 0; j < p.inputs.size(); ++j)
        p.in[j] = p.inputs[j] < 0 ? nullptr : static_cast<const char *>(args.inputs[p.inputs[j]]) + p.inOffset[j];
      p.out[0] = static_cast<char *>(args.outputs[p.output]) + p.outOffset;
    }
    auto *scratch = static_cast<char *>(args.scratch);
    auto runPart = [scratch](Part &p) {
      KernelArgs a;
      a.inputs = p.in.data();
      a.inputCount = p.in.size();
      a.outputs = p.out.data();
      a.outputCount = 1;
      a.scratch = scratch ? scratch + p.scratchOffset : nullptr;
      p.kernel->run(a);
    };
    if (team_.empty()) {
      for (Part &p : parts_)
        runPart(p);
      return;
    }
    const auto teamSize = static_cast<int>(team_.size());
#pragma omp parallel num_threads(teamSize)
    {
      // A kernel that asks OpenMP for its thread count inside a part gets the one it runs on.
      omp_set_num_threads(1);
      // Should OpenMP give fewer threads than asked, the ones there take the others' lists too.
      for (int t = omp_get_thread_num(); t < teamSize; t += omp_get_num_threads())
        for (size_t p : team_[static_cast<size_t>(t)])
          runPart(parts_[p]);
    }
  }

  int64_t scratchBytes() const override { return scratchBytes_; }
  std::string choice() const override { return choice_; }

private:
  void describe(bool concurrent, int threads, double makespan, double total) {
    if (!concurrent) {
      choice_ =
          std::to_string(parts_.size()) + " convolutions one after another on " + std::to_string(threads) + " threads";
      if (team_.empty() && parts_.size() >= 2 && threads >= 2 && total > 0)
        choice_ += " (concurrently, the longest thread would do " +
                   std::to_string(std::lround(100.0 * makespan / total)) + "% of the work)";
      return;
    }
    choice_ = "concurrent on " + std::to_string(team_.size()) + " threads (the longest has " +
              std::to_string(std::lround(100.0 * makespan / total)) + "% of the FLOPs):";
    for (size_t t = 0; t < team_.size(); ++t) {
      choice_ += t ? " |" : "";
      for (size_t p : team_[t])
        choice_ += " " + parts_[p].label;
    }
  }

  std::vector<Part> parts_;
  /// Each thread's parts; empty: the parts run one after another on all threads.
  std::vector<std::vector<size_t>> team_;
  int64_t scratchBytes_ = 0;
  std::string choice_;
};

/// The oneDNN entry: its parts take the best kernel each (oneDNN's for f32 and bf16 convolutions).
Support supportsOnDnnl(const ir::Op &op) {
  for (const ir::Tensor *t : op.inputs)
    if (t && t->info().dataType() == DataType::DOUBLE)
      return Support::no("DOUBLE convolutions have only reference kernels");
  return Support::yes();
}

std::unique_ptr<Kernel> createWithBestParts(const ir::Op &op, const KernelContext &context) {
  return std::make_unique<MultiConvKernel>(op, context, KernelProvider::Any);
}

std::unique_ptr<Kernel> createWithReferenceParts(const ir::Op &op, const KernelContext &context) {
  return std::make_unique<MultiConvKernel>(op, context, KernelProvider::Reference);
}

} // namespace

void registerDnnlMultiConvKernels(KernelRegistry &r) {
  for (const char *type : {"MultiConv", "MultiConvGrad"}) {
    r.add({"ai.graphcore", type, KernelProvider::Dnnl, supportsOnDnnl, createWithBestParts});
    // The reference entry runs the reference Conv kernels, concurrently as well: the oracle of
    // the entry above, and what DOUBLE graphs (gradient checks) run.
    r.add({"ai.graphcore", type, KernelProvider::Reference, {}, createWithReferenceParts});
  }
}

} // namespace popart::backend_cpu
