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

constexpr I kLow = MixedKeys::kLow;

// Rows of the table of axis a over w positions: x's in steps of kLow.
I rows(int a, I w) { return a == 0 ? (w + kLow - 1) / kLow : w; }

// Whether the tables over wx x and wy y positions take at most kMixedTableBytes.
bool within_budget(const attn::Dims& d, I wx, I wy) {
  return (kLow + rows(0, wx) + rows(1, wy)) * d.Hq * d.rot.r * static_cast<I>(sizeof(float)) <= kMixedTableBytes;
}

}  // namespace

bool mixed_fits(const attn::Dims& d) {
  I w[2];
  for (int a = 0; a < 2; ++a) {
    I lo = 0, hi = 0;
    key_range(d, a, &lo, &hi);
    if (hi - lo > kMixedTableBytes) return false;  // (and within_budget's product does not overflow)
    w[a] = hi - lo;
  }
  return within_budget(d, w[0], w[1]);
}

namespace {

// tab [Hq, n, r] and padding: row (h, p) at angle θ·(start + step·p), θ axis a's.
void fill_rows(const attn::Dims& d, int a, I start, I step, I n, int threads, std::vector<float>* tab) {
  const rotary::Plan& pl = d.rot;
  const I r = pl.r, half = pl.half, Hq = d.Hq;
  tab->resize(ix(Hq * n * r + kPad));
  const int th = Hq * n * half > 65536 ? threads : 1;
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
  for (I h = 0; h < Hq; ++h)
    for (I k = 0; k < half; ++k) {
      const double t = pl.mixed_freq(a, k, h), ts = t * static_cast<double>(step);
      const double sc = std::cos(ts), ss = std::sin(ts);
      double c = std::cos(t * static_cast<double>(start)), s = std::sin(t * static_cast<double>(start));
      for (I p = 0; p < n; ++p) {
        float* row = tab->data() + (h * n + p) * r;  // the pairs' cos, then their sin
        row[k] = static_cast<float>(c);
        row[half + k] = static_cast<float>(s);
        const double cn = c * sc - s * ss;  // e^{iθ(α + step)} = e^{iθα}·e^{iθ·step}
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
  const bool fits = within_budget(d, want[0][1] - want[0][0], want[1][1] - want[1][0]);
  for (int a = 0; a < 2; ++a) {
    md->lo[a] = fits ? want[a][0] : lo[a];
    md->w[a] = fits ? want[a][1] - want[a][0] : hi[a] - lo[a];
    fill_rows(d, a, md->lo[a], a == 0 ? kLow : 1, rows(a, md->w[a]), threads, &md->cs[a]);
  }
  if (same) md->low = kept->low;
  else fill_rows(d, 0, 0, 1, kLow, threads, &md->low);
  kept = md;
  return kept;
}

MixedKeys MixedData::row(const attn::Dims& d, I b) const {
  MixedKeys mk;
  mk.low = low.data();
  for (int a = 0; a < 2; ++a) {
    mk.c[a] = cs[a].data();
    mk.lo[a] = lo[a], mk.w[a] = rows(a, w[a]);
    mk.pos[a] = d.k_ids.data() + (b * 2 + a) * d.N;
  }
  mk.r = d.rot.r;
  mk.interleaved = d.rot.layout == RopeLayout::kInterleaved;
  return mk;
}

}  // namespace posenc::decode_impl
