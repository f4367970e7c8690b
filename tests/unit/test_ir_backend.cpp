// IR passes, memory planning, and oneDNN kernels against the reference kernels.

#include "kernel_compare.hpp"

#include "backend_cpu/plan.hpp"
#include "core/dispatch.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace popart;
using namespace popart::ir;
using backend_cpu::KernelProvider;

namespace {

TensorData randomFloats(const Shape &shape, std::mt19937 &rng) {
  TensorData t(TensorInfo(DataType::FLOAT, shape));
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  for (int64_t i = 0; i < t.info().elementCount(); ++i)
    t.as<float>()[i] = d(rng);
  return t;
}

/// Runs \p op with \p provider on \p inputs and returns output 0.
TensorData runOp(const Op &op, KernelProvider provider, const std::vector<TensorData *> &inputs) {
  auto kernel = backend_cpu::createKernel(op, provider);
  std::vector<const void *> in;
  for (auto *t : inputs)
    in.push_back(t ? t->data() : nullptr);
  TensorData out(op.outInfo(0));
  void *o = out.data();
  kernel->run({in.data(), in.size(), &o, 1});
  return out;
}

/// Builds a one-op graph with random float inputs of \p shapes; checks oneDNN against reference.
void compareProviders(const std::string &type, const std::vector<Shape> &shapes, Attributes attrs, unsigned seed,
                      double tol = 1e-5) {
  registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  std::mt19937 rng(seed);
  Graph g;
  std::vector<TensorId> ids;
  std::vector<TensorData> data;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ids.push_back("in" + std::to_string(i));
    g.addTensor(ids.back(), TensorKind::Stream, TensorInfo(DataType::FLOAT, shapes[i]));
    g.addInput(ids.back());
    data.push_back(randomFloats(shapes[i], rng));
  }
  Op &op = g.addOp(type, "", 13, "op", attrs, ids, {"out"});
  inferShapes(g, nullptr);
  ASSERT_NE(backend_cpu::KernelRegistry::instance().find(op, KernelProvider::Dnnl), nullptr)
      << type << ": no oneDNN kernel for these shapes (seed " << seed << ")";
  std::vector<TensorData *> ptrs;
  for (auto &d : data)
    ptrs.push_back(&d);
  TensorData ref = runOp(op, KernelProvider::Reference, ptrs);
  TensorData fast = runOp(op, KernelProvider::Dnnl, ptrs);
  EXPECT_LT(kernel_compare::maxRelDiff(fast, ref), tol)
      << type << " seed " << seed << " shapes " << toString(shapes[0]);
}

} // namespace

TEST(DnnlVsReference, EltwiseOnRandomShapes) {
  backend_cpu::registerBuiltinKernels();
  std::mt19937 shapes(1);
  for (const char *type : {"Relu", "Tanh", "Sigmoid", "Exp", "Abs", "Elu", "LeakyRelu", "Softplus", "Neg", "HardSwish"})
    for (unsigned seed = 0; seed < 3; ++seed) {
      std::uniform_int_distribution<int64_t> d(1, 9);
      compareProviders(type, {{d(shapes), d(shapes), d(shapes)}}, {}, seed);
    }
  Attributes alpha;
  alpha.set("alpha", 0.3f);
  compareProviders("LeakyRelu", {{4, 5}}, alpha, 7);
  compareProviders("Elu", {{4, 5}}, alpha, 8);
}

TEST(DnnlVsReference, BinaryWithBroadcasting) {
  for (const char *type : {"Add", "Sub", "Mul", "Div"}) {
    compareProviders(type, {{2, 3, 4}, {2, 3, 4}}, {}, 1);
    compareProviders(type, {{2, 3, 4}, {4}}, {}, 2);
    compareProviders(type, {{2, 3, 4}, {3, 1}}, {}, 3);
  }
  compareProviders("Add", {{1, 4}, {3, 4}}, {}, 4); // first operand broadcast: oneDNN swaps them
}

TEST(DnnlVsReference, MatMulAndGemm) {
  std::mt19937 rng(5);
  for (unsigned seed = 0; seed < 4; ++seed) {
    std::uniform_int_distribution<int64_t> d(1, 17);
    int64_t m = d(rng), k = d(rng), n = d(rng), b = d(rng) % 3 + 1;
    compareProviders("MatMul", {{m, k}, {k, n}}, {}, seed);
    compareProviders("MatMul", {{b, m, k}, {k, n}}, {}, seed);
    compareProviders("MatMul", {{b, 1, m, k}, {2, k, n}}, {}, seed);
    compareProviders("MatMul", {{k}, {b, k, n}}, {}, seed);
    Attributes t;
    t.set("transA", int64_t{1});
    t.set("transB", int64_t{1});
    t.set("alpha", 0.5f);
    compareProviders("Gemm", {{k, m}, {n, k}, {n}}, t, seed);
    compareProviders("Gemm", {{m, k}, {k, n}, {m, 1}}, {}, seed);
  }
}

TEST(Passes, ConstantFoldingMakesShapeInputsKnown) {
  registerBuiltinOps();
  Graph g;
  g.addTensor("x", TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3}));
  g.addInput("x");
  g.addConst("a", TensorData::fromDoubles(DataType::FLOAT, {3}, {1, 2, 3}));
  g.addConst("b", TensorData::fromDoubles(DataType::FLOAT, {3}, {10, 20, 30}));
  g.addOp("Add", "", 13, "fold_me", {}, {"a", "b"}, {"c"});
  g.addOp("Mul", "", 13, "keep", {}, {"x", "c"}, {"y"});
  g.addOutput("y");
  backend_cpu::ReferenceEvaluator folder;
  inferShapes(g, &folder);
  ASSERT_EQ(g.ops().size(), 1u);
  EXPECT_TRUE(g.tensor("c").isConst());
  EXPECT_EQ(g.tensor("c").data()->toDoubleVector(), (std::vector<double>{11, 22, 33}));
  EXPECT_EQ(g.tensor("y").info(), TensorInfo(DataType::FLOAT, {2, 3}));
}

TEST(Passes, DeadCodeIsRemoved) {
  registerBuiltinOps();
  Graph g;
  g.addTensor("x", TensorKind::Stream, TensorInfo(DataType::FLOAT, {4}));
  g.addInput("x");
  g.addOp("Relu", "", 13, "used", {}, {"x"}, {"y"});
  g.addOp("Exp", "", 13, "unused", {}, {"x"}, {"z"});
  g.addOutput("y");
  removeDeadCode(g);
  ASSERT_EQ(g.ops().size(), 1u);
  EXPECT_EQ(g.ops()[0]->name, "used");
  EXPECT_FALSE(g.hasTensor("z"));
}

TEST(Graph, ScheduleOrdersReadyOpsByInsertionNotAddress) {
  // Ten readers of x; the first five are removed and five more added, which the allocator places
  // in the freed (lower) addresses. Ops ready together run in the order they were added, so the
  // schedule (and the memory plan built on it) is the same in every run.
  registerBuiltinOps();
  Graph g;
  g.addTensor("x", TensorKind::Stream, TensorInfo(DataType::FLOAT, {4}));
  g.addInput("x");
  g.addOp("Relu", "", 13, "p", {}, {"x"}, {"px"});
  std::vector<std::string> want{"p"};
  for (int i = 0; i < 10; ++i)
    g.addOp("Exp", "", 13, "c" + std::to_string(i), {}, {"px"}, {"c" + std::to_string(i) + "y"});
  for (int i = 0; i < 5; ++i) {
    for (const auto &op : g.ops())
      if (op->name == "c" + std::to_string(i)) {
        g.removeOp(*op);
        break;
      }
    g.removeTensor("c" + std::to_string(i) + "y");
  }
  for (int i = 5; i < 10; ++i)
    want.push_back("c" + std::to_string(i));
  for (int i = 0; i < 5; ++i) {
    g.addOp("Exp", "", 13, "d" + std::to_string(i), {}, {"px"}, {"d" + std::to_string(i) + "y"});
    want.push_back("d" + std::to_string(i));
  }
  std::vector<std::string> got;
  for (const Op *op : g.schedule())
    got.push_back(op->name);
  EXPECT_EQ(got, want);
}

TEST(Passes, SetupErrorsNameTheOp) {
  registerBuiltinOps();
  Graph g;
  g.addTensor("a", TensorKind::Stream, TensorInfo(DataType::FLOAT, {2, 3}));
  g.addTensor("b", TensorKind::Stream, TensorInfo(DataType::FLOAT, {4, 5}));
  g.addInput("a");
  g.addInput("b");
  g.addOp("MatMul", "", 13, "mm", {}, {"a", "b"}, {"c"});
  try {
    inferShapes(g, nullptr);
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("MatMul 'mm': inner dimensions differ"), std::string::npos) << e.what();
  }
}

TEST(MemoryPlan, TensorsWithDisjointLifetimesShareBytes) {
  registerBuiltinOps();
  Graph g;
  g.addTensor("x", TensorKind::Stream, TensorInfo(DataType::FLOAT, {1024}));
  g.addInput("x");
  // A chain x -> t0 -> t1 -> ... -> t5: only neighbours are alive together.
  // (Names from a table: GCC 12 warns falsely on "t" + std::to_string(i) here.)
  const char *names[] = {"x", "t0", "t1", "t2", "t3", "t4", "y"};
  for (int i = 0; i < 6; ++i)
    g.addOp("Relu", "", 13, names[i + 1], {}, {names[i]}, {names[i + 1]});
  g.addOutput("y");
  inferShapes(g, nullptr);
  // Reference kernels: oneDNN's Relu would run in place (PlanInPlace), which needs no sharing.
  backend_cpu::ExecutionPlan plan(g, {KernelProvider::Reference});
  const auto &mp = plan.memoryPlan();
  EXPECT_EQ(mp.unsharedBytes, 7 * 4096);
  EXPECT_LE(mp.arenaBytes, 4 * 4096); // x and y pinned, the chain reuses two more buffers
  // Results are still right.
  for (int i = 0; i < 1024; ++i)
    static_cast<float *>(plan.address("x"))[i] = static_cast<float>(i % 7) - 3.f;
  plan.run();
  for (int i = 0; i < 1024; ++i)
    ASSERT_EQ(static_cast<float *>(plan.address("y"))[i], std::max(0.f, static_cast<float>(i % 7) - 3.f));
}

TEST(Registry, EveryRegisteredOpHasAReferenceKernel) {
  registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  std::vector<std::string> missing;
  for (const auto &def : OpRegistry::instance().all()) {
    if (def.expandedBeforeLowering) continue;
    bool found = false;
    for (const auto &k : backend_cpu::KernelRegistry::instance().all())
      if (k.type == def.type && k.domain == def.domain && k.provider == KernelProvider::Reference) found = true;
    if (!found) missing.push_back(def.type);
  }
  EXPECT_TRUE(missing.empty()) << "ops without a reference kernel: " << ::testing::PrintToString(missing);
}
