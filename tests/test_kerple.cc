// KERPLE (Chi et al. 2022, arXiv 2205.09921): the logarithmic and power kernels as a logit bias.
// d = |key − query| throughout; the reference (posenc::reference) and the public entry point (the
// fast path) against hand-worked values and a formula written again here, gradients by central
// differences, properties (a function of the distance only, symmetric, 0 on the diagonal, falling
// with the distance), and bad inputs.
#include <cmath>
#include <cstdint>
#include <string>
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
using I = std::int64_t;

// The paper's two variants, written here independently (std::log of 1 + r2·d, std::pow).
double naive(bool power, double r1, double r2, I qp, I kp) {
  const double d = std::fabs(static_cast<double>(qp - kp));
  return power ? -r1 * std::pow(d, r2) : -r1 * std::log(1.0 + r2 * d);
}

Vec positive(Sz n, std::uint64_t seed, double lo, double span) {
  Vec r = randn(n, seed);
  for (double& x : r) x = lo + span * (0.5 + 0.5 * std::tanh(x));
  return r;
}

using BiasFn = Status (*)(const KerpleParams&, const BiasGeometry&, const View&, const View&, const View&);
using BackFn = Status (*)(const KerpleParams&, const BiasGeometry&, const View&, const View&, const View&,
                          const View&, const View&);
struct Impl {
  const char* name;
  BiasFn bias;
  BackFn back;
};
const Impl kImpls[] = {{"reference", &reference::kerple_bias, &reference::kerple_bias_backward},
                       {"public", &kerple_bias, &kerple_bias_backward}};

// Hand-worked: log, r1 = 2, r2 = 0.5: d = 2 → −2·log 2 = −1.3862943611198906, d = 6 → −2·log 4;
// power, r1 = 0.5, r2 = 1.5: d = 4 → −0.5·8 = −4, d = 1 → −0.5, d = 0 → 0.
TEST(KerpleBias, HandWorkedValues) {
  for (const Impl& im : kImpls) {
    SCOPED_TRACE(im.name);
    Vec r1 = {2.0, 0.5}, r2 = {0.5, 1.5};
    // one query at 4, keys at 0 … 8 (d = 4 3 2 1 0 1 2 3 4)
    Vec out(2 * 9);
    ASSERT_TRUE(im.bias({KerpleKernel::kLog}, {2, 1, 9, 4, 0}, V(r1, {2}), V(r2, {2}), V(out, {2, 1, 9})).ok());
    EXPECT_NEAR(out[2], -1.3862943611198906, 1e-15);   // head 0, d = 2
    EXPECT_NEAR(out[4], 0.0, 0.0);                      // d = 0
    EXPECT_NEAR(out[8], -2 * std::log(3.0), 1e-15);     // d = 4
    EXPECT_NEAR(out[9 + 3], -0.5 * std::log(2.5), 1e-15);  // head 1, d = 1: −0.5·log(1 + 1.5)
    ASSERT_TRUE(im.bias({KerpleKernel::kPower}, {2, 1, 9, 4, 0}, V(r1, {2}), V(r2, {2}), V(out, {2, 1, 9})).ok());
    EXPECT_NEAR(out[9 + 0], -4.0, 1e-15);  // head 1, d = 4: −0.5·4^1.5
    EXPECT_NEAR(out[9 + 3], -0.5, 1e-15);  // d = 1
    EXPECT_EQ(out[9 + 4], 0.0);            // d = 0
    EXPECT_NEAR(out[0], -2 * std::pow(4.0, 0.5), 1e-15);  // head 0, d = 4: −2·√4
  }
}

TEST(KerpleBias, MatchesTheFormulaWrittenAgain) {
  struct G {
    I H, M, N, qo, ko;
  };
  const G gs[] = {{1, 1, 1, 0, 0}, {3, 5, 7, 2, 0}, {4, 6, 3, 0, 9}, {2, 1, 40, 39, 0}, {3, 4, 5, -3, 1000}};
  int n = 0;
  for (const Impl& im : kImpls)
    for (bool power : {false, true})
      for (const G& gg : gs) {
        ++n;
        const BiasGeometry g{gg.H, gg.M, gg.N, gg.qo, gg.ko};
        Vec r1 = positive(static_cast<Sz>(gg.H), 10 + n, 0.05, 2.0), r2 = positive(static_cast<Sz>(gg.H), 20 + n, 0.05, 1.9);
        Vec out(static_cast<Sz>(gg.H * gg.M * gg.N)), want;
        const KerpleParams p{power ? KerpleKernel::kPower : KerpleKernel::kLog};
        ASSERT_TRUE(im.bias(p, g, V(r1, {gg.H}), V(r2, {gg.H}), V(out, {gg.H, gg.M, gg.N})).ok());
        for (I h = 0; h < gg.H; ++h)
          for (I i = 0; i < gg.M; ++i)
            for (I j = 0; j < gg.N; ++j)
              want.push_back(naive(power, r1[static_cast<Sz>(h)], r2[static_cast<Sz>(h)], gg.qo + i, gg.ko + j));
        EXPECT_TRUE(AllClose(out, want, 1e-14, 1e-13)) << im.name << " power=" << power << " case " << n;
        // float32 out and parameters
        std::vector<float> r1f(r1.begin(), r1.end()), r2f(r2.begin(), r2.end()), outf(out.size());
        ASSERT_TRUE(im.bias(p, g, V(r1f, {gg.H}), V(r2f, {gg.H}), V(outf, {gg.H, gg.M, gg.N})).ok());
        Vec wantf;
        for (I h = 0; h < gg.H; ++h)
          for (I i = 0; i < gg.M; ++i)
            for (I j = 0; j < gg.N; ++j)
              wantf.push_back(naive(power, r1f[static_cast<Sz>(h)], r2f[static_cast<Sz>(h)], gg.qo + i, gg.ko + j));
        EXPECT_TRUE(AllClose(Vec(outf.begin(), outf.end()), wantf, 1e-6, 1e-6));
      }
}

TEST(KerpleBias, BackwardByFiniteDifferences) {
  int n = 0;
  for (const Impl& im : kImpls)
    for (bool power : {false, true}) {
      ++n;
      const KerpleParams p{power ? KerpleKernel::kPower : KerpleKernel::kLog};
      const BiasGeometry g{3, 5, 9, 6, 0};  // keys on both sides of the queries
      const Sz nb = static_cast<Sz>(g.heads * g.q_len * g.k_len);
      const Vec r1 = positive(3, 40 + n, 0.2, 1.5), r2 = positive(3, 50 + n, 0.2, 1.5), proj = randn(nb, 60 + n);
      auto loss = [&](const Vec& a, const Vec& b) {
        Vec x = a, y = b, out(nb);
        EXPECT_TRUE(im.bias(p, g, V(x, {3}), V(y, {3}), V(out, {3, 5, 9})).ok());
        return dot(proj, out);
      };
      Vec db = proj, d1(3, 7.0), d2(3, 7.0), x1 = r1, x2 = r2;
      ASSERT_TRUE(im.back(p, g, V(x1, {3}), V(x2, {3}), V(db, {3, 5, 9}), V(d1, {3}), V(d2, {3})).ok());
      EXPECT_TRUE(GradCheck([&](const Vec& a) { return loss(a, r2); }, r1, d1)) << im.name << " dr1";
      EXPECT_TRUE(GradCheck([&](const Vec& b) { return loss(r1, b); }, r2, d2)) << im.name << " dr2";
      // each gradient alone
      Vec only(3, 9.0);
      ASSERT_TRUE(im.back(p, g, V(x1, {3}), V(x2, {3}), V(db, {3, 5, 9}), View{}, V(only, {3})).ok());
      EXPECT_EQ(only, d2);
    }
}

// A function of the distance only: moving queries and keys together changes nothing; symmetric
// in key − query; 0 on the diagonal; strictly falling with the distance (r1, r2 > 0).
TEST(KerpleBias, DependsOnTheDistanceOnly) {
  for (bool power : {false, true}) {
    const KerpleParams p{power ? KerpleKernel::kPower : KerpleKernel::kLog};
    Vec r1 = {0.7, 1.9}, r2 = {0.3, 1.2};
    Vec a(2 * 6 * 6), b(a.size());
    ASSERT_TRUE(kerple_bias(p, {2, 6, 6, 0, 0}, V(r1, {2}), V(r2, {2}), V(a, {2, 6, 6})).ok());
    ASSERT_TRUE(kerple_bias(p, {2, 6, 6, 12345, 12345}, V(r1, {2}), V(r2, {2}), V(b, {2, 6, 6})).ok());
    EXPECT_EQ(a, b);
    for (I h = 0; h < 2; ++h)
      for (I i = 0; i < 6; ++i)
        for (I j = 0; j < 6; ++j) {
          const double x = a[static_cast<Sz>((h * 6 + i) * 6 + j)], y = a[static_cast<Sz>((h * 6 + j) * 6 + i)];
          EXPECT_EQ(x, y);
          if (i == j) {
            EXPECT_EQ(x, 0.0);
          }
          if (j > i) {
            EXPECT_LT(x, a[static_cast<Sz>((h * 6 + i) * 6 + j - 1)]);
          }
        }
  }
}

TEST(KerpleBias, BadInputsNameTheArgumentAndWriteNothing) {
  const BiasGeometry g{2, 3, 4, 0, 0};
  Vec r1 = {0.5, 1.0}, r2 = {0.5, 1.0}, out(24, 7.0), d1(2, 7.0), d2(2, 7.0), db(24, 1.0);
  auto arg = [&](Status s) {
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(out, Vec(24, 7.0)) << s.message();
    EXPECT_EQ(d1, Vec(2, 7.0)) << s.message();
    EXPECT_EQ(d2, Vec(2, 7.0)) << s.message();
    return s.arg();
  };
  const KerpleParams lg{KerpleKernel::kLog}, pw{KerpleKernel::kPower};
  for (const Impl& im : kImpls) {
    SCOPED_TRACE(im.name);
    Vec neg = {0.5, -1.0}, zero = {0.0, 1.0}, nan = {0.5, std::nan("")}, big = {0.5, 2.5};
    EXPECT_EQ(arg(im.bias(lg, g, V(neg, {2}), V(r2, {2}), V(out, {2, 3, 4}))), "r1");
    EXPECT_EQ(arg(im.bias(lg, g, V(zero, {2}), V(r2, {2}), V(out, {2, 3, 4}))), "r1");
    EXPECT_EQ(arg(im.bias(lg, g, V(r1, {2}), V(nan, {2}), V(out, {2, 3, 4}))), "r2");
    EXPECT_EQ(arg(im.bias(pw, g, V(r1, {2}), V(big, {2}), V(out, {2, 3, 4}))), "r2");  // power: r2 ≤ 2
    Vec o2(24);
    EXPECT_TRUE(im.bias(lg, g, V(r1, {2}), V(big, {2}), V(o2, {2, 3, 4})).ok());     // log: any r2 > 0
    EXPECT_EQ(arg(im.bias(lg, g, V(r1, {1}), V(r2, {2}), V(out, {2, 3, 4}))), "r1");
    EXPECT_EQ(arg(im.bias(lg, g, V(r1, {2}), View{}, V(out, {2, 3, 4}))), "r2");
    EXPECT_EQ(arg(im.bias(lg, g, V(r1, {2}), V(r2, {2}), V(out, {2, 4, 3}))), "out");
    std::vector<float> outf(24), r2f = {0.5f, 1.f};
    EXPECT_EQ(arg(im.bias(lg, g, V(r1, {2}), V(r2, {2}), V(outf, {2, 3, 4}))), "out");   // dtype of r1
    EXPECT_EQ(arg(im.bias(lg, g, V(r1, {2}), V(r2f, {2}), V(out, {2, 3, 4}))), "r2");    // dtype of r1
    EXPECT_EQ(arg(im.bias(KerpleParams{static_cast<KerpleKernel>(7)}, g, V(r1, {2}), V(r2, {2}), V(out, {2, 3, 4}))),
              "kernel");
    EXPECT_EQ(arg(im.bias(lg, {2, -1, 4, 0, 0}, V(r1, {2}), V(r2, {2}), V(out, {2, 3, 4}))), "q_len");
    EXPECT_EQ(arg(im.back(lg, g, V(r1, {2}), V(r2, {2}), V(db, {2, 3, 5}), V(d1, {2}), V(d2, {2}))), "dbias");
    EXPECT_EQ(arg(im.back(lg, g, V(r1, {2}), V(r2, {2}), V(db, {2, 3, 4}), V(d1, {3}), V(d2, {2}))), "dr1");
    EXPECT_EQ(arg(im.back(lg, g, V(r1, {2}), V(r2, {2}), V(db, {2, 3, 4}), V(d1, {2}), V(outf, {2}))), "dr2");
    EXPECT_EQ(arg(im.back(pw, g, V(r1, {2}), V(big, {2}), V(db, {2, 3, 4}), V(d1, {2}), V(d2, {2}))), "r2");
    EXPECT_EQ(arg(im.back(lg, g, V(r1, {2}), V(r2, {2}), V(db, {2, 3, 4}), V(d1, {2}), V(d1, {2}))), "dr2");  // one buffer
  }
  // The message says what was expected and where.
  Vec neg = {0.5, -1.0};
  const Status s = kerple_bias(lg, g, V(neg, {2}), V(r2, {2}), V(out, {2, 3, 4}));
  EXPECT_NE(s.what().find("> 0"), std::string::npos) << s.message();
  EXPECT_NE(s.what().find("head 1"), std::string::npos) << s.message();
  EXPECT_EQ(parse_kerple_kernel("power").value(), KerpleKernel::kPower);
  EXPECT_EQ(parse_kerple_kernel("linear").status().arg(), "kernel");
}

}  // namespace
}  // namespace posenc
