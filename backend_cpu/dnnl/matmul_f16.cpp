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
// Blocks (blockABytes, panelBytes): the scratch is planned in the arena at the product's step,
// and the arena peaks of the MLP and of BERT were at 16-bit products whose blocks held up to 2.4 MB,
// more than the operands. A block of rows of A (512 KiB to 2 MiB of f32, by the product's size) is
// widened by all threads together and shared; each thread takes panels of columns of B (128 KiB to
// 1 MiB) with a result
// block and a oneDNN scratchpad of its own, so the scratch is a fraction of the operands whatever
// their sizes. The price is widening B's panels again for each block of A. The threads run their
// panels' products on one-thread primitives in one parallel region per run, with two barriers
// per block of A: no fork-join per block (oneDNN's own, and one per conversion), which costs most
// on a loaded machine. fp16 modes gain memory on CPUs without fp16 arithmetic, not speed: with
// one thread the bench MLP's fp16.32 inference and training steps took 0-20% longer than with
// blocks of up to 2 MiB (its noisy host), for 1.1 MB of scratch at its Gemm instead of 2.4 MB
// (64 KiB panels: 0.9 MB, 30-45% longer). With those floors for every product BERT-mini's fp16.32
// training ran 23% slower than with the old 2 MiB blocks; blocks grown with the product's size
// brought that to 10% (A/B of the two builds, 2 threads) for 4 MB more arena. A transposed A (a weight gradient's X) is
// copied by brgemm into each thread's scratchpad: there the scratch is larger than it need be.

#include "backend_cpu/dnnl/dnnl_common.hpp"
#include "backend_cpu/dnnl/dnnl_families.hpp"
#include "backend_cpu/fast/half_blocks.hpp"
#include "core/half.hpp"
#include "core/tensordata.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/ops/matmul_layout.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

using namespace dnnl;

/// f32 bytes of a block of rows of A, shared by the threads, and of each thread's panel of
/// columns of B (and of its result block), for a product whose fp16 operands and result take
/// \p operandBytes: an eighth and a thirty-second of them, within [512 KiB, 2 MiB] and
/// [128 KiB, 1 MiB]. Small blocks keep a small product's scratch from dominating the arena (the
/// MLP's); a large product's is small beside its operands anyway, and small blocks there cost its
/// speed (BERT-mini's fp16.32 gradient products ran at half their GFLOP/s with the floors: oneDNN
/// copies a transposed operand per call, and calls on 128 KiB panels are short).
int64_t blockABytes(int64_t operandBytes) {
  return std::clamp<int64_t>(operandBytes / 8, int64_t{512} << 10, int64_t{2} << 20);
}
int64_t panelBytes(int64_t operandBytes) {
  return std::clamp<int64_t>(operandBytes / 32, int64_t{128} << 10, int64_t{1} << 20);
}

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
    // A block of rows of A (about blockABytes() of f32) is widened once, shared by the threads; each
    // thread takes panels of columns of B (about panelBytes(), with a result block of at most that)
    // and widens them again for each block of A. B is the per-thread operand because oneDNN's
    // brgemm matmul copies its weights into a scratchpad of its own (per thread here) when they are
    // not in its blocked layout: that copy is a panel's size, not a block of A's.
    auto split = [](int64_t total, int64_t most) {
      const int64_t parts = (total + most - 1) / most;
      return std::min(total, ((total + parts - 1) / parts + 15) / 16 * 16);
    };
    auto linesOf = [k](int64_t bytes) { return std::max<int64_t>(16, bytes / (4 * k) / 16 * 16); };
    const int64_t operandBytes = 2 * (m * k + k * n + m * n), panel = panelBytes(operandBytes);
    mb_ = split(m, linesOf(blockABytes(operandBytes)));
    nb_ = split(n, std::max<int64_t>(16, std::min(linesOf(panel), panel / (4 * mb_) / 16 * 16)));
    rowBlocks_ = (m + mb_ - 1) / mb_, panels_ = (n + nb_ - 1) / nb_;
    threads_ = static_cast<int>(std::clamp<int64_t>(panels_, 1, omp_get_max_threads()));
    // A FLOAT Y that takes the product as it is (a gradient written for an fp32 master weight,
    // Fusion::outputType) is oneDNN's destination itself: no f32 block of it in the scratch, which
    // is planned in the arena at the step of the product (often the arena's peak), and no pass
    // copying it out.
    yDirect_ = !p_.yHalf && p_.yCol == 1 && p_.yRow >= n && p_.alpha == 1.f && p_.addendInput < 0 &&
               p_.residualInput < 0 && !p_.relu;
    // The threads run whole products of blocks in one parallel region per run: oneDNN's own threads
    // and a region per conversion made several fork-joins per block, which on a loaded machine
    // cost more than small blocks' products. So the primitives are made for one thread (oneDNN
    // fixes a matmul's threads when it is made), each thread with its own oneDNN scratchpad.
    const int outer = omp_get_max_threads();
    omp_set_num_threads(1);
    int64_t scratchpad = 0;
    try {
      primitive_attr attr;
      attr.set_scratchpad_mode(scratchpad_mode::user);
      for (int r = 0; r < 2; ++r)
        for (int c = 0; c < 2; ++c) {
          int64_t rows = r == 0 ? mb_ : (m % mb_), cols = c == 0 ? nb_ : (n % nb_);
          if (rows == 0 || cols == 0) continue;
          memory::desc mdA({rows, k}, memory::data_type::f32,
                           aTransposed_ ? memory::dims{1, rows} : memory::dims{k, 1});
          memory::desc mdB({k, cols}, memory::data_type::f32,
                           bTransposed_ ? memory::dims{1, k} : memory::dims{cols, 1});
          memory::desc mdY({rows, cols}, memory::data_type::f32, memory::dims{yDirect_ ? p_.yRow : cols, 1});
          matmul::primitive_desc pd(matmul::desc(mdA, mdB, mdY), attr, dnnl_util::engine());
          if (r == 0 && c == 0) implementation_ = pd.impl_info_str();
          const auto shape = static_cast<size_t>(r) * 2 + static_cast<size_t>(c);
          prims_[shape] = matmul(pd);
          descs_[shape] = {mdA, mdB, mdY, pd.scratchpad_desc()};
          scratchpad = std::max(scratchpad, static_cast<int64_t>(pd.scratchpad_desc().get_size()));
        }
    } catch (...) {
      omp_set_num_threads(outer);
      throw;
    }
    omp_set_num_threads(outer);
    // The scratch: the block of A, then a slice per thread (its panel of B, result block and
    // oneDNN scratchpad).
    sharedBytes_ = aligned64(mb_ * k * 4);
    yOffset_ = aligned64(k * nb_ * 4);
    padOffset_ = yOffset_ + (yDirect_ ? 0 : aligned64(mb_ * nb_ * 4));
    sliceBytes_ = padOffset_ + aligned64(scratchpad);
    slices_.resize(static_cast<size_t>(threads_));
    for (Slice &slice : slices_)
      for (size_t shape = 0; shape < 4; ++shape)
        if (prims_[shape]) {
          Block &blk = slice.blocks[shape];
          blk.a = memory(descs_[shape][0], dnnl_util::engine(), DNNL_MEMORY_NONE);
          blk.b = memory(descs_[shape][1], dnnl_util::engine(), DNNL_MEMORY_NONE);
          blk.y = memory(descs_[shape][2], dnnl_util::engine(), DNNL_MEMORY_NONE);
          blk.pad = memory(descs_[shape][3], dnnl_util::engine(), DNNL_MEMORY_NONE);
        }
    scratchBytes_ = sharedBytes_ + sliceBytes_ * threads_;
  }

  int64_t scratchBytes() const override { return scratchBytes_; }

  std::string choice() const override {
    return "fp32 blocks of " + std::to_string(mb_) + " rows x " + std::to_string(nb_) + " columns" +
           (aTransposed_ ? ", A transposed" : "") + (bTransposed_ ? ", B transposed" : "") + " on " +
           std::to_string(threads_) + " thread" + (threads_ == 1 ? "" : "s") + " (" + implementation_ + ")";
  }

  void run(const KernelArgs &args) override {
    // In a plan the scratch is the arena's. Outside one (tests, constant folding) the first run
    // allocates memory of the kernel's own: allocating it at creation made every f16 kernel of a
    // plan hold up to 10 MiB it never touches, which the memory report counted.
    if (!args.scratch && !owned_) owned_ = alignedBytes(static_cast<size_t>(scratchBytes_));
    auto *scratch = static_cast<uint8_t *>(args.scratch ? args.scratch : owned_.get());
    std::exception_ptr failure;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
    runThread(scratch, args, failure);
    if (failure) std::rethrow_exception(failure);
  }

private:
  /// The per-thread memories of one block shape over the thread's slice of the scratch.
  struct Block {
    memory a, b, y, pad;
    std::vector<dnnl_exec_arg_t> args; ///< dnnl_util::execute's cache
  };
  /// A thread's blocks: [0] full rows and columns, [1] full rows and the last columns, [2] the
  /// last rows and full columns, [3] the last rows and columns.
  struct Slice {
    std::array<Block, 4> blocks;
  };

  /// One thread's part of a run (all of it outside a parallel region): for each block of A, its
  /// share of widening it, a barrier, then its panels' products; a failure is kept in \p failure
  /// (an exception must not leave the parallel region).
  void runThread(uint8_t *scratch, const KernelArgs &args, std::exception_ptr &failure) {
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
    uint8_t *slice = scratch + sharedBytes_ + sliceBytes_ * t;
    auto *aBlock = reinterpret_cast<float *>(scratch), *bPanel = reinterpret_cast<float *>(slice);
    auto *yBlock = reinterpret_cast<float *>(slice + yOffset_);
    std::array<Block, 4> &blks = slices_[static_cast<size_t>(t)].blocks;
    for (size_t shape = 0; shape < 4; ++shape)
      if (prims_[shape]) {
        blks[shape].a.set_data_handle(aBlock);
        blks[shape].b.set_data_handle(bPanel);
        blks[shape].pad.set_data_handle(slice + padOffset_);
        if (!yDirect_) blks[shape].y.set_data_handle(yBlock);
      }
    const auto *a = static_cast<const uint16_t *>(args.inputs[0]);
    const auto *b = static_cast<const uint16_t *>(args.inputs[1]);
    const void *addend = p_.addendInput >= 0 ? args.inputs[static_cast<size_t>(p_.addendInput)] : nullptr;
    const void *residual = p_.residualInput >= 0 ? args.inputs[static_cast<size_t>(p_.residualInput)] : nullptr;
    // A thread's panel of B is widened when it changes: once per run when the thread has one
    // panel and B is the same for every batch.
    const uint16_t *widenedB = nullptr;
    int64_t widenedColumn = -1;
    for (size_t bi = 0; bi < p_.offsetA.size(); ++bi)
      for (int64_t blockA = 0; blockA < rowBlocks_; ++blockA) {
        const uint16_t *batchA = a + p_.offsetA[bi], *batchB = b + p_.offsetB[bi];
        const int64_t m0 = blockA * mb_, rows = std::min(mb_, p_.m - m0);
        if (bi > 0 || blockA > 0) {
#pragma omp barrier
        } // the previous block of A's products are done
        widenA(batchA, m0, rows, aBlock, t, team);
#pragma omp barrier
        for (int64_t panel = t; panel < panels_; panel += team) {
          const int64_t n0 = panel * nb_, cols = std::min(nb_, p_.n - n0);
          if (widenedB != batchB || widenedColumn != n0) widenB(batchB, n0, cols, bPanel, 0, 1);
          widenedB = batchB, widenedColumn = n0;
          const size_t shape = (rows == mb_ ? size_t{0} : size_t{2}) + (cols == nb_ ? size_t{0} : size_t{1});
          Block &blk = blks[shape];
          if (yDirect_)
            blk.y.set_data_handle(static_cast<float *>(args.outputs[0]) + p_.offsetY[bi] + m0 * p_.yRow + n0);
          try {
            dnnl_util::execute(prims_[shape], blk.args,
                               {{DNNL_ARG_SRC, blk.a},
                                {DNNL_ARG_WEIGHTS, blk.b},
                                {DNNL_ARG_DST, blk.y},
                                {DNNL_ARG_SCRATCHPAD, blk.pad}});
          } catch (...) {
#pragma omp critical(popart_half_product_failure)
            failure = std::current_exception();
            continue;
          }
          if (!yDirect_) store(yBlock, p_.offsetY[bi], m0, rows, n0, cols, addend, residual, args.outputs[0]);
        }
      }
  }

  /// Part \p part of \p parts (an even share of its lines) of rows [m0, m0 + rows) of A (from \p a,
  /// this batch's) into \p dst, f32 in A's orientation: [rows, K] row-major, or [K, rows] when A is
  /// stored transposed.
  void widenA(const uint16_t *a, int64_t m0, int64_t rows, float *dst, int part, int parts) const {
    const int64_t k = p_.k;
    const int64_t lines = aTransposed_ ? k : rows, from = lines * part / parts, to = lines * (part + 1) / parts;
    if (aTransposed_) {
      for (int64_t q = from; q < to; ++q)
        loops_.widen(a + q * p_.aCol + m0, dst + q * rows, rows);
    } else if (p_.aCol == 1 || k == 1) {
      for (int64_t i = from; i < to; ++i)
        loops_.widen(a + (m0 + i) * p_.aRow, dst + i * k, k);
    } else { // neither axis contiguous (a permuted operand): element by element
      for (int64_t i = from; i < to; ++i)
        for (int64_t q = 0; q < k; ++q)
          dst[i * k + q] = halfToFloat(a[(m0 + i) * p_.aRow + q * p_.aCol]);
    }
  }

  /// Part \p part of \p parts of columns [n0, n0 + cols) of B (from \p b, this batch's) into \p dst,
  /// f32 in B's orientation: [K, cols] row-major, or [cols, K] when B is stored transposed.
  void widenB(const uint16_t *b, int64_t n0, int64_t cols, float *dst, int part, int parts) const {
    const int64_t k = p_.k;
    const int64_t lines = bTransposed_ ? cols : k, from = lines * part / parts, to = lines * (part + 1) / parts;
    if (bTransposed_) {
      for (int64_t j = from; j < to; ++j)
        loops_.widen(b + (n0 + j) * p_.bCol, dst + j * k, k);
    } else if (p_.bCol == 1 || cols == 1) {
      for (int64_t q = from; q < to; ++q)
        loops_.widen(b + q * p_.bRow + n0, dst + q * cols, cols);
    } else {
      for (int64_t q = from; q < to; ++q)
        for (int64_t j = 0; j < cols; ++j)
          dst[q * cols + j] = halfToFloat(b[q * p_.bRow + (n0 + j) * p_.bCol]);
    }
  }

  /// The f32 block [rows, cols] of \p acc into Y at rows m0.., columns n0.. of the batch at \p offsetY.
  void store(const float *acc, int64_t offsetY, int64_t m0, int64_t rows, int64_t n0, int64_t cols, const void *addend,
             const void *residual, void *y) const {
    const size_t ySize = p_.yHalf ? 2 : 4, addendSize = p_.addendHalf ? 2 : 4;
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

  Product p_;
  HalfLoops loops_;
  bool aTransposed_ = false, bTransposed_ = false;
  int64_t mb_ = 0, nb_ = 0;            ///< rows and columns of a full block
  int64_t rowBlocks_ = 0, panels_ = 0; ///< blocks of rows of A and panels of B per batch
  int threads_ = 1;                    ///< threads sharing the tiles, each with its slice of the scratch
  int64_t sharedBytes_ = 0, sliceBytes_ = 0, scratchBytes_ = 0; ///< the outer block's, a thread's slice's, all
  int64_t yOffset_ = 0, padOffset_ = 0;                         ///< in a slice, after its inner block
  bool yDirect_ = false;                             ///< oneDNN writes Y's blocks in place (a FLOAT Y with no epilogue)
  std::array<primitive, 4> prims_;                   ///< one-thread matmuls of the block shapes (Slice::blocks' order)
  std::array<std::array<memory::desc, 4>, 4> descs_; ///< their A, B, Y and scratchpad
  std::vector<Slice> slices_;
  std::string implementation_; ///< oneDNN's implementation of the full block
  std::unique_ptr<uint8_t, void (*)(uint8_t *)> owned_{nullptr, nullptr};
};

} // namespace

Support supportsHalfMatMul(const ir::Op &op) { return Support::unless(halfProductObstacle(op, false)); }
Support supportsHalfGemm(const ir::Op &op) { return Support::unless(halfProductObstacle(op, true)); }
std::unique_ptr<Kernel> createHalfMatMul(const ir::Op &op) { return std::make_unique<HalfProductKernel>(op, false); }
std::unique_ptr<Kernel> createHalfGemm(const ir::Op &op) { return std::make_unique<HalfProductKernel>(op, true); }

} // namespace popart::backend_cpu
