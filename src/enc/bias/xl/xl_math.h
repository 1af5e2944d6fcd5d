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

// One (sin, cos) pair of Y = (q + v)·W turned to the key's frame: with (sa, ca) = (sin α, cos α) of
// the query's angle, Y₀ sin(α − β) + Y₁ cos(α − β) = t₀ sin β + t₁ cos β for every key angle β
// (the angle-difference identities), so the position term is a dot product with the key's own
// sinusoid. The fused and decode kernels form their query rows with it (attention_xl_cpu.cc).
template <class T>
inline void to_key_frame(T y0, T y1, T sa, T ca, T* t0, T* t1) {
  *t0 = y1 * sa - y0 * ca;
  *t1 = y0 * sa + y1 * ca;
}

}  // namespace posenc::xl
