// fast::widen / fast::narrow (src/core/convert.h) on every SIMD target against half.h's scalar
// conversions, which are independent (bit manipulation or the compiler's _Float16), bit for bit:
// every 16-bit pattern up, and floats chosen to hit rounding ties, overflow, subnormals and NaN down.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/convert.h"
#include "posenc/half.h"

namespace posenc {
namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

template <class F>
void ForEachTarget(F&& body) {
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    body(std::string(hwy::TargetName(t)));
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Every 16-bit pattern, at every offset of a run (the vector body and the scalar tail).
template <class H>
void CheckWidenAllPatterns(const std::string& target) {
  std::vector<H> src(65536 + 7);
  for (std::size_t i = 0; i < src.size(); ++i) src[i].bits = static_cast<std::uint16_t>(i * 40503u);  // odd: a permutation
  for (std::int64_t off : {0, 1, 5}) {
    const std::int64_t n = static_cast<std::int64_t>(src.size()) - off;
    std::vector<float> got(static_cast<std::size_t>(n));
    fast::widen(src.data() + off, got.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      const float want = to_float(src[static_cast<std::size_t>(off + i)]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got[static_cast<std::size_t>(i)])) << target << " at " << i;
        ASSERT_EQ(std::signbit(want), std::signbit(got[static_cast<std::size_t>(i)])) << target;
      } else {
        ASSERT_EQ(bits(want), bits(got[static_cast<std::size_t>(i)])) << target << " bits " << src[static_cast<std::size_t>(off + i)].bits;
      }
    }
  }
}

std::vector<float> hard_floats() {
  std::vector<float> x = {0.f, -0.f, 1.f, -1.f, 65504.f, 65519.f, 65520.f, -65520.f, 1e-8f, 5.96e-8f, 2.98e-8f,
                          2.9802322e-8f, 6.1e-5f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                          1.f + 0x1p-8f, 1.f + 0x1p-7f + 0x1p-8f, 1.f + 0x1p-11f, 1.f + 0x1p-10f + 0x1p-11f};
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 20000; ++i) {  // random bit patterns, and exact ties of both formats
    std::uint32_t u = any(rng);
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
    u = (u & 0xffff0000u) | 0x8000u;  // a bfloat16 tie
    std::memcpy(&f, &u, 4);
    x.push_back(f);
    u = (any(rng) & 0xc7ffe000u) | 0x1000u;  // a float16 tie within or near its range
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  return x;
}

template <class H, class Round>
void CheckNarrow(const std::string& target, Round round) {
  const std::vector<float> x = hard_floats();
  for (std::int64_t off : {0, 3}) {
    const std::int64_t n = static_cast<std::int64_t>(x.size()) - off;
    std::vector<H> got(static_cast<std::size_t>(n));
    fast::narrow(x.data() + off, got.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      const float f = x[static_cast<std::size_t>(off + i)];
      const H want = round(f);
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(to_float(got[static_cast<std::size_t>(i)]))) << target << " NaN at " << i;
      } else {
        ASSERT_EQ(want.bits, got[static_cast<std::size_t>(i)].bits) << target << " float bits " << bits(f);
      }
    }
  }
}

TEST(Convert, WidenMatchesScalarOnEveryTarget) {
  ForEachTarget([](const std::string& t) {
    CheckWidenAllPatterns<bf16>(t);
    CheckWidenAllPatterns<f16>(t);
  });
}

TEST(Convert, NarrowRoundsToNearestEvenOnEveryTarget) {
  ForEachTarget([](const std::string& t) {
    CheckNarrow<bf16>(t, [](float f) { return to_bf16(f); });
    CheckNarrow<f16>(t, [](float f) { return to_f16(f); });
  });
}

TEST(Convert, EmptyRunsTouchNothing) {
  float f = 3.f;
  bf16 b{0x1234};
  fast::widen(&b, &f, 0);
  fast::narrow(&f, &b, 0);
  EXPECT_EQ(f, 3.f);
  EXPECT_EQ(b.bits, 0x1234);
}

}  // namespace
}  // namespace posenc
