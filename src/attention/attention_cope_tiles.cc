// The CoPE kernel's per-tile SIMD steps (attention_cope_tiles.h), per Highway target: foreach_target.h
// compiles this file for every target. What they compute: attention_cope_cpu.cc.
#include <cstdint>
#include <cstring>

#include "attention/attention_cope_tiles.h"
#include "attention/attention_tiles.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/attention_cope_tiles.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "enc/contextual/cope/cope_simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Index rowbase + f of a float f ∈ [0, 2^23) holding an integer, without a conversion: the bits of
// f + 2^23 are those of 2^23 plus f; rbm = rowbase − bits(2^23).
template <class D, class DI, class V, class VI>
HWY_INLINE VI CopeIndex(D d, DI di, V f, VI rbm) {
  return hn::Add(hn::BitCast(di, hn::Add(f, hn::Set(d, 8388608.f))), rbm);
}

// Lanes [c0, c0 + L) that are real, unmasked queries of key row j.
template <class D, class V>
HWY_INLINE hn::Mask<D> CopeValid(D d, V iv, V nqf, bool causal, cope_fast::I j, cope_fast::I base,
                                 cope_fast::I nq) {
  auto valid = hn::Lt(iv, nqf);
  if (causal) {
    const cope_fast::I th = std::clamp<cope_fast::I>(j + base, 0, nq);
    valid = hn::And(valid, hn::Ge(iv, hn::Set(d, static_cast<float>(th))));
  }
  return valid;
}

// Whether a tile of nk keys masks some (key j, query i ≥ 0): causal, i < j + base.
inline bool CopeKeysMasked(bool causal, cope_fast::I base, cope_fast::I nk) { return causal && base + nk - 1 > 0; }

// r + g (r ∈ [0, 1), g ∈ [0, 1]) back into [0, 1), carrying 1 into k.
template <class D, class V>
HWY_INLINE void CopeAddFrac(D d, V g, V& k, V& r) {
  r = hn::Add(r, g);
  const V carry = hn::IfThenElseZero(hn::Ge(r, hn::Set(d, 1.f)), hn::Set(d, 1.f));
  r = hn::Sub(r, carry);
  k = hn::Add(k, carry);
}

// The forward's keys of one lane chunk whose counts are computed (the tile is not saturated), from
// the tile's last key down. A lane's table row ⌊p⌋ changes at most npos times along its row, so
// q·e_⌊p⌋ and q·(e_⌈p⌉ − e_⌊p⌋) are gathered only at keys where some lane's ⌊p⌋ moved: every key
// while gates are dense (but then counts saturate within ~2·npos keys), rarely while they are
// sparse (the case where rows stay unclamped for long). kTrack: record j* and its count (pass 1).
template <bool kTrack, class D, class V>
HWY_INLINE V CopeForwardCounts(D d, const cope_fast::FwdTile& t, cope_fast::I c0, V iv, V mx) {
  using cope_fast::I;
  const hn::RebindToSigned<D> di;
  constexpr I kBq = attn_fast::kBq;
  const V ninf = hn::Set(d, -HUGE_VALF), topv = hn::Set(d, t.top), colv = hn::Set(d, t.colmax);
  const V one = hn::Set(d, 1.f), nqf = hn::Set(d, static_cast<float>(t.nq));
  const V ck = hn::LoadU(d, t.ck + c0), cr = hn::LoadU(d, t.cr + c0);
  const auto rb = hn::Sub(hn::LoadU(di, t.rowbase + c0), hn::Set(di, 0x4B000000));
  V tk = hn::Zero(d), tr = hn::Zero(d);  // the tile's suffix sum of gates
  auto js = hn::LoadU(di, t.js + c0);
  V uk = hn::LoadU(d, t.uk + c0), ur = hn::LoadU(d, t.ur + c0);
  V fcur = hn::Set(d, -2.f), qf = hn::Zero(d), qc = hn::Zero(d), qd = hn::Zero(d);  // -2: no floor yet
  const I nk = t.nk, base = t.base, nq = t.nq, j0 = t.j0;
  const bool causal = t.causal;
  float* const at = t.at;
  const float* const qe = t.qe;
  for (I j = nk - 1; j >= 0; --j) {
    float* row = at + j * kBq + c0;
    const V a = hn::IfThenElse(CopeValid(d, iv, nqf, causal, j, base, nq), hn::LoadU(d, row), ninf);
    CopeAddFrac(d, CopeSigmoid(d, a), tk, tr);
    V K = hn::Add(ck, tk), r = hn::Add(cr, tr);  // S = K + r
    const V over = hn::IfThenElseZero(hn::Ge(r, one), one);
    r = hn::Sub(r, over);
    K = hn::Add(K, over);
    const auto uncl = hn::Lt(K, topv);
    if (kTrack) {
      const auto jv = hn::Set(di, static_cast<std::int32_t>(j0 + j));
      js = hn::IfThenElse(hn::RebindMask(di, uncl), jv, js);
      uk = hn::IfThenElse(uncl, K, uk);
      ur = hn::IfThenElse(uncl, r, ur);
    }
    const V f = hn::Min(hn::IfThenElse(uncl, K, topv), colv);
    const V w = hn::IfThenElseZero(uncl, r);
    const auto moved = hn::Ne(f, fcur);
    if (!hn::AllFalse(d, moved)) {  // ⌊p⌋ moves by one key at a time: the old ceiling is the new floor
      const auto up = hn::And(moved, hn::Eq(f, hn::Add(fcur, one)));
      qf = hn::IfThenElse(up, qc, qf);
      if (!hn::AllTrue(d, hn::Or(up, hn::Not(moved))))  // a jump: the tile's first key, a carried count
        qf = hn::IfThenElse(hn::AndNot(up, moved), hn::GatherIndex(d, qe, CopeIndex(d, di, f, rb)), qf);
      qc = hn::GatherIndex(d, qe, CopeIndex(d, di, hn::Min(hn::Add(f, one), colv), rb));
      qd = hn::Sub(qc, qf);
      fcur = f;
    }
    const V lg = hn::Add(a, hn::MulAdd(w, qd, qf));
    hn::StoreU(lg, d, row);
    mx = hn::Max(mx, lg);
  }
  hn::StoreU(tk, d, t.tk + c0);
  hn::StoreU(tr, d, t.tr + c0);
  if (kTrack) {
    hn::StoreU(js, di, t.js + c0);
    hn::StoreU(uk, d, t.uk + c0);
    hn::StoreU(ur, d, t.ur + c0);
  }
  return mx;
}

// Vectors of lanes a forward step takes together, key row by key row (the tile's rows are 512 bytes
// apart: a lane chunk walked down its column touches a cache line per key and only an eighth of the
// L1's sets): the AVX-512 targets' 32 registers hold 8 vectors' max, sum and q·e_top, the others' 4.
#if HWY_TARGET <= HWY_AVX3
constexpr int kG = 8;
#else
constexpr int kG = 4;
#endif

// The forward's softmax step of the G lane chunks from c0 (their counts, where computed, already
// added to the tile's logits, in mx the running max over them): every logit turned into
// exp(logit − m_new), the running statistics updated. saturated: the tile holds a, the logit is
// a + q·e_top, and max_j (a_j + q·e_top) = (max_j a_j) + q·e_top (the rounding of a sum is
// monotone), so the logits are formed in the exponentials' pass. kMask: some lane or key masked.
template <int G, bool kMask, class D, class V>
HWY_INLINE void CopeForwardStep(D d, const cope_fast::FwdTile& t, cope_fast::I c0, V* mx) {
  using cope_fast::I;
  constexpr I kBq = attn_fast::kBq;
  const I L = static_cast<I>(hn::Lanes(d));
  const V ninf = hn::Set(d, -HUGE_VALF), nqf = hn::Set(d, static_cast<float>(t.nq));
  float* const at = t.at;
  const I nk = t.nk;
  const bool saturated = t.saturated;
  const auto load = [&](I j, int g) {
    const V x = hn::LoadU(d, at + j * kBq + c0 + g * L);
    if constexpr (!kMask) return x;
    const V iv = hn::Iota(d, static_cast<float>(c0 + g * L));
    return hn::IfThenElse(CopeValid(d, iv, nqf, t.causal, j, t.base, t.nq), x, ninf);
  };
  V qt[G], mu[G], sum[G];
  HWY_UNROLL(8)
  for (int g = 0; g < G; ++g) qt[g] = saturated ? hn::LoadU(d, t.qetop + c0 + g * L) : hn::Zero(d);
  if (saturated) {
    V ma[G];
    HWY_UNROLL(8)
    for (int g = 0; g < G; ++g) ma[g] = ninf;
    for (I j = 0; j < nk; ++j)
      HWY_UNROLL(8)
      for (int g = 0; g < G; ++g) ma[g] = hn::Max(ma[g], load(j, g));
    HWY_UNROLL(8)
    for (int g = 0; g < G; ++g) mx[g] = hn::Max(mx[g], hn::Add(ma[g], qt[g]));
  }
  // a row still without a key keeps m = −inf and gets P = 0
  HWY_UNROLL(8)
  for (int g = 0; g < G; ++g) mu[g] = hn::IfThenZeroElse(hn::Eq(mx[g], ninf), mx[g]), sum[g] = hn::Zero(d);
  for (I j = 0; j < nk; ++j)
    HWY_UNROLL(8)
    for (int g = 0; g < G; ++g) {
      float* x = at + j * kBq + c0 + g * L;
      const V lg = saturated ? hn::Add(load(j, g), qt[g]) : hn::LoadU(d, x);
      const V e = ExpSoftmax(d, hn::Sub(lg, mu[g]));
      hn::StoreU(e, d, x);
      sum[g] = hn::Add(sum[g], e);
    }
  HWY_UNROLL(8)
  for (int g = 0; g < G; ++g) {
    const I c = c0 + g * L;
    const V corr = ExpSoftmax(d, hn::Sub(hn::LoadU(d, t.m + c), mu[g]));  // 0 while m was −inf
    hn::StoreU(hn::MulAdd(hn::LoadU(d, t.l + c), corr, sum[g]), d, t.l + c);
    hn::StoreU(mx[g], d, t.m + c);
    hn::StoreU(corr, d, t.corr + c);
  }
}

// G lane chunks from c0: the counts where the tile needs them (a chunk at a time: they run down the
// keys), then the softmax step.
template <int G, bool kMask, class D>
HWY_INLINE void CopeForwardChunks(D d, const cope_fast::FwdTile& t, cope_fast::I c0) {
  using V = hn::Vec<D>;
  const cope_fast::I L = static_cast<cope_fast::I>(hn::Lanes(d));
  V mx[G];
  HWY_UNROLL(8)
  for (int g = 0; g < G; ++g) {
    const cope_fast::I c = c0 + g * L;
    mx[g] = hn::LoadU(d, t.m + c);
    if (t.saturated) continue;
    const V iv = hn::Iota(d, static_cast<float>(c));
    mx[g] = t.track ? CopeForwardCounts<true>(d, t, c, iv, mx[g]) : CopeForwardCounts<false>(d, t, c, iv, mx[g]);
  }
  CopeForwardStep<G, kMask>(d, t, c0, mx);
}

void CopeForwardTile(const cope_fast::FwdTile& t) {
  using cope_fast::I;
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));  // divides Bq = 128 on every target
  const bool keys_masked = CopeKeysMasked(t.causal, t.base, t.nk);
  I c0 = 0;
  for (; c0 + kG * L <= t.nq; c0 += kG * L)
    keys_masked ? CopeForwardChunks<kG, true>(d, t, c0) : CopeForwardChunks<kG, false>(d, t, c0);
  for (; c0 < t.nq; c0 += L) CopeForwardChunks<1, true>(d, t, c0);
}

// C[idx] += acc lane by lane (the lanes are distinct rows, so the scatter never collides).
template <class D, class V, class VI>
HWY_INLINE void CopeScatterAdd(D d, float* c, VI idx, V acc) {
  hn::ScatterIndex(hn::Add(hn::GatherIndex(d, c, idx), acc), d, c, idx);
}

// The backward's step of G lane chunks from c0 in a clamped tile, key row by key row: P = exp(a +
// q·e_top − lse), da = P·(dp − D), and Σ_j da per lane into ctop. kMask: some lane or key masked.
template <int G, bool kMask, class D>
HWY_INLINE void CopeBackwardClamped(D d, const cope_fast::BwdTile& t, cope_fast::I c0) {
  using cope_fast::I;
  using V = hn::Vec<D>;
  constexpr I kBq = attn_fast::kBq;
  const I L = static_cast<I>(hn::Lanes(d));
  const V ninf = hn::Set(d, -HUGE_VALF), nqf = hn::Set(d, static_cast<float>(t.nq));
  float* const at = t.at;
  float* const dp = t.dp;
  const I nk = t.nk;
  V qt[G], lse[G], dd[G], ct[G];
  HWY_UNROLL(8)
  for (int g = 0; g < G; ++g) {
    const I c = c0 + g * L;
    qt[g] = hn::LoadU(d, t.qetop + c), lse[g] = hn::LoadU(d, t.lse + c), dd[g] = hn::LoadU(d, t.dd + c);
    ct[g] = hn::Zero(d);
  }
  for (I j = 0; j < nk; ++j)
    HWY_UNROLL(8)
    for (int g = 0; g < G; ++g) {
      float* ar = at + j * kBq + c0 + g * L;
      float* dr = dp + j * kBq + c0 + g * L;
      V a = hn::LoadU(d, ar);
      if constexpr (kMask)
        a = hn::IfThenElse(CopeValid(d, hn::Iota(d, static_cast<float>(c0 + g * L)), nqf, t.causal, j, t.base, t.nq),
                           a, ninf);
      const V P = ExpSoftmax(d, hn::Sub(hn::Add(a, qt[g]), lse[g]));
      const V dl = hn::Mul(P, hn::Sub(hn::LoadU(d, dr), dd[g]));
      ct[g] = hn::Add(ct[g], dl);
      hn::StoreU(P, d, ar);
      hn::StoreU(dl, d, dr);
    }
  HWY_UNROLL(8)
  for (int g = 0; g < G; ++g) hn::StoreU(ct[g], d, t.ctop + c0 + g * L);
}

void CopeBackwardTile(const cope_fast::BwdTile& t) {
  using cope_fast::I;
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const I L = static_cast<I>(hn::Lanes(d));
  constexpr I kBq = attn_fast::kBq;
  const auto ninf = hn::Set(d, -HUGE_VALF);
  const auto topv = hn::Set(d, t.top), colv = hn::Set(d, t.colmax), one = hn::Set(d, 1.f);
  const auto zero = hn::Zero(d);
  const auto nqf = hn::Set(d, static_cast<float>(t.nq));
  const I nk = t.nk, base = t.base, nq = t.nq, j0 = t.j0;
  const bool causal = t.causal;
  if (t.clamped) {
    constexpr int G = kG / 2;  // four vectors of state per chunk
    const bool keys_masked = CopeKeysMasked(causal, base, nk);
    I c0 = 0;
    for (; c0 + G * L <= nq; c0 += G * L)
      keys_masked ? CopeBackwardClamped<G, true>(d, t, c0) : CopeBackwardClamped<G, false>(d, t, c0);
    for (; c0 < nq; c0 += L) CopeBackwardClamped<1, true>(d, t, c0);
    return;
  }
  for (I c0 = 0; c0 < nq; c0 += L) {
    const auto iv = hn::Iota(d, static_cast<float>(c0));
    const auto lse = hn::LoadU(d, t.lse + c0);
    const auto dd = hn::LoadU(d, t.dd + c0);
    const auto rb = hn::Sub(hn::LoadU(di, t.rowbase + c0), hn::Set(di, 0x4B000000));
    const auto js = hn::LoadU(di, t.js + c0);
    const auto bk = hn::LoadU(d, t.bk + c0), br = hn::LoadU(d, t.br + c0);
    auto tk = zero, tr = zero;          // Σ_{j* ≤ t < j} g_t within the tile
    auto dg = hn::LoadU(d, t.dc + c0);  // Σ_{t ≤ j} dp_t
    // table values of the lanes' current ⌊p⌋ (see CopeForwardCounts), and the C updates for
    // ⌊p⌋ and ⌈p⌉ summed in registers until ⌊p⌋ moves
    auto fcur = hn::Set(d, -1.f), qf = zero, qd = zero, accf = zero, accc = zero;
    auto idf = hn::Zero(di), idc = hn::Zero(di);
    bool have = false;
    for (I j = 0; j < nk; ++j) {
      float* ar = t.at + j * kBq + c0;
      float* dr = t.dp + j * kBq + c0;
      const auto a =
          hn::IfThenElse(CopeValid(d, iv, nqf, causal, j, base, nq), hn::LoadU(d, ar), ninf);
      const auto next = hn::Set(di, static_cast<std::int32_t>(j0 + j + 1));
      const auto cand = hn::RebindMask(d, hn::Lt(js, next));  // j ≥ j*
      const auto g = hn::IfThenElseZero(cand, CopeSigmoid(d, a));
      auto K = hn::Sub(bk, tk), r = hn::Sub(br, tr);  // S = K + r, r back into [0, 1)
      const auto under = hn::IfThenElseZero(hn::Lt(r, zero), one);
      r = hn::Add(r, under);
      K = hn::Sub(K, under);
      CopeAddFrac(d, g, tk, tr);
      // clamped at top; a count rounded below 0 (at most an ulp) reads row 0
      const auto uncl = hn::And(cand, hn::Lt(K, topv));
      const auto pos = hn::Ge(K, zero);
      const auto f = hn::Min(hn::IfThenElse(uncl, hn::IfThenElseZero(pos, K), topv), colv);
      const auto w = hn::IfThenElseZero(hn::And(uncl, pos), r);
      if (!hn::AllFalse(d, hn::Ne(f, fcur))) {
        if (have) {
          CopeScatterAdd(d, t.c, idf, accf);
          CopeScatterAdd(d, t.c, idc, accc);  // ⌈p⌉ = ⌊p⌋ at the last row: accc is 0 there
        }
        have = true;
        accf = accc = zero;
        idf = CopeIndex(d, di, f, rb);
        idc = CopeIndex(d, di, hn::Min(hn::Add(f, one), colv), rb);
        qf = hn::GatherIndex(d, t.qe, idf);
        qd = hn::Sub(hn::GatherIndex(d, t.qe, idc), qf);
        fcur = f;
      }
      const auto P = ExpSoftmax(d, hn::Sub(hn::Add(a, hn::MulAdd(w, qd, qf)), lse));
      const auto dl = hn::Mul(P, hn::Sub(hn::LoadU(d, dr), dd));
      const auto dlw = hn::Mul(dl, w);
      accf = hn::Add(accf, hn::Sub(dl, dlw));
      accc = hn::Add(accc, dlw);
      dg = hn::Add(dg, hn::IfThenElseZero(uncl, hn::Mul(dl, qd)));
      hn::StoreU(P, d, ar);
      hn::StoreU(hn::MulAdd(hn::Mul(dg, g), hn::Sub(one, g), dl), d, dr);
    }
    if (have) {
      CopeScatterAdd(d, t.c, idf, accf);
      CopeScatterAdd(d, t.c, idc, accc);
    }
    hn::StoreU(tk, d, t.tk + c0);
    hn::StoreU(tr, d, t.tr + c0);
    hn::StoreU(dg, d, t.dc + c0);
  }
}

cope_fast::Kernels GetCopeKernels() {
  return cope_fast::Kernels{&CopeForwardTile, &CopeBackwardTile};
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posenc {
HWY_EXPORT(GetCopeKernels);

cope_fast::Kernels cope_fast::kernels() { return HWY_DYNAMIC_DISPATCH(GetCopeKernels)(); }
}  // namespace posenc
#endif  // HWY_ONCE
