// convert.h's conversions, compiled for every Highway target (the loads and stores of simd-inl.h).
#include "core/convert.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/convert.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class T>
void Widen(const T* HWY_RESTRICT src, float* HWY_RESTRICT dst, std::int64_t n) {
  const hn::ScalableTag<float> d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(LoadF(d, src + i), d, dst + i);
  for (; i < n; ++i) dst[i] = ToF(src[i]);
}

template <class T>
void Narrow(const float* HWY_RESTRICT src, T* HWY_RESTRICT dst, std::int64_t n) {
  const hn::ScalableTag<float> d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + L <= n; i += L) StoreF(d, hn::LoadU(d, src + i), dst + i);
  for (; i < n; ++i) FromF(src[i], dst + i);
}

void WidenBf16(const void* s, float* d, std::int64_t n) { Widen(static_cast<const hwy::bfloat16_t*>(s), d, n); }
void WidenF16(const void* s, float* d, std::int64_t n) { Widen(static_cast<const hwy::float16_t*>(s), d, n); }
void NarrowBf16(const float* s, void* d, std::int64_t n) { Narrow(s, static_cast<hwy::bfloat16_t*>(d), n); }
void NarrowF16(const float* s, void* d, std::int64_t n) { Narrow(s, static_cast<hwy::float16_t*>(d), n); }

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posenc {
HWY_EXPORT(WidenBf16);
HWY_EXPORT(WidenF16);
HWY_EXPORT(NarrowBf16);
HWY_EXPORT(NarrowF16);

namespace fast {
void widen(const bf16* src, float* dst, std::int64_t n) { HWY_DYNAMIC_DISPATCH(WidenBf16)(src, dst, n); }
void widen(const f16* src, float* dst, std::int64_t n) { HWY_DYNAMIC_DISPATCH(WidenF16)(src, dst, n); }
void narrow(const float* src, bf16* dst, std::int64_t n) { HWY_DYNAMIC_DISPATCH(NarrowBf16)(src, dst, n); }
void narrow(const float* src, f16* dst, std::int64_t n) { HWY_DYNAMIC_DISPATCH(NarrowF16)(src, dst, n); }
}  // namespace fast
}  // namespace posenc
#endif  // HWY_ONCE
