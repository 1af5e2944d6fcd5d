// T5 relative buckets (Raffel et al. 2020; Mesh TensorFlow / Hugging Face _relative_position_bucket).
// r = key − query throughout.
#include <cmath>
#include <cstdint>
#include <vector>

#include "posenc/bias.h"
#include "posenc/reference.h"
#include "testing.h"

namespace posenc {
namespace {

using testing::AllClose;
using testing::GradCheck;
using testing::V;
using testing::dot;
using testing::randn;

using Vec = std::vector<double>;
using Sz = std::size_t;

struct Case {
  std::int64_t r, bucket;
};

// Bidirectional, num_buckets 32, max_distance 128: 16 buckets per direction, keys after the query
// (r > 0) in 16..31. Within a direction n = |r|; max_exact = 8; n < 8 is bucket n; otherwise
//   bucket = 8 + ⌊ln(n/8) / ln(128/8) · 8⌋ = 8 + ⌊2·log2(n/8)⌋ = 8 + ⌊log2((n/8)²)⌋, at most 15:
//   n = 8:    (1)²      = 1      → log2 0      → 8
//   n = 12:   (1.5)²    = 2.25   → log2 1.17   → 9
//   n = 20:   (2.5)²    = 6.25   → log2 2.64   → 10
//   n = 30:   (3.75)²   = 14.06  → log2 3.81   → 11
//   n = 50:   (6.25)²   = 39.06  → log2 5.29   → 13
//   n = 100:  (12.5)²   = 156.25 → log2 7.29   → 15
//   n = 127:  (15.875)² = 252.0  → log2 7.977  → 15
//   n = 1000: log2 13.97 → 21, clamped → 15 (beyond max_distance: the last bucket)
TEST(T5Bucket, BidirectionalHandWorked) {
  const T5Params p{.bidirectional = true, .num_buckets = 32, .max_distance = 128};
  const std::vector<Case> cases = {
      {0, 0},    {-1, 1},    {-3, 3},    {-7, 7},    {-8, 8},      {-12, 9},    {-20, 10},  {-30, 11},
      {-50, 13}, {-100, 15}, {-127, 15}, {-128, 15}, {-1000, 15},  {-1000000, 15},
      {1, 17},   {3, 19},    {7, 23},    {12, 25},   {20, 26},     {50, 29},    {100, 31},  {1000, 31},
  };
  for (const Case& c : cases) EXPECT_EQ(t5_bucket(c.r, p), c.bucket) << "r=" << c.r;
}

// Unidirectional, num_buckets 32, max_distance 128: n = max(−r, 0) (keys after the query all land in
// bucket 0); max_exact = 16;
//   bucket = 16 + ⌊ln(n/16) / ln(128/16) · 16⌋ = 16 + ⌊(16/3)·log2(n/16)⌋, at most 31:
//   n = 20:  log2 1.25   = 0.3219 · 5.333 = 1.717  → 17
//   n = 40:  log2 2.5    = 1.3219 · 5.333 = 7.050  → 23
//   n = 100: log2 6.25   = 2.6439 · 5.333 = 14.10  → 30
//   n = 127: log2 7.9375 = 2.9887 · 5.333 = 15.94  → 31
//   n = 5000: far beyond max_distance → 31
TEST(T5Bucket, UnidirectionalHandWorked) {
  const T5Params p{.bidirectional = false, .num_buckets = 32, .max_distance = 128};
  const std::vector<Case> cases = {
      {0, 0},    {1, 0},    {500, 0},   {-1, 1},    {-5, 5},     {-15, 15},
      {-16, 16}, {-20, 17}, {-40, 23},  {-100, 30}, {-127, 31},  {-5000, 31},
  };
  for (const Case& c : cases) EXPECT_EQ(t5_bucket(c.r, p), c.bucket) << "r=" << c.r;
}

// A small table: bidirectional, 8 buckets, max_distance 20: 4 per direction, max_exact 2,
//   bucket = 2 + ⌊2·ln(n/2)/ln(10)⌋ = 2 + ⌊2·log10(n/2)⌋, at most 3:
//   n = 3: 2·0.176 = 0.35 → 2;  n = 7: 2·0.544 = 1.09 → 3;  n = 19: 1.96 → 3;  n = 25: 2.19 → 3 (clamped)
TEST(T5Bucket, SmallTableHandWorked) {
  const T5Params p{.bidirectional = true, .num_buckets = 8, .max_distance = 20};
  const std::vector<Case> cases = {{0, 0}, {-1, 1}, {-2, 2}, {-3, 2}, {-7, 3}, {-19, 3}, {-25, 3},
                                   {1, 5}, {2, 6},   {3, 6},   {7, 7},   {25, 7}};
  for (const Case& c : cases) EXPECT_EQ(t5_bucket(c.r, p), c.bucket) << "r=" << c.r;
}

// The bucket rule written again here in double, against every distance up to 400 for a few tables
// (skipping distances whose log term lies within 1e-4 of an integer: there the float32 evaluation
// the library shares with Mesh TensorFlow may round to either side).
std::int64_t bucket_in_double(std::int64_t r, const T5Params& p, bool* near_edge) {
  std::int64_t nb = p.num_buckets, base = 0, n = 0;
  if (p.bidirectional) {
    nb /= 2;
    base = r > 0 ? nb : 0;
    n = r < 0 ? -r : r;
  } else {
    n = r < 0 ? -r : 0;
  }
  const std::int64_t exact = nb / 2;
  *near_edge = false;
  if (n < exact) return base + n;
  const double v = static_cast<double>(exact) +
                   std::log(static_cast<double>(n) / static_cast<double>(exact)) /
                       std::log(static_cast<double>(p.max_distance) / static_cast<double>(exact)) *
                       static_cast<double>(nb - exact);
  *near_edge = std::fabs(v - std::round(v)) < 1e-4;
  return base + std::min<std::int64_t>(static_cast<std::int64_t>(std::floor(v)), nb - 1);
}

TEST(T5Bucket, AgreesWithTheRuleInDouble) {
  for (const T5Params& p : {T5Params{true, 32, 128}, T5Params{false, 32, 128}, T5Params{true, 64, 256},
                            T5Params{false, 10, 50}, T5Params{true, 6, 3}}) {
    int checked = 0;
    for (std::int64_t r = -400; r <= 400; ++r) {
      bool edge = false;
      const std::int64_t want = bucket_in_double(r, p, &edge);
      if (edge) continue;
      EXPECT_EQ(t5_bucket(r, p), want) << "r=" << r << " nb=" << p.num_buckets << " bi=" << p.bidirectional;
      ++checked;
    }
    EXPECT_GT(checked, 700);
  }
}

// ---- bias and its gradient ---------------------------------------------------------------------

TEST(T5Bias, LooksUpTheBucketOfKeyMinusQuery) {
  const T5Params p{.bidirectional = true, .num_buckets = 32, .max_distance = 128};
  // Queries at 100, 101, 102; keys at 0, 50, 88, 92, 97, 101, 120, 300: distances include hand-worked
  // ones (−100 → 15, −50 → 13, −12 → 9, 0 → 0, +20 → 26, +1 → 17, …).
  const std::vector<std::int64_t> keys = {0, 50, 88, 92, 97, 101, 120, 300};
  // W[c, h] = 100·h + c: every entry says which (bucket, head) it came from.
  Vec w(32 * 2);
  for (std::int64_t c = 0; c < 32; ++c)
    for (std::int64_t h = 0; h < 2; ++h) w[static_cast<Sz>(c * 2 + h)] = 100.0 * static_cast<double>(h) + static_cast<double>(c);
  // Buckets per (query i, key j), by the hand-worked rule (bidirectional 32/128 above).
  const std::vector<std::vector<std::int64_t>> buckets = {
      // keys:  0   50  88  92  97  101 120 300      query 100: r = −100 −50 −12 −8 −3 +1 +20 +200
      {15, 13, 9, 8, 3, 17, 26, 31},
      // query 101: r = −101 −51 −13 −9 −4 0 +19 +199;  n = 13: (13/8)² = 2.64 → 9; n = 9: 1.27 → 8;
      // n = 19: (19/8)² = 5.64 → 10 → 26
      {15, 13, 9, 8, 4, 0, 26, 31},
      // query 102: r = −102 −52 −14 −10 −5 −1 +18 +198;  n = 14: 3.06 → 9; n = 10: 1.56 → 8;
      // n = 18: (18/8)² = 5.06 → 10 → 26
      {15, 13, 9, 8, 5, 1, 26, 31},
  };
  // These keys are not contiguous positions, so each (i, j) is its own 1×1 geometry here; a
  // contiguous block follows.
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 8; ++j) {
      const BiasGeometry one{2, 1, 1, 100 + i, keys[static_cast<Sz>(j)]};
      Vec out(2);
      ASSERT_TRUE(t5_bias(p, one, V(w, {32, 2}), V(out, {2, 1, 1})).ok());
      for (std::int64_t h = 0; h < 2; ++h)
        EXPECT_EQ(out[static_cast<Sz>(h)],
                  100.0 * static_cast<double>(h) + static_cast<double>(buckets[static_cast<Sz>(i)][static_cast<Sz>(j)]))
            << "i=" << i << " j=" << j << " h=" << h;
    }
  // A block: queries at 10, 11 against keys 5..12 (r from −6 to +2): all exact buckets.
  const BiasGeometry blk{2, 2, 8, 10, 5};
  Vec out(2 * 2 * 8, -1.0);
  ASSERT_TRUE(t5_bias(p, blk, V(w, {32, 2}), V(out, {2, 2, 8})).ok());
  Vec want;
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t j = 0; j < 8; ++j) {
        const std::int64_t r = (5 + j) - (10 + i);
        want.push_back(100.0 * static_cast<double>(h) + static_cast<double>(r <= 0 ? -r : 16 + r));
      }
  EXPECT_TRUE(AllClose(out, want, 0, 0));
}

TEST(T5Bias, Float32OutKeepsWeightsDtype) {
  const T5Params p{.bidirectional = false, .num_buckets = 4, .max_distance = 8};
  std::vector<float> w = {0.5f, 1.5f, 2.5f, 3.5f};  // [4, 1]
  std::vector<float> out(6);
  ASSERT_TRUE(t5_bias(p, {1, 2, 3, 1, 0}, V(w, {4, 1}), V(out, {1, 2, 3})).ok());
  // queries at 1, 2; keys 0, 1, 2 → r = −1, 0, +1 | −2, −1, 0; unidirectional n = max(−r, 0):
  // max_exact 2; n = 2: 2 + ⌊ln(1)/ln(4)·2⌋ = 2.
  EXPECT_EQ(out, (std::vector<float>{1.5f, 0.5f, 0.5f, 2.5f, 1.5f, 0.5f}));
}

TEST(T5Bias, BackwardByFiniteDifferences) {
  for (const T5Params& p : {T5Params{true, 8, 20}, T5Params{false, 6, 12}}) {
    const BiasGeometry g{3, 5, 9, 6, 0};
    const Sz nw = static_cast<Sz>(p.num_buckets * g.heads);
    const Vec w = randn(nw, 51), proj = randn(static_cast<Sz>(g.heads * g.q_len * g.k_len), 52);
    auto loss = [&](const Vec& wv) {
      Vec ww = wv, out(proj.size());
      EXPECT_TRUE(t5_bias(p, g, V(ww, {p.num_buckets, g.heads}), V(out, {g.heads, g.q_len, g.k_len})).ok());
      return dot(proj, out);
    };
    Vec db = proj, dw(nw, 33.0);  // overwritten
    ASSERT_TRUE(t5_bias_backward(p, g, V(db, {g.heads, g.q_len, g.k_len}), V(dw, {p.num_buckets, g.heads})).ok());
    EXPECT_TRUE(GradCheck(loss, w, dw));
  }
}

// ---- validation --------------------------------------------------------------------------------

TEST(T5, ValidateNamesTheParameter) {
  EXPECT_TRUE(t5_validate({}).ok());
  EXPECT_TRUE(t5_validate({.bidirectional = false, .num_buckets = 2, .max_distance = 2}).ok());
  EXPECT_EQ(t5_validate({.bidirectional = false, .num_buckets = 1}).arg(), "num_buckets");
  EXPECT_EQ(t5_validate({.bidirectional = true, .num_buckets = 31}).arg(), "num_buckets");
  EXPECT_EQ(t5_validate({.bidirectional = true, .num_buckets = 2}).arg(), "num_buckets");  // max_exact 0
  EXPECT_EQ(t5_validate({.bidirectional = true, .num_buckets = -4}).arg(), "num_buckets");
  EXPECT_EQ(t5_validate({.bidirectional = true, .num_buckets = 32, .max_distance = 8}).arg(), "max_distance");
  EXPECT_TRUE(t5_validate({.bidirectional = true, .num_buckets = 32, .max_distance = 9}).ok());
  EXPECT_EQ(t5_validate({.bidirectional = false, .num_buckets = 32, .max_distance = 16}).arg(), "max_distance");
  EXPECT_EQ(t5_bucket(3, {.bidirectional = true, .num_buckets = 2}), -1);
}

// A NaN or ±inf in the bias table would be copied into the logits: refused by the public (fast)
// path and the reference alike, naming weights and the first bad entry, before anything is written.
TEST(T5, WeightsMustBeFinite) {
  const T5Params p{.bidirectional = true, .num_buckets = 4, .max_distance = 8};
  const BiasGeometry g{2, 3, 4, 0, 0};
  using Fwd = Status (*)(const T5Params&, const BiasGeometry&, const View&, const View&);
  for (Fwd fwd : {static_cast<Fwd>(&t5_bias), static_cast<Fwd>(&reference::t5_bias)}) {
    for (double bad : {std::nan(""), double{INFINITY}, -double{INFINITY}}) {
      SCOPED_TRACE(bad);
      Vec w = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};  // [4, 2]
      w[5] = bad;                                        // w[2, 1]
      Vec out(24, 7.0);
      const Status s = fwd(p, g, V(w, {4, 2}), V(out, {2, 3, 4}));
      EXPECT_EQ(s.arg(), "weights") << s.message();
      EXPECT_NE(s.what().find("[2, 1]"), std::string::npos) << s.message();
      EXPECT_EQ(out, Vec(24, 7.0)) << "written on error";
    }
  }
}

TEST(T5, BadInputsNameTheArgumentAndWriteNothing) {
  const T5Params p{};
  const BiasGeometry g{2, 3, 4, 0, 0};
  Vec w(64, 1.0), out(24, 7.0), dw(64, 7.0);
  auto arg = [&](Status s) {
    EXPECT_EQ(out, Vec(24, 7.0)) << s.message();
    EXPECT_EQ(dw, Vec(64, 7.0)) << s.message();
    return s.arg();
  };
  EXPECT_EQ(arg(t5_bias({.num_buckets = 5}, g, V(w, {5, 2}), V(out, {2, 3, 4}))), "num_buckets");
  EXPECT_EQ(arg(t5_bias(p, g, V(w, {2, 32}), V(out, {2, 3, 4}))), "weights");
  EXPECT_EQ(arg(t5_bias(p, g, View{}, V(out, {2, 3, 4}))), "weights");
  EXPECT_EQ(arg(t5_bias(p, g, V(w, {32, 2}), V(out, {2, 4, 3}))), "out");
  std::vector<float> outf(24);
  EXPECT_EQ(arg(t5_bias(p, g, V(w, {32, 2}), V(outf, {2, 3, 4}))), "out");
  EXPECT_EQ(arg(t5_bias(p, {0, 3, 4, 0, 0}, V(w, {32, 0}), V(out, {0, 3, 4}))), "heads");
  EXPECT_EQ(arg(t5_bias_backward(p, g, V(out, {2, 4, 3}), V(dw, {32, 2}))), "dbias");
  EXPECT_EQ(arg(t5_bias_backward(p, g, V(out, {2, 3, 4}), V(dw, {2, 32}))), "dweights");
  EXPECT_EQ(arg(t5_bias_backward({.max_distance = 3}, g, V(out, {2, 3, 4}), V(dw, {32, 2}))), "max_distance");
}

}  // namespace
}  // namespace posenc
