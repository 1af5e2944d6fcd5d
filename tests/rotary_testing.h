// The rotary encodings' tests' own formulas (test_rope2d.cc, test_mrope.cc, test_xpos.cc): a pair
// rotated in the authors' complex form and in transformers' rotate_half form, and RoPE-ViT's axial
// angles.
#pragma once

#include <cmath>
#include <complex>
#include <cstdint>
#include <functional>
#include <vector>

#include "posenc/reference.h"
#include "posenc/rotary.h"
#include "testing.h"

namespace posenc::rotary_testing {

using testing::AllClose;
using testing::GradCheck;
using testing::V;
using testing::dot;
using testing::randn;
using I = std::int64_t;
using Vec = std::vector<double>;
using Sz = std::size_t;

inline Sz ix(I i) { return static_cast<Sz>(i); }

// ---- independent formulas ------------------------------------------------------------------------

// Rotates the interleaved pairs (x_{2j}, x_{2j+1}) of one head row by the complex factor
// scale_j·e^{iφ_j} (the authors' view_as_complex form).
inline void rotate_complex(double* row, const Vec& phi, const Vec& scale) {
  for (Sz j = 0; j < phi.size(); ++j) {
    const std::complex<double> z = std::complex<double>(row[2 * j], row[2 * j + 1]) * std::polar(scale[j], phi[j]);
    row[2 * j] = z.real();
    row[2 * j + 1] = z.imag();
  }
}

// The half layout as transformers writes it: y = x·cos + rotate_half(x)·sin over the first r dims,
// cos, sin [r] (each pair's value in both halves).
inline void rotate_half_form(double* row, const Vec& cosr, const Vec& sinr) {
  const Sz r = cosr.size(), h = r / 2;
  Vec rh(r), y(r);
  for (Sz i = 0; i < h; ++i) {
    rh[i] = -row[h + i];
    rh[h + i] = row[i];
  }
  for (Sz i = 0; i < r; ++i) y[i] = row[i] * cosr[i] + rh[i] * sinr[i];
  for (Sz i = 0; i < r; ++i) row[i] = y[i];
}

// RoPE-ViT axial (compute_axial_cis): freqs 1/theta^(arange(0, r, 4)/r), x rotations then y.
inline Vec axial_phi(double x, double y, I r, double theta) {
  Vec phi;
  for (I j = 0; j < r / 4; ++j) phi.push_back(x / std::pow(theta, static_cast<double>(4 * j) / r));
  for (I j = 0; j < r / 4; ++j) phi.push_back(y / std::pow(theta, static_cast<double>(4 * j) / r));
  return phi;
}

}  // namespace posenc::rotary_testing
