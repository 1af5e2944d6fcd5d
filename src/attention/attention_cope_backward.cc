// The fused CoPE attention's backward (attention_cope_fused.h; how: attention_cope_cpu.cc).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/attention_cope_fused.h"

namespace posenc::cope_cpu {

bool Cope::backward(const View& dout, const View& dq, const View& dk, const View& dv,
                    const View& dtable) const {
  const I D = d_.D, M = d_.M, nc = ncol_;
  if (stored_ok()) return stored_backward(Grads{dout, dq, dk, dv, dtable.present()}, dtable);
  Stats st;
  if (!pass1(dout, &st)) return false;
  // pass 2: per (b, kv head), its query rows in chunks of mc rows per head
  const I kvtasks = d_.B * d_.Hkv;
  const int nthr = threads_ > 1 ? threads_ : 1;
  const I mc = std::max<I>(1, std::min(chunk_rows(), M)), nchunks = (M + mc - 1) / mc;
  std::vector<std::vector<double>> dE(ix(nthr));  // per thread [ncol, D]
  RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    Scratch w;
    Chunk c;
    std::vector<double>& dEs = dE[ix(omp_get_thread_num())];
    guard.run([&] {
      w.init(D, nc);
      w.init_backward(D);
      c.init(d_, mc, nc);
      dEs.assign(ix(nc * D), 0.0);
      // dK, dV of a key block get a part from each chunk that sees it. A float32 dk (dv) sums them
      // in place (the task owns its kv head: no race); a 16-bit one, when there are several
      // chunks, in float32 split between itself and a SplitSum, rounded once at the end.
      if (dk.present() && dk.dtype != DType::kF32 && nchunks > 1) c.dka.size_for(d_.N, D);
      if (dv.present() && dv.dtype != DType::kF32 && nchunks > 1) c.dva.size_for(d_.N, D);
    });
    const Grads gr{dout, dq, dk, dv, dtable.present()};
#pragma omp for schedule(dynamic, 1)
    for (I task = 0; task < kvtasks; ++task) {
      if (guard.failed()) continue;
      unit(gr, st, task / d_.Hkv, task % d_.Hkv, &w, &c);
      if (gr.dtable)
        for (I g = 0; g < d_.G; ++g)
          for (I x = 0; x < nc * D; ++x) dEs[ix(x)] += static_cast<double>(c.dEt[ix(g * nc * D + x)]);
    }
  }
  guard.rethrow();
  if (dtable.present()) {  // rows past ncol are never reached: 0
    std::vector<double> tot(ix(d_.npos * D), 0.0);
    for (const auto& part : dE)
      for (std::size_t x = 0; x < part.size(); ++x) tot[x] += part[x];
    from_doubles(tot, dtable);
  }
  return true;
}

bool Cope::pass1(const View& dout, Stats* st) const {
  const I B = d_.B, M = d_.M, Hq = d_.Hq, D = d_.D, nc = ncol_;
  st->lse.resize(ix(B * Hq * M));
  st->Dv.resize(ix(B * Hq * M));
  st->U.resize(ix(B * Hq * M));
  st->J.resize(ix(B * Hq * M));
  const I nqb = (M + kBq - 1) / kBq, per = B * Hq;
  const std::vector<float> kv = key_rows();
  RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    Scratch w;
    std::vector<double> l;
    guard.run([&] {
      w.init(D, nc);
      w.init_backward(D);
      l.resize(ix(kBq));
    });
#pragma omp for schedule(dynamic, 1)
    for (I task = 0; task < per * nqb; ++task) {
      if (guard.failed()) continue;
      const I qb = nqb - 1 - task / per, bh = task % per, b = bh / Hq, h = bh % Hq;
      const I q0 = qb * kBq, nq = std::min(kBq, M - q0);
      const auto [kr, vr] = unit_rows(kv, b, h / d_.G);
      forward_block(b, h, q0, nq, true, &w, l.data(), kr, vr);
      load_rows(dout, D, b, q0, nq, h, w.dout.data());
      for (I i = 0; i < nq; ++i) {
        const std::size_t at = ix((b * Hq + h) * M + q0 + i);
        st->lse[at] = static_cast<float>(l[ix(i)]);
        st->Dv[at] = simd_.dot(&w.dout[ix(i * D)], &w.o[ix(i * D)], ix(D));
        st->J[at] = w.js[ix(i)];
        st->U[at] = static_cast<double>(w.uk[ix(i)]) + static_cast<double>(w.ur[ix(i)]);
      }
    }
  }
  guard.rethrow();
  for (I r = 0; r < B * Hq * M; ++r)  // a row that sees keys has a finite lse and D from finite inputs
    if (sees_keys(r % M) && (!std::isfinite(st->lse[ix(r)]) || !std::isfinite(st->Dv[ix(r)]))) return false;
  return unseen_rows_finite();
}

bool Cope::unseen_rows_finite() const {
  const I D = d_.D, M = d_.M;
  const I none = d_.N == 0 ? M : causal_ ? std::clamp<I>(d_.k_off - d_.q_off, 0, M) : 0;
  std::vector<float> row(ix(D));
  for (I b = 0; b < d_.B; ++b)
    for (I h = 0; h < d_.Hq; ++h)
      for (I i = 0; i < none; ++i) {
        load_rows(q_, D, b, i, 1, h, row.data());
        if (!simd_.finite(row.data(), ix(D))) return false;
      }
  return true;
}

void Cope::unit(const Grads& gr, const Stats& st, I b, I kh, Scratch* w, Chunk* c) const {
  const I D = d_.D, M = d_.M, N = d_.N, G = d_.G, nc = ncol_, mc = c->mc;
  // a key block's part: stored where no earlier chunk reached it (j0 ≥ done), added elsewhere
  const auto put = [&](const View& out, SplitSum& acc, I j0, I nk, const float* x, bool first) {
    if (!out.present()) return;
    if (!acc.empty()) acc.put(out, D, b, kh, j0, nk, x, first);
    else if (first) store_rows(out, D, b, j0, nk, kh, x);
    else add_rows(out, D, b, j0, nk, kh, x);  // float32 (else acc is there)
  };
  I done = 0;  // keys [0, done) have had a part from an earlier chunk
  std::fill(c->dEt.begin(), c->dEt.end(), 0.f);
  for (I c0 = 0; c0 < M; c0 += mc) {
    const I mq = std::min(mc, M - c0);  // the chunk: rows [c0, c0 + mq) of each query head
    for (auto* x : {&c->dqt, &c->C, &c->dct}) std::fill(x->begin(), x->end(), 0.f);
    std::fill(c->gc.begin(), c->gc.end(), 0.0);
    for (I g = 0; g < G; ++g)  // Q, dO and QE [mq, ncol] of each query head
      for (I i0 = c0; i0 < c0 + mq; i0 += kBq) {
        const I nq = std::min(kBq, c0 + mq - i0), gm = g * mc + i0 - c0;
        load_rows(q_, D, b, i0, nq, kh * G + g, &c->qd[ix(gm * D)]);
        load_rows(gr.dout, D, b, i0, nq, kh * G + g, &c->dod[ix(gm * D)]);
        tile_gemm(gemm_, GemmForm::kNT, nq, cols(i0, nq), D, 1.f, &c->qd[ix(gm * D)], D, E_.data(), D,
                  &c->qe[ix(gm * nc)], nc);
      }
    for (I g = 0; g < G; ++g) {  // transposed once per chunk, not per key block
      tr_(&c->qd[ix(g * mc * D)], D, mq, D, &c->qdt[ix(g * D * c->ldq)], c->ldq);
      tr_(&c->dod[ix(g * mc * D)], D, mq, D, &c->dodt[ix(g * D * c->ldq)], c->ldq);
    }
    // the keys the chunk's rows see (causal: up to its last row)
    const I jhi = causal_ ? std::clamp<I>(d_.q_off + c0 + mq - d_.k_off, 0, N) : N;
    for (I j0 = 0; j0 < jhi; j0 += kBk) {
      const I nk = std::min(kBk, N - j0), kp0 = d_.k_off + j0;
      load_rows(k_, D, b, j0, nk, kh, w->k.data());
      load_rows(v_, D, b, j0, nk, kh, w->v.data());
      std::fill(w->dk.begin(), w->dk.begin() + nk * D, 0.f);
      std::fill(w->dv.begin(), w->dv.begin() + nk * D, 0.f);
      for (I g = 0; g < G; ++g) {
        const I ilo = causal_ ? std::clamp<I>(kp0 - d_.q_off, c0, c0 + mq) : c0;
        for (I i0 = ilo; i0 < c0 + mq; i0 += kBq)
          tile(st, b, kh * G + g, g, i0 - c0, i0, std::min(kBq, c0 + mq - i0), j0, nk, w, c);
      }
      put(gr.dk, c->dka, j0, nk, w->dk.data(), j0 >= done);
      put(gr.dv, c->dva, j0, nk, w->dv.data(), j0 >= done);
    }
    done = std::max(done, std::min(N, (jhi + kBk - 1) / kBk * kBk));
    // the z term's direct paths: dQ += C·E, dE += Cᵀ·Q
    for (I g = 0; g < G; ++g) {
      for (I i0 = c0; i0 < c0 + mq; i0 += kBq) {
        const I nq = std::min(kBq, c0 + mq - i0), ncb = cols(i0, nq), gm = g * mc + i0 - c0;
        const float* Cb = &c->C[ix(gm * nc)];
        tile_gemm(gemm_, GemmForm::kNN, nq, D, ncb, 1.f, Cb, nc, E_.data(), D, &c->dqt[ix(gm * D)], D);
        if (!gr.dtable) continue;
        tile_gemm(gemm_, GemmForm::kTN, ncb, D, nq, 1.f, Cb, nc, &c->qd[ix(gm * D)], D, &c->dEt[ix(g * nc * D)],
                  D);
      }
      if (gr.dq.present()) store_rows(gr.dq, D, b, c0, mq, kh * G + g, &c->dqt[ix(g * mc * D)]);
    }
  }
  // keys no chunk saw (causal: right of the last query) get 0; the accumulators go out
  std::fill(w->dk.begin(), w->dk.end(), 0.f);
  for (auto [out, acc] : {std::pair{&gr.dk, &c->dka}, std::pair{&gr.dv, &c->dva}}) {
    if (!out->present()) continue;
    if (acc->empty()) {
      for (I j0 = done; j0 < N; j0 += kBk) store_rows(*out, D, b, j0, std::min(kBk, N - j0), kh, w->dk.data());
    } else {
      acc->finish(*out, D, b, kh, done, N);
    }
  }
}

void Cope::tile(const Stats& st, I b, I h, I g, I r, I i0, I nq, I j0, I nk, Scratch* w, Chunk* c) const {
  const I D = d_.D, nc = ncol_, row = (b * d_.Hq + h) * d_.M + i0, gm = g * c->mc + r;
  const I tc = g * D * c->ldq + r;  // the tile's first column of Qᵀ and dOᵀ
  const float sc = static_cast<float>(d_.scale);
  tile_gemm(gemm_, GemmForm::kNP, nk, nq, D, sc, w->k.data(), D, &c->qdt[ix(tc)], c->ldq, w->at.data(), kBq);
  tile_gemm(gemm_, GemmForm::kNP, nk, nq, D, 1.f, w->v.data(), D, &c->dodt[ix(tc)], c->ldq, w->dpt.data(), kBq);
  std::int32_t minjs = std::numeric_limits<std::int32_t>::max();
  for (I i = 0; i < kBq; ++i) {
    const bool real = i < nq;
    const float L = real ? st.lse[ix(row + i)] : kNegInfF;
    w->lse[ix(i)] = L == kNegInfF ? kPosInfF : L;
    w->dd[ix(i)] = real ? st.Dv[ix(row + i)] : 0.f;
    w->js[ix(i)] = real ? st.J[ix(row + i)] : 0;
    const double bc = real ? st.U[ix(row + i)] - c->gc[ix(gm + i)] : 0.0;  // count at j0
    w->ck[ix(i)] = static_cast<float>(std::floor(bc));
    w->cr[ix(i)] = static_cast<float>(bc - std::floor(bc));
    w->dc[ix(i)] = real ? c->dct[ix(gm + i)] : 0.f;
    w->qetop[ix(i)] = real ? c->qe[ix((gm + i) * nc + nc - 1)] : 0.f;
    if (real) minjs = std::min(minjs, w->js[ix(i)]);
  }
  cope_fast::BwdTile t = bwd_tile(w, &c->qe[ix(gm * nc)], &c->C[ix(gm * nc)]);
  t.at = w->at.data();
  t.dp = w->dpt.data();
  t.nk = nk;
  t.nq = nq;
  t.j0 = j0;
  t.base = (d_.k_off + j0) - (d_.q_off + i0);
  t.clamped = j0 + nk <= minjs;
  kern_.bwd(t);
  if (t.clamped) {
    for (I i = 0; i < nq; ++i) c->C[ix((gm + i) * nc + nc - 1)] += w->ctop[ix(i)];
  } else {
    for (I i = 0; i < nq; ++i) {
      c->gc[ix(gm + i)] += static_cast<double>(w->tk[ix(i)]) + static_cast<double>(w->tr[ix(i)]);
      c->dct[ix(gm + i)] = w->dc[ix(i)];
    }
  }
  const float* Q = &c->qd[ix(gm * D)];
  const float* dO = &c->dod[ix(gm * D)];
  tile_gemm(gemm_, GemmForm::kNN, nk, D, nq, 1.f, w->at.data(), kBq, dO, D, w->dv.data(), D);
  tile_gemm(gemm_, GemmForm::kNN, nk, D, nq, sc, w->dpt.data(), kBq, Q, D, w->dk.data(), D);
  tile_gemm(gemm_, GemmForm::kTN, nq, D, nk, sc, w->dpt.data(), kBq, w->k.data(), D, &c->dqt[ix(gm * D)], D);
}

cope_fast::BwdTile Cope::bwd_tile(Scratch* w, const float* qe, float* C) const {
  cope_fast::BwdTile t;
  t.causal = causal_;
  t.qe = qe;
  t.c = C;
  t.rowbase = w->rowbase.data();
  t.qetop = w->qetop.data();
  t.top = top_;
  t.colmax = static_cast<float>(ncol_ - 1);
  t.lse = w->lse.data();
  t.dd = w->dd.data();
  t.js = w->js.data();
  t.bk = w->ck.data();
  t.br = w->cr.data();
  t.tk = w->tk.data();
  t.tr = w->tr.data();
  t.dc = w->dc.data();
  t.ctop = w->ctop.data();
  return t;
}

}  // namespace posenc::cope_cpu
