// The IR verifier (see verify.hpp): each check names the op or tensor at fault.

#include "ir/verify.hpp"
#include "ir/ops/matmul_layout.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cmath>
#include <set>

namespace popart::ir {

namespace {

[[noreturn]] void fail(const std::string &context, const std::string &what) {
  throw error("IR verification failed", context.empty() ? "" : " " + context, ": ", what);
}

bool contains(const std::vector<TensorId> &ids, const TensorId &id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

/// The Fusion fields \p op carries.
std::vector<FusionField> fusionFieldsOf(const Op &op) {
  std::vector<FusionField> fields;
  if (op.fusion.bias) fields.push_back(FusionField::Bias);
  if (op.fusion.residual) fields.push_back(FusionField::Residual);
  if (op.fusion.scale) fields.push_back(FusionField::Scale);
  if (op.fusion.pool) fields.push_back(FusionField::Pool);
  if (op.fusion.relu())
    fields.push_back(FusionField::Relu);
  else if (op.fusion.activated())
    fields.push_back(FusionField::Activation);
  if (op.fusion.transA || op.fusion.transB) fields.push_back(FusionField::Transpose);
  if (op.fusion.permuted()) fields.push_back(FusionField::Permute);
  if (op.fusion.outputType) fields.push_back(FusionField::OutputType);
  return fields;
}

/// Checks \p op's MatMul layout fields: each permutation one of its tensor's axes.
void verifyLayout(const Op &op, const std::string &context) {
  auto check = [&](const std::vector<int64_t> &perm, const char *field, const Tensor *t) {
    if (perm.empty()) return;
    bool fits = isPermutation(perm, perm.size()) && (!t || t->info().dataType() == DataType::UNDEFINED ||
                                                     t->info().rank() == static_cast<int64_t>(perm.size()));
    if (!fits)
      fail(context, op.debugName() + ": fusion field '" + field + "' " + popart::toString(perm) +
                        " is not a permutation of its tensor's axes");
  };
  check(op.fusion.permA, "permA", op.hasInput(0) ? &op.input(0) : nullptr);
  check(op.fusion.permB, "permB", op.hasInput(1) ? &op.input(1) : nullptr);
  check(op.fusion.permY, "permY", op.hasOutput(0) ? &op.output(0) : nullptr);
}

/// Checks that \p op carries only the Fusion fields its definition declares, with values that fit
/// it.
void verifyFusion(const Op &op, const std::string &context) {
  for (FusionField f : fusionFieldsOf(op))
    if (!op.def->declares(f) && !(f == FusionField::Relu && op.def->declares(FusionField::Activation)))
      fail(context,
           op.debugName() + " carries fusion field '" + fusionFieldName(f) +
               (f == FusionField::Activation ? std::string(" ") + FusedActivation::name(op.fusion.activation.kind) + "'"
                                             : std::string("'")) +
               ", which " + op.domain + "::" + op.type + " does not declare");
  if (op.fusion.scale && (!std::isfinite(*op.fusion.scale) || *op.fusion.scale == 0.f))
    fail(context, op.debugName() + ": fusion field 'scale' must be finite and non-zero, not " +
                      std::to_string(*op.fusion.scale));
  if (op.fusion.bias && !op.hasInput(2))
    fail(context, op.debugName() + ": fusion field 'bias' needs a bias as input 2, which is missing");
  if (op.fusion.residual && !op.hasInput(3))
    fail(context, op.debugName() + ": fusion field 'residual' needs the residual as input 3, which is missing");
  const FusedActivation &act = op.fusion.activation;
  if (!FusedActivation::parameterised(act.kind) && (act.alpha != 0.f || act.beta != 0.f))
    fail(context,
         op.debugName() + ": fusion field 'activation' " + FusedActivation::name(act.kind) + " takes no alpha or beta");
  if (act.kind == FusedActivation::Kind::Clip && !(act.alpha <= act.beta))
    fail(context, op.debugName() + ": fusion field 'activation' Clip needs alpha <= beta, not " +
                      std::to_string(act.alpha) + " and " + std::to_string(act.beta));
  verifyLayout(op, context);
  if (op.fusion.outputType &&
      (*op.fusion.outputType != DataType::FLOAT || !op.hasInput(0) ||
       (op.inInfo(0).dataType() != DataType::FLOAT16 && op.inInfo(0).dataType() != DataType::BFLOAT16 &&
        op.inInfo(0).dataType() != DataType::UNDEFINED)))
    fail(context, op.debugName() + ": fusion field 'outputType' " + popart::toString(*op.fusion.outputType) +
                      " must be FLOAT, for 16-bit operands");
  if (const auto &pool = op.fusion.pool) {
    size_t nsp = pool->kernel.size();
    if (pool->strides.size() != nsp || pool->pads.size() != 2 * nsp || pool->input.size() != nsp + 2 ||
        (op.hasInput(0) && op.inInfo(0).dataType() != DataType::UNDEFINED &&
         op.inInfo(0).rank() != static_cast<int64_t>(nsp + 2)))
      fail(context, op.debugName() + ": fusion field 'pool' has " + std::to_string(nsp) + " kernel axes, " +
                        std::to_string(pool->strides.size()) + " strides, " + std::to_string(pool->pads.size()) +
                        " pads and a rank-" + std::to_string(pool->input.size()) +
                        " input shape, which do not fit the op's input");
  }
}

/// Checks that every internal (popart_) attribute of \p op is one its definition declares
/// (OpDef::internalAttributes): the fused forms of old string attributes are typed fields now.
void verifyAttributes(const Op &op, const std::string &context) {
  for (const auto &[name, value] : op.attrs.all()) {
    if (name.rfind("popart_", 0) != 0) continue;
    const auto &declared = op.def->internalAttributes;
    if (std::find(declared.begin(), declared.end(), name) == declared.end())
      fail(context, op.debugName() + " has internal attribute '" + name + "', which " + op.domain + "::" + op.type +
                        " does not declare (OpDef::internalAttributes)");
  }
}

} // namespace

void verifyGraph(const Graph &graph, const std::string &context, const VerifyOptions &options) {
  std::set<const Op *> ops;
  for (const auto &op : graph.ops())
    ops.insert(op.get());
  auto owned = [&](const Tensor *t) {
    auto it = graph.tensors().find(t->id());
    return it != graph.tensors().end() && it->second.get() == t;
  };
  for (const auto &p : graph.ops()) {
    const Op &op = *p;
    if (!op.def) fail(context, op.debugName() + " has no op definition");
    if (op.graph != &graph) fail(context, op.debugName() + " belongs to another graph");
    verifyFusion(op, context);
    verifyAttributes(op, context);
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const Tensor *t = op.inputs[i];
      if (!t) continue;
      if (!owned(t)) fail(context, op.debugName() + " reads tensor '" + t->id() + "', which is not in the graph");
      auto slots = std::count(op.inputs.begin(), op.inputs.end(), t);
      auto listed = std::count(t->consumers().begin(), t->consumers().end(), &op);
      if (slots != listed)
        fail(context, op.debugName() + " reads '" + t->id() + "' " + std::to_string(slots) +
                          " time(s) but the tensor lists it as a consumer " + std::to_string(listed) + " time(s)");
    }
    for (const Tensor *t : op.outputs) {
      if (!t) continue;
      if (!owned(t)) fail(context, op.debugName() + " writes tensor '" + t->id() + "', which is not in the graph");
      if (t->producer() != &op)
        fail(context, op.debugName() + " writes '" + t->id() + "' but the tensor names " +
                          (t->producer() ? t->producer()->debugName() : std::string("no producer")));
      if (options.outputInfos && t->info().dataType() == DataType::UNDEFINED)
        fail(context, "output '" + t->id() + "' of " + op.debugName() + " has no inferred type");
    }
  }
  const std::vector<TensorId> &inputs = graph.inputs(), &outputs = graph.outputs();
  for (const auto &[id, t] : graph.tensors()) {
    if (const Op *p = t->producer()) {
      if (!ops.count(p)) fail(context, "tensor '" + id + "' names a producer that is not in the graph");
      if (std::find(p->outputs.begin(), p->outputs.end(), t.get()) == p->outputs.end())
        fail(context, "tensor '" + id + "' names " + p->debugName() + " as producer, which does not write it");
    }
    for (const Op *c : t->consumers()) {
      if (!ops.count(c)) fail(context, "tensor '" + id + "' lists a consumer that is not in the graph");
      if (std::find(c->inputs.begin(), c->inputs.end(), t.get()) == c->inputs.end())
        fail(context, "tensor '" + id + "' lists " + c->debugName() + " as consumer, which does not read it");
    }
    bool sourced = t->producer() || contains(inputs, id) || t->kind() == TensorKind::Const ||
                   t->kind() == TensorKind::Variable || t->kind() == TensorKind::Stream;
    if (!sourced && !t->consumers().empty())
      fail(context, "tensor '" + id + "' is read by " + t->consumers()[0]->debugName() +
                        " but no op produces it and it is no graph input, constant or variable");
    if (!sourced && t->consumers().empty() && !contains(outputs, id))
      fail(context, "tensor '" + id + "' is dangling: no op produces or reads it");
  }
  for (const auto &id : inputs)
    if (!graph.hasTensor(id)) fail(context, "graph input '" + id + "' does not exist");
  for (const auto &id : outputs) {
    if (!graph.hasTensor(id)) fail(context, "graph output '" + id + "' does not exist");
    const Tensor &t = graph.tensor(id);
    if (!t.producer() && !contains(inputs, id) && t.kind() == TensorKind::ActGrad)
      fail(context, "graph output '" + id + "' is produced by no op");
  }
  try {
    graph.schedule();
  } catch (const error &e) {
    fail(context, e.what());
  }
}

} // namespace popart::ir
