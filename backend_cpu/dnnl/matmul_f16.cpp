// FLOAT16 MatMul and Gemm on oneDNN's f32 matmul. oneDNN 2.6.3 has no f16 matmul, inner product
// or convolution on this CPU (only f16 ↔ f32 reorders, and those in a C++ loop), so the product of
// fp16 operands computes in fp32, block by block, without a full-size fp32 copy of any operand:
// a block of rows of A and a panel of columns of B (all of B when it is small) are widened into
// the kernel's scratch, multiplied by an f32 matmul primitive created for that block shape, and
// the f32 result block is narrowed into Y (round to nearest even, as core/half.hpp) or written as
// it is when Y is FLOAT (Fusion::outputType), with the fused bias, scale, Relu and residual, or
// Gemm's alpha, beta and C, applied on the way. The fp16.16 products (kHalfPartials) are the
// reference kernel's.
//
// Block sizes (kBlockBytes): a block of rows of A, a panel of columns of B and the f32 result block
// are each about 256 KiB of f32 (16 rows or columns at least), whatever the operands' sizes, so that
// the scratch, planned in the arena at the product's step (the MLP's and BERT's arena peaks were
// at 16-bit products whose scratch held up to 2.4 MB), is a small fraction of the operands, and the
// converted blocks are in L2 when oneDNN reads them. The price is widening one operand again for
// each block of the other (unless the other is one block): the loop order keeps whichever operand
// costs more to widen again in the outer loop. fp16 modes gain memory on CPUs without fp16
// arithmetic, not speed. One OpenMP region widens A's block and B's panel, one narrows the result,
// around oneDNN's.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/dnnl/half_blocks.hpp"
#include "core/half.hpp"
#include "core/tensordata.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/ops/matmul_layout.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

/// f32 bytes of a block of rows of A, of a panel of columns of B and of a result block, each.
constexpr int64_t kBlockBytes = int64_t{256} << 10;
/// Elements below which a conversion pass runs on one thread: one thread converts 128 Ki elements
/// in some 50 µs, and an OpenMP region costs microseconds, far more on a loaded machine.
constexpr int64_t kThreadedElements = int64_t{1} << 17;

int64_t aligned64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

using half_blocks::Epilogue;
using half_blocks::HalfLoops;
using half_blocks::halfLoops;

/// A batch of matrix products Y_b = epilogue(A_b · B_b): element (i, p) of A_b at
/// a + offsetA[b] + i·aRow + p·aCol, and so on; the addend (bias, C) at addendRow/addendCol strides
/// (0 where broadcast), the same for every batch; the residual in Y's layout.
struct Product : ir::MatMulGeometry {
  float alpha = 1.f, beta = 1.f;
  bool relu = false;
  int addendInput = -1, residualInput = -1; ///< -1: none
  bool addendHalf = true, yHalf = true;
  int64_t addendRow = 0, addendCol = 0;
};

Product matMulProduct(const ir::Op &op) {
  Product p;
  // Operands and result through strides (Fusion::transA/B, permA/B/Y), as the reference kernel reads them.
  static_cast<ir::MatMulGeometry &>(p) = ir::matMulGeometry(op);
  const auto batches = static_cast<int64_t>(p.offsetA.size());
  // [..., M, K] x [K, N] whose batches of A and Y follow on from each other: one product of all the rows.
  bool foldable = batches > 1;
  for (int64_t bi = 0; foldable && bi < batches; ++bi)
    foldable = p.offsetB[static_cast<size_t>(bi)] == p.offsetB[0] &&
               p.offsetA[static_cast<size_t>(bi)] == p.offsetA[0] + bi * p.m * p.aRow &&
               p.offsetY[static_cast<size_t>(bi)] == p.offsetY[0] + bi * p.m * p.yRow;
  if (foldable) {
    p.m *= batches;
    p.offsetA.resize(1), p.offsetB.resize(1), p.offsetY.resize(1);
  }
  // (acc + bias) · scale = scale·acc + scale·bias (fuseMatMulScale never comes with a bias).
  p.alpha = p.beta = op.fusion.scale.value_or(1.f);
  p.relu = op.fusion.relu();
  if (op.hasInput(2)) { // fused by fuseMatMulBias: [N] along the rows
    p.addendInput = 2;
    p.addendHalf = op.inInfo(2).dataType() == DataType::FLOAT16;
    p.addendCol = 1;
  }
  if (op.inputCount() > 3 && op.hasInput(3)) p.residualInput = 3; // fuseMatMulResidual
  p.yHalf = op.outInfo(0).dataType() == DataType::FLOAT16;
  return p;
}

Product gemmProduct(const ir::Op &op) {
  Product p;
  bool ta = op.attrs.getInt("transA", 0) != 0, tb = op.attrs.getInt("transB", 0) != 0;
  p.m = op.outInfo(0).dim(0), p.n = op.outInfo(0).dim(1);
  p.k = ta ? op.inInfo(0).dim(0) : op.inInfo(0).dim(1);
  p.aRow = ta ? 1 : p.k, p.aCol = ta ? p.m : 1;
  p.bRow = tb ? 1 : p.n, p.bCol = tb ? p.k : 1;
  p.yRow = p.n, p.yCol = 1;
  p.alpha = op.attrs.getFloat("alpha", 1.f);
  p.beta = op.attrs.getFloat("beta", 1.f);
  p.relu = op.fusion.relu();
  if (op.hasInput(2) && p.beta != 0.f) { // C broadcast to [M, N]
    const Shape &c = op.inInfo(2).shape();
    p.addendInput = 2;
    p.addendHalf = op.inInfo(2).dataType() == DataType::FLOAT16;
    int64_t rows = c.size() == 2 ? c[0] : 1, cols = c.empty() ? 1 : c.back();
    p.addendCol = cols == 1 ? 0 : 1;
    p.addendRow = rows == 1 ? 0 : cols;
  }
  p.yHalf = op.outInfo(0).dataType() == DataType::FLOAT16;
  return p;
}

/// Why the f16 kernel does not take \p op ("" if it does), for the checks of both ops.
std::string halfProductObstacle(const ir::Op &op, bool gemm) {
  if (op.attrs.getInt(ir::internal_attr::kHalfPartials, 0) != 0)
    return "its partial sums are rounded to 16 bits (fp16.16), which only the reference kernel does";
  if (op.inInfo(0).dataType() != DataType::FLOAT16 || op.inInfo(1).dataType() != DataType::FLOAT16)
    return "A and B not both FLOAT16";
  DataType y = op.outInfo(0).dataType();
  if (y != DataType::FLOAT16 && y != DataType::FLOAT) return "Y is " + toString(y);
  for (size_t i : {size_t{2}, size_t{3}})
    if (op.inputCount() > i && op.hasInput(i) && op.inInfo(i).dataType() != DataType::FLOAT16 &&
        op.inInfo(i).dataType() != DataType::FLOAT)
      return "input " + std::to_string(i) + " is " + toString(op.inInfo(i).dataType());
  if (op.outInfo(0).elementCount() == 0) return "an empty result";
  Product p = gemm ? gemmProduct(op) : matMulProduct(op);
  if (p.k == 0) return "an empty reduction (K = 0)";
  if (p.residualInput >= 0 && op.inInfo(3).dataType() != y) return "a residual not in Y's type";
  return {};
}

/// The product of FLOAT16 operands in fp32, block by block (see the top of this file).
class HalfProductKernel : public Kernel {
public:
  HalfProductKernel(const ir::Op &op, bool gemm) : p_(gemm ? gemmProduct(op) : matMulProduct(op)), loops_(halfLoops()) {
    const int64_t m = p_.m, k = p_.k, n = p_.n;
    // Which way each block is widened: keeping the stored orientation, so that every conversion
    // reads and writes contiguous runs (oneDNN reads the transposed f32 block through strides).
    aTransposed_ = p_.aCol != 1 && k > 1 && (p_.aRow == 1 || m == 1);
    bTransposed_ = p_.bCol != 1 && n > 1 && (p_.bRow == 1 || k == 1);
    // Blocks of rows of A, panels of columns of B and result blocks of about kBlockBytes of f32
    // each (16 rows or columns at least), so that the scratch, planned in the arena at this step
    // (often its peak), is a small fraction of the operands; rows and columns split evenly.
    auto split = [](int64_t total, int64_t most) {
      const int64_t parts = (total + most - 1) / most;
      return std::min(total, ((total + parts - 1) / parts + 15) / 16 * 16);
    };
    const int64_t lines = std::max<int64_t>(16, kBlockBytes / (4 * k) / 16 * 16); // rows of A or columns of B
    mb_ = split(m, lines), nb_ = split(n, lines);
    while (mb_ * nb_ * 4 > kBlockBytes && std::max(mb_, nb_) > 16) { // the result block
      if (mb_ >= nb_)
        mb_ = split(m, std::max<int64_t>(16, mb_ / 2));
      else
        nb_ = split(n, std::max<int64_t>(16, nb_ / 2));
    }
    // One of the operands is widened again for each block of the other (unless the other is one
    // block): the loop keeps the one whose repeated widening costs more in the outer loop.
    const int64_t rowBlocks = (m + mb_ - 1) / mb_, panels = (n + nb_ - 1) / nb_;
    rowsOuter_ = (panels > 1 ? rowBlocks * k * n : k * n) + m * k < (rowBlocks > 1 ? panels * m * k : m * k) + k * n;
    bOffset_ = aligned64(mb_ * k * 4);
    yOffset_ = bOffset_ + aligned64(k * nb_ * 4);
    // A FLOAT Y that takes the product as it is (a gradient written for an fp32 master weight,
    // Fusion::outputType) is oneDNN's destination itself: no f32 block of it in the scratch, which
    // is planned in the arena at the step of the product (often the arena's peak), and no pass
    // copying it out.
    yDirect_ = !p_.yHalf && p_.yCol == 1 && p_.yRow >= n && p_.alpha == 1.f && p_.addendInput < 0 &&
               p_.residualInput < 0 && !p_.relu;
    scratchBytes_ = yOffset_ + (yDirect_ ? 0 : aligned64(mb_ * nb_ * 4));
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c) {
        int64_t rows = r == 0 ? mb_ : (m % mb_), cols = c == 0 ? nb_ : (n % nb_);
        if (rows == 0 || cols == 0) continue;
        memory::desc mdA({rows, k}, memory::data_type::f32, aTransposed_ ? memory::dims{1, rows} : memory::dims{k, 1});
        memory::desc mdB({k, cols}, memory::data_type::f32, bTransposed_ ? memory::dims{1, k} : memory::dims{cols, 1});
        memory::desc mdY({rows, cols}, memory::data_type::f32, memory::dims{yDirect_ ? p_.yRow : cols, 1});
        Block &blk = blocks_[static_cast<size_t>(r) * 2 + static_cast<size_t>(c)];
        matmul::primitive_desc pd(matmul::desc(mdA, mdB, mdY), dnnl_util::engine());
        if (r == 0 && c == 0) implementation_ = pd.impl_info_str();
        blk.prim = matmul(pd);
        blk.a = memory(mdA, dnnl_util::engine(), DNNL_MEMORY_NONE);
        blk.b = memory(mdB, dnnl_util::engine(), DNNL_MEMORY_NONE);
        blk.y = memory(mdY, dnnl_util::engine(), DNNL_MEMORY_NONE);
      }
  }

  int64_t scratchBytes() const override { return scratchBytes_; }

  std::string choice() const override {
    return "fp32 blocks of " + std::to_string(mb_) + " rows x " + std::to_string(nb_) + " columns" +
           (rowsOuter_ ? ", rows outer" : "") + (aTransposed_ ? ", A transposed" : "") +
           (bTransposed_ ? ", B transposed" : "") + " (" + implementation_ + ")";
  }

  void run(const KernelArgs &args) override {
    // In a plan the scratch is the arena's. Outside one (tests, constant folding) the first run
    // allocates memory of the kernel's own: allocating it at creation made every f16 kernel of a
    // plan hold up to 10 MiB it never touches, which the memory report counted.
    if (!args.scratch && !owned_) owned_ = alignedBytes(static_cast<size_t>(scratchBytes_));
    auto *scratch = static_cast<uint8_t *>(args.scratch ? args.scratch : owned_.get());
    auto *aBlock = reinterpret_cast<float *>(scratch);
    auto *bPanel = reinterpret_cast<float *>(scratch + bOffset_);
    auto *yBlock = reinterpret_cast<float *>(scratch + yOffset_);
    for (Block &blk : blocks_)
      if (blk.prim) {
        blk.a.set_data_handle(aBlock);
        blk.b.set_data_handle(bPanel);
        if (!yDirect_) blk.y.set_data_handle(yBlock);
      }
    const auto *a = static_cast<const uint16_t *>(args.inputs[0]);
    const auto *b = static_cast<const uint16_t *>(args.inputs[1]);
    const void *addend = p_.addendInput >= 0 ? args.inputs[static_cast<size_t>(p_.addendInput)] : nullptr;
    const void *residual = p_.residualInput >= 0 ? args.inputs[static_cast<size_t>(p_.residualInput)] : nullptr;
    const int64_t m = p_.m, n = p_.n;
    // What the scratch holds: A's block and B's panel are widened only when they change (a
    // broadcast B, or A or B in one block, is widened once).
    const uint16_t *widenedA = nullptr, *widenedB = nullptr;
    int64_t widenedRow = -1, widenedColumn = -1;
    auto step = [&](size_t bi, int64_t m0, int64_t n0) {
      const int64_t rows = std::min(mb_, m - m0), cols = std::min(nb_, n - n0);
      const uint16_t *batchA = a + p_.offsetA[bi], *batchB = b + p_.offsetB[bi];
      const bool newBlock = widenedA != batchA || widenedRow != m0;
      const bool newPanel = widenedB != batchB || widenedColumn != n0;
      widenedA = batchA, widenedRow = m0, widenedB = batchB, widenedColumn = n0;
      // One parallel region for both conversions (each is an orphaned omp for).
      const bool threads = ((newBlock ? rows : 0) + (newPanel ? cols : 0)) * p_.k >= kThreadedElements;
#pragma omp parallel if (threads)
      {
        if (newPanel) widenB(batchB, n0, cols, bPanel);
        if (newBlock) widenA(batchA, m0, rows, aBlock);
      }
      Block &blk = blocks_[(rows == mb_ ? size_t{0} : size_t{2}) + (cols == nb_ ? size_t{0} : size_t{1})];
      if (yDirect_) blk.y.set_data_handle(static_cast<float *>(args.outputs[0]) + p_.offsetY[bi] + m0 * p_.yRow + n0);
      dnnl_util::execute(blk.prim, blk.args, {{DNNL_ARG_SRC, blk.a}, {DNNL_ARG_WEIGHTS, blk.b}, {DNNL_ARG_DST, blk.y}});
      if (!yDirect_) store(yBlock, p_.offsetY[bi], m0, rows, n0, cols, addend, residual, args.outputs[0]);
    };
    for (size_t bi = 0; bi < p_.offsetA.size(); ++bi)
      if (rowsOuter_) {
        for (int64_t m0 = 0; m0 < m; m0 += mb_)
          for (int64_t n0 = 0; n0 < n; n0 += nb_)
            step(bi, m0, n0);
      } else {
        for (int64_t n0 = 0; n0 < n; n0 += nb_)
          for (int64_t m0 = 0; m0 < m; m0 += mb_)
            step(bi, m0, n0);
      }
  }

private:
  /// Rows [m0, m0 + rows) of A (from \p a, this batch's) into \p dst, f32 in A's orientation:
  /// [rows, K] row-major, or [K, rows] when A is stored transposed. Shared among the threads of
  /// the enclosing parallel region, if any; ends with its barrier.
  void widenA(const uint16_t *a, int64_t m0, int64_t rows, float *dst) const {
    const int64_t k = p_.k;
    if (aTransposed_) {
#pragma omp for schedule(static)
      for (int64_t q = 0; q < k; ++q)
        loops_.widen(a + q * p_.aCol + m0, dst + q * rows, rows);
    } else if (p_.aCol == 1 || k == 1) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < rows; ++i)
        loops_.widen(a + (m0 + i) * p_.aRow, dst + i * k, k);
    } else { // neither axis contiguous (a permuted operand): element by element
#pragma omp for schedule(static)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t q = 0; q < k; ++q)
          dst[i * k + q] = halfToFloat(a[(m0 + i) * p_.aRow + q * p_.aCol]);
    }
  }

  /// Columns [n0, n0 + cols) of B (from \p b, this batch's) into \p dst, f32 in B's orientation:
  /// [K, cols] row-major, or [cols, K] when B is stored transposed. Shared among the threads of
  /// the enclosing parallel region, if any, without a barrier (widenA's follows, if any, and the
  /// region's end).
  void widenB(const uint16_t *b, int64_t n0, int64_t cols, float *dst) const {
    const int64_t k = p_.k;
    if (bTransposed_) {
#pragma omp for schedule(static) nowait
      for (int64_t j = 0; j < cols; ++j)
        loops_.widen(b + (n0 + j) * p_.bCol, dst + j * k, k);
    } else if (p_.bCol == 1 || cols == 1) {
#pragma omp for schedule(static) nowait
      for (int64_t q = 0; q < k; ++q)
        loops_.widen(b + q * p_.bRow + n0, dst + q * cols, cols);
    } else {
#pragma omp for schedule(static) nowait
      for (int64_t q = 0; q < k; ++q)
        for (int64_t j = 0; j < cols; ++j)
          dst[q * cols + j] = halfToFloat(b[q * p_.bRow + (n0 + j) * p_.bCol]);
    }
  }

  /// The f32 block [rows, cols] of \p acc into Y at rows m0.., columns n0.. of the batch at \p offsetY.
  void store(const float *acc, int64_t offsetY, int64_t m0, int64_t rows, int64_t n0, int64_t cols, const void *addend,
             const void *residual, void *y) const {
    const size_t ySize = p_.yHalf ? 2 : 4, addendSize = p_.addendHalf ? 2 : 4;
    const bool threads = rows * cols >= kThreadedElements;
#pragma omp parallel for schedule(static) if (threads)
    for (int64_t i = 0; i < rows; ++i) {
      Epilogue e;
      e.alpha = p_.alpha, e.beta = p_.beta, e.relu = p_.relu;
      if (addend) {
        e.addend = static_cast<const uint8_t *>(addend) +
                   static_cast<size_t>((m0 + i) * p_.addendRow + n0 * p_.addendCol) * addendSize;
        e.addendHalf = p_.addendHalf;
        e.addendStride = p_.addendCol;
      }
      const auto at = static_cast<size_t>(offsetY + (m0 + i) * p_.yRow + n0 * p_.yCol) * ySize;
      if (residual) e.residual = static_cast<const uint8_t *>(residual) + at;
      e.y = static_cast<uint8_t *>(y) + at;
      e.yHalf = p_.yHalf;
      e.yStride = p_.yCol;
      loops_.epilogue(acc + i * cols, cols, e);
    }
  }

  /// The primitive for one block shape: [0] full rows and columns, [1] full rows and the last
  /// columns, [2] the last rows and full columns, [3] the last rows and columns.
  struct Block {
    primitive prim;
    memory a, b, y;
    std::vector<dnnl_exec_arg_t> args;
  };

  Product p_;
  HalfLoops loops_;
  bool aTransposed_ = false, bTransposed_ = false;
  int64_t mb_ = 0, nb_ = 0; ///< rows and columns of a full block
  int64_t bOffset_ = 0, yOffset_ = 0, scratchBytes_ = 0;
  bool yDirect_ = false;   ///< oneDNN writes Y's blocks in place (a FLOAT Y with no epilogue)
  bool rowsOuter_ = false; ///< blocks of A in the outer loop (B's panels widened for each), else panels of B
  std::array<Block, 4> blocks_;
  std::string implementation_; ///< oneDNN's implementation of the full block
  std::unique_ptr<uint8_t, void (*)(uint8_t *)> owned_{nullptr, nullptr};
};

} // namespace

Support supportsHalfMatMul(const ir::Op &op) { return Support::unless(halfProductObstacle(op, false)); }
Support supportsHalfGemm(const ir::Op &op) { return Support::unless(halfProductObstacle(op, true)); }
std::unique_ptr<Kernel> createHalfMatMul(const ir::Op &op) { return std::make_unique<HalfProductKernel>(op, false); }
std::unique_ptr<Kernel> createHalfGemm(const ir::Op &op) { return std::make_unique<HalfProductKernel>(op, true); }

} // namespace popart::backend_cpu
