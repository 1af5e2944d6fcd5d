// Private: the fused tile attention of nope, the rotary and the bias encodings (what it computes and
// how: attention_cpu.cc, whose dispatcher runs it). class Fused holds one call's state; its members
// are defined by family: attention_fused_bias.cc (construction, the bias tables, their gradients),
// attention_fused_forward.cc, attention_fused_backward.cc and attention_fused_bf16.cc (the products
// on bfloat16 pairs).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "attention/attention_check.h"
#include "attention/attention_fused_simd.h"
#include "attention/attention_tiles.h"
#include "attention/tile_gemm.h"
#include "attention/tile_gemm_bf16.h"
#include "enc/bias/fire/fire_math.h"
#include "posenc/attention.h"

namespace posenc::fused_cpu {

using attn::Dims;
using namespace attn_fast;  // NOLINT: the shared tile machinery

// One side's rotation table (queries or keys): a·ρ·cos φ, a·ρ·sin φ of every token and pair,
// [nh, nb, n, half] — nh = Hq for rope2d mixed (per-head angles), else 1; nb = B when the positions
// differ per batch row, else 1. Angles and scales come from the call's rotary plan (rotary_plan.h),
// formed in double; role +1 for queries, −1 for keys (xPos's ζ^(±(p − c)/s)).
struct RotTab {
  I n = 0, half = 0, nb = 1, nh = 1;
  std::vector<float> c, s;
  void build(const Extra& xs, const rotary::Plan& pl, const std::vector<I>& ids, I B, I count, bool batched,
             I heads, int role, int threads);
  std::size_t at(I b, I h, I i) const {
    return ix((((nh > 1 ? h : 0) * nb + (nb > 1 ? b : 0)) * n + i) * half);
  }
  // Rows i, i + 1, … of (b, h) follow one another.
  const float* cos_at(I b, I h, I i) const { return &c[at(b, h, i)]; }
  const float* sin_at(I b, I h, I i) const { return &s[at(b, h, i)]; }
};

// Rows of a tile as sgemm reads them: p with row stride ld (in the input itself, or in scratch).
struct Tile {
  const float* p;
  I ld;
};

// Where a backward task accumulates the dQ rows of its G query heads (float32): in dq itself or in
// a buffer [G, rows, D] whose first row is row0. p == nullptr: dq is not wanted.
struct Acc {
  float* p = nullptr;
  I ld = 0, hs = 0, row0 = 0;  // row stride, head stride
  float* row(I g, I i) const { return p + g * hs + (i - row0) * ld; }
};

// Per-thread scratch, kept by each thread between calls (thread_scratch): at the study model's size
// (B·L = 256 rows a call, D = 16) allocating and zero-filling it afresh took ~2% of a training step.
// Nothing reads it before writing it (the tests pass with it NaN-filled), so it is never cleared; it
// keeps ~(8·128·D + 2·128²) floats a thread (~200 KB at D = 16) after the last call.
struct Scratch {
  std::vector<float> q, k, v, s, dp, o, dout, dk, dv, ml, diag, dkg, row;
  std::vector<float> kt, vt;  // backward: Kᵀ, Vᵀ of the key block [D, kLdt] (the kNP products)
  std::vector<float> qs, ks, vs, dos;  // careful steps (non-finite inputs): sanitized copies
  // the bfloat16-rate forward (tile_gemm_bf16.h): Q [Bq, D/2], Kᵀ [D/2, kLdt] and P [Bq, Bk/2] as
  // pairs; V [Bk/2, D] as row pairs. Its backward (keys_rate): kb, pb as there, vb K's row pairs,
  // vtb Vᵀ [D/2, kLdt], ib P or dS as row pairs [Bq/2, kLdt]; under a rotary encoding kft the
  // rotated K̃ᵀ [D, kLdt] in float32 (the logits' kNP product)
  std::vector<attn_fast::Pair> qb, kb, pb, vb, vtb, ib;
  std::vector<float> kft;
  void init(I D) {
    q.resize(ix(kBq * D));
    k.resize(ix(kBk * D));
    v.resize(ix(kBk * D));
    vs.resize(ix(kBk * D));
    s.resize(ix(kBq * kBk));
    o.resize(ix(kBq * D));
    ml.resize(ix(2 * kBq));
    diag.resize(ix(kBq + kBk));
  }
  void init_bf16(I D) {
    qb.resize(ix(kBq * D / 2));
    kb.resize(ix(D / 2 * kLdt));
    pb.resize(ix(kBq * kBk / 2));
    vb.resize(ix(kBk / 2 * D));
  }
  void init_bf16_backward(I D) {
    init_bf16(D);
    vtb.resize(ix(D / 2 * kLdt));
    ib.resize(ix(kBq / 2 * kLdt));
    kft.resize(ix(D * kLdt));
  }
  void init_backward(I D) {
    dp.resize(ix(kBq * kBk));
    dout.resize(ix(kBq * D));
    dk.resize(ix(kBk * D));
    dv.resize(ix(kBk * D));
    dkg.resize(ix(kBk * D));
    row.resize(ix(D));
    kt.resize(ix(D * kLdt));
    vt.resize(ix(D * kLdt));
    qs.resize(ix(kBq * D));
    ks.resize(ix(kBk * D));
    dos.resize(ix(kBq * D));
  }
};

// This thread's scratch.
Scratch& thread_scratch();

// The forward's key panels: every key block's Kᵀ and V packed once per call ([B, Hkv, key blocks]),
// not once per query tile that reads it. bf16: as bfloat16 pairs for the bfloat16 rate; wide: as
// float32 off that rate (16-bit k and v widened), V's rows D floats apart.
struct Panels {
  // Left unset when sized: key_panels writes every element a product reads.
  template <class T>
  struct Unset : std::allocator<T> {
    template <class U>
    struct rebind {
      using other = Unset<U>;
    };
    template <class U>
    void construct(U* p) { ::new (static_cast<void*>(p)) U; }
    template <class U, class... A>
    void construct(U* p, A&&... a) { ::new (static_cast<void*>(p)) U(std::forward<A>(a)...); }
  };
  std::vector<attn_fast::Pair, Unset<attn_fast::Pair>> bf16;
  std::vector<float, Unset<float>> wide;
};

// What a forward wrote, handed to the backward: out [B, M, Hq, D] and lse (float64 [B, Hq, M]).
struct Saved {
  View out, lse;
};


class Fused {
 public:
  Fused(const AttentionParams& p, const Dims& d, const View& q, const View& k, const View& v,
        const EncodingTensors& t, int threads);

  // Forward over every (b, h, query block); out [B, M, Hq, D], lse optional [B, Hq, M] float64.
  void forward(const View& out, const View& lse) const;

  // Backward. dq, dk, dv optional (absent: not computed); parameter gradients g optional. With
  // `saved` (the out and lse this object's forward wrote for the same arguments), pass 1 reads them
  // instead of running the forward again: the same lse and D, bit for bit, when out is float32.
  void backward(const View& dout, const View& dq, const View& dk, const View& dv,
                const EncodingGrads& g, const Saved* saved = nullptr) const;

 private:
  // kLut: a per-head table over every distance of the call (kerple, sandwich); kFire: ψ per distance
  // and per-row linear pieces of the MLP.
  enum class Bias { kNone, kSlopes, kLearned, kT5, kLut, kFire };

  // What pass 2 reads and writes.
  struct Bwd {
    const View& dout;
    bool dir_dout;
    const View &dq, &dk, &dv;
    std::vector<float> lse, Dv;  // [B, Hq, M]
    I npar;                      // parameter gradients per head
    bool freq = false;           // rope2d mixed: dfreqs wanted (npar = r: θˣ then θʸ per pair)
    bool careful = false;        // k or v not finite: the careful steps on every tile
    bool rate = false;           // pass 2's products at the bfloat16 rate where a unit allows (keys_rate)
  };

  // Pass 1: bw->lse and bw->Dv (D = rowsum(dO ⊙ out)) of every row, from the forward again (at the
  // bfloat16 rate where bw->rate and there are no parameter gradients), or from saved.
  void pass1(Bwd* bw, const Saved* saved) const;
  // The parameter gradients into g: gw [B, Hq, npar], the per-(b, h) sums, summed over the batch.
  void write_param_grads(const std::vector<double>& gw, const Bwd& bw, const EncodingGrads& g) const;

  bool past_only(I h) const { return p_.causal || (nonsym_ && h < d_.Hq / 2); }
  bool future_only(I h) const { return nonsym_ && h >= d_.Hq / 2; }
  // The tile products' band (tile_gemm.h) for head h's tile whose key 0 − query 0 distance is base
  // (kp − qp): past-only heads see key j from row i when j ≤ i − base.
  I band(I h, I base) const { return past_only(h) && !future_only(h) ? -base : attn_fast::kNoBand; }

  // Task → (b, h, query block): (b, h)-major, so that the threads share a head's K and V in cache;
  // within a head the costly blocks first (the most keys: last when causal, first for future-only
  // heads), so the cheap ones even out the threads' ends.
  void query_task(I task, I nqb, I* b, I* h, I* q0, I* nq) const {
    I qi;
    attn_fast::head_major_task(task, nqb, d_.Hq, b, h, &qi);
    const I qb = future_only(*h) ? qi : nqb - 1 - qi;
    *q0 = qb * kBq;
    *nq = std::min(kBq, d_.M - *q0);
  }

  // Query rows [ilo, ihi) of head h that see any key of the block at kp0 .. kp0 + nk − 1.
  void query_range(I h, I kp0, I nk, I* ilo, I* ihi) const {
    *ilo = 0;
    *ihi = d_.M;
    if (past_only(h)) *ilo = std::clamp<I>(kp0 - d_.q_off, 0, d_.M);
    if (future_only(h)) *ihi = std::clamp<I>(kp0 + nk - d_.q_off, 0, d_.M);
  }

  // Whether the products may take the bfloat16 rate (where the CPU has it): q, k and v
  // bfloat16, even D within the tile GEMM's, k and v rows with unit inner stride (packed from the
  // input as they are).
  bool bf16_rate(const View& q, const View& k, const View& v) const {
    return q.dtype == DType::kBF16 && k.dtype == DType::kBF16 && v.dtype == DType::kBF16 && d_.D % 2 == 0 &&
           gemm_ && k.strides[3] == 1 && v.strides[3] == 1;
  }
  // Whether sgemm can read rows of x in place: float32, unit inner stride, a row stride ≥ D that
  // fits an int (or a single row).
  bool direct(const View& x) const {
    return x.dtype == DType::kF32 && (x.strides[3] == 1 || d_.D == 1) &&
           (x.shape[1] == 1 || (x.strides[1] >= d_.D && x.strides[1] <= INT_MAX));
  }
  // Whether dq [B, M, H, D] can take sgemm's accumulation in place: direct, and its (b, row, head)
  // rows never overlap one another.
  bool direct_out(const View& x, I H) const {
    if (!direct(x) || x.strides[3] != 1) return false;
    if (H > 1 && x.strides[2] < d_.D) return false;
    const I row = (H - 1) * x.strides[2] + d_.D;
    if (x.shape[1] > 1 && x.strides[1] < row) return false;
    return x.shape[0] == 1 || x.strides[0] >= (x.shape[1] - 1) * x.strides[1] + row;
  }
  Acc dq_in_place(const View& dq, I b, I kh) const {
    float* base = static_cast<float*>(dq.data) + b * dq.strides[0] + kh * d_.G * dq.strides[2];
    return Acc{base, d_.M == 1 ? d_.D : dq.strides[1], dq.strides[2], 0};
  }
  void zero_rows(const Acc& a, I g, I i0, I i1) const {
    for (I i = i0; i < i1; ++i) std::fill(a.row(g, i), a.row(g, i) + d_.D, 0.f);
  }
  // dQ rows [i0, i1) of query head g of (b, kh), accumulated in a: rotated back by the transpose
  // a·ρ·R(−φ) (rotary encodings) and, from a buffer, stored into dq (when dq is wanted: rope2d
  // mixed accumulates dQ̃ for dfreqs even without it).
  void finish_dq(const View& dq, bool in_place, const Acc& a, I b, I kh, I g, I i0, I i1) const;

  // rope2d mixed: fg [2, half] (head h's ∂/∂θˣ, ∂/∂θʸ) += Σ over the rows [i0, i0 + n) of the
  // queries (query) or keys of (px − x₀, py − y₀)·(g_b·ỹ_a − g_a·ỹ_b) (pos0_: the same total), ỹ
  // the row rotated for head h (tile rows at yt, row stride yld; null: the query rows, loaded and
  // rotated here into tmp [D]) and g its gradient (rows at gt, row stride gld).
  void freq_grad_rows(bool query, I b, I h, I i0, I n, const float* yt, I yld, const float* gt, I gld,
                      float* tmp, double* fg) const;

  // Rows [r0, r0 + n) of head `head` of x [B, L, H, D]: in place when `dir` and no rotation; with a
  // rotation table, rotated as query head th sees them into buf [n, D] (when `dir`, straight from x:
  // one pass); else converted into buf first.
  Tile rows(const View& x, bool dir, I b, I r0, I n, I head, float* buf, const RotTab* tab,
            I th) const;

  // n rows of x (row stride ld), tokens i0, i0 + 1, … of batch row b as query head th sees them,
  // rotated by a·ρ·R(φ) or its transpose a·ρ·R(−φ) (inverse).
  void rotate(float* x, I n, I ld, const RotTab& tab, I b, I th, I i0, bool inverse) const {
    xs_.rot_rows(x, ld, x, n, ld, tab.cos_at(b, th, i0), tab.sin_at(b, th, i0), tab.half, interleaved_,
                 inverse);
  }

  // The bias of head h for the tile whose key 0 − query 0 distance is `base` (kp − qp):
  // diag[t] for kp − qp = base + t − (nq − 1), t ∈ [0, nq + nk − 1).
  void tile_bias(I h, I base, I nq, I nk, float* diag) const;

  // w->s [nq, Bk] = scale·Q·Kᵀ + bias, masked entries −inf. Kt: K's rows transposed [D, kLdt] (the
  // tile GEMM's kNP form), or null.
  // out: where the tile goes instead of w->s (rows kBk apart).
  void logits(I h, I q0, I nq, I j0, I nk, const Tile& Q, const Tile& K, Scratch* w,
              const float* Kt = nullptr, float* out = nullptr) const;

  // The rest of logits() on S [nq, Bk] holding scale·Q·Kᵀ: the bias, and the masks.
  void finish_logits(I h, I q0, I nq, I nk, I base, I bd, float* S, float* diag) const;

  // Rows [q0, q0 + nq) of head h: o [nq, D] = softmax(logits)·V, lse [nq]. careful_v: P·V of the
  // sanitized V, its non-finite entries' terms added back (attention_tiles.h) — taken again with it
  // when a row of finite lse comes out non-finite (a NaN or ±inf in V).
  // rate_ok: the bfloat16-rate products where the call has them (bf16_): the forward's blocks, and the
  // backward's pass 1 where it has no parameter gradients (see backward()).
  // panels: key_panels() of the call, or null.
  void forward_block(I b, I h, I q0, I nq, Scratch* w, float* o, double* lse, bool careful_v = false,
                     bool rate_ok = false, const Panels* panels = nullptr) const;

  // One key block [j0, j0 + nk) of forward_block at the bfloat16 rate (tile_gemm_bf16.h): the
  // products read Q (w->qb), K, V and P as bfloat16 pairs, P rounded to bfloat16 for its product
  // (docs/attention.md); the softmax stays float32. Under a rotary encoding the logits stay the
  // float32 tile product of the rotated rows (rounded to bfloat16, those moved lse past its 1e-4).
  // panel: the key block's packed Kᵀ and V (key_panels), or null: packed here.
  // qp: Q as pairs, rows ldq pairs apart (bfloat16 q in place, or w->qb).
  void bf16_block(I b, I h, I q0, I nq, I j0, I nk, I bd, const Tile& Q, const attn_fast::Pair* qp, I ldq,
                  Scratch* w, float* o, const attn_fast::Pair* panel) const;
  // Row `row` of (b, head h) of bfloat16 q as pairs read in place where q's rows allow it (unit inner
  // stride, every row 4-byte aligned), else null.
  const attn_fast::Pair* q_pairs(I b, I row, I h) const {
    const auto at = reinterpret_cast<std::uintptr_t>(q_.data);
    const bool even = q_.strides[0] % 2 == 0 && q_.strides[1] % 2 == 0 && q_.strides[2] % 2 == 0;
    if (q_.strides[3] != 1 || at % 4 != 0 || !even) return nullptr;
    return reinterpret_cast<const attn_fast::Pair*>(row_at(q_, b, row, h));
  }

  // Keys [j0, j0 + nk) of (b, kv head kh) as pairs transposed, Kᵀ [D/2, kLdt]; their values as row
  // pairs, V [kBk/2, D] (tile_gemm_bf16.h).
  const std::uint16_t* row_at(const View& x, I b, I row, I kh) const {
    return static_cast<const std::uint16_t*>(x.data) + b * x.strides[0] + row * x.strides[1] + kh * x.strides[2];
  }
  void pack_keys(I b, I kh, I j0, I nk, attn_fast::Pair* kt) const {
    bf16_->transpose_pairs(row_at(k_, b, j0, kh), k_.strides[1], nk, d_.D / 2, kt, kLdt);
  }
  void pack_values(I b, I kh, I j0, I nk, attn_fast::Pair* vp) const {
    bf16_->interleave_rows(row_at(v_, b, j0, kh), v_.strides[1], nk, d_.D, vp, d_.D);
  }
  // A key block's panel: Kᵀ [D, kLdt] then V, as bfloat16 pairs (V as row pairs [kBk/2, D]) for
  // the bfloat16 rate, or widened to float32 (V [kBk, D]); sizes in pairs or floats.
  I bf16_panel() const { return d_.D / 2 * kLdt + kBk / 2 * d_.D; }
  I wide_panel() const { return d_.D * kLdt + kBk * d_.D; }
  // Where key block kb of (b, kv head kh) starts in panels of `size` elements.
  I panel_at(I b, I kh, I kb, I size) const { return ((b * d_.Hkv + kh) * ((d_.N + kBk - 1) / kBk) + kb) * size; }

  // The forward's panels (Panels), where each key block has two or more readers (G heads × query
  // blocks), k is not rotated, and they fit kPanelBytes; else both empty (the blocks packed per tile).
  // rate: for blocks that take the bfloat16 rate where the call has it (else the float32 products).
  Panels key_panels(bool rate) const;

  // Q (rotated where it is) and dO of the G query heads of kv head kh, dense [G, M, D] each (Q's,
  // then dO's), once per pass-2 call, where together they fit the dQ buffer's limit; else empty.
  std::vector<float> dense_rows(const Bwd& bw, I b, I kh) const;

  // Pass 2 over key blocks [kb0, kb1) of (b, kv head kh), every query head of the group and every
  // query block that sees the key block: dK, dV of those keys stored; dQ added into acc; parameter
  // gradients added into gwu [G, npar] (when given).
  void keys(const Bwd& bw, I b, I kh, I kb0, I kb1, const Acc& acc, double* gwu, Scratch* w) const;

  // The unit's Q (rotated, where it is) and dO as bfloat16 pairs for keys_rate (exact but for the
  // rotation: both are bfloat16), each as rows [G, M, D/2] (the S and dP products' A) and transposed,
  // pairs along the queries [G, D, Mh] (dK's and dV's A; Mh = rate_ld(): ⌈M/2⌉ rounded up to 16,
  // zeros past M): Q's rows, dO's rows, Qᵀ, dOᵀ; under a rotary encoding *qf the rotated Q̃ in
  // float32 [G, M, D] (the logits' A). False where they would pass the dQ buffer's limit, or where a
  // row of the unit takes the careful steps (lse or D not finite: keys() has them).
  bool rate_rows(const Bwd& bw, I b, I kh, Scratch* w, std::vector<attn_fast::Pair>* pr,
                 std::vector<float>* qf) const;
  // The row stride of rate_rows()' transposed pairs: ⌈M/2⌉ rounded up to 16 (transpose_pairs writes
  // whole 16s of columns).
  I rate_ld() const { return ((d_.M + 1) / 2 + 15) / 16 * 16; }

  // keys() at the bfloat16 rate (bw.rate): S, dP, dV, dK and dQ as products of bfloat16 pairs
  // (tile_gemm_bf16.h); P and scale·dS rounded to bfloat16 for their products, the softmax and dS
  // itself float32 as in keys(). Under a rotary encoding S stays the float32 product of the rotated
  // rows (as in the forward), and dK̃, dQ̃ read Q̃, K̃ rounded to bfloat16. dKᵀ and dVᵀ [D, nk] are
  // summed (their A is Qᵀ or dOᵀ, the B the tile's P or dS as pairs of query rows) and transposed
  // once per key block. A query range starts at an even row, so that its pairs are whole (a row
  // before the range sees no key: P = dS = 0; dQ skips it). False, nothing done, where rate_rows()
  // declines.
  bool keys_rate(const Bwd& bw, I b, I kh, I kb0, I kb1, const Acc& acc, double* gwu, Scratch* w) const;

  // A thread's tiles of the stored backward (stored_unit): S and dP of one query block's key blocks
  // [2, blocks, kBq, kBk] each block's S then its dP; the unit's dK, dV, K (rotated) [3, N, D] and
  // Kᵀ, Vᵀ per key block [2, blocks, D, kLdt]; per row m, l, the running Σ P·dP, lse and D [5, kBq].
  // At the bfloat16 rate (stored_unit_rate) unit holds dKᵀ, dVᵀ per key block and pairs the unit's
  // K and V as the products read them and the query block's Q and dO.
  struct Store {
    std::vector<float> tiles, unit, row;
    std::vector<attn_fast::Pair> pairs;
  };
  // Whether the backward takes the stored path: no saved statistics, products through the tile GEMM
  // (at the bfloat16 rate: not under a rotary encoding or with future-only heads), not rope2d mixed,
  // k and v finite, whole units on every thread, and a thread's Store within score_store_limit.
  bool stored_ok(const Bwd& bw, const Saved* saved) const;
  // The stored backward, every unit (b, kv head) on one thread: stored_unit, then dQ finished.
  void stored_backward(const Bwd& bw, std::vector<double>* gw) const;
  // One unit, per query head and query block: sweep 1 forms S and dP of each key block it sees
  // (kept in st), the online softmax's lse and D = Σ_j P_ij·dP_ij (= rowsum(dO ⊙ out)); sweep 2
  // turns the kept tiles into P and dS and adds dV, dK (the unit's rows in st) and dQ (into acc):
  // five tile products per tile where the forward again and pass 2 take seven. Then dK, dV stored.
  void stored_unit(const Bwd& bw, I b, I kh, const Acc& acc, double* gwu, Scratch* w, Store* st) const;
  // stored_unit at the bfloat16 rate (bw.rate): S, dP, dV, dK and dQ as keys_rate forms them, from
  // pairs packed once per unit (K, V) or per query block (Q, dO); dKᵀ, dVᵀ summed per key block.
  // False (acc and gwu partly written) where a query block has a row that sees no key or a non-finite
  // lse or D: the caller then runs stored_unit, which has the careful steps.
  bool stored_unit_rate(const Bwd& bw, I b, I kh, const Acc& acc, double* gwu, Scratch* w, Store* st) const;

  // Key-block cuts [T + 1] of kv head kh into T parts of about equal work (the query rows each key
  // block meets, over the group's heads, plus a share for loading the block).
  std::vector<I> key_cuts(I kh, I T) const;

  // Pass 2 of one unit (b, kh) split over the threads: T parts of its key blocks (key_cuts), each
  // with its own dQ rows (part 0 in the primary accumulator — dq itself or a buffer —, the others
  // in buffers of the rows they touch) and parameter gradients; then summed in part order, so the
  // result depends on the thread count only, not on which thread ran what.
  void split_unit(const Bwd& bw, I b, I kh, bool dq_dir, std::vector<double>* gw) const;

  // Parameter gradients of one tile from dS [nq, Bk]: diagonal sums, then per distance.
  void param_grads(I h, I base, I nq, I nk, const float* dS, float* diag, double* gwh) const;

  // kerple, sandwich: the per-head tables over the M + N − 1 distances of the call (bias.h formulas
  // in double, rounded once).
  void build_lut(const EncodingTensors& t);

  // fire: tiles off the diagonal spanning at most this many segment boundaries take fire_span.
  static constexpr I kFireSpan = 3;

  // fire: the MLP's pieces, ψ per distance, the normaliser per query row.
  void build_fire(const EncodingTensors& t);

  // FIRE over the rows [q0, q0 + nq) of head h against nk keys, the tile's key 0 − query 0 distance
  // being `base`. Each row splits into runs of keys whose normalised distance x = ψ(d)/ψ(n) lies in
  // one linear piece of the MLP: keys before the query (d falling along the row) and from it on (d
  // rising), cut where d crosses the row's thresholds (the smallest d with x ≥ t_k, tabulated per
  // row; the diagonal d = 0 its own run). Forward (S): S += α + (β/ψ(n))·ψ(d) over each run.
  // Backward (dS): each run's Σ dS, Σ dS·ψ, Σ dS·∂ψ/∂c, turned into the segment moments and the c,
  // L sums of gwh [M0 (S + 2), M1 (S + 2), dc, dL] (fire_math.h).
  void fire_tile(I h, I q0, I base, I nq, I nk, float* S, const float* dS, double* gwh) const;

  // fire: the gradients of the six tensors from the per-head sums [Hq, npar] (fire_math.h).
  void fire_grads(const std::vector<double>& sum, const FireTensors& g) const;

  const AttentionParams& p_;
  Dims d_;
  View q_, k_, v_;
  int threads_ = 1;
  Simd simd_;
  Extra xs_;
  TileGemmFn gemm_;  // the tiles' small GEMM (D ≤ kTileGemmMaxD), else null: OpenBLAS
  TileTransposeFn tr_ = tile_transpose_fn();  // Kᵀ, Vᵀ of key blocks (tile_gemm.h)
  const attn_fast::Bf16Ops* bf16_ = nullptr;  // the bfloat16-rate products (bf16_rate())
  bool dir_q_ = false, dir_k_ = false, dir_v_ = false;  // read in place (see direct())
  CarefulForward cf_;  // how the forward finds NaN rows (attention_tiles.h)
  bool interleaved_ = true, nonsym_ = false;
  RotTab tab_q_, tab_k_;
  const RotTab* tq_ = nullptr;  // rotation tables of the queries and keys (rotary encodings)
  const RotTab* tk_ = nullptr;
  bool per_head_ = false;  // rope2d mixed: the tables are per query head
  double pos0_[2] = {0, 0};  // rope2d mixed: the positions dfreqs' sums are taken about (x, y)
  Bias bias_ = Bias::kNone;
  std::vector<double> slopes_, sig_;  // alibi [Hq]; learned σ(w) [2, Hq]
  std::vector<float> t5w_;            // t5 [Hq, nb]
  std::vector<std::int32_t> bucket_;  // t5: bucket of kp − qp = rel_lo_ + t
  I rel_lo_ = 0;
  // kerple, sandwich: lut_ [Hq, lut_w_] the bias at kp − qp = rel_lo_ + t; kerple also dlut_
  // [Hq, lut_w_, 2] its derivatives by r1 and r2 (double: the backward's weights).
  std::vector<float> lut_;
  std::vector<double> dlut_;
  I lut_w_ = 0;
  // fire: the MLP as pieces (fire_math.h); ψ(|kp − qp|) and ∂ψ/∂c per distance (float, rel_lo_ + t);
  // per query row 1/ψ(n), ∂ψ(n)/∂c/ψ(n) and the threshold's factor; α per head and segment.
  fire::Values fire_v_;
  fire::Pieces fire_p_;
  std::vector<float> fire_psi_, fire_dpsi_, fire_a_;
  std::vector<double> fire_inv_, fire_cf_, fire_lf_;
  std::vector<I> fire_th_;  // [M, S]: per row, the smallest distance in each breakpoint's segment
};

}  // namespace posenc::fused_cpu
