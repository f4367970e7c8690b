// NonMaxSuppression.

#include "ir/ops/detection.hpp"
#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

#include <algorithm>
#include <cmath>

namespace popart::ir {

void registerMaxUnpoolOps(OpRegistry &r);

std::vector<std::array<int64_t, 3>> nonMaxSuppression(const TensorData &boxes, const TensorData &scores,
                                                      const TensorData *maxPerClass, const TensorData *iouThreshold,
                                                      const TensorData *scoreThreshold, bool centerPointBox) {
  const Shape &bs = boxes.info().shape(), &ss = scores.info().shape();
  if (bs.size() != 3 || bs[2] != 4 || ss.size() != 3 || ss[0] != bs[0] || ss[2] != bs[1])
    throw error("NonMaxSuppression: boxes ", toString(bs), " and scores ", toString(ss),
                " must be [B,N,4] and [B,C,N]");
  int64_t batches = bs[0], count = bs[1], classes = ss[1];
  int64_t maxOut =
      maxPerClass && maxPerClass->info().elementCount() ? maxPerClass->valueAsInt64(0) : 0;
  double iouMax = iouThreshold && iouThreshold->info().elementCount() ? iouThreshold->valueAsDouble(0) : 0.0;
  bool useScore = scoreThreshold && scoreThreshold->info().elementCount();
  double scoreMin = useScore ? scoreThreshold->valueAsDouble(0) : 0.0;
  std::vector<std::array<int64_t, 3>> selected;
  if (maxOut <= 0) return selected;
  auto corners = [&](int64_t b, int64_t i) {
    std::array<double, 4> v;
    for (int k = 0; k < 4; ++k)
      v[static_cast<size_t>(k)] = boxes.valueAsDouble((b * count + i) * 4 + k);
    if (centerPointBox) {
      double xc = v[0], yc = v[1], w = v[2], h = v[3];
      return std::array<double, 4>{yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2};
    }
    // [y1, x1, y2, x2] with either corner order.
    return std::array<double, 4>{std::min(v[0], v[2]), std::min(v[1], v[3]), std::max(v[0], v[2]),
                                 std::max(v[1], v[3])};
  };
  auto iou = [](const std::array<double, 4> &a, const std::array<double, 4> &b) {
    double h = std::max(0.0, std::min(a[2], b[2]) - std::max(a[0], b[0]));
    double w = std::max(0.0, std::min(a[3], b[3]) - std::max(a[1], b[1]));
    double inter = h * w;
    double uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
    return uni > 0 ? inter / uni : 0.0;
  };
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t c = 0; c < classes; ++c) {
      std::vector<int64_t> order;
      for (int64_t i = 0; i < count; ++i)
        if (!useScore || scores.valueAsDouble((b * classes + c) * count + i) > scoreMin) order.push_back(i);
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
        return scores.valueAsDouble((b * classes + c) * count + x) >
               scores.valueAsDouble((b * classes + c) * count + y);
      });
      std::vector<int64_t> kept;
      for (int64_t i : order) {
        if (static_cast<int64_t>(kept.size()) >= maxOut) break;
        bool suppressed = false;
        for (int64_t k : kept)
          if (iou(corners(b, i), corners(b, k)) > iouMax) {
            suppressed = true;
            break;
          }
        if (!suppressed) {
          kept.push_back(i);
          selected.push_back({b, c, i});
        }
      }
    }
  return selected;
}

namespace {

void setupNms(Op &op) {
  requireInputCount(op, 2, 5);
  auto selected = nonMaxSuppression(
      op.constInput(0, "boxes"), op.constInput(1, "scores"), op.optionalConstInput(2, "max_output_boxes_per_class"),
      op.optionalConstInput(3, "iou_threshold"), op.optionalConstInput(4, "score_threshold"),
      op.attrs.getInt("center_point_box", 0) != 0);
  op.setOutInfo(0, TensorInfo(DataType::INT64, {static_cast<int64_t>(selected.size()), 3}));
}

} // namespace

void registerDetectionOps(OpRegistry &r) {
  OpDef nms = makeDef("NonMaxSuppression", 10, 1000, setupNms);
  nms.allInputsAreValueInputs = true;
  r.add(nms);
  registerMaxUnpoolOps(r);
}

} // namespace popart::ir

namespace popart::ir {

namespace {
void setupMaxUnpool(Op &op) {
  requireInputCount(op, 2, 3);
  const Shape &x = op.inInfo(0).shape();
  if (op.inInfo(1).shape() != x)
    throw error(op.debugName(), ": indices shape ", toString(op.inInfo(1).shape()), " differs from X ", toString(x));
  Shape out = x;
  if (const TensorData *s = op.optionalConstInput(2, "output_shape")) {
    out = s->toInt64Vector();
    if (out.size() != x.size())
      throw error(op.debugName(), ": output_shape has rank ", out.size(), ", expected ", x.size());
    for (int64_t d : out)
      if (d < 0) throw error(op.debugName(), ": output_shape ", toString(out), " has a negative dimension");
  } else {
    // Attribute sizes and the arithmetic are checked: found by the model fuzzer (strides shorter
    // than kernel_shape were read past their end).
    if (x.size() < 3) throw error(op.debugName(), ": X ", toString(x), " needs a batch, a channel and spatial axes");
    std::vector<int64_t> kernel = op.attrs.getInts("kernel_shape");
    size_t spatial = x.size() - 2;
    if (kernel.size() != spatial) throw error(op.debugName(), ": kernel_shape needs ", spatial, " values");
    std::vector<int64_t> strides = op.attrs.getInts("strides", std::vector<int64_t>(spatial, 1));
    std::vector<int64_t> pads = op.attrs.getInts("pads", std::vector<int64_t>(2 * spatial, 0));
    if (strides.size() != spatial) throw error(op.debugName(), ": strides needs ", spatial, " values");
    if (pads.size() != 2 * spatial) throw error(op.debugName(), ": pads needs ", 2 * spatial, " values");
    for (size_t i = 0; i < spatial; ++i) {
      int64_t d = 0, padded = 0;
      if (strides[i] < 1 || kernel[i] < 1 || pads[i] < 0 || pads[spatial + i] < 0 ||
          __builtin_mul_overflow(x[i + 2] - 1, strides[i], &d) || __builtin_add_overflow(d, kernel[i], &d) ||
          __builtin_add_overflow(pads[i], pads[spatial + i], &padded) || d - padded < 1)
        throw error(op.debugName(), ": X ", toString(x), " with kernel_shape ", toString(kernel), ", strides ",
                    intsToString(strides), " and pads ", intsToString(pads), " gives no valid output size on axis ", i + 2);
      out[i + 2] = d - padded;
    }
  }
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}
} // namespace

void registerMaxUnpoolOps(OpRegistry &r) {
  OpDef d = makeDef("MaxUnpool", 9, 1000, setupMaxUnpool);
  d.valueInputs = {2};
  r.add(d);
}

} // namespace popart::ir
