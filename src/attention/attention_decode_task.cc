// The body of one decode task (attention_decode_task.h), per SIMD target (Highway, every target
// compiled, the best chosen per call). What it computes and why: attention_decode.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention/attention_decode_task.h"
#include "attention/attention_decode_xl.h"
#include "enc/bias/xl/xl_math.h"
#include "posenc/absolute.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/attention_decode_task.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "attention/attention_decode_kernels-inl.h"
#include "attention/attention_decode_bf16-inl.h"
#include "attention/attention_decode_rope2d-inl.h"
#include "attention/attention_decode_rows-inl.h"
#include "enc/contextual/cope/cope_simd-inl.h"
#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using decode_impl::BiasKind;
using decode_impl::I;

using decode_rows::AddBias;
using decode_rows::AddFireGroup;
using decode_rows::AddRow;
using decode_rows::CopeRow;
using decode_rows::ExpSubSum;
using decode_rows::Gates;
using decode_rows::RowMaxBelowInf;
using decode_rows::ScaleRow;

// The next block's K and V rows, every kv head, prefetched in memory order (the order the hardware
// prefetchers follow), a few cache lines per call, so that the loads of the cache overlap the work
// on the current block. Where a key's rows of all kv heads are contiguous (the usual [B, N, Hkv, D]
// cache), a key is one span of lines.
class Ahead {
 public:
  Ahead(const decode_impl::Task& t, I elem)
      : k_(static_cast<const char*>(t.k)), v_(static_cast<const char*>(t.v)), kld_(t.kld * elem),
        khs_(t.khs * elem), vld_(t.vld * elem), vhs_(t.vhs * elem) {
    const I row = t.D * elem;
    const bool one = t.khs * elem == row && t.vhs * elem == row;
    span_ = one ? t.Hkv * row : row;
    heads_ = one ? 1 : t.Hkv;
  }
  // Keys [j, j1), over about `calls` calls of Next() (0: all at Rest()).
  void Start(I j, I j1, I calls) {
    j_ = j, j1_ = j1, kh_ = 0, off_ = 0;
    rk_ = pk_ = k_ + j * kld_, rv_ = pv_ = v_ + j * vld_;
    const I lines = std::max<I>(j1 - j, 0) * heads_ * ((span_ + 63) / 64);
    per_ = calls > 0 ? (lines + calls - 1) / calls : 0;
  }
  HWY_INLINE void Next() { Lines(per_); }
  HWY_INLINE void operator()() { Next(); }
  void Rest() { Lines(I{1} << 62); }

 private:
  HWY_INLINE void Lines(I n) {
    for (; n > 0 && j_ < j1_; --n) {
      hwy::Prefetch(pk_ + off_);
      hwy::Prefetch(pv_ + off_);
      if ((off_ += 64) < span_) continue;
      off_ = 0;
      if (++kh_ < heads_) {
        pk_ += khs_, pv_ += vhs_;
      } else {
        kh_ = 0, ++j_;
        pk_ = rk_ += kld_, pv_ = rv_ += vld_;
      }
    }
  }
  const char* k_;
  const char* v_;
  I kld_, khs_, vld_, vhs_, span_ = 0, heads_ = 1;
  const char* rk_ = nullptr;  // key j_'s first row
  const char* rv_ = nullptr;
  const char* pk_ = nullptr;  // row kh_ of key j_
  const char* pv_ = nullptr;
  I j_ = 0, j1_ = 0, kh_ = 0, off_ = 0, per_ = 0;
};

// S[r·lds + j] = Q_r·K_j (Q_r = Q + r·ldq, K_j = K + j·kld) for NR rows and j < n, four keys at a
// time, each four one step of the prefetch.
template <int NR, class T>
HWY_INLINE void LogitRows(const float* HWY_RESTRICT Q, I ldq, const T* HWY_RESTRICT K, I kld, I n, I D,
                          float* HWY_RESTRICT S, I lds, Ahead& ahead) {
  for (I j = 0; j < n; j += 4) {
    decode_kernels::Logits4<NR>(Q, ldq, K + j * kld, kld, std::min<I>(4, n - j), D, S + j, lds);
    ahead.Next();
  }
}

// Whether task t takes its products at the bfloat16 rate on this target (attention_decode_bf16-inl.h).
template <class T>
HWY_INLINE bool BfRate(const decode_impl::Task& t) {
#if POSENC_DECODE_BF16
  return std::is_same_v<T, hwy::bfloat16_t> && t.dp != 0;
#else
  (void)t;
  return false;
#endif
}

// The logits of NR rows of kv head kh, rows r, r + ldr, … (S[x·lds + j] for x < NR) for keys j < n
// at K: the float32 products of t.q, or at the bfloat16 rate those of qhi + qlo.
template <int NR, class T>
HWY_INLINE void RowLogits(const decode_impl::Task& t, I kh, I r, I ldr, const T* HWY_RESTRICT K, I n,
                          float* HWY_RESTRICT S, I lds, Ahead& ahead) {
  const I D = t.D, row = (kh * t.G * t.M + r) * D;
#if POSENC_DECODE_BF16
  if (BfRate<T>(t)) {
    const auto* k = reinterpret_cast<const std::uint16_t*>(K);
    const std::uint16_t* lo = t.qlo ? t.qlo + row : nullptr;
    if (t.dp == 1) decode_bf16::LogitRows<NR, true>(t.qhi + row, lo, ldr * D, k, t.kld, n, D, t.qscale, S, lds, ahead);
    else decode_bf16::LogitRows<NR, false>(t.qhi + row, lo, ldr * D, k, t.kld, n, D, t.qscale, S, lds, ahead);
    return;
  }
#endif
  LogitRows<NR>(t.q + row, ldr * D, K, t.kld, n, D, S, lds, ahead);
}

// o_x += P_x·V over n keys for NR rows (P_x = P + x·ldp, o_x = o + x·ldo): the float32 products,
// or at the bfloat16 rate those of P rounded to bfloat16.
template <int NR, class T>
HWY_INLINE void RowsPV(const decode_impl::Task& t, const float* HWY_RESTRICT P, I ldp, const T* HWY_RESTRICT V, I n,
                       float* HWY_RESTRICT o, I ldo, Ahead& ahead) {
#if POSENC_DECODE_BF16
  if (BfRate<T>(t)) {
    const auto* v = reinterpret_cast<const std::uint16_t*>(V);
    if (t.dp == 1) decode_bf16::AddPV<NR, true>(P, ldp, v, t.vld, n, t.D, o, ldo, ahead);
    else decode_bf16::AddPV<NR, false>(P, ldp, v, t.vld, n, t.D, o, ldo, ahead);
    return;
  }
#endif
  decode_kernels::AddPV<NR>(P, ldp, V, t.vld, n, t.D, o, ldo, ahead);
}

// rope2d mixed: S[i·lds + j] = Q_i·R(θˣ·t_j)K_j for NR rows Q_i = Q + i·ldq (turned back by the
// rest) and keys [j0, j0 + n) (K_j = K + j·kld), row i head h's (kHeads: head h + i's), four keys at
// a time, each four one step of the prefetch (MixedLogitRowsR: the layout and the rotary width
// fixed, kR = 0 for any width).
template <int NR, bool kHeads, bool kInterleaved, int kR, class T>
HWY_INLINE void MixedLogitRowsR(const decode_impl::MixedKeys& mk, I h, const float* HWY_RESTRICT Q, I ldq,
                                const T* HWY_RESTRICT K, I kld, I j0, I n, I D, float* HWY_RESTRICT S, I lds,
                                Ahead& ahead) {
  for (I j = 0; j < n; j += 4) {
    decode_rope2d::MixedLogits4<NR, kHeads, kInterleaved, kR>(mk, h, Q, ldq, K + (j0 + j) * kld, kld, j0 + j,
                                                              std::min<I>(4, n - j), D, S + j, lds);
    ahead.Next();
  }
}
template <int NR, bool kHeads, class T>
HWY_INLINE void MixedLogitRows(const decode_impl::MixedKeys& mk, I h, const float* HWY_RESTRICT Q, I ldq,
                               const T* HWY_RESTRICT K, I kld, I j0, I n, I D, float* HWY_RESTRICT S, I lds,
                               Ahead& ahead) {
  const auto run = [&](auto inter) {  // r = 128 and 64 compiled as constants
    constexpr bool kI = decltype(inter)::value;
    if (mk.r == 128) MixedLogitRowsR<NR, kHeads, kI, 128>(mk, h, Q, ldq, K, kld, j0, n, D, S, lds, ahead);
    else if (mk.r == 64) MixedLogitRowsR<NR, kHeads, kI, 64>(mk, h, Q, ldq, K, kld, j0, n, D, S, lds, ahead);
    else MixedLogitRowsR<NR, kHeads, kI, 0>(mk, h, Q, ldq, K, kld, j0, n, D, S, lds, ahead);
  };
  if (mk.interleaved) run(std::true_type{});
  else run(std::false_type{});
}

// cope, for a task with keys right of its own: each row's count of those keys, Σ σ(a) over [j1, hi)
// (S, g: nb floats of scratch each),
// walked left to right a block at a time until every row's sum has reached npos − 1 (its exact value
// no longer matters: the row is clamped on all of the task's keys) or the keys end. Gates averaging ½
// reach it within about 2·npos keys; sparse ones may read every key to the right. The sum runs in another order
// than the reference's right-to-left one: the counts differ by double rounding.
template <class T>
void CopeCarry(const decode_impl::Task& t, float* S, float* g, double* count) {
  const I D = t.D, R = t.G * t.M, H = t.Hkv, nb = decode_impl::block_keys(H, D);
  const double top = static_cast<double>(t.npos - 1);
  const T* K = static_cast<const T*>(t.k);
  I end = t.j1;
  for (I r = 0; r < H * R; ++r) end = std::max(end, t.hi[r]);
  Ahead none(t, sizeof(T));  // never started: prefetches nothing
  for (I c0 = t.j1; c0 < end; c0 += nb) {
    const I c1 = std::min(end, c0 + nb);
    bool open = false;  // a row still below top with keys beyond this block
    for (I x = 0; x < H * R; ++x) {
      double& c = count[x];
      const I ra = std::max(c0, t.lo[x]), re = std::min(c1, t.hi[x]);
      if (!(c < top)) continue;
      if (ra < re) {
        LogitRows<1>(t.q + x * D, D, K + (x / R) * t.khs + ra * t.kld, t.kld, re - ra, D, S, nb, none);
        Gates(S, g, re - ra);
        for (I j = 0; j < re - ra; ++j) c += static_cast<double>(g[j]);
      }
      open = open || (c < top && t.hi[x] > c1);
    }
    if (!open) break;
  }
}

// xl: the keys of one product of the position terms, a prefetch step after each.
constexpr I kXlPart = 16;

// rope2d mixed: whether the next block's prefetch is spread over the block's MixedLogits4 calls
// (else issued at the block's end); once per process.
inline bool MixedSpread() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  static const bool spread = !__builtin_cpu_is("amd");
#else
  static const bool spread = true;
#endif
  return spread;
}
// The row groups of a kv head that read each key: one Logits4 (rope2d mixed: MixedLogits4) call per
// group and four keys, and one AddPV, as RunTask blocks the rows (the groups kRows rows at a time).
inline I RowGroups(const decode_impl::Task& t) {
  using decode_kernels::kRows;
  if (!t.mixed || t.M < kRows) return t.M * (t.G / kRows + t.G % kRows);
  return t.G * (t.M / kRows + t.M % kRows);
}

// One task (decode_impl::Task) with K/V storage T, every kv head: m, l [Hkv, R] and o [Hkv, R, D]
// (unnormalised). scratch: scratch_floats(Hkv, D, R, X, mixed) floats. Returns false at a NaN or +inf logit
// (or where xl's sinusoid table could not be formed).
// Per block of keys and per kv head: the logits of its R rows, straight from the K rows (xl: plus the
// position terms, every kv head's rows at once in a tile product C·Ỹ'ᵀ per kXlPart keys, C the
// task's table of s(m), Ỹ' the rows turned by the angles of the keys' window of xl_table_keys
// (XlWindows), then transposed); bias and
// online softmax per row (cope: the position term first, CopeRow, with key blocks walked from the
// last; rope2d mixed: MixedLogitRows per run of keys sharing y and x's high part); o += P·V straight
// from the V rows. The rows (g, i), (g + 1, i), … of one query i share their keys (but nonsymmetric
// ALiBi's halves): kRows at a time share each K and V load.
template <class T>
bool RunTask(const decode_impl::Task& t, float* scratch, float* m0, float* l0, float* o0) {
  using decode_kernels::kRows;
  const I D = t.D, R = t.G * t.M, H = t.Hkv, nb = decode_impl::block_keys(H, D, t.mixed != nullptr);
  float* S = scratch;        // [R, nb]
  float* act = S + R * nb;   // [R]: 1 for a row with weight in the block
  float* gb = act + R;       // cope: [nb], a row's gates
  float* qy = gb + nb;       // rope2d mixed: [R, D], the rows turned back for a run of keys, and
  float* qyy = qy + (t.mixed ? R * D : 0);  // [Hkv·R, D], turned back by the y of kv head kh's last run (yk[kh])
  std::vector<I> yk(t.mixed ? static_cast<std::size_t>(H) : 0, INT64_MIN);
  const I X = t.X, nt = decode_impl::xl_table_keys(nb);
  float* ctab = qyy + (t.mixed ? H * R * D : 0);      // xl: [nt, X], the sinusoids s(m), m < nt
  float* yw = ctab + X * nt;  // xl: [X, H·R], Ỹᵀ turned for the window [t0, t1) (XlWindows)
  float* Sx = yw + X * H * R;  // xl: [H·R, nt], the position terms of keys [t0, t1)
  float* Sxt = X ? Sx + H * R * nt : nullptr;  // xl: [kXlPart, H·R] of [nt, H·R], as the product gives them
  I t0 = 0, t1 = 0;
  std::optional<decode_impl::XlWindows> win;
  if (X) {  // key j's sinusoid is s(j), its position relative to k_off (Ỹ's α likewise)
    win.emplace(X, nt, t.j0, xl::kBase);
    const Positions pos{View{}, 0};
    if (!sinusoidal_table(SinusoidalParams{xl::kBase}, pos, View::contiguous(ctab, DType::kF32, {std::min(nt, t.j1 - t.j0), X})).ok())
      return false;
  }
  const T* K = static_cast<const T*>(t.k);
  const T* V = static_cast<const T*>(t.v);
  std::fill(m0, m0 + H * R, -HUGE_VALF);
  std::fill(l0, l0 + H * R, 0.f);
  std::fill(o0, o0 + H * R * D, 0.f);
  const bool rev = t.npos > 0;  // cope: a row's count runs from its last key
  std::vector<double> count(rev ? static_cast<std::size_t>(H * R) : 0, 0.0);  // cope: Σ g of the keys walked, per row
  if (rev) CopeCarry<T>(t, S, gb, count.data());
  Ahead ahead(t, sizeof(T));
  const I blocks = (t.j1 - t.j0 + nb - 1) / nb;
  for (I bi = 0; bi < blocks; ++bi) {
    const I c0 = t.j0 + (rev ? blocks - 1 - bi : bi) * nb, c1 = std::min(t.j1, c0 + nb);
    I a = c1, e = c0;  // the keys some row of some head sees
    for (I r = 0; r < H * R; ++r)
      if (t.lo[r] < c1 && t.hi[r] > c0 && t.lo[r] < t.hi[r])
        a = std::min(a, std::max(t.lo[r], c0)), e = std::max(e, std::min(t.hi[r], c1));
    if (a >= e) continue;
    if (X && e > t1) {  // the window of this block's keys: every kv head's rows turned by its angles
      const I k = (c0 - t.j0) / nt;
      t0 = t.j0 + k * nt, t1 = std::min(t.j1, t0 + nt);
      win->seek(k);
      win->turn(t.yt, H * R, yw);
    }
    // The next block's prefetch, a step per Logits4 call and per four keys of each AddPV pass (rope2d
    // mixed on AMD CPUs: all at the block's end, ahead.Rest(), measured faster there than spread over
    // the block; spread faster on Intel: docs/performance.md).
    const I groups = H * ((e - a + 3) / 4) * RowGroups(t), pv = groups * decode_kernels::PVPasses(D);
    const I calls = !t.mixed || MixedSpread() ? groups + pv : 0;
    const I xl_parts = X ? (e - a + kXlPart - 1) / kXlPart : 0;
    if (rev) ahead.Start(std::max(t.j0, c0 - nb), c0, calls + xl_parts);
    else ahead.Start(c1, std::min(t.j1, c1 + nb), calls + xl_parts);
    for (I x0 = a; x0 < a + xl_parts * kXlPart; x0 += kXlPart) {  // xl: the keys' position terms, every
      const I n = std::min(e, x0 + kXlPart) - x0;                  // kv head's rows, kXlPart keys at a time
      attn_fast::tile_gemm(t.gemm, attn_fast::GemmForm::kNP, n, H * R, X, 1.f, ctab + (x0 - t0) * X, X, yw, H * R,
                           Sxt, H * R);
      t.tr(Sxt, H * R, n, H * R, Sx + (x0 - t0), nt);
      ahead.Next();
    }
    for (I kh = 0; kh < H; ++kh) {
      const I* lo = t.lo + kh * R;
      const I* hi = t.hi + kh * R;
      const float* Q = t.q + kh * R * D;
      float* m = m0 + kh * R;
      float* l = l0 + kh * R;
      float* o = o0 + kh * R * D;
      const T* Kh = K + kh * t.khs;
      const T* Vh = V + kh * t.vhs;
      const auto group = [&](I r) {  // rows r, r + M, … r + (kRows − 1)·M share their keys
        for (I x = 1; x < kRows; ++x)
          if (lo[r + x * t.M] != lo[r] || hi[r + x * t.M] != hi[r]) return false;
        return true;
      };
      if (t.mixed) {  // per run of keys sharing y and x's high part: every row turned back by them
        const decode_impl::MixedKeys& mk = *t.mixed;
        const auto high = [&](I j) { return (mk.pos[0][j] - mk.lo[0]) >> mk.kLowBits; };
        for (I j = a, jn = a; j < e; j = jn) {
          const I y = mk.pos[1][j], u = high(j);
          while (jn < e && mk.pos[1][jn] == y && high(jn) == u) ++jn;
          float* qh = qyy + kh * R * D;
          if (y != yk[static_cast<std::size_t>(kh)])
            for (I r = 0; r < R; ++r) decode_rope2d::TurnBackY(mk, kh * t.G + r / t.M, y, Q + r * D, D, qh + r * D);
          yk[static_cast<std::size_t>(kh)] = y;
          for (I r = 0; r < R; ++r) decode_rope2d::TurnBackX(mk, kh * t.G + r / t.M, u, qh + r * D, D, qy + r * D);
          float* Sj = S + (j - a);
          if (t.M < kRows) {  // kRows heads' rows of query i at a time, each reading the keys once
            for (I i = 0; i < t.M; ++i) {
              I g = 0;
              for (; g + kRows <= t.G; g += kRows)
                MixedLogitRows<kRows, true>(mk, kh * t.G + g, qy + (g * t.M + i) * D, t.M * D, Kh, t.kld, j, jn - j, D,
                                            Sj + (g * t.M + i) * nb, t.M * nb, ahead);
              for (; g < t.G; ++g)
                MixedLogitRows<1, false>(mk, kh * t.G + g, qy + (g * t.M + i) * D, D, Kh, t.kld, j, jn - j, D,
                                         Sj + (g * t.M + i) * nb, nb, ahead);
            }
          } else {  // kRows rows of one head at a time, each key turned once for them
            for (I g = 0; g < t.G; ++g) {
              const I r0 = g * t.M, h = kh * t.G + g;
              I i = 0;
              for (; i + kRows <= t.M; i += kRows)
                MixedLogitRows<kRows, false>(mk, h, qy + (r0 + i) * D, D, Kh, t.kld, j, jn - j, D, Sj + (r0 + i) * nb, nb,
                                             ahead);
              for (; i < t.M; ++i)
                MixedLogitRows<1, false>(mk, h, qy + (r0 + i) * D, D, Kh, t.kld, j, jn - j, D, Sj + (r0 + i) * nb, nb, ahead);
            }
          }
        }
      }
      for (I i = 0; i < t.M && !t.mixed; ++i)
        for (I g0 = 0; g0 < t.G; g0 += kRows) {
          const I r0 = g0 * t.M + i;
          const bool whole = g0 + kRows <= t.G && group(r0);
          for (I g = g0; g < std::min(t.G, g0 + kRows); g += whole ? kRows : 1) {
            const I r = g * t.M + i, ra = std::max(a, lo[r]), re = std::min(e, hi[r]);
            if (ra >= re) continue;
            float* Sr = S + r * nb + (ra - a);
            if (whole) RowLogits<kRows>(t, kh, r, t.M, Kh + ra * t.kld, re - ra, Sr, t.M * nb, ahead);
            else RowLogits<1>(t, kh, r, 1, Kh + ra * t.kld, re - ra, Sr, nb, ahead);
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
        if (X) AddRow(Sx + (kh * R + r) * nt + (ra - t0), Sr, n);
        if (rev) CopeRow(t.qe + (kh * R + r) * t.ncol, t.npos, t.ncol, Sr, n, count.data() + kh * R + r, gb);
        if (bk != BiasKind::kNone && bk != BiasKind::kFire) AddBias(*t.bias, h, i, qp, t.k_off + ra, Sr, n);
        float rm;
        if (!RowMaxBelowInf(Sr, n, &rm)) return false;
        const float mn = std::max(m[r], rm);
        if (mn == -HUGE_VALF) continue;  // every logit −inf: no weight yet
        const float sum = ExpSubSum(Sr, n, mn);
        if (m[r] == -HUGE_VALF) {
          l[r] = sum;
        } else if (mn == m[r]) {  // the max kept (the usual case after the first blocks): no rescaling
          l[r] += sum;
        } else {
          const float corr = std::exp(m[r] - mn);
          if (corr != 1.f) ScaleRow(o + r * D, D, corr);
          l[r] = l[r] * corr + sum;
        }
        m[r] = mn;
        act[r] = 1.f;
      }
      for (I i = 0; i < t.M; ++i)
        for (I g0 = 0; g0 < t.G; g0 += kRows) {
          const I r0 = g0 * t.M + i;
          bool whole = g0 + kRows <= t.G && group(r0);
          for (I x = 0; whole && x < kRows; ++x) whole = act[r0 + x * t.M] != 0;
          for (I g = g0; g < std::min(t.G, g0 + kRows); g += whole ? kRows : 1) {
            const I r = g * t.M + i;
            if (act[r] == 0) continue;
            const I ra = std::max(a, lo[r]), re = std::min(e, hi[r]);
            const float* P = S + r * nb + (ra - a);
            if (whole) RowsPV<kRows>(t, P, t.M * nb, Vh + ra * t.vld, re - ra, o + r * D, t.M * D, ahead);
            else RowsPV<1>(t, P, nb, Vh + ra * t.vld, re - ra, o + r * D, D, ahead);
          }
        }
    }
    ahead.Rest();
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
