// Private helpers of the fast dispatchers (src/enc/*/*_cpu.cc): which views the SIMD kernels take,
// aliasing, and how many threads a call gets.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "posenc/threads.h"
#include "posenc/view.h"

namespace posenc::fast {

// Storage dtypes the kernels handle (math in float32).
inline bool fast_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// The kernels need the innermost dimension contiguous; outer dimensions may have any strides.
inline bool inner_contiguous(const View& v) {
  return v.ndim == 0 || v.strides[v.ndim - 1] == 1 || v.shape[v.ndim - 1] <= 1;
}

// Byte extent [lo, hi) that a view touches.
inline void extent(const View& v, std::uintptr_t* lo, std::uintptr_t* hi) {
  std::int64_t mn = 0, mx = 0;
  for (int i = 0; i < v.ndim; ++i) {
    if (v.shape[i] == 0) { *lo = *hi = reinterpret_cast<std::uintptr_t>(v.data); return; }
    const std::int64_t span = (v.shape[i] - 1) * v.strides[i];
    (span < 0 ? mn : mx) += span;
  }
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(v.dtype));
  *lo = reinterpret_cast<std::uintptr_t>(v.data) + static_cast<std::uintptr_t>(mn * es);
  *hi = reinterpret_cast<std::uintptr_t>(v.data) + static_cast<std::uintptr_t>((mx + 1) * es);
}

// True when a and b share memory without being the very same view (in place is fine; a partial
// overlap is left to the reference, which reads all of its input before writing).
inline bool partial_alias(const View& a, const View& b) {
  if (!a.present() || !b.present()) return false;
  std::uintptr_t alo, ahi, blo, bhi;
  extent(a, &alo, &ahi);
  extent(b, &blo, &bhi);
  if (ahi <= blo || bhi <= alo) return false;
  if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return true;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] > 1 && a.strides[i] != b.strides[i]) return true;
  return false;
}

// The largest |angle| (radians, formed in double) the fast kernels take: simd-inl.h's reduction
// a = q·π/2 + t rounds a·2/π to the integer q, which stays within 0.013 of a·2/π up to 2^47 (the
// product's rounding, 2^-7, and 2/π's, 2^-7.6), so t stays within 0.81 of 0, where the float
// polynomials hold. Beyond it q may be off by whole units and t leaves that range (RoPE at position
// 2^60 came out 4.8·10⁹ times longer than its input; huge frequencies gave NaN), so a call with a
// larger angle runs the reference instead (std::sin, std::cos of the double angle, exactly
// reduced): one check per call, none per element.
constexpr double kMaxFastAngle = 0x1p47;

// max |v| over the positions v (0 for none).
inline std::int64_t max_abs(const std::vector<std::int64_t>& v) {
  std::int64_t m = 0;
  for (std::int64_t x : v) m = std::max(m, x < 0 ? -x : x);
  return m;
}

// Whether this is an AMD CPU (x86 GCC and Clang builds; false elsewhere): where a measured choice
// differs between AMD's and Intel's CPUs (docs/performance.md). Once per process.
inline bool amd_cpu() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  static const bool amd = __builtin_cpu_is("amd");
  return amd;
#else
  return false;
#endif
}

// Below this many elements a call stays on the calling thread.
constexpr std::int64_t kParallelMin = std::int64_t{1} << 15;
inline int threads_for(std::int64_t elements) {
  return elements < kParallelMin ? 1 : std::max(1, num_threads());
}

// Outputs at least this large (bytes) are written with non-temporal stores where aligned (they would
// not stay in cache anyway, and streaming saves the read-for-ownership).
constexpr std::int64_t kStreamMinBytes = std::int64_t{8} << 20;

// Runs body(begin, end) over [0, n) cut into `threads` contiguous ranges, one per thread; with one
// thread the body is called directly (no OpenMP region: a decode-sized call pays nothing for it).
template <class F>
void parallel_ranges(std::int64_t n, int threads, const F& body) {
  if (threads <= 1 || n <= 1) {
    if (n > 0) body(std::int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const std::int64_t a = n * t / T, b = n * (t + 1) / T;
    if (b > a) body(a, b);
  }
}

// Tables that depend only on a few parameters (inverse frequencies, rotation steps): the last ones
// built at this call site on this thread are kept while `key` stays the same, so that a decode step
// does not rebuild them. The reference stays valid until the next call here on this thread.
template <class Key, class Build>
const auto& cached_tables(const Key& key, const Build& build) {
  using Tables = decltype(build());
  thread_local struct {
    bool ok = false;
    Key key{};
    Tables tables{};
  } c;
  if (!c.ok || !(c.key == key)) {
    c.ok = false;
    c.tables = build();
    c.key = key;
    c.ok = true;
  }
  return c.tables;
}

}  // namespace posenc::fast
