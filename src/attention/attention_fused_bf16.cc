// class Fused (attention_fused_cpu.h): the products on bfloat16 pairs (tile_gemm_bf16.h) — a forward
// key block at the bfloat16 rate, the forward's key panels, and pass 2 of the backward at the rate.
#include <omp.h>

#include "attention/attention_fused_cpu.h"

namespace posenc::fused_cpu {

void Fused::bf16_block(I b, I h, I q0, I nq, I j0, I nk, I bd, const Tile& Q, const attn_fast::Pair* qp, I ldq,
                       Scratch* w, float* o, const attn_fast::Pair* panel) const {
  const I D = d_.D, kh = h / d_.G;
  float* S = w->s.data();
  float* m = w->ml.data();
  float* l = m + kBq;
  const attn_fast::Pair* kt = panel;
  const attn_fast::Pair* vp = panel ? panel + D / 2 * kLdt : nullptr;
  if (!panel) {
    if (!tq_ && !tk_) pack_keys(b, kh, j0, nk, w->kb.data());
    pack_values(b, kh, j0, nk, w->vb.data());
    kt = w->kb.data();
    vp = w->vb.data();
  }
  if (tq_ || tk_) {
    logits(h, q0, nq, j0, nk, Q, rows(k_, dir_k_, b, j0, nk, kh, w->k.data(), tk_, h), w);
  } else {
    bf16_->gemm(attn_fast::Bf16Form::kScores, nq, nk, D / 2, static_cast<float>(d_.scale), qp, ldq, kt, kLdt, S,
                kBk, bd);
    finish_logits(h, q0, nq, nk, (d_.k_off + j0) - (d_.q_off + q0), bd, S, w->diag.data());
  }
  if (cf_.rows) mark_nan_rows(simd_, S, nq, nk, bd, m);
  online_softmax_step(simd_, S, nq, nk, m, l, o, D, bd);
  bf16_->round_rows(S, kBk, nq, nk, w->pb.data(), kBk / 2);
  bf16_->gemm(attn_fast::Bf16Form::kValues, nq, D, (nk + 1) / 2, 1.f, w->pb.data(), kBk / 2, vp, D, o, D, bd);
}

Panels Fused::key_panels(bool rate) const {
  constexpr I kPanelBytes = I{32} << 20;
  const I nkb = (d_.N + kBk - 1) / kBk, nqb = (d_.M + kBq - 1) / kBq, blocks = d_.B * d_.Hkv * nkb;
  const bool pairs = rate && bf16_, wide = !pairs;
  Panels pan;  // a single query row (M = 1) reads K's rows as they are (no tile product)
  if (tk_ || (pairs && tq_) || d_.M < 2 || d_.G * nqb < 2 ||
      blocks * (wide ? wide_panel() : bf16_panel()) * 4 > kPanelBytes)
    return pan;
  const bool widen = wide && !dir_k_;  // 16-bit k: a key block's rows widened first (float32: in place)
  std::vector<float> rows_k;          // per thread
  try {
    if (wide) pan.wide.resize(ix(blocks * wide_panel()));
    else pan.bf16.resize(ix(blocks * bf16_panel()));
    rows_k.resize(widen ? ix(threads_ * kBk * d_.D) : 0);
  } catch (const std::bad_alloc&) {
    return {};  // the per-tile packing needs no more memory
  }
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    float* tmp = widen ? &rows_k[ix(omp_get_thread_num() * kBk * d_.D)] : nullptr;
#pragma omp for schedule(static)
    for (I t = 0; t < blocks; ++t) {
      const I kb = t % nkb, kh = (t / nkb) % d_.Hkv, b = t / (nkb * d_.Hkv), j0 = kb * kBk;
      const I nk = std::min(kBk, d_.N - j0), D = d_.D;
      if (wide) {
        float* dst = &pan.wide[ix(panel_at(b, kh, kb, wide_panel()))];
        const Tile K = rows(k_, dir_k_, b, j0, nk, kh, tmp, nullptr, 0);
        tr_(K.p, K.ld, nk, D, dst, kLdt);
        attn_fast::load_rows(v_, D, b, j0, nk, kh, dst + D * kLdt);
      } else {
        attn_fast::Pair* dst = &pan.bf16[ix(panel_at(b, kh, kb, bf16_panel()))];
        pack_keys(b, kh, j0, nk, dst);
        pack_values(b, kh, j0, nk, dst + D / 2 * kLdt);
      }
    }
  }
  return pan;
}

bool Fused::rate_rows(const Bwd& bw, I b, I kh, Scratch* w, std::vector<attn_fast::Pair>* pr,
                      std::vector<float>* qf) const {
  const I D = d_.D, D2 = D / 2, G = d_.G, M = d_.M, Mh = rate_ld();
  for (I g = 0; g < G; ++g) {
    const I at = (b * d_.Hq + kh * G + g) * M;
    if (careful_rows(&bw.lse[ix(at)], &bw.Dv[ix(at)], M)) return false;
  }
  if ((2 * G * (M * D2 + D * Mh) + (tq_ ? G * M * D : 0)) * I{4} > dq_buffer_limit.load()) return false;
  try {
    pr->resize(ix(2 * G * (M * D2 + D * Mh)));
    qf->resize(tq_ ? ix(G * M * D) : 0);
  } catch (const std::bad_alloc&) {
    return false;
  }
  for (int which = 0; which < 2; ++which) {
    const View& x = which == 0 ? q_ : bw.dout;
    attn_fast::Pair* rows_at = &(*pr)[ix(which * G * M * D2)];
    attn_fast::Pair* cols_at = &(*pr)[ix(2 * G * M * D2 + which * G * D * Mh)];
    for (I g = 0; g < G; ++g)
      for (I i0 = 0; i0 < M; i0 += kBq) {
        const I nq = std::min(kBq, M - i0), h = kh * G + g;
        const bool rot = which == 0 && tq_;
        const Tile X = rows(x, false, b, i0, nq, h, rot ? &(*qf)[ix((g * M + i0) * D)] : w->q.data(),
                            rot ? tq_ : nullptr, h);
        attn_fast::Pair* r = rows_at + (g * M + i0) * D2;
        bf16_->round_rows(X.p, X.ld, nq, D, r, D2);
        // rows paired [nq/2, D], then transposed: the pairs' (e, (i0 + i) / 2) entries; i0 is even
        bf16_->interleave_rows(reinterpret_cast<const std::uint16_t*>(r), D, nq, D, w->ib.data(), D);
        bf16_->transpose_pairs(reinterpret_cast<const std::uint16_t*>(w->ib.data()), 2 * D, (nq + 1) / 2, D,
                               cols_at + g * D * Mh + i0 / 2, Mh);
      }
  }
  return true;
}

bool Fused::keys_rate(const Bwd& bw, I b, I kh, I kb0, I kb1, const Acc& acc, double* gwu, Scratch* w) const {
  std::vector<attn_fast::Pair> pr;
  std::vector<float> qf;
  if (!rate_rows(bw, b, kh, w, &pr, &qf)) return false;
  using attn_fast::Bf16Form;
  const I D = d_.D, D2 = D / 2, G = d_.G, M = d_.M, Mh = rate_ld(), Hq = d_.Hq;
  const attn_fast::Pair *qr = pr.data(), *dor = qr + G * M * D2, *qt = dor + G * M * D2, *dot = qt + G * D * Mh;
  const float sc = static_cast<float>(d_.scale);
  float *S = w->s.data(), *dP = w->dp.data(), *dKt = w->kt.data(), *dVt = w->vt.data();
  const auto* pb16 = reinterpret_cast<const std::uint16_t*>(w->pb.data());  // P or dS rounded, [Bq, Bk]
  for (I kb = kb0; kb < kb1; ++kb) {
    const I j0 = kb * kBk, nk = std::min(kBk, d_.N - j0), kp0 = d_.k_off + j0;
    Tile K{nullptr, D};
    if (tq_) {  // K̃ᵀ in float32 for the logits, K̃ rounded to bfloat16 as row pairs for dQ
      K = rows(k_, false, b, j0, nk, kh, w->k.data(), tk_, kh * G);
      tr_(K.p, K.ld, nk, D, w->kft.data(), kLdt);
      bf16_->round_rows(K.p, K.ld, nk, D, w->pb.data(), D2);
      bf16_->interleave_rows(pb16, D, nk, D, w->vb.data(), D);
    } else {
      pack_keys(b, kh, j0, nk, w->kb.data());                                                // Kᵀ
      bf16_->interleave_rows(row_at(k_, b, j0, kh), k_.strides[1], nk, D, w->vb.data(), D);  // K
    }
    bf16_->transpose_pairs(row_at(v_, b, j0, kh), v_.strides[1], nk, D2, w->vtb.data(), kLdt);  // Vᵀ
    for (I e = 0; e < D; ++e) {
      std::fill(dKt + e * kLdt, dKt + e * kLdt + nk, 0.f);
      std::fill(dVt + e * kLdt, dVt + e * kLdt + nk, 0.f);
    }
    for (I g = 0; g < G; ++g) {
      const I h = kh * G + g;
      I ilo, ihi;
      query_range(h, kp0, nk, &ilo, &ihi);
      double* gwh = gwu ? gwu + g * bw.npar : nullptr;
      for (I i0 = ilo - ilo % 2; i0 < ihi; i0 += kBq) {
        const I nq = std::min(kBq, ihi - i0), nqh = (nq + 1) / 2, base = kp0 - (d_.q_off + i0);
        const I bd = band(h, base);
        if (tq_) {
          logits(h, i0, nq, j0, nk, Tile{&qf[ix((g * M + i0) * D)], D}, K, w, w->kft.data());
        } else {
          bf16_->gemm(Bf16Form::kScores, nq, nk, D2, sc, qr + (g * M + i0) * D2, D2, w->kb.data(), kLdt, S, kBk,
                      bd);
          finish_logits(h, i0, nq, nk, base, bd, S, w->diag.data());
        }
        simd_.exp_rows(S, nq, nk, kBk, &bw.lse[ix((b * Hq + h) * M + i0)], bd);  // P
        const float* Di = &bw.Dv[ix((b * Hq + h) * M + i0)];
        bf16_->gemm(Bf16Form::kScores, nq, nk, D2, 1.f, dor + (g * M + i0) * D2, D2, w->vtb.data(), kLdt, dP,
                    kBk, bd);
        if (bw.dv.present()) {  // dVᵀ += dOᵀ·P
          bf16_->round_rows(S, kBk, nq, nk, w->pb.data(), kBk / 2);
          bf16_->interleave_rows(pb16, kBk, nq, nk, w->ib.data(), kLdt);
          bf16_->gemm(Bf16Form::kValues, D, nk, nqh, 1.f, dot + g * D * Mh + i0 / 2, Mh, w->ib.data(), kLdt, dVt,
                      kLdt, attn_fast::kNoBand);
        }
        for (I i = 0; i < nq; ++i) {
          const I n = std::clamp<I>(i + bd + 1, 0, nk);
          simd_.ds_row(S + i * kBk, dP + i * kBk, ix(n), Di[i]);
        }
        if (gwh && bias_ == Bias::kFire) fire_tile(h, i0, base, nq, nk, nullptr, S, gwh);
        else if (gwh && bias_ != Bias::kNone) param_grads(h, base, nq, nk, S, w->diag.data(), gwh);
        for (I i = 0; i < nq; ++i) simd_.scale(S + i * kBk, ix(std::clamp<I>(i + bd + 1, 0, nk)), sc);
        bf16_->round_rows(S, kBk, nq, nk, w->pb.data(), kBk / 2);  // scale·dS
        if (bw.dk.present()) {  // dKᵀ += Qᵀ·(scale·dS)
          bf16_->interleave_rows(pb16, kBk, nq, nk, w->ib.data(), kLdt);
          bf16_->gemm(Bf16Form::kValues, D, nk, nqh, 1.f, qt + g * D * Mh + i0 / 2, Mh, w->ib.data(), kLdt, dKt,
                      kLdt, attn_fast::kNoBand);
        }
        if (acc.p) {  // dQ += (scale·dS)·K, not on a row before the range (acc may not hold it)
          const I skip = i0 < ilo ? 1 : 0;
          bf16_->gemm(Bf16Form::kValues, nq - skip, D, (nk + 1) / 2, 1.f, w->pb.data() + skip * kBk / 2, kBk / 2,
                      w->vb.data(), D, acc.row(g, i0 + skip), acc.ld, band(h, base - skip));
        }
      }
    }
    if (bw.dk.present()) {
      tr_(dKt, kLdt, D, nk, w->dk.data(), D);
      if (tk_) rotate(w->dk.data(), nk, D, *tk_, b, kh * G, j0, true);
      attn_fast::store_rows(bw.dk, D, b, j0, nk, kh, w->dk.data());
    }
    if (bw.dv.present()) {
      tr_(dVt, kLdt, D, nk, w->dv.data(), D);
      attn_fast::store_rows(bw.dv, D, b, j0, nk, kh, w->dv.data());
    }
  }
  return true;
}

}  // namespace posenc::fused_cpu
