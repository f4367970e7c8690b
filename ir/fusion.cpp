// Fusion's names and dump form (fusion.hpp).

#include "ir/fusion.hpp"

#include <charconv>

namespace popart::ir {

const char *FusedActivation::name(Kind k) {
  switch (k) {
  case Kind::Relu: return "Relu";
  case Kind::Clip: return "Clip";
  case Kind::HardSigmoid: return "HardSigmoid";
  case Kind::HardSwish: return "HardSwish";
  case Kind::Sigmoid: return "Sigmoid";
  case Kind::Swish: return "Swish";
  case Kind::None: break;
  }
  return "";
}

const char *fusionFieldName(FusionField field) {
  switch (field) {
  case FusionField::Scale: return "scale";
  case FusionField::Bias: return "bias";
  case FusionField::Residual: return "residual";
  case FusionField::Pool: return "pool";
  case FusionField::Relu: return "relu";
  case FusionField::Activation: return "activation";
  case FusionField::Transpose: return "transpose";
  case FusionField::Permute: return "permute";
  case FusionField::OutputType: return "outputType";
  }
  return "?";
}

/// \p v in its shortest form that reads back exactly.
static std::string shortest(float v) {
  char buf[32];
  auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  return std::string(buf, end);
}

std::string Fusion::toString() const {
  std::string s;
  auto add = [&](const std::string &part) { s += (s.empty() ? "" : " ") + part; };
  if (bias) add("bias");
  if (residual) add("residual");
  if (scale) add("scale=" + shortest(*scale));
  if (activation.kind != FusedActivation::Kind::None) {
    std::string a = FusedActivation::name(activation.kind);
    if (FusedActivation::parameterised(activation.kind))
      a += "(" + shortest(activation.alpha) + "," + shortest(activation.beta) + ")";
    add(a);
  }
  if (transA) add("transA");
  if (transB) add("transB");
  if (!permA.empty()) add("permA=" + popart::toString(permA));
  if (!permB.empty()) add("permB=" + popart::toString(permB));
  if (!permY.empty()) add("permY=" + popart::toString(permY));
  if (outputType) add("out=" + popart::toString(*outputType));
  if (pool)
    add("pool(kernel " + popart::toString(pool->kernel) + " strides " + popart::toString(pool->strides) + " pads " +
        popart::toString(pool->pads) + " of " + popart::toString(pool->input) + ")");
  return s;
}

} // namespace popart::ir
