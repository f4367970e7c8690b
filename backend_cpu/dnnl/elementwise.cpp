// oneDNN kernels for elementwise ops: eltwise (unary) and binary with broadcasting, in f32 or
// bf16 (f16 where oneDNN has it: not in 2.6 on the CPU, so those decline).

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

#include <limits>
#include <map>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

struct EltwiseSpec {
  algorithm alg;
  float alpha;
  float beta;
};

bool eltwiseSpec(const ir::Op &op, EltwiseSpec &spec) {
  const auto &a = op.attrs;
  static const std::map<std::string, algorithm> simple{
      {"Relu", algorithm::eltwise_relu},           {"Tanh", algorithm::eltwise_tanh},
      {"Sigmoid", algorithm::eltwise_logistic},    {"Exp", algorithm::eltwise_exp},
      {"Sqrt", algorithm::eltwise_sqrt},           {"Abs", algorithm::eltwise_abs},
      {"HardSwish", algorithm::eltwise_hardswish}, {"Gelu", algorithm::eltwise_gelu_erf}};
  if (auto it = simple.find(op.type); it != simple.end()) {
    spec = {it->second, 0.f, 0.f};
    return true;
  }
  if (op.type == "Elu")
    spec = {algorithm::eltwise_elu, a.getFloat("alpha", 1.f), 0.f};
  else if (op.type == "LeakyRelu")
    spec = {algorithm::eltwise_relu, a.getFloat("alpha", 0.01f), 0.f};
  else if (op.type == "Softplus")
    spec = {algorithm::eltwise_soft_relu, 1.f, 0.f};
  else if (op.type == "Neg")
    spec = {algorithm::eltwise_linear, -1.f, 0.f};
  else if (op.type == "Clip") { // constant bounds (ReLU6) only: the reference reads fed ones
    float bound[2] = {-std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity()};
    for (size_t i : {1, 2}) {
      if (op.inputCount() <= i || !op.hasInput(i)) continue;
      const ir::Tensor &t = op.input(i);
      if (!t.isConst() || t.info().elementCount() != 1 || !isFloatingPoint(t.info().dataType())) return false;
      bound[i - 1] = static_cast<float>(t.data()->valueAsDouble(0));
    }
    if (!(bound[0] <= bound[1])) return false; // min > max: everything is max, as the reference does
    spec = {algorithm::eltwise_clip_v2, bound[0], bound[1]};
  } else
    return false;
  return true;
}

/// HardSigmoid, max(0, min(1, alpha·x + beta)): oneDNN 2.6 has no such eltwise, so a linear
/// one and a clip to [0, 1] over the result in place.
class HardSigmoidKernel : public Kernel {
public:
  explicit HardSigmoidKernel(const ir::Op &op) {
    auto md = dnnl_util::plainDesc(op.inInfo(0), 1);
    auto &eng = dnnl_util::engine();
    auto linear = eltwise_forward::primitive_desc(
        eltwise_forward::desc(prop_kind::forward_inference, algorithm::eltwise_linear, md,
                              op.attrs.getFloat("alpha", 0.2f), op.attrs.getFloat("beta", 0.5f)),
        eng);
    auto clip = eltwise_forward::primitive_desc(
        eltwise_forward::desc(prop_kind::forward_inference, algorithm::eltwise_clip_v2, md, 0.f, 1.f), eng);
    linear_ = eltwise_forward(linear);
    clip_ = eltwise_forward(clip);
    x_ = memory(md, eng, DNNL_MEMORY_NONE);
    y_ = memory(md, eng, DNNL_MEMORY_NONE);
  }
  void run(const KernelArgs &args) override {
    x_.set_data_handle(const_cast<void *>(args.inputs[0]));
    y_.set_data_handle(args.outputs[0]);
    dnnl_util::execute(linear_, linearArgs_, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_DST, y_}});
    dnnl_util::execute(clip_, clipArgs_, {{DNNL_ARG_SRC, y_}, {DNNL_ARG_DST, y_}});
  }
  int inPlaceInput() const override { return 0; } // each element is read before it is written

private:
  primitive linear_, clip_;
  std::vector<dnnl_exec_arg_t> linearArgs_, clipArgs_;
  memory x_, y_;
};

/// Why a one-input op of \p op's type and shape is not oneDNN's: not one floating-point type
/// oneDNN knows, or empty ("" if neither).
std::string notFloatOrEmpty(const ir::Op &op) {
  if (!dnnl_util::dnnlType(op.inInfo(0).dataType()))
    return std::string("input is ") + toString(op.inInfo(0).dataType());
  if (op.outInfo(0).dataType() != op.inInfo(0).dataType())
    return "output is " + toString(op.outInfo(0).dataType()) + ", input " + toString(op.inInfo(0).dataType());
  if (op.inInfo(0).elementCount() == 0) return "empty input";
  return "";
}

/// Whether oneDNN has a forward eltwise \p alg for \p op's input type (always for f32).
Support eltwiseImplemented(const ir::Op &op, algorithm alg, float alpha, float beta) {
  memory::data_type type = dnnl_util::dnnlType(op.inInfo(0));
  if (type == memory::data_type::f32) return Support::yes();
  auto md = dnnl_util::plainDesc(op.inInfo(0), 1);
  eltwise_forward::primitive_desc pd(eltwise_forward::desc(prop_kind::forward_inference, alg, md, alpha, beta),
                                     dnnl_util::engine(), true);
  return dnnl_util::implementationFor(pd, "eltwise", type);
}

Support supportsHardSigmoid(const ir::Op &op) {
  if (std::string why = notFloatOrEmpty(op); !why.empty()) return Support::no(why);
  return eltwiseImplemented(op, algorithm::eltwise_linear, 1.f, 0.f);
}

Support supportsEltwise(const ir::Op &op) {
  if (std::string why = notFloatOrEmpty(op); !why.empty()) return Support::no(why);
  EltwiseSpec spec;
  if (!eltwiseSpec(op, spec)) return Support::no("no oneDNN eltwise algorithm for these attributes");
  return eltwiseImplemented(op, spec.alg, spec.alpha, spec.beta);
}

std::unique_ptr<Kernel> createEltwise(const ir::Op &op) {
  EltwiseSpec spec{};
  eltwiseSpec(op, spec);
  auto md = dnnl_util::plainDesc(op.inInfo(0), 1);
  auto pd = eltwise_forward::primitive_desc(
      eltwise_forward::desc(prop_kind::forward_inference, spec.alg, md, spec.alpha, spec.beta), dnnl_util::engine());
  return std::make_unique<dnnl_util::SrcDstKernel>(eltwise_forward(pd), md, md, true); // may run in place
}

algorithm binaryAlgorithm(const std::string &type) {
  if (type == "Add") return algorithm::binary_add;
  if (type == "Sub") return algorithm::binary_sub;
  if (type == "Mul") return algorithm::binary_mul;
  if (type == "Div") return algorithm::binary_div;
  if (type == "Max") return algorithm::binary_max;
  return algorithm::binary_min;
}

Support supportsBinary(const ir::Op &op) {
  if (op.inputCount() != 2) return Support::no("not two inputs");
  if (std::string why = dnnl_util::notOneFloatType(op); !why.empty()) return Support::no(why);
  if (op.outInfo(0).elementCount() == 0) return Support::no("empty output");
  // oneDNN broadcasts src1 only: src0 must already have the output shape.
  const Shape &out = op.outInfo(0).shape();
  if (op.inInfo(0).shape() != out && op.inInfo(1).shape() != out)
    return Support::no("both inputs broadcast (oneDNN broadcasts one)");
  if (op.type == "Max" || op.type == "Min") return Support::no("oneDNN's NaN propagation differs from ONNX's");
  return Support::yes();
}

class BinaryKernel : public Kernel {
public:
  explicit BinaryKernel(const ir::Op &op) {
    const Shape &out = op.outInfo(0).shape();
    size_t rank = std::max<size_t>(out.size(), 1);
    swapped_ = op.inInfo(0).shape() != out;
    algorithm alg = binaryAlgorithm(op.type);
    auto md0 = dnnl_util::plainDesc(op.inInfo(swapped_ ? 1 : 0), rank);
    auto md1 = dnnl_util::plainDesc(op.inInfo(swapped_ ? 0 : 1), rank);
    auto mdOut = dnnl_util::plainDesc(op.outInfo(0), rank);
    auto pd = binary::primitive_desc(binary::desc(alg, md0, md1, mdOut), dnnl_util::engine());
    prim_ = binary(pd);
    a_ = memory(md0, dnnl_util::engine(), DNNL_MEMORY_NONE);
    b_ = memory(md1, dnnl_util::engine(), DNNL_MEMORY_NONE);
    y_ = memory(mdOut, dnnl_util::engine(), DNNL_MEMORY_NONE);
  }
  void run(const KernelArgs &args) override {
    a_.set_data_handle(const_cast<void *>(args.inputs[swapped_ ? 1 : 0]));
    b_.set_data_handle(const_cast<void *>(args.inputs[swapped_ ? 0 : 1]));
    y_.set_data_handle(args.outputs[0]);
    dnnl_util::execute(prim_, args_, {{DNNL_ARG_SRC_0, a_}, {DNNL_ARG_SRC_1, b_}, {DNNL_ARG_DST, y_}});
  }
  int inPlaceInput() const override { return swapped_ ? 1 : 0; } // oneDNN's binary: dst over src0

private:
  bool swapped_ = false;
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory a_, b_, y_;
};

Support supportsBinaryKernel(const ir::Op &op) {
  if (Support s = supportsBinary(op); !s) return s;
  // Sub and Div are not commutative: need input 0 at the output shape.
  if ((op.type == "Sub" || op.type == "Div") && op.inInfo(0).shape() != op.outInfo(0).shape())
    return Support::no("input 0 broadcasts (Sub and Div do not commute)");
  // oneDNN 2.6 runs some broadcasts (over a middle axis) in its reference code, 25× slower than
  // a loop: the fast family's broadcast kernel (backend_cpu/fast/broadcast.cpp) takes those.
  const Shape &out = op.outInfo(0).shape();
  size_t rank = std::max<size_t>(out.size(), 1);
  bool swapped = op.inInfo(0).shape() != out;
  auto pd = binary::primitive_desc(
      binary::desc(binaryAlgorithm(op.type), dnnl_util::plainDesc(op.inInfo(swapped ? 1 : 0), rank),
                   dnnl_util::plainDesc(op.inInfo(swapped ? 0 : 1), rank), dnnl_util::plainDesc(op.outInfo(0), rank)),
      dnnl_util::engine(), true);
  memory::data_type type = dnnl_util::dnnlType(op.outInfo(0));
  if (!pd && type != memory::data_type::f32) return dnnl_util::noImplementation("binary", type);
  if (!pd) return Support::no("oneDNN has no binary primitive for these shapes");
  if (dnnl_util::implIs(pd, "ref"))
    return Support::no("oneDNN would run its reference code (the broadcast loop is faster)");
  return Support::yes();
}

/// Pow with a constant scalar exponent: oneDNN's eltwise_pow (x^beta).
Support supportsPow(const ir::Op &op) {
  if (op.inputCount() != 2) return Support::no("not two inputs");
  if (std::string why = notFloatOrEmpty(op); !why.empty()) return Support::no(why);
  const ir::Tensor &e = op.input(1);
  if (!e.isConst() || e.info().elementCount() != 1 || !isFloatingPoint(e.info().dataType()))
    return Support::no("exponent not a constant floating-point scalar");
  if (op.outInfo(0).shape() != op.inInfo(0).shape()) return Support::no("the exponent broadcasts the base");
  return eltwiseImplemented(op, algorithm::eltwise_pow, 1.f, static_cast<float>(e.data()->valueAsDouble(0)));
}

std::unique_ptr<Kernel> createPow(const ir::Op &op) {
  auto exponent = static_cast<float>(op.input(1).data()->valueAsDouble(0));
  auto md = dnnl_util::plainDesc(op.inInfo(0), 1);
  auto pd = eltwise_forward::primitive_desc(
      eltwise_forward::desc(prop_kind::forward_inference, algorithm::eltwise_pow, md, 1.f, exponent),
      dnnl_util::engine());
  return std::make_unique<dnnl_util::SrcDstKernel>(eltwise_forward(pd), md, md, true); // may run in place
}

/// Sum and Mean of same-shape inputs: oneDNN's sum primitive (scales 1 or 1/n). The gradient of a
/// tensor with several consumers is such a Sum.
Support supportsSum(const ir::Op &op) {
  if (op.inputCount() < 2) return Support::no("fewer than two inputs");
  if (op.outInfo(0).elementCount() == 0) return Support::no("empty output");
  for (size_t i = 0; i < op.inputCount(); ++i)
    if (!op.hasInput(i) || op.inInfo(i).shape() != op.outInfo(0).shape())
      return Support::no("input " + std::to_string(i) + " broadcasts");
  if (std::string why = dnnl_util::notOneFloatType(op); !why.empty()) return Support::no(why);
  memory::data_type type = dnnl_util::dnnlType(op.outInfo(0));
  if (type == memory::data_type::f32) return Support::yes();
  auto md = dnnl_util::plainDesc(op.outInfo(0), 1);
  std::vector<float> scales(op.inputCount(), 1.f);
  std::vector<memory::desc> srcs(op.inputCount(), md);
  dnnl_primitive_desc_t pd = nullptr; // the C API: the C++ one throws where no implementation exists
  std::vector<dnnl_memory_desc_t> cSrcs(srcs.size());
  for (size_t i = 0; i < srcs.size(); ++i)
    cSrcs[i] = srcs[i].data;
  dnnl_status_t status = dnnl_sum_primitive_desc_create(&pd, &md.data, static_cast<int>(srcs.size()), scales.data(),
                                                        cSrcs.data(), nullptr, dnnl_util::engine().get());
  if (status != dnnl_success) return dnnl_util::noImplementation("sum", type);
  std::string impl;
  const char *info = nullptr;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, static_cast<void *>(&info)) == dnnl_success && info)
    impl = info;
  dnnl_primitive_desc_destroy(pd);
  if (impl.rfind("ref", 0) == 0)
    return Support::no(std::string("oneDNN 2.6 has only its reference ") + dnnl_util::dnnlTypeName(type) +
                       " sum on this CPU");
  return Support::yes();
}

class SumKernel : public Kernel {
public:
  explicit SumKernel(const ir::Op &op) {
    auto md = dnnl_util::plainDesc(op.outInfo(0), 1);
    size_t n = op.inputCount();
    std::vector<float> scales(n, op.type == "Mean" ? 1.0f / static_cast<float>(n) : 1.0f);
    std::vector<memory::desc> srcs(n, md);
    auto pd = sum::primitive_desc(md, scales, srcs, dnnl_util::engine());
    prim_ = sum(pd);
    for (size_t i = 0; i <= n; ++i) // the sources, then the destination
      mems_.push_back(memory(md, dnnl_util::engine(), DNNL_MEMORY_NONE));
    for (size_t i = 0; i < n; ++i)
      args_.push_back({DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i), mems_[i].get()});
    args_.push_back({DNNL_ARG_DST, mems_.back().get()});
  }
  void run(const KernelArgs &args) override {
    for (size_t i = 0; i + 1 < mems_.size(); ++i)
      mems_[i].set_data_handle(const_cast<void *>(args.inputs[i]));
    mems_.back().set_data_handle(args.outputs[0]);
    dnnl::error::wrap_c_api(
        dnnl_primitive_execute(prim_.get(), dnnl_util::stream().get(), static_cast<int>(args_.size()), args_.data()),
        "could not execute a primitive");
    dnnl_util::stream().wait();
  }
  int inPlaceInput() const override { return 0; } // oneDNN's sum: dst over src 0

private:
  primitive prim_;
  std::vector<memory> mems_;
  std::vector<dnnl_exec_arg_t> args_;
};

} // namespace

void registerDnnlElementwiseKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "Pow", KernelProvider::Dnnl, supportsPow, createPow});
  r.add({"ai.onnx", "Sum", KernelProvider::Dnnl, supportsSum, makeKernel<SumKernel>});
  r.add({"ai.onnx", "Mean", KernelProvider::Dnnl, supportsSum, makeKernel<SumKernel>});
  for (const char *t :
       {"Relu", "Tanh", "Sigmoid", "Exp", "Sqrt", "Abs", "HardSwish", "Elu", "LeakyRelu", "Softplus", "Neg", "Clip"})
    r.add({"ai.onnx", t, KernelProvider::Dnnl, supportsEltwise, createEltwise});
  r.add({"ai.onnx", "HardSigmoid", KernelProvider::Dnnl, supportsHardSigmoid, makeKernel<HardSigmoidKernel>});
  r.add({"ai.graphcore", "Gelu", KernelProvider::Dnnl, supportsEltwise, createEltwise});
  for (const char *t : {"Add", "Sub", "Mul", "Div"})
    r.add({"ai.onnx", t, KernelProvider::Dnnl, supportsBinaryKernel, makeKernel<BinaryKernel>});
}

} // namespace popart::backend_cpu
