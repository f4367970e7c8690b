// The fast kernels' vector math (backend_cpu/fast/vecloops.cpp: exp, erf) against libm in
// double, and views (Reshape-like ops sharing their input's bytes) and in-place outputs in the
// plan. The fast kernels themselves are compared with the reference in test_fast_*.cpp.

#include "kernel_compare.hpp"
#include "op_runner.hpp"

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/plan.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <random>

using namespace popart;

using op_runner::Input;
using op_runner::randomTensor;
using op_runner::runOp;

TEST(VecMath, ElementwiseLoopsGiveTheSameBitsWhereverARangeStarts) {
  // Threads and merged updates split these loops at arbitrary elements, so an element must get
  // the same bits in the vector body, the narrower remainder loop and the scalar tail (an
  // AVX-512 build whose 256-bit remainder lacked FMA once rounded Adam's v differently there).
  const int64_t n = 203;
  std::vector<float> x(n), dy(n), w0(n), m0(n), v0(n);
  for (int64_t i = 0; i < n; ++i) {
    x[static_cast<size_t>(i)] = static_cast<float>(std::sin(0.37 * double(i)) * 3.0);
    dy[static_cast<size_t>(i)] = static_cast<float>(std::cos(0.11 * double(i)));
    w0[static_cast<size_t>(i)] = static_cast<float>(std::sin(0.05 * double(i) + 1.0));
    m0[static_cast<size_t>(i)] = static_cast<float>(0.01 * std::sin(double(i)));
    v0[static_cast<size_t>(i)] = static_cast<float>(0.001 * (1.0 + std::cos(0.5 * double(i))));
  }
  // Each loop as f(begin, end, outputs), run whole and then split at every cut in [1, 40].
  using Loop = std::function<void(int64_t, int64_t, std::vector<std::vector<float>> &)>;
  const std::vector<std::pair<std::string, Loop>> loops{
      {"exp", [&](int64_t b, int64_t e, auto &o) { backend_cpu::vec::exp(x.data() + b, o[0].data() + b, e - b); }},
      {"erf", [&](int64_t b, int64_t e, auto &o) { backend_cpu::vec::erf(x.data() + b, o[0].data() + b, e - b); }},
      {"centerScaleShift",
       [&](int64_t b, int64_t e, auto &o) {
         backend_cpu::vec::centerScaleShift(x.data() + b, 0.3f, 1.7f, -0.2f, o[0].data() + b, e - b);
       }},
      {"batchNormBackward",
       [&](int64_t b, int64_t e, auto &o) {
         backend_cpu::vec::batchNormBackward(x.data() + b, dy.data() + b, 0.3f, 1.3f, 0.9f, 0.05f, 0.7f,
                                             o[0].data() + b, e - b);
       }},
      {"adamStep", [&](int64_t b, int64_t e, auto &o) {
         backend_cpu::vec::adamStep(dy.data() + b, o[0].data() + b, o[1].data() + b, o[2].data() + b, e - b, 0.5f,
                                    0.01f, 0.9f, 0.999f, 0.999f, 0.05f, 0.0447f, 1e-8f);
       }}};
  auto fresh = [&] { return std::vector<std::vector<float>>{w0, m0, v0}; };
  for (const auto &[name, loop] : loops) {
    auto whole = fresh();
    loop(0, n, whole);
    for (int64_t cut = 1; cut <= 40; ++cut) {
      auto split = fresh();
      loop(0, cut, split);
      loop(cut, n, split);
      for (size_t k = 0; k < whole.size(); ++k)
        ASSERT_EQ(0, std::memcmp(whole[k].data(), split[k].data(), sizeof(float) * static_cast<size_t>(n)))
            << name << " output " << k << " split at " << cut;
    }
  }
}

TEST(VecMath, ExpMatchesLibmWithin3Ulp) {
  std::vector<float> x, y;
  for (float v = -87.f; v < 88.5f; v += 0.0013f)
    x.push_back(v);
  y.resize(x.size());
  backend_cpu::vec::exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worstUlp = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double ref = std::exp(static_cast<double>(x[i]));
    double ulp = std::nextafter(static_cast<float>(ref), INFINITY) - static_cast<float>(ref);
    worstUlp = kernel_compare::worseOf(worstUlp, std::fabs(y[i] - ref) / ulp);
  }
  std::cout << "exp: worst error " << worstUlp << " ulp over " << x.size() << " points\n";
  EXPECT_LE(worstUlp, 3.0);
  float special[] = {-INFINITY, INFINITY, NAN, -100.f, 100.f, 0.f};
  float out[6];
  backend_cpu::vec::exp(special, out, 6);
  EXPECT_EQ(out[0], 0.f);
  EXPECT_EQ(out[1], INFINITY);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 0.f);
  EXPECT_EQ(out[4], INFINITY);
  EXPECT_EQ(out[5], 1.f);
}

TEST(VecMath, SoftmaxExponentialsMatchLibmWithin3Ulp) {
  // expSubSum(x, m) for x <= m: each e^(x − m) (by expNonPositive) and their sum.
  std::vector<float> x;
  for (float v = -100.f; v <= 0.f; v += 0.0011f)
    x.push_back(v);
  x.push_back(0.f);
  x.push_back(-INFINITY);
  std::vector<float> y(x.size());
  float sum = backend_cpu::vec::expSubSum(x.data(), 0.f, y.data(), static_cast<int64_t>(x.size()));
  double worstUlp = 0, want = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double ref = std::exp(static_cast<double>(x[i]));
    want += ref;
    if (ref < std::numeric_limits<float>::min()) { // where e^x is subnormal this may return 0
      EXPECT_LE(y[i], std::numeric_limits<float>::min()) << x[i];
      continue;
    }
    double ulp = std::nextafter(static_cast<float>(ref), INFINITY) - static_cast<float>(ref);
    worstUlp = kernel_compare::worseOf(worstUlp, std::fabs(y[i] - ref) / ulp);
  }
  std::cout << "softmax exp: worst error " << worstUlp << " ulp over " << x.size() << " points\n";
  EXPECT_LE(worstUlp, 3.0);
  EXPECT_NEAR(sum, want, 1e-5 * want);
  EXPECT_EQ(backend_cpu::vec::expSubSum(x.data(), 0.f, nullptr, static_cast<int64_t>(x.size())), sum);
  float withNan[] = {-1.f, NAN};
  EXPECT_TRUE(std::isnan(backend_cpu::vec::expSubSum(withNan, 0.f, y.data(), 2)));
  EXPECT_TRUE(std::isnan(y[1]));
}

TEST(VecMath, ErfMatchesLibm) {
  std::vector<float> x, y;
  for (float v = -7.f; v < 7.f; v += 0.00071f)
    x.push_back(v);
  for (float v : {1e-30f, -1e-20f, 1e-6f, 0.4999f, 0.5f, 0.5001f})
    x.push_back(v);
  y.resize(x.size());
  backend_cpu::vec::erf(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worstAbs = 0, worstRel = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double ref = std::erf(static_cast<double>(x[i]));
    worstAbs = kernel_compare::worseOf(worstAbs, std::fabs(y[i] - ref));
    if (ref != 0) worstRel = kernel_compare::worseOf(worstRel, std::fabs(y[i] - ref) / std::fabs(ref));
  }
  std::cout << "erf: worst absolute error " << worstAbs << ", relative " << worstRel << "\n";
  EXPECT_LE(worstAbs, 4e-7);
  EXPECT_LE(worstRel, 1e-6); // also near 0, where a single formula for all x would lose digits
  float special[] = {NAN, INFINITY, -INFINITY, 0.f};
  float out[4];
  backend_cpu::vec::erf(special, out, 4);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], 1.f);
  EXPECT_EQ(out[2], -1.f);
  EXPECT_EQ(out[3], 0.f);
}

TEST(PlanViews, ReshapeSharesItsInputBytesAndKeepsItAlive) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.opsets()["ai.onnx"] = 13;
  g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {4, 6}));
  g.addInput("x");
  g.addConst("shape", TensorData::fromInt64({2}, {6, 4}));
  g.addConst("shape2", TensorData::fromInt64({1}, {24}));
  // a = relu(x); r = reshape(a); b = relu(x) + 1 would reuse a's bytes if r did not keep them.
  g.addOp("Relu", "", 13, "relu", {}, {"x"}, {"a"});
  g.addOp("Reshape", "", 13, "reshape", {}, {"a", "shape"}, {"r"});
  g.addOp("Neg", "", 13, "neg", {}, {"x"}, {"b"});
  g.addOp("Reshape", "", 13, "reshape2", {}, {"b", "shape2"}, {"b2"});
  g.addOp("Reshape", "", 13, "reshape3", {}, {"r", "shape2"}, {"r2"});
  g.addOp("Add", "", 13, "add", {}, {"r2", "b2"}, {"y"});
  g.addOp("Reshape", "", 13, "out", {}, {"y", "shape"}, {"z"});
  g.addOutput("z");
  ir::inferShapes(g, nullptr);
  backend_cpu::ExecutionPlan plan(g, {});
  EXPECT_EQ(plan.address("r"), plan.address("a"));
  EXPECT_EQ(plan.address("r2"), plan.address("a")); // a view of a view shares the root
  EXPECT_NE(plan.address("b"), plan.address("a"));  // r2 is still read after b is written
  EXPECT_NE(plan.address("z"), plan.address("y"));  // graph outputs keep their own bytes
  auto *x = static_cast<float *>(plan.address("x"));
  for (int i = 0; i < 24; ++i)
    x[i] = static_cast<float>(i) - 11.5f;
  plan.run();
  const auto *z = static_cast<const float *>(plan.address("z"));
  for (int i = 0; i < 24; ++i)
    ASSERT_EQ(z[i], std::max(0.f, x[i]) - x[i]) << i;
}

namespace {

/// y = Transpose(MatMul(Transpose(a), b)) + MatMul(a2, Transpose(c)) over random data, run as
/// built and after foldTransposesIntoMatMul, with \p provider's kernels.
struct TransposeGraph {
  ir::Graph g;
  TransposeGraph(int64_t batch, bool shareTranspose) {
    ir::registerBuiltinOps();
    g.opsets()["ai.onnx"] = 13;
    Shape lead = batch ? Shape{batch} : Shape{};
    auto shape = [&](int64_t r, int64_t c) {
      Shape s = lead;
      s.push_back(r);
      s.push_back(c);
      return s;
    };
    std::vector<int64_t> perm;
    for (size_t i = 0; i < lead.size(); ++i)
      perm.push_back(static_cast<int64_t>(i));
    perm.push_back(static_cast<int64_t>(lead.size() + 1));
    perm.push_back(static_cast<int64_t>(lead.size()));
    ir::Attributes p;
    p.set("perm", perm);
    for (auto [id, s] : std::vector<std::pair<const char *, Shape>>{
             {"a", shape(5, 3)}, {"b", shape(5, 4)}, {"a2", shape(4, 6)}, {"c", shape(3, 6)}}) {
      g.addTensor(id, ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, s));
      g.addInput(id);
    }
    g.addOp("Transpose", "", 13, "ta", p, {"a"}, {"at"});     // [3, 5]
    g.addOp("MatMul", "", 13, "m1", {}, {"at", "b"}, {"p"});  // [3, 4]
    g.addOp("Transpose", "", 13, "tp", p, {"p"}, {"pt"});     // [4, 3]
    g.addOp("Transpose", "", 13, "tc", p, {"c"}, {"ct"});     // [6, 3]
    g.addOp("MatMul", "", 13, "m2", {}, {"a2", "ct"}, {"q"}); // [4, 3]
    g.addOp("Add", "", 13, "add", {}, {"pt", "q"}, {"y"});
    g.addOutput("y");
    if (shareTranspose) g.addOutput("ct"); // a transpose something else reads stays
    ir::inferShapes(g, nullptr);
  }
};

std::vector<float> runTransposeGraph(ir::Graph &g, backend_cpu::KernelProvider provider, int seed) {
  backend_cpu::ExecutionPlan plan(g, {provider});
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (const char *id : {"a", "b", "a2", "c"}) {
    auto *x = static_cast<float *>(plan.address(id));
    for (int64_t i = 0; i < plan.info(id).elementCount(); ++i)
      x[i] = d(rng);
  }
  plan.run();
  const auto *y = static_cast<const float *>(plan.address("y"));
  return std::vector<float>(y, y + plan.info("y").elementCount());
}

int countType(const ir::Graph &g, const std::string &type) {
  int n = 0;
  for (const auto &op : g.ops())
    n += op->type == type;
  return n;
}

} // namespace

TEST(FoldTransposes, MatMulReadsTransposedInputsThroughStrides) {
  for (int64_t batch : {0, 2})
    for (bool share : {false, true})
      for (auto provider : {backend_cpu::KernelProvider::Reference, backend_cpu::KernelProvider::Any}) {
        TransposeGraph built(batch, share), folded(batch, share);
        std::vector<float> expected = runTransposeGraph(built.g, backend_cpu::KernelProvider::Reference, 5);
        int n = ir::foldTransposesIntoMatMul(folded.g);
        // (Aᵀ·B)ᵀ becomes Bᵀ·A (two folds: the product's transpose, then Aᵀ cancels); Cᵀ folds.
        EXPECT_EQ(n, 3);
        EXPECT_EQ(countType(folded.g, "Transpose"), share ? 1 : 0);
        std::vector<float> got = runTransposeGraph(folded.g, provider, 5);
        ASSERT_EQ(got.size(), expected.size());
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], expected[i], 1e-5) << "batch " << batch << " element " << i;
      }
}

TEST(FuseConvRelu, FusedConvMatchesConvThenRelu) {
  // Conv -> Relu (fused) and Conv -> Relu + another reader of the conv (left alone), on the
  // reference kernels and on oneDNN's (which reorders to its own layouts inside the kernel).
  for (bool shared : {false, true})
    for (auto provider : {backend_cpu::KernelProvider::Reference, backend_cpu::KernelProvider::Any}) {
      auto build = [&](ir::Graph &g) {
        ir::registerBuiltinOps();
        g.opsets()["ai.onnx"] = 13;
        g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 5, 9, 9}));
        g.addInput("x");
        std::mt19937 rng(31);
        g.addConst("w", randomTensor(DataType::FLOAT, {16, 5, 3, 3}, rng, -0.5, 0.5));
        g.addConst("b", randomTensor(DataType::FLOAT, {16}, rng, -0.5, 0.5));
        ir::Attributes a;
        a.set("pads", std::vector<int64_t>{1, 1, 1, 1});
        g.addOp("Conv", "", 13, "conv", a, {"x", "w", "b"}, {"c"});
        g.addOp("Relu", "", 13, "relu", {}, {"c"}, {"y"});
        g.addOutput("y");
        if (shared) g.addOutput("c");
        ir::inferShapes(g, nullptr);
      };
      ir::Graph plain, fused;
      build(plain);
      build(fused);
      EXPECT_EQ(ir::fuseRelu(fused), shared ? 0 : 1);
      auto run = [&](ir::Graph &g, backend_cpu::KernelProvider p) {
        backend_cpu::ExecutionPlan plan(g, {p});
        auto *x = static_cast<float *>(plan.address("x"));
        for (int i = 0; i < 2 * 5 * 81; ++i)
          x[i] = std::sin(0.37f * static_cast<float>(i));
        plan.run();
        const auto *y = static_cast<const float *>(plan.address("y"));
        return std::vector<float>(y, y + plan.info("y").elementCount());
      };
      std::vector<float> expected = run(plain, backend_cpu::KernelProvider::Reference), got = run(fused, provider);
      ASSERT_EQ(got.size(), expected.size());
      int negatives = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], expected[i], 1e-4) << i;
        negatives += got[i] < 0;
      }
      EXPECT_EQ(negatives, 0);
    }
}

TEST(PlanInPlace, ElementwiseOutputsTakeTheBytesOfInputsThatAreDead) {
  // a = exp(x); b = relu(a); c = sigmoid(b); d = c + x; y = d · 2: b, c and d can each be written
  // over their dead input, all on a's bytes; y is a graph output and keeps its own. In the second
  // graph a is read again after b, so b gets its own bytes and the later Add writes over b.
  for (bool readAgain : {false, true}) {
    ir::registerBuiltinOps();
    ir::Graph g;
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("x", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {8, 33}));
    g.addInput("x");
    g.addConst("two", TensorData::fromDoubles(DataType::FLOAT, {}, {2.0}));
    g.addOp("Exp", "", 13, "exp", {}, {"x"}, {"a"});
    g.addOp("Relu", "", 13, "relu", {}, {"a"}, {"b"});
    g.addOp("Sigmoid", "", 13, "sigmoid", {}, {"b"}, {"c"});
    g.addOp("Add", "", 13, "add", {}, {"c", readAgain ? "a" : "x"}, {"d"});
    g.addOp("Mul", "", 13, "mul", {}, {"d", "two"}, {"y"});
    g.addOutput("y");
    ir::inferShapes(g, nullptr);
    std::vector<float> x(8 * 33);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<float>(i % 17) * 0.25f - 2.f;
    auto run = [&](backend_cpu::ExecutionPlan &plan) {
      std::memcpy(plan.address("x"), x.data(), x.size() * sizeof(float));
      plan.run();
      const auto *y = static_cast<const float *>(plan.address("y"));
      return std::vector<float>(y, y + x.size());
    };
    backend_cpu::ExecutionPlan reference(g, {backend_cpu::KernelProvider::Reference});
    EXPECT_TRUE(reference.inPlace().empty()); // the reference kernels do not offer it
    backend_cpu::ExecutionPlan plan(g, {backend_cpu::KernelProvider::Dnnl});
    if (!readAgain) {
      EXPECT_EQ(plan.address("b"), plan.address("a"));
      EXPECT_EQ(plan.address("c"), plan.address("a"));
      EXPECT_EQ(plan.address("d"), plan.address("a"));
      EXPECT_EQ(plan.inPlace().size(), 3u);
      EXPECT_LT(plan.memoryPlan().arenaBytes, reference.memoryPlan().arenaBytes);
    } else {
      EXPECT_NE(plan.address("b"), plan.address("a"));
      EXPECT_EQ(plan.address("c"), plan.address("b"));
      EXPECT_EQ(plan.address("d"), plan.address("b")); // over c (src0), not over a
    }
    EXPECT_NE(plan.address("y"), plan.address("a"));
    std::vector<float> want = run(reference), got = run(plan);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-6f * (1 + std::fabs(want[i]))) << (readAgain ? "read again " : "") << i;
  }
}
