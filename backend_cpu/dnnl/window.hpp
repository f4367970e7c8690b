#pragma once
// Window parameters of the conv and pool ops (forward and grad) in oneDNN's terms, from
// ir::resolveWindow.

#include "ir/ops/window.hpp"

#include <oneapi/dnnl/dnnl.hpp>
#include <popart/error.hpp>

#include <string>
#include <vector>

namespace popart::backend_cpu::dnnl_util {

/// Padding resolved as ONNX defines it; dilations as oneDNN counts them (the gaps between taps).
struct Window {
  dnnl::memory::dims kernel, strides, dilates, padL, padR;
};

/// \p transposed: ConvTranspose's rules for output_shape / auto_pad (see ir::resolveWindow).
/// padR is the ONNX end padding; callers adapt it to oneDNN's size formula.
inline Window makeWindow(const ir::Op &op, const Shape &x, const Shape &y, const std::vector<int64_t> &kernel,
                         bool transposed) {
  ir::WindowGeometry g = ir::resolveWindow(op, x, y, kernel, transposed);
  Window w;
  for (size_t i = 0; i < g.spatialRank(); ++i) {
    w.kernel.push_back(g.kernel[i]);
    w.strides.push_back(g.strides[i]);
    w.dilates.push_back(g.dilations[i] - 1); // oneDNN counts the gaps between taps
    w.padL.push_back(g.padBegin[i]);
    w.padR.push_back(g.padEnd[i]);
  }
  return w;
}

/// Why oneDNN cannot take \p w ("" if it can): a negative pad.
inline std::string negativePadReason(const Window &w) {
  for (size_t i = 0; i < w.padR.size(); ++i)
    if (w.padL[i] < 0 || w.padR[i] < 0) return "negative padding";
  return {};
}

/// ceil_mode for a pool between \p x and \p y: extends the end padding where needed so that
/// oneDNN's floor formula gives the ceil size. The extension is ignored by max and excluded
/// averaging, but would be counted when padding is (\p includePad): then \returns why oneDNN
/// cannot take it ("" when it can).
inline std::string extendPadsForCeilMode(const Shape &x, const Shape &y, bool includePad, Window &w) {
  for (size_t i = 0; i < w.padR.size(); ++i) {
    int64_t in = x[i + 2], out = y[i + 2], dk = (w.kernel[i] - 1) * (w.dilates[i] + 1) + 1;
    if ((in + w.padL[i] + w.padR[i] - dk) / w.strides[i] + 1 == out) continue;
    int64_t needed = (out - 1) * w.strides[i] + dk - in - w.padL[i];
    if (includePad && needed > w.padR[i]) return "ceil_mode with count_include_pad";
    w.padR[i] = needed;
  }
  return {};
}

/// Whether oneDNN takes these parameters for a forward convolution (\p deconvolution: for a
/// deconvolution), asked through the C API, which answers with a status: the C++ desc made from
/// the same values then cannot throw.
inline bool forwardConvolutionValid(const dnnl::memory::desc &x, const dnnl::memory::desc &w,
                                    const dnnl::memory::desc &b, const dnnl::memory::desc &y, const Window &win,
                                    bool deconvolution = false) {
  if (deconvolution) {
    dnnl_deconvolution_desc_t d;
    return dnnl_dilated_deconvolution_forward_desc_init(
               &d, dnnl_forward_inference, dnnl_deconvolution_direct, &x.data, &w.data, &b.data, &y.data,
               win.strides.data(), win.dilates.data(), win.padL.data(), win.padR.data()) == dnnl_success;
  }
  dnnl_convolution_desc_t d;
  return dnnl_dilated_convolution_forward_desc_init(&d, dnnl_forward_inference, dnnl_convolution_direct, &x.data,
                                                    &w.data, &b.data, &y.data, win.strides.data(), win.dilates.data(),
                                                    win.padL.data(), win.padR.data()) == dnnl_success;
}

/// The same for the backward passes of a convolution: data (dX from \p w and dY) or weights.
inline bool backwardConvolutionValid(bool weights, const dnnl::memory::desc &x, const dnnl::memory::desc &w,
                                     const dnnl::memory::desc &y, const Window &win) {
  dnnl_convolution_desc_t d;
  const dnnl::memory::desc none;
  return (weights ? dnnl_dilated_convolution_backward_weights_desc_init(
                        &d, dnnl_convolution_direct, &x.data, &w.data, &none.data, &y.data, win.strides.data(),
                        win.dilates.data(), win.padL.data(), win.padR.data())
                  : dnnl_dilated_convolution_backward_data_desc_init(&d, dnnl_convolution_direct, &x.data, &w.data,
                                                                     &y.data, win.strides.data(), win.dilates.data(),
                                                                     win.padL.data(), win.padR.data())) == dnnl_success;
}

/// The same for pooling from \p x to \p y, forward (\p prop) and, if \p backward, its backward pass.
inline bool poolingValid(dnnl::prop_kind prop, dnnl::algorithm alg, const dnnl::memory::desc &x,
                         const dnnl::memory::desc &y, const Window &win, bool backward = false) {
  dnnl_pooling_v2_desc_t d;
  if (dnnl_pooling_v2_forward_desc_init(&d, static_cast<dnnl_prop_kind_t>(prop), static_cast<dnnl_alg_kind_t>(alg),
                                        &x.data, &y.data, win.strides.data(), win.kernel.data(), win.dilates.data(),
                                        win.padL.data(), win.padR.data()) != dnnl_success)
    return false;
  return !backward || dnnl_pooling_v2_backward_desc_init(&d, static_cast<dnnl_alg_kind_t>(alg), &x.data, &y.data,
                                                         win.strides.data(), win.kernel.data(), win.dilates.data(),
                                                         win.padL.data(), win.padR.data()) == dnnl_success;
}

} // namespace popart::backend_cpu::dnnl_util
