// oneDNN MatMul, f32: the product as stored, or another way chosen by timing or forced by the
// session (MatMulOperands; matmul_tuning.hpp). Gemm is in gemm.cpp, the 1×1-convolution way in
// pointwise_product.cpp.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/dnnl/matmul_tuning.hpp"
#include "backend_cpu/dnnl/pointwise_product.hpp"
#include "core/log.hpp"
#include "core/tensordata.hpp"
#include "ir/ops/matmul_layout.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;
using matmul_tuning::fastestMs;
using matmul_tuning::kGain;
using matmul_tuning::kPointwiseGain;
using matmul_tuning::kTuneFlops;
using matmul_tuning::tunedWay;
using matmul_tuning::unblocked;

/// The descriptor of logical matrix batch \p shape (padded to \p rank) of \p type; \p transposed:
/// the buffer holds each matrix with its last two axes swapped, which the strides express.
memory::desc storedDesc(const Shape &shape, size_t rank, bool transposed,
                        memory::data_type type = memory::data_type::f32) {
  memory::desc plain = dnnl_util::plainDesc(shape, rank, type);
  if (!transposed) return plain;
  memory::dims dims = plain.dims(), swapped = dims;
  std::swap(swapped[rank - 1], swapped[rank - 2]);
  memory::dims strides = dnnl_util::plainStrides(swapped);
  std::swap(strides[rank - 1], strides[rank - 2]);
  return memory::desc(dims, type, strides);
}

/// \p md with its last two axes swapped: the transposed view of the same bytes.
memory::desc transposedView(const memory::desc &md) {
  std::vector<int> perm(static_cast<size_t>(md.data.ndims));
  for (size_t i = 0; i < perm.size(); ++i)
    perm[i] = static_cast<int>(i);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return md.permute_axes(perm);
}

/// Bytes rounded up to oneDNN's 64-byte alignment.
int64_t aligned64(size_t bytes) { return static_cast<int64_t>((bytes + 63) / 64 * 64); }

/// \p s padded in front to \p rank axes of size 1, as a desc of \p type with its strides.
memory::desc stridedDesc(const ir::StridedShape &s, size_t rank, memory::data_type type) {
  memory::dims dims(rank, 1), strides(rank, shapeElementCount(s.shape));
  size_t pad = rank - s.shape.size();
  for (size_t j = pad; j < rank; ++j) {
    dims[j] = s.shape[j - pad];
    strides[j] = s.strides[j - pad];
  }
  return memory::desc(dims, type, strides);
}

/// The product's operands as oneDNN sees them: logical shapes padded to one rank, and the
/// descriptors of A, B, the bias and Y in the op's types (strided where Fusion permutes).
struct MatMulLayout {
  Shape a, b, y;
  size_t rank = 0;
  bool ta = false, tb = false, permuted = false;
  memory::desc mdA, mdB, mdY, mdBias;
};

MatMulLayout matMulLayout(const ir::Op &op) {
  MatMulLayout l;
  // The logical operands (Fusion::transA/B and permA/B applied; matmul_layout.hpp).
  Shape &a = l.a, &b = l.b, &y = l.y;
  a = ir::matMulOperand(op, 0).shape, b = ir::matMulOperand(op, 1).shape;
  l.ta = op.fusion.transA && a.size() >= 2;
  l.tb = op.fusion.transB && b.size() >= 2;
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  size_t rank = l.rank = std::max(a.size(), b.size());
  while (a.size() < rank)
    a.insert(a.begin(), 1);
  while (b.size() < rank)
    b.insert(b.begin(), 1);
  y.assign(rank, 0);
  for (size_t i = 0; i + 2 < rank; ++i)
    y[i] = std::max(a[i], b[i]);
  y[rank - 2] = a[rank - 2];
  y[rank - 1] = b[rank - 1];
  memory::data_type typeA = dnnl_util::dnnlType(op.inInfo(0)), typeB = dnnl_util::dnnlType(op.inInfo(1));
  memory::data_type typeY = dnnl_util::dnnlType(op.outInfo(0));
  l.mdA = storedDesc(a, rank, l.ta, typeA);
  l.mdB = storedDesc(b, rank, l.tb, typeB);
  l.mdY = dnnl_util::plainDesc(y, rank, typeY);
  l.permuted = op.fusion.permuted(); // Fusion::permA/B/Y: every operand through its strides
  if (l.permuted) {
    l.mdA = stridedDesc(ir::matMulOperand(op, 0), rank, typeA);
    l.mdB = stridedDesc(ir::matMulOperand(op, 1), rank, typeB);
    l.mdY = stridedDesc(ir::matMulResult(op), rank, typeY);
  }
  if (op.hasInput(2)) { // fused by fuseMatMulBias: [N] broadcast over the rows
    Shape biasDims(rank, 1);
    biasDims.back() = y.back();
    l.mdBias = dnnl_util::plainDesc(biasDims, rank, dnnl_util::dnnlType(op.inInfo(2)));
  }
  return l;
}

/// The product's output scale and post-ops (Relu, then the residual, read as \p mdResidual);
/// \p residualArg gets the residual's argument index.
primitive_attr matMulAttr(const ir::Op &op, const memory::desc &mdResidual, int *residualArg = nullptr) {
  primitive_attr attr;
  float scale = op.fusion.scale.value_or(1.f); // fused by fuseMatMulScale (never with a bias)
  if (scale != 1.f) attr.set_output_scales(0, {scale});
  post_ops po;
  if (op.fusion.relu()) // fused by fuseRelu, after the bias
    po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
  if (op.hasInput(3)) { // fused by fuseMatMulResidual: added last
    if (residualArg) *residualArg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(po.len()) | DNNL_ARG_SRC_1;
    po.append_binary(algorithm::binary_add, mdResidual);
  }
  if (po.len() > 0) attr.set_post_ops(po);
  return attr;
}

/// The residual as the post-op reads it: Y's layout in the residual's type.
memory::desc residualDesc(const ir::Op &op, const memory::desc &mdY) {
  if (!op.hasInput(3)) return {};
  memory::desc md = mdY;
  md.data.data_type = static_cast<dnnl_data_type_t>(dnnl_util::dnnlType(op.inInfo(3)));
  return md;
}

Support supportsMatMul(const ir::Op &op) {
  // FLOAT16: oneDNN 2.6 has no f16 matmul on this CPU; the f16 kernel computes in f32 blocks (matmul_f16.cpp).
  if (op.inInfo(0).dataType() == DataType::FLOAT16) return supportsHalfMatMul(op);
  // 16-bit operands: Y, the bias and the residual in their type or FLOAT (fp32 accumulation).
  if (Support types = dnnl_util::productTypes(op, {2, 3}); !types) return types;
  DataType t = op.inInfo(0).dataType(), y = op.outInfo(0).dataType();
  auto type = dnnl_util::dnnlType(t);
  if (op.outInfo(0).elementCount() == 0) return Support::no("an empty result");
  size_t ra = op.inInfo(0).shape().size(), rb = op.inInfo(1).shape().size();
  if (ra < 1 || rb < 1 || std::max(ra, rb) > 12) return Support::no("a scalar operand or rank above 12");
  if (t == DataType::FLOAT && y == DataType::FLOAT) return Support::yes();
  MatMulLayout l = matMulLayout(op);
  matmul::primitive_desc pd(matmul::desc(l.mdA, l.mdB, l.mdBias, l.mdY), matMulAttr(op, residualDesc(op, l.mdY)),
                            dnnl_util::engine(), true);
  return dnnl_util::implementationFor(pd, "matmul", *type);
}

/// The ways timed against the stored one, in order.
constexpr MatMulOperands kTimedWays[] = {MatMulOperands::FlippedA,         MatMulOperands::FlippedB,
                                         MatMulOperands::ShiftedB,         MatMulOperands::Pointwise,
                                         MatMulOperands::Swapped,          MatMulOperands::SwappedCopy,
                                         MatMulOperands::FlippedPointwise, MatMulOperands::Unpermuted};
/// ShiftedB's offset of B in the scratch: 16 bytes off oneDNN's 64-byte alignment.
constexpr int64_t kShift = 16;

/// The data of a stored tensor (a Const's or a Variable's) holding at least \p bytes, or null.
const void *storedData(const ir::Tensor &t, size_t bytes) {
  const auto &data = t.data();
  return data && data->byteCount() >= 0 && static_cast<size_t>(data->byteCount()) >= bytes ? data->data() : nullptr;
}

class MatMulKernel : public Kernel {
public:
  MatMulKernel(const ir::Op &op, const KernelContext &context) {
    MatMulLayout l = matMulLayout(op);
    const Shape &a = l.a, &b = l.b, &y = l.y;
    const size_t rank = l.rank;
    const bool ta = l.ta, tb = l.tb, permuted = l.permuted;
    memory::desc mdA = l.mdA, mdB = l.mdB, mdY = l.mdY, mdBias = l.mdBias;
    // f32 throughout: the other ways (timed, or forced by the session) apply; 16-bit: as stored.
    const bool f32 = mdA.data_type() == memory::data_type::f32 && mdY.data_type() == memory::data_type::f32 &&
                     (!op.hasInput(2) || mdBias.data_type() == memory::data_type::f32) &&
                     (!op.hasInput(3) || op.inInfo(3).dataType() == DataType::FLOAT);
    if (permuted) {
      // Unpermuted's plain layouts of the permuted tensors (transposes stay strides).
      if (!op.fusion.permA.empty()) unpermuted_[0] = dnnl_util::plainDesc(a, rank);
      if (!op.fusion.permB.empty()) unpermuted_[1] = dnnl_util::plainDesc(b, rank);
      if (!op.fusion.permY.empty()) unpermuted_[2] = dnnl_util::plainDesc(y, rank);
    }
    hasBias_ = op.hasInput(2);                   // fused by fuseMatMulBias: [N] broadcast over the rows
    float scale = op.fusion.scale.value_or(1.f); // fused by fuseMatMulScale (never with a bias)
    hasResidual_ = op.hasInput(3);               // fused by fuseMatMulResidual: added last
    memory::desc mdResidual = residualDesc(op, mdY);
    primitive_attr attr = matMulAttr(op, mdResidual, &residualArg_);
    if (hasResidual_) r_ = memory(mdResidual, dnnl_util::engine(), DNNL_MEMORY_NONE);
    attr_ = attr;
    // Constant weights (inference) in the layout oneDNN prefers, packed once.
    auto make = [&](const memory::desc &src, const memory::desc &weights) {
      return matmul::primitive_desc(matmul::desc(src, weights, mdBias, mdY), attr, dnnl_util::engine());
    };
    bool constB = op.input(1).isConst();
    storedA_ = storedData(op.input(0), mdA.get_size());
    storedB_ = storedData(op.input(1), mdB.get_size());
    auto pd = make(mdA, constB ? dnnl_util::anyLayout(mdB) : mdB);
    if (constB && (dnnl_util::implIs(pd, "ref") || unblocked(pd.weights_desc()))) pd = make(mdA, mdB);
    prim_ = matmul(pd);
    a_ = memory(mdA, dnnl_util::engine(), DNNL_MEMORY_NONE);
    b_ = memory(mdB, dnnl_util::engine(), DNNL_MEMORY_NONE);
    y_ = memory(mdY, dnnl_util::engine(), DNNL_MEMORY_NONE);
    if (hasBias_) bias_ = memory(mdBias, dnnl_util::engine(), DNNL_MEMORY_NONE);
    if (constB) packed_.init(b_, pd.weights_desc(), true);
    bool batched = shapeElementCount(y) != y[rank - 1] * y[rank - 2];
    reorderable_ = !constB && !batched && !permuted;
    bool oneB = shapeElementCount(b) == b[rank - 1] * b[rank - 2];
    if (oneB && !permuted) { // a 1×1 convolution over all of A's rows applies (PointwiseProduct), A row-major first
      pointwiseFlipsA_ = ta;
      pointwiseSpec_.m = shapeElementCount(y) / y[rank - 1];
      pointwiseSpec_.k = a[rank - 1];
      pointwiseSpec_.n = y[rank - 1];
      pointwiseSpec_.bTransposed = tb;
      pointwiseSpec_.constB = constB;
      pointwiseSpec_.bias = hasBias_;
      pointwiseSpec_.relu = op.fusion.relu();
      pointwiseSpec_.addAfter = hasResidual_;
      pointwiseSpec_.scale = scale;
    }
    if (f32 && (reorderable_ || pointwiseSpec_.m > 0 || permuted))
      chooseOperands(op, context, a, b, rank, ta, tb, make);
  }
  int64_t scratchBytes() const override {
    return operands_ == MatMulOperands::FlippedA    ? static_cast<int64_t>(a_.get_desc().get_size())
           : operands_ == MatMulOperands::FlippedB  ? static_cast<int64_t>(b_.get_desc().get_size())
           : operands_ == MatMulOperands::ShiftedB  ? static_cast<int64_t>(b_.get_desc().get_size()) + kShift
           : operands_ == MatMulOperands::Pointwise ? pointwise_.scratchBytes()
           : operands_ == MatMulOperands::FlippedPointwise
               ? aligned64(a_.get_desc().get_size()) + pointwise_.scratchBytes()
           : operands_ == MatMulOperands::Unpermuted ? unpermutedOffset_[3]
           : swapped()
               ? swapCopyOffset_ + (operands_ == MatMulOperands::SwappedCopy ? aligned64(b_.get_desc().get_size()) : 0)
               : 0;
  }
  void run(const KernelArgs &args) override {
    a_.set_data_handle(const_cast<void *>(args.inputs[0]));
    b_.set_data_handle(const_cast<void *>(args.inputs[1]));
    y_.set_data_handle(args.outputs[0]);
    if (hasBias_) bias_.set_data_handle(const_cast<void *>(args.inputs[2]));
    if (hasResidual_) r_.set_data_handle(const_cast<void *>(args.inputs[3]));
    if (operands_ == MatMulOperands::Pointwise && (args.scratch || pointwise_.scratchBytes() == 0)) {
      pointwise_.run(args.inputs[0], args.inputs[1], hasBias_ ? args.inputs[2] : nullptr,
                     hasResidual_ ? args.inputs[3] : nullptr, args.outputs[0], args.scratch);
      return;
    }
    if (operands_ == MatMulOperands::Unpermuted && args.scratch) {
      auto *scratch = static_cast<uint8_t *>(args.scratch);
      const memory *src = &a_, *wt = &b_, *dst = &y_;
      if (plainA_) {
        plainA_.set_data_handle(scratch + unpermutedOffset_[0]);
        dnnl_util::execute(reorderA_, reorderAArgs_, {{DNNL_ARG_FROM, a_}, {DNNL_ARG_TO, plainA_}});
        src = &plainA_;
      }
      if (plainB_) {
        plainB_.set_data_handle(scratch + unpermutedOffset_[1]);
        dnnl_util::execute(reorderB_, reorderBArgs_, {{DNNL_ARG_FROM, b_}, {DNNL_ARG_TO, plainB_}});
        wt = &plainB_;
      }
      if (plainY_) {
        plainY_.set_data_handle(scratch + unpermutedOffset_[2]);
        dst = &plainY_;
      }
      product(reordered_, reorderedArgs_, *src, *wt, *dst); // no residual (buildUnpermuted)
      if (plainY_) dnnl_util::execute(reorderY_, reorderYArgs_, {{DNNL_ARG_FROM, plainY_}, {DNNL_ARG_TO, y_}});
      return;
    }
    if (operands_ == MatMulOperands::FlippedPointwise && args.scratch) {
      auto *scratch = static_cast<uint8_t *>(args.scratch);
      scratchA_.set_data_handle(scratch);
      dnnl_util::execute(reorder_, reorderArgs_, {{DNNL_ARG_FROM, a_}, {DNNL_ARG_TO, scratchA_}});
      pointwise_.run(scratch, args.inputs[1], hasBias_ ? args.inputs[2] : nullptr,
                     hasResidual_ ? args.inputs[3] : nullptr, args.outputs[0],
                     scratch + aligned64(a_.get_desc().get_size()));
      return;
    }
    if (swapped() && args.scratch) {
      auto *scratch = static_cast<uint8_t *>(args.scratch);
      bT_.set_data_handle(const_cast<void *>(args.inputs[1]));
      aT_.set_data_handle(const_cast<void *>(args.inputs[0]));
      yT_.set_data_handle(scratch);
      yTasY_.set_data_handle(scratch);
      const memory *src = &bT_;
      if (operands_ == MatMulOperands::SwappedCopy) {
        bTcopy_.set_data_handle(scratch + swapCopyOffset_);
        dnnl_util::execute(reorder_, reorderArgs_, {{DNNL_ARG_FROM, bT_}, {DNNL_ARG_TO, bTcopy_}});
        src = &bTcopy_;
      }
      product(reordered_, reorderedArgs_, *src, aT_, yT_); // no bias or residual (buildSwapped)
      dnnl_util::execute(swapOut_, swapOutArgs_, {{DNNL_ARG_FROM, yTasY_}, {DNNL_ARG_TO, y_}});
      return;
    }
    if (operands_ == MatMulOperands::ShiftedB && args.scratch) {
      void *shifted = static_cast<uint8_t *>(args.scratch) + kShift;
      std::memcpy(shifted, args.inputs[1], b_.get_desc().get_size());
      scratchB_.set_data_handle(shifted);
      product(prim_, reorderedArgs_, a_, scratchB_);
      return;
    }
    if (operands_ != MatMulOperands::AsStored && args.scratch) {
      bool flippedA = operands_ == MatMulOperands::FlippedA;
      memory &scratch = flippedA ? scratchA_ : scratchB_;
      scratch.set_data_handle(args.scratch);
      dnnl_util::execute(reorder_, reorderArgs_, {{DNNL_ARG_FROM, flippedA ? a_ : b_}, {DNNL_ARG_TO, scratch}});
      product(reordered_, reorderedArgs_, flippedA ? scratch : a_, flippedA ? b_ : scratch);
      return;
    }
    product(prim_, args_, a_, packed_ ? packed_.get(b_, args.inputs[1]) : b_);
  }

private:
  /// Which operand, if any, to reorder into the scratch first, or whether to run as a 1×1
  /// convolution (see MatMulOperands). Auto times each way that applies on zeroed buffers once
  /// per configuration.
  template <typename Make>
  void chooseOperands(const ir::Op &op, const KernelContext &context, const Shape &a, const Shape &b, size_t rank,
                      bool ta, bool tb, Make &&make) {
    MatMulOperands choice = context.matmulOperands;
    double flops = 2.0 * static_cast<double>(shapeElementCount(a)) * static_cast<double>(b.back());
    if (choice == MatMulOperands::AsStored || (choice == MatMulOperands::Auto && flops < kTuneFlops)) return;
    memory::desc flippedA = storedDesc(a, rank, !ta), flippedB = storedDesc(b, rank, !tb);
    auto build = [&](MatMulOperands way) {
      reorderedArgs_.clear(); // they name the previous way's memories
      reorderArgs_.clear();
      if (way == MatMulOperands::Unpermuted) return buildUnpermuted();
      if (way == MatMulOperands::Pointwise)
        return pointwiseSpec_.m > 0 && !pointwiseFlipsA_ && pointwise_.init(pointwiseSpec_);
      if (way == MatMulOperands::FlippedPointwise) {
        if (pointwiseSpec_.m == 0 || !pointwiseFlipsA_ || !pointwise_.init(pointwiseSpec_)) return false;
        scratchA_ = memory(flippedA, dnnl_util::engine(), DNNL_MEMORY_NONE);
        reorder_ = dnnl_util::userScratchReorder(a_, scratchA_);
        return true;
      }
      if (!reorderable_) return false;
      if (way == MatMulOperands::ShiftedB) {
        scratchB_ = memory(b_.get_desc(), dnnl_util::engine(), DNNL_MEMORY_NONE);
        return true;
      }
      if (way == MatMulOperands::Swapped || way == MatMulOperands::SwappedCopy) return buildSwapped(way);
      memory::desc mdA = way == MatMulOperands::FlippedA ? flippedA : a_.get_desc();
      memory::desc mdB = way == MatMulOperands::FlippedB ? flippedB : b_.get_desc();
      auto pd = make(mdA, mdB);
      if (dnnl_util::implIs(pd, "ref")) return false;
      reordered_ = matmul(pd);
      memory &scratch = way == MatMulOperands::FlippedA ? scratchA_ : scratchB_;
      scratch = memory(way == MatMulOperands::FlippedA ? flippedA : flippedB, dnnl_util::engine(), DNNL_MEMORY_NONE);
      const memory &from = way == MatMulOperands::FlippedA ? a_ : b_;
      reorder_ = dnnl_util::userScratchReorder(from, scratch);
      return true;
    };
    if (choice == MatMulOperands::Auto) {
      std::string key = toString(a) + (ta ? "T" : "") + "x" + toString(b) + (tb ? "T" : "") +
                        (hasBias_ ? "+bias" : "") + (hasResidual_ ? "+residual" : "") +
                        (op.fusion.relu() ? "Relu" : "") + std::to_string(op.fusion.scale.value_or(1.f)) +
                        (op.input(1).isConst() ? "const" : "");
      // (The key's form predates Fusion and is kept: checkpoints store tuned ways by it.)
      for (const auto &[name, perm] : {std::pair{"permA", &op.fusion.permA}, std::pair{"permB", &op.fusion.permB},
                                       std::pair{"permY", &op.fusion.permY}})
        if (!perm->empty()) key += std::string(" ") + name + toString(*perm);
      choice = tunedWay(context, key, [&] { return timeOperands(build); });
      timed_ = true;
      logging::logger().debug("{}: {} operands for {}", op.debugName(),
                              choice == MatMulOperands::FlippedA           ? "flipped A"
                              : choice == MatMulOperands::FlippedB         ? "flipped B"
                              : choice == MatMulOperands::ShiftedB         ? "shifted B"
                              : choice == MatMulOperands::Pointwise        ? "1x1 convolution"
                              : choice == MatMulOperands::Swapped          ? "swapped"
                              : choice == MatMulOperands::SwappedCopy      ? "swapped, B copied,"
                              : choice == MatMulOperands::FlippedPointwise ? "flipped A, 1x1 convolution"
                              : choice == MatMulOperands::Unpermuted       ? "unpermuted"
                                                                           : "stored",
                              key);
    }
    bool applied = choice != MatMulOperands::AsStored && build(choice);
    if (!applied || (choice != MatMulOperands::Pointwise && choice != MatMulOperands::FlippedPointwise))
      pointwise_ = PointwiseProduct(); // its packed weights
    if (applied) operands_ = choice;
  }

public:
  std::string choice() const override {
    return operands_ == MatMulOperands::AsStored && !timed_
               ? std::string()
               : std::string("operands ") + matMulOperandsName(operands_) + (timed_ ? ", timed" : ", forced");
  }

private:
  /// Times the product as stored and each other way that applies; the fastest if it beats the
  /// stored way by kGain (the fastest of three runs each; a smaller gain could be noise).
  template <typename Build> MatMulOperands timeOperands(Build &&build) {
    // 64-byte aligned like the arena and the variables: oneDNN's AVX2 gemm takes another path
    // for a B that is not (the MLP's dY·W ran in 3.2 ms with B 16 bytes off, 5.8 ms aligned), so
    // timing on malloc'd buffers chose wrongly.
    // Operands with data of their own (weights, constants) are timed on it, not on a copy: a
    // copy of a large weight doubled the compile's peak memory (a 268 MB MatMul weight).
    size_t bytesA = a_.get_desc().get_size(), bytesB = b_.get_desc().get_size(), bytesY = y_.get_desc().get_size();
    auto bufA = alignedBytes(storedA_ ? 1 : bytesA), bufB = alignedBytes(storedB_ ? 1 : bytesB),
         bufY = alignedBytes(bytesY);
    auto bias = alignedBytes(hasBias_ ? bias_.get_desc().get_size() : 1),
         residual = alignedBytes(hasResidual_ ? bytesY : 1);
    const void *ins[4] = {storedA_ ? storedA_ : bufA.get(), storedB_ ? storedB_ : bufB.get(),
                          hasBias_ ? bias.get() : nullptr, hasResidual_ ? residual.get() : nullptr};
    void *outs[1] = {bufY.get()};
    KernelArgs args{ins, 4, outs, 1, nullptr};
    operands_ = MatMulOperands::AsStored;
    double stored = fastestMs([&] { run(args); });
    MatMulOperands best = MatMulOperands::AsStored;
    double bestMs = stored;
    for (MatMulOperands way : kTimedWays) {
      if (!build(way)) continue;
      operands_ = way;
      auto scratch = alignedBytes(static_cast<size_t>(std::max<int64_t>(scratchBytes(), 1))); // as the plan's
      args.scratch = scratch.get();
      double ms = fastestMs([&] { run(args); });
      logging::logger().trace("MatMul operands: stored {:.3f} ms, way {} {:.3f} ms", stored, static_cast<int>(way), ms);
      double gain = way == MatMulOperands::Pointwise ? kPointwiseGain : kGain;
      if (ms * gain < stored && ms < bestMs) {
        best = way;
        bestMs = ms;
      }
    }
    operands_ = MatMulOperands::AsStored;
    return best;
  }

  /// Unpermuted: the operands that Fusion::permA/B permute copied into plain layouts, the product
  /// into a plain buffer and copied into the permuted output (for a oneDNN whose strided product
  /// is slower than the copies). Not with a residual (read in the output's permuted layout).
  bool buildUnpermuted() {
    bool any = !unpermuted_[0].is_zero() || !unpermuted_[1].is_zero() || !unpermuted_[2].is_zero();
    if (!any || hasResidual_) return false;
    memory::desc src = unpermuted_[0].is_zero() ? a_.get_desc() : unpermuted_[0];
    memory::desc wt = unpermuted_[1].is_zero() ? b_.get_desc() : unpermuted_[1];
    memory::desc dst = unpermuted_[2].is_zero() ? y_.get_desc() : unpermuted_[2];
    matmul::primitive_desc pd(matmul::desc(src, wt, hasBias_ ? bias_.get_desc() : memory::desc(), dst), attr_,
                              dnnl_util::engine(), true);
    if (!pd || dnnl_util::implIs(pd, "ref")) return false;
    reordered_ = matmul(pd);
    reorderAArgs_.clear();
    reorderBArgs_.clear();
    reorderYArgs_.clear();
    plainA_ = plainB_ = plainY_ = memory();
    int64_t offset = 0;
    memory *plain[3] = {&plainA_, &plainB_, &plainY_};
    for (size_t i = 0; i < 3; ++i) {
      unpermutedOffset_[i] = offset;
      if (unpermuted_[i].is_zero()) continue;
      *plain[i] = memory(unpermuted_[i], dnnl_util::engine(), DNNL_MEMORY_NONE);
      offset += aligned64(unpermuted_[i].get_size());
    }
    unpermutedOffset_[3] = offset;
    if (plainA_) reorderA_ = dnnl_util::userScratchReorder(a_, plainA_);
    if (plainB_) reorderB_ = dnnl_util::userScratchReorder(b_, plainB_);
    if (plainY_) reorderY_ = dnnl_util::userScratchReorder(plainY_, y_);
    return true;
  }

  bool swapped() const { return operands_ == MatMulOperands::Swapped || operands_ == MatMulOperands::SwappedCopy; }

  /// Swapped ways: Yᵀ = Bᵀ·Aᵀ into the scratch (Bᵀ as a view of B, or for SwappedCopy a row-major
  /// copy of it after Yᵀ), then transposed into Y. Not with a bias (per row of Yᵀ, which oneDNN
  /// 2.6 leaves to its reference matmul) or a residual (the post-op would read it transposed).
  bool buildSwapped(MatMulOperands way) {
    if (hasBias_ || hasResidual_) return false;
    memory::desc src = transposedView(b_.get_desc()), wts = transposedView(a_.get_desc());
    memory::dims yDims = y_.get_desc().dims(), yTDims = yDims;
    std::swap(yTDims[yTDims.size() - 1], yTDims[yTDims.size() - 2]);
    memory::desc yT(yTDims, memory::data_type::f32, dnnl_util::plainStrides(yTDims));
    memory::desc srcCopy(src.dims(), memory::data_type::f32, dnnl_util::plainStrides(src.dims()));
    bool copy = way == MatMulOperands::SwappedCopy;
    matmul::primitive_desc pd(matmul::desc(copy ? srcCopy : src, wts, yT), attr_, dnnl_util::engine());
    if (dnnl_util::implIs(pd, "ref")) return false;
    reordered_ = matmul(pd);
    bT_ = memory(src, dnnl_util::engine(), DNNL_MEMORY_NONE);
    aT_ = memory(wts, dnnl_util::engine(), DNNL_MEMORY_NONE);
    yT_ = memory(yT, dnnl_util::engine(), DNNL_MEMORY_NONE);
    yTasY_ = memory(transposedView(yT), dnnl_util::engine(), DNNL_MEMORY_NONE);
    swapOutArgs_.clear();
    swapOut_ = dnnl_util::userScratchReorder(yTasY_, y_);
    swapCopyOffset_ = aligned64(yT.get_size());
    if (copy) {
      bTcopy_ = memory(srcCopy, dnnl_util::engine(), DNNL_MEMORY_NONE);
      reorder_ = dnnl_util::userScratchReorder(bT_, bTcopy_);
    }
    return true;
  }

  /// Runs \p prim from \p src and \p wt into \p dst (y_ unless given), with the bias and
  /// residual memories if any.
  void product(const primitive &prim, std::vector<dnnl_exec_arg_t> &cache, const memory &src, const memory &wt) {
    product(prim, cache, src, wt, y_);
  }
  void product(const primitive &prim, std::vector<dnnl_exec_arg_t> &cache, const memory &src, const memory &wt,
               const memory &dst) {
    if (hasBias_ && hasResidual_)
      dnnl_util::execute(prim, cache,
                         {{DNNL_ARG_SRC, src},
                          {DNNL_ARG_WEIGHTS, wt},
                          {DNNL_ARG_BIAS, bias_},
                          {DNNL_ARG_DST, dst},
                          {residualArg_, r_}});
    else if (hasBias_)
      dnnl_util::execute(prim, cache,
                         {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_BIAS, bias_}, {DNNL_ARG_DST, dst}});
    else if (hasResidual_)
      dnnl_util::execute(prim, cache,
                         {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_DST, dst}, {residualArg_, r_}});
    else
      dnnl_util::execute(prim, cache, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_DST, dst}});
  }

  bool hasBias_ = false, hasResidual_ = false;
  int residualArg_ = 0;
  primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  memory a_, b_, y_, bias_, r_;
  MatMulOperands operands_ = MatMulOperands::AsStored;
  bool timed_ = false; ///< operands_ came from the timing (or the session's record of it)
  /// A's and B's own data when they are stored tensors (timeOperands reads them; null: none).
  const void *storedA_ = nullptr, *storedB_ = nullptr;
  primitive reordered_, reorder_;
  std::vector<dnnl_exec_arg_t> reorderedArgs_, reorderArgs_;
  memory scratchA_, scratchB_;
  primitive_attr attr_;                  ///< the product's output scale and post-ops
  memory bT_, aT_, yT_, yTasY_, bTcopy_; ///< Swapped ways (buildSwapped)
  primitive swapOut_;
  std::vector<dnnl_exec_arg_t> swapOutArgs_;
  int64_t swapCopyOffset_ = 0;
  memory::desc unpermuted_[3];      ///< plain layouts of the permuted A, B, Y (empty: as stored)
  memory plainA_, plainB_, plainY_; ///< Unpermuted's copies (buildUnpermuted)
  primitive reorderA_, reorderB_, reorderY_;
  std::vector<dnnl_exec_arg_t> reorderAArgs_, reorderBArgs_, reorderYArgs_;
  int64_t unpermutedOffset_[4] = {0, 0, 0, 0}; ///< of A, B, Y in the scratch, and its size
  dnnl_util::PackedWeights packed_;
  bool reorderable_ = false;             ///< FlippedA, FlippedB and ShiftedB apply
  PointwiseProduct::Spec pointwiseSpec_; ///< m > 0: Pointwise (A row-major) or FlippedPointwise applies
  bool pointwiseFlipsA_ = false;         ///< A is stored transposed: FlippedPointwise, not Pointwise
  PointwiseProduct pointwise_;
};

/// The f16 kernel for FLOAT16 operands (supportsHalfMatMul), ours otherwise.
std::unique_ptr<Kernel> createMatMul(const ir::Op &op, const KernelContext &context) {
  if (op.inInfo(0).dataType() == DataType::FLOAT16) return createHalfMatMul(op);
  return std::make_unique<MatMulKernel>(op, context);
}

} // namespace

void registerDnnlMatMulKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "MatMul", KernelProvider::Dnnl, supportsMatMul, createMatMul});
}

Support dnnlComputesIn(DataType type) {
  if (type == DataType::FLOAT) return Support::yes();
  auto t = dnnl_util::dnnlType(type);
  if (!t) return Support::no("oneDNN computes in FLOAT, BFLOAT16 or FLOAT16, not " + toString(type));
  dnnl::memory::desc md = dnnl_util::plainDesc({16, 16}, 2, *t);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), dnnl::primitive_attr(), dnnl_util::engine(), true);
  return dnnl_util::implementationFor(pd, "matmul", *t);
}

} // namespace popart::backend_cpu
