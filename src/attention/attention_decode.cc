// The decode kernel (attention_decode.h): M ≤ 16 queries against N cached keys.
//
// Shape letters: B batch, M queries, N keys, Hq query heads, Hkv kv heads, G = Hq/Hkv, D head dim,
// R = G·M the query rows of one kv head (row r = g·M + i: query i of head kh·G + g).
//
// Per task (batch row b, key part [j0, j1)): the R query rows of every kv head, scaled and rotated
// (rotary encodings: q only, the keys carry their rotation: keys_rotated) in double and rounded once
// to float, Q [Hkv, R, D]. Then per block of nb keys (block_keys: ~256 KiB of float rows):
//   the K and V rows of every kv head converted to float in memory order, one sequential stream
//   (F16C / AVX-512 conversions on float16, a shift on bfloat16, a copy on float32); then per kv
//   head S [R, nb] = Q·Kᵀ on each row's visible keys;
//   + the bias of the row's head at kp − qp (ALiBi, T5, KERPLE, Sandwich, FIRE), computed here per
//     key: −m·|Δ|; T5's weights tabulated over Δ ∈ [−(max_distance + 1), max_distance + 1] (the
//     bucket is constant beyond); KERPLE and Sandwich from per-distance tables in double kept across
//     calls (kerple_table, sandwich_table: a decode step meets the last step's distances and one
//     more); FIRE's MLP on x = ψ(|Δ|)/ψ(max(L, qp)), the hidden units shared by a kv head's G heads;
//   online softmax per row (running max m, sum l, o rescaled), o += P·V.
// Every K and V row is read and converted once per call, whatever G and M.
//
// Threads (flash-decoding): with B ≥ T threads each batch row is one task; else each row's keys are
// cut into P = ⌈T/B⌉ parts (at least kMinPart keys each), whose (m, l, o) are merged exactly:
// m = max m_p, l = Σ l_p·e^{m_p − m}, o = Σ o_p·e^{m_p − m}, in part order (the result depends on
// T, not on which thread ran what). out = o/l, lse = m + log l (−inf, out 0: no key).
//
// Non-finite inputs: the kernel gives up (returns false) when a logit it reads is NaN or +inf or an
// output row with finite lse is not finite; the dispatcher then runs the tile kernel, whose careful
// steps handle them (attention_tiles.h). Finite inputs pay one compare per logit and per output.
// Memory: per thread O(nb·(R + Hkv·D)) floats; the part buffers B·P·Hkv·R·(D + 2) floats when P > 1;
// the kept tables Hq·(largest distance) floats (KERPLE) and one float per distance (Sandwich).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#ifndef POSENC_ATTENTION_DECODE_TYPES
#define POSENC_ATTENTION_DECODE_TYPES
#include "posenc/view.h"
namespace posenc::decode_impl {
using I = std::int64_t;
// Keys per block: the block's K and V rows of every kv head, as float, fill ~256 KiB (L2).
inline I block_keys(I Hkv, I D) { return std::clamp<I>(16384 / std::max<I>(Hkv * D, 1), 8, 128); }

enum class BiasKind { kNone, kSlopes, kLearned, kT5, kKerpleLog, kKerplePower, kSandwich, kFire };

// A call's bias, as the per-target code reads it (filled in prepare_bias below).
struct Bias {
  BiasKind kind = BiasKind::kNone;
  const double* slopes = nullptr;  // alibi [Hq]
  const double* sig = nullptr;     // learned alibi σ(w) [2, Hq]
  I Hq = 0;
  const float* t5 = nullptr;       // [Hq, 2·t5_half + 1]: head h's weight at Δ = −t5_half + e
  I t5_half = 0;
  const float* kt = nullptr;       // kerple: head h's bias at |Δ| = e at kt[h·kt_w + e]
  I kt_w = 0;
  const float* sw = nullptr;       // sandwich: the head-independent part at |Δ| = 0, 1, …
  const float* hs = nullptr;       // sandwich: head scale [Hq]
  const float* w1 = nullptr;       // fire [W], b1 [W], w2 [Hq, W], b2 [Hq]
  const float* b1 = nullptr;
  const float* w2 = nullptr;
  const float* b2 = nullptr;
  I W = 0;
  float c = 0;
  const float* inv = nullptr;      // fire: 1/ψ(max(L, qp)) per query i [M]
};

// One task's inputs: batch row b, keys [j0, j1), every kv head.
struct Task {
  I D, G, M, Hq, Hkv;
  DType dt;
  const float* q;      // [Hkv, R, D]
  const void* k;       // key j of kv head kh of batch row b at k + j·kld + kh·khs elements
  const void* v;
  I kld, khs, vld, vhs;
  I j0, j1;
  const I* lo;         // [Hkv, R]: row r of kv head kh sees keys [lo, hi)
  const I* hi;
  I q_off, k_off;
  const Bias* bias;
};
}  // namespace posenc::decode_impl
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/attention_decode.cc"
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
    for (I j = a; j < e; ++j)
      for (I kh = 0; kh < H; ++kh) {
        if (j + kPrefetch < t.j1) {  // the rows kPrefetch keys ahead, a cache line at a time
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
#include <omp.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "attention/attention_decode.h"
#include "attention/attention_tiles.h"
#include "core/fast_common.h"
#include "enc/bias/alibi/alibi_math.h"
#include "enc/bias/fire/fire_check.h"
#include "enc/bias/fire/fire_math.h"
#include "enc/bias/kerple/kerple_math.h"
#include "enc/bias/sandwich/sandwich_math.h"
#include "enc/bias/t5/t5_math.h"
#include "enc/rotary/rotary_plan.h"
#include "posenc/threads.h"

namespace posenc {
HWY_EXPORT(DecodeTask);

namespace decode {
namespace {

using decode_impl::Bias;
using decode_impl::BiasKind;
using decode_impl::I;
inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

constexpr I kMaxDistance = I{1} << 24;  // |kp − qp| below this: exact in float
constexpr I kMinPart = 256;             // keys per part at least, when a unit is split

// Sandwich's head-independent part Σ_k cos(Δ·ω_k) − d̄/2 at |Δ| = 0 … n − 1 (sandwich_math.h, in
// double, rounded once), kept for the process's last (d̄, base) and grown on demand: a decode step
// meets the previous step's distances and one more, so the table costs O(d̄) a step.
std::shared_ptr<const std::vector<float>> sandwich_table(const SandwichParams& sp, I n, int threads) {
  static std::mutex mu;
  static std::shared_ptr<const std::vector<float>> table;
  static I dim = -1;
  static double base = 0;
  const std::lock_guard<std::mutex> lock(mu);
  if (dim != sp.sinusoid_dim || base != sp.base) table.reset();
  if (table && static_cast<I>(table->size()) >= n) return table;
  const I have = table ? static_cast<I>(table->size()) : 0;
  const I want = std::max(n, 2 * have);
  auto next = std::make_shared<std::vector<float>>(ix(want));
  if (have) std::copy(table->begin(), table->end(), next->begin());
  const std::vector<double> w = sandwich::freqs(sp.sinusoid_dim, sp.base);
  const int th = want - have > 4096 ? threads : 1;
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
  for (I e = have; e < want; ++e) (*next)[ix(e)] = static_cast<float>(sandwich::shifted_inner_product(static_cast<double>(e), w));
  table = next;
  dim = sp.sinusoid_dim;
  base = sp.base;
  return table;
}

// KERPLE's bias per head at |Δ| = 0 … w − 1, [Hq, w] (kerple_math.h, in double, rounded once), kept
// for the process's last (kernel, r1, r2) and rebuilt wider on demand, as sandwich_table.
struct KerpleTable {
  std::shared_ptr<const std::vector<float>> tab;
  I w = 0;
};
KerpleTable kerple_table(bool power, const std::vector<double>& r1, const std::vector<double>& r2, I n, int threads) {
  static std::mutex mu;
  static KerpleTable kept;
  static bool kept_power = false;
  static std::vector<double> kept_r1, kept_r2;
  const std::lock_guard<std::mutex> lock(mu);
  if (kept.tab && kept_power == power && kept_r1 == r1 && kept_r2 == r2 && kept.w >= n) return kept;
  const I w = kept.tab && kept_power == power && kept_r1 == r1 && kept_r2 == r2 ? std::max(n, 2 * kept.w) : n;
  const I H = static_cast<I>(r1.size());
  auto t = std::make_shared<std::vector<float>>(ix(H * w));
  const int th = H * w > 65536 ? threads : 1;
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
  for (I e = 0; e < w; ++e)
    for (I h = 0; h < H; ++h)
      (*t)[ix(h * w + e)] = static_cast<float>(kerple::bias(power, r1[ix(h)], r2[ix(h)], static_cast<double>(e)));
  kept = KerpleTable{t, w};
  kept_power = power;
  kept_r1 = r1;
  kept_r2 = r2;
  return kept;
}

// The largest |kp − qp| of a call, + 1: the width of a per-distance table.
I distances(const attn::Dims& d) {
  const I a = std::abs(d.k_off - d.q_off - (d.M - 1)), z = std::abs(d.k_off + d.N - 1 - d.q_off);
  return std::max(a, z) + 1;
}

// What a call's bias reads, owned (Bias points into it).
struct BiasData {
  Bias b;
  std::vector<double> slopes, sig;
  std::vector<float> t5, hs, w1, b1, w2, b2, inv;
  std::shared_ptr<const std::vector<float>> sw;
  KerpleTable kt;
};

void prepare_bias(const AttentionParams& p, const attn::Dims& d, const EncodingTensors& t, int threads,
                  BiasData* bd) {
  Bias& b = bd->b;
  const I Hq = d.Hq;
  switch (p.encoding) {
    case Encoding::kAlibi:
      if (p.alibi.variant == AlibiVariant::kLearned) {
        const std::vector<double> w = to_doubles(t.weights);  // [2, Hq]
        bd->sig.resize(w.size());
        for (std::size_t e = 0; e < w.size(); ++e) bd->sig[e] = alibi::sigmoid(w[e]);
        b.kind = BiasKind::kLearned;
        b.sig = bd->sig.data();
        b.Hq = Hq;
      } else {
        bd->slopes = t.slopes.present() ? to_doubles(t.slopes)
                                        : alibi::rule_slopes(Hq, p.alibi.variant == AlibiVariant::kNonsymmetric);
        b.kind = BiasKind::kSlopes;
        b.slopes = bd->slopes.data();
      }
      break;
    case Encoding::kT5: {
      const I nb = p.t5.num_buckets, half = p.t5.max_distance + 1, w = 2 * half + 1;
      const std::vector<double> wt = to_doubles(t.weights);  // [nb, Hq]
      bd->t5.resize(ix(Hq * w));
      for (I e = 0; e < w; ++e) {
        const I bk = t5::bucket(e - half, p.t5.bidirectional, nb, p.t5.max_distance);
        for (I h = 0; h < Hq; ++h) bd->t5[ix(h * w + e)] = static_cast<float>(wt[ix(bk * Hq + h)]);
      }
      b.kind = BiasKind::kT5;
      b.t5 = bd->t5.data();
      b.t5_half = half;
      break;
    }
    case Encoding::kKerple: {
      const bool power = p.kerple.kernel == KerpleKernel::kPower;
      bd->kt = kerple_table(power, to_doubles(t.r1), to_doubles(t.r2), distances(d), threads);
      b.kind = power ? BiasKind::kKerplePower : BiasKind::kKerpleLog;
      b.kt = bd->kt.tab->data();
      b.kt_w = bd->kt.w;
      break;
    }
    case Encoding::kSandwich: {
      bd->sw = sandwich_table(p.sandwich, distances(d), threads);
      bd->hs.resize(ix(Hq));
      for (I h = 0; h < Hq; ++h) bd->hs[ix(h)] = static_cast<float>(sandwich::head_scale(h, Hq));
      b.kind = BiasKind::kSandwich;
      b.sw = bd->sw->data();
      b.hs = bd->hs.data();
      break;
    }
    case Encoding::kFire: {
      const fire::Values v = fire::values(t.fire);
      bd->w1.assign(v.w1.begin(), v.w1.end());
      bd->b1.assign(v.b1.begin(), v.b1.end());
      bd->w2.assign(v.w2.begin(), v.w2.end());
      bd->b2.assign(v.b2.begin(), v.b2.end());
      bd->inv.resize(ix(d.M));
      for (I i = 0; i < d.M; ++i)
        bd->inv[ix(i)] = static_cast<float>(1.0 / fire::psi(v.c, fire::norm_arg(v.L, d.q_off + i)));
      b.kind = BiasKind::kFire;
      b.w1 = bd->w1.data();
      b.b1 = bd->b1.data();
      b.w2 = bd->w2.data();
      b.b2 = bd->b2.data();
      b.W = static_cast<I>(v.w1.size());
      b.c = static_cast<float>(v.c);
      b.inv = bd->inv.data();
      break;
    }
    default: break;
  }
}

// Q [R, D] of (b, kh): q_i of head kh·G + g, rotated (rotary encodings; in double, as the reference)
// and scaled, at row g·M + i.
void prepare_q(const attn::Dims& d, const View& q, I b, I kh, float* Q) {
  const I M = d.M, G = d.G, D = d.D;
  std::vector<double> x(ix(M * G * D));  // [1, M, G, D]
  for (I i = 0; i < M; ++i)
    for (I g = 0; g < G; ++g)
      for (I e = 0; e < D; ++e)
        x[ix((i * G + g) * D + e)] = q.get(((b * M + i) * d.Hq + kh * G + g) * D + e);
  if (d.rotary) {
    const I A = static_cast<I>(d.q_ids.size()) / (d.B * M);
    const std::vector<I> ids(d.q_ids.begin() + b * A * M, d.q_ids.begin() + (b + 1) * A * M);
    rotary::rotate_ref(d.rot, &x, 1, M, G, D, ids, +1, +1);
  }
  for (I i = 0; i < M; ++i)
    for (I g = 0; g < G; ++g)
      for (I e = 0; e < D; ++e) Q[(g * M + i) * D + e] = static_cast<float>(d.scale * x[ix((i * G + g) * D + e)]);
}

}  // namespace

bool covers(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k, const View& v) {
  if (d.M < 1 || d.M > kMaxQueries || d.N < 1) return false;
  switch (p.encoding) {
    case Encoding::kNope: case Encoding::kAlibi: case Encoding::kT5: case Encoding::kKerple:
    case Encoding::kSandwich: case Encoding::kFire:
      break;
    case Encoding::kRope: case Encoding::kXpos: case Encoding::kMrope: case Encoding::kRope2d:
      if (!p.keys_rotated) return false;  // (rope2d mixed with keys_rotated is refused in validation)
      break;
    default: return false;
  }
  if (!fast::fast_dtype(q.dtype)) return false;
  if ((k.strides[3] != 1 || v.strides[3] != 1) && d.D > 1) return false;
  const I lo = d.k_off - d.q_off - (d.M - 1), hi = d.k_off + d.N - 1 - d.q_off;
  return std::abs(lo) < kMaxDistance && std::abs(hi) < kMaxDistance;
}

int threads_for(const attn::Dims& d) {
  return d.B * d.Hkv * d.N * d.D < fast::kParallelMin ? 1 : std::max(1, num_threads());
}

bool forward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k, const View& v,
             const EncodingTensors& t, const View& out, const View& lse, int threads) {
  const I B = d.B, M = d.M, N = d.N, G = d.G, D = d.D, Hkv = d.Hkv, R = G * M;
  BiasData bd;
  prepare_bias(p, d, t, threads, &bd);
  // visible keys per row r = g·M + i (and head): causal / nonsymmetric ALiBi's halves
  std::vector<I> lo(ix(Hkv * R)), hi(ix(Hkv * R));
  const bool nonsym = p.encoding == Encoding::kAlibi && p.alibi.variant == AlibiVariant::kNonsymmetric;
  for (I kh = 0; kh < Hkv; ++kh)
    for (I r = 0; r < R; ++r) {
      const I h = kh * G + r / M, qp = d.q_off + r % M;
      const bool past = p.causal || (nonsym && h < d.Hq / 2), fut = nonsym && h >= d.Hq / 2;
      lo[ix(kh * R + r)] = fut ? std::clamp<I>(qp - d.k_off, 0, N) : 0;
      hi[ix(kh * R + r)] = past ? std::clamp<I>(qp - d.k_off + 1, 0, N) : N;
    }
  // tasks: (batch row, key part); a row's keys are split in P parts when there are fewer rows than
  // threads (flash-decoding)
  I P = 1;
  if (B < threads) P = std::max<I>(1, std::min<I>((threads + B - 1) / B, N / kMinPart));
  const I tasks = B * P, HR = Hkv * R, per = HR * (D + 2);  // per: a task's m, l [HR], o [HR, D]
  std::vector<float> parts(P > 1 ? ix(tasks * per) : 0);
  std::atomic<bool> bad{false};
  const auto task_fn = HWY_DYNAMIC_DISPATCH(DecodeTask);
  const std::size_t esz = dtype_size(q.dtype);
  const int th = static_cast<int>(std::min<I>(threads, tasks));
  const I nb = decode_impl::block_keys(Hkv, D);
  // a task's finished rows (o normalised in place) into out and lse
  const auto store = [&](I b, I kh, I r, float mr, float lr, float* o) {
    const I h = kh * G + r / M, i = r % M;
    double ls = -HUGE_VAL;
    if (lr > 0) {
      const float inv = 1.f / lr;
      for (I e = 0; e < D; ++e) {
        o[e] *= inv;
        if (!std::isfinite(o[e])) bad = true;
      }
      ls = static_cast<double>(mr) + std::log(static_cast<double>(lr));
    } else {
      std::fill(o, o + D, 0.f);
    }
    attn_fast::store_row(out, D, b, i, h, o);
    if (lse.present())
      static_cast<double*>(lse.data)[b * lse.strides[0] + h * lse.strides[1] + i * lse.strides[2]] = ls;
  };
#pragma omp parallel num_threads(th) if (th > 1)
  {
    std::vector<float> scratch(ix(nb * (R + 2 * Hkv * D) + R)), Q(ix(HR * D)), mine(P > 1 ? 0 : ix(per));
#pragma omp for schedule(static)
    for (I task = 0; task < tasks; ++task) {
      if (bad.load(std::memory_order_relaxed)) continue;
      const I b = task / P, part = task % P;
      for (I kh = 0; kh < Hkv; ++kh) prepare_q(d, q, b, kh, &Q[ix(kh * R * D)]);
      const decode_impl::Task tk{D, G, M, d.Hq, Hkv, q.dtype, Q.data(),
                                 static_cast<const char*>(k.data) + ix(b * k.strides[0]) * esz,
                                 static_cast<const char*>(v.data) + ix(b * v.strides[0]) * esz,
                                 k.strides[1], k.strides[2], v.strides[1], v.strides[2],
                                 N * part / P, N * (part + 1) / P, lo.data(), hi.data(), d.q_off, d.k_off, &bd.b};
      float* res = P > 1 ? &parts[ix(task * per)] : mine.data();
      if (!task_fn(tk, scratch.data(), res, res + HR, res + 2 * HR)) {
        bad = true;
        continue;
      }
      if (P == 1)
        for (I x = 0; x < HR; ++x) store(b, x / R, x % R, res[x], res[HR + x], res + 2 * HR + x * D);
    }
  }
  if (bad) return false;
  if (P > 1) {  // merge the parts of each batch row, in part order
    std::vector<float> o(ix(D));
    for (I b = 0; b < B; ++b)
      for (I x = 0; x < HR; ++x) {
        float mx = -HUGE_VALF, l = 0;
        for (I pt = 0; pt < P; ++pt) mx = std::max(mx, parts[ix((b * P + pt) * per + x)]);
        std::fill(o.begin(), o.end(), 0.f);
        if (mx > -HUGE_VALF)
          for (I pt = 0; pt < P; ++pt) {
            const float* res = &parts[ix((b * P + pt) * per)];
            if (res[x] == -HUGE_VALF) continue;
            const float c = std::exp(res[x] - mx);
            l += res[HR + x] * c;
            const float* op = res + 2 * HR + x * D;
            for (I e = 0; e < D; ++e) o[ix(e)] += op[e] * c;
          }
        store(b, x / R, x % R, mx, l, o.data());
      }
    if (bad) return false;
  }
  return true;
}

Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse) {
  attn::Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_forward(p, q, k, v, t, out, lse, &d));
  if (!covers(p, d, q, k, v))
    return Status::Invalid("encoding", "the decode kernel does not take " + attn::describe(p) + " on " +
                                           dtype_name(q.dtype) + " with M = " + std::to_string(d.M));
  const attn_fast::BlasOneThread one;
  if (!forward(p, d, q, k, v, t, out, lse, std::max(1, num_threads())))
    return Status::Invalid("k", "a NaN or infinite value: the decode kernel leaves such calls to the tile kernel");
  return Status::Ok();
}

}  // namespace decode
}  // namespace posenc
#endif  // HWY_ONCE
