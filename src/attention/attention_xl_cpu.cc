// The fused (flash-style) Transformer-XL attention, forward and backward (attention_fused.h), on
// float32, bfloat16 and float16 q/k/v (math in float32). The dispatcher of attention_cpu.cc routes
// encoding xl here; the structure is that file's (tasks, tiles, bands, online softmax, FA2 backward).
//
//   l_ij = scale·((q_i + u_h)·k_j + (q_i + v_h)·W_h s(δ_ij)),   δ = qp − kp   (xl_math.h)
//
// ---- the position term as part of one dot product ----------------------------------------------------
//   With W_h folded into the query side, Y_i = (q_i + v_h)·W_h [R], the position term is Y_i·s(δ). Each
//   pair of s is (sin ωδ, cos ωδ); with α_i = ω·(qp_i − p0) and β_j = ω·(kp_j − p0), ωδ = α − β, and
//   the angle-difference identities give, pair by pair,
//     Y₀ sin(α − β) + Y₁ cos(α − β) = Ỹ₀ sin β + Ỹ₁ cos β,   Ỹ₀ = Y₁ sin α − Y₀ cos α,
//                                                           Ỹ₁ = Y₀ sin α + Y₁ cos α:
//   Ỹ_i is Y_i rotated by its query's angles, C_j = s(β_j/ω) = (sin β, cos β) per pair [R] depends
//   on its key alone, and the logits are tile products, S = scale·[Qu | Ỹ]·[K | C]ᵀ, Qu = Q + u_h,
//   with no per-(i, j) sinusoid: scale·Qu·Kᵀ, then scale·Ỹ·Cᵀ added (two products of inner
//   dimension D and R: a column strip of one [K | C]ᵀ of D + R = 128 rows would fill L1). p0 =
//   k_off: β is ω times the key's index in the call, α ω times the query's distance from the first
//   key. One table, shared by every head and batch, holds s(p) for those positions p (one run
//   covering queries and keys when they lie near one another, else the two runs): the rows of
//   sinusoidal_table (posenc/absolute.h), the sinusoidal encoding's fast path.
//
// ---- forward, per task (b, h, query block), OpenMP dynamic over B·Hq·⌈M/Bq⌉ ---------------------------
//   Tasks run head by head (the query blocks with the most keys first within a head), so that the
//   threads read one head's key panels while they may still be in cache (docs/performance.md).
//   Qu [Bq, D] and Ỹ [Bq, R] once per task (Y by the tile GEMM, then rotated); per key block not wholly
//   masked: [K | C]ᵀ [D + R, Bk] (K's rows transposed, tile_gemm.h; Cᵀ copied from the keys' table
//   rows transposed once per call, where that is kept, else transposed here) and V's rows, read from
//   the panels of every key block formed once per call where they are kept (key_panels), S by
//   tile_gemm's kNP and kNN forms; mask, online softmax, O += P·V as in attention_cpu.cc (without
//   panels, K and V read in place where they are float32 with unit inner stride). A causal tile
//   crossing the diagonal takes the band (tile_gemm.h) in S, the softmax and P·V; S's position term
//   there runs in blocks of kBandRows rows, each over the keys its rows see. A call of G·M ≤ Bq rows
//   whose first query sees every key (no band: a decode step) runs a task per (b, kv head) instead,
//   the G heads' rows stacked in one tile, so a key block is read and transposed once per group (per
//   part of it, where the groups are fewer than the threads).
//
// ---- backward (FlashAttention-2, recompute) -----------------------------------------------------------
//   pass 1, per (b, h, query block): the forward gives lse (or the caller's out and lse are read:
//     attention_backward_from_stats); Dᵢ = dOᵢ·outᵢ (float32 [B, Hq, M]).
//   pass 2, per (b, kv head), key blocks outer, its G query heads and their query blocks inner (one
//   task owns its dK, dV and its heads' dQ, so nothing races): K's rows copied and [K | C]ᵀ and Vᵀ
//   transposed once per key block (S and dP as kNP products, tile_gemm.h); Qu, Ỹ and dO of the
//   task's query rows formed once, each a dense [G·M, ·] array (where they fit kCacheMax, else per
//   tile: the products read their rows D or R floats apart, never at a tensor's row stride, whose
//   rows share few L1 sets); per query tile S and P recomputed; dP = dO·Vᵀ; dV += Pᵀ·dO;
//   dS = P ⊙ (dP − D); with c = scale·dS:
//     dK += cᵀ·Qu;   dQc += c·K;   X̃ += c·C   (per row, over the key blocks; dQc in dq itself
//   where dq is float32 with unit inner stride, else in a buffer), every product banded on a causal
//   diagonal tile. C is fixed, so dK has no position term. The position term's gradients are linear
//   in X̃_i = Σ_j c_ij C_j, so they are formed once per row at the end of the task: X_i = Σ_j c_ij s(δ_ij) is X̃_i rotated back (the transposed rotation), and
//     dQ = dQc + X·W_hᵀ;   du_h = Σ_i dQc_i;   dv_h = W_h·Σ_i X_i;   dW_h = (Q + v_h)ᵀ·X
//   (du_h = Σ c_ij k_j, dv_h = Σ c_ij W_h s(δ_ij), dW_h = Σ c_ij (q_i + v_h) s(δ_ij)ᵀ). The parameter
//   gradients are summed per (b, h) in double from per-block float products, then over the batch.
//
// ---- non-finite inputs -------------------------------------------------------------------------------
//   The careful steps of attention_tiles.h, decided as there (Qu and [K | C] sanitized for dK and dQ
//   in a careful tile). Q + v_h is sanitized for dW always: a non-finite q_i makes its logits NaN or
//   ±inf, so its row of c is NaN or 0 and X_i is NaN or 0 — replacing it changes no finite result.
//
// ---- memory (extra to inputs and outputs) --------------------------------------------------------------
//   the table: R floats per position of the queries and keys, at most (M + N)·R (self-attention at
//   L = 65536, R = 64: L·R, 16.8 MB), and its keys' rows transposed, N·R (the backward, and a
//   forward without panels), where that is at most kCacheMax (8 MiB); per thread O((Bq + Bk)·(D +
//   R) + Bq·Bk) floats (≈ 0.3 MB at D = R = 64); backward: lse and D, 2·B·Hq·M floats; per thread
//   X̃ of one task, G·M·R floats (16.8 MB at M = 65536, R = 64, G = 1), and dQc, G·M·D floats,
//   where it is not summed in dq; per thread Qu, Ỹ and dO of one task, G·M·(2D + R) floats, where
//   that is at most kCacheMax (8 MiB); the forward's panels ([K | C]ᵀ and V per key block), up to
//   4·kCacheMax (32 MiB); per (b, h) the gradients of u, v, W in double, B·Hq·(D + R + D·R); W_hᵀ,
//   Hq·D·R floats.
//
// ---- precision ----------------------------------------------------------------------------------------
//   Products and accumulations in float32: the tile products by tile_gemm() as in attention_cpu.cc
//   (tile_gemm.h: the Highway small GEMM while the dimension, D or R, is ≤ kTileGemmMaxD, else
//   OpenBLAS), Y and the once-per-row ones (X·W_hᵀ, dW_h) too (the small GEMM where D and R both
//   are); sin and cos by sinusoidal_table (angles in double; within 3e-7 of sin and cos of the
//   rounded angle, the bounds stated in sinusoidal_kernels.cc), the rotations in float; lse carried in
//   float32 in the backward; dQc and X̃ summed over the key blocks in float32 (as dQ in
//   attention_cpu.cc); the parameter gradients across blocks and the batch in double. The reference
//   rounds the angle ωδ once; this kernel rounds α and β: where a query lies far from the first key
//   (|qp − k_off| ≫ 2^20), the two roundings differ by about ulp(ω·|qp − k_off|), the size of the
//   reference's own angle error at such a distance.

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "attention/attention_tiles.h"
#include "attention/attention_xl_fused.h"
#include "attention/tile_gemm.h"
#include "posenc/absolute.h"
#include "enc/bias/xl/xl_math.h"

namespace posenc::fused::xl_cpu {

std::atomic<I> cache_limit{kCacheMax};

XlFused::XlFused(const AttentionParams& p, const Dims& d, const View& q, const View& k, const View& v,
                 const EncodingTensors& t, int threads)
    : p_(p), d_(d), q_(q), k_(k), v_(v), threads_(threads), simd_(simd()),
               gemm_(tile_gemm_for(d.D)), gemm_r_(tile_gemm_for(d.R)),
               gemm_w_(gemm_ && gemm_r_ ? tile_gemm_fn() : nullptr) {
  const std::vector<double> u = to_doubles(t.u), vb = to_doubles(t.v), w = to_doubles(t.rel_proj);
  u_.assign(u.begin(), u.end());
  vb_.assign(vb.begin(), vb.end());
  w_.assign(w.begin(), w.end());
  wt_.resize(w_.size());  // W_hᵀ per head
  for (I h = 0; h < d.Hq; ++h) tr_(&w_[ix(h * d.D * d.R)], d.R, d.D, d.R, &wt_[ix(h * d.R * d.D)], d.D);
  w64_ = w;
  table_ = build_table();
  cf_ = careful_forward(simd_, d, k, threads);
  dir_k_ = direct(k);
  dir_v_ = direct(v);
}

Status XlFused::build_table() {
  const I M = d_.M, N = d_.N, R = d_.R, dq = d_.q_off - d_.k_off;
  const I lo = std::min<I>(0, dq), hi = std::max<I>(N, dq + M);
  I start0 = dq, n0 = M, start1 = 0, n1 = N;  // rows [0, n0) from start0, then n1 from start1
  if (hi - lo <= M + N) start0 = lo, n0 = hi - lo, n1 = 0;
  qrow_ = dq - start0;
  krow_ = n1 > 0 ? n0 : -start0;
  tab_.assign(ix((n0 + n1) * R), 0.f);
  const SinusoidalParams sp{xl::kBase};
  for (const auto& [start, n, at] : {std::tuple<I, I, I>{start0, n0, 0}, {start1, n1, n0}}) {
    if (n == 0) continue;
    const Positions pos{View{}, start};
    POSENC_RETURN_IF_ERROR(sinusoidal_table(sp, pos, View::contiguous(&tab_[ix(at * R)], DType::kF32, {n, R})));
  }
  return Status::Ok();
}

void XlFused::transpose_keys() {
  if (d_.N == 0 || d_.R * d_.N > cache_limit.load()) return;
  ct_.resize(ix(d_.R * d_.N));
  tr_(tk(0), d_.R, d_.N, d_.R, ct_.data(), d_.N);
}

bool XlFused::direct(const View& x) const {
  return x.dtype == DType::kF32 && (x.strides[3] == 1 || d_.D == 1) &&
         (x.shape[1] == 1 || (x.strides[1] >= d_.D && x.strides[1] <= INT_MAX));
}

bool XlFused::direct_out(const View& x) const {
  const I D = d_.D, H = d_.Hq;
  if (x.dtype != DType::kF32 || x.strides[3] != 1) return false;
  if (x.shape[1] > 1 && (x.strides[1] < D || x.strides[1] > INT_MAX)) return false;
  if (H > 1 && x.strides[2] < D) return false;
  const I row = (H - 1) * x.strides[2] + D;
  if (x.shape[1] > 1 && x.strides[1] < row) return false;
  return x.shape[0] == 1 || x.strides[0] >= (x.shape[1] - 1) * x.strides[1] + row;
}

void XlFused::load_q(I b, I h, I i0, I nq, Scratch* w, float* qc, float* yt) const {
  const I D = d_.D, R = d_.R;
  float* qv = w->qv.data();
  float* y = w->y.data();
  load_rows(q_, D, b, i0, nq, h, qv);
  for (I i = 0; i < nq; ++i) {
    copy_row(qc + i * D, qv + i * D, D);
    simd_.add_to(qc + i * D, &u_[ix(h * D)], ix(D));
    simd_.add_to(qv + i * D, &vb_[ix(h * D)], ix(D));
  }
  tile_gemm(gemm_w_, GemmForm::kNP, nq, R, D, 1.f, qv, D, &w_[ix(h * D * R)], R, y, R);
  for (I i = 0; i < nq; ++i) {
    const float* t = tq(i0 + i);
    const float* yi = y + i * R;
    float* o = yt + i * R;
    for (I c = 0; c < R; c += 2)  // t = (sin α, cos α)
      xl::to_key_frame(yi[c], yi[c + 1], t[c], t[c + 1], &o[c], &o[c + 1]);
  }
}

void XlFused::load_keys_t(I b, I kh, I j0, I nk, Scratch* w, float* kt) const {
  const I D = d_.D;
  if (dir_k_) {
    const float* K = static_cast<const float*>(k_.data) + b * k_.strides[0] + j0 * k_.strides[1] + kh * k_.strides[2];
    keys_t(K, k_.strides[1], j0, nk, kt);
  } else {
    load_rows(k_, D, b, j0, nk, kh, w->kc.data());
    keys_t(w->kc.data(), D, j0, nk, kt);
  }
}

void XlFused::keys_t(const float* K, I ldk, I j0, I nk, float* kt) const {
  tr_(K, ldk, nk, d_.D, kt, kLdt);
  c_t(j0, nk, kt + d_.D * kLdt);
}

void XlFused::c_t(I j0, I nk, float* ct) const {
  if (ct_.empty()) tr_(tk(j0), d_.R, nk, d_.R, ct, kLdt);
  else for (I c = 0; c < d_.R; ++c) copy_row(ct + c * kLdt, &ct_[ix(c * d_.N + j0)], nk);
}

std::unique_ptr<float[]> XlFused::key_panels() const {
  const I nkb = (d_.N + kBk - 1) / kBk, n = d_.B * d_.Hkv * nkb, per = panel_size();
  const I readers = d_.G * ((d_.M + kBq - 1) / kBq);
  if (n == 0 || readers < 2 || n * per > kPanelFactor * cache_limit.load()) return nullptr;
  std::unique_ptr<float[]> panels(new float[ix(n * per)]);
  RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    Scratch w;
    guard.run([&] { w.kc.resize(ix(kBk * (d_.D + d_.R))); });
#pragma omp for schedule(static)
    for (I t = 0; t < n; ++t) {
      if (guard.failed()) continue;
      const I kb = t % nkb, bk = t / nkb, j0 = kb * kBk;
      float* pan = panels.get() + t * per;
      load_keys_t(bk / d_.Hkv, bk % d_.Hkv, j0, std::min(kBk, d_.N - j0), &w, pan);
      load_rows(v_, d_.D, bk / d_.Hkv, j0, std::min(kBk, d_.N - j0), bk % d_.Hkv, pan + (d_.D + d_.R) * kLdt);
    }
  }
  guard.rethrow();
  return panels;
}

I XlFused::logits(I q0, I nq, I j0, I nk, const float* qu, const float* yt, const float* kt, Scratch* w) const {
  float* S = w->s.data();
  const I base = (d_.k_off + j0) - (d_.q_off + q0);  // kp − qp of (row 0, col 0)
  const I bd = band(base, nk);
  const float sc = static_cast<float>(d_.scale);
  // two products of inner dimension D and R rather than one of D + R: a 64-column strip of the
  // panel then fits L1 (at D = R = 64, 16 KB instead of 32 KB)
  tile_gemm(gemm_, GemmForm::kNP, nq, nk, d_.D, sc, qu, d_.D, kt, kLdt, S, kBk, bd);
  const float* ct = kt + d_.D * kLdt;
  if (bd >= kNoBand) {
    tile_gemm(gemm_r_, GemmForm::kNN, nq, nk, d_.R, sc, yt, d_.R, ct, kLdt, S, kBk);
    return bd;
  }
  // banded: the position term in blocks of kBandRows rows, each over the keys its last row sees
  // (rounded up to a vector of 16; the masking below overwrites what lies past a row's keys)
  for (I r0 = 0; r0 < nq; r0 += kBandRows) {
    const I nr = std::min(kBandRows, nq - r0);
    const I nc = std::min(nk, (std::clamp<I>(r0 + nr - base, 0, nk) + 15) / 16 * 16);
    if (nc > 0) tile_gemm(gemm_r_, GemmForm::kNN, nr, nc, d_.R, sc, yt + r0 * d_.R, d_.R, ct, kLdt, S + r0 * kBk, kBk);
  }
  for (I i = 0; i < nq; ++i) {  // causal: row i sees keys j ≤ i − base
    float* Si = S + i * kBk;
    const I jh = std::clamp<I>(i - base + 1, 0, nk), reach = std::max(jh, band_reach(i, bd, nk));
    std::fill(Si + jh, Si + reach, kNegInfF);
    std::fill(Si + reach, Si + nk, 0.f);
  }
  return bd;
}

}  // namespace posenc::fused::xl_cpu

namespace posenc::fused {

using attn_fast::threads_for;
using xl_cpu::XlFused;

bool xl_fused() { return true; }

void xl_set_cache_limit(std::int64_t floats) { xl_cpu::cache_limit.store(floats < 0 ? xl_cpu::kCacheMax : floats); }

Status xl_forward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k,
                  const View& v, const EncodingTensors& t, const View& out, const View& lse) {
  XlFused f(p, d, q, k, v, t, threads_for(d));
  POSENC_RETURN_IF_ERROR(f.status());
  f.forward(out, lse);
  return Status::Ok();
}

Status xl_backward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k,
                   const View& v, const EncodingTensors& t, const View& dout, const View& dq,
                   const View& dk, const View& dv, const EncodingGrads& g, const View* saved_out,
                   const View* saved_lse) {
  XlFused f(p, d, q, k, v, t, threads_for(d));
  POSENC_RETURN_IF_ERROR(f.status());
  f.backward(dout, dq, dk, dv, g, saved_out, saved_lse);
  return Status::Ok();
}

}  // namespace posenc::fused

