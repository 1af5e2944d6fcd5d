// The finiteness scans that decide the fused attention's careful steps (attn_fast::Simd::finite and
// attn_fast::all_finite), on every SIMD target: every position of every short length, views of
// float32, bfloat16 and float16 (contiguous, strided, packed q|k|v rows, long 16-bit runs), NaN, +inf
// and −inf found, the largest finite float passed.
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include <hwy/targets.h>

#include "attention/attention_tiles.h"
#include "posenc/view.h"
#include "testing.h"

namespace posenc {
namespace {

using I = std::int64_t;

// The scan that decides the careful steps: every position of every length, NaN, +inf and −inf; the
// largest finite float passes.
TEST(AttentionNaNMore, FinitenessScan) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const attn_fast::Simd sd = attn_fast::simd();
    SCOPED_TRACE(hwy::TargetName(target));
    for (std::size_t n = 0; n <= 40; ++n) {
      std::vector<float> x(n, 1.f);
      for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 3) - 1.f;
      if (n) x[n / 2] = std::numeric_limits<float>::max();
      EXPECT_TRUE(sd.finite(x.data(), n)) << n;
      for (std::size_t at = 0; at < n; ++at)
        for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
          std::vector<float> y = x;
          y[at] = bad;
          EXPECT_FALSE(sd.finite(y.data(), n)) << n << " " << at << " " << bad;
        }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The pass over a whole k or v [B, L, H, D] (all_finite) on every layout it walks differently, in
// float32, bfloat16 and float16: contiguous, tokens of H·D values inside a wider row (a packed q|k|v
// buffer), heads apart, and a strided last dimension; a NaN or ±inf at every element is found, and
// nothing outside the view is read (the padding holds NaN).
TEST(AttentionNaNMore, FinitenessOfAView) {
  const I B = 2, L = 3, H = 2, D = 9;  // H·D = 18: a vector and a tail on every target
  struct Layout {
    const char* name;
    std::array<I, 4> strides;
  };
  const Layout layouts[] = {{"contiguous", {L * H * D, H * D, D, 1}},
                            {"packed tokens", {L * 3 * H * D, 3 * H * D, D, 1}},
                            {"heads apart", {L * H * (D + 2), H * (D + 2), D + 2, 1}},
                            {"strided dims", {L * H * D * 2, H * D * 2, D * 2, 2}}};
  const float bads[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()};
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const attn_fast::Simd sd = attn_fast::simd();
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (const Layout& lay : layouts) {
        const I extent = (B - 1) * lay.strides[0] + (L - 1) * lay.strides[1] + (H - 1) * lay.strides[2] +
                         (D - 1) * lay.strides[3] + 1;
        std::vector<float> buf(static_cast<std::size_t>(extent));  // room for 16-bit values too
        View x;
        x.data = buf.data();
        x.dtype = dt;
        x.ndim = 4;
        x.shape = {B, L, H, D};
        for (std::size_t i = 0; i < 4; ++i) x.strides[i] = lay.strides[i];
        View all = View::contiguous(buf.data(), dt, {extent});
        for (I e = 0; e < extent; ++e) all.set(e, std::numeric_limits<double>::quiet_NaN());
        for (I e = 0; e < x.numel(); ++e) x.set(e, static_cast<double>(e % 7) - 3.0);
        for (int threads : {1, 2}) {
          SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + dtype_name(dt) + " " + lay.name +
                       " threads " + std::to_string(threads));
          EXPECT_TRUE(attn_fast::all_finite(sd, x, threads));
          for (I e = 0; e < x.numel(); ++e)
            for (float bad : bads) {
              const double keep = x.get(e);
              x.set(e, bad);
              EXPECT_FALSE(attn_fast::all_finite(sd, x, threads)) << e << " " << bad;
              x.set(e, keep);
            }
        }
      }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// A contiguous 16-bit view long enough to be cut into pieces over the threads: a bad value at either
// side of a piece's edge, or at the very end, is found.
TEST(AttentionNaNMore, FinitenessOfALong16BitView) {
  const I L = 4000, H = 2, D = 20;  // 160000 values: three pieces of 2^16
  for (DType dt : {DType::kBF16, DType::kF16}) {
    std::vector<std::uint16_t> buf(static_cast<std::size_t>(L * H * D));
    const View x = View::contiguous(buf.data(), dt, {1, L, H, D});
    for (I e = 0; e < x.numel(); ++e) x.set(e, 0.5);
    const I at[] = {0, (I{1} << 16) - 1, I{1} << 16, x.numel() - 1};
    for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      const attn_fast::Simd sd = attn_fast::simd();
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + dtype_name(dt) + " threads " +
                     std::to_string(threads));
        EXPECT_TRUE(attn_fast::all_finite(sd, x, threads));
        for (I e : at)
          for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
            x.set(e, bad);
            EXPECT_FALSE(attn_fast::all_finite(sd, x, threads)) << e;
            x.set(e, 0.5);
          }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// A packed view long enough to be cut into chunks of tokens over the threads: a bad value in the
// first or last token of either chunk, or at the very end, is found; the padding (NaN) is never read.
TEST(AttentionNaNMore, FinitenessOfALongPackedView) {
  const I L = 5000, H = 2, D = 9, row = 3 * H * D;  // 18 floats a token: chunks of 3640 tokens
  std::vector<float> buf(static_cast<std::size_t>(L * row), std::numeric_limits<float>::quiet_NaN());
  View x;
  x.data = buf.data() + H * D;  // the k of a q|k|v row
  x.dtype = DType::kF32;
  x.ndim = 4;
  x.shape = {1, L, H, D};
  x.strides = {L * row, row, D, 1};
  for (I e = 0; e < x.numel(); ++e) x.set(e, 0.5);
  const I per = (I{1} << 16) / (H * D);
  const I at[] = {0, per * H * D - 1, per * H * D, x.numel() - 1};
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const attn_fast::Simd sd = attn_fast::simd();
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(hwy::TargetName(target)) + " threads " + std::to_string(threads));
      EXPECT_TRUE(attn_fast::all_finite(sd, x, threads));
      for (I e : at) {
        x.set(e, -std::numeric_limits<float>::infinity());
        EXPECT_FALSE(attn_fast::all_finite(sd, x, threads)) << e;
        x.set(e, 0.5);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace posenc
