// Per-target SIMD helpers shared by the fast kernels (re-included once per Highway target through
// foreach_target.h): float32 math on float32 / bfloat16 / float16 storage (loads, stores rounded to
// nearest even, 2N-element steps whose 16-bit stores are whole vectors, non-temporal where
// aligned), an exact-angle float sincos and a double one.
//
// Angles. For position m and inverse frequency w (double), a = m·w is formed in double, reduced in
// double, a = q·π/2 + t with t ∈ [−π/4, π/4] (three-part Cody–Waite constant), t rounded to float
// and sin/cos evaluated in float with Cephes' minimax polynomials and the quadrant q mod 4.
// Error bound, |computed − exact sin/cos of the double angle a|:
//     ≤ 3·10⁻⁷ + |a|·2⁻⁵¹            (2⁻²⁵·π/4 from rounding t, ≤ 2 ulp from the polynomial)
// i.e. ≤ 3.1·10⁻⁷ for |a| ≤ 4·10⁶ (tested at positions up to 4·10⁶ against long double).
// Forming a in float32 instead would lose ~0.1 rad at m = 4·10⁶.
#if defined(POSENC_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSENC_SIMD_INL_H_
#undef POSENC_SIMD_INL_H_
#else
#define POSENC_SIMD_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "posenc/half.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- scalar conversions (tails) ------------------------------------------------------------------
HWY_INLINE float ToF(float v) { return v; }
HWY_INLINE float ToF(hwy::bfloat16_t v) {
  bf16 b;
  std::memcpy(&b.bits, &v, 2);
  return to_float(b);
}
HWY_INLINE float ToF(hwy::float16_t v) {
  f16 b;
  std::memcpy(&b.bits, &v, 2);
  return to_float(b);
}
HWY_INLINE void FromF(float f, float* p) { *p = f; }
HWY_INLINE void FromF(float f, hwy::bfloat16_t* p) {
  const bf16 b = to_bf16(f);
  std::memcpy(p, &b.bits, 2);
}
HWY_INLINE void FromF(float f, hwy::float16_t* p) {
  const f16 b = to_f16(f);
  std::memcpy(p, &b.bits, 2);
}

// ---- vector loads/stores of N float lanes from storage T -----------------------------------------
template <class D>
HWY_INLINE hn::Vec<D> LoadF(D d, const float* HWY_RESTRICT p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadF(D d, const hwy::bfloat16_t* HWY_RESTRICT p) {
  const hn::Rebind<hwy::bfloat16_t, D> d16;
  return hn::PromoteTo(d, hn::LoadU(d16, p));
}
// float16 conversions: hardware where the target has them (F16C on AVX2/AVX3, NEON); elsewhere
// Highway 1.0.3 emulates them, truncating on the way down and mapping inf/NaN to finite values on
// the way up, so these targets use the integer versions below (round to nearest even, as half.h).
#undef POSENC_F16_EMULATED
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128 || \
    (HWY_ARCH_X86 && HWY_TARGET >= HWY_SSE4) || defined(HWY_DISABLE_F16C)
#define POSENC_F16_EMULATED 1
#else
#define POSENC_F16_EMULATED 0
#endif
// On Highway's emulated target (EMU128: a loop over the lanes for every operation) the float16
// conversions stay out of line: inlined into the unrolled kernels, their loops cost clang's optimizer
// minutes per file in the sanitizer build, the one build that compiles EMU128 on this CPU.
#undef POSENC_F16_INLINE
#if HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
#define POSENC_F16_INLINE HWY_NOINLINE
#else
#define POSENC_F16_INLINE HWY_INLINE
#endif

template <class D>
POSENC_F16_INLINE hn::Vec<D> LoadF(D d, const hwy::float16_t* HWY_RESTRICT p) {
#if POSENC_F16_EMULATED
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<std::uint16_t, D> du16;
  const auto h = hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const std::uint16_t*>(p)));
  // Exponent and mantissa moved to float's places: ×2¹¹² rebiases a normal and normalises a
  // subnormal exactly; exponent 31 (inf, NaN) maps to 255.
  const auto t = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7fffu)));
  const auto finite = hn::BitCast(du, hn::Mul(hn::BitCast(d, t), hn::Set(d, 0x1p112f)));
  const auto special = hn::Or(t, hn::Set(du, 0x7f800000u));
  const auto mag = hn::IfThenElse(hn::Eq(hn::And(h, hn::Set(du, 0x7c00u)), hn::Set(du, 0x7c00u)),
                                  special, finite);
  return hn::BitCast(d, hn::Or(mag, hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)))));
#else
  const hn::Rebind<hwy::float16_t, D> d16;
  return hn::PromoteTo(d, hn::LoadU(d16, p));
#endif
}

#if POSENC_F16_EMULATED
// float16 bits of v in the low half of each lane, rounded to nearest even: normals by an integer
// add at bit 13 (the carry reaches inf on overflow), subnormals by the float add of 0.5 (whose ulp
// is float16's smallest subnormal); NaN quiet.
template <class D>
POSENC_F16_INLINE hn::Vec<hn::RebindToUnsigned<D>> F16Rounded(D d, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;  // a < 2³¹: signed compares are unsigned ones
  const auto u = hn::BitCast(du, v);
  const auto a = hn::And(u, hn::Set(du, 0x7fffffffu));
  const auto r = hn::Sub(a, hn::Set(du, 0x38000000u));  // exponent bias 127 → 15
  const auto up = hn::Add(hn::Set(du, 0xfffu), hn::And(hn::ShiftRight<13>(r), hn::Set(du, 1u)));
  const auto normal = hn::Min(hn::ShiftRight<13>(hn::Add(r, up)), hn::Set(du, 0x7c00u));
  const auto sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(d, a), hn::Set(d, 0.5f))),
                           hn::Set(du, 0x3f000000u));
  const auto ai = hn::BitCast(di, a);
  auto h = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 0x38800000))), sub, normal);
  const auto nan =
      hn::Or(hn::Set(du, 0x7e00u), hn::And(hn::ShiftRight<13>(a), hn::Set(du, 0x1ffu)));
  h = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7f800000))), nan, h);
  return hn::Or(h, hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u)));
}
#endif

template <class D>
HWY_INLINE void StoreF(D d, hn::Vec<D> v, float* HWY_RESTRICT p) {
  hn::StoreU(v, d, p);
}
// bfloat16 bits of v (round to nearest even, NaN quiet, as half.h) in the upper half of each lane.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> Bf16Rounded(D d, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  const auto u = hn::BitCast(du, v);
  const auto r =
      hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Or(u, hn::Set(du, 0x400000u)), r);
}
// Round to nearest even (Highway 1.0.3's DemoteTo truncates); NaN stays a quiet NaN, as half.h.
template <class D>
HWY_INLINE void StoreF(D d, hn::Vec<D> v, hwy::bfloat16_t* HWY_RESTRICT p) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<std::uint16_t, D> d16;
  const auto hi = hn::BitCast(di, hn::ShiftRight<16>(Bf16Rounded(d, v)));
  hn::StoreU(hn::DemoteTo(d16, hi), d16, reinterpret_cast<std::uint16_t*>(p));
}
template <class D>
POSENC_F16_INLINE void StoreF(D d, hn::Vec<D> v, hwy::float16_t* HWY_RESTRICT p) {
#if POSENC_F16_EMULATED
  const hn::Rebind<std::uint16_t, D> du16;
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<D>(), F16Rounded(d, v))), du16,
             reinterpret_cast<std::uint16_t*>(p));
#else
  const hn::Rebind<hwy::float16_t, D> d16;
  hn::StoreU(hn::DemoteTo(d16, v), d16, p);
#endif
}

// ---- 2N elements at a time: one full vector of 16-bit storage
// ------------------------------------ Kernels that stream 16-bit outputs work in steps of 2N
// floats so that every store (and every non-temporal store) is one whole vector. The lane order is
// the memory order on every target.
template <class D, typename T>
HWY_INLINE void LoadF2(D d, const T* HWY_RESTRICT p, hn::Vec<D>* v0, hn::Vec<D>* v1) {
  *v0 = LoadF(d, p);
  *v1 = LoadF(d, p + hn::Lanes(d));
}

// Stores v0 (elements 0 .. N−1) and v1 (N .. 2N−1); kStream: non-temporal, p aligned to the float
// vector size (which is also the size of one vector of 2N 16-bit lanes).
template <bool kStream, class D>
HWY_INLINE void StoreF2(D d, hn::Vec<D> v0, hn::Vec<D> v1, float* HWY_RESTRICT p) {
  if (kStream) {
    hn::Stream(v0, d, p);
    hn::Stream(v1, d, p + hn::Lanes(d));
  } else {
    hn::StoreU(v0, d, p);
    hn::StoreU(v1, d, p + hn::Lanes(d));
  }
}
template <bool kStream, class D>
HWY_INLINE void StoreF2(D d, hn::Vec<D> v0, hn::Vec<D> v1, hwy::bfloat16_t* HWY_RESTRICT p) {
#if HWY_TARGET == HWY_SCALAR
  StoreF(d, v0, p);
  StoreF(d, v1, p + 1);
#else
  const hn::Repartition<std::uint16_t, D> d16;  // 2N lanes
  // The odd 16-bit halves of the rounded 32-bit lanes are the bfloat16 values, in order.
  const auto bits = hn::ConcatOdd(d16, hn::BitCast(d16, Bf16Rounded(d, v1)),
                                  hn::BitCast(d16, Bf16Rounded(d, v0)));
  if (kStream)
    hn::Stream(bits, d16, reinterpret_cast<std::uint16_t*>(p));
  else
    hn::StoreU(bits, d16, reinterpret_cast<std::uint16_t*>(p));
#endif
}
template <bool kStream, class D>
HWY_INLINE void StoreF2(D d, hn::Vec<D> v0, hn::Vec<D> v1, hwy::float16_t* HWY_RESTRICT p) {
#if POSENC_F16_EMULATED
  StoreF(d, v0, p);
  StoreF(d, v1, p + hn::Lanes(d));
#else
  const hn::Rebind<hwy::float16_t, D> dh;        // N lanes
  const hn::Repartition<hwy::float16_t, D> d16;  // 2N lanes
  const auto h = hn::Combine(d16, hn::DemoteTo(dh, v1), hn::DemoteTo(dh, v0));
  if (kStream)
    hn::Stream(h, d16, p);
  else
    hn::StoreU(h, d16, p);
#endif
}

// ---- bfloat16 as (even, odd) element vectors
// ----------------------------------------------------- A vector of 2N bfloat16 is N 32-bit lanes,
// each holding elements (2i, 2i+1) in its (low, high) half (little-endian), so it splits into the
// float vectors of its even and its odd elements with one shift and one mask, and joins back with
// one shift and one select: half the instructions of widening and narrowing half vectors. Kernels
// whose math is per pair (RoPE's interleaved pairs, the sinusoid's (sin, cos) columns) or per
// element use this order directly.
#undef POSENC_BF16_PAIRS
#if HWY_TARGET != HWY_SCALAR && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define POSENC_BF16_PAIRS 1
#else
#define POSENC_BF16_PAIRS 0
#endif

#if POSENC_BF16_PAIRS
template <class D>
HWY_INLINE void LoadBf16Pairs(D d, const hwy::bfloat16_t* HWY_RESTRICT p, hn::Vec<D>* even,
                              hn::Vec<D>* odd) {
  const hn::RebindToUnsigned<D> du;
  const auto u = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(p));
  *even = hn::BitCast(d, hn::ShiftLeft<16>(u));
  *odd = hn::BitCast(d, hn::And(u, hn::Set(du, 0xffff0000u)));
}

// Rounds even and odd to nearest even and stores them as 2N bfloat16 (kStream: non-temporal, p as
// for StoreF2<true>). No NaN fix-up: every value rounded here is float arithmetic on bfloat16
// values and finite constants, so a NaN among them is quiet with a zero low half, which the
// rounding add leaves as it is: the result equals half.h's to_bf16 on every value that reaches it.
template <bool kStream, class D>
HWY_INLINE void StoreBf16Pairs(D d, hn::Vec<D> even, hn::Vec<D> odd,
                               hwy::bfloat16_t* HWY_RESTRICT p) {
  const hn::RebindToUnsigned<D> du;
  const auto bias = hn::Set(du, 0x7fffu), one = hn::Set(du, 1u);
  const auto ue = hn::BitCast(du, even), uo = hn::BitCast(du, odd);
  const auto re = hn::Add(ue, hn::Add(bias, hn::And(hn::ShiftRight<16>(ue), one)));
  const auto ro = hn::Add(uo, hn::Add(bias, hn::And(hn::ShiftRight<16>(uo), one)));
  const auto bits = hn::Or(hn::And(ro, hn::Set(du, 0xffff0000u)), hn::ShiftRight<16>(re));
  if (kStream)
    hn::Stream(bits, du, reinterpret_cast<std::uint32_t*>(p));
  else
    hn::StoreU(bits, du, reinterpret_cast<std::uint32_t*>(p));
}
#endif  // POSENC_BF16_PAIRS

// Whether p suits StoreF2<true>: aligned to the float vector size.
template <class D, typename T>
HWY_INLINE bool StreamAligned(D d, const T* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & (hn::Lanes(d) * sizeof(float) - 1)) == 0;
}

// ---- exact-angle sincos ----------------------------------------------------------------------------
constexpr double kTwoOverPi = 0.63661977236758134308;
constexpr double kPio2_1 = 1.57079632673412561417e+00;   // first 33 bits of π/2
constexpr double kPio2_2 = 6.07710050630396597660e-11;   // next 33 bits
constexpr double kPio2_3 = 2.02226624879595063154e-21;   // the rest

// Float sin/cos of t ∈ [−π/4, π/4] (Cephes sinf/cosf), rotated by quadrant q ∈ {0,1,2,3}.
HWY_INLINE void SinCosQ(float t, float q, float* s, float* c) {
  const float z = t * t;
  const float sp = t + t * z * (-1.6666654611e-1f + z * (8.3321608736e-3f + z * -1.9515295891e-4f));
  const float cp = 1.0f - 0.5f * z + z * z * (4.166664568298827e-2f + z * (-1.388731625493765e-3f + z * 2.443315711809948e-5f));
  const bool odd = q == 1.0f || q == 3.0f;
  float sv = odd ? cp : sp, cv = odd ? sp : cp;
  if (q >= 2.0f) sv = -sv;
  if (q == 1.0f || q == 2.0f) cv = -cv;
  *s = sv;
  *c = cv;
}

HWY_INLINE void ReduceScalar(double a, float* t, float* q) {
  const double qd = std::nearbyint(a * kTwoOverPi);
  const double r = ((a - qd * kPio2_1) - qd * kPio2_2) - qd * kPio2_3;
  *t = static_cast<float>(r);
  *q = static_cast<float>(qd - 4.0 * std::floor(qd * 0.25));
}

// s[k] = sin(m·inv[k]), c[k] = cos(m·inv[k]) for k < n; red, quad: scratch of n floats.
HWY_INLINE void SinCosRow(double m, const double* HWY_RESTRICT inv, std::size_t n, float* HWY_RESTRICT red,
                          float* HWY_RESTRICT quad, float* HWY_RESTRICT s, float* HWY_RESTRICT c) {
  std::size_t k = 0;
#if HWY_HAVE_FLOAT64
  {
    const hn::ScalableTag<double> dd;
    const hn::Rebind<float, decltype(dd)> dfh;
    const std::size_t N = hn::Lanes(dd);
    const auto vm = hn::Set(dd, m), v2pi = hn::Set(dd, kTwoOverPi), p1 = hn::Set(dd, kPio2_1),
               p2 = hn::Set(dd, kPio2_2), p3 = hn::Set(dd, kPio2_3), quarter = hn::Set(dd, 0.25),
               four = hn::Set(dd, 4.0);
    for (; k + N <= n; k += N) {
      const auto a = hn::Mul(vm, hn::LoadU(dd, inv + k));
      const auto qd = hn::Round(hn::Mul(a, v2pi));
      auto r = hn::NegMulAdd(qd, p1, a);
      r = hn::NegMulAdd(qd, p2, r);
      r = hn::NegMulAdd(qd, p3, r);
      const auto qm = hn::NegMulAdd(four, hn::Floor(hn::Mul(qd, quarter)), qd);
      hn::StoreU(hn::DemoteTo(dfh, r), dfh, red + k);
      hn::StoreU(hn::DemoteTo(dfh, qm), dfh, quad + k);
    }
  }
#endif
  for (; k < n; ++k) ReduceScalar(m * inv[k], red + k, quad + k);

  const hn::ScalableTag<float> df;
  const std::size_t N = hn::Lanes(df);
  std::size_t i = 0;
  const auto s1 = hn::Set(df, -1.6666654611e-1f), s2 = hn::Set(df, 8.3321608736e-3f),
             s3 = hn::Set(df, -1.9515295891e-4f), c1 = hn::Set(df, 4.166664568298827e-2f),
             c2 = hn::Set(df, -1.388731625493765e-3f), c3 = hn::Set(df, 2.443315711809948e-5f),
             one = hn::Set(df, 1.0f), half = hn::Set(df, 0.5f), q1 = hn::Set(df, 1.0f),
             q2 = hn::Set(df, 2.0f), q3 = hn::Set(df, 3.0f);
  for (; i + N <= n; i += N) {
    const auto t = hn::LoadU(df, red + i), q = hn::LoadU(df, quad + i);
    const auto z = hn::Mul(t, t);
    const auto sp = hn::MulAdd(hn::Mul(t, z), hn::MulAdd(hn::MulAdd(s3, z, s2), z, s1), t);
    const auto cp = hn::MulAdd(hn::Mul(z, z), hn::MulAdd(hn::MulAdd(c3, z, c2), z, c1), hn::NegMulAdd(half, z, one));
    const auto is1 = hn::Eq(q, q1), is2 = hn::Eq(q, q2), is3 = hn::Eq(q, q3);
    const auto odd = hn::Or(is1, is3);
    auto sv = hn::IfThenElse(odd, cp, sp), cv = hn::IfThenElse(odd, sp, cp);
    sv = hn::IfThenElse(hn::Or(is2, is3), hn::Neg(sv), sv);
    cv = hn::IfThenElse(hn::Or(is1, is2), hn::Neg(cv), cv);
    hn::StoreU(sv, df, s + i);
    hn::StoreU(cv, df, c + i);
  }
  for (; i < n; ++i) SinCosQ(red[i], quad[i], s + i, c + i);
}

// ---- double sin/cos (anchors of the sinusoid's rotations)
// ----------------------------------------- a = q·π/2 + t as above but t kept in double, then
// Taylor polynomials in t to degree 17 (sin) and 18 (cos): on |t| ≤ π/4 the first omitted terms are
// below 10⁻¹⁹, so s and c are within a few double ulps of sin and cos of the double angle a (plus
// |a|·2⁻⁵³ from the reduction where the target has no FMA).
#if HWY_HAVE_FLOAT64
template <class DD>
HWY_INLINE void SinCosF64(DD dd, hn::Vec<DD> a, hn::Vec<DD>* s, hn::Vec<DD>* c) {
  const auto qd = hn::Round(hn::Mul(a, hn::Set(dd, kTwoOverPi)));
  auto t = hn::NegMulAdd(qd, hn::Set(dd, kPio2_1), a);
  t = hn::NegMulAdd(qd, hn::Set(dd, kPio2_2), t);
  t = hn::NegMulAdd(qd, hn::Set(dd, kPio2_3), t);
  const auto q =
      hn::NegMulAdd(hn::Set(dd, 4.0), hn::Floor(hn::Mul(qd, hn::Set(dd, 0.25))), qd);  // qd mod 4
  const auto z = hn::Mul(t, t);
  // Horner in z with the coefficients ±1/n!.
  auto sp = hn::Set(dd, 1.0 / 355687428096000.0);               // 1/17!
  sp = hn::MulAdd(sp, z, hn::Set(dd, -1.0 / 1307674368000.0));  // −1/15!
  sp = hn::MulAdd(sp, z, hn::Set(dd, 1.0 / 6227020800.0));      // 1/13!
  sp = hn::MulAdd(sp, z, hn::Set(dd, -1.0 / 39916800.0));       // −1/11!
  sp = hn::MulAdd(sp, z, hn::Set(dd, 1.0 / 362880.0));          // 1/9!
  sp = hn::MulAdd(sp, z, hn::Set(dd, -1.0 / 5040.0));           // −1/7!
  sp = hn::MulAdd(sp, z, hn::Set(dd, 1.0 / 120.0));             // 1/5!
  sp = hn::MulAdd(sp, z, hn::Set(dd, -1.0 / 6.0));              // −1/3!
  sp = hn::MulAdd(hn::Mul(sp, z), t, t);
  auto cp = hn::Set(dd, -1.0 / 6402373705728000.0);             // −1/18!
  cp = hn::MulAdd(cp, z, hn::Set(dd, 1.0 / 20922789888000.0));  // 1/16!
  cp = hn::MulAdd(cp, z, hn::Set(dd, -1.0 / 87178291200.0));    // −1/14!
  cp = hn::MulAdd(cp, z, hn::Set(dd, 1.0 / 479001600.0));       // 1/12!
  cp = hn::MulAdd(cp, z, hn::Set(dd, -1.0 / 3628800.0));        // −1/10!
  cp = hn::MulAdd(cp, z, hn::Set(dd, 1.0 / 40320.0));           // 1/8!
  cp = hn::MulAdd(cp, z, hn::Set(dd, -1.0 / 720.0));            // −1/6!
  cp = hn::MulAdd(cp, z, hn::Set(dd, 1.0 / 24.0));              // 1/4!
  cp = hn::MulAdd(hn::Mul(cp, z), z, hn::NegMulAdd(hn::Set(dd, 0.5), z, hn::Set(dd, 1.0)));
  // Quadrant q: sin a = (sin t, cos t, −sin t, −cos t)[q], cos a = (cos t, −sin t, −cos t, sin
  // t)[q].
  const auto is1 = hn::Eq(q, hn::Set(dd, 1.0)), is2 = hn::Eq(q, hn::Set(dd, 2.0)),
             is3 = hn::Eq(q, hn::Set(dd, 3.0));
  const auto odd = hn::Or(is1, is3);
  const auto sv = hn::IfThenElse(odd, cp, sp), cv = hn::IfThenElse(odd, sp, cp);
  *s = hn::IfThenElse(hn::Or(is2, is3), hn::Neg(sv), sv);
  *c = hn::IfThenElse(hn::Or(is1, is2), hn::Neg(cv), cv);
}
#endif  // HWY_HAVE_FLOAT64

// ---- e^x for the softmaxes ---------------------------------------------------------------------
// Cody–Waite's two-part ln 2 for x = n·ln 2 + r (ExpSoftmax here, GELU's e^{−t²/2} in model_cpu.cc).
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;        // 15 significant bits: n·kLn2Hi exact for |n| < 2⁹
constexpr float kLn2Lo = 1.42860682030941723212e-6f;  // ln 2 − kLn2Hi

// k! in float (exact up to 13!).
constexpr float Factorial(int k) { return k <= 1 ? 1.0f : static_cast<float>(k) * Factorial(k - 1); }

// Σ_{k ≤ kDeg} r^k / k!, the Taylor series of e^r, by Horner's rule from the r^kDeg term down (one
// multiply-add a term; the coefficients 1/k! rounded to float).
template <int kDeg, int kK = kDeg, class D>
HWY_INLINE hn::Vec<D> ExpTaylor(D d, hn::Vec<D> r, hn::Vec<D> acc = hn::Vec<D>()) {
  if constexpr (kK == kDeg) {
    return ExpTaylor<kDeg, kK - 1>(d, r, hn::Set(d, 1.0f / Factorial(kDeg)));
  } else if constexpr (kK < 0) {
    return acc;
  } else {
    return ExpTaylor<kDeg, kK - 1>(d, r, hn::MulAdd(acc, r, hn::Set(d, 1.0f / Factorial(kK))));
  }
}

// e^x for x ≤ 88 (the attention's x − row max and x − lse are ≤ 0 up to rounding): x = n·ln 2 + r,
// n = round(x·log₂e), r ∈ [−0.347, 0.347] by Cody–Waite's two-part ln 2 (n·kLn2Hi exact for
// |n| < 2⁹), e^r by its Taylor series to r⁷/7! (the first omitted term ≤ 0.347⁸/8! < 6·10⁻⁹, a tenth
// of an ulp), and n added into the exponent field. n comes from the shifter 1.5·2²³: t = x·log₂e +
// 1.5·2²³ (one rounding, to nearest even) is an integer whose low bits are n, so nf = t − 1.5·2²³
// and n·2²³ = t's bits shifted left by 23, with no float-to-integer conversion (valid for
// |x·log₂e| < 2²²: every x the result keeps). Below −86 (e^x < 5·10⁻³⁸, where 2ⁿ·e^r could leave the
// normal range), at −∞ and for NaN the result is 0. About 15 instructions a vector; within 2 ulp of
// e^x (tested on every target).
template <class D>
HWY_INLINE hn::Vec<D> ExpSoftmax(D d, hn::Vec<D> x) {
  const hn::RebindToSigned<D> di;
  const auto shifter = hn::Set(d, 12582912.0f);  // 1.5·2²³
  const auto t = hn::MulAdd(x, hn::Set(d, kLog2e), shifter);
  const auto nf = hn::Sub(t, shifter);
  auto r = hn::NegMulAdd(nf, hn::Set(d, kLn2Hi), x);
  r = hn::NegMulAdd(nf, hn::Set(d, kLn2Lo), r);
  const auto e = ExpTaylor<7>(d, r);
  const auto scaled = hn::BitCast(d, hn::Add(hn::BitCast(di, e), hn::ShiftLeft<23>(hn::BitCast(di, t))));
  return hn::IfThenElseZero(hn::Ge(x, hn::Set(d, -86.0f)), scaled);
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#endif  // POSENC_SIMD_INL_H_
