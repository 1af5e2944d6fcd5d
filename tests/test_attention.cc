// Attention with positional encodings: the reference (src/attention/attention_ref.cc) against
//   * a naive computation written here from the papers' formulas (materialised logits [B, Hq, M, N],
//     softmax, weighted sum) — its own RoPE (complex / rotate_half forms), ALiBi slopes, T5 buckets,
//     XL sinusoids, CoPE in the paper's gather form, KERPLE's kernels, Sandwich as a sum of cosines
//     and FIRE's MLP on the normalised log distance;
//   * the public building blocks rope_forward, alibi_bias, t5_bias, kerple_bias, sandwich_bias and
//     fire_bias (AttentionBuildingBlocks);
//   * central differences of a random-projection loss for every backward output (AttentionGrad);
//   * properties: permutation equivariance without positions (and its loss with any encoding, the
//     articles' 我妈想你了 / 我想你妈了), causality, decode = last prefill row, query and key shards,
//     grouped-query heads = repeated kv heads, shift invariance (and FIRE's loss of it once queries
//     pass its threshold L), all-masked rows;
//   * bad inputs: a Status naming the argument, nothing written.
//
// Shape letters: B batch, M queries, N keys, Hq query heads, Hkv kv heads, D head dim.
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

namespace posenc {
namespace {

using ::posenc::testing::AllClose;
using ::posenc::testing::GradCheck;
using ::posenc::testing::randn;
using ::posenc::testing::to_float;
using ::posenc::testing::V;
using I = std::int64_t;
using Vec = std::vector<double>;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::size_t ix(I i) { return static_cast<std::size_t>(i); }

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
void fill(Case* c, std::uint64_t seed) {
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

std::vector<Variant> all_variants() {
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

std::vector<Variant> variants_of(std::initializer_list<Encoding> encs) {
  std::vector<Variant> out;
  for (const Variant& v : all_variants())
    if (std::find(encs.begin(), encs.end(), v.enc) != encs.end()) out.push_back(v);
  return out;
}

Case make_case(const Variant& var, I B, I M, I N, I Hq, I Hkv, I D, bool causal, std::uint64_t seed) {
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

Fwd forward(Case c) {
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

Bwd backward(Case c, Vec dout) {
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
Vec naive_rope(const double* x, I D, I r, RopeLayout layout, double theta, I m) {
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
double naive_slope(I h, I H) { return std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(H)); }

// Hugging Face T5's _relative_position_bucket, in double (the test sizes stay off the edges).
I naive_bucket(I rel, bool bidirectional, I nb, I max_distance) {
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

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Materialised logits [B, Hq, M, N] (−inf where masked). `bias` [Hq, M, N], when given, replaces the
// encoding's own bias (used with the public building blocks).
Vec naive_logits(const Case& c, const Vec* bias = nullptr) {
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
          const double dist = std::fabs(static_cast<double>(qp - kp));
          switch (enc) {
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
        }
        if (enc == Encoding::kCope) {
          // The paper's code: gates = sigmoid(logits); pos = gates.flip(-1).cumsum(-1).flip(-1);
          // pos = pos.clamp(max=npos-1); logits_int = q @ pos_emb; interpolate between floor and ceil.
          double* row = &L[ix(((b * Hq + h) * M + i) * N)];
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
      }
  return L;
}

// softmax(logits)·v: out [B, M, Hq, D] and lse [B, Hq, M].
Fwd naive_attend(const Case& c, const Vec& L) {
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

Fwd naive(const Case& c) { return naive_attend(c, naive_logits(c)); }

std::string trace(const Variant& v, bool causal) { return v.name + (causal ? " causal" : " full"); }

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

Vec* tensor_of(Case* c, const std::string& name) {
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

void check_all_grads(const Case& c0, std::uint64_t seed) {
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

// ==== bad inputs ==================================================================================
struct Bad {
  std::string name, arg;
  Encoding enc;
  std::function<void(Case&, Fwd&, View*, View*, View*, View*, View*, EncodingTensors*)> edit;
};

TEST(AttentionErrors, EveryBadForwardInputNamesItsArgument) {
  using E = EncodingTensors;
  auto f32 = [](View* v) { v->dtype = DType::kF32; };
  std::vector<Bad> bad = {
      {"learned is absolute", "encoding", Encoding::kLearned, [](auto&&...) {}},
      {"sinusoidal is absolute", "encoding", Encoding::kSinusoidal, [](auto&&...) {}},
      {"q absent", "q", Encoding::kNope, [](Case&, Fwd&, View* q, View*, View*, View*, View*, E*) { *q = View{}; }},
      {"q int", "q", Encoding::kNope, [](Case&, Fwd&, View* q, View*, View*, View*, View*, E*) { q->dtype = DType::kI64; }},
      {"q 3-d", "q", Encoding::kNope, [](Case&, Fwd&, View* q, View*, View*, View*, View*, E*) { q->ndim = 3; }},
      {"k batch", "k", Encoding::kNope, [](Case&, Fwd&, View*, View* k, View*, View*, View*, E*) { k->shape[0] = 1; }},
      {"k head dim", "k", Encoding::kNope, [](Case&, Fwd&, View*, View* k, View*, View*, View*, E*) { k->shape[3] = 2; }},
      {"heads not divisible", "k", Encoding::kNope, [](Case&, Fwd&, View*, View* k, View*, View*, View*, E*) { k->shape[2] = 3; }},
      {"k dtype", "k", Encoding::kNope, [=](Case&, Fwd&, View*, View* k, View*, View*, View*, E*) { f32(k); }},
      {"v keys", "v", Encoding::kNope, [](Case&, Fwd&, View*, View*, View* v, View*, View*, E*) { v->shape[1] = 3; }},
      {"v absent", "v", Encoding::kNope, [](Case&, Fwd&, View*, View*, View* v, View*, View*, E*) { *v = View{}; }},
      {"out absent", "out", Encoding::kNope, [](Case&, Fwd&, View*, View*, View*, View* o, View*, E*) { *o = View{}; }},
      {"out shape", "out", Encoding::kNope, [](Case&, Fwd&, View*, View*, View*, View* o, View*, E*) { o->shape[1] = 2; }},
      {"out dtype", "out", Encoding::kNope, [=](Case&, Fwd&, View*, View*, View*, View* o, View*, E*) { f32(o); }},
      {"lse shape", "lse", Encoding::kNope, [](Case&, Fwd&, View*, View*, View*, View*, View* l, E*) { l->shape[2] = 9; }},
      {"lse dtype", "lse", Encoding::kNope, [=](Case&, Fwd&, View*, View*, View*, View*, View* l, E*) { f32(l); }},
      {"scale negative", "scale", Encoding::kNope, [](Case& c, auto&&...) { c.p.scale = -1.0; }},
      {"scale nan", "scale", Encoding::kNope, [](Case& c, auto&&...) { c.p.scale = std::nan(""); }},
      {"q_offset huge", "q_offset", Encoding::kNope, [](Case& c, auto&&...) { c.p.q_offset = std::int64_t{1} << 62; }},
      // the last query (M > 1 here) past 2^53 although the first is not; the same for the last key
      {"last query past 2^53", "q_offset", Encoding::kNope, [](Case& c, auto&&...) { c.p.q_offset = (std::int64_t{1} << 53) - c.M + 2; }},
      {"last key past 2^53", "k_offset", Encoding::kNope, [](Case& c, auto&&...) { c.p.k_offset = (std::int64_t{1} << 53) - c.N + 2; }},
      {"rotary_dim odd", "rotary_dim", Encoding::kRope, [](Case& c, auto&&...) { c.p.rope.rotary_dim = 3; }},
      {"rotary_dim > D", "rotary_dim", Encoding::kRope, [](Case& c, auto&&...) { c.p.rope.rotary_dim = 6; }},
      {"theta", "theta", Encoding::kRope, [](Case& c, auto&&...) { c.p.rope.theta = 0; }},
      {"slopes shape", "slopes", Encoding::kAlibi, [](Case& c, auto&&...) { c.slopes = {1, 2, 3}; }},
      {"nonsymmetric odd heads", "q", Encoding::kAlibi,
       [](Case& c, Fwd&, View* q, View* k, View* v, View* o, View*, E*) {
         c.p.alibi.variant = AlibiVariant::kNonsymmetric;
         q->shape[2] = k->shape[2] = v->shape[2] = o->shape[2] = 1;
       }},
      {"learned weights absent", "weights", Encoding::kAlibi,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.p.alibi.variant = AlibiVariant::kLearned;
         t->weights = View{};
       }},
      {"t5 weights shape", "weights", Encoding::kT5,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->weights.shape[0] = 7; }},
      {"t5 num_buckets", "num_buckets", Encoding::kT5, [](Case& c, auto&&...) { c.p.t5.num_buckets = 3; }},
      {"t5 max_distance", "max_distance", Encoding::kT5, [](Case& c, auto&&...) { c.p.t5.max_distance = 2; }},
      {"xl u absent", "u", Encoding::kXL, [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->u = View{}; }},
      {"xl v shape", "v_bias", Encoding::kXL,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->v.shape[1] = 3; }},
      {"xl odd R", "rel_proj", Encoding::kXL,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->rel_proj.shape[2] = 3; }},
      {"slopes not finite", "slopes", Encoding::kAlibi, [](Case& c, auto&&...) { c.slopes = {0.5, std::nan("")}; }},
      {"slopes with the learned variant", "slopes", Encoding::kAlibi,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.p.alibi.variant = AlibiVariant::kLearned;
         c.weights = randn(4, 1);
         c.slopes = {0.5, 0.25};
         t->weights = V(c.weights, {2, 2});
         t->slopes = V(c.slopes, {2});
       }},
      {"weights with the symmetric variant", "weights", Encoding::kAlibi,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.weights = randn(4, 1);
         t->weights = V(c.weights, {2, 2});
       }},
      {"a table for rope", "table", Encoding::kRope,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.table = randn(8, 1);
         t->table = V(c.table, {2, 4});
       }},
      {"cope table absent", "table", Encoding::kCope,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->table = View{}; }},
      {"cope table D", "table", Encoding::kCope,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->table.shape[1] = 3; }},
      {"kerple r1 absent", "r1", Encoding::kKerple,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->r1 = View{}; }},
      {"kerple r2 shape", "r2", Encoding::kKerple,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->r2.shape[0] = 3; }},
      {"kerple r1 not positive", "r1", Encoding::kKerple, [](Case& c, auto&&...) { c.r1[1] = 0.0; }},
      {"kerple power r2 > 2", "r2", Encoding::kKerple,
       [](Case& c, auto&&...) {
         c.p.kerple.kernel = KerpleKernel::kPower;
         c.r2[0] = 2.5;
       }},
      {"kerple kernel id", "kernel", Encoding::kKerple,
       [](Case& c, auto&&...) { c.p.kerple.kernel = static_cast<KerpleKernel>(9); }},
      {"sandwich odd dim", "sinusoid_dim", Encoding::kSandwich, [](Case& c, auto&&...) { c.p.sandwich.sinusoid_dim = 5; }},
      {"sandwich base", "base", Encoding::kSandwich, [](Case& c, auto&&...) { c.p.sandwich.base = -1; }},
      {"fire w2 shape", "mlp_w2", Encoding::kFire,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->fire.w2.shape[0] = 3; }},
      {"fire c not positive", "c", Encoding::kFire, [](Case& c, auto&&...) { c.fc[0] = -0.5; }},
      {"fire threshold absent", "threshold", Encoding::kFire,
       [](Case&, Fwd&, View*, View*, View*, View*, View*, E* t) { t->fire.threshold = View{}; }},
      {"r1 given to alibi", "r1", Encoding::kAlibi,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.r1 = {0.5, 0.5};
         t->r1 = V(c.r1, {2});
       }},
      {"fire tensors given to kerple", "mlp_w1", Encoding::kKerple,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.fw1 = {0.5, 0.5};
         t->fire.w1 = V(c.fw1, {2});
       }},
      {"kerple tensors given to sandwich", "r2", Encoding::kSandwich,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.r2 = {0.5, 0.5};
         t->r2 = V(c.r2, {2});
       }},
      // Every learned tensor must be finite, as slopes and kerple's and fire's tensors are: a NaN
      // or ±inf would spread through the softmax to every output of its row.
      {"learned weights not finite", "weights", Encoding::kAlibi,
       [](Case& c, Fwd&, View*, View*, View*, View*, View*, E* t) {
         c.p.alibi.variant = AlibiVariant::kLearned;
         c.weights = {0.5, -0.5, std::nan(""), 1.0};
         t->weights = V(c.weights, {2, 2});
       }},
      {"t5 weights not finite", "weights", Encoding::kT5,
       [](Case& c, auto&&...) { c.weights.back() = -std::numeric_limits<double>::infinity(); }},
      {"xl u not finite", "u", Encoding::kXL, [](Case& c, auto&&...) { c.u[3] = std::nan(""); }},
      {"xl v_bias not finite", "v_bias", Encoding::kXL,
       [](Case& c, auto&&...) { c.vb[0] = std::numeric_limits<double>::infinity(); }},
      {"xl rel_proj not finite", "rel_proj", Encoding::kXL, [](Case& c, auto&&...) { c.W[5] = std::nan(""); }},
      {"cope table not finite", "table", Encoding::kCope,
       [](Case& c, auto&&...) { c.table[2] = std::numeric_limits<double>::infinity(); }},
      {"kerple r2 not finite", "r2", Encoding::kKerple, [](Case& c, auto&&...) { c.r2[1] = std::nan(""); }},
      {"fire mlp_b1 not finite", "mlp_b1", Encoding::kFire, [](Case& c, auto&&...) { c.fb1[0] = std::nan(""); }},
  };
  for (Bad& b : bad) {
    SCOPED_TRACE(b.name);
    Variant var{"x", b.enc};
    Case c = make_case(var, 2, 3, 4, 2, 2, 4, false, 151);
    if (b.enc == Encoding::kLearned || b.enc == Encoding::kSinusoidal) c.p.encoding = b.enc;
    Fwd r;
    const double guard = 777.0;
    r.out.assign(c.q.size(), guard);
    r.lse.assign(ix(2 * 2 * 3), guard);
    View q = V(c.q, {2, 3, 2, 4}), k = V(c.k, {2, 4, 2, 4}), v = V(c.v, {2, 4, 2, 4});
    View out = V(r.out, {2, 3, 2, 4}), lse = V(r.lse, {2, 2, 3});
    EncodingTensors t = c.tensors();
    b.edit(c, r, &q, &k, &v, &out, &lse, &t);
    if (b.name == "slopes shape") t.slopes = V(c.slopes, {3});
    if (b.name == "slopes not finite") t.slopes = V(c.slopes, {2});
    const Status st = attention_forward(c.p, q, k, v, t, out, lse);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.arg(), b.arg) << st.message();
    EXPECT_FALSE(st.what().empty());
    for (double e : r.out) EXPECT_EQ(e, guard) << "out written before the error";
    for (double e : r.lse) EXPECT_EQ(e, guard) << "lse written before the error";
  }
}

TEST(AttentionErrors, AbsoluteEncodingsPointToApply) {
  Case c = make_case(Variant{"x", Encoding::kNope}, 1, 2, 2, 1, 1, 2, false, 1);
  c.p.encoding = Encoding::kSinusoidal;
  const Fwd f = forward(c);
  ASSERT_FALSE(f.st.ok());
  EXPECT_NE(f.st.what().find("absolute"), std::string::npos) << f.st.message();
  EXPECT_NE(f.st.what().find("apply"), std::string::npos) << f.st.message();
}

TEST(AttentionErrors, EveryBadBackwardInputNamesItsArgument) {
  struct BadB {
    std::string name, arg;
    Encoding enc;
    std::function<void(View*, View*, View*, View*, EncodingGrads*)> edit;  // dout, dq, dk, dv, g
  };
  std::vector<BadB> bad = {
      {"dout absent", "dout", Encoding::kNope, [](View* d, View*, View*, View*, EncodingGrads*) { *d = View{}; }},
      {"dout shape", "dout", Encoding::kNope, [](View* d, View*, View*, View*, EncodingGrads*) { d->shape[2] = 1; }},
      {"dq shape", "dq", Encoding::kNope, [](View*, View* d, View*, View*, EncodingGrads*) { d->shape[1] = 4; }},
      {"dq dtype", "dq", Encoding::kNope, [](View*, View* d, View*, View*, EncodingGrads*) { d->dtype = DType::kF32; }},
      {"dk shape", "dk", Encoding::kNope, [](View*, View*, View* d, View*, EncodingGrads*) { d->shape[1] = 3; }},
      {"dv shape", "dv", Encoding::kNope, [](View*, View*, View*, View* d, EncodingGrads*) { d->shape[3] = 3; }},
      {"t5 dweights", "dweights", Encoding::kT5, [](View*, View*, View*, View*, EncodingGrads* g) { g->weights.shape[0] = 4; }},
      {"xl du", "du", Encoding::kXL, [](View*, View*, View*, View*, EncodingGrads* g) { g->u.ndim = 1; }},
      {"xl dv", "dv_bias", Encoding::kXL, [](View*, View*, View*, View*, EncodingGrads* g) { g->v.shape[0] = 1; }},
      {"xl drel_proj", "drel_proj", Encoding::kXL, [](View*, View*, View*, View*, EncodingGrads* g) { g->rel_proj.shape[2] = 2; }},
      {"cope dtable", "dtable", Encoding::kCope, [](View*, View*, View*, View*, EncodingGrads* g) { g->table.shape[0] = 9; }},
      {"a gradient the encoding has no tensor for", "dtable", Encoding::kXL,
       [](View*, View*, View*, View*, EncodingGrads* g) {
         static Vec spare(8);
         g->table = V(spare, {2, 4});
       }},
      {"cope dtable int", "dtable", Encoding::kCope, [](View*, View*, View*, View*, EncodingGrads* g) { g->table.dtype = DType::kI32; }},
      {"kerple dr1", "dr1", Encoding::kKerple, [](View*, View*, View*, View*, EncodingGrads* g) { g->r1.shape[0] = 3; }},
      {"kerple dr2 int", "dr2", Encoding::kKerple, [](View*, View*, View*, View*, EncodingGrads* g) { g->r2.dtype = DType::kI64; }},
      {"fire dmlp_w2", "dmlp_w2", Encoding::kFire, [](View*, View*, View*, View*, EncodingGrads* g) { g->fire.w2.shape[1] = 2; }},
      {"fire dthreshold", "dthreshold", Encoding::kFire, [](View*, View*, View*, View*, EncodingGrads* g) { g->fire.threshold.shape[0] = 2; }},
      {"a fire gradient for kerple", "dmlp_b1", Encoding::kKerple,
       [](View*, View*, View*, View*, EncodingGrads* g) {
         static Vec spare(5);
         g->fire.b1 = V(spare, {5});
       }},
      {"a kerple gradient for sandwich", "dr1", Encoding::kSandwich,
       [](View*, View*, View*, View*, EncodingGrads* g) {
         static Vec spare(2);
         g->r1 = V(spare, {2});
       }},
  };
  for (BadB& b : bad) {
    SCOPED_TRACE(b.name);
    Case c = make_case(Variant{"x", b.enc}, 2, 3, 4, 2, 2, 4, false, 161);
    const double guard = 555.0;
    Vec dout = randn(c.q.size(), 162), dq(c.q.size(), guard), dk(c.k.size(), guard), dv(c.v.size(), guard);
    Vec dw(c.weights.size(), guard), du(c.u.size(), guard), dvb(c.vb.size(), guard), dW(c.W.size(), guard),
        dt(c.table.size(), guard);
    View vd = V(dout, {2, 3, 2, 4}), vq = V(dq, {2, 3, 2, 4}), vk = V(dk, {2, 4, 2, 4}), vv = V(dv, {2, 4, 2, 4});
    EncodingGrads g;
    if (b.enc == Encoding::kT5) g.weights = V(dw, {c.p.t5.num_buckets, 2});
    if (b.enc == Encoding::kXL) g.u = V(du, {2, 4}), g.v = V(dvb, {2, 4}), g.rel_proj = V(dW, {2, 4, c.R});
    if (b.enc == Encoding::kCope) g.table = V(dt, {c.npos, 4});
    Vec d1(2, guard), d2(2, guard), f1(ix(c.fw), guard), f2(ix(c.fw), guard), f3(ix(2 * c.fw), guard), f4(2, guard),
        f5(1, guard), f6(1, guard);
    if (b.enc == Encoding::kKerple) g.r1 = V(d1, {2}), g.r2 = V(d2, {2});
    if (b.enc == Encoding::kFire)
      g.fire = FireTensors{V(f1, {c.fw}), V(f2, {c.fw}), V(f3, {2, c.fw}), V(f4, {2}), V(f5, {1}), V(f6, {1})};
    b.edit(&vd, &vq, &vk, &vv, &g);
    const Status st = attention_backward(c.p, V(c.q, {2, 3, 2, 4}), V(c.k, {2, 4, 2, 4}), V(c.v, {2, 4, 2, 4}),
                                         c.tensors(), vd, vq, vk, vv, g);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.arg(), b.arg) << st.message();
    for (const Vec* x : {&dq, &dk, &dv, &dw, &du, &dvb, &dW, &dt, &d1, &d2, &f1, &f2, &f3, &f4, &f5, &f6})
      for (double e : *x) EXPECT_EQ(e, guard) << "a gradient was written before the error";
  }
}

TEST(AttentionErrors, MessagesSayWhatWasExpectedAndFound) {
  Case c = make_case(Variant{"x", Encoding::kNope}, 2, 3, 4, 4, 2, 4, false, 171);
  Vec out(c.q.size());
  const Status st = attention_forward(c.p, V(c.q, {2, 3, 4, 4}), V(c.k, {2, 4, 3, 4}), V(c.v, {2, 4, 3, 4}), {},
                                      V(out, {2, 3, 4, 4}));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.arg(), "k");
  EXPECT_NE(st.what().find('4'), std::string::npos) << st.message();
  EXPECT_NE(st.what().find('3'), std::string::npos) << st.message();
}

}  // namespace
}  // namespace posenc
