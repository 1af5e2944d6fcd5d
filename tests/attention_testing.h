// The attention tests' fixtures (test_attention*.cc): a problem in float64 (Case), every encoding
// and option under test (Variant), the library's forward and backward on it, and the naive oracle
// written from the papers' formulas (materialised logits [B, Hq, M, N], softmax, weighted sum) —
// its own RoPE (complex / rotate_half forms), ALiBi slopes, T5 buckets, XL sinusoids, CoPE in the
// paper's gather form, KERPLE's kernels, Sandwich as a sum of cosines and FIRE's MLP on the
// normalised log distance.
//
// Shape letters: B batch, M queries, N keys, Hq query heads, Hkv kv heads, D head dim.
#pragma once

#include <algorithm>
#include <cmath>
#include <complex>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "posenc/attention.h"
#include "posenc/bias.h"
#include "posenc/rope.h"
#include "testing.h"

namespace posenc::attention_testing {

using ::posenc::testing::AllClose;
using ::posenc::testing::GradCheck;
using ::posenc::testing::randn;
using ::posenc::testing::to_float;
using ::posenc::testing::V;
using I = std::int64_t;
using Vec = std::vector<double>;

inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

// ---- a problem: sizes, parameters and every tensor, contiguous float64 ---------------------------
struct Case {
  AttentionParams p;
  I B = 1, M = 3, N = 4, Hq = 2, Hkv = 2, D = 4;
  I R = 4;     // xl sinusoid dimension
  I npos = 4;  // cope table rows
  Vec q, k, v;                            // [B, M, Hq, D], [B, N, Hkv, D] ×2
  Vec slopes;                             // alibi, optional [Hq]
  Vec weights;                            // alibi learned [2, Hq] / t5 [num_buckets, Hq]
  Vec u, vb, W;                           // xl [Hq, D], [Hq, D], [Hq, D, R]
  Vec table;                              // cope [npos, D]
  Vec r1, r2;                             // kerple [Hq] each
  I fw = 5;                               // fire: MLP width
  Vec fw1, fb1, fw2, fb2, fc, fL;         // fire [fw], [fw], [Hq, fw], [Hq], [1], [1]

  I q_off() const { return p.q_offset ? *p.q_offset : p.k_offset + N - M; }
  double scale() const { return p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(D)); }
  bool alibi_learned() const {
    return p.encoding == Encoding::kAlibi && p.alibi.variant == AlibiVariant::kLearned;
  }

  EncodingTensors tensors() {
    EncodingTensors t;
    if (!slopes.empty()) t.slopes = V(slopes, {Hq});
    if (alibi_learned()) t.weights = V(weights, {2, Hq});
    if (p.encoding == Encoding::kT5) t.weights = V(weights, {p.t5.num_buckets, Hq});
    if (p.encoding == Encoding::kXL) {
      t.u = V(u, {Hq, D});
      t.v = V(vb, {Hq, D});
      t.rel_proj = V(W, {Hq, D, R});
    }
    if (p.encoding == Encoding::kCope) t.table = V(table, {npos, D});
    if (p.encoding == Encoding::kKerple) t.r1 = V(r1, {Hq}), t.r2 = V(r2, {Hq});
    if (p.encoding == Encoding::kFire)
      t.fire = FireTensors{V(fw1, {fw}), V(fb1, {fw}), V(fw2, {Hq, fw}), V(fb2, {Hq}), V(fc, {1}), V(fL, {1})};
    return t;
  }
};

// Fills q, k, v and the tensors the encoding reads with seeded normals.
inline void fill(Case* c, std::uint64_t seed) {
  c->q = randn(ix(c->B * c->M * c->Hq * c->D), seed + 1);
  c->k = randn(ix(c->B * c->N * c->Hkv * c->D), seed + 2);
  c->v = randn(ix(c->B * c->N * c->Hkv * c->D), seed + 3);
  c->weights.clear();
  if (c->alibi_learned()) c->weights = randn(ix(2 * c->Hq), seed + 4);
  if (c->p.encoding == Encoding::kT5) c->weights = randn(ix(c->p.t5.num_buckets * c->Hq), seed + 4);
  if (c->p.encoding == Encoding::kXL) {
    c->u = randn(ix(c->Hq * c->D), seed + 5, 0.5);
    c->vb = randn(ix(c->Hq * c->D), seed + 6, 0.5);
    c->W = randn(ix(c->Hq * c->D * c->R), seed + 7, 0.5);
  }
  if (c->p.encoding == Encoding::kCope) c->table = randn(ix(c->npos * c->D), seed + 8);
  if (c->p.encoding == Encoding::kKerple) {  // inside the kernel's domain: r1 > 0, 0 < r2 < 2
    c->r1 = randn(ix(c->Hq), seed + 9);
    c->r2 = randn(ix(c->Hq), seed + 10);
    for (double& x : c->r1) x = 0.1 + 1.5 * (0.5 + 0.5 * std::tanh(x));
    for (double& x : c->r2) x = 0.1 + 1.8 * (0.5 + 0.5 * std::tanh(x));
  }
  if (c->p.encoding == Encoding::kFire) {  // c and L set by the variant (make_case)
    c->fw1 = randn(ix(c->fw), seed + 11, 1.5);
    c->fb1 = randn(ix(c->fw), seed + 12, 0.7);
    c->fw2 = randn(ix(c->Hq * c->fw), seed + 13, 0.8);
    c->fb2 = randn(ix(c->Hq), seed + 14, 0.5);
  }
}

// ---- the variants under test: every encoding and option -----------------------------------------
struct Variant {
  std::string name;
  Encoding enc;
  RopeLayout layout = RopeLayout::kInterleaved;
  I rotary_dim = 0;
  double theta = 10000.0;
  AlibiVariant alibi = AlibiVariant::kSymmetric;
  bool caller_slopes = false;
  bool bidirectional = true;
  I npos = 4;
  KerpleKernel kernel = KerpleKernel::kLog;
  double fire_L = 3.5;  // fire: the threshold (3.5: the small cases' queries sit on both sides of it)
};

inline std::vector<Variant> all_variants() {
  std::vector<Variant> v;
  v.push_back({"nope", Encoding::kNope});
  for (RopeLayout l : {RopeLayout::kInterleaved, RopeLayout::kHalf})
    for (I r : {0, 2}) {
      Variant x{std::string("rope_") + rope_layout_name(l) + (r ? "_partial" : "_full"), Encoding::kRope};
      x.layout = l;
      x.rotary_dim = r;  // with D = 4 (or 6 below, set per case): 2 rotates one pair only
      x.theta = r ? 100.0 : 10000.0;
      v.push_back(x);
    }
  {
    Variant x{"alibi_symmetric", Encoding::kAlibi};
    v.push_back(x);
    x.name = "alibi_symmetric_slopes";
    x.caller_slopes = true;
    v.push_back(x);
    x = Variant{"alibi_nonsymmetric", Encoding::kAlibi};
    x.alibi = AlibiVariant::kNonsymmetric;
    v.push_back(x);
    x.name = "alibi_nonsymmetric_slopes";  // caller-given slopes [Hq] apply per head as given
    x.caller_slopes = true;
    v.push_back(x);
    x = Variant{"alibi_learned", Encoding::kAlibi};
    x.alibi = AlibiVariant::kLearned;
    v.push_back(x);
  }
  for (bool bi : {true, false}) {
    Variant x{bi ? "t5_bidirectional" : "t5_unidirectional", Encoding::kT5};
    x.bidirectional = bi;
    v.push_back(x);
  }
  v.push_back({"xl", Encoding::kXL});
  {
    Variant x{"cope", Encoding::kCope};
    x.npos = 8;  // counts never reach the top row
    v.push_back(x);
    x.name = "cope_clamped";
    x.npos = 3;  // counts above 2 are clamped
    v.push_back(x);
  }
  {
    Variant x{"kerple_log", Encoding::kKerple};
    v.push_back(x);
    x.name = "kerple_power";
    x.kernel = KerpleKernel::kPower;
    v.push_back(x);
  }
  v.push_back({"sandwich", Encoding::kSandwich});
  {
    Variant x{"fire", Encoding::kFire};
    v.push_back(x);
    x.name = "fire_long_threshold";  // every query of the tests at or below L: ψ(max(L, i)) = ψ(L)
    x.fire_L = 5000.5;
    v.push_back(x);
  }
  return v;
}

inline std::vector<Variant> variants_of(std::initializer_list<Encoding> encs) {
  std::vector<Variant> out;
  for (const Variant& v : all_variants())
    if (std::find(encs.begin(), encs.end(), v.enc) != encs.end()) out.push_back(v);
  return out;
}

inline Case make_case(const Variant& var, I B, I M, I N, I Hq, I Hkv, I D, bool causal, std::uint64_t seed) {
  Case c;
  c.B = B, c.M = M, c.N = N, c.Hq = Hq, c.Hkv = Hkv, c.D = D;
  c.p.encoding = var.enc;
  c.p.causal = causal;
  c.p.rope.layout = var.layout;
  c.p.rope.rotary_dim = var.rotary_dim;
  c.p.rope.theta = var.theta;
  c.p.alibi.variant = var.alibi;
  c.p.t5.bidirectional = var.bidirectional;
  c.p.t5.num_buckets = 8;
  c.p.t5.max_distance = 12;
  c.npos = var.npos;
  c.p.kerple.kernel = var.kernel;
  c.p.sandwich.sinusoid_dim = 8;
  c.p.sandwich.base = 100;  // frequencies 100^(−k/4): the bias varies over the tests' short distances
  c.fc = {0.4};
  c.fL = {var.fire_L};
  fill(&c, seed);
  if (var.caller_slopes) c.slopes = Vec{0.7, 0.3, 0.05, 0.9, 0.2, 0.4, 0.6, 0.1}, c.slopes.resize(ix(Hq));
  return c;
}

// ---- running the library -----------------------------------------------------------------------
struct Fwd {
  Status st;
  Vec out, lse;
};

inline Fwd forward(Case c) {
  Fwd r;
  r.out.assign(ix(c.B * c.M * c.Hq * c.D), std::nan(""));
  r.lse.assign(ix(c.B * c.Hq * c.M), std::nan(""));
  r.st = attention_forward(c.p, V(c.q, {c.B, c.M, c.Hq, c.D}), V(c.k, {c.B, c.N, c.Hkv, c.D}),
                           V(c.v, {c.B, c.N, c.Hkv, c.D}), c.tensors(), V(r.out, {c.B, c.M, c.Hq, c.D}),
                           V(r.lse, {c.B, c.Hq, c.M}));
  return r;
}

struct Bwd {
  Status st;
  Vec dq, dk, dv, dweights, du, dvb, dW, dtable;
  Vec dr1, dr2;                                   // kerple
  Vec dfw1, dfb1, dfw2, dfb2, dfc, dfL;          // fire
};

inline Bwd backward(Case c, Vec dout) {
  Bwd r;
  r.dq.assign(c.q.size(), std::nan(""));
  r.dk.assign(c.k.size(), std::nan(""));
  r.dv.assign(c.v.size(), std::nan(""));
  EncodingGrads g;
  if (c.alibi_learned() || c.p.encoding == Encoding::kT5) {
    r.dweights.assign(c.weights.size(), std::nan(""));
    g.weights = V(r.dweights, {c.alibi_learned() ? 2 : c.p.t5.num_buckets, c.Hq});
  }
  if (c.p.encoding == Encoding::kXL) {
    r.du.assign(c.u.size(), std::nan(""));
    r.dvb.assign(c.vb.size(), std::nan(""));
    r.dW.assign(c.W.size(), std::nan(""));
    g.u = V(r.du, {c.Hq, c.D});
    g.v = V(r.dvb, {c.Hq, c.D});
    g.rel_proj = V(r.dW, {c.Hq, c.D, c.R});
  }
  if (c.p.encoding == Encoding::kCope) {
    r.dtable.assign(c.table.size(), std::nan(""));
    g.table = V(r.dtable, {c.npos, c.D});
  }
  if (c.p.encoding == Encoding::kKerple) {
    r.dr1.assign(c.r1.size(), std::nan(""));
    r.dr2.assign(c.r2.size(), std::nan(""));
    g.r1 = V(r.dr1, {c.Hq});
    g.r2 = V(r.dr2, {c.Hq});
  }
  if (c.p.encoding == Encoding::kFire) {
    r.dfw1.assign(c.fw1.size(), std::nan(""));
    r.dfb1.assign(c.fb1.size(), std::nan(""));
    r.dfw2.assign(c.fw2.size(), std::nan(""));
    r.dfb2.assign(c.fb2.size(), std::nan(""));
    r.dfc.assign(1, std::nan(""));
    r.dfL.assign(1, std::nan(""));
    g.fire = FireTensors{V(r.dfw1, {c.fw}), V(r.dfb1, {c.fw}), V(r.dfw2, {c.Hq, c.fw}), V(r.dfb2, {c.Hq}),
                         V(r.dfc, {1}), V(r.dfL, {1})};
  }
  r.st = attention_backward(c.p, V(c.q, {c.B, c.M, c.Hq, c.D}), V(c.k, {c.B, c.N, c.Hkv, c.D}),
                            V(c.v, {c.B, c.N, c.Hkv, c.D}), c.tensors(), V(dout, {c.B, c.M, c.Hq, c.D}),
                            V(r.dq, {c.B, c.M, c.Hq, c.D}), V(r.dk, {c.B, c.N, c.Hkv, c.D}),
                            V(r.dv, {c.B, c.N, c.Hkv, c.D}), g);
  return r;
}

// ---- the naive oracle, from the papers' formulas ------------------------------------------------
// RoPE of one head vector x [D] at position m: interleaved as complex products (RoFormer eq. 34,
// Llama's view_as_complex), half as x·cos + rotate_half(x)·sin (GPT-NeoX / HF Llama).
inline Vec naive_rope(const double* x, I D, I r, RopeLayout layout, double theta, I m) {
  Vec y(x, x + D);
  for (I kk = 0; kk < r / 2; ++kk) {
    const double ang = static_cast<double>(m) / std::pow(theta, static_cast<double>(2 * kk) / r);
    if (layout == RopeLayout::kInterleaved) {
      const std::complex<double> z =
          std::complex<double>(x[2 * kk], x[2 * kk + 1]) * std::polar(1.0, ang);
      y[ix(2 * kk)] = z.real();
      y[ix(2 * kk + 1)] = z.imag();
    }
  }
  if (layout == RopeLayout::kHalf) {
    Vec cosv(ix(r)), sinv(ix(r)), rot(ix(r));
    for (I d = 0; d < r; ++d) {
      const I kk = d % (r / 2);
      const double ang = static_cast<double>(m) / std::pow(theta, static_cast<double>(2 * kk) / r);
      cosv[ix(d)] = std::cos(ang);
      sinv[ix(d)] = std::sin(ang);
      rot[ix(d)] = d < r / 2 ? -x[d + r / 2] : x[d - r / 2];  // rotate_half
    }
    for (I d = 0; d < r; ++d) y[ix(d)] = x[d] * cosv[ix(d)] + rot[ix(d)] * sinv[ix(d)];
  }
  return y;
}

// ALiBi slopes for a power of two H: 2^(−8/H), 2^(−16/H), …, 2^(−8).
inline double naive_slope(I h, I H) { return std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(H)); }

// Hugging Face T5's _relative_position_bucket, in double (the test sizes stay off the edges).
inline I naive_bucket(I rel, bool bidirectional, I nb, I max_distance) {
  I ret = 0, n = -rel;
  if (bidirectional) {
    nb /= 2;
    if (n < 0) ret += nb;
    n = std::abs(n);
  } else {
    n = std::max<I>(n, 0);
  }
  const I max_exact = nb / 2;
  if (n < max_exact) return ret + n;
  const I large = max_exact + static_cast<I>(std::log(static_cast<double>(n) / max_exact) /
                                             std::log(static_cast<double>(max_distance) / max_exact) *
                                             static_cast<double>(nb - max_exact));
  return ret + std::min(large, nb - 1);
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The encoding's own logit term for query head h at query position qp and key position kp (qi, kj
// the head's query and key rows after any rotation), the papers' formulas; 0 for encodings without one.
inline double naive_term(const Case& c, I h, I qp, I kp, const Vec& qi, const Vec& kj) {
  const I Hq = c.Hq, D = c.D;
  const double sc = c.scale();
  double l = 0;
  const double dist = std::fabs(static_cast<double>(qp - kp));
  switch (c.p.encoding) {
    case Encoding::kAlibi:
      if (c.p.alibi.variant == AlibiVariant::kLearned) {
        if (kp < qp) l -= sigmoid(c.weights[ix(h)]) * dist;
        if (kp > qp) l -= sigmoid(c.weights[ix(Hq + h)]) * dist;
      } else if (!c.slopes.empty()) {
        l -= c.slopes[ix(h)] * dist;
      } else if (c.p.alibi.variant == AlibiVariant::kSymmetric) {
        l -= naive_slope(h, Hq) * dist;
      } else {
        l -= naive_slope(h % (Hq / 2), Hq / 2) * dist;
      }
      break;
    case Encoding::kT5:
      l += c.weights[ix(naive_bucket(kp - qp, c.p.t5.bidirectional, c.p.t5.num_buckets,
                                     c.p.t5.max_distance) * Hq + h)];
      break;
    case Encoding::kXL: {
      // r = W_h s(δ), s(δ) = [sin(δ ω_0), cos(δ ω_0), sin(δ ω_1), …], ω_i = 10000^(−2i/R)
      const double delta = static_cast<double>(qp - kp);
      Vec s(ix(c.R));
      for (I i2 = 0; i2 < c.R / 2; ++i2) {
        const double w = std::pow(10000.0, -2.0 * static_cast<double>(i2) / c.R);
        s[ix(2 * i2)] = std::sin(delta * w);
        s[ix(2 * i2 + 1)] = std::cos(delta * w);
      }
      double extra = 0;  // u·k + q·r + v·r
      for (I d = 0; d < D; ++d) {
        double r = 0;
        for (I e = 0; e < c.R; ++e) r += c.W[ix((h * D + d) * c.R + e)] * s[ix(e)];
        extra += c.u[ix(h * D + d)] * kj[ix(d)] + (qi[ix(d)] + c.vb[ix(h * D + d)]) * r;
      }
      l += sc * extra;
      break;
    }
    case Encoding::kKerple:  // Chi et al. 2022: −r1·log(1 + r2|m − n|), −r1·|m − n|^r2
      l += c.p.kerple.kernel == KerpleKernel::kPower
               ? -c.r1[ix(h)] * std::pow(dist, c.r2[ix(h)])
               : -c.r1[ix(h)] * std::log(1.0 + c.r2[ix(h)] * dist);
      break;
    case Encoding::kSandwich: {  // Σ_{k=1}^{d/2} cos((m − n)/base^(2k/d)) − d/2, head h ÷ 8(h+1)/H
      const I sd = c.p.sandwich.sinusoid_dim;
      double ip = 0;
      for (I kk = 1; kk <= sd / 2; ++kk)
        ip += std::cos(static_cast<double>(qp - kp) / std::pow(c.p.sandwich.base, 2.0 * static_cast<double>(kk) / static_cast<double>(sd)));
      l += (ip - static_cast<double>(sd) / 2) * static_cast<double>(Hq) / (8.0 * static_cast<double>(h + 1));
      break;
    }
    case Encoding::kFire: {  // f_h(log(c|i − j| + 1)/log(c·max(L, i) + 1)), f = w2·relu(w1 x + b1) + b2
      const double cc = c.fc[0], x = std::log(cc * dist + 1) /
                                       std::log(cc * std::max(c.fL[0], static_cast<double>(qp)) + 1);
      double f = c.fb2[ix(h)];
      for (I kk = 0; kk < c.fw; ++kk)
        f += c.fw2[ix(h * c.fw + kk)] * std::max(0.0, c.fw1[ix(kk)] * x + c.fb1[ix(kk)]);
      l += f;
      break;
    }
    default: break;
  }
  return l;
}

// CoPE's position term added to a row of N logits (row, −inf where masked) of query row qi.
inline void naive_cope_row(const Case& c, const Vec& qi, double* row) {
  const I N = c.N, D = c.D;
  // The paper's code: gates = sigmoid(logits); pos = gates.flip(-1).cumsum(-1).flip(-1);
  // pos = pos.clamp(max=npos-1); logits_int = q @ pos_emb; interpolate between floor and ceil.
  Vec pos(ix(N));
  double acc = 0;
  for (I j = N - 1; j >= 0; --j) {
    acc += row[j] == -kInf ? 0.0 : sigmoid(row[j]);
    pos[ix(j)] = std::min(acc, static_cast<double>(c.npos - 1));
  }
  Vec logits_int(ix(c.npos));
  for (I t = 0; t < c.npos; ++t)
    for (I d = 0; d < D; ++d) logits_int[ix(t)] += qi[ix(d)] * c.table[ix(t * D + d)];
  for (I j = 0; j < N; ++j) {
    if (row[j] == -kInf) continue;
    const double fl = std::floor(pos[ix(j)]), ce = std::ceil(pos[ix(j)]), w = pos[ix(j)] - fl;
    row[j] += logits_int[ix(static_cast<I>(ce))] * w + logits_int[ix(static_cast<I>(fl))] * (1 - w);
  }
}

// Materialised logits [B, Hq, M, N] (−inf where masked). `bias` [Hq, M, N], when given, replaces the
// encoding's own bias (used with the public building blocks).
inline Vec naive_logits(const Case& c, const Vec* bias = nullptr) {
  const I B = c.B, M = c.M, N = c.N, Hq = c.Hq, D = c.D, G = c.Hq / c.Hkv;
  const double sc = c.scale();
  const I qo = c.q_off(), ko = c.p.k_offset;
  const Encoding enc = c.p.encoding;
  Vec L(ix(B * Hq * M * N), -kInf);
  for (I b = 0; b < B; ++b)
    for (I h = 0; h < Hq; ++h)
      for (I i = 0; i < M; ++i) {
        const I qp = qo + i;
        Vec qi(&c.q[ix(((b * M + i) * Hq + h) * D)], &c.q[ix(((b * M + i) * Hq + h) * D)] + D);
        if (enc == Encoding::kRope)
          qi = naive_rope(qi.data(), D, c.p.rope.rotary_dim ? c.p.rope.rotary_dim : D, c.p.rope.layout,
                          c.p.rope.theta, qp);
        for (I j = 0; j < N; ++j) {
          const I kp = ko + j;
          double& l = L[ix(((b * Hq + h) * M + i) * N + j)];
          bool masked = c.p.causal && kp > qp;
          if (enc == Encoding::kAlibi && c.p.alibi.variant == AlibiVariant::kNonsymmetric)
            masked = masked || (h < Hq / 2 ? kp > qp : kp < qp);
          if (masked) continue;
          const double* kr = &c.k[ix(((b * N + j) * c.Hkv + h / G) * D)];
          Vec kj(kr, kr + D);
          if (enc == Encoding::kRope)
            kj = naive_rope(kj.data(), D, c.p.rope.rotary_dim ? c.p.rope.rotary_dim : D, c.p.rope.layout,
                            c.p.rope.theta, kp);
          double qk = 0;
          for (I d = 0; d < D; ++d) qk += qi[ix(d)] * kj[ix(d)];
          l = sc * qk;
          if (bias) {
            l += (*bias)[ix((h * M + i) * N + j)];
            continue;
          }
          l += naive_term(c, h, qp, kp, qi, kj);
        }
        if (enc == Encoding::kCope) naive_cope_row(c, qi, &L[ix(((b * Hq + h) * M + i) * N)]);
      }
  return L;
}

// softmax(logits)·v: out [B, M, Hq, D] and lse [B, Hq, M].
inline Fwd naive_attend(const Case& c, const Vec& L) {
  const I G = c.Hq / c.Hkv;
  Fwd r;
  r.out.assign(ix(c.B * c.M * c.Hq * c.D), 0.0);
  r.lse.assign(ix(c.B * c.Hq * c.M), -kInf);
  for (I b = 0; b < c.B; ++b)
    for (I h = 0; h < c.Hq; ++h)
      for (I i = 0; i < c.M; ++i) {
        const double* row = &L[ix(((b * c.Hq + h) * c.M + i) * c.N)];
        double mx = -kInf;
        for (I j = 0; j < c.N; ++j) mx = std::max(mx, row[j]);
        if (mx == -kInf) continue;
        double sum = 0;
        for (I j = 0; j < c.N; ++j) sum += std::exp(row[j] - mx);
        r.lse[ix((b * c.Hq + h) * c.M + i)] = mx + std::log(sum);
        for (I j = 0; j < c.N; ++j) {
          const double pj = std::exp(row[j] - mx) / sum;
          for (I d = 0; d < c.D; ++d)
            r.out[ix(((b * c.M + i) * c.Hq + h) * c.D + d)] +=
                pj * c.v[ix(((b * c.N + j) * c.Hkv + h / G) * c.D + d)];
        }
      }
  return r;
}

inline Fwd naive(const Case& c) { return naive_attend(c, naive_logits(c)); }

inline std::string trace(const Variant& v, bool causal) { return v.name + (causal ? " causal" : " full"); }

// The tensor of c that the gradient check named `name` perturbs.
inline Vec* tensor_of(Case* c, const std::string& name) {
  if (name == "q") return &c->q;
  if (name == "k") return &c->k;
  if (name == "v") return &c->v;
  if (name == "weights") return &c->weights;
  if (name == "u") return &c->u;
  if (name == "v_bias") return &c->vb;
  if (name == "rel_proj") return &c->W;
  if (name == "r1") return &c->r1;
  if (name == "r2") return &c->r2;
  if (name == "mlp_w1") return &c->fw1;
  if (name == "mlp_b1") return &c->fb1;
  if (name == "mlp_w2") return &c->fw2;
  if (name == "mlp_b2") return &c->fb2;
  if (name == "c") return &c->fc;
  if (name == "threshold") return &c->fL;
  return &c->table;
}

// Every gradient backward() gives for c0 against central differences of loss = Σ proj ⊙ out,
// proj seeded normals.
inline void check_all_grads(const Case& c0, std::uint64_t seed) {
  const Vec proj = randn(c0.q.size(), seed);
  const Bwd g = backward(c0, proj);
  ASSERT_TRUE(g.st.ok()) << g.st.message();
  std::vector<std::pair<std::string, const Vec*>> checks = {{"q", &g.dq}, {"k", &g.dk}, {"v", &g.dv}};
  if (c0.alibi_learned() || c0.p.encoding == Encoding::kT5) checks.push_back({"weights", &g.dweights});
  if (c0.p.encoding == Encoding::kXL) {
    checks.push_back({"u", &g.du});
    checks.push_back({"v_bias", &g.dvb});
    checks.push_back({"rel_proj", &g.dW});
  }
  if (c0.p.encoding == Encoding::kCope) checks.push_back({"table", &g.dtable});
  if (c0.p.encoding == Encoding::kKerple) {
    checks.push_back({"r1", &g.dr1});
    checks.push_back({"r2", &g.dr2});
  }
  if (c0.p.encoding == Encoding::kFire) {
    checks.push_back({"mlp_w1", &g.dfw1});
    checks.push_back({"mlp_b1", &g.dfb1});
    checks.push_back({"mlp_w2", &g.dfw2});
    checks.push_back({"mlp_b2", &g.dfb2});
    checks.push_back({"c", &g.dfc});
    checks.push_back({"threshold", &g.dfL});
  }
  for (const auto& check : checks) {
    const auto& name = check.first;  // not a structured binding: clang 14 cannot capture one
    const auto& analytic = check.second;
    SCOPED_TRACE("d" + name);
    Case c = c0;
    auto loss = [&](const Vec& x) {
      *tensor_of(&c, name) = x;
      const Fwd f = forward(c);
      return ::posenc::testing::dot(proj, f.out);
    };
    EXPECT_TRUE(GradCheck(loss, *tensor_of(&c, name), *analytic, 1e-6, 1e-7, 1e-5));
  }
}

}  // namespace posenc::attention_testing
