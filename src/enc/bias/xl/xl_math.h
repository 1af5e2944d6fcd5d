// Transformer-XL's relative positional term written once (Dai et al. 2019, arXiv 1901.02860, §3.3):
//
//   logit_ij = scale·( q_i·k_j  +  u·k_j  +  q_i·r(δ)  +  v·r(δ) )      (terms (a), (c), (b), (d))
//   r(δ) = W·s(δ),   δ = query position − key position,   W: [D, R] per head
//   s(δ)[2i] = sin(δ / base^(2i/R)),  s(δ)[2i+1] = cos(δ / base^(2i/R)),  base = 10000, R even
//
// The paper's code concatenates [sin…, cos…] where posenc interleaves them (the layout of
// sinusoidal_math.h); since W is learned, the two differ only by a fixed permutation of W's columns.
#pragma once

#include <cstdint>

#include "enc/absolute/sinusoidal/sinusoidal_math.h"

namespace posenc::xl {

inline constexpr double kBase = 10000.0;

// s(δ) into s[0 .. R).
inline void relative_sinusoid(double delta, std::int64_t R, double* s) {
  for (std::int64_t c = 0; c < R; ++c) s[c] = sinusoid::value(delta, c, R, kBase);
}

// r = W·s with W [D, R] row-major, s [R], r [D].
inline void project(const double* W, const double* s, std::int64_t D, std::int64_t R, double* r) {
  for (std::int64_t d = 0; d < D; ++d) {
    double acc = 0;
    for (std::int64_t c = 0; c < R; ++c) acc += W[d * R + c] * s[c];
    r[d] = acc;
  }
}

}  // namespace posenc::xl
