// The fused attention's products at the bfloat16 rate (tile_gemm_bf16.h: AMX, VDPBF16PS or their
// emulation), against the float64 reference: the forward on every variant and shape, the backward
// on the stored path at the rate and after the forward again, which products each mode names, how q
// is read, P rounded, and the stored path's fallback to the float32 sweeps. Fixtures:
// attention_fast_testing.h.
#include "attention_fast_testing.h"

namespace posenc {
namespace {

using namespace fast_testing;  // NOLINT: the fixtures

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

}  // namespace
}  // namespace posenc
