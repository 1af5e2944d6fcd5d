// Properties of the attention reference (src/attention/attention_ref.cc): permutation equivariance
// without positions (and its loss with any encoding, the articles' 我妈想你了 / 我想你妈了),
// causality, decode = last prefill row, query and key shards, grouped-query heads = repeated kv
// heads, shift invariance (and FIRE's loss of it once queries pass its threshold L), all-masked rows.
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

// ==== properties ==================================================================================
// Rows of out [B, M, H, D] for batch 0 as vectors of H·D.
std::vector<Vec> rows(const Vec& out, I M, I HD) {
  std::vector<Vec> r;
  for (I i = 0; i < M; ++i) r.emplace_back(out.begin() + i * HD, out.begin() + (i + 1) * HD);
  return r;
}

double max_abs_diff(const Vec& a, const Vec& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Permutes the tokens of x [B, L, H·D] (per batch): y[:, l] = x[:, perm[l]].
Vec permute_tokens(const Vec& x, I B, I L, I HD, const std::vector<I>& perm) {
  Vec y(x.size());
  for (I b = 0; b < B; ++b)
    for (I l = 0; l < L; ++l)
      std::copy_n(x.begin() + (b * L + perm[ix(l)]) * HD, HD, y.begin() + (b * L + l) * HD);
  return y;
}

TEST(AttentionProperties, NopeIsPermutationEquivariant) {
  Case c = make_case(all_variants()[0], 2, 6, 6, 4, 2, 4, false, 61);
  const std::vector<I> perm = {3, 0, 5, 1, 4, 2};
  const Fwd a = forward(c);
  Case pc = c;
  pc.q = permute_tokens(c.q, 2, 6, 16, perm);
  pc.k = permute_tokens(c.k, 2, 6, 8, perm);
  pc.v = permute_tokens(c.v, 2, 6, 8, perm);
  const Fwd b = forward(pc);
  ASSERT_TRUE(a.st.ok() && b.st.ok());
  EXPECT_TRUE(AllClose(b.out, permute_tokens(a.out, 2, 6, 16, perm), 1e-12, 1e-10));
}

// The articles' example: 我妈想你了 ("I miss my mom") and 我想你妈了 (a very different sentence) are
// the same five tokens in two orders. Without positions attention sees one bag of tokens: each
// token's output is the same in both orders. Every encoding tells the two sentences apart.
TEST(AttentionProperties, WoMaXiangNiLeNeedsPositions) {
  const char* tokens[] = {"我", "妈", "想", "你", "了"};
  const std::vector<I> order_a = {0, 1, 2, 3, 4};  // 我妈想你了
  const std::vector<I> order_b = {0, 2, 3, 1, 4};  // 我想你妈了
  for (const Variant& var : all_variants()) {
    SCOPED_TRACE(var.name);
    Case base = make_case(var, 1, 5, 5, 2, 2, 4, false, 71);  // row t holds token t's q, k, v
    Case ca = base, cb = base;
    ca.q = permute_tokens(base.q, 1, 5, 8, order_a), ca.k = permute_tokens(base.k, 1, 5, 8, order_a);
    ca.v = permute_tokens(base.v, 1, 5, 8, order_a);
    cb.q = permute_tokens(base.q, 1, 5, 8, order_b), cb.k = permute_tokens(base.k, 1, 5, 8, order_b);
    cb.v = permute_tokens(base.v, 1, 5, 8, order_b);
    const Fwd fa = forward(ca), fb = forward(cb);
    ASSERT_TRUE(fa.st.ok() && fb.st.ok());
    const std::vector<Vec> ra = rows(fa.out, 5, 8), rb = rows(fb.out, 5, 8);
    // Is the multiset of outputs the same? Match every row of b to a row of a.
    int unmatched = 0;
    std::string which;
    for (I l = 0; l < 5; ++l) {
      bool found = false;
      for (const Vec& x : ra) found = found || max_abs_diff(x, rb[ix(l)]) < 1e-9;
      if (!found) ++unmatched, which += tokens[order_b[ix(l)]];
    }
    if (var.enc == Encoding::kNope) {
      EXPECT_EQ(unmatched, 0) << which;
      for (I l = 0; l < 5; ++l)  // and token by token
        EXPECT_LT(max_abs_diff(ra[ix(order_b[ix(l)])], rb[ix(l)]), 1e-12) << tokens[order_b[ix(l)]];
    } else {
      EXPECT_GT(unmatched, 0) << "the encoding does not tell 我妈想你了 from 我想你妈了";
    }
  }
}

TEST(AttentionProperties, CausalIgnoresTheFuture) {
  for (const Variant& var : all_variants()) {
    SCOPED_TRACE(var.name);
    Case c = make_case(var, 2, 6, 6, 4, 2, 4, true, 81);
    const Fwd a = forward(c);
    // new tokens 4 and 5 (queries, keys and values)
    Case f = c;
    const Vec noise = randn(c.q.size() + 2 * c.k.size(), 82);
    for (I b = 0; b < 2; ++b)
      for (I l = 4; l < 6; ++l) {
        for (I e = 0; e < 16; ++e) f.q[ix((b * 6 + l) * 16 + e)] = noise[ix((b * 6 + l) * 16 + e)];
        for (I e = 0; e < 8; ++e) {
          f.k[ix((b * 6 + l) * 8 + e)] = noise[c.q.size() + ix((b * 6 + l) * 8 + e)];
          f.v[ix((b * 6 + l) * 8 + e)] = noise[c.q.size() + c.k.size() + ix((b * 6 + l) * 8 + e)];
        }
      }
    const Fwd b = forward(f);
    ASSERT_TRUE(a.st.ok() && b.st.ok());
    for (I bb = 0; bb < 2; ++bb) {
      const Vec pa(a.out.begin() + bb * 96, a.out.begin() + bb * 96 + 64);  // rows 0..3
      const Vec pb(b.out.begin() + bb * 96, b.out.begin() + bb * 96 + 64);
      EXPECT_TRUE(AllClose(pb, pa, 0, 0));
      const Vec la(a.out.begin() + bb * 96 + 64, a.out.begin() + bb * 96 + 96);
      const Vec lb(b.out.begin() + bb * 96 + 64, b.out.begin() + bb * 96 + 96);
      EXPECT_GT(max_abs_diff(la, lb), 1e-6);  // and the changed rows do change
    }
  }
}

TEST(AttentionProperties, DecodeStepEqualsLastPrefillRow) {
  for (const Variant& var : all_variants())
    for (bool causal : {false, true}) {
      SCOPED_TRACE(trace(var, causal));
      Case full = make_case(var, 2, 6, 6, 4, 2, 4, causal, 91);
      full.p.k_offset = 3;
      const Fwd whole = forward(full);
      Case step = full;
      step.M = 1;
      step.q.clear();
      for (I b = 0; b < 2; ++b) step.q.insert(step.q.end(), full.q.begin() + (b * 6 + 5) * 16, full.q.begin() + (b * 6 + 6) * 16);
      const Fwd one = forward(step);
      ASSERT_TRUE(whole.st.ok() && one.st.ok()) << one.st.message();
      Vec want;
      for (I b = 0; b < 2; ++b) want.insert(want.end(), whole.out.begin() + (b * 6 + 5) * 16, whole.out.begin() + (b * 6 + 6) * 16);
      EXPECT_TRUE(AllClose(one.out, want, 1e-13, 1e-12));
    }
}

TEST(AttentionProperties, QueryShardsEqualTheWhole) {
  for (const Variant& var : all_variants())
    for (bool causal : {false, true}) {
      SCOPED_TRACE(trace(var, causal));
      const I M = 7, N = 7, HD = 16;
      Case full = make_case(var, 1, M, N, 4, 2, 4, causal, 101);
      full.p.k_offset = 2;  // q_offset defaults to 2
      const Fwd whole = forward(full);
      ASSERT_TRUE(whole.st.ok());
      const I cuts[] = {0, 2, 5, 7};
      for (int s = 0; s < 3; ++s) {
        Case shard = full;
        shard.M = cuts[s + 1] - cuts[s];
        shard.p.q_offset = 2 + cuts[s];
        shard.q.assign(full.q.begin() + cuts[s] * HD, full.q.begin() + cuts[s + 1] * HD);
        const Fwd part = forward(shard);
        ASSERT_TRUE(part.st.ok());
        EXPECT_TRUE(AllClose(part.out, Vec(whole.out.begin() + cuts[s] * HD, whole.out.begin() + cuts[s + 1] * HD),
                             1e-13, 1e-12));
        for (I h = 0; h < 4; ++h)
          EXPECT_TRUE(AllClose(Vec(part.lse.begin() + h * shard.M, part.lse.begin() + (h + 1) * shard.M),
                               Vec(whole.lse.begin() + h * M + cuts[s], whole.lse.begin() + h * M + cuts[s + 1]),
                               1e-13, 1e-12));
      }
    }
}

// Key shards computed apart and merged with their lse: out = Σ_s exp(lse_s − lse)·out_s,
// lse = log Σ_s exp(lse_s). Holds for every encoding whose terms depend only on positions (FIRE's on
// the query's too; not CoPE, whose counts run over all keys of the row).
TEST(AttentionProperties, KeyShardsCombinedWithLseEqualTheWhole) {
  for (const Variant& var : variants_of({Encoding::kNope, Encoding::kRope, Encoding::kAlibi,
                                         Encoding::kT5, Encoding::kXL, Encoding::kKerple,
                                         Encoding::kSandwich, Encoding::kFire}))
    for (bool causal : {false, true}) {
      SCOPED_TRACE(trace(var, causal));
      const I B = 2, M = 4, N = 7, Hq = 4, Hkv = 2, D = 4;
      Case full = make_case(var, B, M, N, Hq, Hkv, D, causal, 111);
      full.p.q_offset = causal ? 0 : 3;  // causal: shard 2 sees nothing from the first queries
      const Fwd whole = forward(full);
      ASSERT_TRUE(whole.st.ok());
      const I cuts[] = {0, 3, 7};
      std::vector<Fwd> parts;
      for (int s = 0; s < 2; ++s) {
        Case shard = full;
        shard.N = cuts[s + 1] - cuts[s];
        shard.p.k_offset = cuts[s];
        shard.k.clear();
        shard.v.clear();
        for (I b = 0; b < B; ++b) {
          const I lo = (b * N + cuts[s]) * Hkv * D, hi = (b * N + cuts[s + 1]) * Hkv * D;
          shard.k.insert(shard.k.end(), full.k.begin() + lo, full.k.begin() + hi);
          shard.v.insert(shard.v.end(), full.v.begin() + lo, full.v.begin() + hi);
        }
        parts.push_back(forward(shard));
        ASSERT_TRUE(parts.back().st.ok()) << parts.back().st.message();
      }
      Vec out(whole.out.size(), 0.0), lse(whole.lse.size());
      int empty_rows = 0;
      for (I b = 0; b < B; ++b)
        for (I h = 0; h < Hq; ++h)
          for (I i = 0; i < M; ++i) {
            const std::size_t li = ix((b * Hq + h) * M + i);
            const double l0 = parts[0].lse[li], l1 = parts[1].lse[li];
            empty_rows += (l0 == -kInf) + (l1 == -kInf);
            const double mx = std::max(l0, l1);
            const double l = mx == -kInf ? -kInf : mx + std::log(std::exp(l0 - mx) + std::exp(l1 - mx));
            lse[li] = l;
            for (int s = 0; s < 2; ++s) {
              const double ls = parts[ix(s)].lse[li];
              if (ls == -kInf) continue;
              for (I d = 0; d < D; ++d) {
                const std::size_t oi = ix(((b * M + i) * Hq + h) * D + d);
                out[oi] += std::exp(ls - l) * parts[ix(s)].out[oi];
              }
            }
          }
      if (causal) {
        EXPECT_GT(empty_rows, 0);  // the merge saw rows with every key masked
      }
      EXPECT_TRUE(AllClose(out, whole.out, 1e-13, 1e-12));
      EXPECT_TRUE(AllClose(lse, whole.lse, 1e-13, 1e-12));
    }
}

// Grouped-query heads are the same as repeating each kv head Hq/Hkv times — forward and backward
// (dk, dv of a shared head are the sums over the query heads that read it).
TEST(AttentionProperties, GroupedQueryEqualsRepeatedKvHeads) {
  for (const Variant& var : all_variants())
    for (bool causal : {false, true}) {
      SCOPED_TRACE(trace(var, causal));
      const I B = 2, M = 3, N = 5, Hq = 4, Hkv = 2, D = 4, G = 2;
      Case gqa = make_case(var, B, M, N, Hq, Hkv, D, causal, 121);
      Case rep = gqa;
      rep.Hkv = Hq;
      rep.k.assign(ix(B * N * Hq * D), 0.0);
      rep.v.assign(rep.k.size(), 0.0);
      for (I r = 0; r < B * N; ++r)
        for (I h = 0; h < Hq; ++h)
          for (I d = 0; d < D; ++d) {
            rep.k[ix((r * Hq + h) * D + d)] = gqa.k[ix((r * Hkv + h / G) * D + d)];
            rep.v[ix((r * Hq + h) * D + d)] = gqa.v[ix((r * Hkv + h / G) * D + d)];
          }
      const Fwd a = forward(gqa), b = forward(rep);
      ASSERT_TRUE(a.st.ok() && b.st.ok());
      EXPECT_TRUE(AllClose(a.out, b.out, 1e-13, 1e-12));
      const Vec dout = randn(gqa.q.size(), 122);
      const Bwd ga = backward(gqa, dout), gb = backward(rep, dout);
      ASSERT_TRUE(ga.st.ok() && gb.st.ok());
      EXPECT_TRUE(AllClose(ga.dq, gb.dq, 1e-13, 1e-12));
      Vec dk(ga.dk.size(), 0.0), dv(ga.dv.size(), 0.0);
      for (I r = 0; r < B * N; ++r)
        for (I h = 0; h < Hq; ++h)
          for (I d = 0; d < D; ++d) {
            dk[ix((r * Hkv + h / G) * D + d)] += gb.dk[ix((r * Hq + h) * D + d)];
            dv[ix((r * Hkv + h / G) * D + d)] += gb.dv[ix((r * Hq + h) * D + d)];
          }
      EXPECT_TRUE(AllClose(ga.dk, dk, 1e-13, 1e-12));
      EXPECT_TRUE(AllClose(ga.dv, dv, 1e-13, 1e-12));
      EXPECT_TRUE(AllClose(ga.dweights, gb.dweights, 1e-13, 1e-12));
      EXPECT_TRUE(AllClose(ga.dW, gb.dW, 1e-13, 1e-12));
      EXPECT_TRUE(AllClose(ga.dtable, gb.dtable, 1e-13, 1e-12));
      for (auto m : {&Bwd::dr1, &Bwd::dr2, &Bwd::dfw1, &Bwd::dfb1, &Bwd::dfw2, &Bwd::dfb2, &Bwd::dfc, &Bwd::dfL})
        EXPECT_TRUE(AllClose(ga.*m, gb.*m, 1e-13, 1e-12));
    }
}

// Every encoding here is relative: moving queries and keys together changes nothing (RoPE only to
// rounding of the angles) — but FIRE once its queries pass the threshold L: ψ(max(L, i)) then grows
// with the query's position (fire_long_threshold keeps every query below L and is invariant).
TEST(AttentionProperties, ShiftingBothOffsetsChangesNothing) {
  for (const Variant& var : all_variants())
    for (bool causal : {false, true}) {
      SCOPED_TRACE(trace(var, causal));
      Case c = make_case(var, 1, 4, 6, 4, 2, 4, causal, 131);
      c.p.k_offset = 2;
      c.p.q_offset = 3;
      const Fwd a = forward(c);
      c.p.k_offset += 1000;
      *c.p.q_offset += 1000;
      const Fwd b = forward(c);
      ASSERT_TRUE(a.st.ok() && b.st.ok());
      if (var.enc == Encoding::kFire && var.fire_L < 1000) {
        EXPECT_GT(max_abs_diff(b.out, a.out), 1e-6);
      } else {
        EXPECT_TRUE(AllClose(b.out, a.out, 1e-10, 1e-9));
      }
    }
}

// Queries before every key (causal), and no keys at all: out = 0, lse = −inf, gradients finite and 0.
TEST(AttentionProperties, RowsWithEveryKeyMaskedGiveZeroAndMinusInfinity) {
  for (const Variant& var : all_variants()) {
    SCOPED_TRACE(var.name);
    Case c = make_case(var, 1, 3, 4, 2, 2, 4, true, 141);
    c.p.q_offset = -2;  // queries at −2, −1, 0 against keys 0..3: rows 0 and 1 see nothing
    const Fwd f = forward(c);
    ASSERT_TRUE(f.st.ok()) << f.st.message();
    for (I h = 0; h < 2; ++h) {
      EXPECT_EQ(f.lse[ix(h * 3 + 0)], -kInf);
      EXPECT_EQ(f.lse[ix(h * 3 + 1)], -kInf);
      EXPECT_TRUE(std::isfinite(f.lse[ix(h * 3 + 2)]));
    }
    for (I e = 0; e < 16; ++e) EXPECT_EQ(f.out[ix(e)], 0.0);
    const Fwd want = naive(c);
    EXPECT_TRUE(AllClose(f.out, want.out, 1e-12, 1e-10));
    const Bwd g = backward(c, randn(c.q.size(), 142));
    ASSERT_TRUE(g.st.ok());
    for (const Vec* x : {&g.dq, &g.dk, &g.dv, &g.dweights, &g.du, &g.dvb, &g.dW, &g.dtable, &g.dr1, &g.dr2,
                         &g.dfw1, &g.dfb1, &g.dfw2, &g.dfb2, &g.dfc, &g.dfL})
      for (double e : *x) EXPECT_TRUE(std::isfinite(e));
    for (I e = 0; e < 16; ++e) EXPECT_EQ(g.dq[ix(e)], 0.0);
    check_all_grads(c, 143);

    Case none = make_case(var, 1, 2, 0, 2, 2, 4, false, 144);  // N = 0
    none.k.assign(1, 0.0);  // a present (non-null) buffer of zero elements
    none.v.assign(1, 0.0);
    const Fwd fn = forward(none);
    ASSERT_TRUE(fn.st.ok()) << fn.st.message();
    for (double e : fn.out) EXPECT_EQ(e, 0.0);
    for (double e : fn.lse) EXPECT_EQ(e, -kInf);
  }
}

}  // namespace
}  // namespace posenc
