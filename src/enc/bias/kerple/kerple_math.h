// KERPLE's two kernels (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for
// Length Extrapolation", arXiv 2205.09921), as a bias of the distance d = |m − n| ≥ 0:
//   power        b = −r1·d^r2          r1 > 0, 0 < r2 ≤ 2  (−r1|m−n|^r2, the paper's power variant)
//   logarithmic  b = −r1·log(1 + r2·d)  r1, r2 > 0          (the paper's log variant, its best)
// and their derivatives by r1 and r2 (written here once; used by the bias reference and fast path,
// the reference attention and the fused kernel's tables):
//   power  ∂b/∂r1 = −d^r2,           ∂b/∂r2 = −r1·d^r2·log d     (both 0 at d = 0: 0^r2 = 0 for r2 > 0)
//   log    ∂b/∂r1 = −log(1 + r2·d),  ∂b/∂r2 = −r1·d/(1 + r2·d)
// log(1 + r2·d) is evaluated as log1p(r2·d) (the same function, accurate for small r2·d).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace posenc::kerple {

struct Term {
  double b = 0, d_r1 = 0, d_r2 = 0;  // the bias and its derivatives by r1, r2
};

inline double bias(bool power, double r1, double r2, double d) {
  if (power) return d == 0 ? 0.0 : -r1 * std::pow(d, r2);
  return -r1 * std::log1p(r2 * d);
}

inline Term term(bool power, double r1, double r2, double d) {
  Term t;
  if (power) {
    if (d == 0) return t;
    const double p = std::pow(d, r2);
    t.b = -r1 * p;
    t.d_r1 = -p;
    t.d_r2 = -r1 * p * std::log(d);
  } else {
    const double l = std::log1p(r2 * d);
    t.b = -r1 * l;
    t.d_r1 = -l;
    t.d_r2 = -r1 * d / (1 + r2 * d);
  }
  return t;
}

// Whether (r1, r2) lies in the kernel's domain; otherwise a description of what is wrong.
inline bool in_domain(bool power, double r1, double r2, std::string* why_r1, std::string* why_r2) {
  if (!std::isfinite(r1) || !(r1 > 0)) {
    *why_r1 = "expected a finite value > 0";
    return false;
  }
  if (!std::isfinite(r2) || !(r2 > 0) || (power && r2 > 2)) {
    *why_r2 = power ? "expected a value in (0, 2] for the power kernel" : "expected a finite value > 0";
    return false;
  }
  return true;
}

}  // namespace posenc::kerple
