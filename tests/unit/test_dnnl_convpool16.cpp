// The fused Conv + Relu + MaxPool (fuseConvPool) in 16 bits: oneDNN's bf16 convolution pooling a
// chunk of images at a time (backend_cpu/dnnl/convpool.cpp) and the FLOAT16 convolution's f32 chunks
// pooled in its scratch (backend_cpu/dnnl/conv_f16.cpp), against the unfused fp32 reference kernels
// (Conv with its Relu, then MaxPool) on the same inputs widened exactly; batches that are not a
// multiple of the chunk, padded and overlapping windows.

#include "kernel_compare.hpp"
#include "one_op.hpp"

#include "backend_cpu/kernel.hpp"
#include "backend_cpu/kernel_context.hpp"
#include "core/tensordata.hpp"
#include "ir/graph.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace popart;
using backend_cpu::KernelProvider;

namespace {

constexpr DataType F32 = DataType::FLOAT;

struct PoolCase {
  Shape x, w;
  int64_t convPad = 1;
  std::vector<int64_t> kernel, strides, pads; ///< the MaxPool's
  int64_t chunk = 0;                          ///< KernelContext::convPoolChunk (0: sized by bytes)
};

/// Values drawn uniformly in [-2, 2), rounded to \p type.
TensorData draw(DataType type, const Shape &shape, std::mt19937 &rng) {
  std::vector<double> v(static_cast<size_t>(shapeElementCount(shape)));
  for (double &e : v)
    e = std::uniform_real_distribution<double>(-2, 2)(rng);
  return TensorData::fromDoubles(type, shape, v);
}

/// \p t as FLOAT, exactly.
TensorData widened(const TensorData &t) { return TensorData::fromDoubles(F32, t.info().shape(), t.toDoubleVector()); }

/// \p kernel's output 0 of \p info (filled with garbage first) on \p ins.
TensorData run(backend_cpu::Kernel &kernel, const std::vector<const TensorData *> &ins, const TensorInfo &info) {
  std::vector<const void *> in;
  for (const TensorData *t : ins)
    in.push_back(t->data());
  TensorData out = TensorData::fromDoubles(info.dataType(), info.shape(),
                                           std::vector<double>(static_cast<size_t>(info.elementCount()), 1e6));
  void *outp = out.data();
  kernel.run({in.data(), in.size(), &outp, 1});
  return out;
}

ir::Attributes convAttrs(int64_t pad) {
  ir::Attributes a;
  a.set("pads", std::vector<int64_t>{pad, pad, pad, pad});
  return a;
}

ir::Attributes poolAttrs(const PoolCase &c) {
  ir::Attributes a;
  a.set("kernel_shape", c.kernel);
  a.set("strides", c.strides);
  a.set("pads", c.pads.empty() ? std::vector<int64_t>(4, 0) : c.pads);
  return a;
}

/// Expects oneDNN's kernel of the fused 16-bit Conv + Relu + MaxPool of \p c to match the unfused
/// fp32 reference kernels within \p type's tolerance; \returns the kernel's choice(). Where oneDNN
/// computes no bf16 (an AVX2-only CPU), expects it to decline a bf16 one saying so and the kernel
/// that runs instead to match; \returns "" then.
std::string expectFusedMatchesUnfused(DataType type, const PoolCase &c, int threads = 1, unsigned seed = 5) {
  std::mt19937 rng(seed);
  const int64_t m = c.w[0];
  const Shape convShape{c.x[0], m, c.x[2] + 2 * c.convPad - c.w[2] + 1, c.x[3] + 2 * c.convPad - c.w[3] + 1};
  TensorData x = draw(type, c.x, rng), w = draw(type, c.w, rng), b = draw(type, {m}, rng);
  // The unfused fp32 reference: Conv with its Relu, then the MaxPool.
  test_ops::OneOp conv = test_ops::makeOneOp(
      "Conv", "ai.onnx", 13, {TensorInfo(F32, c.x), TensorInfo(F32, c.w), TensorInfo(F32, {m})}, convAttrs(c.convPad),
      1, {}, [](ir::Op &op) { op.fusion.activation.kind = ir::FusedActivation::Kind::Relu; });
  EXPECT_EQ(conv.op->outInfo(0).shape(), convShape);
  test_ops::OneOp pool = test_ops::makeOneOp("MaxPool", "ai.onnx", 12, {TensorInfo(F32, convShape)}, poolAttrs(c), 1);
  TensorData x32 = widened(x), w32 = widened(w), b32 = widened(b);
  auto convRef = backend_cpu::createKernel(*conv.op, KernelProvider::Reference);
  TensorData convOut = run(*convRef, {&x32, &w32, &b32}, conv.op->outInfo(0));
  auto poolRef = backend_cpu::createKernel(*pool.op, KernelProvider::Reference);
  TensorData want = run(*poolRef, {&convOut}, pool.op->outInfo(0));
  // The fused 16-bit op, as fuseConvPool leaves it.
  test_ops::OneOp fused =
      test_ops::makeOneOp("Conv", "ai.onnx", 13, {TensorInfo(type, c.x), TensorInfo(type, c.w), TensorInfo(type, {m})},
                          convAttrs(c.convPad), 1, {}, [&](ir::Op &op) {
                            op.fusion.activation.kind = ir::FusedActivation::Kind::Relu;
                            op.fusion.pool = ir::FusedPool{
                                c.kernel, c.strides, c.pads.empty() ? std::vector<int64_t>(4, 0) : c.pads, convShape};
                          });
  EXPECT_EQ(fused.op->outInfo(0), TensorInfo(type, pool.op->outInfo(0).shape()));
  KernelProvider provider = KernelProvider::Dnnl;
  if (type == DataType::BFLOAT16 && !backend_cpu::dnnlComputesIn(type)) {
    kernel_compare::expectDnnlDeclinesOnThisCpu(*fused.op, type);
    provider = KernelProvider::Any;
  } else {
    backend_cpu::KernelChoice choice = backend_cpu::KernelRegistry::instance().choose(*fused.op, KernelProvider::Dnnl);
    EXPECT_NE(choice.entry, nullptr) << toString(type) << ": oneDNN declined: " << choice.explanation();
    if (!choice.entry) return {};
  }
  backend_cpu::KernelContext context;
  context.threads = threads;
  context.convPoolChunk = c.chunk;
  auto kernel = backend_cpu::createKernel(*fused.op, provider, context);
  run(*kernel, {&x, &w, &b}, fused.op->outInfo(0));
  TensorData got = run(*kernel, {&x, &w, &b}, fused.op->outInfo(0)); // a second run must not accumulate
  const double tolerance = kernel_compare::sixteenBitTolerance(type, c.w[1] * c.w[2] * c.w[3]);
  EXPECT_LT(kernel_compare::maxRelDiff(got, want), tolerance)
      << toString(type) << " " << toString(c.x) << " * " << toString(c.w) << ", chunk " << c.chunk;
  return provider == KernelProvider::Dnnl ? kernel->choice() : std::string();
}

/// The chunk and batch of a FLOAT16 convolution's choice() ("fp32 chunks of C of N images (K chunks; ...").
struct Chunks {
  long chunk = 0, batch = 0, chunks = 0;
};
Chunks chunksOf(const std::string &choice) {
  Chunks c;
  EXPECT_EQ(std::sscanf(choice.c_str(), "fp32 chunks of %ld of %ld images (%ld", &c.chunk, &c.batch, &c.chunks), 3)
      << choice;
  return c;
}

} // namespace

TEST(DnnlConvPool16, Bf16FusedPoolMatchesTheUnfusedFp32Reference) {
  const std::vector<PoolCase> cases{
      {{7, 16, 12, 12}, {32, 16, 3, 3}, 1, {2, 2}, {2, 2}, {}, 3},           // chunks of 3, 3 and 1
      {{7, 16, 12, 12}, {32, 16, 3, 3}, 1, {3, 3}, {2, 2}, {1, 1, 1, 1}, 2}, // padded, overlapping windows
      {{5, 8, 11, 11}, {16, 8, 3, 3}, 0, {2, 2}, {2, 2}, {}, 0},             // 9 → 4 drops the last row
      {{11, 8, 32, 32}, {32, 8, 3, 3}, 1, {2, 2}, {2, 2}, {}, 0},            // chunks by bytes: 8 and 3
      {{3, 3, 16, 16}, {16, 3, 5, 5}, 2, {3, 3}, {3, 3}, {}, 0},             // three channels in
  };
  for (const PoolCase &c : cases)
    expectFusedMatchesUnfused(DataType::BFLOAT16, c);
}

TEST(DnnlConvPool16, Float16FusedPoolMatchesTheUnfusedFp32Reference) {
  const std::vector<PoolCase> cases{
      {{13, 16, 12, 12}, {32, 16, 3, 3}, 1, {2, 2}, {2, 2}, {}},
      {{13, 16, 12, 12}, {32, 16, 3, 3}, 1, {3, 3}, {2, 2}, {1, 1, 1, 1}},
      {{5, 8, 11, 11}, {16, 8, 3, 3}, 0, {2, 2}, {2, 2}, {}},
      {{3, 3, 16, 16}, {16, 3, 5, 5}, 2, {3, 3}, {3, 3}, {}},
  };
  for (const PoolCase &c : cases) {
    std::string choice = expectFusedMatchesUnfused(DataType::FLOAT16, c);
    EXPECT_NE(choice.find("max pool"), std::string::npos) << choice;
  }
}

TEST(DnnlConvPool16, Float16ChunksThatDoNotDivideTheBatch) {
  // A batch of 31 large images: several chunks, the last one shorter, whose spare images' results
  // are pooled and dropped; with one thread and with two (larger chunks).
  const PoolCase c{{31, 16, 24, 24}, {32, 16, 3, 3}, 1, {2, 2}, {2, 2}, {}};
  for (int threads : {1, 2}) {
    Chunks k = chunksOf(expectFusedMatchesUnfused(DataType::FLOAT16, c, threads, 7));
    EXPECT_EQ(k.batch, 31);
    EXPECT_GT(k.chunks, 1);
    EXPECT_NE(31 % k.chunk, 0) << "chunks of " << k.chunk;
  }
}

namespace {

/// The rows and columns of a FLOAT16 product's blocks from its choice() ("fp32 blocks of R rows x C columns...").
std::pair<long, long> blocksOf(const std::string &choice) {
  long rows = 0, cols = 0;
  EXPECT_EQ(std::sscanf(choice.c_str(), "fp32 blocks of %ld rows x %ld columns", &rows, &cols), 2) << choice;
  return {rows, cols};
}

} // namespace

TEST(DnnlHalfProductBlocks, RowsAndColumnsThatDoNotDivideIntoBlocks) {
  // Blocks of rows of A and panels of B with shorter last ones, shared unevenly among the threads;
  // transposed B as the MLP's Gemm stores it; batches with their own B, and a B broadcast over
  // batches of A that do not fold into rows (a panel kept across them).
  struct Case {
    Shape a, b;
    bool transB = false, blocks = true; ///< blocks: expect shorter last blocks of rows and columns
  };
  for (const Case &c :
       {Case{{1000, 512}, {512, 700}}, Case{{3000, 512}, {300, 512}, true}, Case{{333, 1024}, {1024, 1000}},
        Case{{200, 64}, {64, 20}, false, false}, Case{{3, 300, 256}, {3, 256, 90}, false, false},
        Case{{2, 1, 130, 48}, {3, 48, 40}, false, false}}) {
    test_ops::OneOp o = test_ops::makeOneOp("MatMul", "ai.onnx", 13,
                                            {TensorInfo(DataType::FLOAT16, c.a), TensorInfo(DataType::FLOAT16, c.b)},
                                            {}, 1, {}, [&](ir::Op &op) { op.fusion.transB = c.transB; });
    SCOPED_TRACE(toString(c.a) + " x " + toString(c.b));
    std::string choice = backend_cpu::createKernel(*o.op, KernelProvider::Dnnl)->choice();
    auto [rows, cols] = blocksOf(choice);
    if (c.blocks) {
      const int64_t n = c.transB ? c.b[0] : c.b[1];
      EXPECT_NE(c.a[0] % rows, 0) << choice;
      EXPECT_NE(n % cols, 0) << choice;
    }
    std::mt19937 rng(11);
    kernel_compare::expectSixteenBitMatchesFp32Reference(
        KernelProvider::Dnnl, *o.op, rng,
        [](size_t, std::mt19937 &r) { return std::uniform_real_distribution<float>(-2, 2)(r); },
        kernel_compare::sixteenBitTolerance(DataType::FLOAT16, c.a.back()));
  }
}

TEST(DnnlHalfProductBlocks, ScratchIsASmallFractionOfTheOperands) {
  // The bench MLP's [256, 1024] x [1024, 1024] Gemm: its f32 blocks, planned in the arena at the
  // product's step, were 2.36 MB, more than the operands.
  for (const auto &[a, b] : std::vector<std::pair<Shape, Shape>>{{{256, 1024}, {1024, 1024}}}) {
    test_ops::OneOp o = test_ops::makeOneOp(
        "Gemm", "ai.onnx", 13, {TensorInfo(DataType::FLOAT16, a), TensorInfo(DataType::FLOAT16, b)}, {}, 1);
    const int64_t operands = 2 * (shapeElementCount(a) + shapeElementCount(b));
    auto kernel = backend_cpu::createKernel(*o.op, KernelProvider::Dnnl);
    EXPECT_LE(kernel->scratchBytes() * 2, operands) << toString(a) << " x " << toString(b) << ": " << kernel->choice();
  }
}

TEST(DnnlConvPool16, Float16ScratchIsASmallFractionOfTheActivations) {
  // The bench CNN's second convolution, pooled: its f32 chunks were 3.8 MB of scratch in the arena
  // where its 16-bit input and pooled result are 0.8 MB.
  test_ops::OneOp o = test_ops::makeOneOp(
      "Conv", "ai.onnx", 13,
      {TensorInfo(DataType::FLOAT16, {32, 32, 16, 16}), TensorInfo(DataType::FLOAT16, {64, 32, 3, 3})}, convAttrs(1), 1,
      {}, [](ir::Op &op) {
        op.fusion.activation.kind = ir::FusedActivation::Kind::Relu;
        op.fusion.pool = ir::FusedPool{{2, 2}, {2, 2}, {0, 0, 0, 0}, {32, 64, 16, 16}};
      });
  backend_cpu::KernelContext context;
  context.threads = 2;
  auto kernel = backend_cpu::createKernel(*o.op, KernelProvider::Dnnl, context);
  const int64_t activations = o.op->inInfo(0).byteCount() + o.op->outInfo(0).byteCount();
  EXPECT_LE(kernel->scratchBytes(), activations) << kernel->choice();
}
