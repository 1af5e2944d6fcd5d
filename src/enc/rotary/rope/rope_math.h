// RoPE's formulas written once: the pairs of a layout and the inverse frequency ω_k of every scheme
// (see docs/rope.md for the definitions and their sources).
//
// Each scheme is a template over its arithmetic T, evaluated twice by rope_freqs.cc:
//   T = double: the accurate frequencies;
//   T = F32:    transformers' float32 tensors, every operation rounded to float32 in the order the
//               Python code performs it (hf mode). The quantities transformers computes with Python
//               floats (YaRN's correction range, Llama 3's wavelength thresholds, attention factors)
//               stay double in both.
// Operation order follows transformers 4.56 (src/transformers/modeling_rope_utils.py); with
// T = double it is the plain formula up to an ulp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "posenc/rope.h"

namespace posenc::rope {

constexpr double kPi = 3.14159265358979323846;

// Indices (a, b) of pair k: x'_a = x_a cos − x_b sin, x'_b = x_a sin + x_b cos.
// Pair members: interleaved (2k, 2k+1); half (k, k + r/2).
inline void pair(RopeLayout layout, std::int64_t k, std::int64_t r, std::int64_t* a, std::int64_t* b) {
  if (layout == RopeLayout::kInterleaved) {
    *a = 2 * k;
    *b = 2 * k + 1;
  } else {
    *a = k;
    *b = k + r / 2;
  }
}

// ---- the two arithmetics ------------------------------------------------------------------------
// A float32 value whose operations round to float32 (IEEE single, as PyTorch's CPU float32
// kernels: + − × ÷ are correctly rounded there). pow goes through double and is rounded once, which
// is the correctly rounded float32 result except for a double-rounding tie that powf's own error
// dwarfs. This file is compiled with -ffp-contract=off (CMakeLists.txt) so no product is fused.
struct F32 {
  float v = 0.0f;
  F32() = default;
  explicit F32(double x) : v(static_cast<float>(x)) {}
  static F32 raw(float f) {
    F32 r;
    r.v = f;
    return r;
  }
};
inline F32 operator+(F32 a, F32 b) { return F32::raw(a.v + b.v); }
inline F32 operator-(F32 a, F32 b) { return F32::raw(a.v - b.v); }
inline F32 operator*(F32 a, F32 b) { return F32::raw(a.v * b.v); }
inline F32 operator/(F32 a, F32 b) { return F32::raw(a.v / b.v); }
inline bool operator<(F32 a, F32 b) { return a.v < b.v; }
inline bool operator>(F32 a, F32 b) { return a.v > b.v; }
inline F32 pow(F32 a, F32 b) { return F32(std::pow(static_cast<double>(a.v), static_cast<double>(b.v))); }
// A float32 tensor to a Python-float power: PyTorch keeps that exponent in double (measured with
// torch 1.13 on the CPU: x ** (r / (r − 2)) matches pow in double of the float x, rounded once).
inline F32 pow(F32 a, double b) { return F32(std::pow(static_cast<double>(a.v), b)); }
inline F32 clamp01(F32 a) { return F32::raw(std::min(std::max(a.v, 0.0f), 1.0f)); }
inline double value(F32 a) { return static_cast<double>(a.v); }

inline double pow(double a, double b) { return std::pow(a, b); }
inline double clamp01(double a) { return std::min(std::max(a, 0.0), 1.0); }
inline double value(double a) { return a; }

// ---- RoFormer's frequencies --------------------------------------------------------------------
// ω⁰_k = 1 / base^(2k/r) (RoFormer eq. 15): transformers' 1.0 / (base ** (arange(0, r, 2).float() / r)).
template <class T>
T exponent(std::int64_t k, std::int64_t r) {
  return T(static_cast<double>(2 * k)) / T(static_cast<double>(r));
}
template <class T>
T base_pow(double base, std::int64_t k, std::int64_t r) {
  return pow(T(base), exponent<T>(k, r));
}
template <class T>
T default_inv(double base, std::int64_t k, std::int64_t r) {
  return T(1.0) / base_pow<T>(base, k, r);
}

// ---- NTK-aware bases ---------------------------------------------------------------------------
// Static (bloc97, 2023): θ' = theta·s^(r/(r−2)), so that the lowest frequency is divided by s.
inline double ntk_base(double theta, double s, std::int64_t r) {
  return theta * std::pow(s, static_cast<double>(r) / static_cast<double>(r - 2));
}
// Dynamic (transformers' _compute_dynamic_ntk_parameters): θ' = theta·(s·n/W − (s − 1))^(r/(r−2)) for
// the call's length n > W. At a forward transformers computes it on float32 tensors (n is
// max(position_ids) + 1, a tensor), which T = F32 reproduces.
template <class T>
T dynamic_base(double theta, double s, std::int64_t n, std::int64_t W, std::int64_t r) {
  T x = T(s) * T(static_cast<double>(n));
  x = x / T(static_cast<double>(W));
  x = x - T(s - 1.0);
  x = pow(x, static_cast<double>(r) / static_cast<double>(r - 2));
  return T(theta) * x;
}
template <class T>
T base_pow_t(T base, std::int64_t k, std::int64_t r) {
  return pow(base, exponent<T>(k, r));
}

// ---- YaRN (Peng et al. 2023, arXiv 2309.00071, §3.2 eq. 17–20; transformers' _compute_yarn_parameters)
// The dimension where a wavelength fits `rotations` times into L positions:
//   d(β) = r·ln(L / (2π·β)) / (2·ln base)
inline double yarn_correction_dim(double rotations, std::int64_t r, double base, double L) {
  return static_cast<double>(r) * std::log(L / (rotations * 2 * kPi)) / (2 * std::log(base));
}
// [lo, hi] = [d(beta_fast), d(beta_slow)], floored/ceiled when truncate, clamped to [0, r − 1] (sic:
// r − 1, not r/2 − 1, as transformers), and widened by 0.001 when equal (its singularity guard).
inline void yarn_range(double beta_fast, double beta_slow, std::int64_t r, double base, double L, bool truncate,
                       double* lo, double* hi) {
  double low = yarn_correction_dim(beta_fast, r, base, L);
  double high = yarn_correction_dim(beta_slow, r, base, L);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  *lo = std::max(low, 0.0);
  *hi = std::min(high, static_cast<double>(r - 1));
  if (*lo == *hi) *hi += 0.001;
}
// ω_k = ω⁰_k/s·γ_k + ω⁰_k·(1 − γ_k), γ_k = clamp((k − lo)/(hi − lo), 0, 1): interpolated (÷s) above
// hi, extrapolated (unchanged) below lo, blended between.
template <class T>
T yarn_inv(double base, double s, double lo, double hi, std::int64_t k, std::int64_t r) {
  const T pos = base_pow<T>(base, k, r);
  const T extrapolation = T(1.0) / pos;
  const T interpolation = T(1.0) / (T(s) * pos);
  const T ramp = clamp01((T(static_cast<double>(k)) - T(lo)) / T(hi - lo));
  const T extrapolation_factor = T(1.0) - ramp;
  return interpolation * (T(1.0) - extrapolation_factor) + extrapolation * extrapolation_factor;
}
// m(s, μ) = 0.1·μ·ln s + 1 for s > 1, else 1 (eq. 22: √(1/t) = 0.1 ln s + 1).
inline double yarn_mscale(double s, double mu) { return s <= 1 ? 1.0 : 0.1 * mu * std::log(s) + 1.0; }
inline double yarn_attention_factor(double s, double mscale, double mscale_all_dim) {
  if (mscale != 0 && mscale_all_dim != 0) return yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim);
  return yarn_mscale(s, 1.0);
}

// ---- Llama 3.1 (Meta's apply_scaling; transformers' _compute_llama3_parameters) -----------------
// λ = 2π/ω⁰ (in T: the reciprocal times 2π, as Python's 2*math.pi / tensor); λ < L/high keeps ω⁰,
// λ > L/low takes ω⁰/s, between: (1 − g)·ω/s + g·ω with g = (L/λ − low)/(high − low).
template <class T>
T llama3_inv(double base, double s, double low, double high, double L, std::int64_t k, std::int64_t r) {
  const T inv = default_inv<T>(base, k, r);
  const T wavelen = (T(1.0) / inv) * T(2 * kPi);
  const double low_freq_wavelen = L / low, high_freq_wavelen = L / high;
  T out = wavelen > T(low_freq_wavelen) ? inv / T(s) : inv;
  const bool medium = !(wavelen < T(high_freq_wavelen)) && !(wavelen > T(low_freq_wavelen));
  if (medium) {
    const T g = ((T(1.0) / wavelen) * T(L) - T(low)) / T(high - low);
    out = (T(1.0) - g) * out / T(s) + g * out;
  }
  return out;
}

// ---- LongRoPE (Ding et al. 2024, arXiv 2402.13753; transformers' _compute_longrope_parameters) --
// ω_k = 1 / (f_k · base^(2k/r)); attention factor √(1 + ln s / ln L) for s > 1.
template <class T>
T longrope_inv(double base, double f, std::int64_t k, std::int64_t r) {
  return T(1.0) / (T(f) * base_pow<T>(base, k, r));
}
inline double longrope_attention_factor(double s, double L) {
  return s <= 1.0 ? 1.0 : std::sqrt(1 + std::log(s) / std::log(L));
}

}  // namespace posenc::rope
