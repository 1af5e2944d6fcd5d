// ALiBi (Press et al. 2022): slopes, the three variants of the article
// “Position Embedding” (docs/articles.md), caller slopes, the learned
// variant's gradient. Expectations are computed here, on their own.
#include <cmath>
#include <cstdint>
#include <limits>
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
using testing::to_float;

using Vec = std::vector<double>;
using Sz = std::size_t;
const double kInf = std::numeric_limits<double>::infinity();

// That article's get_slopes, written again: for a power of two n, start = 2^(−2^−(log2 n − 3)), slopes
// start·start^i; otherwise the slopes of the closest smaller power of two, then every other slope of
// twice that, up to n.
Vec articles_slopes(int n) {
  auto pow2 = [](int n) {
    const double start = std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(n)) - 3)));
    Vec s;
    for (int i = 0; i < n; ++i) s.push_back(start * std::pow(start, i));
    return s;
  };
  const double lg = std::log2(static_cast<double>(n));
  if (lg == std::floor(lg)) return pow2(n);
  const int closest = 1 << static_cast<int>(std::floor(lg));
  Vec s = pow2(closest);
  const Vec twice = articles_slopes(2 * closest);
  for (int i = 0; i < n - closest; ++i) s.push_back(twice[static_cast<Sz>(2 * i)]);
  return s;
}

// b[h, i, j] from a per-(h, r) rule, r = key − query with the geometry's offsets.
template <class F>
Vec build(const BiasGeometry& g, F f) {
  Vec b;
  for (std::int64_t h = 0; h < g.heads; ++h)
    for (std::int64_t i = 0; i < g.q_len; ++i)
      for (std::int64_t j = 0; j < g.k_len; ++j) b.push_back(f(h, (g.k_offset + j) - (g.query_offset() + i)));
  return b;
}

View out_view(Vec& v, const BiasGeometry& g) {
  v.assign(static_cast<Sz>(g.heads * g.q_len * g.k_len), 123.0);
  return V(v, {g.heads, g.q_len, g.k_len});
}

// ---- slopes ------------------------------------------------------------------------------------

TEST(AlibiSlopes, EightHeadsAreOneHalfToOne256th) {
  const Vec want = {1. / 2, 1. / 4, 1. / 8, 1. / 16, 1. / 32, 1. / 64, 1. / 128, 1. / 256};
  EXPECT_TRUE(AllClose(alibi_slopes(8), want, 0, 1e-15));
}

TEST(AlibiSlopes, NonPowersOfTwoFollowArticlesRule) {
  // 6 heads: 4's slopes 2^−2, 2^−4, 2^−6, 2^−8, then 8's 2^−1, 2^−3.
  EXPECT_TRUE(AllClose(alibi_slopes(6), {0.25, 0.0625, 1. / 64, 1. / 256, 0.5, 0.125}, 0, 1e-15));
  // 12 heads: 8's slopes 2^−1 … 2^−8, then 16's 2^−0.5, 2^−1.5, 2^−2.5, 2^−3.5.
  Vec want12;
  for (int h = 1; h <= 8; ++h) want12.push_back(std::ldexp(1.0, -h));
  for (double e : {0.5, 1.5, 2.5, 3.5}) want12.push_back(std::sqrt(0.5) * std::ldexp(1.0, -static_cast<int>(e - 0.5)));
  EXPECT_TRUE(AllClose(alibi_slopes(12), want12, 0, 1e-14));
  for (int n = 1; n <= 70; ++n) EXPECT_TRUE(AllClose(alibi_slopes(n), articles_slopes(n), 0, 1e-13)) << n;
}

// ---- symmetric ---------------------------------------------------------------------------------

TEST(Alibi, SymmetricIsMinusSlopeTimesDistanceWithOffsets) {
  for (BiasGeometry g : {BiasGeometry{4, 3, 7, 4, 0}, BiasGeometry{4, 5, 2, 2, 9}, BiasGeometry{4, 1, 6, 5, 0}}) {
    // m_h = 2^(−8(h+1)/4) = 2^(−2(h+1)).
    const Vec want = build(g, [](std::int64_t h, std::int64_t r) {
      return -std::ldexp(1.0, -2 * static_cast<int>(h + 1)) * static_cast<double>(std::llabs(r));
    });
    Vec out;
    ASSERT_TRUE(alibi_bias({}, g, {}, {}, out_view(out, g)).ok());
    EXPECT_TRUE(AllClose(out, want, 1e-15, 0));
    std::vector<float> outf(out.size());
    ASSERT_TRUE(alibi_bias({}, g, {}, {}, V(outf, {g.heads, g.q_len, g.k_len})).ok());
    EXPECT_TRUE(AllClose(Vec(outf.begin(), outf.end()), want, 1e-6, 1e-6));
  }
}

// attention.h's alignment: without q_offset the M queries are the last M of the N key positions
// (q_offset = k_offset + N − M), for M < N, M = N and M > N.
TEST(Alibi, DefaultQueryOffsetAlignsTheQueriesToTheLastKeys) {
  struct Geo {
    std::int64_t M, N, ko;
  };
  for (const Geo& s : {Geo{3, 7, 0}, Geo{5, 5, 2}, Geo{6, 2, 4}, Geo{1, 9, -3}}) {
    BiasGeometry g;
    g.heads = 4;
    g.q_len = s.M;
    g.k_len = s.N;
    g.k_offset = s.ko;
    EXPECT_FALSE(g.q_offset.has_value());
    EXPECT_EQ(g.query_offset(), s.ko + s.N - s.M);
    Vec want;
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t i = 0; i < s.M; ++i)
        for (std::int64_t j = 0; j < s.N; ++j) {
          const std::int64_t qp = s.ko + s.N - s.M + i, kp = s.ko + j;
          want.push_back(-std::ldexp(1.0, -2 * static_cast<int>(h + 1)) * static_cast<double>(std::llabs(qp - kp)));
        }
    Vec out;
    ASSERT_TRUE(alibi_bias({}, g, {}, {}, out_view(out, g)).ok());
    EXPECT_TRUE(AllClose(out, want, 1e-15, 0)) << s.M << " " << s.N;
    // the reference reads the same default
    Vec ref;
    ASSERT_TRUE(reference::alibi_bias({}, g, {}, {}, out_view(ref, g)).ok());
    EXPECT_TRUE(AllClose(ref, want, 1e-15, 0)) << s.M << " " << s.N;
  }
  // a default that puts a query beyond ±2^52 names q_offset
  BiasGeometry far;
  far.q_len = 3;
  far.k_len = 1;
  far.k_offset = -(std::int64_t{1} << 52);
  Vec out;
  const Status st = alibi_bias({}, far, {}, {}, out_view(out, far));
  EXPECT_EQ(st.arg(), "q_offset") << st.message();
}

TEST(Alibi, CallerSlopesAreUsedPerHead) {
  const BiasGeometry g{3, 4, 4, 0, 0};
  Vec slopes = {0.3, 0.7, 1.1};
  const Vec want = build(g, [&](std::int64_t h, std::int64_t r) {
    return -slopes[static_cast<Sz>(h)] * static_cast<double>(std::llabs(r));
  });
  Vec out;
  ASSERT_TRUE(alibi_bias({}, g, V(slopes, {3}), {}, out_view(out, g)).ok());
  EXPECT_TRUE(AllClose(out, want, 1e-15, 0));

  // Nonsymmetric with caller slopes [H]: each head its own slope, the masks as usual.
  const BiasGeometry g4{4, 3, 5, 2, 0};
  Vec s4 = {0.1, 0.2, 0.3, 0.4};
  std::vector<float> s4f = to_float(s4);
  const Vec want4 = build(g4, [&](std::int64_t h, std::int64_t r) {
    if ((h < 2 && r > 0) || (h >= 2 && r < 0)) return -kInf;
    return -static_cast<double>(s4f[static_cast<Sz>(h)]) * static_cast<double>(std::llabs(r));
  });
  ASSERT_TRUE(alibi_bias({.variant = AlibiVariant::kNonsymmetric}, g4, V(s4f, {4}), {}, out_view(out, g4)).ok());
  EXPECT_TRUE(AllClose(out, want4, 1e-15, 0));
}

// ---- nonsymmetric ------------------------------------------------------------------------------

TEST(Alibi, NonsymmetricMasksAndSharesSlopes) {
  const BiasGeometry g{6, 5, 5, 0, 0};
  const Vec m = articles_slopes(3);  // H/2 heads
  const Vec want = build(g, [&](std::int64_t h, std::int64_t r) {
    const bool past_head = h < 3;
    if (past_head && r > 0) return -kInf;    // heads 0..2 see j ≤ i
    if (!past_head && r < 0) return -kInf;   // heads 3..5 see j ≥ i
    return -m[static_cast<Sz>(h % 3)] * static_cast<double>(std::llabs(r));
  });
  Vec out;
  ASSERT_TRUE(alibi_bias({.variant = AlibiVariant::kNonsymmetric}, g, {}, {}, out_view(out, g)).ok());
  EXPECT_TRUE(AllClose(out, want, 1e-15, 0));
  // Spelled out: the diagonal is 0 in every head; each head masks exactly the 10 off-diagonal
  // entries of one side; head h and h + 3 mirror each other.
  for (std::int64_t h = 0; h < 6; ++h) {
    int masked = 0;
    for (std::int64_t i = 0; i < 5; ++i)
      for (std::int64_t j = 0; j < 5; ++j) {
        const double v = out[static_cast<Sz>((h * 5 + i) * 5 + j)];
        if (i == j) {
          EXPECT_EQ(v, 0.0);
        }
        if (std::isinf(v)) ++masked;
        if (h < 3) {
          EXPECT_EQ(v, out[static_cast<Sz>(((h + 3) * 5 + j) * 5 + i)]) << h << i << j;
        }
      }
    EXPECT_EQ(masked, 10) << h;
  }
}

TEST(Alibi, NonsymmetricWithOffsetsAndFloat32) {
  const BiasGeometry g{2, 2, 6, 4, 1};  // queries at 4, 5; keys at 1..6
  const Vec want = build(g, [](std::int64_t h, std::int64_t r) {
    if ((h == 0 && r > 0) || (h == 1 && r < 0)) return -kInf;
    return -0.00390625 * static_cast<double>(std::llabs(r));  // one head per side: 2^−8
  });
  std::vector<float> out(static_cast<Sz>(2 * 2 * 6));
  ASSERT_TRUE(alibi_bias({.variant = AlibiVariant::kNonsymmetric}, g, {}, {}, V(out, {2, 2, 6})).ok());
  EXPECT_TRUE(AllClose(Vec(out.begin(), out.end()), want, 1e-7, 0));
}

// ---- learned -----------------------------------------------------------------------------------

double logistic(double x) { return 0.5 * (1.0 + std::tanh(0.5 * x)); }

TEST(Alibi, LearnedValue) {
  const BiasGeometry g{3, 4, 6, 2, 0};
  Vec w = randn(6, 41, 2.0);  // [2, H]: w[0] the past side, w[1] the future side
  const Vec want = build(g, [&](std::int64_t h, std::int64_t r) {
    if (r < 0) return -logistic(w[static_cast<Sz>(h)]) * static_cast<double>(-r);
    if (r > 0) return -logistic(w[static_cast<Sz>(3 + h)]) * static_cast<double>(r);
    return 0.0;
  });
  Vec out;
  ASSERT_TRUE(alibi_bias({.variant = AlibiVariant::kLearned}, g, {}, V(w, {2, 3}), out_view(out, g)).ok());
  EXPECT_TRUE(AllClose(out, want, 1e-14, 1e-14));
}

TEST(Alibi, LearnedGradientByFiniteDifferences) {
  const AlibiParams p{.variant = AlibiVariant::kLearned};
  for (BiasGeometry g : {BiasGeometry{3, 4, 6, 2, 0}, BiasGeometry{2, 5, 3, 0, 1}}) {
    const Vec w = randn(static_cast<Sz>(2 * g.heads), 42);
    const Vec proj = randn(static_cast<Sz>(g.heads * g.q_len * g.k_len), 43);
    auto loss = [&](const Vec& wv) {
      Vec ww = wv, out;
      EXPECT_TRUE(alibi_bias(p, g, {}, V(ww, {2, g.heads}), out_view(out, g)).ok());
      return dot(proj, out);
    };
    Vec wc = w, db = proj, dw(w.size(), 77.0);
    ASSERT_TRUE(alibi_bias_backward(p, g, V(wc, {2, g.heads}), V(db, {g.heads, g.q_len, g.k_len}),
                                    V(dw, {2, g.heads}))
                    .ok());
    EXPECT_TRUE(GradCheck(loss, w, dw, 1e-6, 1e-8, 1e-6));
  }
}

TEST(Alibi, BackwardOnlyForTheLearnedVariant) {
  const BiasGeometry g{2, 2, 2, 0, 0};
  Vec w(4, 0.0), db(8, 1.0), dw(4, 5.0);
  for (AlibiVariant v : {AlibiVariant::kSymmetric, AlibiVariant::kNonsymmetric}) {
    Status s = alibi_bias_backward({.variant = v}, g, V(w, {2, 2}), V(db, {2, 2, 2}), V(dw, {2, 2}));
    EXPECT_EQ(s.arg(), "variant");
    EXPECT_EQ(dw, Vec(4, 5.0));
  }
}

// ---- errors ------------------------------------------------------------------------------------

TEST(Alibi, BadInputsNameTheArgument) {
  const BiasGeometry g{4, 3, 5, 0, 0};
  Vec out(60, 9.0), s3(3, 0.5), s4(4, 0.5), w(8, 0.0), w3(6, 0.0);
  const View ov = V(out, {4, 3, 5});
  auto arg = [&](Status s) {
    EXPECT_EQ(out, Vec(60, 9.0)) << "written on error: " << s.message();
    return s.arg();
  };
  const AlibiParams sym{}, nonsym{.variant = AlibiVariant::kNonsymmetric}, learned{.variant = AlibiVariant::kLearned};
  EXPECT_EQ(arg(alibi_bias(sym, g, V(s3, {3}), {}, ov)), "slopes");
  EXPECT_EQ(arg(alibi_bias(sym, g, V(s4, {2, 2}), {}, ov)), "slopes");
  Vec snan = {0.1, NAN, 0.2, 0.3};
  EXPECT_EQ(arg(alibi_bias(sym, g, V(snan, {4}), {}, ov)), "slopes");
  EXPECT_EQ(arg(alibi_bias(sym, g, {}, V(w, {2, 4}), ov)), "weights");
  EXPECT_EQ(arg(alibi_bias(sym, g, {}, {}, V(out, {4, 5, 3}))), "out");
  EXPECT_EQ(arg(alibi_bias(sym, g, {}, {}, View{})), "out");
  EXPECT_EQ(arg(alibi_bias(sym, {0, 3, 5, 0, 0}, {}, {}, ov)), "heads");
  EXPECT_EQ(arg(alibi_bias(sym, {4, -3, 5, 0, 0}, {}, {}, ov)), "q_len");
  EXPECT_EQ(arg(alibi_bias(sym, {4, 3, -5, 0, 0}, {}, {}, ov)), "k_len");
  // the last query or key past 2^52 (the first within it), and the largest accepted offsets
  const std::int64_t e52 = std::int64_t{1} << 52;
  EXPECT_EQ(arg(alibi_bias(sym, {4, 3, 5, e52 - 1, 0}, {}, {}, ov)), "q_offset");
  EXPECT_EQ(arg(alibi_bias(sym, {4, 3, 5, 0, e52 - 3}, {}, {}, ov)), "k_offset");
  Vec edge(60, 9.0);
  EXPECT_TRUE(alibi_bias(sym, {4, 3, 5, e52 - 2, e52 - 4}, {}, {}, V(edge, {4, 3, 5})).ok());
  Vec out3(45, 9.0);
  Status odd = alibi_bias(nonsym, {3, 3, 5, 0, 0}, {}, {}, V(out3, {3, 3, 5}));
  EXPECT_EQ(odd.arg(), "heads");
  EXPECT_EQ(out3, Vec(45, 9.0));
  EXPECT_EQ(arg(alibi_bias(learned, g, {}, {}, ov)), "weights");
  EXPECT_EQ(arg(alibi_bias(learned, g, {}, V(w3, {2, 3}), ov)), "weights");
  EXPECT_EQ(arg(alibi_bias(learned, g, V(s4, {4}), V(w, {2, 4}), ov)), "slopes");
  std::vector<float> wf(8);
  EXPECT_EQ(arg(alibi_bias(learned, g, {}, V(wf, {2, 4}), ov)), "out");  // out keeps weights' dtype
  EXPECT_EQ(arg(alibi_bias({.variant = static_cast<AlibiVariant>(9)}, g, {}, {}, ov)), "variant");
  Vec dw(8);
  EXPECT_EQ(alibi_bias_backward(learned, g, V(w, {2, 4}), V(out, {4, 5, 3}), V(dw, {2, 4})).arg(), "dbias");
  EXPECT_EQ(alibi_bias_backward(learned, g, V(w, {2, 4}), ov, V(dw, {4, 2})).arg(), "dweights");
  EXPECT_EQ(alibi_bias_backward(learned, g, V(w3, {2, 3}), ov, V(dw, {2, 4})).arg(), "weights");
}

// The learned variant's weights must be finite, like caller slopes: σ(NaN) would be a NaN bias (and
// ±inf a slope of exactly 0 or 1, a diverged parameter). The public (fast) path and the reference
// refuse them alike, forward and backward, before writing anything; the error gives the index.
TEST(Alibi, LearnedWeightsMustBeFinite) {
  const BiasGeometry g{2, 3, 4, 1, 0};
  const AlibiParams learned{.variant = AlibiVariant::kLearned};
  using Fwd = Status (*)(const AlibiParams&, const BiasGeometry&, const View&, const View&, const View&);
  using Bwd = Status (*)(const AlibiParams&, const BiasGeometry&, const View&, const View&, const View&);
  const std::pair<Fwd, Bwd> impls[] = {{&alibi_bias, &alibi_bias_backward},
                                       {&reference::alibi_bias, &reference::alibi_bias_backward}};
  for (const auto& [fwd, bwd] : impls) {
    for (double bad : {std::nan(""), kInf, -kInf}) {
      SCOPED_TRACE(bad);
      Vec w = {0.5, -1.0, 2.0, 0.25};  // [2, H]
      w[3] = bad;                      // w[1, 1]: head 1's future slope
      Vec out(24, 9.0), db(24, 1.0), dw(4, 5.0);
      const Status f = fwd(learned, g, {}, V(w, {2, 2}), V(out, {2, 3, 4}));
      EXPECT_EQ(f.arg(), "weights") << f.message();
      EXPECT_NE(f.what().find("finite"), std::string::npos) << f.message();
      EXPECT_NE(f.what().find("[1, 1]"), std::string::npos) << f.message();
      EXPECT_EQ(out, Vec(24, 9.0)) << "written on error";
      const Status b = bwd(learned, g, V(w, {2, 2}), V(db, {2, 3, 4}), V(dw, {2, 2}));
      EXPECT_EQ(b.arg(), "weights") << b.message();
      EXPECT_EQ(dw, Vec(4, 5.0)) << "written on error";
    }
    // Finite weights, however large, are fine: σ saturates to 1 (w ≥ 700) and 0 (w ≤ −700).
    Vec w = {700.0, -700.0, 1e300, -1e300}, out(24, 9.0);  // w[0] = {700, −700}, w[1] = {1e300, −1e300}
    ASSERT_TRUE(fwd(learned, g, {}, V(w, {2, 2}), V(out, {2, 3, 4})).ok());
    // query i at 1 + i, key j at j: r = j − 1 − i; past (r < 0) −σ(w[0,h])·|r|, future −σ(w[1,h])·r.
    const Vec sig_past = {1.0, 0.0}, sig_future = {1.0, 0.0};
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < 4; ++j) {
          const double r = static_cast<double>(j - 1 - i);
          const double want = r < 0 ? sig_past[static_cast<Sz>(h)] * r : -sig_future[static_cast<Sz>(h)] * r;
          EXPECT_NEAR(out[static_cast<Sz>((h * 3 + i) * 4 + j)], want, 1e-12);
        }
  }
}

TEST(Alibi, VariantNamesRoundTrip) {
  for (AlibiVariant v : {AlibiVariant::kSymmetric, AlibiVariant::kNonsymmetric, AlibiVariant::kLearned}) {
    auto parsed = parse_alibi_variant(alibi_variant_name(v));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, v);
  }
  EXPECT_EQ(parse_alibi_variant("causal").status().arg(), "variant");
}

}  // namespace
}  // namespace posenc
