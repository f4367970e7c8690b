#pragma once
// The activation a Conv applies to its result (fuseRelu, fuseConvActivation): attribute
// popart_activation names it, popart_activation_alpha and popart_activation_beta hold its
// parameters. Kernels apply it after the bias and any fused residual.

#include "ir/op.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cmath>
#include <string>

namespace popart::ir {

/// A Conv's fused activation.
struct FusedActivation {
  enum class Kind {
    None,
    Relu,        ///< max(x, 0)
    Clip,        ///< min(max(x, alpha), beta)
    HardSigmoid, ///< max(0, min(1, alpha·x + beta))
    HardSwish,   ///< x · max(0, min(1, x/6 + 1/2))
    Sigmoid,     ///< 1 / (1 + e^−x)
    Swish,       ///< x · sigmoid(x) (SiLU)
  };
  Kind kind = Kind::None;
  float alpha = 0.f;
  float beta = 0.f;

  /// \returns the name popart_activation holds for \p k.
  static const char *name(Kind k) {
    switch (k) {
    case Kind::Relu: return "Relu";
    case Kind::Clip: return "Clip";
    case Kind::HardSigmoid: return "HardSigmoid";
    case Kind::HardSwish: return "HardSwish";
    case Kind::Sigmoid: return "Sigmoid";
    case Kind::Swish: return "Swish";
    default: return "";
    }
  }

  /// Writes this activation into \p attrs (popart_activation and, where it has them, its parameters).
  void store(Attributes &attrs) const {
    attrs.set("popart_activation", std::string(name(kind)));
    if (kind == Kind::Clip || kind == Kind::HardSigmoid) {
      attrs.set("popart_activation_alpha", alpha);
      attrs.set("popart_activation_beta", beta);
    }
  }

  /// \p x activated, computed in \p C (the reference kernels' compute type).
  template <typename C> C apply(C x) const {
    switch (kind) {
    case Kind::Relu: return x < C(0) ? C(0) : x; // NaN stays NaN, as ONNX Relu keeps it
    case Kind::Clip: return std::min(std::max(x, C(alpha)), C(beta));
    case Kind::HardSigmoid: return std::max(C(0), std::min(C(1), C(alpha) * x + C(beta)));
    case Kind::HardSwish: return x * std::max(C(0), std::min(C(1), x / C(6) + C(0.5)));
    case Kind::Sigmoid: return C(1) / (C(1) + std::exp(-x));
    case Kind::Swish: return x / (C(1) + std::exp(-x));
    default: return x;
    }
  }
};

/// \p op's fused activation (Kind::None without popart_activation); throws naming \p op for an
/// unknown name or missing parameters.
inline FusedActivation fusedActivation(const Op &op) {
  FusedActivation a;
  if (!op.attrs.has("popart_activation")) return a;
  const std::string n = op.attrs.getString("popart_activation");
  using K = FusedActivation::Kind;
  for (K k : {K::Relu, K::Clip, K::HardSigmoid, K::HardSwish, K::Sigmoid, K::Swish})
    if (n == FusedActivation::name(k)) a.kind = k;
  if (a.kind == K::None)
    throw error(op.debugName(), ": popart_activation '", n,
                "' is not one of Relu, Clip, HardSigmoid, HardSwish, Sigmoid, Swish");
  if (a.kind == K::Clip || a.kind == K::HardSigmoid) {
    if (!op.attrs.has("popart_activation_alpha") || !op.attrs.has("popart_activation_beta"))
      throw error(op.debugName(), ": popart_activation ", n, " needs popart_activation_alpha and _beta");
    a.alpha = op.attrs.getFloat("popart_activation_alpha");
    a.beta = op.attrs.getFloat("popart_activation_beta");
  }
  return a;
}

} // namespace popart::ir
