// The fused Transformer-XL attention's forward (attention_xl_fused.h; how: attention_xl_cpu.cc).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "attention/attention_xl_fused.h"

namespace posenc::fused::xl_cpu {

void XlFused::forward(const View& out, const View& lse) {
  const I G = d_.G, M = d_.M, groups = d_.B * d_.Hkv;
  const bool all_see_all = !p_.causal || d_.q_off >= d_.k_off + d_.N - 1;  // no band in any tile
  const bool grouped = G > 1 && G * M <= kBq && all_see_all;
  const I parts = std::min(G, (I{threads_} + groups - 1) / groups), hp = (G + parts - 1) / parts;
  const I np = (G + hp - 1) / hp;  // parts of hp heads (the last may be shorter)
  const I nqb = (M + kBq - 1) / kBq, per = d_.B * d_.Hq;
  const I tasks = grouped ? groups * np : per * nqb;
  const std::unique_ptr<float[]> panels = grouped ? nullptr : key_panels();
  if (!panels) transpose_keys();  // the key blocks' Cᵀ, else transposed from the table per query block
  RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    Scratch w;
    std::vector<double> l;
    guard.run([&] {
      w.init(d_.D, d_.R);
      l.resize(ix(kBq));
    });
#pragma omp for schedule(dynamic, 1)
    for (I task = 0; task < tasks; ++task) {
      if (guard.failed()) continue;
      // Later query blocks (more keys when causal) first within a head.
      I b, h, nh = 1, qb = 0;
      if (grouped) {  // task = (b·Hkv + kv head)·(parts of hp heads) + part
        const I bk = task / np, part = task % np;
        b = bk / d_.Hkv;
        h = (bk % d_.Hkv) * G + part * hp;
        nh = std::min(hp, G - part * hp);
      } else {  // head by head, so the head's key panels stay in cache across its query blocks
        I qi;
        head_major_task(task, nqb, d_.Hq, &b, &h, &qi);
        qb = nqb - 1 - qi;
      }
      const I q0 = qb * kBq, nq = std::min(kBq, M - q0);
      forward_block(b, h, nh, q0, nq, &w, l.data(), panels.get());
      for (I g = 0; g < nh; ++g) {
        store_rows(out, d_.D, b, q0, nq, h + g, w.o.data() + g * nq * d_.D);
        if (!lse.present()) continue;
        double* base = static_cast<double*>(lse.data);
        for (I i = 0; i < nq; ++i)
          base[b * lse.strides[0] + (h + g) * lse.strides[1] + (q0 + i) * lse.strides[2]] = l[ix(g * nq + i)];
      }
    }
  }
  guard.rethrow();
}

void XlFused::forward_block(I b, I h, I nh, I q0, I nq, Scratch* w, double* lse, const float* panels,
                            bool careful_v) const {
  const I D = d_.D, R = d_.R, kh = h / d_.G, nkb = (d_.N + kBk - 1) / kBk, rows = nh * nq;
  float* yt = w->qc.data() + kBq * D;
  for (I g = 0; g < nh; ++g) load_q(b, h + g, q0, nq, w, w->qc.data() + g * nq * D, yt + g * nq * R);
  const I qp_max = d_.q_off + q0 + nq - 1;
  const I jhi = p_.causal ? std::clamp<I>(qp_max - d_.k_off + 1, 0, d_.N) : d_.N;
  float* m = w->ml.data();
  float* l = m + kBq;
  float* o = w->o.data();
  std::fill(m, m + rows, kNegInfF);
  std::fill(l, l + rows, 0.f);
  std::fill(o, o + rows * D, 0.f);
  float* S = w->s.data();
  for (I j0 = 0; j0 < jhi; j0 += kBk) {
    const I nk = std::min(kBk, jhi - j0);
    const float* kt = w->kt.data();
    if (panels) kt = panels + ((b * d_.Hkv + kh) * nkb + j0 / kBk) * panel_size();
    else load_keys_t(b, kh, j0, nk, w, w->kt.data());
    const float* V = w->v.data();
    I ldv = D;
    if (panels) {
      V = kt + (D + d_.R) * kLdt;
    } else if (dir_v_) {
      V = static_cast<const float*>(v_.data) + b * v_.strides[0] + j0 * v_.strides[1] + kh * v_.strides[2];
      ldv = nk == 1 ? D : v_.strides[1];
    } else {
      load_rows(v_, D, b, j0, nk, kh, w->v.data());
    }
    const I bd = logits(q0, rows, j0, nk, w->qc.data(), yt, kt, w);
    if (cf_.rows) mark_nan_rows(simd_, S, rows, nk, bd, m);  // careful steps (attention_tiles.h)
    online_softmax_step(simd_, S, rows, nk, m, l, o, D, bd);
    const bool bad_v = careful_v && sanitize_rows(V, ldv, nk, D, w->sv.data());
    if (bad_v) tile_gemm(gemm_, GemmForm::kNN, rows, D, nk, 1.f, S, kBk, w->sv.data(), D, o, D, bd);
    else tile_gemm(gemm_, GemmForm::kNN, rows, D, nk, 1.f, S, kBk, V, ldv, o, D, bd);
    if (bad_v) add_back_pv(S, rows, V, ldv, nk, D, o, D);
  }
  online_softmax_finish(simd_, rows, m, l, o, D, lse);
  if (!careful_v && !outputs_finite(simd_, o, rows, D, lse)) forward_block(b, h, nh, q0, nq, w, lse, panels, true);
}

}  // namespace posenc::fused::xl_cpu
