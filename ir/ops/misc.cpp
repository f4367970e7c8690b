// Misc ops: Dropout, Einsum, MatMulInteger, QuantizeLinear, DequantizeLinear,
// DynamicQuantizeLinear, Det.

#include "ir/internal_attributes.hpp"
#include "ir/ops/dropout.hpp"
#include "ir/ops/einsum.hpp"
#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

#include <algorithm>
#include <map>

namespace popart::ir {

namespace {

/// Dropout. Beyond ONNX: an optional input 3, INT64 [2] = {seed, counter}, selects the
/// counter-based mask of ir/ops/dropout.hpp, and attribute popart_salt tells two ops apart.
void setupDropout(Op &op) {
  requireInputCount(op, 1, 4);
  if (op.version < 12)
    for (size_t i : {1, 2})
      if (op.hasInput(i)) throw error(op.debugName(), ": opset ", op.version, " Dropout has no input ", i);
  requireType(op, 0, {DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16, DataType::BFLOAT16});
  if (op.hasInput(3)) {
    requireType(op, 3, {DataType::INT64});
    if (op.inInfo(3).elementCount() != 2)
      throw error(op.debugName(), ": input 3 (seed, counter) has shape ", toString(op.inInfo(3).shape()),
                  ", expected [2]");
  }
  float ratio = op.attrs.getFloat("ratio", 0.5f);
  if (op.version < 12 && (ratio < 0 || ratio >= 1))
    throw error(op.debugName(), ": ratio ", ratio, " must be in [0, 1)");
  if (op.hasInput(1) && op.inInfo(1).elementCount() != 1) throw error(op.debugName(), ": ratio must be a scalar");
  if (op.hasInput(2)) requireType(op, 2, {DataType::BOOL});
  setupSameAsInput0(op);
  op.setOutInfo(1, TensorInfo(op.version >= 10 ? DataType::BOOL : op.inInfo(0).dataType(), op.inInfo(0).shape()));
}

} // namespace

int64_t dropoutSalt(const Op &op) {
  if (op.attrs.has(ir::internal_attr::kSalt)) return op.attrs.getInt(ir::internal_attr::kSalt);
  if (op.attrs.has("seed")) return op.attrs.getInt("seed");
  // FNV-1a of the output's name: stable across runs and processes, unlike std::hash.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : op.output(0).id()) {
    h ^= ch;
    h *= 0x100000001b3ULL;
  }
  return static_cast<int64_t>(h);
}

bool dropoutTraining(const Op &op, bool trainingInput) {
  if (op.version >= 12) return trainingInput;
  return op.hasInput(3) && op.attrs.getInt("is_test", 0) == 0;
}

namespace {

void setupEinsum(Op &op) {
  requireInputCount(op, 1, 1000);
  EinsumSpec spec = parseEinsum(op);
  std::map<int, int64_t> sizes;
  for (size_t t = 0; t < spec.inputs.size(); ++t) {
    if (op.inInfo(t).dataType() != op.inInfo(0).dataType())
      throw error(op.debugName(), ": inputs have different types");
    for (size_t d = 0; d < spec.inputs[t].size(); ++d) {
      int l = spec.inputs[t][d];
      int64_t s = op.inInfo(t).shape()[d];
      auto it = sizes.find(l);
      if (it == sizes.end() || it->second == 1)
        sizes[l] = s;
      else if (s != 1 && s != it->second)
        throw error(op.debugName(), ": dimension ", d, " of input ", t, " has size ", s, " but its label has size ",
                    it->second);
    }
  }
  Shape out;
  for (int l : spec.output)
    out.push_back(sizes[l]);
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void setupMatMulInteger(Op &op) {
  requireInputCount(op, 2, 4);
  requireType(op, 0, {DataType::UINT8, DataType::INT8});
  requireType(op, 1, {DataType::UINT8, DataType::INT8});
  Shape a = op.inInfo(0).shape(), b = op.inInfo(1).shape();
  if (a.empty() || b.empty()) throw error(op.debugName(), ": inputs must have rank >= 1");
  bool aVec = a.size() == 1, bVec = b.size() == 1;
  if (aVec) a.insert(a.begin(), 1);
  if (bVec) b.push_back(1);
  if (a.back() != b[b.size() - 2])
    throw error(op.debugName(), ": inner dimensions differ: ", toString(op.inInfo(0).shape()), " x ",
                toString(op.inInfo(1).shape()));
  Shape out = broadcastShapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2), op);
  if (!aVec) out.push_back(a[a.size() - 2]);
  if (!bVec) out.push_back(b.back());
  int64_t m = a[a.size() - 2], n = b.back();
  if (op.hasInput(2) && op.inInfo(2).elementCount() != 1 && op.inInfo(2).elementCount() != m)
    throw error(op.debugName(), ": a_zero_point must be a scalar or have M = ", m, " elements");
  if (op.hasInput(3) && op.inInfo(3).elementCount() != 1 && op.inInfo(3).elementCount() != n)
    throw error(op.debugName(), ": b_zero_point must be a scalar or have N = ", n, " elements");
  op.setOutInfo(0, TensorInfo(DataType::INT32, out));
}

void setupQLinearMatMul(Op &op) {
  requireInputCount(op, 8, 8);
  for (size_t i : {0, 2, 3, 5, 7})
    requireType(op, i, {DataType::UINT8, DataType::INT8});
  for (size_t i : {1, 4, 6})
    requireType(op, i, {DataType::FLOAT});
  if (op.inInfo(6).elementCount() != 1 || op.inInfo(7).elementCount() != 1)
    throw error(op.debugName(), ": y_scale and y_zero_point must be scalars");
  Shape a = op.inInfo(0).shape(), b = op.inInfo(3).shape();
  if (a.empty() || b.empty()) throw error(op.debugName(), ": inputs must have rank >= 1");
  bool aVec = a.size() == 1, bVec = b.size() == 1;
  if (aVec) a.insert(a.begin(), 1);
  if (bVec) b.push_back(1);
  if (a.back() != b[b.size() - 2])
    throw error(op.debugName(), ": inner dimensions differ: ", toString(op.inInfo(0).shape()), " x ",
                toString(op.inInfo(3).shape()));
  int64_t m = a[a.size() - 2], n = b.back();
  for (size_t i : {1, 2})
    if (op.inInfo(i).elementCount() != 1 && op.inInfo(i).elementCount() != m)
      throw error(op.debugName(), ": input ", i, " must be a scalar or have M = ", m, " elements");
  for (size_t i : {4, 5})
    if (op.inInfo(i).elementCount() != 1 && op.inInfo(i).elementCount() != n)
      throw error(op.debugName(), ": input ", i, " must be a scalar or have N = ", n, " elements");
  Shape out = broadcastShapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2), op);
  if (!aVec) out.push_back(m);
  if (!bVec) out.push_back(n);
  op.setOutInfo(0, TensorInfo(op.inInfo(7).dataType(), out));
}

/// Scale (and zero point) must be scalars or 1-D along `axis`.
void checkQuantParams(const Op &op) {
  int64_t rank = op.inInfo(0).rank();
  for (size_t i = 1; i < 3 && i < op.inputCount(); ++i) {
    if (!op.hasInput(i)) continue;
    const TensorInfo &p = op.inInfo(i);
    if (p.elementCount() == 1 && p.rank() <= 1) continue;
    int64_t axis = normalizeAxis(op.attrs.getInt("axis", 1), rank, op);
    if (p.rank() != 1 || p.dim(0) != op.inInfo(0).dim(axis))
      throw error(op.debugName(), ": input ", i, " has shape ", toString(p.shape()), ", expected a scalar or [",
                  op.inInfo(0).dim(axis), "] for axis ", axis);
  }
  if (op.hasInput(2) && op.inInfo(1).elementCount() != op.inInfo(2).elementCount())
    throw error(op.debugName(), ": scale and zero point have different sizes");
}

void setupQuantizeLinear(Op &op) {
  requireInputCount(op, 2, 3);
  requireType(op, 0, {DataType::FLOAT, DataType::INT32, DataType::FLOAT16, DataType::BFLOAT16, DataType::DOUBLE});
  DataType out = op.hasInput(2) ? op.inInfo(2).dataType() : DataType::UINT8;
  if (out != DataType::UINT8 && out != DataType::INT8 && out != DataType::UINT16 && out != DataType::INT16)
    throw error(op.debugName(), ": zero point type ", toString(out), " is not supported (UINT8, INT8, UINT16, INT16)");
  checkQuantParams(op);
  setupSameShape(op, out);
}

void setupDequantizeLinear(Op &op) {
  requireInputCount(op, 2, 3);
  requireType(op, 0, {DataType::UINT8, DataType::INT8, DataType::UINT16, DataType::INT16, DataType::INT32});
  requireType(op, 1, {DataType::FLOAT, DataType::FLOAT16, DataType::BFLOAT16, DataType::DOUBLE});
  if (op.hasInput(2) && op.inInfo(2).dataType() != op.inInfo(0).dataType())
    throw error(op.debugName(), ": zero point type differs from input type");
  checkQuantParams(op);
  setupSameShape(op, op.inInfo(1).dataType());
}

void setupDynamicQuantizeLinear(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, {DataType::FLOAT});
  setupSameShape(op, DataType::UINT8);
  op.setOutInfo(1, TensorInfo(DataType::FLOAT, {}));
  op.setOutInfo(2, TensorInfo(DataType::UINT8, {}));
}

void setupDet(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, {DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16, DataType::BFLOAT16});
  const Shape &s = op.inInfo(0).shape();
  if (s.size() < 2 || s[s.size() - 1] != s[s.size() - 2])
    throw error(op.debugName(), ": input must be [*, M, M], got ", toString(s));
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), Shape(s.begin(), s.end() - 2)));
}

void setupGridSample(Op &op) {
  requireInputCount(op, 2, 2);
  requireType(op, 0, {DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16, DataType::BFLOAT16});
  const Shape &x = op.inInfo(0).shape(), &grid = op.inInfo(1).shape();
  if (x.size() != 4) throw error(op.debugName(), ": only 4-D (N, C, H, W) inputs are supported, got ", toString(x));
  if (grid.size() != 4 || grid[0] != x[0] || grid[3] != 2)
    throw error(op.debugName(), ": grid must be [N, H_out, W_out, 2] with N = ", x[0], ", got ", toString(grid));
  std::string mode = op.attrs.getString("mode", "bilinear"), pad = op.attrs.getString("padding_mode", "zeros");
  if (mode != "bilinear" && mode != "linear" && mode != "nearest" && mode != "bicubic" && mode != "cubic")
    throw error(op.debugName(), ": mode '", mode, "' is not one of bilinear, nearest, bicubic");
  if (pad != "zeros" && pad != "border" && pad != "reflection")
    throw error(op.debugName(), ": padding_mode '", pad, "' is not one of zeros, border, reflection");
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), {x[0], x[1], grid[1], grid[2]}));
}

} // namespace

namespace {
int einsumLetter(char c, const Op &op) {
  if (c >= 'a' && c <= 'z') return c - 'a';
  if (c >= 'A' && c <= 'Z') return 26 + (c - 'A');
  throw error(op.debugName(), ": invalid character '", c, "' in equation");
}

} // namespace

EinsumSpec parseEinsum(const Op &op) {
  std::string eq;
  for (char c : op.attrs.getString("equation"))
    if (c != ' ') eq += c;
  size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != op.inputCount())
    throw error(op.debugName(), ": equation '", eq, "' has ", terms.size(), " operands but the op has ",
                op.inputCount(), " inputs");
  EinsumSpec spec;
  int64_t ellipsisDims = 0;
  std::vector<int64_t> termEllipsis;
  for (size_t t = 0; t < terms.size(); ++t) {
    std::string term = terms[t];
    size_t dots = term.find("...");
    int64_t rank = op.inInfo(t).rank();
    int64_t letters = static_cast<int64_t>(term.size()) - (dots == std::string::npos ? 0 : 3);
    int64_t e = dots == std::string::npos ? 0 : rank - letters;
    if (e < 0 || (dots == std::string::npos && letters != rank))
      throw error(op.debugName(), ": term '", term, "' does not match input ", t, " of rank ", rank);
    termEllipsis.push_back(e);
    ellipsisDims = std::max(ellipsisDims, e);
  }
  std::map<int, int> letterCount;
  for (size_t t = 0; t < terms.size(); ++t) {
    std::vector<int> labels;
    const std::string &term = terms[t];
    for (size_t i = 0; i < term.size(); ++i) {
      if (term.compare(i, 3, "...") == 0) {
        for (int64_t k = 0; k < termEllipsis[t]; ++k)
          labels.push_back(static_cast<int>(52 + ellipsisDims - termEllipsis[t] + k));
        i += 2;
      } else {
        int l = einsumLetter(term[i], op);
        labels.push_back(l);
        ++letterCount[l];
      }
    }
    spec.inputs.push_back(labels);
  }
  if (arrow != std::string::npos) {
    std::string rhs = eq.substr(arrow + 2);
    for (size_t i = 0; i < rhs.size(); ++i) {
      if (rhs.compare(i, 3, "...") == 0) {
        for (int64_t k = 0; k < ellipsisDims; ++k)
          spec.output.push_back(static_cast<int>(52 + k));
        i += 2;
      } else {
        int l = einsumLetter(rhs[i], op);
        if (!letterCount.count(l)) throw error(op.debugName(), ": output label '", rhs[i], "' is not in any input");
        if (std::find(spec.output.begin(), spec.output.end(), l) != spec.output.end())
          throw error(op.debugName(), ": output label '", rhs[i], "' is repeated");
        spec.output.push_back(l);
      }
    }
  } else {
    for (int64_t k = 0; k < ellipsisDims; ++k)
      spec.output.push_back(static_cast<int>(52 + k));
    for (auto [l, n] : letterCount)
      if (n == 1) spec.output.push_back(l);
  }
  return spec;
}

void registerMiscOps(OpRegistry &r) {
  // Training connects the session's {seed, counter} as input 3 (autodiff's seedDropout).
  OpDef dropoutOld = makeDef("Dropout", 1, 11, setupDropout);
  dropoutOld.randomInput = 3;
  // popart_salt (Dropout's gradient rule): the forward op's salt, so the gradient redraws its mask.
  dropoutOld.internalAttributes = {ir::internal_attr::kSalt};
  r.add(dropoutOld);
  // From opset 12 training_mode may be true at run time, which makes the op random.
  OpDef dropout = makeDef("Dropout", 12, 1000, setupDropout);
  dropout.foldable = false;
  dropout.randomInput = 3;
  dropout.internalAttributes = {ir::internal_attr::kSalt};
  r.add(dropout);
  r.add(makeDef("Einsum", 12, 1000, setupEinsum));
  r.add(makeDef("MatMulInteger", 10, 1000, setupMatMulInteger));
  r.add(makeDef("QLinearMatMul", 10, 1000, setupQLinearMatMul));
  r.add(makeDef("QuantizeLinear", 10, 1000, setupQuantizeLinear));
  r.add(makeDef("DequantizeLinear", 10, 1000, setupDequantizeLinear));
  r.add(makeDef("DynamicQuantizeLinear", 11, 1000, setupDynamicQuantizeLinear));
  r.add(makeDef("Det", 11, 1000, setupDet));
  r.add(makeDef("GridSample", 16, 1000, setupGridSample));
}

} // namespace popart::ir
