// RoPE (Su et al. 2021). The three formulations of the articles are each written out here, on their
// own, and the library must agree with all of them; the other tests check properties and plumbing.
#include <cmath>
#include <complex>
#include <cstdint>
#include <functional>
#include <vector>

#include "posenc/rope.h"
#include "posenc/rotary.h"
#include "testing.h"

namespace posenc {
namespace {

using testing::AllClose;
using testing::GradCheck;
using testing::V;
using testing::dot;
using testing::randn;
using testing::to_float;

using Vec = std::vector<double>;
using Sz = std::size_t;

// (1) “位置编码” (docs/articles.md): the block-diagonal rotation matrix R_{Θ,m} (d×d), θ_k = theta^(−(2k)/d), sin on the
// sub-diagonal and −sin on the super-diagonal; y = R·x.
Vec rotate_matrix(const Vec& x, std::int64_t m, double theta) {
  const Sz d = x.size();
  Vec R(d * d, 0.0);
  for (Sz k = 0; k < d / 2; ++k) {
    const double th = std::pow(theta, -static_cast<double>(2 * k) / static_cast<double>(d));
    const double a = static_cast<double>(m) * th;
    R[(2 * k) * d + 2 * k] = std::cos(a);
    R[(2 * k) * d + 2 * k + 1] = -std::sin(a);
    R[(2 * k + 1) * d + 2 * k] = std::sin(a);
    R[(2 * k + 1) * d + 2 * k + 1] = std::cos(a);
  }
  Vec y(d, 0.0);
  for (Sz r = 0; r < d; ++r)
    for (Sz c = 0; c < d; ++c) y[r] += R[r * d + c] * x[c];
  return y;
}

// (2) “Position Embedding”'s complex form (Llama): (x_{2k} + i·x_{2k+1})·e^{i·m·freq_k}, freq_k = 1/theta^(2k/d).
Vec rotate_complex(const Vec& x, std::int64_t m, double theta) {
  const Sz d = x.size();
  Vec y(d);
  for (Sz k = 0; k < d / 2; ++k) {
    const double freq = 1.0 / std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(d));
    const std::complex<double> z =
        std::complex<double>(x[2 * k], x[2 * k + 1]) * std::polar(1.0, static_cast<double>(m) * freq);
    y[2 * k] = z.real();
    y[2 * k + 1] = z.imag();
  }
  return y;
}

// (3) “Position Embedding”'s element-wise form: x⊙cos + rotate_every_two(x)⊙sin, rotate_every_two(x) =
// (−x1, x0, −x3, x2, …), cos/sin repeat_interleave'd, div_term = exp(2k·(−ln theta / d)).
Vec rotate_elementwise(const Vec& x, std::int64_t m, double theta) {
  const Sz d = x.size();
  Vec cos_emb(d), sin_emb(d), alt(d), y(d);
  for (Sz k = 0; k < d / 2; ++k) {
    const double div_term = std::exp(static_cast<double>(2 * k) * -(std::log(theta) / static_cast<double>(d)));
    const double a = static_cast<double>(m) * div_term;
    cos_emb[2 * k] = cos_emb[2 * k + 1] = std::cos(a);
    sin_emb[2 * k] = sin_emb[2 * k + 1] = std::sin(a);
    alt[2 * k] = -x[2 * k + 1];
    alt[2 * k + 1] = x[2 * k];
  }
  for (Sz i = 0; i < d; ++i) y[i] = x[i] * cos_emb[i] + alt[i] * sin_emb[i];
  return y;
}

using RotateFn = std::function<Vec(const Vec&, std::int64_t, double)>;

// Applies `fn` to every [D] vector of x [B, L, H, D], token (b, l) at position pos[b·L + l], to the
// first r dims (interleaved pairing; dims ≥ r copied).
Vec apply_all(const Vec& x, std::int64_t B, std::int64_t L, std::int64_t H, std::int64_t D,
              const std::vector<std::int64_t>& pos, std::int64_t r, double theta, const RotateFn& fn) {
  Vec y = x;
  for (std::int64_t t = 0; t < B * L; ++t)
    for (std::int64_t h = 0; h < H; ++h) {
      const Sz base = static_cast<Sz>((t * H + h) * D);
      const Vec head(x.begin() + static_cast<std::ptrdiff_t>(base), x.begin() + static_cast<std::ptrdiff_t>(base + static_cast<Sz>(r)));
      const Vec out = fn(head, pos[static_cast<Sz>(t)], theta);
      for (Sz i = 0; i < static_cast<Sz>(r); ++i) y[base + i] = out[i];
    }
  return y;
}

std::vector<std::int64_t> arange(std::int64_t B, std::int64_t L, std::int64_t offset) {
  std::vector<std::int64_t> p;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t l = 0; l < L; ++l) p.push_back(offset + l);
  return p;
}

Vec as_doubles(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ---- the three formulations --------------------------------------------------------------------

TEST(Rope, InterleavedAgreesWithArticlesMatrixComplexAndElementwiseForms) {
  const std::int64_t B = 2, L = 5, H = 3, D = 8;
  const Vec x = randn(B * L * H * D, 21);
  std::vector<std::int64_t> ids = {0, 1, 2, 3, 4, 9, 40, 7, 1000, 3};
  const Positions pos{View::contiguous(ids.data(), DType::kI64, {B, L}), 0};
  Vec xc = x, y(x.size());
  ASSERT_TRUE(rope_forward({.layout = RopeLayout::kInterleaved}, V(xc, {B, L, H, D}), pos, V(y, {B, L, H, D})).ok());
  EXPECT_TRUE(AllClose(y, apply_all(x, B, L, H, D, ids, D, 10000.0, rotate_matrix), 1e-12, 1e-12));
  EXPECT_TRUE(AllClose(y, apply_all(x, B, L, H, D, ids, D, 10000.0, rotate_complex), 1e-12, 1e-12));
  EXPECT_TRUE(AllClose(y, apply_all(x, B, L, H, D, ids, D, 10000.0, rotate_elementwise), 1e-12, 1e-12));

  // Another theta, an odd number of pairs.
  const std::int64_t D6 = 6;
  const Vec x6 = randn(B * L * H * D6, 22);
  Vec x6c = x6, y6(x6.size());
  ASSERT_TRUE(rope_forward({.layout = RopeLayout::kInterleaved, .theta = 500.0}, V(x6c, {B, L, H, D6}), pos,
                           V(y6, {B, L, H, D6}))
                  .ok());
  EXPECT_TRUE(AllClose(y6, apply_all(x6, B, L, H, D6, ids, D6, 500.0, rotate_matrix), 1e-12, 1e-12));
}

// Half layout pairs (k, k + r/2): it equals the interleaved rotation of the vector permuted so that
// those pairs become neighbours, permuted back.
TEST(Rope, HalfLayoutIsInterleavedOnPermutedPairs) {
  const std::int64_t B = 1, L = 4, H = 2, D = 10;
  const Vec x = randn(B * L * H * D, 23);
  for (std::int64_t r : {D, std::int64_t{6}}) {
    Vec xc = x, y(x.size());
    ASSERT_TRUE(rope_forward({.layout = RopeLayout::kHalf, .rotary_dim = r}, V(xc, {B, L, H, D}), {{}, 3},
                             V(y, {B, L, H, D}))
                    .ok());
    Vec want = x;
    for (std::int64_t t = 0; t < B * L; ++t)
      for (std::int64_t h = 0; h < H; ++h) {
        const Sz base = static_cast<Sz>((t * H + h) * D);
        const Sz half = static_cast<Sz>(r / 2);
        Vec w(static_cast<Sz>(r));
        for (Sz k = 0; k < half; ++k) {
          w[2 * k] = x[base + k];
          w[2 * k + 1] = x[base + k + half];
        }
        const Vec wr = rotate_complex(w, 3 + t, 10000.0);
        for (Sz k = 0; k < half; ++k) {
          want[base + k] = wr[2 * k];
          want[base + k + half] = wr[2 * k + 1];
        }
      }
    EXPECT_TRUE(AllClose(y, want, 1e-12, 1e-12)) << "r=" << r;
  }
}

// The default layout is half, for RoPE and for every rotary encoding of rotary.h: rope_forward with
// default parameters is transformers' form x·cos + rotate_half(x)·sin, cos and sin of cat(ω, ω)·m.
TEST(Rope, DefaultLayoutIsHalfAsHuggingFace) {
  EXPECT_EQ(RopeParams{}.layout, RopeLayout::kHalf);
  EXPECT_EQ(Rope2dParams{}.rope.layout, RopeLayout::kHalf);
  EXPECT_EQ(MropeParams{}.rope.layout, RopeLayout::kHalf);
  EXPECT_EQ(XposParams{}.rope.layout, RopeLayout::kHalf);
  const std::int64_t B = 1, L = 5, H = 2, D = 8, half = D / 2;
  const Vec x = randn(B * L * H * D, 29);
  Vec xc = x, y(x.size());
  ASSERT_TRUE(rope_forward({}, V(xc, {B, L, H, D}), {{}, 7}, V(y, {B, L, H, D})).ok());
  Vec want(x.size());
  for (std::int64_t l = 0; l < L; ++l)
    for (std::int64_t h = 0; h < H; ++h) {
      const Sz base = static_cast<Sz>((l * H + h) * D);
      for (std::int64_t e = 0; e < D; ++e) {
        const std::int64_t k = e % half;
        const double ang = static_cast<double>(7 + l) * std::pow(10000.0, -static_cast<double>(2 * k) / D);
        const double rot = e < half ? -x[base + static_cast<Sz>(e + half)] : x[base + static_cast<Sz>(e - half)];
        want[base + static_cast<Sz>(e)] = x[base + static_cast<Sz>(e)] * std::cos(ang) + rot * std::sin(ang);
      }
    }
  EXPECT_TRUE(AllClose(y, want, 1e-12, 1e-12));
}

TEST(Rope, PartialRotaryLeavesTrailingDimsUntouched) {
  const std::int64_t B = 2, L = 3, H = 2, D = 10, r = 4;
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
    std::vector<float> x = to_float(randn(B * L * H * D, 24)), y(x.size(), 0.0f);
    ASSERT_TRUE(rope_forward({.layout = layout, .rotary_dim = r}, V(x, {B, L, H, D}), {{}, 7}, V(y, {B, L, H, D})).ok());
    for (Sz t = 0; t < static_cast<Sz>(B * L * H); ++t)
      for (Sz d = r; d < static_cast<Sz>(D); ++d) EXPECT_EQ(y[t * D + d], x[t * D + d]) << t << "," << d;
    if (layout == RopeLayout::kInterleaved) {
      // The first r dims: θ_k uses r, not D.
      EXPECT_TRUE(AllClose(as_doubles(y), apply_all(as_doubles(x), B, L, H, D, arange(B, L, 7), r, 1e4, rotate_matrix),
                           1e-6, 1e-6));
    }
  }
}

// ---- properties --------------------------------------------------------------------------------

TEST(Rope, PreservesNorms) {
  const std::int64_t B = 1, L = 6, H = 3, D = 16;
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
    const Vec x = randn(B * L * H * D, 25);
    Vec xc = x, y(x.size());
    ASSERT_TRUE(rope_forward({.layout = layout, .rotary_dim = 12}, V(xc, {B, L, H, D}), {{}, 123456}, V(y, {B, L, H, D})).ok());
    for (Sz v = 0; v < static_cast<Sz>(B * L * H); ++v) {
      double nx = 0, ny = 0;
      for (Sz d = 0; d < static_cast<Sz>(D); ++d) {
        nx += x[v * D + d] * x[v * D + d];
        ny += y[v * D + d] * y[v * D + d];
      }
      EXPECT_NEAR(ny, nx, 1e-12 * nx);
    }
  }
}

// q_m·k_n = qᵀ R(n − m) k: shifting both positions by s changes nothing.
TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const std::int64_t D = 12;
  const Vec q = randn(D, 26), k = randn(D, 27);
  auto score = [&](const RopeParams& p, std::int64_t m, std::int64_t n) {
    Vec qk = q;
    qk.insert(qk.end(), k.begin(), k.end());  // [B=1, L=2, H=1, D]: q at m, k at n
    std::vector<std::int64_t> ids = {m, n};
    Vec y(qk.size());
    EXPECT_TRUE(rope_forward(p, V(qk, {1, 2, 1, D}), {View::contiguous(ids.data(), DType::kI64, {2}), 0},
                             V(y, {1, 2, 1, D}))
                    .ok());
    return dot(Vec(y.begin(), y.begin() + D), Vec(y.begin() + D, y.end()));
  };
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf})
    for (std::int64_t r : {D, std::int64_t{8}}) {
      const RopeParams p{.layout = layout, .rotary_dim = r};
      for (auto [m, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 0}, {5, 2}, {3, 17}, {100, 1}}) {
        const double base = score(p, m, n);
        for (std::int64_t s : {1, 13, 4096}) EXPECT_NEAR(score(p, m + s, n + s), base, 1e-9) << m << "," << n << "+" << s;
      }
      // …and it does depend on m − n.
      EXPECT_GT(std::fabs(score(p, 5, 2) - score(p, 2, 5)), 1e-6);
    }
}

// ---- positions, dtypes, strides ----------------------------------------------------------------

TEST(Rope, PositionsFlatBatchedInt32Int64AndOffsets) {
  const std::int64_t B = 2, L = 3, H = 2, D = 6;
  const Vec x = randn(B * L * H * D, 28);
  auto check = [&](const Positions& pos, const std::vector<std::int64_t>& want_pos) {
    Vec xc = x, y(x.size());
    ASSERT_TRUE(rope_forward({.layout = RopeLayout::kInterleaved}, V(xc, {B, L, H, D}), pos, V(y, {B, L, H, D})).ok());
    EXPECT_TRUE(AllClose(y, apply_all(x, B, L, H, D, want_pos, D, 1e4, rotate_complex), 1e-12, 1e-12));
  };
  std::vector<std::int32_t> flat32 = {4, 0, 9};
  check({View::contiguous(flat32.data(), DType::kI32, {L}), 0}, {4, 0, 9, 4, 0, 9});
  check({View::contiguous(flat32.data(), DType::kI32, {L}), 10}, {14, 10, 19, 14, 10, 19});
  std::vector<std::int64_t> batched64 = {1, 2, 3, 50, 60, 70};
  check({View::contiguous(batched64.data(), DType::kI64, {B, L}), 0}, batched64);
  std::vector<std::int32_t> batched32 = {1, 2, 3, 50, 60, 70};
  check({View::contiguous(batched32.data(), DType::kI32, {B, L}), 2}, {3, 4, 5, 52, 62, 72});
  check({{}, 0}, arange(B, L, 0));
  check({{}, 31}, arange(B, L, 31));
}

TEST(Rope, Float32AgreesWithFloat64) {
  const std::int64_t B = 2, L = 4, H = 3, D = 8;
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
    const std::vector<float> xf = to_float(randn(B * L * H * D, 29));
    Vec x64 = as_doubles(xf), y64(x64.size());
    std::vector<float> xf_copy = xf, y32(xf.size());
    const RopeParams p{.layout = layout};
    ASSERT_TRUE(rope_forward(p, V(x64, {B, L, H, D}), {{}, 500}, V(y64, {B, L, H, D})).ok());
    ASSERT_TRUE(rope_forward(p, V(xf_copy, {B, L, H, D}), {{}, 500}, V(y32, {B, L, H, D})).ok());
    EXPECT_TRUE(AllClose(as_doubles(y32), y64, 1e-6, 1e-6));
    EXPECT_FALSE(AllClose(y64, x64, 1e-3, 0));  // it did rotate
  }
}

// x lives in a padded [B, H, L, D + 3] buffer and is viewed as [B, L, H, D] (neither contiguous nor
// in C order); y is written through a strided view too, whose padding must stay untouched.
TEST(Rope, StridedViews) {
  const std::int64_t B = 2, L = 3, H = 2, D = 6, P = D + 3;
  const Vec buf = randn(B * H * L * P, 30);
  View xs;
  xs.data = const_cast<double*>(buf.data());
  xs.dtype = DType::kF64;
  xs.ndim = 4;
  xs.shape = {B, L, H, D, 0, 0};
  xs.strides = {H * L * P, P, L * P, 1, 0, 0};
  ASSERT_FALSE(xs.is_contiguous());
  Vec contiguous_x = to_doubles(xs);

  Vec ybuf(buf.size(), 42.0);
  View ys = xs;
  ys.data = ybuf.data();
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
    const RopeParams p{.layout = layout, .rotary_dim = 4};
    Vec want(contiguous_x.size());
    ASSERT_TRUE(rope_forward(p, V(contiguous_x, {B, L, H, D}), {{}, 2}, V(want, {B, L, H, D})).ok());
    Vec got(contiguous_x.size());
    ASSERT_TRUE(rope_forward(p, xs, {{}, 2}, V(got, {B, L, H, D})).ok());
    EXPECT_TRUE(AllClose(got, want, 0, 0));
    ASSERT_TRUE(rope_forward(p, xs, {{}, 2}, ys).ok());
    EXPECT_TRUE(AllClose(to_doubles(ys), want, 0, 0));
    for (Sz i = 0; i < ybuf.size(); ++i) {
      if (static_cast<std::int64_t>(i) % P >= D) {
        ASSERT_EQ(ybuf[i], 42.0) << "padding written at " << i;
      }
    }
  }
}

// At position 2^24 (and 2^24 + 1, not a float32) the angle must be the exact one: compared with an
// angle formed in long double. A float32 angle would be off by up to ~1 rad here.
TEST(Rope, LargePositionsUseAnExactAngle) {
  const std::int64_t D = 8;  // exponents −2k/8 are exact binary fractions
  const std::int64_t m0 = std::int64_t{1} << 24;
  const Vec x = randn(2 * D, 31);
  std::vector<std::int64_t> ids = {m0, m0 + 1};
  const Positions pos{View::contiguous(ids.data(), DType::kI64, {2}), 0};
  Vec want(x.size());
  for (Sz t = 0; t < 2; ++t)
    for (Sz k = 0; k < static_cast<Sz>(D / 2); ++k) {
      const long double a = static_cast<long double>(ids[t]) * powl(10000.0L, -2.0L * static_cast<long double>(k) / D);
      const long double c = cosl(a), s = sinl(a);
      const long double x0 = x[t * D + 2 * k], x1 = x[t * D + 2 * k + 1];
      want[t * D + 2 * k] = static_cast<double>(x0 * c - x1 * s);
      want[t * D + 2 * k + 1] = static_cast<double>(x0 * s + x1 * c);
    }
  Vec xc = x, y(x.size());
  ASSERT_TRUE(rope_forward({.layout = RopeLayout::kInterleaved}, V(xc, {1, 2, 1, D}), pos, V(y, {1, 2, 1, D})).ok());
  EXPECT_TRUE(AllClose(y, want, 1e-8, 0));

  std::vector<float> xf = to_float(x), yf(x.size());
  Vec wantf(x.size());
  for (Sz t = 0; t < 2; ++t)  // the same, on the float-rounded input
    for (Sz k = 0; k < static_cast<Sz>(D / 2); ++k) {
      const long double a = static_cast<long double>(ids[t]) * powl(10000.0L, -2.0L * static_cast<long double>(k) / D);
      const long double x0 = xf[t * D + 2 * k], x1 = xf[t * D + 2 * k + 1];
      wantf[t * D + 2 * k] = static_cast<double>(x0 * cosl(a) - x1 * sinl(a));
      wantf[t * D + 2 * k + 1] = static_cast<double>(x0 * sinl(a) + x1 * cosl(a));
    }
  ASSERT_TRUE(rope_forward({.layout = RopeLayout::kInterleaved}, V(xf, {1, 2, 1, D}), pos, V(yf, {1, 2, 1, D})).ok());
  EXPECT_TRUE(AllClose(as_doubles(yf), wantf, 1e-6, 1e-6));
}

TEST(Rope, InPlace) {
  const std::int64_t B = 1, L = 3, H = 2, D = 4;
  Vec x = randn(B * L * H * D, 32), want(x.size());
  Vec xc = x;
  ASSERT_TRUE(rope_forward({.layout = RopeLayout::kHalf}, V(xc, {B, L, H, D}), {{}, 1}, V(want, {B, L, H, D})).ok());
  ASSERT_TRUE(rope_forward({.layout = RopeLayout::kHalf}, V(x, {B, L, H, D}), {{}, 1}, V(x, {B, L, H, D})).ok());
  EXPECT_TRUE(AllClose(x, want, 0, 0));
}

// ---- backward ----------------------------------------------------------------------------------

TEST(RopeBackward, MatchesFiniteDifferencesForEveryOptionCombination) {
  const std::int64_t B = 2, L = 3, H = 2, D = 6;
  std::vector<std::int32_t> ids = {0, 5, 2, 11, 3, 3};
  const Vec x = randn(B * L * H * D, 33), proj = randn(B * L * H * D, 34);
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf})
    for (std::int64_t r : {std::int64_t{0}, std::int64_t{4}})
      for (bool explicit_ids : {true, false}) {
        const RopeParams p{.layout = layout, .rotary_dim = r, .theta = 100.0};
        const Positions pos = explicit_ids ? Positions{View::contiguous(ids.data(), DType::kI32, {B, L}), 1}
                                           : Positions{{}, 9};
        auto loss = [&](const Vec& xv) {
          Vec xx = xv, y(xv.size());
          EXPECT_TRUE(rope_forward(p, V(xx, {B, L, H, D}), pos, V(y, {B, L, H, D})).ok());
          return dot(proj, y);
        };
        Vec dy = proj, dx(x.size(), 5.0);
        ASSERT_TRUE(rope_backward(p, V(dy, {B, L, H, D}), pos, V(dx, {B, L, H, D})).ok());
        EXPECT_TRUE(GradCheck(loss, x, dx)) << rope_layout_name(layout) << " r=" << r << " ids=" << explicit_ids;

        // The backward undoes the forward.
        Vec xc = x, y(x.size()), back(x.size());
        ASSERT_TRUE(rope_forward(p, V(xc, {B, L, H, D}), pos, V(y, {B, L, H, D})).ok());
        ASSERT_TRUE(rope_backward(p, V(y, {B, L, H, D}), pos, V(back, {B, L, H, D})).ok());
        EXPECT_TRUE(AllClose(back, x, 1e-12, 1e-12));
      }
}

// ---- errors ------------------------------------------------------------------------------------

TEST(Rope, BadInputsNameTheArgumentAndWriteNothing) {
  const std::int64_t B = 1, L = 2, H = 1, D = 6;
  Vec x = randn(B * L * H * D, 35), y(x.size(), 8.0);
  const View xv = V(x, {B, L, H, D}), yv = V(y, {B, L, H, D});
  auto expect_error = [&](Status s, const char* arg) {
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.arg(), arg) << s.message();
    EXPECT_FALSE(s.what().empty());
    EXPECT_EQ(y, Vec(y.size(), 8.0)) << "output written on error: " << s.message();
  };
  expect_error(rope_forward({.rotary_dim = 3}, xv, {}, yv), "rotary_dim");
  expect_error(rope_forward({.rotary_dim = 8}, xv, {}, yv), "rotary_dim");
  expect_error(rope_forward({.rotary_dim = -2}, xv, {}, yv), "rotary_dim");
  Vec x5(5 * 2), y5(5 * 2);
  expect_error(rope_forward({}, V(x5, {1, 2, 1, 5}), {}, V(y5, {1, 2, 1, 5})), "rotary_dim");  // 0 → D = 5
  expect_error(rope_forward({.theta = 0.0}, xv, {}, yv), "theta");
  expect_error(rope_forward({.theta = -1.0}, xv, {}, yv), "theta");
  expect_error(rope_forward({.theta = INFINITY}, xv, {}, yv), "theta");
  expect_error(rope_forward({.theta = NAN}, xv, {}, yv), "theta");
  expect_error(rope_forward({}, V(x, {L, H, D}), {}, yv), "x");
  expect_error(rope_forward({}, View{}, {}, yv), "x");
  expect_error(rope_forward({}, xv, {}, V(y, {B, L, D, H})), "y");
  std::vector<float> yf(y.size());
  expect_error(rope_forward({}, xv, {}, V(yf, {B, L, H, D})), "y");
  std::vector<std::int32_t> xi(x.size());
  expect_error(rope_forward({}, View::contiguous(xi.data(), DType::kI32, {B, L, H, D}), {}, yv), "x");
  std::vector<double> fpos = {0, 1};
  expect_error(rope_forward({}, xv, {V(fpos, {2}), 0}, yv), "positions");
  std::vector<std::int64_t> pos3 = {0, 1, 2};
  expect_error(rope_forward({}, xv, {View::contiguous(pos3.data(), DType::kI64, {3}), 0}, yv), "positions");
  expect_error(rope_forward({}, xv, {View::contiguous(pos3.data(), DType::kI64, {1, 1, 3}), 0}, yv), "positions");
  std::vector<std::int64_t> neg = {0, -1};
  expect_error(rope_forward({}, xv, {View::contiguous(neg.data(), DType::kI64, {2}), 0}, yv), "positions");
  expect_error(rope_forward({.layout = static_cast<RopeLayout>(7)}, xv, {}, yv), "layout");
  expect_error(rope_backward({.rotary_dim = 3}, xv, {}, yv), "rotary_dim");
  expect_error(rope_backward({}, xv, {}, V(yf, {B, L, H, D})), "dx");
  expect_error(rope_backward({}, V(x, {L, H, D}), {}, yv), "dy");
}

TEST(Rope, LayoutNamesRoundTrip) {
  for (RopeLayout l : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
    auto parsed = parse_rope_layout(rope_layout_name(l));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, l);
  }
  EXPECT_EQ(parse_rope_layout("neox").status().arg(), "layout");
}

}  // namespace
}  // namespace posenc
