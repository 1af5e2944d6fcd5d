// Non-finite inputs through the attention: a NaN (or ±inf) in q, k or v, forward (out, lse) and backward
// (dq, dk, dv and the parameter gradients), in the fused kernels (posenc::fused::, without the
// dispatcher's small-problem rule: nope, rope, alibi symmetric and learned, t5, kerple, sandwich, fire,
// xl; cope, which runs the reference for such a call), the public dispatcher at a fused size, the
// reference itself and attention_backward_saved; a NaN in dout; causal or not, float32 and bfloat16,
// decode (M = 1, the sgemv path), head dims on the tile GEMM and on OpenBLAS, every SIMD target.
//
// The rule (posenc/attention.h): a row whose logits hold a NaN or +inf is a NaN row — out and lse
// NaN, and in the backward NaN in dq of the row and in dk, dv of every key it sees; a NaN in v_j
// makes NaN out_i[·, d] in its dimension for the rows that see j, and in the backward (through
// Dᵢ = dOᵢ·outᵢ) dq of those rows and dk of the keys they see; nothing reaches a row from a key it
// does not see, or a key from a row that does not see it; a row that sees no key stays out = 0,
// lse = −inf. The expected NaNs are worked out here from the mask alone (which rows see which keys),
// independently of both implementations; every element outside them is finite and equals the
// reference (the reference run on the same inputs, and for the forward the clean inputs' result too).
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attention_nan_testing.h"

namespace posenc {
namespace {

using namespace ::posenc::attention_nan_testing;  // NOLINT: the fixtures of these tests

// ---- the cases -------------------------------------------------------------------------------------
struct Case {
  Enc enc;
  bool causal;
  In in;
};
std::string case_name(const ::testing::TestParamInfo<Case>& c) {
  return std::string(enc_name(c.param.enc)) + (c.param.causal ? "_causal" : "_full") + "_" +
         (c.param.in == In::kQ ? "q" : c.param.in == In::kK ? "k" : "v");
}
void PrintTo(const Case& c, std::ostream* os) {
  *os << enc_name(c.enc) << (c.causal ? " causal " : " ") << "qkvo"[static_cast<int>(c.in)];
}

std::vector<Case> cases() {
  std::vector<Case> r;
  for (Enc e : {Enc::kNope, Enc::kRope, Enc::kAlibi, Enc::kAlibiLearned, Enc::kT5, Enc::kKerple, Enc::kSandwich,
                Enc::kFire, Enc::kXL, Enc::kCope})
    for (bool causal : {false, true})
      for (In in : {In::kQ, In::kK, In::kV}) r.push_back({e, causal, in});
  return r;
}

// Two query and two key blocks (M = N = 150), grouped heads, D = 16 (the study's; the tile GEMM). The
// spot: query 10 (its row sees keys 0–10 when causal, the rest of the diagonal tile masked: a NaN
// must not reach dk of those) or key 20 (seen by queries ≥ 20; 0–19 share its tile), batch row 1.
Spot spot_for(In in) {
  if (in == In::kQ) return Spot{In::kQ, 1, 10, 3, 5, kNaN};
  return Spot{in, 1, 20, 1, 7, kNaN};
}

class AttentionNaN : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionNaN, Float32) {
  const Case& c = GetParam();
  Problem pr(c.enc, c.causal, DType::kF32, {2, 150, 150, 4, 2, 16}, 100);
  check(pr, spot_for(c.in), 200);
}


// A decode step: one query row against 150 keys (cblas_sgemv in the main kernel), with offsets that
// leave the last keys masked when causal.
TEST_P(AttentionNaN, Decode) {
  const Case& c = GetParam();
  Problem pr(c.enc, c.causal, DType::kF32, {2, 1, 150, 4, 2, 16, I{140}}, 500);
  Spot sp = spot_for(c.in);
  if (c.in == In::kQ) sp.t = 0;
  check(pr, sp, 600);
}

INSTANTIATE_TEST_SUITE_P(Attention, AttentionNaN, ::testing::ValuesIn(cases()), case_name);

// bfloat16 storage: the NaN survives the conversions in and out.
class AttentionNaNBf16 : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionNaNBf16, BFloat16) {
  const Case& c = GetParam();
  Problem pr(c.enc, c.causal, DType::kBF16, {2, 150, 150, 4, 2, 16}, 300);
  check(pr, spot_for(c.in), 400);
}

std::vector<Case> bf16_cases() {
  std::vector<Case> r;
  for (const Case& c : cases())
    if (c.enc == Enc::kNope || c.enc == Enc::kRope || c.enc == Enc::kXL || c.enc == Enc::kCope) r.push_back(c);
  return r;
}

INSTANTIATE_TEST_SUITE_P(Attention, AttentionNaNBf16, ::testing::ValuesIn(bf16_cases()), case_name);

// Head dim 130: the products on OpenBLAS (beyond kTileGemmMaxD) instead of the tile GEMM.
TEST(AttentionNaNMore, OpenBlasHeadDim) {
  for (bool causal : {false, true})
    for (In in : {In::kQ, In::kK, In::kV}) {
      SCOPED_TRACE(std::string(causal ? "causal " : "") + "qkvo"[static_cast<int>(in)]);
      Problem pr(Enc::kNope, causal, DType::kF32, {1, 140, 140, 2, 1, 130}, 700);
      check(pr, in == In::kQ ? Spot{in, 0, 10, 1, 5, kNaN} : Spot{in, 0, 20, 0, 7, kNaN}, 800);
    }
}

// Every SIMD target (the row helpers and the finiteness scan are per target), one and two threads.
TEST(AttentionNaNMore, EveryTargetAndThreads) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (In in : {In::kQ, In::kK, In::kV}) {
        SCOPED_TRACE(std::string(hwy::TargetName(target)) + " threads " + std::to_string(threads) + " " +
                     "qkvo"[static_cast<int>(in)]);
        Problem pr(Enc::kT5, true, DType::kF32, {1, 140, 140, 2, 1, 20}, 900);
        check(pr, in == In::kQ ? Spot{in, 0, 10, 1, 5, kNaN} : Spot{in, 0, 20, 0, 7, kNaN}, 1000);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  set_num_threads(0);
}

// The public dispatcher at a size it sends to the fused kernels (B·Hq·M·N ≥ 2^14) and at one it
// sends to the reference.
TEST(AttentionNaNMore, Dispatcher) {
  for (In in : {In::kQ, In::kK, In::kV}) {
    Problem big(Enc::kRope, true, DType::kF32, {2, 150, 150, 4, 2, 16}, 1100);
    check(big, spot_for(in), 1200, true);
    Problem small(Enc::kNope, false, DType::kF32, {2, 8, 8, 4, 2, 16}, 1300);
    check(small, in == In::kQ ? Spot{in, 0, 0, 0, 0, kNaN} : Spot{in, 0, 3, 1, 2, kNaN}, 1400, true);
  }
}

// attention_backward_saved (the model's path: pass 1 reads the forward's out and lse) with a NaN in
// q, k or v: the same gradients as attention_backward running the forward again (the stored tiles
// off), NaN for NaN, bit for bit.
TEST(AttentionNaNMore, SavedBackwardAgrees) {
  const fused::ScoreStoreLimit recompute(0);
  for (In in : {In::kQ, In::kK, In::kV})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(causal ? "causal " : "") + "qkvo"[static_cast<int>(in)]);
      Problem pr(Enc::kT5, causal, DType::kF32, {2, 150, 150, 4, 2, 16}, 2300);
      Tensor q(DType::kF32, randn(Tensor::count(pr.qshape()), 2301), pr.qshape());
      Tensor k(DType::kF32, randn(Tensor::count(pr.kshape()), 2302), pr.kshape());
      Tensor v(DType::kF32, randn(Tensor::count(pr.kshape()), 2303), pr.kshape());
      Tensor dout(DType::kF32, randn(Tensor::count(pr.qshape()), 2304), pr.qshape());
      const Spot sp = spot_for(in);
      (in == In::kQ ? q : in == In::kK ? k : v)
          .set(in == In::kQ ? pr.qat(sp.b, sp.t, sp.h, sp.e) : pr.kat(sp.b, sp.t, sp.h, sp.e), kNaN);
      const EncodingTensors t = pr.tensors();
      Tensor out(DType::kF32, pr.qshape());
      Vec lse(ix(pr.s.B * pr.s.Hq * pr.s.M));
      const View lv = View::contiguous(lse.data(), DType::kF64, {pr.s.B, pr.s.Hq, pr.s.M});
      ASSERT_TRUE(attention_forward(pr.p, q.view(), k.view(), v.view(), t, out.view(), lv).ok());
      Tensor dq(DType::kF32, pr.qshape()), dk(DType::kF32, pr.kshape()), dv(DType::kF32, pr.kshape());
      Tensor dq2(DType::kF32, pr.qshape()), dk2(DType::kF32, pr.kshape()), dv2(DType::kF32, pr.kshape());
      std::vector<Param> ps = pr.params(9.0), ps2 = pr.params(9.0);
      ASSERT_TRUE(attention_backward(pr.p, q.view(), k.view(), v.view(), t, dout.view(), dq.view(), dk.view(),
                                     dv.view(), pr.grads(ps, false))
                      .ok());
      ASSERT_TRUE(attention_backward_saved(pr.p, q.view(), k.view(), v.view(), t, out.view(), lv, dout.view(),
                                           dq2.view(), dk2.view(), dv2.view(), pr.grads(ps2, false))
                      .ok());
      auto same = [](const Vec& a, const Vec& b) {
        int bad = 0, nan = 0;
        for (std::size_t i = 0; i < a.size(); ++i) {
          nan += std::isnan(a[i]);
          bad += !(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])));
        }
        return std::pair{bad, nan};
      };
      int nans = 0;
      for (auto [a, b] : {std::pair{&dq, &dq2}, std::pair{&dk, &dk2}, std::pair{&dv, &dv2}}) {
        const auto [bad, nan] = same(a->values(), b->values());
        EXPECT_EQ(bad, 0);
        nans += nan;
      }
      EXPECT_GT(nans, 0);
      EXPECT_EQ(same(ps[0].got, ps2[0].got).first, 0) << "dweights";
    }
}

// ±inf in q: its logits are ±inf (NaN where a key has 0 there): a +inf logit makes a NaN row (∞ − ∞
// in the softmax), like a NaN, whose P is NaN on the keys of logit +inf and 0 on those of −inf. In k: +inf logits (NaN rows) for the rows that see it with q of the
// same sign there, −inf (a key of weight 0: finite rows) for the others.
TEST(AttentionNaNMore, InfinityMakesANaNRow) {
  for (double value : {kInf, -kInf})
    for (bool causal : {false, true})
      for (In in : {In::kQ, In::kK}) {
        SCOPED_TRACE(std::to_string(value) + (causal ? " causal " : " ") + "qk"[static_cast<int>(in)]);
        Problem pr(Enc::kNope, causal, DType::kF32, {2, 150, 150, 4, 2, 16}, 1500);
        Spot sp = spot_for(in);
        sp.value = value;
        check(pr, sp, 1600);
      }
}

// A row whose logits are all −inf (q_i = −inf where every key it sees is positive) is a row with no
// key: out = 0, lse = −inf, and no gradient, nor any NaN from 0·inf in dk.
TEST(AttentionNaNMore, AllMinusInfinityIsAMaskedRow) {
  for (bool causal : {false, true})
    for (bool fused : {true, false}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "full") + (fused ? " fused" : " reference"));
      Problem pr(Enc::kNope, causal, DType::kF32, {1, 150, 150, 2, 1, 16}, 1700);
      const Shape& s = pr.s;
      Tensor q(DType::kF32, randn(Tensor::count(pr.qshape()), 1801), pr.qshape());
      Vec kv = randn(Tensor::count(pr.kshape()), 1802);
      for (I j = 0; j < s.N; ++j) kv[pr.kat(0, j, 0, 5)] = 0.5 + std::fabs(kv[pr.kat(0, j, 0, 5)]);
      Tensor k(DType::kF32, kv, pr.kshape());
      Tensor v(DType::kF32, randn(Tensor::count(pr.kshape()), 1803), pr.kshape());
      Tensor dout(DType::kF32, randn(Tensor::count(pr.qshape()), 1804), pr.qshape());
      const I i0 = 10, h0 = 1;
      q.set(pr.qat(0, i0, h0, 5), -kInf);
      Tensor out(DType::kF32, pr.qshape()), dq(DType::kF32, pr.qshape()), dk(DType::kF32, pr.kshape()),
          dv(DType::kF32, pr.kshape());
      Vec lse(ix(s.Hq * s.M));
      const View lv = View::contiguous(lse.data(), DType::kF64, {s.B, s.Hq, s.M});
      const EncodingTensors t;
      const EncodingGrads g;
      if (fused) {
        ASSERT_TRUE(fused::attention_forward(pr.p, q.view(), k.view(), v.view(), t, out.view(), lv).ok());
        ASSERT_TRUE(fused::attention_backward(pr.p, q.view(), k.view(), v.view(), t, dout.view(), dq.view(),
                                              dk.view(), dv.view(), g)
                        .ok());
      } else {
        ASSERT_TRUE(reference::attention_forward(pr.p, q.view(), k.view(), v.view(), t, out.view(), lv).ok());
        ASSERT_TRUE(reference::attention_backward(pr.p, q.view(), k.view(), v.view(), t, dout.view(), dq.view(),
                                                  dk.view(), dv.view(), g)
                        .ok());
      }
      for (I e = 0; e < s.D; ++e) {
        EXPECT_EQ(out.f[pr.qat(0, i0, h0, e)], 0.f);
        EXPECT_EQ(dq.f[pr.qat(0, i0, h0, e)], 0.f);
      }
      EXPECT_EQ(lse[pr.lat(0, h0, i0)], -kInf);
      int nonfinite = 0;
      for (const Tensor* x : {&out, &dq, &dk, &dv})
        for (float f : x->f) nonfinite += !std::isfinite(f);
      EXPECT_EQ(nonfinite, 0);
      // the other rows as if row i0 were not there: dk, dv from the clean problem minus nothing
      // (row i0 gives no weight to any key), compared with the reference on clean inputs
      Vec q1 = q.d;
      for (I e = 0; e < s.D; ++e) q1[pr.qat(0, i0, h0, e)] = 0;  // any finite row: its P does not matter
      Vec wk(k.d.size()), wv(v.d.size()), wo(q.d.size()), wl(lse.size());
      Vec do1 = dout.d;
      for (I e = 0; e < s.D; ++e) do1[pr.qat(0, i0, h0, e)] = 0;  // and no gradient through it
      ASSERT_TRUE(reference::attention_backward(pr.p, View::contiguous(q1.data(), DType::kF64, pr.qshape()),
                                                k.view64(), v.view64(), t,
                                                View::contiguous(do1.data(), DType::kF64, pr.qshape()), View{},
                                                View::contiguous(wk.data(), DType::kF64, pr.kshape()),
                                                View::contiguous(wv.data(), DType::kF64, pr.kshape()), g)
                      .ok());
      EXPECT_TRUE(AllClose(dk.values(), wk, 2e-5 * amax(wk), 1e-4)) << "dk";
      EXPECT_TRUE(AllClose(dv.values(), wv, 2e-5 * amax(wv), 1e-4)) << "dv";
    }
}

// A NaN in dout: the forward untouched; dq of its row, dk of the keys the row sees and dv of those
// keys in the NaN's dimension (dv_j = Σ_i P_ij dO_i).
TEST(AttentionNaNMore, NaNInDout) {
  for (Enc e : {Enc::kNope, Enc::kAlibiLearned, Enc::kT5, Enc::kXL, Enc::kCope})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(enc_name(e)) + (causal ? " causal" : ""));
      Problem pr(e, causal, DType::kF32, {2, 150, 150, 4, 2, 16}, 2100);
      check(pr, Spot{In::kDout, 1, 10, 3, 5, kNaN}, 2200);
    }
}

// Rows that see no key (causal, queries placed before the keys) stay out = 0, lse = −inf, with a NaN
// in their own q or in a key; the rows that see the NaN key are NaN rows.
TEST(AttentionNaNMore, FullyMaskedRowsStayZero) {
  for (Enc e : {Enc::kNope, Enc::kAlibiLearned, Enc::kXL, Enc::kCope})
    for (In in : {In::kQ, In::kK, In::kV}) {
      SCOPED_TRACE(std::string(enc_name(e)) + " " + "qkvo"[static_cast<int>(in)]);
      // q_off = k_off − 3: queries 0, 1, 2 see no key
      Problem pr(e, true, DType::kF32, {1, 140, 140, 2, 1, 16, I{97}, I{100}}, 1900);
      // the spot: query 1 (masked: nothing happens) or key 0 (seen by queries ≥ 3)
      Got got;
      check(pr, in == In::kQ ? Spot{in, 0, 1, 1, 5, kNaN} : Spot{in, 0, 0, 0, 7, kNaN}, 2000, false, &got);
      for (I h = 0; h < 2; ++h)
        for (I i = 0; i < 3; ++i) {
          EXPECT_EQ(got.lse[pr.lat(0, h, i)], -kInf);
          for (I d = 0; d < 16; ++d) EXPECT_EQ(got.out[pr.qat(0, i, h, d)], 0.0);
        }
      if (in != In::kQ) {  // row 3 sees key 0 (for v: in dimension 7)
        EXPECT_TRUE(std::isnan(got.out[pr.qat(0, 3, 0, 7)]));
      }
    }
}

}  // namespace
}  // namespace posenc
