#pragma once
// Dropout's counter-based mask, shared by its kernel, its gradient rule and the tests.
//
// In training mode with the optional input 3 (INT64 [2] = {seed, counter}, which the session
// supplies and advances per step), element i is kept iff
//   uniform(key(seed, counter, salt), i) >= ratio,
// a pure function: the backward pass recomputes the same mask from the same inputs and salt.

#include "ir/op.hpp"

#include <cstdint>

namespace popart::ir {

/// The SplitMix64 finaliser: a bijective 64-bit mix with full avalanche.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// One key per (seed, counter, salt): the three are mixed in turn so that no two differ by a shift.
inline uint64_t dropoutKey(uint64_t seed, uint64_t counter, uint64_t salt) {
  return mix64(mix64(mix64(seed + 0x9e3779b97f4a7c15ULL) ^ counter) + salt);
}

/// A uniform double in [0, 1) for element \p i: the i-th SplitMix64 output from state \p key.
inline double dropoutUniform(uint64_t key, uint64_t i) {
  uint64_t bits = mix64(key + (i + 1) * 0x9e3779b97f4a7c15ULL);
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

/// The salt of Dropout \p op: attribute popart_salt if set, else the seed attribute, else a hash
/// of output 0's name, so that two Dropout ops fed the same (seed, counter) draw different masks.
int64_t dropoutSalt(const Op &op);

/// True if Dropout \p op trains when its training_mode input (opset 12+) holds \p trainingInput.
/// Opsets 1-11 have no such input: they train when the session connects the (seed, counter)
/// input 3 (and, for opsets 1-6, is_test is 0).
bool dropoutTraining(const Op &op, bool trainingInput);

} // namespace popart::ir
