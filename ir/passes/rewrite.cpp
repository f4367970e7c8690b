// Helpers shared by the graph rewrites of ir/passes (declared in rewrite.hpp).

#include "ir/passes/rewrite.hpp"

#include <algorithm>
#include <cmath>
#include <set>

namespace popart::ir {

bool isGraphOutput(const Graph &graph, const Tensor &t) {
  return std::find(graph.outputs().begin(), graph.outputs().end(), t.id()) != graph.outputs().end();
}

Op &addRewrittenOp(Graph &graph, int phase, const std::string &type, const std::string &domain, int version,
                   const std::string &name, Attributes attrs, const std::vector<TensorId> &inputs,
                   const std::vector<TensorId> &outputs, const Fusion &fusion) {
  Op &op = graph.addOp(type, domain, version, name, std::move(attrs), inputs, outputs);
  op.fusion = fusion;
  op.phase = phase;
  op.def->setup(op);
  return op;
}

Op &replacePair(Graph &graph, Op &producer, Op &consumer, Attributes attrs, Fusion fusion,
                const std::vector<TensorId> &inputs) {
  TensorId out = consumer.output(0).id(), mid = producer.output(0).id();
  std::string type = producer.type, domain = producer.domain, name = producer.name;
  int version = producer.version, phase = producer.phase;
  graph.removeOp(consumer);
  graph.removeOp(producer);
  graph.removeTensor(mid);
  return addRewrittenOp(graph, phase, type, domain, version, name, std::move(attrs), inputs, {out}, fusion);
}

std::vector<TensorId> inputIds(const Op &op) {
  std::vector<TensorId> ids;
  for (const Tensor *t : op.inputs)
    ids.push_back(t ? t->id() : "");
  return ids;
}

bool isOnnxOp(const Op *op, const char *type) { return op && op->type == type && op->domain == "ai.onnx"; }

Op *onlyReader(const Kept &kept, const Tensor &t) {
  if (t.consumers().size() != 1 || kept.has(t)) return nullptr;
  return t.consumers()[0];
}

bool constScalar(const Tensor *t, double &value) {
  if (!t || !t->isConst() || t->info().elementCount() != 1) return false;
  value = t->data()->toDoubleVector()[0];
  return true;
}

Tensor *otherInput(const Op &op, const Tensor &known) {
  if (op.inputCount() != 2 || !op.hasInput(0) || !op.hasInput(1)) return nullptr;
  if (&op.input(0) == &known) return &op.input(1);
  if (&op.input(1) == &known) return &op.input(0);
  return nullptr;
}

bool withScalar(const Op *op, const Tensor &known, double value, double tol) {
  double v = 0;
  return op && constScalar(otherInput(*op, known), v) && std::fabs(v - value) <= tol;
}

Op &replaceOps(Graph &graph, const std::vector<Op *> &ops, std::string type, std::string domain, int version,
               Attributes attrs, const std::vector<TensorId> &inputs, const std::vector<TensorId> &outputs,
               Fusion fusion) {
  // type, domain and fusion are copies: they may be those of an op removed here.
  std::string name = ops[0]->name;
  int phase = ops[0]->phase;
  std::vector<TensorId> inner;
  std::set<Tensor *> constants;
  for (Op *op : ops) {
    for (const Tensor *t : op->outputs)
      if (t && std::find(outputs.begin(), outputs.end(), t->id()) == outputs.end()) inner.push_back(t->id());
    for (Tensor *t : op->inputs)
      if (t && t->isConst() && !t->producer()) constants.insert(t);
  }
  for (Op *op : ops)
    graph.removeOp(*op);
  for (const auto &id : inner)
    graph.removeTensor(id);
  for (Tensor *t : constants) // the pattern's own constants (axes, epsilon), unless read elsewhere
    if (t->consumers().empty() && !isGraphOutput(graph, *t) &&
        std::find(inputs.begin(), inputs.end(), t->id()) == inputs.end() &&
        std::find(graph.initializers().begin(), graph.initializers().end(), t->id()) == graph.initializers().end())
      graph.removeTensor(t->id());
  Op &op = graph.addOp(type, domain, version, name, std::move(attrs), inputs, outputs);
  op.fusion = std::move(fusion);
  op.phase = phase;
  op.def->setup(op);
  return op;
}

bool isTwoInputAdd(const Op *op) {
  if (!isOnnxOp(op, "Add") && !isOnnxOp(op, "Sum")) return false;
  return op->inputCount() == 2 && op->hasInput(0) && op->hasInput(1) && &op->input(0) != &op->input(1);
}

bool foldResidual(Graph &graph, Op &op, const std::function<Op *(const Tensor &)> &producerOf) {
  if (!isTwoInputAdd(&op)) return false;
  for (size_t side = 0; side < 2; ++side) {
    Op *producer = producerOf(op.input(side));
    const Tensor &residual = op.input(1 - side);
    if (!producer || residual.info() != op.input(side).info() || op.outInfo(0) != residual.info()) continue;
    Fusion fusion = producer->fusion;
    fusion.residual = true;
    std::vector<TensorId> ins = inputIds(*producer);
    ins.resize(3);
    ins.push_back(residual.id());
    replacePair(graph, *producer, op, producer->attrs, fusion, ins);
    return true;
  }
  return false;
}

} // namespace popart::ir
