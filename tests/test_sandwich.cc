// Sandwich (Chi et al. 2023, arXiv 2212.10356): the inner product of two sinusoidal position
// embeddings as a parameter-free logit bias, shifted by −d̄/2 and divided per head by 8(h+1)/H.
// The reference and the public entry point (fast path) against hand-worked values, against the
// inner product of sinusoid vectors built here, properties and bad inputs.
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "posenc/bias.h"
#include "posenc/reference.h"
#include "testing.h"

namespace posenc {
namespace {

using testing::AllClose;
using testing::V;

using Vec = std::vector<double>;
using Sz = std::size_t;
using I = std::int64_t;

using BiasFn = Status (*)(const SandwichParams&, const BiasGeometry&, const View&);
struct Impl {
  const char* name;
  BiasFn bias;
};
const Impl kImpls[] = {{"reference", &reference::sandwich_bias}, {"public", &sandwich_bias}};

// d̄ = 2 and base = 2/π give the single frequency ω_1 = base^(−1) = π/2, so
//   b_0(r) = cos(r·π/2) − 1 = 0, −1, −2, −1, 0 for |r| = 0, 1, 2, 3, 4,
// and with H = 8 head h is that divided by (h + 1) (H/(8(h+1)) = 1/(h+1)).
TEST(SandwichBias, HandWorkedValues) {
  const SandwichParams p{2, 2.0 / std::numbers::pi};
  for (const Impl& im : kImpls) {
    SCOPED_TRACE(im.name);
    Vec out(8 * 9);
    ASSERT_TRUE(im.bias(p, {8, 1, 9, 4, 0}, V(out, {8, 1, 9})).ok());  // query 4, keys 0 … 8
    const double want0[] = {0, -1, -2, -1, 0, -1, -2, -1, 0};
    for (I h = 0; h < 8; ++h)
      for (I j = 0; j < 9; ++j)
        EXPECT_NEAR(out[static_cast<Sz>(h * 9 + j)], want0[j] / static_cast<double>(h + 1), 1e-15) << h << " " << j;
  }
}

// The paper's construction: p_m = [sin(m·ω_1), cos(m·ω_1), …, sin(m·ω_{d̄/2}), cos(m·ω_{d̄/2})],
// ω_k = base^(−2k/d̄); the bias is (p_mᵀp_n − d̄/2)·H/(8(h+1)) for query m and key n.
TEST(SandwichBias, IsTheSinusoidsInnerProduct) {
  struct G {
    I H, M, N, qo, ko, dim;
    double base;
  };
  const G gs[] = {{1, 1, 1, 0, 0, 2, 10000}, {4, 5, 7, 2, 0, 8, 10000}, {3, 6, 3, 0, 9, 16, 100},
                  {8, 1, 40, 39, 0, 128, 10000}, {2, 4, 5, 100, 3, 6, 500}};
  for (const Impl& im : kImpls)
    for (const G& gg : gs) {
      const SandwichParams p{gg.dim, gg.base};
      auto emb = [&](I m) {
        Vec e;
        for (I k = 1; k <= gg.dim / 2; ++k) {
          const double w = std::pow(gg.base, -2.0 * static_cast<double>(k) / static_cast<double>(gg.dim));
          e.push_back(std::sin(static_cast<double>(m) * w));
          e.push_back(std::cos(static_cast<double>(m) * w));
        }
        return e;
      };
      Vec out(static_cast<Sz>(gg.H * gg.M * gg.N)), want;
      ASSERT_TRUE(im.bias(p, {gg.H, gg.M, gg.N, gg.qo, gg.ko}, V(out, {gg.H, gg.M, gg.N})).ok());
      for (I h = 0; h < gg.H; ++h)
        for (I i = 0; i < gg.M; ++i)
          for (I j = 0; j < gg.N; ++j) {
            const Vec a = emb(gg.qo + i), b = emb(gg.ko + j);
            double ip = 0;
            for (Sz e = 0; e < a.size(); ++e) ip += a[e] * b[e];
            want.push_back((ip - static_cast<double>(gg.dim) / 2) * static_cast<double>(gg.H) / (8.0 * static_cast<double>(h + 1)));
          }
      // the inner product of vectors of norm² d̄/2 in double: absolute error ~ d̄·2⁻⁵²
      EXPECT_TRUE(AllClose(out, want, 1e-12 * static_cast<double>(gg.dim), 1e-12)) << im.name << " dim " << gg.dim;
    }
}

// A function of key − query only, even in it, 0 on the diagonal and ≤ 0 elsewhere; heads are
// one profile scaled by 1/(h+1); parameter-free, so the same for any other call with the geometry.
TEST(SandwichBias, Properties) {
  const SandwichParams p{};  // d̄ = 128, base 10000
  const I H = 4, L = 40;
  Vec a(static_cast<Sz>(H * L * L)), b(a.size());
  ASSERT_TRUE(sandwich_bias(p, {H, L, L, 0, 0}, V(a, {H, L, L})).ok());
  ASSERT_TRUE(sandwich_bias(p, {H, L, L, 777, 777}, V(b, {H, L, L})).ok());
  EXPECT_EQ(a, b);
  for (I h = 0; h < H; ++h)
    for (I i = 0; i < L; ++i)
      for (I j = 0; j < L; ++j) {
        const double x = a[static_cast<Sz>((h * L + i) * L + j)];
        EXPECT_EQ(x, a[static_cast<Sz>((h * L + j) * L + i)]);
        if (i == j) {
          EXPECT_EQ(x, 0.0);
        } else {
          EXPECT_LT(x, 0.0);
        }
        const double x0 = a[static_cast<Sz>(i * L + j)];  // head 0 = (H/8)·profile
        EXPECT_NEAR(x * static_cast<double>(h + 1), x0, 1e-12 * std::fabs(x0));
      }
  // Near the diagonal it falls with the distance (farther out the fast frequencies make it ripple:
  // with d̄ = 128 it first rises again between d = 13 and 14).
  for (I d = 1; d <= 13; ++d) EXPECT_LT(a[static_cast<Sz>(d)], a[static_cast<Sz>(d - 1)]) << d;
}

TEST(SandwichBias, BadInputsNameTheArgumentAndWriteNothing) {
  Vec out(24, 7.0);
  const BiasGeometry g{2, 3, 4, 0, 0};
  for (const Impl& im : kImpls) {
    auto arg = [&](Status s) {
      EXPECT_FALSE(s.ok());
      EXPECT_EQ(out, Vec(24, 7.0)) << s.message();
      return s.arg();
    };
    EXPECT_EQ(arg(im.bias({7, 10000}, g, V(out, {2, 3, 4}))), "sinusoid_dim");
    EXPECT_EQ(arg(im.bias({0, 10000}, g, V(out, {2, 3, 4}))), "sinusoid_dim");
    EXPECT_EQ(arg(im.bias({8, 0}, g, V(out, {2, 3, 4}))), "base");
    EXPECT_EQ(arg(im.bias({8, std::nan("")}, g, V(out, {2, 3, 4}))), "base");
    EXPECT_EQ(arg(im.bias({}, g, V(out, {2, 4, 3}))), "out");
    EXPECT_EQ(arg(im.bias({}, g, View{})), "out");
    EXPECT_EQ(arg(im.bias({}, {0, 3, 4, 0, 0}, V(out, {0, 3, 4}))), "heads");
  }
  EXPECT_TRUE(sandwich_validate({}).ok());
  EXPECT_EQ(sandwich_validate({-2, 10000}).arg(), "sinusoid_dim");
}

// d̄ is bounded (2^16) so that a typo cannot ask for 2^40 frequencies; the bound itself still works.
TEST(SandwichBias, SinusoidDimIsBounded) {
  const BiasGeometry g{1, 1, 3, 0, 0};
  for (const Impl& im : kImpls) {
    SCOPED_TRACE(im.name);
    Vec out(3, 7.0);
    for (std::int64_t dim : {std::int64_t{65538}, std::int64_t{1} << 40, std::int64_t{100000000000}}) {
      const Status s = im.bias({dim, 10000}, g, V(out, {1, 1, 3}));
      EXPECT_EQ(s.arg(), "sinusoid_dim") << s.message();
      EXPECT_NE(s.what().find("65536"), std::string::npos) << s.message();
      EXPECT_EQ(out, Vec(3, 7.0));
    }
    // d̄ = 65536 is accepted: (Σ_{k=1}^{d̄/2} cos(r·10000^(−2k/d̄)) − d̄/2)·H/8 at r = 0, 1, 2, H = 1.
    ASSERT_TRUE(im.bias({65536, 10000}, g, V(out, {1, 1, 3})).ok());
    for (std::int64_t r = 0; r < 3; ++r) {
      double want = 0;
      for (std::int64_t k = 1; k <= 32768; ++k)
        want += std::cos(static_cast<double>(r) * std::pow(10000.0, -2.0 * static_cast<double>(k) / 65536.0)) - 1.0;
      want /= 8.0;
      EXPECT_NEAR(out[static_cast<Sz>(r)], want, 1e-9 * (1 + std::fabs(want))) << "r = " << r;
    }
  }
  EXPECT_TRUE(sandwich_validate({65536, 10000}).ok());
  EXPECT_EQ(sandwich_validate({65538, 10000}).arg(), "sinusoid_dim");
}

}  // namespace
}  // namespace posenc
