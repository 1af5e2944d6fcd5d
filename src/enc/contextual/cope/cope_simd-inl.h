// CoPE's gate σ(a) on vectors, per Highway target (re-included through foreach_target.h by the
// kernels that take cope: attention_cope_cpu.cc, attention_decode_task.cc).
#if defined(POSENC_COPE_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSENC_COPE_SIMD_INL_H_
#undef POSENC_COPE_SIMD_INL_H_
#else
#define POSENC_COPE_SIMD_INL_H_
#endif

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {

// σ(a) without overflow; 0 for a = −inf (e^−|a| by ExpSoftmax, core/simd-inl.h: 0 below −86).
// 1/(1 + e) is the approximate reciprocal refined by one Newton step (≥ 22 good bits from the 12-
// or 14-bit estimate; a division costs more).
template <class D, class V>
HWY_INLINE V CopeSigmoid(D d, V a) {
  namespace hn = hwy::HWY_NAMESPACE;
  const V e = ExpSoftmax(d, hn::Neg(hn::Abs(a)));
  const V den = hn::Add(hn::Set(d, 1.f), e);  // in [1, 2]
  const V r0 = hn::ApproximateReciprocal(den);
  const V r = hn::Mul(r0, hn::NegMulAdd(den, r0, hn::Set(d, 2.f)));
  return hn::IfThenElse(hn::Ge(a, hn::Zero(d)), r, hn::Mul(e, r));
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#endif  // POSENC_COPE_SIMD_INL_H_
