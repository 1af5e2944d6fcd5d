// rope2d mixed in the decode task, per Highway target (re-included through foreach_target.h by
// attention_decode_task.cc): with x = lo + kLow·u + t,
// q·R(θˣx + θʸy)k = (R(−θʸy − θˣ(lo + kLow·u))q)·(R(θˣt)k). The query is turned back by θʸy when y
// changes and by the rest once per run of keys sharing y and u (TurnBackY, TurnBackX); each key is
// turned by θˣt in registers, four keys at a time, and dotted with the turned rows (MixedLogits4;
// with one query row per head, the G heads' rows at once, so that each key is read once). The
// turned keys are never stored, and their table is small (kLow rows a head). cos and sin come from
// the tables' rows (MixedKeys).
#if defined(POSENC_ATTENTION_DECODE_ROPE2D_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSENC_ATTENTION_DECODE_ROPE2D_INL_H_
#undef POSENC_ATTENTION_DECODE_ROPE2D_INL_H_
#else
#define POSENC_ATTENTION_DECODE_ROPE2D_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

#include "attention/attention_decode_kernels-inl.h"
#include "attention/attention_decode_task.h"
#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace decode_rope2d {
namespace hn = hwy::HWY_NAMESPACE;
using decode_impl::I;
using decode_impl::MixedKeys;

// Rotary pairs are worked on in the half layout: (a, b) = (x[p], x[p + r/2]) for pair p. The turned
// query rows are stored so; an interleaved key's pairs (x[2p], x[2p + 1]) are split into the two
// halves as they are loaded (LoadPairs).

#if HWY_TARGET != HWY_SCALAR
// Pairs [p, p + L) of x (storage T) into a and b.
template <bool kInterleaved, class D, class T>
HWY_INLINE void LoadPairs(D d, const T* HWY_RESTRICT x, I p, I half, hn::Vec<D>* a, hn::Vec<D>* b) {
  if constexpr (kInterleaved) {
    const auto lo = LoadF(d, x + 2 * p), hi = LoadF(d, x + 2 * p + hn::Lanes(d));
    *a = hn::ConcatEven(d, hi, lo);
    *b = hn::ConcatOdd(d, hi, lo);
  } else {
    *a = LoadF(d, x + p);
    *b = LoadF(d, x + half + p);
  }
}
#endif

// out [r] (half layout) = R(−α)·q per rotary pair (q in the half layout, or interleaved), cos α and
// sin α from the table row cs.
template <bool kInterleaved>
HWY_INLINE void TurnBack(const float* HWY_RESTRICT cs, I r, const float* HWY_RESTRICT q, float* HWY_RESTRICT out) {
  const I half = r / 2;
  const float* sn = cs + half;
  I done = 0;  // pairs done
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  for (; done + L <= half; done += L) {  // (a, b) := (a·c + b·s, b·c − a·s)
    hn::Vec<decltype(d)> a, b;
    LoadPairs<kInterleaved>(d, q, done, half, &a, &b);
    const auto c = hn::LoadU(d, cs + done), s = hn::LoadU(d, sn + done);
    hn::StoreU(hn::MulAdd(b, s, hn::Mul(a, c)), d, out + done);
    hn::StoreU(hn::NegMulAdd(a, s, hn::Mul(b, c)), d, out + half + done);
  }
#endif
  for (I p = done; p < half; ++p) {
    const float c = cs[p], s = sn[p], a = q[kInterleaved ? 2 * p : p], b = q[kInterleaved ? 2 * p + 1 : half + p];
    out[p] = a * c + b * s;
    out[half + p] = b * c - a * s;
  }
}

// out [D] = q turned back by head h's θʸ·y, its rotary lanes in the half layout (the lanes past r
// copied).
HWY_INLINE void TurnBackY(const MixedKeys& mk, I h, I y, const float* HWY_RESTRICT q, I D, float* HWY_RESTRICT out) {
  const I r = mk.r;
  const float* row = mk.c[1] + (h * mk.w[1] + y - mk.lo[1]) * r;
  if (mk.interleaved) TurnBack<true>(row, r, q, out);
  else TurnBack<false>(row, r, q, out);
  std::copy(q + r, q + D, out + r);
}

// out [D] = qy (TurnBackY's) turned back by head h's θˣ·(lo[0] + kLow·u), so that
// out·R(θˣt)k = q·R(θˣx + θʸy)k for every key at y and x = lo[0] + kLow·u + t.
HWY_INLINE void TurnBackX(const MixedKeys& mk, I h, I u, const float* HWY_RESTRICT qy, I D, float* HWY_RESTRICT out) {
  const I r = mk.r;
  TurnBack<false>(mk.c[0] + (h * mk.w[0] + u) * r, r, qy, out);
  std::copy(qy + r, qy + D, out + r);
}

// S[i·lds + k] = Q_i·R(θˣ·t_k)K_k for the NR rows Q_i = Q + i·ldq (turned back by the rest of their
// keys' angles: TurnBackY, TurnBackX) and the nk ≤ 4 keys K_k = K + k·kld at index j0 + k of mk.pos, t_k the
// low part of x_k; lanes past r unturned. kHeads: row i is head h + i's (each key turned for each
// row; the keys read once for the NR heads); else every row is head h's (each key turned once for
// the NR rows). kR: r when it is known here (0: mk.r), so that the table rows' offsets are
// constants (the row pointers would not fit the integer registers).
template <int NR, bool kHeads, bool kInterleaved, int kR, class T>
HWY_INLINE void MixedLogits4(const MixedKeys& mk, I h, const float* HWY_RESTRICT Q, I ldq,
                             const T* HWY_RESTRICT K, I kld, I j0, I nk, I D, float* HWY_RESTRICT S, I lds) {
  const I r = kR ? I{kR} : mk.r, half = r / 2;
  const I hs = MixedKeys::kLow * r;  // from a head's rows of the low table to the next head's
  const T* k[4];  // the keys past nk repeat the last one (their sums are not stored)
  const float* cs[4];  // head h's row of each key: the pairs' cos, then their sin (head h + n's: + n·hs)
  for (I x = 0; x < 4; ++x) {
    const I j = std::min(x, nk - 1);
    k[x] = K + j * kld;
    cs[x] = mk.low + (h * MixedKeys::kLow + ((mk.pos[0][j0 + j] - mk.lo[0]) & (MixedKeys::kLow - 1))) * r;
  }
  HWY_ALIGN float tail[NR][4] = {};  // the scalar tails' sums
  I done = 0;  // pairs done
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  V acc[NR][4];
  POSENC_UNROLL
  for (int i = 0; i < NR; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = hn::Zero(d);
#if HWY_TARGET != HWY_SCALAR
  const I L = static_cast<I>(hn::Lanes(d));
  for (; done + L <= half; done += L) {  // turned: (a, b) := (a·c − b·s, b·c + a·s)
    V ka[4], kb[4];
    POSENC_UNROLL
    for (int x = 0; x < 4; ++x) LoadPairs<kInterleaved>(d, k[x], done, half, &ka[x], &kb[x]);
    if constexpr (!kHeads) {
      POSENC_UNROLL
      for (int x = 0; x < 4; ++x) {
        const V c = hn::LoadU(d, cs[x] + done), sn = hn::LoadU(d, cs[x] + half + done);
        const V a = ka[x];
        ka[x] = hn::NegMulAdd(kb[x], sn, hn::Mul(a, c));
        kb[x] = hn::MulAdd(a, sn, hn::Mul(kb[x], c));
      }
    }
    POSENC_UNROLL
    for (int i = 0; i < NR; ++i) {
      const V qa = hn::LoadU(d, Q + i * ldq + done), qb = hn::LoadU(d, Q + i * ldq + half + done);
      POSENC_UNROLL
      for (int x = 0; x < 4; ++x) {
        if constexpr (kHeads) {  // q·(turned k) = c·(qa·a + qb·b) + s·(qb·a − qa·b)
          const float* row = cs[x] + i * hs;
          const V c = hn::LoadU(d, row + done), sn = hn::LoadU(d, row + half + done);
          const V u = hn::MulAdd(qb, kb[x], hn::Mul(qa, ka[x])), w = hn::NegMulAdd(qa, kb[x], hn::Mul(qb, ka[x]));
          acc[i][x] = hn::MulAdd(sn, w, hn::MulAdd(c, u, acc[i][x]));
        } else {
          acc[i][x] = hn::MulAdd(qb, kb[x], hn::MulAdd(qa, ka[x], acc[i][x]));
        }
      }
    }
  }
#endif
  for (I p = done; p < half; ++p)
    for (int x = 0; x < 4; ++x) {
      const float a = ToF(k[x][kInterleaved ? 2 * p : p]), b = ToF(k[x][kInterleaved ? 2 * p + 1 : half + p]);
      for (int i = 0; i < NR; ++i) {
        const float* row = cs[x] + (kHeads ? i * hs : 0);
        const float c = row[p], s = row[half + p];
        tail[i][x] += Q[i * ldq + p] * (a * c - b * s) + Q[i * ldq + half + p] * (b * c + a * s);
      }
    }
  I e = r;  // the lanes past r, unturned
#if HWY_TARGET != HWY_SCALAR
  for (; e + L <= D; e += L) {
    V v[4];
    POSENC_UNROLL
    for (int x = 0; x < 4; ++x) v[x] = LoadF(d, k[x] + e);
    POSENC_UNROLL
    for (int i = 0; i < NR; ++i) {
      const V q = hn::LoadU(d, Q + i * ldq + e);
      POSENC_UNROLL
      for (int x = 0; x < 4; ++x) acc[i][x] = hn::MulAdd(q, v[x], acc[i][x]);
    }
  }
#endif
  for (; e < D; ++e)
    for (int x = 0; x < 4; ++x)
      for (int i = 0; i < NR; ++i) tail[i][x] += Q[i * ldq + e] * ToF(k[x][e]);
  POSENC_UNROLL
  for (int i = 0; i < NR; ++i)
    decode_kernels::StoreSums4(d, acc[i][0], acc[i][1], acc[i][2], acc[i][3], tail[i], nk, S + i * lds);
}

}  // namespace decode_rope2d
}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#endif  // POSENC_ATTENTION_DECODE_ROPE2D_INL_H_
