// Shape family: shape inference, opset canonicalisation and reference kernels.

#include "backend_cpu/kernel.hpp"
#include "core/dispatch.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <random>

using namespace popart;

namespace {

/// A graph with one stream input "x", to which ops are added and run with the reference kernels.
struct Fixture {
  ir::Graph graph;

  explicit Fixture(const TensorInfo &x) {
    ir::registerBuiltinOps();
    backend_cpu::registerBuiltinKernels();
    graph.addTensor("x", ir::TensorKind::Stream, x);
    graph.addInput("x");
  }

  std::string ints(const std::string &id, const std::vector<int64_t> &v) {
    graph.addConst(id, TensorData::fromInt64({static_cast<int64_t>(v.size())}, v));
    return id;
  }

  ir::Op &add(const std::string &type, int version, ir::Attributes attrs, const std::vector<TensorId> &inputs,
              size_t outputs = 1) {
    std::vector<TensorId> outs;
    static const char *names[] = {"y0", "y1", "y2", "y3"};
    for (size_t i = 0; i < outputs && i < 4; ++i)
      outs.push_back(names[i]);
    ir::Op &op = graph.addOp(type, "ai.onnx", version, "", std::move(attrs), inputs, outs);
    ir::inferShapes(graph, nullptr);
    return op;
  }

  /// Runs \p op on \p x (other inputs must be constants) and returns its outputs.
  std::vector<TensorData> run(const ir::Op &op, const TensorData &x) {
    auto kernel = backend_cpu::createKernel(op, backend_cpu::KernelProvider::Reference);
    std::vector<const void *> in;
    for (const ir::Tensor *t : op.inputs)
      in.push_back(!t ? nullptr : t->id() == "x" ? x.data() : t->data()->data());
    std::vector<TensorData> outs;
    outs.reserve(op.outputCount());
    std::vector<void *> out;
    for (size_t i = 0; i < op.outputCount(); ++i) {
      outs.emplace_back(op.outInfo(i));
      out.push_back(outs.back().data());
    }
    kernel->run({in.data(), in.size(), out.data(), out.size()});
    return outs;
  }
};

TensorData iota(DataType type, const Shape &shape) {
  std::vector<double> v(static_cast<size_t>(shapeElementCount(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>(i);
  return TensorData::fromDoubles(type, shape, v);
}

std::vector<double> values(const TensorData &d) { return d.toDoubleVector(); }

} // namespace

TEST(Shape, ReshapeCopiesZeroAndInfersMinusOne) {
  Fixture f(TensorInfo(DataType::FLOAT, {2, 3, 4}));
  ir::Op &op = f.add("Reshape", 14, {}, {"x", f.ints("s", {0, -1})});
  EXPECT_EQ(op.outInfo(0).shape(), (Shape{2, 12}));
}

TEST(Shape, ReshapeAllowZeroKeepsZero) {
  Fixture f(TensorInfo(DataType::FLOAT, {0, 3}));
  ir::Attributes a;
  a.set("allowzero", int64_t(1));
  ir::Op &op = f.add("Reshape", 14, a, {"x", f.ints("s", {3, 0})});
  EXPECT_EQ(op.outInfo(0).shape(), (Shape{3, 0}));
}

TEST(Shape, ReshapeRejectsTwoMinusOnes) {
  Fixture f(TensorInfo(DataType::FLOAT, {2, 3}));
  try {
    f.add("Reshape", 13, {}, {"x", f.ints("s", {-1, -1})});
    FAIL() << "expected an error";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("Reshape"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("more than one -1"), std::string::npos) << e.what();
  }
}

TEST(Shape, SqueezeAttributeBecomesInput) {
  Fixture f(TensorInfo(DataType::FLOAT, {1, 3, 1}));
  ir::Attributes a;
  a.set("axes", std::vector<int64_t>{-1});
  ir::Op &op = f.add("Squeeze", 11, a, {"x"});
  EXPECT_FALSE(op.attrs.has("axes"));
  ASSERT_TRUE(op.hasInput(1));
  EXPECT_EQ(op.outInfo(0).shape(), (Shape{1, 3}));
}

TEST(Shape, SqueezeRejectsNonUnitAxis) {
  Fixture f(TensorInfo(DataType::FLOAT, {1, 3}));
  EXPECT_THROW(f.add("Squeeze", 13, {}, {"x", f.ints("a", {1})}), error);
}

TEST(Shape, SliceNegativeStepsAndClamping) {
  Fixture f(TensorInfo(DataType::INT32, {10}));
  ir::Op &op =
      f.add("Slice", 13, {}, {"x", f.ints("s", {20}), f.ints("e", {-100}), f.ints("a", {0}), f.ints("st", {-3})});
  ASSERT_EQ(op.outInfo(0).shape(), (Shape{4}));
  EXPECT_EQ(values(f.run(op, iota(DataType::INT32, {10}))[0]), (std::vector<double>{9, 6, 3, 0}));
}

TEST(Shape, SliceOpset1AttributesBecomeInputs) {
  Fixture f(TensorInfo(DataType::FLOAT, {3, 4}));
  ir::Attributes a;
  a.set("starts", std::vector<int64_t>{1});
  a.set("ends", std::vector<int64_t>{1000});
  a.set("axes", std::vector<int64_t>{1});
  ir::Op &op = f.add("Slice", 1, a, {"x"});
  EXPECT_EQ(op.inputCount(), 4u);
  ASSERT_EQ(op.outInfo(0).shape(), (Shape{3, 3}));
  EXPECT_EQ(values(f.run(op, iota(DataType::FLOAT, {3, 4}))[0]), (std::vector<double>{1, 2, 3, 5, 6, 7, 9, 10, 11}));
}

TEST(Shape, PadModes) {
  struct Case {
    const char *mode;
    std::vector<double> expected;
  };
  // x = [0 1 2], pads: 3 before, 2 after
  for (const Case &c : {Case{"constant", {0, 0, 0, 0, 1, 2, 0, 0}}, Case{"edge", {0, 0, 0, 0, 1, 2, 2, 2}},
                        Case{"reflect", {1, 2, 1, 0, 1, 2, 1, 0}}, Case{"wrap", {0, 1, 2, 0, 1, 2, 0, 1}}}) {
    Fixture f(TensorInfo(DataType::FLOAT, {3}));
    ir::Attributes a;
    a.set("mode", std::string(c.mode));
    ir::Op &op = f.add("Pad", 19, a, {"x", f.ints("p", {3, 2})});
    EXPECT_EQ(values(f.run(op, iota(DataType::FLOAT, {3}))[0]), c.expected) << c.mode;
  }
}

TEST(Shape, PadOpset2ValueAndNegativePads) {
  Fixture f(TensorInfo(DataType::FLOAT16, {4}));
  ir::Attributes a;
  a.set("pads", std::vector<int64_t>{-1, 2});
  a.set("value", 1.5f);
  ir::Op &op = f.add("Pad", 2, a, {"x"});
  EXPECT_EQ(values(f.run(op, iota(DataType::FLOAT16, {4}))[0]), (std::vector<double>{1, 2, 3, 1.5, 1.5}));
}

TEST(Shape, SplitRejectsUnevenEqualSplit) {
  Fixture f(TensorInfo(DataType::FLOAT, {5}));
  EXPECT_THROW(f.add("Split", 13, {}, {"x"}, 2), error);
}

TEST(Shape, SplitAndConcatRoundTrip) {
  Fixture f(TensorInfo(DataType::BOOL, {2, 5}));
  ir::Attributes a;
  a.set("axis", int64_t(-1));
  ir::Op &split = f.add("Split", 13, a, {"x", f.ints("s", {2, 0, 3})}, 3);
  std::vector<double> v{1, 0, 0, 1, 1, 0, 1, 0, 0, 1};
  TensorData x = TensorData::fromDoubles(DataType::BOOL, {2, 5}, v);
  std::vector<TensorData> parts = f.run(split, x);
  ASSERT_EQ(parts[2].info().shape(), (Shape{2, 3}));
  EXPECT_EQ(values(parts[2]), (std::vector<double>{0, 1, 1, 0, 0, 1}));

  // Concat the parts back through a second graph whose inputs are the parts as constants.
  Fixture g(TensorInfo(DataType::BOOL, {2, 2}));
  g.graph.addConst("p1", parts[1]);
  g.graph.addConst("p2", parts[2]);
  ir::Op &concat = g.add("Concat", 13, a, {"x", "p1", "p2"});
  EXPECT_EQ(values(g.run(concat, parts[0])[0]), v);
}

TEST(Shape, TransposeMatchesNaiveOnRandomShapes) {
  unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 20; ++iter) {
    size_t rank = 1 + rng() % 4;
    Shape shape;
    for (size_t i = 0; i < rank; ++i)
      shape.push_back(1 + static_cast<int64_t>(rng() % 4));
    std::vector<int64_t> perm(rank);
    for (size_t i = 0; i < rank; ++i)
      perm[i] = static_cast<int64_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (DataType type : {DataType::FLOAT16, DataType::INT64, DataType::UINT8}) {
      Fixture f(TensorInfo(type, shape));
      ir::Attributes a;
      a.set("perm", perm);
      ir::Op &op = f.add("Transpose", 13, a, {"x"});
      TensorData x = iota(type, shape);
      std::vector<double> got = values(f.run(op, x)[0]);
      // Naive: walk the output index, map it back to the input.
      const Shape &out = op.outInfo(0).shape();
      std::vector<int64_t> inStrides(rank, 1);
      for (size_t d = rank - 1; d > 0; --d)
        inStrides[d - 1] = inStrides[d] * shape[d];
      std::vector<int64_t> idx(rank, 0);
      for (size_t i = 0; i < got.size(); ++i) {
        int64_t src = 0;
        for (size_t d = 0; d < rank; ++d)
          src += idx[d] * inStrides[static_cast<size_t>(perm[d])];
        ASSERT_EQ(got[i], x.valueAsDouble(src))
            << "seed " << seed << " shape " << toString(shape) << " perm " << toString(perm) << " element " << i;
        for (size_t d = rank; d-- > 0;) {
          if (++idx[d] < out[d]) break;
          idx[d] = 0;
        }
      }
    }
  }
}

TEST(Shape, DepthToSpaceModesDiffer) {
  Fixture f(TensorInfo(DataType::FLOAT, {1, 4, 1, 1}));
  ir::Attributes dcr, crd;
  dcr.set("blocksize", int64_t(2));
  crd.set("blocksize", int64_t(2));
  crd.set("mode", std::string("CRD"));
  ir::Op &op = f.add("DepthToSpace", 13, dcr, {"x"});
  ASSERT_EQ(op.outInfo(0).shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(values(f.run(op, iota(DataType::FLOAT, {1, 4, 1, 1}))[0]), (std::vector<double>{0, 1, 2, 3}));
  Fixture g(TensorInfo(DataType::FLOAT, {1, 8, 1, 1}));
  ir::Op &op2 = g.add("DepthToSpace", 13, crd, {"x"});
  ASSERT_EQ(op2.outInfo(0).shape(), (Shape{1, 2, 2, 2}));
  EXPECT_EQ(values(g.run(op2, iota(DataType::FLOAT, {1, 8, 1, 1}))[0]), (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7}));
  Fixture h(TensorInfo(DataType::FLOAT, {1, 8, 1, 1}));
  ir::Op &op3 = h.add("DepthToSpace", 13, dcr, {"x"});
  EXPECT_EQ(values(h.run(op3, iota(DataType::FLOAT, {1, 8, 1, 1}))[0]), (std::vector<double>{0, 2, 4, 6, 1, 3, 5, 7}));
}

TEST(Shape, ShapeOutputIsKnownForStreamInput) {
  Fixture f(TensorInfo(DataType::FLOAT, {2, 3, 5}));
  ir::Attributes a;
  a.set("start", int64_t(-2));
  // Shape's value is known from the input's shape alone: inferShapes replaces the op by a constant.
  f.graph.addOp("Shape", "ai.onnx", 15, "", a, {"x"}, {"y0"});
  ir::inferShapes(f.graph, nullptr);
  EXPECT_TRUE(f.graph.ops().empty());
  ASSERT_TRUE(f.graph.tensor("y0").isConst());
  EXPECT_EQ(f.graph.tensor("y0").data()->toInt64Vector(), (std::vector<int64_t>{3, 5}));
}

TEST(Shape, TriluAndEyeLike) {
  Fixture f(TensorInfo(DataType::INT32, {3, 3}));
  f.graph.addConst("k", TensorData::fromInt64({}, {1}));
  ir::Attributes lower;
  lower.set("upper", int64_t(0));
  ir::Op &op = f.add("Trilu", 14, lower, {"x", "k"});
  EXPECT_EQ(values(f.run(op, iota(DataType::INT32, {3, 3}))[0]), (std::vector<double>{0, 1, 0, 3, 4, 5, 6, 7, 8}));
  Fixture g(TensorInfo(DataType::INT32, {2, 3}));
  ir::Attributes e;
  e.set("k", int64_t(1));
  e.set("dtype", int64_t(10)); // FLOAT16
  ir::Op &eye = g.add("EyeLike", 9, e, {"x"});
  ASSERT_EQ(eye.outInfo(0).dataType(), DataType::FLOAT16);
  EXPECT_EQ(values(g.run(eye, iota(DataType::INT32, {2, 3}))[0]), (std::vector<double>{0, 1, 0, 0, 0, 1}));
}
