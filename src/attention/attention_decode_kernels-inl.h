// The decode task's inner products, per Highway target (re-included through foreach_target.h by
// attention_decode_task.cc): logits Q·Kᵀ and o += P·V read the K and V rows straight from the cache
// (float32, bfloat16 or float16, converted in registers), register-blocked so that one load of K or
// V serves several query rows and one load of a query row several keys.
//
// Logits: kRows query rows × 4 keys, kRows·4 accumulators over D; the four keys' sums of a row
// reduced together (StoreSums4: two interleave-add steps inside each 128-bit block, then the blocks
// added), instead of one horizontal reduction per dot product. P·V: kRows rows × kChunks vectors of
// D, the p of a row broadcast once per key for its kChunks vectors.
//
// The accumulators are arrays of vectors (fixed-size targets; the loops over them are unrolled).
#if defined(POSENC_ATTENTION_DECODE_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSENC_ATTENTION_DECODE_KERNELS_INL_H_
#undef POSENC_ATTENTION_DECODE_KERNELS_INL_H_
#else
#define POSENC_ATTENTION_DECODE_KERNELS_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

#include "core/fast_common.h"
#include "core/simd-inl.h"

#ifndef POSENC_UNROLL  // loops over arrays of vectors unrolled whole, so that the arrays stay in registers
#define POSENC_UNROLL _Pragma("GCC unroll 16")
#endif

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace decode_kernels {
namespace hn = hwy::HWY_NAMESPACE;
using I = std::int64_t;

// Blocking: AVX-512 has 32 vector registers (4·4 accumulators + 4 keys + a row fit), the other
// targets 16.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kRows = 4;
constexpr int kChunks = 4;
#else
constexpr int kRows = 2;
constexpr int kChunks = 2;
#endif

#if HWY_TARGET != HWY_SCALAR
// The sum of v's 128-bit blocks.
template <class D>
HWY_INLINE hn::Vec<hn::Full128<float>> SumBlocks(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    return SumBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    (void)d;
    return v;
  }
}
#endif

// out[k] = add[k] + mul · the lane sum of the k-th of a, b, c, e, for k < nk ≤ 4.
template <class D>
HWY_INLINE void StoreSums4(D d, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D> c, hn::Vec<D> e,
                           const float* HWY_RESTRICT add, I nk, float* HWY_RESTRICT out, float mul = 1.f) {
  HWY_ALIGN float s[4];
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  s[0] = hn::GetLane(a), s[1] = hn::GetLane(b), s[2] = hn::GetLane(c), s[3] = hn::GetLane(e);
  for (int k = 0; k < 4; ++k) s[k] = add[k] + mul * s[k];
#else
  const hn::Repartition<std::uint64_t, D> d64;
  const hn::Full128<float> d4;
  // per block: [a0 + a2, b0 + b2, a1 + a3, b1 + b3] and the same of c, e
  const auto ab = hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
  const auto ce = hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));
  // per block: [Σ a, Σ b, Σ c, Σ e] of the block's four lanes
  const auto x = hn::BitCast(d64, ab), y = hn::BitCast(d64, ce);
  const auto blocks = hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, x, y)), hn::BitCast(d, hn::InterleaveUpper(d64, x, y)));
  const auto sums = hn::MulAdd(SumBlocks(d, blocks), hn::Set(d4, mul), hn::LoadU(d4, add));
  if (nk == 4) return hn::StoreU(sums, d4, out);
  hn::Store(sums, d4, s);
#endif
  std::copy(s, s + nk, out);
}

// S[r·lds + k] = Q_r·K_k for the NR rows Q_r = Q + r·ldq (float) and the nk ≤ 4 keys K_k = K + k·kld
// (storage T), D values each.
template <int NR, class T>
HWY_INLINE void Logits4(const float* HWY_RESTRICT Q, I ldq, const T* HWY_RESTRICT K, I kld, I nk, I D,
                        float* HWY_RESTRICT S, I lds) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const I L = static_cast<I>(hn::Lanes(d));
  const T* k0 = K;  // the keys past nk repeat the last one (their sums are not stored)
  const T* k1 = K + std::min<I>(1, nk - 1) * kld;
  const T* k2 = K + std::min<I>(2, nk - 1) * kld;
  const T* k3 = K + std::min<I>(3, nk - 1) * kld;
  V acc[NR][4];
  POSENC_UNROLL
  for (int r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = hn::Zero(d);
  I e = 0;
  for (; e + L <= D; e += L) {
    const V x0 = LoadF(d, k0 + e), x1 = LoadF(d, k1 + e), x2 = LoadF(d, k2 + e), x3 = LoadF(d, k3 + e);
    POSENC_UNROLL
    for (int r = 0; r < NR; ++r) {
      const V q = hn::LoadU(d, Q + r * ldq + e);
      acc[r][0] = hn::MulAdd(q, x0, acc[r][0]);
      acc[r][1] = hn::MulAdd(q, x1, acc[r][1]);
      acc[r][2] = hn::MulAdd(q, x2, acc[r][2]);
      acc[r][3] = hn::MulAdd(q, x3, acc[r][3]);
    }
  }
  POSENC_UNROLL
  for (int r = 0; r < NR; ++r) {
    HWY_ALIGN float t[4] = {0.f, 0.f, 0.f, 0.f};  // the tail of D
    const float* q = Q + r * ldq;
    for (I x = e; x < D; ++x) {
      t[0] += q[x] * ToF(k0[x]);
      t[1] += q[x] * ToF(k1[x]);
      t[2] += q[x] * ToF(k2[x]);
      t[3] += q[x] * ToF(k3[x]);
    }
    StoreSums4(d, acc[r][0], acc[r][1], acc[r][2], acc[r][3], t, nk, S + r * lds);
  }
}

// S[r·lds + j] = Q_r·K_j for j < n (key j at K + j·kld), NR rows: four keys at a time.
template <int NR, class T>
HWY_INLINE void LogitRows(const float* HWY_RESTRICT Q, I ldq, const T* HWY_RESTRICT K, I kld, I n, I D,
                          float* HWY_RESTRICT S, I lds) {
  for (I j = 0; j < n; j += 4) Logits4<NR>(Q, ldq, K + j * kld, kld, std::min<I>(4, n - j), D, S + j, lds);
}

// Keys per prefetch step of a P·V pass, for V elements of `bytes`: four; on AMD CPUs eight of 16-bit V
// (about as many bytes of V a step as four of float32), measured faster there (docs/performance.md).
inline I PVStepKeys(std::size_t bytes) { return fast::amd_cpu() && bytes == 2 ? 8 : 4; }

// o_r[e, e + NC·L) += Σ_j p_r[j]·V_j[e, e + NC·L) for NR rows (p_r = p + r·ldp, o_r = o + r·ldo) and
// n keys (V_j = V + j·vld); step() after every PVStepKeys(sizeof(T)) keys (the caller's prefetch).
template <int NR, int NC, class T, class Step>
HWY_INLINE void AddPVChunks(const float* HWY_RESTRICT p, I ldp, const T* HWY_RESTRICT V, I vld, I n, I e,
                            float* HWY_RESTRICT o, I ldo, Step& step) {
  const hn::ScalableTag<float> d;
  using Vf = hn::Vec<decltype(d)>;
  const I L = static_cast<I>(hn::Lanes(d));
  const I mask = PVStepKeys(sizeof(T)) - 1;
  Vf acc[NR][NC];
  POSENC_UNROLL
  for (int r = 0; r < NR; ++r)
    POSENC_UNROLL
    for (int c = 0; c < NC; ++c) acc[r][c] = hn::LoadU(d, o + r * ldo + e + c * L);
  for (I j = 0; j < n; ++j) {
    Vf v[NC];
    POSENC_UNROLL
    for (int c = 0; c < NC; ++c) v[c] = LoadF(d, V + j * vld + e + c * L);
    POSENC_UNROLL
    for (int r = 0; r < NR; ++r) {
      const Vf pr = hn::Set(d, p[r * ldp + j]);
      POSENC_UNROLL
      for (int c = 0; c < NC; ++c) acc[r][c] = hn::MulAdd(pr, v[c], acc[r][c]);
    }
    if ((j & mask) == mask) step();
  }
  POSENC_UNROLL
  for (int r = 0; r < NR; ++r)
    POSENC_UNROLL
    for (int c = 0; c < NC; ++c) hn::StoreU(acc[r][c], d, o + r * ldo + e + c * L);
}

// The passes of AddPVChunks that AddPV makes over the keys for rows of D values.
HWY_INLINE I PVPasses(I D) {
  const I L = static_cast<I>(hn::Lanes(hn::ScalableTag<float>()));
  return D / (kChunks * L) + D % (kChunks * L) / L;
}

// o_r [D] += Σ_j p_r[j]·V_j for NR rows and n keys: kChunks vectors of D at a time, then one, then
// the tail; step() after every PVStepKeys(sizeof(T)) keys of each pass (PVPasses(D) passes).
template <int NR, class T, class Step>
HWY_INLINE void AddPV(const float* HWY_RESTRICT p, I ldp, const T* HWY_RESTRICT V, I vld, I n, I D,
                      float* HWY_RESTRICT o, I ldo, Step& step) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  I e = 0;
  for (; e + kChunks * L <= D; e += kChunks * L) AddPVChunks<NR, kChunks>(p, ldp, V, vld, n, e, o, ldo, step);
  for (; e + L <= D; e += L) AddPVChunks<NR, 1>(p, ldp, V, vld, n, e, o, ldo, step);
  for (; e < D; ++e)
    for (int r = 0; r < NR; ++r) {
      float a = o[r * ldo + e];
      for (I j = 0; j < n; ++j) a += p[r * ldp + j] * ToF(V[j * vld + e]);
      o[r * ldo + e] = a;
    }
}

}  // namespace decode_kernels
}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#endif  // POSENC_ATTENTION_DECODE_KERNELS_INL_H_
