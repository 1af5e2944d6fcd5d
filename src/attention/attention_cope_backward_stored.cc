// class Cope (attention_cope_fused.h): the stored backward. The plain backward
// (attention_cope_backward.cc) runs the forward again for each row's lse, D, j* and count (pass 1),
// then pass 2 forms S = scale·K·Qᵀ and dPᵀ = V·dOᵀ again before its three gradient products. Here
// each unit (b, kv head) walks the query blocks of its heads; for one block, sweep 1 is the forward
// walk (forward_block with a Keep) that keeps every key block's S and dPᵀ and sums D = Σ P·dP in
// place of O = P·V; sweep 2 walks the kept tiles forward (ascending keys, as pass 2) through the
// backward tile step and the products dV += P·dO, dK += scale·da·Q, dQ += scale·daᵀ·K, then
// dQ += C·E, dE += Cᵀ·Q: five tile products per tile instead of seven. The unit's dK, dV sum in float
// over all its blocks and are rounded once. Memory a thread: the kept tiles (2·kBk·kBq floats a key
// block) and K, V, dK, dV rows (4·N·D floats), taken where they fit score_store_limit.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention/attention_cope_fused.h"

namespace posenc::cope_cpu {

namespace {
I key_blocks(I N) { return (N + kBk - 1) / kBk; }
I tile_floats(I N) { return 2 * key_blocks(N) * kBk * kBq; }
}  // namespace

bool Cope::stored_ok() const {
  const I D = d_.D, N = d_.N, nc = ncol_;
  // tiles; K, V, dK, dV; dOᵀ; dq, C, dsum and gc (doubles); dEt
  const I floats = tile_floats(N) + 4 * N * D + D * kLdt + kBq * (D + nc + 3) + nc * D;
  return floats * I{4} <= score_store_limit.load();
}

bool Cope::stored_backward(const Grads& gr, const View& dtable) const {
  if (!unseen_rows_finite()) return false;
  const I D = d_.D, N = d_.N, nc = ncol_, units = d_.B * d_.Hkv;
  const int nthr = threads_ > 1 ? threads_ : 1;
  std::vector<std::vector<double>> dE(ix(nthr));  // per thread [ncol, D]
  bool bad = false;
  RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    Scratch w;
    Store st;
    std::vector<double>& dEs = dE[ix(omp_get_thread_num())];
    guard.run([&] {
      w.init(D, nc);
      w.init_backward(D);
      dEs.assign(gr.dtable ? ix(nc * D) : 0, 0.0);
    });
#pragma omp for schedule(dynamic, 1) reduction(|| : bad)
    for (I u = 0; u < units; ++u) {
      if (guard.failed() || bad) continue;
      if (st.gc.empty() && !guard.run([&] {  // a thread's Store, once it has a unit
            st.tiles.resize(ix(tile_floats(N)));
            st.unit.resize(ix(4 * N * D));
            st.dot.assign(ix(D * kLdt), 0.f);
            st.dq.resize(ix(kBq * D));
            st.C.resize(ix(kBq * nc));
            st.dEt.assign(ix(nc * D), 0.f);
            st.dsum.resize(ix(kBq));
            st.gc.resize(ix(kBq));
          }))
        continue;
      bad = !stored_unit(gr, u / d_.Hkv, u % d_.Hkv, &w, &st);
      if (bad || !gr.dtable) continue;
      for (I x = 0; x < nc * D; ++x) dEs[ix(x)] += static_cast<double>(st.dEt[ix(x)]);
      std::fill(st.dEt.begin(), st.dEt.end(), 0.f);
    }
  }
  guard.rethrow();
  if (bad) return false;
  if (dtable.present()) {  // rows past ncol are never reached: 0
    std::vector<double> tot(ix(d_.npos * D), 0.0);
    for (const auto& part : dE)
      for (std::size_t x = 0; x < part.size(); ++x) tot[x] += part[x];
    from_doubles(tot, dtable);
  }
  return true;
}

bool Cope::stored_unit(const Grads& gr, I b, I kh, Scratch* w, Store* st) const {
  const I D = d_.D, M = d_.M, N = d_.N, G = d_.G;
  float* kr = st->unit.data();
  float* vr = kr + N * D;
  float* dK = vr + N * D;
  float* dV = dK + N * D;
  for (I j0 = 0; j0 < N; j0 += kBk) {  // once per unit
    load_rows(k_, D, b, j0, std::min(kBk, N - j0), kh, kr + j0 * D);
    load_rows(v_, D, b, j0, std::min(kBk, N - j0), kh, vr + j0 * D);
  }
  std::fill(dK, dK + 2 * N * D, 0.f);
  std::vector<double> l(ix(kBq));
  for (I g = 0; g < G; ++g) {
    const I h = kh * G + g;
    for (I q0 = 0; q0 < M; q0 += kBq) {
      const I nq = std::min(kBq, M - q0), qp_max = d_.q_off + q0 + nq - 1;
      const I jhi = causal_ ? std::clamp<I>(qp_max - d_.k_off + 1, 0, N) : N;
      load_rows(gr.dout, D, b, q0, nq, h, w->dout.data());
      tr_(w->dout.data(), D, nq, D, st->dot.data(), kLdt);
      std::fill(st->dsum.begin(), st->dsum.end(), 0.f);
      const Keep keep{st->tiles.data(), st->dot.data(), st->dsum.data()};
      forward_block(b, h, q0, nq, true, w, l.data(), kr, vr, &keep);
      // the rows' lse and D (= rowsum(dO ⊙ out)) as pass 1 leaves them; j*, U stay in w
      for (I i = 0; i < nq; ++i) {
        const float L = static_cast<float>(l[ix(i)]);
        const float Dv = w->l[ix(i)] > 0 ? st->dsum[ix(i)] / w->l[ix(i)] : 0.f;
        if (sees_keys(q0 + i) && (!std::isfinite(L) || !std::isfinite(Dv))) return false;
        w->lse[ix(i)] = L == kNegInfF ? kPosInfF : L;
        w->dd[ix(i)] = Dv;
      }
      stored_sweep2(gr, b, h, q0, nq, jhi, kr, w, st);
    }
  }
  if (gr.dk.present()) store_rows(gr.dk, D, b, 0, N, kh, dK);
  if (gr.dv.present()) store_rows(gr.dv, D, b, 0, N, kh, dV);
  return true;
}

void Cope::stored_sweep2(const Grads& gr, I b, I h, I q0, I nq, I jhi, const float* kr, Scratch* w,
                         Store* st) const {
  const I D = d_.D, N = d_.N, nc = ncol_;
  const float sc = static_cast<float>(d_.scale);
  float* dK = st->unit.data() + 2 * N * D;
  float* dV = dK + N * D;
  // lanes past nq: masked rows (lse +inf: P = 0) that read and add 0
  std::int32_t minjs = std::numeric_limits<std::int32_t>::max();
  for (I i = 0; i < kBq; ++i) {
    const bool real = i < nq;
    if (!real) w->lse[ix(i)] = kPosInfF, w->dd[ix(i)] = 0.f, w->js[ix(i)] = 0, w->qetop[ix(i)] = 0.f;
    w->uk[ix(i)] = real ? w->uk[ix(i)] : 0.f;
    w->ur[ix(i)] = real ? w->ur[ix(i)] : 0.f;
    if (real) minjs = std::min(minjs, w->js[ix(i)]);
  }
  std::fill(st->gc.begin(), st->gc.end(), 0.0);
  std::fill(w->dc.begin(), w->dc.end(), 0.f);
  std::fill(st->C.begin(), st->C.end(), 0.f);
  std::fill(st->dq.begin(), st->dq.begin() + nq * D, 0.f);
  cope_fast::BwdTile t = bwd_tile(w, w->qe.data(), st->C.data());
  t.nq = nq;
  const float* Q = w->q.data();
  const float* dO = w->dout.data();
  for (I j0 = 0; j0 < jhi; j0 += kBk) {
    const I nk = std::min(kBk, jhi - j0);
    float* at = st->tiles.data() + j0 / kBk * 2 * kBk * kBq;
    float* da = at + kBk * kBq;
    for (I i = 0; i < kBq; ++i) {  // the count at j0: U − the gates from j* passed
      const double bc = static_cast<double>(w->uk[ix(i)]) + static_cast<double>(w->ur[ix(i)]) - st->gc[ix(i)];
      w->ck[ix(i)] = static_cast<float>(std::floor(bc));
      w->cr[ix(i)] = static_cast<float>(bc - std::floor(bc));
    }
    t.at = at;
    t.dp = da;
    t.nk = nk;
    t.j0 = j0;
    t.base = (d_.k_off + j0) - (d_.q_off + q0);
    t.clamped = j0 + nk <= minjs;
    kern_.bwd(t);
    if (t.clamped) {
      for (I i = 0; i < nq; ++i) st->C[ix(i * nc + nc - 1)] += w->ctop[ix(i)];
    } else {
      for (I i = 0; i < nq; ++i)
        st->gc[ix(i)] += static_cast<double>(w->tk[ix(i)]) + static_cast<double>(w->tr[ix(i)]);
    }
    tile_gemm(gemm_, GemmForm::kNN, nk, D, nq, 1.f, at, kBq, dO, D, dV + j0 * D, D);
    tile_gemm(gemm_, GemmForm::kNN, nk, D, nq, sc, da, kBq, Q, D, dK + j0 * D, D);
    tile_gemm(gemm_, GemmForm::kTN, nq, D, nk, sc, da, kBq, kr + j0 * D, D, st->dq.data(), D);
  }
  // the z term's direct paths: dQ += C·E, dE += Cᵀ·Q
  const I ncb = cols(q0, nq);
  tile_gemm(gemm_, GemmForm::kNN, nq, D, ncb, 1.f, st->C.data(), nc, E_.data(), D, st->dq.data(), D);
  if (gr.dtable) tile_gemm(gemm_, GemmForm::kTN, ncb, D, nq, 1.f, st->C.data(), nc, Q, D, st->dEt.data(), D);
  if (gr.dq.present()) store_rows(gr.dq, D, b, q0, nq, h, st->dq.data());
}

}  // namespace posenc::cope_cpu
