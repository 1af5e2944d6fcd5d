// class XlFused (attention_xl_fused.h): the stored backward. Without a kept out and lse the plain
// backward (attention_xl_backward.cc) runs the forward again for lse and D (three products of
// dimension D or R per tile: S's two and P·V), then pass 2 forms S and dP again before its four
// gradient products: ten. Here, per unit (b, kv head) and query block, sweep 1 forms S and dP of
// every key block the block sees and keeps them, with the online softmax's lse and D = Σ_j P_ij·dP_ij
// (= rowsum(dO ⊙ out)); sweep 2 reads them back for tile_grads: seven. The unit's [K | C]ᵀ, Vᵀ and
// K's rows are formed once, its dK and dV summed in float over its query blocks and stored once. A
// unit is one thread's, so the results do not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "attention/attention_xl_fused.h"

namespace posenc::fused::xl_cpu {

namespace {
I key_blocks(I N) { return (N + kBk - 1) / kBk; }
I tile_floats(I N) { return 2 * key_blocks(N) * kBq * kBk; }
// [K | C]ᵀ and Vᵀ per key block, K's rows, dK, dV
I unit_floats(I N, I D, I R) { return key_blocks(N) * (2 * D + R) * kLdt + 3 * N * D; }
}  // namespace

bool XlFused::stored_ok() const {
  return (tile_floats(d_.N) + unit_floats(d_.N, d_.D, d_.R) + 5 * kBq) * I{4} <= score_store_limit.load();
}

void XlFused::stored_backward(const View& dout, const View& dq, const View& dk, const View& dv,
                              const EncodingGrads& g) const {
  const I B = d_.B, M = d_.M, Hq = d_.Hq, D = d_.D, G = d_.G, R = d_.R;
  const I npar = D + R + D * R;
  std::vector<double> gp(ix(B * Hq * npar), 0.0);
  const bool dq_dir = dq.present() && direct_out(dq) && !dq_buffered(G, M, D);
  RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    Scratch w;
    Store st;
    std::vector<float> qacc, xacc;  // the unit's dQc [G, M, D] (unless dq_dir) and X̃ [G, M, R]
    guard.run([&] {
      w.init(D, R);
      w.init_backward(D, R);
    });
#pragma omp for schedule(dynamic, 1)
    for (I u = 0; u < B * d_.Hkv; ++u) {
      const I b = u / d_.Hkv, kh = u % d_.Hkv;
      if (guard.failed() || !guard.run([&] {
            if (st.row.empty()) {  // a thread's Store, once it has a unit
              st.tiles.resize(ix(tile_floats(d_.N)));
              st.unit.resize(ix(unit_floats(d_.N, D, R)));
              st.row.resize(ix(5 * kBq));
            }
            xacc.assign(ix(G * M * R), 0.f);
            if (!dq_dir) qacc.assign(ix(G * M * D), 0.f);
          }))
        continue;
      const DqRows dqr = dq_rows(dq, dq_dir, b, kh, &qacc);
      stored_unit(dout, dk, dv, b, kh, dqr, xacc.data(), &w, &st);
      for (I gi = 0; gi < G; ++gi) {
        const I h = kh * G + gi;
        finish_rows(b, h, dqr.base + gi * dqr.hs, dqr.ld, &xacc[ix(gi * M * R)], &w, &gp[ix((b * Hq + h) * npar)],
                    dq_dir ? View{} : dq);
      }
    }
  }
  guard.rethrow();
  write_param_grads(gp, g);
}

void XlFused::stored_unit(const View& dout, const View& dk, const View& dv, I b, I kh, const DqRows& dqr,
                          float* xacc, Scratch* w, Store* st) const {
  const I D = d_.D, R = d_.R, M = d_.M, N = d_.N, G = d_.G, nkb = key_blocks(N);
  float* Kt = st->unit.data();  // [K | C]ᵀ per key block [D + R, kLdt], then Vᵀ [D, kLdt]
  float* Vt = Kt + nkb * (D + R) * kLdt;
  float* Kr = Vt + nkb * D * kLdt;  // K's rows [N, D], dK, dV
  float* dK = Kr + N * D;
  float* dV = dK + N * D;
  for (I kb = 0; kb < nkb; ++kb) {  // once per unit
    const I j0 = kb * kBk, nk = std::min(kBk, N - j0);
    load_rows(k_, D, b, j0, nk, kh, Kr + j0 * D);
    keys_t(Kr + j0 * D, D, j0, nk, Kt + kb * (D + R) * kLdt);
    load_rows(v_, D, b, j0, nk, kh, w->v.data());
    tr_(w->v.data(), D, nk, D, Vt + kb * D * kLdt, kLdt);
  }
  std::fill(dK, dK + 2 * N * D, 0.f);
  float* m = st->row.data();
  float* l = m + kBq;
  float* dsum = l + kBq;
  float* lse = dsum + kBq;
  float* Di = lse + kBq;
  float* qc = w->qc.data();
  float* yt = qc + kBq * D;
  const float* dO = w->dout.data();
  for (I g = 0; g < G; ++g) {
    const I h = kh * G + g;
    for (I q0 = 0; q0 < M; q0 += kBq) {
      const I nq = std::min(kBq, M - q0), qp_max = d_.q_off + q0 + nq - 1;
      const I jhi = p_.causal ? std::clamp<I>(qp_max - d_.k_off + 1, 0, N) : N;
      load_q(b, h, q0, nq, w, qc, yt);
      load_rows(dout, D, b, q0, nq, h, w->dout.data());
      std::fill(m, m + nq, kNegInfF);
      std::fill(l, l + nq, 0.f);
      std::fill(dsum, dsum + nq, 0.f);
      float* tile = st->tiles.data();
      for (I j0 = 0; j0 < jhi; j0 += kBk, tile += 2 * kBq * kBk) {  // sweep 1: S and dP kept
        const I nk = std::min(kBk, jhi - j0), kb = j0 / kBk;
        float* S = w->s.data();
        float* dP = tile + kBq * kBk;
        const I bd = logits(q0, nq, j0, nk, qc, yt, Kt + kb * (D + R) * kLdt, w);
        std::copy(S, S + (nq - 1) * kBk + nk, tile);
        tile_gemm(gemm_, GemmForm::kNP, nq, nk, D, 1.f, dO, D, Vt + kb * D * kLdt, kLdt, dP, kBk, bd);
        stored_sweep_step(simd_, S, dP, nq, nk, bd, cf_.rows, m, l, dsum);
      }
      stored_row_stats(nq, m, l, dsum, lse, Di);  // lse and D as pass 1 gives them
      const bool careful = careful_rows(lse, Di, nq);
      tile = st->tiles.data();
      for (I j0 = 0; j0 < jhi; j0 += kBk, tile += 2 * kBq * kBk) {  // sweep 2
        const I nk = std::min(kBk, jhi - j0), bd = band((d_.k_off + j0) - (d_.q_off + q0), nk);
        simd_.exp_rows(tile, nq, nk, kBk, lse, bd);  // P
        const TileGrads tg{careful, Di, qc, dO, Kr + j0 * D, tk(j0), dK + j0 * D, dV + j0 * D,
                           dqr.base + g * dqr.hs + q0 * dqr.ld, dqr.ld, xacc + (g * M + q0) * R};
        tile_grads(tg, nq, nk, bd, tile, tile + kBq * kBk, w);
      }
    }
  }
  if (dk.present()) store_rows(dk, D, b, 0, N, kh, dK);
  if (dv.present()) store_rows(dv, D, b, 0, N, kh, dV);
}

}  // namespace posenc::fused::xl_cpu
