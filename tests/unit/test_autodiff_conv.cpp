// Gradients of Conv, ConvTranspose and AveragePool: the rules checked against central finite
// differences in double over varied geometry, and the oneDNN kernels of the grad ops they
// create checked against the reference kernels on random fp32 data.

#include "gradcheck.hpp"
#include "kernel_compare.hpp"

#include "backend_cpu/kernel.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace popart;
using backend_cpu::KernelProvider;
using Ints = std::vector<int64_t>;

namespace {

/// One forward op whose inputs x0, x1, ... (X, W, B) all get gradients.
struct Case {
  std::string type;
  std::vector<Shape> shapes;
  ir::Attributes attrs;
  int opset = 17;
};

/// The graph y = w·op(x...) with uneven weights w, its inputs in \p type.
gradcheck::Problem problem(const Case &c, DataType type) {
  return {c.type, c.opset, c.attrs, gradcheck::streamsThenConsts(c.shapes, type)};
}

/// Builds the graph of \p c, with the gradients of every x if \p grads.
std::unique_ptr<ir::Graph> buildGraph(const Case &c, DataType type, std::vector<TensorId> *grads) {
  return gradcheck::buildGraph(problem(c, type), grads);
}

void checkGradient(const Case &c, unsigned seed) {
  SCOPED_TRACE(c.type + " seed " + std::to_string(seed));
  gradcheck::Problem p = problem(c, DataType::DOUBLE);
  gradcheck::fillStreams(p.feeds, seed);
  gradcheck::checkGradient(p, seed);
}

using gradcheck::attrs;

/// The ai.graphcore grad ops that the rule for \p c creates (fp32 graph).
std::vector<std::string> gradOpTypes(const Case &c) {
  std::vector<TensorId> grads;
  auto g = buildGraph(c, DataType::FLOAT, &grads);
  std::vector<std::string> types;
  for (const auto &op : g->ops())
    if (op->domain == "ai.graphcore") types.push_back(op->type);
  return types;
}

} // namespace

TEST(AutodiffConv, TwoDStridesDilationsAsymmetricPads) {
  checkGradient({"Conv",
                 {{2, 3, 5, 6}, {4, 3, 3, 2}, {4}},
                 attrs({{"strides", Ints{2, 1}}, {"pads", Ints{1, 0, 2, 1}}, {"dilations", Ints{1, 2}}})},
                1);
  checkGradient({"Conv", {{1, 2, 4, 4}, {3, 2, 2, 2}}, {}}, 2); // no bias
}

TEST(AutodiffConv, Groups) {
  checkGradient({"Conv",
                 {{1, 4, 6, 5}, {6, 2, 3, 3}, {6}},
                 attrs({{"group", int64_t{2}}, {"dilations", Ints{2, 1}}, {"pads", Ints{0, 1, 1, 0}}})},
                3);
  checkGradient({"Conv", {{2, 3, 5, 5}, {3, 1, 2, 2}}, attrs({{"group", int64_t{3}}, {"strides", Ints{2, 2}}})},
                4); // depthwise
}

TEST(AutodiffConv, AutoPad) {
  for (const char *ap : {"SAME_UPPER", "SAME_LOWER"})
    checkGradient(
        {"Conv", {{1, 2, 5, 7}, {3, 2, 3, 4}, {3}}, attrs({{"auto_pad", std::string(ap)}, {"strides", Ints{2, 2}}})},
        5);
  checkGradient(
      {"Conv", {{1, 2, 5, 6}, {2, 2, 2, 3}}, attrs({{"auto_pad", std::string("VALID")}, {"strides", Ints{2, 1}}})}, 6);
}

TEST(AutodiffConv, OneDAndThreeD) {
  checkGradient({"Conv",
                 {{2, 3, 9}, {2, 3, 3}, {2}},
                 attrs({{"strides", Ints{3}}, {"dilations", Ints{2}}, {"pads", Ints{2, 1}}})},
                7);
  checkGradient({"Conv",
                 {{1, 2, 4, 3, 5}, {4, 1, 2, 2, 3}, {4}},
                 attrs({{"group", int64_t{2}}, {"strides", Ints{1, 2, 1}}, {"pads", Ints{1, 0, 0, 1, 1, 0}}})},
                8);
}

TEST(AutodiffConvTranspose, StridesPadsOutputPadding) {
  checkGradient({"ConvTranspose",
                 {{1, 2, 3, 4}, {2, 3, 3, 2}, {3}},
                 attrs({{"strides", Ints{2, 3}}, {"pads", Ints{1, 0, 0, 1}}, {"output_padding", Ints{1, 2}}})},
                11);
  checkGradient({"ConvTranspose",
                 {{2, 4, 3, 3}, {4, 1, 2, 3}, {2}},
                 attrs({{"group", int64_t{2}}, {"dilations", Ints{2, 1}}, {"strides", Ints{1, 2}}})},
                12);
}

TEST(AutodiffConvTranspose, OutputShapeAndAutoPad) {
  // Larger than the natural 7x7: negative pads, which the rule turns into a crop of dY.
  checkGradient(
      {"ConvTranspose", {{1, 1, 3, 3}, {1, 2, 3, 3}}, attrs({{"strides", Ints{2, 2}}, {"output_shape", Ints{8, 9}}})},
      13);
  checkGradient({"ConvTranspose",
                 {{1, 2, 3, 3}, {2, 1, 3, 3}, {1}},
                 attrs({{"strides", Ints{2, 2}}, {"output_shape", Ints{6, 5}}})},
                14);
  // Stride 1, two beyond the natural 4: both pads -1, so dY is cropped at both ends.
  checkGradient({"ConvTranspose", {{2, 2, 3}, {2, 2, 2}, {2}}, attrs({{"output_shape", Ints{6}}})}, 18);
  for (const char *ap : {"SAME_UPPER", "SAME_LOWER"})
    checkGradient({"ConvTranspose",
                   {{1, 2, 3, 4}, {2, 1, 3, 2}, {1}},
                   attrs({{"auto_pad", std::string(ap)}, {"strides", Ints{2, 3}}})},
                  15);
}

TEST(AutodiffConvTranspose, OneDAndThreeD) {
  checkGradient(
      {"ConvTranspose",
       {{2, 2, 5}, {2, 3, 3}, {3}},
       attrs({{"strides", Ints{2}}, {"pads", Ints{1, 2}}, {"output_padding", Ints{1}}, {"dilations", Ints{2}}})},
      16);
  checkGradient({"ConvTranspose",
                 {{1, 2, 2, 3, 2}, {2, 1, 2, 2, 3}},
                 attrs({{"group", int64_t{2}}, {"strides", Ints{2, 1, 2}}, {"pads", Ints{0, 1, 1, 1, 0, 0}}})},
                17);
}

TEST(AutodiffAveragePool, PadsAndCountIncludePad) {
  for (int64_t include : {0, 1})
    checkGradient({"AveragePool",
                   {{2, 2, 5, 6}},
                   attrs({{"kernel_shape", Ints{3, 2}},
                          {"strides", Ints{2, 1}},
                          {"pads", Ints{1, 0, 1, 1}},
                          {"count_include_pad", include}})},
                  21);
}

TEST(AutodiffAveragePool, CeilModeAndAutoPad) {
  for (int64_t include : {0, 1}) {
    checkGradient({"AveragePool",
                   {{1, 2, 6, 7}},
                   attrs({{"kernel_shape", Ints{3, 3}},
                          {"strides", Ints{2, 2}},
                          {"pads", Ints{0, 1, 0, 0}},
                          {"ceil_mode", int64_t{1}},
                          {"count_include_pad", include}})},
                  22);
    for (const char *ap : {"SAME_UPPER", "SAME_LOWER"})
      checkGradient({"AveragePool",
                     {{1, 1, 5, 6}},
                     attrs({{"kernel_shape", Ints{2, 3}},
                            {"strides", Ints{2, 2}},
                            {"auto_pad", std::string(ap)},
                            {"count_include_pad", include}})},
                    23);
  }
}

TEST(AutodiffAveragePool, OneDAndThreeD) {
  checkGradient(
      {"AveragePool", {{2, 3, 8}}, attrs({{"kernel_shape", Ints{3}}, {"strides", Ints{2}}, {"pads", Ints{2, 1}}})}, 24);
  checkGradient({"AveragePool",
                 {{1, 2, 4, 5, 3}},
                 attrs({{"kernel_shape", Ints{2, 3, 2}},
                        {"strides", Ints{2, 2, 1}},
                        {"pads", Ints{1, 0, 0, 0, 1, 1}},
                        {"count_include_pad", int64_t{1}}})},
                25);
}

TEST(AutodiffConv, RulesUseTheGradOps) {
  EXPECT_EQ(gradOpTypes({"Conv", {{1, 2, 4, 4}, {3, 2, 2, 2}}, {}}),
            (std::vector<std::string>{"ConvDataGrad", "ConvWeightGrad"}));
  EXPECT_EQ(gradOpTypes({"ConvTranspose", {{1, 2, 4, 4}, {2, 3, 2, 2}}, {}}),
            (std::vector<std::string>{"ConvWeightGrad"})); // dX is a forward Conv
  EXPECT_EQ(gradOpTypes({"AveragePool", {{1, 2, 4, 4}}, attrs({{"kernel_shape", Ints{2, 2}}})}),
            (std::vector<std::string>{"AveragePoolGrad"}));
}

TEST(ConvGradOps, SetupChecksTheGeometry) {
  ir::registerBuiltinOps();
  ir::Graph g;
  g.addTensor("dy", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {1, 3, 4, 4}));
  g.addTensor("w", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, {3, 2, 3, 3}));
  ir::Attributes a = attrs({{"strides", Ints{1, 1}},
                            {"dilations", Ints{1, 1}},
                            {"pads", Ints{0, 0, 0, 0}},
                            {"input_shape", Ints{1, 2, 7, 6}}}); // gives 5x4 outputs, not 4x4
  ir::Op &op = g.addOp("ConvDataGrad", "ai.graphcore", 1, "dgrad", a, {"dy", "w"}, {"dx"});
  try {
    op.def->setup(op);
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("ConvDataGrad 'dgrad': output gradient has 4 positions on spatial axis 0"),
              std::string::npos)
        << e.what();
  }
}

namespace {

/// Runs every grad op that the rule for \p c creates with oneDNN and with the reference kernel on
/// random inputs and compares; \p dnnl says whether oneDNN is expected to take each of them.
void compareGradKernels(const Case &c, unsigned seed, bool dnnl = true) {
  SCOPED_TRACE(c.type + " seed " + std::to_string(seed));
  backend_cpu::registerBuiltinKernels();
  std::vector<TensorId> grads;
  auto g = buildGraph(c, DataType::FLOAT, &grads);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  int seen = 0;
  for (const auto &op : g->ops()) {
    if (op->domain != "ai.graphcore") continue;
    ++seen;
    const backend_cpu::KernelEntry *fast = backend_cpu::KernelRegistry::instance().find(*op, KernelProvider::Dnnl);
    ASSERT_EQ(fast != nullptr, dnnl) << op->type << ": oneDNN " << (dnnl ? "declined" : "accepted") << " it";
    if (!fast) continue;
    kernel_compare::expectDnnlMatchesReference(*op, rng, [&](size_t, std::mt19937 &r) { return d(r); });
  }
  EXPECT_GT(seen, 0) << "the rule created no grad op";
}

} // namespace

TEST(DnnlVsReference, ConvGradKernels) {
  compareGradKernels({"Conv",
                      {{2, 3, 7, 6}, {4, 3, 3, 2}, {4}},
                      attrs({{"strides", Ints{2, 1}}, {"pads", Ints{1, 0, 2, 1}}, {"dilations", Ints{1, 2}}})},
                     1);
  compareGradKernels(
      {"Conv", {{2, 4, 6, 5}, {6, 2, 3, 3}}, attrs({{"group", int64_t{2}}, {"auto_pad", std::string("SAME_LOWER")}})},
      2);
  compareGradKernels({"Conv", {{3, 3, 10}, {5, 3, 4}}, attrs({{"strides", Ints{3}}, {"pads", Ints{0, 2}}})}, 3);
  compareGradKernels(
      {"Conv",
       {{1, 2, 5, 4, 6}, {3, 2, 2, 3, 2}},
       attrs({{"strides", Ints{1, 2, 2}}, {"pads", Ints{1, 0, 0, 0, 1, 1}}, {"dilations", Ints{2, 1, 1}}})},
      4);
  compareGradKernels({"Conv", {{8, 16, 12, 12}, {32, 16, 3, 3}}, attrs({{"pads", Ints{1, 1, 1, 1}}})}, 5);
  // Pointwise: plain layouts (one GEMM per image), with and without a stride.
  compareGradKernels({"Conv", {{3, 24, 7, 5}, {40, 24, 1, 1}}, attrs({})}, 6);
  compareGradKernels({"Conv", {{2, 16, 9, 8}, {8, 16, 1, 1}, {8}}, attrs({{"strides", Ints{2, 2}}})}, 7);
}

TEST(DepthwiseWeightGrad, PlaneKernelMatchesTheDefinition) {
  // The fast family's vectorised depthwise ConvWeightGrad (oneDNN declines it) against the sum that defines it,
  // in double: dW[c, u, v] = Σ dY[b, c, r, j] · X[b, c, r·sh + u − pt, j·sw + v − pl].
  struct Geometry {
    Shape x, w;
    Ints strides, pads;
  };
  const Geometry cases[] = {{{2, 6, 9, 8}, {6, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}},
                            {{3, 5, 11, 10}, {5, 1, 5, 5}, {2, 2}, {2, 2, 2, 2}},
                            {{1, 4, 7, 12}, {4, 1, 3, 2}, {2, 1}, {0, 1, 2, 1}},
                            {{2, 3, 30, 40}, {3, 1, 5, 5}, {1, 1}, {2, 2, 2, 2}}};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (const Geometry &c : cases) {
    std::vector<TensorId> grads;
    auto g = buildGraph({"Conv", {c.x, c.w}, attrs({{"group", c.x[1]}, {"strides", c.strides}, {"pads", c.pads}})},
                        DataType::FLOAT, &grads);
    int seen = 0;
    for (const auto &op : g->ops()) {
      if (op->type != "ConvWeightGrad") continue;
      ++seen;
      ASSERT_TRUE(backend_cpu::depthwiseWeightGrad(*op));
      EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*op, KernelProvider::Dnnl), nullptr);
      const Shape &dyShape = op->inInfo(0).shape();
      TensorData dy(op->inInfo(0)), x(op->inInfo(1)), dw(op->outInfo(0));
      for (int64_t i = 0; i < dy.info().elementCount(); ++i)
        dy.as<float>()[i] = d(rng);
      for (int64_t i = 0; i < x.info().elementCount(); ++i)
        x.as<float>()[i] = d(rng);
      std::fill(dw.as<float>(), dw.as<float>() + dw.info().elementCount(), 1e6f);
      const void *in[] = {dy.data(), x.data()};
      void *out[] = {dw.data()};
      auto kernel = backend_cpu::createKernel(*op, KernelProvider::Fast);
      kernel->run({in, 2, out, 1});
      kernel->run({in, 2, out, 1}); // a second run must not accumulate
      int64_t n = c.x[0], ch = c.x[1], h = c.x[2], w = c.x[3], oh = dyShape[2], ow = dyShape[3];
      double worst = 0;
      for (int64_t k = 0; k < ch; ++k)
        for (int64_t u = 0; u < c.w[2]; ++u)
          for (int64_t v = 0; v < c.w[3]; ++v) {
            double want = 0;
            for (int64_t b = 0; b < n; ++b)
              for (int64_t r = 0; r < oh; ++r)
                for (int64_t j = 0; j < ow; ++j) {
                  int64_t ih = r * c.strides[0] + u - c.pads[0], iw = j * c.strides[1] + v - c.pads[1];
                  if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                  want += double(dy.as<float>()[((b * ch + k) * oh + r) * ow + j]) *
                          double(x.as<float>()[((b * ch + k) * h + ih) * w + iw]);
                }
            double got = dw.as<float>()[(k * c.w[2] + u) * c.w[3] + v];
            worst = kernel_compare::worseOf(worst, kernel_compare::relDiff(got, want));
          }
      EXPECT_LT(worst, 1e-5) << "x " << c.x[2] << "x" << c.x[3] << ", kernel " << c.w[2] << "x" << c.w[3];
    }
    EXPECT_EQ(seen, 1);
  }
}

TEST(DnnlVsReference, ConvTransposeWeightGradKernel) {
  compareGradKernels({"ConvTranspose",
                      {{2, 4, 3, 4}, {4, 3, 3, 2}},
                      attrs({{"group", int64_t{2}}, {"strides", Ints{2, 2}}, {"pads", Ints{1, 0, 1, 1}}})},
                     6);
  // output_padding below the stride: the end pad of the transposed convolution stays >= 0.
  compareGradKernels(
      {"ConvTranspose", {{1, 2, 3, 3}, {2, 2, 3, 3}}, attrs({{"strides", Ints{2, 2}}, {"output_padding", Ints{1, 1}}})},
      7);
  // output_shape beyond the natural size: a negative begin pad, which oneDNN declines.
  compareGradKernels(
      {"ConvTranspose", {{1, 2, 3, 3}, {2, 2, 3, 3}}, attrs({{"strides", Ints{2, 2}}, {"output_shape", Ints{9, 9}}})},
      13, false);
}

TEST(DnnlVsReference, AveragePoolGradKernel) {
  for (int64_t include : {0, 1}) {
    compareGradKernels({"AveragePool",
                        {{2, 3, 7, 8}},
                        attrs({{"kernel_shape", Ints{3, 2}},
                               {"strides", Ints{2, 2}},
                               {"pads", Ints{1, 0, 1, 1}},
                               {"count_include_pad", include}})},
                       8);
    compareGradKernels({"AveragePool", {{2, 3, 9}}, attrs({{"kernel_shape", Ints{3}}, {"count_include_pad", include}})},
                       9);
    compareGradKernels({"AveragePool",
                        {{1, 2, 4, 5, 6}},
                        attrs({{"kernel_shape", Ints{2, 2, 3}},
                               {"strides", Ints{1, 2, 2}},
                               {"auto_pad", std::string("SAME_UPPER")},
                               {"count_include_pad", include}})},
                       10);
  }
  compareGradKernels({"AveragePool",
                      {{1, 2, 6, 7}},
                      attrs({{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}}, {"ceil_mode", int64_t{1}}})},
                     11);
  // ceil_mode whose extra window reaches past the end padding, counted with the padding: declined.
  compareGradKernels({"AveragePool",
                      {{1, 2, 6, 7}},
                      attrs({{"kernel_shape", Ints{3, 3}},
                             {"strides", Ints{2, 2}},
                             {"ceil_mode", int64_t{1}},
                             {"count_include_pad", int64_t{1}}})},
                     12, false);
}

namespace {

/// The gradients of \p c's inputs in \p type, from inputs \p values (exact in float16).
std::vector<std::vector<double>> gradientsIn(const Case &c, DataType type,
                                             const std::vector<std::vector<double>> &values) {
  gradcheck::Problem p = problem(c, type);
  for (size_t i = 0; i < values.size(); ++i)
    p.feeds[i].data = TensorData::fromDoubles(type, c.shapes[i], values[i]);
  gradcheck::OpNet net(p, true);
  net.run(p.feeds);
  std::vector<std::vector<double>> out;
  for (const auto &id : net.gradIds())
    out.push_back(net.value(id).toDoubleVector());
  return out;
}

} // namespace

TEST(AutodiffConv, Float16GradOpsMatchFloat) {
  // Inputs on a coarse grid (exact in float16); the 16-bit kernels sum in float scratch. The
  // tolerance covers rounding of the loss weights and of each op's result to float16.
  for (const Case &c :
       {Case{"Conv", {{2, 4, 6, 5}, {6, 2, 3, 3}}, attrs({{"group", int64_t{2}}, {"pads", Ints{1, 0, 1, 2}}})},
        Case{"AveragePool", {{2, 3, 7, 6}}, attrs({{"kernel_shape", Ints{3, 2}}, {"strides", Ints{2, 1}}})}}) {
    std::mt19937 rng(31);
    std::uniform_int_distribution<int> d(-8, 8);
    std::vector<std::vector<double>> values;
    for (const Shape &s : c.shapes) {
      values.emplace_back(static_cast<size_t>(shapeElementCount(s)));
      for (double &v : values.back())
        v = d(rng) / 8.0;
    }
    auto half = gradientsIn(c, DataType::FLOAT16, values), full = gradientsIn(c, DataType::FLOAT, values);
    ASSERT_EQ(half.size(), full.size());
    for (size_t i = 0; i < half.size(); ++i)
      for (size_t k = 0; k < half[i].size(); ++k)
        ASSERT_NEAR(half[i][k], full[i][k], 1e-2 * (1 + std::fabs(full[i][k])))
            << c.type << " d/dx" << i << "[" << k << "]";
  }
}
