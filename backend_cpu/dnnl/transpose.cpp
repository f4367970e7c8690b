// oneDNN kernel for Transpose: a reorder from the input's plain layout into a destination whose
// strides are the output's plain strides permuted back, f32 or bf16.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

#include <numeric>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

std::vector<int64_t> permutation(const ir::Op &op) {
  std::vector<int64_t> perm = op.attrs.getInts("perm", {});
  size_t rank = op.inInfo(0).shape().size();
  if (perm.empty()) {
    perm.resize(rank);
    std::iota(perm.rbegin(), perm.rend(), 0); // default: reverse the dimensions
  }
  for (auto &p : perm)
    if (p < 0) p += static_cast<int64_t>(rank);
  return perm;
}

/// src: the input, plain. dst: the input's dims with strides such that element (i0, i1, ...)
/// lands where the output (plain) keeps it: stride of input dim perm[d] = output stride d.
std::pair<memory::desc, memory::desc> descs(const ir::Op &op) {
  const Shape &in = op.inInfo(0).shape(), &out = op.outInfo(0).shape();
  std::vector<int64_t> perm = permutation(op);
  memory::dims dims(in.begin(), in.end());
  memory::dims outStrides = dnnl_util::plainStrides(memory::dims(out.begin(), out.end()));
  memory::dims strides(dims.size());
  for (size_t d = 0; d < perm.size(); ++d)
    strides[static_cast<size_t>(perm[d])] = outStrides[d];
  memory::data_type type = dnnl_util::dnnlType(op.inInfo(0));
  return {memory::desc(dims, type, dnnl_util::plainStrides(dims)), memory::desc(dims, type, strides)};
}

Support supportsTranspose(const ir::Op &op) {
  const TensorInfo &in = op.inInfo(0);
  if (!dnnl_util::dnnlType(in.dataType())) return Support::no("not FLOAT, BFLOAT16 or FLOAT16");
  // (tests/unit/test_dnnl_16bit.cpp: its simple:any f16 reorder does not move every bit pattern as it is.)
  if (in.dataType() == DataType::FLOAT16) return Support::no("oneDNN 2.6's f16 reorder changes some bit patterns");
  if (in.rank() < 2 || in.rank() > DNNL_MAX_NDIMS || in.elementCount() == 0)
    return Support::no("rank below 2 or too high, or an empty input");
  auto [src, dst] = descs(op);
  auto pd = reorder::primitive_desc(dnnl_util::engine(), src, dnnl_util::engine(), dst, primitive_attr(), true);
  // As for reductions: oneDNN's plain C++ reorder is not faster than our reference loop.
  if (!pd || dnnl_util::implIs(pd, "ref")) return Support::no("only oneDNN's plain C++ reorder, slower than ours");
  return dnnl_util::exactReorder(pd, src.data_type(), "transpose");
}

std::unique_ptr<Kernel> createTranspose(const ir::Op &op) {
  auto [src, dst] = descs(op);
  auto pd = reorder::primitive_desc(dnnl_util::engine(), src, dnnl_util::engine(), dst);
  return std::make_unique<dnnl_util::SrcDstKernel>(reorder(pd), src, dst);
}

} // namespace

void registerDnnlTransposeKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "Transpose", KernelProvider::Dnnl, supportsTranspose, createTranspose});
}

} // namespace popart::backend_cpu
