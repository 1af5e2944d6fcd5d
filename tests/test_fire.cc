// FIRE (Li et al. 2023, arXiv 2310.04418): b_h(i, j) = f_h(ψ(|i − j|)/ψ(max(L, i))), ψ(x) =
// log(c·x + 1), f an MLP with one ReLU layer. The reference (the MLP per pair) and the public entry
// point (its piecewise-linear form) against hand-worked values and the formula written again here;
// every learned tensor's gradient by central differences; the pieces themselves; the kink
// convention; properties (shift invariance while the queries stay below L, lost beyond it;
// the farthest key at x = 1; symmetric in the distance) and bad inputs.
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "enc/bias/fire/fire_math.h"
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
using I = std::int64_t;

// An MLP of width W for H heads with c and L, as doubles, and its views.
struct Mlp {
  I W, H;
  Vec w1, b1, w2, b2, c, L;
  Mlp(I w, I h, std::uint64_t seed, double cc = 0.3, double LL = 5.5) : W(w), H(h) {
    w1 = randn(static_cast<Sz>(W), seed, 1.5);
    b1 = randn(static_cast<Sz>(W), seed + 1, 0.7);
    w2 = randn(static_cast<Sz>(H * W), seed + 2, 0.8);
    b2 = randn(static_cast<Sz>(H), seed + 3, 0.5);
    c = {cc};
    L = {LL};
  }
  FireTensors views() {
    return FireTensors{V(w1, {W}), V(b1, {W}), V(w2, {H, W}), V(b2, {H}), V(c, {1}), V(L, {1})};
  }
  Vec* by_name(const std::string& n) {
    return n == "w1" ? &w1 : n == "b1" ? &b1 : n == "w2" ? &w2 : n == "b2" ? &b2 : n == "c" ? &c : &L;
  }
};

// The paper's formula, written again: x = log(c·d + 1)/log(c·max(L, qp) + 1), f = w2·relu(w1·x + b1) + b2.
double naive(const Mlp& m, I h, I qp, I kp) {
  const double c = m.c[0], L = m.L[0];
  const double d = std::fabs(static_cast<double>(qp - kp));
  const double x = std::log(c * d + 1) / std::log(c * std::max(L, static_cast<double>(qp)) + 1);
  double f = m.b2[static_cast<Sz>(h)];
  for (I k = 0; k < m.W; ++k)
    f += m.w2[static_cast<Sz>(h * m.W + k)] * std::max(0.0, m.w1[static_cast<Sz>(k)] * x + m.b1[static_cast<Sz>(k)]);
  return f;
}

using BiasFn = Status (*)(const FireParams&, const BiasGeometry&, const FireTensors&, const View&);
using BackFn = Status (*)(const FireParams&, const BiasGeometry&, const FireTensors&, const View&, const FireTensors&);
struct Impl {
  const char* name;
  BiasFn bias;
  BackFn back;
};
const Impl kImpls[] = {{"reference", &reference::fire_bias, &reference::fire_bias_backward},
                       {"public", &fire_bias, &fire_bias_backward}};

// W = 2, H = 1: w1 = (1, −1), b1 = (0, 0.5), w2 = (2, 1), b2 = 0.25, so f(x) = 2·relu(x) +
// relu(0.5 − x) + 0.25; c = e − 1 makes ψ(1) = log e = 1, and L = 1.
//   query 1 (n = max(1, 1) = 1, ψ(n) = 1): key 0, 2 (d = 1): x = 1, f = 2.25; key 1: x = 0, f = 0.75;
//     key 3 (d = 2): x = ψ(2) = log(2e − 1), f = 2·log(2e − 1) + 0.25 (relu(0.5 − x) = 0);
//   query 3 (n = 3, ψ(3) = log(3e − 2)): key 0 (d = 3): x = 1, f = 2.25; key 3: 0.75;
//     key 2 (d = 1): x = 1/log(3e − 2) ≈ 0.5503 > 0.5, f = 2/log(3e − 2) + 0.25.
TEST(FireBias, HandWorkedValues) {
  const double e = std::numbers::e;
  Mlp m(2, 1, 1);
  m.w1 = {1, -1};
  m.b1 = {0, 0.5};
  m.w2 = {2, 1};
  m.b2 = {0.25};
  m.c = {e - 1};
  m.L = {1};
  for (const Impl& im : kImpls) {
    SCOPED_TRACE(im.name);
    Vec out(3 * 4);
    ASSERT_TRUE(im.bias({}, {1, 3, 4, 1, 0}, m.views(), V(out, {1, 3, 4})).ok());  // queries 1, 2, 3
    EXPECT_NEAR(out[0], 2.25, 1e-14);
    EXPECT_NEAR(out[1], 0.75, 1e-14);
    EXPECT_NEAR(out[2], 2.25, 1e-14);
    EXPECT_NEAR(out[3], 2 * std::log(2 * e - 1) + 0.25, 1e-14);
    EXPECT_NEAR(out[8], 2.25, 1e-14);
    EXPECT_NEAR(out[10], 2 / std::log(3 * e - 2) + 0.25, 1e-14);
    EXPECT_NEAR(out[11], 0.75, 1e-14);
  }
}

TEST(FireBias, MatchesTheFormulaWrittenAgain) {
  struct G {
    I H, M, N, qo, ko;
  };
  // queries below and above L = 5.5, keys on both sides, far offsets
  const G gs[] = {{1, 1, 1, 0, 0}, {3, 9, 9, 0, 0}, {2, 5, 12, 3, 0}, {4, 6, 3, 20, 2}, {2, 1, 40, 39, 0},
                  {3, 4, 7, 100000, 99990}};
  int n = 0;
  for (const Impl& im : kImpls)
    for (const G& gg : gs) {
      ++n;
      Mlp m(7, gg.H, 100 + n);
      Vec out(static_cast<Sz>(gg.H * gg.M * gg.N)), want;
      ASSERT_TRUE(im.bias({}, {gg.H, gg.M, gg.N, gg.qo, gg.ko}, m.views(), V(out, {gg.H, gg.M, gg.N})).ok());
      for (I h = 0; h < gg.H; ++h)
        for (I i = 0; i < gg.M; ++i)
          for (I j = 0; j < gg.N; ++j) want.push_back(naive(m, h, gg.qo + i, gg.ko + j));
      EXPECT_TRUE(AllClose(out, want, 1e-13, 1e-12)) << im.name << " case " << n;
    }
}

TEST(FireBias, BackwardByFiniteDifferences) {
  // L = 5.5 between the query positions 2 … 8 (both sides of max(L, i)), keys 0 … 10.
  const BiasGeometry g{3, 7, 11, 2, 0};
  const Sz nb = static_cast<Sz>(g.heads * g.q_len * g.k_len);
  for (const Impl& im : kImpls) {
    SCOPED_TRACE(im.name);
    Mlp m0(6, 3, 200);
    const Vec proj = randn(nb, 201);
    Vec db = proj;
    Mlp gm = m0;  // gradient buffers of the same shapes
    for (const char* nm : {"w1", "b1", "w2", "b2", "c", "L"}) std::fill(gm.by_name(nm)->begin(), gm.by_name(nm)->end(), 7.0);
    ASSERT_TRUE(im.back({}, g, m0.views(), V(db, {3, 7, 11}), gm.views()).ok());
    for (const char* nm : {"w1", "b1", "w2", "b2", "c", "L"}) {
      SCOPED_TRACE(nm);
      auto loss = [&](const Vec& x) {
        Mlp m = m0;
        *m.by_name(nm) = x;
        Vec out(nb);
        EXPECT_TRUE(im.bias({}, g, m.views(), V(out, {3, 7, 11})).ok());
        return dot(proj, out);
      };
      EXPECT_TRUE(GradCheck(loss, *m0.by_name(nm), *gm.by_name(nm), 1e-6, 1e-7, 1e-5));
    }
    // a subset of the gradients alone gives the same values
    Vec only(1, 9.0);
    FireTensors one;
    one.threshold = V(only, {1});
    ASSERT_TRUE(im.back({}, g, m0.views(), V(db, {3, 7, 11}), one).ok());
    EXPECT_EQ(only[0], gm.L[0]);
  }
}

// The pieces (fire_math.h): α + β·x on the segment of x equals the MLP at x, also at the
// breakpoints themselves and at 0, and the segment walk from any start finds the same segment.
TEST(FirePieces, EqualTheMlpEverywhere) {
  for (std::uint64_t seed : {1, 2, 3, 4, 5}) {
    Mlp m(16, 3, 300 + seed);
    if (seed == 5) m.b1[3] = m.b1[7] = 0.0;  // breakpoints at 0
    const fire::Pieces P = fire::pieces(m.w1, m.b1, m.w2, m.b2, 3);
    EXPECT_LE(P.S, 16);
    Vec xs = {0.0, 1e-9, 0.25, 0.5, 1.0, 2.0, 7.5, 1e6};
    for (double t : P.t) xs.push_back(t), xs.push_back(std::nextafter(t, 0.0)), xs.push_back(t * (1 + 1e-9));
    for (double x : xs)
      for (I h = 0; h < 3; ++h) {
        const I s = P.segment(x);
        for (I s0 = 0; s0 <= P.S + 1; ++s0) EXPECT_EQ(P.segment_near(x, s0), s) << x;
        const double want = fire::mlp(m.w1.data(), m.b1.data(), &m.w2[static_cast<Sz>(h * 16)], m.b2[static_cast<Sz>(h)], 16, x);
        EXPECT_NEAR(P.a(h, s) + P.b(h, s) * x, want, 1e-12 * (1 + std::fabs(want) + std::fabs(x))) << "x " << x;
      }
  }
}

// At d = 0 (x = 0) a unit with b1 = 0 sits on its kink; both implementations take relu'(0) = 0
// there (the public one through its x = 0 segment), so their db1 agree exactly in that unit's
// treatment, and with finite differences of the other units.
TEST(FireBias, KinkAtTheDiagonalTreatedAlike) {
  const BiasGeometry g{2, 6, 6, 0, 0};
  Mlp m(5, 2, 400);
  m.b1[1] = 0.0;
  m.w1[1] = 1.3;   // active for x > 0, at its kink at x = 0
  m.b1[2] = 0.0;
  m.w1[2] = -0.4;  // active for x < 0 only: never
  const Vec proj = randn(72, 401);
  Vec db = proj;
  Mlp ga = m, gb = m;
  ASSERT_TRUE(reference::fire_bias_backward({}, g, m.views(), V(db, {2, 6, 6}), ga.views()).ok());
  ASSERT_TRUE(fire_bias_backward({}, g, m.views(), V(db, {2, 6, 6}), gb.views()).ok());
  for (const char* nm : {"w1", "b1", "w2", "b2", "c", "L"})
    EXPECT_TRUE(AllClose(*gb.by_name(nm), *ga.by_name(nm), 1e-13, 1e-12)) << nm;
  // the kinked unit's db1 collects only the pairs off the diagonal (x > 0): written out here
  double want = 0;
  for (I h = 0; h < 2; ++h)
    for (I i = 0; i < 6; ++i)
      for (I j = 0; j < 6; ++j)
        if (i != j) want += proj[static_cast<Sz>((h * 6 + i) * 6 + j)] * m.w2[static_cast<Sz>(h * 5 + 1)];
  EXPECT_NEAR(ga.b1[1], want, 1e-12);
}

TEST(FireBias, Properties) {
  Mlp m(8, 2, 500, 0.2, 64.5);
  const I L = 10;
  auto bias = [&](I qo, I ko, I M, I N) {
    Vec out(static_cast<Sz>(2 * M * N));
    EXPECT_TRUE(fire_bias({}, {2, M, N, qo, ko}, m.views(), V(out, {2, M, N})).ok());
    return out;
  };
  // Every query at or below L = 64.5: ψ(max(L, i)) = ψ(L) for all, a function of the distance only.
  EXPECT_TRUE(AllClose(bias(30, 30, L, L), bias(0, 0, L, L), 1e-13, 1e-12));
  // Past L the normaliser grows with the query's position: the same distances give other values.
  const Vec far = bias(1000, 1000, L, L), near = bias(0, 0, L, L);
  double diff = 0;
  for (Sz e = 0; e < far.size(); ++e) diff = std::max(diff, std::fabs(far[e] - near[e]));
  EXPECT_GT(diff, 1e-3);
  // Progressive interpolation: for a query past L the key at position 0 sits at x = 1, so every
  // such query gives it the same bias f_h(1); and a key d before the query gets the bias of the key d
  // after it (|i − j|).
  const Vec col = bias(100, 0, 50, 1);  // queries 100 … 149, key 0
  for (I h = 0; h < 2; ++h)
    for (I i = 1; i < 50; ++i) EXPECT_NEAR(col[static_cast<Sz>(h * 50 + i)], col[static_cast<Sz>(h * 50)], 1e-12);
  const Vec row = bias(200, 190, 1, 21);  // query 200, keys 190 … 210
  for (I h = 0; h < 2; ++h)
    for (I d = 1; d <= 10; ++d)
      EXPECT_NEAR(row[static_cast<Sz>(h * 21 + 10 - d)], row[static_cast<Sz>(h * 21 + 10 + d)], 1e-13);
}

TEST(FireBias, BadInputsNameTheArgumentAndWriteNothing) {
  const BiasGeometry g{2, 3, 4, 0, 0};
  for (const Impl& im : kImpls) {
    SCOPED_TRACE(im.name);
    Vec out(24, 7.0), db(24, 1.0);
    Mlp gm(4, 2, 1);
    for (const char* nm : {"w1", "b1", "w2", "b2", "c", "L"}) std::fill(gm.by_name(nm)->begin(), gm.by_name(nm)->end(), 7.0);
    auto arg = [&](Status s) {
      EXPECT_FALSE(s.ok());
      EXPECT_EQ(out, Vec(24, 7.0)) << s.message();
      for (const char* nm : {"w1", "b1", "w2", "b2", "c", "L"}) EXPECT_EQ(*gm.by_name(nm), Vec(gm.by_name(nm)->size(), 7.0));
      return s.arg();
    };
    auto with = [&](auto edit) {
      Mlp m(4, 2, 1);
      FireTensors t = m.views();
      edit(m, t);
      return im.bias({}, g, t, V(out, {2, 3, 4}));
    };
    EXPECT_EQ(arg(with([](Mlp&, FireTensors& t) { t.w1 = View{}; })), "mlp_w1");
    EXPECT_EQ(arg(with([](Mlp&, FireTensors& t) { t.w1.shape[0] = 0; })), "mlp_w1");
    EXPECT_EQ(arg(with([](Mlp&, FireTensors& t) { t.b1.shape[0] = 3; })), "mlp_b1");
    EXPECT_EQ(arg(with([](Mlp&, FireTensors& t) { t.w2.shape[0] = 3; })), "mlp_w2");
    EXPECT_EQ(arg(with([](Mlp&, FireTensors& t) { t.b2.ndim = 2; })), "mlp_b2");
    EXPECT_EQ(arg(with([](Mlp& m, FireTensors&) { m.c[0] = 0; })), "c");
    EXPECT_EQ(arg(with([](Mlp& m, FireTensors&) { m.c[0] = -0.1; })), "c");
    EXPECT_EQ(arg(with([](Mlp& m, FireTensors&) { m.L[0] = 0; })), "threshold");
    EXPECT_EQ(arg(with([](Mlp& m, FireTensors&) { m.L[0] = INFINITY; })), "threshold");
    EXPECT_EQ(arg(with([](Mlp& m, FireTensors&) { m.w2[3] = std::nan(""); })), "mlp_w2");
    EXPECT_EQ(arg(with([](Mlp&, FireTensors& t) { t.c.shape[0] = 2; })), "c");
    Mlp m(4, 2, 1);
    EXPECT_EQ(arg(im.bias({}, g, m.views(), V(out, {2, 3, 5}))), "out");
    std::vector<float> outf(24);
    EXPECT_EQ(arg(im.bias({}, g, m.views(), V(outf, {2, 3, 4}))), "out");  // mlp_w2's dtype
    FireTensors bad = gm.views();
    bad.w2.shape[1] = 3;
    EXPECT_EQ(arg(im.back({}, g, m.views(), V(db, {2, 3, 4}), bad)), "dmlp_w2");
    bad = gm.views();
    bad.threshold.shape[0] = 2;
    EXPECT_EQ(arg(im.back({}, g, m.views(), V(db, {2, 3, 4}), bad)), "dthreshold");
    EXPECT_EQ(arg(im.back({}, g, m.views(), V(db, {2, 4, 4}), gm.views())), "dbias");
    bad = gm.views();
    bad.b1 = bad.w1;  // two gradients in one buffer
    EXPECT_EQ(arg(im.back({}, g, m.views(), V(db, {2, 3, 4}), bad)), "dmlp_b1");
  }
}

}  // namespace
}  // namespace posenc
