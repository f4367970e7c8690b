#pragma once
// Whether a floating-point value can be converted to int64 without undefined behaviour.

namespace popart {

/// True if \p v is a number in [-2^63, 2^63), so that a cast to int64 is defined (it truncates).
/// False for NaN and for values past either end. Every double in that range casts exactly.
inline bool fitsInt64(double v) {
  constexpr double kTwo63 = 9223372036854775808.0; // 2^63, exactly representable
  return v >= -kTwo63 && v < kTwo63;
}

} // namespace popart
