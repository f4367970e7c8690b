// The MatMul post-op fusions: a [N] bias (fuseMatMulBias), a constant scale (fuseMatMulScale) and
// a residual addition (fuseMatMulResidual, last: the others cannot follow it), oneDNN matmul
// attributes that the kernels apply in the same pass over the product.

#include "ir/passes/pass_manager.hpp"
#include "ir/passes/rewrite.hpp"

#include <cmath>

namespace popart::ir {

int fuseMatMulBias(Graph &graph) {
  return rewriteAll(graph, [&](Op &candidate) {
    Op *add = &candidate;
    if (!isOnnxOp(add, "Add") || add->inputCount() != 2 || !add->hasInput(0) || !add->hasInput(1)) return false;
    for (size_t side = 0; side < 2; ++side) {
      Op *mm = add->input(side).producer();
      const Tensor &bias = add->input(1 - side);
      if (!isOnnxOp(mm, "MatMul") || mm->inputCount() != 2 || mm->fusion.bias || mm->fusion.scale ||
          mm->fusion.activated() || // they would apply before it
          mm->fusion.residual)
        continue;
      const Tensor &product = mm->output(0);
      if (product.consumers().size() != 1 || isGraphOutput(graph, product)) continue;
      const Shape &y = product.info().shape();
      if (y.size() < 2 || mm->inInfo(1).rank() < 2 || add->outInfo(0).shape() != y) continue;
      if (bias.info().shape() != Shape{y.back()} || bias.info().dataType() != product.info().dataType()) continue;
      if (!isMatMulFusionType(bias.info().dataType())) continue;
      Fusion fusion = mm->fusion;
      fusion.bias = true;
      replacePair(graph, *mm, *add, mm->attrs, fusion, {mm->input(0).id(), mm->input(1).id(), bias.id()});
      return true;
    }
    return false;
  });
}

int fuseMatMulScale(Graph &graph) {
  return rewriteAll(graph, [&](Op &op) {
    bool div = isOnnxOp(&op, "Div");
    if ((!div && !isOnnxOp(&op, "Mul")) || op.inputCount() != 2 || !op.hasInput(0) || !op.hasInput(1)) return false;
    for (size_t side = 0; side < (div ? 1u : 2u); ++side) {
      Op *mm = op.input(side).producer();
      double c = 0;
      if (!isOnnxOp(mm, "MatMul") || mm->inputCount() != 2 || mm->fusion.scale || mm->fusion.activated() ||
          mm->fusion.residual)
        continue;
      if (!constScalar(&op.input(1 - side), c) || c == 0 || !std::isfinite(c)) continue;
      const Tensor &product = mm->output(0);
      if (product.consumers().size() != 1 || isGraphOutput(graph, product)) continue;
      if (!isMatMulFusionType(product.info().dataType()) || op.outInfo(0).shape() != product.info().shape()) continue;
      Fusion fusion = mm->fusion;
      fusion.scale = static_cast<float>(div ? 1.0 / c : c);
      replacePair(graph, *mm, op, mm->attrs, fusion, {mm->input(0).id(), mm->input(1).id()});
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
  if (!isMatMulFusionType(t.info().dataType()) || t.info().rank() < 2) return nullptr;
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

/// A float Gemm (alpha 1; no C, or a [N] bias with beta 1) whose result only feeds an Add or a
/// two-input Sum with a tensor of its shape becomes the MatMul it is (Fusion::transA/B,
/// Fusion::bias), so that fuseMatMulResidual folds the residual into it.
static bool gemmBeforeResidual(Graph &graph, Op &op) {
  if (!isOnnxOp(&op, "Gemm") || !op.hasOutput(0) || op.attrs.getFloat("alpha", 1.f) != 1.f) return false;
  const Tensor &y = op.output(0);
  if (!isMatMulFusionType(y.info().dataType()) || y.consumers().size() != 1 || isGraphOutput(graph, y)) return false;
  bool bias = op.hasInput(2);
  if (bias && (op.attrs.getFloat("beta", 1.f) != 1.f || op.inInfo(2).shape() != Shape{y.info().dim(1)})) return false;
  const Op *add = y.consumers()[0];
  if (!isTwoInputAdd(add)) return false;
  const Tensor &other = &add->input(0) == &y ? add->input(1) : add->input(0);
  if (other.info() != y.info() || add->outInfo(0) != y.info()) return false;
  Fusion fusion;
  fusion.transA = op.attrs.getInt("transA", 0) != 0;
  fusion.transB = op.attrs.getInt("transB", 0) != 0;
  fusion.bias = bias;
  fusion.activation = op.fusion.activation;
  std::vector<TensorId> ins = inputIds(op);
  TensorId out = y.id();
  std::string name = op.name;
  int phase = op.phase;
  graph.removeOp(op);
  addRewrittenOp(graph, phase, "MatMul", "ai.onnx", 13, name, {}, ins, {out}, fusion);
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

int foldCastIntoMatMul(Graph &graph, const std::vector<TensorId> &keep) {
  Kept kept{graph, keep};
  return rewriteAll(graph, [&](Op &cast) {
    if (!isOnnxOp(&cast, "Cast") || !cast.hasInput(0) || !cast.hasOutput(0)) return false;
    if (cast.outInfo(0).dataType() != DataType::FLOAT) return false;
    Op *mm = cast.input(0).producer();
    if (!isOnnxOp(mm, "MatMul") || mm->fusion.outputType || mm->fusion.residual) return false;
    DataType t = mm->inInfo(0).dataType();
    if ((t != DataType::FLOAT16 && t != DataType::BFLOAT16) || onlyReader(kept, cast.input(0)) != &cast) return false;
    Fusion fusion = mm->fusion;
    fusion.outputType = DataType::FLOAT;
    replacePair(graph, *mm, cast, mm->attrs, fusion, inputIds(*mm));
    return true;
  });
}

void registerMatMulFusionPasses(PassRegistry &r) {
  r.add(optionalPass("fuseMatMulBias", "a MatMul adds the [N] bias of the Add that is its only reader (Fusion::bias)",
                     OutputsFixed, [](Graph &g, PassContext &) { return fuseMatMulBias(g); }));
  r.add(optionalPass("fuseMatMulScale", "a MatMul applies a constant Mul or Div of its product (Fusion::scale)",
                     OutputsFixed, [](Graph &g, PassContext &) { return fuseMatMulScale(g); }));
  r.add(optionalPass("fuseMatMulResidual",
                     "a MatMul adds the other input of the Add or Sum that is its only reader (last MatMul fusion)",
                     OutputsFixed, [](Graph &g, PassContext &) { return fuseMatMulResidual(g); }));
  r.add(optionalPass("foldCastIntoMatMul",
                     "a 16-bit MatMul whose only reader is a Cast to FLOAT writes FLOAT itself (Fusion::outputType)",
                     OutputsFixed, [](Graph &g, PassContext &c) { return foldCastIntoMatMul(g, c.keep); }));
}

} // namespace popart::ir
