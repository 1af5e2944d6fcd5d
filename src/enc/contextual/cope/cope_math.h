// Contextual Position Encoding written once (Golovneva et al. 2024, arXiv 2405.18719, §3):
//
//   g_ij = σ(a_ij)                     a_ij the (masked) attention logit; σ(−inf) = 0
//   p_ij = min(Σ_{t ≥ j} g_it, npos − 1)   a fractional, clamped count of the gates from j onwards
//   z_ij = (1 − w)·q_i·e[⌊p⌋] + w·q_i·e[⌈p⌉],  w = p − ⌊p⌋   (interpolation between table rows)
//
// The paper's code computes the same with gates.flip(-1).cumsum(-1).flip(-1), clamp(max=npos−1),
// then gathers q·eᵀ at floor and ceil.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace posenc::cope {

// σ(a), 0 for a = −inf, without overflow for large |a|.
inline double gate(double a) {
  if (a >= 0) return 1.0 / (1.0 + std::exp(-a));
  const double e = std::exp(a);  // 0 for a = −inf
  return e / (1.0 + e);
}

// A clamped position and its interpolation between two table rows.
struct Interp {
  std::int64_t lo = 0, hi = 0;  // ⌊p⌋, ⌈p⌉ (equal when p is an integer)
  double w = 0;                 // p − ⌊p⌋: weight of row hi
  bool clamped = false;         // the count reached npos − 1: ∂p/∂(count) = 0
};

inline Interp interpolate(double count, std::int64_t npos) {
  Interp r;
  const double top = static_cast<double>(npos - 1);
  double p = count;
  if (!(p < top)) {
    p = top;
    r.clamped = true;
  }
  if (p < 0) p = 0;  // counts are sums of gates in [0, 1]; never negative
  const double f = std::floor(p);
  r.lo = static_cast<std::int64_t>(f);
  r.hi = static_cast<std::int64_t>(std::ceil(p));
  r.w = p - f;
  return r;
}

// Table rows a row of n_keys keys can reach: each gate is at most 1, so the count, and with it ⌈p⌉,
// never exceeds n_keys; rows past min(npos − 1, n_keys) are never read and get no gradient.
inline std::int64_t rows_reached(std::int64_t npos, std::int64_t n_keys) {
  return std::min(npos, n_keys + 1);
}

}  // namespace posenc::cope
