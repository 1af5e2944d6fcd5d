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
// ---- backward, stored (attention_cope_backward_stored.cc) -----------------------------------------
//   Where a thread's tiles fit score_store_limit (attention_tiles.h; N up to ~12000 at D = 64):
//   per (b, kv head), OpenMP dynamic over B·Hkv, its K and V rows loaded once; per query head and
//   query block, sweep 1 is the forward walk above (track on) that keeps each key block's At
//   (before the step turns it into P) and dPᵀ = V·dOᵀ, and sums D_i = Σ_j P_ij·dP_ij in the lanes,
//   rescaled with the running sum, in place of O = P·V; sweep 2 walks the kept tiles forward with
//   pass 2's tile step and its three products, then dQ += C·E, dE += Cᵀ·Q for the block. Five tile
//   products per tile where pass 1 and pass 2 take seven; dK and dV summed in float [N, D] over the
//   unit's blocks and rounded once; the same bits at any thread count (a unit is one thread's). D
//   rounds otherwise than dO·out, so its gradients differ from pass 2's in the last bits. Memory per
//   thread: At and dPᵀ of every key block [2, N, Bq] and K, V, dK, dV [4, N, D] floats (8 MiB at
//   N = 4096, D = 64).
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
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/attention_cope_fused.h"

namespace posenc::cope_cpu {

std::atomic<I> g_chunk_rows{0};

Cope::Cope(const Dims& d, const View& q, const View& k, const View& v, const View& table, bool causal,
           int threads)
    : d_(d), q_(q), k_(k), v_(v), causal_(causal), threads_(threads), simd_(simd()),
            kern_(cope_fast::kernels()), gemm_(attn_fast::tile_gemm_for(d.D)) {
  ncol_ = cope::rows_reached(d.npos, d.N);
  const std::vector<double> e = to_doubles(table);  // [npos, D]
  E_.assign(e.begin(), e.begin() + ncol_ * d.D);
  top_ = static_cast<float>(d.npos - 1);
}

I Cope::chunk_rows() const {
  const I set = g_chunk_rows.load(std::memory_order_relaxed);
  if (set > 0) return set;
  const I row_bytes = 4 * d_.G * (5 * d_.D + 2 * ncol_);
  return std::max<I>(kBq, kChunkBytes / row_bytes / kBq * kBq);
}

I Cope::cols(I q0, I nq) const {
  if (!causal_) return ncol_;
  const I seen = std::clamp<I>(d_.q_off + q0 + nq - 1 - d_.k_off + 1, 0, d_.N);
  return std::min(ncol_, seen + 2);
}

std::vector<float> Cope::key_rows() const {
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

}  // namespace posenc::cope_cpu


namespace posenc {
namespace fused {

using namespace attn_fast;  // NOLINT: the shared tile machinery
using cope_cpu::Cope;
using cope_cpu::g_chunk_rows;

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

