// AdamW with warm-up, cosine decay and global-norm clipping (posenc/model.h).
//
//   g ← g·min(1, clip/‖g‖);  m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²
//   w ← w − lr_t·( m/(1−β₁ᵗ) / (√(v/(1−β₂ᵗ)) + ε) + λ·w )      (λ only on the decayed matrices)
//   lr_t: linear from lr/warmup to lr over the warm-up, then lr·(r + (1−r)·½(1 + cos(π·progress))).
//   Bounded tensors (ParamInfo::lo, hi) are then clamped into their range.
// Precisions (model_kernels.h's adamw, which runs it): the moments in float, the update in double.
#include <algorithm>
#include <cmath>

#include "study/model_kernels.h"
#include "study/model.h"

namespace posenc {

AdamW::AdamW(const AdamWConfig& c, const std::vector<ParamInfo>& layout, std::size_t n)
    : c_(c), m_(n, 0.f), v_(n, 0.f) {
  std::vector<unsigned char> decay(n, 0);
  for (const ParamInfo& p : layout)
    if (p.decay)
      for (std::size_t i = 0; i < p.size && p.offset + i < n; ++i) decay[p.offset + i] = 1;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && decay[j] == decay[i]) ++j;
    runs_.push_back({i, j - i, decay[i] != 0});
    i = j;
  }
  for (const ParamInfo& p : layout)
    if (p.lo > -HUGE_VAL || p.hi < HUGE_VAL) bounds_.push_back({p.offset, p.size, p.lo, p.hi});
}

double AdamW::lr_at(std::int64_t step) const {
  if (c_.warmup > 0 && step < c_.warmup) return c_.lr * double(step + 1) / double(c_.warmup);
  const std::int64_t span = std::max<std::int64_t>(1, c_.total - c_.warmup);
  const double progress = std::min(1.0, double(step - c_.warmup) / double(span));
  const double r = c_.min_lr_ratio;
  return c_.lr * (r + (1 - r) * 0.5 * (1 + std::cos(M_PI * progress)));
}

double AdamW::step(std::vector<float>& w, const std::vector<float>& g) {
  const model_fast::Kernels k = model_fast::kernels();
  const double norm = std::sqrt(k.sum_squares(g.data(), std::int64_t(g.size())));
  const double clip = c_.clip > 0 && norm > c_.clip ? c_.clip / norm : 1.0;
  const double lr = lr_at(t_);
  ++t_;
  const double bc1 = 1 - std::pow(c_.beta1, double(t_)), bc2 = 1 - std::pow(c_.beta2, double(t_));
  for (const Run& r : runs_)
    k.adamw(w.data() + r.offset, g.data() + r.offset, m_.data() + r.offset, v_.data() + r.offset,
            std::int64_t(r.size), clip, float(c_.beta1), float(c_.beta2), bc1, bc2, c_.eps, lr,
            r.decay ? c_.weight_decay : 0.0);
  for (const Bounds& b : bounds_)  // projected back into their range (ParamInfo::lo, hi)
    for (std::size_t i = b.offset; i < b.offset + b.size && i < w.size(); ++i)
      w[i] = float(std::min(b.hi, std::max(b.lo, double(w[i]))));
  return norm;
}

}  // namespace posenc
