// Convolution and pooling ops: Conv, ConvTranspose, MaxPool, AveragePool, LpPool and the
// global pools. Setup validates the attributes against the input ranks and infers the spatial
// output sizes; kernels re-derive the padding from (input, output, attributes), so the op keeps
// its attributes exactly as imported.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"
#include "ir/ops/window.hpp"

#include <algorithm>

namespace popart::ir {

namespace {

const std::initializer_list<DataType> kFloatTypes{DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16,
                                                  DataType::BFLOAT16};

/// Attribute \p name as one value per spatial axis (\p fallback each when absent).
std::vector<int64_t> perAxis(const Op &op, const char *name, size_t nsp, int64_t fallback, int64_t minValue) {
  std::vector<int64_t> v = op.attrs.getInts(name, std::vector<int64_t>(nsp, fallback));
  if (v.size() != nsp)
    throw error(op.debugName(), ": attribute '", name, "' has ", v.size(), " values, expected ", nsp,
                " (one per spatial axis)");
  for (int64_t x : v)
    if (x < minValue) throw error(op.debugName(), ": attribute '", name, "' value ", x, " must be >= ", minValue);
  return v;
}

std::vector<int64_t> explicitPads(const Op &op, size_t nsp) {
  std::vector<int64_t> pads = op.attrs.getInts("pads", std::vector<int64_t>(2 * nsp, 0));
  if (pads.size() != 2 * nsp)
    throw error(op.debugName(), ": attribute 'pads' has ", pads.size(), " values, expected ", 2 * nsp);
  for (int64_t p : pads)
    if (p < 0) throw error(op.debugName(), ": attribute 'pads' has negative value ", p);
  return pads;
}

std::string autoPad(const Op &op) {
  std::string a = op.attrs.getString("auto_pad", "NOTSET");
  if (a != "NOTSET" && a != "VALID" && a != "SAME_UPPER" && a != "SAME_LOWER")
    throw error(op.debugName(), ": auto_pad '", a, "' is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER");
  return a;
}

void requireSpatialInput(const Op &op, const char *what) {
  const Shape &x = op.inInfo(0).shape();
  if (x.size() < 3)
    throw error(op.debugName(), ": ", what, " input X has shape ", toString(x),
                ", expected rank >= 3 (N, C, spatial...)");
}

/// Output spatial sizes of a sliding window (Conv and the pools).
Shape windowOutput(const Op &op, const Shape &in, const std::vector<int64_t> &kernel, bool ceilMode) {
  size_t nsp = in.size();
  auto strides = perAxis(op, "strides", nsp, 1, 1);
  auto dil = perAxis(op, "dilations", nsp, 1, 1);
  std::string ap = autoPad(op);
  auto pads = explicitPads(op, nsp);
  Shape out(nsp);
  int64_t windowSize = 1; // the kernels loop over it: a pool's kernel_shape is not a tensor's shape
  for (size_t i = 0; i < nsp; ++i) {
    // Attributes and dimensions come from the model: every sum and product is checked.
    const std::string axis = "spatial axis " + std::to_string(i) + ":";
    windowSize = checkedMul(op, windowSize, kernel[i], axis + " the window's size");
    int64_t dk = checkedAdd(op, checkedMul(op, kernel[i] - 1, dil[i], axis + " the dilated kernel"), 1,
                            axis + " the dilated kernel");
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      out[i] = checkedAdd(op, in[i], strides[i] - 1, axis + " the input rounded up to the stride") / strides[i];
      // The padding the kernels derive, (out - 1) * stride + dilated kernel - input.
      checkedAdd(op, (out[i] - 1) * strides[i], dk, axis + " the padded extent");
    } else {
      int64_t pb = ap == "VALID" ? 0 : pads[i], pe = ap == "VALID" ? 0 : pads[i + nsp];
      const int64_t padded = checkedAdd(op, checkedAdd(op, in[i], pb, axis + " the padded input"), pe,
                                        axis + " the padded input");
      // The kernels step back from a window's start by up to a dilation.
      checkedAdd(op, padded, dil[i], axis + " the padded input and a dilation");
      int64_t span = padded - dk;
      if (span < 0)
        throw error(op.debugName(), ": window of extent ", dk, " on spatial axis ", i,
                    " is larger than the padded input (", padded, ")");
      out[i] = (ceilMode ? checkedAdd(op, span, strides[i] - 1, axis + " the span rounded up to the stride") /
                               strides[i]
                         : span / strides[i]) +
               1;
      // A window may not start in the end padding (as in PyTorch).
      if (ceilMode && (out[i] - 1) * strides[i] >= in[i] + pb) --out[i];
    }
  }
  return out;
}

void setupConv(Op &op) {
  const bool residual = op.fusion.residual;
  requireInputCount(op, residual ? 4 : 2, residual ? 4 : 3);
  requireType(op, 0, kFloatTypes);
  requireSpatialInput(op, "Conv");
  const Shape &x = op.inInfo(0).shape(), &w = op.inInfo(1).shape();
  if (w.size() != x.size())
    throw error(op.debugName(), ": weights W have shape ", toString(w), ", expected rank ", x.size(), " like X ",
                toString(x));
  if (op.inInfo(1).dataType() != op.inInfo(0).dataType())
    throw error(op.debugName(), ": W has type ", toString(op.inInfo(1).dataType()), " but X has type ",
                toString(op.inInfo(0).dataType()));
  int64_t group = op.attrs.getInt("group", 1);
  if (group < 1) throw error(op.debugName(), ": group ", group, " must be >= 1");
  const int64_t channels = checkedMul(op, w[1], group, "the input channels, W's channels times group,");
  if (x[1] != channels)
    throw error(op.debugName(), ": X has ", x[1], " channels but W ", toString(w), " with group ", group, " expects ",
                channels);
  if (w[0] % group != 0) throw error(op.debugName(), ": ", w[0], " output channels are not divisible by group ", group);
  size_t nsp = x.size() - 2;
  std::vector<int64_t> kernel(w.begin() + 2, w.end());
  if (op.attrs.has("kernel_shape") && op.attrs.getInts("kernel_shape") != kernel)
    throw error(op.debugName(), ": kernel_shape ", toString(op.attrs.getInts("kernel_shape")),
                " does not match the weights' spatial shape ", toString(kernel));
  if (op.hasInput(2) && op.inInfo(2).shape() != Shape{w[0]})
    throw error(op.debugName(), ": bias B has shape ", toString(op.inInfo(2).shape()), ", expected [", w[0], "]");
  Shape out = windowOutput(op, Shape(x.begin() + 2, x.end()), kernel, false);
  Shape y{x[0], w[0]};
  y.insert(y.end(), out.begin(), out.end());
  (void)nsp;
  // Fusion::residual (set by fuseConvResidual): input 3, of the result's shape, is added to it
  // after the bias and before a fused activation.
  if (residual && (!op.hasInput(3) || op.inInfo(3) != TensorInfo(op.inInfo(0).dataType(), y) || op.fusion.pool))
    throw error(op.debugName(), ": the residual input 3 must be ", TensorInfo(op.inInfo(0).dataType(), y).toString(),
                " without a fused pool, got ", op.hasInput(3) ? op.inInfo(3).toString() : std::string("none"));
  if (FusedPool pool; fusedPool(op, pool)) { // fuseConvPool: the output is the pooled result
    if (pool.input != y)
      throw error(op.debugName(), ": fused pool input shape ", toString(pool.input),
                  " is not the convolution's result shape ", toString(y));
    y = pool.output(op);
  }
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), y));
}

void setupConvTranspose(Op &op) {
  requireInputCount(op, 2, 3);
  requireType(op, 0, kFloatTypes);
  requireSpatialInput(op, "ConvTranspose");
  const Shape &x = op.inInfo(0).shape(), &w = op.inInfo(1).shape();
  if (w.size() != x.size())
    throw error(op.debugName(), ": weights W have shape ", toString(w), ", expected rank ", x.size(), " like X ",
                toString(x));
  int64_t group = op.attrs.getInt("group", 1);
  if (group < 1) throw error(op.debugName(), ": group ", group, " must be >= 1");
  if (x[1] != w[0]) throw error(op.debugName(), ": X has ", x[1], " channels but W ", toString(w), " expects ", w[0]);
  if (w[0] % group != 0) throw error(op.debugName(), ": ", w[0], " input channels are not divisible by group ", group);
  int64_t m = checkedMul(op, w[1], group, "the output channels, W's channels times group,");
  if (op.hasInput(2) && op.inInfo(2).shape() != Shape{m})
    throw error(op.debugName(), ": bias B has shape ", toString(op.inInfo(2).shape()), ", expected [", m, "]");
  size_t nsp = x.size() - 2;
  std::vector<int64_t> kernel(w.begin() + 2, w.end());
  if (op.attrs.has("kernel_shape") && op.attrs.getInts("kernel_shape") != kernel)
    throw error(op.debugName(), ": kernel_shape ", toString(op.attrs.getInts("kernel_shape")),
                " does not match the weights' spatial shape ", toString(kernel));
  auto strides = perAxis(op, "strides", nsp, 1, 1);
  auto dil = perAxis(op, "dilations", nsp, 1, 1);
  auto outPad = perAxis(op, "output_padding", nsp, 0, 0);
  std::string ap = autoPad(op);
  auto pads = explicitPads(op, nsp);
  Shape out(nsp);
  // Attributes and dimensions come from the model: every sum and product is checked.
  std::vector<int64_t> natural(nsp); // stride * (input - 1) + output padding + dilated kernel
  for (size_t i = 0; i < nsp; ++i) {
    const std::string axis = "spatial axis " + std::to_string(i) + ":";
    int64_t dk = checkedAdd(op, checkedMul(op, kernel[i] - 1, dil[i], axis + " the dilated kernel"), 1,
                            axis + " the dilated kernel");
    natural[i] = checkedAdd(op, checkedAdd(op, checkedMul(op, strides[i], x[i + 2] - 1, axis + " the strided input"),
                                           outPad[i], axis + " the output size"),
                            dk, axis + " the output size");
    checkedAdd(op, natural[i], dil[i], axis + " the output size and a dilation"); // the kernels step by one
  }
  if (op.attrs.has("output_shape")) {
    std::vector<int64_t> os = op.attrs.getInts("output_shape");
    if (os.size() == nsp + 2) os.erase(os.begin(), os.begin() + 2);
    if (os.size() != nsp) throw error(op.debugName(), ": output_shape has ", os.size(), " values, expected ", nsp);
    out = os;
  } else {
    for (size_t i = 0; i < nsp; ++i) {
      if (ap == "SAME_UPPER" || ap == "SAME_LOWER")
        out[i] = checkedMul(op, x[i + 2], strides[i], "spatial axis " + std::to_string(i) + ": the strided input");
      else {
        int64_t pb = ap == "VALID" ? 0 : pads[i], pe = ap == "VALID" ? 0 : pads[i + nsp];
        const std::string what = "spatial axis " + std::to_string(i) + ": the output size less the pads";
        out[i] = checkedAdd(op, checkedAdd(op, natural[i], -pb, what), -pe, what); // pads are >= 0
      }
    }
  }
  for (size_t i = 0; i < nsp; ++i) {
    if (out[i] < 0) throw error(op.debugName(), ": output spatial shape ", toString(out), " is negative");
    // The padding the kernels derive from output_shape.
    checkedAdd(op, natural[i], -out[i], "spatial axis " + std::to_string(i) + ": the padding");
  }
  Shape y{x[0], m};
  y.insert(y.end(), out.begin(), out.end());
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), y));
}

void setupPool(Op &op) {
  requireInputCount(op, 1, 1);
  if (op.type == "MaxPool")
    requireType(
        op, 0,
        {DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16, DataType::BFLOAT16, DataType::INT8, DataType::UINT8});
  else
    requireType(op, 0, kFloatTypes);
  requireSpatialInput(op, op.type.c_str());
  const Shape &x = op.inInfo(0).shape();
  size_t nsp = x.size() - 2;
  if (!op.attrs.has("kernel_shape")) throw error(op.debugName(), ": attribute 'kernel_shape' is required");
  auto kernel = perAxis(op, "kernel_shape", nsp, 1, 1);
  if (op.type != "MaxPool" && op.attrs.has("dilations") &&
      perAxis(op, "dilations", nsp, 1, 1) != std::vector<int64_t>(nsp, 1))
    throw error(op.debugName(), ": dilations are not supported for ", op.type);
  if (op.attrs.getInt("storage_order", 0) != 0 && op.attrs.getInt("storage_order", 0) != 1)
    throw error(op.debugName(), ": storage_order must be 0 or 1");
  bool ceilMode = op.attrs.getInt("ceil_mode", 0) != 0;
  Shape out = windowOutput(op, Shape(x.begin() + 2, x.end()), kernel, ceilMode);
  Shape y{x[0], x[1]};
  y.insert(y.end(), out.begin(), out.end());
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), y));
  if (op.type == "MaxPool") op.setOutInfo(1, TensorInfo(DataType::INT64, y));
}

void setupGlobalPool(Op &op) {
  requireInputCount(op, 1, 1);
  requireType(op, 0, kFloatTypes);
  requireSpatialInput(op, op.type.c_str());
  Shape y = op.inInfo(0).shape();
  std::fill(y.begin() + 2, y.end(), 1);
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), y));
}

/// 2 · (elements of the convolution's result) · (weight elements per output channel): 2 · MACs,
/// of the result before any fused pool.
double convFlops(const Op &op) {
  if (!op.hasInput(1) || !op.hasOutput(0)) return outputElementCount(op);
  const Shape &ws = op.inInfo(1).shape();
  if (ws.size() < 2) return 0.0;
  double perOutput = static_cast<double>(op.inInfo(1).elementCount()) / static_cast<double>(ws[0]);
  return 2.0 * static_cast<double>(shapeElementCount(convResultShape(op))) * perOutput;
}

/// 2 · (input elements) · (weight elements per input channel).
double convTransposeFlops(const Op &op) {
  if (!op.hasInput(1) || !op.hasInput(0)) return outputElementCount(op);
  const Shape &ws = op.inInfo(1).shape();
  double perInput = ws.empty() ? 0.0 : static_cast<double>(op.inInfo(1).elementCount()) / static_cast<double>(ws[0]);
  return 2.0 * static_cast<double>(op.inInfo(0).elementCount()) * perInput;
}

} // namespace

void registerConvPoolOps(OpRegistry &r) {
  OpDef conv = makeDef("Conv", 1, 1000, setupConv);
  conv.fusionFields = fusionFieldBits({FusionField::Residual, FusionField::Pool, FusionField::Activation});
  conv.flops = convFlops;
  r.add(conv);
  OpDef convTranspose = makeDef("ConvTranspose", 1, 1000, setupConvTranspose);
  convTranspose.flops = convTransposeFlops;
  r.add(convTranspose);
  r.add(makeDef("MaxPool", 1, 1000, setupPool));
  r.add(makeDef("AveragePool", 1, 1000, setupPool));
  r.add(makeDef("LpPool", 1, 1000, setupPool));
  for (const char *t : {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
    r.add(makeDef(t, 1, 1000, setupGlobalPool));
}

} // namespace popart::ir
