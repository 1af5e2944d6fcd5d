// The reference attention's backward in double (attention_ref_problem.h; the derivatives: attention_ref.cc).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/attention_ref_problem.h"

namespace posenc::attn_ref {

void Problem::backward(const Vec& dout, Grads* gr, const Stats* st) const {
  const I B = d_.B, M = d_.M, N = d_.N, Hq = d_.Hq, D = d_.D;
  const double sc = d_.scale;
  Vec G;  // xl: G_h(δ) [Hq, nd, D]
  init_grads(gr, &G);

  Row row;
  Vec dl(ix(N)), da(ix(N)), dp(ix(N));
  for (I b = 0; b < B; ++b)
    for (I h = 0; h < Hq; ++h)
      for (I i = 0; i < M; ++i) {
        compute_row(b, h, i, &row);
        if (st) apply_stats(st->lse[ix((b * Hq + h) * M + i)], &row);
        if (row.lse == kNegInf) continue;  // every key masked: nothing depends on the inputs
        const I kh = h / d_.G;
        const double* qi = q(b, i, h);
        const double* dO = &dout[ix(((b * M + i) * Hq + h) * D)];
        double* dqi = &gr->dq[ix(((b * M + i) * Hq + h) * D)];
        // softmax: dl_j = P_j (dP_j − Σ_t P_t dP_t), dP_j = dO·v_j
        double rowsum = 0;
        for (I j = 0; j < N; ++j) {
          dl[ix(j)] = 0;
          if (row.P[ix(j)] == 0) continue;
          dl[ix(j)] = dot(dO, v(b, j, kh), D);
          rowsum += row.P[ix(j)] * dl[ix(j)];
          axpy(row.P[ix(j)], dO, &gr->dv[ix(((b * N + j) * d_.Hkv + kh) * D)], D);
        }
        if (st) rowsum = dot(dO, &st->out[ix(((b * M + i) * Hq + h) * D)], D);
        // With a NaN or ±inf in rowsum (a NaN row, or a non-finite v or dO), a key of weight 0 keeps
        // dl = 0 rather than 0·(dP − rowsum) = NaN: it does not pass the NaN on.
        const bool finite = std::isfinite(rowsum);
        for (I j = 0; j < N; ++j)
          dl[ix(j)] = finite || row.P[ix(j)] != 0 ? row.P[ix(j)] * (dl[ix(j)] - rowsum) : 0.0;

        // the encoding's own terms; da_j = ∂L/∂(scale·q·k) starts as dl_j
        for (I j = 0; j < N; ++j) da[ix(j)] = row.a[ix(j)] == kNegInf ? 0.0 : dl[ix(j)];
        encoding_terms(b, h, i, row, dl, &da, &dp, gr, &G);
        // the product a_j = scale·q_i·k_j
        for (I j = 0; j < N; ++j) {
          if (da[ix(j)] == 0) continue;
          axpy(sc * da[ix(j)], key(b, j, h), dqi, D);
          double* dkj = d_.rotary ? &gr->dkq[ix(((b * N + j) * Hq + h) * D)]
                                  : &gr->dk[ix(((b * N + j) * d_.Hkv + kh) * D)];
          axpy(sc * da[ix(j)], qi, dkj, D);
        }
      }

  finish_grads(gr, G);
}

void Problem::init_grads(Grads* gr, Vec* G) const {
  const I Hq = d_.Hq, D = d_.D;
  gr->dq.assign(q_.size(), 0.0);
  gr->dk.assign(k_.size(), 0.0);
  gr->dv.assign(v_.size(), 0.0);
  if (d_.rotary) gr->dkq.assign(kq_.size(), 0.0);
  if (p_.encoding == Encoding::kAlibi && p_.alibi.variant == AlibiVariant::kLearned)
    gr->dw.assign(w_.size(), 0.0);
  if (p_.encoding == Encoding::kT5) gr->dw.assign(w_.size(), 0.0);
  if (p_.encoding == Encoding::kXL) {
    gr->du.assign(u_.size(), 0.0);
    gr->dvb.assign(vb_.size(), 0.0);
    gr->dW.assign(W_.size(), 0.0);
    G->assign(ix(Hq * nd_ * D), 0.0);
  }
  if (p_.encoding == Encoding::kCope) gr->de.assign(table_.size(), 0.0);
  if (p_.encoding == Encoding::kKerple) {
    gr->dr1.assign(r1_.size(), 0.0);
    gr->dr2.assign(r2_.size(), 0.0);
  }
  if (p_.encoding == Encoding::kFire) {
    gr->dw1.assign(fire_.w1.size(), 0.0);
    gr->db1.assign(fire_.b1.size(), 0.0);
    gr->dw2.assign(fire_.w2.size(), 0.0);
    gr->db2.assign(fire_.b2.size(), 0.0);
  }
}

void Problem::encoding_terms(I b, I h, I i, const Row& row, const Vec& dl, Vec* da, Vec* dp, Grads* gr, Vec* G) const {
  const I N = d_.N, Hq = d_.Hq, qp = d_.q_off + i;
  switch (p_.encoding) {
    case Encoding::kAlibi:
      if (p_.alibi.variant == AlibiVariant::kLearned)
        for (I j = 0; j < N; ++j) {
          if (dl[ix(j)] == 0) continue;
          int side = -1;
          double dterm = 0;
          alibi_term(h, qp, d_.k_off + j, &side, &dterm);
          if (side >= 0) gr->dw[ix(side * Hq + h)] += dl[ix(j)] * dterm;
        }
      break;
    case Encoding::kT5:
      for (I j = 0; j < N; ++j)
        if (row.a[ix(j)] != kNegInf) gr->dw[ix(bucket(qp, d_.k_off + j) * Hq + h)] += dl[ix(j)];
      break;
    case Encoding::kKerple:
      for (I j = 0; j < N; ++j) {
        if (row.a[ix(j)] == kNegInf) continue;
        const I kp = d_.k_off + j;
        const kerple::Term t = kerple::term(p_.kerple.kernel == KerpleKernel::kPower, r1_[ix(h)],
                                            r2_[ix(h)], static_cast<double>(qp > kp ? qp - kp : kp - qp));
        gr->dr1[ix(h)] += dl[ix(j)] * t.d_r1;
        gr->dr2[ix(h)] += dl[ix(j)] * t.d_r2;
      }
      break;
    case Encoding::kFire:
      fire_terms(h, qp, row, dl, gr);
      break;
    case Encoding::kXL:
      xl_terms(b, h, i, row, dl, gr, G);
      break;
    case Encoding::kCope:
      cope_terms(b, h, i, row, dl, da, dp, gr);
      break;
    default: break;
  }
}

void Problem::fire_terms(I h, I qp, const Row& row, const Vec& dl, Grads* gr) const {
  const I N = d_.N;
  for (I j = 0; j < N; ++j) {
    if (row.a[ix(j)] == kNegInf) continue;
    const I kp = d_.k_off + j;
    const fire::X xx =
        fire::normalised(fire_.c, fire_.L, qp, static_cast<double>(qp > kp ? qp - kp : kp - qp));
    const double gd = dl[ix(j)];
    gr->db2[ix(h)] += gd;
    double dx = 0;
    for (I k = 0; k < d_.fire_w; ++k) {
      const double u = fire_.w1[ix(k)] * xx.x + fire_.b1[ix(k)];
      if (!(u > 0)) continue;  // relu'(0) = 0
      const double w2 = fire_w2(h)[k];
      gr->dw2[ix(h * d_.fire_w + k)] += gd * u;
      gr->dw1[ix(k)] += gd * w2 * xx.x;
      gr->db1[ix(k)] += gd * w2;
      dx += gd * w2 * fire_.w1[ix(k)];
    }
    gr->dc += dx * xx.dc;
    gr->dL += dx * xx.dL;
  }
}

void Problem::xl_terms(I b, I h, I i, const Row& row, const Vec& dl, Grads* gr, Vec* G) const {
  const I N = d_.N, D = d_.D, kh = h / d_.G, qp = d_.q_off + i, M = d_.M, Hq = d_.Hq;
  const double sc = d_.scale;
  const double* qi = q(b, i, h);
  double* dqi = &gr->dq[ix(((b * M + i) * Hq + h) * D)];
  for (I j = 0; j < N; ++j) {
    if (row.a[ix(j)] == kNegInf) continue;
    const double c = sc * dl[ix(j)];
    const I delta = qp - (d_.k_off + j);
    const double* kj = k(b, j, kh);
    const double* rr = r(h, delta);
    axpy(c, rr, dqi, D);                                   // q·r
    double* dkj = &gr->dk[ix(((b * N + j) * d_.Hkv + kh) * D)];
    axpy(c, &u_[ix(h * D)], dkj, D);                       // u·k
    axpy(c, kj, &gr->du[ix(h * D)], D);
    axpy(c, rr, &gr->dvb[ix(h * D)], D);                   // v·r
    double* Gd = &(*G)[ix((h * nd_ + (delta - dmin_)) * D)];  // (q + v)·W s
    axpy(c, qi, Gd, D);
    axpy(c, &vb_[ix(h * D)], Gd, D);
  }
}

void Problem::cope_terms(I b, I h, I i, const Row& row, const Vec& dl, Vec* da, Vec* dp, Grads* gr) const {
  const I N = d_.N, D = d_.D, M = d_.M, Hq = d_.Hq;
  const double* qi = q(b, i, h);
  double* dqi = &gr->dq[ix(((b * M + i) * Hq + h) * D)];
  for (I j = 0; j < N; ++j) {
    (*dp)[ix(j)] = 0;
    if (row.a[ix(j)] == kNegInf) continue;
    const cope::Interp& c = row.pos[ix(j)];
    const double* ef = e(c.lo);
    const double* ec = e(c.hi);
    axpy(dl[ix(j)] * (1 - c.w), ef, dqi, D);
    axpy(dl[ix(j)] * c.w, ec, dqi, D);
    axpy(dl[ix(j)] * (1 - c.w), qi, &gr->de[ix(c.lo * D)], D);
    axpy(dl[ix(j)] * c.w, qi, &gr->de[ix(c.hi * D)], D);
    if (!c.clamped) (*dp)[ix(j)] = dl[ix(j)] * (dot(qi, ec, D) - dot(qi, ef, D));
  }
  double dg = 0;  // dg_t = Σ_{j ≤ t} dp_j
  for (I t = 0; t < N; ++t) {
    dg += (*dp)[ix(t)];
    if (row.a[ix(t)] == kNegInf) continue;
    const double g = row.g[ix(t)];
    (*da)[ix(t)] += dg * g * (1 - g);
  }
}

void Problem::finish_grads(Grads* gr, const Vec& G) const {
  const I B = d_.B, M = d_.M, N = d_.N, Hq = d_.Hq, D = d_.D;
  if (p_.encoding == Encoding::kXL)  // dW_h = Σ_δ G_h(δ) s(δ)ᵀ
    for (I h = 0; h < Hq; ++h)
      for (I e = 0; e < nd_; ++e) {
        const double* Gd = &G[ix((h * nd_ + e) * D)];
        const double* sd = &s_[ix(e * d_.R)];
        for (I dd = 0; dd < D; ++dd)
          for (I c = 0; c < d_.R; ++c) gr->dW[ix((h * D + dd) * d_.R + c)] += Gd[dd] * sd[c];
      }
  if (d_.rotary) {
    // Mixed: ∂L/∂φ of every rotated q and k pair, times its position (x, y), summed per head.
    if (d_.rot.per_head()) {
      gr->dfreqs.assign(ix(2 * Hq * d_.rot.half), 0.0);
      rotary::mixed_freq_grad_ref(d_.rot, q_, gr->dq, B, M, Hq, D, d_.q_ids, &gr->dfreqs);
      rotary::mixed_freq_grad_ref(d_.rot, kq_, gr->dkq, B, N, Hq, D, d_.k_ids, &gr->dfreqs);
    }
    // Back from the rotated vectors: the transpose a·ρ·R(−φ); the key's per head, summed over its
    // group.
    rotary::rotate_ref(d_.rot, &gr->dq, B, M, Hq, D, d_.q_ids, -1, +1);
    if (!p_.keys_rotated) rotary::rotate_ref(d_.rot, &gr->dkq, B, N, Hq, D, d_.k_ids, -1, -1);
    for (I b = 0; b < B; ++b)
      for (I j = 0; j < N; ++j)
        for (I h = 0; h < Hq; ++h)
          axpy(1.0, &gr->dkq[ix(((b * N + j) * Hq + h) * D)], &gr->dk[ix(((b * N + j) * d_.Hkv + h / d_.G) * D)], D);
  }
}

}  // namespace posenc::attn_ref
