// The decode task's per-row steps on a block's logits, per Highway target (re-included through
// foreach_target.h by attention_decode_task.cc): the biases (ALiBi, T5, KERPLE, Sandwich, FIRE), CoPE's
// positions, a row's max and its softmax sum, and the row adds and scales of the online softmax.
#if defined(POSENC_ATTENTION_DECODE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSENC_ATTENTION_DECODE_ROWS_INL_H_
#undef POSENC_ATTENTION_DECODE_ROWS_INL_H_
#else
#define POSENC_ATTENTION_DECODE_ROWS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "attention/attention_decode_task.h"
#include "core/simd-inl.h"
#include "enc/contextual/cope/cope_simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace decode_rows {
namespace hn = hwy::HWY_NAMESPACE;
using decode_impl::BiasKind;
using decode_impl::I;

// S[j] += c·tab[|d0 + j|] for j < n: loads when the run keeps one sign (reversed before the query).
HWY_INLINE void AddTableRun(const float* HWY_RESTRICT tab, I d0, float c, float* HWY_RESTRICT S, I n) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  const auto vc = hn::Set(d, c);
  I j = 0;
  // the next blocks' entries (a table per head: more streams than the prefetchers follow)
  const I ahead = d0 + n - 1 <= 0 ? -d0 - n - 64 : d0 + n;
  for (I k = 0; k < 64; k += 16)
    if (ahead + k >= 0) hwy::Prefetch(tab + ahead + k);
  if (d0 + n - 1 <= 0) {  // |Δ| = −d0 − j falls
    for (; j + L <= n; j += L)
      hn::StoreU(hn::MulAdd(vc, hn::Reverse(d, hn::LoadU(d, tab + (-d0 - j - L + 1))), hn::LoadU(d, S + j)), d, S + j);
  } else if (d0 >= 0) {
    for (; j + L <= n; j += L) hn::StoreU(hn::MulAdd(vc, hn::LoadU(d, tab + d0 + j), hn::LoadU(d, S + j)), d, S + j);
  }
  for (; j < n; ++j) {
    const I a = d0 + j;
    S[j] += c * tab[a < 0 ? -a : a];
  }
}

// S[j] += c for j < n.
HWY_INLINE void AddConst(float c, float* HWY_RESTRICT S, I n) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  const auto vc = hn::Set(d, c);
  I j = 0;
  for (; j + L <= n; j += L) hn::StoreU(hn::Add(hn::LoadU(d, S + j), vc), d, S + j);
  for (; j < n; ++j) S[j] += c;
}

// FIRE for the G heads h0 … h0 + G − 1 of query i at once (their rows S + g·ld): x and the hidden
// units shared, four heads' outputs per pass.
void AddFireGroup(const decode_impl::Bias& bs, I h0, I G, I i, I qp, I kp0, float* HWY_RESTRICT S, I ld, I n) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  const float base = static_cast<float>(kp0 - qp);
  const auto iota = hn::Iota(d, 0.f), c = hn::Set(d, bs.c), inv = hn::Set(d, bs.inv[i]);
  HWY_ALIGN float buf[4][HWY_MAX_BYTES / sizeof(float)];
  for (I j = 0; j < n; j += L) {
    const auto dist = hn::Abs(hn::Add(hn::Set(d, base + static_cast<float>(j)), iota));
    const auto x = hn::Mul(hn::Log1p(d, hn::Mul(c, dist)), inv);
    for (I g0 = 0; g0 < G; g0 += 4) {
      const I ng = std::min<I>(4, G - g0);
      const float* w2 = bs.w2 + (h0 + g0) * bs.W;
      auto f0 = hn::Set(d, bs.b2[h0 + g0]);
      auto f1 = hn::Set(d, ng > 1 ? bs.b2[h0 + g0 + 1] : 0.f);
      auto f2 = hn::Set(d, ng > 2 ? bs.b2[h0 + g0 + 2] : 0.f);
      auto f3 = hn::Set(d, ng > 3 ? bs.b2[h0 + g0 + 3] : 0.f);
      for (I u = 0; u < bs.W; ++u) {
        const auto a = hn::Max(hn::MulAdd(hn::Set(d, bs.w1[u]), x, hn::Set(d, bs.b1[u])), hn::Zero(d));
        f0 = hn::MulAdd(hn::Set(d, w2[u]), a, f0);
        if (ng > 1) f1 = hn::MulAdd(hn::Set(d, w2[bs.W + u]), a, f1);
        if (ng > 2) f2 = hn::MulAdd(hn::Set(d, w2[2 * bs.W + u]), a, f2);
        if (ng > 3) f3 = hn::MulAdd(hn::Set(d, w2[3 * bs.W + u]), a, f3);
      }
      hn::Store(f0, d, buf[0]);
      hn::Store(f1, d, buf[1]);
      hn::Store(f2, d, buf[2]);
      hn::Store(f3, d, buf[3]);
      for (I g = 0; g < ng; ++g) {
        float* Sg = S + (g0 + g) * ld + j;
        if (j + L <= n) hn::StoreU(hn::Add(hn::LoadU(d, Sg), hn::Load(d, buf[g])), d, Sg);
        else for (I e = 0; j + e < n; ++e) Sg[e] += buf[g][e];
      }
    }
  }
}

// S[0, n) += the bias of head h, query i (position qp) at keys kp0, kp0 + 1, … (FIRE: AddFireGroup)
void AddBias(const decode_impl::Bias& bs, I h, I i, I qp, I kp0, float* HWY_RESTRICT S, I n) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  const float base = static_cast<float>(kp0 - qp);  // Δ of key 0; |Δ| < 2^24 (covers())
  const auto iota = hn::Iota(d, 0.f);
  auto delta = [&](I j) { return hn::Add(hn::Set(d, base + static_cast<float>(j)), iota); };
  I j = 0;
  switch (bs.kind) {
    case BiasKind::kSlopes: {
      const auto m = hn::Set(d, static_cast<float>(-bs.slopes[h]));
      for (; j + L <= n; j += L) hn::StoreU(hn::MulAdd(m, hn::Abs(delta(j)), hn::LoadU(d, S + j)), d, S + j);
      for (; j < n; ++j) S[j] += static_cast<float>(-bs.slopes[h]) * std::fabs(base + static_cast<float>(j));
      break;
    }
    case BiasKind::kLearned: {
      const float past = static_cast<float>(bs.sig[h]), fut = static_cast<float>(-bs.sig[bs.Hq + h]);
      const auto vp = hn::Set(d, past), vf = hn::Set(d, fut);
      for (; j + L <= n; j += L) {
        const auto dl = delta(j);
        const auto f = hn::IfThenElse(hn::Lt(dl, hn::Zero(d)), vp, vf);
        hn::StoreU(hn::MulAdd(f, dl, hn::LoadU(d, S + j)), d, S + j);
      }
      for (; j < n; ++j) {
        const float dl = base + static_cast<float>(j);
        S[j] += (dl < 0 ? past : fut) * dl;
      }
      break;
    }
    case BiasKind::kT5: {  // Δ ≤ −half: tab[0]; Δ ≥ half: tab[2·half]; between, tab[Δ + half]
      const I half = bs.t5_half, d0 = kp0 - qp;
      const float* tab = bs.t5 + h * (2 * half + 1);
      const I a = std::clamp<I>(1 - half - d0, 0, n), b = std::clamp<I>(half - d0, a, n);
      AddConst(tab[0], S, a);
      if (b > a) AddTableRun(tab, d0 + a + half, 1.f, S + a, b - a);  // indices d0 + j + half ≥ 1
      AddConst(tab[2 * half], S + b, n - b);
      break;
    }
    case BiasKind::kKerpleLog:
    case BiasKind::kKerplePower:
      AddTableRun(bs.kt + h * bs.kt_w, kp0 - qp, 1.f, S, n);
      break;
    case BiasKind::kSandwich:
      AddTableRun(bs.sw, kp0 - qp, bs.hs[h], S, n);
      break;
    default: break;
  }
}

// Whether every x[0, n) is < +inf (no NaN, no +inf); and its max.
HWY_INLINE bool RowMaxBelowInf(const float* HWY_RESTRICT x, I n, float* mx) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  const auto inf = hn::Set(d, HUGE_VALF);
  auto m = hn::Set(d, -HUGE_VALF);
  auto ok = hn::Lt(m, inf);
  I j = 0;
  for (; j + L <= n; j += L) {
    const auto v = hn::LoadU(d, x + j);
    ok = hn::And(ok, hn::Lt(v, inf));
    m = hn::Max(m, v);
  }
  float r = hn::GetLane(hn::MaxOfLanes(d, m));
  bool good = hn::AllTrue(d, ok);
  for (; j < n; ++j) {
    good = good && x[j] < HUGE_VALF;
    r = x[j] > r ? x[j] : r;
  }
  *mx = r;
  return good;
}

// x = e^(x − mx) over [0, n); returns Σ.
HWY_INLINE float ExpSubSum(float* HWY_RESTRICT x, I n, float mx) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  const auto vm = hn::Set(d, mx);
  auto s = hn::Zero(d);
  I j = 0;
  for (; j + L <= n; j += L) {
    const auto e = ExpSoftmax(d, hn::Sub(hn::LoadU(d, x + j), vm));
    hn::StoreU(e, d, x + j);
    s = hn::Add(s, e);
  }
  float r = hn::GetLane(hn::SumOfLanes(d, s));
  for (; j < n; ++j) {
    const float e = x[j] == -HUGE_VALF ? 0.f : std::exp(x[j] - mx);
    x[j] = e;
    r += e;
  }
  return r;
}

// g[0, n) = σ(a[0, n)) (CopeSigmoid, in float).
HWY_INLINE void Gates(const float* HWY_RESTRICT a, float* HWY_RESTRICT g, I n) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  I j = 0;
  for (; j + L <= n; j += L) hn::StoreU(CopeSigmoid(d, hn::LoadU(d, a + j)), d, g + j);
  if (j == n) return;
  HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)] = {};
  std::copy(a + j, a + n, buf);
  hn::Store(CopeSigmoid(d, hn::Load(d, buf)), d, buf);
  std::copy(buf, buf + (n - j), g + j);
}

// cope, one row: S[j] += z_j for j = n − 1 … 0, the row's keys right to left, count carrying the
// gates Σ σ(a) of the keys right of them (cope_math.h; gates in float, summed in double): S holds
// the logits a = scale·q·k; qe [ncol] = q·e_c; g: n floats of scratch. Once the count reaches
// npos − 1 every key to its left takes z = qe[npos − 1] (clamped: no gates needed).
void CopeRow(const float* HWY_RESTRICT qe, I npos, I ncol, float* HWY_RESTRICT S, I n, double* count,
             float* HWY_RESTRICT g) {
  const double top = static_cast<double>(npos - 1);
  double c = *count;
  I j = n;
  if (c < top) {
    Gates(S, g, n);
    while (j > 0) {
      --j;
      c += static_cast<double>(g[j]);
      if (!(c < top)) {  // clamped from here (NaN too: the logit's check below gives up)
        ++j;
        break;
      }
      const I lo = static_cast<I>(c);  // ⌊c⌋: c ≥ 0
      const double w = c - static_cast<double>(lo);
      const double z = w > 0 ? (1 - w) * qe[lo] + w * qe[lo + 1] : qe[lo];
      S[j] = static_cast<float>(static_cast<double>(S[j]) + z);
    }
  }
  *count = c;
  if (!(c < top)) {
    const hn::ScalableTag<float> d;
    const I L = static_cast<I>(hn::Lanes(d));
    const float zt = npos - 1 < ncol ? qe[npos - 1] : NAN;  // (a NaN count: the row gives up)
    I x = 0;
    for (; x + L <= j; x += L) hn::StoreU(hn::Add(hn::LoadU(d, S + x), hn::Set(d, zt)), d, S + x);
    for (; x < j; ++x) S[x] += zt;
  }
}

// y[0, n) += x[0, n).
HWY_INLINE void AddRow(const float* HWY_RESTRICT x, float* HWY_RESTRICT y, I n) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  I j = 0;
  for (; j + L <= n; j += L) hn::StoreU(hn::Add(hn::LoadU(d, y + j), hn::LoadU(d, x + j)), d, y + j);
  for (; j < n; ++j) y[j] += x[j];
}

HWY_INLINE void ScaleRow(float* HWY_RESTRICT x, I n, float c) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  I j = 0;
  for (; j + L <= n; j += L) hn::StoreU(hn::Mul(hn::LoadU(d, x + j), hn::Set(d, c)), d, x + j);
  for (; j < n; ++j) x[j] *= c;
}

}  // namespace decode_rows
}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#endif  // POSENC_ATTENTION_DECODE_ROWS_INL_H_
