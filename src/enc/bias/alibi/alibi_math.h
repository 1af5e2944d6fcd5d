// ALiBi's slope rule (Press et al. 2022, arXiv 2108.12409, §3 and the authors' reference code):
// for H a power of two, m_h = start^(h+1) with start = 2^(−8/H), i.e. 2^(−8/H), 2^(−16/H), …, 2^(−8);
// for other H, the slopes of the largest power of two P < H, then the even-indexed slopes of 2P
// (2^(−4/P), 2^(−12/P), …) until H are filled.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace posenc::alibi {

inline std::vector<double> slopes_pow2(std::int64_t n) {
  std::vector<double> s(static_cast<std::size_t>(n));
  const double start = std::exp2(-8.0 / static_cast<double>(n));
  for (std::int64_t h = 0; h < n; ++h) s[static_cast<std::size_t>(h)] = std::pow(start, h + 1);
  return s;
}

inline std::vector<double> slopes(std::int64_t n) {
  if (n <= 0) return {};
  std::int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  std::vector<double> s = slopes_pow2(p);
  if (p == n) return s;
  const std::vector<double> extra = slopes(2 * p);
  for (std::size_t i = 0; s.size() < static_cast<std::size_t>(n); i += 2) s.push_back(extra[i]);
  return s;
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The slopes of H heads by the rule: symmetric, the rule for H heads; nonsymmetric, the rule for H/2
// heads, shared by head h and head h + H/2.
inline std::vector<double> rule_slopes(std::int64_t H, bool nonsymmetric) {
  if (!nonsymmetric) return slopes(H);
  std::vector<double> s = slopes(H / 2);
  const std::vector<double> half = s;
  s.insert(s.end(), half.begin(), half.end());
  return s;
}

// Nonsymmetric variant: heads h < H/2 look only at the past (r ≤ 0), the others only at the future
// (r ≥ 0); r = key − query.
inline bool nonsymmetric_allows(std::int64_t h, std::int64_t H, std::int64_t r) {
  return r == 0 || (h < H / 2 ? r < 0 : r > 0);
}

// Learned variant at r = key − query, given σ(w[0,h]) (past) and σ(w[1,h]) (future).
inline double learned_bias(std::int64_t r, double sig_past, double sig_future) {
  return r < 0 ? -sig_past * static_cast<double>(-r) : r > 0 ? -sig_future * static_cast<double>(r) : 0.0;
}

}  // namespace posenc::alibi
