// The FLOAT16 convolution kernels (backend_cpu/dnnl/conv_f16.cpp: oneDNN's f32 primitives on chunks
// of images widened from fp16) against the fp32 reference kernel of the same op on the same fp16
// inputs: Conv, ConvTranspose, ConvDataGrad and ConvWeightGrad with strides, pads, dilations and
// groups, batches of several chunks and a shorter last one, the fused bias, activations and
// residual, a FLOAT output; that oneDNN's entry takes them, and what it declines.

#include "kernel_compare.hpp"
#include "one_op.hpp"

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"
#include "ir/internal_attributes.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace popart;
using backend_cpu::KernelProvider;

namespace {

constexpr DataType F16 = DataType::FLOAT16;
constexpr DataType F32 = DataType::FLOAT;

using test_ops::OneOp;

/// One op of its own graph reading stream inputs \p ins (shape {-1}: omitted); \p prepare sets
/// fusion fields before its setup.
OneOp makeOp(const std::string &type, const std::string &domain, const std::vector<TensorInfo> &ins,
             ir::Attributes attrs, const std::function<void(ir::Op &)> &prepare = {}) {
  return test_ops::makeOneOp(type, domain, domain == "ai.onnx" ? 13 : 1, ins, std::move(attrs), 1, {}, prepare);
}

TensorInfo omitted() { return TensorInfo(F32, {-1}); }

backend_cpu::KernelChoice dnnlChoice(const ir::Op &op) {
  return backend_cpu::KernelRegistry::instance().choose(op, KernelProvider::Dnnl);
}

/// Expects oneDNN's f16 kernel to take \p op and match the fp32 reference within the 16-bit
/// tolerance of a reduction of \p k terms; \returns its choice() ("fp32 chunks of ...").
std::string expectMatches(const ir::Op &op, int64_t k, unsigned seed = 1) {
  backend_cpu::KernelChoice choice = dnnlChoice(op);
  EXPECT_NE(choice.entry, nullptr) << op.type << ": oneDNN declined: " << choice.explanation();
  if (!choice.entry) return {};
  std::string chosen = backend_cpu::createKernel(op, KernelProvider::Dnnl)->choice();
  EXPECT_EQ(chosen.rfind("fp32 chunks of", 0), 0u) << chosen;
  std::mt19937 rng(seed);
  kernel_compare::expectSixteenBitMatchesFp32Reference(
      KernelProvider::Dnnl, op, rng,
      [](size_t, std::mt19937 &r) { return std::uniform_real_distribution<float>(-2, 2)(r); },
      kernel_compare::sixteenBitTolerance(F16, k));
  return chosen;
}

struct Geometry {
  Shape x, w;
  int64_t group = 1;
  std::vector<int64_t> pads, strides, dilations;
};

ir::Attributes convAttrs(const Geometry &g) {
  ir::Attributes a;
  a.set("group", g.group);
  a.set("pads", g.pads);
  a.set("strides", g.strides);
  a.set("dilations", g.dilations);
  return a;
}

std::vector<Geometry> geometries() {
  return {
      {{2, 16, 9, 9}, {32, 16, 3, 3}, 1, {1, 1, 1, 1}, {1, 1}, {1, 1}},
      {{3, 8, 10, 10}, {16, 8, 1, 1}, 1, {0, 0, 0, 0}, {2, 2}, {1, 1}},                // pointwise, strided
      {{2, 16, 8, 8}, {16, 1, 3, 3}, 16, {1, 1, 1, 1}, {1, 1}, {1, 1}},                // depthwise
      {{2, 12, 11, 9}, {18, 4, 3, 2}, 3, {2, 1, 0, 1}, {2, 1}, {2, 3}},                // groups, dilated, uneven pads
      {{3, 3, 17, 17}, {8, 3, 5, 5}, 1, {2, 2, 2, 2}, {2, 2}, {1, 1}},                 // three channels in
      {{3, 4, 20}, {6, 4, 5}, 1, {2, 2}, {1}, {1}},                                    // 1-D
      {{2, 4, 5, 6, 7}, {8, 4, 3, 3, 3}, 1, {1, 1, 1, 1, 1, 1}, {1, 2, 1}, {1, 1, 1}}, // 3-D
      {{13, 16, 16, 16}, {32, 16, 3, 3}, 1, {1, 1, 1, 1}, {1, 1}, {1, 1}},             // chunks of 5, the last of 3
  };
}

} // namespace

TEST(DnnlHalfConv, ConvMatchesTheFp32Reference) {
  for (const Geometry &g : geometries()) {
    SCOPED_TRACE(toString(g.x) + " * " + toString(g.w));
    int64_t k = shapeElementCount(g.w) / g.w[0];
    OneOp plain = makeOp("Conv", "ai.onnx", {TensorInfo(F16, g.x), TensorInfo(F16, g.w)}, convAttrs(g));
    std::string chosen = expectMatches(*plain.op, k);
    if (g.x[0] == 13) {
      EXPECT_NE(chosen.find("chunks of 5 of 13 images (3 chunks"), std::string::npos) << chosen;
    }
    for (DataType biasType : {F16, F32}) {
      OneOp biased =
          makeOp("Conv", "ai.onnx", {TensorInfo(F16, g.x), TensorInfo(F16, g.w), TensorInfo(biasType, {g.w[0]})},
                 convAttrs(g), [](ir::Op &op) { op.fusion.activation.kind = ir::FusedActivation::Kind::Relu; });
      expectMatches(*biased.op, k);
    }
  }
}

TEST(DnnlHalfConv, ConvFusedActivationsResidualAndFloatOutput) {
  const Geometry g{{11, 16, 24, 24}, {16, 16, 3, 3}, 1, {1, 1, 1, 1}, {1, 1}, {1, 1}}; // several chunks
  const int64_t k = 16 * 9;
  const std::vector<TensorInfo> withBias{TensorInfo(F16, g.x), TensorInfo(F16, g.w), TensorInfo(F16, {16})};
  ir::FusedActivation clip{ir::FusedActivation::Kind::Clip, -0.5f, 1.5f};
  OneOp clipped = makeOp("Conv", "ai.onnx", withBias, convAttrs(g), [&](ir::Op &op) { op.fusion.activation = clip; });
  expectMatches(*clipped.op, k);
  OneOp swish = makeOp("Conv", "ai.onnx", withBias, convAttrs(g),
                       [](ir::Op &op) { op.fusion.activation.kind = ir::FusedActivation::Kind::Swish; });
  expectMatches(*swish.op, k);
  // The residual is added before the Relu, with and without a bias.
  for (bool bias : {true, false}) {
    OneOp residual = makeOp("Conv", "ai.onnx",
                            {TensorInfo(F16, g.x), TensorInfo(F16, g.w), bias ? TensorInfo(F16, {16}) : omitted(),
                             TensorInfo(F16, {g.x[0], 16, 24, 24})},
                            convAttrs(g), [](ir::Op &op) {
                              op.fusion.residual = true;
                              op.fusion.activation.kind = ir::FusedActivation::Kind::Relu;
                            });
    SCOPED_TRACE(bias ? "residual and bias" : "residual");
    expectMatches(*residual.op, k);
  }
  // A FLOAT result of FLOAT16 operands is written as computed, rounded once, to fp32.
  OneOp wide = makeOp("Conv", "ai.onnx", withBias, convAttrs(g));
  wide.op->setOutInfo(0, TensorInfo(F32, wide.op->outInfo(0).shape()));
  expectMatches(*wide.op, k);
}

TEST(DnnlHalfConv, GradientsMatchTheFp32Reference) {
  for (const Geometry &g : geometries()) {
    SCOPED_TRACE(toString(g.x) + " * " + toString(g.w));
    OneOp conv = makeOp("Conv", "ai.onnx", {TensorInfo(F16, g.x), TensorInfo(F16, g.w)}, convAttrs(g));
    Shape y = conv.op->outInfo(0).shape();
    ir::Attributes data = convAttrs(g), weights = convAttrs(g);
    data.set("input_shape", std::vector<int64_t>(g.x.begin(), g.x.end()));
    data.set("kernel_shape", std::vector<int64_t>(g.w.begin() + 2, g.w.end()));
    weights.set("weight_shape", std::vector<int64_t>(g.w.begin(), g.w.end()));
    weights.set("kernel_shape", std::vector<int64_t>(g.w.begin() + 2, g.w.end()));
    OneOp dx = makeOp("ConvDataGrad", "ai.graphcore", {TensorInfo(F16, y), TensorInfo(F16, g.w)}, data);
    expectMatches(*dx.op, shapeElementCount(g.w) / g.w[1] / g.group);
    // dW sums over the batch and the positions: the chunks' sums are added in fp32.
    OneOp dw = makeOp("ConvWeightGrad", "ai.graphcore", {TensorInfo(F16, y), TensorInfo(F16, g.x)}, weights);
    std::string chosen = expectMatches(*dw.op, shapeElementCount(y) / y[1]);
    if (g.x[0] == 13) {
      EXPECT_NE(chosen.find("(3 chunks"), std::string::npos) << chosen;
    }
    OneOp wide = makeOp("ConvWeightGrad", "ai.graphcore", {TensorInfo(F16, y), TensorInfo(F16, g.x)}, weights);
    wide.op->setOutInfo(0, TensorInfo(F32, wide.op->outInfo(0).shape()));
    expectMatches(*wide.op, shapeElementCount(y) / y[1]);
  }
}

TEST(DnnlHalfConv, ConvTransposeMatchesTheFp32Reference) {
  ir::Attributes a;
  a.set("strides", std::vector<int64_t>{2, 2});
  a.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  a.set("output_padding", std::vector<int64_t>{1, 1});
  a.set("group", int64_t{2});
  OneOp o = makeOp("ConvTranspose", "ai.onnx",
                   {TensorInfo(F16, {9, 8, 20, 20}), TensorInfo(F16, {8, 6, 3, 3}), TensorInfo(F16, {12})}, a);
  expectMatches(*o.op, 4 * 9);
}

TEST(DnnlHalfConv, TakesFloat16AndDeclinesWhatItCannotDo) {
  const Geometry g{{2, 8, 8, 8}, {8, 8, 3, 3}, 1, {1, 1, 1, 1}, {1, 1}, {1, 1}};
  OneOp f16 = makeOp("Conv", "ai.onnx", {TensorInfo(F16, g.x), TensorInfo(F16, g.w)}, convAttrs(g));
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*f16.op)->provider, KernelProvider::Dnnl);
  // fp32 and bf16 stay on the oneDNN kernels of their own types; bf16 is declined where oneDNN
  // computes none (an AVX2-only CPU), not handed to the f32 chunks.
  for (DataType t : {F32, DataType::BFLOAT16}) {
    OneOp o = makeOp("Conv", "ai.onnx", {TensorInfo(t, g.x), TensorInfo(t, g.w)}, convAttrs(g));
    if (!backend_cpu::dnnlComputesIn(t)) {
      kernel_compare::expectDnnlDeclinesOnThisCpu(*o.op, t);
      continue;
    }
    EXPECT_EQ(backend_cpu::createKernel(*o.op, KernelProvider::Dnnl)->choice().find("fp32 chunks"), std::string::npos);
  }
  auto reasons = [](const ir::Op &op) {
    backend_cpu::KernelChoice choice = dnnlChoice(op);
    EXPECT_EQ(choice.entry, nullptr);
    std::string all;
    for (const auto &d : choice.declined)
      all += d + "; ";
    return all;
  };
  OneOp partials = makeOp("Conv", "ai.onnx", {TensorInfo(F16, g.x), TensorInfo(F16, g.w)}, convAttrs(g));
  partials.op->attrs.set(ir::internal_attr::kHalfPartials, int64_t{1});
  EXPECT_NE(reasons(*partials.op).find("fp16.16"), std::string::npos);
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*partials.op)->provider, KernelProvider::Reference);
  // A fused max pool is pooled in the f32 chunks (test_dnnl_convpool16.cpp).
  OneOp pooled = makeOp("Conv", "ai.onnx", {TensorInfo(F16, g.x), TensorInfo(F16, g.w)}, convAttrs(g), [](ir::Op &op) {
    op.fusion.pool = ir::FusedPool{{2, 2}, {2, 2}, {0, 0, 0, 0}, {2, 8, 8, 8}};
  });
  EXPECT_NE(backend_cpu::createKernel(*pooled.op, KernelProvider::Dnnl)->choice().find("max pool"), std::string::npos);
  OneOp clipResidual =
      makeOp("Conv", "ai.onnx", {TensorInfo(F16, g.x), TensorInfo(F16, g.w), omitted(), TensorInfo(F16, {2, 8, 8, 8})},
             convAttrs(g), [](ir::Op &op) {
               op.fusion.residual = true;
               op.fusion.activation = {ir::FusedActivation::Kind::Clip, 0.f, 6.f};
             });
  EXPECT_NE(reasons(*clipResidual.op).find("residual with an activation other than Relu"), std::string::npos);
}
