// class Fused (attention_fused_cpu.h): the stored backward. Without saved statistics, the plain
// backward (attention_fused_backward.cc) runs the forward again for lse and D, then pass 2's five
// tile products per tile: seven in all. Here each unit (b, kv head) walks its query blocks; for one
// query block, sweep 1 forms the logits S and dP = dO·Vᵀ of every key block it sees and keeps them,
// with the online softmax's lse and D_i = Σ_j P_ij·dP_ij (equal to rowsum(dO ⊙ out)); sweep 2 reads
// the kept tiles back as P and dS for the products dV += Pᵀ·dO, dK += dSᵀ·Q, dQ += dS·K: five
// products per tile. The kept tiles ([kBq, N] twice) and the unit's dK, dV, K rows and Kᵀ, Vᵀ
// blocks (~5·N·D floats) cost memory, so the path is taken where they fit score_store_limit a thread
// (attention_tiles.h).
#include <omp.h>

#include <cmath>
#include <limits>

#include "attention/attention_fused_cpu.h"

namespace posenc::fused_cpu {

namespace {
// A thread's Store: the tiles, dK, dV and K, Kᵀ and Vᵀ of a unit, the rows' statistics.
I key_blocks(I N) { return (N + kBk - 1) / kBk; }
I tile_floats(I N) { return 2 * key_blocks(N) * kBq * kBk; }
I unit_floats(I N, I D) { return 3 * N * D + 2 * key_blocks(N) * D * kLdt; }
I store_floats(I N, I D) { return tile_floats(N) + unit_floats(N, D) + 5 * kBq; }
}  // namespace

bool Fused::stored_ok(const Bwd& bw, const Saved* saved) const {
  const I U = d_.B * d_.Hkv, T = threads_;
  if (saved || bw.rate || per_head_ || bw.careful || !gemm_ || U % T != 0) return false;
  return store_floats(d_.N, d_.D) * I{4} <= score_store_limit.load();
}

void Fused::stored_backward(const Bwd& bw, std::vector<double>* gw) const {
  const I B = d_.B, M = d_.M, N = d_.N, Hq = d_.Hq, Hkv = d_.Hkv, D = d_.D, G = d_.G, npar = bw.npar;
  const View& dq = bw.dq;
  const bool dq_dir = dq.present() && direct_out(dq, Hq) && !attn_fast::dq_buffered(G, M, D);
  attn_fast::RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && B * Hkv > 1)
  {
    Scratch& w = thread_scratch();
    Store st;
    std::vector<float> dqbuf;  // [G, M, D]
    guard.run([&] {
      w.init(D);
      w.init_backward(D);
      st.tiles.resize(ix(tile_floats(N)));
      st.unit.resize(ix(unit_floats(N, D)));
      st.row.resize(ix(5 * kBq));
      dqbuf.resize(dq.present() && !dq_dir ? ix(G * M * D) : 0);
    });
#pragma omp for schedule(dynamic, 1)
    for (I u = 0; u < B * Hkv; ++u) {
      if (guard.failed()) continue;
      const I b = u / Hkv, kh = u % Hkv;
      const Acc acc = dq_dir ? dq_in_place(dq, b, kh) : dq.present() ? Acc{dqbuf.data(), D, M * D, 0} : Acc{};
      for (I g = 0; g < G && acc.p; ++g) zero_rows(acc, g, 0, M);
      stored_unit(bw, b, kh, acc, npar ? &(*gw)[ix((b * Hq + kh * G) * npar)] : nullptr, &w, &st);
      for (I g = 0; g < G && acc.p; ++g) finish_dq(dq, dq_dir, acc, b, kh, g, 0, M);
    }
  }
  guard.rethrow();
}

void Fused::stored_unit(const Bwd& bw, I b, I kh, const Acc& acc, double* gwu, Scratch* w, Store* st) const {
  const I D = d_.D, G = d_.G, M = d_.M, N = d_.N;
  const float sc = static_cast<float>(d_.scale);
  const bool want_dk = bw.dk.present();
  float* dK = st->unit.data();
  float* dV = dK + N * D;
  float* Kr = dV + N * D;  // K's rows (rotated), then Kᵀ and Vᵀ per key block [D, kLdt]
  float* Kt = Kr + N * D;
  float* Vt = Kt + key_blocks(N) * D * kLdt;
  std::fill(dK, dK + 2 * N * D, 0.f);
  for (I j0 = 0; j0 < N; j0 += kBk) {  // once per unit, not per tile
    const I nk = std::min(kBk, N - j0), at = j0 / kBk * D * kLdt;
    rows(k_, false, b, j0, nk, kh, Kr + j0 * D, tk_, kh * G);
    tr_(Kr + j0 * D, D, nk, D, Kt + at, kLdt);
    const Tile V = rows(v_, dir_v_, b, j0, nk, kh, w->v.data(), nullptr, 0);
    tr_(V.p, V.ld, nk, D, Vt + at, kLdt);
  }
  float* m = st->row.data();
  float* l = m + kBq;
  float* dsum = l + kBq;  // Σ_j exp(S_ij − m_i)·dP_ij, rescaled with l
  float* lse = dsum + kBq;
  float* Di = lse + kBq;
  float* S = w->s.data();
  for (I g = 0; g < G; ++g) {
    const I h = kh * G + g;
    double* gwh = gwu ? gwu + g * bw.npar : nullptr;
    for (I q0 = 0; q0 < M; q0 += kBq) {
      const I nq = std::min(kBq, M - q0), qp_min = d_.q_off + q0, qp_max = qp_min + nq - 1;
      I jlo = 0, jhi = N;  // the keys some row of the block sees (as forward_block)
      if (past_only(h)) jhi = std::clamp<I>(qp_max - d_.k_off + 1, 0, N);
      if (future_only(h)) jlo = std::clamp<I>(qp_min - d_.k_off, 0, N);
      const Tile Q = rows(q_, false, b, q0, nq, h, w->q.data(), tq_, h);
      const Tile dO = rows(bw.dout, false, b, q0, nq, h, w->dout.data(), nullptr, 0);
      std::fill(m, m + nq, kNegInfF);
      std::fill(l, l + nq, 0.f);
      std::fill(dsum, dsum + nq, 0.f);
      // sweep 1: S and dP kept, the online softmax over S's copy, Σ P·dP alongside
      float* tile = st->tiles.data();
      for (I j0 = jlo; j0 < jhi; j0 += kBk, tile += 2 * kBq * kBk) {
        const I nk = std::min(kBk, jhi - j0), bd = band(h, (d_.k_off + j0) - qp_min);
        float* dP = tile + kBq * kBk;
        const Tile K{Kr + j0 * D, D};
        const float* kt = Kt + j0 / kBk * D * kLdt;
        const float* vt = Vt + j0 / kBk * D * kLdt;
        if (j0 % kBk != 0) {  // a future-only head's blocks start at its first key: transposed here
          tr_(K.p, K.ld, nk, D, w->kt.data(), kLdt);
          const Tile V = rows(v_, dir_v_, b, j0, nk, kh, w->v.data(), nullptr, 0);
          tr_(V.p, V.ld, nk, D, w->vt.data(), kLdt);
          kt = w->kt.data(), vt = w->vt.data();
        }
        logits(h, q0, nq, j0, nk, Q, K, w, kt, tile);
        tile_gemm(gemm_, GemmForm::kNP, nq, nk, D, 1.f, dO.p, dO.ld, vt, kLdt, dP, kBk, bd);
        std::copy(tile, tile + (nq - 1) * kBk + nk, S);
        if (cf_.rows) mark_nan_rows(simd_, S, nq, nk, bd, m);
        online_softmax_step(simd_, S, nq, nk, m, l, dsum, 1, bd);  // dsum rescaled as a 1-wide out
        for (I i = 0; i < nq; ++i)
          dsum[i] += simd_.dot(S + i * kBk, dP + i * kBk, ix(std::clamp<I>(i + bd + 1, 0, nk)));
      }
      // lse and D as online_softmax_finish and pass 1 give them (D: rowsum(dO ⊙ out) there)
      for (I i = 0; i < nq; ++i) {
        if (l[i] > 0) {
          lse[i] = static_cast<float>(static_cast<double>(m[i]) + std::log(static_cast<double>(l[i])));
          Di[i] = dsum[i] / l[i];
        } else if (std::isnan(m[i]) || std::isnan(l[i])) {
          lse[i] = Di[i] = std::numeric_limits<float>::quiet_NaN();
        } else {  // no key seen: out is 0
          lse[i] = kNegInfF;
          Di[i] = dsum[i];
        }
      }
      // sweep 2: P, dS and the three products; the careful steps as in keys()
      const bool careful = careful_rows(lse, Di, nq);
      const bool bad_do = careful && sanitize_rows(dO.p, dO.ld, nq, D, w->dos.data());
      const Tile dOp = bad_do ? Tile{w->dos.data(), D} : dO;
      const Tile Qp = careful && sanitize_rows(Q.p, Q.ld, nq, D, w->qs.data()) ? Tile{w->qs.data(), D} : Q;
      tile = st->tiles.data();
      for (I j0 = jlo; j0 < jhi; j0 += kBk, tile += 2 * kBq * kBk) {
        const I nk = std::min(kBk, jhi - j0), base = (d_.k_off + j0) - qp_min, bd = band(h, base);
        float* P = tile;
        const float* dP = tile + kBq * kBk;
        simd_.exp_rows(P, nq, nk, kBk, lse, bd);
        if (bw.dv.present()) {
          tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, 1.f, P, kBk, dOp.p, dOp.ld, dV + j0 * D, D, bd);
          if (bad_do) add_back_ptdo(P, nq, nk, dO.p, dO.ld, D, dV + j0 * D);
        }
        for (I i = 0; i < nq; ++i) {
          const I n = std::clamp<I>(i + bd + 1, 0, nk);
          if (careful) careful_ds(P + i * kBk, dP + i * kBk, n, Di[i]);
          else simd_.ds_row(P + i * kBk, dP + i * kBk, ix(n), Di[i]);
        }
        if (gwh && bias_ == Bias::kFire) fire_tile(h, q0, base, nq, nk, nullptr, P, gwh);
        else if (gwh && bias_ != Bias::kNone) param_grads(h, base, nq, nk, P, w->diag.data(), gwh);
        if (want_dk) tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, sc, P, kBk, Qp.p, Qp.ld, dK + j0 * D, D, bd);
        if (acc.p)
          tile_gemm(gemm_, GemmForm::kNN, nq, D, nk, sc, P, kBk, Kr + j0 * D, D, acc.row(g, q0), acc.ld, bd);
      }
    }
  }
  if (want_dk) {
    if (tk_) rotate(dK, N, D, *tk_, b, kh * G, 0, true);
    attn_fast::store_rows(bw.dk, D, b, 0, N, kh, dK);
  }
  if (bw.dv.present()) attn_fast::store_rows(bw.dv, D, b, 0, N, kh, dV);
}

}  // namespace posenc::fused_cpu
