// mrope (rotary.h; chunked and interleaved) against transformers' M-RoPE written out here (the cos/sin
// of cat(freqs, freqs) split by mrope_section * 2, and the interleaved slices of Qwen3-VL); M-RoPE on
// text is RoPE; gradients against central differences; Qwen2-VL's position ids on a hand-worked
// sequence; every rotation keeps its pairs' norms; bad sections and positions naming their argument.
#include <cmath>
#include <cstdint>
#include <vector>

#include "rotary_testing.h"

namespace posenc {
namespace {

using namespace ::posenc::rotary_testing;  // NOLINT: the formulas of these tests

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

}  // namespace
}  // namespace posenc
