// oneDNN kernels: Reduce family, f32 or bf16 (fp32 accumulation), through dnnl::reduction for the reductions it
// computes exactly. LogSum and LogSumExp have no oneDNN algorithm; ReduceMax/ReduceMin are left out because oneDNN's
// reduction_max/min drop NaN where ONNX (numpy) propagates it.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

#include <map>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

struct ReductionSpec {
  algorithm alg;
  float p;
};

const std::map<std::string, ReductionSpec> &reductionSpecs() {
  // Lp algorithms with eps = 0: norm_lp_sum is (sum |x|^p)^(1/p), norm_lp_power_p_sum is sum |x|^p.
  static const std::map<std::string, ReductionSpec> specs{
      {"ReduceSum", {algorithm::reduction_sum, 0.f}},
      {"ReduceMean", {algorithm::reduction_mean, 0.f}},
      {"ReduceProd", {algorithm::reduction_mul, 0.f}},
      {"ReduceL1", {algorithm::reduction_norm_lp_sum, 1.f}},
      {"ReduceL2", {algorithm::reduction_norm_lp_sum, 2.f}},
      {"ReduceSumSquare", {algorithm::reduction_norm_lp_power_p_sum, 2.f}},
  };
  return specs;
}

/// The output dims with the input's rank (1 along reduced axes); empty if the op reduces
/// nothing (noop_with_empty_axes). Mirrors the op's setup().
memory::dims keptDims(const ir::Op &op) {
  const Shape &s = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(s.size());
  std::vector<int64_t> axes;
  if (const TensorData *a = op.optionalConstInput(1, "axes")) axes = a->toInt64Vector();
  if (axes.empty() && op.attrs.getInt("noop_with_empty_axes", 0) != 0) return {};
  memory::dims dims(s.begin(), s.end());
  if (axes.empty())
    for (auto &d : dims)
      d = 1;
  for (int64_t a : axes)
    dims[static_cast<size_t>(a < 0 ? a + rank : a)] = 1;
  return dims;
}

Support supportsReduction(const ir::Op &op) {
  const TensorInfo &in = op.inInfo(0);
  if (!dnnl_util::dnnlType(in.dataType())) return Support::no("not FLOAT, BFLOAT16 or FLOAT16");
  if (op.outInfo(0).dataType() != in.dataType()) return Support::no("output not of the input's type");
  if (in.rank() == 0 || in.rank() > DNNL_MAX_NDIMS || in.elementCount() == 0)
    return Support::no("a scalar, empty or high-rank input");
  if (op.hasInput(1) && !op.input(1).isConst()) return Support::no("axes not constant");
  if (!reductionSpecs().count(op.type)) return Support::no("no oneDNN reduction of this kind");
  memory::dims dims = keptDims(op);
  // oneDNN wants a real reduction: src and dst dims must differ.
  if (dims.empty() || memory::dims(in.shape().begin(), in.shape().end()) == dims)
    return Support::no("nothing to reduce");
  // oneDNN 2.6 falls back to its plain C++ reduction ("ref:any") for layouts its jit kernels do
  // not cover, e.g. reducing the leading axis of [80, 32]: our fast kernel is several times
  // faster there (profiled: 130-170 us against about 20 us), so leave those to it.
  memory::dims srcDims(in.shape().begin(), in.shape().end());
  memory::data_type type = dnnl_util::dnnlType(in);
  memory::desc srcMd(srcDims, type, dnnl_util::plainStrides(srcDims));
  memory::desc dstMd(dims, type, dnnl_util::plainStrides(dims));
  const ReductionSpec &spec = reductionSpecs().at(op.type);
  auto pd = reduction::primitive_desc(reduction::desc(spec.alg, srcMd, dstMd, spec.p, 0.f), dnnl_util::engine(), true);
  if (!pd && type != memory::data_type::f32) return dnnl_util::noImplementation("reduction", type);
  if (!pd || dnnl_util::implIs(pd, "ref")) return Support::no("only oneDNN's plain C++ reduction, slower than ours");
  return Support::yes();
}

std::unique_ptr<Kernel> createReduction(const ir::Op &op) {
  const ReductionSpec &spec = reductionSpecs().at(op.type);
  memory::dims srcDims(op.inInfo(0).shape().begin(), op.inInfo(0).shape().end());
  memory::dims dstDims = keptDims(op);
  memory::data_type type = dnnl_util::dnnlType(op.inInfo(0));
  memory::desc srcMd(srcDims, type, dnnl_util::plainStrides(srcDims));
  // keepdims = 0 only drops size-1 dims, so the plain layout of the output is the same.
  memory::desc dstMd(dstDims, type, dnnl_util::plainStrides(dstDims));
  auto pd = reduction::primitive_desc(reduction::desc(spec.alg, srcMd, dstMd, spec.p, 0.f), dnnl_util::engine());
  return std::make_unique<dnnl_util::SrcDstKernel>(reduction(pd), srcMd, dstMd);
}

} // namespace

void registerDnnlReduceKernels(KernelRegistry &r) {
  for (const auto &[type, spec] : reductionSpecs())
    r.add({"ai.onnx", type, KernelProvider::Dnnl, supportsReduction, createReduction});
}

} // namespace popart::backend_cpu
