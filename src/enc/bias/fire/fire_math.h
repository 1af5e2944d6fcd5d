// FIRE (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context
// Transformers", arXiv 2310.04418): a learned function of the progressively interpolated distance,
//   b_h(i, j) = f_h( ψ(i − j) / ψ(max(L, i)) ),   ψ(x) = log(c·x + 1),
// with f a small MLP, R → R^H: f(x) = w2·relu(w1·x + b1) + b2 (W hidden units; the paper's
// experiments use W = 32), and c, L learned scalars. posenc takes d = |i − j| for the distance (the
// paper's models are causal, i ≥ j; see docs/bias.md) and i = the query's global position qp.
//
// Written here once: ψ and its derivatives, the normalised distance x with ∂x/∂c and ∂x/∂L, the
// MLP (the references evaluate it per pair) and its piecewise-linear form (the fast paths):
//
// Piecewise linear. Over x, unit k of the hidden layer switches at x_k = −b1[k]/w1[k], so f_h is
// linear between consecutive breakpoints: with the positive breakpoints sorted, t_1 < … < t_S
// (x ≥ 0 always: d ≥ 0, c > 0), segment s covers t_s ≤ x < t_{s+1} (t_0 = 0, t_{S+1} = ∞) and
//   f_h(x) = α[h][s] + β[h][s]·x,   α = b2[h] + Σ_{k∈A_s} w2[h,k]·b1[k],   β = Σ_{k∈A_s} w2[h,k]·w1[k],
// A_s the units active on it (w1[k]·x + b1[k] > 0). This is f exactly (up to the order of the
// double sums); per pair it costs a segment look-up (shared by the heads) and one multiply-add
// instead of W units. The point x = 0 (d = 0: the diagonal) is its own "segment" S + 1: there a
// unit with b1[k] = 0 sits exactly at its kink, which the gradient treats as inactive (relu'(0) = 0,
// as the reference does); its value equals segment 0's by continuity. At an exact tie x = t_k > 0
// the fast paths take the segment to the right (relu'(0) = 1 for that unit): a set of measure zero,
// where the reference says 0.
//
// Gradients from segment moments. For pairs in segment s with upstream g, Σ g·relu(w1[k]x + b1[k])
// = w1[k]·Σ g·x + b1[k]·Σ g for k ∈ A_s. So the MLP's gradients need only M0[s] = Σ g and
// M1[s] = Σ g·x per head and segment:
//   db2[h] += Σ_s M0,   dw2[h,k] += Σ_{s: k∈A_s} (w1[k]·M1 + b1[k]·M0),
//   dw1[k] += Σ_{s: k∈A_s} w2[h,k]·M1,   db1[k] += Σ_{s: k∈A_s} w2[h,k]·M0,
// and c, L through x: dc += Σ g·β_s·∂x/∂c, dL += Σ g·β_s·∂x/∂L.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace posenc::fire {

using I = std::int64_t;

// ψ(x) = log(c·x + 1), as log1p(c·x).
inline double psi(double c, double x) { return std::log1p(c * x); }
inline double psi_dc(double c, double x) { return x / (1.0 + c * x); }  // ∂ψ/∂c
inline double psi_dx(double c, double x) { return c / (1.0 + c * x); }  // ∂ψ/∂x

// The normaliser's argument n = max(L, qp); L wins ties (its gradient goes to L).
inline bool by_threshold(double L, I qp) { return L >= static_cast<double>(qp); }
inline double norm_arg(double L, I qp) { return by_threshold(L, qp) ? L : static_cast<double>(qp); }

// x = ψ(d)/ψ(n) and its derivatives by c and L.
struct X {
  double x = 0, dc = 0, dL = 0;
};
inline X normalised(double c, double L, I qp, double d) {
  const double n = norm_arg(L, qp), pn = psi(c, n);
  X r;
  r.x = psi(c, d) / pn;
  r.dc = (psi_dc(c, d) - r.x * psi_dc(c, n)) / pn;
  r.dL = by_threshold(L, qp) ? -r.x * psi_dx(c, n) / pn : 0.0;
  return r;
}

// f_h(x) = b2h + Σ_k w2h[k]·relu(w1[k]·x + b1[k]) (the reference's per-pair MLP).
inline double mlp(const double* w1, const double* b1, const double* w2h, double b2h, I W, double x) {
  double f = b2h;
  for (I k = 0; k < W; ++k) {
    const double pre = w1[k] * x + b1[k];
    if (pre > 0) f += w2h[k] * pre;
  }
  return f;
}

// f as linear pieces (see the top of this file).
struct Pieces {
  I W = 0, H = 0, S = 0;
  std::vector<double> t;             // [S] positive breakpoints, increasing
  std::vector<double> alpha, beta;   // [H, S + 2]
  std::vector<std::uint8_t> active;  // [S + 2, W]

  I segs() const { return S + 2; }
  I zero() const { return S + 1; }
  // Segment of x ≥ 0: S + 1 for x = 0, else the number of breakpoints ≤ x.
  I segment(double x) const {
    if (x == 0) return zero();
    return static_cast<I>(std::upper_bound(t.begin(), t.end(), x) - t.begin());
  }
  // The same, walking from the segment s0 of a nearby x (rows of a tile move by little).
  I segment_near(double x, I s0) const {
    if (x == 0) return zero();
    I s = s0 > S ? 0 : s0;
    while (s > 0 && x < t[static_cast<std::size_t>(s - 1)]) --s;
    while (s < S && x >= t[static_cast<std::size_t>(s)]) ++s;
    return s;
  }
  double a(I h, I s) const { return alpha[static_cast<std::size_t>(h * segs() + s)]; }
  double b(I h, I s) const { return beta[static_cast<std::size_t>(h * segs() + s)]; }
  bool on(I s, I k) const { return active[static_cast<std::size_t>(s * W + k)] != 0; }
};

// w1, b1 [W], w2 [H, W], b2 [H] (doubles).
inline Pieces pieces(const std::vector<double>& w1, const std::vector<double>& b1,
                     const std::vector<double>& w2, const std::vector<double>& b2, I H) {
  Pieces P;
  P.W = static_cast<I>(w1.size());
  P.H = H;
  std::vector<double> xk(w1.size());  // each unit's breakpoint (±inf when w1 = 0: never switches)
  for (std::size_t k = 0; k < w1.size(); ++k) {
    xk[k] = w1[k] != 0 ? -b1[k] / w1[k] : std::numeric_limits<double>::infinity();
    if (xk[k] > 0 && std::isfinite(xk[k])) P.t.push_back(xk[k]);
  }
  std::sort(P.t.begin(), P.t.end());
  P.t.erase(std::unique(P.t.begin(), P.t.end()), P.t.end());
  P.S = static_cast<I>(P.t.size());
  P.active.assign(static_cast<std::size_t>(P.segs() * P.W), 0);
  for (I k = 0; k < P.W; ++k) {
    const std::size_t uk = static_cast<std::size_t>(k);
    // Segment s ≤ S is [t_{s−1}, t_s) (t_{−1} = 0, t_S = ∞). A unit with w1 > 0 is on right of its
    // breakpoint x_k = t_m: on segments s ≥ m + 1 (all of them when x_k ≤ 0); with w1 < 0 left of
    // it: on segments s ≤ m (none when x_k ≤ 0); with w1 = 0 it is constant: on iff b1 > 0.
    I m = -1;  // index of x_k among the breakpoints, −1 when x_k ≤ 0
    if (w1[uk] != 0 && xk[uk] > 0 && std::isfinite(xk[uk]))
      m = static_cast<I>(std::lower_bound(P.t.begin(), P.t.end(), xk[uk]) - P.t.begin());
    for (I s = 0; s <= P.S; ++s) {
      bool on;
      if (w1[uk] == 0) on = b1[uk] > 0;
      else if (w1[uk] > 0) on = m < 0 || s >= m + 1;
      else on = m >= 0 && s <= m;
      P.active[static_cast<std::size_t>(s * P.W + k)] = on ? 1 : 0;
    }
    P.active[static_cast<std::size_t>(P.zero() * P.W + k)] = b1[uk] > 0 ? 1 : 0;  // pre-activation at 0
  }
  P.alpha.assign(static_cast<std::size_t>(H * P.segs()), 0.0);
  P.beta.assign(P.alpha.size(), 0.0);
  for (I h = 0; h < H; ++h)
    for (I s = 0; s < P.segs(); ++s) {
      double a = b2[static_cast<std::size_t>(h)], b = 0;
      for (I k = 0; k < P.W; ++k)
        if (P.on(s, k)) {
          const double w = w2[static_cast<std::size_t>(h * P.W + k)];
          a += w * b1[static_cast<std::size_t>(k)];
          b += w * w1[static_cast<std::size_t>(k)];
        }
      P.alpha[static_cast<std::size_t>(h * P.segs() + s)] = a;
      P.beta[static_cast<std::size_t>(h * P.segs() + s)] = b;
    }
  return P;
}

// The MLP's gradients from per-head segment moments M0, M1 [H, S + 2] (see the top), added into
// dw1, db1 [W], dw2 [H, W], db2 [H].
inline void mlp_grads(const Pieces& P, const std::vector<double>& w1, const std::vector<double>& b1,
                      const std::vector<double>& w2, const std::vector<double>& M0,
                      const std::vector<double>& M1, std::vector<double>* dw1, std::vector<double>* db1,
                      std::vector<double>* dw2, std::vector<double>* db2) {
  for (I h = 0; h < P.H; ++h)
    for (I s = 0; s < P.segs(); ++s) {
      const std::size_t hs = static_cast<std::size_t>(h * P.segs() + s);
      const double m0 = M0[hs], m1 = M1[hs];
      (*db2)[static_cast<std::size_t>(h)] += m0;
      if (m0 == 0 && m1 == 0) continue;
      for (I k = 0; k < P.W; ++k) {
        if (!P.on(s, k)) continue;
        const std::size_t uk = static_cast<std::size_t>(k), hk = static_cast<std::size_t>(h * P.W + k);
        (*dw2)[hk] += w1[uk] * m1 + b1[uk] * m0;
        (*dw1)[uk] += w2[hk] * m1;
        (*db1)[uk] += w2[hk] * m0;
      }
    }
}

}  // namespace posenc::fire
