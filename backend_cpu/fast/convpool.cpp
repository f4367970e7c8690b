// Fast kernels of the pools: f32 MaxPool over 2-D windows that tile the plane, one vectorised
// pass per plane (vec::maxPoolPlane), and over any other 2-D windows (overlapping, padded,
// dilated: GoogLeNet's 3×3 stride-1 pools, ResNet's 3×3 stride-2 one) in two separable passes,
// each row's maxima over the window's columns and then those rows' maxima over the window's rows.
// The window test (ir::whyWindowsDoNotTile) is shared with MaxPoolGrad's fast kernel
// (fast/convgrad.cpp), whose predicate tiledMaxPoolGrad is defined here beside tiledMaxPool, and
// with fuseMaxPoolGradRelu.

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"
#include "ir/ops/window.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// Why the fast MaxPool declines \p op; empty if it takes it.
std::string whyNotTiledMaxPool(const ir::Op &op) {
  if (op.type != "MaxPool") return "not a MaxPool";
  if (op.hasOutput(1)) return "it gives no Indices";
  if (!op.hasOutput(0)) return "no output Y";
  if (op.inInfo(0).dataType() != DataType::FLOAT) return "not f32";
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  if (std::string why = ir::whyWindowsDoNotTile(op, y); !why.empty()) return why;
  if (op.attrs.getString("auto_pad", "NOTSET") != "NOTSET") return "auto_pad";
  if (y[0] != x[0] || y[1] != x[1]) return "batch or channels differ between X and Y";
  return {};
}

Support supportsTiledMaxPool(const ir::Op &op) { return Support::unless(whyNotTiledMaxPool(op)); }

std::unique_ptr<Kernel> createTiledMaxPool(const ir::Op &op) {
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  std::vector<int64_t> k = op.attrs.getInts("kernel_shape"), s = op.attrs.getInts("strides");
  int64_t planes = x[0] * x[1], h = x[2], w = x[3], oh = y[2], ow = y[3];
  return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
    const float *X = a.in<float>(0);
    float *Y = a.out<float>(0);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < planes; ++p)
      vec::maxPoolPlane(X + p * h * w, Y + p * oh * ow, h, w, oh, ow, k[0], k[1], s[0], s[1]);
  });
}

/// The taps [lo, hi) of each output position's window along one axis that lie inside the input.
struct AxisTaps {
  std::vector<int64_t> lo, hi;
  int64_t inner0 = 0, inner1 = 0; ///< the positions [inner0, inner1) whose every tap is inside
};

/// AxisTaps of \p out positions over an input of \p in; false if a window lies wholly outside it.
bool axisTaps(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t dilation, int64_t padBegin,
              AxisTaps &t) {
  t.lo.resize(static_cast<size_t>(out));
  t.hi.resize(static_cast<size_t>(out));
  t.inner0 = out;
  t.inner1 = 0;
  for (int64_t o = 0; o < out; ++o) {
    const int64_t start = o * stride - padBegin;
    const int64_t lo = start >= 0 ? 0 : (-start + dilation - 1) / dilation;
    const int64_t hi = start > in - 1 ? 0 : std::min(kernel, (in - 1 - start) / dilation + 1);
    if (hi <= lo) return false;
    t.lo[static_cast<size_t>(o)] = lo;
    t.hi[static_cast<size_t>(o)] = hi;
    if (lo == 0 && hi == kernel) {
      t.inner0 = std::min(t.inner0, o);
      t.inner1 = o + 1;
    }
  }
  return true; // the interior is one run: a window's start grows with its position
}

/// Why the separable MaxPool declines \p op; empty if it takes it.
std::string whyNotSeparableMaxPool(const ir::Op &op) {
  if (op.type != "MaxPool") return "not a MaxPool";
  if (op.hasOutput(1)) return "it gives no Indices";
  if (!op.hasOutput(0)) return "no output Y";
  if (op.inInfo(0).dataType() != DataType::FLOAT) return "not f32";
  const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
  if (x.size() != 4) return "not 2-D";
  if (y[0] != x[0] || y[1] != x[1]) return "batch or channels differ between X and Y";
  if (shapeElementCount(y) == 0) return "an empty output";
  ir::WindowGeometry g = ir::resolveWindow(op, x, y, op.attrs.getInts("kernel_shape"), false);
  AxisTaps rows, cols;
  if (!axisTaps(x[2], y[2], g.kernel[0], g.strides[0], g.dilations[0], g.padBegin[0], rows) ||
      !axisTaps(x[3], y[3], g.kernel[1], g.strides[1], g.dilations[1], g.padBegin[1], cols))
    return "a window lies wholly in the padding";
  return {};
}

/// MaxPool of any 2-D windows in two passes per plane: m[r][j], the maximum of input row r over
/// output column j's taps, for every row; then y[i][j], the maximum of m over output row i's rows.
/// Both passes keep the first of equal maxima and pass NaN over, and a window whose first tap is
/// NaN gives NaN: the reference's row-major scan, bit for bit (ties of ±0 and NaN included).
class SeparableMaxPoolKernel : public Kernel {
public:
  SeparableMaxPoolKernel(const ir::Op &op, const KernelContext &context) {
    const Shape &x = op.inInfo(0).shape(), &y = op.outInfo(0).shape();
    g_ = ir::resolveWindow(op, x, y, op.attrs.getInts("kernel_shape"), false);
    planes_ = x[0] * x[1];
    h_ = x[2];
    w_ = x[3];
    oh_ = y[2];
    ow_ = y[3];
    axisTaps(h_, oh_, g_.kernel[0], g_.strides[0], g_.dilations[0], g_.padBegin[0], rows_);
    axisTaps(w_, ow_, g_.kernel[1], g_.strides[1], g_.dilations[1], g_.padBegin[1], cols_);
    for (int64_t j = 0; j < ow_; ++j)
      firstColumn_.push_back(j * g_.strides[1] - g_.padBegin[1] + cols_.lo[static_cast<size_t>(j)] * g_.dilations[1]);
    threads_ = static_cast<int>(std::clamp<int64_t>(context.threads, 1, planes_));
    perThread_ = (h_ * ow_ + 15) / 16 * 16;
  }

  int64_t scratchBytes() const override { return perThread_ * threads_ * static_cast<int64_t>(sizeof(float)); }

  void run(const KernelArgs &a) override {
    const float *X = a.in<float>(0);
    float *Y = a.out<float>(0);
    float *scratch = static_cast<float *>(a.scratch);
    if (!scratch) { // outside a plan: the kernel's own, allocated once
      if (owned_.empty()) owned_.resize(static_cast<size_t>(perThread_ * threads_));
      scratch = owned_.data();
    }
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t p = 0; p < planes_; ++p)
      plane(X + p * h_ * w_, Y + p * oh_ * ow_, scratch + omp_get_thread_num() * perThread_);
  }

private:
  void plane(const float *x, float *y, float *m) const {
    // The maxima over each window's other taps pass NaN over; a NaN first tap then wins its window.
    constexpr float kLowest = -std::numeric_limits<float>::infinity();
    const int64_t kw = g_.kernel[1], sw = g_.strides[1], dw = g_.dilations[1], pw = g_.padBegin[1];
    const int64_t inner0 = cols_.inner0, inner = std::max<int64_t>(0, cols_.inner1 - cols_.inner0);
    for (int64_t r = 0; r < h_; ++r) {
      const float *row = x + r * w_;
      float *mr = m + r * ow_;
      for (int64_t j = 0; j < ow_; ++j) {
        if (j == inner0 && inner > 0) { // the interior: one tap at a time, vectorised
          std::fill_n(mr + j, inner, kLowest);
          for (int64_t t = 0; t < kw; ++t)
            vec::maxInto(row + inner0 * sw - pw + t * dw, sw, mr + inner0, inner);
          j += inner - 1;
          continue;
        }
        const int64_t start = j * sw - pw;
        float v = kLowest;
        for (int64_t t = cols_.lo[static_cast<size_t>(j)]; t < cols_.hi[static_cast<size_t>(j)]; ++t)
          v = row[start + t * dw] > v ? row[start + t * dw] : v;
        mr[j] = v;
      }
    }
    const int64_t sh = g_.strides[0], dh = g_.dilations[0], ph = g_.padBegin[0];
    for (int64_t i = 0; i < oh_; ++i) {
      const int64_t first = i * sh - ph + rows_.lo[static_cast<size_t>(i)] * dh; // the windows' first row
      float *yi = y + i * ow_;
      std::copy_n(m + first * ow_, ow_, yi);
      for (int64_t t = rows_.lo[static_cast<size_t>(i)] + 1; t < rows_.hi[static_cast<size_t>(i)]; ++t)
        vec::maxInto(m + (first + (t - rows_.lo[static_cast<size_t>(i)]) * dh) * ow_, 1, yi, ow_);
      const float *firstRow = x + first * w_;
      for (int64_t j = 0; j < ow_; ++j) {
        const float tap = firstRow[firstColumn_[static_cast<size_t>(j)]];
        if (std::isnan(tap)) yi[j] = tap;
      }
    }
  }

  ir::WindowGeometry g_;
  AxisTaps rows_, cols_;
  std::vector<int64_t> firstColumn_; ///< the column of each output column's first tap
  int64_t planes_ = 0, h_ = 0, w_ = 0, oh_ = 0, ow_ = 0, perThread_ = 0;
  int threads_ = 1;
  std::vector<float> owned_;
};

Support supportsSeparableMaxPool(const ir::Op &op) { return Support::unless(whyNotSeparableMaxPool(op)); }

std::unique_ptr<Kernel> createSeparableMaxPool(const ir::Op &op, const KernelContext &context) {
  return std::make_unique<SeparableMaxPoolKernel>(op, context);
}

} // namespace

bool separableMaxPool(const ir::Op &op) { return whyNotSeparableMaxPool(op).empty(); }

bool tiledMaxPool(const ir::Op &op) { return whyNotTiledMaxPool(op).empty(); }

bool tiledMaxPoolGrad(const ir::Op &op) {
  // Every window of dY inside X, too: vec::maxPoolGradPlane would read and write beyond the plane.
  return op.type == "MaxPoolGrad" && op.hasInput(0) && op.hasInput(1) && op.inInfo(0).dataType() == DataType::FLOAT &&
         ir::whyWindowsDoNotTile(op, op.inInfo(1).shape()).empty();
}

void registerFastConvPoolKernels(KernelRegistry &r) {
  // The tiled kernel first: where both take a pool, its one pass runs it.
  r.add({"ai.onnx", "MaxPool", KernelProvider::Fast, supportsTiledMaxPool, createTiledMaxPool});
  r.add({"ai.onnx", "MaxPool", KernelProvider::Fast, supportsSeparableMaxPool, createSeparableMaxPool});
}

} // namespace popart::backend_cpu
