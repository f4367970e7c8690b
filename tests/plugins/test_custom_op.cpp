// Custom-op plugins (include/popart/custom_op.hpp, docs/custom-ops.md): the example plugins'
// forward against plain loops, their gradients against finite differences, and the refusals of
// loading. ctest runs each test in its own process (gtest_discover_tests), so what one test loads
// does not leak into another.

#include "../unit/gradcheck.hpp"
#include "../unit/thrown.hpp"
#include "autodiff/grad_rules.hpp"
#include "ir/op.hpp"

#include <popart/custom_op.hpp>
#include <popart/session.hpp>

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <random>
#include <thread>

namespace popart {
namespace {

/// One node of a chain x -> ... -> y: domain, type and float attributes.
struct Node {
  std::string domain;
  std::string type;
  std::vector<std::pair<std::string, float>> floats;
};

/// A model y = nodes[k](...nodes[0](x)) over x of \p n elements of \p type, importing ai.onnx 13
/// and com.example 1.
std::string chainModel(const std::vector<Node> &nodes, int64_t n,
                       onnx::TensorProto_DataType type = onnx::TensorProto_DataType_FLOAT) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto *custom = m.add_opset_import();
  custom->set_domain("com.example");
  custom->set_version(1);
  onnx::GraphProto *g = m.mutable_graph();
  g->set_name("chain");
  auto value = [&](onnx::ValueInfoProto *v, const std::string &name) {
    v->set_name(name);
    v->mutable_type()->mutable_tensor_type()->set_elem_type(type);
    v->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(n);
  };
  value(g->add_input(), "x");
  value(g->add_output(), "y");
  for (size_t i = 0; i < nodes.size(); ++i) {
    onnx::NodeProto *node = g->add_node();
    node->set_name("n" + std::to_string(i));
    node->set_domain(nodes[i].domain);
    node->set_op_type(nodes[i].type);
    node->add_input(i == 0 ? "x" : "t" + std::to_string(i - 1));
    node->add_output(i + 1 == nodes.size() ? "y" : "t" + std::to_string(i));
    for (const auto &[name, v] : nodes[i].floats) {
      auto *a = node->add_attribute();
      a->set_name(name);
      a->set_type(onnx::AttributeProto_AttributeType_FLOAT);
      a->set_f(v);
    }
  }
  return m.SerializeAsString();
}

/// Runs the model on \p x with \p threads threads; \returns y.
template <typename T>
std::vector<T> run(const std::string &model, std::vector<T> x, int threads = 2, const std::string &kernels = "any",
                   std::string *explanation = nullptr) {
  SessionOptions options;
  options.numThreads = threads;
  options.kernels = kernels;
  auto session = InferenceSession::createFromOnnxModel(model, DataFlow(1, {"y"}), options);
  session->prepareDevice();
  std::vector<T> y(x.size());
  auto n = static_cast<int64_t>(x.size());
  NDArrayWrapper<T> in(x.data(), {n}), out(y.data(), {n});
  StepIO stepio({{"x", in}}, {{"y", out}});
  session->run(stepio);
  if (explanation) *explanation = session->explainKernels();
  return y;
}

std::vector<float> randomFloats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2, 2);
  std::vector<float> v(n);
  for (auto &x : v)
    x = d(rng);
  return v;
}

void loadExamples() {
  loadCustomOpLibrary(LEAKY_RELU_LIB);
  loadCustomOpLibrary(CUBE_LIB);
}

TEST(CustomOp, ForwardOnTwoThreadsMatchesPlainLoops) {
  loadExamples();
  const size_t n = 10007; // not a multiple of the threads' ranges
  std::vector<float> x = randomFloats(n, 1);
  auto y = run(chainModel({{"com.example", "LeakyRelu", {{"alpha", 0.2f}}}, {"com.example", "Cube", {{"scale", 0.5f}}}},
                          static_cast<int64_t>(n)),
               x);
  for (size_t i = 0; i < n; ++i) {
    double h = x[i] >= 0 ? x[i] : 0.2 * x[i];
    ASSERT_NEAR(y[i], 0.5 * h * h * h, 1e-5 * (1 + std::abs(0.5 * h * h * h))) << "element " << i;
  }
  // Attribute defaults: alpha 0.01, scale 1.
  auto d = run(chainModel({{"com.example", "LeakyRelu", {}}, {"com.example", "Cube", {}}}, 4),
               std::vector<float>{-2, -0.5f, 0.5f, 2});
  EXPECT_FLOAT_EQ(d[0], -8e-6f);
  EXPECT_FLOAT_EQ(d[3], 8.0f);
}

TEST(CustomOp, DoubleKernels) {
  loadExamples();
  auto y = run(chainModel({{"com.example", "LeakyRelu", {{"alpha", 0.5f}}}}, 3, onnx::TensorProto_DataType_DOUBLE),
               std::vector<double>{-1, 0, 3}, 1);
  EXPECT_EQ(y, (std::vector<double>{-0.5, 0, 3}));
}

/// Inputs away from LeakyRelu's kink at 0, where central differences straddle it.
double awayFromZero(size_t, double v) { return v + (v >= 0 ? 0.1 : -0.1); }

TEST(CustomOp, LeakyReluGradientMatchesFiniteDifferences) {
  loadExamples();
  gradcheck::Problem p("LeakyRelu", 13, gradcheck::attrs({{"alpha", 0.2f}}),
                       gradcheck::streamsThenConsts({{3, 5}}, DataType::DOUBLE));
  p.domain = "com.example";
  for (unsigned seed : {1u, 2u}) {
    gradcheck::fillStreams(p.feeds, seed, awayFromZero);
    gradcheck::checkGradient(p, seed);
  }
  // The gradient is the dedicated grad op, not a composition.
  std::vector<TensorId> grads;
  auto g = gradcheck::buildGraph(p, &grads);
  bool gradOp = false;
  for (const auto &op : g->ops())
    gradOp = gradOp || (op->domain == "com.example" && op->type == "LeakyReluGrad");
  EXPECT_TRUE(gradOp);
}

TEST(CustomOp, CubeGradientMatchesFiniteDifferences) {
  loadExamples();
  gradcheck::Problem p("Cube", 13, gradcheck::attrs({{"scale", 0.7f}}),
                       gradcheck::streamsThenConsts({{2, 3, 4}}, DataType::DOUBLE));
  p.domain = "com.example";
  for (unsigned seed : {3u, 4u}) {
    gradcheck::fillStreams(p.feeds, seed);
    gradcheck::checkGradient(p, seed);
  }
}

TEST(CustomOp, NodeErrorsNameTheNode) {
  loadExamples();
  std::string e = thrown([] {
    run(chainModel({{"com.example", "LeakyRelu", {{"beta", 1.0f}}}}, 4), randomFloats(4, 1));
  });
  EXPECT_NE(e.find("LeakyRelu 'n0'"), std::string::npos) << e;
  EXPECT_NE(e.find("has no attribute 'beta'"), std::string::npos) << e;
  e = thrown([] {
    run(chainModel({{"com.example", "Cube", {}}}, 4, onnx::TensorProto_DataType_INT32), std::vector<int32_t>(4, 1));
  });
  EXPECT_NE(e.find("Cube 'n0'"), std::string::npos) << e;
  EXPECT_NE(e.find("Cube takes FLOAT or DOUBLE, not INT32"), std::string::npos) << e;
  // Without the library, the op is unknown.
  e = thrown([] { run(chainModel({{"com.example", "Square", {}}}, 4), randomFloats(4, 1)); });
  EXPECT_NE(e.find("unsupported op com.example::Square"), std::string::npos) << e;
}

TEST(CustomOp, LoadingTwiceDoesNothing) {
  loadExamples();
  EXPECT_NO_THROW(loadExamples());
}

TEST(CustomOp, LoadsFromTwoThreads) {
  // Each thread loads both libraries, in opposite orders: every load either registers or finds
  // the library loaded, and nothing is registered twice.
  std::string errors[2];
  std::thread a([&] { errors[0] = thrown(loadExamples); });
  std::thread b([&] {
    errors[1] = thrown([] {
      loadCustomOpLibrary(CUBE_LIB);
      loadCustomOpLibrary(LEAKY_RELU_LIB);
    });
  });
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  for (const char *type : {"LeakyRelu", "LeakyReluGrad", "Cube"})
    EXPECT_NE(ir::OpRegistry::instance().find("com.example", type, 1), nullptr) << type;
  int cubes = 0;
  for (const auto &d : ir::OpRegistry::instance().all())
    cubes += d.domain == "com.example" && d.type == "Cube";
  EXPECT_EQ(cubes, 1);
  auto y = run(chainModel({{"com.example", "Cube", {}}}, 2), std::vector<float>{2, -1});
  EXPECT_EQ(y, (std::vector<float>{8, -1}));
}

TEST(CustomOp, RefusesAMissingFile) {
  std::string e = thrown([] { loadCustomOpLibrary("/nonexistent/libnothing.so"); });
  EXPECT_NE(e.find("custom op library '/nonexistent/libnothing.so': cannot load it"), std::string::npos) << e;
}

TEST(CustomOp, RefusesAMissingAbiVersion) {
  std::string e = thrown([] { loadCustomOpLibrary(BAD_NO_ABI_LIB); });
  EXPECT_NE(e.find(BAD_NO_ABI_LIB), std::string::npos) << e;
  EXPECT_NE(e.find("exports no popart_custom_op_abi_version"), std::string::npos) << e;
}

TEST(CustomOp, RefusesAnotherAbiVersion) {
  std::string e = thrown([] { loadCustomOpLibrary(BAD_WRONG_ABI_LIB); });
  EXPECT_NE(e.find("built for custom-op ABI version 2, this runtime has version 1"), std::string::npos) << e;
  EXPECT_EQ(ir::OpRegistry::instance().find("com.example", "WrongAbi", 1), nullptr);
}

TEST(CustomOp, RefusesAMissingEntryPoint) {
  std::string e = thrown([] { loadCustomOpLibrary(BAD_NO_ENTRY_LIB); });
  EXPECT_NE(e.find("exports no popart_register_custom_ops"), std::string::npos) << e;
}

TEST(CustomOp, RefusesAMalformedDefinitionAndRegistersNothing) {
  std::string e = thrown([] { loadCustomOpLibrary(BAD_MALFORMED_LIB); });
  EXPECT_NE(e.find(BAD_MALFORMED_LIB), std::string::npos) << e;
  EXPECT_NE(e.find("op com.example::NoKernel (opsets 1+) is malformed: it has no kernel factory"), std::string::npos)
      << e;
  EXPECT_EQ(ir::OpRegistry::instance().find("com.example", "GoodBeforeMalformed", 1), nullptr);
  // Refused libraries are not remembered as loaded: loading again says the same.
  EXPECT_EQ(thrown([] { loadCustomOpLibrary(BAD_MALFORMED_LIB); }), e);
}

TEST(CustomOp, RefusesABuiltinDomain) {
  std::string e = thrown([] { loadCustomOpLibrary(BAD_RESERVED_DOMAIN_LIB); });
  EXPECT_NE(e.find("its domain must be the library's own, not 'ai.onnx'"), std::string::npos) << e;
}

TEST(CustomOp, RefusesADuplicateOp) {
  loadExamples();
  std::string e = thrown([] { loadCustomOpLibrary(BAD_DUPLICATE_LIB); });
  EXPECT_NE(e.find("op com.example::LeakyRelu (opsets 1+) is already registered by custom op library '"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("set CustomOpDef::override"), std::string::npos) << e;
}

TEST(CustomOp, OverrideReplacesACustomDefinition) {
  loadExamples();
  std::string model = chainModel({{"com.example", "LeakyRelu", {}}}, 2);
  EXPECT_EQ(run(model, std::vector<float>{-1, 3}), (std::vector<float>{-0.01f, 3}));
  loadCustomOpLibrary(OVERRIDE_LEAKY_RELU_LIB);
  EXPECT_EQ(run(model, std::vector<float>{-1, 3}), (std::vector<float>{-2, 6}));
}

TEST(CustomOp, RefusesAFailingRegistration) {
  std::string e = thrown([] { loadCustomOpLibrary(BAD_THROWS_LIB); });
  EXPECT_NE(e.find("its registration failed: the plugin cannot find its configuration"), std::string::npos) << e;
  EXPECT_EQ(ir::OpRegistry::instance().find("com.example", "BeforeThrow", 1), nullptr);
}

TEST(CustomOp, RefusesAnOverrideOfAnUnknownOp) {
  std::string e = thrown([] { loadCustomOpLibrary(BAD_OVERRIDE_UNKNOWN_LIB); });
  EXPECT_NE(e.find("kernel override of ai.onnx::NoSuchOp: no registered op has that domain and type"),
            std::string::npos)
      << e;
}

TEST(CustomOp, OverridesABuiltinKernel) {
  std::string model = chainModel({{"", "Relu", {}}}, 5);
  std::vector<float> x{-2, -0.5f, 0, 0.5f, 2}, want{0, 0, 0, 0.5f, 2};
  loadCustomOpLibrary(RELU_OVERRIDE_LIB);
  void *lib = dlopen(RELU_OVERRIDE_LIB, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto runs = reinterpret_cast<int64_t (*)()>(dlsym(lib, "relu_override_runs"));
  ASSERT_NE(runs, nullptr);
  std::string explanation;
  EXPECT_EQ(run(model, x, 2, "any", &explanation), want);
  EXPECT_EQ(runs(), 1);
  EXPECT_NE(explanation.find("plugin"), std::string::npos) << explanation;
  // DOUBLE: the override declines, the built-in kernels run.
  EXPECT_EQ(run(chainModel({{"", "Relu", {}}}, 2, onnx::TensorProto_DataType_DOUBLE), std::vector<double>{-1, 1}),
            (std::vector<double>{0, 1}));
  EXPECT_EQ(runs(), 1);
  // A session that allows the reference kernels only runs the built-in one.
  EXPECT_EQ(run(model, x, 2, "reference"), want);
  EXPECT_EQ(runs(), 1);
  dlclose(lib);
}

TEST(CustomOp, ProgramsRegisterOpsWithoutALibrary) {
  std::string e = thrown([] {
    registerCustomOps("test program", [](CustomOpRegistrar &r) {
      CustomOpDef def;
      def.domain = "com.example";
      def.type = "NoShapes";
      r.addOp(def);
    });
  });
  EXPECT_EQ(e, "test program: op com.example::NoShapes (opsets 1+) is malformed: it has no shape inference "
               "(inferShapes)");
}

} // namespace
} // namespace popart
