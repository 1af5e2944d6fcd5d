// The fused Transformer-XL attention's backward (attention_xl_fused.h; how: attention_xl_cpu.cc).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "attention/attention_xl_fused.h"

namespace posenc::fused::xl_cpu {

void XlFused::backward(const View& dout, const View& dq, const View& dk, const View& dv,
                       const EncodingGrads& g, const View* saved_out,
                       const View* saved_lse) {
  transpose_keys();  // for pass 2's key blocks, and pass 1's panels
  const I B = d_.B, M = d_.M, N = d_.N, Hq = d_.Hq, D = d_.D, G = d_.G, R = d_.R;
  // the careful steps on every tile (attention_tiles.h): k or v not finite
  const bool careful_all = (cf_.k_known ? !cf_.k_finite : !all_finite(simd_, k_, threads_)) ||
                           !all_finite(simd_, v_, threads_);
  if (!saved_out && !careful_all && stored_ok()) {  // attention_xl_backward_stored.cc
    stored_backward(dout, dq, dk, dv, g);
    return;
  }
  std::vector<float> lse, Dv;  // [B, Hq, M]
  pass1(dout, saved_out, saved_lse, careful_all, &lse, &Dv);
  RegionGuard guard;
  // pass 2: per (b, kv head). Parameter gradients per (b, h): du [D], Σ X [R], dW [D, R].
  const I npar = D + R + D * R, Dc = D + R;
  std::vector<double> gp(ix(B * Hq * npar), 0.0);
  const I kvtasks = B * d_.Hkv;
  // dQc summed in dq itself (see kDqBufferBytes)
  const bool dq_dir = dq.present() && direct_out(dq) && !dq_buffered(G, M, D);
  const bool q_all = G * M * (Dc + D) <= cache_limit.load();  // Qu, Ỹ and dO formed once per task
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    Scratch w;
    // the task's dQc [G·M, D] (unless dq_dir), X̃ [G·M, R], and Qu [G·M, D], Ỹ [G·M, R] and dO
    // [G·M, D] (when q_all)
    std::vector<float> qacc, xacc, qall;
    guard.run([&] {
      w.init(D, R);
      w.init_backward(D, R);
    });
#pragma omp for schedule(dynamic, 1)
    for (I task = 0; task < kvtasks; ++task) {
      const I b = task / d_.Hkv, kh = task % d_.Hkv;
      if (guard.failed() || !guard.run([&] {
            xacc.assign(ix(G * M * R), 0.f);
            if (!dq_dir) qacc.assign(ix(G * M * D), 0.f);
            if (q_all) qall.resize(ix(G * M * (Dc + D)));
          }))
        continue;
      if (q_all)  // Qu, Ỹ and dO of the group's query rows, once for every key block
        for (I gi = 0; gi < G; ++gi)
          for (I i0 = 0; i0 < M; i0 += kBq) {
            const I nq = std::min(kBq, M - i0);
            load_q(b, kh * G + gi, i0, nq, &w, &qall[ix((gi * M + i0) * D)],
                   &qall[ix(G * M * D + (gi * M + i0) * R)]);
            load_rows(dout, D, b, i0, nq, kh * G + gi, &qall[ix(G * M * Dc + (gi * M + i0) * D)]);
          }
      const DqRows dqr = dq_rows(dq, dq_dir, b, kh, &qacc);
      float* qbase = dqr.base;
      const I qld = dqr.ld, qhs = dqr.hs;
      for (I j0 = 0; j0 < N; j0 += kBk) {
        const I nk = std::min(kBk, N - j0), kp0 = d_.k_off + j0;
        load_rows(k_, D, b, j0, nk, kh, w.kc.data());
        load_rows(v_, D, b, j0, nk, kh, w.v.data());
        const float* C = tk(j0);  // the keys' C [nk, R], rows of the table
        // [K | C]ᵀ and Vᵀ once for the block's query tiles (the kNP products S and dP)
        keys_t(w.kc.data(), D, j0, nk, w.kt.data());
        tr_(w.v.data(), D, nk, D, w.vt.data(), kLdt);
        std::fill(w.dk.begin(), w.dk.begin() + nk * D, 0.f);
        std::fill(w.dv.begin(), w.dv.begin() + nk * D, 0.f);
        for (I gi = 0; gi < G; ++gi) {
          const I h = kh * G + gi;
          const I ilo = p_.causal ? std::clamp<I>(kp0 - d_.q_off, 0, M) : 0;
          for (I i0 = ilo; i0 < M; i0 += kBq) {
            const I nq = std::min(kBq, M - i0);
            // Qu [nq, D] and Ỹ [nq, R] of the tile
            float* qc = q_all ? &qall[ix((gi * M + i0) * D)] : w.qc.data();
            float* yt = q_all ? &qall[ix(G * M * D + (gi * M + i0) * R)] : w.qc.data() + kBq * D;
            if (!q_all) {
              load_q(b, h, i0, nq, &w, qc, yt);
            }
            // dO [nq, D], copied even where it could be read in place: dV's product reads it a
            // row per step, and rows at the tensor's stride (Hq·D floats) share few L1 sets
            const float* dO = q_all ? &qall[ix(G * M * Dc + (gi * M + i0) * D)] : w.dout.data();
            if (!q_all) load_rows(dout, D, b, i0, nq, h, w.dout.data());
            tile(Tiles{lse.data(), Dv.data(), careful_all}, b, h, i0, nq, j0, nk, qc, yt, dO, C,
                 qbase + gi * qhs + i0 * qld, qld, &xacc[ix((gi * M + i0) * R)], &w);
          }
        }
        if (dk.present()) store_rows(dk, D, b, j0, nk, kh, w.dk.data());
        if (dv.present()) store_rows(dv, D, b, j0, nk, kh, w.dv.data());
      }
      for (I gi = 0; gi < G; ++gi) {
        const I h = kh * G + gi;
        finish_rows(b, h, qbase + gi * qhs, qld, &xacc[ix(gi * M * R)], &w, &gp[ix((b * Hq + h) * npar)],
                    dq_dir ? View{} : dq);
      }
    }
  }
  guard.rethrow();
  write_param_grads(gp, g);
}

XlFused::DqRows XlFused::dq_rows(const View& dq, bool dq_dir, I b, I kh, std::vector<float>* qacc) const {
  const I D = d_.D, M = d_.M, G = d_.G;
  if (!dq_dir) return DqRows{qacc->data(), D, M * D};
  DqRows r{static_cast<float*>(dq.data) + b * dq.strides[0] + kh * G * dq.strides[2], M == 1 ? D : dq.strides[1],
           dq.strides[2]};
  for (I gi = 0; gi < G; ++gi)
    for (I i = 0; i < M; ++i) std::fill(r.base + gi * r.hs + i * r.ld, r.base + gi * r.hs + i * r.ld + D, 0.f);
  return r;
}

void XlFused::pass1(const View& dout, const View* saved_out, const View* saved_lse, bool careful, std::vector<float>* lse,
                    std::vector<float>* Dv) const {
  const I B = d_.B, M = d_.M, Hq = d_.Hq, D = d_.D, R = d_.R;
  lse->resize(ix(B * Hq * M));
  Dv->resize(ix(B * Hq * M));
  const I nqb = (M + kBq - 1) / kBq, per = B * Hq;
  const std::unique_ptr<float[]> panels = saved_out ? nullptr : key_panels();
  RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    Scratch w;
    std::vector<double> l;
    guard.run([&] {
      w.init(D, R);
      w.init_backward(D, R);
      l.resize(ix(kBq));
    });
#pragma omp for schedule(dynamic, 1)
    for (I task = 0; task < per * nqb; ++task) {
      if (guard.failed()) continue;
      I b, h, qi;  // as forward()
      head_major_task(task, nqb, Hq, &b, &h, &qi);
      const I qb = nqb - 1 - qi;
      const I q0 = qb * kBq, nq = std::min(kBq, M - q0);
      if (saved_out) {
        load_rows(*saved_out, D, b, q0, nq, h, w.o.data());
        const View& ls = *saved_lse;
        const double* base = static_cast<const double*>(ls.data);
        for (I i = 0; i < nq; ++i)
          l[ix(i)] = base[b * ls.strides[0] + h * ls.strides[1] + (q0 + i) * ls.strides[2]];
      } else {
        forward_block(b, h, 1, q0, nq, &w, l.data(), panels.get(), careful);
      }
      load_rows(dout, D, b, q0, nq, h, w.dout.data());
      for (I i = 0; i < nq; ++i) {
        const std::size_t at = ix((b * Hq + h) * M + q0 + i);
        (*lse)[at] = static_cast<float>(l[ix(i)]);
        (*Dv)[at] = simd_.dot(&w.dout[ix(i * D)], &w.o[ix(i * D)], ix(D));
      }
    }
  }
  guard.rethrow();
}

void XlFused::tile(const Tiles& t, I b, I h, I i0, I nq, I j0, I nk, float* qc, const float* yt, const float* dO,
                   const float* C, float* dq, I ldq, float* xt, Scratch* w) const {
  const I D = d_.D, M = d_.M, Hq = d_.Hq;
  float* S = w->s.data();
  float* dP = w->dp.data();
  // banded (tile_gemm.h): P and dS formed on each row's reach and visible keys, the
  // masked ones keeping logits' zeros; dP's masked entries may stay unset
  const I bd = logits(i0, nq, j0, nk, qc, yt, w->kt.data(), w);
  const float* L = &t.lse[ix((b * Hq + h) * M + i0)];
  const float* Di = &t.Dv[ix((b * Hq + h) * M + i0)];
  simd_.exp_rows(S, nq, nk, kBk, L, bd);  // P
  tile_gemm(gemm_, GemmForm::kNP, nq, nk, D, 1.f, dO, D, w->vt.data(), kLdt, dP, kBk, bd);
  const TileGrads tg{t.careful || careful_rows(L, Di, nq), Di, qc, dO, w->kc.data(), C, w->dk.data(), w->dv.data(),
                     dq, ldq, xt};
  tile_grads(tg, nq, nk, bd, S, dP, w);
}

void XlFused::tile_grads(const TileGrads& t, I nq, I nk, I bd, float* S, const float* dP, Scratch* w) const {
  const I D = d_.D, R = d_.R;
  const float sc = static_cast<float>(d_.scale);
  // careful (attention_tiles.h): the products read sanitized dO, Qu, K; dO's non-finite
  // entries' terms added back into dV; dS 0 where P is
  const bool careful = t.careful;
  const float* dO = t.dO;
  const bool bad_do = careful && sanitize_rows(dO, D, nq, D, w->sd.data());
  if (bad_do) tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, 1.f, S, kBk, w->sd.data(), D, t.dv, D, bd);
  else tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, 1.f, S, kBk, dO, D, t.dv, D, bd);
  if (bad_do) add_back_ptdo(S, nq, nk, dO, D, D, t.dv);
  for (I i = 0; i < nq; ++i) {
    const I n = std::clamp<I>(i + bd + 1, 0, nk);
    if (careful) careful_ds(S + i * kBk, dP + i * kBk, n, t.Di[i]);
    else simd_.ds_row(S + i * kBk, dP + i * kBk, ix(n), t.Di[i]);
  }
  // S now holds dS; c = scale·dS.
  const bool bad_q = careful && sanitize_rows(t.qc, D, nq, D, w->sq.data());
  tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, sc, S, kBk, bad_q ? w->sq.data() : t.qc, D, t.dk, D, bd);
  const bool bad_k = careful && sanitize_rows(t.K, D, nk, D, w->sk.data());
  const float* K = bad_k ? w->sk.data() : t.K;
  tile_gemm(gemm_, GemmForm::kNN, nq, D, nk, sc, S, kBk, K, D, t.dq, t.ldq, bd);
  tile_gemm(gemm_r_, GemmForm::kNN, nq, R, nk, sc, S, kBk, t.C, R, t.xt, R, bd);
}

void XlFused::finish_rows(I b, I h, float* qa, I ld, const float* xt_all, Scratch* w, double* gph,
                          const View& dq) const {
  const I D = d_.D, R = d_.R;
  const float* Wt = &wt_[ix(h * R * D)];
  double* du = gph;
  double* xs = gph + D;
  double* dW = gph + D + R;
  float* X = w->x.data();
  float* qv = w->qv.data();
  float* bs = w->bs.data();  // the block's Σ dQc_i [D] and Σ X_i [R] in float
  for (I i0 = 0; i0 < d_.M; i0 += kBq) {
    const I nq = std::min(kBq, d_.M - i0);
    float* A = qa + i0 * ld;
    std::fill(bs, bs + D + R, 0.f);
    for (I i = 0; i < nq; ++i) {
      const float* xt = xt_all + (i0 + i) * R;
      const float* t = tq(i0 + i);
      float* xi = X + i * R;
      for (I c = 0; c < R; c += 2) {  // t = (sin α, cos α)
        xi[c] = xt[c + 1] * t[c] - xt[c] * t[c + 1];
        xi[c + 1] = xt[c + 1] * t[c + 1] + xt[c] * t[c];
      }
      simd_.add_to(bs, A + i * ld, ix(D));
      simd_.add_to(bs + D, xi, ix(R));
    }
    for (I e = 0; e < D; ++e) du[e] += bs[e];
    for (I c = 0; c < R; ++c) xs[c] += bs[D + c];
    tile_gemm(gemm_w_, GemmForm::kNN, nq, D, R, 1.f, X, R, Wt, D, A, ld);
    if (dq.present())
      for (I i = 0; i < nq; ++i) store_row(dq, D, b, i0 + i, h, A + i * ld);
    load_rows(q_, D, b, i0, nq, h, qv);
    for (I i = 0; i < nq; ++i) simd_.add_to(qv + i * D, &vb_[ix(h * D)], ix(D));
    if (!simd_.finite_rows(qv, ix(D), ix(nq), ix(D))) sanitize_rows(qv, D, nq, D, qv);
    std::fill(w->dw.begin(), w->dw.end(), 0.f);
    tile_gemm(gemm_w_, GemmForm::kTN, D, R, nq, 1.f, qv, D, X, R, w->dw.data(), R);
    for (I e = 0; e < D * R; ++e) dW[e] += w->dw[ix(e)];
  }
}

void XlFused::write_param_grads(const std::vector<double>& gp, const EncodingGrads& g) const {
  const I B = d_.B, Hq = d_.Hq, D = d_.D, R = d_.R, npar = D + R + D * R;
  std::vector<double> sum(ix(npar));
  for (I h = 0; h < Hq; ++h) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (I b = 0; b < B; ++b)
      for (I e = 0; e < npar; ++e) sum[ix(e)] += gp[ix((b * Hq + h) * npar + e)];
    if (g.u.present())
      for (I e = 0; e < D; ++e) g.u.set(h * D + e, sum[ix(e)]);
    if (g.v.present())
      for (I e = 0; e < D; ++e) {
        double acc = 0;
        for (I c = 0; c < R; ++c) acc += w64_[ix((h * D + e) * R + c)] * sum[ix(D + c)];
        g.v.set(h * D + e, acc);
      }
    if (g.rel_proj.present())
      for (I e = 0; e < D * R; ++e) g.rel_proj.set(h * D * R + e, sum[ix(D + R + e)]);
  }
}

}  // namespace posenc::fused::xl_cpu
