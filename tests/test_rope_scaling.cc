// RoPE's frequency schemes (linear, ntk, dynamic, yarn, llama3, longrope, generic factors) and the
// two angle modes (accurate, hf); config.json reading and bad parameters: test_rope_config.cc. The
// expectations are hand-worked values and formulas written here again, separately, in long double
// (and, for hf, plain float32 C++ arithmetic); the reference is checked against them, gradients against central differences,
// and the properties (norms scale by the attention factor, q·k depends on m − n, the call's length
// decides dynamic and longrope) directly. The fast paths are checked against the reference in
// test_fast_rope.cc and the attentions in test_attention*.cc.
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "posenc/reference.h"
#include "posenc/rope.h"
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
using LD = long double;
constexpr LD kPiL = 3.141592653589793238462643383279502884L;

RopeFrequencies freqs(const RopeParams& p, I D, I call_len = 0) {
  auto f = rope_frequencies(p, D, call_len);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f.ok() ? *f : RopeFrequencies{};
}

// ---- the schemes, written again in long double ---------------------------------------------------
LD w0(LD theta, I k, I r) { return powl(theta, -2.0L * static_cast<LD>(k) / static_cast<LD>(r)); }

// ω_k of p for rotary dimension r and call length n, from the definitions in docs/rope.md.
LD exact_inv(const RopeParams& p, I r, I n, I k) {
  const LD theta = p.theta, s = p.factor, L = static_cast<LD>(p.original_max_position);
  LD w = 0;
  switch (p.rope_type) {
    case RopeType::kDefault: w = p.inv_freq.empty() ? w0(theta, k, r) : p.inv_freq[static_cast<std::size_t>(k)]; break;
    case RopeType::kLinear: w = w0(theta, k, r) / s; break;
    case RopeType::kNtk: w = w0(theta * powl(s, static_cast<LD>(r) / (r - 2)), k, r); break;
    case RopeType::kDynamic: {
      const LD nn = std::max<LD>(static_cast<LD>(n), L);
      w = w0(theta * powl(s * nn / L - (s - 1), static_cast<LD>(r) / (r - 2)), k, r);
      break;
    }
    case RopeType::kYarn: {
      auto dim = [&](LD beta) { return r * logl(L / (2 * kPiL * beta)) / (2 * logl(theta)); };
      LD lo = dim(p.beta_fast), hi = dim(p.beta_slow);
      if (p.truncate) {
        lo = floorl(lo);
        hi = ceill(hi);
      }
      lo = std::max<LD>(lo, 0);
      hi = std::min<LD>(hi, r - 1);
      if (lo == hi) hi += 0.001L;
      const LD g = std::min<LD>(std::max<LD>((k - lo) / (hi - lo), 0), 1);
      w = w0(theta, k, r) / s * g + w0(theta, k, r) * (1 - g);
      break;
    }
    case RopeType::kLlama3: {
      const LD base = w0(theta, k, r), lambda = 2 * kPiL / base;
      if (lambda < L / p.high_freq_factor) {
        w = base;
      } else if (lambda > L / p.low_freq_factor) {
        w = base / s;
      } else {
        const LD g = (L / lambda - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
        w = (1 - g) * base / s + g * base;
      }
      break;
    }
    case RopeType::kLongrope: {
      const bool lng = p.longrope_factors == LongropeFactors::kLong ||
                       (p.longrope_factors == LongropeFactors::kByLength && n > p.original_max_position);
      w = w0(theta, k, r) / (lng ? p.long_factor : p.short_factor)[static_cast<std::size_t>(k)];
      break;
    }
  }
  if (!p.freq_factors.empty()) w /= p.freq_factors[static_cast<std::size_t>(k)];
  return w;
}

Vec ramp_list(I n, double a, double b) {  // n values from a to b
  Vec v(static_cast<std::size_t>(n));
  for (I i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = a + (b - a) * static_cast<double>(i) / std::max<I>(1, n - 1);
  return v;
}

// The schemes under test, for rotary dimension r (their lists sized r/2).
struct Scheme {
  std::string name;
  RopeParams p;
};
std::vector<Scheme> schemes(I r) {
  std::vector<Scheme> out;
  RopeParams p;
  out.push_back({"default", p});
  p.rope_type = RopeType::kLinear;
  p.factor = 4;
  out.push_back({"linear", p});
  p.rope_type = RopeType::kNtk;
  p.factor = 2.5;
  out.push_back({"ntk", p});
  p = RopeParams{};
  p.rope_type = RopeType::kDynamic;
  p.factor = 2;
  p.original_max_position = 64;
  out.push_back({"dynamic", p});
  p = RopeParams{};
  p.rope_type = RopeType::kYarn;
  p.theta = 1e6;
  p.factor = 4;
  p.original_max_position = 4096;
  out.push_back({"yarn", p});
  p.mscale = 0.707;
  p.mscale_all_dim = 1.0;
  p.truncate = false;
  p.beta_fast = 16;
  out.push_back({"yarn_mscale_untruncated", p});
  p = RopeParams{};
  p.rope_type = RopeType::kLlama3;
  p.theta = 500000;
  p.factor = 8;
  p.original_max_position = 8192;
  out.push_back({"llama3", p});
  p = RopeParams{};
  p.rope_type = RopeType::kLongrope;
  p.factor = 32;
  p.original_max_position = 48;
  p.short_factor = ramp_list(r / 2, 1.05, 3.0);
  p.long_factor = ramp_list(r / 2, 1.0, 60.0);
  out.push_back({"longrope", p});
  p = RopeParams{};
  p.freq_factors = ramp_list(r / 2, 1.0, 0.5);
  p.attention_factor = 1.25;
  out.push_back({"freq_factors_attention_factor", p});
  return out;
}

// ---- hand-worked values ------------------------------------------------------------------------

// r = 8, theta = 10⁴: ω⁰ = (1, 0.1, 0.01, 0.001).
TEST(RopeSchemes, HandWorkedFrequencies) {
  const I D = 8;
  auto near = [](const Vec& got, const Vec& want) { return AllClose(got, want, 0, 1e-14); };
  EXPECT_TRUE(near(freqs(RopeParams{}, D).inv_freq, {1, 0.1, 0.01, 0.001}));
  RopeParams p;
  p.rope_type = RopeType::kLinear;
  p.factor = 4;
  EXPECT_TRUE(near(freqs(p, D).inv_freq, {0.25, 0.025, 0.0025, 0.00025}));
  // ntk: θ' = θ·s^(r/(r−2)) keeps ω_0 and divides the lowest frequency ω_{r/2−1} by s exactly.
  p.rope_type = RopeType::kNtk;
  p.factor = 2;
  const RopeFrequencies fn = freqs(p, D);
  EXPECT_DOUBLE_EQ(fn.inv_freq[0], 1.0);
  EXPECT_NEAR(fn.inv_freq[3], 0.0005, 1e-17);
  EXPECT_NEAR(fn.theta, 1e4 * std::pow(2.0, 8.0 / 6.0), 1e-9);
  // dynamic, W = 100: inside the window (n ≤ 100) the base is theta; at n = 200 the base scales by
  // (s·n/W − (s − 1))^(r/(r−2)) = 3^(4/3), so ω_3 = 0.001/3.
  p.rope_type = RopeType::kDynamic;
  p.original_max_position = 100;
  EXPECT_TRUE(near(freqs(p, D, 100).inv_freq, {1, 0.1, 0.01, 0.001}));
  EXPECT_TRUE(near(freqs(p, D, 37).inv_freq, {1, 0.1, 0.01, 0.001}));
  EXPECT_NEAR(freqs(p, D, 200).inv_freq[3], 0.001 / 3, 1e-17);
  EXPECT_DOUBLE_EQ(freqs(p, D, 200).inv_freq[0], 1.0);
  // yarn, L = 2048, s = 4: d(32) = 8·ln(2048/(64π))/(2 ln 10⁴) = 1.008 → lo = 1; d(1) = 2.51 → hi = 3;
  // γ = (0, 0, 0.5, 1): ω = (1, 0.1, 0.01·(0.5/4 + 0.5), 0.001/4); a = 0.1·ln 4 + 1.
  p = RopeParams{};
  p.rope_type = RopeType::kYarn;
  p.factor = 4;
  p.original_max_position = 2048;
  const RopeFrequencies fy = freqs(p, D);
  EXPECT_TRUE(near(fy.inv_freq, {1, 0.1, 0.00625, 0.00025}));
  EXPECT_NEAR(fy.attention_factor, 1.1386294361119891, 1e-15);
  p.truncate = false;  // lo = 1.0079, hi = 2.5126 unrounded
  const double lo = 8 * std::log(2048 / (64 * M_PI)) / (2 * std::log(1e4)), hi = 8 * std::log(2048 / (2 * M_PI)) / (2 * std::log(1e4));
  const double g2 = (2 - lo) / (hi - lo);
  EXPECT_NEAR(freqs(p, D).inv_freq[2], 0.01 * (g2 / 4 + (1 - g2)), 1e-16);
  EXPECT_NEAR(freqs(p, D).inv_freq[1], 0.1, 1e-16);  // k = 1 < lo: extrapolated
  // mscale: a = m(s, mscale)/m(s, mscale_all_dim); DeepSeek-V3's 1/1 gives 1; one of them 0 gives m(s, 1).
  p.mscale = 0.707;
  p.mscale_all_dim = 1.0;
  EXPECT_NEAR(freqs(p, D).attention_factor, (0.0707 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1), 1e-15);
  p.mscale = 1.0;
  EXPECT_DOUBLE_EQ(freqs(p, D).attention_factor, 1.0);
  p.mscale_all_dim = 0;
  EXPECT_NEAR(freqs(p, D).attention_factor, 0.1 * std::log(4.0) + 1, 1e-15);
  p.attention_factor = 0.5;  // explicit overrides everything
  EXPECT_DOUBLE_EQ(freqs(p, D).attention_factor, 0.5);
  // llama3, L = 1024, low 1, high 4, s = 8: λ = 2π/ω = (6.28, 62.8, 628, 6283); λ < 256 kept;
  // λ > 1024 divided by 8; λ = 628 blended with g = (1024/628.3 − 1)/3.
  p = RopeParams{};
  p.rope_type = RopeType::kLlama3;
  p.factor = 8;
  p.original_max_position = 1024;
  const double g = (1024 / (2 * M_PI / 0.01) - 1) / 3;
  EXPECT_TRUE(near(freqs(p, D).inv_freq, {1, 0.1, (1 - g) * 0.01 / 8 + g * 0.01, 0.001 / 8}));
  EXPECT_DOUBLE_EQ(freqs(p, D).attention_factor, 1.0);
  // longrope: ω_k = ω⁰_k / f_k, the long list when the call is longer than L; a = √(1 + ln s / ln L)
  // (Phi-3 128k: s = 32, L = 4096 → √(17/12)).
  p = RopeParams{};
  p.rope_type = RopeType::kLongrope;
  p.factor = 32;
  p.original_max_position = 4096;
  p.short_factor = {1, 2, 4, 8};
  p.long_factor = {1, 10, 100, 1000};
  EXPECT_TRUE(near(freqs(p, D, 4096).inv_freq, {1, 0.05, 0.0025, 0.000125}));
  EXPECT_FALSE(freqs(p, D, 4096).long_factors);
  EXPECT_TRUE(near(freqs(p, D, 4097).inv_freq, {1, 0.01, 0.0001, 0.000001}));
  EXPECT_TRUE(freqs(p, D, 4097).long_factors);
  EXPECT_NEAR(freqs(p, D).attention_factor, std::sqrt(17.0 / 12.0), 1e-15);
  p.longrope_factors = LongropeFactors::kLong;  // the explicit override
  EXPECT_TRUE(near(freqs(p, D, 10).inv_freq, {1, 0.01, 0.0001, 0.000001}));
  p.longrope_factors = LongropeFactors::kShort;
  EXPECT_TRUE(near(freqs(p, D, 100000).inv_freq, {1, 0.05, 0.0025, 0.000125}));
  // generic: per-pair divisors, or the frequencies outright.
  p = RopeParams{};
  p.freq_factors = {1, 2, 0.5, 10};
  EXPECT_TRUE(near(freqs(p, D).inv_freq, {1, 0.05, 0.02, 0.0001}));
  p = RopeParams{};
  p.inv_freq = {3, 0.5, 0, 0.25};
  EXPECT_TRUE(near(freqs(p, D).inv_freq, {3, 0.5, 0, 0.25}));
}

// Every scheme against its long-double definition (rope.h), for several r and call lengths.
TEST(RopeSchemes, FrequenciesMatchTheDefinitionsInLongDouble) {
  for (I r : {I{8}, I{64}, I{96}, I{128}})
    for (const Scheme& s : schemes(r))
      for (I n : {I{0}, I{64}, I{65}, I{100}, I{5000}}) {
        RopeParams p = s.p;
        p.rotary_dim = r;
        const RopeFrequencies f = freqs(p, r, n);
        for (I k = 0; k < r / 2; ++k) {
          const double want = static_cast<double>(exact_inv(p, r, n, k));
          EXPECT_NEAR(f.inv_freq[static_cast<std::size_t>(k)], want, 4e-15 * want) << s.name << " r=" << r << " n=" << n << " k=" << k;
        }
      }
}

// ---- hf angles ---------------------------------------------------------------------------------

// transformers' default frequencies and angle in plain float32 C++: exponent, pow, reciprocal, each
// rounded to float, then the float product with the float position.
float hf_default_inv(float theta, I k, I r) {
  const float e = static_cast<float>(2 * k) / static_cast<float>(r);
  const float pw = static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
  return 1.0f / pw;
}

TEST(RopeAngles, HfIsTheFloat32ProductBitForBit) {
  const I r = 128;
  RopeParams p;
  p.theta = 500000;
  p.angles = RopeAngles::kHf;
  const RopeFrequencies f = freqs(p, r);
  int differs_from_accurate = 0;
  for (I m : {I{0}, I{1}, I{4097}, I{100000}, I{123457}, I{1000003}, I{4000000}, (I{1} << 24) + 1, I{50000017}}) {
    for (I k = 0; k < r / 2; ++k) {
      const float w = hf_default_inv(500000.0f, k, r);
      ASSERT_EQ(f.inv_freq_f32[static_cast<std::size_t>(k)], static_cast<double>(w)) << k;
      const float want = w * static_cast<float>(m);  // fl32(ω·fl32(m))
      const double got = f.angle(m, k);
      ASSERT_EQ(static_cast<float>(got), want) << "m=" << m << " k=" << k;
      ASSERT_EQ(got, static_cast<double>(want)) << "m=" << m << " k=" << k;
      // The accurate angle is m·ω in double: at m = 4·10⁶ the float product is off by ~0.1 rad.
      RopeParams pa = p;
      pa.angles = RopeAngles::kAccurate;
      if (m == 4000000 && std::fabs(freqs(pa, r).angle(m, k) - got) > 1e-3) ++differs_from_accurate;
    }
  }
  EXPECT_GT(differs_from_accurate, 5);  // what hf mode exists to reproduce

  // The reference rotates by exactly that float angle (cos, sin in double), times the attention factor.
  p.rope_type = RopeType::kYarn;
  p.factor = 4;
  p.original_max_position = 32768;
  p.theta = 1e6;
  const I D = 16;
  const RopeFrequencies fy = freqs(p, D, 0);
  EXPECT_NEAR(fy.attention_factor, 0.1 * std::log(4.0) + 1, 1e-15);
  std::vector<std::int64_t> ids = {3999999, 100000};
  Vec x(2 * D, 0.0), y(2 * D);
  for (I t = 0; t < 2; ++t)
    for (I k = 0; k < D / 2; ++k) x[static_cast<std::size_t>(t * D + k)] = 1.0;  // half layout: (1, 0) pairs
  p.layout = RopeLayout::kHalf;
  ASSERT_TRUE(reference::rope_forward(p, V(x, {1, 2, 1, D}), {View::contiguous(ids.data(), DType::kI64, {2}), 0},
                                      V(y, {1, 2, 1, D})).ok());
  for (I t = 0; t < 2; ++t)
    for (I k = 0; k < D / 2; ++k) {
      const double a = fy.angle(ids[static_cast<std::size_t>(t)], k);
      EXPECT_NEAR(y[static_cast<std::size_t>(t * D + k)], fy.attention_factor * std::cos(a), 1e-15);
      EXPECT_NEAR(y[static_cast<std::size_t>(t * D + k + D / 2)], fy.attention_factor * std::sin(a), 1e-15);
    }
}

// The hf frequencies of the scaled schemes are float32 values near the accurate ones: the float32
// exponent 2k/r alone moves base^(2k/r) by up to ln(base)·2⁻²⁴ relative (8·10⁻⁷ at theta = 10⁶).
TEST(RopeAngles, HfFrequenciesAreFloat32ValuesNearTheAccurateOnes) {
  for (const Scheme& s : schemes(96))
    for (I n : {I{10}, I{5000}}) {
      RopeParams p = s.p;
      const RopeFrequencies f = freqs(p, 96, n);
      for (std::size_t k = 0; k < f.inv_freq.size(); ++k) {
        const double h = f.inv_freq_f32[k];
        EXPECT_EQ(h, static_cast<double>(static_cast<float>(h))) << s.name;
        EXPECT_NEAR(h, f.inv_freq[k], 2e-6 * f.inv_freq[k] + 1e-30) << s.name << " n=" << n << " k=" << k;
      }
    }
}

// ---- accurate angles: exact to ≤ 10⁻⁶ rad up to position 2^24 (theta ≤ 10⁷) -----------------------

LD wrap(LD a) {  // to (−π, π]
  a = fmodl(a, 2 * kPiL);
  if (a > kPiL) a -= 2 * kPiL;
  if (a <= -kPiL) a += 2 * kPiL;
  return a;
}

TEST(RopeAngles, AccurateWithinBoundAtLargePositionsForEveryScheme) {
  const I r = 64, D = 64;
  const std::vector<I> positions = {100000, 1000000, 2500001, 4000000, I{1} << 24};
  std::vector<Scheme> all = schemes(r);
  RopeParams big;
  big.theta = 1e7;
  all.push_back({"theta_1e7", big});
  for (const Scheme& s : all) {
    RopeParams p = s.p;
    p.layout = RopeLayout::kInterleaved;
    const I n = positions.back() + 1;
    const RopeFrequencies f = freqs(p, D, n);
    // (1, 0) pairs rotate to a·(cos, sin) of the angle: recover it and compare with long double.
    Vec x(positions.size() * D, 0.0), y(x.size());
    for (std::size_t i = 0; i < x.size(); i += 2) x[i] = 1.0;
    std::vector<I> ids = positions;
    ASSERT_TRUE(reference::rope_forward(p, V(x, {1, static_cast<I>(positions.size()), 1, D}),
                                        {View::contiguous(ids.data(), DType::kI64, {static_cast<I>(ids.size())}), 0},
                                        V(y, {1, static_cast<I>(positions.size()), 1, D})).ok());
    double worst_angle = 0, worst_rot = 0;
    for (std::size_t t = 0; t < positions.size(); ++t)
      for (I k = 0; k < r / 2; ++k) {
        const LD exact = static_cast<LD>(positions[t]) * exact_inv(p, r, n, k);
        worst_angle = std::max(worst_angle, static_cast<double>(fabsl(f.angle(positions[t], k) - exact)));
        const double c = y[t * D + 2 * k], sn = y[t * D + 2 * k + 1];
        EXPECT_NEAR(std::hypot(c, sn), f.attention_factor, 1e-14);
        worst_rot = std::max(worst_rot, static_cast<double>(fabsl(wrap(std::atan2(sn, c) - exact))));
      }
    EXPECT_LE(worst_angle, 1e-6) << s.name;
    EXPECT_LE(worst_rot, 1e-6) << s.name;
    EXPECT_LE(worst_angle, 5e-8) << s.name << ": double angles are this good";
  }
}

// The fast path (float32 storage, every SIMD target): |a·cos, a·sin − exact| within the bound of
// rope.h, a·(3·10⁻⁷ + |m·ω|·2⁻⁴⁷), at positions 10⁵ .. 4·10⁶ and 2^24.
TEST(RopeAngles, FastPathWithinItsBoundAtLargePositionsForEveryScheme) {
  const I r = 64, D = 64;
  std::vector<I> ids = {100000, 999999, 2500001, 4000000, I{1} << 24};
  const I L = static_cast<I>(ids.size());
  std::vector<Scheme> all = schemes(r);
  RopeParams big;
  big.theta = 1e7;
  all.push_back({"theta_1e7", big});
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const Scheme& s : all) {
      RopeParams p = s.p;
      p.layout = RopeLayout::kHalf;
      const I n = ids.back() + 1;
      const RopeFrequencies f = freqs(p, D, n);
      std::vector<float> x(static_cast<std::size_t>(L * D), 0.0f), y(x.size());
      for (I t = 0; t < L; ++t)
        for (I k = 0; k < D / 2; ++k) x[static_cast<std::size_t>(t * D + k)] = 1.0f;
      ASSERT_TRUE(rope_forward(p, View::contiguous(x.data(), DType::kF32, {1, L, 1, D}),
                               {View::contiguous(ids.data(), DType::kI64, {L}), 0},
                               View::contiguous(y.data(), DType::kF32, {1, L, 1, D})).ok());
      double worst = 0;
      for (I t = 0; t < L; ++t)
        for (I k = 0; k < r / 2; ++k) {
          const LD exact = static_cast<LD>(ids[static_cast<std::size_t>(t)]) * exact_inv(p, r, n, k);
          const double a = f.attention_factor;
          const double bound = a * (3e-7 + static_cast<double>(exact) * std::ldexp(1.0, -47));
          const double ec = std::fabs(y[static_cast<std::size_t>(t * D + k)] - static_cast<double>(a * cosl(exact)));
          const double es = std::fabs(y[static_cast<std::size_t>(t * D + k + D / 2)] - static_cast<double>(a * sinl(exact)));
          worst = std::max(worst, std::max(ec, es) / a);
          ASSERT_LE(ec, bound) << hwy::TargetName(target) << " " << s.name << " t=" << t << " k=" << k;
          ASSERT_LE(es, bound) << hwy::TargetName(target) << " " << s.name << " t=" << t << " k=" << k;
        }
      EXPECT_LE(worst, 1e-6) << hwy::TargetName(target) << " " << s.name;
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// ---- gradients and properties ------------------------------------------------------------------

TEST(RopeSchemes, BackwardMatchesFiniteDifferencesForEveryScheme) {
  const I B = 2, L = 3, H = 2, D = 12;
  std::vector<std::int32_t> ids = {0, 5, 70, 11, 3, 90};
  const Vec x = randn(B * L * H * D, 41), proj = randn(B * L * H * D, 42);
  for (const Scheme& s : schemes(8))
    for (RopeAngles angles : {RopeAngles::kAccurate, RopeAngles::kHf})
      for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
        RopeParams p = s.p;
        p.rotary_dim = 8;
        p.layout = layout;
        p.angles = angles;
        const Positions pos{View::contiguous(ids.data(), DType::kI32, {B, L}), 1};
        auto loss = [&](const Vec& xv) {
          Vec xx = xv, y(xv.size());
          EXPECT_TRUE(reference::rope_forward(p, V(xx, {B, L, H, D}), pos, V(y, {B, L, H, D})).ok());
          return dot(proj, y);
        };
        Vec dy = proj, dx(x.size(), 5.0);
        ASSERT_TRUE(reference::rope_backward(p, V(dy, {B, L, H, D}), pos, V(dx, {B, L, H, D})).ok());
        EXPECT_TRUE(GradCheck(loss, x, dx)) << s.name << " " << rope_angles_name(angles) << " " << rope_layout_name(layout);
        // backward ∘ forward = a²: the rotation undone, the factor twice. Pass-through dims untouched.
        const double a = freqs(p, D, 92).attention_factor;
        Vec xc = x, y(x.size()), back(x.size());
        ASSERT_TRUE(reference::rope_forward(p, V(xc, {B, L, H, D}), pos, V(y, {B, L, H, D})).ok());
        ASSERT_TRUE(reference::rope_backward(p, V(y, {B, L, H, D}), pos, V(back, {B, L, H, D})).ok());
        Vec want = x;
        for (std::size_t i = 0; i < want.size(); ++i)
          if (static_cast<I>(i) % D < 8) want[i] *= a * a;
        EXPECT_TRUE(AllClose(back, want, 1e-12, 1e-12)) << s.name;
      }
}

// q_m·k_n depends on m − n only (for a fixed call length), scaled by a².
TEST(RopeSchemes, ScoresDependOnRelativePositionAndNormsScaleByTheAttentionFactor) {
  const I D = 16;
  const Vec q = randn(D, 43), k = randn(D, 44);
  for (const Scheme& s : schemes(D))
    for (RopeAngles angles : {RopeAngles::kAccurate, RopeAngles::kHf}) {
      RopeParams p = s.p;
      p.layout = RopeLayout::kHalf;
      p.angles = angles;
      p.seq_len = 10000;  // one call length for every pair, so dynamic and longrope stay fixed
      const double a = freqs(p, D, 0).attention_factor;
      auto rotated = [&](const Vec& v, I m) {
        Vec vc = v, y(v.size());
        std::vector<I> id = {m};
        EXPECT_TRUE(reference::rope_forward(p, V(vc, {1, 1, 1, D}), {View::contiguous(id.data(), DType::kI64, {1}), 0},
                                            V(y, {1, 1, 1, D})).ok());
        return y;
      };
      const double base = dot(rotated(q, 7), rotated(k, 3));
      // hf angles are float32 products: exactly relative only up to their rounding (ulp(500) ≈ 3·10⁻⁵).
      const double tol = angles == RopeAngles::kHf ? 2e-3 : 1e-9;
      EXPECT_NEAR(dot(rotated(q, 507), rotated(k, 503)), base, tol * a * a) << s.name;
      EXPECT_NEAR(dot(rotated(q, 7), rotated(q, 7)), a * a * dot(q, q), 1e-12 * a * a * dot(q, q)) << s.name;
      if (angles == RopeAngles::kAccurate) {  // hf's float products are only approximately relative
        EXPECT_NEAR(dot(rotated(q, 9003), rotated(k, 8999)), base, 1e-9) << s.name;
      }
    }
}

// Dynamic NTK and LongRoPE read the call's own length, max(position) + 1, never an allocation.
TEST(RopeSchemes, TheCallsLengthDecidesDynamicAndLongrope) {
  const I D = 8, W = 16;
  auto run = [&](const RopeParams& p, std::vector<I> ids, const Vec& x) {
    Vec xc = x, y(x.size());
    const I L = static_cast<I>(ids.size());
    EXPECT_TRUE(reference::rope_forward(p, V(xc, {1, L, 1, D}), {View::contiguous(ids.data(), DType::kI64, {L}), 0},
                                        V(y, {1, L, 1, D})).ok());
    return y;
  };
  RopeParams dyn;
  dyn.rope_type = RopeType::kDynamic;
  dyn.factor = 4;
  dyn.original_max_position = W;
  RopeParams lr;
  lr.rope_type = RopeType::kLongrope;
  lr.factor = 8;
  lr.original_max_position = W;
  lr.short_factor = {1, 1.5, 2, 3};
  lr.long_factor = {1, 4, 16, 64};
  for (const RopeParams& base : {dyn, lr}) {
    const Vec x = randn(40 * D, 45);
    std::vector<I> prefill(40);
    for (I i = 0; i < 40; ++i) prefill[static_cast<std::size_t>(i)] = i;
    const Vec whole = run(base, prefill, x);
    // A decode step at position 39 sees length 40: it equals the prefill's last row.
    const Vec last(x.end() - D, x.end());
    const Vec step = run(base, {39}, last);
    EXPECT_TRUE(AllClose(step, Vec(whole.end() - D, whole.end()), 1e-14, 1e-14));
    // A piece of the sequence equals the whole's rows only with the whole's seq_len.
    const Vec head(x.begin(), x.begin() + 10 * D);
    std::vector<I> first(prefill.begin(), prefill.begin() + 10);
    RopeParams whole_len = base;
    whole_len.seq_len = 40;
    EXPECT_TRUE(AllClose(run(whole_len, first, head), Vec(whole.begin(), whole.begin() + 10 * D), 1e-14, 1e-14));
    EXPECT_FALSE(AllClose(run(base, first, head), Vec(whole.begin(), whole.begin() + 10 * D), 1e-6, 0));
    // Inside the window the scheme is plain (dynamic) / short (longrope): positions < W.
    RopeParams plain;
    if (base.rope_type == RopeType::kLongrope) {
      plain = base;
      plain.longrope_factors = LongropeFactors::kShort;
    }
    EXPECT_TRUE(AllClose(run(base, first, head), run(plain, first, head), 1e-14, 1e-14));
    // Length W exactly is inside, W + 1 beyond.
    std::vector<I> at_w = {W - 1}, past_w = {W};
    const Vec one(x.begin(), x.begin() + D);
    EXPECT_TRUE(AllClose(run(base, at_w, one), run(plain, at_w, one), 1e-14, 1e-14));
    RopeParams forced = base;
    if (base.rope_type == RopeType::kLongrope) forced.longrope_factors = LongropeFactors::kLong;
    forced.seq_len = W + 1;
    EXPECT_TRUE(AllClose(run(base, past_w, one), run(forced, past_w, one), 1e-14, 1e-14));
    EXPECT_FALSE(AllClose(run(base, past_w, one), run(plain, past_w, one), 1e-6, 0));
  }
}

}  // namespace
}  // namespace posenc
