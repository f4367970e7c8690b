// oneDNN kernel for Cast (and CastLike) between FLOAT, BFLOAT16 and FLOAT16: one reorder between
// plain layouts of the two types, where it gives exactly what ONNX (and the reference kernel, with
// core/half.hpp) gives. Measured on oneDNN 2.6.3 with avx512_bf16 (tests/unit/test_dnnl_16bit.cpp):
// - bf16 → f32 (jit:uni): exact for all 65536 patterns. Taken.
// - f32 → bf16 (jit:uni, vcvtneps2bf16): flushes f32 subnormals to ±0 (the instruction ignores
//   MXCSR), where round-to-nearest-even keeps them. Declined.
// - f16 ↔ f32 (simple:any, a C++ loop): turns −0 into +0 both ways. Declined.
// - bf16 ↔ f16: no reorder. Declined.
// Without AVX-512 (AVX2 only), bf16 → f32 is simple:any, a C++ loop that turns −0 into +0: declined.
// Declined casts are the reference kernel's.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

/// A user scratchpad, so that a reorder needing one is declined rather than allocating per run.
primitive_attr userScratch() {
  primitive_attr attr;
  attr.set_scratchpad_mode(scratchpad_mode::user);
  return attr;
}

Support supportsCast(const ir::Op &op) {
  DataType from = op.inInfo(0).dataType(), to = op.outInfo(0).dataType();
  auto src = dnnl_util::dnnlType(from), dst = dnnl_util::dnnlType(to);
  if (!src || !dst) return Support::no("a cast from " + toString(from) + " to " + toString(to));
  if (from == to) return Support::no("a cast to the same type (a copy)");
  if (op.inInfo(0).elementCount() == 0) return Support::no("an empty input");
  if (from == DataType::FLOAT && to == DataType::BFLOAT16)
    return Support::no("oneDNN 2.6's f32 to bf16 reorder flushes subnormals to zero (not round-to-nearest-even)");
  if ((from == DataType::FLOAT && to == DataType::FLOAT16) || (from == DataType::FLOAT16 && to == DataType::FLOAT))
    return Support::no("oneDNN 2.6's f16 reorder loses the sign of zero");
  reorder::primitive_desc pd(dnnl_util::engine(), dnnl_util::plainDesc(op.inInfo(0), 1), dnnl_util::engine(),
                             dnnl_util::plainDesc(op.outInfo(0), 1), userScratch(), true);
  if (!pd)
    return Support::no(std::string("oneDNN 2.6 has no ") + dnnl_util::dnnlTypeName(*src) + " to " +
                       dnnl_util::dnnlTypeName(*dst) + " reorder");
  if (pd.scratchpad_desc().get_size() != 0) return Support::no("the reorder needs a scratchpad");
  return dnnl_util::exactReorder(pd, *src, std::string("to ") + dnnl_util::dnnlTypeName(*dst));
}

std::unique_ptr<Kernel> createCast(const ir::Op &op) {
  auto src = dnnl_util::plainDesc(op.inInfo(0), 1), dst = dnnl_util::plainDesc(op.outInfo(0), 1);
  reorder::primitive_desc pd(dnnl_util::engine(), src, dnnl_util::engine(), dst, userScratch());
  return std::make_unique<dnnl_util::SrcDstKernel>(reorder(pd), src, dst);
}

} // namespace

void registerDnnlCastKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "Cast", KernelProvider::Dnnl, supportsCast, createCast});
  r.add({"ai.onnx", "CastLike", KernelProvider::Dnnl, supportsCast, createCast});
}

} // namespace popart::backend_cpu
