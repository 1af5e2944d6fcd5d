// The decode kernel, posenc::decode:: (src/attention/attention_decode.cc), against the plain reference
// posenc::reference::attention_forward (out and lse), for every encoding it covers (nope; rope in both
// layouts, partial, xpos and mrope with keys_rotated; alibi symmetric, with slopes, nonsymmetric,
// learned; t5 bi- and unidirectional; kerple log and power; sandwich; fire; xl; cope clamped on most
// keys of a row and never clamped; rope2d mixed in both layouts, on unrotated keys) × float32,
// bfloat16, float16 × M ∈ {1, 3, 16} × grouped heads (Hq, Hkv) ∈ {(8, 2), (4, 1)} × causal or not × N = 601
// (not a multiple of the kernel's key blocks; two key parts at two threads when Hkv = 1) × 1 and
// 2 threads; head groups G = 1, 3, 6 and D = 150 on nope and nonsymmetric ALiBi; three batch rows on
// nope, xl, cope and rope2d mixed; rope2d mixed's kept tables over changing positions; every SIMD
// target on one case per encoding and dtype; keys_rotated against rotating the cache with
// rope_forward, its refusals and its text key; the dispatcher's routing; non-finite inputs left to
// the tile kernel.
//
// The reference sees exactly what the kernel reads: inputs are rounded to the dtype first.
// Tolerances as tests/attention_fast_testing.h's: |got − want| ≤ atol·max|want| + rtol·|want|.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "attention/attention_decode.h"
#include "attention/attention_decode_xl.h"
#include "attention/attention_fused.h"
#include "core/param_text.h"
#include "enc/absolute/sinusoidal/sinusoidal_math.h"
#include "posenc/attention.h"
#include "posenc/half.h"
#include "posenc/rope.h"
#include "posenc/threads.h"
#include "testing.h"
#include "typed_tensor.h"
#include "decode_testing.h"

namespace posenc {
namespace {

using namespace decode_testing;  // NOLINT: the shared problems and check()
using ::posenc::testing::AllClose;
using ::posenc::testing::randn;

class Decode : public ::testing::TestWithParam<Variant> {};

TEST_P(Decode, MatchesReference) {
  std::uint64_t seed = 100;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (I M : {1, 3, 16})
      for (auto [Hq, Hkv] : {std::pair<I, I>{8, 2}, {4, 1}})
        for (bool causal : {false, true})
          for (int threads : {1, 2}) check(GetParam(), dt, M, Hq, Hkv, causal, 601, threads, seed += 20);
}

INSTANTIATE_TEST_SUITE_P(Decode, Decode, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) { return i.param.name; });

// Every SIMD target compiled and supported here, one case per encoding and dtype (D = 94: on every
// target the kernel's widest register blocks over D, a single vector and a tail); rope2d mixed also
// with one query row and G = 6 (its heads taken several at a time, then one by one).
TEST(DecodeTargets, EveryTargetMatchesReference) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const Variant& var : variants())
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        check(var, dt, 2, 4, 2, true, 301, 2, 7, 94);
        if (var.enc == Encoding::kRope2d) check(var, dt, 1, 12, 2, false, 301, 1, 9, 94);
      }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Query-head groups that the kernel's row blocks do not divide (G = 1, 3, 6; nonsymmetric ALiBi's
// halves also split a group) and wide heads (D = 150: two 64-wide blocks, a vector and a tail on
// AVX-512; rope2d mixed: rotary pairs in vectors and a tail, lanes past r), every dtype, M = 1 and
// 5, causal or not.
TEST(DecodeShapes, HeadGroupsAndWideHeads) {
  std::uint64_t seed = 900;
  for (const Variant& var : {Variant{"nope", Encoding::kNope}, Variant{"alibi_nonsymmetric", Encoding::kAlibi},
                             Variant{"rope2d_mixed_half", Encoding::kRope2d},
                             Variant{"rope2d_mixed_interleaved_partial", Encoding::kRope2d}})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (auto [Hq, Hkv] : {std::pair<I, I>{2, 2}, {6, 2}, {6, 1}})
        for (I M : {1, 5})
          for (bool causal : {false, true}) check(var, dt, M, Hq, Hkv, causal, 601, 1, seed += 20, 150);
}

// Several batch rows: a task per row (B ≥ threads) or per part of a row's keys (3 rows at 4
// threads: 2 parts each), each row's queries, xl's rotated rows and cope's counts its own.
TEST(DecodeShapes, BatchRows) {
  std::uint64_t seed = 1300;
  for (const Variant& var : {Variant{"nope", Encoding::kNope}, Variant{"xl", Encoding::kXL},
                             Variant{"cope", Encoding::kCope}, Variant{"cope_wide", Encoding::kCope},
                             Variant{"rope2d_mixed_half", Encoding::kRope2d}})
    for (DType dt : {DType::kF32, DType::kBF16})
      for (int threads : {1, 2, 4}) check(var, dt, 2, 4, 2, true, 601, threads, seed += 20, 40, 3);
}

// rope2d mixed (p, frequencies f [2, Hq, r/2], positions qp [2, M], kp [2, N], B = 1): the decode
// kernel on float32 q, k, v against the reference in double.
void expect_mixed_matches(const AttentionParams& p, Vec f, std::vector<std::int64_t> qp, std::vector<std::int64_t> kp,
                          std::vector<float> q, std::vector<float> k, std::vector<float> v, I M,
                          I N, I Hq, I Hkv, I D) {
  const I B = 1, r = p.rope2d.rope.rotary_dim;
  std::vector<float> out(q.size());
  EncodingTensors t;
  t.freqs = View::contiguous(f.data(), DType::kF64, {2, Hq, r / 2});
  t.q_positions = View::contiguous(qp.data(), DType::kI64, {2, M});
  t.k_positions = View::contiguous(kp.data(), DType::kI64, {2, N});
  const Status sd = decode::attention_forward(p, testing::V(q, {B, M, Hq, D}), testing::V(k, {B, N, Hkv, D}),
                                              testing::V(v, {B, N, Hkv, D}), t, testing::V(out, {B, M, Hq, D}));
  ASSERT_TRUE(sd.ok()) << sd.message();
  std::vector<double> q64(q.begin(), q.end()), k64(k.begin(), k.end()), v64(v.begin(), v.end()), want(q.size());
  ASSERT_TRUE(reference::attention_forward(p, testing::V(q64, {B, M, Hq, D}), testing::V(k64, {B, N, Hkv, D}),
                                           testing::V(v64, {B, N, Hkv, D}), t, testing::V(want, {B, M, Hq, D})).ok());
  EXPECT_TRUE(AllClose(Vec(out.begin(), out.end()), want, 2e-6 * amax(want), 2e-5));
}

// rope2d mixed's kept tables: steps of one frequency set whose key positions grow past the kept
// range on either side (the tables grown), shrink inside it (kept), and a second frequency set
// (formed again), each step against the reference.
TEST(DecodeRope2dMixed, KeptTablesFollowThePositions) {
  const I M = 1, Hq = 4, Hkv = 2, D = 24, r = 24, N = 300;
  AttentionParams p;
  p.encoding = Encoding::kRope2d;
  p.rope2d.variant = Rope2dVariant::kMixed;
  p.rope2d.rope.layout = RopeLayout::kHalf;
  p.rope2d.rope.rotary_dim = r;
  const Vec fa = randn(ix(2 * Hq * r / 2), 31, 0.7), fb = randn(ix(2 * Hq * r / 2), 32, 0.7);
  const std::vector<float> q = testing::to_float(randn(ix(M * Hq * D), 33)),
                           k = testing::to_float(randn(ix(N * Hkv * D), 34)),
                           v = testing::to_float(randn(ix(N * Hkv * D), 35));
  // (x0, y0, grid width): keys at x0 + j % w, y0 + j / w; the query at the cell after them
  const struct { I x0, y0, w; const Vec* f; } steps[] = {
      {10, 10, 20, &fa}, {10, 10, 30, &fa}, {3, 5, 30, &fa}, {0, 0, 31, &fa}, {4, 6, 10, &fa}, {5, 9, 17, &fb}};
  for (const auto& st : steps) {
    SCOPED_TRACE("x0=" + std::to_string(st.x0) + " y0=" + std::to_string(st.y0) + " w=" + std::to_string(st.w));
    std::vector<std::int64_t> kp(ix(2 * N)), qp(2);
    for (I j = 0; j < N; ++j) kp[ix(j)] = st.x0 + j % st.w, kp[ix(N + j)] = st.y0 + j / st.w;
    qp[0] = st.x0 + N % st.w, qp[1] = st.y0 + N / st.w;
    expect_mixed_matches(p, *st.f, qp, kp, q, k, v, M, N, Hq, Hkv, D);
  }
}

// rope2d mixed with rotary widths of 64 and 128, which the kernel compiles with the width known (half
// layout r = D = 64 and 128; interleaved r = D/2 = 32, 64 and 128), on every SIMD target, every dtype, one
// query row (the four heads of a kv head together) and four (each head's rows together).
TEST(DecodeRope2dMixed, RotaryWidthsOf64And128) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::uint64_t seed = 1700;
    for (const Variant& var : {Variant{"rope2d_mixed_half", Encoding::kRope2d},
                               Variant{"rope2d_mixed_interleaved_partial", Encoding::kRope2d}})
      for (I D : {64, 128, 256}) {
        if (var.name == "rope2d_mixed_half" && D == 256) continue;
        SCOPED_TRACE("D=" + std::to_string(D));
        for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
          for (I M : {1, 4}) check(var, dt, M, 8, 2, M > 1, 203, 1, seed += 20, D);
      }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// rope2d mixed with keys in no order (x and y drawn at random, so that runs sharing y and x's high
// part are short and y comes back), both layouts, one and three query rows, against the reference.
TEST(DecodeRope2dMixed, ScatteredPositions) {
  const I Hq = 8, Hkv = 2, D = 40, N = 400;
  std::mt19937_64 rng(5);
  std::vector<std::int64_t> kp(ix(2 * N));
  for (I j = 0; j < N; ++j) kp[ix(j)] = static_cast<std::int64_t>(rng() % 70), kp[ix(N + j)] = static_cast<std::int64_t>(rng() % 9);
  for (RopeLayout layout : {RopeLayout::kHalf, RopeLayout::kInterleaved})
    for (I M : {1, 3}) {
      SCOPED_TRACE(std::string(layout == RopeLayout::kHalf ? "half" : "interleaved") + " M=" + std::to_string(M));
      AttentionParams p;
      p.encoding = Encoding::kRope2d;
      p.rope2d.variant = Rope2dVariant::kMixed;
      p.rope2d.rope.layout = layout;
      p.rope2d.rope.rotary_dim = layout == RopeLayout::kHalf ? D : 36;
      const I r = p.rope2d.rope.rotary_dim;
      std::vector<std::int64_t> qp(ix(2 * M));
      for (I i = 0; i < M; ++i) qp[ix(i)] = 30 + i, qp[ix(M + i)] = 4;
      expect_mixed_matches(p, randn(ix(2 * Hq * r / 2), 41, 0.7), qp, kp, testing::to_float(randn(ix(M * Hq * D), 42)),
                           testing::to_float(randn(ix(N * Hkv * D), 43)), testing::to_float(randn(ix(N * Hkv * D), 44)),
                           M, N, Hq, Hkv, D);
    }
}

// xl's windows: after seek(k), Ỹ turned by the window's angles and dotted with s(m) equals Ỹ·s(t0 + m)
// in double, t0 = j0 + k·nt, out to positions near 2^20 (windows stepped one by one in double).
TEST(DecodeXl, WindowsTurnTheRowsAsTheKeysMove) {
  const I X = 128, n = 3, nt = 256, j0 = 4321;
  const Vec y64 = randn(ix(X * n), 51);
  const std::vector<float> yt = testing::to_float(y64);
  decode_impl::XlWindows win(X, nt, j0, 10000.0);
  std::vector<float> out(ix(X * n));
  for (I k : {I{0}, I{1}, I{2}, I{9}, I{300}, I{4000}}) {
    win.seek(k);
    win.turn(yt.data(), n, out.data());
    for (I m : {I{0}, I{1}, I{77}, nt - 1})
      for (I x = 0; x < n; ++x) {
        double got = 0, want = 0, mag = 0;
        for (I c = 0; c < X; ++c) {
          got += double(out[ix(c * n + x)]) * sinusoid::value(double(m), c, X, 10000.0);
          want += double(yt[ix(c * n + x)]) * sinusoid::value(double(j0 + k * nt + m), c, X, 10000.0);
          mag += std::abs(double(yt[ix(c * n + x)]));
        }
        EXPECT_NEAR(got, want, 1e-6 * mag) << "k " << k << " m " << m << " row " << x;
      }
  }
}

// keys_rotated: a cache rotated by rope_forward at the keys' positions, with q rotated by the call,
// gives what the call gives when it rotates both (reference and decode kernel alike).
TEST(DecodeKeysRotated, EqualsRotatingTheCache) {
  const I B = 1, M = 2, N = 333, Hq = 4, Hkv = 2, D = 32;
  for (RopeLayout layout : {RopeLayout::kHalf, RopeLayout::kInterleaved}) {
    AttentionParams p;
    p.encoding = Encoding::kRope;
    p.rope.layout = layout;
    p.causal = true;
    p.k_offset = 10;
    std::vector<double> q = randn(ix(B * M * Hq * D), 1), k = randn(ix(B * N * Hkv * D), 2),
                        v = randn(ix(B * N * Hkv * D), 3), kr(k.size());
    ASSERT_TRUE(rope_forward(p.rope, testing::V(k, {B, N, Hkv, D}), Positions{View{}, p.k_offset},
                             testing::V(kr, {B, N, Hkv, D})).ok());
    Vec want(q.size()), got(q.size()), fast(q.size());
    ASSERT_TRUE(reference::attention_forward(p, testing::V(q, {B, M, Hq, D}), testing::V(k, {B, N, Hkv, D}),
                                             testing::V(v, {B, N, Hkv, D}), {}, testing::V(want, {B, M, Hq, D})).ok());
    p.keys_rotated = true;
    ASSERT_TRUE(reference::attention_forward(p, testing::V(q, {B, M, Hq, D}), testing::V(kr, {B, N, Hkv, D}),
                                             testing::V(v, {B, N, Hkv, D}), {}, testing::V(got, {B, M, Hq, D})).ok());
    EXPECT_TRUE(AllClose(got, want, 1e-12, 1e-10));
    std::vector<float> qf(q.begin(), q.end()), krf(kr.begin(), kr.end()), vf(v.begin(), v.end()), of(q.size());
    ASSERT_TRUE(decode::attention_forward(p, testing::V(qf, {B, M, Hq, D}), testing::V(krf, {B, N, Hkv, D}),
                                          testing::V(vf, {B, N, Hkv, D}), {}, testing::V(of, {B, M, Hq, D})).ok());
    EXPECT_TRUE(AllClose(Vec(of.begin(), of.end()), want, 2e-6 * amax(want), 2e-5));
  }
}

// The backward with keys_rotated gives the gradient of the rotated keys: rope_backward of it is the
// dk of the call that rotates k itself; dq and dv are that call's. The tile kernel's backward agrees.
TEST(DecodeKeysRotated, BackwardGivesTheRotatedKeysGradient) {
  const I B = 1, M = 40, N = 300, Hq = 4, Hkv = 2, D = 16;
  AttentionParams p;
  p.encoding = Encoding::kRope;
  p.causal = true;
  p.k_offset = 3;
  const std::vector<I> qs = {B, M, Hq, D}, ks = {B, N, Hkv, D};
  auto v64 = [](std::vector<double>& x, const std::vector<I>& s) { return View::contiguous(x.data(), DType::kF64, s); };
  std::vector<double> q = randn(ix(B * M * Hq * D), 1), k = randn(ix(B * N * Hkv * D), 2),
                      v = randn(ix(B * N * Hkv * D), 3), dout = randn(q.size(), 4), kr(k.size());
  const Positions kpos{View{}, p.k_offset};
  ASSERT_TRUE(rope_forward(p.rope, v64(k, ks), kpos, v64(kr, ks)).ok());
  Vec dq1(q.size()), dk1(k.size()), dv1(v.size()), dq2(q.size()), dk2(k.size()), dv2(v.size()), dk2u(k.size());
  ASSERT_TRUE(reference::attention_backward(p, v64(q, qs), v64(k, ks), v64(v, ks), {}, v64(dout, qs), v64(dq1, qs),
                                            v64(dk1, ks), v64(dv1, ks), {}).ok());
  p.keys_rotated = true;
  ASSERT_TRUE(reference::attention_backward(p, v64(q, qs), v64(kr, ks), v64(v, ks), {}, v64(dout, qs),
                                            v64(dq2, qs), v64(dk2, ks), v64(dv2, ks), {}).ok());
  ASSERT_TRUE(rope_backward(p.rope, v64(dk2, ks), kpos, v64(dk2u, ks)).ok());
  EXPECT_TRUE(AllClose(dq2, dq1, 1e-10, 1e-9)) << "dq";
  EXPECT_TRUE(AllClose(dv2, dv1, 1e-10, 1e-9)) << "dv";
  EXPECT_TRUE(AllClose(dk2u, dk1, 1e-10, 1e-9)) << "dk";
  std::vector<float> qf(q.begin(), q.end()), krf(kr.begin(), kr.end()), vf(v.begin(), v.end()),
      df(dout.begin(), dout.end()), dq(q.size()), dk(k.size()), dv(v.size());
  auto v32 = [](std::vector<float>& x, const std::vector<I>& s) { return View::contiguous(x.data(), DType::kF32, s); };
  ASSERT_TRUE(fused::attention_backward(p, v32(qf, qs), v32(krf, ks), v32(vf, ks), {}, v32(df, qs), v32(dq, qs),
                                        v32(dk, ks), v32(dv, ks), {}).ok());
  EXPECT_TRUE(AllClose(Vec(dq.begin(), dq.end()), dq2, 2e-5 * amax(dq2), 1e-4)) << "fused dq";
  EXPECT_TRUE(AllClose(Vec(dk.begin(), dk.end()), dk2, 2e-5 * amax(dk2), 1e-4)) << "fused dk";
  EXPECT_TRUE(AllClose(Vec(dv.begin(), dv.end()), dv2, 2e-5 * amax(dv2), 1e-4)) << "fused dv";
}

// keys_rotated is refused where it means nothing, naming the argument.
TEST(DecodeKeysRotated, RefusedOutsideTheRotaryEncodings) {
  std::vector<float> q(8, 0.5f), out(8);
  AttentionParams p;
  p.keys_rotated = true;
  const View qv = testing::V(q, {1, 2, 1, 4}), ov = testing::V(out, {1, 2, 1, 4});
  const Status st = attention_forward(p, qv, qv, qv, {}, ov);
  EXPECT_EQ(st.arg(), "keys_rotated");
  p.encoding = Encoding::kRope2d;
  p.rope2d.variant = Rope2dVariant::kMixed;
  EXPECT_EQ(reference::attention_forward(p, qv, qv, qv, {}, ov).arg(), "keys_rotated");
}

// The C ABI's and Python's key vocabulary sets it from text.
TEST(DecodeKeysRotated, KeyFromText) {
  AttentionParams p;
  p.encoding = Encoding::kRope;
  ASSERT_TRUE(text::set_attention_param(&p, "keys_rotated", "true").ok());
  EXPECT_TRUE(p.keys_rotated);
  ASSERT_TRUE(text::set_attention_param(&p, "keys_rotated", "false").ok());
  EXPECT_FALSE(p.keys_rotated);
  EXPECT_EQ(text::set_attention_param(&p, "keys_rotated", "maybe").arg(), "keys_rotated");
}

// The public dispatcher sends a decode step to the decode kernel (bit for bit), also below the
// size where it would run the reference, and a NaN in k to a path that gives the reference's NaN row.
TEST(DecodeDispatch, PublicEntryPointRunsTheDecodeKernel) {
  const I M = 1, N = 40, Hq = 4, Hkv = 2, D = 16;
  Problem pr({"alibi", Encoding::kAlibi}, Hq, D, true, 3);
  std::vector<float> q = testing::to_float(randn(ix(M * Hq * D), 1)), k = testing::to_float(randn(ix(N * Hkv * D), 2)),
                     v = testing::to_float(randn(ix(N * Hkv * D), 3)), a(q.size()), b(q.size());
  const View qv = testing::V(q, {1, M, Hq, D}), kv = testing::V(k, {1, N, Hkv, D}), vv = testing::V(v, {1, N, Hkv, D});
  ASSERT_TRUE(attention_forward(pr.p, qv, kv, vv, {}, testing::V(a, {1, M, Hq, D})).ok());
  ASSERT_TRUE(decode::attention_forward(pr.p, qv, kv, vv, {}, testing::V(b, {1, M, Hq, D})).ok());
  EXPECT_EQ(a, b);
  k[ix(7 * Hkv * D + 3)] = std::numeric_limits<float>::quiet_NaN();  // key 7 of kv head 0
  EXPECT_EQ(decode::attention_forward(pr.p, qv, kv, vv, {}, testing::V(b, {1, M, Hq, D})).arg(), "k");
  ASSERT_TRUE(attention_forward(pr.p, qv, kv, vv, {}, testing::V(a, {1, M, Hq, D})).ok());
  for (I h = 0; h < Hq; ++h)
    for (I e = 0; e < D; ++e) EXPECT_EQ(std::isnan(a[ix(h * D + e)]), h < 2) << h;
}

// A batch of 0 rows (shapes the decode kernel would take otherwise): nothing to do, no error, at
// every thread count.
TEST(DecodeShapes, EmptyBatch) {
  const I N = 8, Hq = 4, Hkv = 2, D = 16;
  for (const Variant& var : {Variant{"nope", Encoding::kNope}, Variant{"alibi", Encoding::kAlibi}})
    for (I M : {1, 16})
      for (int threads : {1, 2}) {
        SCOPED_TRACE(var.name + " M = " + std::to_string(M) + " threads " + std::to_string(threads));
        const ThreadScope scope(threads);
        Problem pr(var, Hq, D, true, 5);
        std::vector<float> none(1, 0.f), out(1, 7.f);
        std::vector<double> lse(1, 7.0);
        const Status st = attention_forward(pr.p, View::contiguous(none.data(), DType::kF32, {0, M, Hq, D}),
                                            View::contiguous(none.data(), DType::kF32, {0, N, Hkv, D}),
                                            View::contiguous(none.data(), DType::kF32, {0, N, Hkv, D}), {},
                                            View::contiguous(out.data(), DType::kF32, {0, M, Hq, D}),
                                            View::contiguous(lse.data(), DType::kF64, {0, Hq, M}));
        EXPECT_TRUE(st.ok()) << st.message();
        EXPECT_EQ(out[0], 7.f);
        EXPECT_EQ(lse[0], 7.0);
      }
}

}  // namespace
}  // namespace posenc
