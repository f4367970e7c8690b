// A LeakyRelu-style activation as a custom-op plugin: y = x where x >= 0, alpha·x elsewhere, in the
// domain "com.example", with a dedicated grad op (LeakyReluGrad: dX = dY where x >= 0, alpha·dY
// elsewhere) that has its own kernel. Written as a user would, against <popart/custom_op.hpp> only.

#include <popart/custom_op.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace {

constexpr const char *kDomain = "com.example";

/// FLOAT and DOUBLE only: the kernels are templates over those two.
std::string floatingInput(const popart::CustomOpNode &node) {
  popart::DataType t = node.inputs[0].dataType();
  if (t == popart::DataType::FLOAT || t == popart::DataType::DOUBLE) return {};
  return node.type + " takes FLOAT or DOUBLE, not " + popart::toString(t);
}

/// Output 0 has input 0's type and shape.
std::vector<popart::TensorInfo> likeInput0(const popart::CustomOpNode &node) { return {node.inputs[0]}; }

/// y = x where x >= 0, alpha·x elsewhere.
template <typename T> class LeakyReluKernel final : public popart::CustomKernel {
public:
  explicit LeakyReluKernel(T alpha) : alpha_(alpha) {}
  void run(const popart::CustomKernelRun &r) override {
    auto x = r.input<T>(0);
    auto y = r.output<T>(0);
    const T alpha = alpha_;
    r.parallelFor(x.size, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        y[i] = x[i] >= T(0) ? x[i] : alpha * x[i];
    });
  }

private:
  T alpha_;
};

/// dX = dY where x >= 0, alpha·dY elsewhere; inputs {X, dY}.
template <typename T> class LeakyReluGradKernel final : public popart::CustomKernel {
public:
  explicit LeakyReluGradKernel(T alpha) : alpha_(alpha) {}
  void run(const popart::CustomKernelRun &r) override {
    auto x = r.input<T>(0);
    auto dy = r.input<T>(1);
    auto dx = r.output<T>(0);
    const T alpha = alpha_;
    r.parallelFor(x.size, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        dx[i] = x[i] >= T(0) ? dy[i] : alpha * dy[i];
    });
  }

private:
  T alpha_;
};

/// Kernel<float> or Kernel<double> for the node's input type, given alpha.
template <template <typename> class Kernel>
std::unique_ptr<popart::CustomKernel> makeKernel(const popart::CustomOpNode &node) {
  auto alpha = node.attribute<float>("alpha");
  if (node.inputs[0].dataType() == popart::DataType::DOUBLE) return std::make_unique<Kernel<double>>(alpha);
  return std::make_unique<Kernel<float>>(alpha);
}

popart::CustomOpDef leakyRelu() {
  popart::CustomOpDef def;
  def.domain = kDomain;
  def.type = "LeakyRelu";
  def.attributes = {{"alpha", popart::CustomAttributeKind::Float, popart::CustomAttributeValue(0.01f)}};
  def.inferShapes = likeInput0;
  def.supports = floatingInput;
  def.kernel = makeKernel<LeakyReluKernel>;
  def.gradient = [](popart::CustomGradBuilder &g) {
    if (g.outputGrad(0).empty()) return;
    popart::CustomAttributes alpha{{"alpha", g.node().attribute<float>("alpha")}};
    g.setInputGrad(0, g.addOp("LeakyReluGrad", {g.input(0), g.outputGrad(0)}, alpha, kDomain, 1, 1)[0]);
  };
  return def;
}

popart::CustomOpDef leakyReluGrad() {
  popart::CustomOpDef def;
  def.domain = kDomain;
  def.type = "LeakyReluGrad";
  def.minInputs = def.maxInputs = 2;
  def.attributes = {{"alpha", popart::CustomAttributeKind::Float, popart::CustomAttributeValue(0.01f)}};
  def.inferShapes = [](const popart::CustomOpNode &node) -> std::vector<popart::TensorInfo> {
    if (node.inputs[0] != node.inputs[1])
      throw popart::error(node.name, ": X is ", node.inputs[0].toString(), " but dY is ", node.inputs[1].toString());
    return {node.inputs[0]};
  };
  def.supports = floatingInput;
  def.kernel = makeKernel<LeakyReluGradKernel>;
  return def;
}

} // namespace

POPART_CUSTOM_OP_LIBRARY(registrar) {
  registrar.addOp(leakyRelu());
  registrar.addOp(leakyReluGrad());
}
