// The fused CoPE attention's forward (attention_cope_fused.h; how: attention_cope_cpu.cc).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/attention_cope_fused.h"

namespace posenc::cope_cpu {

bool Cope::forward(const View& out, const View& lse) const {
  const I nqb = (d_.M + kBq - 1) / kBq, per = d_.B * d_.Hq, tasks = per * nqb;
  bool bad = false;
  const std::vector<float> kv = key_rows();
  RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    Scratch w;
    std::vector<double> l;
    guard.run([&] {
      w.init(d_.D, ncol_);
      l.resize(ix(kBq));
    });
#pragma omp for schedule(dynamic, 1) reduction(|| : bad)
    for (I task = 0; task < tasks; ++task) {
      if (guard.failed()) continue;
      const I qb = nqb - 1 - task / per, bh = task % per, b = bh / d_.Hq, h = bh % d_.Hq;
      const I q0 = qb * kBq, nq = std::min(kBq, d_.M - q0);
      const auto [kr, vr] = unit_rows(kv, b, h / d_.G);
      forward_block(b, h, q0, nq, false, &w, l.data(), kr, vr);
      for (I i = 0; i < nq; ++i)
        bad = bad || (sees_keys(q0 + i) && (!std::isfinite(l[ix(i)]) || !simd_.finite(&w.o[ix(i * d_.D)], ix(d_.D))));
      store_rows(out, d_.D, b, q0, nq, h, w.o.data());
      if (lse.present()) {
        double* base = static_cast<double*>(lse.data);
        for (I i = 0; i < nq; ++i)
          base[b * lse.strides[0] + h * lse.strides[1] + (q0 + i) * lse.strides[2]] = l[ix(i)];
      }
    }
  }
  guard.rethrow();
  return !bad;
}

void Cope::forward_block(I b, I h, I q0, I nq, bool track, Scratch* w, double* lse, const float* kr,
                         const float* vr, const Keep* keep) const {
  const I D = d_.D, kh = h / d_.G, nc = ncol_;
  load_rows(q_, D, b, q0, nq, h, w->q.data());
  tile_gemm(gemm_, GemmForm::kNT, nq, cols(q0, nq), D, 1.f, w->q.data(), D, E_.data(), D,
            w->qe.data(), nc);
  for (I i = 0; i < nq; ++i) w->qetop[ix(i)] = w->qe[ix(i * nc + nc - 1)];
  tr_(w->q.data(), D, nq, D, w->qt.data(), kLdt);  // Qᵀ once for the key blocks' K·Qᵀ (kNP)
  const I qp_max = d_.q_off + q0 + nq - 1;
  const I jhi = causal_ ? std::clamp<I>(qp_max - d_.k_off + 1, 0, d_.N) : d_.N;
  std::fill(w->m.begin(), w->m.end(), kNegInfF);
  for (auto* x : {&w->l, &w->ck, &w->cr, &w->uk, &w->ur}) std::fill(x->begin(), x->end(), 0.f);
  std::fill(w->carry.begin(), w->carry.end(), 0.0);
  std::fill(w->js.begin(), w->js.end(), static_cast<std::int32_t>(jhi));
  float* o = w->o.data();
  std::fill(o, o + nq * D, 0.f);
  cope_fast::FwdTile t;
  t.at = w->at.data();
  t.nq = nq;
  t.causal = causal_;
  t.track = track;
  t.qe = w->qe.data();
  t.rowbase = w->rowbase.data();
  t.qetop = w->qetop.data();
  t.top = top_;
  t.colmax = static_cast<float>(nc - 1);
  t.ck = w->ck.data();
  t.cr = w->cr.data();
  t.tk = w->tk.data();
  t.tr = w->tr.data();
  t.js = w->js.data();
  t.uk = w->uk.data();
  t.ur = w->ur.data();
  t.m = w->m.data();
  t.l = w->l.data();
  t.corr = w->corr.data();
  for (I j0 = jhi > 0 ? (jhi - 1) / kBk * kBk : -1; j0 >= 0; j0 -= kBk) {
    const I nk = std::min(kBk, jhi - j0);
    const float* K = w->k.data();
    const float* V = w->v.data();
    if (kr) {
      K = kr + j0 * D;
      V = vr + j0 * D;
    } else {
      load_rows(k_, D, b, j0, nk, kh, w->k.data());
      load_rows(v_, D, b, j0, nk, kh, w->v.data());
    }
    tile_gemm(gemm_, GemmForm::kNP, nk, nq, D, static_cast<float>(d_.scale), K, D, w->qt.data(), kLdt,
              w->at.data(), kBq);
    float* kept = keep ? keep->tiles + j0 / kBk * 2 * kBk * kBq : nullptr;  // S, then dPᵀ
    if (kept) {
      std::copy(w->at.begin(), w->at.begin() + nk * kBq, kept);
      tile_gemm(gemm_, GemmForm::kNP, nk, nq, D, 1.f, V, D, keep->dot, kLdt, kept + kBk * kBq, kBq);
    }
    bool sat = true;  // counts only grow leftwards: every key from here on is clamped
    for (I i = 0; i < nq && sat; ++i) sat = w->ck[ix(i)] >= top_;
    t.nk = nk;
    t.j0 = j0;
    t.base = (d_.k_off + j0) - (d_.q_off + q0);
    t.saturated = sat;
    kern_.fwd(t);
    if (!sat)
      for (I i = 0; i < nq; ++i) {
        double& cnt = w->carry[ix(i)];
        cnt += static_cast<double>(w->tk[ix(i)]) + static_cast<double>(w->tr[ix(i)]);
        w->ck[ix(i)] = static_cast<float>(std::floor(cnt));
        w->cr[ix(i)] = static_cast<float>(cnt - std::floor(cnt));
      }
    if (kept) {  // D's running sum, rescaled as O would be, then + Σ_j P_ij·dP_ij (lanes: rows)
      float* ds = keep->dsum;
      for (I i = 0; i < nq; ++i) ds[i] *= w->corr[ix(i)];
      const float* P = w->at.data();
      const float* dP = kept + kBk * kBq;
      for (I j = 0; j < nk; ++j) simd_.mul_add_to(ds, P + j * kBq, dP + j * kBq, ix(nq));
      continue;
    }
    for (I i = 0; i < nq; ++i)
      if (w->corr[ix(i)] != 1.f) simd_.scale(o + i * D, ix(D), w->corr[ix(i)]);
    tile_gemm(gemm_, GemmForm::kTN, nq, D, nk, 1.f, w->at.data(), kBq, V, D, o, D);
  }
  online_softmax_finish(simd_, nq, w->m.data(), w->l.data(), o, D, lse);
  // a row that sees no key: out 0, lse −inf, whatever its q (a NaN there reaches its masked lanes'
  // logits, −inf + q·e, which a finite q leaves −inf: the same 0 and −inf)
  for (I i = 0; i < nq; ++i)
    if (!sees_keys(q0 + i)) {
      std::fill(o + i * D, o + (i + 1) * D, 0.f);
      lse[i] = -std::numeric_limits<double>::infinity();
    }
}

}  // namespace posenc::cope_cpu
