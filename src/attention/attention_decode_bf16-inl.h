// The decode task's products at the bfloat16 rate (re-included per Highway target through
// attention_decode_task.cc; AVX-512 targets only): VDPBF16PS on bfloat16 pairs, or its emulation by
// two float32 multiply-adds (kNative false: any AVX-512 CPU, for tests). Each function is compiled
// for its target plus AVX512_BF16 and called only where the CPU has it (or emulated).
//
// Logits: the query rows as two bfloat16 parts, q ≈ hi + lo (lo = 0 where the row is exact in
// bfloat16), each pair of K as it is in the cache, no conversion: Σ over pairs of (q₂ₚ·k₂ₚ +
// q₂ₚ₊₁·k₂ₚ₊₁), the products exact, the sums float32; times `scale`. P·V: P rounded to bfloat16 (to
// nearest even), two keys a product: V rows j and j + 1 interleaved element by element (an unpack
// within 128-bit blocks, so the accumulators hold the elements of 32 in a fixed permutation, turned
// back once per call).
#if defined(POSENC_ATTENTION_DECODE_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSENC_ATTENTION_DECODE_BF16_INL_H_
#undef POSENC_ATTENTION_DECODE_BF16_INL_H_
#else
#define POSENC_ATTENTION_DECODE_BF16_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "attention/attention_decode_kernels-inl.h"

#undef POSENC_DECODE_BF16
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (defined(__GNUC__) || defined(__clang__))
#define POSENC_DECODE_BF16 1
#include <immintrin.h>
#else
#define POSENC_DECODE_BF16 0
#endif

#if POSENC_DECODE_BF16
#if !defined(__clang__)  // GCC 12's AVX-512 headers start masked intrinsics from an undefined vector
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#undef POSENC_BF16_RATE
#define POSENC_BF16_RATE __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace decode_bf16 {
namespace hn = hwy::HWY_NAMESPACE;
using I = std::int64_t;

// acc + Σ of each lane's pair products a·b (the high halves' product added first, as the instruction).
template <bool kNative>
POSENC_BF16_RATE HWY_INLINE __m512 Dot2(__m512 acc, __m512i a, __m512i b) {
  if constexpr (kNative) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
  } else {
    const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    const __m512 high = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(a, top)),
                                      _mm512_castsi512_ps(_mm512_and_si512(b, top)));
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)), _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)),
                           _mm512_add_ps(acc, high));
  }
}

// 16 finite floats rounded to bfloat16, to nearest even.
template <bool kNative>
POSENC_BF16_RATE HWY_INLINE __m256i Round16(__m512 x) {
  if constexpr (kNative) {
    return (__m256i)_mm512_cvtneps_pbh(x);
  } else {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, odd), _mm512_set1_epi32(0x7fff)), 16));
  }
}

// The first n of 16 lanes (n ≤ 0: none).
POSENC_BF16_RATE HWY_INLINE __mmask16 PairLanes(I n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1u);
}

// S[r·lds + k] = scale·(hi_r + lo_r)·K_k for NR rows (hi_r = hi + r·ldq bfloat16 elements; kLo false:
// no low part) and the nk ≤ 4 keys K_k = K + k·kld, D (even) elements each (kD: D as a constant, 0:
// read at run time).
template <int NR, bool kNative, bool kLo, int kD>
POSENC_BF16_RATE HWY_INLINE void Logits4(const std::uint16_t* hi, const std::uint16_t* lo, I ldq, const std::uint16_t* K,
                                         I kld, I nk, I D, float scale, float* S, I lds) {
  if constexpr (kD > 0) D = kD;
  const std::uint16_t* k[4];
  for (int x = 0; x < 4; ++x) k[x] = K + std::min<I>(x, nk - 1) * kld;  // keys past nk: the last again
  __m512 acc[NR][4];
  HWY_UNROLL(4)
  for (int r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_ps();
  HWY_UNROLL(4)
  for (I e = 0; e < D; e += 32) {
    const __mmask16 m = PairLanes((D - e) / 2);
    __m512i x[4];
    HWY_UNROLL(4)
    for (int c = 0; c < 4; ++c) x[c] = _mm512_maskz_loadu_epi32(m, k[c] + e);
    HWY_UNROLL(4)
    for (int r = 0; r < NR; ++r) {
      const __m512i q = _mm512_maskz_loadu_epi32(m, hi + r * ldq + e);
      HWY_UNROLL(4)
      for (int c = 0; c < 4; ++c) acc[r][c] = Dot2<kNative>(acc[r][c], q, x[c]);
      if constexpr (kLo) {
        const __m512i ql = _mm512_maskz_loadu_epi32(m, lo + r * ldq + e);
        HWY_UNROLL(4)
        for (int c = 0; c < 4; ++c) acc[r][c] = Dot2<kNative>(acc[r][c], ql, x[c]);
      }
    }
  }
  const hn::ScalableTag<float> d;  // 16 lanes: the AVX-512 vectors as Highway's
  using V = hn::Vec<decltype(d)>;
  const float zero[4] = {0.f, 0.f, 0.f, 0.f};
  HWY_UNROLL(4)
  for (int r = 0; r < NR; ++r) {
    float* out = S + r * lds;
    decode_kernels::StoreSums4(d, V{acc[r][0]}, V{acc[r][1]}, V{acc[r][2]}, V{acc[r][3]}, zero, nk, out, scale);
  }
}

template <int NR, bool kNative, bool kLo, int kD, class Step>
POSENC_BF16_RATE HWY_INLINE void LogitRowsD(const std::uint16_t* hi, const std::uint16_t* lo, I ldq, const std::uint16_t* K,
                                            I kld, I n, I D, float scale, float* S, I lds, Step& step) {
  for (I j = 0; j < n; j += 4) {
    Logits4<NR, kNative, kLo, kD>(hi, lo, ldq, K + j * kld, kld, std::min<I>(4, n - j), D, scale, S + j, lds);
    step();
  }
}

// S[r·lds + j] = the logits of NR rows and keys j < n (key j at K + j·kld; lo null: no low part),
// four keys at a time, step() after each four; D = 64 and 128 compiled as constants.
template <int NR, bool kNative, bool kLo, class Step>
POSENC_BF16_RATE HWY_INLINE void LogitRowsLo(const std::uint16_t* hi, const std::uint16_t* lo, I ldq, const std::uint16_t* K,
                                             I kld, I n, I D, float scale, float* S, I lds, Step& step) {
  if (D == 128) LogitRowsD<NR, kNative, kLo, 128>(hi, lo, ldq, K, kld, n, D, scale, S, lds, step);
  else if (D == 64) LogitRowsD<NR, kNative, kLo, 64>(hi, lo, ldq, K, kld, n, D, scale, S, lds, step);
  else LogitRowsD<NR, kNative, kLo, 0>(hi, lo, ldq, K, kld, n, D, scale, S, lds, step);
}
template <int NR, bool kNative, class Step>
POSENC_BF16_RATE void LogitRows(const std::uint16_t* hi, const std::uint16_t* lo, I ldq, const std::uint16_t* K, I kld,
                                I n, I D, float scale, float* S, I lds, Step& step) {
  if (lo) LogitRowsLo<NR, kNative, true>(hi, lo, ldq, K, kld, n, D, scale, S, lds, step);
  else LogitRowsLo<NR, kNative, false>(hi, lo, ldq, K, kld, n, D, scale, S, lds, step);
}

// Row x of P (n floats at P + x·ldp) rounded to bfloat16 at out + x·ldo, then a 0 (so that keys pair
// up), for x < nr.
template <bool kNative>
POSENC_BF16_RATE HWY_INLINE void RoundRows(const float* P, I ldp, I nr, I n, std::uint16_t* out, I ldo) {
  for (I x = 0; x < nr; ++x)
    for (I j = 0; j <= n; j += 16) {
      const __mmask16 m = PairLanes(n - j);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + x * ldo + j), Round16<kNative>(_mm512_maskz_loadu_ps(m, P + x * ldp + j)));
    }
}

// The accumulators' lanes back in element order: of the 32 elements of a chunk, lo holds 8b + t and
// hi 8b + 4 + t at lane 4b + t (b < 4, t < 4), as the unpacks of AddPV leave them.
POSENC_BF16_RATE HWY_INLINE void Unpermute(__m512 lo, __m512 hi, __m512* first, __m512* second) {
  const __m512i a = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i b = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  *first = _mm512_permutex2var_ps(lo, a, hi);
  *second = _mm512_permutex2var_ps(lo, b, hi);
}

// o_r[e, e + 32·NC) += Σ_j p_r[j]·V_j over n keys for NR rows (p_r: bfloat16 at P + r·ldp, a 0 after
// an odd n; o_r = o + r·ldo; V_j = V + j·vld; w ≤ 32·NC elements from e, even), two keys a product;
// step() after every PVStepKeys(2) keys.
template <int NR, int NC, bool kNative, class Step>
POSENC_BF16_RATE HWY_INLINE void AddPVChunks(const std::uint16_t* P, I ldp, const std::uint16_t* V, I vld, I n, I e, I w,
                                             float* o, I ldo, Step& step) {
  __mmask32 m[NC];
  HWY_UNROLL(2)
  for (int c = 0; c < NC; ++c) {
    const I left = std::clamp<I>(w - 32 * c, 0, 32);
    m[c] = left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << left) - 1u);
  }
  const I mask = decode_kernels::PVStepKeys(2) - 1;
  __m512 acc[NR][2 * NC];
  HWY_UNROLL(4)
  for (int r = 0; r < NR; ++r)
    HWY_UNROLL(4)
    for (int c = 0; c < 2 * NC; ++c) acc[r][c] = _mm512_setzero_ps();
  for (I j = 0; j < n; j += 2) {
    const std::uint16_t* va = V + j * vld + e;
    const std::uint16_t* vb = j + 1 < n ? va + vld : va;  // an odd n's last key: weight 0
    __m512i x[2 * NC];
    HWY_UNROLL(2)
    for (int c = 0; c < NC; ++c) {
      const __m512i a = _mm512_maskz_loadu_epi16(m[c], va + 32 * c), b = _mm512_maskz_loadu_epi16(m[c], vb + 32 * c);
      x[2 * c] = _mm512_unpacklo_epi16(a, b);
      x[2 * c + 1] = _mm512_unpackhi_epi16(a, b);
    }
    HWY_UNROLL(4)
    for (int r = 0; r < NR; ++r) {
      std::uint32_t pair;
      std::memcpy(&pair, P + r * ldp + j, 4);
      const __m512i p = _mm512_set1_epi32(static_cast<int>(pair));
      HWY_UNROLL(4)
      for (int c = 0; c < 2 * NC; ++c) acc[r][c] = Dot2<kNative>(acc[r][c], p, x[c]);
    }
    if ((j & mask) == mask - 1) step();
  }
  HWY_UNROLL(4)
  for (int r = 0; r < NR; ++r)
    HWY_UNROLL(2)
    for (int c = 0; c < NC; ++c) {
      float* y = o + r * ldo + e + 32 * c;
      const I left = std::clamp<I>(w - 32 * c, 0, 32);
      const __mmask16 m0 = PairLanes(left), m1 = PairLanes(left - 16);
      __m512 first, second;
      Unpermute(acc[r][2 * c], acc[r][2 * c + 1], &first, &second);
      _mm512_mask_storeu_ps(y, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, y), first));
      if (left > 16) _mm512_mask_storeu_ps(y + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, y + 16), second));
    }
}

// The most keys AddPV takes at once.
constexpr I kMaxKeys = 256;

// o_r [D] += Σ_j p_r[j]·V_j for NR rows (p_r = P + r·ldp, float) and n ≤ kMaxKeys keys: P rounded to
// bfloat16, then AddPVChunks 64 elements of D a pass.
template <int NR, bool kNative, class Step>
POSENC_BF16_RATE void AddPV(const float* P, I ldp, const std::uint16_t* V, I vld, I n, I D, float* o, I ldo,
                            Step& step) {
  constexpr I ldb = kMaxKeys + 16;
  alignas(64) std::uint16_t pb[NR * ldb];
  RoundRows<kNative>(P, ldp, NR, n, pb, ldb);
  for (I e = 0; e < D; e += 64) AddPVChunks<NR, 2, kNative>(pb, ldb, V, vld, n, e, std::min<I>(64, D - e), o, ldo, step);
}

}  // namespace decode_bf16
}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // POSENC_DECODE_BF16

#endif  // POSENC_ATTENTION_DECODE_BF16_INL_H_
