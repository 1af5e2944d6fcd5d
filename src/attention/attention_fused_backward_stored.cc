// class Fused (attention_fused_cpu.h): the stored backward. Without saved statistics, the plain
// backward (attention_fused_backward.cc) runs the forward again for lse and D, then pass 2's five
// tile products per tile: seven in all. Here each unit (b, kv head) walks its query blocks; for one
// query block, sweep 1 forms the logits S and dP = dO·Vᵀ of every key block it sees and keeps them,
// with the online softmax's lse and D_i = Σ_j P_ij·dP_ij (equal to rowsum(dO ⊙ out)); sweep 2 reads
// the kept tiles back as P and dS for the products dV += Pᵀ·dO, dK += dSᵀ·Q, dQ += dS·K: five
// products per tile. The kept tiles ([kBq, N] twice) and the unit's dK, dV, K rows and Kᵀ, Vᵀ
// blocks (~5·N·D floats) cost memory, so the path is taken where they fit score_store_limit a thread
// (attention_tiles.h). stored_unit_rate runs the same sweeps with the bfloat16-rate products.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "attention/attention_fused_cpu.h"

namespace posenc::fused_cpu {

namespace {
// A thread's Store: the tiles, dK, dV and K, Kᵀ and Vᵀ of a unit, the rows' statistics.
I key_blocks(I N) { return (N + kBk - 1) / kBk; }
I tile_floats(I N) { return 2 * key_blocks(N) * kBq * kBk; }
I unit_floats(I N, I D) { return 3 * N * D + 2 * key_blocks(N) * D * kLdt; }
I store_floats(I N, I D) { return tile_floats(N) + unit_floats(N, D) + 5 * kBq; }
// At the bfloat16 rate: the unit's Kᵀ and Vᵀ pairs [2, blocks, D/2, kLdt] and K's row pairs
// [blocks, kBk/2, D]; a query block's Q and dO row pairs [2, kBq, D/2] and their transposes
// [2, D, kBq/2]. Its floats: dKᵀ, dVᵀ [2, blocks, D, kLdt].
I rate_pairs(I N, I D) { return key_blocks(N) * (D * kLdt + kBk / 2 * D) + 2 * kBq * D; }
I rate_floats(I N, I D) { return 2 * key_blocks(N) * D * kLdt; }
}  // namespace

bool Fused::stored_ok(const Bwd& bw, const Saved* saved) const {
  const I U = d_.B * d_.Hkv, T = threads_, N = d_.N, D = d_.D;
  if (saved || per_head_ || bw.careful || !gemm_ || U % T != 0) return false;
  // the bfloat16 rate: not under a rotary encoding or with future-only heads (keys_rate has them)
  if (bw.rate && (tq_ || tk_ || nonsym_)) return false;
  const I rate = bw.rate ? rate_pairs(N, D) + std::max<I>(rate_floats(N, D) - unit_floats(N, D), 0) : 0;
  return (store_floats(N, D) + rate) * I{4} <= score_store_limit.load();
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
      if (bw.rate) w.init_bf16_backward(D);
      st.tiles.resize(ix(tile_floats(N)));
      st.unit.resize(ix(std::max(unit_floats(N, D), bw.rate ? rate_floats(N, D) : 0)));
      st.row.resize(ix(5 * kBq));
      st.pairs.resize(bw.rate ? ix(rate_pairs(N, D)) : 0);
      dqbuf.resize(dq.present() && !dq_dir ? ix(G * M * D) : 0);
    });
#pragma omp for schedule(dynamic, 1)
    for (I u = 0; u < B * Hkv; ++u) {
      if (guard.failed()) continue;
      const I b = u / Hkv, kh = u % Hkv;
      const Acc acc = dq_dir ? dq_in_place(dq, b, kh) : dq.present() ? Acc{dqbuf.data(), D, M * D, 0} : Acc{};
      for (I g = 0; g < G && acc.p; ++g) zero_rows(acc, g, 0, M);
      double* gwu = npar ? &(*gw)[ix((b * Hq + kh * G) * npar)] : nullptr;
      if (!bw.rate || !stored_unit_rate(bw, b, kh, acc, gwu, &w, &st)) {
        for (I g = 0; g < G && acc.p && bw.rate; ++g) zero_rows(acc, g, 0, M);  // the rate's part undone
        if (gwu && bw.rate) std::fill(gwu, gwu + G * npar, 0.0);
        stored_unit(bw, b, kh, acc, gwu, &w, &st);
      }
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
        stored_sweep_step(simd_, S, dP, nq, nk, bd, cf_.rows, m, l, dsum);
      }
      stored_row_stats(nq, m, l, dsum, lse, Di);  // lse and D as pass 1 gives them
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

bool Fused::stored_unit_rate(const Bwd& bw, I b, I kh, const Acc& acc, double* gwu, Scratch* w, Store* st) const {
  using attn_fast::Bf16Form;
  using attn_fast::Pair;
  const I D = d_.D, D2 = D / 2, G = d_.G, M = d_.M, N = d_.N, nkb = key_blocks(N), Bh = kBq / 2;
  const float sc = static_cast<float>(d_.scale);
  float* dKt = st->unit.data();  // [blocks, D, kLdt]
  float* dVt = dKt + nkb * D * kLdt;
  Pair* Kt = st->pairs.data();  // [blocks, D/2, kLdt]
  Pair* Vt = Kt + nkb * D2 * kLdt;
  Pair* Kp = Vt + nkb * D2 * kLdt;  // [blocks, kBk/2, D]
  Pair* Qr = Kp + nkb * kBk / 2 * D;  // the query block's Q, dO rows [kBq, D/2], Qᵀ, dOᵀ [D, kBq/2]
  Pair* dOr = Qr + kBq * D2;
  Pair* Qt = dOr + kBq * D2;
  Pair* dOt = Qt + D * Bh;
  for (I kb = 0; kb < nkb; ++kb) {  // once per unit
    const I j0 = kb * kBk, nk = std::min(kBk, N - j0);
    pack_keys(b, kh, j0, nk, Kt + kb * D2 * kLdt);
    bf16_->transpose_pairs(row_at(v_, b, j0, kh), v_.strides[1], nk, D2, Vt + kb * D2 * kLdt, kLdt);
    bf16_->interleave_rows(row_at(k_, b, j0, kh), k_.strides[1], nk, D, Kp + kb * kBk / 2 * D, D);
  }
  std::fill(dKt, dKt + 2 * nkb * D * kLdt, 0.f);
  float* m = st->row.data();
  float* l = m + kBq;
  float* dsum = l + kBq;
  float* lse = dsum + kBq;
  float* Di = lse + kBq;
  float* S = w->s.data();
  const auto* pb16 = reinterpret_cast<const std::uint16_t*>(w->pb.data());
  for (I g = 0; g < G; ++g) {
    const I h = kh * G + g;
    double* gwh = gwu ? gwu + g * bw.npar : nullptr;
    for (I q0 = 0; q0 < M; q0 += kBq) {
      const I nq = std::min(kBq, M - q0), nqh = (nq + 1) / 2, qp_max = d_.q_off + q0 + nq - 1;
      const I jhi = past_only(h) ? std::clamp<I>(qp_max - d_.k_off + 1, 0, N) : N;
      for (int which = 0; which < 2; ++which) {  // Q's and dO's row pairs and their transposes
        const Tile X = rows(which ? bw.dout : q_, false, b, q0, nq, h, w->q.data(), nullptr, 0);
        Pair* r = which ? dOr : Qr;
        bf16_->round_rows(X.p, X.ld, nq, D, r, D2);
        bf16_->interleave_rows(reinterpret_cast<const std::uint16_t*>(r), D, nq, D, w->ib.data(), D);
        bf16_->transpose_pairs(reinterpret_cast<const std::uint16_t*>(w->ib.data()), 2 * D, nqh, D,
                               which ? dOt : Qt, Bh);
      }
      std::fill(m, m + nq, kNegInfF);
      std::fill(l, l + nq, 0.f);
      std::fill(dsum, dsum + nq, 0.f);
      float* tile = st->tiles.data();
      for (I j0 = 0; j0 < jhi; j0 += kBk, tile += 2 * kBq * kBk) {  // sweep 1, as stored_unit's
        const I nk = std::min(kBk, jhi - j0), base = (d_.k_off + j0) - (d_.q_off + q0), bd = band(h, base);
        float* dP = tile + kBq * kBk;
        bf16_->gemm(Bf16Form::kScores, nq, nk, D2, sc, Qr, D2, Kt + j0 / kBk * D2 * kLdt, kLdt, tile, kBk, bd);
        finish_logits(h, q0, nq, nk, base, bd, tile, w->diag.data());
        bf16_->gemm(Bf16Form::kScores, nq, nk, D2, 1.f, dOr, D2, Vt + j0 / kBk * D2 * kLdt, kLdt, dP, kBk, bd);
        std::copy(tile, tile + (nq - 1) * kBk + nk, S);
        stored_sweep_step(simd_, S, dP, nq, nk, bd, cf_.rows, m, l, dsum);
      }
      stored_row_stats(nq, m, l, dsum, lse, Di);
      if (careful_rows(lse, Di, nq)) return false;  // a row that sees no key, a NaN or ±inf: stored_unit
      tile = st->tiles.data();
      for (I j0 = 0; j0 < jhi; j0 += kBk, tile += 2 * kBq * kBk) {  // sweep 2, as keys_rate's products
        const I nk = std::min(kBk, jhi - j0), kb = j0 / kBk, base = (d_.k_off + j0) - (d_.q_off + q0);
        const I bd = band(h, base);
        float* P = tile;
        const float* dP = tile + kBq * kBk;
        simd_.exp_rows(P, nq, nk, kBk, lse, bd);
        if (bw.dv.present()) {  // dVᵀ += dOᵀ·P
          bf16_->round_rows(P, kBk, nq, nk, w->pb.data(), kBk / 2);
          bf16_->interleave_rows(pb16, kBk, nq, nk, w->ib.data(), kLdt);
          bf16_->gemm(Bf16Form::kValues, D, nk, nqh, 1.f, dOt, Bh, w->ib.data(), kLdt, dVt + kb * D * kLdt, kLdt,
                      attn_fast::kNoBand);
        }
        for (I i = 0; i < nq; ++i) simd_.ds_row(P + i * kBk, dP + i * kBk, ix(std::clamp<I>(i + bd + 1, 0, nk)), Di[i]);
        if (gwh && bias_ == Bias::kFire) fire_tile(h, q0, base, nq, nk, nullptr, P, gwh);
        else if (gwh && bias_ != Bias::kNone) param_grads(h, base, nq, nk, P, w->diag.data(), gwh);
        for (I i = 0; i < nq; ++i) simd_.scale(P + i * kBk, ix(std::clamp<I>(i + bd + 1, 0, nk)), sc);
        bf16_->round_rows(P, kBk, nq, nk, w->pb.data(), kBk / 2);  // scale·dS
        if (bw.dk.present()) {  // dKᵀ += Qᵀ·(scale·dS)
          bf16_->interleave_rows(pb16, kBk, nq, nk, w->ib.data(), kLdt);
          bf16_->gemm(Bf16Form::kValues, D, nk, nqh, 1.f, Qt, Bh, w->ib.data(), kLdt, dKt + kb * D * kLdt, kLdt,
                      attn_fast::kNoBand);
        }
        if (acc.p)  // dQ += (scale·dS)·K
          bf16_->gemm(Bf16Form::kValues, nq, D, (nk + 1) / 2, 1.f, w->pb.data(), kBk / 2, Kp + kb * kBk / 2 * D, D,
                      acc.row(g, q0), acc.ld, bd);
      }
    }
  }
  for (I kb = 0; kb < nkb; ++kb) {  // keys no row sees keep 0
    const I j0 = kb * kBk, nk = std::min(kBk, N - j0);
    if (bw.dk.present()) {
      tr_(dKt + kb * D * kLdt, kLdt, D, nk, w->dk.data(), D);
      attn_fast::store_rows(bw.dk, D, b, j0, nk, kh, w->dk.data());
    }
    if (bw.dv.present()) {
      tr_(dVt + kb * D * kLdt, kLdt, D, nk, w->dv.data(), D);
      attn_fast::store_rows(bw.dv, D, b, j0, nk, kh, w->dv.data());
    }
  }
  return true;
}

}  // namespace posenc::fused_cpu
