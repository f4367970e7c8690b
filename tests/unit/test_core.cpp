#include "core/half.hpp"
#include "core/tensordata.hpp"
#include <popart/error.hpp>

#include <gtest/gtest.h>

#include <cmath>

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
