// The fixtures of the fast elementwise kernels' tests (test_fast_rope.cc, test_fast_absolute.cc,
// test_fast_bias.cc, test_fast_rotary.cc): tensors in buffers with guard bands, tolerances per
// dtype, a fast call checked against its reference call, and a loop over the SIMD targets.
#pragma once

#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "enc/bias/kerple/kerple_math.h"
#include "posenc/absolute.h"
#include "posenc/bias.h"
#include "posenc/half.h"
#include "posenc/reference.h"
#include "posenc/rope.h"
#include "posenc/rotary.h"
#include "posenc/threads.h"
#include "testing.h"

namespace posenc::fast_elementwise_testing {

using ::posenc::testing::AllClose;
using ::posenc::testing::randn;

inline constexpr DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
inline constexpr unsigned char kSentinel = 0xA5;
inline constexpr std::int64_t kGuard = 8;  // elements before and after every buffer

// A tensor in a buffer with guard bands (sentinel bytes) before, after and between strided rows.
struct Buf {
  std::vector<unsigned char> mem;
  View v;
  std::size_t es = 0, base = 0;
  std::int64_t span = 0;
  bool dense = false;  // contiguous, no gaps

  // align64: the view starts on a 64-byte boundary (then + 1 element if misaligned), so that the
  // kernels' aligned non-temporal stores are taken.
  Buf(DType dt, const std::vector<std::int64_t>& shape, bool strided = false,
      bool misaligned = false, bool align64 = false) {
    es = dtype_size(dt);
    const int nd = static_cast<int>(shape.size());
    v.dtype = dt;
    v.ndim = nd;
    std::int64_t s = 1;
    for (int i = nd - 1; i >= 0; --i) {
      v.shape[i] = shape[static_cast<std::size_t>(i)];
      v.strides[i] = s;
      s *= v.shape[i];
      if (strided && i == nd - 1) s += 3;  // gap after every innermost row
      if (strided && i == nd - 2) s += 5;
    }
    span = 1;
    for (int i = 0; i < nd; ++i) {
      if (v.shape[i] == 0) span = 0;
      if (span) span += (v.shape[i] - 1) * v.strides[i];
    }
    mem.assign((static_cast<std::size_t>(span) + 2 * kGuard + 1) * es + (align64 ? 64 : 0),
               kSentinel);
    base = static_cast<std::size_t>(kGuard);
    while (align64 && reinterpret_cast<std::uintptr_t>(mem.data() + base * es) % 64 != 0) ++base;
    base += misaligned ? 1 : 0;
    v.data = mem.data() + base * es;
    dense = !strided && v.is_contiguous();
  }
  Buf(const Buf&) = delete;

  // Back to the state after construction (every byte the sentinel), reusing the memory.
  void reset() { std::memset(mem.data(), kSentinel, mem.size()); }
  // A contiguous view's elements copied from another contiguous view of the same dtype and size.
  void copy_from(const Buf& o) {
    std::memcpy(v.data, o.v.data, static_cast<std::size_t>(v.numel()) * es);
  }

  void fill(const std::vector<double>& x) const {
    for (std::int64_t i = 0; i < v.numel(); ++i) v.set(i, x[static_cast<std::size_t>(i)]);
  }
  std::vector<double> values() const { return to_doubles(v); }

  // Element i of a dense buffer, without View::get (large tensors).
  double at(std::size_t i) const {
    const unsigned char* e = static_cast<const unsigned char*>(v.data) + i * es;
    if (v.dtype == DType::kF32) {
      float f;
      std::memcpy(&f, e, 4);
      return f;
    }
    std::uint16_t bits;
    std::memcpy(&bits, e, 2);
    return v.dtype == DType::kBF16 ? to_float(bf16{bits}) : to_float(f16{bits});
  }

  // AllClose(values(), want, atol, rtol) for a dense buffer, without building values() (whose fresh
  // large vector costs more than the kernels under test).
  ::testing::AssertionResult close_to(const std::vector<double>& want, double atol,
                                      double rtol) const {
    if (static_cast<std::size_t>(v.numel()) != want.size())
      return ::testing::AssertionFailure() << "size";
    int bad = 0;
    std::string msg;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double g = at(i), w = want[i];
      if (std::isinf(g) && std::isinf(w) && (g > 0) == (w > 0)) continue;
      if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
        if (bad++ < 5)
          msg += " [" + std::to_string(i) + "] got " + std::to_string(g) + " want " +
                 std::to_string(w) + ";";
      }
    }
    if (bad)
      return ::testing::AssertionFailure() << bad << " of " << want.size() << " differ:" << msg;
    return ::testing::AssertionSuccess();
  }

  // Every byte the view does not cover still holds the sentinel.
  ::testing::AssertionResult guards_ok() const {
    if (dense) {  // the bytes before and after the view
      const std::size_t a = base * es, b = a + static_cast<std::size_t>(v.numel()) * es;
      for (std::size_t i = 0; i < mem.size(); i = i + 1 == a ? b : i + 1)
        if (mem[i] != kSentinel)
          return ::testing::AssertionFailure()
                 << "byte " << i << " (view at " << a << ".." << b << ") was overwritten";
      return ::testing::AssertionSuccess();
    }
    std::vector<char> mine(mem.size() / es, 0);
    for (std::int64_t i = 0; i < v.numel(); ++i) mine[base + static_cast<std::size_t>(v.offset_of(i))] = 1;
    for (std::size_t e = 0; e < mine.size(); ++e) {
      if (mine[e]) continue;
      for (std::size_t b = 0; b < es; ++b)
        if (mem[e * es + b] != kSentinel)
          return ::testing::AssertionFailure() << "byte " << b << " of element " << e << " (base " << base
                                               << ") was overwritten";
    }
    return ::testing::AssertionSuccess();
  }
};

struct Tol {
  double atol, rtol;
};
inline Tol tol_for(DType dt) {
  switch (dt) {
    case DType::kBF16: return {1.6e-2, 8e-3};  // one bfloat16 ulp (2⁻⁸) either side
    case DType::kF16: return {2e-3, 1e-3};     // one float16 ulp (2⁻¹¹)
    default: return {6e-6, 1e-5};              // float32: sin/cos error ≤ 3·10⁻⁷ times |x| ≲ 5
  }
}

inline std::string target_name(std::int64_t t) { return hwy::TargetName(t); }

// One fast call (status s; output x when in place, else y) against its reference call (rs, ry):
// both succeed, the values agree within the dtype's tolerance, and x's and y's guard bands hold.
inline void ExpectCallMatches(const Status& s, const Status& rs, const std::string& what, DType dt, bool in_place,
                       const Buf& x, const Buf& y, const Buf& ry) {
  ASSERT_TRUE(s.ok()) << what << ": " << s.message();
  ASSERT_TRUE(rs.ok()) << rs.message();
  const Tol t = tol_for(dt);
  const Buf& got = in_place ? x : y;
  EXPECT_TRUE(AllClose(got.values(), ry.values(), t.atol, t.rtol)) << what;
  EXPECT_TRUE(x.guards_ok()) << what;
  EXPECT_TRUE(y.guards_ok()) << what;
}

// Runs body once per SIMD target compiled and supported here, then restores the default.
inline void ForEachTarget(const std::function<void(const std::string&)>& body) {
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    body(target_name(t));
  }
  hwy::SetSupportedTargetsForTest(0);
}

inline std::vector<double> random_positions(std::int64_t n, std::uint64_t seed, double scale) {
  std::vector<double> r = randn(static_cast<std::size_t>(n), seed);
  for (double& x : r) x = std::floor(std::fabs(x) * scale);
  return r;
}

}  // namespace posenc::fast_elementwise_testing
