#include "attention/attention_decode_xl.h"

#include <cmath>
#include <cstddef>

#include "enc/absolute/sinusoidal/sinusoidal_math.h"

namespace posenc::decode_impl {

XlWindows::XlWindows(std::int64_t X, std::int64_t nt, std::int64_t j0, double base) {
  const auto half = static_cast<std::size_t>(X / 2);
  cn_.resize(half), sn_.resize(half), c_.resize(half), s_.resize(half);
  for (std::size_t f = 0; f < half; ++f) {
    const double w = sinusoid::inv_freq(static_cast<std::int64_t>(f), X, base);
    cn_[f] = std::cos(static_cast<double>(nt) * w), sn_[f] = std::sin(static_cast<double>(nt) * w);
    c_[f] = std::cos(static_cast<double>(j0) * w), s_[f] = std::sin(static_cast<double>(j0) * w);
  }
}

void XlWindows::seek(std::int64_t k) {
  for (; k_ < k; ++k_)
    for (std::size_t f = 0; f < c_.size(); ++f) {
      const double c = c_[f], s = s_[f];
      c_[f] = c * cn_[f] - s * sn_[f];
      s_[f] = s * cn_[f] + c * sn_[f];
    }
}

void XlWindows::turn(const float* yt, std::int64_t n, float* out) const {
  // y_s·sin(a + b) + y_c·cos(a + b) = (y_s·cos a − y_c·sin a)·sin b + (y_s·sin a + y_c·cos a)·cos b
  for (std::size_t f = 0; f < c_.size(); ++f) {
    const float* ys = yt + 2 * static_cast<std::int64_t>(f) * n;
    const float* yc = ys + n;
    float* os = out + 2 * static_cast<std::int64_t>(f) * n;
    float* oc = os + n;
    for (std::int64_t x = 0; x < n; ++x) {
      const double a = ys[x], b = yc[x];
      os[x] = static_cast<float>(a * c_[f] - b * s_[f]);
      oc[x] = static_cast<float>(a * s_[f] + b * c_[f]);
    }
  }
}

}  // namespace posenc::decode_impl
