#include "attention/attention_decode_xl.h"

#include <cmath>
#include <cstddef>

#include "enc/absolute/sinusoidal/sinusoidal_math.h"
#include "enc/bias/xl/xl_math.h"

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
  // y_s·sin(a + b) + y_c·cos(a + b) = −y_s·sin(−a − b) + y_c·cos(−a − b): xl's key-frame identity
  // with the query's angle −a (a = t0·ω_f, b = m·ω_f) and Y₀ = −y_s
  for (std::size_t f = 0; f < c_.size(); ++f) {
    const float* ys = yt + 2 * static_cast<std::int64_t>(f) * n;
    const float* yc = ys + n;
    float* os = out + 2 * static_cast<std::int64_t>(f) * n;
    float* oc = os + n;
    for (std::int64_t x = 0; x < n; ++x) {
      double t0, t1;
      xl::to_key_frame<double>(-static_cast<double>(ys[x]), yc[x], -s_[f], c_[f], &t0, &t1);
      os[x] = static_cast<float>(t0);
      oc[x] = static_cast<float>(t1);
    }
  }
}

}  // namespace posenc::decode_impl
