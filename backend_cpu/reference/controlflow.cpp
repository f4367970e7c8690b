// Kernels of If, Loop, Scan and SequenceMap: each runs its subgraph through a nested
// ExecutionPlan. The plan is compiled once, when the kernel is created, for the infos the op's
// setup used; where the subgraph's shapes depend on values known only at run time (a Slice by
// the iteration number, sequence elements of varying shapes), the subgraph is specialised for the
// infos (and the iteration number and condition) it meets, and each specialisation is compiled
// once and cached.

#include "ir/ops/controlflow.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/plan.hpp"
#include "core/log.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cstring>
#include <map>

namespace popart::backend_cpu {

namespace {

/// One input of a subgraph run: a tensor's bytes or a SequenceData, with its info (for a
/// sequence, with the element list of the value itself).
struct Value {
  const void *data = nullptr;
  TensorInfo info;
};

Value valueOf(const void *data, const TensorInfo &staticInfo) {
  if (staticInfo.isTensor()) return {data, staticInfo};
  return {data, static_cast<const SequenceData *>(data)->info(staticInfo.valueKind(), staticInfo.dataType())};
}

/// Copies \p src (a tensor of \p info, or a SequenceData) to \p dst, checking a tensor has the
/// info \p expected that the plan was compiled for.
/// Errors name \p owner (the op) and \p what (the value); nothing is formatted unless one is thrown.
void copyValue(const void *src, const TensorInfo &info, void *dst, const TensorInfo &expected, const std::string &owner,
               const char *what, const std::string &name) {
  if (!expected.isTensor()) {
    *static_cast<SequenceData *>(dst) = *static_cast<const SequenceData *>(src);
    return;
  }
  if (info != expected)
    throw error(owner, ": ", what, " '", name, "' is ", info.toString(), " but the plan was compiled for ",
                expected.toString());
  if (info.byteCount()) std::memcpy(dst, src, static_cast<size_t>(info.byteCount()));
}

/// A subgraph attribute of an op with its compiled plans.
class SubgraphRunner {
public:
  struct Instance {
    std::unique_ptr<ir::Graph> graph;
    std::unique_ptr<ExecutionPlan> plan;
  };

  /// \p staticInfos: the infos of the subgraph's inputs for the plan compiled now; \p bake: inputs
  /// whose values are baked into a specialisation when that plan cannot be compiled.
  SubgraphRunner(const ir::Op &op, const char *attr, const std::vector<TensorInfo> &staticInfos,
                 std::vector<bool> bake = {})
      : op_(op.debugName()), attr_(attr), body_(op.attrs.getGraph(attr)), bake_(std::move(bake)) {
    if (!body_) throw error(op_, ": subgraph attribute '", attr, "' is missing");
    staticInfos_ = staticInfos;
    bake_.resize(staticInfos.size(), false);
    try {
      static_ = compile(staticInfos, {});
    } catch (const error &e) {
      logging::logger().debug("{}: subgraph '{}' is specialised at run time: {}", op_, attr_, e.what());
    }
  }

  /// Sets the subgraph's inputs to \p values (its input order) and runs it; \returns the instance
  /// that ran, whose outputs the caller reads.
  Instance &run(const std::vector<Value> &values) {
    Instance *inst = nullptr;
    if (static_ && matchesStatic(values)) {
      inst = static_.get();
    } else {
      std::string key;
      for (size_t i = 0; i < values.size(); ++i) {
        key += values[i].info.toString();
        if (!values[i].info.elementsKnown()) key += "|";
        for (const TensorInfo &e : values[i].info.elements())
          key += e.toString();
        if (bake_[i] && values[i].info.isTensor())
          key.append(static_cast<const char *>(values[i].data), static_cast<size_t>(values[i].info.byteCount()));
        key += ";";
      }
      auto it = cache_.find(key);
      if (it == cache_.end()) {
        if (cache_.size() >= 256) cache_.clear(); // bounds memory when every iteration differs
        std::vector<TensorInfo> infos;
        std::vector<TensorData> baked(values.size());
        std::vector<const TensorData *> bakedPtrs(values.size(), nullptr);
        for (size_t i = 0; i < values.size(); ++i) {
          infos.push_back(values[i].info);
          if (bake_[i] && values[i].info.isTensor()) {
            baked[i] = TensorData(values[i].info, values[i].data);
            bakedPtrs[i] = &baked[i];
          }
        }
        it = cache_.emplace(key, compile(infos, bakedPtrs)).first;
      }
      inst = it->second.get();
    }
    ExecutionPlan &plan = *inst->plan;
    const auto &inputs = inst->graph->inputs();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ir::Tensor &t = inst->graph->tensor(inputs[i]);
      if (t.kind() == ir::TensorKind::Const) continue; // baked in
      copyValue(values[i].data, values[i].info, plan.address(inputs[i]), plan.info(inputs[i]), op_, "subgraph input",
                inputs[i]);
    }
    plan.run();
    return *inst;
  }

  /// Copies output \p k of \p inst to \p dst, which holds a value of \p expected.
  void readOutput(Instance &inst, size_t k, void *dst, const TensorInfo &expected) const {
    const TensorId &id = inst.graph->outputs()[k];
    copyValue(inst.plan->address(id), inst.plan->info(id), dst, expected, op_, "subgraph output", id);
  }
  static const void *outputAddress(Instance &inst, size_t k) { return inst.plan->address(inst.graph->outputs()[k]); }
  static const TensorInfo &outputInfo(Instance &inst, size_t k) { return inst.plan->info(inst.graph->outputs()[k]); }

private:
  bool matchesStatic(const std::vector<Value> &values) const {
    for (size_t i = 0; i < values.size(); ++i) {
      const TensorInfo &s = staticInfos_[i];
      if (s.isTensor() ? values[i].info != s
                       : values[i].info.valueKind() != s.valueKind() || values[i].info.dataType() != s.dataType())
        return false;
    }
    return true;
  }

  std::unique_ptr<Instance> compile(const std::vector<TensorInfo> &infos,
                                    const std::vector<const TensorData *> &values) const {
    auto inst = std::make_unique<Instance>();
    inst->graph = ir::specialiseSubgraph(op_, attr_.c_str(), *body_, infos, values);
    for (const TensorId &id : inst->graph->outputs())
      if (!inst->graph->tensor(id).info().isKnown())
        throw error(op_, ": subgraph '", attr_, "' output '", id, "' has unknown shape ",
                    inst->graph->tensor(id).info().toString());
    inst->plan = std::make_unique<ExecutionPlan>(*inst->graph, CompileOptions{});
    return inst;
  }

  std::string op_, attr_;
  std::shared_ptr<const ir::Graph> body_;
  std::vector<bool> bake_;
  std::vector<TensorInfo> staticInfos_;
  std::unique_ptr<Instance> static_;
  std::map<std::string, std::unique_ptr<Instance>> cache_;
};

/// Values of \p body's inputs: \p formal, then the captured op inputs from \p args.
/// Points \p values (one per subgraph input, sized by the caller once) at \p formal, then at the
/// captured op inputs in \p args. Infos are only assigned when they change (tensors: never), so
/// binding allocates nothing unless sequences are involved.
void bindValues(std::vector<Value> &values, const std::vector<int> &sources, const std::vector<TensorInfo> &inInfos,
                const KernelArgs &args, const std::vector<Value> &formal) {
  values.resize(sources.size());
  size_t f = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    int s = sources[i];
    if (s < 0) {
      const Value &v = formal[f++];
      values[i].data = v.data;
      if (values[i].info != v.info) values[i].info = v.info;
      continue;
    }
    const TensorInfo &info = inInfos[static_cast<size_t>(s)];
    if (info.isTensor()) {
      values[i].data = args.inputs[static_cast<size_t>(s)];
      if (values[i].info != info) values[i].info = info;
    } else {
      values[i] = valueOf(args.inputs[static_cast<size_t>(s)], info);
    }
  }
}

std::vector<TensorInfo> inputInfos(const ir::Op &op) {
  std::vector<TensorInfo> v;
  for (const ir::Tensor *t : op.inputs)
    v.push_back(t ? t->info() : TensorInfo());
  return v;
}
std::vector<TensorInfo> outputInfos(const ir::Op &op) {
  std::vector<TensorInfo> v;
  for (const ir::Tensor *t : op.outputs)
    v.push_back(t ? t->info() : TensorInfo());
  return v;
}

/// Where formal inputs go in a subgraph's input list (infos in subgraph order).
std::vector<TensorInfo> withCaptures(const ir::Op &op, const char *attr, const std::vector<TensorInfo> &formal) {
  return ir::subgraphInputInfos(op, *op.attrs.getGraph(attr), formal);
}

/// A holder for one value the kernel keeps between iterations: a tensor or a SequenceData.
struct Slot {
  TensorInfo info;
  TensorData tensor;
  SequenceData sequence;
  explicit Slot(const TensorInfo &i) : info(i), tensor(i.isTensor() ? TensorData(i) : TensorData()) {}
  void *data() { return info.isTensor() ? tensor.data() : static_cast<void *>(&sequence); }
  Value value() { return valueOf(data(), info); }
};

class IfKernel : public Kernel {
public:
  explicit IfKernel(const ir::Op &op)
      : inInfos_(inputInfos(op)), outInfos_(outputInfos(op)),
        then_(op, "then_branch", withCaptures(op, "then_branch", {})),
        else_(op, "else_branch", withCaptures(op, "else_branch", {})),
        thenSources_(ir::subgraphInputSources(op, *op.attrs.getGraph("then_branch"))),
        elseSources_(ir::subgraphInputSources(op, *op.attrs.getGraph("else_branch"))) {}

  void run(const KernelArgs &args) override {
    bool cond = *args.in<bool>(0);
    SubgraphRunner &r = cond ? then_ : else_;
    std::vector<Value> &values = cond ? thenValues_ : elseValues_;
    bindValues(values, cond ? thenSources_ : elseSources_, inInfos_, args, noFormal_);
    auto &inst = r.run(values);
    for (size_t k = 0; k < outInfos_.size(); ++k)
      if (args.hasOutput(k)) r.readOutput(inst, k, args.outputs[k], outInfos_[k]);
  }

private:
  std::vector<TensorInfo> inInfos_, outInfos_;
  SubgraphRunner then_, else_;
  std::vector<int> thenSources_, elseSources_;
  std::vector<Value> thenValues_, elseValues_, noFormal_;
};

class LoopKernel : public Kernel {
public:
  explicit LoopKernel(const ir::Op &op)
      : name_(op.debugName()), inInfos_(inputInfos(op)), outInfos_(outputInfos(op)),
        carried_(ir::ownInputCount(op) - 2), sources_(ir::subgraphInputSources(op, *op.attrs.getGraph("body"))),
        body_(op, "body", withCaptures(op, "body", formalInfos(op)), bakeIterationAndCond(op)) {
    state_.reserve(carried_);
    for (size_t i = 0; i < carried_; ++i)
      state_.emplace_back(outInfos_[i]);
    formal_ = {{&iteration_, TensorInfo(DataType::INT64, {})}, {&cond_, TensorInfo(DataType::BOOL, {})}};
    for (Slot &s : state_)
      formal_.push_back(s.value());
    for (const ir::Tensor *t : op.inputs)
      inputNames_.push_back(t ? t->id() : "");
    for (const ir::Tensor *t : op.outputs)
      outputNames_.push_back(t ? t->id() : "");
  }

  void run(const KernelArgs &args) override {
    const bool hasTrips = args.hasInput(0);
    const int64_t trips = hasTrips ? std::max<int64_t>(0, *args.in<int64_t>(0)) : 0; // negative: no iteration
    bool cond = args.hasInput(1) ? *args.in<bool>(1) : true;
    for (size_t i = 0; i < carried_; ++i) {
      if (!args.hasInput(2 + i)) throw error(name_, ": loop-carried input ", i, " is missing");
      Slot &s = state_[i];
      if (s.info.isTensor())
        copyValue(args.inputs[2 + i], inInfos_[2 + i], s.data(), s.info, name_, "loop-carried value",
                  inputNames_[2 + i]);
      else
        s.sequence = *static_cast<const SequenceData *>(args.inputs[2 + i]);
    }
    const size_t scans = outInfos_.size() - carried_;
    int64_t &it = iteration_;
    cond_ = cond;
    for (it = 0; (!hasTrips || it < trips) && cond_; ++it) {
      for (size_t i = 0; i < carried_; ++i)
        if (!state_[i].info.isTensor()) formal_[2 + i] = state_[i].value();
      bindValues(values_, sources_, inInfos_, args, formal_);
      auto &inst = body_.run(values_);
      // Read everything before writing: the body's outputs may be its inputs.
      const TensorInfo &condInfo = SubgraphRunner::outputInfo(inst, 0);
      if (condInfo.elementCount() != 1 || condInfo.dataType() != DataType::BOOL)
        throw error(name_, ": the body's condition output is ", condInfo.toString(), ", expected BOOL[]");
      bool next = *static_cast<const bool *>(SubgraphRunner::outputAddress(inst, 0));
      for (size_t i = 0; i < carried_; ++i)
        body_.readOutput(inst, 1 + i, state_[i].data(), state_[i].info);
      for (size_t k = 0; k < scans; ++k) {
        const TensorInfo &e = SubgraphRunner::outputInfo(inst, 1 + carried_ + k);
        const TensorInfo &out = outInfos_[carried_ + k];
        int64_t bytes = e.byteCount();
        if (e.dataType() != out.dataType() || bytes * out.shape()[0] != out.byteCount() || it >= out.shape()[0])
          throw error(name_, ": scan output ", k, " of iteration ", it, " is ", e.toString(),
                      ", which does not fit the compiled output ", out.toString());
        if (args.hasOutput(carried_ + k) && bytes)
          std::memcpy(static_cast<uint8_t *>(args.outputs[carried_ + k]) + it * bytes,
                      SubgraphRunner::outputAddress(inst, 1 + carried_ + k), static_cast<size_t>(bytes));
      }
      cond_ = next;
    }
    if (scans > 0 && it != trips)
      throw error(name_, ": stopped after ", it, " of ", trips,
                  " iterations, but its scan outputs were sized for the trip count");
    for (size_t i = 0; i < carried_; ++i)
      if (args.hasOutput(i))
        copyValue(state_[i].data(), state_[i].info, args.outputs[i], outInfos_[i], name_, "output", outputNames_[i]);
  }

private:
  static std::vector<TensorInfo> formalInfos(const ir::Op &op) {
    std::vector<TensorInfo> f{TensorInfo(DataType::INT64, {}), TensorInfo(DataType::BOOL, {})};
    for (size_t i = 0; i + 2 < ir::ownInputCount(op); ++i)
      f.push_back(op.outInfo(i)); // the merged info the setup found for all iterations
    return f;
  }
  static std::vector<bool> bakeIterationAndCond(const ir::Op &op) {
    std::vector<int> sources = ir::subgraphInputSources(op, *op.attrs.getGraph("body"));
    std::vector<bool> bake(sources.size(), false);
    size_t formal = 0;
    for (size_t i = 0; i < sources.size(); ++i)
      if (sources[i] < 0 && formal++ < 2) bake[i] = true;
    return bake;
  }

  std::string name_;
  std::vector<TensorInfo> inInfos_, outInfos_;
  size_t carried_;
  std::vector<int> sources_;
  SubgraphRunner body_;
  std::vector<Slot> state_;
  int64_t iteration_ = 0;
  bool cond_ = true;
  std::vector<Value> formal_, values_;
  std::vector<std::string> inputNames_, outputNames_;
};

/// Copies slice \p t along \p axis of a tensor of \p shape between \p whole and \p slice
/// (into the slice when \p gather, else out of it).
void copySlice(uint8_t *whole, const Shape &shape, int64_t axis, int64_t t, uint8_t *slice, size_t es, bool gather) {
  int64_t outer = 1, inner = 1, len = shape[static_cast<size_t>(axis)];
  for (int64_t d = 0; d < axis; ++d)
    outer *= shape[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d)
    inner *= shape[d];
  size_t bytes = static_cast<size_t>(inner) * es;
  for (int64_t o = 0; o < outer; ++o) {
    uint8_t *w = whole + static_cast<size_t>((o * len + t) * inner) * es, *s = slice + static_cast<size_t>(o) * bytes;
    if (gather)
      std::memcpy(s, w, bytes);
    else
      std::memcpy(w, s, bytes);
  }
}

class ScanKernel : public Kernel {
public:
  explicit ScanKernel(const ir::Op &op)
      : name_(op.debugName()), inInfos_(inputInfos(op)), outInfos_(outputInfos(op)), l_(ir::scanLayout(op)),
        sources_(ir::subgraphInputSources(op, *op.attrs.getGraph("body"))),
        body_(op, "body", withCaptures(op, "body", formalInfos(op))) {
    std::vector<TensorInfo> f = formalInfos(op);
    slots_.reserve(f.size());
    for (const TensorInfo &i : f)
      slots_.emplace_back(i);
    for (Slot &s : slots_)
      formal_.push_back(s.value());
    // Shapes of one batch entry, so that run() copies no Shape.
    for (size_t j = 0; j < l_.scanInputs; ++j) {
      inShapes_.push_back(inInfos_[l_.firstState + l_.states + j].shape());
      if (l_.batched) inShapes_.back().erase(inShapes_.back().begin());
    }
    for (size_t k = 0; k < l_.scanOutputs; ++k) {
      outShapes_.push_back(outInfos_[l_.states + k].shape());
      if (l_.batched) outShapes_.back().erase(outShapes_.back().begin());
    }
  }

  void run(const KernelArgs &args) override {
    for (int64_t b = 0; b < l_.batch; ++b) {
      for (size_t i = 0; i < l_.states; ++i) {
        int64_t bytes = slots_[i].info.byteCount();
        std::memcpy(slots_[i].tensor.data(), args.in<uint8_t>(l_.firstState + i) + b * bytes,
                    static_cast<size_t>(bytes));
      }
      for (int64_t t = 0; t < l_.length; ++t) {
        for (size_t j = 0; j < l_.scanInputs; ++j) {
          size_t in = l_.firstState + l_.states + j;
          const TensorInfo &info = inInfos_[in];
          Slot &s = slots_[l_.states + j];
          int64_t step = l_.inputReverse[j] ? l_.length - 1 - t : t;
          const Shape &shape = inShapes_[j];
          int64_t per = info.byteCount() / l_.batch;
          copySlice(const_cast<uint8_t *>(args.in<uint8_t>(in)) + b * per, shape, l_.inputAxes[j], step,
                    static_cast<uint8_t *>(s.tensor.data()), dataTypeSize(info.dataType()), true);
        }
        bindValues(values_, sources_, inInfos_, args, formal_);
        auto &inst = body_.run(values_);
        for (size_t i = 0; i < l_.states; ++i)
          body_.readOutput(inst, i, slots_[i].data(), slots_[i].info);
        for (size_t k = 0; k < l_.scanOutputs; ++k) {
          if (!args.hasOutput(l_.states + k)) continue;
          const TensorInfo &out = outInfos_[l_.states + k];
          const Shape &shape = outShapes_[k];
          int64_t per = out.byteCount() / l_.batch;
          const TensorInfo &e = SubgraphRunner::outputInfo(inst, l_.states + k);
          if (e.byteCount() * l_.length != per)
            throw error(name_, ": scan output ", k, " is ", e.toString(), ", which does not fit ", out.toString());
          int64_t step = l_.outputReverse[k] ? l_.length - 1 - t : t;
          int64_t axis =
              l_.outputAxes[k] < 0 ? l_.outputAxes[k] + static_cast<int64_t>(shape.size()) : l_.outputAxes[k];
          copySlice(
              static_cast<uint8_t *>(args.outputs[l_.states + k]) + b * per, shape, axis, step,
              const_cast<uint8_t *>(static_cast<const uint8_t *>(SubgraphRunner::outputAddress(inst, l_.states + k))),
              dataTypeSize(out.dataType()), false);
        }
      }
      for (size_t i = 0; i < l_.states; ++i) {
        if (!args.hasOutput(i)) continue;
        int64_t bytes = slots_[i].info.byteCount();
        std::memcpy(args.out<uint8_t>(i) + b * bytes, slots_[i].tensor.data(), static_cast<size_t>(bytes));
      }
    }
  }

private:
  static std::vector<TensorInfo> formalInfos(const ir::Op &op) {
    ir::ScanLayout l = ir::scanLayout(op);
    std::vector<TensorInfo> f;
    for (size_t i = 0; i < l.states; ++i) {
      Shape s = op.inInfo(l.firstState + i).shape();
      if (l.batched) s.erase(s.begin());
      f.emplace_back(op.inInfo(l.firstState + i).dataType(), s);
    }
    for (size_t j = 0; j < l.scanInputs; ++j) {
      const TensorInfo &in = op.inInfo(l.firstState + l.states + j);
      Shape s = in.shape();
      if (l.batched) s.erase(s.begin());
      s.erase(s.begin() + l.inputAxes[j]);
      f.emplace_back(in.dataType(), s);
    }
    return f;
  }

  std::string name_;
  std::vector<TensorInfo> inInfos_, outInfos_;
  ir::ScanLayout l_;
  std::vector<int> sources_;
  SubgraphRunner body_;
  std::vector<Slot> slots_;
  std::vector<Value> formal_, values_;
  std::vector<Shape> inShapes_, outShapes_;
};

class SequenceMapKernel : public Kernel {
public:
  explicit SequenceMapKernel(const ir::Op &op)
      : name_(op.debugName()), inInfos_(inputInfos(op)), outInfos_(outputInfos(op)), own_(ir::ownInputCount(op)),
        sources_(ir::subgraphInputSources(op, *op.attrs.getGraph("body"))),
        body_(op, "body", withCaptures(op, "body", formalInfos(op))) {}

  void run(const KernelArgs &args) override {
    size_t n = static_cast<const SequenceData *>(args.inputs[0])->items.size();
    for (size_t i = 1; i < own_; ++i)
      if (!inInfos_[i].isTensor() && static_cast<const SequenceData *>(args.inputs[i])->items.size() != n)
        throw error(name_, ": input sequences have different lengths (", n, " and ",
                    static_cast<const SequenceData *>(args.inputs[i])->items.size(), ")");
    std::vector<SequenceData> outs(outInfos_.size());
    for (size_t e = 0; e < n; ++e) {
      std::vector<Value> formal;
      for (size_t i = 0; i < own_; ++i) {
        if (inInfos_[i].isTensor()) {
          formal.push_back({args.inputs[i], inInfos_[i]});
        } else {
          const TensorData &t = static_cast<const SequenceData *>(args.inputs[i])->items[e];
          formal.push_back({t.data(), t.info()});
        }
      }
      bindValues(values_, sources_, inInfos_, args, formal);
      auto &inst = body_.run(values_);
      for (size_t k = 0; k < outs.size(); ++k)
        outs[k].items.emplace_back(SubgraphRunner::outputInfo(inst, k), SubgraphRunner::outputAddress(inst, k));
    }
    for (size_t k = 0; k < outs.size(); ++k)
      if (args.hasOutput(k)) *static_cast<SequenceData *>(args.outputs[k]) = std::move(outs[k]);
  }

private:
  static std::vector<TensorInfo> formalInfos(const ir::Op &op) {
    std::vector<TensorInfo> f;
    for (size_t i = 0; i < ir::ownInputCount(op); ++i)
      f.push_back(op.inInfo(i).isTensor() ? op.inInfo(i) : op.inInfo(i).elementInfo());
    return f;
  }

  std::string name_;
  std::vector<TensorInfo> inInfos_, outInfos_;
  size_t own_;
  std::vector<int> sources_;
  SubgraphRunner body_;
  std::vector<Value> values_;
};

} // namespace

void registerReferenceControlFlowKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "If", KernelProvider::Reference, nullptr, makeKernel<IfKernel>});
  r.add({"ai.onnx", "Loop", KernelProvider::Reference, nullptr, makeKernel<LoopKernel>});
  r.add({"ai.onnx", "Scan", KernelProvider::Reference, nullptr, makeKernel<ScanKernel>});
  r.add({"ai.onnx", "SequenceMap", KernelProvider::Reference, nullptr, makeKernel<SequenceMapKernel>});
}

} // namespace popart::backend_cpu
