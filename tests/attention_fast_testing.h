// The fixtures of the fused attention's tests (test_attention_fast.cc, test_attention_bf16_rate.cc):
// the encoding variants and shapes, a problem's inputs rounded to the dtype, the checks of forward and
// backward against the float64 reference, and a backward through the kernels alone.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <hwy/targets.h>

#include "attention/attention_fused.h"
#include "attention/attention_tiles.h"
#include "attention/tile_gemm_bf16.h"
#include "core/param_text.h"
#include "posenc/attention.h"
#include "posenc/half.h"
#include "posenc/threads.h"
#include "testing.h"
#include "typed_tensor.h"

namespace posenc::fast_testing {

using ::posenc::testing::AllClose;
using ::posenc::testing::randn;
using I = std::int64_t;
using Vec = std::vector<double>;

inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

// ---- encodings -----------------------------------------------------------------------------------
struct Variant {
  std::string name;
  Encoding enc = Encoding::kNope;
  RopeLayout layout = RopeLayout::kInterleaved;
  bool partial = false;  // rope: rotary_dim = about D/2
  AlibiVariant alibi = AlibiVariant::kSymmetric;
  bool slopes = false;  // alibi: caller-given slopes
  bool bidirectional = true;  // t5
  KerpleKernel kernel = KerpleKernel::kLog;  // kerple
  int scheme = 0;  // rope: 0 plain, else a frequency scheme of rope_scheme() (sized per shape)
};

inline void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

inline std::vector<Variant> variants() {
  return {
      {"nope", Encoding::kNope},
      {"rope_interleaved", Encoding::kRope, RopeLayout::kInterleaved},
      {"rope_half_partial", Encoding::kRope, RopeLayout::kHalf, true},
      {"alibi_symmetric", Encoding::kAlibi},
      {"alibi_slopes", Encoding::kAlibi, RopeLayout::kInterleaved, false, AlibiVariant::kSymmetric, true},
      {"alibi_nonsymmetric", Encoding::kAlibi, RopeLayout::kInterleaved, false, AlibiVariant::kNonsymmetric},
      {"alibi_learned", Encoding::kAlibi, RopeLayout::kInterleaved, false, AlibiVariant::kLearned},
      {"t5_bidirectional", Encoding::kT5},
      {"t5_unidirectional", Encoding::kT5, RopeLayout::kInterleaved, false, AlibiVariant::kSymmetric,
       false, false},
      {"kerple_log", Encoding::kKerple},
      {"kerple_power", Encoding::kKerple, RopeLayout::kInterleaved, false, AlibiVariant::kSymmetric, false,
       true, KerpleKernel::kPower},
      {"sandwich", Encoding::kSandwich},
      {"fire", Encoding::kFire},
      {"rope_yarn_attention_factor", Encoding::kRope, RopeLayout::kInterleaved, true, AlibiVariant::kSymmetric,
       false, true, KerpleKernel::kLog, 1},
      {"rope_dynamic_hf", Encoding::kRope, RopeLayout::kHalf, false, AlibiVariant::kSymmetric, false, true, KerpleKernel::kLog, 2},
      {"rope_longrope_llama3", Encoding::kRope, RopeLayout::kHalf, true, AlibiVariant::kSymmetric, false, true, KerpleKernel::kLog, 3},
      // rotary.h (the variant by name: "mixed", "interleaved"; rope2d needs D >= 4, shapes below skip it)
      {"rope2d_axial", Encoding::kRope2d, RopeLayout::kInterleaved},
      {"rope2d_mixed_half", Encoding::kRope2d, RopeLayout::kHalf},
      {"mrope_chunked", Encoding::kMrope, RopeLayout::kHalf},
      {"mrope_interleaved_partial", Encoding::kMrope, RopeLayout::kInterleaved, true},
      {"xpos", Encoding::kXpos, RopeLayout::kInterleaved},
      {"xpos_half_partial", Encoding::kXpos, RopeLayout::kHalf, true},
  };
}

// RoPE frequency schemes (rope.h) for rotary dimension r: the fused kernel's a·cos, a·sin tables come
// from the call's RopeFrequencies, in both angle modes.
inline RopeParams rope_scheme(int scheme, I r, I D) {
  RopeParams p;
  switch (scheme) {
    case 1:  // YaRN with DeepSeek-style mscale and an attention factor ≠ 1
      p.rope_type = RopeType::kYarn;
      p.theta = 1e6;
      p.factor = 4;
      p.original_max_position = 64;
      p.mscale = 0.707;
      p.mscale_all_dim = 1.0;
      break;
    case 2:  // dynamic NTK beyond its window (most shapes), hf angles (the "far" shape rounds them)
      if (r >= 4) {
        p.rope_type = RopeType::kDynamic;
        p.factor = 2;
        p.original_max_position = 16;
      }
      p.angles = RopeAngles::kHf;
      p.theta = 500000;
      break;
    default: {  // LongRoPE (long beyond 32) for even D / 2 pairs, Llama 3.1's scheme otherwise
      if ((r / 2) % 2 == 0) {
        p.rope_type = RopeType::kLongrope;
        p.factor = 16;
        p.original_max_position = 32;
        for (I k = 0; k < r / 2; ++k) {
          p.short_factor.push_back(1.0 + 0.1 * static_cast<double>(k));
          p.long_factor.push_back(1.0 + 4.0 * static_cast<double>(k));
        }
      } else {
        p.rope_type = RopeType::kLlama3;
        p.theta = 500000;
        p.factor = 8;
        p.original_max_position = 64;
      }
      break;
    }
  }
  (void)D;
  return p;
}

// ---- a problem -----------------------------------------------------------------------------------
struct Shape {
  I B = 1, M = 1, N = 1, Hq = 2, Hkv = 1, D = 2;
  std::optional<I> q_off;
  I k_off = 0;
  Shape(I b, I m, I n, I hq, I hkv, I d, std::optional<I> qo = std::nullopt, I ko = 0)
      : B(b), M(m), N(n), Hq(hq), Hkv(hkv), D(d), q_off(qo), k_off(ko) {}
};

using Tensor = testing::TypedTensor;

struct Problem {
  AttentionParams p;
  Shape s;
  Vec slopes, weights;  // alibi [Hq] / learned [2, Hq] / t5 [nb, Hq]
  Vec r1, r2;           // kerple [Hq]
  I fire_w = 9;         // fire: w1, b1 [W], w2 [Hq, W], b2 [Hq], c, L [1]
  Vec w1, b1, w2, b2, c, L;
  Vec freqs;                             // rope2d mixed [2, Hq, r/2]
  I A = 0, r2d = 0;                      // rope2d / mrope: position components; rope2d's rotary dim
  std::vector<std::int64_t> qpos, kpos;  // [A, M] / [B, A, M], [A, N] / [B, A, N]
  bool batched = false;

  Problem(const Variant& var, const Shape& sh, bool causal, std::uint64_t seed) : s(sh) {
    p.encoding = var.enc;
    p.causal = causal;
    p.q_offset = sh.q_off;
    p.k_offset = sh.k_off;
    if (var.scheme) {
      const I r = var.partial && sh.D >= 4 ? (sh.D / 2) & ~I{1} : sh.D;
      p.rope = rope_scheme(var.scheme, r, sh.D);
    }
    p.rope.layout = var.layout;
    if (var.partial && sh.D >= 4) p.rope.rotary_dim = (sh.D / 2) & ~I{1};
    p.alibi.variant = var.alibi;
    p.t5.bidirectional = var.bidirectional;
    p.t5.num_buckets = 16;
    p.t5.max_distance = 40;
    if (var.slopes) {
      slopes = randn(ix(sh.Hq), seed + 10, 0.2);
      for (double& m : slopes) m = std::fabs(m);
    }
    if (var.enc == Encoding::kAlibi && var.alibi == AlibiVariant::kLearned)
      weights = randn(ix(2 * sh.Hq), seed + 11);
    if (var.enc == Encoding::kT5) weights = randn(ix(p.t5.num_buckets * sh.Hq), seed + 12);
    if (var.enc == Encoding::kKerple) {
      p.kerple.kernel = var.kernel;
      r1 = randn(ix(sh.Hq), seed + 13);
      r2 = randn(ix(sh.Hq), seed + 14);
      for (double& x : r1) x = 0.1 + 1.5 * (0.5 + 0.5 * std::tanh(x));
      for (double& x : r2) x = 0.05 + 1.9 * (0.5 + 0.5 * std::tanh(x));
    }
    if (var.enc == Encoding::kSandwich) p.sandwich.sinusoid_dim = 16;
    const bool partial = var.partial && sh.D >= 4;
    const I r = partial ? (sh.D / 2) & ~I{1} : sh.D;
    if (var.enc == Encoding::kRope2d) {  // a multiple of 4 (callers skip D < 4)
      p.rope2d.rope.layout = var.layout;
      r2d = sh.D - sh.D % 4;
      if (r2d != sh.D) p.rope2d.rope.rotary_dim = r2d;
      if (var.name.find("mixed") != std::string::npos) {
        p.rope2d.variant = Rope2dVariant::kMixed;
        freqs = randn(ix(2 * sh.Hq * r2d / 2), seed + 19, 0.5);
      }
    }
    if (var.enc == Encoding::kMrope) {
      p.mrope.rope.layout = var.layout;
      if (partial) p.mrope.rope.rotary_dim = r;
      const I half = r / 2, s3 = half / 3;
      p.mrope.mrope_section = {half - 2 * s3, s3, s3};
      if (var.name.find("interleaved") != std::string::npos) p.mrope.variant = MropeVariant::kInterleaved;
      p.mrope.rope.theta = 1e6;
    }
    if (var.enc == Encoding::kXpos) {
      p.xpos.rope.layout = var.layout;
      if (partial) p.xpos.rope.rotary_dim = r;
      p.xpos.scale_base = 64;  // a stronger decay than the paper's 512: the scales matter here
    }
    if (var.enc == Encoding::kRope2d || var.enc == Encoding::kMrope) {
      // Grid-like ids from the 1D positions (far shapes stay far), per batch row when B > 1.
      A = var.enc == Encoding::kRope2d ? 2 : 3;
      batched = sh.B > 1;
      const I qo = std::max<I>(0, sh.q_off ? *sh.q_off : sh.k_off + sh.N - sh.M), ko = sh.k_off;
      for (I b = 0; b < (batched ? sh.B : 1); ++b) {
        for (I a = 0; a < A; ++a)
          for (I i = 0; i < sh.M; ++i) qpos.push_back(qo + (i * (a + 1) + 3 * b) % 11 + (a == 0 ? i / 11 : 0));
        for (I a = 0; a < A; ++a)
          for (I j = 0; j < sh.N; ++j) kpos.push_back(ko + (j * (a + 2) + 5 * b) % 13 + (a == 0 ? j / 13 : 0));
      }
    }
    if (var.enc == Encoding::kFire) {
      w1 = randn(ix(fire_w), seed + 15, 1.5);
      b1 = randn(ix(fire_w), seed + 16, 0.7);
      w2 = randn(ix(sh.Hq * fire_w), seed + 17, 0.8);
      b2 = randn(ix(sh.Hq), seed + 18, 0.5);
      c = {0.15};
      L = {60.5};  // query positions on both sides of it in most shapes
    }
  }
  static View v64(Vec& x, std::initializer_list<std::int64_t> shape) {
    return View::contiguous(x.data(), DType::kF64, shape);
  }
  EncodingTensors tensors() {
    EncodingTensors t;
    if (!slopes.empty()) t.slopes = View::contiguous(slopes.data(), DType::kF64, {s.Hq});
    if (!weights.empty()) t.weights = View::contiguous(weights.data(), DType::kF64, {I(weights.size()) / s.Hq, s.Hq});
    if (!r1.empty()) t.r1 = v64(r1, {s.Hq}), t.r2 = v64(r2, {s.Hq});
    if (!w1.empty())
      t.fire = FireTensors{v64(w1, {fire_w}), v64(b1, {fire_w}), v64(w2, {s.Hq, fire_w}), v64(b2, {s.Hq}),
                           v64(c, {1}), v64(L, {1})};
    if (!freqs.empty()) t.freqs = v64(freqs, {2, s.Hq, r2d / 2});
    if (A > 0) {
      t.q_positions = batched ? View::contiguous(qpos.data(), DType::kI64, {s.B, A, s.M})
                              : View::contiguous(qpos.data(), DType::kI64, {A, s.M});
      t.k_positions = batched ? View::contiguous(kpos.data(), DType::kI64, {s.B, A, s.N})
                              : View::contiguous(kpos.data(), DType::kI64, {A, s.N});
    }
    return t;
  }
  // Gradient buffers (filled with `fill`) for every learned tensor the encoding reads, and their views.
  struct Grads {
    std::vector<Vec> bufs;
    EncodingGrads g;
  };
  Grads grads(double fill) {
    Grads r;
    r.bufs.reserve(8);
    auto buf = [&](std::size_t n, std::initializer_list<std::int64_t> shape) {
      r.bufs.emplace_back(n, fill);
      return View::contiguous(r.bufs.back().data(), DType::kF64, shape);
    };
    if (!weights.empty()) r.g.weights = buf(weights.size(), {I(weights.size()) / s.Hq, s.Hq});
    if (!r1.empty()) {
      r.g.r1 = buf(r1.size(), {s.Hq});
      r.g.r2 = buf(r2.size(), {s.Hq});
    }
    if (!w1.empty()) {
      r.g.fire.w1 = buf(w1.size(), {fire_w});
      r.g.fire.b1 = buf(b1.size(), {fire_w});
      r.g.fire.w2 = buf(w2.size(), {s.Hq, fire_w});
      r.g.fire.b2 = buf(b2.size(), {s.Hq});
      r.g.fire.c = buf(1, {1});
      r.g.fire.threshold = buf(1, {1});
    }
    if (!freqs.empty()) r.g.freqs = buf(freqs.size(), {2, s.Hq, r2d / 2});
    return r;
  }
  std::vector<std::int64_t> qshape() const { return {s.B, s.M, s.Hq, s.D}; }
  std::vector<std::int64_t> kshape() const { return {s.B, s.N, s.Hkv, s.D}; }
};

// Largest |x| (for tolerances scaled to the tensor).
inline double amax(const Vec& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::isfinite(v) ? std::fabs(v) : 0.0);
  return m;
}

struct Tol {
  double atol, rtol;  // atol relative to the tensor's largest |want|
};
inline Tol tol_out(DType t) { return t == DType::kF32 ? Tol{2e-6, 2e-5} : Tol{8e-3, 8e-3}; }
inline Tol tol_grad(DType t) { return t == DType::kF32 ? Tol{2e-5, 1e-4} : Tol{1.6e-2, 1.6e-2}; }

inline ::testing::AssertionResult Close(const Vec& got, const Vec& want, Tol t) {
  return AllClose(got, want, t.atol * std::max(amax(want), 1e-30), t.rtol);
}

// Forward of the fused kernel and the reference on the same (rounded) inputs.
inline void check_forward(Problem& pr, DType dt, std::uint64_t seed) {
  Tensor q(dt, randn(ix(pr.s.B * pr.s.M * pr.s.Hq * pr.s.D), seed + 1), pr.qshape());
  Tensor k(dt, randn(ix(pr.s.B * pr.s.N * pr.s.Hkv * pr.s.D), seed + 2), pr.kshape());
  Tensor v(dt, randn(ix(pr.s.B * pr.s.N * pr.s.Hkv * pr.s.D), seed + 3), pr.kshape());
  Tensor out(dt, pr.qshape());
  Vec lse(ix(pr.s.B * pr.s.Hq * pr.s.M), 7.0);
  const EncodingTensors t = pr.tensors();
  const Status st = fused::attention_forward(pr.p, q.view(), k.view(), v.view(), t, out.view(),
                                             View::contiguous(lse.data(), DType::kF64, {pr.s.B, pr.s.Hq, pr.s.M}));
  ASSERT_TRUE(st.ok()) << st.message();
  Vec want(q.d.size()), want_lse(lse.size());
  const Status sr = reference::attention_forward(pr.p, q.view64(), k.view64(), v.view64(), t,
                                                 View::contiguous(want.data(), DType::kF64, pr.qshape()),
                                                 View::contiguous(want_lse.data(), DType::kF64,
                                                                  {pr.s.B, pr.s.Hq, pr.s.M}));
  ASSERT_TRUE(sr.ok()) << sr.message();
  EXPECT_TRUE(Close(out.values(), want, tol_out(dt))) << "out";
  EXPECT_TRUE(AllClose(lse, want_lse, 1e-4, 1e-5)) << "lse";
}

inline void check_backward(Problem& pr, DType dt, std::uint64_t seed) {
  Tensor q(dt, randn(ix(pr.s.B * pr.s.M * pr.s.Hq * pr.s.D), seed + 1), pr.qshape());
  Tensor k(dt, randn(ix(pr.s.B * pr.s.N * pr.s.Hkv * pr.s.D), seed + 2), pr.kshape());
  Tensor v(dt, randn(ix(pr.s.B * pr.s.N * pr.s.Hkv * pr.s.D), seed + 3), pr.kshape());
  Tensor dout(dt, randn(q.d.size(), seed + 4), pr.qshape());
  Tensor dq(dt, pr.qshape()), dk(dt, pr.kshape()), dv(dt, pr.kshape());
  const EncodingTensors t = pr.tensors();
  Problem::Grads g = pr.grads(9.0), gw = pr.grads(0.0);
  const Status st = fused::attention_backward(pr.p, q.view(), k.view(), v.view(), t, dout.view(),
                                              dq.view(), dk.view(), dv.view(), g.g);
  ASSERT_TRUE(st.ok()) << st.message();
  Vec wq(q.d.size()), wk(k.d.size()), wv(v.d.size());
  const Status sr = reference::attention_backward(
      pr.p, q.view64(), k.view64(), v.view64(), t, dout.view64(),
      View::contiguous(wq.data(), DType::kF64, pr.qshape()), View::contiguous(wk.data(), DType::kF64, pr.kshape()),
      View::contiguous(wv.data(), DType::kF64, pr.kshape()), gw.g);
  ASSERT_TRUE(sr.ok()) << sr.message();
  EXPECT_TRUE(Close(dq.values(), wq, tol_grad(dt))) << "dq";
  EXPECT_TRUE(Close(dk.values(), wk, tol_grad(dt))) << "dk";
  EXPECT_TRUE(Close(dv.values(), wv, tol_grad(dt))) << "dv";
  // Parameter gradients sum over every (i, j): compare relative to the largest entry of any of them
  // (FIRE's db2, a per-head constant's gradient, is Σ dS over whole rows: 0 up to rounding).
  double scale = 1e-30;
  for (const Vec& b : gw.bufs) scale = std::max(scale, amax(b));
  const Tol pt{dt == DType::kF32 ? 1e-4 : 2e-2, 1e-3};
  for (std::size_t i = 0; i < g.bufs.size(); ++i)
    EXPECT_TRUE(AllClose(g.bufs[i], gw.bufs[i], pt.atol * scale, pt.rtol)) << "parameter gradient " << i;
}

struct NamedShape {
  const char* name;
  Shape s;
};

inline std::vector<NamedShape> shapes() {
  return {
      {"L1", {1, 1, 1, 2, 1, 2}},
      {"L3_B2", {2, 3, 3, 2, 2, 6}},
      {"L19_gqa", {1, 19, 19, 4, 2, 64}},
      {"L130_d6", {1, 130, 130, 2, 1, 6}},
      {"decode", {1, 1, 130, 4, 2, 64}},
      {"M_lt_N_d130", {1, 19, 130, 2, 2, 130}},
      {"M_gt_N", {1, 130, 19, 2, 1, 6}},  // default q_off = N − M < 0: early causal rows see nothing
      {"offsets", {2, 19, 37, 2, 1, 6, I{960}, I{955}}},
      {"far", {1, 3, 130, 2, 2, 6, I{1000003}, I{1000000}}},
  };
}


inline std::vector<Vec> backward_fused(Problem& pr, DType dt, bool with_dq, std::uint64_t seed, I nan_in_q = -1) {
  Vec qv = randn(ix(pr.s.B * pr.s.M * pr.s.Hq * pr.s.D), seed + 1);
  if (nan_in_q >= 0) qv[ix(nan_in_q)] = std::nan("");
  Tensor q(dt, qv, pr.qshape());
  Tensor k(dt, randn(ix(pr.s.B * pr.s.N * pr.s.Hkv * pr.s.D), seed + 2), pr.kshape());
  Tensor v(dt, randn(ix(pr.s.B * pr.s.N * pr.s.Hkv * pr.s.D), seed + 3), pr.kshape());
  Tensor dout(dt, randn(q.d.size(), seed + 4), pr.qshape());
  Tensor dq(dt, pr.qshape()), dk(dt, pr.kshape()), dv(dt, pr.kshape());
  Problem::Grads g = pr.grads(0.0);
  const Status st =
      fused::attention_backward(pr.p, q.view(), k.view(), v.view(), pr.tensors(), dout.view(),
                                with_dq ? dq.view() : View{}, dk.view(), dv.view(), g.g);
  EXPECT_TRUE(st.ok()) << st.message();
  std::vector<Vec> r = {dq.values(), dk.values(), dv.values()};
  for (const Vec& b : g.bufs) r.push_back(b);
  return r;
}

// The dQ buffer limit for a test's scope (fused::set_dq_buffer_limit; 0: a float32 dq summed in place).
struct DqBufferLimit {
  explicit DqBufferLimit(std::int64_t bytes) { fused::set_dq_buffer_limit(bytes); }
  ~DqBufferLimit() { fused::set_dq_buffer_limit(-1); }
};

}  // namespace posenc::fast_testing
