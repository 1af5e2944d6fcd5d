// rope2d (rotary.h; axial and mixed) through the reference and the public (fast) entry points, against
// the authors' complex form of RoPE-ViT (a pair times e^{iφ}) written out in rotary_testing.h, and
// hand-worked values; its gradients (dx and mixed's dfreqs) against central differences of a
// random-projection loss; q·k depends only on the 2D offset; the mixed initialisation at angle 0 is
// axial; bad inputs naming their argument.
#include <cmath>
#include <cstdint>
#include <vector>

#include "rotary_testing.h"

namespace posenc {
namespace {

using namespace ::posenc::rotary_testing;  // NOLINT: the formulas of these tests

// ---- rope2d ----------------------------------------------------------------------------------------

// Hand-worked: D = 4, theta irrelevant (ω_0 = 1): pair 0 turns by x radians, pair 1 by y radians.
TEST(Rope2d, AxialHandWorked) {
  Vec x = {1, 0, 0, 2}, y(4);
  std::vector<std::int64_t> pos = {3, 5};  // [2, L = 1]: x = 3, y = 5
  Rope2dParams p;
  p.rope.layout = RopeLayout::kInterleaved;  // pairs (0, 1), (2, 3)
  ASSERT_TRUE(rope2d_forward(p, V(x, {1, 1, 1, 4}), Positions{View::contiguous(pos.data(), DType::kI64, {2, 1}), 0},
                             View{}, V(y, {1, 1, 1, 4}))
                  .ok());
  EXPECT_TRUE(AllClose(y, {std::cos(3.0), std::sin(3.0), -2 * std::sin(5.0), 2 * std::cos(5.0)}, 1e-15, 1e-15));
}

TEST(Rope2d, AxialMatchesTheAuthorsComplexFormAndHalfIsItsPermutation) {
  const I B = 2, L = 7, H = 3, D = 18, r = 16;
  const Vec x = randn(ix(B * L * H * D), 1);
  std::vector<std::int32_t> pos(ix(B * 2 * L));  // [B, 2, L]: x = l mod 3, y = l / 3 (+ b)
  for (I b = 0; b < B; ++b)
    for (I l = 0; l < L; ++l) {
      pos[ix((b * 2 + 0) * L + l)] = static_cast<std::int32_t>(l % 3 + 4 * b);
      pos[ix((b * 2 + 1) * L + l)] = static_cast<std::int32_t>(l / 3 + 7 * b);
    }
  const Positions ps{View::contiguous(pos.data(), DType::kI32, {B, 2, L}), 0};
  for (double theta : {100.0, 10000.0}) {
    Rope2dParams p;
    p.rope.layout = RopeLayout::kInterleaved;  // the authors' complex form
    p.rope.rotary_dim = r;
    p.rope.theta = theta;
    Vec want = x;
    for (I b = 0; b < B; ++b)
      for (I l = 0; l < L; ++l)
        for (I h = 0; h < H; ++h)
          rotate_complex(&want[ix(((b * L + l) * H + h) * D)],
                         axial_phi(pos[ix((b * 2 + 0) * L + l)], pos[ix((b * 2 + 1) * L + l)], r, theta), Vec(r / 2, 1.0));
    Vec xc = x, y(x.size()), yr(x.size());
    ASSERT_TRUE(rope2d_forward(p, V(xc, {B, L, H, D}), ps, View{}, V(y, {B, L, H, D})).ok());
    ASSERT_TRUE(reference::rope2d_forward(p, V(xc, {B, L, H, D}), ps, View{}, V(yr, {B, L, H, D})).ok());
    EXPECT_TRUE(AllClose(y, want, 1e-12, 1e-12)) << theta;
    EXPECT_TRUE(AllClose(yr, want, 1e-12, 1e-12)) << theta;
    // The half layout is the same rotation of the pairs (k, k + r/2).
    p.rope.layout = RopeLayout::kHalf;
    Vec perm = x, yh(x.size());
    for (Sz t = 0; t < ix(B * L * H); ++t)
      for (I k = 0; k < r / 2; ++k) {
        perm[t * D + ix(k)] = x[t * D + ix(2 * k)];
        perm[t * D + ix(k + r / 2)] = x[t * D + ix(2 * k + 1)];
      }
    ASSERT_TRUE(rope2d_forward(p, V(perm, {B, L, H, D}), ps, View{}, V(yh, {B, L, H, D})).ok());
    for (Sz t = 0; t < ix(B * L * H); ++t) {
      for (I k = 0; k < r / 2; ++k) {
        EXPECT_NEAR(yh[t * D + ix(k)], want[t * D + ix(2 * k)], 1e-12);
        EXPECT_NEAR(yh[t * D + ix(k + r / 2)], want[t * D + ix(2 * k + 1)], 1e-12);
      }
      for (I e = r; e < D; ++e) EXPECT_EQ(yh[t * D + ix(e)], x[t * D + ix(e)]);  // pass-through
    }
  }
}

TEST(Rope2d, MixedMatchesTheComplexFormPerHead) {
  const I B = 1, L = 6, H = 3, D = 8, r = 8;
  const Vec x = randn(ix(B * L * H * D), 2);
  Vec freqs = randn(ix(2 * H * r / 2), 3, 0.7);
  std::vector<std::int64_t> pos = {0, 1, 2, 0, 1, 2, 0, 0, 0, 1, 1, 1};  // [2, 6]: a 3 × 2 grid
  const Positions ps{View::contiguous(pos.data(), DType::kI64, {2, L}), 0};
  Rope2dParams p;
  p.variant = Rope2dVariant::kMixed;
  p.rope.layout = RopeLayout::kInterleaved;  // the authors' complex form
  Vec want = x;
  for (I l = 0; l < L; ++l)
    for (I h = 0; h < H; ++h) {
      Vec phi(ix(r / 2));
      for (I k = 0; k < r / 2; ++k)
        phi[ix(k)] = pos[ix(l)] * freqs[ix(h * r / 2 + k)] + pos[ix(L + l)] * freqs[ix((H + h) * r / 2 + k)];
      rotate_complex(&want[ix((l * H + h) * D)], phi, Vec(r / 2, 1.0));
    }
  Vec xc = x, y(x.size()), yr(x.size());
  ASSERT_TRUE(rope2d_forward(p, V(xc, {B, L, H, D}), ps, V(freqs, {2, H, r / 2}), V(y, {B, L, H, D})).ok());
  ASSERT_TRUE(reference::rope2d_forward(p, V(xc, {B, L, H, D}), ps, V(freqs, {2, H, r / 2}), V(yr, {B, L, H, D})).ok());
  EXPECT_TRUE(AllClose(y, want, 1e-12, 1e-12));
  EXPECT_TRUE(AllClose(yr, want, 1e-12, 1e-12));
}

// init_random_2d_freqs with angle 0 points the first r/4 pairs along x and the next along y with
// RoPE-Axial's magnitudes: mixed(init(0)) is axial (up to cos(π/2) ≈ 6e-17); with angle α the
// first quarter's direction is (cos α, sin α).
TEST(Rope2d, MixedInitialisationAtAngleZeroIsAxial) {
  const I L = 5, H = 2, D = 16;
  auto f = rope2d_mixed_init(H, D, 100.0, {0.0, 0.0});
  ASSERT_TRUE(f.ok()) << f.status().message();
  Vec freqs = *f;
  const Vec x = randn(ix(L * H * D), 4);
  std::vector<std::int64_t> pos = {0, 3, 1, 7, 2, 5, 5, 0, 9, 1};
  const Positions ps{View::contiguous(pos.data(), DType::kI64, {2, L}), 0};
  Vec xc = x, ya(x.size()), ym(x.size());
  Rope2dParams axial, mixed;
  mixed.variant = Rope2dVariant::kMixed;
  ASSERT_TRUE(rope2d_forward(axial, V(xc, {1, L, H, D}), ps, View{}, V(ya, {1, L, H, D})).ok());
  ASSERT_TRUE(rope2d_forward(mixed, V(xc, {1, L, H, D}), ps, V(freqs, {2, H, D / 2}), V(ym, {1, L, H, D})).ok());
  EXPECT_TRUE(AllClose(ym, ya, 1e-12, 1e-12));
  auto g = rope2d_mixed_init(1, 8, 10.0, {0.3});
  ASSERT_TRUE(g.ok());
  const double mu1 = 1.0 / std::pow(10.0, 4.0 / 8.0);
  EXPECT_NEAR((*g)[0], std::cos(0.3), 1e-15);              // θˣ_0 = μ_0 cos α, μ_0 = 1
  EXPECT_NEAR((*g)[1], mu1 * std::cos(0.3), 1e-15);        // θˣ_1
  EXPECT_NEAR((*g)[2], std::cos(0.3 + M_PI / 2), 1e-15);   // θˣ_2 = μ_0 cos(α + π/2)
  EXPECT_NEAR((*g)[4], std::sin(0.3), 1e-15);              // θʸ_0
  EXPECT_NEAR((*g)[7], mu1 * std::sin(0.3 + M_PI / 2), 1e-15);
  EXPECT_EQ(rope2d_mixed_init(2, 6, 10.0, {0, 0}).status().arg(), "rotary_dim");
  EXPECT_EQ(rope2d_mixed_init(2, 8, 10.0, {0}).status().arg(), "angles");
}

// q·k after 2D RoPE depends on the positions only through (Δx, Δy): shift both by (sx, sy).
TEST(Rope2d, DotProductDependsOnlyOnThe2dOffset) {
  const I D = 16, H = 2;
  Vec freqs = randn(ix(2 * H * D / 2), 5, 0.5);
  for (Rope2dVariant var : {Rope2dVariant::kAxial, Rope2dVariant::kMixed}) {
    Rope2dParams p;
    p.variant = var;
    const View fv = var == Rope2dVariant::kMixed ? V(freqs, {2, H, D / 2}) : View{};
    const Vec q = randn(ix(H * D), 6), k = randn(ix(H * D), 7);
    auto rot = [&](const Vec& x, I px, I py) {
      Vec xc = x, y(x.size());
      std::vector<std::int64_t> pos = {px, py};
      EXPECT_TRUE(rope2d_forward(p, V(xc, {1, 1, H, D}), Positions{View::contiguous(pos.data(), DType::kI64, {2, 1}), 0},
                                 fv, V(y, {1, 1, H, D}))
                      .ok());
      return y;
    };
    const double a = dot(rot(q, 3, 4), rot(k, 1, 9));
    const double b = dot(rot(q, 3 + 20, 4 + 7), rot(k, 1 + 20, 9 + 7));
    const double c = dot(rot(q, 3, 4), rot(k, 2, 9));  // another offset: another product
    EXPECT_NEAR(a, b, 1e-12 * (1 + std::fabs(a))) << rope2d_variant_name(var);
    EXPECT_GT(std::fabs(a - c), 1e-6) << rope2d_variant_name(var);
  }
}

TEST(Rope2d, GradientsMatchFiniteDifferences) {
  const I B = 2, L = 4, H = 2, D = 12, r = 8;
  std::vector<std::int64_t> pos = {0, 1, 2, 3, 0, 0, 1, 1, 5, 6, 7, 8, 2, 2, 3, 3};  // [B, 2, L]
  const Positions ps{View::contiguous(pos.data(), DType::kI64, {B, 2, L}), 0};
  const Vec proj = randn(ix(B * L * H * D), 8);
  for (Rope2dVariant var : {Rope2dVariant::kAxial, Rope2dVariant::kMixed})
    for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
      SCOPED_TRACE(std::string(rope2d_variant_name(var)) + " " + rope_layout_name(layout));
      Rope2dParams p;
      p.variant = var;
      p.rope.layout = layout;
      p.rope.rotary_dim = r;
      const bool mixed = var == Rope2dVariant::kMixed;
      Vec freqs = randn(ix(2 * H * r / 2), 9, 0.6);
      auto fwd = [&](const Vec& x, Vec f) {
        Vec xc = x, y(x.size());
        EXPECT_TRUE(reference::rope2d_forward(p, V(xc, {B, L, H, D}), ps, mixed ? V(f, {2, H, r / 2}) : View{},
                                              V(y, {B, L, H, D}))
                        .ok());
        return dot(proj, y);
      };
      const Vec x = randn(ix(B * L * H * D), 10);
      Vec pc = proj, dx(x.size()), df(freqs.size()), xc = x;
      for (bool fast : {false, true}) {
        const Status s = fast ? rope2d_backward(p, V(pc, {B, L, H, D}), ps, mixed ? V(freqs, {2, H, r / 2}) : View{},
                                                V(dx, {B, L, H, D}), mixed ? V(xc, {B, L, H, D}) : View{},
                                                mixed ? V(df, {2, H, r / 2}) : View{})
                              : reference::rope2d_backward(p, V(pc, {B, L, H, D}), ps,
                                                           mixed ? V(freqs, {2, H, r / 2}) : View{}, V(dx, {B, L, H, D}),
                                                           mixed ? V(xc, {B, L, H, D}) : View{},
                                                           mixed ? V(df, {2, H, r / 2}) : View{});
        ASSERT_TRUE(s.ok()) << s.message();
        EXPECT_TRUE(GradCheck([&](const Vec& xx) { return fwd(xx, freqs); }, x, dx)) << "dx fast=" << fast;
        if (mixed) {
          EXPECT_TRUE(GradCheck([&](const Vec& ff) { return fwd(x, ff); }, freqs, df)) << "dfreqs fast=" << fast;
        }
      }
      if (mixed) {  // dfreqs alone (no dx)
        Vec df2(freqs.size(), 7.0);
        ASSERT_TRUE(rope2d_backward(p, V(pc, {B, L, H, D}), ps, V(freqs, {2, H, r / 2}), View{}, V(xc, {B, L, H, D}),
                                    V(df2, {2, H, r / 2}))
                        .ok());
        EXPECT_TRUE(AllClose(df2, df, 1e-12, 1e-12));
      }
    }
}

TEST(Rope2d, BadInputsNameTheArgument) {
  Vec x(2 * 3 * 1 * 8, 0.5), y(x.size()), f(2 * 1 * 4, 0.1), bad_f(2 * 2 * 4, 0.1);
  const View xv = V(x, {2, 3, 1, 8}), yv = V(y, {2, 3, 1, 8});
  std::vector<std::int64_t> p1 = {0, 1, 2};  // [3]: 1D, not [2, 3]
  Rope2dParams p;
  EXPECT_EQ(rope2d_forward(p, xv, Positions{View::contiguous(p1.data(), DType::kI64, {3}), 0}, View{}, yv).arg(),
            "positions");
  std::vector<std::int64_t> neg = {0, 1, -3, 0, 0, 0};
  EXPECT_EQ(rope2d_forward(p, xv, Positions{View::contiguous(neg.data(), DType::kI64, {2, 3}), 0}, View{}, yv).arg(),
            "positions");
  p.rope.rotary_dim = 6;  // not a multiple of 4
  EXPECT_EQ(rope2d_forward(p, xv, Positions{}, View{}, yv).arg(), "rotary_dim");
  p.rope.rotary_dim = 0;
  EXPECT_EQ(rope2d_forward(p, xv, Positions{}, V(f, {2, 1, 4}), yv).arg(), "freqs");  // axial reads none
  p.variant = Rope2dVariant::kMixed;
  EXPECT_EQ(rope2d_forward(p, xv, Positions{}, View{}, yv).arg(), "freqs");
  EXPECT_EQ(rope2d_forward(p, xv, Positions{}, V(bad_f, {2, 2, 4}), yv).arg(), "freqs");
  f[3] = std::nan("");
  EXPECT_EQ(rope2d_forward(p, xv, Positions{}, V(f, {2, 1, 4}), yv).arg(), "freqs");
  f[3] = 0.1;
  p.rope.rope_type = RopeType::kLinear;  // mixed takes no scheme
  p.rope.factor = 2;
  EXPECT_EQ(rope2d_forward(p, xv, Positions{}, V(f, {2, 1, 4}), yv).arg(), "rope");
  p.rope = Rope2dParams{}.rope;
  EXPECT_EQ(rope2d_backward(p, xv, Positions{}, V(f, {2, 1, 4}), View{}, View{}, View{}).arg(), "dx");
  EXPECT_EQ(rope2d_backward(p, xv, Positions{}, V(f, {2, 1, 4}), yv, View{}, V(bad_f, {2, 1, 4})).arg(), "x");
  EXPECT_EQ(rope2d_backward(p, xv, Positions{}, V(f, {2, 1, 4}), yv, xv, V(bad_f, {2, 2, 4})).arg(), "dfreqs");
  EXPECT_EQ(rope2d_backward(p, xv, Positions{}, V(f, {2, 1, 4}), yv, xv, V(y, {2, 1, 4})).arg(), "dfreqs");  // in dx
  EXPECT_EQ(reference::rope2d_backward(p, xv, Positions{}, V(f, {2, 1, 4}), yv, xv, V(y, {2, 1, 4})).arg(), "dfreqs");
  p.variant = Rope2dVariant::kAxial;
  EXPECT_EQ(rope2d_backward(p, xv, Positions{}, View{}, yv, xv, V(f, {2, 1, 4})).arg(), "dfreqs");
  EXPECT_EQ(rope2d_forward(p, xv, Positions{}, View{}, V(bad_f, {2, 2, 4})).arg(), "y");
  EXPECT_EQ(parse_rope2d_variant("diagonal").status().arg(), "variant");
  // the public and the reference entry points say the same
  EXPECT_EQ(rope2d_forward(p, xv, Positions{View::contiguous(p1.data(), DType::kI64, {3}), 0}, View{}, yv).message(),
            reference::rope2d_forward(p, xv, Positions{View::contiguous(p1.data(), DType::kI64, {3}), 0}, View{}, yv)
                .message());
}

}  // namespace
}  // namespace posenc
