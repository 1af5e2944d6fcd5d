// xpos (rotary.h) against torchscale's XPOS written out here (its scale table over
// arange(−⌈n/2⌉, ⌊n/2⌋) and rotate_every_two); the logit depends only on m − n and norms scale by ρ;
// gradients against central differences; the automatic centre; bad parameters naming the field.
#include <cmath>
#include <cstdint>
#include <vector>

#include "rotary_testing.h"

namespace posenc {
namespace {

using namespace ::posenc::rotary_testing;  // NOLINT: the formulas of these tests

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
