// Private: the fused Transformer-XL attention (what it computes and how: attention_xl_cpu.cc, whose
// entry points run it). class XlFused holds one call's state; its members are defined by part:
// attention_xl_cpu.cc (construction, the angle table, the loads of Q and of the key panels, the
// logits), attention_xl_forward.cc and attention_xl_backward.cc.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "attention/attention_fused.h"
#include "attention/attention_tiles.h"
#include "attention/tile_gemm.h"

namespace posenc::fused::xl_cpu {

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
extern std::atomic<I> cache_limit;  // xl_set_cache_limit()
// A third, the forward's [K | C]ᵀ and V of every key block (key_panels, B·Hkv·N·(2D + R) floats and
// the row padding, once per call; else each block's transposed once per query block): up to
// kPanelFactor·cache_limit floats (32 MiB: 26 MiB at L = 4096, Hkv = 8, D = R = 64).
constexpr I kPanelFactor = 4;
// Rows per block of a causal diagonal tile's position term (logits).
constexpr I kBandRows = 24;

class XlFused {
 public:
  XlFused(const AttentionParams& p, const Dims& d, const View& q, const View& k, const View& v,
          const EncodingTensors& t, int threads);

  // The angle table's Status: the calls below need it ok.
  const Status& status() const { return table_; }

  // Forward over every (b, h, query block); out [B, M, Hq, D], lse optional [B, Hq, M] float64. A
  // short call (a decode step) whose tiles need no band runs a task per (b, kv head, part of its G
  // heads), the part's rows stacked in one tile, so each key block is transposed and read once per
  // part: one part per group, or more where B·Hkv tasks would leave threads idle.
  void forward(const View& out, const View& lse);

  // Backward. dq, dk, dv optional (absent: computed, not stored); g's views optional. With
  // saved_out and saved_lse, pass 1 reads them instead of running the forward.
  void backward(const View& dout, const View& dq, const View& dk, const View& dv,
                const EncodingGrads& g, const View* saved_out = nullptr,
                const View* saved_lse = nullptr);

 private:
  // Pass 1: lse and D = rowsum(dO ⊙ out) of every row, [B, Hq, M], from the forward again (careful:
  // its careful steps on every tile) or read from saved_out and saved_lse.
  void pass1(const View& dout, const View* saved_out, const View* saved_lse, bool careful, std::vector<float>* lse,
             std::vector<float>* Dv) const;

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
            const float* C, float* dq, I ldq, float* xt, Scratch* w) const;

  // What tile_grads reads and adds into: whether the tile takes the careful steps, D of its rows, its
  // Qu [nq, D], dO [nq, D], K's rows [nk, D], C [nk, R];
  // dK, dV [nk, D], dQc (row stride ldq), X̃ [nq, R].
  struct TileGrads {
    bool careful;
    const float* Di;
    float* qc;
    const float* dO;
    const float* K;
    const float* C;
    float *dk, *dv, *dq;
    I ldq;
    float* xt;
  };
  // The part of a pass-2 tile after S and dP: S [nq, Bk] holding P (in: P, out: dS), dP; dV += Pᵀ·dO,
  // dS, dK += cᵀ·Qu, dQc += c·K, X̃ += c·C (c = scale·dS), banded by bd.
  void tile_grads(const TileGrads& t, I nq, I nk, I bd, float* S, const float* dP, Scratch* w) const;

  // Where a unit (b, kv head kh) sums dQc: head g's row i at base + g·hs + i·ld — in dq itself
  // (dq_dir; zeroed here) or in qacc [G, M, D].
  struct DqRows {
    float* base;
    I ld, hs;
  };
  DqRows dq_rows(const View& dq, bool dq_dir, I b, I kh, std::vector<float>* qacc) const;

  // The stored backward (attention_xl_backward_stored.cc): a thread's kept S and dP tiles of one
  // query block [2, key blocks, Bq, Bk]; its unit's [K | C]ᵀ and Vᵀ per key block, K's rows and
  // the float dK, dV sums [3, N, D]; the block's rows' m, l, Σ P·dP, lse and D [5, Bq].
  struct Store {
    std::vector<float> tiles, unit, row;
  };
  // Whether a thread's Store fits score_store_limit (attention_tiles.h).
  bool stored_ok() const;
  // The backward without pass 1 (no saved out and lse, k and v finite): per unit (b, kv head), per
  // query head and query block, sweep 1 forms S and dP = dO·Vᵀ of each key block the block sees,
  // keeps both and runs the online softmax for lse and D = Σ_j P_ij·dP_ij; sweep 2 reads them back
  // as P for tile_grads. Seven products of dimension D or R per tile where pass 1 and pass 2 take ten.
  void stored_backward(const View& dout, const View& dq, const View& dk, const View& dv, const EncodingGrads& g) const;
  void stored_unit(const View& dout, const View& dk, const View& dv, I b, I kh, const DqRows& dqr, float* xacc,
                   Scratch* w, Store* st) const;

  // The angle table tab_ [rows, R]: s(p) = per pair (sin ω·p, cos ω·p), sinusoidal_table's rows, for
  // the positions p relative to k_off of the queries, q_off − k_off + i, and of the keys, j. One run
  // of positions covers both where it is no longer than M + N rows (queries near their keys), else
  // the queries' M rows come first and the keys' N rows after them.
  Status build_table();

  // After the table: ct_ [R, N] = the keys' rows transposed (Cᵀ, read a key block at a time), where
  // it takes at most cache_limit floats (else empty).
  void transpose_keys();

  // The table rows of query row i (cos α, sin α) and key j (cos β, sin β): a key's row is its C.
  const float* tq(I i) const { return &tab_[ix((qrow_ + i) * d_.R)]; }
  const float* tk(I j) const { return &tab_[ix((krow_ + j) * d_.R)]; }

  // Whether rows of x [B, L, H, D] can be read in place: float32, unit inner stride, a row stride
  // ≥ D that fits an int (or a single row).
  bool direct(const View& x) const;

  // Whether dq [B, M, Hq, D] can take the tile products' sums in place (as attention_cpu.cc):
  // float32, unit inner stride, row strides within int, its (b, row, head) rows disjoint.
  bool direct_out(const View& x) const;

  // Q rows [i0, i0 + nq) of head h, read once: qc [nq, D] = Q + u_h, and yt [nq, R] = Ỹ, Y = (Q + v_h)·W_h
  // with each pair rotated by its row's angle (Ỹ₀ = Y₀ sin α + Y₁ cos α, Ỹ₁ = Y₁ sin α − Y₀ cos α).
  // Q + v_h is left in w->qv.
  void load_q(I b, I h, I i0, I nq, Scratch* w, float* qc, float* yt) const;

  // Keys [j0, j0 + nk) of kv head kh: kt [D + R, kLdt] = [K | C]ᵀ, transposed straight from k
  // where it is read in place (else from its rows loaded into w->kc), and C's rows from ct_ (where
  // kept, else transposed from the table).
  void load_keys_t(I b, I kh, I j0, I nk, Scratch* w, float* kt) const;

  // kt [D + R, kLdt] = [K | C]ᵀ of keys [j0, j0 + nk) from their rows K (row stride ldk).
  void keys_t(const float* K, I ldk, I j0, I nk, float* kt) const;

  // ct [R, kLdt] = Cᵀ of keys [j0, j0 + nk): ct_'s rows where kept, else the table's transposed.
  void c_t(I j0, I nk, float* ct) const;

  // Per key block [B, Hkv, ⌈N/Bk⌉], [K | C]ᵀ [D + R, kLdt] (load_keys_t's tiles; columns past a
  // block's keys unset) and V's rows [Bk, D] (dense for P·V, which reads a row per step: in place,
  // rows Hkv·D floats apart share few L1 sets), for the forward's tasks, which would otherwise
  // transpose each block once per query block of each of its G heads; null where that is once
  // (nothing to save) or where it would take more than kPanelFactor·cache_limit floats.
  I panel_size() const { return (d_.D + d_.R) * kLdt + kBk * d_.D; }
  std::unique_ptr<float[]> key_panels() const;

  // The band of the tile whose key 0 − query 0 distance is base (tile_gemm.h): causal tiles
  // crossing the diagonal.
  I band(I base, I nk) const { return p_.causal && base + nk - 1 > 0 ? -base : kNoBand; }

  // w->s [nq, Bk] = scale·[Qu | Ỹ]·[K | C]ᵀ of qc [nq, D + R] and kt = [K | C]ᵀ [D + R, kLdt] (the
  // kNP form). A banded tile (returned) holds −inf past each row's last visible key up to the
  // softmax's reach (band_reach, attention_tiles.h) and zeros beyond it, which the products read as
  // P and dS.
  I logits(I q0, I nq, I j0, I nk, const float* qu, const float* yt, const float* kt, Scratch* w) const;

  // Rows [q0, q0 + nq) of heads h … h + nh − 1 (of one kv group; nh > 1 only where no tile needs a
  // band): w->o [nh·nq, D] = softmax(logits)·V, lse [nh·nq], head by head.
  // careful_v: P·V of the sanitized V, its non-finite entries' terms added back (attention_tiles.h) —
  // taken again with it when a row of finite lse comes out non-finite (a NaN or ±inf in V).
  void forward_block(I b, I h, I nh, I q0, I nq, Scratch* w, double* lse, const float* panels,
                     bool careful_v = false) const;

  // The end of pass 2 for head h: qa (row stride ld) holds dQc of its M rows, xt [M, R] X̃. X = X̃
  // rotated back (X₀ = X̃₀ sin α − X̃₁ cos α, X₁ = X̃₀ cos α + X̃₁ sin α); qa += X·W_hᵀ (dQ), stored
  // into dq when given; into gph (du [D], Σ X [R], dW [D, R]) Σ_i dQc_i, Σ_i X_i and (Q + v_h)ᵀ·X,
  // Q + v_h sanitized: each summed in float over a block of kBq rows, the blocks in double.
  void finish_rows(I b, I h, float* qa, I ld, const float* xt_all, Scratch* w, double* gph,
                   const View& dq) const;

  // g.u = Σ_b du, g.v = W_h·Σ_b Σ X, g.rel_proj = Σ_b dW, from gp [B, Hq, D + R + D·R].
  void write_param_grads(const std::vector<double>& gp, const EncodingGrads& g) const;

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

}  // namespace posenc::fused::xl_cpu
