// The fast pooling and convolution-gradient kernels (backend_cpu/fast/convpool.cpp, convgrad.cpp)
// against the reference kernels: MaxPool and MaxPoolGrad over windows that tile the plane (the
// 2×2 / 2 path and the general one, rows and columns no window covers, gaps between windows,
// ties, infinities, NaNs, the fused Relu gradient) and the depthwise ConvWeightGrad; and the
// cases the fast kernels must decline.

#include "fast_cases.hpp"

#include "backend_cpu/kernel.hpp"
#include "backend_cpu/kernel_families.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace popart;
using backend_cpu::KernelProvider;
using Ints = std::vector<int64_t>;

POPART_FAST_KERNEL_COMPARED("ai.onnx", "MaxPool");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "MaxPoolGrad");
POPART_FAST_KERNEL_COMPARED("ai.graphcore", "ConvWeightGrad");

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

/// A graph of one op on stream inputs of \p inputs, with fusion \p fusion.
struct OneOp {
  std::unique_ptr<ir::Graph> graph = std::make_unique<ir::Graph>();
  ir::Op *op = nullptr;
};

OneOp oneOp(const std::string &type, const std::string &domain, int version, ir::Attributes attrs,
            const std::vector<TensorInfo> &inputs, const ir::Fusion &fusion = {}) {
  ir::registerBuiltinOps();
  backend_cpu::registerBuiltinKernels();
  OneOp o;
  o.graph->opsets()["ai.onnx"] = 13;
  const std::vector<TensorId> names{"a", "b", "c"};
  std::vector<TensorId> ids(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    o.graph->addTensor(ids[i], ir::TensorKind::Stream, inputs[i]);
    o.graph->addInput(ids[i]);
  }
  o.op = &o.graph->addOp(type, domain, version, "op", std::move(attrs), ids, {"y"});
  o.op->fusion = fusion;
  o.graph->addOutput("y");
  ir::inferShapes(*o.graph, nullptr);
  return o;
}

/// Output 0 of \p op run by \p provider's kernel on \p inputs. The output starts as garbage and
/// the kernel runs twice: a second run must not accumulate.
TensorData run(const ir::Op &op, KernelProvider provider, const std::vector<TensorData> &inputs) {
  std::vector<const void *> in;
  for (const TensorData &t : inputs)
    in.push_back(t.data());
  const TensorInfo &info = op.outInfo(0);
  TensorData out =
      TensorData::fromDoubles(info.dataType(), info.shape(), std::vector<double>(info.elementCount(), 1e6));
  void *o = out.data();
  auto kernel = backend_cpu::createKernel(op, provider);
  kernel->run({in.data(), in.size(), &o, 1});
  kernel->run({in.data(), in.size(), &o, 1});
  return out;
}

/// Whether the fast provider takes \p op, and what the reference and the fast kernel give.
struct Outputs {
  TensorData fast, reference;
};

Outputs runBoth(const ir::Op &op, const std::vector<TensorData> &inputs) {
  // The fast kernel must take the op: a comparison that ran the reference twice could not fail.
  EXPECT_NE(backend_cpu::KernelRegistry::instance().find(op, KernelProvider::Fast), nullptr)
      << "the fast provider declines " << op.type << ": "
      << backend_cpu::KernelRegistry::instance().choose(op, KernelProvider::Fast).explanation();
  // Production runs it too: oneDNN declines the op in favour of the fast kernel.
  backend_cpu::KernelChoice any = backend_cpu::KernelRegistry::instance().choose(op, KernelProvider::Any);
  EXPECT_TRUE(any.entry && any.entry->provider == KernelProvider::Fast)
      << op.type << " does not run the fast kernel by default: " << any.explanation();
  EXPECT_NE(any.explanation().find("oneDNN declined: "), std::string::npos) << any.explanation();
  EXPECT_NE(any.explanation().find("the fast kernel"), std::string::npos) << any.explanation();
  return {run(op, KernelProvider::Fast, inputs), run(op, KernelProvider::Reference, inputs)};
}

/// Expects \p got and \p want to hold the same values, NaN where the other has NaN (a maximum
/// or a single contribution is exact: no rounding to allow for).
void expectSame(const TensorData &got, const TensorData &want, const std::string &what) {
  ASSERT_EQ(got.info().elementCount(), want.info().elementCount()) << what;
  int shown = 0;
  for (int64_t i = 0; i < got.info().elementCount(); ++i) {
    float g = got.as<float>()[i], w = want.as<float>()[i];
    bool same = g == w || (std::isnan(g) && std::isnan(w));
    EXPECT_TRUE(same) << what << ": element " << i << " fast " << g << ", reference " << w;
    if (!same && ++shown == 5) return;
  }
}

TensorData floats(const Shape &shape, const std::vector<float> &values) {
  TensorData t(TensorInfo(DataType::FLOAT, shape));
  std::copy(values.begin(), values.end(), t.as<float>());
  return t;
}

/// \p n values: uniform in [-2, 2), or integers in [-levels, levels] (ties and zeros) when
/// \p levels > 0; a fraction \p infinities of them ±infinity.
std::vector<float> values(int64_t n, std::mt19937 &rng, int levels, double infinities = 0) {
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  std::uniform_int_distribution<int> small(-levels, levels);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (float &x : v) {
    x = levels > 0 ? static_cast<float>(small(rng)) : d(rng);
    if (u(rng) < infinities) x = u(rng) < 0.5 ? kInf : -kInf;
  }
  return v;
}

/// A pool over windows that tile the plane: X's shape, kernel and strides (no padding).
struct Tiling {
  Shape x;
  Ints kernel, strides;
  std::string what;
};

/// Output extent of a floor-rounded window on \p in.
int64_t outExtent(int64_t in, int64_t k, int64_t s) { return (in - k) / s + 1; }

/// The geometries the fast pool kernels take: the 2×2 / 2 pool with and without a row and column
/// that no window covers, batch and channels > 1, larger windows, a kernel that differs from the
/// stride (gaps between windows), non-square windows, 1×1 windows, and planes large enough to
/// thread.
std::vector<Tiling> tilings() {
  return {{{2, 3, 8, 10}, {2, 2}, {2, 2}, "2x2/2 even"},
          {{2, 3, 9, 7}, {2, 2}, {2, 2}, "2x2/2 with an uncovered row and column"},
          {{1, 1, 2, 2}, {2, 2}, {2, 2}, "2x2/2 one window"},
          {{3, 2, 6, 33}, {2, 2}, {2, 2}, "2x2/2 wide rows"},
          {{1, 2, 9, 9}, {3, 3}, {3, 3}, "3x3/3"},
          {{2, 2, 11, 10}, {3, 3}, {3, 3}, "3x3/3 with remainders"},
          {{1, 2, 8, 8}, {2, 2}, {3, 3}, "2x2/3 gaps"},
          {{2, 3, 11, 13}, {2, 3}, {3, 4}, "2x3/3x4"},
          {{2, 2, 10, 9}, {2, 2}, {2, 3}, "2x2/2x3"},
          {{2, 2, 9, 10}, {3, 2}, {3, 2}, "3x2/3x2"},
          {{1, 3, 5, 4}, {1, 1}, {1, 1}, "1x1/1"},
          {{1, 2, 7, 9}, {1, 2}, {2, 2}, "1x2/2"},
          {{4, 16, 32, 30}, {2, 2}, {2, 2}, "2x2/2 threaded"},
          {{4, 16, 27, 31}, {3, 3}, {3, 3}, "3x3/3 threaded"}};
}

ir::Attributes poolAttrs(const Tiling &t) {
  ir::Attributes a;
  a.set("kernel_shape", t.kernel);
  a.set("strides", t.strides);
  return a;
}

OneOp maxPool(const Tiling &t, ir::Attributes a) {
  return oneOp("MaxPool", "", 12, std::move(a), {TensorInfo(DataType::FLOAT, t.x)});
}

Shape pooledShape(const Tiling &t) {
  return {t.x[0], t.x[1], outExtent(t.x[2], t.kernel[0], t.strides[0]), outExtent(t.x[3], t.kernel[1], t.strides[1])};
}

OneOp maxPoolGrad(const Tiling &t, bool relu, const Shape &dy) {
  ir::Attributes a = poolAttrs(t);
  a.set("dilations", Ints{1, 1});
  a.set("pads", Ints{0, 0, 0, 0});
  ir::Fusion fusion;
  if (relu) fusion.activation.kind = ir::FusedActivation::Kind::Relu;
  return oneOp("MaxPoolGrad", "ai.graphcore", 1, std::move(a),
               {TensorInfo(DataType::FLOAT, t.x), TensorInfo(DataType::FLOAT, dy)}, fusion);
}

OneOp maxPoolGrad(const Tiling &t, bool relu) { return maxPoolGrad(t, relu, pooledShape(t)); }

/// Offset of tap (u, v) of window (r, j) in plane p of X.
int64_t tapAt(const Tiling &t, int64_t p, int64_t r, int64_t j, int64_t u, int64_t v) {
  return (p * t.x[2] + r * t.strides[0] + u) * t.x[3] + j * t.strides[1] + v;
}

bool isTwoByTwoPath(const Tiling &t) { return t.kernel == Ints{2, 2} && t.strides == Ints{2, 2}; }

} // namespace

TEST(FastConvPool, MaxPoolOverTilingWindowsMatchesTheReference) {
  unsigned seed = 500;
  for (const Tiling &t : tilings())
    for (int levels : {0, 2}) // random values, and small integers (ties)
      for (double infinities : {0.0, 0.1}) {
        std::mt19937 rng(seed++);
        OneOp o = maxPool(t, poolAttrs(t));
        TensorData x = floats(t.x, values(shapeElementCount(t.x), rng, levels, infinities));
        Outputs r = runBoth(*o.op, {x});
        expectSame(r.fast, r.reference, t.what + (levels ? ", ties" : "") + (infinities > 0 ? ", infinities" : ""));
      }
}

TEST(FastConvPool, MaxPoolCeilModeThatAddsNoWindowIsFast) {
  // ceil_mode with windows that end on the input's edge gives the floor shape: still tiled.
  Tiling t{{2, 3, 8, 9}, {2, 3}, {2, 3}, "ceil_mode, no extra window"};
  ir::Attributes a = poolAttrs(t);
  a.set("ceil_mode", int64_t{1});
  OneOp o = maxPool(t, a);
  ASSERT_EQ(o.op->outInfo(0).shape(), pooledShape(t));
  std::mt19937 rng(530);
  TensorData x = floats(t.x, values(shapeElementCount(t.x), rng, 0));
  Outputs r = runBoth(*o.op, {x});
  expectSame(r.fast, r.reference, t.what);
}

TEST(FastConvPool, MaxPoolWindowsThatDoNotTileRunTheSeparableKernel) {
  // The tiled kernel declines them (its reason named), the separable one takes them.
  Tiling t{{1, 2, 9, 9}, {2, 2}, {2, 2}, ""};
  auto expectSeparable = [&](const OneOp &o, const std::string &tiledReason) {
    EXPECT_FALSE(backend_cpu::tiledMaxPool(*o.op)) << tiledReason;
    EXPECT_TRUE(backend_cpu::separableMaxPool(*o.op)) << tiledReason;
    std::mt19937 rng(531);
    TensorData x = floats(t.x, values(shapeElementCount(t.x), rng, 2, 0.1));
    Outputs r = runBoth(*o.op, {x});
    expectSame(r.fast, r.reference, tiledReason);
  };
  ir::Attributes a = poolAttrs(t);
  a.set("ceil_mode", int64_t{1}); // a last window that reaches past the input
  expectSeparable(maxPool(t, a), "reaches past the input");
  a = poolAttrs(t);
  a.set("pads", Ints{1, 1, 0, 0});
  expectSeparable(maxPool(t, a), "padded windows");
  a = poolAttrs(t);
  a.set("strides", Ints{1, 2});
  expectSeparable(maxPool(t, a), "overlapping windows");
  a = poolAttrs(t);
  a.set("dilations", Ints{2, 2});
  a.set("strides", Ints{4, 4});
  expectSeparable(maxPool(t, a), "dilated windows");
  a = poolAttrs(t);
  a.set("auto_pad", std::string("VALID"));
  expectSeparable(maxPool(t, a), "auto_pad");
}

TEST(FastConvPool, MaxPoolDeclinesWhatNeitherFastKernelRuns) {
  auto reasonOf = [](const OneOp &o) {
    return backend_cpu::KernelRegistry::instance().choose(*o.op, KernelProvider::Fast).explanation();
  };
  auto expectDeclined = [&](const OneOp &o, const std::string &reason) {
    EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*o.op, KernelProvider::Fast), nullptr) << reason;
    EXPECT_FALSE(backend_cpu::tiledMaxPool(*o.op)) << reason;
    EXPECT_FALSE(backend_cpu::separableMaxPool(*o.op)) << reason;
    EXPECT_NE(reasonOf(o).find(reason), std::string::npos) << reasonOf(o);
  };
  Tiling t{{1, 2, 9, 9}, {2, 2}, {2, 2}, ""};
  expectDeclined(oneOp("MaxPool", "", 12, poolAttrs(t), {TensorInfo(DataType::DOUBLE, t.x)}), "not f32");
  ir::Attributes oneD;
  oneD.set("kernel_shape", Ints{2});
  oneD.set("strides", Ints{2});
  expectDeclined(oneOp("MaxPool", "", 12, oneD, {TensorInfo(DataType::FLOAT, {1, 2, 8})}), "not 2-D");
  // A dilated window whose taps all fall in the padding: the reference's lowest float.
  ir::Attributes padded;
  padded.set("kernel_shape", Ints{2, 2});
  padded.set("dilations", Ints{3, 3});
  padded.set("pads", Ints{2, 2, 2, 2});
  expectDeclined(oneOp("MaxPool", "", 12, padded, {TensorInfo(DataType::FLOAT, {1, 1, 1, 1})}),
                 "a window lies wholly in the padding");
  {
    // Indices: only the reference gives them.
    ir::registerBuiltinOps();
    ir::Graph g;
    g.opsets()["ai.onnx"] = 13;
    g.addTensor("a", ir::TensorKind::Stream, TensorInfo(DataType::FLOAT, t.x));
    g.addInput("a");
    ir::Op &op = g.addOp("MaxPool", "", 12, "op", poolAttrs(t), {"a"}, {"y", "i"});
    g.addOutput("y");
    g.addOutput("i");
    ir::inferShapes(g, nullptr);
    EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(op, KernelProvider::Fast), nullptr);
    EXPECT_FALSE(backend_cpu::tiledMaxPool(op));
    EXPECT_FALSE(backend_cpu::separableMaxPool(op));
  }
}

TEST(FastConvPool, SeparableMaxPoolMatchesTheReferenceBitForBit) {
  // Overlapping, padded, strided, dilated and ceil-mode windows, square or not, on planes from
  // one pixel to ones large enough to thread, with ties, infinities and NaNs (a NaN wins a window
  // only as its first tap, in the reference's row-major order).
  struct Case {
    Shape x;
    Ints kernel, strides, pads, dilations;
    int64_t ceil;
    std::string what;
  };
  std::vector<Case> cases{{{8, 19, 28, 28}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 0, "GoogLeNet's 3x3/1 pad 1"},
                          {{2, 8, 112, 112}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0, "ResNet's 3x3/2 pad 1"},
                          {{2, 3, 28, 28}, {3, 3}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, "GoogLeNet's 3x3/2 ceil_mode"},
                          {{2, 3, 13, 13}, {3, 3}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 0, "AlexNet's 3x3/2"},
                          {{1, 4, 9, 11}, {2, 4}, {1, 3}, {0, 1, 1, 2}, {1, 1}, 0, "2x4/1x3, uneven pads"},
                          {{1, 4, 12, 10}, {3, 2}, {2, 1}, {1, 0, 2, 1}, {2, 3}, 1, "dilated 3x2, ceil_mode"},
                          {{3, 2, 1, 1}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 0, "one pixel"},
                          {{1, 2, 5, 40}, {5, 1}, {1, 1}, {2, 0, 2, 0}, {1, 1}, 0, "5x1 column windows"},
                          {{1, 2, 6, 6}, {6, 6}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 0, "one window as large as the plane"}};
  unsigned seed = 700;
  for (const Case &c : cases)
    for (int levels : {0, 2})
      for (double specials : {0.0, 0.15}) {
        ir::Attributes a;
        a.set("kernel_shape", c.kernel);
        a.set("strides", c.strides);
        a.set("pads", c.pads);
        a.set("dilations", c.dilations);
        a.set("ceil_mode", c.ceil);
        OneOp o = oneOp("MaxPool", "", 12, std::move(a), {TensorInfo(DataType::FLOAT, c.x)});
        ASSERT_TRUE(backend_cpu::separableMaxPool(*o.op)) << c.what;
        std::mt19937 rng(seed++);
        std::vector<float> v = values(shapeElementCount(c.x), rng, levels, specials);
        if (specials > 0) // NaNs too: where one is a window's first tap and where it is not
          for (size_t i = 0; i < v.size(); i += 7)
            v[i] = kNaN;
        Outputs r = runBoth(*o.op, {floats(c.x, v)});
        expectSame(r.fast, r.reference,
                   c.what + (levels ? ", ties" : "") + (specials > 0 ? ", infinities and NaNs" : ""));
      }
}

TEST(FastConvPool, MaxPoolGradOverTilingWindowsMatchesTheReference) {
  unsigned seed = 600;
  for (const Tiling &t : tilings())
    for (bool relu : {false, true})
      for (int levels : {0, 2, 3}) { // random values; integers: ties, zeros and negative maxima
        std::mt19937 rng(seed++);
        OneOp o = maxPoolGrad(t, relu);
        const Shape &dyShape = o.op->inInfo(1).shape();
        TensorData x = floats(t.x, values(shapeElementCount(t.x), rng, levels, levels == 3 ? 0.1 : 0.0));
        TensorData dy = floats(dyShape, values(shapeElementCount(dyShape), rng, 0));
        Outputs r = runBoth(*o.op, {x, dy});
        expectSame(r.fast, r.reference, t.what + (relu ? ", Relu" : "") + ", levels " + std::to_string(levels));
      }
}

TEST(FastConvPool, MaxPoolGradReluMaskZeroesWhereXIsNotPositive) {
  // The mask must change the result here, or the Relu cases above would not test it.
  Tiling t{{2, 3, 8, 10}, {2, 2}, {2, 2}, ""};
  for (const Tiling &tiling : {t, Tiling{{2, 3, 9, 9}, {3, 3}, {3, 3}, ""}}) {
    std::mt19937 rng(640);
    // Integers in [-3, 1]: zeros, and windows whose maximum is not positive.
    std::vector<float> xv = values(shapeElementCount(tiling.x), rng, 2);
    for (float &v : xv)
      v -= 1;
    TensorData x = floats(tiling.x, xv);
    OneOp plain = maxPoolGrad(tiling, false), relu = maxPoolGrad(tiling, true);
    const Shape &dyShape = plain.op->inInfo(1).shape();
    TensorData dy = floats(dyShape, values(shapeElementCount(dyShape), rng, 0));
    Outputs p = runBoth(*plain.op, {x, dy}), m = runBoth(*relu.op, {x, dy});
    int masked = 0;
    for (int64_t i = 0; i < x.info().elementCount(); ++i) {
      float xi = x.as<float>()[i], got = m.fast.as<float>()[i];
      if (xi > 0) {
        EXPECT_EQ(got, p.fast.as<float>()[i]) << i;
      } else {
        EXPECT_EQ(got, 0.f) << i;
        masked += p.fast.as<float>()[i] != 0.f;
      }
    }
    EXPECT_GT(masked, 0) << "no gradient reached an input that is not positive";
    expectSame(m.fast, m.reference, "Relu mask");
  }
}

TEST(FastConvPool, NaNWinsAWindowOnlyAsItsFirstTap) {
  // A NaN loses every comparison, so it wins a window only as its first tap (row-major), in the
  // reference and the fast kernels alike; except on the fast kernels' 2×2 / 2 paths (the
  // forward's whenever the windows are 2×2 / 2, the gradient's when they also cover the whole
  // plane), which compare the two rows' maxima (vecloops.hpp): a NaN at the second row's first
  // tap makes that row's maximum NaN, which loses to the first row's, so the second row's other
  // tap is not seen. That case is pinned here as it is, beside the reference's answer.
  std::vector<Tiling> cases = {{{2, 3, 8, 10}, {2, 2}, {2, 2}, "2x2/2"},
                               {{2, 3, 9, 7}, {2, 2}, {2, 2}, "2x2/2 with remainders"},
                               {{2, 2, 11, 10}, {3, 3}, {3, 3}, "3x3/3"},
                               {{1, 2, 8, 8}, {2, 2}, {3, 3}, "2x2/3"},
                               {{2, 3, 11, 13}, {2, 3}, {3, 4}, "2x3/3x4"}};
  unsigned seed = 700;
  for (const Tiling &t : cases) {
    Shape y = pooledShape(t);
    int64_t planes = t.x[0] * t.x[1];
    for (int64_t u = 0; u < t.kernel[0]; ++u)
      for (int64_t v = 0; v < t.kernel[1]; ++v)
        for (bool relu : {false, true}) {
          std::string what =
              t.what + " NaN at tap (" + std::to_string(u) + ", " + std::to_string(v) + ")" + (relu ? ", Relu" : "");
          std::mt19937 rng(seed++);
          std::vector<float> xv = values(shapeElementCount(t.x), rng, 0);
          for (int64_t p = 0; p < planes; ++p)
            for (int64_t r = 0; r < y[2]; ++r)
              for (int64_t j = 0; j < y[3]; ++j)
                xv[static_cast<size_t>(tapAt(t, p, r, j, u, v))] = kNaN;
          TensorData x = floats(t.x, xv);
          bool first = u == 0 && v == 0, secondRowFirstTap = u == 1 && v == 0;
          bool hidesRow = isTwoByTwoPath(t) && secondRowFirstTap;
          bool gradHidesRow = hidesRow && t.x[2] == 2 * y[2] && t.x[3] == 2 * y[3];
          if (!relu) {
            OneOp pool = maxPool(t, poolAttrs(t));
            Outputs r = runBoth(*pool.op, {x});
            if (!hidesRow) expectSame(r.fast, r.reference, what);
            for (int64_t p = 0; p < planes; ++p)
              for (int64_t rr = 0; rr < y[2]; ++rr)
                for (int64_t j = 0; j < y[3]; ++j) {
                  int64_t o = (p * y[2] + rr) * y[3] + j;
                  float fast = r.fast.as<float>()[o], ref = r.reference.as<float>()[o];
                  ASSERT_EQ(std::isnan(ref), first) << what << ", output " << o;
                  if (!hidesRow) continue;
                  // The fast 2×2 pass: the first row's maximum; the reference: all but the NaN.
                  float a = xv[static_cast<size_t>(tapAt(t, p, rr, j, 0, 0))];
                  float b = xv[static_cast<size_t>(tapAt(t, p, rr, j, 0, 1))];
                  float d = xv[static_cast<size_t>(tapAt(t, p, rr, j, 1, 1))];
                  ASSERT_EQ(fast, std::max(a, b)) << what << ", output " << o;
                  ASSERT_EQ(ref, std::max({a, b, d})) << what << ", output " << o;
                }
          }
          OneOp grad = maxPoolGrad(t, relu);
          TensorData dy = floats(y, values(shapeElementCount(y), rng, 0));
          Outputs g = runBoth(*grad.op, {x, dy});
          if (!gradHidesRow) {
            expectSame(g.fast, g.reference, what + ", gradient");
            continue;
          }
          // The gradient follows the same choice: the fast pass sends dY to the first row's
          // maximum, the reference to the maximum of the three numbers.
          for (int64_t p = 0; p < planes; ++p)
            for (int64_t rr = 0; rr < y[2]; ++rr)
              for (int64_t j = 0; j < y[3]; ++j) {
                float dyo = dy.as<float>()[(p * y[2] + rr) * y[3] + j];
                int64_t a = tapAt(t, p, rr, j, 0, 0), b = tapAt(t, p, rr, j, 0, 1), d = tapAt(t, p, rr, j, 1, 1);
                float xa = xv[static_cast<size_t>(a)], xb = xv[static_cast<size_t>(b)], xd = xv[static_cast<size_t>(d)];
                int64_t fastAt = xb > xa ? b : a, refAt = xd > std::max(xa, xb) ? d : fastAt;
                auto masked = [&](int64_t at) { return relu && !(xv[static_cast<size_t>(at)] > 0) ? 0.f : dyo; };
                ASSERT_EQ(g.fast.as<float>()[fastAt], masked(fastAt)) << what;
                ASSERT_EQ(g.reference.as<float>()[refAt], masked(refAt)) << what;
              }
        }
  }
}

TEST(FastConvPool, NaNsOutsideEveryWindowAreNotRead) {
  // Rows, columns and gaps no window covers: NaN there changes no output, and gets no gradient.
  std::vector<Tiling> cases = {{{2, 3, 9, 7}, {2, 2}, {2, 2}, "2x2/2 remainders"},
                               {{2, 2, 11, 10}, {3, 3}, {3, 3}, "3x3/3 remainders"},
                               {{1, 2, 8, 8}, {2, 2}, {3, 3}, "2x2/3 gaps"},
                               {{2, 3, 11, 13}, {2, 3}, {3, 4}, "2x3/3x4 gaps"}};
  unsigned seed = 800;
  for (const Tiling &t : cases) {
    Shape y = pooledShape(t);
    std::mt19937 rng(seed++);
    std::vector<float> xv = values(shapeElementCount(t.x), rng, 0);
    std::vector<bool> covered(xv.size(), false);
    for (int64_t p = 0; p < t.x[0] * t.x[1]; ++p)
      for (int64_t r = 0; r < y[2]; ++r)
        for (int64_t j = 0; j < y[3]; ++j)
          for (int64_t u = 0; u < t.kernel[0]; ++u)
            for (int64_t v = 0; v < t.kernel[1]; ++v)
              covered[static_cast<size_t>(tapAt(t, p, r, j, u, v))] = true;
    int uncovered = 0;
    for (size_t i = 0; i < xv.size(); ++i)
      if (!covered[i]) xv[i] = kNaN, ++uncovered;
    ASSERT_GT(uncovered, 0) << t.what;
    TensorData x = floats(t.x, xv);
    OneOp pool = maxPool(t, poolAttrs(t));
    Outputs r = runBoth(*pool.op, {x});
    expectSame(r.fast, r.reference, t.what);
    for (int64_t i = 0; i < r.fast.info().elementCount(); ++i)
      ASSERT_FALSE(std::isnan(r.fast.as<float>()[i])) << t.what << ", output " << i;
    for (bool relu : {false, true}) {
      OneOp grad = maxPoolGrad(t, relu);
      TensorData dy = floats(y, values(shapeElementCount(y), rng, 0));
      Outputs g = runBoth(*grad.op, {x, dy});
      expectSame(g.fast, g.reference, t.what + ", gradient");
      for (size_t i = 0; i < xv.size(); ++i)
        if (!covered[i]) {
          ASSERT_EQ(g.fast.as<float>()[i], 0.f) << t.what << ", dX " << i;
        }
    }
  }
}

TEST(FastConvPool, MaxPoolGradDeclinesWindowsThatDoNotTile) {
  // A ceil_mode pool's last window that reaches past X: its dY is one larger than the floor
  // shape with no padding. The plane kernel assumes every window inside the plane, so it must
  // decline; the reference (or oneDNN) runs it.
  Tiling t{{2, 3, 9, 7}, {2, 2}, {2, 2}, "ceil"};
  OneOp ceil = maxPoolGrad(t, false, {2, 3, 5, 4});
  EXPECT_FALSE(backend_cpu::tiledMaxPoolGrad(*ceil.op));
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*ceil.op, KernelProvider::Fast), nullptr);
  OneOp ceilRelu = maxPoolGrad(t, true, {2, 3, 5, 3});
  EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*ceilRelu.op, KernelProvider::Fast), nullptr);
  // Overlapping windows, padding, dilation, f64.
  auto declined = [](const Shape &x, const Shape &dy, ir::Attributes a, DataType type = DataType::FLOAT) {
    OneOp o = oneOp("MaxPoolGrad", "ai.graphcore", 1, std::move(a), {TensorInfo(type, x), TensorInfo(type, dy)});
    EXPECT_FALSE(backend_cpu::tiledMaxPoolGrad(*o.op));
    EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*o.op, KernelProvider::Fast), nullptr);
  };
  auto attrs = [](Ints k, Ints s, Ints d, Ints pads) {
    ir::Attributes a;
    a.set("kernel_shape", k);
    a.set("strides", s);
    a.set("dilations", d);
    a.set("pads", pads);
    return a;
  };
  declined({1, 2, 9, 9}, {1, 2, 4, 8}, attrs({2, 2}, {2, 1}, {1, 1}, {0, 0, 0, 0}));
  declined({1, 2, 8, 8}, {1, 2, 5, 5}, attrs({2, 2}, {2, 2}, {1, 1}, {1, 1, 1, 1}));
  declined({1, 2, 9, 9}, {1, 2, 2, 2}, attrs({2, 2}, {4, 4}, {2, 2}, {0, 0, 0, 0}));
  declined({1, 2, 8, 8}, {1, 2, 4, 4}, attrs({2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}), DataType::DOUBLE);
  // Through the default providers the ceil case still matches the reference.
  std::mt19937 rng(900);
  TensorData x = floats(t.x, values(shapeElementCount(t.x), rng, 0));
  TensorData dy = floats({2, 3, 5, 4}, values(2 * 3 * 5 * 4, rng, 0));
  TensorData any = run(*ceil.op, KernelProvider::Any, {x, dy}), ref = run(*ceil.op, KernelProvider::Reference, {x, dy});
  for (int64_t i = 0; i < ref.info().elementCount(); ++i)
    ASSERT_NEAR(any.as<float>()[i], ref.as<float>()[i], 1e-6f) << "dX " << i;
}

namespace {

/// A depthwise convolution's weight gradient: X's shape, kernel, strides, pads (begin, end).
struct Depthwise {
  Shape x;
  Ints kernel, strides, pads;
};

int64_t convExtent(int64_t in, int64_t k, int64_t s, int64_t pb, int64_t pe) { return (in + pb + pe - k) / s + 1; }

OneOp depthwiseWeightGradOp(const Depthwise &c, DataType type, Ints dilations = {1, 1}, int64_t multiplier = 1) {
  int64_t ch = c.x[1];
  Shape dy{c.x[0], ch * multiplier,
           convExtent(c.x[2], (c.kernel[0] - 1) * dilations[0] + 1, c.strides[0], c.pads[0], c.pads[2]),
           convExtent(c.x[3], (c.kernel[1] - 1) * dilations[1] + 1, c.strides[1], c.pads[1], c.pads[3])};
  ir::Attributes a;
  a.set("group", ch);
  a.set("strides", c.strides);
  a.set("pads", c.pads);
  a.set("dilations", dilations);
  a.set("weight_shape", Ints{ch * multiplier, 1, c.kernel[0], c.kernel[1]});
  return oneOp("ConvWeightGrad", "ai.graphcore", 1, std::move(a), {TensorInfo(type, dy), TensorInfo(type, c.x)});
}

} // namespace

TEST(FastConvGrad, DepthwiseWeightGradMatchesTheReference) {
  // The fast kernel sums in f32 (16 lanes per tap, then the lanes in order); the reference runs
  // in f64 on the same numbers, so the difference is the fast kernel's rounding alone: sums of up
  // to 2·32·40 products of numbers in [-1, 1) stay well inside 1e-5 relative to 1 + |dW|.
  const std::vector<Depthwise> cases = {
      {{2, 6, 9, 8}, {3, 3}, {1, 1}, {1, 1, 1, 1}},    // MobileNet's 3×3, same padding
      {{3, 5, 11, 10}, {5, 5}, {2, 2}, {2, 2, 2, 2}},  // EfficientNet's 5×5 / 2
      {{1, 4, 7, 12}, {3, 2}, {2, 1}, {0, 1, 2, 1}},   // non-square, asymmetric pads
      {{2, 3, 30, 40}, {5, 5}, {1, 1}, {2, 2, 2, 2}},  // rows wider than 16 lanes
      {{2, 3, 32, 40}, {3, 3}, {2, 2}, {1, 1, 1, 1}},  // stride 2 on a larger plane
      {{1, 2, 10, 11}, {3, 3}, {3, 3}, {0, 0, 0, 0}},  // stride 3: three phases per axis
      {{2, 4, 9, 9}, {2, 2}, {3, 3}, {0, 0, 1, 1}},    // stride above the kernel
      {{4, 3, 5, 6}, {1, 1}, {1, 1}, {0, 0, 0, 0}},    // 1×1
      {{1, 1, 3, 3}, {3, 3}, {1, 1}, {0, 0, 0, 0}},    // one output position
      {{2, 2, 4, 5}, {3, 3}, {1, 1}, {3, 3, 3, 3}},    // pads as large as the kernel
      {{3, 8, 14, 14}, {7, 7}, {1, 2}, {3, 3, 3, 3}}}; // 7×7, mixed strides
  std::mt19937 rng(1000);
  for (const Depthwise &c : cases) {
    std::string what = "X " + toString(c.x) + ", kernel " + toString(c.kernel) + ", strides " + toString(c.strides) +
                       ", pads " + toString(c.pads);
    OneOp f32 = depthwiseWeightGradOp(c, DataType::FLOAT), f64 = depthwiseWeightGradOp(c, DataType::DOUBLE);
    ASSERT_TRUE(backend_cpu::depthwiseWeightGrad(*f32.op)) << what;
    const Shape &dyShape = f32.op->inInfo(0).shape();
    std::uniform_real_distribution<double> d(-1, 1);
    std::vector<double> dyv(static_cast<size_t>(shapeElementCount(dyShape))),
        xv(static_cast<size_t>(shapeElementCount(c.x)));
    for (double &v : dyv)
      v = static_cast<float>(d(rng));
    for (double &v : xv)
      v = static_cast<float>(d(rng));
    Outputs r = runBoth(*f32.op, {TensorData::fromDoubles(DataType::FLOAT, dyShape, dyv),
                                  TensorData::fromDoubles(DataType::FLOAT, c.x, xv)});
    TensorData want = run(
        *f64.op, KernelProvider::Reference,
        {TensorData::fromDoubles(DataType::DOUBLE, dyShape, dyv), TensorData::fromDoubles(DataType::DOUBLE, c.x, xv)});
    double worst = 0;
    for (int64_t i = 0; i < want.info().elementCount(); ++i) {
      double got = r.fast.as<float>()[i], w = want.as<double>()[i];
      double diff = std::fabs(got - w) / (1 + std::fabs(w));
      worst = std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(worst, diff);
    }
    EXPECT_LT(worst, 1e-5) << what;
    // The f32 reference too, which sums in f32 in another order.
    double worstF32 = 0;
    for (int64_t i = 0; i < want.info().elementCount(); ++i) {
      double got = r.reference.as<float>()[i], w = want.as<double>()[i];
      double diff = std::fabs(got - w) / (1 + std::fabs(w));
      worstF32 = std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(worstF32, diff);
    }
    EXPECT_LT(worstF32, 1e-5) << what << " (f32 reference)";
  }
}

TEST(FastConvGrad, DepthwiseWeightGradPropagatesNaN) {
  // A NaN in dY reaches every tap of its channel (each tap reads every dY of an inner position),
  // in both kernels.
  Depthwise c{{2, 3, 9, 8}, {3, 3}, {1, 1}, {1, 1, 1, 1}};
  OneOp o = depthwiseWeightGradOp(c, DataType::FLOAT);
  const Shape &dyShape = o.op->inInfo(0).shape();
  std::mt19937 rng(1100);
  std::vector<float> dyv = values(shapeElementCount(dyShape), rng, 0), xv = values(shapeElementCount(c.x), rng, 0);
  dyv[static_cast<size_t>((1 * 3 + 1) * 9 * 8 + 4 * 8 + 3)] = kNaN; // image 1, channel 1, an inner position
  Outputs r = runBoth(*o.op, {floats(dyShape, dyv), floats(c.x, xv)});
  for (int64_t i = 0; i < r.fast.info().elementCount(); ++i) {
    bool channel1 = i / 9 == 1;
    EXPECT_EQ(std::isnan(r.fast.as<float>()[i]), channel1) << "dW " << i;
    EXPECT_EQ(std::isnan(r.reference.as<float>()[i]), channel1) << "dW " << i;
  }
}

TEST(FastConvGrad, DepthwiseWeightGradNaNOrInfinityInX) {
  // A NaN or infinity in X makes NaN or infinite every tap that read it, in both kernels. The
  // fast kernel can also make NaN of taps that did not read it: it multiplies the zeros that pad
  // its dY rows (and round them to 16 lanes) by X values past each tap's window, and 0·∞ is NaN
  // (an infinity at the end of X's first row of a 3×3 valid convolution turns taps (0, 0) and
  // (0, 1) NaN). So where the reference is NaN or infinite, so is the fast kernel; elsewhere the
  // fast kernel is either the reference's value or NaN.
  Depthwise c{{1, 2, 6, 6}, {3, 3}, {1, 1}, {0, 0, 0, 0}};
  OneOp o = depthwiseWeightGradOp(c, DataType::FLOAT);
  const Shape &dyShape = o.op->inInfo(0).shape();
  for (float special : {kNaN, kInf, -kInf})
    for (int64_t at : {int64_t{0}, int64_t{5}, int64_t{14}, int64_t{35}, int64_t{36 + 21}}) {
      std::string what = "X[" + std::to_string(at) + "] = " + std::to_string(special);
      std::mt19937 rng(1200);
      std::vector<float> dyv = values(shapeElementCount(dyShape), rng, 0), xv = values(shapeElementCount(c.x), rng, 0);
      xv[static_cast<size_t>(at)] = special;
      Outputs r = runBoth(*o.op, {floats(dyShape, dyv), floats(c.x, xv)});
      int specialTaps = 0;
      for (int64_t i = 0; i < r.fast.info().elementCount(); ++i) {
        float fast = r.fast.as<float>()[i], ref = r.reference.as<float>()[i];
        if (!std::isfinite(ref)) {
          ++specialTaps;
          EXPECT_TRUE(fast == ref || (std::isnan(fast) && std::isnan(ref))) << what << ", dW " << i;
        } else if (!std::isnan(fast)) {
          EXPECT_NEAR(fast, ref, 1e-5 * (1 + std::fabs(ref))) << what << ", dW " << i;
        }
      }
      EXPECT_GT(specialTaps, 0) << what;
    }
}

TEST(FastConvGrad, DepthwiseWeightGradDeclinesOtherConvolutions) {
  Depthwise c{{2, 4, 9, 9}, {3, 3}, {1, 1}, {1, 1, 1, 1}};
  auto expectDeclined = [](const OneOp &o, const std::string &reason) {
    EXPECT_FALSE(backend_cpu::depthwiseWeightGrad(*o.op)) << reason;
    EXPECT_EQ(backend_cpu::KernelRegistry::instance().find(*o.op, KernelProvider::Fast), nullptr) << reason;
    std::string why = backend_cpu::KernelRegistry::instance().choose(*o.op, KernelProvider::Fast).explanation();
    EXPECT_NE(why.find(reason), std::string::npos) << why;
  };
  expectDeclined(depthwiseWeightGradOp(c, DataType::DOUBLE), "not f32");
  expectDeclined(depthwiseWeightGradOp(c, DataType::FLOAT, {2, 2}), "dilated");
  expectDeclined(depthwiseWeightGradOp(c, DataType::FLOAT, {1, 1}, 2), "not depthwise");
  expectDeclined(depthwiseWeightGradOp({c.x, c.kernel, c.strides, {-1, 0, 0, 0}}, DataType::FLOAT), "negative pads");
  // Grouped but not depthwise: two input channels per group.
  ir::Attributes a;
  a.set("group", int64_t{2});
  a.set("strides", Ints{1, 1});
  a.set("pads", Ints{1, 1, 1, 1});
  a.set("dilations", Ints{1, 1});
  a.set("weight_shape", Ints{2, 2, 3, 3});
  expectDeclined(oneOp("ConvWeightGrad", "ai.graphcore", 1, a,
                       {TensorInfo(DataType::FLOAT, {2, 2, 9, 9}), TensorInfo(DataType::FLOAT, c.x)}),
                 "not depthwise");
}
