// The body of one decode task (attention_decode_task.h), per SIMD target (Highway, every target
// compiled, the best chosen per call). What it computes and why: attention_decode.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention/attention_decode_task.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/attention_decode_task.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using decode_impl::BiasKind;
using decode_impl::I;

// n rows of D values of T (row stride ld) into dst [n, D] as float.
template <class T>
HWY_INLINE void ConvertRows(const T* HWY_RESTRICT src, I ld, I n, I D, float* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  for (I r = 0; r < n; ++r) {
    const T* s = src + r * ld;
    float* y = dst + r * D;
    I e = 0;
    for (; e + L <= D; e += L) hn::StoreU(LoadF(d, s + e), d, y + e);
    for (; e < D; ++e) y[e] = ToF(s[e]);
  }
}

HWY_INLINE float DotRow(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, I D) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  auto s0 = hn::Zero(d), s1 = hn::Zero(d);
  I e = 0;
  for (; e + 2 * L <= D; e += 2 * L) {
    s0 = hn::MulAdd(hn::LoadU(d, a + e), hn::LoadU(d, b + e), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + e + L), hn::LoadU(d, b + e + L), s1);
  }
  for (; e + L <= D; e += L) s0 = hn::MulAdd(hn::LoadU(d, a + e), hn::LoadU(d, b + e), s0);
  float r = hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
  for (; e < D; ++e) r += a[e] * b[e];
  return r;
}

// s[g·lds] = a_g·b for four rows a_g = a + g·lda (one load of b for the four).
HWY_INLINE void Dot4(const float* HWY_RESTRICT a, I lda, const float* HWY_RESTRICT b, I D, float* HWY_RESTRICT s,
                     I lds) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  auto c0 = hn::Zero(d), c1 = hn::Zero(d), c2 = hn::Zero(d), c3 = hn::Zero(d);
  I e = 0;
  for (; e + L <= D; e += L) {
    const auto bv = hn::LoadU(d, b + e);
    c0 = hn::MulAdd(hn::LoadU(d, a + e), bv, c0);
    c1 = hn::MulAdd(hn::LoadU(d, a + lda + e), bv, c1);
    c2 = hn::MulAdd(hn::LoadU(d, a + 2 * lda + e), bv, c2);
    c3 = hn::MulAdd(hn::LoadU(d, a + 3 * lda + e), bv, c3);
  }
  float r[4] = {hn::GetLane(hn::SumOfLanes(d, c0)), hn::GetLane(hn::SumOfLanes(d, c1)),
                hn::GetLane(hn::SumOfLanes(d, c2)), hn::GetLane(hn::SumOfLanes(d, c3))};
  for (; e < D; ++e)
    for (int g = 0; g < 4; ++g) r[g] += a[g * lda + e] * b[e];
  for (int g = 0; g < 4; ++g) s[g * lds] = r[g];
}

// o_g [D] += Σ_j p_g[j]·V[j] for four rows (p_g = p + g·ldp, o_g = o + g·ldo; V row stride D), one
// load of V for the four.
HWY_INLINE void AddPV4(const float* HWY_RESTRICT p, I ldp, const float* HWY_RESTRICT V, I n, I D,
                       float* HWY_RESTRICT o, I ldo) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  I e = 0;
  for (; e + L <= D; e += L) {
    auto a0 = hn::LoadU(d, o + e), a1 = hn::LoadU(d, o + ldo + e), a2 = hn::LoadU(d, o + 2 * ldo + e),
         a3 = hn::LoadU(d, o + 3 * ldo + e);
    for (I j = 0; j < n; ++j) {
      const auto v = hn::LoadU(d, V + j * D + e);
      a0 = hn::MulAdd(hn::Set(d, p[j]), v, a0);
      a1 = hn::MulAdd(hn::Set(d, p[ldp + j]), v, a1);
      a2 = hn::MulAdd(hn::Set(d, p[2 * ldp + j]), v, a2);
      a3 = hn::MulAdd(hn::Set(d, p[3 * ldp + j]), v, a3);
    }
    hn::StoreU(a0, d, o + e);
    hn::StoreU(a1, d, o + ldo + e);
    hn::StoreU(a2, d, o + 2 * ldo + e);
    hn::StoreU(a3, d, o + 3 * ldo + e);
  }
  for (; e < D; ++e)
    for (int g = 0; g < 4; ++g) {
      float acc = o[g * ldo + e];
      for (I j = 0; j < n; ++j) acc += p[g * ldp + j] * V[j * D + e];
      o[g * ldo + e] = acc;
    }
}

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
    case BiasKind::kT5: {
      const I w = 2 * bs.t5_half + 1;
      const float* tab = bs.t5 + h * w;
      for (; j < n; ++j) {
        const I rel = std::clamp<I>(kp0 - qp + j, -bs.t5_half, bs.t5_half);
        S[j] += tab[rel + bs.t5_half];
      }
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

// o [D] += Σ_j p[j]·V[j] over n rows of V (row stride ld).
HWY_INLINE void AddPV(const float* HWY_RESTRICT p, const float* HWY_RESTRICT V, I ld, I n, I D,
                      float* HWY_RESTRICT o) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  I e = 0;
  for (; e + 2 * L <= D; e += 2 * L) {
    auto a0 = hn::LoadU(d, o + e), a1 = hn::LoadU(d, o + e + L);
    for (I j = 0; j < n; ++j) {
      const auto pj = hn::Set(d, p[j]);
      a0 = hn::MulAdd(pj, hn::LoadU(d, V + j * ld + e), a0);
      a1 = hn::MulAdd(pj, hn::LoadU(d, V + j * ld + e + L), a1);
    }
    hn::StoreU(a0, d, o + e);
    hn::StoreU(a1, d, o + e + L);
  }
  for (; e + L <= D; e += L) {
    auto a0 = hn::LoadU(d, o + e);
    for (I j = 0; j < n; ++j) a0 = hn::MulAdd(hn::Set(d, p[j]), hn::LoadU(d, V + j * ld + e), a0);
    hn::StoreU(a0, d, o + e);
  }
  for (; e < D; ++e) {
    float a = o[e];
    for (I j = 0; j < n; ++j) a += p[j] * V[j * ld + e];
    o[e] = a;
  }
}

HWY_INLINE void ScaleRow(float* HWY_RESTRICT x, I n, float c) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  I j = 0;
  for (; j + L <= n; j += L) hn::StoreU(hn::Mul(hn::LoadU(d, x + j), hn::Set(d, c)), d, x + j);
  for (; j < n; ++j) x[j] *= c;
}

// One task (decode_impl::Task) with K/V storage T, every kv head: m, l [Hkv, R] and o [Hkv, R, D]
// (unnormalised). scratch: block_keys(Hkv, D)·(R + 2·Hkv·D) + R floats. Returns false at a NaN or +inf
// logit. Per block of keys, the K and V rows of every kv head are converted in memory order (one
// sequential stream, as the hardware prefetchers like it), then each kv head's R rows use them.
constexpr I kPrefetch = 8;  // keys ahead of the conversion that the K and V rows are prefetched

// The K and V rows of keys [a, e), every kv head, into Kf, Vf [Hkv, nb, D] as float, in memory
// order (one sequential stream, as the hardware prefetchers like it), prefetching kPrefetch keys ahead.
template <class T>
HWY_INLINE void ConvertBlock(const decode_impl::Task& t, const T* K, const T* V, I a, I e, I nb, float* Kf,
                             float* Vf) {
  const I D = t.D;
  for (I j = a; j < e; ++j)
    for (I kh = 0; kh < t.Hkv; ++kh) {
      if (j + kPrefetch < t.j1) {  // a cache line at a time
        const char* pk = reinterpret_cast<const char*>(K + (j + kPrefetch) * t.kld + kh * t.khs);
        const char* pv = reinterpret_cast<const char*>(V + (j + kPrefetch) * t.vld + kh * t.vhs);
        for (I by = 0; by < D * I{sizeof(T)}; by += 64) {
          hwy::Prefetch(pk + by);
          hwy::Prefetch(pv + by);
        }
      }
      ConvertRows(K + j * t.kld + kh * t.khs, 0, 1, D, Kf + (kh * nb + j - a) * D);
      ConvertRows(V + j * t.vld + kh * t.vhs, 0, 1, D, Vf + (kh * nb + j - a) * D);
    }
}

template <class T>
bool RunTask(const decode_impl::Task& t, float* scratch, float* m0, float* l0, float* o0) {
  const I D = t.D, R = t.G * t.M, H = t.Hkv, nb = decode_impl::block_keys(H, D);
  float* S = scratch;           // [R, nb]
  float* Kf = S + R * nb;       // [H, nb, D]
  float* Vf = Kf + H * nb * D;  // [H, nb, D]
  float* act = Vf + H * nb * D;  // [R]: 1 for a row with weight in the block
  const T* K = static_cast<const T*>(t.k);
  const T* V = static_cast<const T*>(t.v);
  std::fill(m0, m0 + H * R, -HUGE_VALF);
  std::fill(l0, l0 + H * R, 0.f);
  std::fill(o0, o0 + H * R * D, 0.f);
  for (I c0 = t.j0; c0 < t.j1; c0 += nb) {
    const I c1 = std::min(t.j1, c0 + nb);
    I a = c1, e = c0;  // the keys some row of some head sees
    for (I r = 0; r < H * R; ++r)
      if (t.lo[r] < c1 && t.hi[r] > c0 && t.lo[r] < t.hi[r])
        a = std::min(a, std::max(t.lo[r], c0)), e = std::max(e, std::min(t.hi[r], c1));
    if (a >= e) continue;
    ConvertBlock(t, K, V, a, e, nb, Kf, Vf);
    for (I kh = 0; kh < H; ++kh) {
      const I* lo = t.lo + kh * R;
      const I* hi = t.hi + kh * R;
      const float* Q = t.q + kh * R * D;
      float* m = m0 + kh * R;
      float* l = l0 + kh * R;
      float* o = o0 + kh * R * D;
      const float* Kb = Kf + kh * nb * D;
      const float* Vb = Vf + kh * nb * D;
      // logits: rows (g, i), (g + 1, i), … of one query i share their keys (but nonsymmetric
      // ALiBi's halves): four at a time share each K load
      const auto same4 = [&](I r) {
        for (I x = 1; x < 4; ++x)
          if (lo[r + x * t.M] != lo[r] || hi[r + x * t.M] != hi[r]) return false;
        return true;
      };
      for (I i = 0; i < t.M; ++i)
        for (I g0 = 0; g0 < t.G; g0 += 4) {
          const I r0 = g0 * t.M + i;
          if (g0 + 4 <= t.G && same4(r0)) {
            for (I j = std::max(a, lo[r0]); j < std::min(e, hi[r0]); ++j)
              Dot4(Q + r0 * D, t.M * D, Kb + (j - a) * D, D, S + r0 * nb + (j - a), t.M * nb);
            continue;
          }
          for (I g = g0; g < std::min(t.G, g0 + 4); ++g) {
            const I r = g * t.M + i;
            for (I j = std::max(a, lo[r]); j < std::min(e, hi[r]); ++j)
              S[r * nb + (j - a)] = DotRow(Q + r * D, Kb + (j - a) * D, D);
          }
        }
      std::fill(act, act + R, 0.f);
      const BiasKind bk = t.bias->kind;
      if (bk == BiasKind::kFire)  // rows g·M + i share their keys (FIRE masks only causally) and x
        for (I i = 0; i < t.M; ++i) {
          const I ra = std::max(a, lo[i]), re = std::min(e, hi[i]);
          if (ra < re)
            AddFireGroup(*t.bias, kh * t.G, t.G, i, t.q_off + i, t.k_off + ra, S + i * nb + (ra - a), t.M * nb, re - ra);
        }
      for (I r = 0; r < R; ++r) {
        const I ra = std::max(a, lo[r]), re = std::min(e, hi[r]);
        if (ra >= re) continue;
        const I g = r / t.M, i = r % t.M, h = kh * t.G + g, qp = t.q_off + i;
        float* Sr = S + r * nb + (ra - a);
        const I n = re - ra;
        if (bk != BiasKind::kNone && bk != BiasKind::kFire) AddBias(*t.bias, h, i, qp, t.k_off + ra, Sr, n);
        float rm;
        if (!RowMaxBelowInf(Sr, n, &rm)) return false;
        const float mn = std::max(m[r], rm);
        if (mn == -HUGE_VALF) continue;  // every logit −inf: no weight yet
        const float sum = ExpSubSum(Sr, n, mn);
        if (m[r] == -HUGE_VALF) {
          l[r] = sum;
        } else {
          const float corr = std::exp(m[r] - mn);
          if (corr != 1.f) ScaleRow(o + r * D, D, corr);
          l[r] = l[r] * corr + sum;
        }
        m[r] = mn;
        act[r] = 1.f;
      }
      // o += P·V, four rows of one query at a time where they share their keys
      for (I i = 0; i < t.M; ++i)
        for (I g0 = 0; g0 < t.G; g0 += 4) {
          const I r0 = g0 * t.M + i;
          if (g0 + 4 <= t.G && same4(r0) && act[r0] != 0 && act[r0 + t.M] != 0 && act[r0 + 2 * t.M] != 0 && act[r0 + 3 * t.M] != 0) {
            const I ra = std::max(a, lo[r0]), re = std::min(e, hi[r0]);
            AddPV4(S + r0 * nb + (ra - a), t.M * nb, Vb + (ra - a) * D, re - ra, D, o + r0 * D, t.M * D);
            continue;
          }
          for (I g = g0; g < std::min(t.G, g0 + 4); ++g) {
            const I r = g * t.M + i;
            if (act[r] == 0) continue;
            const I ra = std::max(a, lo[r]), re = std::min(e, hi[r]);
            AddPV(S + r * nb + (ra - a), Vb + (ra - a) * D, D, re - ra, D, o + r * D);
          }
        }
    }
  }
  return true;
}

bool DecodeTask(const decode_impl::Task& t, float* scratch, float* m, float* l, float* o) {
  switch (t.dt) {
    case DType::kF32: return RunTask<float>(t, scratch, m, l, o);
    case DType::kBF16: return RunTask<hwy::bfloat16_t>(t, scratch, m, l, o);
    default: return RunTask<hwy::float16_t>(t, scratch, m, l, o);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posenc {
HWY_EXPORT(DecodeTask);
bool decode_impl::run_task(const Task& t, float* scratch, float* m, float* l, float* o) {
  return HWY_DYNAMIC_DISPATCH(DecodeTask)(t, scratch, m, l, o);
}
}  // namespace posenc
#endif  // HWY_ONCE
