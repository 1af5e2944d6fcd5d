// 2D RoPE's formulas written once (see docs/rotary.md for the definitions).
//
// Source: Heo et al. 2024, Rotary Position Embedding for Vision Transformer (RoPE-ViT, arXiv
// 2403.13298), its axial and mixed frequencies, as the authors' code (naver-ai/rope-vit,
// models/vit_rope.py) computes them: compute_axial_cis, init_random_2d_freqs, compute_mixed_cis.
#pragma once

#include <cmath>
#include <cstdint>

namespace posenc::rope2d {

using I = std::int64_t;

// Axial: pair k of r/2 reads coordinate x (axis 0) for k < r/4 and y (axis 1) after, with rung
// k mod r/4 of the per-axis ladder ω_j = theta^(−4j/r) (compute_axial_cis: freqs_x and freqs_y are
// both 1/theta^(arange(0, r, 4)/r), and the rotations are concatenated x first, then y).
inline int axial_axis(I k, I r) { return k < r / 4 ? 0 : 1; }
inline I axial_rung(I k, I r) { return k < r / 4 ? k : k - r / 4; }

// Mixed: φ_{h,k} = x·θˣ_{h,k} + y·θʸ_{h,k} (compute_mixed_cis: t_x·freqs[0] + t_y·freqs[1]), in double.
inline double mixed_angle(I x, I y, double fx, double fy) {
  return static_cast<double>(x) * fx + static_cast<double>(y) * fy;
}

// The derivative of the loss by the angle of one pair, from the pair's output y = a·R(φ)x and its
// upstream gradient g: ∂y_a/∂φ = −y_b, ∂y_b/∂φ = y_a, so ∂L/∂φ = g_b·y_a − g_a·y_b.
inline double dphi(double ya, double yb, double ga, double gb) { return gb * ya - ga * yb; }

// Mixed initialisation (init_random_2d_freqs): magnitude μ_j = 1/theta^(4j/r) for j < r/4; head h's
// pairs j and j + r/4 point along α_h and α_h + π/2:
//   θˣ_{h,j} = μ_j cos α_h, θˣ_{h,j+r/4} = μ_j cos(α_h + π/2), θʸ likewise with sin.
inline double mixed_magnitude(double theta, I j, I r) {
  return 1.0 / std::pow(theta, static_cast<double>(4 * j) / static_cast<double>(r));
}

}  // namespace posenc::rope2d
