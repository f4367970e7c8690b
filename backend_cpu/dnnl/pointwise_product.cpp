// PointwiseProduct: building the 1×1 convolution and running it.

#include "backend_cpu/dnnl/pointwise_product.hpp"

namespace popart::backend_cpu {

using namespace dnnl;

bool PointwiseProduct::init(const Spec &s) {
  *this = PointwiseProduct(); // the argument caches name the memories of an earlier init
  auto &eng = dnnl_util::engine();
  using tag = memory::format_tag;
  memory::desc src({1, s.k, 1, s.m}, memory::data_type::f32, tag::nhwc);
  memory::desc dst({1, s.n, 1, s.m}, memory::data_type::f32, tag::nhwc);
  // (o, i) = (n, k): B[k, n] at k·N + n, or transposed at n·K + k.
  memory::desc stored({s.n, s.k, 1, 1}, memory::data_type::f32,
                      s.bTransposed ? memory::dims{s.k, 1, 1, 1} : memory::dims{1, s.n, 1, 1});
  memory::desc bias = s.bias ? memory::desc({s.n}, memory::data_type::f32, tag::a) : memory::desc();
  primitive_attr attr;
  attr.set_scratchpad_mode(scratchpad_mode::user);
  post_ops po; // the scale as a post-op: oneDNN's jit 1×1 kernels take no f32 output scales
  if (s.scale != 1.f) po.append_eltwise(1.f, algorithm::eltwise_linear, s.scale, 0.f);
  auto add = [&] {
    addArg_ = DNNL_ARG_ATTR_MULTIPLE_POST_OP(po.len()) | DNNL_ARG_SRC_1;
    po.append_binary(algorithm::binary_add, dst);
  };
  if (s.addBeforeRelu) add();
  if (s.relu) po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
  if (s.addAfter) add();
  if (po.len() > 0) attr.set_post_ops(po);
  // Valid for any positive m, k, n; the implementation may still be missing (allow_empty).
  convolution_forward::primitive_desc pd(
      convolution_forward::desc(prop_kind::forward_inference, algorithm::convolution_direct, src,
                                dnnl_util::anyLayout(stored), bias, dst, {1, 1}, {0, 0}, {0, 0}),
      attr, eng, true);
  if (!pd) return false;
  dnnl_util::skipBrgconv(pd);
  if (dnnl_util::implIs(pd, "ref") || pd.src_desc() != src || pd.dst_desc() != dst) return false;
  prim_ = convolution_forward(pd);
  convScratch_ = memory(pd.scratchpad_desc(), eng);
  stored_ = memory(stored, eng, DNNL_MEMORY_NONE);
  if (s.constB) {
    packed_.init(stored_, pd.weights_desc(), true);
  } else {
    perRun_ = memory(pd.weights_desc(), eng, DNNL_MEMORY_NONE);
    if (pd.weights_desc() != stored) pack_ = dnnl_util::userScratchReorder(stored_, perRun_);
  }
  a_ = memory(src, eng, DNNL_MEMORY_NONE);
  c_ = memory(dst, eng, DNNL_MEMORY_NONE);
  add_ = memory(dst, eng, DNNL_MEMORY_NONE);
  if (s.bias) bias_ = memory(bias, eng, DNNL_MEMORY_NONE);
  hasAdd_ = s.addBeforeRelu || s.addAfter;
  return true;
}

void PointwiseProduct::run(const void *a, const void *b, const void *bias, const void *add, void *c, void *scratch) {
  a_.set_data_handle(const_cast<void *>(a));
  c_.set_data_handle(c);
  stored_.set_data_handle(const_cast<void *>(b));
  const memory *wt = &stored_;
  if (packed_) {
    wt = &packed_.get(stored_, b);
  } else if (pack_) {
    perRun_.set_data_handle(scratch);
    dnnl_util::execute(pack_, packArgs_, {{DNNL_ARG_FROM, stored_}, {DNNL_ARG_TO, perRun_}});
    wt = &perRun_;
  }
  if (bias_) bias_.set_data_handle(const_cast<void *>(bias));
  if (hasAdd_) add_.set_data_handle(const_cast<void *>(add));
  if (bias_ && hasAdd_)
    dnnl_util::execute(prim_, args_,
                       {{DNNL_ARG_SRC, a_},
                        {DNNL_ARG_WEIGHTS, *wt},
                        {DNNL_ARG_BIAS, bias_},
                        {DNNL_ARG_DST, c_},
                        {DNNL_ARG_SCRATCHPAD, convScratch_},
                        {addArg_, add_}});
  else if (bias_)
    dnnl_util::execute(prim_, args_,
                       {{DNNL_ARG_SRC, a_},
                        {DNNL_ARG_WEIGHTS, *wt},
                        {DNNL_ARG_BIAS, bias_},
                        {DNNL_ARG_DST, c_},
                        {DNNL_ARG_SCRATCHPAD, convScratch_}});
  else if (hasAdd_)
    dnnl_util::execute(prim_, args_,
                       {{DNNL_ARG_SRC, a_},
                        {DNNL_ARG_WEIGHTS, *wt},
                        {DNNL_ARG_DST, c_},
                        {DNNL_ARG_SCRATCHPAD, convScratch_},
                        {addArg_, add_}});
  else
    dnnl_util::execute(
        prim_, args_,
        {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, *wt}, {DNNL_ARG_DST, c_}, {DNNL_ARG_SCRATCHPAD, convScratch_}});
}

} // namespace popart::backend_cpu
