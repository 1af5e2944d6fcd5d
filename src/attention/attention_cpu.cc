// The fused (flash-style) attention: the public posenc::attention_forward / attention_backward
// dispatch here. This comment describes the kernel, class Fused (attention_fused_cpu.h; its members
// in attention_fused_bias.cc, attention_fused_forward.cc, attention_fused_backward.cc and
// attention_fused_bf16.cc, its SIMD helpers in attention_fused_simd.cc).
//
// Validation is shared with the reference (attention_check.h), so errors are identical. The fused
// kernels run nope, the rotary encodings (rope, rope2d axial and mixed, mrope, xpos), alibi
// (symmetric, nonsymmetric, learned), t5, kerple, sandwich and fire
// on float32, bfloat16 and float16 q/k/v (any strides; tiles are converted to float32 on load,
// outputs rounded once on store); xl and cope run the kernels of attention_xl_cpu.cc and
// attention_cope_cpu.cc where those are built. A forward of M ≤ 16 queries that the decode kernel
// takes runs it first (attention_decode.h), whatever its size. Float64 inputs, outputs that overlap
// an input, and other small problems (fewer than 2^14 (query, key) pairs over batch and heads: as
// fast there, and exact) fall back to posenc::reference (attention_ref.cc, double accumulation) — the function the
// tests compare against. The kernels themselves, without the small-problem rule, are posenc::fused::
// (attention_fused.h) for the tests.
//
// Shape letters: B batch, M queries, N keys, Hq query heads, Hkv kv heads (G = Hq/Hkv), D head
// dim; Bq × Bk the tile (attention_tiles.h). Query i sits at qp = q_off + i, key j at
// kp = k_off + j. T: the call's thread count (one below 2^15 pairs).
//
// Tile products. Each is one call of tile_gemm() (tile_gemm.h): for head dims D ≤ kTileGemmMaxD
// (128) the Highway small GEMM of tile_gemm.cc (no packing but a transpose of the NT form's Bᵀ;
// deterministic, the same sum for an element wherever it lies), else cblas_sgemm; a single query row
// (a decode step) calls cblas_sgemv whatever D. On a tile that the causal diagonal crosses, the
// products, the softmax and the exponentials take a band (tile_gemm.h: only keys j ≤ i − base of
// row i matter) and skip the masked half: the tile holds −inf past each row's last key up to a
// whole 16 (band_reach) and zeros beyond, so what a product still reads there is P = dS = 0. With
// bfloat16 q, k, v on a CPU with AMX (or AVX512_BF16, AMD), the forward's products run on bfloat16
// pairs instead (bf16_block, tile_gemm_bf16.h; docs/attention.md), and with a bfloat16 dout so do
// the backward's (keys_rate; not rope2d mixed).
//
// Tile rows. A float32 view with unit inner stride (and a row stride sgemm accepts) is read in
// place: the GEMM gets its pointer and row stride, no copy. Otherwise, and for q and k under a rotary
// encoding, rows are converted into per-thread scratch and rotated by a·ρ·R(φ) (SIMD; rows that could be
// read in place rotated on their way in, one pass, others converted first), from
// per-token tables built once per call for the queries and for the keys (RotTab: a·ρ·cos φ,
// a·ρ·sin φ of every token and pair, from the call's rotary::Plan — RoPE's frequencies in either
// angle mode, 2D axial / mixed, M-RoPE's sections, xPos's ζ^(±(p − c)/s) — angles formed in double,
// the exact-angle sincos of core/simd-inl.h). rope2d mixed's angles are per head: its tables are
// per query head, and a key block is rotated (and its dK rotated back) once per query head of the
// group. The tile code is the same for every rotary encoding; only the tables differ.
//
// ---- forward, per task (b, h, query block), OpenMP dynamic over B·Hq·⌈M/Bq⌉ --------------------
//   Tasks run (b, h)-major, so that the threads share one head's K and V in cache; within a head
//   the blocks with the most keys go first (the last ones when causal), so that the cheap ones
//   even out the threads' ends.
//   Q [Bq, D]; for each key block not wholly masked (causal / nonsymmetric ALiBi give the range):
//     S [Bq, Bk] = scale·Q·Kᵀ (tile_gemm; cblas_sgemv for a single query row: a decode step);
//     + bias: it depends on kp − qp only, so the tile's Bq + Bk − 1 distinct values are computed
//       once (ALiBi −m·|Δ|, learned −σ(w)·|Δ| per side, T5 W[bucket(Δ), h] with the bucket of
//       every Δ the call meets tabulated up front) and row i adds a slice of that diagonal array;
//       KERPLE and Sandwich: a per-head table over every Δ of the call (Hq·(M + N − 1) floats,
//       built once) whose tile slice row i adds in place;
//     FIRE depends on qp too (ψ(max(L, qp))): its MLP is piecewise linear in x = ψ(Δ)/ψ(n)
//       (fire_math.h), so row i is a few runs of keys, each adding α + (β/ψ(n_i))·ψ(|Δ|) over a
//       slice of a per-call ψ table (runs cut where |Δ| reaches the row's tabulated threshold of
//       an MLP breakpoint, O(M·S) integers built once; usually one or two runs per row and part):
//       no per-pair MLP;
//     mask (−inf), online softmax: m' = max(m, rowmax S); P = exp(S − m'); l = l·e^{m−m'} + ΣP;
//     O = O·e^{m−m'} + P·V;
//   out = O / l, lse = m + log l (−inf and out = 0 for a row with every key masked; NaN and out all
//     NaN for a NaN row: a row max of NaN or +inf, tested once per row and tile).
//   Non-finite inputs (posenc/attention.h): the careful steps of attention_tiles.h — NaN rows found
//   by a test of the logits, products on sanitized copies with the non-finite terms added back,
//   dS = 0 where P = 0 — decided per call as described there; none of them runs on finite inputs.
//   Memory: O((Bq + Bk)·D + Bq·Bk) per thread, the rotary tables O(B'·(M + N)·r) (B' = B when the
//   positions differ per batch row, else 1; times Hq for rope2d mixed), t5's buckets O(M + N),
//   the kerple / sandwich tables O(Hq·(M + N)), fire's O(M + N) and its thresholds O(M·W).
//
// ---- backward (FlashAttention-2, recompute) -----------------------------------------------------
//   pass 1, per (b, h, query block), ordered as the forward: the forward gives out and lse (or,
//     from attention_backward_saved, the out and lse a caller kept from its forward, and from
//     attention_backward_from_stats those of the larger attention a key shard belongs to: read, not
//     recomputed); Dᵢ = dOᵢ·outᵢ. Kept: lse, D [B, Hq, M] (float32), nothing else.
//   pass 2, per unit (b, kv head), key-major: for each key block, for each of the unit's G query
//     heads and its query blocks not wholly masked:
//       S = scale·Q·Kᵀ + bias, P = exp(S − lse);  dP = dO·Vᵀ;  dV += Pᵀ·dO;  dS = P ⊙ (dP − D);
//       dK += scale·dSᵀ·Q;  dQ += scale·dS·K;
//     S and dP are kNP products (tile_gemm.h) reading Kᵀ and Vᵀ of the key block, transposed once
//     for all its query tiles (per query head for rope2d mixed's K), not packed again per product;
//     the other products read K, Q and dO as rows D floats apart, never at a tensor's row stride
//     (Hq·D floats: such rows share few L1 sets): K's rows copied per key block, Q (rotated) and dO
//     of the unit's rows copied once into dense [G, M, D] arrays where both fit kDqBufferBytes (else
//     per tile); dK, dV of the block stored once it is done (rotary: dK rotated back by the transpose
//     a·ρ·R(−φ); mixed: per query head, then summed); dQ summed in float32 over the key blocks — in
//     a [G, M, D] buffer per thread where that fits kDqBufferBytes or dq is not float32 with rows
//     that never overlap, else in dq itself — and rotated back / stored at the end; rope2d mixed's dfreqs from each
//     complete dK̃ block and dQ̃ row before they are rotated back (Σ (p − p₀)·(g_b·ỹ_a − g_a·ỹ_b),
//     p₀ the middle of the call's positions: the same sum, since Σ ∂L/∂φ = 0 per head and pair,
//     without cancellation at large positions; dQ̃ is accumulated for it even without dq); parameter
//     gradients from the tile's diagonal sums Σ_{j−i = t} dS (t5: dW[bucket, h];
//     learned ALiBi: dw[side, h] += Σ dS·(−σ(1−σ)|Δ|); KERPLE: dr[h] += Σ dS·∂b/∂r at each Δ, from
//     the table of derivatives; FIRE: per row run Σ dS, Σ dS·ψ, Σ dS·∂ψ/∂c into per-segment
//     moments and the c, L sums, turned into the MLP's gradients at the end), per (b, h) in double,
//     summed over b last.
//   Parallelism: the first U − U mod T of the U = B·Hkv units are one task each (OpenMP dynamic;
//     a task owns its dK, dV and dQ rows, so nothing races). Each remaining unit (all of them
//     when U < T: one head, MQA) is split over its key blocks into T contiguous parts of about
//     equal work (causal: the early key blocks meet the most queries), run in parallel; part 0
//     sums dQ in the unit's accumulator, part p > 0 in a buffer of the rows it touches (at most
//     T − 1 more [G, M, D]), added in part order afterwards (in parallel over rows); parameter
//     gradients likewise (rope2d mixed's dQ̃ share of dfreqs per thread of a static schedule over
//     the unit's rows, summed in thread order). So results depend on T (the order of dQ's sums), never on which thread
//     ran what; dK and dV do not depend on T at all.
//   Memory: lse and D (8·B·Hq·M bytes), the forward's per thread plus Kᵀ and Vᵀ (2·D·Bk floats),
//     the dQ buffers and the dense Q and dO (at most 8 MiB a thread) above.
//   Stored path (attention_fused_backward_stored.cc), without a kept out and lse, where a thread's
//     tiles fit kScoreStoreBytes, the units split evenly over the threads, the products go through
//     the tile GEMM and k, v finite (not rope2d mixed): per unit, per query head and query block,
//     sweep 1 over the block's key blocks keeps S and dP = dO·Vᵀ, runs the online softmax (lse) and
//     sums D = Σ_j P_ij·dP_ij alongside (rescaled with l); sweep 2 turns the kept tiles into P, dS
//     and adds dV, dK (the unit's [N, D] rows, stored at the end) and dQ: five products per tile
//     against pass 1's two and pass 2's five. Memory per thread: S and dP [2, Bq, N], the unit's dK,
//     dV and rotated K [3, N, D], its Kᵀ and Vᵀ blocks (2·N·D·kLdt/Bk floats). At the bfloat16 rate
//     (not under a rotary encoding or with future-only heads) the same sweeps run keys_rate's
//     products on pairs packed once per unit (Kᵀ, Vᵀ, K's row pairs) and per query block (Q, dO),
//     dKᵀ and dVᵀ summed per key block; a unit with a row that sees no key or a non-finite lse or D
//     runs the float32 sweeps instead (they have the careful steps).
//
// OpenBLAS (D > kTileGemmMaxD, sgemv) is called from inside the OpenMP threads with its own
// threading set to 1 for the call (restored after). SIMD row helpers (max, exp, scale, add, the
// rotation, diagonal adds and sums) are Highway, every target compiled, the best chosen at run time
// (per call: tests switch).
#include <initializer_list>
#include <string>
#include <utility>

#include "attention/attention_check.h"
#include "attention/attention_decode.h"
#include "attention/attention_fused.h"
#include "attention/attention_fused_cpu.h"
#include "core/fast_common.h"
#include "posenc/attention.h"

namespace posenc {
namespace {

using attn::Dims;
using attn_fast::BlasOneThread;
using attn_fast::I;
using attn_fast::overlaps;
using attn_fast::threads_for;
using fused_cpu::Fused;
using fused_cpu::Saved;

// Below this many (query, key) pairs over the batch and heads, the dispatcher runs the reference:
// as fast at that size, and exact (double) where the float32 kernel is not.
constexpr I kFusedMinPairs = I{1} << 14;

// The fused kernels' argument checks beyond validation: which case they cover, and no output that
// overlaps an input (the reference reads everything before it writes).
Status fusable(const AttentionParams& p, const View& q, std::initializer_list<const View*> ins,
               std::initializer_list<std::pair<const char*, const View*>> outs) {
  if (!fused::supports(p, q.dtype))
    return Status::Invalid("encoding", "the fused kernels cover " + fused::covered() +
                                       " on float32, bfloat16 and float16; got " + attn::describe(p) +
                                       " on " + dtype_name(q.dtype));
  for (const auto& [arg, o] : outs)
    for (const View* in : ins)
      if (overlaps(*o, *in)) return Status::Invalid(arg, "overlaps an input");
  return Status::Ok();
}

// saved_out, saved_lse: the statistics a backward reads (absent views when it reads none).
Status fusable_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                        const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                        const View& dv, const EncodingGrads& g, const View& saved_out = View{},
                        const View& saved_lse = View{}) {
  return fusable(p, q, {&q, &k, &v, &dout, &saved_out, &saved_lse, &t.slopes, &t.weights, &t.u, &t.v, &t.rel_proj, &t.table, &t.r1,
                  &t.r2, &t.fire.w1, &t.fire.b1, &t.fire.w2, &t.fire.b2, &t.fire.c, &t.fire.threshold,
                  &t.freqs, &t.q_positions, &t.k_positions},
                 {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dweights", &g.weights}, {"du", &g.u},
                  {"dv_bias", &g.v}, {"drel_proj", &g.rel_proj}, {"dtable", &g.table},
                  {"dr1", &g.r1}, {"dr2", &g.r2}, {"dmlp_w1", &g.fire.w1}, {"dmlp_b1", &g.fire.b1},
                  {"dmlp_w2", &g.fire.w2}, {"dmlp_b2", &g.fire.b2}, {"dc", &g.fire.c},
                  {"dthreshold", &g.fire.threshold}, {"dfreqs", &g.freqs}});
}

Status run_forward(const AttentionParams& p, const Dims& d, const View& q, const View& k,
                   const View& v, const EncodingTensors& t, const View& out, const View& lse) {
  const BlasOneThread one;
  if (p.encoding == Encoding::kXL) return fused::xl_forward(p, d, q, k, v, t, out, lse);
  if (p.encoding == Encoding::kCope) return fused::cope_forward(p, d, q, k, v, t, out, lse);
  const Fused f(p, d, q, k, v, t, threads_for(d));
  f.forward(out, lse);
  return Status::Ok();
}

Status run_backward(const AttentionParams& p, const Dims& d, const View& q, const View& k,
                    const View& v, const EncodingTensors& t, const View& dout, const View& dq,
                    const View& dk, const View& dv, const EncodingGrads& g, const Saved* saved = nullptr) {
  const BlasOneThread one;
  if (p.encoding == Encoding::kXL)
    return saved ? fused::xl_backward(p, d, q, k, v, t, dout, dq, dk, dv, g, &saved->out, &saved->lse)
                 : fused::xl_backward(p, d, q, k, v, t, dout, dq, dk, dv, g);
  if (p.encoding == Encoding::kCope)
    return fused::cope_backward(p, d, q, k, v, t, dout, dq, dk, dv, g);
  const Fused f(p, d, q, k, v, t, threads_for(d));
  f.backward(dout, dq, dk, dv, g, saved);
  return Status::Ok();
}

}  // namespace

namespace fused {

bool supports(const AttentionParams& p, DType qkv) {
  switch (p.encoding) {
    case Encoding::kNope: case Encoding::kRope: case Encoding::kAlibi: case Encoding::kT5: break;
    case Encoding::kRope2d: case Encoding::kMrope: case Encoding::kXpos: break;
    case Encoding::kKerple: case Encoding::kSandwich: case Encoding::kFire: break;
    case Encoding::kXL: if (!xl_fused()) return false; break;
    case Encoding::kCope: if (!cope_fused()) return false; break;
    default: return false;
  }
  return fast::fast_dtype(qkv);
}

std::string bf16_products(const AttentionParams& p) {
  // xl and cope run kernels of their own (run_forward), which keep the float32 products
  const attn_fast::Bf16Ops* ops = attn_fast::bf16_ops();
  if (!ops || !p.bf16_rate || !supports(p, DType::kBF16) || p.encoding == Encoding::kXL ||
      p.encoding == Encoding::kCope)
    return "";
  return ops->name;
}

void set_dq_buffer_limit(std::int64_t bytes) {
  attn_fast::dq_buffer_limit.store(bytes < 0 ? attn_fast::kDqBufferBytes : bytes);
}

void set_score_store_limit(std::int64_t bytes) {
  attn_fast::score_store_limit.store(bytes < 0 ? attn_fast::kScoreStoreBytes : bytes);
}

std::string covered() {
  std::string s = "nope, rope, rope2d, mrope, xpos, alibi, t5, kerple, sandwich, fire";
  if (xl_fused()) s += ", xl";
  if (cope_fused()) s += ", cope";
  return s;
}

Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_forward(p, q, k, v, t, out, lse, &d));
  POSENC_RETURN_IF_ERROR(fusable(p, q, {&q, &k, &v, &t.slopes, &t.weights, &t.u, &t.v, &t.rel_proj, &t.table, &t.r1, &t.r2,
                  &t.fire.w1, &t.fire.b1, &t.fire.w2, &t.fire.b2, &t.fire.c, &t.fire.threshold, &t.freqs,
                  &t.q_positions, &t.k_positions},
                 {{"out", &out}, {"lse", &lse}}));
  return run_forward(p, d, q, k, v, t, out, lse);
}

Status attention_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                          const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                          const View& dv, const EncodingGrads& g) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_backward(p, q, k, v, t, dout, dq, dk, dv, g, &d));
  if (!fast::fast_dtype(dout.dtype))
    return Status::Invalid("dout", std::string("the fused kernels read float32, bfloat16 or float16; got ") +
                                       dtype_name(dout.dtype));
  POSENC_RETURN_IF_ERROR(fusable_backward(p, q, k, v, t, dout, dq, dk, dv, g));
  return run_backward(p, d, q, k, v, t, dout, dq, dk, dv, g);
}

}  // namespace fused

Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_forward(p, q, k, v, t, out, lse, &d));
  const bool fuse =
      fusable(p, q, {&q, &k, &v, &t.slopes, &t.weights, &t.u, &t.v, &t.rel_proj, &t.table, &t.r1, &t.r2,
                  &t.fire.w1, &t.fire.b1, &t.fire.w2, &t.fire.b2, &t.fire.c, &t.fire.threshold, &t.freqs,
                  &t.q_positions, &t.k_positions},
              {{"out", &out}, {"lse", &lse}}).ok();
  // A decode step (M ≤ 16): the decode kernel, whatever the size; it leaves a call with a NaN or
  // ±inf to the paths below.
  if (fuse && decode::covers(p, d, q, k, v) && decode::forward(p, d, q, k, v, t, out, lse, decode::threads_for(d)))
    return Status::Ok();
  if (d.B * d.Hq * d.M * d.N < kFusedMinPairs || !fuse) return reference::attention_forward(p, q, k, v, t, out, lse);
  return run_forward(p, d, q, k, v, t, out, lse);
}

Status attention_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                          const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                          const View& dv, const EncodingGrads& g) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_backward(p, q, k, v, t, dout, dq, dk, dv, g, &d));
  if (d.B * d.Hq * d.M * d.N < kFusedMinPairs || !fast::fast_dtype(dout.dtype) ||
      !fusable_backward(p, q, k, v, t, dout, dq, dk, dv, g).ok())
    return reference::attention_backward(p, q, k, v, t, dout, dq, dk, dv, g);
  return run_backward(p, d, q, k, v, t, dout, dq, dk, dv, g);
}

// The forward's own statistics: where the reference runs, it computes them again (the same bits as
// attention_backward); cope's kernel computes them again (run_backward).
Status attention_backward_saved(const AttentionParams& p, const View& q, const View& k, const View& v,
                                const EncodingTensors& t, const View& out, const View& lse,
                                const View& dout, const View& dq, const View& dk, const View& dv,
                                const EncodingGrads& g) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_backward_saved(p, q, k, v, t, out, lse, dout, dq, dk, dv, g, &d));
  if (d.B * d.Hq * d.M * d.N < kFusedMinPairs || !fast::fast_dtype(dout.dtype) ||
      !fusable_backward(p, q, k, v, t, dout, dq, dk, dv, g, out, lse).ok())
    return reference::attention_backward(p, q, k, v, t, dout, dq, dk, dv, g);
  const Saved saved{out, lse};
  return run_backward(p, d, q, k, v, t, dout, dq, dk, dv, g, &saved);
}

// The statistics are those of a larger attention (a key shard's backward): pass 1 must read them,
// so unlike attention_backward_saved there is no fallback to recomputing.
Status attention_backward_from_stats(const AttentionParams& p, const View& q, const View& k, const View& v,
                                     const EncodingTensors& t, const View& out, const View& lse,
                                     const View& dout, const View& dq, const View& dk, const View& dv,
                                     const EncodingGrads& g) {
  Dims d;
  POSENC_RETURN_IF_ERROR(
      attn::validate_backward_from_stats(p, q, k, v, t, out, lse, dout, dq, dk, dv, g, &d));
  if (d.B * d.Hq * d.M * d.N < kFusedMinPairs || !fast::fast_dtype(dout.dtype) ||
      !fusable_backward(p, q, k, v, t, dout, dq, dk, dv, g, out, lse).ok())
    return reference::attention_backward_from_stats(p, q, k, v, t, out, lse, dout, dq, dk, dv, g);
  const Saved saved{out, lse};
  return run_backward(p, d, q, k, v, t, dout, dq, dk, dv, g, &saved);
}

}  // namespace posenc
