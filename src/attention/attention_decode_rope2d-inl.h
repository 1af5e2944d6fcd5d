// rope2d mixed in the decode task, per Highway target (re-included through foreach_target.h by
// attention_decode_task.cc): with x = lo + kLow·u + t, q·R(θˣx + θʸy)k = (R(−θʸy − θˣ(lo + kLow·u))q)·
// (R(θˣt)k): the query turned back once per run of keys sharing y and u (RotateQuery), each key
// turned by θˣt in registers, four keys at a time, and dotted with the turned rows (MixedLogits4).
// The turned keys are never stored, and their table (kLow rows a head) stays in the L1 cache.
// cos and sin come from the tables' rows (MixedKeys).
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

#if HWY_TARGET != HWY_SCALAR
// Lane e reads lane e/2: each pair's cos or sin twice (the interleaved layout).
template <class D>
HWY_INLINE auto TwiceIndices(D d) {
  HWY_ALIGN std::int32_t dup[hn::MaxLanes(d)];
  for (std::size_t e = 0; e < hn::MaxLanes(d); ++e) dup[e] = static_cast<std::int32_t>(e / 2);
  return hn::SetTableIndices(d, dup);
}
#endif

// out [r] = R(−α)·q per rotary pair, cos α and sin α from the table row cs (in and out may alias).
HWY_INLINE void TurnBack(const float* HWY_RESTRICT cs, I r, bool interleaved, const float* q, float* out) {
  const I half = r / 2;
  const float* sn = cs + half;
  I done = 0;  // pairs done
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  if (interleaved) {  // (a, b) := (a·c + b·s, b·c − a·s)
    const auto twice = TwiceIndices(d);
    for (; 2 * done + L <= r; done += L / 2) {
      const auto x = hn::LoadU(d, q + 2 * done);
      const auto c = hn::TableLookupLanes(hn::LoadU(d, cs + done), twice);
      const auto s = hn::TableLookupLanes(hn::LoadU(d, sn + done), twice);
      hn::StoreU(hn::MulAdd(x, c, hn::Mul(hn::Shuffle2301(x), hn::OddEven(hn::Neg(s), s))), d, out + 2 * done);
    }
  } else {
    for (; done + L <= half; done += L) {
      const auto a = hn::LoadU(d, q + done), b = hn::LoadU(d, q + half + done);
      const auto c = hn::LoadU(d, cs + done), s = hn::LoadU(d, sn + done);
      hn::StoreU(hn::MulAdd(b, s, hn::Mul(a, c)), d, out + done);
      hn::StoreU(hn::NegMulAdd(a, s, hn::Mul(b, c)), d, out + half + done);
    }
  }
#endif
  for (I p = done; p < half; ++p) {
    const I ia = interleaved ? 2 * p : p, ib = interleaved ? 2 * p + 1 : p + half;
    const float c = cs[p], s = sn[p], a = q[ia], b = q[ib];
    out[ia] = a * c + b * s;
    out[ib] = b * c - a * s;
  }
}

// out [D] = q turned back by head h's θʸ·y + θˣ·(lo[0] + kLow·u) (the lanes past r copied), so that
// out·R(θˣt)k = q·R(θˣx + θʸy)k for every key at y and x = lo[0] + kLow·u + t.
HWY_INLINE void RotateQuery(const MixedKeys& mk, I h, I y, I u, const float* HWY_RESTRICT q, I D,
                            float* HWY_RESTRICT out) {
  const I r = mk.r;
  TurnBack(mk.c[1] + (h * mk.w[1] + y - mk.lo[1]) * r, r, mk.interleaved, q, out);
  TurnBack(mk.c[0] + (h * mk.w[0] + u) * r, r, mk.interleaved, out, out);
  std::copy(q + r, q + D, out + r);
}

// S[i·lds + k] = Q_i·R(θˣ·t_k)K_k for the NR rows Q_i = Q + i·ldq (already turned by the rest of
// their keys' angles: RotateQuery) and the nk ≤ 4 keys K_k = K + k·kld at index j0 + k of mk.pos,
// t_k the low part of x_k, head h's θ; lanes past r unturned. Each key is turned once in registers
// for the NR rows.
template <int NR, class T>
HWY_INLINE void MixedLogits4(const MixedKeys& mk, I h, const float* HWY_RESTRICT Q, I ldq,
                             const T* HWY_RESTRICT K, I kld, I j0, I nk, I D, float* HWY_RESTRICT S, I lds) {
  const I r = mk.r, half = r / 2;
  const T* k[4];   // the keys past nk repeat the last one (their sums are not stored)
  const float* cs[4];  // their rows of the low table: the pairs' cos, then their sin
  for (I x = 0; x < 4; ++x) {
    const I j = std::min(x, nk - 1);
    k[x] = K + j * kld;
    cs[x] = mk.low + (h * MixedKeys::kLow + ((mk.pos[0][j0 + j] - mk.lo[0]) & (MixedKeys::kLow - 1))) * r;
  }
  HWY_ALIGN float t[NR][4] = {};  // the scalar tails' sums
  I done = 0;  // pairs done
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  V acc[NR][4];
  POSENC_UNROLL
  for (int i = 0; i < NR; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = hn::Zero(d);
#if HWY_TARGET != HWY_SCALAR
  const I L = static_cast<I>(hn::Lanes(d));
  if (mk.interleaved) {  // L/2 pairs a vector: (a, b) := (a·c − b·s, b·c + a·s)
    const auto twice = TwiceIndices(d);
    for (; 2 * done + L <= r; done += L / 2) {
      V kt[4];
      POSENC_UNROLL
      for (int x = 0; x < 4; ++x) {
        const V v = LoadF(d, k[x] + 2 * done);
        const V c = hn::TableLookupLanes(hn::LoadU(d, cs[x] + done), twice);
        const V sn = hn::TableLookupLanes(hn::LoadU(d, cs[x] + half + done), twice);
        kt[x] = hn::MulAdd(v, c, hn::Mul(hn::Shuffle2301(v), hn::OddEven(sn, hn::Neg(sn))));
      }
      POSENC_UNROLL
      for (int i = 0; i < NR; ++i) {
        const V q = hn::LoadU(d, Q + i * ldq + 2 * done);
        POSENC_UNROLL
        for (int x = 0; x < 4; ++x) acc[i][x] = hn::MulAdd(q, kt[x], acc[i][x]);
      }
    }
  } else {
    for (; done + L <= half; done += L) {
      V ka[4], kb[4];
      POSENC_UNROLL
      for (int x = 0; x < 4; ++x) {
        const V a = LoadF(d, k[x] + done), b = LoadF(d, k[x] + half + done);
        const V c = hn::LoadU(d, cs[x] + done), sn = hn::LoadU(d, cs[x] + half + done);
        ka[x] = hn::NegMulAdd(b, sn, hn::Mul(a, c));
        kb[x] = hn::MulAdd(a, sn, hn::Mul(b, c));
      }
      POSENC_UNROLL
      for (int i = 0; i < NR; ++i) {
        const V qa = hn::LoadU(d, Q + i * ldq + done), qb = hn::LoadU(d, Q + i * ldq + half + done);
        POSENC_UNROLL
        for (int x = 0; x < 4; ++x) acc[i][x] = hn::MulAdd(qb, kb[x], hn::MulAdd(qa, ka[x], acc[i][x]));
      }
    }
  }
#endif
  for (I p = done; p < half; ++p) {
    const I ia = mk.interleaved ? 2 * p : p, ib = mk.interleaved ? 2 * p + 1 : p + half;
    for (int x = 0; x < 4; ++x) {
      const float c = cs[x][p], s = cs[x][half + p], a = ToF(k[x][ia]), b = ToF(k[x][ib]);
      const float ta = a * c - b * s, tb = b * c + a * s;
      for (int i = 0; i < NR; ++i) t[i][x] += Q[i * ldq + ia] * ta + Q[i * ldq + ib] * tb;
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
      for (int i = 0; i < NR; ++i) t[i][x] += Q[i * ldq + e] * ToF(k[x][e]);
  POSENC_UNROLL
  for (int i = 0; i < NR; ++i)
    decode_kernels::StoreSums4(d, acc[i][0], acc[i][1], acc[i][2], acc[i][3], t[i], nk, S + i * lds);
}

}  // namespace decode_rope2d
}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#endif  // POSENC_ATTENTION_DECODE_ROPE2D_INL_H_
