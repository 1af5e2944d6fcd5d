// The fused tile kernel's SIMD row helpers (attention_tiles.h's Simd and attention_fused_simd.h's
// Extra), per Highway target: foreach_target.h compiles this file for every target.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/attention_fused_simd.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/attention_fused_simd.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using attn_fast::Extra;
using attn_fast::I;
using attn_fast::ix;

HWY_INLINE float RowMax(const float* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  auto m = hn::Set(d, -HUGE_VALF);
  auto nan = hn::IsNaN(m);  // Max's NaN rule differs between targets (EMU128 drops NaN): tracked apart
  std::size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto v = hn::LoadU(d, x + i);
    m = hn::Max(m, v);
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  float r = hn::GetLane(hn::MaxOfLanes(d, m));
  for (; i < n; ++i) r = (x[i] > r || std::isnan(x[i])) ? x[i] : r;
  return hn::AllFalse(d, nan) ? r : std::numeric_limits<float>::quiet_NaN();
}

// x = e^(x − mx) (ExpSoftmax, core/simd-inl.h); with kSum, returns Σ x (else 0).
template <bool kSum>
HWY_INLINE float ExpSub(float* HWY_RESTRICT x, std::size_t n, float mx) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  const auto vm = hn::Set(d, mx);
  auto s = hn::Zero(d), s1 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {  // four vectors at a time: their long chains interleaved
    const auto e0 = ExpSoftmax(d, hn::Sub(hn::LoadU(d, x + i), vm));
    const auto e1 = ExpSoftmax(d, hn::Sub(hn::LoadU(d, x + i + L), vm));
    const auto e2 = ExpSoftmax(d, hn::Sub(hn::LoadU(d, x + i + 2 * L), vm));
    const auto e3 = ExpSoftmax(d, hn::Sub(hn::LoadU(d, x + i + 3 * L), vm));
    hn::StoreU(e0, d, x + i);
    hn::StoreU(e1, d, x + i + L);
    hn::StoreU(e2, d, x + i + 2 * L);
    hn::StoreU(e3, d, x + i + 3 * L);
    if (kSum) {
      s = hn::Add(s, hn::Add(e0, e1));
      s1 = hn::Add(s1, hn::Add(e2, e3));
    }
  }
  if (kSum) s = hn::Add(s, s1);
  for (; i + L <= n; i += L) {
    const auto e = ExpSoftmax(d, hn::Sub(hn::LoadU(d, x + i), vm));
    hn::StoreU(e, d, x + i);
    if (kSum) s = hn::Add(s, e);
  }
  if (i < n) {  // tail through a padded buffer (−inf pads give 0)
    HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)];
    for (std::size_t t = 0; t < L; ++t) buf[t] = i + t < n ? x[i + t] : -HUGE_VALF;
    const auto e = ExpSoftmax(d, hn::Sub(hn::Load(d, buf), vm));
    hn::Store(e, d, buf);
    if (kSum) s = hn::Add(s, e);
    for (std::size_t t = 0; i + t < n; ++t) x[i + t] = buf[t];
  }
  return kSum ? hn::GetLane(hn::SumOfLanes(d, s)) : 0.f;
}

HWY_INLINE void ZeroRow(float* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Zero(d), d, x + i);
  for (; i < n; ++i) x[i] = 0.f;
}

// P = exp(S − lse) over rows (0 for a row whose lse is −inf; attn_fast::nan_row for a NaN row, lse
// NaN), row stride ld.
void ExpRows(float* HWY_RESTRICT S, I nq, I nk, I ld, const float* HWY_RESTRICT lse, I band) {
  for (I i = 0; i < nq; ++i) {
    float* Si = S + i * ld;
    const I n = attn_fast::band_reach(i, band, nk);
    if (lse[i] == -HUGE_VALF) ZeroRow(Si, ix(n));
    else if (std::isnan(lse[i])) attn_fast::nan_row(Si, n);
    else ExpSub<false>(Si, ix(n), lse[i]);
  }
}

void ScaleRow(float* HWY_RESTRICT x, std::size_t n, float c) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  const auto vc = hn::Set(d, c);
  std::size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vc), d, x + i);
  for (; i < n; ++i) x[i] *= c;
}

void AddTo(float* HWY_RESTRICT y, const float* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Add(hn::LoadU(d, y + i), hn::LoadU(d, x + i)), d, y + i);
  for (; i < n; ++i) y[i] += x[i];
}

void MulAddTo(float* HWY_RESTRICT y, const float* HWY_RESTRICT a, const float* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  for (; i < n; ++i) y[i] += a[i] * x[i];
}

void DsRow(float* HWY_RESTRICT p, const float* HWY_RESTRICT dp, std::size_t n, float di) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  const auto vd = hn::Set(d, di);
  std::size_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::Mul(hn::LoadU(d, p + i), hn::Sub(hn::LoadU(d, dp + i), vd)), d, p + i);
  for (; i < n; ++i) p[i] *= dp[i] - di;
}

float Dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  auto s = hn::Zero(d);
  std::size_t i = 0;
  for (; i + L <= n; i += L) s = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s);
  float r = hn::GetLane(hn::SumOfLanes(d, s));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

// Whether every x[0, n) is < +inf: no NaN, no +inf (−inf passes).
bool BelowInf(const float* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  const auto inf = hn::Set(d, HUGE_VALF);
  auto ok = hn::Lt(hn::Zero(d), inf);  // all true
  std::size_t i = 0;
  for (; i + L <= n; i += L) ok = hn::And(ok, hn::Lt(hn::LoadU(d, x + i), inf));
  bool r = hn::AllTrue(d, ok);
  for (; i < n; ++i) r = r && x[i] < HUGE_VALF;
  return r;
}

// attn_fast::online_softmax_step (attention_tiles.h) over every row of the tile, in one call: per row
// the same steps as there, the row's o kept as it is (zeros) while its running max is still −∞. A NaN
// row (m NaN, or a row max of NaN or +inf: exp would make 0s of those, or a NaN behind a row max of
// −inf) gets m = l = NaN and S = 0; per row tests only, nothing added to the loops over the row (the
// last one reads the row again, where it would be taken for wholly masked).
void SoftmaxStep(float* HWY_RESTRICT S, I nq, I nk, float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                 float* HWY_RESTRICT o, I D, I band) {
  // The row maxima of a chunk of rows first, then their exponentials: a row's exp pass waits on its
  // max's reduction, and with the passes apart the rows' reductions overlap one another.
  constexpr I kChunk = 32;
  float rms[kChunk];
  for (I c0 = 0; c0 < nq; c0 += kChunk) {
    const I nc = std::min(kChunk, nq - c0);
    for (I t = 0; t < nc; ++t)
      rms[t] = RowMax(S + (c0 + t) * attn_fast::kBk, ix(attn_fast::band_reach(c0 + t, band, nk)));
    for (I i = c0; i < c0 + nc; ++i) {
      float* Si = S + i * attn_fast::kBk;
      const std::size_t n = ix(attn_fast::band_reach(i, band, nk));
      const float rm = rms[i - c0];
      if (std::isnan(m[i]) || std::isnan(rm) || rm == HUGE_VALF) {
        m[i] = l[i] = std::numeric_limits<float>::quiet_NaN();
        ZeroRow(Si, n);
        continue;
      }
      const float mn = std::max(m[i], rm);
      if (mn == -HUGE_VALF) {  // no key yet, unless the −inf row max dropped a NaN
        if (!BelowInf(Si, n)) m[i] = l[i] = std::numeric_limits<float>::quiet_NaN();
        ZeroRow(Si, n);
        continue;
      }
      const float sum = ExpSub<true>(Si, n, mn);
      if (m[i] == -HUGE_VALF) {  // the row's first keys: o is still 0, l = 0
        l[i] = sum;
      } else if (mn == m[i]) {  // the max held: the correction e⁰ = 1
        l[i] += sum;
      } else {
        const float corr = std::exp(m[i] - mn);
        if (corr != 1.f) ScaleRow(o + i * D, ix(D), corr);
        l[i] = l[i] * corr + sum;
      }
      m[i] = mn;
    }
  }
}

// Whether no x[0, n) has every bit of em set (16-bit floats, em their exponent field: ±inf, NaN).
bool Finite16(const std::uint16_t* HWY_RESTRICT x, std::size_t n, std::uint16_t em) {
  const hn::ScalableTag<std::uint16_t> d;
  const std::size_t L = hn::Lanes(d);
  const auto vem = hn::Set(d, em);
  auto bad = hn::Zero(d);  // lanes where some x had every bit of em
  std::size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto v = hn::LoadU(d, x + i);
    bad = hn::Or(bad, hn::VecFromMask(d, hn::Eq(hn::And(v, vem), vem)));
  }
  bool ok = hn::AllTrue(d, hn::Eq(bad, hn::Zero(d)));
  for (; i < n; ++i) ok = ok && (x[i] & em) != em;
  return ok;
}

// Whether `rows` runs of n floats, run r at x + r·stride, hold no NaN or ±inf: the largest |x| as
// bits below those of +inf, one reduction for all of them.
bool AllFiniteRows(const float* HWY_RESTRICT x, std::size_t n, std::size_t rows, std::size_t stride) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const std::size_t L = hn::Lanes(d);
  const auto abs_bits = hn::Set(du, 0x7fffffffu);
  auto mx = hn::Zero(du);
  bool ok = true;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* y = x + r * stride;
    std::size_t i = 0;
    for (; i + L <= n; i += L) mx = hn::Max(mx, hn::And(hn::BitCast(du, hn::LoadU(d, y + i)), abs_bits));
    for (; i < n; ++i) ok = ok && std::isfinite(y[i]);
  }
  return ok && hn::GetLane(hn::MaxOfLanes(du, mx)) < 0x7f800000u;
}

bool AllFinite(const float* HWY_RESTRICT x, std::size_t n) { return AllFiniteRows(x, n, 1, n); }

attn_fast::Simd GetSimd() {
  return attn_fast::Simd{&ExpRows,   &ScaleRow,      &AddTo,    &MulAddTo, &DsRow,   &Dot,
                         &SoftmaxStep, &AllFinite, &AllFiniteRows, &BelowInf, &Finite16};
}

// c, s [n, half] = sc·cos, sc·sin of the angles ang [n, half] (formed in double by the caller from
// the call's rotary plan), by the exact-angle sincos of core/simd-inl.h (reduced in double; bound
// stated there); sc [n, half] the per-pair a·ρ in double, rounded once to float, or null for 1.
void TrigRows(const double* HWY_RESTRICT ang, const double* HWY_RESTRICT sc, I n, I half, float* HWY_RESTRICT c,
              float* HWY_RESTRICT s) {
  std::vector<float> red(ix(2 * half));
  for (I t = 0; t < n; ++t) {
    float* ct = c + t * half;
    float* st = s + t * half;
    SinCosRow(1.0, ang + t * half, ix(half), red.data(), red.data() + half, st, ct);
    if (sc)
      for (I k = 0; k < half; ++k) {
        const float f = static_cast<float>(sc[t * half + k]);
        ct[k] *= f;
        st[k] *= f;
      }
  }
}

// Rotates rows x + r·xld (r < n; the first 2·half entries of each) by R(±pos) into rows y + r·ld, with
// table rows c, s + r·half (consecutive rows at consecutive positions); inverse: R(−pos), the
// gradient's. y may be x (in place: each vector is loaded before its place is stored); entries past
// 2·half are not touched.
//   interleaved: y = x·C + swap_pairs(x)·S, C = (c0 c0 c1 c1 …), S = ∓(s0, −s0, …) per vector;
//   half:        y_a = x_a·c ∓ x_b·s, y_b = x_b·c ± x_a·s over the two contiguous halves.
void RotRows(const float* x, I xld, float* y, I n, I ld, const float* HWY_RESTRICT c,
             const float* HWY_RESTRICT s, I half, bool interleaved, bool inverse) {
  const hn::ScalableTag<float> df;
  const I N = static_cast<I>(hn::Lanes(df));
  const float sg = inverse ? -1.f : 1.f;
  for (I r = 0; r < n; ++r, x += xld, y += ld, c += half, s += half) {
    I k = 0;
    if (interleaved) {
#if HWY_TARGET != HWY_SCALAR
      // Each pair's cos/sin duplicated into two lanes through a 64-bit widening; the sign of the
      // sin lanes flipped by xor (lane 2k gets −s for the forward rotation, lane 2k + 1 for the
      // inverse).
      const hn::Repartition<std::uint64_t, decltype(df)> d64;
      const hn::Rebind<std::uint32_t, decltype(d64)> d32;
      const auto flip =
          hn::BitCast(df, hn::Set(d64, inverse ? 0x8000000000000000ull : 0x80000000ull));
      for (; 2 * k + N <= 2 * half; k += N / 2) {
        const auto cw =
            hn::PromoteTo(d64, hn::LoadU(d32, reinterpret_cast<const std::uint32_t*>(c + k)));
        const auto sw =
            hn::PromoteTo(d64, hn::LoadU(d32, reinterpret_cast<const std::uint32_t*>(s + k)));
        const auto C = hn::BitCast(df, hn::Or(cw, hn::ShiftLeft<32>(cw)));
        const auto S = hn::Xor(hn::BitCast(df, hn::Or(sw, hn::ShiftLeft<32>(sw))), flip);
        const auto v = hn::LoadU(df, x + 2 * k);
        hn::StoreU(hn::MulAdd(hn::Shuffle2301(v), S, hn::Mul(v, C)), df, y + 2 * k);
      }
#endif
      for (; k < half; ++k) {
        const float xa = x[2 * k], xb = x[2 * k + 1], sn = sg * s[k];
        y[2 * k] = xa * c[k] - xb * sn;
        y[2 * k + 1] = xa * sn + xb * c[k];
      }
    } else {
      const auto vs = hn::Set(df, sg);
      for (; k + N <= half; k += N) {
        const auto xa = hn::LoadU(df, x + k), xb = hn::LoadU(df, x + half + k);
        const auto cv = hn::LoadU(df, c + k), sv = hn::Mul(vs, hn::LoadU(df, s + k));
        hn::StoreU(hn::NegMulAdd(xb, sv, hn::Mul(xa, cv)), df, y + k);
        hn::StoreU(hn::MulAdd(xa, sv, hn::Mul(xb, cv)), df, y + half + k);
      }
      for (; k < half; ++k) {
        const float xa = x[k], xb = x[half + k], sn = sg * s[k];
        y[k] = xa * c[k] - xb * sn;
        y[half + k] = xa * sn + xb * c[k];
      }
    }
  }
}

// Adds bias rows: S[i, 0 .. nk) += diag[nq − 1 − i ..] for i < nq (S's row stride ld).
void AddDiag(float* HWY_RESTRICT S, I nq, I nk, I ld, const float* HWY_RESTRICT diag) {
  for (I i = 0; i < nq; ++i) AddTo(S + i * ld, diag + (nq - 1 - i), ix(nk));
}

// Diagonal sums: diag[nq − 1 − i + j] += dS[i, j] (diag zeroed first, nq + nk − 1 entries).
void SumDiag(const float* HWY_RESTRICT dS, I nq, I nk, I ld, float* HWY_RESTRICT diag) {
  std::fill(diag, diag + nq + nk - 1, 0.f);
  for (I i = 0; i < nq; ++i) AddTo(diag + (nq - 1 - i), dS + i * ld, ix(nk));
}

// y[j] += a + g·x[j] (a FIRE run: one linear piece of the MLP over a slice of the ψ table).
HWY_INLINE void AffineAddRun(float* HWY_RESTRICT y, const float* HWY_RESTRICT x, I n, float a, float g) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  const auto va = hn::Set(d, a), vg = hn::Set(d, g);
  I j = 0;
  for (; j + L <= n; j += L) hn::StoreU(hn::Add(hn::LoadU(d, y + j), hn::MulAdd(vg, hn::LoadU(d, x + j), va)), d, y + j);
  for (; j < n; ++j) y[j] += a + g * x[j];
}

void AffineAdd(float* HWY_RESTRICT y, const float* HWY_RESTRICT x, I n, float a, float g) {
  AffineAddRun(y, x, n, a, g);
}

// A FIRE tile wholly before its queries (before) or wholly after them, whose segments all lie in
// [lo, hi]: row i (key 0 at kp − qp = base − i, ψ from ps0 − i, thresholds th0[i·nb ..]) is the runs
// of segments hi, hi − 1, …, lo (before: the distance falls along the row) or lo, …, hi (after),
// each cut at the row's threshold between it and the next; a segment the row does not reach is an
// empty run. S[i, run] += α[s] + (float)(β[s]·inv[i])·ψ: the runs of the general walk, no search.
void FireSpan(float* HWY_RESTRICT S, I nq, I nk, I ld, const float* ps0, I base, bool before, const I* th0,
              I nb, I lo, I hi, const float* alpha, const double* beta, const double* inv) {
  for (I i = 0; i < nq; ++i) {
    float* Si = S + i * ld;
    const float* ps = ps0 - i;
    const I r0 = base - i;
    const I* th = th0 + i * nb;
    I j = 0;
    for (I k = 0; k <= hi - lo; ++k) {
      const I sg = before ? hi - k : lo + k;
      const I e = attn_fast::fire_span_end(before, r0, th, sg, k, lo, hi, j, nk);
      AffineAddRun(Si + j, ps + j, e - j, alpha[sg], static_cast<float>(beta[sg] * inv[i]));
      j = e;
    }
  }
}

// out3 = (Σ w, Σ w·x, Σ w·z) over n entries (a FIRE run's moments of dS).
void Moments(const float* HWY_RESTRICT w, const float* HWY_RESTRICT x, const float* HWY_RESTRICT z, I n,
             float* HWY_RESTRICT out3) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d);
  I j = 0;
  for (; j + L <= n; j += L) {
    const auto vw = hn::LoadU(d, w + j);
    s0 = hn::Add(s0, vw);
    s1 = hn::MulAdd(vw, hn::LoadU(d, x + j), s1);
    s2 = hn::MulAdd(vw, hn::LoadU(d, z + j), s2);
  }
  float a0 = hn::GetLane(hn::SumOfLanes(d, s0)), a1 = hn::GetLane(hn::SumOfLanes(d, s1)),
        a2 = hn::GetLane(hn::SumOfLanes(d, s2));
  for (; j < n; ++j) a0 += w[j], a1 += w[j] * x[j], a2 += w[j] * z[j];
  out3[0] = a0;
  out3[1] = a1;
  out3[2] = a2;
}

Extra GetExtra() {
  return Extra{&TrigRows, &RotRows, &AddDiag, &SumDiag, &AffineAdd, &FireSpan, &Moments};
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posenc {
HWY_EXPORT(GetSimd);
HWY_EXPORT(GetExtra);

// Not cached: the tests switch targets (hwy::SetSupportedTargetsForTest) between calls.
attn_fast::Simd attn_fast::simd() { return HWY_DYNAMIC_DISPATCH(GetSimd)(); }
attn_fast::Extra attn_fast::extra() { return HWY_DYNAMIC_DISPATCH(GetExtra)(); }
}  // namespace posenc
#endif  // HWY_ONCE
