// The ranges every position-taking encoding accepts and what it does at their edges:
//   * positions (ids + offset, or offset + l) within |p| <= 2^53 (view.h), else Code::kOutOfRange
//     naming "positions", for rope, sinusoidal, rope2d, mrope and xpos, forward and backward, with
//     nothing written; positions up to 2^53 rotate exactly (against long double);
//   * frequencies whose angles would overflow are errors naming the field (theta, inv_freq,
//     freq_factors, factor, base, freqs); huge but finite angles (a tiny theta or base, a large
//     mixed frequency, a far position) are computed as the double reference computes them, the fast
//     path included (it hands such calls to the reference), against an independent computation;
//   * xPos's scale a·ρ must fit the output's dtype, above and below (its smallest normal): an error
//     naming "positions" with the limit otherwise ("scale_base" when no position but c fits),
//     float64 working where the value is finite in float64.
#include <cfloat>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "posenc/absolute.h"
#include "posenc/reference.h"
#include "posenc/rope.h"
#include "posenc/rotary.h"
#include "testing.h"

namespace posenc {
namespace {

using testing::AllClose;
using testing::V;
using testing::randn;
using testing::to_float;

using I = std::int64_t;
using Vec = std::vector<double>;
using Sz = std::size_t;

constexpr I kTwo53 = I{1} << 53;

Vec as_doubles(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Interleaved rotation of x [T, D] (T tokens, one head) by angles ang [T, D/2] in long double:
// cos and sin of the given (double) angle, reduced exactly by the long double library.
Vec rotate_ld(const Vec& x, const Vec& ang, I T, I D) {
  Vec y(x.size());
  for (I t = 0; t < T; ++t)
    for (I k = 0; k < D / 2; ++k) {
      const long double a = ang[static_cast<Sz>(t * (D / 2) + k)];
      const long double x0 = x[static_cast<Sz>(t * D + 2 * k)], x1 = x[static_cast<Sz>(t * D + 2 * k + 1)];
      y[static_cast<Sz>(t * D + 2 * k)] = static_cast<double>(x0 * cosl(a) - x1 * sinl(a));
      y[static_cast<Sz>(t * D + 2 * k + 1)] = static_cast<double>(x0 * sinl(a) + x1 * cosl(a));
    }
  return y;
}

// ---- positions -----------------------------------------------------------------------------------

// Every forward and backward of the position-taking encodings, on [1, 2, 1, 8] float32 inputs (the
// fast path; sinusoidal on [1, 2, 8]), with the given positions: the Status of each, and whether
// the output kept its fill.
struct Outcome {
  const char* what;
  Status s;
  bool untouched;
};

std::vector<Outcome> every_encoding(const Positions& pos1, const Positions& pos2, const Positions& pos3) {
  const I L = 2, D = 8;
  std::vector<float> x = to_float(randn(static_cast<Sz>(L * D), 1));
  std::vector<Outcome> out;
  auto run = [&](const char* what, auto&& fn) {
    std::vector<float> y(x.size(), 7.0f);
    const Status s = fn(V(x, {1, L, 1, D}), V(y, {1, L, 1, D}));
    out.push_back({what, s, y == std::vector<float>(y.size(), 7.0f)});
  };
  auto run3 = [&](const char* what, auto&& fn) {
    std::vector<float> y(x.size(), 7.0f);
    const Status s = fn(V(x, {1, L, D}), V(y, {1, L, D}));
    out.push_back({what, s, y == std::vector<float>(y.size(), 7.0f)});
  };
  run("rope forward", [&](View a, View b) { return rope_forward({}, a, pos1, b); });
  run("rope backward", [&](View a, View b) { return rope_backward({}, a, pos1, b); });
  run("rope q+k", [&](View a, View b) { return rope_apply_qk({}, a, View{}, pos1, b, View{}); });
  run("rope reference", [&](View a, View b) { return reference::rope_forward({}, a, pos1, b); });
  run3("sinusoidal forward", [&](View a, View b) { return sinusoidal_forward({}, a, pos1, b); });
  run3("sinusoidal backward", [&](View a, View b) { return sinusoidal_backward({}, a, pos1, b); });
  {
    std::vector<float> t(static_cast<Sz>(L * D), 7.0f);
    const Status s = sinusoidal_table({}, pos1, V(t, {L, D}));
    out.push_back({"sinusoidal table", s, t == std::vector<float>(t.size(), 7.0f)});
  }
  run("rope2d forward", [&](View a, View b) { return rope2d_forward({}, a, pos2, View{}, b); });
  run("rope2d backward", [&](View a, View b) { return rope2d_backward({}, a, pos2, View{}, b); });
  const MropeParams mp{.mrope_section = {2, 1, 1}};
  run("mrope forward", [&](View a, View b) { return mrope_forward(mp, a, pos3, b); });
  run("mrope backward", [&](View a, View b) { return mrope_backward(mp, a, pos3, b); });
  run("xpos forward", [&](View a, View b) { return xpos_forward({}, XposRole::kQuery, a, pos1, b); });
  run("xpos backward", [&](View a, View b) { return xpos_backward({}, XposRole::kKey, a, pos1, b); });
  return out;
}

void expect_all_out_of_range(const std::vector<Outcome>& got, const std::string& where) {
  for (const Outcome& o : got) {
    EXPECT_FALSE(o.s.ok()) << o.what << " accepted " << where;
    EXPECT_EQ(o.s.code(), Code::kOutOfRange) << o.what << ", " << where << ": " << o.s.message();
    EXPECT_EQ(o.s.arg(), "positions") << o.what << ", " << where << ": " << o.s.message();
    EXPECT_NE(o.s.what().find("2^53"), std::string::npos) << o.what << ": " << o.s.message();
    EXPECT_TRUE(o.untouched) << o.what << " wrote its output on an error (" << where << ")";
  }
}

TEST(Positions, OffsetsBeyond2To53AreErrorsForEveryEncoding) {
  // L = 2 tokens at offset and offset + 1; offset 2^53 puts the second at 2^53 + 1.
  for (I off : {I{1} << 60, std::numeric_limits<I>::max(), kTwo53, -kTwo53 - 1, std::numeric_limits<I>::min()}) {
    const Positions p{View{}, off};
    expect_all_out_of_range(every_encoding(p, p, p), "offset " + std::to_string(off));
  }
  // The bound is inclusive: offset 2^53 − 1 (second token at 2^53) and −2^53 are accepted (xPos's own
  // scale bound, which these far positions exceed, is tested below).
  for (I off : {kTwo53 - 1, -kTwo53}) {
    const Positions p{View{}, off};
    for (const Outcome& o : every_encoding(p, p, p)) {
      if (std::string(o.what).rfind("xpos", 0) == 0) continue;
      EXPECT_TRUE(o.s.ok()) << o.what << ": " << o.s.message();
    }
  }
}

TEST(Positions, IdsBeyond2To53AreErrorsForEveryEncoding) {
  for (I big : {I{1} << 57, I{1} << 60, std::numeric_limits<I>::max(), kTwo53 + 1}) {
    std::vector<I> p1 = {0, big}, p2 = {0, 1, big, 2}, p3 = {0, 1, 2, 3, 4, big};
    const Positions a{View::contiguous(p1.data(), DType::kI64, {2}), 0};
    const Positions b{View::contiguous(p2.data(), DType::kI64, {2, 2}), 0};
    const Positions c{View::contiguous(p3.data(), DType::kI64, {3, 2}), 0};
    expect_all_out_of_range(every_encoding(a, b, c), "id " + std::to_string(big));
  }
  // An id plus an offset that overflows int64, and one that passes 2^53 only with the offset.
  for (auto [id, off] : {std::pair{std::numeric_limits<I>::max(), I{5}}, std::pair{kTwo53, I{1}}}) {
    std::vector<I> p1 = {0, id}, p2 = {0, 1, id, 2}, p3 = {0, 1, 2, 3, 4, id};
    const Positions a{View::contiguous(p1.data(), DType::kI64, {2}), off};
    const Positions b{View::contiguous(p2.data(), DType::kI64, {2, 2}), off};
    const Positions c{View::contiguous(p3.data(), DType::kI64, {3, 2}), off};
    expect_all_out_of_range(every_encoding(a, b, c), "id + offset");
  }
  // Negative ids stay refused ("positions must be >= 0").
  std::vector<I> neg = {0, -1};
  Vec x(16), y(16);
  const Status s =
      rope_forward({}, V(x, {1, 2, 1, 8}), {View::contiguous(neg.data(), DType::kI64, {2}), 0}, V(y, {1, 2, 1, 8}));
  EXPECT_EQ(s.arg(), "positions");
  EXPECT_EQ(s.code(), Code::kOutOfRange);
}

TEST(Positions, RopeUpTo2To53IsExactInEveryPath) {
  // theta = 256, D = 8: ω_k = 4^−k, exact powers of two, so m·ω_k is exact in double and long double
  // gives the true rotation; positions 2^53 − 7 .. 2^53 (angles far beyond the fast reduction's
  // range) in float32 (fast path), float64 (reference) and through explicit ids.
  const I L = 8, D = 8, first = kTwo53 - 7;
  const Vec x = randn(static_cast<Sz>(L * D), 2);
  Vec ang(static_cast<Sz>(L * D / 2));
  for (I l = 0; l < L; ++l)
    for (I k = 0; k < D / 2; ++k)
      ang[static_cast<Sz>(l * D / 2 + k)] = std::ldexp(static_cast<double>(first + l), static_cast<int>(-2 * k));
  const RopeParams p{.layout = RopeLayout::kInterleaved, .theta = 256.0};
  std::vector<float> xf = to_float(x), yf(x.size());
  const Vec want_f = rotate_ld(as_doubles(xf), ang, L, D), want = rotate_ld(x, ang, L, D);
  ASSERT_TRUE(rope_forward(p, V(xf, {1, L, 1, D}), {View{}, first}, V(yf, {1, L, 1, D})).ok());
  EXPECT_TRUE(AllClose(as_doubles(yf), want_f, 1e-6, 1e-6));
  std::vector<I> ids(static_cast<Sz>(L));
  for (I l = 0; l < L; ++l) ids[static_cast<Sz>(l)] = first + l;
  std::fill(yf.begin(), yf.end(), 0.0f);
  ASSERT_TRUE(rope_forward(p, V(xf, {1, L, 1, D}), {View::contiguous(ids.data(), DType::kI64, {L}), 0},
                           V(yf, {1, L, 1, D})).ok());
  EXPECT_TRUE(AllClose(as_doubles(yf), want_f, 1e-6, 1e-6));
  Vec xd = x, yd(x.size());
  ASSERT_TRUE(rope_forward(p, V(xd, {1, L, 1, D}), {View{}, first}, V(yd, {1, L, 1, D})).ok());
  EXPECT_TRUE(AllClose(yd, want, 1e-12, 1e-12));
  // The backward undoes it.
  std::vector<float> back(x.size());
  ASSERT_TRUE(rope_backward(p, V(yf, {1, L, 1, D}), {View{}, first}, V(back, {1, L, 1, D})).ok());
  EXPECT_TRUE(AllClose(as_doubles(back), as_doubles(xf), 1e-6, 1e-6));
}

// ---- frequencies ------------------------------------------------------------------------------------

TEST(Frequencies, TinyThetaRotatesAsTheDoubleReference) {
  // theta = 1e-300: ω_k = 1/theta^(2k/D) up to 1e262 (finite), angles m·ω_k up to ~1e263. The fast
  // float32 path must give cos, sin of those double angles (norms kept, no NaN), like the reference.
  const I L = 8, H = 2, D = 16;
  const double theta = 1e-300;
  const Vec x = randn(static_cast<Sz>(L * H * D), 3);
  Vec ang(static_cast<Sz>(L * H * D / 2));
  for (I t = 0; t < L * H; ++t)
    for (I k = 0; k < D / 2; ++k) {
      const double w = 1.0 / std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(D));
      ang[static_cast<Sz>(t * D / 2 + k)] = static_cast<double>(t / H) * w;
    }
  std::vector<float> xf = to_float(x), yf(x.size());
  ASSERT_TRUE(rope_forward({.layout = RopeLayout::kInterleaved, .theta = theta}, V(xf, {1, L, H, D}), {},
                           V(yf, {1, L, H, D}))
                  .ok());
  EXPECT_TRUE(AllClose(as_doubles(yf), rotate_ld(as_doubles(xf), ang, L * H, D), 1e-6, 1e-6));
  Vec xd = x, yd(x.size());
  ASSERT_TRUE(rope_forward({.layout = RopeLayout::kInterleaved, .theta = theta}, V(xd, {1, L, H, D}), {},
                           V(yd, {1, L, H, D}))
                  .ok());
  EXPECT_TRUE(AllClose(yd, rotate_ld(x, ang, L * H, D), 1e-12, 1e-12));
}

TEST(Frequencies, OverflowingFrequenciesNameTheirField) {
  const I L = 2, D = 8;
  Vec x = randn(static_cast<Sz>(L * D), 4), y(x.size(), 7.0);
  const View xv = V(x, {1, L, 1, D}), yv = V(y, {1, L, 1, D});
  auto expect_error = [&](const Status& s, const char* arg) {
    EXPECT_FALSE(s.ok()) << arg;
    EXPECT_EQ(s.arg(), arg) << s.message();
    EXPECT_EQ(s.code(), Code::kOutOfRange) << s.message();
    EXPECT_EQ(y, Vec(y.size(), 7.0)) << "output written on an error: " << s.message();
  };
  // hf: theta = 1e-300 is 0 in float32, so ω_k = 1/0^(2k/r) = inf.
  expect_error(rope_forward({.theta = 1e-300, .angles = RopeAngles::kHf}, xv, {}, yv), "theta");
  // A denormal theta with many pairs: ω_k = theta^(−2k/r) overflows double.
  Vec xb(static_cast<Sz>(1024)), yb(xb.size(), 7.0);
  const Status sb = rope_forward({.theta = 5e-324}, V(xb, {1, 1, 1, 1024}), {}, V(yb, {1, 1, 1, 1024}));
  EXPECT_EQ(sb.arg(), "theta") << sb.message();
  EXPECT_EQ(yb, Vec(yb.size(), 7.0));
  expect_error(rope_forward({.inv_freq = {1.0, 1e300, 0.5, 0.25}}, xv, {}, yv), "inv_freq");
  expect_error(rope_forward({.freq_factors = {1.0, 1e-300, 1.0, 1.0}}, xv, {}, yv), "freq_factors");
  expect_error(rope_forward({.rope_type = RopeType::kLinear, .factor = 1e-300}, xv, {}, yv), "factor");
  expect_error(rope_backward({.rope_type = RopeType::kLinear, .factor = 1e-300}, xv, {}, yv), "factor");
  // The same bound through the public frequencies (posenc table) and the rotary encodings.
  EXPECT_EQ(rope_frequencies({.theta = 1e-300, .angles = RopeAngles::kHf}, D, 4).status().arg(), "theta");
  expect_error(xpos_forward({.rope = {.inv_freq = {1e300, 1, 1, 1}}}, XposRole::kQuery, xv, {}, yv), "inv_freq");
  expect_error(mrope_forward({.mrope_section = {2, 1, 1}, .rope = {.inv_freq = {1e300, 1, 1, 1}}}, xv, {}, yv),
               "inv_freq");
  // Just inside the bound (2^969) is accepted and finite.
  Vec yok(x.size());
  ASSERT_TRUE(rope_forward({.inv_freq = {0x1p969, 1, 1, 1}}, xv, {}, V(yok, {1, L, 1, D})).ok());
  for (double v : yok) EXPECT_TRUE(std::isfinite(v));
}

TEST(Frequencies, SinusoidalTinyBaseMatchesTheDoubleAnglesAndHugeFrequenciesAreErrors) {
  const I B = 1, L = 8, D = 16;
  const double base = 1e-300;
  const Vec x = randn(static_cast<Sz>(B * L * D), 5);
  Vec want(x.size());
  for (I l = 0; l < L; ++l)
    for (I i = 0; i < D / 2; ++i) {
      const double w = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
      const long double a = static_cast<double>(l) * w;
      want[static_cast<Sz>(l * D + 2 * i)] = x[static_cast<Sz>(l * D + 2 * i)] + static_cast<double>(sinl(a));
      want[static_cast<Sz>(l * D + 2 * i + 1)] = x[static_cast<Sz>(l * D + 2 * i + 1)] + static_cast<double>(cosl(a));
    }
  std::vector<float> xf = to_float(x), yf(x.size());
  ASSERT_TRUE(sinusoidal_forward({.base = base}, V(xf, {B, L, D}), {}, V(yf, {B, L, D})).ok());
  EXPECT_TRUE(AllClose(as_doubles(yf), want, 1e-5, 1e-6));
  std::vector<float> tf(static_cast<Sz>(L * D));
  ASSERT_TRUE(sinusoidal_table({.base = base}, {}, V(tf, {L, D})).ok());
  for (I e = 0; e < L * D; ++e)
    EXPECT_NEAR(tf[static_cast<Sz>(e)], want[static_cast<Sz>(e)] - x[static_cast<Sz>(e)], 1e-6) << e;

  // base = 1e-310, D = 64: w_31 = base^(−62/64) ≈ 1e300 > 2^969.
  Vec xb(64), yb(64, 7.0);
  const Status s = sinusoidal_forward({.base = 1e-310}, V(xb, {1, 1, 64}), {}, V(yb, {1, 1, 64}));
  EXPECT_EQ(s.arg(), "base") << s.message();
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(yb, Vec(64, 7.0));
  EXPECT_EQ(sinusoidal_table({.base = 1e-310}, {}, V(yb, {1, 64})).arg(), "base");
  EXPECT_EQ(sinusoidal_backward({.base = 1e-310}, V(xb, {1, 1, 64}), {}, V(yb, {1, 1, 64})).arg(), "base");
}

TEST(Frequencies, Rope2dMixedHugeFrequencyMatchesTheDoubleAngles) {
  // One mixed frequency of 1e30: angles x·1e30 (the other component's frequency 0 there, so the
  // double angle is one rounded product), computed as cos, sin of that angle in every path.
  const I L = 4, H = 2, D = 8, half = D / 2;
  std::vector<I> pos = {0, 1, 2, 3, 3, 2, 1, 0};  // [2, L]: x, y
  Vec freqs(static_cast<Sz>(2 * H * half));
  for (Sz i = 0; i < freqs.size(); ++i) freqs[i] = 0.1 * static_cast<double>(i % 5) - 0.2;
  freqs[0] = 1e30;                          // θˣ of head 0, pair 0
  freqs[static_cast<Sz>(H * half)] = 0.0;  // θʸ of head 0, pair 0
  freqs[3] = -3e20;                         // θˣ of head 0, pair 3
  freqs[static_cast<Sz>(H * half + 3)] = 0.0;
  const Vec x = randn(static_cast<Sz>(L * H * D), 6);
  Vec ang(static_cast<Sz>(L * H * half));
  for (I l = 0; l < L; ++l)
    for (I h = 0; h < H; ++h)
      for (I k = 0; k < half; ++k)
        ang[static_cast<Sz>((l * H + h) * half + k)] =
            static_cast<double>(pos[static_cast<Sz>(l)]) * freqs[static_cast<Sz>(h * half + k)] +
            static_cast<double>(pos[static_cast<Sz>(L + l)]) * freqs[static_cast<Sz>((H + h) * half + k)];
  const Rope2dParams p{.variant = Rope2dVariant::kMixed, .rope = {.layout = RopeLayout::kInterleaved, .theta = 10.0}};
  const Positions ps{View::contiguous(pos.data(), DType::kI64, {2, L}), 0};
  std::vector<float> xf = to_float(x), yf(x.size());
  ASSERT_TRUE(rope2d_forward(p, V(xf, {1, L, H, D}), ps, V(freqs, {2, H, half}), V(yf, {1, L, H, D})).ok());
  EXPECT_TRUE(AllClose(as_doubles(yf), rotate_ld(as_doubles(xf), ang, L * H, D), 1e-6, 1e-6));
  Vec xd = x, yd(x.size());
  ASSERT_TRUE(rope2d_forward(p, V(xd, {1, L, H, D}), ps, V(freqs, {2, H, half}), V(yd, {1, L, H, D})).ok());
  EXPECT_TRUE(AllClose(yd, rotate_ld(x, ang, L * H, D), 1e-12, 1e-12));
  // The backward (dx and dfreqs) agrees with the reference's.
  std::vector<float> dxf(x.size()), dff(freqs.size()), dxr(x.size()), dfr(freqs.size());
  ASSERT_TRUE(rope2d_backward(p, V(yf, {1, L, H, D}), ps, V(freqs, {2, H, half}), V(dxf, {1, L, H, D}),
                              V(xf, {1, L, H, D}), V(dff, {2, H, half})).ok());
  ASSERT_TRUE(reference::rope2d_backward(p, V(yf, {1, L, H, D}), ps, V(freqs, {2, H, half}), V(dxr, {1, L, H, D}),
                                         V(xf, {1, L, H, D}), V(dfr, {2, H, half})).ok());
  EXPECT_TRUE(AllClose(as_doubles(dxf), as_doubles(dxr), 0, 0));
  EXPECT_TRUE(AllClose(as_doubles(dff), as_doubles(dfr), 0, 0));
  EXPECT_TRUE(AllClose(as_doubles(dxf), as_doubles(xf), 1e-5, 1e-5));  // R(−φ)R(φ)x = x

  // A frequency whose angle could overflow at |position| <= 2^53 is an error naming freqs.
  Vec bad = freqs;
  bad[1] = 1e300;
  std::vector<float> yb(x.size(), 7.0f);
  const Status s = rope2d_forward(p, V(xf, {1, L, H, D}), ps, V(bad, {2, H, half}), V(yb, {1, L, H, D}));
  EXPECT_EQ(s.arg(), "freqs") << s.message();
  EXPECT_EQ(yb, std::vector<float>(yb.size(), 7.0f));
}

// ---- xPos's scale ------------------------------------------------------------------------------------

// The last key position m (centre 0) whose every scale ζ_k^(−m/s) is at most mx, independently in
// long double: ζ_0 is the smallest, so its scale is the largest.
I key_limit(double mx, double s = 512, double gamma = 0.4) {
  const long double rate = logl((1.0L + gamma) / gamma) / s;  // −ln ζ_0 / s
  I m = static_cast<I>(logl(mx) / rate);
  while (expl(static_cast<long double>(m + 1) * rate) <= mx) ++m;
  while (expl(static_cast<long double>(m) * rate) > mx) --m;
  return m;
}

TEST(Xpos, ScaleOverflowingTheOutputDtypeIsAnErrorWithTheLimit) {
  const I L = 8, H = 1, D = 16;
  const Vec x = randn(static_cast<Sz>(L * D), 7);
  std::vector<float> xf = to_float(x), yf(x.size(), 7.0f);
  // The CLI's failing case: keys at 100000 .. 100007, c = ⌈100008/2⌉ = 50004: m − c ≈ 50000 > 36259.
  const Status s = xpos_forward({}, XposRole::kKey, V(xf, {1, L, H, D}), {View{}, 100000}, V(yf, {1, L, H, D}));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.arg(), "positions") << s.message();
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_NE(s.what().find("float32"), std::string::npos) << s.message();
  const I lim = key_limit(FLT_MAX);
  EXPECT_NE(s.what().find("m <= c + " + std::to_string(lim) + " = " + std::to_string(50004 + lim)), std::string::npos)
      << s.message();
  EXPECT_EQ(yf, std::vector<float>(yf.size(), 7.0f));
  EXPECT_EQ(xpos_backward({}, XposRole::kKey, V(xf, {1, L, H, D}), {View{}, 100000}, V(yf, {1, L, H, D})).arg(),
            "positions");
  EXPECT_EQ(reference::xpos_forward({}, XposRole::kKey, V(xf, {1, L, H, D}), {View{}, 100000}, V(yf, {1, L, H, D}))
                .arg(),
            "positions");

  // float64 holds those scales (e^122): the call works and pair k's norm is scaled by ζ_k^(−(m−c)/s).
  Vec xd = x, yd(x.size());
  ASSERT_TRUE(xpos_forward({.rope = {.layout = RopeLayout::kInterleaved}}, XposRole::kKey, V(xd, {1, L, H, D}),
                           {View{}, 100000}, V(yd, {1, L, H, D}))
                  .ok());
  for (I l = 0; l < L; ++l)
    for (I k = 0; k < D / 2; ++k) {
      const long double zeta = (2.0L * k / D + 0.4L) / 1.4L;
      const long double rho = powl(zeta, -static_cast<long double>(100000 + l - 50004) / 512);
      const Sz a = static_cast<Sz>(l * D + 2 * k);
      const double n0 = std::hypot(x[a], x[a + 1]), n1 = std::hypot(yd[a], yd[a + 1]);
      EXPECT_NEAR(n1 / static_cast<double>(rho), n0, 1e-10 * n0) << l << " " << k;
    }

  // The limit is exact: with c = 0, keys at lim are accepted in float32, at lim + 1 refused; queries
  // at −lim... are positions < 0, so a query centre of lim + 1 refuses position 0, lim accepts it.
  XposParams p0;
  p0.center = 0;
  std::vector<float> x1 = to_float(randn(static_cast<Sz>(D), 8)), y1(x1.size());
  EXPECT_TRUE(xpos_forward(p0, XposRole::kKey, V(x1, {1, 1, 1, D}), {View{}, lim}, V(y1, {1, 1, 1, D})).ok());
  for (float v : y1) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(xpos_forward(p0, XposRole::kKey, V(x1, {1, 1, 1, D}), {View{}, lim + 1}, V(y1, {1, 1, 1, D})).arg(),
            "positions");
  XposParams pq;
  pq.center = lim;
  EXPECT_TRUE(xpos_forward(pq, XposRole::kQuery, V(x1, {1, 1, 1, D}), {View{}, 0}, V(y1, {1, 1, 1, D})).ok());
  pq.center = lim + 1;
  const Status sq = xpos_forward(pq, XposRole::kQuery, V(x1, {1, 1, 1, D}), {View{}, 0}, V(y1, {1, 1, 1, D}));
  EXPECT_EQ(sq.arg(), "positions");
  EXPECT_NE(sq.what().find("m >= c - " + std::to_string(lim)), std::string::npos) << sq.message();
  // float64's own limit.
  const I lim64 = key_limit(DBL_MAX);
  Vec xd1 = randn(static_cast<Sz>(D), 9), yd1(xd1.size());
  EXPECT_TRUE(xpos_forward(p0, XposRole::kKey, V(xd1, {1, 1, 1, D}), {View{}, lim64}, V(yd1, {1, 1, 1, D})).ok());
  EXPECT_EQ(xpos_forward(p0, XposRole::kKey, V(xd1, {1, 1, 1, D}), {View{}, lim64 + 1}, V(yd1, {1, 1, 1, D})).arg(),
            "positions");
}

// The last query position m (centre 0) whose every scale ζ_k^(m/s) stays at or above mn (the
// dtype's smallest normal), independently in long double.
I query_underflow_limit(double mn, double s = 512, double gamma = 0.4) {
  const long double rate = logl((1.0L + gamma) / gamma) / s;  // −ln ζ_0 / s
  I m = static_cast<I>(-logl(mn) / rate);
  while (expl(-static_cast<long double>(m + 1) * rate) >= mn) ++m;
  while (expl(-static_cast<long double>(m) * rate) < mn) --m;
  return m;
}

TEST(Xpos, ScaleUnderflowingTheOutputDtypeIsAnErrorWithTheLimit) {
  const I D = 16;
  const I ulim = query_underflow_limit(FLT_MIN);
  std::vector<float> x1 = to_float(randn(static_cast<Sz>(D), 10)), y1(x1.size(), 7.0f);
  XposParams p0;
  p0.center = 0;
  // queries above c shrink: at ulim every pair keeps a normal scale (and a non-zero output), one
  // further is refused with that side's limit, the output untouched
  ASSERT_TRUE(xpos_forward(p0, XposRole::kQuery, V(x1, {1, 1, 1, D}), {View{}, ulim}, V(y1, {1, 1, 1, D})).ok());
  for (float v : y1) EXPECT_NE(v, 0.0f);
  std::fill(y1.begin(), y1.end(), 7.0f);
  const Status s = xpos_forward(p0, XposRole::kQuery, V(x1, {1, 1, 1, D}), {View{}, ulim + 1}, V(y1, {1, 1, 1, D}));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.arg(), "positions") << s.message();
  EXPECT_NE(s.what().find("underflows float32"), std::string::npos) << s.message();
  EXPECT_NE(s.what().find("m <= c + " + std::to_string(ulim)), std::string::npos) << s.message();
  EXPECT_EQ(y1, std::vector<float>(y1.size(), 7.0f));
  // keys below c: position 0 with c = ulim is accepted, with c = ulim + 1 refused
  XposParams pk;
  pk.center = ulim;
  EXPECT_TRUE(xpos_forward(pk, XposRole::kKey, V(x1, {1, 1, 1, D}), {View{}, 0}, V(y1, {1, 1, 1, D})).ok());
  pk.center = ulim + 1;
  const Status sk = xpos_forward(pk, XposRole::kKey, V(x1, {1, 1, 1, D}), {View{}, 0}, V(y1, {1, 1, 1, D}));
  EXPECT_EQ(sk.arg(), "positions") << sk.message();
  EXPECT_NE(sk.what().find("m >= c - " + std::to_string(ulim)), std::string::npos) << sk.message();
  // a scale base so small that one step from c leaves float32 names the scale base, on either side
  XposParams tiny;
  tiny.scale_base = 1e-300;
  for (XposRole role : {XposRole::kQuery, XposRole::kKey})
    EXPECT_EQ(xpos_forward(tiny, role, V(x1, {1, 1, 1, D}), {View{}, 0}, V(y1, {1, 1, 1, D})).arg(), "scale_base");
}

TEST(Xpos, TableChecksItsScalesAgainstTheGivenDtype) {
  const I D = 16, L = 8;
  const Positions far{View{}, 100000};
  auto t32 = xpos_table({}, XposRole::kKey, D, L, far, DType::kF32);
  ASSERT_FALSE(t32.ok());
  EXPECT_EQ(t32.status().arg(), "positions");
  auto t64 = xpos_table({}, XposRole::kKey, D, L, far, DType::kF64);
  ASSERT_TRUE(t64.ok()) << t64.status().message();
  double top = 0;
  for (double v : t64->scale) {
    EXPECT_TRUE(std::isfinite(v));
    top = std::max(top, v);
  }
  EXPECT_GT(top, FLT_MAX);
  EXPECT_TRUE(xpos_table({}, XposRole::kKey, D, L, far).ok());  // no dtype: an angle table, unchecked
  // float16's limit is far lower (|m − c| ≈ 4500 at the defaults).
  EXPECT_TRUE(xpos_table({}, XposRole::kKey, D, L, {View{}, 8000}, DType::kF16).ok());
  EXPECT_EQ(xpos_table({}, XposRole::kKey, D, L, {View{}, 10000}, DType::kF16).status().arg(), "positions");
}

}  // namespace
}  // namespace posenc
