// The sinusoid of Vaswani et al. 2017 (§3.5), written once:
//   PE[p, 2i] = sin(p / base^(2i/D)),  PE[p, 2i+1] = cos(p / base^(2i/D)),  i = 0 .. D/2 − 1.
// The code of the article “位置编码” (docs/articles.md) divides by 10000^(j/D) for every dimension j
// (both members of a pair get different frequencies); the other articles use 2i/D as the paper
// does. posenc follows the paper.
#pragma once

#include <cmath>
#include <cstdint>

namespace posenc::sinusoid {

// 1 / base^(2i/D), in double.
inline double inv_freq(std::int64_t i, std::int64_t D, double base) {
  return std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
}

// PE[p, dim] for a (possibly negative or fractional) position p.
inline double value(double p, std::int64_t dim, std::int64_t D, double base) {
  const double a = p * inv_freq(dim / 2, D, base);
  return (dim % 2 == 0) ? std::sin(a) : std::cos(a);
}

}  // namespace posenc::sinusoid
