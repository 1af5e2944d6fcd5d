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
// (else issued at the block's end).
inline bool MixedSpread() { return !fast::amd_cpu(); }
// The row groups of a kv head that read each key: one Logits4 (rope2d mixed: MixedLogits4) call per
// group and four keys, and one AddPV, as RunTask blocks the rows (the groups kRows rows at a time).
inline I RowGroups(const decode_impl::Task& t) {
  using decode_kernels::kRows;
  if (!t.mixed || t.M < kRows) return t.M * (t.G / kRows + t.G % kRows);
  return t.G * (t.M / kRows + t.M % kRows);
}

// One task (decode_impl::Task) with K/V storage T, every kv head: m, l [Hkv, R] and o [Hkv, R, D]
// (unnormalised). scratch: scratch_floats(Hkv, D, R, X, mixed) floats. run() returns false at a NaN
// or +inf logit (or where xl's sinusoid table could not be formed).
// Per block of keys and per kv head: the logits of its R rows, straight from the K rows (xl: plus the
// position terms, every kv head's rows at once in a tile product C·Ỹ'ᵀ per kXlPart keys, C the
// task's table of s(m), Ỹ' the rows turned by the angles of the keys' window of xl_table_keys
// (XlWindows), then transposed); bias and
// online softmax per row (cope: the position term first, CopeRow, with key blocks walked from the
// last until every row's count is clamped, then the rest in memory order; rope2d mixed:
// MixedLogitRows per run of keys sharing y and x's high part); o += P·V straight from the V rows. The rows (g, i), (g + 1, i), … of one query i share their keys (but nonsymmetric
// ALiBi's halves): kRows at a time share each K and V load.
template <class T>
class TaskRun {
 public:
  TaskRun(const decode_impl::Task& t, float* scratch, float* m0, float* l0, float* o0)
      : t_(t), D_(t.D), R_(t.G * t.M), H_(t.Hkv), nb_(decode_impl::block_keys(H_, D_, t.mixed != nullptr)),
        X_(t.X), nt_(decode_impl::xl_table_keys(nb_)), m0_(m0), l0_(l0), o0_(o0), rev_(t.npos > 0),
        ahead_(t, sizeof(T)) {
    S_ = scratch;           // [R, nb]
    act_ = S_ + R_ * nb_;   // [R]: 1 for a row with weight in the block
    gb_ = act_ + R_;        // cope: [nb], a row's gates
    qy_ = gb_ + nb_;        // rope2d mixed: [R, D], the rows turned back for a run of keys, and
    qyy_ = qy_ + (t.mixed ? R_ * D_ : 0);  // [Hkv·R, D], turned back by the y of kv head kh's last run (yk_[kh])
    yk_.assign(t.mixed ? static_cast<std::size_t>(H_) : 0, INT64_MIN);
    ctab_ = qyy_ + (t.mixed ? H_ * R_ * D_ : 0);  // xl: [nt, X], the sinusoids s(m), m < nt
    yw_ = ctab_ + X_ * nt_;                       // xl: [X, H·R], Ỹᵀ turned for the window [t0, t1) (XlWindows)
    Sx_ = yw_ + X_ * H_ * R_;                     // xl: [H·R, nt], the position terms of keys [t0, t1)
    Sxt_ = X_ ? Sx_ + H_ * R_ * nt_ : nullptr;    // xl: [kXlPart, H·R] of [nt, H·R], as the product gives them
    count_.assign(rev_ ? static_cast<std::size_t>(H_ * R_) : 0, 0.0);  // cope: Σ g of the keys walked, per row
  }

  bool run() {
    if (X_) {  // key j's sinusoid is s(j), its position relative to k_off (Ỹ's α likewise)
      win_.emplace(X_, nt_, t_.j0, xl::kBase);
      const Positions pos{View{}, 0};
      const View tab = View::contiguous(ctab_, DType::kF32, {std::min(nt_, t_.j1 - t_.j0), X_});
      if (!sinusoidal_table(SinusoidalParams{xl::kBase}, pos, tab).ok()) return false;
    }
    std::fill(m0_, m0_ + H_ * R_, -HUGE_VALF);
    std::fill(l0_, l0_ + H_ * R_, 0.f);
    std::fill(o0_, o0_ + H_ * R_ * D_, 0.f);
    if (rev_) CopeCarry<T>(t_, S_, gb_, count_.data());
    // blocks [b0, b1) still to walk: cope from the last while some row's count runs, then (every
    // row clamped: a key's position term no longer depends on the keys right of it) in memory
    // order, which the prefetchers follow better
    I b0 = 0, b1 = (t_.j1 - t_.j0 + nb_ - 1) / nb_;
    bool back = rev_;
    while (b0 < b1) {
      back = back && CountsRun(b0, b1);
      const I bi = back ? --b1 : b0++;
      const I c0 = t_.j0 + bi * nb_, c1 = std::min(t_.j1, c0 + nb_);
      const I n0 = back ? t_.j0 + (b1 - 1) * nb_ : c1;  // the next block (prefetched)
      const I n1 = b0 < b1 ? std::min(t_.j1, n0 + nb_) : n0;
      I a = c1, e = c0;  // the keys some row of some head sees
      for (I r = 0; r < H_ * R_; ++r)
        if (t_.lo[r] < c1 && t_.hi[r] > c0 && t_.lo[r] < t_.hi[r])
          a = std::min(a, std::max(t_.lo[r], c0)), e = std::max(e, std::min(t_.hi[r], c1));
      if (a >= e) continue;
      if (X_ && e > t1_) {  // the window of this block's keys: every kv head's rows turned by its angles
        const I k = (c0 - t_.j0) / nt_;
        t0_ = t_.j0 + k * nt_, t1_ = std::min(t_.j1, t0_ + nt_);
        win_->seek(k);
        win_->turn(t_.yt, H_ * R_, yw_);
      }
      const I xl_parts = Prefetch(n0, n1, a, e);
      for (I x0 = a; x0 < a + xl_parts * kXlPart; x0 += kXlPart) XlTerms(x0, std::min(e, x0 + kXlPart) - x0);
      for (I kh = 0; kh < H_; ++kh) {
        if (t_.mixed) MixedLogits(kh, a, e);
        else Logits(kh, a, e);
        if (!Softmax(kh, a, e)) return false;
        PV(kh, a, e);
      }
      ahead_.Rest();
    }
    return true;
  }

 private:
  // The next block's prefetch, a step per Logits4 call and per PVStepKeys keys of each AddPV pass
  // (rope2d mixed on AMD CPUs: all at the block's end, ahead.Rest(), measured faster there than
  // spread over the block; spread faster on Intel: docs/performance.md), and one per xl part. Returns the block's
  // xl parts (keys [a, e) of block [c0, c1) seen).
  I Prefetch(I n0, I n1, I a, I e) {
    const I groups = H_ * ((e - a + 3) / 4) * RowGroups(t_);
    const I pv = groups * decode_kernels::PVPasses(D_) * 4 / decode_kernels::PVStepKeys(sizeof(T));
    const I calls = !t_.mixed || MixedSpread() ? groups + pv : 0;
    const I xl_parts = X_ ? (e - a + kXlPart - 1) / kXlPart : 0;
    ahead_.Start(n0, n1, calls + xl_parts);
    return xl_parts;
  }

  // cope: whether some row's count is below npos − 1 with keys left to walk in blocks [b0, b1).
  bool CountsRun(I b0, I b1) const {
    const double top = static_cast<double>(t_.npos - 1);
    const I k0 = t_.j0 + b0 * nb_, k1 = std::min(t_.j1, t_.j0 + b1 * nb_);
    for (I r = 0; r < H_ * R_; ++r)
      if (count_[static_cast<std::size_t>(r)] < top && std::max(k0, t_.lo[r]) < std::min(k1, t_.hi[r])) return true;
    return false;
  }

  // xl: the position terms of keys [x0, x0 + n), every kv head's rows, into Sx_.
  void XlTerms(I x0, I n) {
    const I HR = H_ * R_;
    attn_fast::tile_gemm(t_.gemm, attn_fast::GemmForm::kNP, n, HR, X_, 1.f, ctab_ + (x0 - t0_) * X_, X_, yw_, HR, Sxt_,
                         HR);
    t_.tr(Sxt_, HR, n, HR, Sx_ + (x0 - t0_), nt_);
    ahead_.Next();
  }

  // Whether kv head kh's rows r, r + M, … r + (kRows − 1)·M share their keys.
  bool Group(I kh, I r) const {
    const I* lo = t_.lo + kh * R_;
    const I* hi = t_.hi + kh * R_;
    for (I x = 1; x < kRows; ++x)
      if (lo[r + x * t_.M] != lo[r] || hi[r + x * t_.M] != hi[r]) return false;
    return true;
  }

  // rope2d mixed: kv head kh's logits of keys [a, e) into S_, per run of keys sharing y and x's high
  // part, every row turned back by them.
  void MixedLogits(I kh, I a, I e) {
    const decode_impl::MixedKeys& mk = *t_.mixed;
    const I D = D_, R = R_, nb = nb_, G = t_.G, M = t_.M;
    const float* Q = t_.q + kh * R * D;
    const T* Kh = static_cast<const T*>(t_.k) + kh * t_.khs;
    const auto high = [&](I j) { return (mk.pos[0][j] - mk.lo[0]) >> mk.kLowBits; };
    for (I j = a, jn = a; j < e; j = jn) {
      const I y = mk.pos[1][j], u = high(j);
      while (jn < e && mk.pos[1][jn] == y && high(jn) == u) ++jn;
      float* qh = qyy_ + kh * R * D;
      if (y != yk_[static_cast<std::size_t>(kh)])
        for (I r = 0; r < R; ++r) decode_rope2d::TurnBackY(mk, kh * G + r / M, y, Q + r * D, D, qh + r * D);
      yk_[static_cast<std::size_t>(kh)] = y;
      for (I r = 0; r < R; ++r) decode_rope2d::TurnBackX(mk, kh * G + r / M, u, qh + r * D, D, qy_ + r * D);
      float* Sj = S_ + (j - a);
      if (M < kRows) {  // kRows heads' rows of query i at a time, each reading the keys once
        for (I i = 0; i < M; ++i) {
          I g = 0;
          for (; g + kRows <= G; g += kRows)
            MixedLogitRows<kRows, true>(mk, kh * G + g, qy_ + (g * M + i) * D, M * D, Kh, t_.kld, j, jn - j, D,
                                        Sj + (g * M + i) * nb, M * nb, ahead_);
          for (; g < G; ++g)
            MixedLogitRows<1, false>(mk, kh * G + g, qy_ + (g * M + i) * D, D, Kh, t_.kld, j, jn - j, D,
                                     Sj + (g * M + i) * nb, nb, ahead_);
        }
      } else {  // kRows rows of one head at a time, each key turned once for them
        for (I g = 0; g < G; ++g) {
          const I r0 = g * M, h = kh * G + g;
          I i = 0;
          for (; i + kRows <= M; i += kRows)
            MixedLogitRows<kRows, false>(mk, h, qy_ + (r0 + i) * D, D, Kh, t_.kld, j, jn - j, D, Sj + (r0 + i) * nb, nb,
                                         ahead_);
          for (; i < M; ++i)
            MixedLogitRows<1, false>(mk, h, qy_ + (r0 + i) * D, D, Kh, t_.kld, j, jn - j, D, Sj + (r0 + i) * nb, nb,
                                     ahead_);
        }
      }
    }
  }

  // kv head kh's logits of keys [a, e) into S_ (each row its visible keys), kRows rows at a time
  // where they share their keys.
  void Logits(I kh, I a, I e) {
    const I* lo = t_.lo + kh * R_;
    const I* hi = t_.hi + kh * R_;
    const T* Kh = static_cast<const T*>(t_.k) + kh * t_.khs;
    for (I i = 0; i < t_.M; ++i)
      for (I g0 = 0; g0 < t_.G; g0 += kRows) {
        const I r0 = g0 * t_.M + i;
        const bool whole = g0 + kRows <= t_.G && Group(kh, r0);
        for (I g = g0; g < std::min(t_.G, g0 + kRows); g += whole ? kRows : 1) {
          const I r = g * t_.M + i, ra = std::max(a, lo[r]), re = std::min(e, hi[r]);
          if (ra >= re) continue;
          float* Sr = S_ + r * nb_ + (ra - a);
          if (whole) RowLogits<kRows>(t_, kh, r, t_.M, Kh + ra * t_.kld, re - ra, Sr, t_.M * nb_, ahead_);
          else RowLogits<1>(t_, kh, r, 1, Kh + ra * t_.kld, re - ra, Sr, nb_, ahead_);
        }
      }
  }

  // kv head kh's rows over keys [a, e): the position terms and biases added to the logits, then the
  // online softmax (m, l, o rescaled; S_ turned into the weights). false at a NaN or +inf logit.
  bool Softmax(I kh, I a, I e) {
    const I* lo = t_.lo + kh * R_;
    const I* hi = t_.hi + kh * R_;
    const I D = D_, R = R_, nb = nb_;
    float* m = m0_ + kh * R;
    float* l = l0_ + kh * R;
    float* o = o0_ + kh * R * D;
    std::fill(act_, act_ + R, 0.f);
    const BiasKind bk = t_.bias->kind;
    if (bk == BiasKind::kFire)  // rows g·M + i share their keys (FIRE masks only causally) and x
      for (I i = 0; i < t_.M; ++i) {
        const I ra = std::max(a, lo[i]), re = std::min(e, hi[i]);
        if (ra < re)
          AddFireGroup(*t_.bias, kh * t_.G, t_.G, i, t_.q_off + i, t_.k_off + ra, S_ + i * nb + (ra - a), t_.M * nb,
                       re - ra);
      }
    for (I r = 0; r < R; ++r) {
      const I ra = std::max(a, lo[r]), re = std::min(e, hi[r]);
      if (ra >= re) continue;
      const I g = r / t_.M, i = r % t_.M, h = kh * t_.G + g, qp = t_.q_off + i;
      float* Sr = S_ + r * nb + (ra - a);
      const I n = re - ra;
      if (X_) AddRow(Sx_ + (kh * R + r) * nt_ + (ra - t0_), Sr, n);
      if (rev_) CopeRow(t_.qe + (kh * R + r) * t_.ncol, t_.npos, t_.ncol, Sr, n, count_.data() + kh * R + r, gb_);
      if (bk != BiasKind::kNone && bk != BiasKind::kFire) AddBias(*t_.bias, h, i, qp, t_.k_off + ra, Sr, n);
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
      act_[r] = 1.f;
    }
    return true;
  }

  // o += P·V for kv head kh's rows with weight in keys [a, e), kRows rows at a time where they share
  // their keys.
  void PV(I kh, I a, I e) {
    const I* lo = t_.lo + kh * R_;
    const I* hi = t_.hi + kh * R_;
    const I D = D_, nb = nb_, M = t_.M;
    float* o = o0_ + kh * R_ * D;
    const T* Vh = static_cast<const T*>(t_.v) + kh * t_.vhs;
    for (I i = 0; i < M; ++i)
      for (I g0 = 0; g0 < t_.G; g0 += kRows) {
        const I r0 = g0 * M + i;
        bool whole = g0 + kRows <= t_.G && Group(kh, r0);
        for (I x = 0; whole && x < kRows; ++x) whole = act_[r0 + x * M] != 0;
        for (I g = g0; g < std::min(t_.G, g0 + kRows); g += whole ? kRows : 1) {
          const I r = g * M + i;
          if (act_[r] == 0) continue;
          const I ra = std::max(a, lo[r]), re = std::min(e, hi[r]);
          const float* P = S_ + r * nb + (ra - a);
          if (whole) RowsPV<kRows>(t_, P, M * nb, Vh + ra * t_.vld, re - ra, o + r * D, M * D, ahead_);
          else RowsPV<1>(t_, P, nb, Vh + ra * t_.vld, re - ra, o + r * D, D, ahead_);
        }
      }
  }

  static constexpr I kRows = decode_kernels::kRows;
  const decode_impl::Task& t_;
  const I D_, R_, H_, nb_, X_, nt_;
  float* m0_;
  float* l0_;
  float* o0_;
  const bool rev_;  // cope: a row's count runs from its last key
  Ahead ahead_;
  float *S_, *act_, *gb_, *qy_, *qyy_, *ctab_, *yw_, *Sx_, *Sxt_;  // the scratch (constructor)
  std::vector<I> yk_;
  std::vector<double> count_;
  I t0_ = 0, t1_ = 0;  // xl: the window of keys whose terms Sx_ holds
  std::optional<decode_impl::XlWindows> win_;
};

template <class T>
bool RunTask(const decode_impl::Task& t, float* scratch, float* m0, float* l0, float* o0) {
  return TaskRun<T>(t, scratch, m0, l0, o0).run();
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
