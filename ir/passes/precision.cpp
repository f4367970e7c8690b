// convertPrecision: the fp16.32, fp16.16 and bf16 modes as one graph rewrite (docs/precision.md).
// Every float tensor is stored in the low type except where an op of fp32Ops() computes; each
// tensor is cast once per type it is read in, so the casts sit on tensors, not on consumers.

#include "ir/passes/precision.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/passes/pass_manager.hpp"
#include "ir/passes/rewrite.hpp"

#include <popart/error.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace popart::ir {

const std::vector<Fp32Op> &fp32Ops() {
  static const std::vector<Fp32Op> ops{
      {"SoftmaxCrossEntropyLoss", "a loss: log-softmax and a mean over the batch", false},
      {"NegativeLogLikelihoodLoss", "a loss: a mean over the batch", false},
      {"BatchNormalization", "statistics in fp32, data in the low type", false, true},
      {"InstanceNormalization", "per-instance statistics", false},
      {"MeanVarianceNormalization", "statistics", false},
      {"CumSum", "a running sum outgrows fp16's range and bf16's precision", false},
      {"Range", "positions must stay exact integers", false},
      {"LSTM", "a recurrence over time steps (and no 16-bit gradient kernels yet)", false},
      {"GRU", "a recurrence over time steps (and no 16-bit gradient kernels yet)", false},
      {"RNN", "a recurrence over time steps (and no 16-bit gradient kernels yet)", false},
      {"ReduceSum", "a sum", true},
      {"ReduceMean", "a sum", true},
      {"ReduceSumSquare", "a sum of squares", true},
      {"ReduceL1", "a sum", true},
      {"ReduceL2", "a sum of squares", true},
      {"ReduceLogSum", "a sum", true},
      {"ReduceLogSumExp", "a sum of exponentials", true},
      {"ReduceProd", "a product", true},
  };
  return ops;
}

namespace {

bool isFloat16Or32(DataType t) { return t == DataType::FLOAT || t == DataType::FLOAT16 || t == DataType::BFLOAT16; }

/// Elements summed into each output of \p op (0 when unknown).
int64_t reductionLength(const Op &op) {
  if (!op.hasInput(0) || !op.hasOutput(0) || !op.outInfo(0).isKnown()) return 0;
  return op.inInfo(0).elementCount() / std::max<int64_t>(1, op.outInfo(0).elementCount());
}

const char *suffix(DataType t) {
  switch (t) {
  case DataType::FLOAT16: return "fp16";
  case DataType::BFLOAT16: return "bf16";
  default: return "fp32";
  }
}

class Converter {
public:
  Converter(Graph &graph, const PrecisionPolicy &policy, const std::vector<TensorId> &keep, StreamTypes *streams,
            TensorId loss)
      : graph_(graph), policy_(policy), kept_(keep.begin(), keep.end()),
        streams_(policy.lowStreams ? streams : nullptr), loss_(std::move(loss)) {
    for (const auto &id : graph.outputs())
      kept_.insert(id);
    for (const auto &[t, use] : shapeDecidingTensors(graph))
      shapeDeciding_.insert(t);
    findLayoutOpsForProducts();
  }

  int run() {
    if (policy_.low == DataType::UNDEFINED) return 0;
    if (policy_.low != DataType::FLOAT16 && policy_.low != DataType::BFLOAT16)
      throw error("convertPrecision: the low type must be FLOAT16 or BFLOAT16, got ", toString(policy_.low));
    if (policy_.masterWeights) promoteVariables();
    for (Op *op : graph_.schedule())
      convertOp(*op);
    if (streams_) streamInputsLow();
    if (!policy_.masterWeights) convertVariablesInPlace();
    return changes_;
  }

private:
  /// A 16-bit Variable (a model exported after model.half()) becomes a FLOAT master copy, its
  /// values widened exactly; the ops that read it then read it through one Cast, as a FLOAT
  /// model's weights.
  void promoteVariables() {
    for (const auto &[id, t] : graph_.tensors()) {
      DataType type = t->info().dataType();
      if (t->kind() != TensorKind::Variable || (type != DataType::FLOAT16 && type != DataType::BFLOAT16) ||
          kept_.count(id) || shapeDeciding_.count(t.get()))
        continue;
      if (t->data()) t->setData(std::make_shared<TensorData>(convertedData(*t->data(), DataType::FLOAT)));
      t->setInfo(TensorInfo(DataType::FLOAT, t->info().shape()));
      ++changes_;
    }
  }

  /// A FLOAT graph input read only through its Cast to the low type becomes a low input, which
  /// the Cast's readers read directly; the session narrows the user's values as it copies them.
  void streamInputsLow() {
    for (const TensorId &id : graph_.inputs()) {
      Tensor *t = graph_.findTensor(id);
      auto cast = casts_.find({id, policy_.low});
      if (!t || t->producer() || t->kind() != TensorKind::Stream || t->info().dataType() != DataType::FLOAT ||
          kept_.count(id) || cast == casts_.end() || t->consumers().size() != 1)
        continue;
      Tensor &low = graph_.tensor(cast->second);
      if (t->consumers()[0] != low.producer()) continue;
      for (Op *reader : std::vector<Op *>(low.consumers()))
        for (size_t i = 0; i < reader->inputCount(); ++i)
          if (reader->inputs[i] == &low) graph_.setOpInput(*reader, i, t);
      graph_.removeOp(*low.producer());
      graph_.removeTensor(cast->second);
      casts_.erase(cast);
      t->setInfo(TensorInfo(policy_.low, t->info().shape()));
      streams_->host[id] = DataType::FLOAT;
    }
  }

  /// fp16.16: a FLOAT Variable read only through its Cast to the low type becomes a low Variable
  /// (no master copy), which the Cast's readers read directly.
  void convertVariablesInPlace() {
    std::vector<std::pair<TensorId, TensorId>> converted;
    for (const auto &[key, castId] : casts_) {
      Tensor *t = graph_.findTensor(key.first);
      if (key.second != policy_.low || !t || t->kind() != TensorKind::Variable || kept_.count(t->id()) ||
          t->consumers().size() != 1 || t->consumers()[0]->type != "Cast")
        continue;
      converted.emplace_back(key.first, castId);
    }
    for (const auto &[id, castId] : converted) {
      Tensor &w = graph_.tensor(id);
      Tensor &cast = graph_.tensor(castId);
      for (Op *reader : std::vector<Op *>(cast.consumers()))
        for (size_t i = 0; i < reader->inputCount(); ++i)
          if (reader->inputs[i] == &cast) graph_.setOpInput(*reader, i, &w);
      graph_.removeOp(*cast.producer());
      graph_.removeTensor(castId);
      if (w.data()) w.setData(std::make_shared<TensorData>(convertedData(*w.data(), policy_.low)));
      w.setInfo(TensorInfo(policy_.low, w.info().shape()));
    }
  }

  /// The layout ops (no arithmetic: exact in any type) whose results only products read, directly or
  /// through other such ops, as a weight's Transpose before its MatMul: they run in the low type,
  /// so that the Cast comes before them and the fusions see the product's operand as it is.
  void findLayoutOpsForProducts() {
    static const std::set<std::string> layout{"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                                              "Identity",  "Split",   "Concat",  "Expand",  "Tile"};
    std::vector<Op *> order = graph_.schedule();
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Op &op = **it;
      if (op.domain != "ai.onnx" || !layout.count(op.type)) continue;
      bool forProducts = !op.outputs.empty();
      for (const Tensor *t : op.outputs) {
        if (!t) continue;
        if (!isFloat16Or32(t->info().dataType()) || kept_.count(t->id()) || shapeDeciding_.count(t) ||
            t->consumers().empty())
          forProducts = false;
        for (const Op *c : t->consumers())
          if (precisionClass(*c) != PrecisionClass::Low && !forProducts_.count(c)) forProducts = false;
      }
      if (forProducts) forProducts_.insert(&op);
    }
  }

  /// Whether \p op reads input \p i as a float value that the conversion may retype.
  bool convertible(const Op &op, size_t i) const {
    const Tensor *t = op.inputs[i];
    if (!t || !isFloat16Or32(t->info().dataType()) || shapeDeciding_.count(t) || !readsValuesOf(op, i)) return false;
    for (size_t v : valueInputIndices(op))
      if (v == i) return false;
    if (op.type == "Cast" || op.type == "CastLike") return false; // it converts anyway
    if (op.type == "Dropout" && i == 1) return false;             // the ratio (T1)
    return true;
  }

  /// The type \p op computes in: FLOAT, the low type, or UNDEFINED to leave it as it is (an op
  /// that follows its inputs and reads no 16-bit input).
  DataType computeType(const Op &op) const {
    switch (precisionClass(op)) {
    case PrecisionClass::Fp32: return DataType::FLOAT;
    case PrecisionClass::Low:
    case PrecisionClass::LowData: return policy_.low;
    case PrecisionClass::Follow: break;
    }
    if (forProducts_.count(&op)) return policy_.low;
    for (size_t i = 0; i < op.inputCount(); ++i)
      if (convertible(op, i) && op.inputs[i]->info().dataType() != DataType::FLOAT) return policy_.low;
    return DataType::UNDEFINED;
  }

  static TensorData convertedData(const TensorData &data, DataType to) {
    return TensorData::fromDoubles(to, data.info().shape(), data.toDoubleVector());
  }

  /// \p t read as \p to: itself, a converted constant, or the output of one Cast per (tensor, type).
  Tensor *as(Tensor &t, DataType to) {
    if (t.info().dataType() == to) return &t;
    auto key = std::make_pair(t.id(), to);
    if (auto it = casts_.find(key); it != casts_.end()) return &graph_.tensor(it->second);
    TensorId id = graph_.uniqueId(t.id() + "_" + suffix(to));
    if (t.isConst()) {
      graph_.addConst(id, convertedData(*t.data(), to));
    } else {
      Attributes a;
      a.set("to", static_cast<int64_t>(to));
      Op &cast = graph_.addOp("Cast", "ai.onnx", 13, "", std::move(a), {t.id()}, {id});
      if (t.producer()) cast.phase = t.producer()->phase;
      cast.def->setup(cast);
    }
    ++changes_;
    casts_[key] = id;
    return &graph_.tensor(id);
  }

  void convertOp(Op &op) {
    bool outputsShapeDeciding =
        !op.outputs.empty() &&
        std::all_of(op.outputs.begin(), op.outputs.end(), [&](Tensor *t) { return !t || shapeDeciding_.count(t); });
    // Ops of other domains (training, custom) keep their inputs, but are set up again below.
    bool convertInputs = !outputsShapeDeciding && (op.domain == "ai.onnx" || op.domain == "ai.onnx.ml");
    std::vector<DataType> before;
    for (Tensor *t : op.outputs)
      before.push_back(t ? t->info().dataType() : DataType::UNDEFINED);
    const DataType want = convertInputs ? computeType(op) : DataType::UNDEFINED;
    const bool lowData = want != DataType::UNDEFINED && precisionClass(op) == PrecisionClass::LowData;
    for (size_t i = 0; want != DataType::UNDEFINED && i < op.inputCount(); ++i) {
      const DataType wantHere = lowData && i > 0 ? DataType::FLOAT : want;
      if (convertible(op, i) && op.inputs[i]->info().dataType() != wantHere)
        graph_.setOpInput(op, i, as(*op.inputs[i], wantHere));
    }
    // Every op is set up again: its inputs may have changed type upstream.
    op.def->setup(op);
    // Outputs that must keep their types: the op writes a new low tensor, which a Cast converts.
    for (size_t j = 0; j < op.outputs.size(); ++j) {
      Tensor *t = op.outputs[j];
      if (!t || before[j] != DataType::FLOAT || t->info().dataType() == DataType::FLOAT || !keptOutput(*t)) continue;
      if (streams_ && t->id() != loss_) { // it stays low; the session widens it for the user
        streams_->host[t->id()] = DataType::FLOAT;
        ++changes_;
        continue;
      }
      TensorId id = t->id();
      TensorInfo lowInfo = t->info();
      TensorId lowId = graph_.uniqueId(id + "_" + suffix(lowInfo.dataType()));
      graph_.setOpOutput(op, j, &graph_.addTensor(lowId, TensorKind::ActGrad, lowInfo));
      t->setInfo(TensorInfo(DataType::FLOAT, lowInfo.shape()));
      Attributes a;
      a.set("to", static_cast<int64_t>(DataType::FLOAT));
      Op &cast = graph_.addOp("Cast", "ai.onnx", 13, "", std::move(a), {lowId}, {id});
      cast.phase = op.phase;
      cast.def->setup(cast);
      casts_[{id, lowInfo.dataType()}] = lowId; // readers in the low type read it directly
      ++changes_;
    }
  }

  bool keptOutput(const Tensor &t) const { return kept_.count(t.id()) != 0; }

  Graph &graph_;
  const PrecisionPolicy &policy_;
  std::set<TensorId> kept_;
  StreamTypes *streams_;
  TensorId loss_;
  std::set<const Tensor *> shapeDeciding_;
  std::set<const Op *> forProducts_;
  std::map<std::pair<TensorId, DataType>, TensorId> casts_;
  int changes_ = 0;
};

} // namespace

PrecisionClass precisionClass(const Op &op) {
  if (op.domain != "ai.onnx") return PrecisionClass::Follow;
  for (const char *t : kLowOps)
    if (op.type == t) return PrecisionClass::Low;
  for (const Fp32Op &f : fp32Ops())
    if (op.type == f.type) {
      if (f.lowData) return PrecisionClass::LowData;
      if (!f.onlyLargeReductions || reductionLength(op) > kLargeReduction) return PrecisionClass::Fp32;
      break;
    }
  return PrecisionClass::Follow;
}

int convertPrecision(Graph &graph, const PrecisionPolicy &policy, const std::vector<TensorId> &keep,
                     StreamTypes *streams, const TensorId &loss) {
  return Converter(graph, policy, keep, streams, loss).run();
}

int markHalfPartials(Graph &graph, const PrecisionPolicy &policy) {
  if (!policy.halfPartials) return 0;
  int marked = 0;
  for (const auto &op : graph.ops()) {
    if (op->domain != "ai.onnx" || (op->type != "MatMul" && op->type != "Gemm") || !op->hasInput(0)) continue;
    DataType t = op->inInfo(0).dataType();
    if (t != DataType::FLOAT16 && t != DataType::BFLOAT16) continue;
    op->attrs.set(internal_attr::kHalfPartials, int64_t{1});
    ++marked;
  }
  return marked;
}

int keepWeightGradientsLow(Graph &graph, const PrecisionPolicy &policy, TrainingTensors &training,
                           const std::vector<TensorId> &keep) {
  if (policy.low == DataType::UNDEFINED || !policy.masterWeights) return 0;
  std::set<TensorId> kept(keep.begin(), keep.end());
  kept.insert(graph.outputs().begin(), graph.outputs().end());
  int changed = 0;
  for (auto &[weight, grad] : training.weightGrads) {
    const Tensor *w = graph.findTensor(weight);
    Tensor *g = graph.findTensor(grad);
    if (!w || !g || w->info().dataType() != DataType::FLOAT || kept.count(grad) || !g->consumers().empty()) continue;
    Op *cast = g->producer();
    if (!cast || cast->domain != "ai.onnx" || cast->type != "Cast" || !cast->hasInput(0)) continue;
    const Tensor &low = cast->input(0);
    const DataType t = low.info().dataType();
    // The widening is exact, so the update computes from the same values; only a Cast from a
    // 16-bit type qualifies (a narrowing one would change them).
    if ((t != DataType::FLOAT16 && t != DataType::BFLOAT16) || low.info().shape() != w->info().shape()) continue;
    TensorId castOut = grad;
    grad = low.id();
    graph.removeOp(*cast);
    graph.removeTensor(castOut);
    ++changed;
  }
  return changed;
}

void registerPrecisionPasses(PassRegistry &r) {
  r.add({
      .name = "convertPrecision",
      .purpose = "fp16/bf16 modes: float tensors in the low type except around the ops kept in fp32 "
                 "(docs/precision.md), one Cast per tensor and type",
      .needs = ShapesInferred,
      .before = GradientsBuilt,
      .run =
          [](Graph &g, PassContext &c) {
            return convertPrecision(g, c.state<PrecisionPolicy>(), c.keep, &c.state<StreamTypes>(), c.loss);
          },
  });
  r.add({
      .name = "keepWeightGradientsLow",
      .purpose = "fp16.32, bf16: the optimiser reads each master weight's 16-bit gradient, not its Cast to FLOAT, "
                 "and widens it in the update",
      .needs = ShapesInferred | GradientsBuilt,
      .before = OptimizerApplied,
      .optional = true,
      .run =
          [](Graph &g, PassContext &c) {
            return keepWeightGradientsLow(g, c.state<PrecisionPolicy>(), c.state<TrainingTensors>(), c.keep);
          },
  });
  r.add({
      .name = "markHalfPartials",
      .purpose = "fp16.16: 16-bit MatMul and Gemm ops, forward and gradient, round their partial sums to 16 bits",
      .needs = ShapesInferred,
      .run = [](Graph &g, PassContext &c) { return markHalfPartials(g, c.state<PrecisionPolicy>()); },
  });
}

} // namespace popart::ir
