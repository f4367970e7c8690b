#pragma once
// Element conversions between FLOAT and the 16-bit float types for code outside the kernels: the
// sessions' copies of inputs and anchors that the precision modes keep in 16 bits on the device.

#include <popart/datatype.hpp>

#include <cstdint>

namespace popart::backend_cpu {

/// Converts \p n elements of \p from at \p src into \p to at \p dst: FLOAT to and from FLOAT16 or
/// BFLOAT16, bit for bit as the Cast kernels (core/half.hpp's rounding), in parallel when \p n is
/// large; a copy when the types are equal. Throws naming both types for any other pair.
void convertElements(DataType from, const void *src, DataType to, void *dst, int64_t n);

} // namespace popart::backend_cpu
