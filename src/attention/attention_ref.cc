// The reference attention with a positional encoding inside it: scalar, readable, double accumulation.
// It is the oracle the fused kernels are tested against, so clarity wins over speed. These are
// posenc::reference::attention_forward / attention_backward; the public posenc:: entry points are the
// fused dispatchers of attention_cpu.cc, which fall back to these for what they do not cover.
// Validation is shared with the dispatcher (attention_check.h).
//
// Shape letters: B batch, M queries, N keys, Hq query heads, Hkv key/value heads (G = Hq/Hkv query
// heads share one), D head dimension. q [B, M, Hq, D]; k, v [B, N, Hkv, D]; out [B, M, Hq, D];
// lse [B, Hq, M]. Query i sits at position qp = q_offset + i, key j at kp = k_offset + j.
//
// Arguments: q, k, v share one dtype (float32 or float64, any strides); out, dq, dk, dv have it too;
// lse is float64; encoding tensors and their gradients may be either float type. Everything is
// validated before anything is written, and a Status names the argument at fault (gradient views as
// dweights, du, dv_bias, drel_proj, dtable). A tensor in EncodingTensors, or a gradient in
// EncodingGrads, that the chosen encoding does not read is an error rather than silently ignored.
//
// ---- forward, for one row (b, h, i), h reading kv head h / G ----------------------------------------
//   l_j   = scale·q_i·k_j + term_j        (−inf where masked: causal kp > qp, or the ALiBi mask)
//   P_j   = exp(l_j − lse),  lse = log Σ_j exp(l_j)
//   out_i = Σ_j P_j v_j                   (a row with every key masked: out = 0, lse = −inf)
//   A logit of −inf counts as masked. A row with a NaN or +inf logit is a NaN row: P_j = NaN for
//   every l_j ≠ −inf, 0 for the rest, lse = NaN (so out_i is all NaN); the key of P_j = 0 is never
//   read (posenc/attention.h: non-finite values).
//
// ---- backward, with dO = ∂L/∂out_i -----------------------------------------------------------------
//   dv_j += P_j dO;   dP_j = dO·v_j;   dl_j = P_j (dP_j − Σ_t P_t dP_t)   (Σ_t P_t dP_t = dO·out_i)
//   (dl_j = 0 where P_j = 0, also when the sum is NaN or ±inf: a NaN row, a non-finite v or dO)
//   attention_backward_from_stats: P_j = exp(l_j − lse) and Σ_t P_t dP_t = dO·out_i from the lse and
//   out it is given (those of a larger attention whose keys this call holds a shard of).
//   The plain product gives dq_i += scale·da_j·k_j and dk_j += scale·da_j·q_i where da_j = ∂L/∂(a_j),
//   a_j = scale·q_i·k_j; for every encoding but CoPE, da_j = dl_j. Masked entries have P = 0, dl = 0
//   and contribute nothing (no −inf is ever multiplied).
//
// ---- the encodings' terms and their derivatives ----------------------------------------------------
// rope (Su et al. 2021, arXiv 2104.09864), rope2d, mrope, xpos (rotary.h): q_i ↦ a·ρ·R(φ(qp))q_i,
//   k_j ↦ a·ρ'·R(φ(kp))k_j per pair, φ and ρ those of the call's rotary::Plan (rotary_plan.h:
//   RoPE's scheme and angle mode, 2D axial / mixed angles, M-RoPE's sections, xPos's ζ^(±(p −
//   c)/s)); the positions are 1D (q_off + i, k_off + j) or rope2d's / mrope's q_positions and
//   k_positions. The key is rotated per query head (rope2d mixed's frequencies are per head; for
//   the others every head of a group sees the same k̃). The product uses the rotated vectors; the
//   gradients computed for them are rotated back, dq = (a·ρ·R(φ))ᵀ dq̃ = a·ρ·R(−φ) dq̃ (R is
//   orthogonal), the key's per query head and summed over the group. Mixed: dθ = Σ (x, y)·∂L/∂φ
//   over the rotated q and k of each head, ∂L/∂φ = g_b·ỹ_a − g_a·ỹ_b (ỹ rotated, g its gradient).
// alibi (Press et al. 2022, arXiv 2108.12409): term = −m_h·|qp − kp| (symmetric, nonsymmetric);
//   nonsymmetric masks kp > qp for heads h < Hq/2 and kp < qp for the others, its slopes being the
//   rule's for Hq/2 heads, shared by h and h + Hq/2. Caller-given slopes [Hq] are used per head as
//   they are. learned: term = −σ(w[0,h])·(qp − kp) for kp < qp, −σ(w[1,h])·(kp − qp) for kp > qp,
//   0 on the diagonal; ∂term/∂w[0,h] = −σ(w)(1 − σ(w))·|qp − kp| on the past side (likewise w[1,h]
//   on the future side), so dw[·,h] = Σ dl_ij·∂term_ij/∂w.
// t5 (Raffel et al. 2020): term = W[bucket(kp − qp), h] (t5_math.h); dW[bucket, h] = Σ dl over the
//   (i, j) of that bucket.
// xl (Dai et al. 2019, arXiv 1901.02860, §3.3; xl_math.h): the whole logit is
//     l_ij = scale·((q_i + u_h)·k_j + (q_i + v_h)·r_h(δ)),  r_h(δ) = W_h s(δ),  δ = qp − kp,
//   so with c = scale·dl_ij:
//     dq_i += c (k_j + r_h(δ));   dk_j += c (q_i + u_h);   du_h += c k_j;   dv_h += c r_h(δ);
//     dW_h += c (q_i + v_h) s(δ)ᵀ  — gathered per distance first: G_h(δ) = Σ_{δ_ij = δ} c (q_i + v_h),
//     then dW_h = Σ_δ G_h(δ) s(δ)ᵀ.
// cope (Golovneva et al. 2024, arXiv 2405.18719; cope_math.h):
//     a_ij = scale·q_i·k_j (−inf masked), g_ij = σ(a_ij) (0 masked), S_ij = Σ_{t ≥ j} g_it,
//     p_ij = min(S_ij, npos − 1), f = ⌊p⌋, c = ⌈p⌉, w = p − f,
//     z_ij = (1 − w)·q_i·e_f + w·q_i·e_c,   l_ij = a_ij + z_ij.
//   z depends on q_i directly, on e_f and e_c, and on p through w:
//     dq_i += dl_ij ((1 − w) e_f + w e_c);   de_f += dl_ij (1 − w) q_i;   de_c += dl_ij w q_i;
//     dp_ij = dl_ij (q_i·e_c − q_i·e_f), and 0 where p was clamped (∂min/∂S = 0 there; at an integer
//     p, f = c and the term vanishes: the one-sided derivatives differ at that kink).
//   p_ij depends on g_it for every t ≥ j, so dg_it = Σ_{j ≤ t} dp_ij (a prefix sum over j), and
//     da_it = dl_it (the direct path) + dg_it·g_it(1 − g_it)   (unmasked t only),
//   after which the plain product carries da into dq and dk like every other encoding.
// kerple (Chi et al. 2022, arXiv 2205.09921; kerple_math.h): term = −r1_h·log(1 + r2_h·δ) or
//   −r1_h·δ^r2_h with δ = |qp − kp|; dr1_h = Σ dl·∂term/∂r1, dr2_h = Σ dl·∂term/∂r2.
// sandwich (Chi et al. 2023, arXiv 2212.10356; sandwich_math.h): term = (Σ_{k=1}^{d̄/2}
//   cos((qp − kp)·base^(−2k/d̄)) − d̄/2)·Hq/(8(h+1)); no parameters.
// fire (Li et al. 2023, arXiv 2310.04418; fire_math.h): x = ψ(δ)/ψ(max(L, qp)), ψ(y) = log(c·y + 1),
//   term = b2[h] + Σ_k w2[h,k]·relu(u_k), u_k = w1[k]·x + b1[k]; with g = dl_ij and the units with
//   u_k > 0: db2[h] += g, dw2[h,k] += g·u_k, dw1[k] += g·w2[h,k]·x, db1[k] += g·w2[h,k],
//   dx = g·Σ_k w2[h,k]·w1[k], dc += dx·∂x/∂c, dL += dx·∂x/∂L (0 when qp > L).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/attention_ref_problem.h"

namespace posenc::attn_ref {

Problem::Problem(const AttentionParams& p, const Dims& d, const View& q, const View& k, const View& v,
                 const EncodingTensors& t)
    : p_(p), d_(d), q_(to_doubles(q)), k_(to_doubles(k)), v_(to_doubles(v)) {
  if (d.rotary) {  // q̃ = a·ρ·R(φ)q; k̃ per query head (the key of kv head h/G as head h sees it)
    rotary::rotate_ref(d.rot, &q_, d.B, d.M, d.Hq, d.D, d.q_ids, +1, +1);
    kq_.resize(ix(d.B * d.N * d.Hq * d.D));
    for (I b = 0; b < d.B; ++b)
      for (I j = 0; j < d.N; ++j)
        for (I h = 0; h < d.Hq; ++h)
          std::copy_n(this->k(b, j, h / d.G), d.D, &kq_[ix(((b * d.N + j) * d.Hq + h) * d.D)]);
    if (!p.keys_rotated) rotary::rotate_ref(d.rot, &kq_, d.B, d.N, d.Hq, d.D, d.k_ids, +1, -1);
  }
  if (p.encoding == Encoding::kAlibi) {
    if (p.alibi.variant == AlibiVariant::kLearned) {
      w_ = to_doubles(t.weights);
    } else if (t.slopes.present()) {
      slopes_ = to_doubles(t.slopes);
    } else {
      slopes_ = alibi::rule_slopes(d.Hq, p.alibi.variant == AlibiVariant::kNonsymmetric);
    }
  }
  if (p.encoding == Encoding::kT5) w_ = to_doubles(t.weights);
  if (p.encoding == Encoding::kXL) {
    u_ = to_doubles(t.u);
    vb_ = to_doubles(t.v);
    W_ = to_doubles(t.rel_proj);
    // Distances δ = qp − kp range over [dmin, dmin + M + N − 2]; s(δ) [R] and r_h(δ) [D] per δ.
    dmin_ = d.q_off - (d.k_off + d.N - 1);
    const I nd = d.M + d.N - 1 > 0 ? d.M + d.N - 1 : 0;
    s_.assign(ix(nd * d.R), 0.0);
    r_.assign(ix(d.Hq * nd * d.D), 0.0);
    for (I e = 0; e < nd; ++e) {
      xl::relative_sinusoid(static_cast<double>(dmin_ + e), d.R, &s_[ix(e * d.R)]);
      for (I h = 0; h < d.Hq; ++h)
        xl::project(&W_[ix(h * d.D * d.R)], &s_[ix(e * d.R)], d.D, d.R, &r_[ix((h * nd + e) * d.D)]);
    }
    nd_ = nd;
  }
  if (p.encoding == Encoding::kCope) table_ = to_doubles(t.table);
  if (p.encoding == Encoding::kKerple) {
    r1_ = to_doubles(t.r1);
    r2_ = to_doubles(t.r2);
  }
  if (p.encoding == Encoding::kSandwich) sandwich_w_ = sandwich::freqs(p.sandwich.sinusoid_dim, p.sandwich.base);
  if (p.encoding == Encoding::kFire) fire_ = fire::values(t.fire);
}

void Problem::compute_row(I b, I h, I i, Row* row) const {
  const I N = d_.N, D = d_.D, qp = d_.q_off + i;
  const double* qi = q(b, i, h);
  row->a.assign(ix(N), kNegInf);
  row->l.assign(ix(N), kNegInf);
  row->P.assign(ix(N), 0.0);
  for (I j = 0; j < N; ++j) {
    const I kp = d_.k_off + j;
    if (masked(h, qp, kp)) continue;
    const double* kj = key(b, j, h);
    const double a = d_.scale * dot(qi, kj, D);
    double l = a;
    switch (p_.encoding) {
      case Encoding::kAlibi: l += alibi_term(h, qp, kp); break;
      case Encoding::kT5: l += w_[ix(bucket(qp, kp) * d_.Hq + h)]; break;
      case Encoding::kKerple:
        l += kerple::bias(p_.kerple.kernel == KerpleKernel::kPower, r1_[ix(h)], r2_[ix(h)],
                          static_cast<double>(qp > kp ? qp - kp : kp - qp));
        break;
      case Encoding::kSandwich:
        l += sandwich::shifted_inner_product(static_cast<double>(kp - qp), sandwich_w_) *
             sandwich::head_scale(h, d_.Hq);
        break;
      case Encoding::kFire:
        l += fire_term(h, fire::normalised(fire_.c, fire_.L, qp, static_cast<double>(qp > kp ? qp - kp : kp - qp)).x);
        break;
      case Encoding::kXL: {
        const double* rr = r(h, qp - kp);
        const double* u = &u_[ix(h * D)];
        const double* vb = &vb_[ix(h * D)];
        l += d_.scale * (dot(u, kj, D) + dot(qi, rr, D) + dot(vb, rr, D));
        break;
      }
      default: break;
    }
    row->a[ix(j)] = a;
    row->l[ix(j)] = l;
  }
  if (p_.encoding == Encoding::kCope) {
    row->g.assign(ix(N), 0.0);
    row->pos.assign(ix(N), cope::Interp{});
    for (I j = 0; j < N; ++j) row->g[ix(j)] = cope::gate(row->a[ix(j)]);
    double count = 0;  // Σ_{t ≥ j} g_t, built from the right
    for (I j = N - 1; j >= 0; --j) {
      count += row->g[ix(j)];
      row->pos[ix(j)] = cope::interpolate(count, d_.npos);
    }
    for (I j = 0; j < N; ++j) {
      if (row->a[ix(j)] == kNegInf) continue;
      const cope::Interp& c = row->pos[ix(j)];
      row->l[ix(j)] += (1 - c.w) * dot(qi, e(c.lo), D) + c.w * dot(qi, e(c.hi), D);
    }
  }
  double mx = kNegInf;
  bool nan = false;
  for (I j = 0; j < N; ++j) {
    if (std::isnan(row->l[ix(j)])) nan = true;
    else mx = std::max(mx, row->l[ix(j)]);
  }
  if (nan || mx == kPosInf) {  // a NaN row: P NaN on every key it sees, lse NaN
    for (I j = 0; j < N; ++j) row->P[ix(j)] = row->l[ix(j)] == kNegInf ? 0.0 : kNaN;
    row->lse = kNaN;
    return;
  }
  if (mx == kNegInf) {  // every key masked: P = 0, out = 0, lse = −inf
    row->lse = kNegInf;
    return;
  }
  double sum = 0;
  for (I j = 0; j < N; ++j) {
    row->P[ix(j)] = std::exp(row->l[ix(j)] - mx);  // exp(−inf) = 0 for masked keys
    sum += row->P[ix(j)];
  }
  for (I j = 0; j < N; ++j) row->P[ix(j)] /= sum;
  row->lse = mx + std::log(sum);
}

void Problem::forward(Vec* out, Vec* lse) const {
  const I D = d_.D;
  out->assign(ix(d_.B * d_.M * d_.Hq * D), 0.0);
  lse->assign(ix(d_.B * d_.Hq * d_.M), kNegInf);
  Row row;
  for (I b = 0; b < d_.B; ++b)
    for (I h = 0; h < d_.Hq; ++h)
      for (I i = 0; i < d_.M; ++i) {
        compute_row(b, h, i, &row);
        double* o = &(*out)[ix(((b * d_.M + i) * d_.Hq + h) * D)];
        for (I j = 0; j < d_.N; ++j)
          if (row.P[ix(j)] != 0) axpy(row.P[ix(j)], v(b, j, h / d_.G), o, D);
        (*lse)[ix((b * d_.Hq + h) * d_.M + i)] = row.lse;
      }
}

}  // namespace posenc::attn_ref

namespace posenc::reference {

using attn_ref::Problem;
using attn_ref::Vec;
using attn_ref::Dims;

Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_forward(p, q, k, v, t, out, lse, &d));
  const Problem prob(p, d, q, k, v, t);
  Vec o, l;
  prob.forward(&o, &l);
  from_doubles(o, out);
  if (lse.present()) from_doubles(l, lse);
  return Status::Ok();
}

namespace {

// Writes the gradients of gr into the present views of dq, dk, dv and g.
void store_grads(const AttentionParams& p, const Problem::Grads& gr, const View& dq, const View& dk,
                 const View& dv, const EncodingGrads& g) {
  if (dq.present()) from_doubles(gr.dq, dq);
  if (dk.present()) from_doubles(gr.dk, dk);
  if (dv.present()) from_doubles(gr.dv, dv);
  if (g.weights.present()) from_doubles(gr.dw, g.weights);
  if (g.u.present()) from_doubles(gr.du, g.u);
  if (g.v.present()) from_doubles(gr.dvb, g.v);
  if (g.rel_proj.present()) from_doubles(gr.dW, g.rel_proj);
  if (g.table.present()) from_doubles(gr.de, g.table);
  if (g.r1.present()) from_doubles(gr.dr1, g.r1);
  if (g.r2.present()) from_doubles(gr.dr2, g.r2);
  if (g.freqs.present()) from_doubles(gr.dfreqs, g.freqs);
  if (p.encoding == Encoding::kFire) fire::write_grads(g.fire, gr.dw1, gr.db1, gr.dw2, gr.db2, gr.dc, gr.dL);
}

}  // namespace

Status attention_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                          const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                          const View& dv, const EncodingGrads& g) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_backward(p, q, k, v, t, dout, dq, dk, dv, g, &d));
  const Problem prob(p, d, q, k, v, t);
  Problem::Grads gr;
  prob.backward(to_doubles(dout), &gr);
  store_grads(p, gr, dq, dk, dv, g);
  return Status::Ok();
}

// The reference computes the statistics again in double: out and lse checked, not read.
Status attention_backward_saved(const AttentionParams& p, const View& q, const View& k, const View& v,
                                const EncodingTensors& t, const View& out, const View& lse,
                                const View& dout, const View& dq, const View& dk, const View& dv,
                                const EncodingGrads& g) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_backward_saved(p, q, k, v, t, out, lse, dout, dq, dk, dv, g, &d));
  return reference::attention_backward(p, q, k, v, t, dout, dq, dk, dv, g);
}

Status attention_backward_from_stats(const AttentionParams& p, const View& q, const View& k, const View& v,
                                     const EncodingTensors& t, const View& out, const View& lse,
                                     const View& dout, const View& dq, const View& dk, const View& dv,
                                     const EncodingGrads& g) {
  Dims d;
  POSENC_RETURN_IF_ERROR(
      attn::validate_backward_from_stats(p, q, k, v, t, out, lse, dout, dq, dk, dv, g, &d));
  const Problem prob(p, d, q, k, v, t);
  const Problem::Stats st{to_doubles(out), to_doubles(lse)};
  Problem::Grads gr;
  prob.backward(to_doubles(dout), &gr, &st);
  store_grads(p, gr, dq, dk, dv, g);
  return Status::Ok();
}

}  // namespace posenc::reference

