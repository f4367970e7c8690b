// MatMul (numpy semantics) and Gemm.

#include "ir/internal_attributes.hpp"
#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"
#include "ir/ops/matmul_layout.hpp"

namespace popart::ir {

bool isPermutation(const std::vector<int64_t> &perm, size_t rank) {
  if (perm.size() != rank) return false;
  std::vector<bool> seen(rank, false);
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(p)]) return false;
    seen[static_cast<size_t>(p)] = true;
  }
  return true;
}

StridedShape matMulOperand(const Op &op, size_t i) {
  const Shape &stored = op.inInfo(i).shape();
  StridedShape s{stored, rowMajorStrides(stored)};
  const std::vector<int64_t> &perm = i == 0 ? op.fusion.permA : op.fusion.permB;
  if (!perm.empty()) {
    if (!isPermutation(perm, stored.size()))
      throw error(op.debugName(), ": fusion field ", i == 0 ? "permA" : "permB", " ", intsToString(perm),
                  " is not a permutation of input ", i, "'s ", stored.size(), " axes");
    StridedShape p{stored, s.strides};
    for (size_t j = 0; j < perm.size(); ++j) {
      p.shape[j] = stored[static_cast<size_t>(perm[j])];
      p.strides[j] = s.strides[static_cast<size_t>(perm[j])];
    }
    s = p;
  }
  if ((i == 0 ? op.fusion.transA : op.fusion.transB) && s.shape.size() >= 2) {
    std::swap(s.shape[s.shape.size() - 1], s.shape[s.shape.size() - 2]);
    std::swap(s.strides[s.strides.size() - 1], s.strides[s.strides.size() - 2]);
  }
  return s;
}

BatchOffsets matMulBatchOffsets(const StridedShape &a, const StridedShape &b, const StridedShape &y, size_t rank) {
  auto batchStrides = [&](const StridedShape &s) {
    std::vector<int64_t> st(rank, 0);
    size_t axes = s.shape.size() - 2;
    for (size_t d = 0; d < axes; ++d)
      if (s.shape[d] != 1) st[rank - axes + d] = s.strides[d];
    return st;
  };
  std::vector<int64_t> sa = batchStrides(a), sb = batchStrides(b);
  Shape batch(y.shape.begin(), y.shape.begin() + static_cast<std::ptrdiff_t>(rank));
  int64_t batches = shapeElementCount(batch);
  BatchOffsets offsets;
  std::vector<int64_t> index(rank, 0);
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t oa = 0, ob = 0, oy = 0;
    for (size_t d = 0; d < rank; ++d) {
      oa += index[d] * sa[d];
      ob += index[d] * sb[d];
      oy += index[d] * y.strides[d];
    }
    offsets.a.push_back(oa);
    offsets.b.push_back(ob);
    offsets.y.push_back(oy);
    for (size_t d = rank; d-- > 0;) { // next batch index, last axis fastest
      if (++index[d] < batch[d]) break;
      index[d] = 0;
    }
  }
  return offsets;
}

MatMulGeometry matMulGeometry(const Op &op) {
  StridedShape a = matMulOperand(op, 0), b = matMulOperand(op, 1), y = matMulResult(op);
  const bool aVec = a.shape.size() == 1, bVec = b.shape.size() == 1;
  if (aVec) { // [k] is [1, k]; the result has no m axis
    a.shape.insert(a.shape.begin(), 1);
    a.strides.insert(a.strides.begin(), 0);
  }
  if (bVec) { // [k] is [k, 1]; the result has no n axis
    b.shape.push_back(1);
    b.strides.push_back(0);
  }
  MatMulGeometry g;
  g.m = a.shape[a.shape.size() - 2];
  g.k = a.shape.back();
  g.n = b.shape.back();
  g.aRow = a.strides[a.strides.size() - 2];
  g.aCol = a.strides.back();
  g.bRow = b.strides[b.strides.size() - 2];
  g.bCol = b.strides.back();
  const size_t yMatrix = (aVec ? 0 : 1) + (bVec ? 0 : 1);
  const size_t rank = y.shape.size() - yMatrix; // batch axes
  g.yRow = aVec ? 0 : y.strides[rank];
  g.yCol = bVec ? 1 : y.strides.back(); // one column: any stride
  BatchOffsets offsets = matMulBatchOffsets(a, b, y, rank);
  g.offsetA = std::move(offsets.a);
  g.offsetB = std::move(offsets.b);
  g.offsetY = std::move(offsets.y);
  return g;
}

StridedShape matMulResult(const Op &op) {
  const Shape &stored = op.outInfo(0).shape();
  StridedShape s{stored, rowMajorStrides(stored)};
  const std::vector<int64_t> &perm = op.fusion.permY;
  if (perm.empty()) return s;
  StridedShape p{stored, s.strides};
  for (size_t j = 0; j < perm.size() && j < stored.size(); ++j) { // stored axis j is product axis perm[j]
    p.shape[static_cast<size_t>(perm[j])] = stored[j];
    p.strides[static_cast<size_t>(perm[j])] = s.strides[j];
  }
  return p;
}

namespace {

void setupMatMul(Op &op) {
  bool residual = op.fusion.residual;
  requireInputCount(op, residual ? 4 : 2, residual ? 4 : op.fusion.bias ? 3 : 2);
  if (op.inInfo(0).shape().empty() || op.inInfo(1).shape().empty())
    throw error(op.debugName(), ": MatMul inputs must have rank >= 1");
  if (op.inInfo(0).dataType() != op.inInfo(1).dataType())
    throw error(op.debugName(), ": input types differ (", toString(op.inInfo(0).dataType()), " and ",
                toString(op.inInfo(1).dataType()), ")");
  // Fusion::transA/B and permA/B (set by foldTransposesIntoMatMul): the input holds the
  // operand transposed (matmul_layout.hpp).
  Shape a = matMulOperand(op, 0).shape;
  Shape b = matMulOperand(op, 1).shape;
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
  // Fusion::bias (set by fuseMatMulBias): input 2 is a bias of the output's last dimension.
  if (op.hasInput(2)) {
    const TensorInfo &bias = op.inInfo(2);
    if (bVec || bias.shape() != Shape{out.back()} || bias.dataType() != op.inInfo(0).dataType())
      throw error(op.debugName(), ": bias ", bias.toString(), " must be 1-D of the output's last dimension ",
                  out.empty() ? int64_t{0} : out.back(), " in ", toString(op.inInfo(0).dataType()));
  }
  // Fusion::permY (set by foldTransposesIntoMatMul): the output holds the product transposed,
  // its last axis kept last (so a bias stays on it).
  const std::vector<int64_t> &permY = op.fusion.permY;
  if (!permY.empty()) {
    if (!isPermutation(permY, out.size()) || permY.back() != static_cast<int64_t>(out.size()) - 1)
      throw error(op.debugName(), ": fusion field permY ", toString(permY), " must be a permutation of the product's ",
                  out.size(), " axes that keeps the last one last");
    Shape stored(out.size());
    for (size_t j = 0; j < out.size(); ++j)
      stored[j] = out[static_cast<size_t>(permY[j])];
    out = stored;
  }
  // Fusion::outputType (set by foldCastIntoMatMul): a 16-bit product written in FLOAT.
  TensorInfo y(op.fusion.outputType.value_or(op.inInfo(0).dataType()), out);
  // Fusion::residual (set by fuseMatMulResidual): input 3, of the output's shape, is added last.
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

/// 2·M·N·K: one multiply and one add per product term.
double matMulFlops(const Op &op) {
  if (op.inputCount() < 2 || !op.hasOutput(0)) return outputElementCount(op);
  if (op.inInfo(0).shape().empty()) return outputElementCount(op);
  return 2.0 * static_cast<double>(op.outInfo(0).elementCount()) *
         static_cast<double>(matMulOperand(op, 0).shape.back());
}

double gemmFlops(const Op &op) {
  if (op.inputCount() < 2 || !op.hasOutput(0)) return outputElementCount(op);
  const Shape &a = op.inInfo(0).shape();
  if (a.empty()) return outputElementCount(op);
  bool ta = op.attrs.getInt("transA", 0) != 0;
  int64_t k = ta && a.size() >= 2 ? a[a.size() - 2] : a.back();
  return 2.0 * static_cast<double>(op.outInfo(0).elementCount()) * static_cast<double>(k);
}

} // namespace

void registerMatMulOps(OpRegistry &r) {
  OpDef matmul = makeDef("MatMul", 1, 1000, setupMatMul);
  matmul.flops = matMulFlops;
  matmul.fusionFields =
      fusionFieldBits({FusionField::Scale, FusionField::Bias, FusionField::Residual, FusionField::Relu,
                       FusionField::Transpose, FusionField::Permute, FusionField::OutputType});
  matmul.internalAttributes = {internal_attr::kHalfPartials}; // fp16.16 (convertPrecision)
  r.add(matmul);
  OpDef gemm = makeDef("Gemm", 1, 1000, setupGemm);
  gemm.flops = gemmFlops;
  gemm.fusionFields = fusionFieldBits({FusionField::Relu});
  gemm.internalAttributes = {internal_attr::kHalfPartials};
  r.add(gemm);
}

} // namespace popart::ir
