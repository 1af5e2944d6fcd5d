// Attention with positional encodings: the reference (src/attention/attention_ref.cc) against
//   * the naive computation of attention_testing.h, in float64 and float32, and through strided views;
//   * the public building blocks rope_forward, alibi_bias, t5_bias, kerple_bias, sandwich_bias and
//     fire_bias (AttentionBuildingBlocks), and RoPE's schemes against rotated inputs;
//   * central differences of a random-projection loss for every backward output (AttentionGrad).
// Properties: test_attention_properties.cc; bad inputs: test_attention_errors.cc.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "posenc/attention.h"
#include "posenc/bias.h"
#include "posenc/rope.h"
#include "attention_testing.h"

namespace posenc {
namespace {

using namespace ::posenc::attention_testing;  // NOLINT: the fixtures of these tests

// ==== forward against the naive computation ======================================================
class AttentionForward : public ::testing::TestWithParam<Variant> {};

TEST_P(AttentionForward, MatchesNaiveFloat64) {
  const Variant& var = GetParam();
  struct Shape { I B, M, N, Hq, Hkv, D; std::optional<I> q_off; I k_off; std::optional<double> scale; };
  const Shape shapes[] = {
      {2, 5, 5, 2, 2, 4, std::nullopt, 0, std::nullopt},  // prefill
      {2, 3, 6, 4, 2, 6, std::nullopt, 0, 0.8},           // M < N, GQA, a given scale
      {1, 1, 6, 4, 2, 4, std::nullopt, 0, std::nullopt},  // decode
      {2, 4, 5, 4, 1, 4, 7, 3, std::nullopt},             // offsets, multi-query
      {1, 6, 3, 2, 2, 4, std::nullopt, 0, 0.3},           // M > N: the first queries precede every key
  };
  std::uint64_t seed = 100;
  for (const Shape& s : shapes)
    for (bool causal : {false, true}) {
      Case c = make_case(var, s.B, s.M, s.N, s.Hq, s.Hkv, s.D, causal, seed++);
      c.p.q_offset = s.q_off;
      c.p.k_offset = s.k_off;
      c.p.scale = s.scale;
      SCOPED_TRACE(trace(var, causal) + " M=" + std::to_string(s.M) + " N=" + std::to_string(s.N));
      const Fwd got = forward(c);
      ASSERT_TRUE(got.st.ok()) << got.st.message();
      const Fwd want = naive(c);
      EXPECT_TRUE(AllClose(got.out, want.out, 1e-12, 1e-10));
      EXPECT_TRUE(AllClose(got.lse, want.lse, 1e-12, 1e-10));
    }
}

TEST_P(AttentionForward, MatchesNaiveFloat32) {
  const Variant& var = GetParam();
  for (bool causal : {false, true}) {
    SCOPED_TRACE(trace(var, causal));
    Case c = make_case(var, 2, 3, 5, 4, 2, 4, causal, 7);
    // Round the inputs to float32 first: the oracle then sees exactly what the library reads.
    std::vector<float> qf = to_float(c.q), kf = to_float(c.k), vf = to_float(c.v);
    c.q.assign(qf.begin(), qf.end());
    c.k.assign(kf.begin(), kf.end());
    c.v.assign(vf.begin(), vf.end());
    std::vector<float> out(c.q.size());
    Vec lse(ix(c.B * c.Hq * c.M));
    const Status st = attention_forward(c.p, V(qf, {2, 3, 4, 4}), V(kf, {2, 5, 2, 4}), V(vf, {2, 5, 2, 4}),
                                        c.tensors(), V(out, {2, 3, 4, 4}), V(lse, {2, 4, 3}));
    ASSERT_TRUE(st.ok()) << st.message();
    const Fwd want = naive(c);
    EXPECT_TRUE(AllClose(Vec(out.begin(), out.end()), want.out, 1e-6, 1e-6));
    // lse is float64; at M ≤ 16 the decode kernel sums in float32 (docs/attention.md)
    EXPECT_TRUE(AllClose(lse, want.lse, 1e-6, 1e-6));

    // backward in float32 equals backward in float64 on the same (rounded) inputs
    const Vec dout = randn(c.q.size(), 8);
    std::vector<float> doutf = to_float(dout), dq(qf.size()), dk(kf.size()), dv(vf.size());
    const Status sb = attention_backward(c.p, V(qf, {2, 3, 4, 4}), V(kf, {2, 5, 2, 4}),
                                         V(vf, {2, 5, 2, 4}), c.tensors(), V(doutf, {2, 3, 4, 4}),
                                         V(dq, {2, 3, 4, 4}), V(dk, {2, 5, 2, 4}), V(dv, {2, 5, 2, 4}), {});
    ASSERT_TRUE(sb.ok()) << sb.message();
    Vec d64(doutf.begin(), doutf.end());
    const Bwd want_b = backward(c, d64);
    ASSERT_TRUE(want_b.st.ok()) << want_b.st.message();
    EXPECT_TRUE(AllClose(Vec(dq.begin(), dq.end()), want_b.dq, 1e-6, 1e-5));
    EXPECT_TRUE(AllClose(Vec(dk.begin(), dk.end()), want_b.dk, 1e-6, 1e-5));
    EXPECT_TRUE(AllClose(Vec(dv.begin(), dv.end()), want_b.dv, 1e-6, 1e-5));
  }
}

// q heads-major in memory ([B, Hq, M, D] storage seen as [B, M, Hq, D]); k and v padded along D;
// out written through a padded, head-transposed view whose padding must stay untouched.
TEST_P(AttentionForward, StridedViews) {
  const Variant& var = GetParam();
  const I B = 2, M = 3, N = 4, Hq = 4, Hkv = 2, D = 4, P = 3;  // P: padding per k/v row
  Case c = make_case(var, B, M, N, Hq, Hkv, D, /*causal=*/true, 11);
  Vec qs(ix(B * Hq * M * D));
  for (I b = 0; b < B; ++b)
    for (I i = 0; i < M; ++i)
      for (I h = 0; h < Hq; ++h)
        for (I d = 0; d < D; ++d) qs[ix(((b * Hq + h) * M + i) * D + d)] = c.q[ix(((b * M + i) * Hq + h) * D + d)];
  Vec ks(ix(B * N * Hkv * (D + P)), 1e300), vs(ks.size(), 1e300);
  for (I r = 0; r < B * N * Hkv; ++r)
    for (I d = 0; d < D; ++d) ks[ix(r * (D + P) + d)] = c.k[ix(r * D + d)], vs[ix(r * (D + P) + d)] = c.v[ix(r * D + d)];
  auto view = [](Vec& buf, std::array<I, 4> shape, std::array<I, 4> strides) {
    View w;
    w.data = buf.data();
    w.dtype = DType::kF64;
    w.ndim = 4;
    for (int a = 0; a < 4; ++a) w.shape[ix(a)] = shape[ix(a)], w.strides[ix(a)] = strides[ix(a)];
    return w;
  };
  const View qv = view(qs, {B, M, Hq, D}, {Hq * M * D, D, M * D, 1});
  const View kv = view(ks, {B, N, Hkv, D}, {N * Hkv * (D + P), Hkv * (D + P), D + P, 1});
  const View vv = view(vs, {B, N, Hkv, D}, {N * Hkv * (D + P), Hkv * (D + P), D + P, 1});
  const double guard = -12345.0;
  Vec outs(ix(B * Hq * M * (D + 1)), guard);  // [B, Hq, M, D + 1] storage
  const View ov = view(outs, {B, M, Hq, D}, {Hq * M * (D + 1), D + 1, M * (D + 1), 1});
  const Status st = attention_forward(c.p, qv, kv, vv, c.tensors(), ov);
  ASSERT_TRUE(st.ok()) << st.message();
  const Fwd want = naive(c);
  Vec got(want.out.size());
  for (I b = 0; b < B; ++b)
    for (I i = 0; i < M; ++i)
      for (I h = 0; h < Hq; ++h) {
        for (I d = 0; d < D; ++d)
          got[ix(((b * M + i) * Hq + h) * D + d)] = outs[ix(((b * Hq + h) * M + i) * (D + 1) + d)];
        EXPECT_EQ(outs[ix(((b * Hq + h) * M + i) * (D + 1) + D)], guard) << "padding overwritten";
      }
  EXPECT_TRUE(AllClose(got, want.out, 1e-12, 1e-10));

  // backward through the same strided views equals backward on contiguous copies
  const Vec dout = randn(c.q.size(), 12);
  Vec dqs(qs.size(), guard), dks(ks.size(), guard), dvs(ks.size(), guard);
  Vec dout_copy = dout;
  const Status sb = attention_backward(
      c.p, qv, kv, vv, c.tensors(), V(dout_copy, {B, M, Hq, D}), view(dqs, {B, M, Hq, D}, {Hq * M * D, D, M * D, 1}),
      view(dks, {B, N, Hkv, D}, {N * Hkv * (D + P), Hkv * (D + P), D + P, 1}),
      view(dvs, {B, N, Hkv, D}, {N * Hkv * (D + P), Hkv * (D + P), D + P, 1}), {});
  ASSERT_TRUE(sb.ok()) << sb.message();
  const Bwd want_b = backward(c, dout);
  Vec gq(c.q.size()), gk(c.k.size()), gv(c.v.size());
  for (I b = 0; b < B; ++b)
    for (I i = 0; i < M; ++i)
      for (I h = 0; h < Hq; ++h)
        for (I d = 0; d < D; ++d) gq[ix(((b * M + i) * Hq + h) * D + d)] = dqs[ix(((b * Hq + h) * M + i) * D + d)];
  for (I r = 0; r < B * N * Hkv; ++r) {
    for (I d = 0; d < D; ++d) gk[ix(r * D + d)] = dks[ix(r * (D + P) + d)], gv[ix(r * D + d)] = dvs[ix(r * (D + P) + d)];
    for (I d = D; d < D + P; ++d) {
      EXPECT_EQ(dks[ix(r * (D + P) + d)], guard);
      EXPECT_EQ(dvs[ix(r * (D + P) + d)], guard);
    }
  }
  EXPECT_TRUE(AllClose(gq, want_b.dq, 1e-12, 1e-10));
  EXPECT_TRUE(AllClose(gk, want_b.dk, 1e-12, 1e-10));
  EXPECT_TRUE(AllClose(gv, want_b.dv, 1e-12, 1e-10));
}

INSTANTIATE_TEST_SUITE_P(Attention, AttentionForward, ::testing::ValuesIn(all_variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) { return i.param.name; });

// ==== gradients against central differences =====================================================
// loss = Σ proj ⊙ out (a random projection: a plain sum would hide permuted gradients).
class AttentionGrad : public ::testing::TestWithParam<Variant> {};

TEST_P(AttentionGrad, CentralDifferences) {
  const Variant& var = GetParam();
  for (bool causal : {false, true}) {
    SCOPED_TRACE(trace(var, causal));
    {  // GQA, M < N, offsets
      Case c = make_case(var, 2, 4, 6, 4, 2, 6, causal, 21);
      c.p.q_offset = 3;
      c.p.k_offset = 1;
      c.p.scale = 0.6;
      c.R = 6;
      fill(&c, 21);
      check_all_grads(c, 22);
    }
    {  // self-attention, one kv head per query head, default offsets
      Case c = make_case(var, 1, 5, 5, 2, 2, 4, causal, 31);
      check_all_grads(c, 32);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, AttentionGrad, ::testing::ValuesIn(all_variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) { return i.param.name; });

// ==== the public building blocks: the same attention composed from rope_forward / alibi_bias /
// t5_bias and a plain attention ===================================================================
TEST(AttentionBuildingBlocks, RopeEqualsRotatedInputsWithoutPositions) {
  for (const Variant& var : variants_of({Encoding::kRope}))
    for (bool causal : {false, true}) {
      SCOPED_TRACE(trace(var, causal));
      Case c = make_case(var, 2, 3, 5, 4, 2, 6, causal, 41);
      c.p.q_offset = 9;
      c.p.k_offset = 4;
      const Fwd got = forward(c);
      ASSERT_TRUE(got.st.ok()) << got.st.message();
      Case plain = c;
      plain.p.encoding = Encoding::kNope;
      ASSERT_TRUE(rope_forward(c.p.rope, V(c.q, {2, 3, 4, 6}), Positions{View{}, 9}, V(plain.q, {2, 3, 4, 6})).ok());
      ASSERT_TRUE(rope_forward(c.p.rope, V(c.k, {2, 5, 2, 6}), Positions{View{}, 4}, V(plain.k, {2, 5, 2, 6})).ok());
      const Fwd want = forward(plain);
      EXPECT_TRUE(AllClose(got.out, want.out, 1e-12, 1e-10));
      EXPECT_TRUE(AllClose(got.lse, want.lse, 1e-12, 1e-10));
    }
}

// RoPE's frequency schemes (rope.h) inside attention: the rotation is the elementwise one with the
// call's length max(q_offset + M, k_offset + N) (given to rope_forward as seq_len here), gradients
// match central differences, and a query shard given the whole call's seq_len computes its rows.
std::vector<std::pair<std::string, RopeParams>> rope_schemes_r6() {
  std::vector<std::pair<std::string, RopeParams>> out;
  RopeParams p;
  p.rope_type = RopeType::kYarn;
  p.factor = 4;
  p.original_max_position = 8;
  p.beta_fast = 2;
  out.push_back({"yarn", p});
  p = RopeParams{};
  p.rope_type = RopeType::kDynamic;
  p.factor = 2;
  p.original_max_position = 4;
  out.push_back({"dynamic", p});
  p = RopeParams{};
  p.rope_type = RopeType::kLongrope;
  p.factor = 16;
  p.original_max_position = 6;
  p.short_factor = {1, 1.5, 2};
  p.long_factor = {1, 8, 40};
  out.push_back({"longrope", p});
  p = RopeParams{};
  p.rope_type = RopeType::kLlama3;
  p.factor = 8;
  p.original_max_position = 16;
  out.push_back({"llama3", p});
  p = RopeParams{};
  p.angles = RopeAngles::kHf;
  p.layout = RopeLayout::kHalf;
  p.freq_factors = {1, 0.5, 0.25};
  p.attention_factor = 1.2;
  out.push_back({"hf_freq_factors_attention_factor", p});
  p = RopeParams{};
  p.rope_type = RopeType::kLinear;
  p.factor = 3;
  p.layout = RopeLayout::kHalf;
  out.push_back({"linear", p});
  return out;
}

TEST(AttentionRopeSchemes, EqualRotatedInputsGradientsAndShards) {
  const Variant var{"rope", Encoding::kRope};
  for (const auto& [name, rp] : rope_schemes_r6())
    for (bool causal : {false, true}) {
      SCOPED_TRACE(name + (causal ? " causal" : " full"));
      Case c = make_case(var, 2, 3, 5, 4, 2, 6, causal, 61);
      c.p.rope = rp;
      c.p.q_offset = 9;
      c.p.k_offset = 4;
      const Fwd got = forward(c);
      ASSERT_TRUE(got.st.ok()) << got.st.message();
      Case plain = c;
      plain.p.encoding = Encoding::kNope;
      RopeParams whole = rp;
      whole.seq_len = 12;  // max(9 + 3, 4 + 5)
      ASSERT_TRUE(rope_forward(whole, V(c.q, {2, 3, 4, 6}), Positions{View{}, 9}, V(plain.q, {2, 3, 4, 6})).ok());
      ASSERT_TRUE(rope_forward(whole, V(c.k, {2, 5, 2, 6}), Positions{View{}, 4}, V(plain.k, {2, 5, 2, 6})).ok());
      const Fwd want = forward(plain);
      EXPECT_TRUE(AllClose(got.out, want.out, 1e-12, 1e-10));
      EXPECT_TRUE(AllClose(got.lse, want.lse, 1e-12, 1e-10));
      check_all_grads(c, 62);

      // Causal self-attention over 10 tokens, and its first 5 queries against its first 5 keys (a
      // context-parallel shard): the same rows only when the shard is given the whole's seq_len.
      if (!causal) continue;
      Case all = make_case(var, 1, 10, 10, 2, 1, 6, true, 63);
      all.p.rope = rp;
      const Fwd a = forward(all);
      ASSERT_TRUE(a.st.ok()) << a.st.message();
      Case shard = all;
      shard.M = shard.N = 5;
      shard.q.resize(5 * 2 * 6);
      shard.k.resize(5 * 1 * 6);
      shard.v.resize(5 * 1 * 6);
      shard.p.rope.seq_len = 10;
      const Fwd s = forward(shard);
      ASSERT_TRUE(s.st.ok()) << s.st.message();
      EXPECT_TRUE(AllClose(s.out, Vec(a.out.begin(), a.out.begin() + 5 * 2 * 6), 1e-12, 1e-10));
      shard.p.rope.seq_len = 0;  // derived: 5
      const bool by_length = rp.rope_type == RopeType::kDynamic || rp.rope_type == RopeType::kLongrope;
      EXPECT_EQ(static_cast<bool>(AllClose(forward(shard).out, Vec(a.out.begin(), a.out.begin() + 5 * 2 * 6), 1e-12, 1e-10)), !by_length);
      shard.p.rope.seq_len = 4;  // below the call's own length: an error naming seq_len
      EXPECT_EQ(forward(shard).st.arg(), "seq_len");
    }
}

TEST(AttentionBuildingBlocks, BiasesEqualTheBiasTensors) {
  for (const Variant& var : variants_of({Encoding::kAlibi, Encoding::kT5, Encoding::kKerple,
                                         Encoding::kSandwich, Encoding::kFire}))
    for (bool causal : {false, true}) {
      SCOPED_TRACE(trace(var, causal));
      Case c = make_case(var, 2, 4, 6, 4, 2, 4, causal, 51);
      c.p.q_offset = 5;
      c.p.k_offset = 2;
      const Fwd got = forward(c);
      ASSERT_TRUE(got.st.ok()) << got.st.message();
      Vec bias(ix(c.Hq * c.M * c.N));
      const BiasGeometry geo{c.Hq, c.M, c.N, 5, 2};
      EncodingTensors t = c.tensors();
      const View bv = V(bias, {c.Hq, c.M, c.N});
      Status st;
      switch (var.enc) {
        case Encoding::kAlibi: st = alibi_bias(c.p.alibi, geo, t.slopes, t.weights, bv); break;
        case Encoding::kT5: st = t5_bias(c.p.t5, geo, t.weights, bv); break;
        case Encoding::kKerple: st = kerple_bias(c.p.kerple, geo, t.r1, t.r2, bv); break;
        case Encoding::kSandwich: st = sandwich_bias(c.p.sandwich, geo, bv); break;
        default: st = fire_bias(c.p.fire, geo, t.fire, bv); break;
      }
      ASSERT_TRUE(st.ok()) << st.message();
      const Fwd want = naive_attend(c, naive_logits(c, &bias));
      EXPECT_TRUE(AllClose(got.out, want.out, 1e-12, 1e-10));
      EXPECT_TRUE(AllClose(got.lse, want.lse, 1e-12, 1e-10));
    }
}

}  // namespace
}  // namespace posenc
