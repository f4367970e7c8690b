#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "core/half.hpp"
#include "ir/fusion.hpp"
#include "ir/internal_attributes.hpp"
#include <popart/error.hpp>

#include <algorithm>

namespace popart::backend_cpu::dnnl_util {

dnnl::engine &engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream &stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

void execute(const dnnl::primitive &prim, std::vector<dnnl_exec_arg_t> &cache,
             std::initializer_list<std::pair<int, dnnl::memory>> args) {
  if (cache.empty())
    for (const auto &[arg, mem] : args)
      cache.push_back({arg, mem.get()});
  dnnl::error::wrap_c_api(
      dnnl_primitive_execute(prim.get(), stream().get(), static_cast<int>(cache.size()), cache.data()),
      "could not execute a primitive");
  stream().wait();
}

SrcDstKernel::SrcDstKernel(dnnl::primitive prim, const dnnl::memory::desc &src, const dnnl::memory::desc &dst,
                           bool inPlace)
    : prim_(std::move(prim)), src_(src, engine(), DNNL_MEMORY_NONE), dst_(dst, engine(), DNNL_MEMORY_NONE),
      inPlace_(inPlace) {}

void SrcDstKernel::run(const KernelArgs &args) {
  src_.set_data_handle(const_cast<void *>(args.inputs[0]));
  dst_.set_data_handle(args.outputs[0]);
  execute(prim_, args_, {{DNNL_ARG_SRC, src_}, {DNNL_ARG_DST, dst_}});
}

dnnl::memory::dims toDims(const Shape &shape) {
  if (shape.empty()) return {1};
  return dnnl::memory::dims(shape.begin(), shape.end());
}

dnnl::memory::dims plainStrides(const dnnl::memory::dims &dims) {
  dnnl::memory::dims s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i)
    s[i] = s[i + 1] * dims[i + 1];
  return s;
}

dnnl::memory::desc convWeightsDesc(const Shape &w, int64_t group, bool transposed, dnnl::memory::data_type type) {
  dnnl::memory::dims spatial(w.begin() + 2, w.end()), spatialStrides = plainStrides(spatial);
  int64_t k = 1;
  for (int64_t d : spatial)
    k *= d;
  dnnl::memory::dims dims, strides;
  if (!transposed) {
    const int64_t oc = w[0] / group, ic = w[1];
    dims = {oc, ic}, strides = {ic * k, k};
    if (group > 1) dims.insert(dims.begin(), group), strides.insert(strides.begin(), oc * ic * k);
  } else {
    const int64_t ic = w[0] / group, oc = w[1];
    dims = {oc, ic}, strides = {k, oc * k};
    if (group > 1) dims.insert(dims.begin(), group), strides.insert(strides.begin(), oc * ic * k);
  }
  dims.insert(dims.end(), spatial.begin(), spatial.end());
  strides.insert(strides.end(), spatialStrides.begin(), spatialStrides.end());
  return {dims, type, strides};
}

void appendActivation(dnnl::post_ops &po, const ir::FusedActivation &act) {
  using K = ir::FusedActivation::Kind;
  using dnnl::algorithm;
  switch (act.kind) {
  case K::Relu: po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f); break;
  case K::Clip: po.append_eltwise(1.f, algorithm::eltwise_clip_v2, act.alpha, act.beta); break;
  case K::HardSigmoid:
    po.append_eltwise(1.f, algorithm::eltwise_linear, act.alpha, act.beta);
    po.append_eltwise(1.f, algorithm::eltwise_clip_v2, 0.f, 1.f);
    break;
  case K::HardSwish: po.append_eltwise(1.f, algorithm::eltwise_hardswish, 0.f, 0.f); break;
  case K::Sigmoid: po.append_eltwise(1.f, algorithm::eltwise_logistic, 0.f, 0.f); break;
  case K::Swish: po.append_eltwise(1.f, algorithm::eltwise_swish, 1.f, 0.f); break;
  case K::None: break;
  }
}

dnnl::memory::desc plainDesc(const Shape &shape, size_t rank, dnnl::memory::data_type type) {
  dnnl::memory::dims dims = toDims(shape);
  while (dims.size() < rank)
    dims.insert(dims.begin(), 1);
  return dnnl::memory::desc(dims, type, plainStrides(dims));
}

bool inputsFloat(const ir::Op &op) {
  for (size_t i = 0; i < op.inputCount(); ++i)
    if (op.hasInput(i) && op.inInfo(i).dataType() != DataType::FLOAT) return false;
  return true;
}

bool allFloat(const ir::Op &op) { return inputsFloat(op) && op.outInfo(0).dataType() == DataType::FLOAT; }

Support productTypes(const ir::Op &op, std::initializer_list<size_t> extraInputs) {
  if (op.attrs.getInt(ir::internal_attr::kHalfPartials, 0) != 0)
    return Support::no("its partial sums are rounded to 16 bits (fp16.16), which oneDNN does not do");
  DataType t = op.inInfo(0).dataType();
  if (!dnnlType(t) || op.inInfo(1).dataType() != t)
    return Support::no("A and B not both FLOAT, BFLOAT16 or FLOAT16 (" + toString(t) + ", " +
                       toString(op.inInfo(1).dataType()) + ")");
  DataType y = op.outInfo(0).dataType();
  if (y != t && y != DataType::FLOAT) return Support::no("Y is " + toString(y) + " with " + toString(t) + " operands");
  for (size_t i : extraInputs)
    if (op.inputCount() > i && op.hasInput(i) && op.inInfo(i).dataType() != t &&
        op.inInfo(i).dataType() != DataType::FLOAT)
      return Support::no("input " + std::to_string(i) + " is " + toString(op.inInfo(i).dataType()));
  return Support::yes();
}

std::optional<dnnl::memory::data_type> dnnlType(DataType type) {
  switch (type) {
  case DataType::FLOAT: return dnnl::memory::data_type::f32;
  case DataType::BFLOAT16: return dnnl::memory::data_type::bf16;
  case DataType::FLOAT16: return dnnl::memory::data_type::f16;
  default: return std::nullopt;
  }
}

dnnl::memory::data_type dnnlType(const TensorInfo &info) {
  if (auto t = dnnlType(info.dataType())) return *t;
  throw ::popart::error("oneDNN kernels take FLOAT, BFLOAT16 or FLOAT16 tensors, not ", toString(info.dataType()));
}

const char *dnnlTypeName(dnnl::memory::data_type type) {
  switch (type) {
  case dnnl::memory::data_type::f32: return "f32";
  case dnnl::memory::data_type::bf16: return "bf16";
  case dnnl::memory::data_type::f16: return "f16";
  default: return "other";
  }
}

std::string notOneFloatType(const ir::Op &op, bool outputs) {
  std::optional<DataType> first;
  auto check = [&](const TensorInfo &info, const char *role, size_t i) -> std::string {
    if (!dnnlType(info.dataType()))
      return std::string(role) + " " + std::to_string(i) + " is " + toString(info.dataType()) +
             " (oneDNN's: FLOAT, BFLOAT16, FLOAT16)";
    if (first && *first != info.dataType())
      return std::string(role) + " " + std::to_string(i) + " is " + toString(info.dataType()) + ", not " +
             toString(*first) + " like the others";
    first = info.dataType();
    return "";
  };
  for (size_t i = 0; i < op.inputCount(); ++i)
    if (op.hasInput(i))
      if (std::string why = check(op.inInfo(i), "input", i); !why.empty()) return why;
  if (outputs)
    for (size_t i = 0; i < op.outputCount(); ++i)
      if (op.hasOutput(i))
        if (std::string why = check(op.outInfo(i), "output", i); !why.empty()) return why;
  return "";
}

Support noImplementation(const char *what, dnnl::memory::data_type type) {
  return Support::no(std::string("oneDNN 2.6 has no ") + dnnlTypeName(type) + " " + what + " on this CPU");
}

F32Staging::F32Staging(DataType type, int64_t count) : type_(type) {
  if (type != DataType::FLOAT && type != DataType::BFLOAT16 && type != DataType::FLOAT16)
    throw ::popart::error("a oneDNN kernel stages FLOAT, BFLOAT16 or FLOAT16 tensors, not ", toString(type));
  if (staged()) buffer_.assign(static_cast<size_t>(count), 0.f);
}

float *F32Staging::widen(const void *data) {
  if (!staged()) return static_cast<float *>(const_cast<void *>(data));
  const auto *bits = static_cast<const uint16_t *>(data);
  for (size_t i = 0; i < buffer_.size(); ++i)
    buffer_[i] = type_ == DataType::BFLOAT16 ? bfloat16ToFloat(bits[i]) : halfToFloat(bits[i]);
  return buffer_.data();
}

float *F32Staging::target(void *data) { return staged() ? buffer_.data() : static_cast<float *>(data); }

void F32Staging::narrow(void *data) const {
  if (!staged()) return;
  auto *bits = static_cast<uint16_t *>(data);
  for (size_t i = 0; i < buffer_.size(); ++i)
    bits[i] = type_ == DataType::BFLOAT16 ? floatToBfloat16(buffer_[i]) : floatToHalf(buffer_[i]);
}

bool pointwiseWeights(const Shape &w, int64_t group) {
  if (group != 1 || w.size() < 3) return false;
  return std::all_of(w.begin() + 2, w.end(), [](int64_t k) { return k == 1; });
}

dnnl::memory::desc anyLayout(const dnnl::memory::desc &md) {
  return dnnl::memory::desc(md.dims(), md.data_type(), dnnl::memory::format_tag::any);
}

void PackedWeights::init(const dnnl::memory &stored, const dnnl::memory::desc &chosen, bool constant) {
  constant_ = constant;
  if (chosen == stored.get_desc()) return;
  packed_ = dnnl::memory(chosen, engine());
  pack_ = userScratchReorder(stored, packed_);
}

const dnnl::memory &PackedWeights::get(const dnnl::memory &stored, const void *data) {
  if (!constant_ || packedFrom_ != data) {
    execute(pack_, args_, {{DNNL_ARG_FROM, stored}, {DNNL_ARG_TO, packed_}});
    packedFrom_ = data;
  }
  return packed_;
}

dnnl::reorder userScratchReorder(const dnnl::memory &from, const dnnl::memory &to) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::reorder::primitive_desc pd(from, to, attr);
  if (pd.scratchpad_desc().get_size() != 0) throw ::popart::error("reorder needs a scratchpad");
  return dnnl::reorder(pd);
}

int64_t channelBlock(const dnnl::memory::desc &md) {
  const dnnl_memory_desc_t &d = md.data;
  if (d.ndims != 4 || d.format_kind != dnnl_blocked || d.offset0 != 0 || d.data_type != dnnl_f32) return 0;
  const auto &bl = d.format_desc.blocking;
  int64_t block = 1;
  if (bl.inner_nblks == 1 && bl.inner_idxs[0] == 1 && (bl.inner_blks[0] == 8 || bl.inner_blks[0] == 16))
    block = bl.inner_blks[0];
  else if (bl.inner_nblks != 0)
    return 0;
  const dnnl_dim_t *p = d.padded_dims;
  if (p[0] != d.dims[0] || p[2] != d.dims[2] || p[3] != d.dims[3] || p[1] % block != 0) return 0;
  if (bl.strides[3] != block || bl.strides[2] != p[3] * block || bl.strides[1] != p[2] * p[3] * block ||
      bl.strides[0] != p[1] * p[2] * p[3])
    return 0;
  return block;
}

} // namespace popart::backend_cpu::dnnl_util
