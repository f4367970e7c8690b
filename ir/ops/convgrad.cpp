// Gradient ops of convolution and pooling (domain ai.graphcore), created by the autodiff rules
// of Conv, ConvTranspose, AveragePool and MaxPool:
//   ConvDataGrad(dY, W) -> dX      of shape attribute input_shape
//   ConvWeightGrad(dY, X) -> dW    of shape attribute weight_shape
//   AveragePoolGrad(dY) -> dX      of shape attribute input_shape
//   MaxPoolGrad(X, dY) -> dX       of X's shape: each dY goes to its window's first maximum
// Their geometry is explicit: strides, dilations and pads (2 per spatial axis, begin then end)
// always present, no auto_pad, output_shape or ceil_mode: the rule resolves those, so kernels
// see one form. Pads may be negative (the transpose of a ConvTranspose with output_shape).

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

namespace popart::ir {

namespace {

const std::initializer_list<DataType> kFloatTypes{DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16,
                                                  DataType::BFLOAT16};

std::vector<int64_t> requiredShape(const Op &op, const char *name) {
  if (!op.attrs.has(name)) throw error(op.debugName(), ": attribute '", name, "' is required");
  std::vector<int64_t> s = op.attrs.getInts(name);
  if (s.size() < 3) throw error(op.debugName(), ": attribute '", name, "' ", toString(s), " must have rank >= 3");
  for (int64_t d : s)
    if (d < 0) throw error(op.debugName(), ": attribute '", name, "' ", toString(s), " has a negative dimension");
  return s;
}

std::vector<int64_t> requiredInts(const Op &op, const char *name, size_t count, int64_t minValue) {
  if (!op.attrs.has(name)) throw error(op.debugName(), ": attribute '", name, "' is required");
  std::vector<int64_t> v = op.attrs.getInts(name);
  if (v.size() != count)
    throw error(op.debugName(), ": attribute '", name, "' has ", v.size(), " values, expected ", count);
  for (int64_t x : v)
    if (x < minValue) throw error(op.debugName(), ": attribute '", name, "' value ", x, " must be >= ", minValue);
  return v;
}

/// Checks that a window over spatial input \p in gives spatial output \p out: exactly the floor
/// formula, or for pools anything up to the ceil formula (ceil_mode, resolved by the rule).
void checkWindow(const Op &op, const Shape &in, const Shape &out, const std::vector<int64_t> &kernel, bool pool) {
  size_t nsp = in.size();
  auto strides = requiredInts(op, "strides", nsp, 1);
  auto dil = requiredInts(op, "dilations", nsp, 1);
  auto pads = requiredInts(op, "pads", 2 * nsp, INT64_MIN);
  for (size_t i = 0; i < nsp; ++i) {
    int64_t span = in[i] + pads[i] + pads[i + nsp] - (kernel[i] - 1) * dil[i] - 1;
    if (span < 0)
      throw error(op.debugName(), ": window of kernel ", kernel[i], " on spatial axis ", i,
                  " is larger than the padded input (", in[i] + pads[i] + pads[i + nsp], ")");
    int64_t lo = span / strides[i] + 1, hi = pool ? (span + strides[i] - 1) / strides[i] + 1 : lo;
    if (out[i] < lo || out[i] > hi)
      throw error(op.debugName(), ": output gradient has ", out[i], " positions on spatial axis ", i, ", expected ", lo,
                  pool && hi != lo ? " or " + std::to_string(hi) : std::string(), " from the geometry");
  }
}

Shape spatial(const Shape &s) { return Shape(s.begin() + 2, s.end()); }

/// Common checks of ConvDataGrad and ConvWeightGrad: dY (N, M, out...), X (N, C, in...), W (M, C/g, k...).
void checkConv(const Op &op, const Shape &dy, const Shape &x, const Shape &w) {
  if (dy.size() != x.size() || w.size() != x.size())
    throw error(op.debugName(), ": dY ", toString(dy), ", X ", toString(x), " and W ", toString(w),
                " must have the same rank");
  int64_t group = op.attrs.getInt("group", 1);
  if (group < 1) throw error(op.debugName(), ": group ", group, " must be >= 1");
  if (dy[0] != x[0])
    throw error(op.debugName(), ": dY ", toString(dy), " and X ", toString(x), " differ in batch size");
  if (dy[1] != w[0] || w[0] % group != 0 || x[1] != w[1] * group)
    throw error(op.debugName(), ": channels of dY ", toString(dy), ", X ", toString(x), " and W ", toString(w),
                " do not match with group ", group);
  checkWindow(op, spatial(x), spatial(dy), spatial(w), false);
}

void setupConvDataGrad(Op &op) {
  requireInputCount(op, 2, 2);
  requireType(op, 0, kFloatTypes);
  if (op.inInfo(1).dataType() != op.inInfo(0).dataType())
    throw error(op.debugName(), ": W has type ", toString(op.inInfo(1).dataType()), " but dY has type ",
                toString(op.inInfo(0).dataType()));
  Shape x = requiredShape(op, "input_shape");
  checkConv(op, op.inInfo(0).shape(), x, op.inInfo(1).shape());
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), x));
}

void setupConvWeightGrad(Op &op) {
  requireInputCount(op, 2, 2);
  requireType(op, 0, kFloatTypes);
  if (op.inInfo(1).dataType() != op.inInfo(0).dataType())
    throw error(op.debugName(), ": X has type ", toString(op.inInfo(1).dataType()), " but dY has type ",
                toString(op.inInfo(0).dataType()));
  Shape w = requiredShape(op, "weight_shape");
  checkConv(op, op.inInfo(0).shape(), op.inInfo(1).shape(), w);
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), w));
}

void setupAveragePoolGrad(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, kFloatTypes);
  Shape x = requiredShape(op, "input_shape");
  const Shape &dy = op.inInfo(0).shape();
  if (dy.size() != x.size() || dy[0] != x[0] || dy[1] != x[1])
    throw error(op.debugName(), ": dY ", toString(dy), " does not match input_shape ", toString(x),
                " in rank, batch or channels");
  auto kernel = requiredInts(op, "kernel_shape", x.size() - 2, 1);
  int64_t include = op.attrs.getInt("count_include_pad", 0);
  if (include != 0 && include != 1) throw error(op.debugName(), ": count_include_pad must be 0 or 1");
  checkWindow(op, spatial(x), spatial(dy), kernel, true);
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), x));
}

/// MaxPoolGrad(X, dY): attributes kernel_shape, strides, dilations, pads; padding counts as -inf.
void setupMaxPoolGrad(Op &op) {
  requireInputCount(op, 2, 2);
  requireType(op, 0, kFloatTypes);
  if (op.inInfo(1).dataType() != op.inInfo(0).dataType())
    throw error(op.debugName(), ": dY has type ", toString(op.inInfo(1).dataType()), " but X has type ",
                toString(op.inInfo(0).dataType()));
  const Shape &x = op.inInfo(0).shape(), &dy = op.inInfo(1).shape();
  if (x.size() < 3) throw error(op.debugName(), ": X ", toString(x), " must have rank >= 3");
  if (dy.size() != x.size() || dy[0] != x[0] || dy[1] != x[1])
    throw error(op.debugName(), ": dY ", toString(dy), " does not match X ", toString(x),
                " in rank, batch or channels");
  auto kernel = requiredInts(op, "kernel_shape", x.size() - 2, 1);
  checkWindow(op, spatial(x), spatial(dy), kernel, true);
  op.setOutInfo(0, op.inInfo(0));
}

/// The gradients of a convolution: 2 · (elements of the larger activation \p out) · (elements of
/// weight \p w per output channel), i.e. 2 · MACs.
double convMacFlops(const Tensor &w, const Tensor &out) {
  const Shape &ws = w.info().shape();
  if (ws.size() < 2) return 0.0;
  double perOutput = static_cast<double>(w.info().elementCount()) / static_cast<double>(ws[0]);
  return 2.0 * static_cast<double>(out.info().elementCount()) * perOutput;
}

} // namespace

void registerConvGradOps(OpRegistry &r) {
  OpDef dataGrad = makeDef("ConvDataGrad", 1, 1000, setupConvDataGrad);
  dataGrad.flops = [](const Op &op) {
    return op.hasInput(1) && op.hasInput(0) ? convMacFlops(op.input(1), op.input(0)) : outputElementCount(op);
  };
  OpDef weightGrad = makeDef("ConvWeightGrad", 1, 1000, setupConvWeightGrad);
  weightGrad.flops = [](const Op &op) {
    return op.hasInput(0) && op.hasOutput(0) ? convMacFlops(op.output(0), op.input(0)) : outputElementCount(op);
  };
  OpDef maxPoolGrad = makeDef("MaxPoolGrad", 1, 1000, setupMaxPoolGrad);
  maxPoolGrad.fusionFields = fusionFieldBits({FusionField::Relu}); // fuseMaxPoolGradRelu
  for (OpDef d : {dataGrad, weightGrad, makeDef("AveragePoolGrad", 1, 1000, setupAveragePoolGrad), maxPoolGrad}) {
    d.domain = "ai.graphcore";
    r.add(d);
  }
}

} // namespace popart::ir
