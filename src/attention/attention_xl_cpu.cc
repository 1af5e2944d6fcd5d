// The fused (flash-style) Transformer-XL attention, forward and backward (attention_fused.h), on
// float32, bfloat16 and float16 q/k/v (math in float32). The dispatcher of attention_cpu.cc routes
// encoding xl here; the structure is that file's (tasks, tiles, online softmax, FA2 backward).
//
//   l_ij = scale·((q_i + u_h)·k_j + (q_i + v_h)·W_h s(δ_ij)),   δ = qp − kp   (xl_math.h)
//
// The projection W_h [D, R] is folded into the query side, Y_i = scale·(q_i + v_h)·W_h [R], so the
// position term is Y_i·s(δ_ij) and one sinusoid table serves every head and batch: no per-head
// table r_h(δ) = W_h s(δ) is ever formed.
//
// ---- the sinusoid table ----------------------------------------------------------------------------
//   S[e] = s(δ) in float for ρ = kp − qp = ρ_lo + e (δ = −ρ), angles formed in double as in the
//   reference (sinusoid_math.h), rounded once. Rows run in increasing ρ, so the ρ values of a tile
//   (query block × key block) are a contiguous slice, and query row i of the tile reads a contiguous,
//   forward slice of it. It covers every ρ of the problem, [k_off − q_off − (M − 1), k_off + N − 1 −
//   q_off], causal: only up to Bq + Bk − 2 (the overhang of a diagonal tile past ρ = 0).
//
// ---- forward, per task (b, h, query block), OpenMP dynamic over B·Hq·⌈M/Bq⌉ ---------------------------
//   Qu = Q + u_h, Y = scale·(Q + v_h)·W_h [Bq, R] (cblas_sgemm), once per task; per key block not
//   wholly masked:
//     S = scale·Qu·Kᵀ (tile_gemm), + position term: the tile's ρ slice has Bq + Bk − 1 rows but row
//     i needs only Bk of them (a band), so the query rows go in sub-blocks of kSub: one tile_gemm
//     T = Y_sub·S_sliceᵀ [kSub, kSub + Bk − 1] each, row i adding its contiguous slice of T into S
//     (≈ 1.24 times the work of Q·Kᵀ at kSub = 32, instead of 2 for the whole slice);
//     mask, online softmax, O += P·V as in attention_cpu.cc. A causal tile crossing the diagonal
//     takes the band (tile_gemm.h) in Q·Kᵀ, the softmax and P·V, and forms T only up to the last
//     column its visible keys read (about half the work of such a tile; measured with posenc bench
//     at L = 4096, four alternating runs: forward 1.79–1.87× nope's time → 1.64–1.75×).
//
// ---- backward (FlashAttention-2, recompute) -----------------------------------------------------------
//   pass 1, per (b, h, query block): the forward gives lse (or the caller's out and lse are read:
//     attention_backward_from_stats); Dᵢ = dOᵢ·outᵢ (float32 [B, Hq, M]).
//   pass 2, per (b, kv head), key blocks outer, its G query heads and their query blocks inner (one
//   task owns its dK, dV and its heads' dQ, so nothing races): S and P recomputed; dP = dO·Vᵀ;
//   dV += Pᵀ·dO; dS = P ⊙ (dP − D); with c = scale·dS:
//     dK += cᵀ·Qu;   dQ += c·K + X·W_hᵀ,   X = c_skew·S_slice [Bq, R]  (X_i = Σ_j c_ij s(δ_ij), the
//       skewed c placed in ρ coordinates, sub-blocks as in the forward);
//     du_h += Σ_j (Σ_i c_ij) k_j;   dv_h = W_h·Σ_i X_i;   dW_h += (Q + v_h)ᵀ·X
//   (since dv_h = Σ c_ij W_h s(δ_ij) and dW_h = Σ c_ij (q_i + v_h) s(δ_ij)ᵀ). The parameter gradients
//   are summed per (b, h) in double from per-tile float products, then over the batch at the end.
//
// ---- non-finite inputs -------------------------------------------------------------------------------
//   The careful steps of attention_tiles.h, decided as there (Qu, Qv and K sanitized for dK, dW and
//   dQ in the backward).
//
// ---- memory (extra to inputs and outputs) --------------------------------------------------------------
//   the table: (number of ρ)·R floats — at L = M = N = 65536, R = 64: 33.5 MB, causal 16.8 MB;
//   per thread O((Bq + Bk)·(D + R) + Bq·Bk) floats (≈ 0.3 MB at D = R = 64);
//   backward: lse and D, 2·B·Hq·M floats; per thread dQ of one task, G·M·D floats (16.8 MB at
//   M = 65536, D = 64, G = 1; as attention_cpu.cc); per (b, h) the gradients of u, v, W in double,
//   B·Hq·(D + R + D·R).
//
// ---- precision ----------------------------------------------------------------------------------------
//   Products and accumulations in float32: the tile products (S, T, P·V; dP, dV, dK, dQ's c·K) by
//   tile_gemm() as in attention_cpu.cc (tile_gemm.h: the Highway small GEMM while D and R are
//   ≤ kTileGemmMaxD, else OpenBLAS), the once-per-task ones (Y, X, X·W_hᵀ, dW_h) by OpenBLAS's
//   sgemm; the sinusoid from double angles rounded
//   to float (error ≤ 6e-8 + the angle's own, see README), lse carried in float32 in the backward;
//   the parameter gradients accumulate per tile in float32, across tiles and the batch in double.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/attention_fused.h"
#include "attention/attention_tiles.h"
#include "attention/tile_gemm.h"
#include "enc/bias/xl/xl_math.h"

namespace posenc::fused {
namespace {

using attn::Dims;
using namespace attn_fast;  // NOLINT: the shared tile machinery

// Query rows per sgemm of the skewed (position) products: smaller wastes less of the band's
// triangle corners, larger runs the sgemm closer to peak; 32 measured best at D = R = 64.
constexpr I kSub = 32;

// Per-thread scratch.
struct Scratch {
  std::vector<float> qu, qv, y, k, v, s, o, ml, t;  // forward
  std::vector<float> dp, dout, dk, dv, x, dw;      // backward
  std::vector<float> sq, sk, sv, sd;               // careful steps: sanitized Qu or Qv, K, V, dO
  void init(I D, I R) {
    qu.resize(ix(kBq * D));
    qv.resize(ix(kBq * D));
    y.resize(ix(kBq * R));
    k.resize(ix(kBk * D));
    v.resize(ix(kBk * D));
    s.resize(ix(kBq * kBk));
    o.resize(ix(kBq * D));
    ml.resize(ix(2 * kBq));
    t.resize(ix(kSub * (kSub + kBk - 1)));
    sv.resize(ix(kBk * D));
  }
  void init_backward(I D, I R) {
    dp.resize(ix(kBq * kBk));
    dout.resize(ix(kBq * D));
    dk.resize(ix(kBk * D));
    dv.resize(ix(kBk * D));
    x.resize(ix(kBq * R));
    dw.resize(ix(D * R));
    sq.resize(ix(kBq * D));
    sk.resize(ix(kBk * D));
    sd.resize(ix(kBq * D));
  }
};

class XlFused {
 public:
  XlFused(const AttentionParams& p, const Dims& d, const View& q, const View& k, const View& v,
          const EncodingTensors& t, int threads)
      : p_(p), d_(d), q_(q), k_(k), v_(v), threads_(threads), simd_(simd()),
        gemm_(tile_gemm_for(std::max(d.D, d.R))) {
    const std::vector<double> u = to_doubles(t.u), vb = to_doubles(t.v), w = to_doubles(t.rel_proj);
    u_.assign(u.begin(), u.end());
    vb_.assign(vb.begin(), vb.end());
    w_.assign(w.begin(), w.end());
    w64_ = w;
    build_table();
    cf_ = careful_forward(simd_, d, k, threads);
  }

  // Forward over every (b, h, query block); out [B, M, Hq, D], lse optional [B, Hq, M] float64.
  void forward(const View& out, const View& lse) const {
    const I nqb = (d_.M + kBq - 1) / kBq, per = d_.B * d_.Hq, tasks = per * nqb;
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
        // Later query blocks (more keys when causal) first.
        const I qb = nqb - 1 - task / per, bh = task % per, b = bh / d_.Hq, h = bh % d_.Hq;
        const I q0 = qb * kBq, nq = std::min(kBq, d_.M - q0);
        forward_block(b, h, q0, nq, &w, l.data());
        store_rows(out, d_.D, b, q0, nq, h, w.o.data());
        if (lse.present()) {
          double* base = static_cast<double*>(lse.data);
          for (I i = 0; i < nq; ++i)
            base[b * lse.strides[0] + h * lse.strides[1] + (q0 + i) * lse.strides[2]] = l[ix(i)];
        }
      }
    }
    guard.rethrow();
  }

  // Backward. dq, dk, dv optional (absent: computed, not stored); g's views optional. With
  // saved_out and saved_lse, pass 1 reads them instead of running the forward.
  void backward(const View& dout, const View& dq, const View& dk, const View& dv,
                const EncodingGrads& g, const View* saved_out = nullptr,
                const View* saved_lse = nullptr) const {
    const I B = d_.B, M = d_.M, N = d_.N, Hq = d_.Hq, D = d_.D, G = d_.G, R = d_.R;
    // the careful steps on every tile (attention_tiles.h): k or v not finite
    const bool careful_all = (cf_.k_known ? !cf_.k_finite : !all_finite(simd_, k_, threads_)) ||
                             !all_finite(simd_, v_, threads_);
    // pass 1: lse and D = rowsum(dO ⊙ out), [B, Hq, M]
    std::vector<float> lse(ix(B * Hq * M)), Dv(ix(B * Hq * M));
    const I nqb = (M + kBq - 1) / kBq, per = B * Hq;
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
        const I qb = nqb - 1 - task / per, bh = task % per, b = bh / Hq, h = bh % Hq;
        const I q0 = qb * kBq, nq = std::min(kBq, M - q0);
        if (saved_out) {
          load_rows(*saved_out, D, b, q0, nq, h, w.o.data());
          const View& ls = *saved_lse;
          const double* base = static_cast<const double*>(ls.data);
          for (I i = 0; i < nq; ++i)
            l[ix(i)] = base[b * ls.strides[0] + h * ls.strides[1] + (q0 + i) * ls.strides[2]];
        } else {
          forward_block(b, h, q0, nq, &w, l.data(), careful_all);
        }
        load_rows(dout, D, b, q0, nq, h, w.dout.data());
        for (I i = 0; i < nq; ++i) {
          const std::size_t at = ix((b * Hq + h) * M + q0 + i);
          lse[at] = static_cast<float>(l[ix(i)]);
          Dv[at] = simd_.dot(&w.dout[ix(i * D)], &w.o[ix(i * D)], ix(D));
        }
      }
    }
    guard.rethrow();
    // pass 2: per (b, kv head). Parameter gradients per (b, h): du [D], Σ X [R], dW [D, R].
    const I npar = D + R + D * R;
    std::vector<double> gp(ix(B * Hq * npar), 0.0);
    const I kvtasks = B * d_.Hkv;
    const float sc = static_cast<float>(d_.scale);
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
    {
      Scratch w;
      std::vector<float> dq_acc, csum;
      guard.run([&] {
        w.init(D, R);
        w.init_backward(D, R);
        csum.resize(ix(kBk));
      });
#pragma omp for schedule(dynamic, 1)
      for (I task = 0; task < kvtasks; ++task) {
        const I b = task / d_.Hkv, kh = task % d_.Hkv;
        if (guard.failed() || !guard.run([&] { dq_acc.assign(ix(G * M * D), 0.f); })) continue;
        for (I j0 = 0; j0 < N; j0 += kBk) {
          const I nk = std::min(kBk, N - j0), kp0 = d_.k_off + j0;
          load_rows(k_, D, b, j0, nk, kh, w.k.data());
          load_rows(v_, D, b, j0, nk, kh, w.v.data());
          std::fill(w.dk.begin(), w.dk.begin() + nk * D, 0.f);
          std::fill(w.dv.begin(), w.dv.begin() + nk * D, 0.f);
          for (I gi = 0; gi < G; ++gi) {
            const I h = kh * G + gi;
            const I ilo = p_.causal ? std::clamp<I>(kp0 - d_.q_off, 0, M) : 0;
            double* gph = &gp[ix((b * Hq + h) * npar)];
            for (I i0 = ilo; i0 < M; i0 += kBq) {
              const I nq = std::min(kBq, M - i0);
              load_query(b, h, i0, nq, &w);
              load_rows(dout, D, b, i0, nq, h, w.dout.data());
              float* S = w.s.data();
              float* dP = w.dp.data();
              logits(i0, nq, j0, nk, &w);
              const float* L = &lse[ix((b * Hq + h) * M + i0)];
              const float* Di = &Dv[ix((b * Hq + h) * M + i0)];
              for (I i = 0; i < nq; ++i) {
                float* Si = S + i * kBk;
                if (L[i] == kNegInfF) std::fill(Si, Si + nk, 0.f);
                else if (std::isnan(L[i])) nan_row(Si, nk);  // a NaN row (attention_tiles.h)
                else simd_.exp_sub_sum(Si, ix(nk), L[i]);
              }
              tile_gemm(gemm_, GemmForm::kNT, nq, nk, D, 1.f, w.dout.data(), D, w.v.data(), D, dP, kBk);
              // careful (attention_tiles.h): the products read sanitized dO, Qu, K (and Qv in
              // position_grads); dO's non-finite entries' terms added back into dV; dS 0 where P is
              const bool careful = careful_all || careful_rows(L, Di, nq);
              const bool bad_do = careful && sanitize_rows(w.dout.data(), D, nq, D, w.sd.data());
              tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, 1.f, S, kBk, bad_do ? w.sd.data() : w.dout.data(), D,
                        w.dv.data(), D);
              if (bad_do) add_back_ptdo(S, nq, nk, w.dout.data(), D, D, w.dv.data());
              for (I i = 0; i < nq; ++i) {
                if (careful) careful_ds(S + i * kBk, dP + i * kBk, nk, Di[i]);
                else simd_.ds_row(S + i * kBk, dP + i * kBk, ix(nk), Di[i]);
              }
              // S now holds dS; c = scale·dS.
              const bool bad_q = careful && sanitize_rows(w.qu.data(), D, nq, D, w.sq.data());
              tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, sc, S, kBk, bad_q ? w.sq.data() : w.qu.data(), D,
                        w.dk.data(), D);
              float* dqt = &dq_acc[ix((gi * M + i0) * D)];
              const bool bad_k = careful && sanitize_rows(w.k.data(), D, nk, D, w.sk.data());
              tile_gemm(gemm_, GemmForm::kNN, nq, D, nk, sc, S, kBk, bad_k ? w.sk.data() : w.k.data(), D, dqt, D);
              position_grads(h, i0, nq, j0, nk, &w, dqt, gph, csum.data(), careful);
            }
          }
          if (dk.present()) store_rows(dk, D, b, j0, nk, kh, w.dk.data());
          if (dv.present()) store_rows(dv, D, b, j0, nk, kh, w.dv.data());
        }
        if (dq.present())
          for (I gi = 0; gi < G; ++gi) store_rows(dq, D, b, 0, M, kh * G + gi, &dq_acc[ix(gi * M * D)]);
      }
    }
    guard.rethrow();
    write_param_grads(gp, g);
  }

 private:
  // The table S [nrho, R]: row e = s(δ) for ρ = kp − qp = rho_lo_ + e, δ = −ρ.
  void build_table() {
    const I R = d_.R;
    rho_lo_ = d_.k_off - (d_.q_off + d_.M - 1);
    I rho_hi = d_.k_off + d_.N - 1 - d_.q_off;
    if (p_.causal) rho_hi = std::min(rho_hi, kBq + kBk - 2);
    nrho_ = d_.M > 0 && d_.N > 0 ? std::max<I>(rho_hi - rho_lo_ + 1, 0) : 0;
    tab_.assign(ix(nrho_ * R), 0.f);
    std::vector<double> inv(ix(R / 2));
    for (I c = 0; c < R / 2; ++c) inv[ix(c)] = sinusoid::inv_freq(c, R, xl::kBase);
    const int threads = nrho_ * R < fast::kParallelMin ? 1 : threads_;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (I e = 0; e < nrho_; ++e) {
      const double delta = -static_cast<double>(rho_lo_ + e);
      float* row = &tab_[ix(e * R)];
      for (I c = 0; c < R / 2; ++c) {
        const double a = delta * inv[ix(c)];
        row[2 * c] = static_cast<float>(std::sin(a));
        row[2 * c + 1] = static_cast<float>(std::cos(a));
      }
    }
  }

  // Table rows from ρ (which must lie in the table).
  const float* table_at(I rho) const { return &tab_[ix((rho - rho_lo_) * d_.R)]; }

  // Q rows [i0, i0 + nq) of head h: w->qu = Q + u_h, w->qv = Q + v_h, w->y = scale·(Q + v_h)·W_h.
  void load_query(I b, I h, I i0, I nq, Scratch* w) const {
    const I D = d_.D, R = d_.R;
    float* qu = w->qu.data();
    float* qv = w->qv.data();
    load_rows(q_, D, b, i0, nq, h, qv);
    std::memcpy(qu, qv, ix(nq * D) * sizeof(float));
    for (I i = 0; i < nq; ++i) {
      simd_.add_to(qu + i * D, &u_[ix(h * D)], ix(D));
      simd_.add_to(qv + i * D, &vb_[ix(h * D)], ix(D));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(nq), int(R), int(D),
                static_cast<float>(d_.scale), qv, int(D), &w_[ix(h * D * R)], int(R), 0.f,
                w->y.data(), int(R));
  }

  // The band of the tile whose key 0 − query 0 distance is base (tile_gemm.h): causal tiles
  // crossing the diagonal.
  I band(I base, I nk) const { return p_.causal && base + nk - 1 > 0 ? -base : kNoBand; }

  // w->s [nq, Bk] = scale·Qu·Kᵀ + Y·s(δ), masked entries −inf (Qu, Y from load_query, K in w->k).
  // A causal tile crossing the diagonal computes only what it keeps: Q·Kᵀ banded, and T only up to
  // the last column a visible key reads (the same values as the full products, tile_gemm.h).
  // Returns the tile's band.
  I logits(I q0, I nq, I j0, I nk, Scratch* w) const {
    const I D = d_.D, R = d_.R;
    float* S = w->s.data();
    const I base = (d_.k_off + j0) - (d_.q_off + q0);  // ρ of (row 0, col 0); ρ(i, j) = base + j − i
    const I bd = band(base, nk);
    tile_gemm(gemm_, GemmForm::kNT, nq, nk, D, static_cast<float>(d_.scale), w->qu.data(), D,
              w->k.data(), D, S, kBk, bd);
    // causal: kp ≤ qp, i.e. row i sees keys j < jh(i) = i − base + 1
    auto jh = [&](I i) { return bd < kNoBand ? std::clamp<I>(i - base + 1, 0, nk) : nk; };
    float* T = w->t.data();
    for (I a = 0; a < nq; a += kSub) {
      const I nb = std::min(kSub, nq - a), wd = nb + nk - 1;
      // rows [a, a + nb) see ρ ∈ [base − a − nb + 1, base − a + nk − 1]: T [nb, wd], row r's
      // keys at columns nb − 1 − r + j, so a band needs only the first a + nb − base of them
      const I used = bd < kNoBand ? std::clamp<I>(a + nb - base, 0, wd) : wd;
      if (used > 0)
        tile_gemm(gemm_, GemmForm::kNT, nb, used, R, 1.f, &w->y[ix(a * R)], R, table_at(base - a - nb + 1), R,
                  T, wd);
      for (I r = 0; r < nb; ++r)
        simd_.add_to(S + (a + r) * kBk, T + r * wd + (nb - 1 - r), ix(jh(a + r)));
    }
    if (bd >= kNoBand) return bd;
    for (I i = 0; i < nq; ++i) {
      float* Si = S + i * kBk;
      std::fill(Si + jh(i), Si + nk, kNegInfF);
    }
    return bd;
  }

  // Rows [q0, q0 + nq) of head h: w->o [nq, D] = softmax(logits)·V, lse [nq].
  // careful_v: P·V of the sanitized V, its non-finite entries' terms added back (attention_tiles.h) —
  // taken again with it when a row of finite lse comes out non-finite (a NaN or ±inf in V).
  void forward_block(I b, I h, I q0, I nq, Scratch* w, double* lse, bool careful_v = false) const {
    const I D = d_.D, kh = h / d_.G;
    load_query(b, h, q0, nq, w);
    const I qp_max = d_.q_off + q0 + nq - 1;
    const I jhi = p_.causal ? std::clamp<I>(qp_max - d_.k_off + 1, 0, d_.N) : d_.N;
    float* m = w->ml.data();
    float* l = m + kBq;
    float* o = w->o.data();
    std::fill(m, m + nq, kNegInfF);
    std::fill(l, l + nq, 0.f);
    std::fill(o, o + nq * D, 0.f);
    float* S = w->s.data();
    for (I j0 = 0; j0 < jhi; j0 += kBk) {
      const I nk = std::min(kBk, jhi - j0);
      load_rows(k_, D, b, j0, nk, kh, w->k.data());
      load_rows(v_, D, b, j0, nk, kh, w->v.data());
      // banded: the softmax reads each row's band_reach (−inf past its keys), and P·V reads zeros
      // beyond it (attention_tiles.h, tile_gemm.h)
      const I bd = logits(q0, nq, j0, nk, w);
      if (bd < kNoBand)
        for (I i = 0; i < nq; ++i)
          std::fill(S + i * kBk + band_reach(i, bd, nk), S + i * kBk + nk, 0.f);
      if (cf_.rows) mark_nan_rows(simd_, S, nq, nk, bd, m);  // careful steps (attention_tiles.h)
      online_softmax_step(simd_, S, nq, nk, m, l, o, D, bd);
      const bool bad_v = careful_v && sanitize_rows(w->v.data(), D, nk, D, w->sv.data());
      tile_gemm(gemm_, GemmForm::kNN, nq, D, nk, 1.f, S, kBk, bad_v ? w->sv.data() : w->v.data(), D, o, D, bd);
      if (bad_v) add_back_pv(S, nq, w->v.data(), D, nk, D, o, D);
    }
    online_softmax_finish(simd_, nq, m, l, o, D, lse);
    if (!careful_v && !outputs_finite(simd_, o, nq, D, lse)) forward_block(b, h, q0, nq, w, lse, true);
  }

  // The position term's gradients of one tile from dS [nq, Bk] (in w->s; c = scale·dS):
  // dQ += X·W_hᵀ, and into gph (du [D], Σ X [R], dW [D, R]) Σ_j (Σ_i c_ij) k_j, Σ_i X_i, Qvᵀ·X.
  void position_grads(I h, I i0, I nq, I j0, I nk, Scratch* w, float* dqt, double* gph,
                      float* csum, bool careful) const {
    const I D = d_.D, R = d_.R;
    const float sc = static_cast<float>(d_.scale);
    const float* dS = w->s.data();
    const I base = (d_.k_off + j0) - (d_.q_off + i0);
    float* Cs = w->t.data();
    float* X = w->x.data();
    for (I a = 0; a < nq; a += kSub) {
      const I nb = std::min(kSub, nq - a), wd = nb + nk - 1;
      // c_skew [nb, wd]: row r holds dS row a + r at column nb − 1 − r, zeros around it
      for (I r = 0; r < nb; ++r) {
        float* cr = Cs + r * wd;
        const I off = nb - 1 - r;
        std::fill(cr, cr + off, 0.f);
        std::memcpy(cr + off, dS + (a + r) * kBk, ix(nk) * sizeof(float));
        std::fill(cr + off + nk, cr + wd, 0.f);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(nb), int(R), int(wd), sc, Cs,
                  int(wd), table_at(base - a - nb + 1), int(R), 0.f, X + a * R, int(R));
    }
    const float* Wh = &w_[ix(h * D * R)];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(nq), int(D), int(R), 1.f, X, int(R),
                Wh, int(R), 1.f, dqt, int(D));
    const bool bad_qv = careful && sanitize_rows(w->qv.data(), D, nq, D, w->sq.data());
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(D), int(R), int(nq), 1.f,
                bad_qv ? w->sq.data() : w->qv.data(), int(D), X, int(R), 0.f, w->dw.data(), int(R));
    double* du = gph;
    double* xs = gph + D;
    double* dW = gph + D + R;
    for (I e = 0; e < D * R; ++e) dW[e] += w->dw[ix(e)];
    std::memcpy(csum, dS, ix(nk) * sizeof(float));  // Σ_i dS_ij, then du += scale·csum·K
    for (I i = 1; i < nq; ++i) simd_.add_to(csum, dS + i * kBk, ix(nk));
    for (I j = 0; j < nk; ++j) {
      const double cj = static_cast<double>(csum[j]) * sc;
      if (cj == 0) continue;
      const float* kj = &w->k[ix(j * D)];
      for (I e = 0; e < D; ++e) du[e] += cj * kj[e];
    }
    for (I i = 1; i < nq; ++i) simd_.add_to(X, X + i * R, ix(R));  // X row 0 becomes Σ_i X_i
    for (I c = 0; c < R; ++c) xs[c] += X[c];
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
  TileGemmFn gemm_;  // the tile products' GEMM (tile_gemm.h): K is D or R
  std::vector<float> u_, vb_, w_;  // u, v [Hq, D]; W [Hq, D, R] as float
  std::vector<double> w64_;         // W as given, for dv = W·Σ X in double
  std::vector<float> tab_;          // the sinusoid table [nrho_, R]
  I rho_lo_ = 0, nrho_ = 0;
  CarefulForward cf_;  // how the forward finds NaN rows (attention_tiles.h)
};

}  // namespace

bool xl_fused() { return true; }

Status xl_forward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k,
                  const View& v, const EncodingTensors& t, const View& out, const View& lse) {
  const XlFused f(p, d, q, k, v, t, threads_for(d));
  f.forward(out, lse);
  return Status::Ok();
}

Status xl_backward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k,
                   const View& v, const EncodingTensors& t, const View& dout, const View& dq,
                   const View& dk, const View& dv, const EncodingGrads& g, const View* saved_out,
                   const View* saved_lse) {
  const XlFused f(p, d, q, k, v, t, threads_for(d));
  f.backward(dout, dq, dk, dv, g, saved_out, saved_lse);
  return Status::Ok();
}

}  // namespace posenc::fused
