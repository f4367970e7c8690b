#pragma once
// How a MatMul reads its operands and writes its result (Fusion::transA/B, permA/B/Y, set by
// foldTransposesIntoMatMul): logical shapes with element strides into the stored tensors. Shared
// by the op's setup, the kernels and the profiler's FLOP count.

#include "ir/op.hpp"

#include <cstdint>
#include <vector>

namespace popart::ir {

/// A logical shape and, per axis, the element stride into a row-major stored tensor.
struct StridedShape {
  Shape shape;
  std::vector<int64_t> strides;
};

/// True if \p perm holds each of 0..rank-1 once (a permutation of \p rank axes).
bool isPermutation(const std::vector<int64_t> &perm, size_t rank);

/// MatMul input \p i (0: A, 1: B) as the product reads it: the stored input transposed by
/// Fusion::permA/B (logical axis j is stored axis perm[j]), then its last two axes swapped if
/// Fusion::transA/B is set. Throws naming \p op if the permutation is not one of the input's axes.
StridedShape matMulOperand(const Op &op, size_t i);

/// The product before Fusion::permY, with strides into the stored output (the output is
/// Transpose(product, Fusion::permY)). Needs the output's info.
StridedShape matMulResult(const Op &op);

/// Each batch's element offsets into A, B and Y of a product of \p a and \p b into \p y (vector
/// operands already padded to matrices) over the \p rank batch axes of \p y, last axis fastest;
/// a broadcast batch axis of A or B has stride 0.
struct BatchOffsets {
  std::vector<int64_t> a, b, y;
};
BatchOffsets matMulBatchOffsets(const StridedShape &a, const StridedShape &b, const StridedShape &y, size_t rank);

/// A MatMul as the kernels loop over it: a batch of [m, k] x [k, n] products, each operand and the
/// result read through row and column element strides from each batch's offsets (vector operands
/// padded to matrices: a vector A is one row, a vector B one column).
struct MatMulGeometry {
  int64_t m = 0, k = 0, n = 0;
  int64_t aRow = 0, aCol = 0, bRow = 0, bCol = 0, yRow = 0, yCol = 0;
  std::vector<int64_t> offsetA{0}, offsetB{0}, offsetY{0};
};
MatMulGeometry matMulGeometry(const Op &op);

} // namespace popart::ir
