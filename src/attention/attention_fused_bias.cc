// class Fused (attention_fused_cpu.h): construction, the bias encodings' tables (ALiBi's slopes,
// learned ALiBi's σ(w), T5's buckets, KERPLE's and Sandwich's per-distance tables, FIRE's pieces and
// thresholds), the bias of a tile, and the bias parameters' gradients from dS.
#include <omp.h>

#include <cmath>
#include <cstdlib>

#include "attention/attention_fused_cpu.h"
#include "enc/bias/alibi/alibi_math.h"
#include "enc/bias/fire/fire_check.h"
#include "enc/bias/fire/fire_math.h"
#include "enc/bias/kerple/kerple_math.h"
#include "enc/bias/sandwich/sandwich_math.h"
#include "enc/bias/t5/t5_math.h"

namespace posenc::fused_cpu {

Fused::Fused(const AttentionParams& p, const Dims& d, const View& q, const View& k, const View& v,
             const EncodingTensors& t, int threads)
    : p_(p), d_(d), q_(q), k_(k), v_(v), threads_(threads), simd_(simd()), xs_(extra()), gemm_(tile_gemm_for(d.D)) {
  const I Hq = d.Hq;
  dir_q_ = direct(q);
  dir_k_ = direct(k);
  dir_v_ = direct(v);
  cf_ = careful_forward(simd_, d, k, threads);
  bf16_ = p.bf16_rate && bf16_rate(q, k, v) ? attn_fast::bf16_ops() : nullptr;
  if (d.rotary) {
    interleaved_ = d.rot.layout == RopeLayout::kInterleaved;
    per_head_ = d.rot.per_head();
    tab_q_.build(xs_, d.rot, d.q_ids, d.B, d.M, d.q_batched, Hq, +1, threads);
    tq_ = &tab_q_;
    if (!p.keys_rotated) {  // else k carries its rotation: read as it is, dK not rotated back
      tab_k_.build(xs_, d.rot, d.k_ids, d.B, d.N, d.k_batched, Hq, -1, threads);
      tk_ = &tab_k_;
    }
    if (per_head_) {
      // dfreqs = Σ p·∂L/∂φ over the head's rotated q and k rows. The logits depend on φ_q − φ_k
      // only, so Σ ∂L/∂φ = 0 per head and pair: Σ (p − p₀)·∂L/∂φ is the same sum, and with p₀ the
      // middle of the call's positions it loses no digits to cancellation at large positions.
      for (int a = 0; a < 2; ++a) {
        I lo = INT64_MAX, hi = INT64_MIN;
        for (const std::vector<I>* ids : {&d.q_ids, &d.k_ids}) {
          const I n = ids == &d.q_ids ? d.M : d.N;
          for (I b = 0; b < d.B; ++b)
            for (I i = 0; i < n; ++i) {
              const I v = (*ids)[ix((b * 2 + a) * n + i)];
              lo = std::min(lo, v), hi = std::max(hi, v);
            }
        }
        pos0_[a] = lo <= hi ? static_cast<double>(lo / 2 + hi / 2) : 0.0;
      }
    }
  }
  if (p.encoding == Encoding::kAlibi) {
    const AlibiVariant var = p.alibi.variant;
    nonsym_ = var == AlibiVariant::kNonsymmetric;
    if (var == AlibiVariant::kLearned) {
      bias_ = Bias::kLearned;
      const std::vector<double> w = to_doubles(t.weights);  // [2, Hq]
      sig_.resize(ix(2 * Hq));
      for (I i = 0; i < 2 * Hq; ++i) sig_[ix(i)] = alibi::sigmoid(w[ix(i)]);
    } else {
      bias_ = Bias::kSlopes;
      if (t.slopes.present()) {
        slopes_ = to_doubles(t.slopes);
      } else {
        slopes_ = alibi::rule_slopes(Hq, nonsym_);
      }
    }
  }
  if (p.encoding == Encoding::kT5) {
    bias_ = Bias::kT5;
    const I nb = p.t5.num_buckets;
    const std::vector<double> w = to_doubles(t.weights);  // [nb, Hq]
    t5w_.resize(ix(Hq * nb));  // [Hq, nb]: a head's row stays in cache
    for (I bk = 0; bk < nb; ++bk)
      for (I h = 0; h < Hq; ++h) t5w_[ix(h * nb + bk)] = static_cast<float>(w[ix(bk * Hq + h)]);
    // The bucket of every kp − qp the call meets (M + N − 1 values, shared by the heads): the log
    // of t5::bucket leaves the tiles.
    rel_lo_ = d.k_off - d.q_off - (d.M - 1);
    bucket_.resize(ix(d.M + d.N - 1));
    for (I t = 0; t < d.M + d.N - 1; ++t)
      bucket_[ix(t)] = static_cast<std::int32_t>(
          t5::bucket(rel_lo_ + t, p.t5.bidirectional, nb, p.t5.max_distance));
  }
  if (p.encoding == Encoding::kKerple || p.encoding == Encoding::kSandwich) build_lut(t);
  if (p.encoding == Encoding::kFire) build_fire(t);
}

void Fused::tile_bias(I h, I base, I nq, I nk, float* diag) const {
  const I nt = nq + nk - 1, rel0 = base - (nq - 1);
  switch (bias_) {
    case Bias::kSlopes: {
      const double m = slopes_[ix(h)];
      for (I t = 0; t < nt; ++t) {
        const I rel = rel0 + t;
        diag[t] = static_cast<float>(-m * static_cast<double>(rel < 0 ? -rel : rel));
      }
      break;
    }
    case Bias::kLearned: {
      const double past = sig_[ix(h)], fut = sig_[ix(d_.Hq + h)];
      for (I t = 0; t < nt; ++t) {
        const I rel = rel0 + t;
        diag[t] = static_cast<float>(rel < 0 ? past * static_cast<double>(rel)
                                             : -fut * static_cast<double>(rel));
      }
      break;
    }
    case Bias::kT5: {
      const float* w = &t5w_[ix(h * p_.t5.num_buckets)];
      const std::int32_t* bk = &bucket_[ix(rel0 - rel_lo_)];
      for (I t = 0; t < nt; ++t) diag[t] = w[bk[t]];
      break;
    }
    default: break;
  }
}

void Fused::param_grads(I h, I base, I nq, I nk, const float* dS, float* diag, double* gwh) const {
  const I nt = nq + nk - 1;
  xs_.sum_diag(dS, nq, nk, kBk, diag);
  for (I t = 0; t < nt; ++t) {
    if (diag[t] == 0.f) continue;
    const I rel = base + t - (nq - 1);
    if (bias_ == Bias::kT5) {
      gwh[bucket_[ix(rel - rel_lo_)]] += diag[t];
    } else if (bias_ == Bias::kLut) {  // kerple: Σ dS·∂b/∂r1, Σ dS·∂b/∂r2 at this distance
      const std::size_t at = ix(h * lut_w_ + rel - rel_lo_);
      gwh[0] += static_cast<double>(diag[t]) * dlut_[2 * at];
      gwh[1] += static_cast<double>(diag[t]) * dlut_[2 * at + 1];
    } else if (rel != 0) {  // learned ALiBi: ∂/∂w[side] = −σ(1 − σ)|Δ|
      const int side = rel < 0 ? 0 : 1;
      const double sg = sig_[ix(side * d_.Hq + h)];
      const double dist = static_cast<double>(rel < 0 ? -rel : rel);
      gwh[side] += static_cast<double>(diag[t]) * (-sg * (1 - sg) * dist);
    }
  }
}

void Fused::build_lut(const EncodingTensors& t) {
  bias_ = Bias::kLut;
  const I Hq = d_.Hq, nd = std::max<I>(d_.M + d_.N - 1, 0);
  rel_lo_ = d_.k_off - d_.q_off - (d_.M - 1);
  lut_w_ = nd;
  lut_.resize(ix(Hq * nd));
  const int th = nd > 4096 ? threads_ : 1;
  if (p_.encoding == Encoding::kKerple) {
    const bool power = p_.kerple.kernel == KerpleKernel::kPower;
    const std::vector<double> r1 = to_doubles(t.r1), r2 = to_doubles(t.r2);
    dlut_.resize(ix(2 * Hq * nd));
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
    for (I e = 0; e < nd; ++e) {
      const I rel = rel_lo_ + e;
      const double dist = static_cast<double>(rel < 0 ? -rel : rel);
      for (I h = 0; h < Hq; ++h) {
        const kerple::Term k = kerple::term(power, r1[ix(h)], r2[ix(h)], dist);
        lut_[ix(h * nd + e)] = static_cast<float>(k.b);
        dlut_[ix(2 * (h * nd + e))] = k.d_r1;
        dlut_[ix(2 * (h * nd + e) + 1)] = k.d_r2;
      }
    }
  } else {
    const std::vector<double> w = sandwich::freqs(p_.sandwich.sinusoid_dim, p_.sandwich.base);
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
    for (I e = 0; e < nd; ++e) {
      const double v = sandwich::shifted_inner_product(static_cast<double>(rel_lo_ + e), w);
      for (I h = 0; h < Hq; ++h) lut_[ix(h * nd + e)] = static_cast<float>(v * sandwich::head_scale(h, Hq));
    }
  }
}

void Fused::build_fire(const EncodingTensors& t) {
  bias_ = Bias::kFire;
  const I Hq = d_.Hq, nd = std::max<I>(d_.M + d_.N - 1, 0), M = d_.M;
  fire_v_ = fire::values(t.fire);
  fire_p_ = fire::pieces(fire_v_.w1, fire_v_.b1, fire_v_.w2, fire_v_.b2, Hq);
  const double c = fire_v_.c, L = fire_v_.L;
  rel_lo_ = d_.k_off - d_.q_off - (d_.M - 1);
  fire_psi_.resize(ix(nd));
  fire_dpsi_.resize(ix(nd));
  for (I e = 0; e < nd; ++e) {
    const I rel = rel_lo_ + e;
    const double dist = static_cast<double>(rel < 0 ? -rel : rel);
    fire_psi_[ix(e)] = static_cast<float>(fire::psi(c, dist));
    fire_dpsi_[ix(e)] = static_cast<float>(fire::psi_dc(c, dist));
  }
  fire_inv_.resize(ix(M));
  fire_cf_.resize(ix(M));
  fire_lf_.resize(ix(M));
  for (I i = 0; i < M; ++i) {
    const I qp = d_.q_off + i;
    const double n = fire::norm_arg(L, qp), inv = 1.0 / fire::psi(c, n);
    fire_inv_[ix(i)] = inv;
    fire_cf_[ix(i)] = fire::psi_dc(c, n) * inv;
    fire_lf_[ix(i)] = fire::by_threshold(L, qp) ? -fire::psi_dx(c, n) * inv * inv : 0.0;
  }
  // Per row, the smallest distance at or past each breakpoint: x(d) ≥ t_k ⇔ d ≥ (e^{t_k·ψ(n)} − 1)/c,
  // clamped past the call's largest distance (rows at or below L share n = L).
  const I nb = fire_p_.S;
  fire_th_.resize(ix(M * nb));
  const double dmax = static_cast<double>(std::max(std::llabs(rel_lo_), std::llabs(rel_lo_ + nd - 1))) + 1;
  for (I i = 0; i < M; ++i) {
    const I qp = d_.q_off + i;
    if (i > 0 && fire::by_threshold(L, qp) && fire::by_threshold(L, qp - 1)) {
      std::copy_n(&fire_th_[ix((i - 1) * nb)], nb, &fire_th_[ix(i * nb)]);
      continue;
    }
    const double pn = fire::psi(c, fire::norm_arg(L, qp));
    for (I k = 0; k < nb; ++k) {
      const double dt = std::ceil(std::expm1(fire_p_.t[ix(k)] * pn) / c);
      fire_th_[ix(i * nb + k)] = static_cast<I>(dt < dmax ? dt : dmax);
    }
  }
  fire_a_.resize(fire_p_.alpha.size());
  for (std::size_t e = 0; e < fire_a_.size(); ++e) fire_a_[e] = static_cast<float>(fire_p_.alpha[e]);
}

void Fused::fire_tile(I h, I q0, I base, I nq, I nk, float* S, const float* dS, double* gwh) const {
  const fire::Pieces& P = fire_p_;
  const I segs = P.segs(), nb = P.S;
  const float* alpha = &fire_a_[ix(h * segs)];
  // The segment of distance d ≥ 1 rises with d and, the thresholds rising with the query position,
  // falls from row to row. So the segments of a tile wholly before its queries (or wholly after
  // them) lie between its last row's at its smallest distance and its first row's at its largest:
  // one segment for most tiles off the diagonal, a few for the rest. There each row is those
  // segments' runs in order, cut at its thresholds with no search (the same runs, the same bits).
  I lo = -1, hi = -1;
  const bool before = base + nk - 1 < 0;
  if (before || base - (nq - 1) > 0) {
    const I dmax = before ? nq - 1 - base : base + nk - 1, dmin = before ? -(base + nk - 1) : base - (nq - 1);
    const auto seg = [nb](const I* th, I d) {
      I sg = 0;
      while (sg < nb && d >= th[sg]) ++sg;
      return sg;
    };
    hi = seg(fire_th_.data() + q0 * nb, dmax);
    lo = seg(fire_th_.data() + (q0 + nq - 1) * nb, dmin);
  }
  if (lo >= 0 && S && hi - lo <= kFireSpan) {
    xs_.fire_span(S, nq, nk, kBk, &fire_psi_[ix(base - rel_lo_)], base, before, fire_th_.data() + q0 * nb, nb,
                  lo, hi, alpha, &P.beta[ix(h * segs)], &fire_inv_[ix(q0)]);
    return;
  }
  I hint = 0;
  for (I i = 0; i < nq; ++i) {
    const I row = q0 + i, r0 = base - i;  // kp − qp of the row's key 0
    const float* ps = &fire_psi_[ix(r0 - rel_lo_)];
    const float* dps = &fire_dpsi_[ix(r0 - rel_lo_)];
    const I* th = nb ? &fire_th_[ix(row * nb)] : nullptr;
    const double inv = fire_inv_[ix(row)];
    auto run = [&](I j0, I j1, I sg) {
      if (S) {
        xs_.affine_add(S + i * kBk + j0, ps + j0, j1 - j0, alpha[sg], static_cast<float>(P.b(h, sg) * inv));
        return;
      }
      float m[3];
      xs_.moments(dS + i * kBk + j0, ps + j0, dps + j0, j1 - j0, m);
      const double beta = P.b(h, sg);
      gwh[sg] += m[0];
      gwh[segs + sg] += inv * m[1];
      gwh[2 * segs] += beta * inv * (m[2] - static_cast<double>(m[1]) * fire_cf_[ix(row)]);
      gwh[2 * segs + 1] += beta * m[1] * fire_lf_[ix(row)];
    };
    if (lo >= 0 && hi - lo <= kFireSpan) {  // the backward's side of fire_span: the same cuts
      I j = 0;
      for (I k = 0; k <= hi - lo; ++k) {
        const I sg = before ? hi - k : lo + k;
        const I e = fire_span_end(before, r0, th, sg, k, lo, hi, j, nk);
        if (e > j) run(j, e, sg);
        j = e;
      }
      continue;
    }
    // segment of distance d ≥ 1: the number of thresholds ≤ d, walked from the last one found
    auto seg = [&](I d) {
      I sg = hint > nb ? 0 : hint;
      while (sg > 0 && d < th[sg - 1]) --sg;
      while (sg < nb && d >= th[sg]) ++sg;
      return hint = sg;
    };
    const I jz = std::clamp<I>(-r0, 0, nk);  // the first key at or after the query
    for (I j = 0; j < jz;) {  // before the query: d = −r0 − j falls
      const I sg = seg(-r0 - j);
      const I e = sg > 0 ? std::min(jz, -r0 - th[sg - 1] + 1) : jz;  // until d < th[sg − 1]
      run(j, e, sg);
      j = e;
    }
    I j = jz;
    if (j < nk && r0 + j == 0) run(j, j + 1, P.zero()), ++j;  // the diagonal: x = 0
    while (j < nk) {  // after it: d = r0 + j rises
      const I sg = seg(r0 + j);
      const I e = sg < nb ? std::min(nk, th[sg] - r0) : nk;  // until d ≥ th[sg]
      run(j, e, sg);
      j = e;
    }
  }
}

void Fused::fire_grads(const std::vector<double>& sum, const FireTensors& g) const {
  const fire::Pieces& P = fire_p_;
  const I Hq = d_.Hq, segs = P.segs(), npar = 2 * segs + 2;
  std::vector<double> M0(ix(Hq * segs)), M1(ix(Hq * segs));
  double dc = 0, dL = 0;
  for (I h = 0; h < Hq; ++h) {
    for (I sg = 0; sg < segs; ++sg) {
      M0[ix(h * segs + sg)] = sum[ix(h * npar + sg)];
      M1[ix(h * segs + sg)] = sum[ix(h * npar + segs + sg)];
    }
    dc += sum[ix(h * npar + 2 * segs)];
    dL += sum[ix(h * npar + 2 * segs + 1)];
  }
  std::vector<double> dw1(fire_v_.w1.size(), 0.0), db1(fire_v_.b1.size(), 0.0), dw2(fire_v_.w2.size(), 0.0),
      db2(fire_v_.b2.size(), 0.0);
  fire::mlp_grads(P, fire_v_.w1, fire_v_.b1, fire_v_.w2, M0, M1, &dw1, &db1, &dw2, &db2);
  fire::write_grads(g, dw1, db1, dw2, db2, dc, dL);
}

}  // namespace posenc::fused_cpu
