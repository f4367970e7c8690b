// ai.graphcore MultiConv and MultiConvGrad (see multiconv.hpp). Shape inference unpacks the
// convolutions into Conv ops of a graph of their own and runs Conv's own setup on each, so that a
// MultiConv accepts exactly what Conv accepts; errors name the MultiConv and the convolution.

#include "ir/ops/multiconv.hpp"

#include "ir/ops/helpers.hpp"
#include <popart/error.hpp>

#include <set>
#include <string>

namespace popart::ir {

namespace {

constexpr const char *kDomain = "ai.graphcore";
/// The opset of the unpacked ONNX Conv ops (Conv is the same from opset 11 on).
constexpr int kConvOpset = 17;

const std::initializer_list<DataType> kFloatTypes{DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16,
                                                  DataType::BFLOAT16};

bool isGrad(const Op &op) { return op.type == "MultiConvGrad"; }

/// Inputs per convolution (x, w, b or dy, x, w) and the slot of X and W among them.
constexpr size_t kPerConv = 3;
size_t xSlot(const Op &op) { return isGrad(op) ? 1 : 0; }
size_t wSlot(const Op &op) { return isGrad(op) ? 2 : 1; }

/// Spatial rank of convolution \p i (from X_i); throws naming the op if X_i is absent or too small.
size_t spatialRank(const Op &op, size_t i) {
  size_t slot = kPerConv * i + xSlot(op);
  if (!op.hasInput(slot)) throw error(op.debugName(), ": convolution ", i, " has no input X (input ", slot, ")");
  const Shape &x = op.inInfo(slot).shape();
  if (x.size() < 3)
    throw error(op.debugName(), ": convolution ", i, ": X has shape ", toString(x),
                ", expected rank >= 3 (N, C, spatial...)");
  return x.size() - 2;
}

/// Convolution \p i's part of flattened attribute \p name (\p perAxis values per spatial axis),
/// or \p fallback per axis when the attribute is absent.
std::vector<int64_t> slice(const Op &op, const char *name, size_t i, size_t perAxis, int64_t fallback) {
  size_t k = multiConvCount(op), begin = 0, total = 0;
  for (size_t j = 0; j < k; ++j) {
    size_t n = perAxis * spatialRank(op, j);
    if (j < i) begin += n;
    total += n;
  }
  size_t n = perAxis * spatialRank(op, i);
  if (!op.attrs.has(name)) return std::vector<int64_t>(n, fallback);
  std::vector<int64_t> all = op.attrs.getInts(name);
  if (all.size() != total)
    throw error(op.debugName(), ": attribute '", name, "' has ", all.size(), " values, expected ", total, " (",
                perAxis == 1 ? "one per spatial axis" : "two per spatial axis", " of each of the ", k,
                " convolutions, concatenated)");
  return {all.begin() + static_cast<std::ptrdiff_t>(begin), all.begin() + static_cast<std::ptrdiff_t>(begin + n)};
}

/// Throws naming the op unless flattened attribute \p name is absent or every value is \p only.
void requireDefault(const Op &op, const char *name, int64_t only) {
  if (!op.attrs.has(name)) return;
  for (int64_t v : op.attrs.getInts(name))
    if (v != only)
      throw error(op.debugName(), ": attribute '", name, "' value ", v, " is not supported (only ", only, ")");
}

/// Adds tensor \p id to \p g as a copy of \p from's info, kind and constant value.
void mirror(Graph &g, const TensorId &id, const Tensor &from) {
  TensorKind kind =
      from.kind() == TensorKind::Const || from.kind() == TensorKind::Variable ? from.kind() : TensorKind::Stream;
  Tensor &t = g.addTensor(id, kind, from.info());
  if (kind == TensorKind::Const || kind == TensorKind::Variable) t.setData(from.data());
}

std::string indexed(const char *prefix, size_t i) {
  std::string s(prefix);
  s.append(std::to_string(i));
  return s;
}

/// Runs \p sub's setup, rethrowing its error with \p op and convolution \p i named.
void setupPart(const Op &op, size_t i, Op &sub) {
  try {
    sub.def->setup(sub);
  } catch (const error &e) {
    throw error(op.debugName(), ": convolution ", i, ": ", e.what());
  }
}

/// The grad ops of convolution \p i (dy, x, w in \p g) writing \p dx and \p dw (either "" for none).
void addGradParts(const Op &op, size_t i, Graph &g, const Attributes &geometry, const TensorId &dy, const TensorId &dx,
                  const TensorId &dw, UnpackedMultiConv &u) {
  if (!dx.empty()) {
    Attributes a = geometry;
    a.set("input_shape", g.tensor(indexed("x", i)).info().shape());
    u.dataGrad[i] = &g.addOp("ConvDataGrad", kDomain, 1, op.name, a, {dy, indexed("w", i)}, {dx});
    setupPart(op, i, *u.dataGrad[i]);
  }
  if (!dw.empty()) {
    Attributes a = geometry;
    a.set("weight_shape", g.tensor(indexed("w", i)).info().shape());
    u.weightGrad[i] = &g.addOp("ConvWeightGrad", kDomain, 1, op.name, a, {dy, indexed("x", i)}, {dw});
    setupPart(op, i, *u.weightGrad[i]);
  }
}

/// Whether a MultiConvGrad reads MultiConv \p op's inputs (it is trained).
bool trained(const Op &op) {
  for (const Tensor *t : op.inputs)
    if (t)
      for (const Op *reader : t->consumers())
        if (reader->type == "MultiConvGrad" && reader->domain == kDomain) return true;
  return false;
}

void checkCounts(const Op &op) {
  if (isGrad(op)) {
    if (op.inputCount() == 0 || op.inputCount() % kPerConv != 0 || op.outputCount() != 2 * (op.inputCount() / 3))
      throw error(op.debugName(), ": expected inputs (dY, X, W) and outputs (dX, dW) per convolution, got ",
                  op.inputCount(), " inputs and ", op.outputCount(), " outputs");
    return;
  }
  size_t k = op.outputCount();
  // The last bias may be omitted (ONNX drops trailing empty inputs).
  if (k == 0 || op.inputCount() + 1 < kPerConv * k || op.inputCount() > kPerConv * k)
    throw error(op.debugName(), ": ", k, " outputs need ", kPerConv * k,
                " inputs (X, W and B or \"\" per convolution), got ", op.inputCount());
  if (op.attrs.has("numConvs") && op.attrs.getInt("numConvs") != static_cast<int64_t>(k))
    throw error(op.debugName(), ": numConvs is ", op.attrs.getInt("numConvs"), " but the op has ", k, " outputs");
  requireDefault(op, "inDilations", 1);
  requireDefault(op, "outPads", 0);
}

void setupMultiConv(Op &op) {
  for (size_t i = 0; i < op.inputCount(); ++i)
    if (op.hasInput(i)) requireType(op, i, kFloatTypes);
  UnpackedMultiConv u = unpackMultiConv(op);
  for (size_t i = 0; i < multiConvCount(op); ++i) {
    if (isGrad(op)) {
      if (u.dataGrad[i]) op.setOutInfo(2 * i, u.dataGrad[i]->outInfo(0));
      if (u.weightGrad[i]) op.setOutInfo(2 * i + 1, u.weightGrad[i]->outInfo(0));
    } else {
      op.setOutInfo(i, u.conv[i]->outInfo(0));
    }
  }
}

/// The sum of the unpacked ops' estimates.
double multiConvFlops(const Op &op) {
  double total = 0;
  UnpackedMultiConv u = unpackMultiConv(op);
  for (const auto &sub : u.graph->ops())
    total += estimateFlops(*sub);
  return total;
}

} // namespace

size_t multiConvCount(const Op &op) { return isGrad(op) ? op.inputCount() / kPerConv : op.outputCount(); }

Attributes multiConvAttributes(const Op &op, size_t i) {
  size_t nsp = spatialRank(op, i);
  Attributes a;
  a.set("strides", slice(op, "strides", i, 1, 1));
  a.set("pads", slice(op, "pads", i, 2, 0));
  a.set("dilations", slice(op, "dilations", i, 1, 1));
  const Shape &x = op.inInfo(kPerConv * i + xSlot(op)).shape();
  size_t ws = kPerConv * i + wSlot(op);
  if (!op.hasInput(ws)) throw error(op.debugName(), ": convolution ", i, " has no weights W (input ", ws, ")");
  const Shape &w = op.inInfo(ws).shape();
  if (w.size() != nsp + 2 || w[1] <= 0 || x[1] % w[1] != 0)
    throw error(op.debugName(), ": convolution ", i, ": W has shape ", toString(w), ", expected rank ", nsp + 2,
                " with a channel count that divides X's ", x[1], " (X ", toString(x), ")");
  a.set("group", x[1] / w[1]);
  return a;
}

UnpackedMultiConv unpackMultiConv(const Op &op, bool withGradients) {
  checkCounts(op);
  size_t k = multiConvCount(op);
  UnpackedMultiConv u;
  u.graph = std::make_unique<Graph>();
  Graph &g = *u.graph;
  g.opsets()["ai.onnx"] = kConvOpset;
  g.opsets()[kDomain] = 1;
  u.conv.assign(k, nullptr);
  u.dataGrad.assign(k, nullptr);
  u.weightGrad.assign(k, nullptr);
  const std::vector<int64_t> reluList = op.attrs.getInts(kMultiConvReluAttr, {});
  const std::set<int64_t> relu(reluList.begin(), reluList.end());
  for (size_t i = 0; i < k; ++i) {
    Attributes geometry = multiConvAttributes(op, i);
    TensorId x = indexed("x", i), w = indexed("w", i);
    mirror(g, x, op.input(kPerConv * i + xSlot(op)));
    mirror(g, w, op.input(kPerConv * i + wSlot(op)));
    u.opInput[x] = kPerConv * i + xSlot(op);
    u.opInput[w] = kPerConv * i + wSlot(op);
    if (isGrad(op)) {
      if (!op.hasInput(kPerConv * i)) continue; // no gradient reaches this convolution
      TensorId dy = indexed("dy", i);
      mirror(g, dy, op.input(kPerConv * i));
      u.opInput[dy] = kPerConv * i;
      u.opOutput[indexed("dx", i)] = 2 * i;
      u.opOutput[indexed("dw", i)] = 2 * i + 1;
      addGradParts(op, i, g, geometry, dy, op.hasOutput(2 * i) ? indexed("dx", i) : "",
                   op.hasOutput(2 * i + 1) ? indexed("dw", i) : "", u);
      continue;
    }
    std::vector<TensorId> inputs{x, w};
    if (op.hasInput(kPerConv * i + 2)) {
      inputs.push_back(indexed("b", i));
      mirror(g, inputs.back(), op.input(kPerConv * i + 2));
      u.opInput[inputs.back()] = kPerConv * i + 2;
    }
    TensorId y = indexed("y", i);
    u.opOutput[y] = i;
    u.conv[i] = &g.addOp("Conv", "ai.onnx", kConvOpset, op.name, geometry, inputs, {y});
    if (relu.count(static_cast<int64_t>(i))) u.conv[i]->fusion.activation.kind = FusedActivation::Kind::Relu;
    setupPart(op, i, *u.conv[i]);
    if (withGradients && trained(op)) {
      TensorId dy = indexed("dy", i);
      g.addTensor(dy, TensorKind::Stream, u.conv[i]->outInfo(0));
      addGradParts(op, i, g, geometry, dy, indexed("dx", i), indexed("dw", i), u);
    }
  }
  return u;
}

void registerMultiConvOps(OpRegistry &r) {
  for (const char *type : {"MultiConv", "MultiConvGrad"}) {
    OpDef d = makeDef(type, 1, 1000, setupMultiConv);
    d.domain = kDomain;
    d.flops = multiConvFlops;
    r.add(d);
  }
}

} // namespace popart::ir
