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

#include "attention/attention_fused.h"
#include "attention/attention_tiles.h"
#include "attention/tile_gemm.h"
#include "posenc/absolute.h"
#include "enc/bias/xl/xl_math.h"

namespace posenc::fused {
namespace {

using attn::Dims;
using namespace attn_fast;  // NOLINT: the shared tile machinery

// Per-thread scratch (Dc = D + R).
struct Scratch {
  std::vector<float> qc, qv, y, kc, v, s, o, ml;  // forward: Qu then Ỹ, Q + v_h, Y, K's rows, …
  std::vector<float> dp, dout, dk, dv, x, dw, bs;  // backward (bs: a block's sums, finish_rows)
  std::vector<float> kt, vt;                      // [K | C]ᵀ [D + R, kLdt]; backward: Vᵀ [D, kLdt]
  std::vector<float> sq, sk, sv, sd;              // careful steps: sanitized Qu, [K | C], V, dO
  void init(I D, I R) {
    qc.resize(ix(kBq * (D + R)));
    qv.resize(ix(kBq * D));
    y.resize(ix(kBq * R));
    kc.resize(ix(kBk * (D + R)));
    v.resize(ix(kBk * D));
    s.resize(ix(kBq * kBk));
    o.resize(ix(kBq * D));
    ml.resize(ix(2 * kBq));
    sv.resize(ix(kBk * D));
    kt.resize(ix((D + R) * kLdt));
  }
  void init_backward(I D, I R) {
    dp.resize(ix(kBq * kBk));
    dout.resize(ix(kBq * D));
    dk.resize(ix(kBk * D));
    dv.resize(ix(kBk * D));
    x.resize(ix(kBq * R));
    dw.resize(ix(D * R));
    bs.resize(ix(D + R));
    sq.resize(ix(kBq * D));
    sk.resize(ix(kBk * (D + R)));
    sd.resize(ix(kBq * D));
    vt.resize(ix(D * kLdt));
  }
};

// The most floats (8 MiB) of each of two buffers kept for speed: the keys' C transposed (N·R, once
// per call; else each key block's transposed from the table) and, in the backward, Qu, Ỹ and dO of a
// task's query rows (G·M·(2D + R) per thread; else each tile's formed again).
constexpr I kCacheMax = I{1} << 21;
std::atomic<I> cache_limit{kCacheMax};  // xl_set_cache_limit()
// A third, the forward's [K | C]ᵀ and V of every key block (key_panels, B·Hkv·N·(2D + R) floats and
// the row padding, once per call; else each block's transposed once per query block): up to
// kPanelFactor·cache_limit floats (32 MiB: 26 MiB at L = 4096, Hkv = 8, D = R = 64).
constexpr I kPanelFactor = 4;
// Rows per block of a causal diagonal tile's position term (logits).
constexpr I kBandRows = 24;

class XlFused {
 public:
  XlFused(const AttentionParams& p, const Dims& d, const View& q, const View& k, const View& v,
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

  // The angle table's Status: the calls below need it ok.
  const Status& status() const { return table_; }

  // Forward over every (b, h, query block); out [B, M, Hq, D], lse optional [B, Hq, M] float64. A
  // short call (a decode step) whose tiles need no band runs a task per (b, kv head, part of its G
  // heads), the part's rows stacked in one tile, so each key block is transposed and read once per
  // part: one part per group, or more where B·Hkv tasks would leave threads idle.
  void forward(const View& out, const View& lse) {
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

  // Backward. dq, dk, dv optional (absent: computed, not stored); g's views optional. With
  // saved_out and saved_lse, pass 1 reads them instead of running the forward.
  void backward(const View& dout, const View& dq, const View& dk, const View& dv,
                const EncodingGrads& g, const View* saved_out = nullptr,
                const View* saved_lse = nullptr) {
    transpose_keys();  // for pass 2's key blocks, and pass 1's panels
    const I B = d_.B, M = d_.M, N = d_.N, Hq = d_.Hq, D = d_.D, G = d_.G, R = d_.R;
    // the careful steps on every tile (attention_tiles.h): k or v not finite
    const bool careful_all = (cf_.k_known ? !cf_.k_finite : !all_finite(simd_, k_, threads_)) ||
                             !all_finite(simd_, v_, threads_);
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
        // dQc of head kh·G + gi, row i at qbase + gi·qhs + i·qld
        float* qbase = qacc.data();
        I qld = D, qhs = M * D;
        if (dq_dir) {
          qbase = static_cast<float*>(dq.data) + b * dq.strides[0] + kh * G * dq.strides[2];
          qld = M == 1 ? D : dq.strides[1];
          qhs = dq.strides[2];
          for (I gi = 0; gi < G; ++gi)
            for (I i = 0; i < M; ++i) std::fill(qbase + gi * qhs + i * qld, qbase + gi * qhs + i * qld + D, 0.f);
        }
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

 private:
  // Pass 1: lse and D = rowsum(dO ⊙ out) of every row, [B, Hq, M], from the forward again (careful:
  // its careful steps on every tile) or read from saved_out and saved_lse.
  void pass1(const View& dout, const View* saved_out, const View* saved_lse, bool careful, std::vector<float>* lse,
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

  // What pass 1 gives the tiles of pass 2: lse and D [B, Hq, M], and whether every tile takes the
  // careful steps (k or v not finite).
  struct Tiles {
    const float* lse;
    const float* Dv;
    bool careful;
  };

  // One tile of pass 2: head h's query rows [i0, i0 + nq) (Qu qc [nq, D], Ỹ yt [nq, R], dO [nq, D])
  // against keys [j0, j0 + nk) (w->kc, [K | C]ᵀ w->kt, Vᵀ w->vt, C [nk, R]): dV, dK of the block
  // (w->dv, w->dk), dQc (dq, row stride ldq) and X̃ (xt [nq, R]) added, every product banded on a
  // causal diagonal tile.
  void tile(const Tiles& t, I b, I h, I i0, I nq, I j0, I nk, float* qc, const float* yt, const float* dO,
            const float* C, float* dq, I ldq, float* xt, Scratch* w) const {
    const I D = d_.D, R = d_.R, M = d_.M, Hq = d_.Hq;
    const float sc = static_cast<float>(d_.scale);
    float* S = w->s.data();
    float* dP = w->dp.data();
    // banded (tile_gemm.h): P and dS formed on each row's reach and visible keys, the
    // masked ones keeping logits' zeros; dP's masked entries may stay unset
    const I bd = logits(i0, nq, j0, nk, qc, yt, w->kt.data(), w);
    const float* L = &t.lse[ix((b * Hq + h) * M + i0)];
    const float* Di = &t.Dv[ix((b * Hq + h) * M + i0)];
    simd_.exp_rows(S, nq, nk, kBk, L, bd);  // P
    tile_gemm(gemm_, GemmForm::kNP, nq, nk, D, 1.f, dO, D, w->vt.data(), kLdt, dP, kBk, bd);
    // careful (attention_tiles.h): the products read sanitized dO, Qu, K; dO's non-finite
    // entries' terms added back into dV; dS 0 where P is
    const bool careful = t.careful || careful_rows(L, Di, nq);
    const bool bad_do = careful && sanitize_rows(dO, D, nq, D, w->sd.data());
    if (bad_do) tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, 1.f, S, kBk, w->sd.data(), D, w->dv.data(), D, bd);
    else tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, 1.f, S, kBk, dO, D, w->dv.data(), D, bd);
    if (bad_do) add_back_ptdo(S, nq, nk, dO, D, D, w->dv.data());
    for (I i = 0; i < nq; ++i) {
      const I n = std::clamp<I>(i + bd + 1, 0, nk);
      if (careful) careful_ds(S + i * kBk, dP + i * kBk, n, Di[i]);
      else simd_.ds_row(S + i * kBk, dP + i * kBk, ix(n), Di[i]);
    }
    // S now holds dS; c = scale·dS.
    const bool bad_q = careful && sanitize_rows(qc, D, nq, D, w->sq.data());
    tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, sc, S, kBk, bad_q ? w->sq.data() : qc, D, w->dk.data(),
              D, bd);
    const bool bad_k = careful && sanitize_rows(w->kc.data(), D, nk, D, w->sk.data());
    const float* K = bad_k ? w->sk.data() : w->kc.data();
    tile_gemm(gemm_, GemmForm::kNN, nq, D, nk, sc, S, kBk, K, D, dq, ldq, bd);
    tile_gemm(gemm_r_, GemmForm::kNN, nq, R, nk, sc, S, kBk, C, R, xt, R, bd);
  }

  // The angle table tab_ [rows, R]: s(p) = per pair (sin ω·p, cos ω·p), sinusoidal_table's rows, for
  // the positions p relative to k_off of the queries, q_off − k_off + i, and of the keys, j. One run
  // of positions covers both where it is no longer than M + N rows (queries near their keys), else
  // the queries' M rows come first and the keys' N rows after them.
  Status build_table() {
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

  // After the table: ct_ [R, N] = the keys' rows transposed (Cᵀ, read a key block at a time), where
  // it takes at most cache_limit floats (else empty).
  void transpose_keys() {
    if (d_.N == 0 || d_.R * d_.N > cache_limit.load()) return;
    ct_.resize(ix(d_.R * d_.N));
    tr_(tk(0), d_.R, d_.N, d_.R, ct_.data(), d_.N);
  }

  // The table rows of query row i (cos α, sin α) and key j (cos β, sin β): a key's row is its C.
  const float* tq(I i) const { return &tab_[ix((qrow_ + i) * d_.R)]; }
  const float* tk(I j) const { return &tab_[ix((krow_ + j) * d_.R)]; }

  // Whether rows of x [B, L, H, D] can be read in place: float32, unit inner stride, a row stride
  // ≥ D that fits an int (or a single row).
  bool direct(const View& x) const {
    return x.dtype == DType::kF32 && (x.strides[3] == 1 || d_.D == 1) &&
           (x.shape[1] == 1 || (x.strides[1] >= d_.D && x.strides[1] <= INT_MAX));
  }

  // Whether dq [B, M, Hq, D] can take the tile products' sums in place (as attention_cpu.cc):
  // float32, unit inner stride, row strides within int, its (b, row, head) rows disjoint.
  bool direct_out(const View& x) const {
    const I D = d_.D, H = d_.Hq;
    if (x.dtype != DType::kF32 || x.strides[3] != 1) return false;
    if (x.shape[1] > 1 && (x.strides[1] < D || x.strides[1] > INT_MAX)) return false;
    if (H > 1 && x.strides[2] < D) return false;
    const I row = (H - 1) * x.strides[2] + D;
    if (x.shape[1] > 1 && x.strides[1] < row) return false;
    return x.shape[0] == 1 || x.strides[0] >= (x.shape[1] - 1) * x.strides[1] + row;
  }

  // Q rows [i0, i0 + nq) of head h, read once: qc [nq, D] = Q + u_h, and yt [nq, R] = Ỹ, Y = (Q + v_h)·W_h
  // with each pair rotated by its row's angle (Ỹ₀ = Y₀ sin α + Y₁ cos α, Ỹ₁ = Y₁ sin α − Y₀ cos α).
  // Q + v_h is left in w->qv.
  void load_q(I b, I h, I i0, I nq, Scratch* w, float* qc, float* yt) const {
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

  // Keys [j0, j0 + nk) of kv head kh: kt [D + R, kLdt] = [K | C]ᵀ, transposed straight from k
  // where it is read in place (else from its rows loaded into w->kc), and C's rows from ct_ (where
  // kept, else transposed from the table).
  void load_keys_t(I b, I kh, I j0, I nk, Scratch* w, float* kt) const {
    const I D = d_.D;
    if (dir_k_) {
      const float* K = static_cast<const float*>(k_.data) + b * k_.strides[0] + j0 * k_.strides[1] + kh * k_.strides[2];
      keys_t(K, k_.strides[1], j0, nk, kt);
    } else {
      load_rows(k_, D, b, j0, nk, kh, w->kc.data());
      keys_t(w->kc.data(), D, j0, nk, kt);
    }
  }

  // kt [D + R, kLdt] = [K | C]ᵀ of keys [j0, j0 + nk) from their rows K (row stride ldk).
  void keys_t(const float* K, I ldk, I j0, I nk, float* kt) const {
    tr_(K, ldk, nk, d_.D, kt, kLdt);
    c_t(j0, nk, kt + d_.D * kLdt);
  }

  // ct [R, kLdt] = Cᵀ of keys [j0, j0 + nk): ct_'s rows where kept, else the table's transposed.
  void c_t(I j0, I nk, float* ct) const {
    if (ct_.empty()) tr_(tk(j0), d_.R, nk, d_.R, ct, kLdt);
    else for (I c = 0; c < d_.R; ++c) copy_row(ct + c * kLdt, &ct_[ix(c * d_.N + j0)], nk);
  }

  // Per key block [B, Hkv, ⌈N/Bk⌉], [K | C]ᵀ [D + R, kLdt] (load_keys_t's tiles; columns past a
  // block's keys unset) and V's rows [Bk, D] (dense for P·V, which reads a row per step: in place,
  // rows Hkv·D floats apart share few L1 sets), for the forward's tasks, which would otherwise
  // transpose each block once per query block of each of its G heads; null where that is once
  // (nothing to save) or where it would take more than kPanelFactor·cache_limit floats.
  I panel_size() const { return (d_.D + d_.R) * kLdt + kBk * d_.D; }
  std::unique_ptr<float[]> key_panels() const {
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

  // The band of the tile whose key 0 − query 0 distance is base (tile_gemm.h): causal tiles
  // crossing the diagonal.
  I band(I base, I nk) const { return p_.causal && base + nk - 1 > 0 ? -base : kNoBand; }

  // w->s [nq, Bk] = scale·[Qu | Ỹ]·[K | C]ᵀ of qc [nq, D + R] and kt = [K | C]ᵀ [D + R, kLdt] (the
  // kNP form). A banded tile (returned) holds −inf past each row's last visible key up to the
  // softmax's reach (band_reach, attention_tiles.h) and zeros beyond it, which the products read as
  // P and dS.
  I logits(I q0, I nq, I j0, I nk, const float* qu, const float* yt, const float* kt, Scratch* w) const {
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

  // Rows [q0, q0 + nq) of heads h … h + nh − 1 (of one kv group; nh > 1 only where no tile needs a
  // band): w->o [nh·nq, D] = softmax(logits)·V, lse [nh·nq], head by head.
  // careful_v: P·V of the sanitized V, its non-finite entries' terms added back (attention_tiles.h) —
  // taken again with it when a row of finite lse comes out non-finite (a NaN or ±inf in V).
  void forward_block(I b, I h, I nh, I q0, I nq, Scratch* w, double* lse, const float* panels,
                     bool careful_v = false) const {
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

  // The end of pass 2 for head h: qa (row stride ld) holds dQc of its M rows, xt [M, R] X̃. X = X̃
  // rotated back (X₀ = X̃₀ sin α − X̃₁ cos α, X₁ = X̃₀ cos α + X̃₁ sin α); qa += X·W_hᵀ (dQ), stored
  // into dq when given; into gph (du [D], Σ X [R], dW [D, R]) Σ_i dQc_i, Σ_i X_i and (Q + v_h)ᵀ·X,
  // Q + v_h sanitized: each summed in float over a block of kBq rows, the blocks in double.
  void finish_rows(I b, I h, float* qa, I ld, const float* xt_all, Scratch* w, double* gph,
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

  // g.u = Σ_b du, g.v = W_h·Σ_b Σ X, g.rel_proj = Σ_b dW, from gp [B, Hq, D + R + D·R].
  void write_param_grads(const std::vector<double>& gp, const EncodingGrads& g) const {
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

  const AttentionParams& p_;
  Dims d_;
  View q_, k_, v_;
  int threads_ = 1;
  Simd simd_;
  TileGemmFn gemm_;    // the tile products' GEMM of dimension D (tile_gemm.h)
  TileGemmFn gemm_r_;  // of dimension R: S's position term, X̃
  TileGemmFn gemm_w_;  // the products with W_h (Y, X·W_hᵀ, dW_h), of dimensions D and R
  std::vector<float> u_, vb_, w_, wt_;  // u, v [Hq, D]; W [Hq, D, R] as float; Wᵀ [Hq, R, D]
  std::vector<double> w64_;         // W as given, for dv = W·Σ X in double
  std::vector<float> tab_;          // the angle table (build_table)
  std::vector<float> ct_;           // the keys' C transposed, [R, N], or empty (transpose_keys)
  I qrow_ = 0, krow_ = 0;           // its rows of query 0 and key 0
  Status table_;       // build_table()'s
  CarefulForward cf_;  // how the forward finds NaN rows (attention_tiles.h)
  bool dir_k_ = false, dir_v_ = false;  // the forward reads K's and V's rows in place (direct())
  TileTransposeFn tr_ = tile_transpose_fn();
};

}  // namespace

bool xl_fused() { return true; }

void xl_set_cache_limit(std::int64_t floats) { cache_limit.store(floats < 0 ? kCacheMax : floats); }

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
