// inferShapes: every op's setup in schedule order, folding ops whose inputs are all constant, and
// the questions about value inputs that shape specialisation asks (shapeDecidingTensors).

#include "core/log.hpp"
#include "ir/passes/pass_manager.hpp"
#include <popart/error.hpp>

#include <algorithm>

namespace popart::ir {

static bool allInputsConst(const Op &op) {
  for (const Tensor *t : op.inputs)
    if (t && !t->isConst()) return false;
  return true;
}

/// Outputs larger than this in all are not folded: they are computed when the plan runs, after the
/// plan's memory limit has been checked (the model fuzzer found a constant Tile whose folding
/// asked for 2^44 bytes of index tables before any limit was checked).
constexpr int64_t kMaxFoldedBytes = int64_t{256} << 20;

static bool smallEnoughToFold(const Op &op) {
  int64_t total = 0;
  for (const Tensor *t : op.outputs) {
    if (!t || !t->info().isTensor()) continue;
    if (!t->info().isKnown()) return false;
    int64_t n = 0;
    try {
      n = t->info().elementCount(); // throws past 2^63 elements
    } catch (const error &) {
      return false;
    }
    const int64_t width = std::max<int64_t>(static_cast<int64_t>(dataTypeSize(t->info().dataType())), 1);
    if (n > (kMaxFoldedBytes - total) / width) return false;
    total += n * width;
  }
  return true;
}

static void fold(Graph &graph, Op &op, const ConstEvaluator &folder) {
  std::vector<TensorData> values = folder.evaluate(op);
  std::vector<Tensor *> outs = op.outputs;
  graph.removeOp(op);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i]) continue;
    if (i >= values.size()) throw error("constant folding produced too few outputs");
    outs[i]->setKind(TensorKind::Const);
    outs[i]->setInfo(values[i].info());
    outs[i]->setData(std::make_shared<TensorData>(std::move(values[i])));
  }
}

std::vector<size_t> valueInputIndices(const Op &op) {
  std::vector<size_t> idx;
  if (op.def->allInputsAreValueInputs) {
    for (size_t i = 0; i < op.inputCount(); ++i)
      idx.push_back(i);
    return idx;
  }
  for (int i : op.def->valueInputs)
    idx.push_back(static_cast<size_t>(i));
  if (op.def->valueInputsOf)
    for (int i : op.def->valueInputsOf(op))
      idx.push_back(static_cast<size_t>(i));
  return idx;
}

bool readsValuesOf(const Op &op, size_t i) {
  const auto &only = op.def->shapeOnlyInputs;
  return std::find(only.begin(), only.end(), static_cast<int>(i)) == only.end();
}

std::map<const Tensor *, ShapeUse> shapeDecidingTensors(const Graph &graph) {
  std::map<const Tensor *, ShapeUse> found;
  for (const Op *op : graph.schedule())
    for (size_t i : valueInputIndices(*op)) {
      if (!op->hasInput(i)) continue;
      std::vector<const Tensor *> stack{&op->input(i)};
      while (!stack.empty()) {
        const Tensor *t = stack.back();
        stack.pop_back();
        if (!found.emplace(t, ShapeUse{op, i}).second) continue;
        if (const Op *p = t->producer())
          for (size_t k = 0; k < p->inputCount(); ++k)
            if (p->hasInput(k) && readsValuesOf(*p, k)) stack.push_back(&p->input(k));
      }
    }
  return found;
}

void inferShapes(Graph &graph, const ConstEvaluator *folder) {
  for (Op *op : graph.schedule()) {
    for (const Tensor *t : op->inputs)
      if (t && !t->info().isKnown() && t->info().dataType() != DataType::STRING)
        throw error(op->debugName(), ": input '", t->id(), "' has unknown type or shape ", t->info().toString());
    try {
      op->def->setup(*op);
    } catch (const error &e) {
      std::string msg = e.what();
      if (msg.find(op->debugName()) == std::string::npos) throw error(op->debugName(), ": ", msg);
      throw;
    }
    bool outputsConst = true;
    for (const Tensor *t : op->outputs)
      if (t && !t->isConst()) outputsConst = false;
    if (outputsConst && !op->outputs.empty()) {
      // setup() computed the values itself (Shape, Size): the op has nothing left to do.
      graph.removeOp(*op);
      continue;
    }
    if (folder && op->def->foldable && allInputsConst(*op) && smallEnoughToFold(*op) && folder->canEvaluate(*op)) {
      logging::logger().trace("folding {}", op->debugName());
      fold(graph, *op, *folder);
    }
  }
}

void registerShapeInferencePasses(PassRegistry &r) {
  r.add({
      .name = "inferShapes",
      .purpose = "runs every op's setup in schedule order, folding ops whose inputs are all constant",
      .establishes = ShapesInferred,
      .run =
          [](Graph &g, PassContext &c) {
            inferShapes(g, c.folder);
            return 0;
          },
  });
}

} // namespace popart::ir
