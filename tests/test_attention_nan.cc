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

namespace posenc {
namespace {

using ::posenc::testing::AllClose;
using ::posenc::testing::randn;
using I = std::int64_t;
using Vec = std::vector<double>;
using Mask = std::vector<bool>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::size_t ix(I i) { return static_cast<std::size_t>(i); }

using Tensor = testing::TypedTensor;

enum class Enc { kNope, kRope, kAlibi, kAlibiLearned, kT5, kKerple, kSandwich, kFire, kXL, kCope };
const char* enc_name(Enc e) {
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

Expect expect(const Problem& pr, const Spot& sp, const Vec& q, const Vec& k) {
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
double amax(const Vec& x) {
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
void check(Problem& pr, const Spot& sp, std::uint64_t seed, bool dispatch = false, Got* got = nullptr) {
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

// The scan that decides the careful steps: every position of every length, NaN, +inf and −inf; the
// largest finite float passes.
TEST(AttentionNaNMore, FinitenessScan) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const attn_fast::Simd sd = attn_fast::simd();
    SCOPED_TRACE(hwy::TargetName(target));
    for (std::size_t n = 0; n <= 40; ++n) {
      std::vector<float> x(n, 1.f);
      for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 3) - 1.f;
      if (n) x[n / 2] = std::numeric_limits<float>::max();
      EXPECT_TRUE(sd.finite(x.data(), n)) << n;
      for (std::size_t at = 0; at < n; ++at)
        for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
          std::vector<float> y = x;
          y[at] = bad;
          EXPECT_FALSE(sd.finite(y.data(), n)) << n << " " << at << " " << bad;
        }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The pass over a whole k or v [B, L, H, D] (all_finite) on every layout it walks differently, in
// float32, bfloat16 and float16: contiguous, tokens of H·D values inside a wider row (a packed q|k|v
// buffer), heads apart, and a strided last dimension; a NaN or ±inf at every element is found, and
// nothing outside the view is read (the padding holds NaN).
TEST(AttentionNaNMore, FinitenessOfAView) {
  const I B = 2, L = 3, H = 2, D = 9;  // H·D = 18: a vector and a tail on every target
  struct Layout {
    const char* name;
    std::array<I, 4> strides;
  };
  const Layout layouts[] = {{"contiguous", {L * H * D, H * D, D, 1}},
                            {"packed tokens", {L * 3 * H * D, 3 * H * D, D, 1}},
                            {"heads apart", {L * H * (D + 2), H * (D + 2), D + 2, 1}},
                            {"strided dims", {L * H * D * 2, H * D * 2, D * 2, 2}}};
  const float bads[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()};
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const attn_fast::Simd sd = attn_fast::simd();
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (const Layout& lay : layouts) {
        const I extent = (B - 1) * lay.strides[0] + (L - 1) * lay.strides[1] + (H - 1) * lay.strides[2] +
                         (D - 1) * lay.strides[3] + 1;
        std::vector<float> buf(static_cast<std::size_t>(extent));  // room for 16-bit values too
        View x;
        x.data = buf.data();
        x.dtype = dt;
        x.ndim = 4;
        x.shape = {B, L, H, D};
        for (std::size_t i = 0; i < 4; ++i) x.strides[i] = lay.strides[i];
        View all = View::contiguous(buf.data(), dt, {extent});
        for (I e = 0; e < extent; ++e) all.set(e, std::numeric_limits<double>::quiet_NaN());
        for (I e = 0; e < x.numel(); ++e) x.set(e, static_cast<double>(e % 7) - 3.0);
        for (int threads : {1, 2}) {
          SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + dtype_name(dt) + " " + lay.name +
                       " threads " + std::to_string(threads));
          EXPECT_TRUE(attn_fast::all_finite(sd, x, threads));
          for (I e = 0; e < x.numel(); ++e)
            for (float bad : bads) {
              const double keep = x.get(e);
              x.set(e, bad);
              EXPECT_FALSE(attn_fast::all_finite(sd, x, threads)) << e << " " << bad;
              x.set(e, keep);
            }
        }
      }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// A contiguous 16-bit view long enough to be cut into pieces over the threads: a bad value at either
// side of a piece's edge, or at the very end, is found.
TEST(AttentionNaNMore, FinitenessOfALong16BitView) {
  const I L = 4000, H = 2, D = 20;  // 160000 values: three pieces of 2^16
  for (DType dt : {DType::kBF16, DType::kF16}) {
    std::vector<std::uint16_t> buf(static_cast<std::size_t>(L * H * D));
    const View x = View::contiguous(buf.data(), dt, {1, L, H, D});
    for (I e = 0; e < x.numel(); ++e) x.set(e, 0.5);
    const I at[] = {0, (I{1} << 16) - 1, I{1} << 16, x.numel() - 1};
    for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      const attn_fast::Simd sd = attn_fast::simd();
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + dtype_name(dt) + " threads " +
                     std::to_string(threads));
        EXPECT_TRUE(attn_fast::all_finite(sd, x, threads));
        for (I e : at)
          for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
            x.set(e, bad);
            EXPECT_FALSE(attn_fast::all_finite(sd, x, threads)) << e;
            x.set(e, 0.5);
          }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// A packed view long enough to be cut into chunks of tokens over the threads: a bad value in the
// first or last token of either chunk, or at the very end, is found; the padding (NaN) is never read.
TEST(AttentionNaNMore, FinitenessOfALongPackedView) {
  const I L = 5000, H = 2, D = 9, row = 3 * H * D;  // 18 floats a token: chunks of 3640 tokens
  std::vector<float> buf(static_cast<std::size_t>(L * row), std::numeric_limits<float>::quiet_NaN());
  View x;
  x.data = buf.data() + H * D;  // the k of a q|k|v row
  x.dtype = DType::kF32;
  x.ndim = 4;
  x.shape = {1, L, H, D};
  x.strides = {L * row, row, D, 1};
  for (I e = 0; e < x.numel(); ++e) x.set(e, 0.5);
  const I per = (I{1} << 16) / (H * D);
  const I at[] = {0, per * H * D - 1, per * H * D, x.numel() - 1};
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const attn_fast::Simd sd = attn_fast::simd();
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(hwy::TargetName(target)) + " threads " + std::to_string(threads));
      EXPECT_TRUE(attn_fast::all_finite(sd, x, threads));
      for (I e : at) {
        x.set(e, -std::numeric_limits<float>::infinity());
        EXPECT_FALSE(attn_fast::all_finite(sd, x, threads)) << e;
        x.set(e, 0.5);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace posenc
