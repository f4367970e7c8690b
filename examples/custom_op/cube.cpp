// A custom op whose gradient is a composition of existing ops: Cube, y = scale·x³ in the domain
// "com.example"; dX = dY · (3·scale) · x · x, built from ai.onnx Mul ops. Written as a user
// would, against <popart/custom_op.hpp> only.

#include <popart/custom_op.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace {

/// y = scale·x³.
template <typename T> class CubeKernel final : public popart::CustomKernel {
public:
  explicit CubeKernel(T scale) : scale_(scale) {}
  void run(const popart::CustomKernelRun &r) override {
    auto x = r.input<T>(0);
    auto y = r.output<T>(0);
    const T scale = scale_;
    r.parallelFor(x.size, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        y[i] = scale * x[i] * x[i] * x[i];
    });
  }

private:
  T scale_;
};

popart::CustomOpDef cube() {
  popart::CustomOpDef def;
  def.domain = "com.example";
  def.type = "Cube";
  def.attributes = {{"scale", popart::CustomAttributeKind::Float, popart::CustomAttributeValue(1.0f)}};
  def.inferShapes = [](const popart::CustomOpNode &node) { return std::vector<popart::TensorInfo>{node.inputs[0]}; };
  def.supports = [](const popart::CustomOpNode &node) -> std::string {
    popart::DataType t = node.inputs[0].dataType();
    if (t == popart::DataType::FLOAT || t == popart::DataType::DOUBLE) return {};
    return "Cube takes FLOAT or DOUBLE, not " + popart::toString(t);
  };
  def.kernel = [](const popart::CustomOpNode &node) -> std::unique_ptr<popart::CustomKernel> {
    auto scale = node.attribute<float>("scale");
    if (node.inputs[0].dataType() == popart::DataType::DOUBLE) return std::make_unique<CubeKernel<double>>(scale);
    return std::make_unique<CubeKernel<float>>(scale);
  };
  def.gradient = [](popart::CustomGradBuilder &g) {
    if (g.outputGrad(0).empty()) return;
    popart::TensorId x = g.input(0);
    popart::TensorId slope = g.add("Mul", {g.add("Mul", {x, x}), g.scalar(3.0 * g.node().attribute<float>("scale"))});
    g.setInputGrad(0, g.add("Mul", {g.outputGrad(0), slope}));
  };
  return def;
}

} // namespace

POPART_CUSTOM_OP_LIBRARY(registrar) { registrar.addOp(cube()); }
