// oneDNN kernels: Softmax and LogSoftmax (f32 or bf16) through softmax_v2 on an [outer, n, inner] view,
// which expresses both the single-axis form (opset >= 13) and the 2-D coercion (opset < 13).

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

/// The [outer, n, inner] dims the op normalises over (n is the middle one).
memory::dims softmaxDims(const ir::Op &op) {
  const Shape &s = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(s.size());
  int64_t axis = op.attrs.getInt("axis", op.version < 13 ? 1 : -1);
  if (axis < 0) axis += rank;
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d)
    outer *= s[static_cast<size_t>(d)];
  if (op.version < 13) {
    for (int64_t d = axis; d < rank; ++d)
      n *= s[static_cast<size_t>(d)];
  } else {
    n = s[static_cast<size_t>(axis)];
    for (int64_t d = axis + 1; d < rank; ++d)
      inner *= s[static_cast<size_t>(d)];
  }
  return {outer, n, inner};
}

Support supportsSoftmax(const ir::Op &op) {
  if (std::string why = dnnl_util::notOneFloatType(op); !why.empty()) return Support::no(why);
  if (op.inInfo(0).rank() == 0 || op.inInfo(0).elementCount() == 0) return Support::no("a scalar or empty input");
  memory::data_type type = dnnl_util::dnnlType(op.inInfo(0));
  if (type == memory::data_type::f32) return Support::yes();
  memory::dims dims = softmaxDims(op);
  memory::desc md(dims, type, dnnl_util::plainStrides(dims));
  algorithm alg = op.type == "LogSoftmax" ? algorithm::softmax_log : algorithm::softmax_accurate;
  softmax_v2_forward::primitive_desc pd(softmax_v2_forward::desc(prop_kind::forward_inference, alg, md, md, 1),
                                        dnnl_util::engine(), true);
  return dnnl_util::implementationFor(pd, "softmax", type);
}

std::unique_ptr<Kernel> createSoftmax(const ir::Op &op) {
  memory::dims dims = softmaxDims(op);
  memory::desc md(dims, dnnl_util::dnnlType(op.inInfo(0)), dnnl_util::plainStrides(dims));
  algorithm alg = op.type == "LogSoftmax" ? algorithm::softmax_log : algorithm::softmax_accurate;
  auto pd = softmax_v2_forward::primitive_desc(softmax_v2_forward::desc(prop_kind::forward_inference, alg, md, md, 1),
                                               dnnl_util::engine());
  return std::make_unique<dnnl_util::SrcDstKernel>(softmax_v2_forward(pd), md, md);
}

} // namespace

void registerDnnlSoftmaxKernels(KernelRegistry &r) {
  for (const char *t : {"Softmax", "LogSoftmax"})
    r.add({"ai.onnx", t, KernelProvider::Dnnl, supportsSoftmax, createSoftmax});
}

} // namespace popart::backend_cpu
