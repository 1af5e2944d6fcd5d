// The decode kernel's test problems (tests/test_attention_decode*.cc): every encoding the kernel
// covers as a Variant, its parameters and tensors (Problem), and check(): the kernel against the
// plain reference on one shape, inputs rounded to the dtype first, with the fast kernels' tolerances.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention_decode.h"
#include "posenc/attention.h"
#include "posenc/threads.h"
#include "testing.h"
#include "typed_tensor.h"

namespace posenc::decode_testing {

using ::posenc::testing::AllClose;
using ::posenc::testing::randn;
using I = std::int64_t;
using Vec = std::vector<double>;

inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

using Tensor = testing::TypedTensor;

struct Variant {
  std::string name;
  Encoding enc;
};

inline std::vector<Variant> variants() {
  return {{"nope", Encoding::kNope},         {"rope_half", Encoding::kRope},
          {"rope_interleaved_partial", Encoding::kRope}, {"xpos", Encoding::kXpos},
          {"mrope", Encoding::kMrope},       {"alibi", Encoding::kAlibi},
          {"alibi_slopes", Encoding::kAlibi}, {"alibi_nonsymmetric", Encoding::kAlibi},
          {"alibi_learned", Encoding::kAlibi}, {"t5_bidirectional", Encoding::kT5},
          {"t5_unidirectional", Encoding::kT5}, {"t5_bidirectional_early", Encoding::kT5},
          {"kerple_log", Encoding::kKerple},
          {"kerple_power", Encoding::kKerple}, {"sandwich", Encoding::kSandwich},
          {"fire", Encoding::kFire},         {"xl", Encoding::kXL},
          {"cope", Encoding::kCope},         {"cope_wide", Encoding::kCope},
          {"rope2d_mixed_half", Encoding::kRope2d}, {"rope2d_mixed_interleaved_partial", Encoding::kRope2d}};
}

// One call's parameters and encoding tensors (float64).
struct Problem {
  AttentionParams p;
  I Hq, D;
  Vec slopes, weights, r1, r2, w1, b1, w2, b2, c, L, u, vb, W, table, freqs;
  std::vector<std::int64_t> qpos, kpos;  // rope2d: [B, 2, M], [B, 2, N]
  I npos = 0;
  static constexpr I kXlDim = 14;  // xl's sinusoid dimension: 7 (sin, cos) pairs
  Problem(const Variant& var, I hq, I d, bool causal, std::uint64_t seed) : Hq(hq), D(d) {
    p.encoding = var.enc;
    p.causal = causal;
    p.k_offset = 5;
    const bool has = [&](const char* s) { return var.name.find(s) != std::string::npos; }("partial");
    if (var.enc == Encoding::kRope) {
      p.keys_rotated = true;
      p.rope.layout = var.name.find("half") != std::string::npos ? RopeLayout::kHalf : RopeLayout::kInterleaved;
      if (has) p.rope.rotary_dim = D / 2 - (D / 2) % 2;
    }
    if (var.enc == Encoding::kXpos) p.keys_rotated = true, p.xpos.scale_base = 64;
    if (var.enc == Encoding::kMrope) {
      p.keys_rotated = true;
      const I half = D / 2, s3 = half / 3;
      p.mrope.mrope_section = {half - 2 * s3, s3, s3};
    }
    if (var.name == "alibi_slopes") {
      slopes = randn(ix(Hq), seed + 1, 0.2);
      for (double& m : slopes) m = std::fabs(m);
    }
    if (var.name == "alibi_nonsymmetric") p.alibi.variant = AlibiVariant::kNonsymmetric;
    if (var.name == "alibi_learned") {
      p.alibi.variant = AlibiVariant::kLearned;
      weights = randn(ix(2 * Hq), seed + 2);
    }
    if (var.enc == Encoding::kT5) {
      p.t5.bidirectional = var.name != "t5_unidirectional";
      if (var.name == "t5_bidirectional_early") p.q_offset = p.k_offset + 100;  // keys far on both sides
      p.t5.num_buckets = 16;
      p.t5.max_distance = 40;
      weights = randn(ix(16 * Hq), seed + 3);
    }
    if (var.enc == Encoding::kKerple) {
      if (var.name == "kerple_power") p.kerple.kernel = KerpleKernel::kPower;
      r1 = randn(ix(Hq), seed + 4);
      r2 = randn(ix(Hq), seed + 5);
      for (double& x : r1) x = 0.1 + 1.5 * (0.5 + 0.5 * std::tanh(x));
      for (double& x : r2) x = 0.05 + 1.9 * (0.5 + 0.5 * std::tanh(x));
    }
    if (var.enc == Encoding::kRope2d) {  // mixed: per-head frequencies, unrotated keys
      p.rope2d.variant = Rope2dVariant::kMixed;
      p.rope2d.rope.layout = has ? RopeLayout::kInterleaved : RopeLayout::kHalf;
      p.rope2d.rope.rotary_dim = has ? D / 2 - (D / 2) % 4 : D - D % 4;
      freqs = randn(ix(2 * Hq * (p.rope2d.rope.rotary_dim / 2)), seed + 18, 0.6);
    }
    if (var.enc == Encoding::kSandwich) p.sandwich.sinusoid_dim = 16;
    if (var.enc == Encoding::kFire) {
      w1 = randn(9, seed + 6, 1.5);
      b1 = randn(9, seed + 7, 0.7);
      w2 = randn(ix(Hq * 9), seed + 8, 0.8);
      b2 = randn(ix(Hq), seed + 9, 0.5);
      c = {0.15};
      L = {300.5};  // query positions on both sides of it over the shapes
    }
    if (var.enc == Encoding::kCope) {  // clamped on most keys of a row, or never (npos > N + 1)
      npos = var.name == "cope_wide" ? 700 : 24;
      table = randn(ix(npos * D), seed + 17, 0.5);
    }
    if (var.enc == Encoding::kXL) {
      u = randn(ix(Hq * D), seed + 14, 0.5);
      vb = randn(ix(Hq * D), seed + 15, 0.5);
      W = randn(ix(Hq * D * kXlDim), seed + 16, 0.4);
    }
  }
  // rope2d: keys on a grid 23 wide, row b's shifted by 3·b; the queries on the cells after the keys.
  void positions(I B, I M, I N) {
    if (freqs.empty()) return;
    const I Wd = 23;
    for (I b = 0; b < B; ++b) {
      for (I a = 0; a < 2; ++a)
        for (I i = 0; i < M; ++i) qpos.push_back(a ? (N + i) / Wd + b : (N + i + 3 * b) % Wd);
      for (I a = 0; a < 2; ++a)
        for (I j = 0; j < N; ++j) kpos.push_back(a ? j / Wd + b : (j + 3 * b) % Wd);
    }
    Bp = B, Mp = M, Np = N;
  }
  I Bp = 0, Mp = 0, Np = 0;
  static View v(Vec& x, std::initializer_list<I> s) { return View::contiguous(x.data(), DType::kF64, s); }
  EncodingTensors tensors() {
    EncodingTensors t;
    if (!slopes.empty()) t.slopes = v(slopes, {Hq});
    if (!weights.empty()) t.weights = v(weights, {I(weights.size()) / Hq, Hq});
    if (!r1.empty()) t.r1 = v(r1, {Hq}), t.r2 = v(r2, {Hq});
    if (!table.empty()) t.table = v(table, {npos, D});
    if (!u.empty()) t.u = v(u, {Hq, D}), t.v = v(vb, {Hq, D}), t.rel_proj = v(W, {Hq, D, kXlDim});
    if (!freqs.empty()) {
      t.freqs = v(freqs, {2, Hq, I(freqs.size()) / (2 * Hq)});
      t.q_positions = View::contiguous(qpos.data(), DType::kI64, {Bp, 2, Mp});
      t.k_positions = View::contiguous(kpos.data(), DType::kI64, {Bp, 2, Np});
    }
    if (!w1.empty()) t.fire = FireTensors{v(w1, {9}), v(b1, {9}), v(w2, {Hq, 9}), v(b2, {Hq}), v(c, {1}), v(L, {1})};
    return t;
  }
};

inline double amax(const Vec& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::isfinite(v) ? std::fabs(v) : 0.0);
  return m;
}

// The decode kernel (at `threads`) against the reference on one shape; got (unless null): its out;
// bf16_rate: AttentionParams::bf16_rate.
inline void check(const Variant& var, DType dt, I M, I Hq, I Hkv, bool causal, I N, int threads, std::uint64_t seed,
           I D = 40, I B = 1, Vec* got = nullptr, bool bf16_rate = true) {
  SCOPED_TRACE(var.name + " " + dtype_name(dt) + " B=" + std::to_string(B) + " M=" + std::to_string(M) +
               " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + (causal ? " causal" : "") +
               " threads=" + std::to_string(threads));
  Problem pr(var, Hq, D, causal, seed);
  pr.p.bf16_rate = bf16_rate;
  pr.positions(B, M, N);
  Tensor q(dt, randn(ix(B * M * Hq * D), seed + 11), {B, M, Hq, D});
  Tensor k(dt, randn(ix(B * N * Hkv * D), seed + 12), {B, N, Hkv, D});
  Tensor v(dt, randn(ix(B * N * Hkv * D), seed + 13), {B, N, Hkv, D});
  Tensor out(dt, Vec(q.d.size(), 0.0), {B, M, Hq, D});
  Vec lse(ix(B * Hq * M), 7.0), want(q.d.size()), want_lse(lse.size());
  const EncodingTensors t = pr.tensors();
  {
    const ThreadScope scope(threads);
    const Status st = decode::attention_forward(pr.p, q.view(), k.view(), v.view(), t, out.view(),
                                                View::contiguous(lse.data(), DType::kF64, {B, Hq, M}));
    ASSERT_TRUE(st.ok()) << st.message();
  }
  const Status sr = reference::attention_forward(pr.p, q.view64(), k.view64(), v.view64(), t,
                                                 View::contiguous(want.data(), DType::kF64, {B, M, Hq, D}),
                                                 View::contiguous(want_lse.data(), DType::kF64, {B, Hq, M}));
  ASSERT_TRUE(sr.ok()) << sr.message();
  // cope float32: a count sums the gates of float logits over hundreds of keys, and a count's error
  // moves z by that much times q·(e_⌈p⌉ − e_⌊p⌋) — the tile kernel's tolerance (test_attention_cope_fast.cc)
  const double atol = dt != DType::kF32 ? 8e-3 : var.enc == Encoding::kCope ? 2e-5 : 2e-6;
  const double rtol = dt == DType::kF32 ? 2e-5 : 8e-3;
  EXPECT_TRUE(AllClose(out.values(), want, atol * std::max(amax(want), 1e-30), rtol)) << "out";
  EXPECT_TRUE(AllClose(lse, want_lse, 1e-4, 1e-5)) << "lse";
  if (got) *got = out.values();
}

}  // namespace posenc::decode_testing
