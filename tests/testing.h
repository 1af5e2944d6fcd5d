// tests/testing.h — shared test helpers: random tensors, closeness with atol + rtol·|want|, and a
// central-difference gradient check on a random-projection loss (a plain sum would hide a
// permutation error in the gradient).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "posenc/view.h"

namespace posenc::testing {

inline std::vector<double> randn(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

inline std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// |got − want| ≤ atol + rtol·|want| for every element; reports the first few failures.
inline ::testing::AssertionResult AllClose(const std::vector<double>& got, const std::vector<double>& want,
                                           double atol, double rtol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  int bad = 0;
  std::string msg;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool both_inf = std::isinf(g) && std::isinf(w) && (g > 0) == (w > 0);
    if (both_inf) continue;
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      if (bad < 5)
      {
        char buf[96];
        std::snprintf(buf, sizeof buf, " [%zu] got %.6g want %.6g;", i, g, w);
        msg += buf;
      }
      ++bad;
    }
  }
  if (bad) return ::testing::AssertionFailure() << bad << " of " << got.size() << " differ:" << msg;
  return ::testing::AssertionSuccess();
}

// Checks `analytic` = ∂loss/∂x at x by central differences, loss(x) a scalar (typically
// Σ proj·f(x) with a random proj). Checks at most `max_checks` coordinates, spread over x.
inline ::testing::AssertionResult GradCheck(const std::function<double(const std::vector<double>&)>& loss,
                                            std::vector<double> x, const std::vector<double>& analytic,
                                            double eps = 1e-6, double atol = 1e-6, double rtol = 1e-5,
                                            std::size_t max_checks = 400) {
  if (analytic.size() != x.size())
    return ::testing::AssertionFailure() << "gradient size " << analytic.size() << " != " << x.size();
  const std::size_t step = x.size() > max_checks ? (x.size() + max_checks - 1) / max_checks : 1;
  int bad = 0;
  std::string msg;
  for (std::size_t i = 0; i < x.size(); i += step) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = loss(x);
    x[i] = x0 - eps;
    const double lm = loss(x);
    x[i] = x0;
    const double fd = (lp - lm) / (2 * eps);
    if (!(std::fabs(fd - analytic[i]) <= atol + rtol * std::fabs(fd))) {
      if (bad < 5)
        msg += " [" + std::to_string(i) + "] analytic " + std::to_string(analytic[i]) + " fd " +
               std::to_string(fd) + ";";
      ++bad;
    }
  }
  if (bad) return ::testing::AssertionFailure() << bad << " coordinates differ:" << msg;
  return ::testing::AssertionSuccess();
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// A float64 C-order view over a vector.
inline View V(std::vector<double>& v, std::initializer_list<std::int64_t> shape) {
  return View::contiguous(v.data(), DType::kF64, shape);
}
inline View V(std::vector<float>& v, std::initializer_list<std::int64_t> shape) {
  return View::contiguous(v.data(), DType::kF32, shape);
}

}  // namespace posenc::testing
