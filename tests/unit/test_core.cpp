#include "core/half.hpp"
#include "core/tensordata.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace popart;

TEST(Core, DataTypeNamesRoundTrip) {
  for (int i = 1; i <= 16; ++i) {
    DataType t = dataTypeFromOnnx(i);
    EXPECT_EQ(dataTypeFromString(toString(t)), t);
  }
  EXPECT_THROW(dataTypeFromString("FLOAT7"), error);
  EXPECT_THROW(dataTypeFromOnnx(99), error);
}

TEST(Core, TensorInfoCounts) {
  TensorInfo info(DataType::FLOAT16, {2, 3, 4});
  EXPECT_EQ(info.elementCount(), 24);
  EXPECT_EQ(info.byteCount(), 48);
  EXPECT_EQ(info.dim(-1), 4);
  EXPECT_THROW(info.dim(3), error);
  EXPECT_EQ(info.toString(), "FLOAT16[2,3,4]");
  EXPECT_FALSE(TensorInfo(DataType::FLOAT, {-1, 3}).isKnown());
}

TEST(Core, HalfConversionIsExactOnRepresentableValues) {
  for (float f : {0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f, 5.960464477539063e-08f})
    EXPECT_EQ(halfToFloat(floatToHalf(f)), f) << f;
  EXPECT_TRUE(std::isinf(halfToFloat(floatToHalf(1e6f))));
  EXPECT_EQ(bfloat16ToFloat(floatToBfloat16(1.5f)), 1.5f);
}

TEST(Core, TensorDataIsAlignedAndCopies) {
  TensorData a = TensorData::fromDoubles(DataType::INT32, {3}, {1, 2, 3});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  TensorData b = a;
  b.as<int32_t>()[0] = 7;
  EXPECT_EQ(a.as<int32_t>()[0], 1);
  EXPECT_EQ(b.toInt64Vector(), (std::vector<int64_t>{7, 2, 3}));
  EXPECT_THROW(a.reshape({2}), error);
}

TEST(Core, IntegerValuesAreExactAndFloatsPastInt64AreRefused) {
  // int64 values past 2^53 read through a double once lost their low bits, and 2^63 - 3 rounded to
  // 2^63, whose cast back to int64 is undefined behaviour (a SequenceErase position, found by fuzzing).
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  TensorData big = TensorData::fromInt64({3}, {kMax - 2, std::numeric_limits<int64_t>::min(), -7});
  EXPECT_EQ(big.valueAsInt64(0), kMax - 2);
  EXPECT_EQ(big.toInt64Vector(), (std::vector<int64_t>{kMax - 2, std::numeric_limits<int64_t>::min(), -7}));
  TensorData floats = TensorData::fromDoubles(DataType::FLOAT, {4}, {-2.75, 1e30, std::nan(""), -9.2233720368547758e18});
  EXPECT_EQ(floats.valueAsInt64(0), -2); // truncated toward zero, as a C++ cast
  EXPECT_EQ(floats.valueAsInt64(3), std::numeric_limits<int64_t>::min());
  for (int64_t i : {1, 2}) {
    try {
      floats.valueAsInt64(i);
      ADD_FAILURE() << "element " << i << " was read as an integer";
    } catch (const error &e) {
      EXPECT_NE(std::string(e.what()).find("a FLOAT value"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("int64 cannot hold"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(floats.toInt64Vector(), error);
}

TEST(Core, ShapesWhoseDimensionsMultiplyPastInt64AreRefusedEvenWhenEmpty) {
  // A fuzzed model held an empty constant of shape [2,1,0,0,8064,0,1224934963022921727,12,64]:
  // the Add folding it computed its strides in a product past int64 (UB).
  const Shape empty{2, 0, int64_t{1} << 62, int64_t{1} << 62, 4};
  for (const Shape &s : {empty, Shape{2, int64_t{1} << 62, int64_t{1} << 62}}) {
    EXPECT_THROW(rowMajorStrides(s), error) << toString(s);
    EXPECT_THROW(shapeElementCount(s), error) << toString(s);
  }
  try {
    shapeElementCount(empty);
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("is empty, but its other dimensions multiply past 2^63"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(rowMajorStrides({2, 0, 4}), (std::vector<int64_t>{0, 4, 1}));
  EXPECT_EQ(rowMajorStrides({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
}

TEST(Core, FromDoublesSaturatesIntegerTypesLikeCast) {
  // Pad-2's float `value` attribute becomes an input of the data's type: NaN for a UINT16 Pad,
  // found by fuzzing, was a plain cast (UB).
  TensorData t = TensorData::fromDoubles(DataType::UINT16, {4}, {std::nan(""), 1e9, -5, 7.9});
  EXPECT_EQ(t.toInt64Vector(), (std::vector<int64_t>{0, 65535, 0, 7}));
  TensorData b = TensorData::fromDoubles(DataType::BOOL, {2}, {std::nan(""), 0});
  EXPECT_EQ(b.toInt64Vector(), (std::vector<int64_t>{1, 0}));
}
