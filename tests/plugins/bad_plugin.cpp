// Libraries that loading must refuse (or, for OVERRIDE_LEAKY_RELU, accept), one per BAD_* mode
// given at compile time (tests/CMakeLists.txt builds each): each names what is wrong with it.

#include <popart/custom_op.hpp>

#include <memory>
#include <string>

namespace {

/// A well-formed op of \p type in com.example (identity; its kernel is never run).
[[maybe_unused]] popart::CustomOpDef wellFormed(const std::string &type) {
  popart::CustomOpDef def;
  def.domain = "com.example";
  def.type = type;
  def.inferShapes = [](const popart::CustomOpNode &node) { return std::vector<popart::TensorInfo>{node.inputs[0]}; };
  def.kernel = [](const popart::CustomOpNode &) -> std::unique_ptr<popart::CustomKernel> { return nullptr; };
  return def;
}

} // namespace

#if defined(BAD_NO_ABI)
// Only the entry point: the ABI version symbol is missing.
extern "C" __attribute__((visibility("default"))) void popart_register_custom_ops(popart::CustomOpRegistrar &r) {
  r.addOp(wellFormed("NoAbi"));
}
#elif defined(BAD_WRONG_ABI)
extern "C" __attribute__((visibility("default"))) int popart_custom_op_abi_version() {
  return POPART_CUSTOM_OP_ABI_VERSION + 1;
}
extern "C" __attribute__((visibility("default"))) void popart_register_custom_ops(popart::CustomOpRegistrar &r) {
  r.addOp(wellFormed("WrongAbi"));
}
#elif defined(BAD_NO_ENTRY)
extern "C" __attribute__((visibility("default"))) int popart_custom_op_abi_version() {
  return POPART_CUSTOM_OP_ABI_VERSION;
}
#elif defined(BAD_MALFORMED)
// A good op, then one without a kernel: neither may be registered.
POPART_CUSTOM_OP_LIBRARY(r) {
  r.addOp(wellFormed("GoodBeforeMalformed"));
  popart::CustomOpDef def = wellFormed("NoKernel");
  def.kernel = nullptr;
  r.addOp(def);
}
#elif defined(BAD_RESERVED_DOMAIN)
POPART_CUSTOM_OP_LIBRARY(r) {
  popart::CustomOpDef def = wellFormed("Relu");
  def.domain = "ai.onnx";
  r.addOp(def);
}
#elif defined(BAD_DUPLICATE)
// com.example::LeakyRelu again, as libleaky_relu_op defines it, without override.
POPART_CUSTOM_OP_LIBRARY(r) { r.addOp(wellFormed("LeakyRelu")); }
#elif defined(OVERRIDE_LEAKY_RELU)
// com.example::LeakyRelu with override: replaces libleaky_relu_op's definition, with a kernel that
// doubles x (so that a test sees which one runs).
namespace {
class Double final : public popart::CustomKernel {
public:
  void run(const popart::CustomKernelRun &r) override {
    auto x = r.input<float>(0);
    auto y = r.output<float>(0);
    for (int64_t i = 0; i < x.size; ++i)
      y[i] = 2 * x[i];
  }
};
} // namespace
POPART_CUSTOM_OP_LIBRARY(r) {
  popart::CustomOpDef def = wellFormed("LeakyRelu");
  def.attributes = {{"alpha", popart::CustomAttributeKind::Float, popart::CustomAttributeValue(0.01f)}};
  def.kernel = [](const popart::CustomOpNode &) -> std::unique_ptr<popart::CustomKernel> {
    return std::make_unique<Double>();
  };
  def.override = true;
  r.addOp(def);
}
#elif defined(BAD_THROWS)
POPART_CUSTOM_OP_LIBRARY(r) {
  r.addOp(wellFormed("BeforeThrow"));
  throw popart::error("the plugin cannot find its configuration");
}
#elif defined(BAD_OVERRIDE_UNKNOWN)
POPART_CUSTOM_OP_LIBRARY(r) {
  popart::CustomKernelOverride k;
  k.domain = "ai.onnx";
  k.type = "NoSuchOp";
  k.kernel = [](const popart::CustomOpNode &) -> std::unique_ptr<popart::CustomKernel> { return nullptr; };
  r.overrideKernel(k);
}
#else
#error "give one BAD_* mode"
#endif
