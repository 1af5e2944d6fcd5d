// AdamW with warm-up, cosine decay and global-norm clipping (posenc/model.h).
//
//   g ← g·min(1, clip/‖g‖);  m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²
//   w ← w − lr_t·( m/(1−β₁ᵗ) / (√(v/(1−β₂ᵗ)) + ε) + λ·w )      (λ only on the decayed matrices)
//   lr_t: linear from lr/warmup to lr over the warm-up, then lr·(r + (1−r)·½(1 + cos(π·progress))).
#include <cmath>

#include "posenc/model.h"

namespace posenc {

AdamW::AdamW(const AdamWConfig& c, const std::vector<ParamInfo>& layout, std::size_t n)
    : c_(c), decay_(n, 0), m_(n, 0.f), v_(n, 0.f) {
  for (const ParamInfo& p : layout)
    if (p.decay)
      for (std::size_t i = 0; i < p.size; ++i) decay_[p.offset + i] = 1;
}

double AdamW::lr_at(std::int64_t step) const {
  if (c_.warmup > 0 && step < c_.warmup) return c_.lr * double(step + 1) / double(c_.warmup);
  const std::int64_t span = std::max<std::int64_t>(1, c_.total - c_.warmup);
  const double progress = std::min(1.0, double(step - c_.warmup) / double(span));
  const double r = c_.min_lr_ratio;
  return c_.lr * (r + (1 - r) * 0.5 * (1 + std::cos(M_PI * progress)));
}

double AdamW::step(std::vector<float>& w, const std::vector<float>& g) {
  double sq = 0;
  for (float x : g) sq += double(x) * double(x);
  const double norm = std::sqrt(sq);
  const double clip = c_.clip > 0 && norm > c_.clip ? c_.clip / norm : 1.0;
  const double lr = lr_at(t_);
  ++t_;
  const double bc1 = 1 - std::pow(c_.beta1, double(t_)), bc2 = 1 - std::pow(c_.beta2, double(t_));
  const float b1 = float(c_.beta1), b2 = float(c_.beta2);
  for (std::size_t i = 0; i < w.size(); ++i) {
    const float gi = float(double(g[i]) * clip);
    m_[i] = b1 * m_[i] + (1 - b1) * gi;
    v_[i] = b2 * v_[i] + (1 - b2) * gi * gi;
    const double upd = (double(m_[i]) / bc1) / (std::sqrt(double(v_[i]) / bc2) + c_.eps);
    const double wd = decay_[i] ? c_.weight_decay * double(w[i]) : 0.0;
    w[i] = float(double(w[i]) - lr * (upd + wd));
  }
  return norm;
}

}  // namespace posenc
