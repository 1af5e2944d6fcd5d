// attention_backward_saved, public and reference, for the encodings whose statistics a key shard
// cannot reuse (cope; a RoPE scheme that reads the call's own length, without seq_len) and ALiBi:
// given the forward's own out and lse, the gradients of attention_backward bit for bit (float32 out)
// where it runs the forward again, within float32 rounding where it takes the stored path (D summed
// as Σ P·dP), at sizes the dispatcher sends to the kernels and to the reference; and its errors,
// which name "out" or "lse". The other encodings: test_attention_fast.cc, test_attention_xl_fast.cc.
// Never times anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention_fused.h"
#include "posenc/attention.h"
#include "testing.h"

namespace posenc {
namespace {

using ::posenc::testing::randn;
using I = std::int64_t;
using Vec = std::vector<double>;

std::size_t ix(I i) { return static_cast<std::size_t>(i); }

std::vector<float> randf(std::size_t n, std::uint64_t seed) {
  const Vec d = randn(n, seed);
  return std::vector<float>(d.begin(), d.end());
}

View F(std::vector<float>& x, std::vector<I> shape) { return View::contiguous(x.data(), DType::kF32, shape); }

struct Case {
  const char* name;
  AttentionParams p;
  bool cope = false;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  AttentionParams p;
  p.encoding = Encoding::kCope;
  p.causal = true;
  c.push_back({"cope", p, true});
  p = AttentionParams{};
  p.encoding = Encoding::kRope;
  p.rope.rope_type = RopeType::kDynamic;
  p.rope.factor = 2;
  p.rope.original_max_position = 16;  // the call's own length (> 16) scales the frequencies
  p.causal = true;
  c.push_back({"rope_dynamic_without_seq_len", p});
  p = AttentionParams{};
  p.encoding = Encoding::kAlibi;
  c.push_back({"alibi_full", p});
  return c;
}

// dq, dk, dv (and dtable for cope) of attention_backward and of attention_backward_saved given the
// public forward's out and lse; B = 2, Hq = 4, Hkv = 2, D = 32. stored: attention_backward may take
// the stored path (fused::set_score_store_limit), whose D rounds otherwise: equal within 1e-5 of
// each output's largest entry; else bit for bit.
void check(const Case& cs, I L, bool reference_api, bool stored) {
  const I B = 2, Hq = 4, Hkv = 2, D = 32, npos = 8;
  const std::vector<I> qs{B, L, Hq, D}, ks{B, L, Hkv, D};
  std::vector<float> q = randf(ix(B * L * Hq * D), 1), k = randf(ix(B * L * Hkv * D), 2),
                     v = randf(ix(B * L * Hkv * D), 3), dout = randf(q.size(), 4), table = randf(ix(npos * D), 5);
  std::vector<float> out(q.size());
  Vec lse(ix(B * Hq * L));
  const View lv = View::contiguous(lse.data(), DType::kF64, {B, Hq, L});
  EncodingTensors t;
  if (cs.cope) t.table = F(table, {npos, D});
  const Status fs = reference_api ? reference::attention_forward(cs.p, F(q, qs), F(k, ks), F(v, ks), t, F(out, qs), lv)
                                  : attention_forward(cs.p, F(q, qs), F(k, ks), F(v, ks), t, F(out, qs), lv);
  ASSERT_TRUE(fs.ok()) << fs.message();
  std::vector<std::vector<float>> res[2];
  for (int saved : {0, 1}) {
    std::vector<float> dq(q.size(), 9.f), dk(k.size(), 9.f), dv(v.size(), 9.f), dt(table.size(), 9.f);
    EncodingGrads g;
    if (cs.cope) g.table = F(dt, {npos, D});
    Status st;
    const fused::ScoreStoreLimit limit(stored ? -1 : 0);
    if (reference_api)
      st = saved ? reference::attention_backward_saved(cs.p, F(q, qs), F(k, ks), F(v, ks), t, F(out, qs), lv,
                                                      F(dout, qs), F(dq, qs), F(dk, ks), F(dv, ks), g)
                 : reference::attention_backward(cs.p, F(q, qs), F(k, ks), F(v, ks), t, F(dout, qs), F(dq, qs),
                                                 F(dk, ks), F(dv, ks), g);
    else
      st = saved ? attention_backward_saved(cs.p, F(q, qs), F(k, ks), F(v, ks), t, F(out, qs), lv, F(dout, qs),
                                            F(dq, qs), F(dk, ks), F(dv, ks), g)
                 : attention_backward(cs.p, F(q, qs), F(k, ks), F(v, ks), t, F(dout, qs), F(dq, qs), F(dk, ks),
                                      F(dv, ks), g);
    ASSERT_TRUE(st.ok()) << st.message();
    res[saved] = {dq, dk, dv, dt};
  }
  for (std::size_t i = 0; i < res[0].size(); ++i) {
    if (!stored) {
      EXPECT_EQ(res[0][i], res[1][i]) << "output " << i;
      continue;
    }
    float top = 0, worst = 0;
    for (std::size_t e = 0; e < res[1][i].size(); ++e)
      top = std::max(top, std::abs(res[1][i][e])), worst = std::max(worst, std::abs(res[0][i][e] - res[1][i][e]));
    EXPECT_LE(worst, 1e-5f * top) << "output " << i;
  }
  // not the untouched fill: the gradients were written
  EXPECT_NE(res[1][0][0], 9.f);
}

TEST(AttentionSaved, EqualsTheBackward) {
  for (const Case& cs : cases())
    for (I L : {I{5}, I{150}})  // the reference's size, then the kernels'
      for (bool reference_api : {false, true})
        for (bool stored : {false, true}) {
          SCOPED_TRACE(std::string(cs.name) + " L = " + std::to_string(L) + (reference_api ? " reference" : "") +
                       (stored ? " stored" : ""));
          check(cs, L, reference_api, stored);
        }
}

// out missing, of another dtype than q or another shape; lse missing, not float64 or of another
// shape: an error naming the argument, from the public function and the reference, nothing written.
TEST(AttentionSaved, ErrorsNameOutOrLse) {
  const I B = 1, L = 150, H = 2, D = 32;  // a size for the kernels
  const std::vector<I> qs{B, L, H, D};
  std::vector<float> q = randf(ix(B * L * H * D), 1), k = randf(q.size(), 2), v = randf(q.size(), 3),
                     dout = randf(q.size(), 4), out(q.size()), out_short(ix(B * (L - 1) * H * D));
  std::vector<float> dq(q.size(), 9.f), lse32(ix(B * H * L));
  Vec out64(q.size()), lse(ix(B * H * L)), lse_long(ix(B * H * (L + 1)));
  const View lv = View::contiguous(lse.data(), DType::kF64, {B, H, L});
  AttentionParams p;
  ASSERT_TRUE(attention_forward(p, F(q, qs), F(k, qs), F(v, qs), {}, F(out, qs), lv).ok());
  struct Bad {
    const char* arg;
    View out, lse;
  };
  const Bad bads[] = {
      {"out", View{}, lv},
      {"out", View::contiguous(out64.data(), DType::kF64, qs), lv},
      {"out", F(out_short, {B, L - 1, H, D}), lv},
      {"lse", F(out, qs), View{}},
      {"lse", F(out, qs), View::contiguous(lse32.data(), DType::kF32, {B, H, L})},
      {"lse", F(out, qs), View::contiguous(lse_long.data(), DType::kF64, {B, H, L + 1})},
  };
  for (const Bad& b : bads)
    for (bool reference_api : {false, true}) {
      const Status st =
          reference_api ? reference::attention_backward_saved(p, F(q, qs), F(k, qs), F(v, qs), {}, b.out, b.lse,
                                                              F(dout, qs), F(dq, qs), View{}, View{}, {})
                        : attention_backward_saved(p, F(q, qs), F(k, qs), F(v, qs), {}, b.out, b.lse, F(dout, qs),
                                                   F(dq, qs), View{}, View{}, {});
      EXPECT_EQ(st.code(), Code::kInvalidArgument) << b.arg;
      EXPECT_EQ(st.message().rfind(std::string(b.arg) + ":", 0), 0u) << st.message();
      for (float x : dq) ASSERT_EQ(x, 9.f) << "dq written on an error";
    }
}

}  // namespace
}  // namespace posenc
