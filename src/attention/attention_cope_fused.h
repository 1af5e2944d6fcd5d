// Private: the fused CoPE attention (what it computes and how: attention_cope_cpu.cc, whose entry
// points run it). class Cope holds one call's state; its members are defined by part:
// attention_cope_cpu.cc (construction, the key rows), attention_cope_forward.cc and
// attention_cope_backward.cc; its per-tile SIMD steps are attention_cope_tiles.{h,cc}.
#pragma once

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

namespace posenc::cope_cpu {

using attn::Dims;
using namespace attn_fast;  // NOLINT: the shared tile machinery

constexpr float kPosInfF = std::numeric_limits<float>::infinity();

// The backward's pass 2 walks each task's query rows in chunks whose Q, dO, dQ, QE and C take at most this
// (one set per thread), so that its memory does not grow with M.
constexpr I kChunkBytes = I{4} << 20;
extern std::atomic<I> g_chunk_rows;  // cope_set_chunk_rows: > 0 overrides the chunk's rows per head

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
       int threads);

  // Whether the outputs came out as a finite input gives them (else a NaN or ±inf in q or v: the
  // caller runs the reference instead; see nonfinite below).
  bool forward(const View& out, const View& lse) const;

  // Whether the gradients were written (else pass 1 met a NaN or ±inf from q, v or dout, and nothing
  // was: the caller runs the reference instead).
  bool backward(const View& dout, const View& dq, const View& dk, const View& dv,
                const View& dtable) const;

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

  // A thread's arrays for the stored backward (attention_cope_backward_stored.cc): the kept tiles of
  // one query block (per key block it sees: S = scale·K·Qᵀ as the forward step reads it, then dPᵀ =
  // V·dOᵀ, [kBk, kBq] each), its unit's K and V rows and float dK, dV sums [N, D] each, the block's dOᵀ
  // [D, kLdt], dQ [kBq, D] and C [kBq, ncol], its rows' Σ P·dP and carries; dE [ncol, D] of the unit.
  struct Store {
    std::vector<float> tiles, unit, dot, dq, C, dEt, dsum;
    std::vector<double> gc;
  };

  // What the forward walk leaves for the stored backward's first sweep (forward_block's keep).
  struct Keep {
    float* tiles;       // Store::tiles: S and dPᵀ of each key block
    const float* dot;   // dOᵀ [D, kLdt] of the block's rows
    float* dsum;        // [kBq] out: Σ_j exp(l_ij − m_i)·dP_ij, rescaled with the running sum
  };

  // Whether backward() takes the stored path: a thread's Store fits score_store_limit
  // (attention_tiles.h).
  bool stored_ok() const;
  // The backward without pass 1 (the contract of backward()): per unit (b, kv head) and query block
  // of each of its heads, the forward walk keeps the tiles S and dPᵀ and sums D = Σ P·dP; a second
  // sweep reads them back for the backward tile step and the three gradient products.
  bool stored_backward(const Grads& gr, const View& dtable) const;
  // One unit of it; false where a row that sees keys has a non-finite lse or D.
  bool stored_unit(const Grads& gr, I b, I kh, Scratch* w, Store* st) const;
  // Sweep 2 of query rows [q0, q0 + nq) of head h against the kept tiles of keys [0, jhi).
  void stored_sweep2(const Grads& gr, I b, I h, I q0, I nq, I jhi, const float* kr, Scratch* w,
                     Store* st) const;
  // Whether the rows that see no key (a prefix) have a finite q: they still enter dE = Cᵀ·Q, C = 0.
  bool unseen_rows_finite() const;

  // Pass 1: st's lse, D, j*, U of every row, from the forward again. False where a row that sees
  // keys has a non-finite lse or D, or a row that sees none a non-finite q (it still enters dE).
  bool pass1(const View& dout, Stats* st) const;

  // Pass 2 of one unit (b, kv head kh), its query rows a chunk at a time: dk, dv of its keys and dq
  // of its query heads stored; its dE per query head left in c->dEt (when gr.dtable).
  void unit(const Grads& gr, const Stats& st, I b, I kh, Scratch* w, Chunk* c) const;

  // One tile of pass 2: query rows [i0, i0 + nq) of head h, the g-th of its group (row r of the
  // chunk, gm = g·mc + r in the chunk's arrays), against
  // keys [j0, j0 + nk) (their rows in w->k, w->v): P and da by the backward tile step, then
  // dV += Pᵀ·dO, dK += scale·daᵀ·Q (w->dv, w->dk) and dQ += scale·da·K (c->dqt); the rows' carries
  // and C updated.
  void tile(const Stats& st, I b, I h, I g, I r, I i0, I nq, I j0, I nk, Scratch* w, Chunk* c) const;
  // A backward tile step's arguments that stay from tile to tile: w's per-row arrays, the table's
  // sizes, the rows' QE and C (qe, C [Bq, ncol]); the caller sets the tile's own (at, dp, nk, nq, j0,
  // base, clamped).
  cope_fast::BwdTile bwd_tile(Scratch* w, const float* qe, float* C) const;
  // Whether query row i sees any key (else its lse is −inf and its out 0 whatever the inputs).
  bool sees_keys(I i) const { return d_.N > 0 && (!causal_ || d_.q_off + i >= d_.k_off); }

  // Query rows per head of a pass-2 chunk: the largest multiple of Bq (at least Bq) whose Q, dO, dQ,
  // Qᵀ, dOᵀ, QE and C, 4·G·Mc·(5D + 2·ncol) bytes, fit in kChunkBytes; or the tests' setting
  // (cope_set_chunk_rows).
  I chunk_rows() const;

  // Table rows that query rows [q0, q0 + nq) can read: a count is at most the number of keys a row
  // sees, so causal rows early in the sequence need fewer than ncol (the ⌈p⌉ read beside the last
  // one, with weight 0, is included). Columns past this of QE and C are neither written nor read.
  I cols(I q0, I nq) const;

  // K's rows [B, Hkv, N, D] then V's, float32 and dense, formed once per call for the forward's
  // tiles (which read V's rows as a product's B, a row per step: rows Hkv·D floats apart share few
  // L1 sets), where each key block has two or more readers and both take at most 32 MiB; else
  // empty (each tile's rows copied).
  std::vector<float> key_rows() const;

  // Rows [q0, q0 + nq) of head h: w->o [nq, D] = softmax(logits)·V, lse [nq]; with track, leaves
  // each row's j* (the leftmost unclamped key; the walk's right end when there is none) in w->js
  // and its count in w->uk + w->ur. kr, vr: the unit's K and V rows [N, D] (key_rows()), or null
  // (each tile's rows loaded). With keep, the tiles are kept and D summed instead of O = P·V (o 0).
  void forward_block(I b, I h, I q0, I nq, bool track, Scratch* w, double* lse, const float* kr,
                     const float* vr, const Keep* keep = nullptr) const;
  // The unit (b, kv head kh)'s K and V rows in key_rows()' kv, or null when kv is empty.
  std::pair<const float*, const float*> unit_rows(const std::vector<float>& kv, I b, I kh) const {
    if (kv.empty()) return {nullptr, nullptr};
    const float* k = kv.data() + (b * d_.Hkv + kh) * d_.N * d_.D;
    return {k, k + d_.B * d_.Hkv * d_.N * d_.D};
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

}  // namespace posenc::cope_cpu
