// The float model's Highway kernels (src/model/model_kernels.h) against scalar computations, on
// every SIMD target compiled and supported here: GELU and its derivative against x·Φ(x) and
// Φ(x) + x·φ(x) in double (std::erfc, std::exp) over a dense grid of [−20, 20] with the bounds the
// header states; LayerNorm forward and backward, softmax + cross-entropy against double formulas;
// the row helpers against the scalar float loops they replace (bit for bit where the operation is a
// single rounding), the embedding gradient and AdamW against double formulas. Sizes
// include tails shorter than a vector and misaligned pointers; outputs sit between guard values.
// Never times anything.
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "study/model_kernels.h"
#include "testing.h"

namespace posenc {
namespace {

using model_fast::I;
using model_fast::Kernels;
using testing::randn;

inline std::size_t sz(I n) { return static_cast<std::size_t>(n); }

// Runs body once per SIMD target compiled and supported here, then restores the default.
void ForEachTarget(const std::function<void(const Kernels&, const std::string&)>& body) {
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    body(model_fast::kernels(), hwy::TargetName(t));
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Floats at an offset of one element from a 64-byte boundary (misaligned for every vector width),
// with guard values before and after.
constexpr float kGuardValue = -12345.5f;
constexpr std::size_t kGuard = 19;
struct Floats {
  std::vector<float> mem;
  std::size_t n;
  explicit Floats(std::size_t count) : mem(count + 2 * kGuard + 16, kGuardValue), n(count) {}
  float* data() {
    std::size_t b = kGuard;
    while ((reinterpret_cast<std::uintptr_t>(mem.data() + b) % 64) != 0) ++b;
    return mem.data() + b + 1;
  }
  float& operator[](std::size_t i) { return data()[i]; }
  void set(const std::vector<double>& v) {
    for (std::size_t i = 0; i < n; ++i) data()[i] = float(v[i]);
  }
  bool guards_intact() {
    const float* d = data();
    for (const float* p = mem.data(); p < d; ++p)
      if (*p != kGuardValue) return false;
    for (const float* p = d + n; p < mem.data() + mem.size(); ++p)
      if (*p != kGuardValue) return false;
    return true;
  }
};

// ---- GELU ----------------------------------------------------------------------------------------
double Phi(double x) { return 0.5 * std::erfc(-x * M_SQRT1_2); }
double phi(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }

// The spacing of floats at |w| (the subnormal spacing 2⁻¹⁴⁹ at least).
double ulp(double w) {
  if (w == 0) return 0x1p-149;
  return std::max(std::ldexp(1.0, std::ilogb(w) - 23), 0x1p-149);
}

// A dense grid of [−20, 20] (step 2⁻¹²), as many uniform floats with full mantissas (so that the
// low bits of t² matter), region boundaries, tiny and huge values.
std::vector<float> gelu_grid() {
  std::vector<float> x;
  for (int i = -20 * 4096; i <= 20 * 4096; ++i) x.push_back(float(i) / 4096.0f);
  std::mt19937_64 rng(2024);
  std::uniform_real_distribution<float> u(-20.0f, 20.0f);
  for (int i = 0; i < 40 * 4096; ++i) x.push_back(u(rng));
  // the region boundaries ±0.75 (±14.5: the fit's end, ±18: the clamp) and their neighbours, tiny and huge values
  for (float b : {0.75f, 14.5f, 18.0f}) {
    float u = b, d = b;
    for (int k = 0; k < 8; ++k) {
      u = std::nextafter(u, 100.0f);
      d = std::nextafter(d, 0.0f);
      for (float v : {u, d, -u, -d}) x.push_back(v);
    }
  }
  for (float v : {1e-30f, -1e-30f, 1e-45f, -1e-45f, 3e-8f, -3e-8f, 50.0f, -50.0f, 1e30f, -1e30f})
    x.push_back(v);
  return x;
}

TEST(ModelKernels, GeluWithinFourUlpsOfXPhi) {
  const std::vector<float> x = gelu_grid();
  ForEachTarget([&](const Kernels& k, const std::string& target) {
    Floats in(x.size()), out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) in[i] = x[i];
    k.gelu(in.data(), out.data(), I(x.size()));
    EXPECT_TRUE(out.guards_intact()) << target;
    double worst = 0;
    float at = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double want = double(x[i]) * Phi(double(x[i]));
      const double err = std::fabs(double(out[i]) - want) / ulp(want);
      if (!(err <= worst)) worst = err, at = x[i];
    }
    EXPECT_LE(worst, 4.0) << target << ": worst " << worst << " ulps at x = " << at;
    std::printf("  %s: GELU worst %.2f ulps at x = %.6g\n", target.c_str(), worst, double(at));
    // infinities: GELU(+∞) = +∞, GELU(−∞) = 0
    Floats sp(2), r(2);
    sp[0] = std::numeric_limits<float>::infinity();
    sp[1] = -std::numeric_limits<float>::infinity();
    k.gelu(sp.data(), r.data(), 2);
    EXPECT_EQ(r[0], std::numeric_limits<float>::infinity()) << target;
    EXPECT_EQ(r[1], 0.0f) << target;
  });
}

TEST(ModelKernels, GeluGradWithinBound) {
  const std::vector<float> x = gelu_grid();
  ForEachTarget([&](const Kernels& k, const std::string& target) {
    Floats in(x.size()), dy(x.size()), out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) in[i] = x[i], dy[i] = 1.0f;
    k.gelu_backward(in.data(), dy.data(), out.data(), I(x.size()));
    EXPECT_TRUE(out.guards_intact()) << target;
    double worst = 0;
    float at = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double xd = x[i], P = Phi(xd), xp = xd * phi(xd);
      const double scale = (std::fabs(P) + std::fabs(xp)) * 0x1p-24;  // 2⁻²⁴·(|Φ| + |xφ|)
      const double err = std::fabs(double(out[i]) - (P + xp)) / std::max(scale, 0x1p-149);
      if (!(err <= worst)) worst = err, at = x[i];
    }
    EXPECT_LE(worst, 5.0) << target << ": worst " << worst << " units at x = " << at;
    std::printf("  %s: GELU' worst %.2f units of 2^-24(|Phi| + |x phi|) at x = %.6g\n", target.c_str(), worst,
                double(at));
    // with an incoming gradient, in place (dx = dy): one more rounding
    const std::vector<double> g = randn(x.size(), 5);
    for (std::size_t i = 0; i < x.size(); ++i) dy[i] = float(g[i]);
    std::vector<float> dy0(dy.data(), dy.data() + x.size());
    k.gelu_backward(in.data(), dy.data(), dy.data(), I(x.size()));
    for (std::size_t i = 0; i < x.size(); i += 7) {
      const double xd = x[i], P = Phi(xd), xp = xd * phi(xd);
      const double want = double(dy0[i]) * (P + xp);
      const double bound = std::fabs(dy0[i]) * (std::fabs(P) + std::fabs(xp)) * 5 * 0x1p-24 + 0x1p-148;
      ASSERT_LE(std::fabs(double(dy[i]) - want), bound) << target << " at x = " << x[i];
    }
  });
}

// A tail shorter than a vector gives the same bits as the same value inside a full vector.
TEST(ModelKernels, GeluTailsMatchTheBulk) {
  const std::vector<double> r = randn(64, 9, 2.0);
  ForEachTarget([&](const Kernels& k, const std::string& target) {
    Floats in(64), all(64), dyv(64), gall(64);
    in.set(r);
    for (std::size_t i = 0; i < 64; ++i) dyv[i] = 1.0f;
    k.gelu(in.data(), all.data(), 64);
    k.gelu_backward(in.data(), dyv.data(), gall.data(), 64);
    for (I n = 1; n <= 40; ++n) {
      Floats part(sz(n)), gpart(sz(n));
      k.gelu(in.data() + (64 - n), part.data(), n);
      k.gelu_backward(in.data() + (64 - n), dyv.data(), gpart.data(), n);
      EXPECT_TRUE(part.guards_intact() && gpart.guards_intact()) << target << " n " << n;
      for (I i = 0; i < n; ++i) {
        ASSERT_EQ(part[sz(i)], all[sz(64 - n + i)]) << target << " n " << n;
        ASSERT_EQ(gpart[sz(i)], gall[sz(64 - n + i)]) << target << " n " << n;
      }
    }
  });
}

// gelu_with_grad gives gelu's bits and gelu_backward's (dy = 1) bits, at every length (tails
// included) and with dydx in place of x; mul is the scalar product loop.
TEST(ModelKernels, GeluWithGradIsGeluAndItsGradient) {
  const std::vector<double> r = randn(200, 21, 3.0);
  ForEachTarget([&](const Kernels& k, const std::string& target) {
    for (I n : {1, 7, 16, 33, 200}) {
      Floats in(sz(n)), ones(sz(n)), y(sz(n)), g(sz(n)), want_y(sz(n)), want_g(sz(n)), alias(sz(n)), y2(sz(n));
      in.set(r);
      alias.set(r);
      for (I i = 0; i < n; ++i) ones[sz(i)] = 1.0f;
      k.gelu(in.data(), want_y.data(), n);
      k.gelu_backward(in.data(), ones.data(), want_g.data(), n);
      k.gelu_with_grad(in.data(), y.data(), g.data(), n);
      k.gelu_with_grad(alias.data(), y2.data(), alias.data(), n);  // dydx in place of x
      for (I i = 0; i < n; ++i) {
        ASSERT_EQ(y[sz(i)], want_y[sz(i)]) << target << " n " << n << " i " << i;
        ASSERT_EQ(g[sz(i)], want_g[sz(i)]) << target << " n " << n << " i " << i;
        ASSERT_EQ(y2[sz(i)], want_y[sz(i)]) << target << " n " << n << " i " << i;
        ASSERT_EQ(alias[sz(i)], want_g[sz(i)]) << target << " n " << n << " i " << i;
      }
      EXPECT_TRUE(y.guards_intact() && g.guards_intact() && y2.guards_intact() && alias.guards_intact())
          << target;
      Floats a(sz(n)), b(sz(n)), out(sz(n));
      a.set(randn(sz(n), 22));
      b.set(randn(sz(n), 23));
      k.mul(a.data(), b.data(), out.data(), n);
      for (I i = 0; i < n; ++i) ASSERT_EQ(out[sz(i)], a[sz(i)] * b[sz(i)]) << target;
      k.mul(a.data(), b.data(), a.data(), n);  // in place
      for (I i = 0; i < n; ++i) ASSERT_EQ(a[sz(i)], out[sz(i)]) << target;
      EXPECT_TRUE(out.guards_intact() && a.guards_intact()) << target;
    }
  });
}

// ---- LayerNorm -----------------------------------------------------------------------------------
constexpr double kEps = 1e-5;

TEST(ModelKernels, LayerNormAgainstDouble) {
  for (I C : {1, 3, 16, 64, 67, 130}) {
    const I R = 5;
    // rows with an offset (mean ≈ 3) and scale 2 so that the centring matters
    std::vector<double> x = randn(sz(R * C), 1, 2.0), g = randn(sz(C), 2),
                        b = randn(sz(C), 3);
    for (double& v : x) v = double(float(v + 3.0));
    for (double& v : g) v = double(float(v));
    for (double& v : b) v = double(float(v));
    // double reference on the float inputs
    std::vector<double> y(sz(R * C)), mu(sz(R)), rs(sz(R));
    for (I r = 0; r < R; ++r) {
      double s = 0, ss = 0;
      for (I c = 0; c < C; ++c) s += x[sz(r * C + c)];
      mu[sz(r)] = s / double(C);
      for (I c = 0; c < C; ++c) ss += std::pow(x[sz(r * C + c)] - mu[sz(r)], 2);
      rs[sz(r)] = 1 / std::sqrt(ss / double(C) + kEps);
      for (I c = 0; c < C; ++c)
        y[sz(r * C + c)] =
            (x[sz(r * C + c)] - mu[sz(r)]) * rs[sz(r)] * g[sz(c)] +
            b[sz(c)];
    }
    ForEachTarget([&](const Kernels& k, const std::string& target) {
      Floats fx(x.size()), fg(g.size()), fb(b.size()), fy(y.size()), fm(sz(R)), fr(sz(R));
      fx.set(x);
      fg.set(g);
      fb.set(b);
      k.layer_norm(fx.data(), fg.data(), fb.data(), R, C, kEps, fy.data(), fm.data(), fr.data());
      EXPECT_TRUE(fy.guards_intact() && fm.guards_intact() && fr.guards_intact()) << target;
      std::vector<double> gy(fy.data(), fy.data() + y.size());
      // |x̂| ≲ √C, |g|, |b| ≲ 4: float sums of C terms, a few roundings per element
      EXPECT_TRUE(testing::AllClose(gy, y, 2e-5, 2e-6)) << target << " C " << C;
      for (I r = 0; r < R; ++r) {
        EXPECT_NEAR(fm[sz(r)], mu[sz(r)], 1e-6 * 4) << target;
        EXPECT_NEAR(fr[sz(r)], rs[sz(r)], 1e-5 * rs[sz(r)]) << target;
      }
    });
  }
}

TEST(ModelKernels, LayerNormBackwardAgainstDouble) {
  for (I C : {1, 3, 16, 64, 67, 130}) {
    const I R = 6;
    std::vector<double> x = randn(sz(R * C), 4, 2.0), g = randn(sz(C), 5),
                        dy = randn(sz(R * C), 6), dx0 = randn(sz(R * C), 7),
                        dg0 = randn(sz(C), 8), db0 = randn(sz(C), 9);
    for (auto* v : {&x, &g, &dy, &dx0, &dg0, &db0})
      for (double& e : *v) e = double(float(e));
    std::vector<double> mu(sz(R)), rs(sz(R));
    for (I r = 0; r < R; ++r) {  // float statistics, as the forward kernel stores them
      double s = 0, ss = 0;
      for (I c = 0; c < C; ++c) s += x[sz(r * C + c)];
      mu[sz(r)] = double(float(s / double(C)));
      for (I c = 0; c < C; ++c) ss += std::pow(x[sz(r * C + c)] - mu[sz(r)], 2);
      rs[sz(r)] = double(float(1 / std::sqrt(ss / double(C) + kEps)));
    }
    std::vector<double> dx = dx0, dg = dg0, db = db0;
    for (I r = 0; r < R; ++r) {
      double s1 = 0, s2 = 0;
      for (I c = 0; c < C; ++c) {
        const std::size_t i = sz(r * C + c);
        const double xh = (x[i] - mu[sz(r)]) * rs[sz(r)];
        dg[sz(c)] += dy[i] * xh;
        db[sz(c)] += dy[i];
        s1 += dy[i] * g[sz(c)];
        s2 += dy[i] * g[sz(c)] * xh;
      }
      s1 /= double(C);
      s2 /= double(C);
      for (I c = 0; c < C; ++c) {
        const std::size_t i = sz(r * C + c);
        const double xh = (x[i] - mu[sz(r)]) * rs[sz(r)];
        dx[i] += rs[sz(r)] * (dy[i] * g[sz(c)] - s1 - xh * s2);
      }
    }
    ForEachTarget([&](const Kernels& k, const std::string& target) {
      Floats fx(x.size()), fg(g.size()), fdy(dy.size()), fdx(dx.size()), fdg(dg.size()), fdb(db.size()),
          fm(mu.size()), fr(rs.size());
      fx.set(x);
      fg.set(g);
      fdy.set(dy);
      fdx.set(dx0);
      fdg.set(dg0);
      fdb.set(db0);
      fm.set(mu);
      fr.set(rs);
      k.layer_norm_backward(fx.data(), fg.data(), fm.data(), fr.data(), fdy.data(), R, C, fdx.data(), fdg.data(),
                            fdb.data());
      EXPECT_TRUE(fdx.guards_intact() && fdg.guards_intact() && fdb.guards_intact()) << target;
      auto vec = [](Floats& f) { return std::vector<double>(f.data(), f.data() + f.n); };
      // rstd ≲ 0.5 and |x̂| ≲ √C: terms of size a few units, sums of C of them in float
      EXPECT_TRUE(testing::AllClose(vec(fdx), dx, 2e-5, 2e-5)) << target << " C " << C;
      EXPECT_TRUE(testing::AllClose(vec(fdg), dg, 2e-5, 2e-5)) << target << " C " << C;
      EXPECT_TRUE(testing::AllClose(vec(fdb), db, 2e-5, 2e-5)) << target << " C " << C;
    });
  }
}

// ---- softmax and cross-entropy ---------------------------------------------------------------------
TEST(ModelKernels, SoftmaxXentAgainstDouble) {
  for (I V : {1, 7, 16, 256, 259}) {
    const I R = 5;
    std::vector<double> z = randn(sz(R * V), 10, 8.0);
    for (double& v : z) v = double(float(v));
    const std::vector<std::int32_t> tgt = {0, std::int32_t(V - 1), -1, std::int32_t(V / 2), std::int32_t(V / 3)};
    std::vector<double> p(z.size()), nll(sz(R));
    for (I r = 0; r < R; ++r) {
      double mx = -INFINITY, s = 0;
      for (I j = 0; j < V; ++j) mx = std::max(mx, z[sz(r * V + j)]);
      for (I j = 0; j < V; ++j) s += std::exp(z[sz(r * V + j)] - mx);
      for (I j = 0; j < V; ++j) p[sz(r * V + j)] = std::exp(z[sz(r * V + j)] - mx) / s;
      const std::int32_t t = tgt[sz(r)];
      nll[sz(r)] = t >= 0 ? std::log(s) + mx - z[sz(r * V + t)] : 0.0;
    }
    ForEachTarget([&](const Kernels& k, const std::string& target) {
      Floats fz(z.size());
      fz.set(z);
      std::vector<double> got_nll(sz(R), -1.0);
      k.softmax_xent(fz.data(), tgt.data(), R, V, got_nll.data());
      EXPECT_TRUE(fz.guards_intact()) << target;
      std::vector<double> got(fz.data(), fz.data() + z.size());
      // Highway's Exp is within 1 ulp; the float sum of V terms and the scaling add a few more
      EXPECT_TRUE(testing::AllClose(got, p, 1e-30, 4e-6)) << target << " V " << V;
      EXPECT_TRUE(testing::AllClose(got_nll, nll, 1e-6, 1e-6)) << target << " V " << V;
    });
  }
}

TEST(ModelKernels, XentBackwardIsTheScalarFormula) {
  for (I V : {1, 7, 16, 259}) {
    const I R = 4;
    const std::vector<double> p = randn(sz(R * V), 11);
    const std::vector<std::int32_t> tgt = {std::int32_t(V - 1), -1, 0, std::int32_t(V / 2)};
    const float scale = 1.0f / 37.0f;
    ForEachTarget([&](const Kernels& k, const std::string& target) {
      Floats f(p.size());
      f.set(p);
      k.xent_backward(f.data(), tgt.data(), R, V, scale);
      EXPECT_TRUE(f.guards_intact()) << target;
      for (I r = 0; r < R; ++r)
        for (I j = 0; j < V; ++j) {
          const float pj = float(p[sz(r * V + j)]);
          const std::int32_t t = tgt[sz(r)];
          const float want = t < 0 ? 0.0f : j == t ? (pj - 1.0f) * scale : pj * scale;
          ASSERT_EQ(f[sz(r * V + j)], want) << target << " V " << V << " r " << r << " j " << j;
        }
    });
  }
}

// ---- row helpers: the scalar float loops, bit for bit ------------------------------------------------
TEST(ModelKernels, RowHelpersAreTheScalarLoops) {
  for (I n : {1, 5, 16, 64, 67, 192}) {
    const I R = 7;
    const std::vector<double> x = randn(sz(R * n), 12), b = randn(sz(n), 13),
                              y0 = randn(sz(n), 14);
    ForEachTarget([&](const Kernels& k, const std::string& target) {
      Floats fx(x.size()), fb(b.size()), out(x.size()), db(b.size());
      fx.set(x);
      fb.set(b);
      k.add_bias_rows(fx.data(), fb.data(), R, n, out.data());
      for (std::size_t i = 0; i < x.size(); ++i)
        ASSERT_EQ(out[i], float(x[i]) + float(b[i % sz(n)])) << target;
      k.add_bias_rows(out.data(), fb.data(), R, n, out.data());  // in place
      for (std::size_t i = 0; i < x.size(); ++i)
        ASSERT_EQ(out[i], (float(x[i]) + float(b[i % sz(n)])) + float(b[i % sz(n)])) << target;
      db.set(y0);
      k.sum_rows(fx.data(), R, n, db.data());
      for (I j = 0; j < n; ++j) {
        float want = float(y0[sz(j)]);
        for (I r = 0; r < R; ++r) want += float(x[sz(r * n + j)]);
        ASSERT_EQ(db[sz(j)], want) << target << " n " << n << " j " << j;
      }
      Floats acc(x.size());
      acc.set(x);
      k.add_to(acc.data(), out.data(), I(x.size()));
      for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(acc[i], float(x[i]) + out[i]) << target;
      EXPECT_TRUE(out.guards_intact() && db.guards_intact() && acc.guards_intact()) << target;
    });
  }
}

TEST(ModelKernels, EmbeddingRows) {
  const I V = 9, C = 67, R = 11;
  const std::vector<double> E = randn(sz(V * C), 15), dx = randn(sz(R * C), 16),
                            dE0 = randn(sz(V * C), 17);
  const std::vector<std::int32_t> tok = {3, 0, 8, 3, 3, 5, 1, 8, 0, 2, 3};  // repeats: sums in row order
  const float s = 8.0f;
  ForEachTarget([&](const Kernels& k, const std::string& target) {
    Floats fE(E.size()), x(sz(R * C)), fdx(dx.size()), dE(E.size());
    fE.set(E);
    k.embed(fE.data(), tok.data(), R, C, s, x.data());
    for (I r = 0; r < R; ++r)
      for (I c = 0; c < C; ++c)
        ASSERT_EQ(x[sz(r * C + c)], s * float(E[sz(tok[sz(r)] * C + c)])) << target;
    fdx.set(dx);
    dE.set(dE0);
    k.embed_backward(fdx.data(), tok.data(), R, C, s, dE.data());
    // dE0 + Σ s·dx over the rows of each token, in double (the kernel may fuse each multiply-add)
    std::vector<double> want(dE0.begin(), dE0.end()), mag(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = double(float(dE0[i])), mag[i] = std::fabs(want[i]);
    for (I r = 0; r < R; ++r)
      for (I c = 0; c < C; ++c) {
        const std::size_t i = sz(tok[sz(r)] * C + c);
        want[i] += double(s) * double(float(dx[sz(r * C + c)]));
        mag[i] = std::max(mag[i], std::fabs(want[i])) + std::fabs(double(s) * double(float(dx[sz(r * C + c)])));
      }
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_LE(std::fabs(dE[i] - want[i]), 0x1p-23 * 5 * mag[i]) << target << " i " << i;
    EXPECT_TRUE(x.guards_intact() && dE.guards_intact()) << target;
  });
}

// ---- AdamW ---------------------------------------------------------------------------------------------
// The update of adamw.cc: float moments, double update. The kernel may fuse the moments' multiply-adds
// (targets with FMA), so m and v are checked against the formula in double within two float roundings
// of their terms, and w against the double update computed from the kernel's own m and v, within one
// float ulp.
TEST(ModelKernels, AdamWIsTheFormula) {
  for (I n : {1, 3, 8, 17, 1000}) {
    const auto f = [](const std::vector<double>& d) { return std::vector<float>(d.begin(), d.end()); };
    const std::vector<float> w0 = f(randn(sz(n), 18, 0.1)), g = f(randn(sz(n), 19, 0.01)),
                             m0 = f(randn(sz(n), 20, 1e-3));
    std::vector<float> v0 = f(randn(sz(n), 21, 1e-3));
    for (float& x : v0) x = x * x;
    const float b1 = 0.9f, b2 = 0.95f;
    const double eps = 1e-8, lr = 3e-3;
    for (double wd : {0.0, 0.1}) {
      for (int step = 1; step <= 3; ++step) {
        const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.95, step), clip = step == 2 ? 0.37 : 1.0;
        ForEachTarget([&](const Kernels& k, const std::string& target) {
          Floats fw(sz(n)), fm(sz(n)), fv(sz(n)), fg(sz(n));
          for (std::size_t i = 0; i < sz(n); ++i) fw[i] = w0[i], fm[i] = m0[i], fv[i] = v0[i], fg[i] = g[i];
          k.adamw(fw.data(), fg.data(), fm.data(), fv.data(), n, clip, b1, b2, bc1, bc2, eps, lr, wd);
          EXPECT_TRUE(fw.guards_intact() && fm.guards_intact() && fv.guards_intact()) << target;
          for (std::size_t i = 0; i < sz(n); ++i) {
            const double gi = double(float(double(g[i]) * clip));
            const double mt1 = double(b1) * m0[i], mt2 = double(1 - b1) * gi;
            const double vt1 = double(b2) * v0[i], vt2 = double(1 - b2) * gi * gi;
            ASSERT_LE(std::fabs(fm[i] - (mt1 + mt2)), 0x1p-23 * (std::fabs(mt1) + std::fabs(mt2)))
                << target << " n " << n << " i " << i;
            ASSERT_LE(std::fabs(fv[i] - (vt1 + vt2)), 0x1p-22 * (vt1 + vt2)) << target << " n " << n;
            const double upd = (double(fm[i]) / bc1) / (std::sqrt(double(fv[i]) / bc2) + eps);
            const double w = double(w0[i]) - lr * (upd + wd * double(w0[i]));
            ASSERT_LE(std::fabs(fw[i] - w), ulp(w)) << target << " n " << n << " i " << i;
          }
        });
      }
    }
    ForEachTarget([&](const Kernels& k, const std::string& target) {
      double want = 0;
      for (float x : g) want += double(x) * double(x);
      EXPECT_NEAR(k.sum_squares(g.data(), n), want, 1e-13 * want) << target;
    });
  }
}

}  // namespace
}  // namespace posenc
