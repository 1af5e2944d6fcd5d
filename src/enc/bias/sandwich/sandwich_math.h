// Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of Receptive
// Field Analysis", arXiv 2212.10356): the inner product of two sinusoidal position embeddings of
// dimension d̄ depends only on the distance r = m − n,
//   p_mᵀp_n = Σ_{k=1}^{d̄/2} cos(r·ω_k),   ω_k = base^(−2k/d̄),
// and Sandwich adds it to the logits as a parameter-free bias, shifted by −d̄/2 (0 on the diagonal,
// ≤ 0 elsewhere; a constant per row, which softmax ignores) and compressed per head as ALiBi's
// slopes are (head h of H, 0-based, divided by 8(h+1)/H):
//   b_h(r) = (Σ_k cos(r·ω_k) − d̄/2) · H/(8(h+1))
// The frequency index k runs from 1 to d̄/2 as in the paper's sum; the offset and the per-head
// factor as in NVIDIA NeMo's SandwichRelativePositionEmbedding, an implementation of the paper.
//
// Evaluated as Σ_k (cos(r·ω_k) − 1) = −2·Σ_k sin²(r·ω_k/2): the same value without the cancellation
// of subtracting d̄/2 from a sum of numbers near 1 (near the diagonal, where the bias is small).
// The angle r·ω_k is formed in double: error ≤ (d̄/2)·|r|·2⁻⁵² besides the sum's rounding.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace posenc::sandwich {

// ω_k for k = 1 … d̄/2.
inline std::vector<double> freqs(std::int64_t dim, double base) {
  std::vector<double> w(static_cast<std::size_t>(dim / 2));
  for (std::int64_t k = 1; k <= dim / 2; ++k)
    w[static_cast<std::size_t>(k - 1)] = std::pow(base, -2.0 * static_cast<double>(k) / static_cast<double>(dim));
  return w;
}

// Σ_k cos(r·ω_k) − d̄/2, the head-independent part.
inline double shifted_inner_product(double r, const std::vector<double>& w) {
  double s = 0;
  for (double wk : w) {
    const double h = std::sin(0.5 * r * wk);
    s += h * h;
  }
  return -2.0 * s;
}

// H/(8(h+1)): head h's compression, ALiBi's 8h/H exponent rule as a divisor.
inline double head_scale(std::int64_t h, std::int64_t H) {
  return static_cast<double>(H) / (8.0 * static_cast<double>(h + 1));
}

}  // namespace posenc::sandwich
