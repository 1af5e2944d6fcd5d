// The rotary encodings beyond 1D RoPE (rotary.h): rope2d (axial, mixed), mrope (chunked,
// interleaved) and xpos, through the reference and the public (fast) entry points, against
// formulas written out here on their own — the authors' complex form of RoPE-ViT (a pair times
// e^{iφ}), transformers' M-RoPE (the cos/sin of cat(freqs, freqs) split by mrope_section * 2, and
// the interleaved slices of Qwen3-VL) and torchscale's XPOS (its scale table over arange(−⌈n/2⌉,
// ⌊n/2⌋) and rotate_every_two) — and hand-worked values; gradients (dx and mixed's dfreqs) against
// central differences of a random-projection loss; properties (2D: q·k depends only on the 2D offset;
// M-RoPE on text is RoPE; xPos's logit depends only on m − n, and its norms scale by ρ; the mixed
// initialisation at angle 0 is axial); Qwen2-VL's position ids on a hand-worked sequence; bad
// inputs naming their argument.
#include <cmath>
#include <complex>
#include <cstdint>
#include <functional>
#include <vector>

#include "posenc/reference.h"
#include "posenc/rotary.h"
#include "testing.h"

namespace posenc {
namespace {

using testing::AllClose;
using testing::GradCheck;
using testing::V;
using testing::dot;
using testing::randn;
using I = std::int64_t;
using Vec = std::vector<double>;
using Sz = std::size_t;

Sz ix(I i) { return static_cast<Sz>(i); }

// ---- independent formulas ------------------------------------------------------------------------

// Rotates the interleaved pairs (x_{2j}, x_{2j+1}) of one head row by the complex factor
// scale_j·e^{iφ_j} (the authors' view_as_complex form).
void rotate_complex(double* row, const Vec& phi, const Vec& scale) {
  for (Sz j = 0; j < phi.size(); ++j) {
    const std::complex<double> z = std::complex<double>(row[2 * j], row[2 * j + 1]) * std::polar(scale[j], phi[j]);
    row[2 * j] = z.real();
    row[2 * j + 1] = z.imag();
  }
}

// The half layout as transformers writes it: y = x·cos + rotate_half(x)·sin over the first r dims,
// cos, sin [r] (each pair's value in both halves).
void rotate_half_form(double* row, const Vec& cosr, const Vec& sinr) {
  const Sz r = cosr.size(), h = r / 2;
  Vec rh(r), y(r);
  for (Sz i = 0; i < h; ++i) {
    rh[i] = -row[h + i];
    rh[h + i] = row[i];
  }
  for (Sz i = 0; i < r; ++i) y[i] = row[i] * cosr[i] + rh[i] * sinr[i];
  for (Sz i = 0; i < r; ++i) row[i] = y[i];
}

// RoPE-ViT axial (compute_axial_cis): freqs 1/theta^(arange(0, r, 4)/r), x rotations then y.
Vec axial_phi(double x, double y, I r, double theta) {
  Vec phi;
  for (I j = 0; j < r / 4; ++j) phi.push_back(x / std::pow(theta, static_cast<double>(4 * j) / r));
  for (I j = 0; j < r / 4; ++j) phi.push_back(y / std::pow(theta, static_cast<double>(4 * j) / r));
  return phi;
}

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
  p.variant = Rope2dVariant::kAxial;
  EXPECT_EQ(rope2d_backward(p, xv, Positions{}, View{}, yv, xv, V(f, {2, 1, 4})).arg(), "dfreqs");
  EXPECT_EQ(rope2d_forward(p, xv, Positions{}, View{}, V(bad_f, {2, 2, 4})).arg(), "y");
  EXPECT_EQ(parse_rope2d_variant("diagonal").status().arg(), "variant");
  // the public and the reference entry points say the same
  EXPECT_EQ(rope2d_forward(p, xv, Positions{View::contiguous(p1.data(), DType::kI64, {3}), 0}, View{}, yv).message(),
            reference::rope2d_forward(p, xv, Positions{View::contiguous(p1.data(), DType::kI64, {3}), 0}, View{}, yv)
                .message());
}

// ---- mrope -----------------------------------------------------------------------------------------

// transformers' Qwen2-VL: freqs [3][r/2] = (t, h, w)·ω, emb = cat(freqs, freqs) [3][r], split by
// mrope_section * 2 into six chunks, chunk i from row i mod 3; then x·cos + rotate_half(x)·sin.
// Qwen3-VL (interleaved): freqs_t = freqs[0] with [1 : 3 s_h : 3] from row 1 and [2 : 3 s_w : 3]
// from row 2; emb = cat(freqs_t, freqs_t).
Vec mrope_transformers(const Vec& x, I L, I H, I D, const std::vector<std::int64_t>& pos /*[3, L]*/,
                       const std::vector<I>& sec, bool interleaved, double theta) {
  const I r = D, half = r / 2;
  Vec out = x;
  for (I l = 0; l < L; ++l) {
    Vec freqs[3];
    for (int a = 0; a < 3; ++a)
      for (I k = 0; k < half; ++k)
        freqs[a].push_back(static_cast<double>(pos[ix(a * L + l)]) / std::pow(theta, static_cast<double>(2 * k) / r));
    Vec emb;
    if (!interleaved) {
      Vec full[3];
      for (int a = 0; a < 3; ++a) {
        full[a] = freqs[a];
        full[a].insert(full[a].end(), freqs[a].begin(), freqs[a].end());
      }
      const std::vector<I> split = {sec[0], sec[1], sec[2], sec[0], sec[1], sec[2]};
      I at = 0;
      for (Sz i = 0; i < split.size(); ++i) {
        for (I e = 0; e < split[i]; ++e) emb.push_back(full[i % 3][ix(at + e)]);
        at += split[i];
      }
    } else {
      Vec ft = freqs[0];
      for (int dim = 1; dim <= 2; ++dim)
        for (I idx = dim; idx < sec[ix(dim)] * 3; idx += 3) ft[ix(idx)] = freqs[dim][ix(idx)];
      emb = ft;
      emb.insert(emb.end(), ft.begin(), ft.end());
    }
    Vec c(ix(r)), s(ix(r));
    for (I i = 0; i < r; ++i) c[ix(i)] = std::cos(emb[ix(i)]), s[ix(i)] = std::sin(emb[ix(i)]);
    for (I h = 0; h < H; ++h) rotate_half_form(&out[ix((l * H + h) * D)], c, s);
  }
  return out;
}

TEST(Mrope, MatchesTransformersChunkedAndInterleaved) {
  const I L = 9, H = 2, D = 24;
  const Vec x = randn(ix(L * H * D), 11);
  // text 2, an image grid 1 x 2 x 3 at start 2, text 1 (Qwen2-VL's ids, see MropePositions below)
  std::vector<std::int64_t> pos = {0, 1, 2, 2, 2, 2, 2, 2, 5,   // t
                                   0, 1, 2, 2, 2, 3, 3, 3, 5,   // h
                                   0, 1, 2, 3, 4, 2, 3, 4, 5};  // w
  const Positions ps{View::contiguous(pos.data(), DType::kI64, {3, L}), 0};
  for (bool interleaved : {false, true}) {
    MropeParams p;
    p.variant = interleaved ? MropeVariant::kInterleaved : MropeVariant::kChunked;
    p.mrope_section = interleaved ? std::vector<I>{4, 4, 4} : std::vector<I>{2, 5, 5};
    p.rope.theta = 1e6;
    const Vec want = mrope_transformers(x, L, H, D, pos, p.mrope_section, interleaved, 1e6);
    Vec xc = x, y(x.size()), yr(x.size());
    ASSERT_TRUE(mrope_forward(p, V(xc, {1, L, H, D}), ps, V(y, {1, L, H, D})).ok());
    ASSERT_TRUE(reference::mrope_forward(p, V(xc, {1, L, H, D}), ps, V(yr, {1, L, H, D})).ok());
    EXPECT_TRUE(AllClose(y, want, 1e-11, 1e-11)) << interleaved;
    EXPECT_TRUE(AllClose(yr, want, 1e-11, 1e-11)) << interleaved;
  }
}

// Text tokens (t = h = w = m) get RoPE at m: any section, variant, layout and scheme.
TEST(Mrope, OnTextEqualsRope) {
  const I B = 2, L = 11, H = 3, D = 20;
  const Vec x = randn(ix(B * L * H * D), 12);
  std::vector<std::int64_t> ids1(ix(B * L)), ids3(ix(B * 3 * L));
  for (I b = 0; b < B; ++b)
    for (I l = 0; l < L; ++l) {
      const std::int64_t m = 5 * l + 3 * b;
      ids1[ix(b * L + l)] = m;
      for (int a = 0; a < 3; ++a) ids3[ix((b * 3 + a) * L + l)] = m;
    }
  for (bool interleaved : {false, true})
    for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf})
      for (int scheme = 0; scheme < 3; ++scheme) {
        MropeParams p;
        p.variant = interleaved ? MropeVariant::kInterleaved : MropeVariant::kChunked;
        p.mrope_section = {4, 3, 3};
        p.rope.layout = layout;
        if (scheme == 1) {  // YaRN, attention factor != 1
          p.rope.rope_type = RopeType::kYarn;
          p.rope.factor = 4;
          p.rope.original_max_position = 16;
        }
        if (scheme == 2) p.rope.angles = RopeAngles::kHf;
        SCOPED_TRACE(std::to_string(interleaved) + " " + rope_layout_name(layout) + " scheme " + std::to_string(scheme));
        Vec xc = x, y(x.size()), want(x.size());
        ASSERT_TRUE(mrope_forward(p, V(xc, {B, L, H, D}), Positions{View::contiguous(ids3.data(), DType::kI64, {B, 3, L}), 0},
                                  V(y, {B, L, H, D}))
                        .ok());
        ASSERT_TRUE(rope_forward(p.rope, V(xc, {B, L, H, D}), Positions{View::contiguous(ids1.data(), DType::kI64, {B, L}), 0},
                                 V(want, {B, L, H, D}))
                        .ok());
        EXPECT_TRUE(AllClose(y, want, 1e-13, 1e-13));
        // Without ids, the offset's positions in all three rows: RoPE at offset + l.
        ASSERT_TRUE(mrope_forward(p, V(xc, {B, L, H, D}), Positions{View{}, 40}, V(y, {B, L, H, D})).ok());
        ASSERT_TRUE(rope_forward(p.rope, V(xc, {B, L, H, D}), Positions{View{}, 40}, V(want, {B, L, H, D})).ok());
        EXPECT_TRUE(AllClose(y, want, 1e-13, 1e-13));
      }
}

TEST(Mrope, GradientsMatchFiniteDifferences) {
  const I B = 1, L = 5, H = 2, D = 14;
  std::vector<std::int32_t> pos = {0, 1, 1, 1, 4, 0, 1, 2, 2, 4, 0, 1, 1, 2, 4};
  const Positions ps{View::contiguous(pos.data(), DType::kI32, {3, L}), 0};
  const Vec proj = randn(ix(B * L * H * D), 13), x = randn(proj.size(), 14);
  for (bool interleaved : {false, true})
    for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
      MropeParams p;
      p.variant = interleaved ? MropeVariant::kInterleaved : MropeVariant::kChunked;
      p.mrope_section = {2, 2, 1};
      p.rope.rotary_dim = 10;
      p.rope.layout = layout;
      p.rope.attention_factor = 1.3;
      auto loss = [&](const Vec& xx) {
        Vec xc = xx, y(xx.size());
        EXPECT_TRUE(reference::mrope_forward(p, V(xc, {B, L, H, D}), ps, V(y, {B, L, H, D})).ok());
        return dot(proj, y);
      };
      Vec pc = proj, dx(x.size());
      ASSERT_TRUE(mrope_backward(p, V(pc, {B, L, H, D}), ps, V(dx, {B, L, H, D})).ok());
      EXPECT_TRUE(GradCheck(loss, x, dx)) << interleaved << rope_layout_name(layout);
      ASSERT_TRUE(reference::mrope_backward(p, V(pc, {B, L, H, D}), ps, V(dx, {B, L, H, D})).ok());
      EXPECT_TRUE(GradCheck(loss, x, dx)) << interleaved << rope_layout_name(layout);
    }
}

TEST(Mrope, BadSectionsAndPositionsNameTheArgument) {
  Vec x(1 * 3 * 1 * 8, 0.5), y(x.size());
  const View xv = V(x, {1, 3, 1, 8}), yv = V(y, {1, 3, 1, 8});
  MropeParams p;
  EXPECT_EQ(mrope_forward(p, xv, Positions{}, yv).arg(), "mrope_section");  // required
  p.mrope_section = {1, 1, 1};                                             // sum 3 != r/2 = 4
  EXPECT_EQ(mrope_forward(p, xv, Positions{}, yv).arg(), "mrope_section");
  p.mrope_section = {2, 1, 1};
  EXPECT_TRUE(mrope_forward(p, xv, Positions{}, yv).ok());
  p.variant = MropeVariant::kInterleaved;
  p.mrope_section = {0, 2, 2};  // 3·s_w = 6 > r/2 = 4: transformers' slice would give w fewer pairs
  EXPECT_EQ(mrope_forward(p, xv, Positions{}, yv).arg(), "mrope_section");
  p.mrope_section = {2, 1, 1};
  std::vector<std::int64_t> two(6, 0), three_by_two(6, 0);
  EXPECT_EQ(mrope_forward(p, xv, Positions{View::contiguous(two.data(), DType::kI64, {2, 3}), 0}, yv).arg(), "positions");
  EXPECT_EQ(mrope_forward(p, xv, Positions{View::contiguous(three_by_two.data(), DType::kI64, {3, 2}), 0}, yv).arg(),
            "positions");
  std::vector<double> fpos(9, 0.0);
  EXPECT_EQ(mrope_forward(p, xv, Positions{View::contiguous(fpos.data(), DType::kF64, {3, 3}), 0}, yv).arg(),
            "positions");
  EXPECT_EQ(parse_mrope_variant("zigzag").status().arg(), "variant");
}

// Qwen2-VL's get_rope_index, worked by hand: text "ab" (ids 0, 1), an image of 1 x 2 x 3 merged
// tokens at start 2 (t = 2; h = 2, 2, 2, 3, 3, 3; w = 2, 3, 4, 2, 3, 4), text "cd" from the largest
// id + 1 = 5 (5, 6); next = 7, delta = 7 − 10 = −3.
TEST(MropePositions, Qwen2VlHandWorked) {
  using K = MropeSegment::Kind;
  auto r = mrope_positions({{K::kText, 2}, {K::kImage, 0, 1, 2, 3}, {K::kText, 2}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->length, 10);
  EXPECT_EQ(r->next, 7);
  EXPECT_EQ(r->delta(), -3);
  const std::vector<std::int64_t> want = {0, 1, 2, 2, 2, 2, 2, 2, 5, 6,
                                          0, 1, 2, 2, 2, 3, 3, 3, 5, 6,
                                          0, 1, 2, 3, 4, 2, 3, 4, 5, 6};
  EXPECT_EQ(r->ids, want);
  // The same grid given before the merge (2 x 4 x 6 patches, merge 2) ... with t = 2 frames it is a
  // video: frames at t = s, s + 1; then the text after starts past the largest id (s + max(2, 2, 3)).
  auto v = mrope_positions({{K::kText, 1}, {K::kVideo, 0, 2, 4, 6}, {K::kText, 1}}, 2);
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->length, 1 + 2 * 2 * 3 + 1);
  const std::vector<std::int64_t> t = {0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 4};
  const std::vector<std::int64_t> h = {0, 1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 4};
  const std::vector<std::int64_t> w = {0, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 4};
  EXPECT_EQ(std::vector<std::int64_t>(v->ids.begin(), v->ids.begin() + 14), t);
  EXPECT_EQ(std::vector<std::int64_t>(v->ids.begin() + 14, v->ids.begin() + 28), h);
  EXPECT_EQ(std::vector<std::int64_t>(v->ids.begin() + 28, v->ids.end()), w);
  EXPECT_EQ(v->next, 5);
  // Two images back to back: the second starts at the first's largest id + 1.
  auto two = mrope_positions({{K::kImage, 0, 1, 1, 2}, {K::kImage, 0, 1, 1, 1}});
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->ids, (std::vector<std::int64_t>{0, 0, 2, 0, 0, 2, 0, 1, 2}));
  // Errors name the argument.
  EXPECT_EQ(mrope_positions({}).status().arg(), "segments");
  EXPECT_EQ(mrope_positions({{K::kText, 0}}).status().arg(), "segments");
  EXPECT_EQ(mrope_positions({{K::kImage, 0, 1, 3, 4}}, 2).status().arg(), "segments");  // 2 does not divide 3
  EXPECT_EQ(mrope_positions({{K::kImage, 0, 1, 0, 4}}).status().arg(), "segments");
  EXPECT_EQ(mrope_positions({{K::kText, 3}}, 0).status().arg(), "spatial_merge");
}

// Rotations keep every pair's norm (a = 1): rope2d axial and mixed, mrope; the pass-through tail is
// untouched.
TEST(RotaryProperties, RotationsKeepPairNorms) {
  const I L = 6, H = 2, D = 14, r = 12;
  const Vec x = randn(ix(L * H * D), 30);
  Vec freqs = randn(ix(2 * H * r / 2), 31);
  std::vector<std::int64_t> p2 = {0, 5, 9, 2, 7, 1, 3, 3, 8, 0, 4, 6}, p3(ix(3 * L));
  for (Sz i = 0; i < p3.size(); ++i) p3[i] = static_cast<std::int64_t>((i * 5) % 17);
  for (int which = 0; which < 3; ++which)
    for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
      Vec xc = x, y(x.size());
      const View xv = V(xc, {1, L, H, D}), yv = V(y, {1, L, H, D});
      if (which < 2) {
        Rope2dParams p;
        p.variant = which ? Rope2dVariant::kMixed : Rope2dVariant::kAxial;
        p.rope.layout = layout;
        p.rope.rotary_dim = r;
        ASSERT_TRUE(rope2d_forward(p, xv, Positions{View::contiguous(p2.data(), DType::kI64, {2, L}), 0},
                                   which ? V(freqs, {2, H, r / 2}) : View{}, yv)
                        .ok());
      } else {
        MropeParams p;
        p.mrope_section = {2, 2, 2};
        p.rope.layout = layout;
        p.rope.rotary_dim = r;
        ASSERT_TRUE(mrope_forward(p, xv, Positions{View::contiguous(p3.data(), DType::kI64, {3, L}), 0}, yv).ok());
      }
      for (Sz t = 0; t < ix(L * H); ++t) {
        for (I k = 0; k < r / 2; ++k) {
          const I a = layout == RopeLayout::kInterleaved ? 2 * k : k, b = layout == RopeLayout::kInterleaved ? 2 * k + 1 : k + r / 2;
          EXPECT_NEAR(std::hypot(y[t * D + ix(a)], y[t * D + ix(b)]), std::hypot(x[t * D + ix(a)], x[t * D + ix(b)]), 1e-13)
              << which << " " << rope_layout_name(layout);
        }
        for (I e = r; e < D; ++e) EXPECT_EQ(y[t * D + ix(e)], x[t * D + ix(e)]);
      }
    }
}

// ---- xpos ------------------------------------------------------------------------------------------

// torchscale's XPOS on a sequence of n tokens at positions offset .. offset + n − 1 with the table
// of length n + offset (its forward(x, offset)): scale_k = ζ_k^(arange(−⌈N/2⌉, ⌊N/2⌋)/scale_base)
// for N = n + offset, the last n rows; sin, cos of position·10000^(−j/(d/2)); interleaved.
Vec xpos_torchscale(const Vec& x, I n, I offset, I H, I D, bool downscale, double scale_base = 512) {
  const I N = n + offset, min_pos = -((N + 1) / 2);
  Vec out = x;
  for (I l = 0; l < n; ++l) {
    const I row = offset + l;  // index into the tables of length N
    Vec phi(ix(D / 2)), sc(ix(D / 2));
    for (I j = 0; j < D / 2; ++j) {
      const double zeta = (2.0 * j + 0.4 * D) / (1.4 * D);
      double s = std::pow(zeta, static_cast<double>(min_pos + row) / scale_base);
      if (downscale) s = 1 / s;
      sc[ix(j)] = s;
      phi[ix(j)] = static_cast<double>(row) / std::pow(10000.0, static_cast<double>(j) / (D / 2));
    }
    for (I h = 0; h < H; ++h) rotate_complex(&out[ix((l * H + h) * D)], phi, sc);
  }
  return out;
}

TEST(Xpos, MatchesTorchscaleQueriesAndKeys) {
  const I H = 2, D = 16;
  for (I n : {7, 8}) {  // odd and even lengths: the centre ⌈n/2⌉
    const Vec x = randn(ix(n * H * D), 15);
    Vec xc = x, y(x.size()), yr(x.size());
    XposParams p;
    p.rope.layout = RopeLayout::kInterleaved;  // torchscale's rotate_every_two
    for (XposRole role : {XposRole::kQuery, XposRole::kKey}) {
      const Vec want = xpos_torchscale(x, n, 0, H, D, role == XposRole::kKey);
      ASSERT_TRUE(xpos_forward(p, role, V(xc, {1, n, H, D}), Positions{}, V(y, {1, n, H, D})).ok());
      ASSERT_TRUE(reference::xpos_forward(p, role, V(xc, {1, n, H, D}), Positions{}, V(yr, {1, n, H, D})).ok());
      EXPECT_TRUE(AllClose(y, want, 1e-12, 1e-11)) << n << xpos_role_name(role);
      EXPECT_TRUE(AllClose(yr, want, 1e-12, 1e-11)) << n << xpos_role_name(role);
    }
  }
  // A decode step: torchscale's query at offset = n − 1 uses the table of length n, like the keys;
  // here the call's length is its largest position + 1 = n, the same centre.
  const I n = 9;
  const Vec q = randn(ix(H * D), 16);
  Vec qc = q, y(q.size());
  ASSERT_TRUE(xpos_forward(XposParams{.rope = {.layout = RopeLayout::kInterleaved}}, XposRole::kQuery,
                           V(qc, {1, 1, H, D}), Positions{View{}, n - 1},
                           V(y, {1, 1, H, D}))
                  .ok());
  EXPECT_TRUE(AllClose(y, xpos_torchscale(q, 1, n - 1, H, D, false), 1e-12, 1e-11));
}

// The logit of a query at m and a key at n is Σ_k ζ_k^((m − n)/s)·(RoPE's terms): shifting every
// position (and so the centre) changes nothing, another m − n does; and per pair the norm is a·ρ.
TEST(Xpos, LogitDependsOnlyOnTheOffsetAndNormsScaleByRho) {
  const I H = 1, D = 8;
  const Vec q = randn(ix(D), 17), k = randn(ix(D), 18);
  XposParams p;
  p.scale_base = 16;  // strong decay: the test sees it
  p.rope.layout = RopeLayout::kInterleaved;  // pair j = (2j, 2j+1) below
  auto logit = [&](I m, I n, I len) {
    Vec qc = q, kc = k, qy(ix(D)), ky(ix(D));
    XposParams pp = p;
    pp.rope.seq_len = len;  // both calls see the same length, so the same centre
    EXPECT_TRUE(xpos_forward(pp, XposRole::kQuery, V(qc, {1, 1, H, D}), Positions{View{}, m}, V(qy, {1, 1, H, D})).ok());
    EXPECT_TRUE(xpos_forward(pp, XposRole::kKey, V(kc, {1, 1, H, D}), Positions{View{}, n}, V(ky, {1, 1, H, D})).ok());
    return dot(qy, ky);
  };
  const double a = logit(9, 4, 10), b = logit(109, 104, 200), c = logit(9, 3, 10);
  EXPECT_NEAR(a, b, 1e-12 * (1 + std::fabs(a)));
  EXPECT_GT(std::fabs(a - c), 1e-6);
  // The explicit formula: Σ_j ζ_j^((m−n)/s)·Re(conj(q_j e^{imθ}) … ) = RoPE's pair terms times ζ^Δ/s.
  double want = 0;
  for (I j = 0; j < D / 2; ++j) {
    const double zeta = (2.0 * j / D + 0.4) / 1.4, w = 1 / std::pow(10000.0, 2.0 * j / D);
    const std::complex<double> qz(q[ix(2 * j)], q[ix(2 * j + 1)]), kz(k[ix(2 * j)], k[ix(2 * j + 1)]);
    want += std::pow(zeta, 5.0 / 16) * std::real(qz * std::polar(1.0, 9 * w) * std::conj(kz * std::polar(1.0, 4 * w)));
  }
  EXPECT_NEAR(a, want, 1e-12 * (1 + std::fabs(want)));
  // Norms: pair j of a query at m is scaled by ζ_j^((m − c)/s) exactly (rotation keeps the rest).
  Vec qc = q, y(ix(D));
  XposParams pc = p;
  pc.center = 3;
  ASSERT_TRUE(xpos_forward(pc, XposRole::kQuery, V(qc, {1, 1, H, D}), Positions{View{}, 11}, V(y, {1, 1, H, D})).ok());
  for (I j = 0; j < D / 2; ++j) {
    const double zeta = (2.0 * j / D + 0.4) / 1.4;
    const double n0 = std::hypot(q[ix(2 * j)], q[ix(2 * j + 1)]), n1 = std::hypot(y[ix(2 * j)], y[ix(2 * j + 1)]);
    EXPECT_NEAR(n1, n0 * std::pow(zeta, 8.0 / 16), 1e-13);
  }
  EXPECT_EQ(xpos_center(XposParams{}, 7), 4);
  EXPECT_EQ(xpos_center(XposParams{}, 8), 4);
  EXPECT_EQ(xpos_center(pc, 8), 3);
}

TEST(Xpos, GradientsMatchFiniteDifferences) {
  const I B = 2, L = 5, H = 2, D = 10;
  std::vector<std::int64_t> ids = {0, 3, 4, 9, 20, 1, 1, 2, 3, 40};
  const Positions ps{View::contiguous(ids.data(), DType::kI64, {B, L}), 0};
  const Vec proj = randn(ix(B * L * H * D), 19), x = randn(proj.size(), 20);
  for (XposRole role : {XposRole::kQuery, XposRole::kKey})
    for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
      XposParams p;
      p.scale_base = 32;
      p.rope.layout = layout;
      p.rope.rotary_dim = 8;
      auto loss = [&](const Vec& xx) {
        Vec xc = xx, y(xx.size());
        EXPECT_TRUE(reference::xpos_forward(p, role, V(xc, {B, L, H, D}), ps, V(y, {B, L, H, D})).ok());
        return dot(proj, y);
      };
      Vec pc = proj, dx(x.size());
      ASSERT_TRUE(xpos_backward(p, role, V(pc, {B, L, H, D}), ps, V(dx, {B, L, H, D})).ok());
      EXPECT_TRUE(GradCheck(loss, x, dx)) << xpos_role_name(role) << rope_layout_name(layout);
      ASSERT_TRUE(reference::xpos_backward(p, role, V(pc, {B, L, H, D}), ps, V(dx, {B, L, H, D})).ok());
      EXPECT_TRUE(GradCheck(loss, x, dx)) << xpos_role_name(role) << rope_layout_name(layout);
    }
}

// The automatic centre is ⌈n/2⌉ for every n a call can state, 2^63 − 1 included (seq_len from the C
// ABI or the CLI): it must not overflow (regression input tests/fuzz/corpus/capi/regress-xpos-center-overflow).
TEST(Xpos, AutoCenterIsCeilHalfUpToTheLargestLength) {
  XposParams p;
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{2}, std::int64_t{7}, std::int64_t{1} << 53,
                               INT64_MAX - 1, INT64_MAX}) {
    p.rope.seq_len = n;
    const std::int64_t want = static_cast<std::int64_t>((static_cast<unsigned __int128>(n) + 1) / 2);
    EXPECT_EQ(xpos_center(p, 3), want) << n;
  }
  p.rope.seq_len = 0;
  EXPECT_EQ(xpos_center(p, 5), 3);  // from the call's length
}

TEST(Xpos, BadParamsNameTheField) {
  Vec x(1 * 3 * 1 * 8, 0.5), y(x.size());
  const View xv = V(x, {1, 3, 1, 8}), yv = V(y, {1, 3, 1, 8});
  XposParams p;
  p.gamma = 0;
  EXPECT_EQ(xpos_forward(p, XposRole::kQuery, xv, Positions{}, yv).arg(), "gamma");
  p = XposParams{};
  p.scale_base = -1;
  EXPECT_EQ(xpos_forward(p, XposRole::kQuery, xv, Positions{}, yv).arg(), "scale_base");
  p = XposParams{};
  p.rope.rotary_dim = 3;
  EXPECT_EQ(xpos_forward(p, XposRole::kKey, xv, Positions{}, yv).arg(), "rotary_dim");
  p = XposParams{};
  EXPECT_EQ(xpos_forward(p, static_cast<XposRole>(7), xv, Positions{}, yv).arg(), "role");
  p.rope.seq_len = 2;  // below the call's length 3
  EXPECT_EQ(xpos_forward(p, XposRole::kKey, xv, Positions{}, yv).arg(), "seq_len");
  EXPECT_EQ(parse_xpos_role("value").status().arg(), "role");
}

}  // namespace
}  // namespace posenc
