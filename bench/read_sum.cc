// The decode rows' read baseline: a sum of every 8-byte word of a buffer in the widest vectors the
// CPU runs (Highway's dispatch, the best target chosen at run time), so that the baseline reads
// memory as fast as the core's vector loads draw it, not at a scalar or SSE2 loop's rate.
#include <cstddef>
#include <cstdint>

#include "bench/bench_cases.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/read_sum.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace posenc::bench_impl {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The sum modulo 2⁶⁴ of p[0 … n); four independent vector sums, so that the adds never wait.
std::uint64_t SumWords(const std::uint64_t* HWY_RESTRICT p, std::size_t n) {
  const hn::ScalableTag<std::uint64_t> d;
  const std::size_t L = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
  std::size_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    s0 = hn::Add(s0, hn::LoadU(d, p + i));
    s1 = hn::Add(s1, hn::LoadU(d, p + i + L));
    s2 = hn::Add(s2, hn::LoadU(d, p + i + 2 * L));
    s3 = hn::Add(s3, hn::LoadU(d, p + i + 3 * L));
  }
  for (; i + L <= n; i += L) s0 = hn::Add(s0, hn::LoadU(d, p + i));
  std::uint64_t total = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) total += p[i];
  return total;
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc::bench_impl
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posenc::bench_impl {
HWY_EXPORT(SumWords);

std::uint64_t sum_words(const std::uint64_t* p, std::size_t n) { return HWY_DYNAMIC_DISPATCH(SumWords)(p, n); }
}  // namespace posenc::bench_impl
#endif
