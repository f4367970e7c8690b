// oneDNN kernels for elementwise ops: eltwise (unary) and binary with broadcasting, f32.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"

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
      {"Relu", algorithm::eltwise_relu},          {"Tanh", algorithm::eltwise_tanh},
      {"Sigmoid", algorithm::eltwise_logistic},   {"Exp", algorithm::eltwise_exp},
      {"Sqrt", algorithm::eltwise_sqrt},          {"Abs", algorithm::eltwise_abs},
      {"HardSwish", algorithm::eltwise_hardswish}};
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
  else
    return false;
  return true;
}

bool supportsEltwise(const ir::Op &op) {
  EltwiseSpec spec;
  return op.inInfo(0).dataType() == DataType::FLOAT && op.inInfo(0).elementCount() > 0 && eltwiseSpec(op, spec);
}

std::unique_ptr<Kernel> createEltwise(const ir::Op &op) {
  EltwiseSpec spec{};
  eltwiseSpec(op, spec);
  auto md = dnnl_util::plainDesc(op.inInfo(0).shape(), 1);
  auto pd = eltwise_forward::primitive_desc(
      eltwise_forward::desc(prop_kind::forward_inference, spec.alg, md, spec.alpha, spec.beta), dnnl_util::engine());
  return std::make_unique<dnnl_util::SrcDstKernel>(eltwise_forward(pd), md, md);
}

algorithm binaryAlgorithm(const std::string &type) {
  if (type == "Add") return algorithm::binary_add;
  if (type == "Sub") return algorithm::binary_sub;
  if (type == "Mul") return algorithm::binary_mul;
  if (type == "Div") return algorithm::binary_div;
  if (type == "Max") return algorithm::binary_max;
  return algorithm::binary_min;
}

bool supportsBinary(const ir::Op &op) {
  if (op.inputCount() != 2) return false;
  if (op.inInfo(0).dataType() != DataType::FLOAT || op.inInfo(1).dataType() != DataType::FLOAT) return false;
  if (op.outInfo(0).elementCount() == 0) return false;
  // oneDNN broadcasts src1 only: src0 must already have the output shape.
  const Shape &out = op.outInfo(0).shape();
  if (op.inInfo(0).shape() != out && op.inInfo(1).shape() != out) return false;
  if (op.type == "Max" || op.type == "Min") return false; // NaN propagation differs from ONNX
  return true;
}

class BinaryKernel : public Kernel {
public:
  explicit BinaryKernel(const ir::Op &op) {
    const Shape &out = op.outInfo(0).shape();
    size_t rank = std::max<size_t>(out.size(), 1);
    swapped_ = op.inInfo(0).shape() != out;
    algorithm alg = binaryAlgorithm(op.type);
    auto md0 = dnnl_util::plainDesc(op.inInfo(swapped_ ? 1 : 0).shape(), rank);
    auto md1 = dnnl_util::plainDesc(op.inInfo(swapped_ ? 0 : 1).shape(), rank);
    auto mdOut = dnnl_util::plainDesc(out, rank);
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

private:
  bool swapped_ = false;
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory a_, b_, y_;
};

bool supportsBinaryKernel(const ir::Op &op) {
  if (!supportsBinary(op)) return false;
  // Sub and Div are not commutative: need input 0 at the output shape.
  if ((op.type == "Sub" || op.type == "Div") && op.inInfo(0).shape() != op.outInfo(0).shape()) return false;
  return true;
}

} // namespace

void registerDnnlElementwiseKernels(KernelRegistry &r) {
  for (const char *t :
       {"Relu", "Tanh", "Sigmoid", "Exp", "Sqrt", "Abs", "HardSwish", "Elu", "LeakyRelu", "Softplus", "Neg"})
    r.add({"ai.onnx", t, KernelProvider::Dnnl, supportsEltwise, createEltwise});
  for (const char *t : {"Add", "Sub", "Mul", "Div"})
    r.add({"ai.onnx", t, KernelProvider::Dnnl, supportsBinaryKernel, makeKernel<BinaryKernel>});
}

} // namespace popart::backend_cpu
