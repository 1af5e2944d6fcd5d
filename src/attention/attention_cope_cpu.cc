// The fused (flash-style) CoPE attention (Golovneva et al. 2024; the formula in docs/attention.md
// and cope_math.h, the derivatives in attention_ref.cc), forward and backward, float32 / bfloat16 /
// float16 q/k/v with float32 math. Called by the dispatcher of attention_cpu.cc, whose tile
// machinery (attention_tiles.h) it shares. Tested against the reference in
// tests/test_attention_cope_fast.cc.
//
// Shape letters as in attention_cpu.cc; ncol = min(npos, N + 1) (cope::rows_reached: the table
// rows a count can reach), top = npos − 1. A row's count S_ij = Σ_{t ≥ j} g_it only grows as j
// moves left, so a row is clamped (p = top) on a prefix of its keys, j < j*_i, and unclamped on the
// rest: the last ~2·npos keys of a row when gates are ~1/2, many more when they are sparse, all of
// them when npos > N.
//
// Score tiles are kept transposed, At [Bk keys, Bq queries]: every per-row quantity (count,
// carries, running max and sum) is one SIMD lane, the scans along keys are vector adds row after
// row, and the table values q_i·e_⌊p⌋, q_i·(e_⌈p⌉ − e_⌊p⌋) are gathered lane by lane
// (attention_cope_tiles.cc: Highway, every target compiled, the best chosen at run time). A lane's ⌊p⌋ changes at most npos times
// along its row, so they are gathered again only at keys where some lane's ⌊p⌋ moved: every key
// while gates are dense (but then rows clamp within ~2·npos keys), rarely while they are sparse
// (the case where rows stay unclamped).
//
// Every product (Q·Eᵀ, K·Qᵀ, P·V, the backward's five and C·E, Cᵀ·Q) is one tile_gemm() call
// (tile_gemm.h: the Highway small GEMM for D ≤ kTileGemmMaxD, as nope's tiles, else cblas_sgemm).
//
// ---- forward, per task (b, h, query block of Bq rows), OpenMP dynamic over B·Hq·⌈M/Bq⌉ ----------
//   QE [Bq, ncol] = Q·Eᵀ (causal blocks only the columns their counts can reach), once.
//   Key blocks walked from the last visible one down to key 0 (the online softmax does not care
//   about the order), carrying each row's count of the keys already passed (double):
//     At = scale·K·Qᵀ (tile product), causal mask;
//     if every row's carry is already ≥ top, the tile is wholly clamped: logits = a + QE[i, top]
//       (no gates; as cheap as a bias), and so are all tiles left of it;
//     else, for j from the tile's last key down: g = σ(a) (0 masked), S = carry + (the tile's
//       suffix sum of g), p = min(S, top), logits = a + QE[i, ⌊p⌋] + w·(QE[i, ⌈p⌉] − QE[i, ⌊p⌋]);
//       for the backward, the leftmost unclamped key is j*_i and U_i = S_{i, j*} (the walk's right
//       end and 0 when a row has none);
//     online softmax in the lanes, O = O·e^{m−m'} + P·V (reading the transposed tile).
//   Memory per thread: O(Bq·Bk + (Bq + Bk)·D + Bq·ncol).
//
// ---- backward (FlashAttention-2, recompute) -----------------------------------------------------
//   pass 1, per (b, h, query block): the forward above; kept [B, Hq, M]: lse, Dᵢ = dOᵢ·outᵢ
//     (float), j*_i (int32), U_i (double).
//   pass 2, per (b, kv head) — owns dK, dV and its G query heads' dQ, so nothing races — its query
//     rows in chunks of Mc rows per head (the largest multiple of Bq, at least Bq, whose Q, dO, Qᵀ,
//     dOᵀ, dQ, QE and C take at most 4 MiB: 2304 rows at G = 1, D = 64, ncol = 64), each chunk on
//     its own: its Q and dO rows copied once (dense: the tiles' products read them as rows D floats
//     apart) and transposed once (the B of the two kNP products below), and QE [G, Mc, ncol] of
//     its rows (tile products); the key blocks its rows see (causal: up to its last row) walked
//     forward (ascending j), for each query head and query block of the chunk not wholly masked:
//       At = scale·K·Qᵀ, dPᵀ = V·dOᵀ;
//       a tile wholly left of every row's j* is clamped: logits = a + QE[i, top], P = exp(l − lse),
//         dl = P ⊙ (dP − D), C[i, top] += Σ_j dl, da = dl;
//       else per key j ascending: the count is rebuilt from j*'s, S_ij = U_i − Σ_{j* ≤ t < j} g_it
//         (only unclamped keys are subtracted, so it cancels at most npos, never a row's total gate
//         count); z, P and dl as in the forward; C[i, ⌊p⌋] += dl(1 − w), C[i, ⌈p⌉] += dl·w
//         (summed in registers while ⌊p⌋ stays, then added with a gather/scatter: lanes are
//         distinct rows); dp = dl·(QE[i, ⌈p⌉] − QE[i, ⌊p⌋]) where unclamped;
//         dg_ij = Σ_{t ≤ j} dp_it — a prefix sum, which the ascending walk carries directly (no row
//         total minus a suffix: no cancellation, and no extra sweep to find the total);
//         da = dl + dg·g(1 − g);
//       dV += P·dO, dK += scale·da·Q, dQ += scale·daᵀ·K.
//     At the end of the chunk: dQ += C·E and dE += Cᵀ·Q, C [G, Mc, ncol] holding each
//     row's Σ_j ∂l_ij/∂(q_i·e_r), and its dQ rows stored. The per-row carries (count from j*, dp
//     prefix) live in [G, Mc] arrays, since key blocks are the outer loop within the chunk. A key
//     block's dK, dV get a part from each chunk that sees it: the first stores it, the others add
//     theirs — in the caller's dk (dv) when it is float32, else (and only with several chunks) in
//     float32 sums split between the caller's 16-bit elements (high halves) and a [N, D] of low
//     halves (SplitSum), rounded to the dtype once at the task's end; keys no chunk sees get 0.
//   Pass 1 decides what is clamped (j < j*_i) and pass 2 follows it; the count pass 2 rebuilds for
//   j ≥ j* agrees with the forward's to float rounding (should it round to ≥ top there, it clamps).
//   Cost over nope: pass 1 is a forward; pass 2 adds the elementwise work of unclamped tiles and
//   three [M, D] × [D, ncol]-sized products per head; the chunks add a load of K, V and a store or
//   add of dK, dV per chunk and key block seen, [N, D]-sized each, against the chunk's Mc/Bq tiles.
//   Memory: pass 1 arrays 20·B·Hq·M bytes; per thread O(Bq·Bk + (Bq + Bk)·D) plus the chunk's Q,
//   dO, their transposes, dQ, QE and C, 4·G·Mc·(5D + 2·ncol) bytes (≤ 4 MiB unless Mc = Bq), its
//   carries 12·G·Mc bytes, dE [G, ncol, D] in float and [ncol, D] in double: none of it grows with
//   M (a bfloat16 or float16 dk, dv with M > Mc adds the low halves of its float sums, 2·N·D bytes
//   each: SplitSum). L = 65536, H = 8, D = 64, npos = 64 (posenc bench --memory): one thread
//   16.6 MiB over the caller's tensors (10 MiB pass 1, ~4 MiB the chunk), two threads 21.2 MiB;
//   forward 2.4 MiB.
//   Never an [M, N] buffer.
//
// ---- non-finite inputs --------------------------------------------------------------------------
//   The tiles assume finite inputs (their e^x, ExpSoftmax of core/simd-inl.h, and so the gate give 0
//   for NaN, and a NaN count would clamp): a call whose q, k, v or dout hold a NaN or ±inf runs the
//   reference instead, which gives the NaNs of posenc/attention.h — at the reference's speed. A
//   pass over k finds a non-finite k before the kernel runs; q, v and dout show in its results
//   (nonfinite_k below).
//
// ---- precision ----------------------------------------------------------------------------------
//   Tiles, logits and the softmax are float32 as in the other fused kernels. Counts are held as an
//   integer part plus a fraction in [0, 1) (attention_cope_tiles.h): a gate added to the
//   fraction rounds by at most 2^-24 however large the count (a plain float count near 64 rounds by
//   up to 2^-18 per addition, an error that z multiplies by q·(e_⌈p⌉ − e_⌊p⌋), several units),
//   the carry between tiles is double, so the error of p grows neither with the count nor with N;
//   and clamping is an exact test. What remains is ~1e-6 from the gates themselves (float logits).
//   The dp prefix carry is float (it runs only over unclamped keys). dK, dV: each chunk's part in
//   float (tile products), the parts added in float. dE: each task's Cᵀ·Q in float,
//   summed over tasks in double (in the order threads finish them, so with several threads dtable
//   can differ in its last double bits between runs; out, lse, dq, dk, dv do not depend on the
//   thread count).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "attention/attention_cope_tiles.h"
#include "attention/attention_fused.h"
#include "attention/attention_tiles.h"
#include "attention/tile_gemm.h"
#include "enc/contextual/cope/cope_math.h"

namespace posenc {

namespace {

using attn::Dims;
using namespace attn_fast;  // NOLINT: the shared tile machinery

constexpr float kPosInfF = std::numeric_limits<float>::infinity();

// The backward's pass 2 walks each task's query rows in chunks whose Q, dO, dQ, QE and C take at most this
// (one set per thread), so that its memory does not grow with M.
constexpr I kChunkBytes = I{4} << 20;
std::atomic<I> g_chunk_rows{0};  // cope_set_chunk_rows: > 0 overrides the chunk's rows per head

// dK or dV of one task (b, kv head kh) in a bfloat16 or float16 tensor, summed over the chunks of
// pass 2 in float32 without a float [N, D] buffer: the high 16 bits of each element's float sum
// live in the output's own element (the caller's tensor is the task's scratch until finish()) and
// the low 16 bits in lo [N, D], so every addition is the float32 one and finish() rounds each sum
// once to the dtype, as a float buffer would (half its memory: 8 MiB at N = 65536, D = 64).
class SplitSum {
 public:
  void size_for(I N, I D) { lo_.resize(ix(N * D)); }  // the low halves of N keys
  bool empty() const { return lo_.empty(); }
  // Rows [j0, j0 + nk) of the sum = x [nk, D] (first) or += x.
  void put(const View& out, I D, I b, I kh, I j0, I nk, const float* x, bool first) {
    for (I r = 0; r < nk; ++r) {
      std::uint16_t* lo = &lo_[ix((j0 + r) * D)];
      for (I e = 0; e < D; ++e) {
        std::uint16_t* hi = high(out, b, j0 + r, kh, e);
        float f = x[r * D + e];
        if (!first) f += joined(*hi, lo[e]);
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        *hi = static_cast<std::uint16_t>(u >> 16);
        lo[e] = static_cast<std::uint16_t>(u & 0xFFFFu);
      }
    }
  }
  // Each element of rows [0, done) rounded once to the dtype; rows [done, N) (keys no chunk saw) 0.
  void finish(const View& out, I D, I b, I kh, I done, I N) const {
    for (I j = 0; j < N; ++j)
      for (I e = 0; e < D; ++e) {
        std::uint16_t* hi = high(out, b, j, kh, e);
        const float f = j < done ? joined(*hi, lo_[ix(j * D + e)]) : 0.f;
        *hi = out.dtype == DType::kBF16 ? to_bf16(f).bits : to_f16(f).bits;
      }
  }

 private:
  static std::uint16_t* high(const View& out, I b, I j, I kh, I e) {
    return static_cast<std::uint16_t*>(out.data) + b * out.strides[0] + j * out.strides[1] +
           kh * out.strides[2] + e * out.strides[3];
  }
  static float joined(std::uint16_t hi, std::uint16_t lo) {
    const std::uint32_t u = (std::uint32_t{hi} << 16) | lo;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  std::vector<std::uint16_t> lo_;
};

// Per-thread scratch: tiles and per-row (lane) state of one query block.
struct Scratch {
  std::vector<float> q, qt, k, v, at, dpt, o, dout, dk, dv, qe, qetop;  // qt: the forward's Qᵀ [D, kLdt]
  std::vector<float> m, l, corr, ck, cr, tk, tr, uk, ur, lse, dd, dc, ctop;
  std::vector<double> carry;  // forward: each row's count of the keys passed
  std::vector<std::int32_t> js, rowbase;
  void init(I D, I ncol) {
    q.assign(ix(kBq * D), 0.f);
    qt.assign(ix(D * kLdt), 0.f);
    k.assign(ix(kBk * D), 0.f);
    v.assign(ix(kBk * D), 0.f);
    at.assign(ix(kBk * kBq), 0.f);
    o.assign(ix(kBq * D), 0.f);
    qe.assign(ix(kBq * ncol), 0.f);
    for (auto* x : {&qetop, &m, &l, &corr, &ck, &cr, &tk, &tr, &uk, &ur, &lse, &dd, &dc, &ctop})
      x->assign(ix(kBq), 0.f);
    carry.assign(ix(kBq), 0.0);
    js.assign(ix(kBq), 0);
    rowbase.resize(ix(kBq));
    for (I i = 0; i < kBq; ++i) rowbase[ix(i)] = static_cast<std::int32_t>(i * ncol);
  }
  void init_backward(I D) {
    dpt.assign(ix(kBk * kBq), 0.f);
    dout.assign(ix(kBq * D), 0.f);
    dk.assign(ix(kBk * D), 0.f);
    dv.assign(ix(kBk * D), 0.f);
  }
};

class Cope {
 public:
  Cope(const Dims& d, const View& q, const View& k, const View& v, const View& table, bool causal,
       int threads)
      : d_(d), q_(q), k_(k), v_(v), causal_(causal), threads_(threads), simd_(simd()),
        kern_(cope_fast::kernels()), gemm_(attn_fast::tile_gemm_for(d.D)) {
    ncol_ = cope::rows_reached(d.npos, d.N);
    const std::vector<double> e = to_doubles(table);  // [npos, D]
    E_.assign(e.begin(), e.begin() + ncol_ * d.D);
    top_ = static_cast<float>(d.npos - 1);
  }

  // Whether the outputs came out as a finite input gives them (else a NaN or ±inf in q or v: the
  // caller runs the reference instead; see nonfinite below).
  bool forward(const View& out, const View& lse) const {
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
        forward_block(b, h, q0, nq, false, &w, l.data(), kv.empty() ? nullptr : kv.data());
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

  // Whether the gradients were written (else pass 1 met a NaN or ±inf from q, v or dout, and nothing
  // was: the caller runs the reference instead).
  bool backward(const View& dout, const View& dq, const View& dk, const View& dv,
                const View& dtable) const {
    const I D = d_.D, M = d_.M, nc = ncol_;
    Stats st;
    if (!pass1(dout, &st)) return false;
    // pass 2: per (b, kv head), its query rows in chunks of mc rows per head
    const I kvtasks = d_.B * d_.Hkv;
    const int nthr = threads_ > 1 ? threads_ : 1;
    const I mc = std::max<I>(1, std::min(chunk_rows(), M)), nchunks = (M + mc - 1) / mc;
    std::vector<std::vector<double>> dE(ix(nthr));  // per thread [ncol, D]
    RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
    {
      Scratch w;
      Chunk c;
      std::vector<double>& dEs = dE[ix(omp_get_thread_num())];
      guard.run([&] {
        w.init(D, nc);
        w.init_backward(D);
        c.init(d_, mc, nc);
        dEs.assign(ix(nc * D), 0.0);
        // dK, dV of a key block get a part from each chunk that sees it. A float32 dk (dv) sums them
        // in place (the task owns its kv head: no race); a 16-bit one, when there are several
        // chunks, in float32 split between itself and a SplitSum, rounded once at the end.
        if (dk.present() && dk.dtype != DType::kF32 && nchunks > 1) c.dka.size_for(d_.N, D);
        if (dv.present() && dv.dtype != DType::kF32 && nchunks > 1) c.dva.size_for(d_.N, D);
      });
      const Grads gr{dout, dq, dk, dv, dtable.present()};
#pragma omp for schedule(dynamic, 1)
      for (I task = 0; task < kvtasks; ++task) {
        if (guard.failed()) continue;
        unit(gr, st, task / d_.Hkv, task % d_.Hkv, &w, &c);
        if (gr.dtable)
          for (I g = 0; g < d_.G; ++g)
            for (I x = 0; x < nc * D; ++x) dEs[ix(x)] += static_cast<double>(c.dEt[ix(g * nc * D + x)]);
      }
    }
    guard.rethrow();
    if (dtable.present()) {  // rows past ncol are never reached: 0
      std::vector<double> tot(ix(d_.npos * D), 0.0);
      for (const auto& part : dE)
        for (std::size_t x = 0; x < part.size(); ++x) tot[x] += part[x];
      from_doubles(tot, dtable);
    }
    return true;
  }

 private:
  // What pass 1 leaves per row [B, Hq, M]: lse, D = rowsum(dO ⊙ out), j* and the count U at j*.
  struct Stats {
    std::vector<float> lse, Dv;
    std::vector<double> U;
    std::vector<std::int32_t> J;
  };

  // The backward's outputs (absent views: not wanted) and its dout.
  struct Grads {
    const View &dout, &dq, &dk, &dv;
    bool dtable;
  };

  // A thread's pass-2 arrays for a chunk of mc query rows per head of its unit: dQ, QE and C
  // [G, mc, ·] (Bq rows of padding: lanes past a block's end read and add 0 there), the per-row
  // carries (dp prefix, count from j*), the unit's dE per query head [G, ncol, D], the chunk's Q and
  // dO rows [G, mc, D], copied once per chunk, and transposed [G, D, ldq] (the B of K·Qᵀ and V·dOᵀ,
  // kNP); dK and dV's 16-bit sums (SplitSum).
  struct Chunk {
    I mc = 0, ldq = 0;
    std::vector<float> dqt, qe, C, dct, dEt, qd, dod, qdt, dodt;
    std::vector<double> gc;
    SplitSum dka, dva;
    void init(const Dims& d, I rows, I nc) {
      const I G = d.G, D = d.D;
      mc = rows;
      ldq = (mc + 15) / 16 * 16 + 16;  // off a multiple of 4 KiB: Bᵀ's rows spread over the L1 sets
      for (auto* x : {&dqt, &qd, &dod}) x->resize(ix(G * mc * D));
      qdt.resize(ix(G * D * ldq));
      dodt.resize(ix(G * D * ldq));
      qe.resize(ix((G * mc + kBq) * nc));
      C.resize(qe.size());
      dct.resize(ix(G * mc));
      gc.resize(ix(G * mc));
      dEt.resize(ix(G * nc * D));
    }
  };

  // Pass 1: st's lse, D, j*, U of every row, from the forward again. False where a row that sees
  // keys has a non-finite lse or D, or a row that sees none a non-finite q (it still enters dE).
  bool pass1(const View& dout, Stats* st) const {
    const I B = d_.B, M = d_.M, Hq = d_.Hq, D = d_.D, nc = ncol_;
    st->lse.resize(ix(B * Hq * M));
    st->Dv.resize(ix(B * Hq * M));
    st->U.resize(ix(B * Hq * M));
    st->J.resize(ix(B * Hq * M));
    const I nqb = (M + kBq - 1) / kBq, per = B * Hq;
    const std::vector<float> kv = key_rows();
    RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
    {
      Scratch w;
      std::vector<double> l;
      guard.run([&] {
        w.init(D, nc);
        w.init_backward(D);
        l.resize(ix(kBq));
      });
#pragma omp for schedule(dynamic, 1)
      for (I task = 0; task < per * nqb; ++task) {
        if (guard.failed()) continue;
        const I qb = nqb - 1 - task / per, bh = task % per, b = bh / Hq, h = bh % Hq;
        const I q0 = qb * kBq, nq = std::min(kBq, M - q0);
        forward_block(b, h, q0, nq, true, &w, l.data(), kv.empty() ? nullptr : kv.data());
        load_rows(dout, D, b, q0, nq, h, w.dout.data());
        for (I i = 0; i < nq; ++i) {
          const std::size_t at = ix((b * Hq + h) * M + q0 + i);
          st->lse[at] = static_cast<float>(l[ix(i)]);
          st->Dv[at] = simd_.dot(&w.dout[ix(i * D)], &w.o[ix(i * D)], ix(D));
          st->J[at] = w.js[ix(i)];
          st->U[at] = static_cast<double>(w.uk[ix(i)]) + static_cast<double>(w.ur[ix(i)]);
        }
      }
    }
    guard.rethrow();
    for (I r = 0; r < B * Hq * M; ++r)  // a row that sees keys has a finite lse and D from finite inputs
      if (sees_keys(r % M) && (!std::isfinite(st->lse[ix(r)]) || !std::isfinite(st->Dv[ix(r)]))) return false;
    // the rows that see no key (a prefix) still enter dE = Cᵀ·Q with C = 0: 0·NaN from their q
    const I none = d_.N == 0 ? M : causal_ ? std::clamp<I>(d_.k_off - d_.q_off, 0, M) : 0;
    std::vector<float> row(ix(D));
    for (I b = 0; b < B; ++b)
      for (I h = 0; h < Hq; ++h)
        for (I i = 0; i < none; ++i) {
          load_rows(q_, D, b, i, 1, h, row.data());
          if (!simd_.finite(row.data(), ix(D))) return false;
        }
    return true;
  }

  // Pass 2 of one unit (b, kv head kh), its query rows a chunk at a time: dk, dv of its keys and dq
  // of its query heads stored; its dE per query head left in c->dEt (when gr.dtable).
  void unit(const Grads& gr, const Stats& st, I b, I kh, Scratch* w, Chunk* c) const {
    const I D = d_.D, M = d_.M, N = d_.N, G = d_.G, nc = ncol_, mc = c->mc;
    // a key block's part: stored where no earlier chunk reached it (j0 ≥ done), added elsewhere
    const auto put = [&](const View& out, SplitSum& acc, I j0, I nk, const float* x, bool first) {
      if (!out.present()) return;
      if (!acc.empty()) acc.put(out, D, b, kh, j0, nk, x, first);
      else if (first) store_rows(out, D, b, j0, nk, kh, x);
      else add_rows(out, D, b, j0, nk, kh, x);  // float32 (else acc is there)
    };
    I done = 0;  // keys [0, done) have had a part from an earlier chunk
    std::fill(c->dEt.begin(), c->dEt.end(), 0.f);
    for (I c0 = 0; c0 < M; c0 += mc) {
      const I mq = std::min(mc, M - c0);  // the chunk: rows [c0, c0 + mq) of each query head
      for (auto* x : {&c->dqt, &c->C, &c->dct}) std::fill(x->begin(), x->end(), 0.f);
      std::fill(c->gc.begin(), c->gc.end(), 0.0);
      for (I g = 0; g < G; ++g)  // Q, dO and QE [mq, ncol] of each query head
        for (I i0 = c0; i0 < c0 + mq; i0 += kBq) {
          const I nq = std::min(kBq, c0 + mq - i0), gm = g * mc + i0 - c0;
          load_rows(q_, D, b, i0, nq, kh * G + g, &c->qd[ix(gm * D)]);
          load_rows(gr.dout, D, b, i0, nq, kh * G + g, &c->dod[ix(gm * D)]);
          tile_gemm(gemm_, GemmForm::kNT, nq, cols(i0, nq), D, 1.f, &c->qd[ix(gm * D)], D, E_.data(), D,
                    &c->qe[ix(gm * nc)], nc);
        }
      for (I g = 0; g < G; ++g) {  // transposed once per chunk, not per key block
        tr_(&c->qd[ix(g * mc * D)], D, mq, D, &c->qdt[ix(g * D * c->ldq)], c->ldq);
        tr_(&c->dod[ix(g * mc * D)], D, mq, D, &c->dodt[ix(g * D * c->ldq)], c->ldq);
      }
      // the keys the chunk's rows see (causal: up to its last row)
      const I jhi = causal_ ? std::clamp<I>(d_.q_off + c0 + mq - d_.k_off, 0, N) : N;
      for (I j0 = 0; j0 < jhi; j0 += kBk) {
        const I nk = std::min(kBk, N - j0), kp0 = d_.k_off + j0;
        load_rows(k_, D, b, j0, nk, kh, w->k.data());
        load_rows(v_, D, b, j0, nk, kh, w->v.data());
        std::fill(w->dk.begin(), w->dk.begin() + nk * D, 0.f);
        std::fill(w->dv.begin(), w->dv.begin() + nk * D, 0.f);
        for (I g = 0; g < G; ++g) {
          const I ilo = causal_ ? std::clamp<I>(kp0 - d_.q_off, c0, c0 + mq) : c0;
          for (I i0 = ilo; i0 < c0 + mq; i0 += kBq)
            tile(st, b, kh * G + g, g, i0 - c0, i0, std::min(kBq, c0 + mq - i0), j0, nk, w, c);
        }
        put(gr.dk, c->dka, j0, nk, w->dk.data(), j0 >= done);
        put(gr.dv, c->dva, j0, nk, w->dv.data(), j0 >= done);
      }
      done = std::max(done, std::min(N, (jhi + kBk - 1) / kBk * kBk));
      // the z term's direct paths: dQ += C·E, dE += Cᵀ·Q
      for (I g = 0; g < G; ++g) {
        for (I i0 = c0; i0 < c0 + mq; i0 += kBq) {
          const I nq = std::min(kBq, c0 + mq - i0), ncb = cols(i0, nq), gm = g * mc + i0 - c0;
          const float* Cb = &c->C[ix(gm * nc)];
          tile_gemm(gemm_, GemmForm::kNN, nq, D, ncb, 1.f, Cb, nc, E_.data(), D, &c->dqt[ix(gm * D)], D);
          if (!gr.dtable) continue;
          tile_gemm(gemm_, GemmForm::kTN, ncb, D, nq, 1.f, Cb, nc, &c->qd[ix(gm * D)], D, &c->dEt[ix(g * nc * D)],
                    D);
        }
        if (gr.dq.present()) store_rows(gr.dq, D, b, c0, mq, kh * G + g, &c->dqt[ix(g * mc * D)]);
      }
    }
    // keys no chunk saw (causal: right of the last query) get 0; the accumulators go out
    std::fill(w->dk.begin(), w->dk.end(), 0.f);
    for (auto [out, acc] : {std::pair{&gr.dk, &c->dka}, std::pair{&gr.dv, &c->dva}}) {
      if (!out->present()) continue;
      if (acc->empty()) {
        for (I j0 = done; j0 < N; j0 += kBk) store_rows(*out, D, b, j0, std::min(kBk, N - j0), kh, w->dk.data());
      } else {
        acc->finish(*out, D, b, kh, done, N);
      }
    }
  }

  // One tile of pass 2: query rows [i0, i0 + nq) of head h, the g-th of its group (row r of the
  // chunk, gm = g·mc + r in the chunk's arrays), against
  // keys [j0, j0 + nk) (their rows in w->k, w->v): P and da by the backward tile step, then
  // dV += Pᵀ·dO, dK += scale·daᵀ·Q (w->dv, w->dk) and dQ += scale·da·K (c->dqt); the rows' carries
  // and C updated.
  void tile(const Stats& st, I b, I h, I g, I r, I i0, I nq, I j0, I nk, Scratch* w, Chunk* c) const {
    const I D = d_.D, nc = ncol_, row = (b * d_.Hq + h) * d_.M + i0, gm = g * c->mc + r;
    const I tc = g * D * c->ldq + r;  // the tile's first column of Qᵀ and dOᵀ
    const float sc = static_cast<float>(d_.scale);
    tile_gemm(gemm_, GemmForm::kNP, nk, nq, D, sc, w->k.data(), D, &c->qdt[ix(tc)], c->ldq, w->at.data(), kBq);
    tile_gemm(gemm_, GemmForm::kNP, nk, nq, D, 1.f, w->v.data(), D, &c->dodt[ix(tc)], c->ldq, w->dpt.data(), kBq);
    std::int32_t minjs = std::numeric_limits<std::int32_t>::max();
    for (I i = 0; i < kBq; ++i) {
      const bool real = i < nq;
      const float L = real ? st.lse[ix(row + i)] : kNegInfF;
      w->lse[ix(i)] = L == kNegInfF ? kPosInfF : L;
      w->dd[ix(i)] = real ? st.Dv[ix(row + i)] : 0.f;
      w->js[ix(i)] = real ? st.J[ix(row + i)] : 0;
      const double bc = real ? st.U[ix(row + i)] - c->gc[ix(gm + i)] : 0.0;  // count at j0
      w->ck[ix(i)] = static_cast<float>(std::floor(bc));
      w->cr[ix(i)] = static_cast<float>(bc - std::floor(bc));
      w->dc[ix(i)] = real ? c->dct[ix(gm + i)] : 0.f;
      w->qetop[ix(i)] = real ? c->qe[ix((gm + i) * nc + nc - 1)] : 0.f;
      if (real) minjs = std::min(minjs, w->js[ix(i)]);
    }
    cope_fast::BwdTile t;
    t.at = w->at.data();
    t.dp = w->dpt.data();
    t.nk = nk;
    t.nq = nq;
    t.j0 = j0;
    t.causal = causal_;
    t.base = (d_.k_off + j0) - (d_.q_off + i0);
    t.clamped = j0 + nk <= minjs;
    t.qe = &c->qe[ix(gm * nc)];
    t.c = &c->C[ix(gm * nc)];
    t.rowbase = w->rowbase.data();
    t.qetop = w->qetop.data();
    t.top = top_;
    t.colmax = static_cast<float>(nc - 1);
    t.lse = w->lse.data();
    t.dd = w->dd.data();
    t.js = w->js.data();
    t.bk = w->ck.data();
    t.br = w->cr.data();
    t.tk = w->tk.data();
    t.tr = w->tr.data();
    t.dc = w->dc.data();
    t.ctop = w->ctop.data();
    kern_.bwd(t);
    if (t.clamped) {
      for (I i = 0; i < nq; ++i) c->C[ix((gm + i) * nc + nc - 1)] += w->ctop[ix(i)];
    } else {
      for (I i = 0; i < nq; ++i) {
        c->gc[ix(gm + i)] += static_cast<double>(w->tk[ix(i)]) + static_cast<double>(w->tr[ix(i)]);
        c->dct[ix(gm + i)] = w->dc[ix(i)];
      }
    }
    const float* Q = &c->qd[ix(gm * D)];
    const float* dO = &c->dod[ix(gm * D)];
    tile_gemm(gemm_, GemmForm::kNN, nk, D, nq, 1.f, w->at.data(), kBq, dO, D, w->dv.data(), D);
    tile_gemm(gemm_, GemmForm::kNN, nk, D, nq, sc, w->dpt.data(), kBq, Q, D, w->dk.data(), D);
    tile_gemm(gemm_, GemmForm::kTN, nq, D, nk, sc, w->dpt.data(), kBq, w->k.data(), D, &c->dqt[ix(gm * D)], D);
  }
  // Whether query row i sees any key (else its lse is −inf and its out 0 whatever the inputs).
  bool sees_keys(I i) const { return d_.N > 0 && (!causal_ || d_.q_off + i >= d_.k_off); }

  // Query rows per head of a pass-2 chunk: the largest multiple of Bq (at least Bq) whose Q, dO, dQ,
  // Qᵀ, dOᵀ, QE and C, 4·G·Mc·(5D + 2·ncol) bytes, fit in kChunkBytes; or the tests' setting
  // (cope_set_chunk_rows).
  I chunk_rows() const {
    const I set = g_chunk_rows.load(std::memory_order_relaxed);
    if (set > 0) return set;
    const I row_bytes = 4 * d_.G * (5 * d_.D + 2 * ncol_);
    return std::max<I>(kBq, kChunkBytes / row_bytes / kBq * kBq);
  }

  // Table rows that query rows [q0, q0 + nq) can read: a count is at most the number of keys a row
  // sees, so causal rows early in the sequence need fewer than ncol (the ⌈p⌉ read beside the last
  // one, with weight 0, is included). Columns past this of QE and C are neither written nor read.
  I cols(I q0, I nq) const {
    if (!causal_) return ncol_;
    const I seen = std::clamp<I>(d_.q_off + q0 + nq - 1 - d_.k_off + 1, 0, d_.N);
    return std::min(ncol_, seen + 2);
  }

  // K's rows [B, Hkv, N, D] then V's, float32 and dense, formed once per call for the forward's
  // tiles (which read V's rows as a product's B, a row per step: rows Hkv·D floats apart share few
  // L1 sets), where each key block has two or more readers and both take at most 32 MiB; else
  // empty (each tile's rows copied).
  std::vector<float> key_rows() const {
    constexpr I kMaxBytes = I{32} << 20;
    const I n = d_.B * d_.Hkv * d_.N * d_.D, readers = d_.G * ((d_.M + kBq - 1) / kBq);
    std::vector<float> kv;
    if (n == 0 || readers < 2 || 2 * n * 4 > kMaxBytes) return kv;
    try {
      kv.resize(ix(2 * n));
    } catch (const std::bad_alloc&) {
      return kv;
    }
    const I nkb = (d_.N + kBk - 1) / kBk, blocks = d_.B * d_.Hkv * nkb;
#pragma omp parallel for num_threads(threads_) schedule(static) if (threads_ > 1)
    for (I t = 0; t < blocks; ++t) {
      const I kb = t % nkb, bk = t / nkb, j0 = kb * kBk, nk = std::min(kBk, d_.N - j0);
      float* dst = &kv[ix((bk * d_.N + j0) * d_.D)];
      load_rows(k_, d_.D, bk / d_.Hkv, j0, nk, bk % d_.Hkv, dst);
      load_rows(v_, d_.D, bk / d_.Hkv, j0, nk, bk % d_.Hkv, dst + n);
    }
    return kv;
  }

  // Rows [q0, q0 + nq) of head h: w->o [nq, D] = softmax(logits)·V, lse [nq]; with track, leaves
  // each row's j* (the leftmost unclamped key; the walk's right end when there is none) in w->js
  // and its count in w->uk + w->ur. kv: key_rows() or null.
  void forward_block(I b, I h, I q0, I nq, bool track, Scratch* w, double* lse, const float* kv) const {
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
      if (kv) {
        K = kv + ((b * d_.Hkv + kh) * d_.N + j0) * D;
        V = K + d_.B * d_.Hkv * d_.N * D;
      } else {
        load_rows(k_, D, b, j0, nk, kh, w->k.data());
        load_rows(v_, D, b, j0, nk, kh, w->v.data());
      }
      tile_gemm(gemm_, GemmForm::kNP, nk, nq, D, static_cast<float>(d_.scale), K, D, w->qt.data(), kLdt,
                w->at.data(), kBq);
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

  Dims d_;
  View q_, k_, v_;
  bool causal_ = false;
  int threads_ = 1;
  Simd simd_;
  cope_fast::Kernels kern_;
  attn_fast::TileGemmFn gemm_;  // the tile products (tile_gemm.h)
  attn_fast::TileTransposeFn tr_ = attn_fast::tile_transpose_fn();
  I ncol_ = 1;
  float top_ = 0;
  std::vector<float> E_;  // [ncol, D]
};

}  // namespace

namespace fused {

bool cope_fused() { return true; }

void cope_set_chunk_rows(std::int64_t rows) {
  g_chunk_rows.store(std::max<std::int64_t>(rows, 0), std::memory_order_relaxed);
}

namespace {
// The tile kernels hold key indices in int32 and table rows as integers in floats (< 2^23); beyond
// that (some 8 million keys and table rows) the reference runs.
bool beyond_kernel(const attn::Dims& d) {
  return d.N > std::numeric_limits<std::int32_t>::max() - kBk ||
         cope::rows_reached(d.npos, d.N) > (I{1} << 23);
}

// Whether k holds a NaN or ±inf. The tile kernels are made for finite inputs (their gate σ(NaN) and
// exp(NaN) are 0, a NaN count clamps), so a call with a NaN or ±inf runs the reference, which gives
// the NaNs their due (attention.h), as slowly as the reference does. A non-finite k is found by this
// pass (the kernel would drop its key); a non-finite q, v or dout shows in the kernel's own results —
// a row that sees keys with a non-finite lse (q), out (v, which the P·V product spreads over the
// tile's rows) or D = dO·out (dout) — and the call then turns to the reference (the table is checked
// finite where it is validated, attention_check.h).
bool nonfinite_k(const attn::Dims& d, const View& k) { return !all_finite(simd(), k, threads_for(d)); }
}  // namespace

Status cope_forward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k,
                    const View& v, const EncodingTensors& t, const View& out, const View& lse) {
  if (beyond_kernel(d) || nonfinite_k(d, k)) return reference::attention_forward(p, q, k, v, t, out, lse);
  const Cope c(d, q, k, v, t.table, p.causal, threads_for(d));
  if (!c.forward(out, lse)) return reference::attention_forward(p, q, k, v, t, out, lse);
  return Status::Ok();
}

Status cope_backward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k,
                     const View& v, const EncodingTensors& t, const View& dout, const View& dq,
                     const View& dk, const View& dv, const EncodingGrads& g) {
  if (beyond_kernel(d) || nonfinite_k(d, k))
    return reference::attention_backward(p, q, k, v, t, dout, dq, dk, dv, g);
  const Cope c(d, q, k, v, t.table, p.causal, threads_for(d));
  if (!c.backward(dout, dq, dk, dv, g.table))
    return reference::attention_backward(p, q, k, v, t, dout, dq, dk, dv, g);
  return Status::Ok();
}

}  // namespace fused
}  // namespace posenc
