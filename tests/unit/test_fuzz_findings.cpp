// The inputs fuzzing found (tests/fuzz/regressions, docs/fuzzing.md) end in a popart::error that
// names the file and what is wrong; the fuzz_regressions_* ctests only check that nothing else
// escapes. A checkpoint refused late must leave the session as it was.

#include "checkpoint_test_helpers.hpp"
#include "op_runner.hpp"
#include "cli/idx.hpp"
#include "onnx_import/onnx_import.hpp"
#include "session/npy.hpp"

#include <popart/builder.hpp>
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <tuple>
#include <limits>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using namespace popart;

const fs::path kRegressions = fs::path(POPART_SOURCE_DIR) / "tests/fuzz/regressions";

/// The message of the popart::error \p read throws on \p file (fails the test if none).
std::string errorOf(const std::function<void(const std::string &)> &read, const fs::path &file) {
  try {
    read(file.string());
  } catch (const error &e) {
    return e.what();
  }
  ADD_FAILURE() << file << " was accepted";
  return "";
}

TEST(FuzzFindings, NpyErrorsNameTheFileAndTheFault) {
  auto read = [](const std::string &p) { npy::read(p); };
  const fs::path d = kRegressions / "npy";
  EXPECT_NE(errorOf(read, d / "shape-not-a-number.npy").find("bad dimension 'x'"), std::string::npos);
  EXPECT_NE(errorOf(read, d / "shape-negative-dimension.npy").find("bad dimension '-3'"), std::string::npos);
  EXPECT_NE(errorOf(read, d / "shape-dimension-out-of-range.npy").find("bad dimension"), std::string::npos);
  EXPECT_NE(errorOf(read, d / "shape-element-count-overflows.npy").find("too many elements"), std::string::npos);
  EXPECT_NE(errorOf(read, d / "shape-larger-than-file.npy").find("is truncated"), std::string::npos);
  EXPECT_NE(errorOf(read, d / "header-length-larger-than-file.npy").find("truncated in its header"), std::string::npos);
  for (const auto &e : fs::directory_iterator(d))
    EXPECT_NE(errorOf(read, e.path()).find(e.path().string()), std::string::npos) << e.path();
}

TEST(FuzzFindings, IdxErrorsNameTheFileAndTheWholeSize) {
  auto read = [](const std::string &p) { cli::readIdx(p); };
  const fs::path d = kRegressions / "idx";
  EXPECT_NE(errorOf(read, d / "dimensions-overflow.idx").find("too many elements"), std::string::npos);
  // The size the header announces, not that of the first chunk read.
  for (const char *f : {"dimensions-larger-than-file.idx", "gzip-dimensions-larger-than-data.idx.gz"})
    EXPECT_NE(errorOf(read, d / f).find("UINT8[100000,100000] needs 10000000000 bytes"), std::string::npos) << f;
  for (const auto &e : fs::directory_iterator(d))
    EXPECT_NE(errorOf(read, e.path()).find(e.path().string()), std::string::npos) << e.path();
}

TEST(FuzzFindings, TensorProtoErrorsNameTheFileAndTheFault) {
  auto read = [](const std::string &p) { onnx_import::readTensorProtoFile(p); };
  const fs::path d = kRegressions / "tensorproto";
  EXPECT_NE(errorOf(read, d / "shape-larger-than-data.pb").find("needs 10000000000 elements"), std::string::npos);
  EXPECT_NE(errorOf(read, d / "strings-larger-than-data.pb").find("needs 1000000000 elements"), std::string::npos);
  EXPECT_NE(errorOf(read, d / "shape-element-count-overflows.pb").find("too many elements"), std::string::npos);
  EXPECT_NE(errorOf(read, d / "external-offset-not-a-number.pb").find("external data offset 'x'"), std::string::npos);
  EXPECT_NE(errorOf(read, d / "external-length-out-of-range.pb").find("external data length"), std::string::npos);
  // Its external data is the file itself under the name the fuzz harness writes: input.pb.
  const fs::path copy = fs::temp_directory_path() / ("fuzz_findings_" + std::to_string(::getpid()));
  fs::create_directories(copy);
  fs::copy_file(d / "external-offset-overflows.pb", copy / "input.pb", fs::copy_options::overwrite_existing);
  EXPECT_NE(errorOf(read, copy / "input.pb").find("range [9223372036854775807,"), std::string::npos);
  fs::remove_all(copy);
  for (const auto &e : fs::directory_iterator(d))
    EXPECT_NE(errorOf(read, e.path()).find(e.path().string()), std::string::npos) << e.path();
}

TEST(FuzzFindings, ModelsEndInAnErrorNamingTheOpAndTheFault) {
  // As the fuzz harness runs them: one thread, a memory limit of 1 GiB.
  const std::vector<std::pair<std::string, std::string>> cases{
      {"reshape-element-count-overflows.onnx",
       "Reshape #1: shape [1,72057593836601345,3,3,4,4] has too many elements (more than 2^63)"},
      {"tile-dimension-overflows.onnx",
       "Tile #1: repeats [1,2,57016320,3097913593677479940] of input [1,2,3,4] give a dimension past 2^63"},
      {"maxunpool-strides-shorter-than-kernel.onnx", "MaxUnpool #0: strides needs 2 values"},
      {"tfidf-ngram-counts-past-pool.onnx",
       "TfIdfVectorizer #0: ngram_counts [0,4] must be non-decreasing offsets into a pool of 2 values"},
      {"empty-constant-with-strides-past-int64.onnx",
       "tensor '0': shape [2,1,0,0,8064,0,1224934963022921727,12,64] is empty, but its other dimensions multiply "
       "past 2^63"},
      {"sequence-erase-position-past-int64-as-double.onnx",
       "SequenceErase #1: position 9223372036854775805 is out of range for a sequence of 3 tensors"},
      {"concat-from-sequence-element-of-lower-rank.onnx", "ConcatFromSequence #1: elements have different ranks"},
      {"convtranspose-weight-rank-2-onnx-inference-null.onnx",
       "ConvTranspose #0: weights W have shape [2,3], expected rank 3 like X [1,1,3]"},
      {"convtranspose-weight-rank-2-with-untyped-if-branch.onnx",
       "a ConvTranspose node: weights 'W' have rank 2, X 'X' rank 3; expected the same rank of 3 or more"},
      {"tile-folded-with-huge-output.onnx", "needs 1688849860.26 MB (1688849860264768 bytes: tensor '4' alone"},
      {"compile-allocates-2.6GB.onnx", "needs 2642.41 MB (2642413856 bytes: tensor '2' alone"},
      // Found by the sweeps of extreme attributes and folded inputs (docs/fuzzing.md).
      {"conv-pads-past-int64.onnx",
       "Conv #0: spatial axis 0: the padded input 4611686018427387911 + 4611686018427387904 is past int64"},
      {"conv-same-stride-int64-max.onnx",
       "Conv #0: spatial axis 0: the input rounded up to the stride 5 + 9223372036854775806 is past int64"},
      {"maxpool-same-window-size-past-int64.onnx",
       "MaxPool #0: spatial axis 1: the window's size 4294967297 * 4294967297 is past int64"},
      {"convtranspose-strides-past-int64.onnx",
       "ConvTranspose #0: spatial axis 0: the strided input 4611686018427387904 * 2 is past int64"},
      {"convtranspose-output-padding-int64-max.onnx",
       "ConvTranspose 'test': spatial axis 0: the output size 6 + 9223372036854775807 is past int64"},
      {"depthtospace-blocksize-squared-past-int64.onnx",
       "DepthToSpace #0: blocksize^2 4294967297 * 4294967297 is past int64"},
      {"lstm-hidden-size-past-int64.onnx",
       "LSTM #0: the gates' rows, gates times hidden_size, 4 * 4611686018427387904 is past int64"},
      {"pad-folded-pad-int64-max.onnx", "Pad #0: the padded axis 1 + 9223372036854775807 is past int64"},
      {"pad-folded-pads-int64-min.onnx",
       "Pad #0: pads [-9223372036854775808,-9223372036854775808,-9223372036854775808,-9223372036854775808,"
       "-9223372036854775808,-9223372036854775808,-9223372036854775808,-9223372036854775808] remove more than the 1 "
       "elements of axis 0"},
      {"split-folded-sizes-past-int64.onnx",
       "Split #0: the sum of split [9223372036854775807,4], 9223372036854775807 + 4 is past int64"},
      {"splittosequence-sizes-past-int64.onnx",
       "SplitToSequence #0: the sum of the split sizes 9223372036854775807 + 9223372036854775807 is past int64"},
      {"lstm-empty-bias.onnx", "LSTM #0: B is FLOAT[1,0], expected FLOAT[1,24]"},
      {"resize-empty-axis-to-nine.onnx", "Resize #0: axis 2 of the input is empty but resized to 9"},
      {"tfidf-negative-ngram-index.onnx", "TfIdfVectorizer #0: ngram_indexes has a negative index -9223372036854775808"},
      {"tfidf-ngram-index-int64-max.onnx",
       "TfIdfVectorizer #0: the output width 9223372036854775807 + 1 is past int64"},
      {"scan-attribute-name-containing-external.onnx",
       "fails the ONNX checker: Unrecognized attribute: num_externaluts for operator Scan"},
      {"scan8-scalar-state-without-batch-axis.onnx", "Scan #0: state 0 is FLOAT[], expected the batch axis (1) first"}};
  for (const auto &[file, message] : cases) {
    std::ifstream in(kRegressions / "model" / file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(bytes.empty()) << file;
    try {
      SessionOptions options;
      options.numThreads = 1;
      options.memoryLimitBytes = int64_t{1} << 30;
      InferenceSession::createFromOnnxModel(bytes, DataFlow(1, std::vector<TensorId>{}), options)->prepareDevice();
      ADD_FAILURE() << file << " was accepted";
    } catch (const error &e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << file << ": " << e.what();
    }
  }
}

TEST(FuzzFindings, ModelsOnceUndefinedCompileToNumpysShapes) {
  // Inputs that overflowed or cast NaN but are valid: a Loop's negative trip count runs no
  // iteration, a Slice step near +-2^63 takes one element, Trilu's k near 2^63, a NaN one-hot
  // index and a max_gram_length of 2^31 - 1. The shapes are numpy's for the same slices.
  const std::vector<std::tuple<std::string, TensorId, Shape>> cases{
      {"loop-negative-trip-count-sizes-scan-output.onnx", "res_scan", {0, 1}},
      {"slice-folded-step-int64-max.onnx", "y", {1, 10, 5}},
      {"slice-folded-step-int64-min.onnx", "y", {1, 3, 2}},
      {"trilu-folded-k-int64-max.onnx", "y", {4, 5}},
      {"onehot-folded-nan-index.onnx", "y", {2, 10, 2}},
      {"tfidf-max-gram-length-int32-max.onnx", "Y", {2, 7}}};
  for (const auto &[file, output, shape] : cases) {
    std::ifstream in(kRegressions / "model" / file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(bytes.empty()) << file;
    SessionOptions options;
    options.numThreads = 1;
    auto session = InferenceSession::createFromOnnxModel(bytes, DataFlow(1, {output}), options);
    EXPECT_NO_THROW(session->prepareDevice()) << file;
    EXPECT_EQ(session->getInfo(output).shape(), shape) << file;
  }
}

TEST(FuzzFindings, TriluAndOneHotOfExtremeValuesAreDefined) {
  // Trilu's i + k overflowed for k near +-2^63; past either corner a row keeps all or none.
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  const TensorData x = TensorData::fromDoubles(DataType::FLOAT, {2, 3}, {1, 2, 3, 4, 5, 6});
  const std::vector<double> all{1, 2, 3, 4, 5, 6}, none(6, 0.0);
  for (int64_t upper : {0, 1})
    for (int64_t k : {kMin, kMax}) {
      ir::Attributes a;
      a.set("upper", upper);
      TensorData y = op_runner::runOp("Trilu", 14, a, {{"x", x}}, {{"k", TensorData::fromInt64({}, {k})}})[0];
      EXPECT_EQ(y.toDoubleVector(), (upper == 0) == (k == kMax) ? all : none) << "upper " << upper << " k " << k;
    }
  // OneHot's float indices were cast to int64 as they are (UB for NaN and 1e30): out of range,
  // they give a row of off values, as a too-large integer index does; -1 counts from the end.
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  ir::Attributes a;
  a.set("axis", int64_t{-1});
  TensorData y =
      op_runner::runOp("OneHot", 11, a, {{"indices", TensorData::fromDoubles(DataType::FLOAT, {5}, {kNan, 1e30, -1e30, 1, -1})}},
                       {{"depth", TensorData::fromDoubles(DataType::FLOAT, {}, {3})},
                        {"values", TensorData::fromDoubles(DataType::FLOAT, {2}, {0, 7})}})[0];
  EXPECT_EQ(y.toDoubleVector(), (std::vector<double>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 7}));
}

TEST(FuzzFindings, AHugeTileIsRefusedByTheMemoryLimitBeforeItsKernelIsMade) {
  // Tile's repeats, known only at compile, make an output of about 6 * 10^18 floats: its kernel
  // once allocated index tables of its axes first (AddressSanitizer: allocation-size-too-big).
  std::ifstream in(kRegressions / "model/tile-output-with-huge-dimension.onnx", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(bytes.empty());
  SessionOptions options;
  options.numThreads = 1;
  auto s = InferenceSession::createFromOnnxModel(bytes, DataFlow(1, std::vector<TensorId>{}), options);
  try {
    s->prepareDevice();
    ADD_FAILURE() << "the model was accepted";
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("tensor '2' alone (the activation arena's least)"), std::string::npos)
        << e.what();
  }
  // An empty shape has no elements, but its other dimensions must not multiply past 2^63 either:
  // kernels take strides and outer/inner sizes from partial products of shapes.
  EXPECT_EQ(shapeElementCount({int64_t{1} << 31, int64_t{1} << 31, 0}), 0);
  EXPECT_THROW(shapeElementCount({int64_t{1} << 62, int64_t{1} << 62, 0}), error);
}

TEST(FuzzFindings, SignedIntegerAddSubMulWrapAroundAsNumpyDoes) {
  // The fuzzer folded an int64 Add of two large constants: signed overflow in the reference kernel.
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  TensorId x = b->addInputTensor(TensorInfo(DataType::INT64, {3}), "x");
  TensorId y = b->addInputTensor(TensorInfo(DataType::INT64, {3}), "y");
  const std::vector<TensorId> outs{ai.add({x, y}), ai.sub({x, y}), ai.mul({x, y})};
  for (const TensorId &o : outs)
    b->addOutputTensor(o);
  SessionOptions options;
  options.numThreads = 1;
  auto s = InferenceSession::createFromOnnxModel(b->getModelProto(), DataFlow(1, outs), options);
  s->prepareDevice();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  std::vector<int64_t> xv{kMax, kMin, int64_t{1} << 62}, yv{1, 1, 4};
  std::vector<std::vector<int64_t>> got(3, std::vector<int64_t>(3));
  NDArrayWrapper<int64_t> xa(xv.data(), {3}), ya(yv.data(), {3}), a0(got[0].data(), {3}), a1(got[1].data(), {3}),
      a2(got[2].data(), {3});
  StepIO io({{x, xa}, {y, ya}}, {{outs[0], a0}, {outs[1], a1}, {outs[2], a2}});
  s->run(io);
  // Two's complement: the exact result modulo 2^64.
  EXPECT_EQ(got[0], (std::vector<int64_t>{kMin, kMin + 1, (int64_t{1} << 62) + 4}));
  EXPECT_EQ(got[1], (std::vector<int64_t>{kMax - 1, kMax, (int64_t{1} << 62) - 4}));
  EXPECT_EQ(got[2], (std::vector<int64_t>{kMax, kMin, 0}));
}

TEST(FuzzFindings, CoordinatesFarOutsideTheInputStayDefined) {
  // Found auditing casts after the SequenceErase finding: Resize's roi and GridSample's grid come
  // from the model or the data, and a coordinate of 1e30 or NaN was cast to int64 (UB).
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  TensorData x = TensorData::fromDoubles(DataType::FLOAT, {1, 1, 2, 2}, {1, 2, 3, 4});
  TensorData grid = TensorData::fromDoubles(DataType::FLOAT, {1, 1, 3, 2}, {1e30, -1e30, 3e38, -3e38, 0.25, 0.5});
  for (const char *padding : {"reflection", "border", "zeros"}) {
    ir::Attributes a;
    a.set("padding_mode", std::string(padding));
    a.set("align_corners", int64_t{0});
    TensorData y = op_runner::runOp("GridSample", 16, a, {{"x", x}, {"grid", grid}}, {})[0];
    for (int64_t i = 0; i < 3; ++i)
      EXPECT_TRUE(y.valueAsDouble(i) >= 0 && y.valueAsDouble(i) <= 4) << padding << " " << i << ": " << y.valueAsDouble(i);
  }
  TensorData roi = TensorData::fromDoubles(DataType::FLOAT, {8}, {0, 0, -1e30, kNan, 1, 1, 1e30, 1});
  for (const char *mode : {"nearest", "linear", "cubic"}) {
    ir::Attributes a;
    a.set("mode", std::string(mode));
    a.set("coordinate_transformation_mode", std::string("tf_crop_and_resize"));
    TensorData y = op_runner::runOp("Resize", 13, a, {{"x", x}},
                                    {{"roi", roi},
                                     {"scales", TensorData::fromDoubles(DataType::FLOAT, {0}, {})},
                                     {"sizes", TensorData::fromInt64({4}, {1, 1, 3, 3})}})[0];
    ASSERT_EQ(y.info().shape(), (Shape{1, 1, 3, 3}));
    for (int64_t i = 0; i < 9; ++i)
      EXPECT_TRUE(std::isfinite(y.valueAsDouble(i))) << mode << " " << i;
  }
}

TEST(FuzzFindings, ResizeRefusesNanScalesHugeScalesAndNegativeSizes) {
  TensorData x = TensorData::fromDoubles(DataType::FLOAT, {1, 1, 2, 2}, {1, 2, 3, 4});
  TensorData noRoi = TensorData::fromDoubles(DataType::FLOAT, {0}, {});
  auto resize = [&](const TensorData &scales, const TensorData &sizes) {
    try {
      op_runner::runOp("Resize", 13, {}, {{"x", x}}, {{"roi", noRoi}, {"scales", scales}, {"sizes", sizes}});
    } catch (const error &e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const TensorData noSizes = TensorData::fromInt64({0}, {});
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  std::string e = resize(TensorData::fromDoubles(DataType::FLOAT, {4}, {1, 1, kNan, 1}), noSizes);
  EXPECT_NE(e.find("on axis 2 must be positive"), std::string::npos) << e;
  e = resize(TensorData::fromDoubles(DataType::FLOAT, {4}, {1, 1, 3e38, 1}), noSizes);
  EXPECT_NE(e.find("on axis 2 of size 2 gives a size past 2^63"), std::string::npos) << e;
  e = resize(TensorData::fromDoubles(DataType::FLOAT, {0}, {}), TensorData::fromInt64({4}, {1, 1, -3, 2}));
  EXPECT_NE(e.find("size -3 on axis 2 is negative"), std::string::npos) << e;
}

TEST(FuzzFindings, CastsOfFloatsAnIntegerTypeCannotHoldSaturate) {
  // A constant Cast of NaN or 1e30 to an integer type, folded at compile, was a plain cast (UB;
  // ONNX leaves the result undefined). Saturated, NaN as 0, as Rust's and Java's casts define it.
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> values{kNan, 1e30, -1e30, 2.75, -2.75, 300, -300};
  auto cast = [&](DataType from, DataType to) {
    ir::Attributes a;
    a.set("to", static_cast<int64_t>(to)); // DataType numbers are ONNX's
    return op_runner::runOp("Cast", 13, a, {{"x", TensorData::fromDoubles(from, {7}, values)}}, {})[0];
  };
  const std::map<DataType, std::vector<double>> expected{
      {DataType::INT64, {0, 9223372036854775807.0, -9223372036854775808.0, 2, -2, 300, -300}},
      {DataType::INT32, {0, 2147483647, -2147483648.0, 2, -2, 300, -300}},
      {DataType::INT8, {0, 127, -128, 2, -2, 127, -128}},
      {DataType::UINT8, {0, 255, 0, 2, 0, 255, 0}}};
  for (DataType from : {DataType::FLOAT, DataType::DOUBLE, DataType::FLOAT16})
    for (const auto &[to, want] : expected) {
      TensorData y = cast(from, to);
      EXPECT_EQ(y.toDoubleVector(), want) << toString(from) << " to " << toString(to);
    }
}

TEST(FuzzFindings, IntegerEdgeCasesOfDivModNegAbsPowAreDefined) {
  // The smallest int64 over -1 traps on x86 (and is UB), as do its % -1, negation and Abs; an
  // integer Pow past the type was a plain cast of the double result (UB). All reachable by folding
  // constants at compile.
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  auto ints = [](const std::vector<int64_t> &v) { return TensorData::fromInt64({static_cast<int64_t>(v.size())}, v); };
  auto binary = [&](const char *type, const std::vector<int64_t> &x, const std::vector<int64_t> &y) {
    return op_runner::runOp(type, 13, {}, {{"x", ints(x)}, {"y", ints(y)}}, {})[0].toInt64Vector();
  };
  EXPECT_EQ(binary("Div", {kMin, 7, -7}, {-1, -1, 2}), (std::vector<int64_t>{kMin, -7, -3}));
  EXPECT_EQ(binary("Mod", {kMin, 7, -7}, {-1, -1, 2}), (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(binary("Pow", {10, -10, 2}, {30, 31, 10}), (std::vector<int64_t>{kMax, kMin, 1024}));
  for (const char *type : {"Neg", "Abs"})
    EXPECT_EQ(op_runner::runOp(type, 13, {}, {{"x", ints({kMin, -3})}}, {})[0].toInt64Vector(),
              (std::vector<int64_t>{kMin, 3}))
        << type;
}

TEST(FuzzFindings, RangeOfAHugeNegativeOrNanCountIsEmptyOrRefused) {
  // Range's count ceil((limit - start) / delta) was cast to int64 before its sign was checked: a
  // count of -1e30 (UB) is an empty range, as numpy.arange gives; NaN or past 1e12 is refused.
  auto range = [](double start, double limit, double delta) {
    auto scalar = [](double v) { return TensorData::fromDoubles(DataType::FLOAT, {}, {v}); };
    try {
      TensorData y = op_runner::runOp("Range", 11, {}, {},
                                      {{"start", scalar(start)}, {"limit", scalar(limit)}, {"delta", scalar(delta)}})[0];
      return "shape " + y.info().toString();
    } catch (const error &e) {
      return std::string(e.what());
    }
  };
  const double kInf = std::numeric_limits<double>::infinity();
  std::string e = range(0, -1e30, 1);
  EXPECT_NE(e.find("shape"), std::string::npos) << e;
  EXPECT_NE(e.find("[0]"), std::string::npos) << e;
  e = range(5, 1, 2);
  EXPECT_NE(e.find("[0]"), std::string::npos) << e;
  e = range(1, 7, 2);
  EXPECT_NE(e.find("[3]"), std::string::npos) << e;
  for (double limit : {1e30, kInf}) {
    e = range(0, limit, 1);
    EXPECT_NE(e.find("is too long"), std::string::npos) << limit << ": " << e;
  }
  e = range(kInf, kInf, 1); // inf - inf is NaN
  EXPECT_NE(e.find("is too long"), std::string::npos) << e;
}

/// A checkpoint whose JSON header has \p from replaced by \p to, its size and checksum made to fit
/// (so that the loader reaches the checks of the header's values).
std::string editedCheckpoint(const std::string &bytes, const std::string &from, const std::string &to) {
  const uint64_t n = test::wordAt(bytes, 24);
  std::string header = bytes.substr(32, n);
  size_t at = header.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at == std::string::npos) return bytes;
  header.replace(at, from.size(), to);
  return test::checkpointBytes({nlohmann::json::parse(header), bytes.substr(32 + n, bytes.size() - 32 - n - 8)});
}

TEST(FuzzFindings, CheckpointRefusedLateLeavesTheSessionUnchanged) {
  auto b = Builder::create();
  auto ai = b->aiOnnxOpset13();
  std::vector<float> w0{1.0f, 2.0f, 3.0f};
  TensorId x = b->addInputTensor(TensorInfo(DataType::FLOAT, {3}), "x");
  TensorId w = b->addInitializedInputTensor(w0.data(), TensorInfo(DataType::FLOAT, {3}), "w");
  b->addOutputTensor(ai.reducesum({ai.mul({w, x})}, std::nullopt, 0));
  SGD sgd({{"defaultLearningRate", {0.5f, false}}});
  auto s = TrainingSession::createFromOnnxModel(b->getModelProto(), DataFlow(1, std::vector<TensorId>{}), "", sgd);
  s->prepareDevice();
  s->weightsFromHost();
  const fs::path dir = fs::temp_directory_path() / ("fuzz_findings_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  s->saveCheckpoint((dir / "good.ckpt").string());
  std::ifstream in(dir / "good.ckpt", std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // One step moves w away from the checkpoint's values.
  std::vector<float> xv{1.0f, 1.0f, 1.0f};
  NDArrayWrapper<float> xa(xv.data(), {3});
  std::map<TensorId, IArray &> inputs{{x, xa}}, anchors;
  StepIO io(inputs, anchors);
  s->run(io);
  std::vector<float> before(3);
  NDArrayWrapper<float> beforeArray(before.data(), {3});
  WeightsIO read;
  read.insert(w, beforeArray);
  s->readWeights(read);
  ASSERT_NE(before, w0);
  // Numbers where the loader wants integers once went through nlohmann's unchecked casts (a shape
  // of 4.6e60 found by the checkpoint fuzzer: undefined behaviour).
  struct Edit {
    std::string from, to, message;
  };
  for (const auto &[from, to, message] : std::vector<Edit>{
           {"\"seed\":\"0\"", "\"seed\":\"x\"", "its seed 'x' is not an unsigned 64-bit number"},
           {"\"step\":0,", "", "its field 'step' is missing"},
           {"\"rngCounter\":0", "\"rngCounter\":\"a\"", "its field 'rngCounter' is \"a\", expected an integer"},
           {"\"shape\":[3]", "\"shape\":[4.6e60]", "its tensor 'w' dimension 0 is 4.6e+60, expected an integer"},
           {"\"shape\":[3]", "\"shape\":[-3]", "its tensor 'w' dimension 0 is -3, expected an integer in [0,"},
           {"\"shape\":[3]", "\"shape\":3", "the shape of tensor 'w' is 3, not an array"},
           {"\"step\":0", "\"step\":1e60", "its field 'step' is 1e+60, expected an integer"},
           {"\"step\":0", "\"step\":18446744073709551615", "its field 'step' is 18446744073709551615, expected"},
           {"\"replicas\":1", "\"replicas\":1.5", "its field 'replicas' is 1.5, expected an integer in [1,"},
           {"\"lossScale\":1.0", "\"lossScale\":1e60", "its field 'lossScale' is 1e+60, expected a positive number"},
           {"\"lossScale\":1.0", "\"lossScale\":0", "its field 'lossScale' is 0, expected a positive number"}}) {
    std::ofstream((dir / "bad.ckpt"), std::ios::binary) << editedCheckpoint(good, from, to);
    try {
      s->loadCheckpoint((dir / "bad.ckpt").string());
      ADD_FAILURE() << "a checkpoint with " << to << " was loaded";
    } catch (const error &e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find((dir / "bad.ckpt").string()), std::string::npos) << e.what();
    }
    std::vector<float> after(3);
    NDArrayWrapper<float> afterArray(after.data(), {3});
    WeightsIO again;
    again.insert(w, afterArray);
    s->readWeights(again);
    EXPECT_EQ(after, before) << "a checkpoint with " << to << " changed the weights";
    EXPECT_EQ(s->getStepCount(), 1);
  }
  s->loadCheckpoint((dir / "good.ckpt").string());
  EXPECT_EQ(s->getStepCount(), 0);
  fs::remove_all(dir);
}

} // namespace
