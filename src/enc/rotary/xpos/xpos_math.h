// xPos's formulas written once (see docs/rotary.md for the definitions).
//
// Source: Sun et al. 2022, A Length-Extrapolatable Transformer (arXiv 2212.10554), §3: RoPE whose
// pair k is scaled by ζ_k^(n/γ_s) on queries and ζ_k^(−n/γ_s) on keys, ζ_k = (2k/d + γ)/(1 + γ)
// (here k < r/2 and d = r, the rotated dimensions), γ = 0.4, scale base γ_s = 512; and the
// authors' torchscale XPOS (xpos_relative_position.py): scale buffer (arange(0, d, 2) + 0.4·d) /
// (1.4·d) raised to arange(min_pos, max_pos)/scale_base with min_pos = −⌈n/2⌉ for n = length +
// offset positions (the exponent of position m is m − ⌈n/2⌉), queries multiplied by it and keys by
// its reciprocal (downscale=True), the rotation torchscale's rotate_every_two (interleaved pairs).
#pragma once

#include <cmath>
#include <cstdint>

namespace posenc::xpos {

using I = std::int64_t;

// ζ_k = (2k/r + γ)/(1 + γ), in (0, 1] for γ > 0.
inline double zeta(I k, I r, double gamma) {
  return (2.0 * static_cast<double>(k) / static_cast<double>(r) + gamma) / (1.0 + gamma);
}
// ln ζ_k / scale_base: ρ = ζ_k^(e/scale_base) = exp(e·ln ζ_k/scale_base).
inline double log_rate(I k, I r, double gamma, double scale_base) { return std::log(zeta(k, r, gamma)) / scale_base; }
// torchscale's centre for n positions: −min_pos = −(−n // 2) = ⌈n/2⌉.
inline I auto_center(I n) { return n <= 0 ? 0 : n / 2 + n % 2; }  // no n + 1: n may be 2^63 − 1
// ρ of a query (sign +1) or key (sign −1) at position m: ζ^(sign·(m − c)/scale_base).
inline double rho(I m, I c, double rate, int sign) {
  return std::exp(static_cast<double>(sign) * static_cast<double>(m - c) * rate);
}

}  // namespace posenc::xpos
