// The fused (flash-style) attention, posenc::fused:: (src/attention/attention_cpu.cc), against the plain
// reference posenc::reference:: (src/attention/attention_ref.cc), forward (out, lse) and backward
// (dq, dk, dv and the parameter gradients), for every encoding the kernels cover (nope, rope in both
// layouts, full and partial, alibi symmetric / with slopes / nonsymmetric / learned, t5 bi- and
// unidirectional, kerple log and power, sandwich, fire, rope2d axial and mixed (with dfreqs, per
// query head under grouped heads), mrope chunked and interleaved with 2D/3D positions shared or per
// batch row, xpos) × causal or not × M = N, decode (M = 1), M < N, M > N × grouped-query heads ×
// global offsets × float32, bfloat16 and float16 × sizes off the tile (L ∈ {1, 3, 19, 130},
// D ∈ {2, 6, 64, 130}) × 1 and 2 threads; every SIMD target on one case per encoding, and at the study model's
// head dim (D = 16, 20); backward units split over key
// blocks (B·Hkv not a multiple of the threads: one head, MQA, three units) against one thread and the
// reference; a large case (L = 989); a long one (L = 16384) whose peak memory shows no L×L buffer; the
// dispatcher's choice; attention_backward_saved (given the forward's out and lse) against
// attention_backward, bit for bit; and the kernels' refusals.
//
// The reference sees exactly what the kernels read: inputs are rounded to the dtype first.
// Tolerances: |got − want| ≤ atol + rtol·|want| with atol scaled by the largest |want| of the tensor.
//
// Shape letters: B batch, M queries, N keys, Hq query heads, Hkv kv heads, D head dim.
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

namespace posenc {
namespace {

using ::posenc::testing::AllClose;
using ::posenc::testing::randn;
using I = std::int64_t;
using Vec = std::vector<double>;

std::size_t ix(I i) { return static_cast<std::size_t>(i); }

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

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

std::vector<Variant> variants() {
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
RopeParams rope_scheme(int scheme, I r, I D) {
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
double amax(const Vec& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::isfinite(v) ? std::fabs(v) : 0.0);
  return m;
}

struct Tol {
  double atol, rtol;  // atol relative to the tensor's largest |want|
};
Tol tol_out(DType t) { return t == DType::kF32 ? Tol{2e-6, 2e-5} : Tol{8e-3, 8e-3}; }
Tol tol_grad(DType t) { return t == DType::kF32 ? Tol{2e-5, 1e-4} : Tol{1.6e-2, 1.6e-2}; }

::testing::AssertionResult Close(const Vec& got, const Vec& want, Tol t) {
  return AllClose(got, want, t.atol * std::max(amax(want), 1e-30), t.rtol);
}

// Forward of the fused kernel and the reference on the same (rounded) inputs.
void check_forward(Problem& pr, DType dt, std::uint64_t seed) {
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

void check_backward(Problem& pr, DType dt, std::uint64_t seed) {
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

std::vector<NamedShape> shapes() {
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

class FastAttention : public ::testing::TestWithParam<Variant> {};

TEST_P(FastAttention, ForwardMatchesReference) {
  const Variant& var = GetParam();
  for (const NamedShape& ns : shapes())
    for (bool causal : {false, true})
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        if (dt != DType::kF32 && ns.s.D == 130) continue;  // 16-bit on the smaller shapes suffices
        if (var.enc == Encoding::kRope2d && ns.s.D < 4) continue;  // 2D RoPE needs r >= 4
        SCOPED_TRACE(std::string(ns.name) + (causal ? " causal " : " full ") + dtype_name(dt));
        Problem pr(var, ns.s, causal, 100);
        check_forward(pr, dt, 200);
      }
}

TEST_P(FastAttention, BackwardMatchesReference) {
  const Variant& var = GetParam();
  for (const NamedShape& ns : shapes())
    for (bool causal : {false, true})
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        if (dt != DType::kF32 && ns.s.D == 130) continue;
        if (var.enc == Encoding::kRope2d && ns.s.D < 4) continue;
        SCOPED_TRACE(std::string(ns.name) + (causal ? " causal " : " full ") + dtype_name(dt));
        Problem pr(var, ns.s, causal, 300);
        check_backward(pr, dt, 400);
      }
}

// The two float32 backwards without saved statistics: the forward run again then pass 2 (the
// stored tiles off), and the stored path (one thread: every unit whole, so it is taken wherever
// its conditions hold), each against the reference on every shape.
TEST_P(FastAttention, BackwardRecomputedAndStoredMatchReference) {
  const Variant& var = GetParam();
  for (bool stored : {false, true})
    for (const NamedShape& ns : shapes())
      for (bool causal : {false, true}) {
        if (var.enc == Encoding::kRope2d && ns.s.D < 4) continue;
        SCOPED_TRACE(std::string(ns.name) + (causal ? " causal" : " full") + (stored ? " stored" : " recomputed"));
        const fused::ScoreStoreLimit limit(stored ? -1 : 0);
        set_num_threads(stored ? 1 : 0);
        Problem pr(var, ns.s, causal, 300);
        check_backward(pr, DType::kF32, 450);
      }
  set_num_threads(0);
}

// The bfloat16-rate forward (tile_gemm_bf16.h: q, k, v bfloat16, the products on pairs of bfloat16,
// P rounded to bfloat16 for its product), emulated on any AVX-512 CPU, and with VDPBF16PS and with
// AMX where this CPU has them: out and lse within the bfloat16 tolerances, on every shape above.
class FastAttentionBf16Rate : public ::testing::TestWithParam<std::tuple<Variant, attn_fast::Bf16Mode>> {
 protected:
  void TearDown() override { attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kAuto); }
};

TEST_P(FastAttentionBf16Rate, ForwardMatchesReference) {
  const auto& [var, mode] = GetParam();
  attn_fast::bf16_set_mode(mode);
  if (!attn_fast::bf16_ops())
    GTEST_SKIP() << "this CPU lacks the instructions of this mode";
  for (const NamedShape& ns : shapes())
    for (bool causal : {false, true}) {
      if (ns.s.D == 130 || (var.enc == Encoding::kRope2d && ns.s.D < 4)) continue;
      SCOPED_TRACE(std::string(ns.name) + (causal ? " causal" : " full"));
      Problem pr(var, ns.s, causal, 100);
      check_forward(pr, DType::kBF16, 200);
    }
}

// At the rate the products read bfloat16 q's pairs in place where its rows allow it (unit inner
// stride, 4-byte aligned rows), else rows copied first: the same bits either way, for q contiguous,
// q one element off 4-byte alignment, and q with an odd row stride.
TEST(FastAttentionBf16RatePath, QReadInPlaceOrCopiedGivesTheSameBits) {
  attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kEmulated);
  if (!attn_fast::bf16_ops()) {
    attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kAuto);
    GTEST_SKIP() << "this CPU has no AVX-512";
  }
  const I M = 200, H = 2, D = 64;
  Problem pr(variants()[0], {1, M, M, H, 1, D}, true, 100);
  Tensor k(DType::kBF16, randn(ix(M * D), 2), pr.kshape());
  Tensor v(DType::kBF16, randn(ix(M * D), 3), pr.kshape());
  const Vec qv = randn(ix(M * H * D), 1);
  std::vector<bf16> buf(ix(M * (H * D + 1) + 1));
  std::vector<std::vector<bf16>> outs;
  for (int layout = 0; layout < 3; ++layout) {  // contiguous, off alignment, odd row stride
    const I ld = layout == 2 ? H * D + 1 : H * D;
    bf16* q0 = buf.data() + (layout == 1 ? 1 : 0);
    for (I i = 0; i < M; ++i)
      for (I e = 0; e < H * D; ++e) q0[i * ld + e] = to_bf16(static_cast<float>(qv[ix(i * H * D + e)]));
    View q;
    q.data = q0;
    q.dtype = DType::kBF16;
    q.ndim = 4;
    q.shape = {1, M, H, D};
    q.strides = {M * ld, ld, D, 1};
    std::vector<bf16> out(ix(M * H * D));
    const Status st = fused::attention_forward(pr.p, q, k.view(), v.view(), pr.tensors(),
                                               View::contiguous(out.data(), DType::kBF16, {1, M, H, D}));
    ASSERT_TRUE(st.ok()) << st.message();
    outs.push_back(out);
  }
  attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kAuto);
  for (int layout = 1; layout < 3; ++layout)
    for (std::size_t e = 0; e < outs[0].size(); ++e)
      ASSERT_EQ(outs[ix(layout)][e].bits, outs[0][e].bits) << "layout " << layout << " element " << e;
}

// The emulated mode does take the rate path: P rounded to bfloat16 changes out's bits against the
// float32 products' (kOff) at a size the tiles see.
TEST(FastAttentionBf16RatePath, EmulatedModeRoundsP) {
  attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kEmulated);
  if (!attn_fast::bf16_ops()) {
    attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kAuto);
    GTEST_SKIP() << "this CPU has no AVX-512";
  }
  Problem pr(variants()[0], {1, 130, 130, 2, 1, 64}, true, 100);
  Tensor q(DType::kBF16, randn(ix(130 * 2 * 64), 1), pr.qshape());
  Tensor k(DType::kBF16, randn(ix(130 * 64), 2), pr.kshape());
  Tensor v(DType::kBF16, randn(ix(130 * 64), 3), pr.kshape());
  Vec res[3];  // the rate, the float32 products (kOff), and the rate declined by bf16_rate = false
  for (int i = 0; i < 3; ++i) {
    attn_fast::bf16_set_mode(i == 1 ? attn_fast::Bf16Mode::kOff : attn_fast::Bf16Mode::kEmulated);
    AttentionParams p = pr.p;
    p.bf16_rate = i != 2;
    Tensor out(DType::kBF16, pr.qshape());
    const Status st = fused::attention_forward(p, q.view(), k.view(), v.view(), pr.tensors(), out.view());
    ASSERT_TRUE(st.ok()) << st.message();
    res[i] = out.values();
  }
  attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kAuto);
  EXPECT_NE(res[0], res[1]);
  EXPECT_EQ(res[2], res[1]);
}

// fused::bf16_products (the bench's path column) names the kernels of the mode bf16_ops() follows,
// and "" where a call keeps the float32 products: mode kOff, bf16_rate = false, xl and cope.
TEST(FastAttentionBf16RatePath, ProductsNameTheModesKernels) {
  AttentionParams p;
  const std::pair<attn_fast::Bf16Mode, const char*> modes[] = {
      {attn_fast::Bf16Mode::kEmulated, "emulated"}, {attn_fast::Bf16Mode::kVdpbf16, "vdpbf16"},
      {attn_fast::Bf16Mode::kAmx, "amx"}, {attn_fast::Bf16Mode::kOff, ""}};
  for (const auto& [mode, name] : modes) {
    attn_fast::bf16_set_mode(mode);
    const std::string want = attn_fast::bf16_ops() ? name : "";  // "" where this CPU lacks the kernel
    for (Encoding e : {Encoding::kNope, Encoding::kRope, Encoding::kXL, Encoding::kCope}) {
      p.encoding = e;
      p.bf16_rate = true;
      const bool own = e == Encoding::kXL || e == Encoding::kCope;
      EXPECT_EQ(fused::bf16_products(p), own ? "" : want) << name << " " << static_cast<int>(e);
      p.bf16_rate = false;
      EXPECT_EQ(fused::bf16_products(p), "") << name;
    }
  }
  attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kAuto);
}

// The C ABI's and Python's key vocabulary sets bf16_rate from text.
TEST(FastAttentionBf16RatePath, KeyFromText) {
  AttentionParams p;
  EXPECT_TRUE(p.bf16_rate);
  ASSERT_TRUE(text::set_attention_param(&p, "bf16_rate", "false").ok());
  EXPECT_FALSE(p.bf16_rate);
  ASSERT_TRUE(text::set_attention_param(&p, "bf16_rate", "true").ok());
  EXPECT_TRUE(p.bf16_rate);
  EXPECT_EQ(text::set_attention_param(&p, "bf16_rate", "maybe").arg(), "bf16_rate");
}

std::string rate_name(const ::testing::TestParamInfo<std::tuple<Variant, attn_fast::Bf16Mode>>& info) {
  const attn_fast::Bf16Mode m = std::get<1>(info.param);
  return std::get<0>(info.param).name +
         (m == attn_fast::Bf16Mode::kAmx ? "_amx" : m == attn_fast::Bf16Mode::kVdpbf16 ? "_vdpbf16" : "_emulated");
}
INSTANTIATE_TEST_SUITE_P(FastAttentionBf16Rate, FastAttentionBf16Rate,
                         ::testing::Combine(::testing::ValuesIn(variants()),
                                            ::testing::Values(attn_fast::Bf16Mode::kEmulated,
                                                              attn_fast::Bf16Mode::kVdpbf16,
                                                              attn_fast::Bf16Mode::kAmx)),
                         rate_name);

// Two threads compute exactly what one does (tasks partition the work; no shared accumulation order).
TEST_P(FastAttention, TwoThreadsEqualOne) {
  const Variant& var = GetParam();
  Problem pr(var, {2, 130, 130, 4, 2, 64}, true, 500);
  Tensor q(DType::kF32, randn(ix(2 * 130 * 4 * 64), 1), pr.qshape());
  Tensor k(DType::kF32, randn(ix(2 * 130 * 2 * 64), 2), pr.kshape());
  Tensor v(DType::kF32, randn(ix(2 * 130 * 2 * 64), 3), pr.kshape());
  Tensor dout(DType::kF32, randn(q.d.size(), 4), pr.qshape());
  const EncodingTensors t = pr.tensors();
  std::vector<Vec> res[2];
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Tensor out(DType::kF32, pr.qshape()), dq(DType::kF32, pr.qshape()), dk(DType::kF32, pr.kshape()),
        dv(DType::kF32, pr.kshape());
    Problem::Grads g = pr.grads(0.0);
    ASSERT_TRUE(fused::attention_forward(pr.p, q.view(), k.view(), v.view(), t, out.view()).ok());
    ASSERT_TRUE(fused::attention_backward(pr.p, q.view(), k.view(), v.view(), t, dout.view(), dq.view(),
                                          dk.view(), dv.view(), g.g).ok());
    res[threads - 1] = {out.values(), dq.values(), dk.values(), dv.values()};
    for (const Vec& b : g.bufs) res[threads - 1].push_back(b);
  }
  set_num_threads(0);
  for (std::size_t i = 0; i < res[0].size(); ++i) EXPECT_EQ(res[0][i], res[1][i]) << "output " << i;
}

// attention_backward_saved (the study model's entry point) with the out and lse of the public
// forward equals the public backward bit for bit where that runs the forward again: at a size the
// dispatcher sends to the kernels, where pass 1 reads the saved out and lse instead of recomputing
// them (1 and 2 threads), and at one it sends to the reference, which ignores them. Where the public
// backward takes the stored path (its D summed as Σ P·dP), within 1e-5 of each output's largest entry.
TEST_P(FastAttention, SavedForwardGivesTheSameBackward) {
  const Variant& var = GetParam();
  for (const I L : {I{130}, I{5}})
    for (int threads : {1, 2})
      for (bool stored : {false, true}) {
        SCOPED_TRACE("L = " + std::to_string(L) + ", threads " + std::to_string(threads) + (stored ? ", stored" : ""));
        const fused::ScoreStoreLimit limit(stored ? -1 : 0);
        set_num_threads(threads);
        Problem pr(var, {2, L, L, 4, 2, 64}, true, 600);
        Tensor q(DType::kF32, randn(ix(2 * L * 4 * 64), 1), pr.qshape());
        Tensor k(DType::kF32, randn(ix(2 * L * 2 * 64), 2), pr.kshape());
        Tensor v(DType::kF32, randn(ix(2 * L * 2 * 64), 3), pr.kshape());
        Tensor dout(DType::kF32, randn(q.d.size(), 4), pr.qshape());
        Tensor out(DType::kF32, pr.qshape());
        std::vector<double> lse(ix(2 * 4 * L));
        const View lv = View::contiguous(lse.data(), DType::kF64, {2, 4, L});
        const EncodingTensors t = pr.tensors();
        ASSERT_TRUE(attention_forward(pr.p, q.view(), k.view(), v.view(), t, out.view(), lv).ok());
        std::vector<Vec> res[2];
        for (int saved : {0, 1}) {
          Tensor dq(DType::kF32, pr.qshape()), dk(DType::kF32, pr.kshape()), dv(DType::kF32, pr.kshape());
          Problem::Grads g = pr.grads(0.0);
          const Status st =
              saved ? attention_backward_saved(pr.p, q.view(), k.view(), v.view(), t, out.view(), lv, dout.view(),
                                               dq.view(), dk.view(), dv.view(), g.g)
                    : attention_backward(pr.p, q.view(), k.view(), v.view(), t, dout.view(), dq.view(), dk.view(),
                                         dv.view(), g.g);
          ASSERT_TRUE(st.ok()) << st.message();
          res[saved] = {dq.values(), dk.values(), dv.values()};
          for (const Vec& b : g.bufs) res[saved].push_back(b);
        }
        // the parameter gradients (outputs 3 …) against the largest entry of any of them, as in
        // check_backward (FIRE's db2 is Σ dS over whole rows: 0 up to rounding)
        double ptop = 0;
        for (std::size_t i = 3; i < res[1].size(); ++i) ptop = std::max(ptop, amax(res[1][i]));
        for (std::size_t i = 0; i < res[0].size(); ++i) {
          if (!stored) {
            EXPECT_EQ(res[0][i], res[1][i]) << "output " << i;
            continue;
          }
          double worst = 0;
          for (std::size_t e = 0; e < res[1][i].size(); ++e) worst = std::max(worst, std::abs(res[0][i][e] - res[1][i][e]));
          EXPECT_LE(worst, 1e-5 * (i < 3 ? amax(res[1][i]) : ptop)) << "output " << i;
        }
      }
  set_num_threads(0);
}

std::string variant_name(const ::testing::TestParamInfo<Variant>& info) { return info.param.name; }
INSTANTIATE_TEST_SUITE_P(FastAttention, FastAttention, ::testing::ValuesIn(variants()), variant_name);

// Every SIMD target compiled and supported here (hwy::SetSupportedTargetsForTest; the kernels fetch
// their row helpers per call), one mid-size case per encoding (both rope layouts; learned ALiBi,
// whose backward also sums diagonals), forward and backward: two key blocks; D = 66 leaves the
// rotation's and the row helpers' vector loops a tail; grouped heads; causal on every other one.
TEST(FastAttentionTargets, EveryTargetMatchesReference) {
  set_num_threads(1);
  int n = 0;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const Variant& var : variants()) {
      if (var.name != "nope" && var.name != "rope_interleaved" && var.name != "rope_half_partial" &&
          var.name != "alibi_learned" && var.name != "t5_bidirectional" && var.name != "kerple_power" &&
          var.name != "sandwich" && var.name != "fire" && var.name != "rope_yarn_attention_factor" &&
          var.name != "rope_dynamic_hf" && var.name != "rope2d_mixed_half" && var.name != "mrope_interleaved_partial" &&
          var.name != "xpos")
        continue;
      SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + var.name);
      const bool causal = ++n % 2 == 1;
      Problem pr(var, {1, 140, 140, 2, 1, 66}, causal, 1200 + ix(n));
      check_forward(pr, DType::kF32, 1300);
      check_backward(pr, DType::kF32, 1400);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  set_num_threads(0);
}

// The study model's shape (L = 64, D = 16: the tile GEMM's one-vector rows on AVX-512, two on AVX2)
// and D = 20 (a tail after whole vectors on every width) on every SIMD target, forward and backward,
// with the encodings the model trains.
TEST(FastAttentionTargets, EveryTargetMatchesReferenceAtSmallHeadDims) {
  set_num_threads(1);
  int n = 0;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const Variant& var : variants()) {
      if (var.name != "nope" && var.name != "rope_interleaved" && var.name != "alibi_learned" &&
          var.name != "t5_bidirectional")
        continue;
      for (I D : {16, 20}) {
        SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + var.name + " D " + std::to_string(D));
        ++n;
        Problem pr(var, {2, 64, 64, 4, 2, D}, true, 1700 + ix(n));
        check_forward(pr, DType::kF32, 1800);
        check_backward(pr, DType::kF32, 1900);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  set_num_threads(0);
}

// The softmax's exponential (ExpSoftmax, core/simd-inl.h, through the tile helper S = e^(S − lse)
// and the tile's online step) on every SIMD target against e^x in double: within 2.5·10⁻⁷ relative
// (2 ulp) on [−86, 0.5] and beyond the row max, 0 at −∞ and below −86 (where e^x < 5·10⁻³⁸), a row
// of lse −∞ all 0; row lengths that end in a vector tail. The online step over two tiles of a
// banded row set against the same softmax in double: m, l and the rescaled o.
TEST(FastAttentionTargets, SoftmaxExponentialOnEveryTarget) {
  std::vector<float> xs;
  for (int i = 0; i <= 86 * 1024; ++i) xs.push_back(-static_cast<float>(i) / 1024.f);  // 0 .. −86
  for (float x : {0.125f, 0.5f, -1e-7f, -0.3465f, -0.3466f, -87.f, -100.f, -1e30f, -HUGE_VALF}) xs.push_back(x);
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    const attn_fast::Simd sd = attn_fast::simd();
    for (std::size_t n : {xs.size(), std::size_t{13}}) {  // 13: a tail on every vector width
      // two rows: lse 0 (the values), then lse −inf (zeros whatever the row holds)
      std::vector<float> y(2 * n);
      std::copy(xs.begin(), xs.begin() + static_cast<long>(n), y.begin());
      std::copy(xs.begin(), xs.begin() + static_cast<long>(n), y.begin() + static_cast<long>(n));
      const float lse[2] = {0.f, -HUGE_VALF};
      sd.exp_rows(y.data(), 2, static_cast<I>(n), static_cast<I>(n), lse, attn_fast::kNoBand);
      int bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double x = xs[i], want = x < -86 ? 0.0 : std::exp(x);
        const double err = x < -86 ? std::fabs(y[i]) : std::fabs(y[i] - want) / want;
        if (!(err <= (x < -86 ? 5e-38 : 2.5e-7)) && ++bad <= 5) ADD_FAILURE() << "e^" << x << " gave " << y[i];
        if (y[n + i] != 0.f && ++bad <= 5) ADD_FAILURE() << "row of lse -inf: " << y[n + i] << " at " << i;
      }
      EXPECT_EQ(bad, 0) << "n " << n;
    }
    // the online step: rows i = 0 .. 39 see keys j ≤ i + 20 of two 48-key tiles (rows from 28 on
    // reach the second); masked keys hold −inf up to the band's reach and 0 beyond, as in Fused::logits
    const I nq = 40, D = 6, band = 20;
    std::vector<float> m(nq, -HUGE_VALF), l(nq, 0.f), o(ix(nq * D), 0.f);
    std::vector<double> S0(ix(nq * 96));
    std::mt19937 rng(7);
    std::normal_distribution<double> nd(0.0, 3.0);
    for (double& v : S0) v = nd(rng);
    for (int t = 0; t < 2; ++t) {
      std::vector<float> S(ix(nq * attn_fast::kBk), 0.f);
      const I bt = band - t * 48;
      for (I i = 0; i < nq; ++i)
        for (I j = 0; j < 48; ++j)
          S[ix(i * attn_fast::kBk + j)] = j <= i + bt                           ? static_cast<float>(S0[ix(i * 96 + t * 48 + j)])
                                          : j < attn_fast::band_reach(i, bt, 48) ? -HUGE_VALF
                                                                                 : 0.f;
      attn_fast::online_softmax_step(sd, S.data(), nq, 48, m.data(), l.data(), o.data(), D, bt);
      for (I i = 0; i < nq; ++i)  // o += P·V with V[j, e] = 1: o's entries all equal the row's Σ P
        for (I e = 0; e < D; ++e)
          for (I j = 0; j < 48; ++j) o[ix(i * D + e)] += S[ix(i * attn_fast::kBk + j)];
    }
    for (I i = 0; i < nq; ++i) {
      double mx = -HUGE_VAL, sum = 0;
      for (I j = 0; j < 96 && j <= i + band; ++j) mx = std::max(mx, double(static_cast<float>(S0[ix(i * 96 + j)])));
      for (I j = 0; j < 96 && j <= i + band; ++j) sum += std::exp(double(static_cast<float>(S0[ix(i * 96 + j)])) - mx);
      EXPECT_EQ(m[ix(i)], static_cast<float>(mx)) << "row " << i;
      EXPECT_NEAR(l[ix(i)], sum, 1e-6 * sum) << "row " << i;
      EXPECT_NEAR(o[ix(i * D + 3)], sum, 1e-6 * sum) << "row " << i;
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// ---- pass 2 split over key blocks ---------------------------------------------------------------
// Backward units (b, kv head) beyond the last multiple of the thread count are split over their key
// blocks, each part with its own dQ rows, summed in part order. dk and dv of a key block come from
// one part whatever the split, so they equal the one-thread result exactly; dq and the parameter
// gradients are summed in another order, so they agree within float32 rounding of the sum
// (tol_grad), and the reference holds every thread count to the usual tolerances.
std::vector<Vec> backward_fused(Problem& pr, DType dt, bool with_dq, std::uint64_t seed, I nan_in_q = -1) {
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

// A float32 dq that takes the tile products' sums in place (tasks past the buffer limit) against
// one summed in a task's buffer: the same sums in the same order, so the same gradients bit for
// bit, and the reference's within the tolerances.
TEST(FastAttentionDq, InPlaceEqualsBuffered) {
  ASSERT_TRUE(attn_fast::dq_buffered(2, 130, 64));  // the shapes below buffer dQ by default
  {
    DqBufferLimit in_place(0);
    ASSERT_FALSE(attn_fast::dq_buffered(1, 1, 2));  // and sum in place under limit 0
  }
  for (const Variant& var : variants())
    for (const NamedShape& ns : shapes())
      for (bool causal : {false, true}) {
        if (var.enc == Encoding::kRope2d && ns.s.D < 4) continue;
        SCOPED_TRACE(std::string(var.name) + " " + ns.name + (causal ? " causal" : " full"));
        Problem pr(var, ns.s, causal, 300);
        const std::vector<Vec> buffered = backward_fused(pr, DType::kF32, true, 400);
        DqBufferLimit in_place(0);
        const std::vector<Vec> got = backward_fused(pr, DType::kF32, true, 400);
        ASSERT_EQ(got.size(), buffered.size());
        for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], buffered[i]) << "gradient " << i;
        check_backward(pr, DType::kF32, 400);
      }
}

// The stored path is taken (one thread, causal, no offsets: the tiles of both paths coincide): dv,
// which does not read D, equals the recomputing path's bit for bit, and dk, which does, differs in
// some bit (D = Σ P·dP rounds otherwise than dO·out); both hold the reference (the tests above).
TEST(FastAttentionStored, TakenWhereItFits) {
  set_num_threads(1);
  Problem pr(Variant{"nope", Encoding::kNope}, {2, 260, 260, 4, 2, 64}, true, 700);
  std::vector<Vec> res[2];
  for (int stored : {0, 1}) {
    const fused::ScoreStoreLimit limit(stored ? -1 : 0);
    res[stored] = backward_fused(pr, DType::kF32, true, 800);
  }
  EXPECT_EQ(res[1][2], res[0][2]) << "dv";
  EXPECT_NE(res[1][1], res[0][1]) << "dk";
  set_num_threads(0);
}

// The bfloat16-rate backward (q, k, v and dout bfloat16): dq, dk, dv and the parameter gradients
// within the bfloat16 tolerances, on the shapes above and on one whose key blocks meet query ranges
// starting at an odd row (q_offset 1, M odd), on the stored path at the rate (one thread: every unit
// whole; not under a rotary encoding, which the other path has) and on keys_rate after the forward
// again, at one thread and at two (B·Hkv = 1: a unit split over its key blocks). Emulated on any
// AVX-512 CPU; VDPBF16PS, AMX where this CPU has them.
TEST_P(FastAttentionBf16Rate, BackwardMatchesReference) {
  const auto& [var, mode] = GetParam();
  attn_fast::bf16_set_mode(mode);
  if (!attn_fast::bf16_ops()) GTEST_SKIP() << "this CPU lacks the instructions of this mode";
  std::vector<NamedShape> all = shapes();
  all.push_back({"odd_rows_gqa", {1, 299, 300, 4, 2, 64}});
  for (bool stored : {true, false})
    for (const NamedShape& ns : all)
      for (bool causal : {false, true}) {
        if (ns.s.D == 130 || (var.enc == Encoding::kRope2d && ns.s.D < 4)) continue;
        SCOPED_TRACE(std::string(ns.name) + (causal ? " causal" : " full") + (stored ? " stored" : " recomputed"));
        const fused::ScoreStoreLimit limit(stored ? -1 : 0);
        set_num_threads(stored ? 1 : 0);
        Problem pr(var, ns.s, causal, 300);
        check_backward(pr, DType::kBF16, 400);
      }
  set_num_threads(2);
  Problem pr(var, {1, 260, 261, 2, 1, 64}, true, 300);
  check_backward(pr, DType::kBF16, 400);
  set_num_threads(0);
}

// The emulated mode does take the backward's rate path: dq, dk and dv differ from the float32
// products' (kOff), which the rate declined (bf16_rate = false) gives bit for bit, and so does t5's
// rate past the dQ buffer's limit (pass 2's pairs not formed; pass 1 keeps the float32 products
// where there are parameter gradients).
TEST(FastAttentionBf16RatePath, EmulatedBackwardRoundsP) {
  attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kEmulated);
  if (!attn_fast::bf16_ops()) {
    attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kAuto);
    GTEST_SKIP() << "this CPU has no AVX-512";
  }
  for (const Variant& var : variants()) {
    if (var.name != "nope" && var.name != "t5_bidirectional" && var.name != "rope_interleaved") continue;
    SCOPED_TRACE(var.name);
    Problem pr(var, {1, 130, 130, 2, 1, 64}, true, 100);
    std::vector<Vec> res[4];  // the rate, kOff, the rate declined, the rate past the buffer limit
    for (int i = 0; i < 4; ++i) {
      attn_fast::bf16_set_mode(i == 1 ? attn_fast::Bf16Mode::kOff : attn_fast::Bf16Mode::kEmulated);
      pr.p.bf16_rate = i != 2;
      DqBufferLimit limit(i == 3 ? 0 : -1);
      res[i] = backward_fused(pr, DType::kBF16, true, 200);
    }
    for (int t = 0; t < 3; ++t) EXPECT_NE(res[0][ix(t)], res[1][ix(t)]) << "gradient " << t;
    for (std::size_t t = 0; t < res[1].size(); ++t) {
      EXPECT_EQ(res[2][t], res[1][t]) << "gradient " << t;
      if (var.enc == Encoding::kT5) {
        EXPECT_EQ(res[3][t], res[1][t]) << "gradient " << t;
      }
    }
  }
  attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kAuto);
}

// The stored path at the bfloat16 rate is taken (one thread, emulated products): dq, dk and dv differ
// from the float32 products' (kOff, on the stored path), as P and dS are rounded to bfloat16 for
// their products. With a NaN in a query row of the second query block the rate gives up that unit
// after its first block and runs the float32 stored unit: every gradient, the parameter gradients
// included, then equals kOff's bit for bit (NaNs in the same places), nothing of the first block's
// rate products left in them.
TEST(FastAttentionBf16RatePath, StoredBackwardAtTheRate) {
  attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kEmulated);
  if (!attn_fast::bf16_ops()) {
    attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kAuto);
    GTEST_SKIP() << "this CPU has no AVX-512";
  }
  const auto same_bits = [](const Vec& a, const Vec& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](double x, double y) {
             return x == y || (std::isnan(x) && std::isnan(y));
           });
  };
  set_num_threads(1);
  for (const Variant& var : {Variant{"nope", Encoding::kNope}, Variant{"t5", Encoding::kT5}}) {
    Problem pr(var, {1, 260, 260, 2, 1, 64}, true, 900);
    for (I nan_at : {I{-1}, I{(140 * 2 + 1) * 64 + 3}}) {  // row 140, head 1, element 3
      SCOPED_TRACE(var.name + (nan_at < 0 ? " finite" : " NaN in q"));
      std::vector<Vec> res[2];
      for (int off : {0, 1}) {
        attn_fast::bf16_set_mode(off ? attn_fast::Bf16Mode::kOff : attn_fast::Bf16Mode::kEmulated);
        res[off] = backward_fused(pr, DType::kBF16, true, 950, nan_at);
      }
      for (std::size_t t = 0; t < res[0].size(); ++t) {
        if (nan_at < 0 && t < 3) {
          EXPECT_FALSE(same_bits(res[0][t], res[1][t])) << "gradient " << t;
        } else if (nan_at >= 0) {
          EXPECT_TRUE(same_bits(res[0][t], res[1][t])) << "gradient " << t;
        }
      }
    }
  }
  set_num_threads(0);
  attn_fast::bf16_set_mode(attn_fast::Bf16Mode::kAuto);
}

struct SplitCase {
  const char* name;
  Shape s;
  bool causal;
};

TEST(FastAttentionSplit, SplitUnitsMatchOneThreadAndReference) {
  const SplitCase cases[] = {
      // B·Hq·M·N ≥ 2^15 in each, so that the kernels take the threads they are given.
      {"one_head", {1, 260, 260, 1, 1, 32}, true},    // B·Hkv = 1: every unit split
      {"mqa", {1, 130, 130, 4, 1, 32}, true},         // Hkv = 1 under 4 query heads
      {"units3", {3, 130, 130, 1, 1, 32}, false},     // B·Hkv = 3: whole units and a split one
      {"decode_rows", {1, 40, 420, 2, 1, 32}, true},  // M < N: the early key blocks see every row
  };
  const Variant vars[] = {{"nope", Encoding::kNope},
                          {"rope_half", Encoding::kRope, RopeLayout::kHalf},
                          {"alibi_nonsymmetric", Encoding::kAlibi, RopeLayout::kInterleaved, false,
                           AlibiVariant::kNonsymmetric},
                          {"alibi_learned", Encoding::kAlibi, RopeLayout::kInterleaved, false,
                           AlibiVariant::kLearned},
                          {"t5", Encoding::kT5},
                          {"kerple", Encoding::kKerple},
                          {"fire", Encoding::kFire},
                          {"rope2d_mixed", Encoding::kRope2d, RopeLayout::kInterleaved},
                          {"xpos", Encoding::kXpos, RopeLayout::kHalf}};
  const fused::ScoreStoreLimit recompute(0);  // one thread would take the stored path
  int n = 0;
  for (const SplitCase& c : cases)
    for (const Variant& var : vars) {
      if (var.alibi == AlibiVariant::kNonsymmetric && c.s.Hq % 2 != 0) continue;  // needs Hq even
      ++n;
      const DType dt = n % 3 == 0 ? DType::kBF16 : DType::kF32;
      DqBufferLimit limit(n % 2 == 0 ? 0 : -1);  // even cases: a float32 dq summed in place
      SCOPED_TRACE(std::string(c.name) + " " + var.name + " " + dtype_name(dt));
      Problem pr(var, c.s, c.causal, 1500 + ix(n));
      set_num_threads(1);
      const std::vector<Vec> one = backward_fused(pr, dt, true, 1600);
      for (int threads : {2, 3}) {
        if (threads == 3 && n != 1) continue;  // three parts (uneven cuts) on one case
        SCOPED_TRACE(threads);
        set_num_threads(threads);
        const std::vector<Vec> got = backward_fused(pr, dt, n % 4 != 1, 1600);  // also without dq
        if (n % 4 != 1) {
          EXPECT_TRUE(Close(got[0], one[0], tol_grad(dt))) << "dq";
        }
        EXPECT_EQ(got[1], one[1]) << "dk";
        EXPECT_EQ(got[2], one[2]) << "dv";
        for (std::size_t i = 3; i < got.size(); ++i)
          EXPECT_TRUE(Close(got[i], one[i], Tol{1e-5, 1e-5})) << "parameter gradient " << i - 3;
        if (threads == 2) check_backward(pr, dt, 1600);
      }
    }
  set_num_threads(0);
}

// A large case against the reference on two heads: rope causal (forward and backward), t5 full.
TEST(FastAttentionLarge, L989MatchesReference) {
  set_num_threads(2);
  {
    Variant var{"rope", Encoding::kRope};
    Problem pr(var, {1, 989, 989, 2, 1, 64}, true, 600);
    check_forward(pr, DType::kF32, 700);
    check_backward(pr, DType::kF32, 800);
  }
  {
    Variant var{"t5", Encoding::kT5};
    Problem pr(var, {1, 989, 989, 2, 2, 64}, false, 900);
    check_forward(pr, DType::kF32, 1000);
  }
  set_num_threads(0);
}

// kB of the process's peak resident memory (VmHWM).
long peak_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// L = 16384, one head: an L×L float buffer would be 1 GiB; the kernel needs O(L·D).
TEST(FastAttentionLarge, LongSequenceNeedsNoLxLBuffer) {
  const I L = 16384, D = 64;
  std::vector<float> q(ix(L * D)), k(ix(L * D)), v(ix(L * D)), out(ix(L * D));
  const Vec r = randn(ix(L * D), 5);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = k[i] = v[i] = static_cast<float>(r[i]);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = 1.f;  // touched: counted before the call
  const long before = peak_kb();
  AttentionParams p;
  p.causal = true;
  const View qv = View::contiguous(q.data(), DType::kF32, {1, L, 1, D});
  const View kv = View::contiguous(k.data(), DType::kF32, {1, L, 1, D});
  const View vv = View::contiguous(v.data(), DType::kF32, {1, L, 1, D});
  ASSERT_TRUE(attention_forward(p, qv, kv, vv, {}, View::contiguous(out.data(), DType::kF32, {1, L, 1, D})).ok());
  const long after = peak_kb();
  if (before < 0 || after < 0) GTEST_SKIP() << "no /proc/self/status";
  EXPECT_LT(after - before, 64 * 1024) << "peak grew by " << (after - before) << " kB";
  // first row sees only key 0: out = v_0
  for (I e = 0; e < D; ++e) EXPECT_FLOAT_EQ(out[ix(e)], v[ix(e)]);
}

// The same for KERPLE, Sandwich and FIRE (their tables are O(Hq·L), FIRE's thresholds O(L·W)):
// forward for each, backward for FIRE (its per-segment moments), the peak reset before each call.
TEST(FastAttentionLarge, LongSequenceWithTheNewBiasesNeedsNoLxLBuffer) {
  const I L = 16384, D = 64, W = 32;
  std::vector<float> q(ix(L * D)), out(ix(L * D), 1.f), dq(ix(L * D), 1.f), dk(ix(L * D), 1.f), dv(ix(L * D), 1.f);
  const Vec r = randn(ix(L * D), 6);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(r[i]);
  Vec r1 = {0.8}, r2 = {0.3}, w1 = randn(ix(W), 7), b1 = randn(ix(W), 8, 0.5), w2 = randn(ix(W), 9, 0.3), b2 = {0.1},
      c = {0.1}, thr = {512.0};
  const View qv = View::contiguous(q.data(), DType::kF32, {1, L, 1, D});
  auto v64 = [](Vec& x, std::initializer_list<std::int64_t> s) { return View::contiguous(x.data(), DType::kF64, s); };
  auto v32 = [&](std::vector<float>& x) { return View::contiguous(x.data(), DType::kF32, {1, L, 1, D}); };
  for (Encoding e : {Encoding::kKerple, Encoding::kSandwich, Encoding::kFire})
    for (bool backward : {false, true}) {
      if (backward && e != Encoding::kFire) continue;
      SCOPED_TRACE(std::string(encoding_info(e).name) + (backward ? " backward" : " forward"));
      AttentionParams p;
      p.encoding = e;
      p.causal = true;
      EncodingTensors t;
      if (e == Encoding::kKerple) t.r1 = v64(r1, {1}), t.r2 = v64(r2, {1});
      if (e == Encoding::kFire) t.fire = FireTensors{v64(w1, {W}), v64(b1, {W}), v64(w2, {1, W}), v64(b2, {1}), v64(c, {1}), v64(thr, {1})};
      std::FILE* f = std::fopen("/proc/self/clear_refs", "w");  // VmHWM := VmRSS (Linux ≥ 4.0)
      const bool reset = f && std::fputs("5", f) >= 0;
      if (f) std::fclose(f);
      if (!reset) GTEST_SKIP() << "cannot reset the peak resident memory here";
      const long before = peak_kb();
      const Status st = backward ? attention_backward(p, qv, qv, qv, t, qv, v32(dq), v32(dk), v32(dv), {})
                                 : attention_forward(p, qv, qv, qv, t, v32(out));
      ASSERT_TRUE(st.ok()) << st.message();
      const long after = peak_kb();
      EXPECT_LT(after - before, 64 * 1024) << "peak grew by " << (after - before) << " kB";
    }
}

// The rotary encodings at L = 16384 (one head, per-head tables for rope2d mixed: O(Hq·L·r)): forward
// and backward (mixed with dfreqs) without an L×L buffer, the peak reset before each call.
TEST(FastAttentionLarge, LongSequenceWithTheRotaryEncodingsNeedsNoLxLBuffer) {
  const I L = 16384, D = 64;
  std::vector<float> q(ix(L * D)), out(ix(L * D), 1.f), dq(ix(L * D), 1.f), dk(ix(L * D), 1.f), dv(ix(L * D), 1.f);
  const Vec r = randn(ix(L * D), 16);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(r[i]);
  Vec freqs = randn(ix(2 * D / 2), 17, 0.1), dfreqs(ix(2 * D / 2), 1.0);
  std::vector<std::int64_t> pos2(ix(2 * L)), pos3(ix(3 * L));
  for (I l = 0; l < L; ++l) {
    pos2[ix(l)] = l % 128, pos2[ix(L + l)] = l / 128;                                  // a 128 × 128 image
    pos3[ix(l)] = l < 64 ? l : 64, pos3[ix(L + l)] = l < 64 ? l : 64 + (l - 64) / 128;  // text, then a grid
    pos3[ix(2 * L + l)] = l < 64 ? l : 64 + (l - 64) % 128;
  }
  const View qv = View::contiguous(q.data(), DType::kF32, {1, L, 1, D});
  auto v32 = [&](std::vector<float>& x) { return View::contiguous(x.data(), DType::kF32, {1, L, 1, D}); };
  for (Encoding e : {Encoding::kRope2d, Encoding::kMrope, Encoding::kXpos})
    for (bool backward : {false, true}) {
      SCOPED_TRACE(std::string(encoding_info(e).name) + (backward ? " backward" : " forward"));
      AttentionParams p;
      p.encoding = e;
      p.causal = true;
      EncodingTensors t;
      EncodingGrads g;
      if (e == Encoding::kRope2d) {
        p.rope2d.variant = Rope2dVariant::kMixed;
        t.freqs = View::contiguous(freqs.data(), DType::kF64, {2, 1, D / 2});
        g.freqs = View::contiguous(dfreqs.data(), DType::kF64, {2, 1, D / 2});
        t.q_positions = t.k_positions = View::contiguous(pos2.data(), DType::kI64, {2, L});
      }
      if (e == Encoding::kMrope) {
        p.mrope.mrope_section = {8, 12, 12};
        t.q_positions = t.k_positions = View::contiguous(pos3.data(), DType::kI64, {3, L});
      }
      std::FILE* f = std::fopen("/proc/self/clear_refs", "w");  // VmHWM := VmRSS (Linux ≥ 4.0)
      const bool reset = f && std::fputs("5", f) >= 0;
      if (f) std::fclose(f);
      if (!reset) GTEST_SKIP() << "cannot reset the peak resident memory here";
      const long before = peak_kb();
      const Status st = backward ? attention_backward(p, qv, qv, qv, t, qv, v32(dq), v32(dk), v32(dv), g)
                                 : attention_forward(p, qv, qv, qv, t, v32(out));
      ASSERT_TRUE(st.ok()) << st.message();
      const long after = peak_kb();
      EXPECT_LT(after - before, 64 * 1024) << "peak grew by " << (after - before) << " kB";
    }
}

// No keys at all: the kernels write out = 0 and every gradient, parameter gradients included, as 0
// (not left unwritten), like the reference.
TEST(FastAttentionEdges, NoKeysWritesZeroGradients) {
  for (const Variant& var : variants()) {
    if (var.enc != Encoding::kKerple && var.enc != Encoding::kFire && var.enc != Encoding::kSandwich &&
        var.enc != Encoding::kT5 && var.name != "rope2d_mixed_half")
      continue;
    for (I M : {1, 3}) {  // M = 1: no distance at all (M + N − 1 = 0)
      SCOPED_TRACE(var.name + " M=" + std::to_string(M));
      Problem pr(var, {1, M, 0, 2, 1, 4}, false, 1800);
      std::vector<float> q(ix(M * 2 * 4), 0.5f), kv(1, 0.f), out(q.size(), 7.f), dq(q.size(), 7.f), dout(q.size(), 1.f);
      const View qv = View::contiguous(q.data(), DType::kF32, {1, M, 2, 4});
      const View kvv = View::contiguous(kv.data(), DType::kF32, {1, 0, 1, 4});
      ASSERT_TRUE(fused::attention_forward(pr.p, qv, kvv, kvv, pr.tensors(), View::contiguous(out.data(), DType::kF32, {1, M, 2, 4})).ok());
      for (float x : out) EXPECT_EQ(x, 0.f);
      Problem::Grads g = pr.grads(7.0);
      ASSERT_TRUE(fused::attention_backward(pr.p, qv, kvv, kvv, pr.tensors(), View::contiguous(dout.data(), DType::kF32, {1, M, 2, 4}),
                                            View::contiguous(dq.data(), DType::kF32, {1, M, 2, 4}), View{}, View{}, g.g).ok());
      for (float x : dq) EXPECT_EQ(x, 0.f);
      for (const Vec& b : g.bufs)
        for (double x : b) EXPECT_EQ(x, 0.0);
    }
  }
}

// The dispatcher: large enough problems run the fused kernel (bit for bit), small ones the reference,
// a decode step (M ≤ 16) the decode kernel (tests/test_attention_decode.cc).
TEST(FastAttentionDispatch, PublicEntryPointsPickTheKernelOrTheReference) {
  Variant var{"alibi", Encoding::kAlibi};
  for (I L : {I{17}, I{200}}) {
    Problem pr(var, {1, L, L, 2, 1, 64}, true, 1100);
    Tensor q(DType::kF32, randn(ix(L * 2 * 64), 1), pr.qshape());
    Tensor k(DType::kF32, randn(ix(L * 64), 2), pr.kshape());
    Tensor v(DType::kF32, randn(ix(L * 64), 3), pr.kshape());
    Tensor a(DType::kF32, pr.qshape()), b(DType::kF32, pr.qshape());
    ASSERT_TRUE(attention_forward(pr.p, q.view(), k.view(), v.view(), {}, a.view()).ok());
    const Status st = L == 17 ? reference::attention_forward(pr.p, q.view(), k.view(), v.view(), {}, b.view())
                             : fused::attention_forward(pr.p, q.view(), k.view(), v.view(), {}, b.view());
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(a.values(), b.values()) << "L = " << L;
  }
}

TEST(FastAttentionErrors, KernelsRefuseWhatTheyDoNotCover) {
  const I B = 1, L = 3, H = 1, D = 4;
  std::vector<float> q(ix(B * L * H * D), 0.5f), out(q.size());
  const View qv = View::contiguous(q.data(), DType::kF32, {B, L, H, D});
  const View ov = View::contiguous(out.data(), DType::kF32, {B, L, H, D});
  AttentionParams p;
  p.encoding = Encoding::kCope;
  std::vector<float> table(ix(4 * D), 0.1f);
  EncodingTensors t;
  t.table = View::contiguous(table.data(), DType::kF32, {4, D});
  // CoPE: refused until its kernel (attention_cope_cpu.cc) is built, then run.
  Status st = fused::attention_forward(p, qv, qv, qv, t, ov);
  if (fused::cope_fused()) {
    EXPECT_TRUE(st.ok()) << st.message();
  } else {
    EXPECT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_EQ(st.arg(), "encoding");
  }
  EXPECT_TRUE(attention_forward(p, qv, qv, qv, t, ov).ok());  // the dispatcher runs it either way

  p = AttentionParams{};
  st = fused::attention_forward(p, qv, qv, qv, {}, qv);  // in place over q
  EXPECT_EQ(st.arg(), "out");
  std::vector<double> q64(q.size(), 0.5), o64(q.size());
  st = fused::attention_forward(p, View::contiguous(q64.data(), DType::kF64, {B, L, H, D}),
                                View::contiguous(q64.data(), DType::kF64, {B, L, H, D}),
                                View::contiguous(q64.data(), DType::kF64, {B, L, H, D}), {},
                                View::contiguous(o64.data(), DType::kF64, {B, L, H, D}));
  EXPECT_EQ(st.arg(), "encoding");
  // validation is the reference's: a bad shape names its argument
  st = fused::attention_forward(p, qv, View::contiguous(q.data(), DType::kF32, {B, L, H, D - 1}), qv, {}, ov);
  EXPECT_EQ(st.arg(), "k");
}

}  // namespace
}  // namespace posenc
