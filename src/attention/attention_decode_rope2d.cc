// rope2d mixed in the decode kernel (attention_decode_rope2d.h).
#include "attention/attention_decode_rope2d.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>

namespace posenc::decode_impl {
namespace {

std::size_t ix(I i) { return static_cast<std::size_t>(i); }

constexpr I kPad = 64;  // floats past a table's last row: a vector load there may read past it

// The smallest and one past the largest key position of axis a over every batch row.
void key_range(const attn::Dims& d, int a, I* lo, I* hi) {
  I l = INT64_MAX, h = INT64_MIN;
  for (I b = 0; b < d.B; ++b) {
    const I* p = d.k_ids.data() + (b * 2 + a) * d.N;
    for (I j = 0; j < d.N; ++j) l = std::min(l, p[j]), h = std::max(h, p[j]);
  }
  *lo = l, *hi = h + 1;
}

// Whether tables over `width` x and y values in all take at most kMixedTableBytes.
bool within_budget(const attn::Dims& d, I width) {
  return width * d.Hq * d.rot.r * static_cast<I>(sizeof(float)) <= kMixedTableBytes;
}

}  // namespace

bool mixed_fits(const attn::Dims& d) {
  I width = 0;
  for (int a = 0; a < 2; ++a) {
    I lo = 0, hi = 0;
    key_range(d, a, &lo, &hi);
    if (hi - lo > kMixedTableBytes) return false;  // (and within_budget's product does not overflow)
    width += hi - lo;
  }
  return within_budget(d, width);
}

namespace {

// Fills axis a of md over [lo, lo + w).
void fill_axis(const attn::Dims& d, int a, I lo, I w, int threads, MixedData* md) {
  const rotary::Plan& pl = d.rot;
  const I r = pl.r, half = pl.half, Hq = d.Hq;
  md->lo[a] = lo, md->w[a] = w;
  md->cs[a].resize(ix(Hq * w * r + kPad));
  const int th = Hq * w * half > 65536 ? threads : 1;
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
  for (I h = 0; h < Hq; ++h)
    for (I k = 0; k < half; ++k) {
      const double t = pl.mixed_freq(a, k, h), sc = std::cos(t), ss = std::sin(t);
      double c = std::cos(t * static_cast<double>(lo)), s = std::sin(t * static_cast<double>(lo));
      for (I p = 0; p < w; ++p) {
        float* row = md->cs[a].data() + (h * w + p) * r;  // the pairs' cos, then their sin
        row[k] = static_cast<float>(c);
        row[half + k] = static_cast<float>(s);
        const double cn = c * sc - s * ss;  // e^{iθ(p + 1)} = e^{iθp}·e^{iθ}
        s = s * sc + c * ss;
        c = cn;
      }
    }
}

}  // namespace

std::shared_ptr<const MixedData> mixed_tables(const attn::Dims& d, int threads) {
  static std::mutex mu;
  static std::shared_ptr<const MixedData> kept;
  const std::lock_guard<std::mutex> lock(mu);
  const rotary::Plan& pl = d.rot;
  const bool same = kept && kept->freqs == pl.mixed && kept->r == pl.r && kept->Hq == d.Hq;
  I lo[2], hi[2];
  bool covered = same;
  for (int a = 0; a < 2; ++a) {
    key_range(d, a, &lo[a], &hi[a]);
    covered = covered && lo[a] >= kept->lo[a] && hi[a] <= kept->lo[a] + kept->w[a];
  }
  if (covered) return kept;
  auto md = std::make_shared<MixedData>();
  md->freqs = pl.mixed, md->r = pl.r, md->Hq = d.Hq;
  I want[2][2];  // [axis][lo, hi): grown past the kept range by its width on the side that grew
  for (int a = 0; a < 2; ++a) {
    want[a][0] = lo[a], want[a][1] = hi[a];
    if (!same) continue;
    const I klo = kept->lo[a], khi = klo + kept->w[a], w = khi - klo;
    want[a][0] = lo[a] < klo ? std::min(lo[a], klo - w) : std::min(lo[a], klo);
    want[a][1] = hi[a] > khi ? std::max(hi[a], khi + w) : std::max(hi[a], khi);
  }
  const I width = want[0][1] - want[0][0] + want[1][1] - want[1][0];
  const bool fits = within_budget(d, width);
  for (int a = 0; a < 2; ++a)
    fill_axis(d, a, fits ? want[a][0] : lo[a], fits ? want[a][1] - want[a][0] : hi[a] - lo[a], threads, md.get());
  kept = md;
  return kept;
}

MixedKeys MixedData::row(const attn::Dims& d, I b) const {
  MixedKeys mk;
  for (int a = 0; a < 2; ++a) {
    mk.c[a] = cs[a].data();
    mk.lo[a] = lo[a], mk.w[a] = w[a];
    mk.pos[a] = d.k_ids.data() + (b * 2 + a) * d.N;
  }
  mk.r = d.rot.r;
  mk.interleaved = d.rot.layout == RopeLayout::kInterleaved;
  return mk;
}

}  // namespace posenc::decode_impl
