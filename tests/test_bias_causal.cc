// BiasGeometry::causal for every logit bias, reference and public entry points: the causal bias is
// the open one with −inf where the key's position exceeds the query's (the mask computed here from
// the positions), and its backward is the open backward of dbias with those entries zeroed, whatever
// the masked entries of dbias hold.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "posenc/bias.h"
#include "posenc/reference.h"
#include "testing.h"

namespace posenc {
namespace {

using testing::V;
using Vec = std::vector<double>;
using Sz = std::size_t;
using I = std::int64_t;

constexpr I kH = 2;

// One bias function pair over float64 views: fwd(g, out [H, M, N]); bwd(g, dbias) → the gradients of
// every learned tensor, concatenated (empty for a bias without parameters).
struct Bias {
  std::string name;
  std::function<Status(const BiasGeometry&, const View&)> fwd;
  std::function<Status(const BiasGeometry&, const View&, Vec*)> bwd;
};

// The learned tensors of the biases, shared by the closures below.
struct Params {
  Vec alibi_w = {0.3, -0.7, 1.1, 0.2};                       // [2, H]
  Vec t5_w = testing::randn(32 * kH, 3, 0.5);                // [32, H]
  Vec r1 = {0.6, 1.3}, r2 = {0.4, 0.9};                      // [H]
  Vec w1 = testing::randn(8, 5), b1 = testing::randn(8, 6);  // FIRE, width 8
  Vec w2 = testing::randn(kH * 8, 7, 0.3), b2 = {0.1, -0.2}, c = {0.1}, thr = {16.0};
  FireTensors fire() { return {V(w1, {8}), V(b1, {8}), V(w2, {kH, 8}), V(b2, {kH}), V(c, {1}), V(thr, {1})}; }
};

std::vector<Bias> biases(Params& P, bool reference) {
  const AlibiParams learned{AlibiVariant::kLearned};
  const AlibiParams nonsym{AlibiVariant::kNonsymmetric};
  auto ab = reference ? &reference::alibi_bias : &alibi_bias;
  auto abb = reference ? &reference::alibi_bias_backward : &alibi_bias_backward;
  auto tb = reference ? &reference::t5_bias : &t5_bias;
  auto tbb = reference ? &reference::t5_bias_backward : &t5_bias_backward;
  auto kb = reference ? &reference::kerple_bias : &kerple_bias;
  auto kbb = reference ? &reference::kerple_bias_backward : &kerple_bias_backward;
  auto sb = reference ? &reference::sandwich_bias : &sandwich_bias;
  auto fb = reference ? &reference::fire_bias : &fire_bias;
  auto fbb = reference ? &reference::fire_bias_backward : &fire_bias_backward;
  std::vector<Bias> r;
  r.push_back({"alibi learned", [=, &P](const BiasGeometry& g, const View& o) { return ab(learned, g, View{}, V(P.alibi_w, {2, kH}), o); },
               [=, &P](const BiasGeometry& g, const View& d, Vec* grad) {
                 grad->assign(2 * kH, 0.0);
                 return abb(learned, g, V(P.alibi_w, {2, kH}), d, V(*grad, {2, kH}));
               }});
  r.push_back({"alibi nonsymmetric", [=](const BiasGeometry& g, const View& o) { return ab(nonsym, g, View{}, View{}, o); },
               nullptr});
  r.push_back({"t5", [=, &P](const BiasGeometry& g, const View& o) { return tb(T5Params{}, g, V(P.t5_w, {32, kH}), o); },
               [=](const BiasGeometry& g, const View& d, Vec* grad) {
                 grad->assign(32 * kH, 0.0);
                 return tbb(T5Params{}, g, d, V(*grad, {32, kH}));
               }});
  r.push_back({"kerple", [=, &P](const BiasGeometry& g, const View& o) { return kb({}, g, V(P.r1, {kH}), V(P.r2, {kH}), o); },
               [=, &P](const BiasGeometry& g, const View& d, Vec* grad) {
                 grad->assign(2 * kH, 0.0);
                 Vec d1(kH), d2(kH);
                 const Status st = kbb({}, g, V(P.r1, {kH}), V(P.r2, {kH}), d, V(d1, {kH}), V(d2, {kH}));
                 for (I h = 0; h < kH; ++h) (*grad)[Sz(h)] = d1[Sz(h)], (*grad)[Sz(kH + h)] = d2[Sz(h)];
                 return st;
               }});
  r.push_back({"sandwich", [=](const BiasGeometry& g, const View& o) { return sb(SandwichParams{}, g, o); }, nullptr});
  r.push_back({"fire", [=, &P](const BiasGeometry& g, const View& o) { return fb({}, g, P.fire(), o); },
               [=, &P](const BiasGeometry& g, const View& d, Vec* grad) {
                 Vec gw1(8), gb1(8), gw2(kH * 8), gb2(kH), gc(1), gt(1);
                 const FireTensors gr{V(gw1, {8}), V(gb1, {8}), V(gw2, {kH, 8}), V(gb2, {kH}), V(gc, {1}), V(gt, {1})};
                 const Status st = fbb({}, g, P.fire(), d, gr);
                 *grad = gw1;
                 for (const Vec* v : {&gb1, &gw2, &gb2, &gc, &gt}) grad->insert(grad->end(), v->begin(), v->end());
                 return st;
               }});
  return r;
}

// Geometries: the default query offset (the last M of N), queries before the keys' start (every
// key masked for the first rows), and queries past the last key (nothing masked).
std::vector<BiasGeometry> geometries() {
  std::vector<BiasGeometry> gs;
  gs.push_back({kH, 5, 9, std::nullopt, 0, true});
  gs.push_back({kH, 6, 7, I{1}, 3, true});
  gs.push_back({kH, 3, 4, I{20}, 2, true});
  return gs;
}

bool masked_here(const BiasGeometry& g, I i, I j) {
  const I q = g.q_offset ? *g.q_offset : g.k_offset + g.k_len - g.q_len;
  return g.k_offset + j > q + i;
}

TEST(BiasCausal, ForwardIsTheOpenBiasMasked) {
  Params P;
  for (bool reference : {true, false})
    for (const Bias& b : biases(P, reference))
      for (const BiasGeometry& g : geometries()) {
        SCOPED_TRACE(b.name + (reference ? " reference" : " public") + " M=" + std::to_string(g.q_len));
        BiasGeometry open = g;
        open.causal = false;
        const Sz n = Sz(kH * g.q_len * g.k_len);
        Vec c(n, 7.0), o(n, 7.0);
        ASSERT_TRUE(b.fwd(g, V(c, {kH, g.q_len, g.k_len})).ok());
        ASSERT_TRUE(b.fwd(open, V(o, {kH, g.q_len, g.k_len})).ok());
        for (I h = 0; h < kH; ++h)
          for (I i = 0; i < g.q_len; ++i)
            for (I j = 0; j < g.k_len; ++j) {
              const Sz e = Sz((h * g.q_len + i) * g.k_len + j);
              if (masked_here(g, i, j))
                EXPECT_EQ(c[e], -std::numeric_limits<double>::infinity()) << h << " " << i << " " << j;
              else
                EXPECT_EQ(c[e], o[e]) << h << " " << i << " " << j;
            }
      }
}

TEST(BiasCausal, BackwardIgnoresTheMaskedEntries) {
  Params P;
  for (bool reference : {true, false})
    for (const Bias& b : biases(P, reference)) {
      if (!b.bwd) continue;
      for (const BiasGeometry& g : geometries()) {
        SCOPED_TRACE(b.name + (reference ? " reference" : " public") + " M=" + std::to_string(g.q_len));
        BiasGeometry open = g;
        open.causal = false;
        Vec d = testing::randn(Sz(kH * g.q_len * g.k_len), 11), zeroed = d;
        for (I h = 0; h < kH; ++h)
          for (I i = 0; i < g.q_len; ++i)
            for (I j = 0; j < g.k_len; ++j)
              if (masked_here(g, i, j)) {
                const Sz e = Sz((h * g.q_len + i) * g.k_len + j);
                d[e] = std::numeric_limits<double>::quiet_NaN();  // what a masked entry holds does not matter
                zeroed[e] = 0.0;
              }
        Vec got, want;
        ASSERT_TRUE(b.bwd(g, V(d, {kH, g.q_len, g.k_len}), &got).ok());
        ASSERT_TRUE(b.bwd(open, V(zeroed, {kH, g.q_len, g.k_len}), &want).ok());
        ASSERT_EQ(got.size(), want.size());
        for (Sz e = 0; e < got.size(); ++e) EXPECT_EQ(got[e], want[e]) << e;
      }
    }
}

// The public fast paths in float32: the same mask, −inf in the output's dtype.
TEST(BiasCausal, Float32FastFill) {
  const BiasGeometry g{kH, 7, 12, std::nullopt, 0, true};
  BiasGeometry open = g;
  open.causal = false;
  std::vector<float> c(Sz(kH * 7 * 12), 7.f), o = c;
  ASSERT_TRUE(alibi_bias({}, g, View{}, View{}, V(c, {kH, 7, 12})).ok());
  ASSERT_TRUE(alibi_bias({}, open, View{}, View{}, V(o, {kH, 7, 12})).ok());
  for (I h = 0; h < kH; ++h)
    for (I i = 0; i < 7; ++i)
      for (I j = 0; j < 12; ++j) {
        const Sz e = Sz((h * 7 + i) * 12 + j);
        EXPECT_EQ(c[e], masked_here(g, i, j) ? -std::numeric_limits<float>::infinity() : o[e]);
      }
}

// The backward's masked copy in float32 (dbias's own dtype): T5's public path, NaN under the mask.
TEST(BiasCausal, Float32Backward) {
  const BiasGeometry g{kH, 5, 9, std::nullopt, 0, true};
  BiasGeometry open = g;
  open.causal = false;
  const Vec r = testing::randn(Sz(kH * 5 * 9), 21);
  std::vector<float> d(r.begin(), r.end()), zeroed = d, dw(Sz(32 * kH), 7.f), want(Sz(32 * kH), 7.f);
  for (I h = 0; h < kH; ++h)
    for (I i = 0; i < 5; ++i)
      for (I j = 0; j < 9; ++j)
        if (masked_here(g, i, j)) {
          d[Sz((h * 5 + i) * 9 + j)] = std::numeric_limits<float>::quiet_NaN();
          zeroed[Sz((h * 5 + i) * 9 + j)] = 0.f;
        }
  ASSERT_TRUE(t5_bias_backward(T5Params{}, g, V(d, {kH, 5, 9}), V(dw, {32, kH})).ok());
  ASSERT_TRUE(t5_bias_backward(T5Params{}, open, V(zeroed, {kH, 5, 9}), V(want, {32, kH})).ok());
  for (Sz e = 0; e < dw.size(); ++e) EXPECT_EQ(dw[e], want[e]) << e;
}

// A bad dbias under the mask gets the function's own error, not one from the mask's copy.
TEST(BiasCausal, BadDbiasNamesTheArgument) {
  const BiasGeometry g{kH, 3, 4, std::nullopt, 0, true};
  Vec d(5, 0.0), dw(32 * kH);
  const Status st = t5_bias_backward(T5Params{}, g, V(d, {1, 5}), V(dw, {32, kH}));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.arg(), "dbias");
}

}  // namespace
}  // namespace posenc
