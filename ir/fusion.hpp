#pragma once
// What the fusion passes fold into an op, as typed fields on ir::Op (Op::fusion): a bias, a
// residual, a scale, an activation, a max pool, and a MatMul's operand and result layouts. The
// kernels read these fields; the verifier (ir/verify.cpp) checks them against the op's OpDef
// (OpDef::fusionFields). No string attributes: a misspelt field fails to compile.

#include <popart/tensorinfo.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace popart::ir {

class Op;

/// A max pool that fuseConvPool moved into the Conv before it: its kernel, strides and pads
/// (begin..., end...; explicit, no dilation, floor rounding), and the shape of the convolution's
/// own result (\p input).
struct FusedPool {
  std::vector<int64_t> kernel, strides, pads;
  Shape input;
  /// The pooled shape; throws naming \p op if a window does not fit (ir/ops/window.cpp).
  Shape output(const Op &op) const;
  bool operator==(const FusedPool &) const = default;
};

/// The activation an op applies to its result (fuseRelu, fuseBatchNormRelu, fuseConvActivation)
/// or, on MaxPoolGrad (fuseMaxPoolGradRelu), the Relu whose gradient it applies.
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
  float alpha = 0.f; ///< Clip's lower bound, HardSigmoid's slope; 0 for the others
  float beta = 0.f;  ///< Clip's upper bound, HardSigmoid's offset; 0 for the others

  bool operator==(const FusedActivation &) const = default;
  /// True for kinds with parameters (alpha, beta).
  static bool parameterised(Kind k) { return k == Kind::Clip || k == Kind::HardSigmoid; }
  /// "Relu", "Clip"...; "" for None.
  static const char *name(Kind k);

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

/// A fused computation's typed fields, set by the fusion passes and read by the kernels: the
/// verifier checks that an op carries only the fields its OpDef declares (OpDef::fusionFields)
/// and that their values fit its inputs.
struct Fusion {
  /// MatMul (fuseMatMulBias): input 2 is a bias of the output's last dimension.
  bool bias = false;
  /// MatMul (fuseMatMulResidual), Conv (fuseConvResidual): input 3, of the output's shape, is
  /// added (a MatMul's after its activation, a Conv's before it).
  bool residual = false;
  /// MatMul (fuseMatMulScale): the product times this, a finite non-zero constant.
  std::optional<float> scale;
  /// Conv (fuseConvPool): the max pool applied to the convolution's result.
  std::optional<FusedPool> pool;
  /// Conv (any kind), MatMul, Gemm, BatchNormalization, MaxPoolGrad (Relu only): applied after
  /// the bias and, for a Conv, after the residual.
  FusedActivation activation;
  /// MatMul (foldTransposesIntoMatMul; a Gemm rewritten by fuseMatMulResidual): operand A / B
  /// is read with its last two axes swapped (after permA / permB).
  bool transA = false, transB = false;
  /// MatMul (foldTransposesIntoMatMul): logical axis j of operand A / B is stored axis
  /// permA[j] / permB[j]; the stored output is Transpose(product, permY), which keeps the last
  /// axis last. Empty: the identity (ir/ops/matmul_layout.hpp).
  std::vector<int64_t> permA, permB, permY;
  /// MatMul (foldCastIntoMatMul): a product of 16-bit operands written in FLOAT, the Cast that
  /// followed it folded in (the kernel rounds once, to fp32, instead of to 16 bits and back).
  std::optional<DataType> outputType;

  bool operator==(const Fusion &) const = default;
  /// True when no field is set (an unfused op).
  bool empty() const { return *this == Fusion{}; }
  /// True if the op applies a fused activation of any kind.
  bool activated() const { return activation.kind != FusedActivation::Kind::None; }
  /// True if the op applies a fused Relu (the only activation MatMul, Gemm, BatchNormalization
  /// and MaxPoolGrad take).
  bool relu() const { return activation.kind == FusedActivation::Kind::Relu; }
  /// True if any of permA, permB, permY is set.
  bool permuted() const { return !permA.empty() || !permB.empty() || !permY.empty(); }
  /// "bias residual scale=0.125 relu transA permY=[0,2,1,3] pool(...)", for Graph::dump; ""
  /// when empty().
  std::string toString() const;
};

/// The fields of Fusion, as bits of OpDef::fusionFields.
enum class FusionField : uint32_t {
  Scale = 1u << 0,
  Bias = 1u << 1,
  Residual = 1u << 2,
  Pool = 1u << 3,
  Relu = 1u << 4,       ///< activation of kind Relu
  Activation = 1u << 5, ///< activation of any kind (implies Relu)
  Transpose = 1u << 6,  ///< transA, transB
  Permute = 1u << 7,    ///< permA, permB, permY
  OutputType = 1u << 8, ///< outputType
};

/// The name of \p field in dumps and verifier messages ("scale").
const char *fusionFieldName(FusionField field);

/// Bits of OpDef::fusionFields for \p fields.
constexpr uint32_t fusionFieldBits(std::initializer_list<FusionField> fields) {
  uint32_t bits = 0;
  for (FusionField f : fields)
    bits |= static_cast<uint32_t>(f);
  return bits;
}

} // namespace popart::ir
