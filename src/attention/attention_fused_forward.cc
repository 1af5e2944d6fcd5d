// class Fused (attention_fused_cpu.h): the forward (per task: b, head, query block; the online
// softmax over the key blocks), the logits of a tile (scale·Q·Kᵀ, bias, masks) and the rows of a
// tile (read in place, converted, rotated), shared with the backward; the rotary tables.
#include <cblas.h>
#include <omp.h>

#include "attention/attention_fused_cpu.h"

namespace posenc::fused_cpu {

void RotTab::build(const Extra& xs, const rotary::Plan& pl, const std::vector<I>& ids, I B, I count, bool batched,
                   I heads, int role, int threads) {
  n = count;
  half = pl.half;
  nb = batched ? B : 1;
  nh = pl.per_head() ? heads : 1;
  const I rows = nh * nb * n, A = pl.axes;
  c.resize(ix(rows * half));
  s.resize(ix(rows * half));
  const bool scaled = pl.scaled() || pl.factor != 1.0;
  constexpr I kPiece = 512;  // rows per parallel piece: a decode step's stays on one thread
  const I pieces = (rows + kPiece - 1) / kPiece;
  const int th = pieces > 1 ? threads : 1;
  attn_fast::RegionGuard guard;
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
  for (I pc = 0; pc < pieces; ++pc) {
    const I r0 = pc * kPiece, cnt = std::min(kPiece, rows - r0);
    std::vector<double> ang, sc;
    if (guard.failed() || !guard.run([&] {
          ang.resize(ix(cnt * half));
          sc.resize(scaled ? ix(cnt * half) : 0);
        }))
      continue;
    I p[3] = {0, 0, 0};
    for (I t = 0; t < cnt; ++t) {
      const I row = r0 + t, i = row % n, b = (row / n) % nb, h = row / (n * nb);
      for (I a = 0; a < A; ++a) p[a] = ids[ix((b * A + a) * n + i)];
      for (I k = 0; k < half; ++k) {
        ang[ix(t * half + k)] = pl.angle(p, k, h);
        if (scaled) sc[ix(t * half + k)] = pl.scale(p[0], k, role);
      }
    }
    xs.trig_rows(ang.data(), scaled ? sc.data() : nullptr, cnt, half, &c[ix(r0 * half)], &s[ix(r0 * half)]);
  }
  guard.rethrow();
}
Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

void Fused::forward(const View& out, const View& lse) const {
  const I nqb = (d_.M + kBq - 1) / kBq, tasks = d_.B * d_.Hq * nqb;
  const Panels panels = key_panels(true);
  attn_fast::RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    Scratch& w = thread_scratch();
    std::vector<double> l;
    guard.run([&] {
      w.init(d_.D);
      if (bf16_) w.init_bf16(d_.D);
      l.resize(ix(kBq));
    });
#pragma omp for schedule(dynamic, 1)
    for (I task = 0; task < tasks; ++task) {
      if (guard.failed()) continue;
      I b, h, q0, nq;
      query_task(task, nqb, &b, &h, &q0, &nq);
      forward_block(b, h, q0, nq, &w, w.o.data(), l.data(), false, true, &panels);
      attn_fast::store_rows(out, d_.D, b, q0, nq, h, w.o.data());
      if (lse.present()) {
        double* base = static_cast<double*>(lse.data);
        for (I i = 0; i < nq; ++i)
          base[b * lse.strides[0] + h * lse.strides[1] + (q0 + i) * lse.strides[2]] = l[ix(i)];
      }
    }
  }
  guard.rethrow();
}

Tile Fused::rows(const View& x, bool dir, I b, I r0, I n, I head, float* buf, const RotTab* tab,
                 I th) const {
  const I D = d_.D;
  if (dir) {
    const float* src = static_cast<const float*>(x.data) + b * x.strides[0] + r0 * x.strides[1] +
                       head * x.strides[2];
    if (!tab) return Tile{src, n == 1 ? D : x.strides[1]};
    xs_.rot_rows(src, x.strides[1], buf, n, D, tab->cos_at(b, th, r0), tab->sin_at(b, th, r0), tab->half,
                 interleaved_, false);
    if (const I rd = 2 * tab->half; rd < D)  // partial rotary: the rest as it is
      for (I r = 0; r < n; ++r) attn_fast::copy_row(buf + r * D + rd, src + r * x.strides[1] + rd, D - rd);
    return Tile{buf, D};
  }
  attn_fast::load_rows(x, D, b, r0, n, head, buf);
  if (tab) rotate(buf, n, D, *tab, b, th, r0, false);
  return Tile{buf, D};
}

void Fused::logits(I h, I q0, I nq, I j0, I nk, const Tile& Q, const Tile& K, Scratch* w,
                   const float* Kt, float* out) const {
  float* S = out ? out : w->s.data();
  const I base = (d_.k_off + j0) - (d_.q_off + q0);  // kp − qp of (row 0, col 0)
  const I bd = band(h, base);
  if (nq == 1)  // a decode step: no tile to reuse, so skip sgemm's packing
    cblas_sgemv(CblasRowMajor, CblasNoTrans, int(nk), int(d_.D), static_cast<float>(d_.scale),
                K.p, int(K.ld), Q.p, 1, 0.f, S, 1);
  else if (Kt)
    tile_gemm(gemm_, GemmForm::kNP, nq, nk, d_.D, static_cast<float>(d_.scale), Q.p, Q.ld, Kt, kLdt, S,
              kBk, bd);
  else
    tile_gemm(gemm_, GemmForm::kNT, nq, nk, d_.D, static_cast<float>(d_.scale), Q.p, Q.ld, K.p,
              K.ld, S, kBk, bd);
  finish_logits(h, q0, nq, nk, base, bd, S, w->diag.data());
}

void Fused::finish_logits(I h, I q0, I nq, I nk, I base, I bd, float* S, float* diag) const {
  if (bias_ == Bias::kLut) {  // the table's slice for this tile, read in place
    xs_.add_diag(S, nq, nk, kBk, &lut_[ix(h * lut_w_ + base - (nq - 1) - rel_lo_)]);
  } else if (bias_ == Bias::kFire) {
    fire_tile(h, q0, base, nq, nk, S, nullptr, nullptr);
  } else if (bias_ != Bias::kNone) {
    tile_bias(h, base, nq, nk, diag);
    xs_.add_diag(S, nq, nk, kBk, diag);
  }
  // kp − qp = base + j − i; past only: j ≤ i − base; future only: j ≥ i − base.
  const bool past = past_only(h), fut = future_only(h);
  if (!past && !fut) return;
  if (past && !fut && base + nk - 1 <= 0) return;  // wholly visible
  if (fut && !past && base - (nq - 1) >= 0) return;
  // a banded tile (past only) holds −inf past each row's last key up to the softmax's reach
  // (band_reach, attention_tiles.h) and zeros beyond it: the softmax and exp_rows read only that
  // reach, and the products read the zeros as P and dS
  for (I i = 0; i < nq; ++i) {
    I jl = 0, jh = nk;
    if (fut) jl = std::clamp<I>(i - base, 0, nk);
    if (past) jh = std::clamp<I>(i - base + 1, 0, nk);
    float* Si = S + i * kBk;
    if (jh < jl) jh = jl;
    std::fill(Si, Si + jl, kNegInfF);
    const I reach = std::max(jh, attn_fast::band_reach(i, bd, nk));
    std::fill(Si + jh, Si + reach, kNegInfF);
    std::fill(Si + reach, Si + nk, 0.f);
  }
}

void Fused::forward_block(I b, I h, I q0, I nq, Scratch* w, float* o, double* lse, bool careful_v,
                          bool rate_ok, const Panels* panels) const {
  const I D = d_.D, kh = h / d_.G;
  const bool rate = rate_ok && bf16_ && !careful_v && nq > 1;
  // at the rate without a rotary encoding the products read Q as pairs: q's own where its rows allow,
  // else rows rounded here (exact: q is bfloat16); under one, the float32 rows (bf16_block)
  const bool pair_q = rate && !tq_ && !tk_;
  const attn_fast::Pair* qp = pair_q ? q_pairs(b, q0, h) : nullptr;
  const I ldq = qp ? q_.strides[1] / 2 : D / 2;
  const Tile Q = qp ? Tile{nullptr, D} : rows(q_, dir_q_, b, q0, nq, h, w->q.data(), tq_, h);
  if (pair_q && !qp) {
    bf16_->round_rows(Q.p, Q.ld, nq, D, w->qb.data(), D / 2);
    qp = w->qb.data();
  }
  const I qp_min = d_.q_off + q0, qp_max = qp_min + nq - 1;
  I jlo = 0, jhi = d_.N;
  if (past_only(h)) jhi = std::clamp<I>(qp_max - d_.k_off + 1, 0, d_.N);
  if (future_only(h)) jlo = std::clamp<I>(qp_min - d_.k_off, 0, d_.N);
  float* m = w->ml.data();
  float* l = m + kBq;
  std::fill(m, m + nq, kNegInfF);
  std::fill(l, l + nq, 0.f);
  std::fill(o, o + nq * D, 0.f);
  float* S = w->s.data();
  for (I j0 = jlo; j0 < jhi; j0 += kBk) {
    const I nk = std::min(kBk, jhi - j0);
    const I bd = band(h, (d_.k_off + j0) - qp_min);
    const bool whole = panels && j0 % kBk == 0;  // a key block of the panels
    if (rate) {
      bf16_block(b, h, q0, nq, j0, nk, bd, Q, qp, ldq, w, o,
                 whole && !panels->bf16.empty() ? &panels->bf16[ix(panel_at(b, kh, j0 / kBk, bf16_panel()))]
                                                : nullptr);
      continue;
    }
    const float* kt = whole && nq > 1 && !panels->wide.empty()
                          ? &panels->wide[ix(panel_at(b, kh, j0 / kBk, wide_panel()))]
                          : nullptr;  // the key block's widened Kᵀ, then its V
    const Tile K = kt ? Tile{nullptr, D} : rows(k_, dir_k_, b, j0, nk, kh, w->k.data(), tk_, h);
    const Tile V = kt ? Tile{kt + D * kLdt, D} : rows(v_, dir_v_, b, j0, nk, kh, w->v.data(), nullptr, 0);
    logits(h, q0, nq, j0, nk, Q, K, w, kt);
    if (cf_.rows) mark_nan_rows(simd_, S, nq, nk, bd, m);  // careful steps (attention_tiles.h)
    online_softmax_step(simd_, S, nq, nk, m, l, o, D, bd);
    const bool bad_v = careful_v && sanitize_rows(V.p, V.ld, nk, D, w->vs.data());
    const Tile Vp = bad_v ? Tile{w->vs.data(), D} : V;
    if (nq == 1)
      cblas_sgemv(CblasRowMajor, CblasTrans, int(nk), int(D), 1.f, Vp.p, int(Vp.ld), S, 1, 1.f,
                  o, 1);
    else
      tile_gemm(gemm_, GemmForm::kNN, nq, D, nk, 1.f, S, kBk, Vp.p, Vp.ld, o, D, bd);
    if (bad_v) add_back_pv(S, nq, V.p, V.ld, nk, D, o, D);
  }
  online_softmax_finish(simd_, nq, m, l, o, D, lse);
  if (!careful_v && !outputs_finite(simd_, o, nq, D, lse)) forward_block(b, h, q0, nq, w, o, lse, true);
}

}  // namespace posenc::fused_cpu
