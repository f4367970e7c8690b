// MatMul (numpy semantics) and Gemm.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

void setupMatMul(Op &op) {
  bool residual = op.attrs.getInt("popart_residual", 0) != 0;
  requireInputCount(op, residual ? 4 : 2, residual ? 4 : op.attrs.getInt("popart_bias", 0) ? 3 : 2);
  Shape a = op.inInfo(0).shape();
  Shape b = op.inInfo(1).shape();
  if (a.empty() || b.empty()) throw error(op.debugName(), ": MatMul inputs must have rank >= 1");
  if (op.inInfo(0).dataType() != op.inInfo(1).dataType())
    throw error(op.debugName(), ": input types differ (", toString(op.inInfo(0).dataType()), " and ",
                toString(op.inInfo(1).dataType()), ")");
  // popart_transA / popart_transB (set by foldTransposesIntoMatMul): the input holds the
  // matrix with its last two axes swapped.
  if (op.attrs.getInt("popart_transA", 0) && a.size() >= 2) std::swap(a[a.size() - 1], a[a.size() - 2]);
  if (op.attrs.getInt("popart_transB", 0) && b.size() >= 2) std::swap(b[b.size() - 1], b[b.size() - 2]);
  bool aVec = a.size() == 1, bVec = b.size() == 1;
  if (aVec) a.insert(a.begin(), 1);
  if (bVec) b.push_back(1);
  int64_t k = a.back(), k2 = b[b.size() - 2];
  if (k != k2)
    throw error(op.debugName(), ": inner dimensions differ: ", toString(op.inInfo(0).shape()), " x ",
                toString(op.inInfo(1).shape()));
  Shape batchA(a.begin(), a.end() - 2), batchB(b.begin(), b.end() - 2);
  Shape out = broadcastShapes(batchA, batchB, op);
  if (!aVec) out.push_back(a[a.size() - 2]);
  if (!bVec) out.push_back(b.back());
  // popart_bias (set by fuseMatMulBias): input 2 is a bias of the output's last dimension.
  if (op.hasInput(2)) {
    const TensorInfo &bias = op.inInfo(2);
    if (bVec || bias.shape() != Shape{out.back()} || bias.dataType() != op.inInfo(0).dataType())
      throw error(op.debugName(), ": bias ", bias.toString(), " must be 1-D of the output's last dimension ",
                  out.empty() ? int64_t{0} : out.back(), " in ", toString(op.inInfo(0).dataType()));
  }
  TensorInfo y(op.inInfo(0).dataType(), out);
  // popart_residual (set by fuseMatMulResidual): input 3, of the output's shape, is added last.
  if (residual && (!op.hasInput(3) || op.inInfo(3) != y || bVec))
    throw error(op.debugName(), ": the residual input 3 must be ", y.toString(), ", got ",
                op.hasInput(3) ? op.inInfo(3).toString() : std::string("none"));
  op.setOutInfo(0, y);
}

void setupGemm(Op &op) {
  requireInputCount(op, 2, 3);
  const Shape &a = op.inInfo(0).shape();
  const Shape &b = op.inInfo(1).shape();
  if (a.size() != 2 || b.size() != 2) throw error(op.debugName(), ": Gemm inputs A and B must be 2-D");
  bool ta = op.attrs.getInt("transA", 0) != 0, tb = op.attrs.getInt("transB", 0) != 0;
  int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1];
  int64_t kb = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
  if (k != kb) throw error(op.debugName(), ": inner dimensions differ (", k, " and ", kb, ")");
  Shape out{m, n};
  if (op.hasInput(2)) {
    Shape c = broadcastShapes(op.inInfo(2).shape(), out, op);
    if (c != out)
      throw error(op.debugName(), ": C of shape ", toString(op.inInfo(2).shape()), " does not broadcast to ",
                  toString(out));
  }
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

} // namespace

void registerMatMulOps(OpRegistry &r) {
  r.add(makeDef("MatMul", 1, 1000, setupMatMul));
  r.add(makeDef("Gemm", 1, 1000, setupGemm));
}

} // namespace popart::ir
