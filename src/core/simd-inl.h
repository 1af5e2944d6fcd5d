// Per-target SIMD helpers shared by the fast kernels (re-included once per Highway target through
// foreach_target.h): float32 math on float32 / bfloat16 / float16 storage, and an exact-angle sincos.
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
template <class D>
HWY_INLINE hn::Vec<D> LoadF(D d, const hwy::float16_t* HWY_RESTRICT p) {
  const hn::Rebind<hwy::float16_t, D> d16;
  return hn::PromoteTo(d, hn::LoadU(d16, p));
}

template <class D>
HWY_INLINE void StoreF(D d, hn::Vec<D> v, float* HWY_RESTRICT p) {
  hn::StoreU(v, d, p);
}
// Round to nearest even (Highway 1.0.3's DemoteTo truncates); NaN stays a quiet NaN, as half.h.
template <class D>
HWY_INLINE void StoreF(D d, hn::Vec<D> v, hwy::bfloat16_t* HWY_RESTRICT p) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const hn::Rebind<std::uint16_t, D> d16;
  const auto u = hn::BitCast(du, v);
  auto rounded = hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
  rounded = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Or(u, hn::Set(du, 0x400000u)), rounded);
  const auto hi = hn::BitCast(di, hn::ShiftRight<16>(rounded));
  hn::StoreU(hn::DemoteTo(d16, hi), d16, reinterpret_cast<std::uint16_t*>(p));
}
template <class D>
HWY_INLINE void StoreF(D d, hn::Vec<D> v, hwy::float16_t* HWY_RESTRICT p) {
  const hn::Rebind<hwy::float16_t, D> d16;
  hn::StoreU(hn::DemoteTo(d16, v), d16, p);
}

// Non-temporal store of float32 when aligned (else a plain store); 16-bit storage uses StoreF.
template <class D>
HWY_INLINE void StreamF(D d, hn::Vec<D> v, float* HWY_RESTRICT p) {
  if ((reinterpret_cast<std::uintptr_t>(p) & (hn::Lanes(d) * sizeof(float) - 1)) == 0)
    hn::Stream(v, d, p);
  else
    hn::StoreU(v, d, p);
}
template <class D, typename T>
HWY_INLINE void StreamF(D d, hn::Vec<D> v, T* HWY_RESTRICT p) {
  StoreF(d, v, p);
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

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#endif  // POSENC_SIMD_INL_H_
