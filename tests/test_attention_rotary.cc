// Attention with the rotary encodings of rotary.h (rope2d axial and mixed, mrope, xpos), through the
// reference (posenc::reference, double) and the public dispatcher:
//   * building blocks: the attention equals nope attention of q and k rotated by the public
//     elementwise functions (rope2d_forward, mrope_forward, xpos_forward with the same centre); for
//     mixed under grouped-query heads, of the keys rotated per query head (docs/attention.md's rule);
//   * central differences of a random-projection loss for dq, dk, dv and mixed's dfreqs;
//   * properties: xPos's output depends on offsets only (a shift of both changes nothing, the
//     centre included), a decode step equals the last prefill row (mrope, xpos), 2D positions
//     shifted by (sx, sy) change nothing, M-RoPE on text positions is RoPE, causal masks by the 1D
//     order whatever the 2D/3D positions;
//   * bad inputs naming the argument.
// The fused kernels are held against this reference in test_attention_fast.cc.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "posenc/attention.h"
#include "posenc/rotary.h"
#include "testing.h"

namespace posenc {
namespace {

using ::posenc::testing::AllClose;
using ::posenc::testing::GradCheck;
using ::posenc::testing::dot;
using ::posenc::testing::randn;
using ::posenc::testing::V;
using I = std::int64_t;
using Vec = std::vector<double>;

std::size_t ix(I i) { return static_cast<std::size_t>(i); }

struct Prob {
  AttentionParams p;
  I B = 1, M = 4, N = 5, Hq = 2, Hkv = 1, D = 8;
  Vec q, k, v, freqs;                       // freqs: rope2d mixed [2, Hq, r/2]
  std::vector<std::int64_t> qpos, kpos;     // rope2d / mrope: [A, M], [A, N] (empty: 1D)
  I A = 1;

  EncodingTensors tensors() {
    EncodingTensors t;
    if (!freqs.empty()) t.freqs = V(freqs, {2, Hq, D / 2});
    if (!qpos.empty()) t.q_positions = View::contiguous(qpos.data(), DType::kI64, {A, M});
    if (!kpos.empty()) t.k_positions = View::contiguous(kpos.data(), DType::kI64, {A, N});
    return t;
  }
  Vec out() {
    Vec o(ix(B * M * Hq * D));
    const Status s = reference::attention_forward(p, V(q, {B, M, Hq, D}), V(k, {B, N, Hkv, D}), V(v, {B, N, Hkv, D}),
                                                  tensors(), V(o, {B, M, Hq, D}));
    EXPECT_TRUE(s.ok()) << s.message();
    return o;
  }
};

// A problem of the encoding; 2D / 3D positions on a small grid, random frequencies for mixed.
Prob make(Encoding e, bool causal, std::uint64_t seed, I B = 1, I M = 4, I N = 5, I Hq = 2, I Hkv = 1, I D = 8) {
  Prob pr;
  pr.B = B, pr.M = M, pr.N = N, pr.Hq = Hq, pr.Hkv = Hkv, pr.D = D;
  pr.p.encoding = e;
  pr.p.causal = causal;
  pr.q = randn(ix(B * M * Hq * D), seed + 1);
  pr.k = randn(ix(B * N * Hkv * D), seed + 2);
  pr.v = randn(ix(B * N * Hkv * D), seed + 3);
  if (e == Encoding::kRope2d || e == Encoding::kMrope) {
    pr.A = e == Encoding::kRope2d ? 2 : 3;
    for (I a = 0; a < pr.A; ++a)
      for (I i = 0; i < M; ++i) pr.qpos.push_back((i * (a + 2) + 3 * a) % 7);
    for (I a = 0; a < pr.A; ++a)
      for (I j = 0; j < N; ++j) pr.kpos.push_back((j * (a + 1) + a) % 6);
  }
  if (e == Encoding::kMrope) pr.p.mrope.mrope_section = {D / 2 - 2 * (D / 6), D / 6, D / 6};
  if (e == Encoding::kXpos) pr.p.xpos.scale_base = 8;  // a visible decay at these small offsets
  return pr;
}
void make_mixed(Prob* pr, std::uint64_t seed) {
  pr->p.rope2d.variant = Rope2dVariant::kMixed;
  pr->freqs = randn(ix(2 * pr->Hq * pr->D / 2), seed, 0.8);
}

// ---- building blocks -----------------------------------------------------------------------------

// Nope attention of the given (already rotated) q [B, M, Hq, D], k, v [B, N, H, D].
Vec nope_out(const Prob& pr, Vec q, Vec k, Vec v, I Hk) {
  AttentionParams np = pr.p;
  np.encoding = Encoding::kNope;
  Vec o(q.size());
  const Status s = reference::attention_forward(np, V(q, {pr.B, pr.M, pr.Hq, pr.D}), V(k, {pr.B, pr.N, Hk, pr.D}),
                                                V(v, {pr.B, pr.N, Hk, pr.D}), {}, V(o, {pr.B, pr.M, pr.Hq, pr.D}));
  EXPECT_TRUE(s.ok()) << s.message();
  return o;
}

TEST(AttentionRotary, EqualsNopeOfTheElementwiseRotations) {
  for (Encoding e : {Encoding::kRope2d, Encoding::kMrope, Encoding::kXpos})
    for (bool causal : {false, true})
      for (int variant = 0; variant < 2; ++variant) {
        SCOPED_TRACE(encoding_info(e).name + (causal ? " causal" : " full") + " variant " + std::to_string(variant));
        Prob pr = make(e, causal, 10, 2, 4, 6, 4, 2, 12);
        pr.p.q_offset = 9;
        pr.p.k_offset = 5;
        if (e == Encoding::kRope2d && variant) make_mixed(&pr, 11);
        if (e == Encoding::kMrope && variant) {
          pr.p.mrope.variant = MropeVariant::kInterleaved;
          pr.p.mrope.rope.layout = RopeLayout::kInterleaved;
        }
        if (e == Encoding::kXpos && variant) {
          pr.p.xpos.rope.layout = RopeLayout::kHalf;
          pr.p.xpos.center = 3;
        }
        const Vec got = pr.out();
        Vec rq(pr.q.size()), rk;
        Vec kexp(ix(pr.B * pr.N * pr.Hq * pr.D)), vexp(kexp.size());  // k, v repeated to Hq heads
        for (I b = 0; b < pr.B; ++b)
          for (I j = 0; j < pr.N; ++j)
            for (I h = 0; h < pr.Hq; ++h)
              for (I d = 0; d < pr.D; ++d) {
                kexp[ix(((b * pr.N + j) * pr.Hq + h) * pr.D + d)] = pr.k[ix(((b * pr.N + j) * pr.Hkv + h / 2) * pr.D + d)];
                vexp[ix(((b * pr.N + j) * pr.Hq + h) * pr.D + d)] = pr.v[ix(((b * pr.N + j) * pr.Hkv + h / 2) * pr.D + d)];
              }
        rk.resize(kexp.size());
        const View qv = V(pr.q, {pr.B, pr.M, pr.Hq, pr.D}), kv = V(kexp, {pr.B, pr.N, pr.Hq, pr.D});
        const View rqv = V(rq, {pr.B, pr.M, pr.Hq, pr.D}), rkv = V(rk, {pr.B, pr.N, pr.Hq, pr.D});
        const EncodingTensors t = pr.tensors();
        if (e == Encoding::kRope2d) {
          ASSERT_TRUE(rope2d_forward(pr.p.rope2d, qv, Positions{t.q_positions, 0}, t.freqs, rqv).ok());
          ASSERT_TRUE(rope2d_forward(pr.p.rope2d, kv, Positions{t.k_positions, 0}, t.freqs, rkv).ok());
        } else if (e == Encoding::kMrope) {
          ASSERT_TRUE(mrope_forward(pr.p.mrope, qv, Positions{t.q_positions, 0}, rqv).ok());
          ASSERT_TRUE(mrope_forward(pr.p.mrope, kv, Positions{t.k_positions, 0}, rkv).ok());
        } else {
          XposParams xp = pr.p.xpos;
          xp.rope.seq_len = std::max<I>(9 + pr.M, 5 + pr.N);  // the attention call's length: the same centre
          ASSERT_TRUE(xpos_forward(xp, XposRole::kQuery, qv, Positions{View{}, 9}, rqv).ok());
          ASSERT_TRUE(xpos_forward(xp, XposRole::kKey, kv, Positions{View{}, 5}, rkv).ok());
        }
        EXPECT_TRUE(AllClose(got, nope_out(pr, rq, rk, vexp, pr.Hq), 1e-12, 1e-10));
      }
}

// ---- gradients -----------------------------------------------------------------------------------

TEST(AttentionRotary, GradientsMatchFiniteDifferences) {
  for (Encoding e : {Encoding::kRope2d, Encoding::kMrope, Encoding::kXpos})
    for (bool causal : {false, true})
      for (int variant = 0; variant < 2; ++variant) {
        SCOPED_TRACE(encoding_info(e).name + (causal ? " causal" : " full") + " variant " + std::to_string(variant));
        Prob pr = make(e, causal, 20, 2, 3, 5, 4, 2, 8);
        if (e == Encoding::kRope2d && variant) make_mixed(&pr, 21);
        if (e == Encoding::kMrope && variant) pr.p.mrope.variant = MropeVariant::kInterleaved;
        if (e == Encoding::kXpos && variant) pr.p.xpos.rope.layout = RopeLayout::kHalf;
        const Vec proj = randn(pr.q.size(), 22);
        auto loss = [&](const Prob& x) {
          Prob c = x;
          return dot(proj, c.out());
        };
        Vec dq(pr.q.size()), dk(pr.k.size()), dv(pr.v.size()), df(pr.freqs.size());
        Vec pc = proj;
        EncodingGrads g;
        if (!pr.freqs.empty()) g.freqs = V(df, {2, pr.Hq, pr.D / 2});
        const Status s = reference::attention_backward(
            pr.p, V(pr.q, {pr.B, pr.M, pr.Hq, pr.D}), V(pr.k, {pr.B, pr.N, pr.Hkv, pr.D}),
            V(pr.v, {pr.B, pr.N, pr.Hkv, pr.D}), pr.tensors(), V(pc, {pr.B, pr.M, pr.Hq, pr.D}),
            V(dq, {pr.B, pr.M, pr.Hq, pr.D}), V(dk, {pr.B, pr.N, pr.Hkv, pr.D}), V(dv, {pr.B, pr.N, pr.Hkv, pr.D}), g);
        ASSERT_TRUE(s.ok()) << s.message();
        EXPECT_TRUE(GradCheck([&](const Vec& x) { Prob c = pr; c.q = x; return loss(c); }, pr.q, dq)) << "dq";
        EXPECT_TRUE(GradCheck([&](const Vec& x) { Prob c = pr; c.k = x; return loss(c); }, pr.k, dk)) << "dk";
        EXPECT_TRUE(GradCheck([&](const Vec& x) { Prob c = pr; c.v = x; return loss(c); }, pr.v, dv)) << "dv";
        if (!pr.freqs.empty()) {
          EXPECT_TRUE(GradCheck([&](const Vec& x) { Prob c = pr; c.freqs = x; return loss(c); }, pr.freqs, df)) << "dfreqs";
        }
      }
}

// ---- properties ----------------------------------------------------------------------------------

// xPos: the logit of (i, j) is Σ ζ^((qp − kp)/s)·(RoPE's terms): shifting both offsets (and so the
// default centre) changes nothing; an explicit centre changes nothing either (it cancels); a decode
// step (one query at the end) is the last row of the prefill, in the same centre.
TEST(AttentionRotary, XposDependsOnOffsetsOnlyAndDecodeIsTheLastRow) {
  for (bool causal : {false, true}) {
    Prob pr = make(Encoding::kXpos, causal, 30, 1, 6, 6, 2, 1, 8);
    const Vec a = pr.out();
    pr.p.q_offset = 40;
    pr.p.k_offset = 40;
    EXPECT_TRUE(AllClose(pr.out(), a, 1e-12, 1e-10)) << "shifted by 40";
    pr.p.xpos.center = -17;
    EXPECT_TRUE(AllClose(pr.out(), a, 1e-12, 1e-10)) << "explicit centre";
    // decode: query 5 alone against keys 0 .. 5
    Prob dec = make(Encoding::kXpos, causal, 30, 1, 6, 6, 2, 1, 8);
    dec.M = 1;
    dec.q.assign(pr.q.begin() + 5 * 2 * 8, pr.q.end());
    const Vec d = dec.out();
    EXPECT_TRUE(AllClose(d, Vec(a.begin() + 5 * 2 * 8, a.end()), 1e-12, 1e-10)) << "decode";
    // and a different relative layout does change it
    pr.p.k_offset = 41;
    EXPECT_FALSE(AllClose(pr.out(), a, 1e-9, 1e-9));
  }
}

TEST(AttentionRotary, TwoDimensionalShiftChangesNothingAndCausalFollowsTheSequence) {
  for (int variant = 0; variant < 2; ++variant) {
    Prob pr = make(Encoding::kRope2d, false, 40, 1, 5, 7, 2, 1, 8);
    if (variant) make_mixed(&pr, 41);
    const Vec a = pr.out();
    Prob s = pr;
    for (I i = 0; i < s.M; ++i) s.qpos[ix(i)] += 11, s.qpos[ix(s.M + i)] += 4;
    for (I j = 0; j < s.N; ++j) s.kpos[ix(j)] += 11, s.kpos[ix(s.N + j)] += 4;
    EXPECT_TRUE(AllClose(s.out(), a, 1e-12, 1e-10)) << variant;
    s.kpos[0] += 1;  // one key moves: the output moves
    EXPECT_FALSE(AllClose(s.out(), a, 1e-9, 1e-9)) << variant;
    // causal: query i sees keys j with k_offset + j <= q_offset + i (1D), whatever the 2D ids; the
    // first query (q_offset = N − M = 2) sees keys 0..2: changing v of key 3 leaves row 0 alone.
    Prob c = pr;
    c.p.causal = true;
    const Vec c0 = c.out();
    for (I d = 0; d < c.D; ++d) c.v[ix(3 * c.D + d)] += 1.0;
    const Vec c1 = c.out();
    for (I e = 0; e < c.Hq * c.D; ++e) EXPECT_EQ(c0[ix(e)], c1[ix(e)]);
    EXPECT_FALSE(AllClose(Vec(c1.begin() + c.Hq * c.D, c1.end()), Vec(c0.begin() + c.Hq * c.D, c0.end()), 1e-9, 1e-9));
  }
}

TEST(AttentionRotary, MropeOnTextIsRopeAndDecodeIsTheLastRow) {
  for (bool interleaved : {false, true}) {
    Prob pr = make(Encoding::kMrope, true, 50, 2, 6, 6, 2, 2, 12);
    pr.p.mrope.variant = interleaved ? MropeVariant::kInterleaved : MropeVariant::kChunked;
    pr.qpos.clear();  // absent: (p, p, p) with p the 1D position
    pr.kpos.clear();
    const Vec a = pr.out();
    Prob rope = pr;
    rope.p.encoding = Encoding::kRope;
    rope.p.rope = pr.p.mrope.rope;
    EXPECT_TRUE(AllClose(a, rope.out(), 1e-12, 1e-10));
    // explicit text ids = the same
    for (I ax = 0; ax < 3; ++ax)
      for (I i = 0; i < 6; ++i) pr.qpos.push_back(i), pr.kpos.push_back(i);
    EXPECT_TRUE(AllClose(pr.out(), a, 1e-13, 1e-13));
  }
  // A decode step with Qwen2-VL ids: the last query of an image + text sequence against all keys.
  using K = MropeSegment::Kind;
  auto ids = mrope_positions({{K::kText, 2}, {K::kImage, 0, 1, 2, 2}, {K::kText, 2}});
  ASSERT_TRUE(ids.ok());
  Prob pr = make(Encoding::kMrope, true, 60, 1, 8, 8, 2, 1, 12);
  pr.qpos = pr.kpos = ids->ids;
  const Vec a = pr.out();
  Prob dec = pr;
  dec.M = 1;
  dec.q.assign(pr.q.begin() + 7 * 2 * 12, pr.q.end());
  dec.qpos = {ids->ids[7], ids->ids[15], ids->ids[23]};
  EXPECT_TRUE(AllClose(dec.out(), Vec(a.begin() + 7 * 2 * 12, a.end()), 1e-12, 1e-10));
}

// ---- errors --------------------------------------------------------------------------------------

TEST(AttentionRotary, BadInputsNameTheArgument) {
  Prob pr = make(Encoding::kMrope, false, 70);
  auto status = [&](Prob& x) {
    Vec o(x.q.size());
    return attention_forward(x.p, V(x.q, {x.B, x.M, x.Hq, x.D}), V(x.k, {x.B, x.N, x.Hkv, x.D}),
                             V(x.v, {x.B, x.N, x.Hkv, x.D}), x.tensors(), V(o, {x.B, x.M, x.Hq, x.D}));
  };
  EXPECT_TRUE(status(pr).ok());
  Prob bad = pr;
  bad.A = 2;  // [2, M]: M-RoPE wants three rows
  bad.qpos.resize(ix(2 * bad.M));
  bad.kpos.resize(ix(2 * bad.N));
  EXPECT_EQ(status(bad).arg(), "q_positions");
  bad = pr;
  bad.kpos[1] = -4;
  EXPECT_EQ(status(bad).arg(), "k_positions");
  bad = pr;
  bad.p.mrope.mrope_section = {1, 1, 1};
  EXPECT_EQ(status(bad).arg(), "mrope_section");
  Prob x = make(Encoding::kXpos, false, 71);
  x.qpos = {0, 1, 2, 3};  // xpos reads 1D offsets: positions tensors are not read
  x.A = 1;
  EXPECT_EQ(status(x).arg(), "q_positions");
  x.qpos.clear();
  x.p.xpos.gamma = -1;
  EXPECT_EQ(status(x).arg(), "gamma");
  Prob r = make(Encoding::kRope2d, false, 72);
  r.freqs = randn(ix(2 * r.Hq * r.D / 2), 73);  // axial reads no frequencies
  EXPECT_EQ(status(r).arg(), "freqs");
  make_mixed(&r, 74);
  EncodingTensors t = r.tensors();
  t.freqs = V(r.freqs, {2, 1, r.D / 2});  // frequencies for one head; q has two
  Vec o(r.q.size());
  EXPECT_EQ(attention_forward(r.p, V(r.q, {1, r.M, 2, r.D}), V(r.k, {1, r.N, 1, r.D}), V(r.v, {1, r.N, 1, r.D}), t,
                              V(o, {1, r.M, 2, r.D}))
                .arg(),
            "freqs");
  // dfreqs: only for mixed
  Prob ax = make(Encoding::kRope2d, false, 75);
  Vec dq(ax.q.size()), df(ix(2 * ax.Hq * ax.D / 2)), dout = randn(ax.q.size(), 76);
  EncodingGrads g;
  g.freqs = V(df, {2, ax.Hq, ax.D / 2});
  EXPECT_EQ(attention_backward(ax.p, V(ax.q, {1, ax.M, ax.Hq, ax.D}), V(ax.k, {1, ax.N, 1, ax.D}),
                               V(ax.v, {1, ax.N, 1, ax.D}), ax.tensors(), V(dout, {1, ax.M, ax.Hq, ax.D}),
                               V(dq, {1, ax.M, ax.Hq, ax.D}), View{}, View{}, g)
                .arg(),
            "dfreqs");
}

}  // namespace
}  // namespace posenc
