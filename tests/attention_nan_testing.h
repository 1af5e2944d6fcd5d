// The fixtures of the non-finite-input tests of the attention (test_attention_nan.cc): a problem
// with a NaN or ±inf placed in q, k or v (Spot), the NaNs the masking rule predicts from the mask
// alone (expect), and the check of the fused kernels, the dispatcher and the reference against it.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "attention/attention_fused.h"
#include "attention/attention_tiles.h"
#include "posenc/attention.h"
#include "posenc/half.h"
#include "posenc/threads.h"
#include "testing.h"
#include "typed_tensor.h"

namespace posenc::attention_nan_testing {

using ::posenc::testing::AllClose;
using ::posenc::testing::randn;
using I = std::int64_t;
using Vec = std::vector<double>;
using Mask = std::vector<bool>;

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

using Tensor = testing::TypedTensor;

enum class Enc { kNope, kRope, kAlibi, kAlibiLearned, kT5, kKerple, kSandwich, kFire, kXL, kCope };
inline const char* enc_name(Enc e) {
  switch (e) {
    case Enc::kNope: return "nope";
    case Enc::kRope: return "rope";
    case Enc::kAlibi: return "alibi";
    case Enc::kAlibiLearned: return "alibi_learned";
    case Enc::kT5: return "t5";
    case Enc::kKerple: return "kerple";
    case Enc::kSandwich: return "sandwich";
    case Enc::kFire: return "fire";
    case Enc::kXL: return "xl";
    case Enc::kCope: return "cope";
  }
  return "?";
}

// Where the special value goes: tensor (q, k or v), batch row, token, head, dimension.
enum class In { kQ, kK, kV, kDout };
struct Spot {
  In in = In::kQ;
  I b = 0, t = 0, h = 0, e = 0;
  double value = kNaN;
};

struct Shape {
  I B, M, N, Hq, Hkv, D;
  std::optional<I> q_off = std::nullopt;
  I k_off = 0;
};

// A parameter gradient buffer and, where it is laid out per query head, each element's head.
struct Param {
  std::string name;
  Vec got, want;
  std::vector<I> head;  // empty: shared by the heads
};

// One problem: the encoding's parameters, random inputs (rounded to the dtype), the spot.
struct Problem {
  Enc enc;
  bool causal;
  DType dt;
  Shape s;
  AttentionParams p;
  Vec slopes, weights, r1, r2, w1, b1, w2, b2, c, L, u, vb, W, table;
  I R = 8, npos = 12, fire_w = 5;

  Problem(Enc e, bool cz, DType t, Shape sh, std::uint64_t seed) : enc(e), causal(cz), dt(t), s(sh) {
    p.causal = cz;
    p.q_offset = sh.q_off;
    p.k_offset = sh.k_off;
    switch (e) {
      case Enc::kNope: p.encoding = Encoding::kNope; break;
      case Enc::kRope: p.encoding = Encoding::kRope; break;
      case Enc::kAlibi: p.encoding = Encoding::kAlibi; break;
      case Enc::kAlibiLearned:  // σ(w) ~ 0.05: every key keeps a weight above float32's underflow
        p.encoding = Encoding::kAlibi;
        p.alibi.variant = AlibiVariant::kLearned;
        weights = randn(ix(2 * sh.Hq), seed + 11, 0.5);
        for (double& w : weights) w -= 3;
        break;
      case Enc::kT5:
        p.encoding = Encoding::kT5;
        p.t5.num_buckets = 16;
        p.t5.max_distance = 40;
        weights = randn(ix(16 * sh.Hq), seed + 12);
        break;
      case Enc::kKerple:
        p.encoding = Encoding::kKerple;
        r1.assign(ix(sh.Hq), 0.7);
        r2.assign(ix(sh.Hq), 0.4);
        break;
      case Enc::kSandwich:
        p.encoding = Encoding::kSandwich;
        p.sandwich.sinusoid_dim = 16;
        break;
      case Enc::kFire:
        p.encoding = Encoding::kFire;
        w1 = randn(ix(fire_w), seed + 15, 1.5);
        b1 = randn(ix(fire_w), seed + 16, 0.7);
        w2 = randn(ix(sh.Hq * fire_w), seed + 17, 0.8);
        b2 = randn(ix(sh.Hq), seed + 18, 0.5);
        c = {0.15};
        L = {60.5};
        break;
      case Enc::kXL:
        p.encoding = Encoding::kXL;
        u = randn(ix(sh.Hq * sh.D), seed + 20, 0.3);
        vb = randn(ix(sh.Hq * sh.D), seed + 21, 0.3);
        W = randn(ix(sh.Hq * sh.D * R), seed + 22, 0.3);
        break;
      case Enc::kCope:
        p.encoding = Encoding::kCope;
        table = randn(ix(npos * sh.D), seed + 23, 0.5);
        break;
    }
  }
  I q_off() const { return s.q_off ? *s.q_off : s.k_off + s.N - s.M; }
  bool sees(I i, I j) const { return !causal || s.k_off + j <= q_off() + i; }
  static View v64(Vec& x, std::initializer_list<std::int64_t> shape) {
    return View::contiguous(x.data(), DType::kF64, shape);
  }
  EncodingTensors tensors() {
    EncodingTensors t;
    if (!weights.empty()) t.weights = v64(weights, {I(weights.size()) / s.Hq, s.Hq});
    if (!r1.empty()) t.r1 = v64(r1, {s.Hq}), t.r2 = v64(r2, {s.Hq});
    if (!w1.empty())
      t.fire = FireTensors{v64(w1, {fire_w}), v64(b1, {fire_w}), v64(w2, {s.Hq, fire_w}), v64(b2, {s.Hq}),
                           v64(c, {1}), v64(L, {1})};
    if (!u.empty()) t.u = v64(u, {s.Hq, s.D}), t.v = v64(vb, {s.Hq, s.D}), t.rel_proj = v64(W, {s.Hq, s.D, R});
    if (!table.empty()) t.table = v64(table, {npos, s.D});
    return t;
  }
  // The parameter gradients this encoding has, filled with `fill` (got) and 0 (want).
  std::vector<Param> params(double fill) const {
    std::vector<Param> r;
    auto add = [&](const char* name, std::size_t n, I per_head_stride, I heads_last) {
      Param pr{name, Vec(n, fill), Vec(n, 0.0), {}};
      if (per_head_stride > 0)
        for (std::size_t e = 0; e < n; ++e) pr.head.push_back(static_cast<I>(e) / per_head_stride % heads_last);
      r.push_back(std::move(pr));
    };
    if (!weights.empty()) add("dweights", weights.size(), 1, s.Hq);  // [·, Hq]
    if (!r1.empty()) add("dr1", r1.size(), 1, s.Hq), add("dr2", r2.size(), 1, s.Hq);
    if (!w1.empty()) {
      add("dw1", w1.size(), 0, 0), add("db1", b1.size(), 0, 0), add("dw2", w2.size(), fire_w, s.Hq);
      add("db2", b2.size(), 1, s.Hq), add("dc", 1, 0, 0), add("dL", 1, 0, 0);
    }
    if (!u.empty()) {
      add("du", u.size(), s.D, s.Hq), add("dv_bias", vb.size(), s.D, s.Hq);
      add("drel_proj", W.size(), s.D * R, s.Hq);
    }
    if (!table.empty()) add("dtable", table.size(), 0, 0);
    return r;
  }
  EncodingGrads grads(std::vector<Param>& ps, bool want) const {
    EncodingGrads g;
    auto at = [&](const char* name) -> Vec* {
      for (Param& x : ps)
        if (x.name == name) return want ? &x.want : &x.got;
      return nullptr;
    };
    if (Vec* x = at("dweights")) g.weights = v64(*x, {I(x->size()) / s.Hq, s.Hq});
    if (Vec* x = at("dr1")) g.r1 = v64(*x, {s.Hq}), g.r2 = v64(*at("dr2"), {s.Hq});
    if (Vec* x = at("dw1"))
      g.fire = FireTensors{v64(*x, {fire_w}), v64(*at("db1"), {fire_w}), v64(*at("dw2"), {s.Hq, fire_w}),
                           v64(*at("db2"), {s.Hq}), v64(*at("dc"), {1}), v64(*at("dL"), {1})};
    if (Vec* x = at("du"))
      g.u = v64(*x, {s.Hq, s.D}), g.v = v64(*at("dv_bias"), {s.Hq, s.D}), g.rel_proj = v64(*at("drel_proj"), {s.Hq, s.D, R});
    if (Vec* x = at("dtable")) g.table = v64(*x, {npos, s.D});
    return g;
  }
  std::vector<I> qshape() const { return {s.B, s.M, s.Hq, s.D}; }
  std::vector<I> kshape() const { return {s.B, s.N, s.Hkv, s.D}; }
  std::size_t qat(I b, I i, I h, I e) const { return ix(((b * s.M + i) * s.Hq + h) * s.D + e); }
  std::size_t kat(I b, I j, I kh, I e) const { return ix(((b * s.N + j) * s.Hkv + kh) * s.D + e); }
  std::size_t lat(I b, I h, I i) const { return ix((b * s.Hq + h) * s.M + i); }
};

// What the spot does to each row (b, h, i), from the mask alone (and, for ±inf in k, the sign of
// q_i there: the logit is +inf, a NaN row, or −inf, a key of weight 0).
enum class RowKind { kClean, kNaN, kValue, kChanged };  // kValue: a NaN in v_j reaches out_i[·, e]
                                                        // kChanged: finite, but not the clean result
struct Expect {
  std::vector<RowKind> row;  // [B, Hq, M]
  Mask out, lse, dq, dk, dv;
  std::vector<bool> head_hit;  // [Hq]: some row of this head is not clean
};

inline Expect expect(const Problem& pr, const Spot& sp, const Vec& q, const Vec& k) {
  const Shape& s = pr.s;
  const I G = s.Hq / s.Hkv;
  Expect x;
  x.row.assign(ix(s.B * s.Hq * s.M), RowKind::kClean);
  x.out.assign(ix(s.B * s.M * s.Hq * s.D), false);
  x.dq = x.out;
  x.dk.assign(ix(s.B * s.N * s.Hkv * s.D), false);
  x.dv = x.dk;
  x.lse.assign(ix(s.B * s.Hq * s.M), false);
  x.head_hit.assign(ix(s.Hq), false);
  if (sp.in == In::kDout) {  // the forward as clean; dq of the row, dk and dv[·, e] of the keys it sees
    x.head_hit[ix(sp.h)] = true;
    for (I j = 0; j < s.N; ++j)
      if (pr.sees(sp.t, j))
        for (I e = 0; e < s.D; ++e) {
          x.dq[pr.qat(sp.b, sp.t, sp.h, e)] = true;
          x.dk[pr.kat(sp.b, j, sp.h / G, e)] = true;
          x.dv[pr.kat(sp.b, j, sp.h / G, e)] = x.dv[pr.kat(sp.b, j, sp.h / G, e)] || e == sp.e;
        }
    return x;
  }
  for (I h = 0; h < s.Hq; ++h)
    for (I i = 0; i < s.M; ++i) {
      bool any = false;
      for (I j = 0; j < s.N; ++j) any = any || pr.sees(i, j);
      RowKind kind = RowKind::kClean;
      if (sp.in == In::kQ && h == sp.h && i == sp.t && any) kind = RowKind::kNaN;
      if (sp.in != In::kQ && h / G == sp.h && pr.sees(i, sp.t))
        kind = sp.in == In::kK ? RowKind::kNaN : RowKind::kValue;
      if (kind == RowKind::kNaN && sp.in == In::kK && std::isinf(sp.value) &&
          q[pr.qat(sp.b, i, h, sp.e)] * sp.value < 0)
        kind = RowKind::kChanged;
      x.row[pr.lat(sp.b, h, i)] = kind;
      if (kind == RowKind::kClean || kind == RowKind::kChanged) continue;
      x.head_hit[ix(h)] = true;
      for (I e = 0; e < s.D; ++e) {
        x.out[pr.qat(sp.b, i, h, e)] = kind == RowKind::kNaN || e == sp.e;
        x.dq[pr.qat(sp.b, i, h, e)] = true;
      }
      x.lse[pr.lat(sp.b, h, i)] = kind == RowKind::kNaN;
      for (I j = 0; j < s.N; ++j) {
        // ±inf in q: the keys whose logit is −inf have weight 0, as if masked
        const bool minus_inf = sp.in == In::kQ && std::isinf(sp.value) && k[pr.kat(sp.b, j, h / G, sp.e)] * sp.value < 0;
        if (pr.sees(i, j) && !minus_inf)
          for (I e = 0; e < s.D; ++e) {
            x.dk[pr.kat(sp.b, j, h / G, e)] = true;
            if (kind == RowKind::kNaN) x.dv[pr.kat(sp.b, j, h / G, e)] = true;
          }
      }
    }
  return x;
}

// Largest finite |x|.
inline double amax(const Vec& x) {
  double m = 1e-30;
  for (double v : x)
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

// got and want are NaN exactly where `nan` says, and the other elements agree within atol·scale +
// rtol·|want| (scale: the largest finite |want|, unless given).
::testing::AssertionResult Matches(const Vec& got, const Vec& want, const Mask& nan, double atol, double rtol,
                                   double scale = 0) {
  if (scale <= 0) scale = amax(want);
  Vec g, w;
  int bad = 0;
  std::string msg;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) != nan[i] || std::isnan(want[i]) != nan[i]) {
      if (bad++ < 5)
        msg += " [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " + std::to_string(want[i]) +
               (nan[i] ? " (NaN expected)" : " (finite expected)") + ";";
      continue;
    }
    if (nan[i]) continue;
    g.push_back(got[i]);
    w.push_back(want[i]);
  }
  if (bad) return ::testing::AssertionFailure() << bad << " elements with the wrong NaN-ness:" << msg;
  return AllClose(g, w, atol * scale, rtol);
}

struct Tol {
  double out, grad, param;
};
Tol tol(DType t) { return t == DType::kF32 ? Tol{2e-5, 1e-4, 1e-4} : Tol{8e-3, 1.6e-2, 2e-2}; }

// What the kernels wrote in the forward.
struct Got {
  Vec out, lse;
};

// Forward and backward of the fused kernels (or, with `dispatch`, posenc::attention_*) and the
// reference on the same inputs with the spot's value, held against the expected NaNs.
inline void check(Problem& pr, const Spot& sp, std::uint64_t seed, bool dispatch = false, Got* got = nullptr) {
  const Shape& s = pr.s;
  Tensor q(pr.dt, randn(Tensor::count(pr.qshape()), seed + 1), pr.qshape());
  Tensor k(pr.dt, randn(Tensor::count(pr.kshape()), seed + 2), pr.kshape());
  Tensor v(pr.dt, randn(Tensor::count(pr.kshape()), seed + 3), pr.kshape());
  Tensor dout(pr.dt, randn(Tensor::count(pr.qshape()), seed + 4), pr.qshape());
  const Vec q0 = q.d, k0 = k.d, v0 = v.d;
  Tensor& x = sp.in == In::kQ ? q : sp.in == In::kK ? k : sp.in == In::kV ? v : dout;
  const bool qside = sp.in == In::kQ || sp.in == In::kDout;
  x.set(qside ? pr.qat(sp.b, sp.t, sp.h, sp.e) : pr.kat(sp.b, sp.t, sp.h, sp.e), sp.value);
  const Expect ex = expect(pr, sp, q.d, k.d);
  const EncodingTensors t = pr.tensors();
  const Tol tl = tol(pr.dt);
  const std::vector<I> lshape{s.B, s.Hq, s.M};

  // forward
  Tensor out(pr.dt, pr.qshape());
  Vec lse(ix(s.B * s.Hq * s.M), 7.0), want(out.d.size()), want_lse(lse.size());
  const View lv = View::contiguous(lse.data(), DType::kF64, lshape);
  const Status st = dispatch ? attention_forward(pr.p, q.view(), k.view(), v.view(), t, out.view(), lv)
                             : fused::attention_forward(pr.p, q.view(), k.view(), v.view(), t, out.view(), lv);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(reference::attention_forward(pr.p, q.view64(), k.view64(), v.view64(), t,
                                           View::contiguous(want.data(), DType::kF64, pr.qshape()),
                                           View::contiguous(want_lse.data(), DType::kF64, lshape))
                  .ok());
  EXPECT_TRUE(Matches(out.values(), want, ex.out, tl.out, tl.out)) << "out";
  EXPECT_TRUE(Matches(lse, want_lse, ex.lse, 1e-4, 1e-5, 1.0)) << "lse";
  if (got) *got = Got{out.values(), lse};
  // the rows the spot does not reach: as with clean inputs (the reference, exactly)
  {
    Vec q1 = q0, k1 = k0, v1 = v0, clean(want.size()), clean_lse(lse.size());
    ASSERT_TRUE(reference::attention_forward(pr.p, View::contiguous(q1.data(), DType::kF64, pr.qshape()),
                                             View::contiguous(k1.data(), DType::kF64, pr.kshape()),
                                             View::contiguous(v1.data(), DType::kF64, pr.kshape()), t,
                                             View::contiguous(clean.data(), DType::kF64, pr.qshape()),
                                             View::contiguous(clean_lse.data(), DType::kF64, lshape))
                    .ok());
    int differ = 0;
    for (I b = 0; b < s.B; ++b)
      for (I h = 0; h < s.Hq; ++h)
        for (I i = 0; i < s.M; ++i) {
          if (b == sp.b && ex.row[pr.lat(b, h, i)] != RowKind::kClean) continue;
          differ += clean_lse[pr.lat(b, h, i)] != want_lse[pr.lat(b, h, i)];
          for (I e = 0; e < s.D; ++e) differ += clean[pr.qat(b, i, h, e)] != want[pr.qat(b, i, h, e)];
        }
    EXPECT_EQ(differ, 0) << "rows the spot does not reach differ from the clean inputs' in the reference";
  }

  // backward
  Tensor dq(pr.dt, pr.qshape()), dk(pr.dt, pr.kshape()), dv(pr.dt, pr.kshape());
  std::vector<Param> ps = pr.params(9.0);
  const EncodingGrads g = pr.grads(ps, false), gw = pr.grads(ps, true);
  const Status sb = dispatch ? attention_backward(pr.p, q.view(), k.view(), v.view(), t, dout.view(), dq.view(),
                                                  dk.view(), dv.view(), g)
                             : fused::attention_backward(pr.p, q.view(), k.view(), v.view(), t, dout.view(),
                                                         dq.view(), dk.view(), dv.view(), g);
  ASSERT_TRUE(sb.ok()) << sb.message();
  Vec wq(q.d.size()), wk(k.d.size()), wv(v.d.size());
  ASSERT_TRUE(reference::attention_backward(pr.p, q.view64(), k.view64(), v.view64(), t, dout.view64(),
                                            View::contiguous(wq.data(), DType::kF64, pr.qshape()),
                                            View::contiguous(wk.data(), DType::kF64, pr.kshape()),
                                            View::contiguous(wv.data(), DType::kF64, pr.kshape()), gw)
                  .ok());
  EXPECT_TRUE(Matches(dq.values(), wq, ex.dq, tl.grad, tl.grad)) << "dq";
  EXPECT_TRUE(Matches(dk.values(), wk, ex.dk, tl.grad, tl.grad)) << "dk";
  EXPECT_TRUE(Matches(dv.values(), wv, ex.dv, tl.grad, tl.grad)) << "dv";
  // Parameter gradients: per-head ones finite for the heads no reached row belongs to and NaN somewhere
  // in a head that has one, shared ones NaN somewhere when a row is reached; NaN where the reference's
  // are, the rest close to it relative to the largest of them all (FIRE's db2 is Σ dS over whole rows:
  // 0 up to rounding).
  bool any_hit = false;
  for (bool h : ex.head_hit) any_hit = any_hit || h;
  double pscale = 1e-30;
  for (const Param& y : ps) pscale = std::max(pscale, amax(y.want));
  for (const Param& x : ps) {
    Mask nan(x.want.size());
    bool some = false;
    for (std::size_t e = 0; e < nan.size(); ++e) {
      nan[e] = std::isnan(x.want[e]);
      some = some || nan[e];
      if (!x.head.empty() && !ex.head_hit[ix(x.head[e])]) {
        EXPECT_FALSE(nan[e]) << x.name << "[" << e << "]";
      }
    }
    if (!x.head.empty())
      for (I h = 0; h < s.Hq; ++h) {
        if (!ex.head_hit[ix(h)]) continue;
        bool nh = false;
        for (std::size_t e = 0; e < nan.size(); ++e) nh = nh || (x.head[e] == h && nan[e]);
        EXPECT_TRUE(nh) << x.name << ": no NaN in head " << h;
      }
    if (x.head.empty()) {
      EXPECT_EQ(some, any_hit) << x.name;
    }
    EXPECT_TRUE(Matches(x.got, x.want, nan, tl.param, 1e-3, pscale)) << x.name;
  }
}

}  // namespace posenc::attention_nan_testing
