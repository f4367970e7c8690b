// foldTransposesIntoMatMul: a MatMul reads its operands and writes its product through strides
// (Fusion::transA/B, permA/B/Y), so that the Transposes around it never run.

#include "ir/passes/pass_manager.hpp"
#include "ir/passes/rewrite.hpp"

#include <algorithm>
#include <set>

namespace popart::ir {

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

/// A Transpose of a MatMul's only use that keeps the product's last axis among its last two:
/// the MatMul writes the transposed result itself. One that moves the last axis to second last
/// uses (A·B)ᵀ = Bᵀ·Aᵀ (for a Transpose of the last two axes only, that is all); what remains
/// keeps the last axis last (Fusion::permY).
static bool foldTransposedProduct(Graph &graph) {
  for (Op *t : graph.schedule()) {
    if (t->type != "Transpose" || t->domain != "ai.onnx" || !t->hasInput(0) || !t->hasOutput(0)) continue;
    Op *m = t->input(0).producer();
    if (!m || m->type != "MatMul" || m->domain != "ai.onnx" || m->inputCount() != 2 || !m->fusion.permY.empty() ||
        m->fusion.activated() || m->fusion.scale)
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
    std::vector<TensorId> inputs{m->input(0).id(), m->input(1).id()};
    Fusion fusion = m->fusion;
    bool ta = fusion.transA, tb = fusion.transB;
    if (swap) { // product = (Bᵀ·Aᵀ)ᵀ: the Transpose of Bᵀ·Aᵀ by σ∘perm keeps the last axis last
      std::swap(inputs[0], inputs[1]);
      std::swap(ta, tb);
      ta = !ta;
      tb = !tb;
      for (auto &p : perm)
        p = p == last ? last - 1 : p == last - 1 ? last : p;
    }
    fusion.transA = ta;
    fusion.transB = tb;
    if (swap) std::swap(fusion.permA, fusion.permB);
    if (!isIdentity(perm)) fusion.permY = perm;
    replacePair(graph, *m, *t, m->attrs, fusion, inputs);
    return true;
  }
  return false;
}

/// Folds Transpose \p t into input \p i of MatMul \p op if the result leaves the stored last
/// axis among the operand's last two (so the kernels read it with one unit stride).
static bool foldTransposeIntoOperand(Op &op, size_t i, Op &t) {
  size_t rank = static_cast<size_t>(op.inInfo(i).rank());
  if (static_cast<size_t>(t.inInfo(0).rank()) != rank || rank < 2) return false;
  bool &trans = i == 0 ? op.fusion.transA : op.fusion.transB;
  std::vector<int64_t> &storedPerm = i == 0 ? op.fusion.permA : op.fusion.permB;
  std::vector<int64_t> outer = storedPerm, inner = transposePerm(t);
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
  storedPerm = perm;
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

void registerMatMulTransposePasses(PassRegistry &r) {
  r.add(optionalPass("foldTransposesIntoMatMul",
                     "MatMuls read transposed operands and write transposed products through strides "
                     "(Fusion::transA/B, permA/B/Y)",
                     OutputsFixed, [](Graph &g, PassContext &) { return foldTransposesIntoMatMul(g); }));
}

} // namespace popart::ir
