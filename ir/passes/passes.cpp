#include "ir/passes/passes.hpp"
#include "ir/passes/rewrite.hpp"
#include "core/log.hpp"
#include "ir/ops/activation.hpp"
#include "ir/ops/window.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

namespace popart::ir {

static bool allInputsConst(const Op &op) {
  for (const Tensor *t : op.inputs)
    if (t && !t->isConst()) return false;
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
    if (folder && op->def->foldable && allInputsConst(*op) && folder->canEvaluate(*op)) {
      logging::logger().trace("folding {}", op->debugName());
      fold(graph, *op, *folder);
    }
  }
}

void removeDeadCode(Graph &graph, const std::vector<TensorId> &keep) {
  std::vector<TensorId> roots = keep.empty() ? graph.outputs() : keep;
  std::set<const Op *> live;
  std::vector<const Tensor *> stack;
  for (const auto &id : roots)
    stack.push_back(&graph.tensor(id));
  // Ops that update a tensor in place are kept for their effect.
  for (const auto &op : graph.ops())
    if (!op->def->modifies.empty())
      for (const Tensor *out : op->outputs)
        if (out) stack.push_back(out);
  std::set<const Tensor *> seen;
  while (!stack.empty()) {
    const Tensor *t = stack.back();
    stack.pop_back();
    if (!seen.insert(t).second) continue;
    if (Op *p = t->producer(); p && live.insert(p).second)
      for (const Tensor *in : p->inputs)
        if (in) stack.push_back(in);
  }
  std::vector<Op *> dead;
  for (const auto &op : graph.ops())
    if (!live.count(op.get())) dead.push_back(op.get());
  for (Op *op : dead)
    graph.removeOp(*op);
  std::set<TensorId> keepIds(graph.inputs().begin(), graph.inputs().end());
  keepIds.insert(graph.outputs().begin(), graph.outputs().end());
  keepIds.insert(roots.begin(), roots.end());
  std::vector<TensorId> unused;
  for (const auto &[id, t] : graph.tensors())
    if (!t->producer() && t->consumers().empty() && !keepIds.count(id) && t->kind() != TensorKind::Variable)
      unused.push_back(id);
  for (const auto &id : unused)
    graph.removeTensor(id);
}

bool isGraphOutput(const Graph &graph, const Tensor &t) {
  return std::find(graph.outputs().begin(), graph.outputs().end(), t.id()) != graph.outputs().end();
}

Op &addRewrittenOp(Graph &graph, int phase, const std::string &type, const std::string &domain, int version,
                   const std::string &name, Attributes attrs, const std::vector<TensorId> &inputs,
                   const std::vector<TensorId> &outputs) {
  Op &op = graph.addOp(type, domain, version, name, std::move(attrs), inputs, outputs);
  op.phase = phase;
  op.def->setup(op);
  return op;
}

/// Replaces \p producer and \p consumer, the only reader of \p producer's output 0, by one op of
/// \p producer's type, domain, version, name and phase that reads \p inputs and writes
/// \p consumer's output 0.
static Op &replacePair(Graph &graph, Op &producer, Op &consumer, Attributes attrs,
                       const std::vector<TensorId> &inputs) {
  TensorId out = consumer.output(0).id(), mid = producer.output(0).id();
  std::string type = producer.type, domain = producer.domain, name = producer.name;
  int version = producer.version, phase = producer.phase;
  graph.removeOp(consumer);
  graph.removeOp(producer);
  graph.removeTensor(mid);
  return addRewrittenOp(graph, phase, type, domain, version, name, std::move(attrs), inputs, {out});
}

/// The ids of \p op's inputs ("" where one is omitted).
static std::vector<TensorId> inputIds(const Op &op) {
  std::vector<TensorId> ids;
  for (const Tensor *t : op.inputs)
    ids.push_back(t ? t->id() : "");
  return ids;
}

/// A Transpose's permutation (its default reverses the axes).
static std::vector<int64_t> transposePerm(const Op &transpose) {
  std::vector<int64_t> perm = transpose.attrs.getInts("perm", {});
  if (perm.empty())
    for (size_t i = transpose.inInfo(0).rank(); i-- > 0;)
      perm.push_back(static_cast<int64_t>(i));
  return perm;
}

static bool isIdentity(const std::vector<int64_t> &perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

/// The MatMul attributes that describe operand layouts, for a rewrite that keeps them.
static void copyLayoutAttrs(const Op &from, Attributes &to, bool swapOperands) {
  const char *a = swapOperands ? "popart_permB" : "popart_permA", *b = swapOperands ? "popart_permA" : "popart_permB";
  if (from.attrs.has(a)) to.set("popart_permA", from.attrs.getInts(a));
  if (from.attrs.has(b)) to.set("popart_permB", from.attrs.getInts(b));
}

/// A Transpose of a MatMul's only use that keeps the product's last axis among its last two:
/// the MatMul writes the transposed result itself. One that moves the last axis to second last
/// uses (A·B)ᵀ = Bᵀ·Aᵀ (for a Transpose of the last two axes only, that is all); what remains
/// keeps the last axis last (popart_permY).
static bool foldTransposedProduct(Graph &graph) {
  for (Op *t : graph.schedule()) {
    if (t->type != "Transpose" || t->domain != "ai.onnx" || !t->hasInput(0) || !t->hasOutput(0)) continue;
    Op *m = t->input(0).producer();
    if (!m || m->type != "MatMul" || m->domain != "ai.onnx" || m->inputCount() != 2 || m->attrs.has("popart_permY") ||
        m->attrs.has("popart_activation") || m->attrs.has("popart_scale"))
      continue;
    const Tensor &product = m->output(0);
    if (product.consumers().size() != 1 || isGraphOutput(graph, product)) continue;
    if (m->inInfo(0).rank() < 2 || m->inInfo(1).rank() < 2) continue;
    size_t r = product.info().rank();
    std::vector<int64_t> perm = transposePerm(*t);
    if (perm.size() != r || isIdentity(perm)) continue;
    int64_t last = static_cast<int64_t>(r) - 1;
    bool swap = perm[r - 1] == last - 1;
    if (perm[r - 1] != last && !swap) continue;
    Attributes attrs;
    std::vector<TensorId> inputs{m->input(0).id(), m->input(1).id()};
    bool ta = m->attrs.getInt("popart_transA", 0) != 0, tb = m->attrs.getInt("popart_transB", 0) != 0;
    if (swap) { // product = (Bᵀ·Aᵀ)ᵀ: the Transpose of Bᵀ·Aᵀ by σ∘perm keeps the last axis last
      std::swap(inputs[0], inputs[1]);
      std::swap(ta, tb);
      ta = !ta;
      tb = !tb;
      for (auto &p : perm)
        p = p == last ? last - 1 : p == last - 1 ? last : p;
    }
    if (ta) attrs.set("popart_transA", int64_t{1});
    if (tb) attrs.set("popart_transB", int64_t{1});
    copyLayoutAttrs(*m, attrs, swap);
    if (!isIdentity(perm)) attrs.set("popart_permY", perm);
    replacePair(graph, *m, *t, std::move(attrs), inputs);
    return true;
  }
  return false;
}

/// Folds Transpose \p t into input \p i of MatMul \p op if the result leaves the stored last
/// axis among the operand's last two (so the kernels read it with one unit stride).
static bool foldTransposeIntoOperand(Op &op, size_t i, Op &t) {
  size_t rank = static_cast<size_t>(op.inInfo(i).rank());
  if (static_cast<size_t>(t.inInfo(0).rank()) != rank || rank < 2) return false;
  const char *transAttr = i == 0 ? "popart_transA" : "popart_transB";
  const char *permAttr = i == 0 ? "popart_permA" : "popart_permB";
  std::vector<int64_t> outer = op.attrs.getInts(permAttr, {}), inner = transposePerm(t);
  if (outer.empty())
    for (size_t j = 0; j < rank; ++j)
      outer.push_back(static_cast<int64_t>(j));
  if (inner.size() != rank) return false;
  // Transpose(Transpose(S, inner), outer): logical axis j is stored axis inner[outer[j]].
  std::vector<int64_t> perm(rank);
  for (size_t j = 0; j < rank; ++j)
    perm[j] = inner[static_cast<size_t>(outer[j])];
  auto storedLast = std::find(perm.begin(), perm.end(), static_cast<int64_t>(rank) - 1) - perm.begin();
  if (static_cast<size_t>(storedLast) + 2 < rank) return false;
  bool trans = op.attrs.getInt(transAttr, 0) != 0;
  std::vector<int64_t> swapped(rank);
  for (size_t j = 0; j < rank; ++j)
    swapped[j] = static_cast<int64_t>(j);
  std::swap(swapped[rank - 1], swapped[rank - 2]);
  if (perm == swapped) { // a plain transpose of the last two axes
    trans = !trans;
    perm.clear();
  } else if (isIdentity(perm)) {
    perm.clear();
  }
  op.attrs.erase(permAttr);
  op.attrs.erase(transAttr);
  if (!perm.empty()) op.attrs.set(permAttr, perm);
  if (trans) op.attrs.set(transAttr, int64_t{1});
  return true;
}

int foldTransposesIntoMatMul(Graph &graph) {
  int folded = 0;
  while (foldTransposedProduct(graph))
    ++folded;
  std::vector<Op *> transposes;
  for (Op *op : graph.schedule()) {
    if (op->type != "MatMul" || op->domain != "ai.onnx" || op->inputCount() != 2) continue;
    for (size_t i = 0; i < 2; ++i) {
      // Repeatedly: the input of a folded Transpose may be another one (the gradient's Wᵀᵀ).
      for (Op *producer = op->input(i).producer();
           producer && producer->type == "Transpose" && producer->domain == "ai.onnx" &&
           foldTransposeIntoOperand(*op, i, *producer);
           producer = op->input(i).producer()) {
        graph.setOpInput(*op, i, &producer->input(0));
        op->def->setup(*op); // same output; checks the folded form
        transposes.push_back(producer);
        ++folded;
      }
    }
  }
  // Folded Transposes left unread go; removing an outer one can leave its inner one unread.
  std::set<Op *> pending(transposes.begin(), transposes.end());
  for (bool removed = true; removed;) {
    removed = false;
    for (auto it = pending.begin(); it != pending.end();) {
      Op *t = *it;
      bool used = false;
      for (const Tensor *out : t->outputs)
        if (out && (!out->consumers().empty() || isGraphOutput(graph, *out))) used = true;
      if (used) {
        ++it;
        continue;
      }
      std::vector<TensorId> outs;
      for (const Tensor *out : t->outputs)
        if (out) outs.push_back(out->id());
      graph.removeOp(*t);
      for (const auto &id : outs)
        graph.removeTensor(id);
      it = pending.erase(it);
      removed = true;
    }
  }
  return folded;
}

int fuseRelu(Graph &graph, bool convolutions) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *r = &candidate;
    if (r->type != "Relu" || r->domain != "ai.onnx" || !r->hasInput(0) || !r->hasOutput(0)) return false;
    Op *c = r->input(0).producer();
    if (!c || c->domain != "ai.onnx" || c->attrs.has("popart_activation")) return false;
    // A MatMul adds its residual after its post-ops; a Conv adds it before them.
    if (c->attrs.has("popart_residual") && c->type != "Conv") return false;
    // oneDNN post-ops. Not Gelu after MatMul: oneDNN 2.6's brgemm with an eltwise_gelu_erf
    // post-op took 8.2 ms for BERT's FFN product against 6.4 + 0.8 ms for the two apart.
    bool producer = c->type == "MatMul" || c->type == "Gemm" || (convolutions && c->type == "Conv");
    if (!producer) return false;
    if (c->type != "Conv" && c->outInfo(0).dataType() != DataType::FLOAT) return false;
    const Tensor &pre = c->output(0);
    if (pre.consumers().size() != 1 || isGraphOutput(graph, pre)) return false;
    std::vector<TensorId> ins = inputIds(*c);
    Attributes attrs = c->attrs;
    attrs.set("popart_activation", std::string("Relu"));
    replacePair(graph, *c, *r, std::move(attrs), ins);
    return true;
  });
}

int fuseMaxPoolGradRelu(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *a = &candidate;
    if (a->type != "ActivationGrad" || a->domain != "ai.graphcore" || a->attrs.getString("activation", "") != "Relu")
      return false;
    if (!a->hasInput(0) || !a->hasInput(1) || !a->hasOutput(0)) return false;
    Op *m = a->input(1).producer();
    if (!m || m->type != "MaxPoolGrad" || m->domain != "ai.graphcore" || m->attrs.has("popart_activation"))
      return false;
    // The Relu's output must be what the pool read: dX of the pool is then masked by it.
    if (!m->hasInput(0) || &m->input(0) != &a->input(0)) return false;
    const Tensor &pooled = m->output(0);
    if (pooled.consumers().size() != 1 || isGraphOutput(graph, pooled)) return false;
    Attributes attrs = m->attrs;
    attrs.set("popart_activation", std::string("Relu"));
    replacePair(graph, *m, *a, std::move(attrs), {m->input(0).id(), m->input(1).id()});
    return true;
  });
}

int fuseConvPool(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *p = &candidate;
    if (p->type != "MaxPool" || p->domain != "ai.onnx" || !p->hasInput(0) || !p->hasOutput(0) || p->hasOutput(1))
      return false;
    Op *c = p->input(0).producer();
    if (!c || c->type != "Conv" || c->domain != "ai.onnx" || c->attrs.has("popart_pool_kernel") ||
        c->attrs.has("popart_residual"))
      return false;
    const Tensor &convOut = c->output(0);
    if (convOut.consumers().size() != 1 || isGraphOutput(graph, convOut)) return false;
    const Shape &x = p->inInfo(0).shape();
    size_t nsp = x.size() - 2;
    if (nsp < 1 || nsp > 3 || p->attrs.getInt("ceil_mode", 0) != 0) return false;
    std::vector<int64_t> kernel = p->attrs.getInts("kernel_shape", {});
    if (kernel.size() != nsp) return false;
    WindowGeometry w = resolveWindow(*p, x, p->outInfo(0).shape(), kernel, false);
    bool plain = true;
    for (size_t i = 0; i < nsp; ++i)
      plain = plain && w.dilations[i] == 1 && w.padBegin[i] >= 0 && w.padEnd[i] >= 0 && w.padBegin[i] < kernel[i] &&
              w.padEnd[i] < kernel[i];
    if (!plain) return false;
    Attributes attrs = c->attrs;
    attrs.set("popart_pool_kernel", w.kernel);
    attrs.set("popart_pool_strides", w.strides);
    attrs.set("popart_pool_pads", w.pads());
    attrs.set("popart_pool_input_shape", std::vector<int64_t>(x.begin(), x.end()));
    Shape pooled = p->outInfo(0).shape();
    Op &op = replacePair(graph, *c, *p, std::move(attrs), inputIds(*c));
    if (op.outInfo(0).shape() != pooled) throw error(op.debugName(), ": fused pool changed the output shape");
    return true;
  });
}

bool isOnnxOp(const Op *op, const char *type) { return op && op->type == type && op->domain == "ai.onnx"; }

namespace {

/// A graph and the tensors a rewrite must keep: its outputs and \p keep.
struct Kept {
  const Graph &graph;
  const std::vector<TensorId> &keep;
  bool has(const Tensor &t) const {
    return isGraphOutput(graph, t) || std::find(keep.begin(), keep.end(), t.id()) != keep.end();
  }
};

/// The one op that reads \p t, if \p t has exactly one reader and need not be kept.
Op *onlyReader(const Kept &kept, const Tensor &t) {
  if (t.consumers().size() != 1 || kept.has(t)) return nullptr;
  return t.consumers()[0];
}

/// The value of a constant with one element.
bool constScalar(const Tensor *t, double &value) {
  if (!t || !t->isConst() || t->info().elementCount() != 1) return false;
  value = t->data()->toDoubleVector()[0];
  return true;
}

/// The input of the two-input \p op that is not \p known, or null if \p known is not one of them.
Tensor *otherInput(const Op &op, const Tensor &known) {
  if (op.inputCount() != 2 || !op.hasInput(0) || !op.hasInput(1)) return nullptr;
  if (&op.input(0) == &known) return &op.input(1);
  if (&op.input(1) == &known) return &op.input(0);
  return nullptr;
}

/// True if the two-input \p op reads \p known and a constant scalar within \p tol of \p value.
bool withScalar(const Op *op, const Tensor &known, double value, double tol) {
  double v = 0;
  return op && constScalar(otherInput(*op, known), v) && std::fabs(v - value) <= tol;
}

/// Replaces \p ops, whose outputs other than \p outputs are read only among them, by one op that
/// reads \p inputs and writes \p outputs (existing tensors or new ids). The new op takes the name
/// and phase of ops[0].
Op &replaceOps(Graph &graph, const std::vector<Op *> &ops, std::string type, std::string domain, int version,
               Attributes attrs, const std::vector<TensorId> &inputs, const std::vector<TensorId> &outputs) {
  // type and domain are copies: they may be those of an op removed here.
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
  op.phase = phase;
  op.def->setup(op);
  return op;
}

/// The first axis of a ReduceMean over the trailing axes of its input with keepdims, or -1.
int64_t trailingMeanAxis(const Op &mean) {
  // Canonical Reduce* form: the axes are constant input 1.
  if (mean.inputCount() != 2 || !mean.hasInput(1) || !mean.input(1).isConst()) return -1;
  if (mean.attrs.getInt("keepdims", 1) != 1 || mean.input(1).info().dataType() != DataType::INT64) return -1;
  int64_t rank = mean.inInfo(0).rank();
  std::vector<int64_t> axes = mean.input(1).data()->toInt64Vector();
  if (axes.empty()) return -1;
  for (auto &a : axes)
    a = a < 0 ? a + rank : a;
  std::sort(axes.begin(), axes.end());
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i] != rank - static_cast<int64_t>(axes.size()) + static_cast<int64_t>(i)) return -1;
  return axes.front();
}

/// An affine factor of a LayerNorm: the other input of \p op (Mul or Add reading \p t), if it is
/// not computed from \p t, has at most the normalised rank and leaves \p t's shape unchanged.
Tensor *affineInput(const Op *op, const Tensor &t, int64_t normRank) {
  if (!op) return nullptr;
  Tensor *p = otherInput(*op, t);
  if (!p || p == &t || p->info().dataType() != t.info().dataType() || p->info().rank() > normRank) return nullptr;
  if (op->outInfo(0).shape() != t.info().shape()) return nullptr;
  return p;
}

/// One LayerNorm decomposition starting at ReduceMean \p m1, fused; false if \p m1 starts none.
bool fuseLayerNormAt(Graph &graph, const Kept &kept, Op &m1, bool statistics) {
  int64_t axis = trailingMeanAxis(m1);
  if (axis < 0 || m1.inInfo(0).dataType() != DataType::FLOAT) return false;
  Tensor &x = m1.input(0);
  int64_t rank = x.info().rank();
  Op *sub = onlyReader(kept, m1.output(0));
  if (!isOnnxOp(sub, "Sub") || sub->inputCount() != 2 || &sub->input(0) != &x || &sub->input(1) != &m1.output(0))
    return false;
  Tensor &d = sub->output(0);
  if (d.consumers().size() != 2 || kept.has(d)) return false;
  Op *pow = nullptr, *div = nullptr;
  for (Op *c : d.consumers()) {
    if (isOnnxOp(c, "Pow") && &c->input(0) == &d) pow = c;
    if (isOnnxOp(c, "Div") && c->inputCount() == 2 && &c->input(0) == &d) div = c;
  }
  double v = 0;
  if (!pow || !div || pow->inputCount() != 2 || !constScalar(&pow->input(1), v) || v != 2) return false;
  Op *m2 = onlyReader(kept, pow->output(0));
  if (!isOnnxOp(m2, "ReduceMean") || trailingMeanAxis(*m2) != axis) return false;
  Op *addEps = onlyReader(kept, m2->output(0));
  double eps = 0;
  if (!isOnnxOp(addEps, "Add") || !constScalar(otherInput(*addEps, m2->output(0)), eps) || eps < 0) return false;
  Op *sqrt = onlyReader(kept, addEps->output(0));
  if (!isOnnxOp(sqrt, "Sqrt") || onlyReader(kept, sqrt->output(0)) != div || &div->input(1) != &sqrt->output(0))
    return false;
  std::vector<Op *> ops{&m1, sub, pow, m2, addEps, sqrt, div};
  Op *mul = onlyReader(kept, div->output(0));
  Tensor *scale = isOnnxOp(mul, "Mul") ? affineInput(mul, div->output(0), rank - axis) : nullptr;
  if (!scale) return false; // LayerNormalization needs a scale
  ops.push_back(mul);
  Op *add = onlyReader(kept, mul->output(0));
  Tensor *bias = isOnnxOp(add, "Add") ? affineInput(add, mul->output(0), rank - axis) : nullptr;
  if (bias) ops.push_back(add);
  TensorId y = ops.back()->output(0).id();
  std::vector<TensorId> outs{y};
  if (statistics) {
    outs.push_back(graph.uniqueId(y + "_mean"));
    outs.push_back(graph.uniqueId(y + "_inv_std_dev"));
  }
  Attributes attrs;
  attrs.set("axis", axis);
  attrs.set("epsilon", static_cast<float>(eps));
  std::vector<TensorId> ins{x.id(), scale->id()};
  if (bias) ins.push_back(bias->id());
  replaceOps(graph, ops, "LayerNormalization", "ai.onnx", 17, std::move(attrs), ins, outs);
  return true;
}

/// One GELU decomposition 0.5·(x·(1 + erf(x/√2))) around Erf \p erf, fused; false if none.
bool fuseGeluAt(Graph &graph, const Kept &kept, Op &erf) {
  if (!erf.hasInput(0) || erf.inInfo(0).dataType() != DataType::FLOAT) return false;
  Op *scaled = erf.input(0).producer();
  if (!scaled || onlyReader(kept, erf.input(0)) != &erf || scaled->inputCount() != 2) return false;
  Tensor *x = nullptr;
  double c = 0;
  if (isOnnxOp(scaled, "Div") && constScalar(&scaled->input(1), c) && std::fabs(c - M_SQRT2) <= 1e-6)
    x = &scaled->input(0);
  for (size_t i = 0; i < 2 && isOnnxOp(scaled, "Mul") && !x; ++i)
    if (constScalar(&scaled->input(1 - i), c) && std::fabs(c - M_SQRT1_2) <= 1e-6) x = &scaled->input(i);
  if (!x || x->info() != erf.inInfo(0)) return false;
  Op *plusOne = onlyReader(kept, erf.output(0));
  if (!isOnnxOp(plusOne, "Add") || !withScalar(plusOne, erf.output(0), 1.0, 0)) return false;
  Op *times = onlyReader(kept, plusOne->output(0));
  if (!isOnnxOp(times, "Mul") || otherInput(*times, plusOne->output(0)) != x) return false;
  Op *half = onlyReader(kept, times->output(0));
  if (!isOnnxOp(half, "Mul") || !withScalar(half, times->output(0), 0.5, 0)) return false;
  if (half->outInfo(0) != x->info()) return false;
  replaceOps(graph, {scaled, &erf, plusOne, times, half}, "Gelu", "ai.graphcore", 1, {}, {x->id()},
             {half->output(0).id()});
  return true;
}

} // namespace

int fuseLayerNorm(Graph &graph, bool statistics, const std::vector<TensorId> &keep) {
  Kept kept{graph, keep};
  return rewriteAll(
      graph, [&](Op &op) { return isOnnxOp(&op, "ReduceMean") && fuseLayerNormAt(graph, kept, op, statistics); });
}

int fuseGelu(Graph &graph, const std::vector<TensorId> &keep) {
  Kept kept{graph, keep};
  return rewriteAll(graph, [&](Op &op) { return isOnnxOp(&op, "Erf") && fuseGeluAt(graph, kept, op); });
}

int fuseBatchNormRelu(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *r = &candidate;
    if (!isOnnxOp(r, "Relu") || !r->hasInput(0) || !r->hasOutput(0)) return false;
    Op *bn = r->input(0).producer();
    if (!isOnnxOp(bn, "BatchNormalization") || bn->attrs.has("popart_activation")) return false;
    if (bn->output(0).consumers().size() != 1 || isGraphOutput(graph, bn->output(0))) return false;
    std::vector<TensorId> ins = inputIds(*bn), outs{r->output(0).id()};
    for (size_t i = 1; i < bn->outputs.size(); ++i)
      outs.push_back(bn->hasOutput(i) ? bn->output(i).id() : "");
    Attributes attrs = bn->attrs;
    attrs.set("popart_activation", std::string("Relu"));
    replaceOps(graph, {bn, r}, bn->type, bn->domain, bn->version, std::move(attrs), ins, outs);
    return true;
  });
}

int fuseMatMulBias(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *add = &candidate;
    if (!isOnnxOp(add, "Add") || add->inputCount() != 2 || !add->hasInput(0) || !add->hasInput(1)) return false;
    for (size_t side = 0; side < 2; ++side) {
      Op *mm = add->input(side).producer();
      const Tensor &bias = add->input(1 - side);
      if (!isOnnxOp(mm, "MatMul") || mm->inputCount() != 2 || mm->attrs.getInt("popart_bias", 0) ||
          mm->attrs.has("popart_scale") || mm->attrs.has("popart_activation") || // they would apply before it
          mm->attrs.has("popart_residual"))
        continue;
      const Tensor &product = mm->output(0);
      if (product.consumers().size() != 1 || isGraphOutput(graph, product)) continue;
      const Shape &y = product.info().shape();
      if (y.size() < 2 || mm->inInfo(1).rank() < 2 || add->outInfo(0).shape() != y) continue;
      if (bias.info().shape() != Shape{y.back()} || bias.info().dataType() != product.info().dataType()) continue;
      if (bias.info().dataType() != DataType::FLOAT) continue;
      Attributes attrs = mm->attrs;
      attrs.set("popart_bias", int64_t{1});
      replacePair(graph, *mm, *add, std::move(attrs), {mm->input(0).id(), mm->input(1).id(), bias.id()});
      return true;
    }
    return false;
  });
}

/// The float MatMul (B a matrix) whose product is \p t, if that product has no other reader and
/// is not a graph output: an addition of it can be the MatMul's residual post-op.
static Op *residualProduct(const Graph &graph, const Tensor &t) {
  Op *mm = t.producer();
  if (!isOnnxOp(mm, "MatMul") || mm->inputCount() > 3 || mm->inInfo(1).rank() < 2) return nullptr;
  if (t.consumers().size() != 1 || isGraphOutput(graph, t)) return nullptr;
  if (t.info().dataType() != DataType::FLOAT || t.info().rank() < 2) return nullptr;
  return mm;
}

/// The Reshape that \p t comes from, if nothing else reads \p t and it views a residualProduct.
static Op *reshapedProduct(const Graph &graph, const Tensor &t) {
  Op *view = t.producer();
  if (!isOnnxOp(view, "Reshape") || !view->hasInput(0) || !view->hasInput(1)) return nullptr;
  if (t.consumers().size() != 1 || isGraphOutput(graph, t)) return nullptr;
  return residualProduct(graph, view->input(0)) ? view : nullptr;
}

/// Sum(a, b, ..., p) of three or more same-shaped inputs, p a product (maybe reshaped) that
/// fuseMatMulResidual can fold: Sum(Sum(a, b, ...), p).
static bool splitSumForResidual(Graph &graph, Op &op) {
  if (!isOnnxOp(&op, "Sum") || op.inputCount() < 3 || !op.hasOutput(0)) return false;
  for (size_t i = 0; i < op.inputCount(); ++i)
    if (!op.hasInput(i) || op.inInfo(i) != op.outInfo(0)) return false;
  for (size_t i = op.inputCount(); i-- > 0;) {
    if (!residualProduct(graph, op.input(i)) && !reshapedProduct(graph, op.input(i))) continue;
    std::vector<TensorId> rest;
    for (size_t j = 0; j < op.inputCount(); ++j)
      if (j != i) rest.push_back(op.input(j).id());
    TensorId product = op.input(i).id(), out = op.output(0).id();
    TensorId partial = graph.uniqueId(out + "_partial");
    std::string name = op.name, domain = op.domain;
    int version = op.version, phase = op.phase;
    graph.removeOp(op);
    addRewrittenOp(graph, phase, "Sum", domain, version, partial, {}, rest, {partial});
    addRewrittenOp(graph, phase, "Sum", domain, version, name, {}, {partial, product}, {out});
    return true;
  }
  return false;
}

/// A two-input Add or Sum of a Reshape of a product and a residual of the Reshape's shape:
/// Reshape(product + Reshape(residual)), whose addition fuseMatMulResidual then folds.
static bool addBeforeReshape(Graph &graph, Op &op) {
  if ((!isOnnxOp(&op, "Sum") && !isOnnxOp(&op, "Add")) || op.inputCount() != 2 || !op.hasInput(0) || !op.hasInput(1) ||
      &op.input(0) == &op.input(1) || !op.hasOutput(0))
    return false;
  for (size_t side = 0; side < 2; ++side) {
    Op *view = reshapedProduct(graph, op.input(side));
    const Tensor &residual = op.input(1 - side);
    if (!view || residual.info() != op.input(side).info() || op.outInfo(0) != residual.info()) continue;
    const TensorInfo &y = view->inInfo(0);
    TensorId out = op.output(0).id(), shapeOut = view->input(1).id(), productId = view->input(0).id();
    TensorId productShape = graph.uniqueId(out + "_product_shape");
    graph.addConst(productShape, TensorData::fromInt64({static_cast<int64_t>(y.rank())},
                                                       std::vector<int64_t>(y.shape().begin(), y.shape().end())));
    TensorId residualView = graph.uniqueId(out + "_residual_view"), sum = graph.uniqueId(out + "_product");
    std::string type = op.type, domain = op.domain, name = op.name, viewDomain = view->domain;
    int version = op.version, phase = op.phase, viewVersion = view->version;
    TensorId viewedId = op.input(side).id(), residualId = residual.id();
    graph.removeOp(op);
    graph.removeOp(*view);
    graph.removeTensor(viewedId);
    addRewrittenOp(graph, phase, "Reshape", viewDomain, viewVersion, residualView, {}, {residualId, productShape},
                   {residualView});
    addRewrittenOp(graph, phase, type, domain, version, name, {}, {productId, residualView}, {sum});
    addRewrittenOp(graph, phase, "Reshape", viewDomain, viewVersion, out, {}, {sum, shapeOut}, {out});
    return true;
  }
  return false;
}

/// An Add or a two-input Sum of two distinct tensors.
static bool isTwoInputAdd(const Op *op) {
  if (!isOnnxOp(op, "Add") && !isOnnxOp(op, "Sum")) return false;
  return op->inputCount() == 2 && op->hasInput(0) && op->hasInput(1) && &op->input(0) != &op->input(1);
}

/// An Add or two-input Sum of \p producerOf(one input)'s result and a tensor r of its shape
/// becomes that producer with popart_residual = 1 and r as input 3 (after an optional bias).
static bool foldResidual(Graph &graph, Op &op, const std::function<Op *(const Tensor &)> &producerOf) {
  if (!isTwoInputAdd(&op)) return false;
  for (size_t side = 0; side < 2; ++side) {
    Op *producer = producerOf(op.input(side));
    const Tensor &residual = op.input(1 - side);
    if (!producer || residual.info() != op.input(side).info() || op.outInfo(0) != residual.info()) continue;
    Attributes attrs = producer->attrs;
    attrs.set("popart_residual", int64_t{1});
    std::vector<TensorId> ins = inputIds(*producer);
    ins.resize(3);
    ins.push_back(residual.id());
    replacePair(graph, *producer, op, std::move(attrs), ins);
    return true;
  }
  return false;
}

/// A float Gemm (alpha 1; no C, or a [N] bias with beta 1) whose result only feeds an Add or a
/// two-input Sum with a tensor of its shape becomes the MatMul it is (popart_transA/B,
/// popart_bias), so that fuseMatMulResidual folds the residual into it.
static bool gemmBeforeResidual(Graph &graph, Op &op) {
  if (!isOnnxOp(&op, "Gemm") || !op.hasOutput(0) || op.attrs.getFloat("alpha", 1.f) != 1.f) return false;
  const Tensor &y = op.output(0);
  if (y.info().dataType() != DataType::FLOAT || y.consumers().size() != 1 || isGraphOutput(graph, y)) return false;
  bool bias = op.hasInput(2);
  if (bias && (op.attrs.getFloat("beta", 1.f) != 1.f || op.inInfo(2).shape() != Shape{y.info().dim(1)})) return false;
  const Op *add = y.consumers()[0];
  if (!isTwoInputAdd(add)) return false;
  const Tensor &other = &add->input(0) == &y ? add->input(1) : add->input(0);
  if (other.info() != y.info() || add->outInfo(0) != y.info()) return false;
  Attributes attrs;
  if (op.attrs.getInt("transA", 0)) attrs.set("popart_transA", int64_t{1});
  if (op.attrs.getInt("transB", 0)) attrs.set("popart_transB", int64_t{1});
  if (bias) attrs.set("popart_bias", int64_t{1});
  if (op.attrs.has("popart_activation")) attrs.set("popart_activation", op.attrs.getString("popart_activation"));
  std::vector<TensorId> ins = inputIds(op);
  TensorId out = y.id();
  std::string name = op.name;
  int phase = op.phase;
  graph.removeOp(op);
  addRewrittenOp(graph, phase, "MatMul", "ai.onnx", 13, name, std::move(attrs), ins, {out});
  return true;
}

int fuseMatMulResidual(Graph &graph) {
  rewriteAll(graph, [&](Op &op) { return gemmBeforeResidual(graph, op); });
  rewriteAll(graph, [&](Op &op) { return splitSumForResidual(graph, op); });
  rewriteAll(graph, [&](Op &op) { return addBeforeReshape(graph, op); });
  return rewriteAll(graph, [&](Op &op) {
    return foldResidual(graph, op, [&](const Tensor &t) { return residualProduct(graph, t); });
  });
}

/// The float Conv that produced \p t, if nothing else reads \p t and the Conv has no fused
/// pool, activation or residual yet.
static Op *bareConvOf(const Graph &graph, const Tensor &t) {
  Op *c = t.producer();
  if (!isOnnxOp(c, "Conv") || c->inputCount() > 3 || c->attrs.has("popart_activation") ||
      c->attrs.has("popart_pool_kernel") || c->attrs.has("popart_residual"))
    return nullptr;
  if (t.consumers().size() != 1 || isGraphOutput(graph, t) || t.info().dataType() != DataType::FLOAT) return nullptr;
  return c;
}

/// The activation \p op computes of its input 0 as a Conv post-op (Kind::None if none): Relu,
/// Clip with constant scalar bounds (or none), HardSigmoid, HardSwish, Sigmoid.
static FusedActivation activationOf(const Op &op) {
  FusedActivation a;
  using K = FusedActivation::Kind;
  if (op.domain != "ai.onnx" || !op.hasInput(0) || !op.hasOutput(0) || op.outputs.size() != 1) return a;
  if (op.type == "Relu") {
    a.kind = K::Relu;
  } else if (op.type == "Clip") {
    double lo = -INFINITY, hi = INFINITY;
    if (op.inputCount() > 1 && op.hasInput(1) && !constScalar(&op.input(1), lo)) return a;
    if (op.inputCount() > 2 && op.hasInput(2) && !constScalar(&op.input(2), hi)) return a;
    if (!(lo <= hi)) return a; // min > max sets everything to max: leave it to the op
    a = {K::Clip, static_cast<float>(lo), static_cast<float>(hi)};
  } else if (op.type == "HardSigmoid") {
    a = {K::HardSigmoid, op.attrs.getFloat("alpha", 0.2f), op.attrs.getFloat("beta", 0.5f)};
  } else if (op.type == "HardSwish") {
    a.kind = K::HardSwish;
  } else if (op.type == "Sigmoid") {
    a.kind = K::Sigmoid;
  }
  return a;
}

/// Rewrites \p conv, whose result only \p ops read, into one Conv that applies \p act and writes
/// \p out.
static void convWithActivation(Graph &graph, Op &conv, const std::vector<Op *> &ops, const FusedActivation &act,
                               const TensorId &out) {
  std::vector<TensorId> ins = inputIds(conv), gone{conv.output(0).id()};
  Attributes attrs = conv.attrs;
  act.store(attrs);
  std::string name = conv.name;
  int version = conv.version, phase = conv.phase;
  for (Op *op : ops) {
    for (const Tensor *t : op->outputs)
      if (t && t->id() != out) gone.push_back(t->id());
    graph.removeOp(*op);
  }
  graph.removeOp(conv);
  for (const auto &id : gone)
    graph.removeTensor(id);
  addRewrittenOp(graph, phase, "Conv", "ai.onnx", version, name, std::move(attrs), ins, {out});
}

int fuseConvActivation(Graph &graph) {
  using K = FusedActivation::Kind;
  return rewriteAll(graph, [&](Op &conv) {
    if (!isOnnxOp(&conv, "Conv") || !conv.hasOutput(0) || conv.attrs.has("popart_activation") ||
        conv.attrs.has("popart_pool_kernel"))
      return false;
    const Tensor &y = conv.output(0);
    if (isGraphOutput(graph, y) || y.info().dataType() != DataType::FLOAT) return false;
    const auto &readers = y.consumers();
    if (readers.size() == 1) { // Conv → activation
      FusedActivation act = activationOf(*readers[0]);
      if (act.kind == K::None || readers[0]->outInfo(0) != y.info()) return false;
      convWithActivation(graph, conv, {readers[0]}, act, readers[0]->output(0).id());
      return true;
    }
    // Conv → Sigmoid / HardSigmoid(1/6, 1/2) → Mul with the result: SiLU and hard swish as
    // exported (torch writes hardswish so before opset 14, SiLU so always).
    if (readers.size() != 2) return false;
    for (int first = 0; first < 2; ++first) {
      Op *gate = readers[static_cast<size_t>(first)], *mul = readers[static_cast<size_t>(1 - first)];
      FusedActivation g = activationOf(*gate);
      K kind = g.kind == K::Sigmoid                                                 ? K::Swish
               : g.kind == K::HardSigmoid && g.alpha == 1.f / 6.f && g.beta == 0.5f ? K::HardSwish
                                                                                    : K::None;
      if (kind == K::None || !isOnnxOp(mul, "Mul") || mul->inputCount() != 2) continue;
      const Tensor &s = gate->output(0);
      if (s.consumers().size() != 1 || s.consumers()[0] != mul || isGraphOutput(graph, s)) continue;
      bool operands = (&mul->input(0) == &y && &mul->input(1) == &s) || (&mul->input(0) == &s && &mul->input(1) == &y);
      if (!operands || mul->outInfo(0) != y.info()) continue;
      FusedActivation act;
      act.kind = kind;
      convWithActivation(graph, conv, {gate, mul}, act, mul->output(0).id());
      return true;
    }
    return false;
  });
}

int fuseHardSwish(Graph &graph) {
  return rewriteAll(graph, [&](Op &mul) {
    if (!isOnnxOp(&mul, "Mul") || mul.inputCount() != 2 || !mul.hasInput(0) || !mul.hasInput(1) || !mul.hasOutput(0))
      return false;
    for (size_t g = 0; g < 2; ++g) {
      Op *gate = mul.input(g).producer();
      const Tensor &x = mul.input(1 - g), &s = mul.input(g);
      if (!isOnnxOp(gate, "HardSigmoid") || !gate->hasInput(0) || &gate->input(0) != &x) continue;
      if (gate->attrs.getFloat("alpha", 0.2f) != 1.f / 6.f || gate->attrs.getFloat("beta", 0.5f) != 0.5f) continue;
      if (s.consumers().size() != 1 || isGraphOutput(graph, s) || x.info().dataType() != DataType::FLOAT ||
          mul.outInfo(0) != x.info())
        continue;
      TensorId in = x.id(), out = mul.output(0).id(), mid = s.id();
      std::string name = gate->name;
      int phase = mul.phase;
      graph.removeOp(mul);
      graph.removeOp(*gate);
      graph.removeTensor(mid);
      addRewrittenOp(graph, phase, "HardSwish", "ai.onnx", 14, name, {}, {in}, {out});
      return true;
    }
    return false;
  });
}

int inferenceDropoutAsIdentity(Graph &graph) {
  return rewriteAll(graph, [&](Op &op) {
    if (!isOnnxOp(&op, "Dropout") || !op.hasInput(0) || !op.hasOutput(0)) return false;
    if (op.inputCount() > 3 && op.hasInput(3)) return false; // the session's seed: it trains
    if (op.version >= 12 && op.inputCount() > 2 && op.hasInput(2)) {
      const Tensor &mode = op.input(2);
      if (!mode.isConst() || mode.info().elementCount() != 1 || mode.data()->valueAsDouble(0) != 0) return false;
    }
    if (op.outputs.size() > 1 && op.hasOutput(1)) {
      const Tensor &mask = op.output(1);
      if (!mask.consumers().empty() || isGraphOutput(graph, mask)) return false;
    }
    TensorId in = op.input(0).id(), out = op.output(0).id();
    std::vector<TensorId> gone;
    for (size_t i = 1; i < op.outputs.size(); ++i)
      if (op.hasOutput(i)) gone.push_back(op.output(i).id());
    std::string name = op.name;
    int phase = op.phase;
    graph.removeOp(op);
    for (const auto &id : gone)
      graph.removeTensor(id);
    addRewrittenOp(graph, phase, "Identity", "ai.onnx", 16, name, {}, {in}, {out});
    return true;
  });
}

int foldBatchNormIntoConv(Graph &graph) {
  return rewriteAll(graph, [&](Op &bn) {
    if (!isOnnxOp(&bn, "BatchNormalization") || bn.inputCount() != 5 || !bn.hasOutput(0)) return false;
    if (bn.attrs.getInt("training_mode", 0) != 0 || bn.attrs.getInt("spatial", 1) == 0) return false;
    for (size_t i = 1; i < bn.outputs.size(); ++i)
      if (bn.hasOutput(i)) return false; // running statistics asked for: a training-mode node
    Op *conv = bn.hasInput(0) ? bareConvOf(graph, bn.input(0)) : nullptr;
    if (!conv) return false;
    auto constFloats = [](const Op &op, size_t i) -> const TensorData * {
      if (!op.hasInput(i) || !op.input(i).isConst() || op.inInfo(i).dataType() != DataType::FLOAT) return nullptr;
      return op.input(i).data().get();
    };
    const int64_t m = conv->outInfo(0).dim(1);
    const TensorData *w = constFloats(*conv, 1), *b = conv->hasInput(2) ? constFloats(*conv, 2) : nullptr;
    if (!w || (conv->hasInput(2) && !b)) return false;
    std::vector<const TensorData *> p; // scale, B, mean, var
    for (size_t i = 1; i < 5; ++i) {
      p.push_back(constFloats(bn, i));
      if (!p.back() || p.back()->info().shape() != Shape{m}) return false;
    }
    // y = (conv - mean) * scale / sqrt(var + eps) + B, per output channel: the factor goes into
    // W's rows and the rest into the bias.
    const double eps = bn.attrs.getFloat("epsilon", 1e-5f);
    const int64_t perChannel = w->info().elementCount() / m;
    TensorData w2(w->info()), b2(TensorInfo(DataType::FLOAT, {m}));
    for (int64_t c = 0; c < m; ++c) {
      const double f = double(p[0]->as<float>()[c]) / std::sqrt(double(p[3]->as<float>()[c]) + eps);
      for (int64_t k = 0; k < perChannel; ++k)
        w2.as<float>()[c * perChannel + k] = static_cast<float>(double(w->as<float>()[c * perChannel + k]) * f);
      const double bias = b ? double(b->as<float>()[c]) : 0.0;
      b2.as<float>()[c] = static_cast<float>((bias - double(p[2]->as<float>()[c])) * f + double(p[1]->as<float>()[c]));
    }
    TensorId wId = graph.uniqueId(bn.output(0).id() + "_folded_weights");
    TensorId bId = graph.uniqueId(bn.output(0).id() + "_folded_bias");
    graph.addConst(wId, std::move(w2));
    graph.addConst(bId, std::move(b2));
    std::vector<TensorId> ins = inputIds(*conv);
    ins.resize(3);
    ins[1] = wId;
    ins[2] = bId;
    replacePair(graph, *conv, bn, conv->attrs, ins);
    return true;
  });
}

int fuseConvResidual(Graph &graph) {
  return rewriteAll(
      graph, [&](Op &op) { return foldResidual(graph, op, [&](const Tensor &t) { return bareConvOf(graph, t); }); });
}

int fuseMatMulScale(Graph &graph) {
  return rewriteAll(graph, [&](Op &op) {
    bool div = isOnnxOp(&op, "Div");
    if ((!div && !isOnnxOp(&op, "Mul")) || op.inputCount() != 2 || !op.hasInput(0) || !op.hasInput(1)) return false;
    for (size_t side = 0; side < (div ? 1u : 2u); ++side) {
      Op *mm = op.input(side).producer();
      double c = 0;
      if (!isOnnxOp(mm, "MatMul") || mm->inputCount() != 2 || mm->attrs.has("popart_scale") ||
          mm->attrs.has("popart_activation") || mm->attrs.has("popart_residual"))
        continue;
      if (!constScalar(&op.input(1 - side), c) || c == 0 || !std::isfinite(c)) continue;
      const Tensor &product = mm->output(0);
      if (product.consumers().size() != 1 || isGraphOutput(graph, product)) continue;
      if (product.info().dataType() != DataType::FLOAT || op.outInfo(0).shape() != product.info().shape()) continue;
      Attributes attrs = mm->attrs;
      attrs.set("popart_scale", static_cast<float>(div ? 1.0 / c : c));
      replacePair(graph, *mm, op, std::move(attrs), {mm->input(0).id(), mm->input(1).id()});
      return true;
    }
    return false;
  });
}

int fuseLossGradClassSums(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *r = &candidate;
    if (!isOnnxOp(r, "ReduceSum") || r->inputCount() != 2 || !r->hasInput(1) || !r->input(1).isConst()) return false;
    // Through Reshapes that keep the class axis last, back to the loss gradient.
    const Tensor *t = &r->input(0);
    int64_t classes = t->info().rank() >= 1 ? t->info().shape().back() : 0;
    while (t->producer() && isOnnxOp(t->producer(), "Reshape") && t->info().rank() >= 1 &&
           t->info().shape().back() == classes)
      t = &t->producer()->input(0);
    Op *sce = t->producer();
    if (!sce || sce->type != "SoftmaxCrossEntropyLossGrad" || sce->domain != "ai.graphcore" || sce->hasOutput(1))
      return false;
    if (&sce->output(0) != t || t->info().rank() != 2 || t->info().shape().back() != classes) return false;
    // The sum runs over every axis but the last.
    int64_t rank = r->inInfo(0).rank();
    std::vector<int64_t> axes = r->input(1).data()->toInt64Vector();
    for (auto &a : axes)
      a = a < 0 ? a + rank : a;
    std::sort(axes.begin(), axes.end());
    std::vector<int64_t> all(static_cast<size_t>(rank - 1));
    for (int64_t a = 0; a < rank - 1; ++a)
      all[static_cast<size_t>(a)] = a;
    if (axes != all || r->outInfo(0).elementCount() != classes) return false;
    TensorId out = r->output(0).id(), sums = graph.uniqueId(out + "_class_sums");
    Shape outShape = r->outInfo(0).shape();
    std::vector<TensorId> ins = inputIds(*sce), outs{sce->output(0).id(), sums};
    std::string name = sce->name;
    int phase = sce->phase, version = sce->version;
    Attributes attrs = sce->attrs;
    graph.removeOp(*r);
    graph.removeOp(*sce);
    Op &grad = graph.addOp("SoftmaxCrossEntropyLossGrad", "ai.graphcore", version, name, std::move(attrs), ins, outs);
    grad.phase = phase;
    grad.def->setup(grad);
    TensorId shape = graph.uniqueId(out + "_shape");
    graph.addConst(shape, TensorData::fromInt64({static_cast<int64_t>(outShape.size())},
                                                std::vector<int64_t>(outShape.begin(), outShape.end())));
    Op &view = graph.addOp("Reshape", "ai.onnx", 14, "", {}, {sums, shape}, {out});
    view.phase = phase;
    view.def->setup(view);
    return true;
  });
}

/// True if \p t is computed (transitively) from an output of \p op.
static bool dependsOn(const Tensor &t, const Op &op) {
  std::vector<const Tensor *> stack{&t};
  std::set<const Tensor *> seen;
  while (!stack.empty()) {
    const Tensor *x = stack.back();
    stack.pop_back();
    if (!seen.insert(x).second) continue;
    const Op *p = x->producer();
    if (!p) continue;
    if (p == &op) return true;
    for (const Tensor *in : p->inputs)
      if (in) stack.push_back(in);
  }
  return false;
}

int fuseLossWithGradient(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *g = &candidate;
    if (g->type != "SoftmaxCrossEntropyLossGrad" || g->domain != "ai.graphcore" || g->hasOutput(2)) return false;
    if (!g->hasInput(0) || !g->hasInput(1) || !g->hasInput(3)) return false;
    Op *f = nullptr;
    for (Op *c : g->input(0).consumers())
      if (isOnnxOp(c, "SoftmaxCrossEntropyLoss") && c->hasInput(1) && &c->input(1) == &g->input(1) &&
          c->hasInput(2) == g->hasInput(2) && (!c->hasInput(2) || &c->input(2) == &g->input(2)) &&
          c->attrs.getString("reduction", "mean") == g->attrs.getString("reduction", "mean") &&
          c->attrs.has("ignore_index") == g->attrs.has("ignore_index") &&
          c->attrs.getInt("ignore_index", 0) == g->attrs.getInt("ignore_index", 0))
        f = c;
    if (!f || !f->hasOutput(0)) return false;
    if (f->hasOutput(1) && (!f->output(1).consumers().empty() || isGraphOutput(graph, f->output(1)))) return false;
    if (dependsOn(g->input(3), *f)) return false; // the gradient seed must not need the loss
    std::vector<TensorId> ins = inputIds(*g),
                          outs{g->output(0).id(), g->hasOutput(1) ? g->output(1).id() : "", f->output(0).id()};
    // Named and phased as the forward; its unused log_prob goes with it.
    replaceOps(graph, {f, g}, g->type, g->domain, g->version, g->attrs, ins, outs);
    return true;
  });
}

} // namespace popart::ir
