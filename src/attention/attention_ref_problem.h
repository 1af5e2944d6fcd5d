// Private: the reference attention's problem (what it computes and how: attention_ref.cc, whose entry
// points run it): the inputs in double, a query row's logits and softmax, and their gradients.
// class Problem's forward is defined in attention_ref.cc, its backward in attention_ref_backward.cc.
#pragma once

#include <cmath>
#include <limits>
#include <string>
#include <vector>
#include "enc/bias/alibi/alibi_math.h"
#include "enc/contextual/cope/cope_math.h"
#include "enc/bias/fire/fire_check.h"
#include "enc/bias/fire/fire_math.h"
#include "enc/bias/kerple/kerple_math.h"
#include "enc/bias/sandwich/sandwich_math.h"
#include "enc/rotary/rope/rope_math.h"
#include "enc/rotary/rotary_plan.h"
#include "enc/bias/t5/t5_math.h"
#include "enc/bias/xl/xl_math.h"
#include "attention/attention_check.h"
#include "posenc/attention.h"

namespace posenc::attn_ref {

using attn::Dims;

using I = std::int64_t;
using Vec = std::vector<double>;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kPosInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

inline double dot(const double* a, const double* b, I n) {
  double s = 0;
  for (I d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}
inline void axpy(double c, const double* x, double* y, I n) {  // y += c·x
  for (I d = 0; d < n; ++d) y[d] += c * x[d];
}

// ---- the computation ---------------------------------------------------------------------------
// One query row (b, h, i): what forward writes and backward differentiates.
struct Row {
  Vec a;          // [N] scale·q̃_i·k̃_j, −inf where masked
  Vec l;          // [N] logits, −inf where masked
  Vec P;          // [N] softmax
  double lse = kNegInf;
  Vec g;                              // cope: [N] gates
  std::vector<cope::Interp> pos;      // cope: [N] positions
};

class Problem {
 public:
  Problem(const AttentionParams& p, const Dims& d, const View& q, const View& k, const View& v,
          const EncodingTensors& t);

  const double* q(I b, I i, I h) const { return &q_[ix(((b * d_.M + i) * d_.Hq + h) * d_.D)]; }
  const double* k(I b, I j, I kh) const { return &k_[ix(((b * d_.N + j) * d_.Hkv + kh) * d_.D)]; }
  const double* v(I b, I j, I kh) const { return &v_[ix(((b * d_.N + j) * d_.Hkv + kh) * d_.D)]; }
  // Key j as query head h reads it: rotated for h (rotary encodings), else kv head h / G as given.
  const double* key(I b, I j, I h) const {
    return d_.rotary ? &kq_[ix(((b * d_.N + j) * d_.Hq + h) * d_.D)] : k(b, j, h / d_.G);
  }
  const double* r(I h, I delta) const { return &r_[ix((h * nd_ + (delta - dmin_)) * d_.D)]; }
  const double* s(I delta) const { return &s_[ix((delta - dmin_) * d_.R)]; }
  const double* e(I row) const { return &table_[ix(row * d_.D)]; }

  bool masked(I h, I qp, I kp) const {
    if (p_.causal && kp > qp) return true;
    if (p_.encoding == Encoding::kAlibi && p_.alibi.variant == AlibiVariant::kNonsymmetric)
      return !alibi::nonsymmetric_allows(h, d_.Hq, kp - qp);
    return false;
  }

  // ALiBi's term for head h (and, for the learned variant, its derivative by w[side, h]).
  double alibi_term(I h, I qp, I kp, int* side = nullptr, double* dterm = nullptr) const {
    const double dist = static_cast<double>(qp > kp ? qp - kp : kp - qp);
    if (p_.alibi.variant != AlibiVariant::kLearned) return -slopes_[ix(h)] * dist;
    if (qp == kp) {
      if (side) *side = -1;
      return 0.0;
    }
    const int sd = kp < qp ? 0 : 1;  // 0: the key is in the past; 1: in the future
    const double sg = alibi::sigmoid(w_[ix(sd * d_.Hq + h)]);
    if (side) *side = sd;
    if (dterm) *dterm = -sg * (1 - sg) * dist;
    return -sg * dist;
  }

  const double* fire_w2(I h) const { return &fire_.w2[ix(h * d_.fire_w)]; }
  double fire_term(I h, double x) const {
    return fire::mlp(fire_.w1.data(), fire_.b1.data(), fire_w2(h), fire_.b2[ix(h)], d_.fire_w, x);
  }

  I bucket(I qp, I kp) const {
    return t5::bucket(kp - qp, p_.t5.bidirectional, p_.t5.num_buckets, p_.t5.max_distance);
  }

  void compute_row(I b, I h, I i, Row* row) const;

  // out [B, M, Hq, D] and lse [B, Hq, M] as contiguous doubles.
  void forward(Vec* out, Vec* lse) const;

  struct Grads {
    Vec dq, dk, dv;      // shapes of q, k, v (dq, dk for the rotated vectors until unrotated)
    Vec dw;              // alibi learned [2, Hq] / t5 [num_buckets, Hq]
    Vec du, dvb, dW;     // xl [Hq, D], [Hq, D], [Hq, D, R]
    Vec de;              // cope [npos, D]
    Vec dr1, dr2;        // kerple [Hq] each
    Vec dw1, db1, dw2, db2;  // fire [W], [W], [Hq, W], [Hq]
    double dc = 0, dL = 0;   // fire
    Vec dkq;                 // rotary: the gradient of the rotated keys, per query head [B, N, Hq, D]
    Vec dfreqs;              // rope2d mixed [2, Hq, r/2]
  };

  // The softmax statistics of a larger attention this call is part of (attention_backward_from_stats):
  // its out [B, M, Hq, D] and lse [B, Hq, M] as contiguous doubles.
  struct Stats {
    Vec out, lse;
  };

  // Row i under the given statistics: P_j = exp(l_j − lse_i) (0 where masked; NaN on a NaN row).
  void apply_stats(double lse, Row* row) const {
    row->lse = lse;
    for (std::size_t j = 0; j < row->l.size(); ++j)
      row->P[j] = row->l[j] == kNegInf ? 0.0 : std::exp(row->l[j] - lse);
  }

  // st: the statistics of the larger attention (P from its lse, Σ_t P_t dP_t = dO·out from its out);
  // null: this call's own.
  void backward(const Vec& dout, Grads* gr, const Stats* st = nullptr) const;

 private:
  // gr's gradients sized and zeroed (those of the call's encoding); xl: G [Hq, nd, D] too.
  void init_grads(Grads* gr, Vec* G) const;

  // The encoding's own terms of row i of (b, h): its parameters' gradients from dl (into gr; xl's
  // (q + v)·W s terms into G), and da_j = ∂L/∂(scale·q·k_j) (da holds dl on entry; cope adds the
  // gates' path, dp its scratch).
  void encoding_terms(I b, I h, I i, const Row& row, const Vec& dl, Vec* da, Vec* dp, Grads* gr, Vec* G) const;

  void fire_terms(I h, I qp, const Row& row, const Vec& dl, Grads* gr) const;

  void xl_terms(I b, I h, I i, const Row& row, const Vec& dl, Grads* gr, Vec* G) const;

  void cope_terms(I b, I h, I i, const Row& row, const Vec& dl, Vec* da, Vec* dp, Grads* gr) const;

  // The gradients' last steps: xl's dW from G; the rotary encodings' dfreqs (rope2d mixed) and dq, dk
  // rotated back, dk summed over each kv head's group.
  void finish_grads(Grads* gr, const Vec& G) const;

  const AttentionParams& p_;
  Dims d_;
  Vec q_, k_, v_;          // gathered; q_ rotated for the rotary encodings
  Vec kq_;                 // rotary: k̃ per query head [B, N, Hq, D]
  Vec slopes_, w_;         // alibi slopes [Hq]; alibi learned [2, Hq] / t5 [num_buckets, Hq]
  Vec u_, vb_, W_;         // xl
  Vec s_, r_;              // xl: s(δ) [nd, R]; r_h(δ) [Hq, nd, D]
  I dmin_ = 0, nd_ = 0;    // xl: smallest distance, number of distances
  Vec table_;              // cope [npos, D]
  Vec r1_, r2_;            // kerple [Hq] each
  Vec sandwich_w_;         // sandwich: the d̄/2 frequencies
  fire::Values fire_;      // fire: the MLP, c and L
};

}  // namespace posenc::attn_ref
