// RoPE's formula written once (RoFormer, arXiv 2104.09864, eq. 34–35):
//   θ_k = theta^(−2k/r), k = 0 .. r/2 − 1; token at position m rotates pair k by m·θ_k.
// Pair members: interleaved (2k, 2k+1); half (k, k + r/2).
#pragma once

#include <cmath>
#include <cstdint>

#include "posenc/rope.h"

namespace posenc::rope {

inline double inv_freq(std::int64_t k, std::int64_t r, double theta) {
  return std::pow(theta, -2.0 * static_cast<double>(k) / static_cast<double>(r));
}

// Indices (a, b) of pair k: x'_a = x_a cos − x_b sin, x'_b = x_a sin + x_b cos.
inline void pair(RopeLayout layout, std::int64_t k, std::int64_t r, std::int64_t* a, std::int64_t* b) {
  if (layout == RopeLayout::kInterleaved) {
    *a = 2 * k;
    *b = 2 * k + 1;
  } else {
    *a = k;
    *b = k + r / 2;
  }
}

// The angle m·θ_k in double: exact to double rounding for any integer position below 2^53.
inline double angle(std::int64_t m, std::int64_t k, std::int64_t r, double theta) {
  return static_cast<double>(m) * inv_freq(k, r, theta);
}

}  // namespace posenc::rope
