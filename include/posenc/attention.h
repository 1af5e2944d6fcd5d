// posenc/attention.h — attention with a positional encoding applied inside it.
//
//   out = softmax(scale·q·kᵀ + encoding terms + mask) · v
//
// q: [B, M, Hq, D]; k, v: [B, N, Hkv, D]; Hq a multiple of Hkv (grouped-query heads: query head h
// reads key/value head h / (Hq/Hkv)); out: [B, M, Hq, D]. scale defaults to 1/√D.
// Query i sits at q_offset + i, key j at k_offset + j (by default k_offset = 0 and
// q_offset = k_offset + N − M: a prefill and a decode step are one code path; a shard of a long
// sequence passes its global offsets). causal masks keys whose position exceeds the query's.
// A row whose keys are all masked yields out = 0 and lse = −inf.
// Non-finite values (NaN, ±inf) in q, k, v or dout, as IEEE arithmetic on the formulas above gives
// them, with masked keys left out of a row entirely:
//   • a logit of −inf counts as a masked key (weight 0): a row whose logits are all −inf, masked or
//     not, yields out = 0, lse = −inf and no gradient;
//   • a row with a NaN logit (a NaN in q_i or in a key the row sees, in an encoding term, or ∞·0 and
//     ∞ − ∞ on the way) or a +inf one (∞ − ∞ in the softmax) is a NaN row: out_i all NaN, lse NaN;
//     its P is NaN on every key of logit other than −inf that it sees, so the backward gives NaN in
//     dq_i, in dk_j and dv_j of those keys, and in the parameter gradients those pairs feed;
//   • a NaN or ±inf in v_j reaches out_i in that dimension for each row i that gives key j a nonzero
//     weight, and then (through Dᵢ = dOᵢ·outᵢ) dq_i and dk of every key row i weights; a non-finite dOᵢ
//     reaches dv of the keys row i weights (in that dimension), dq_i and dk of those keys;
//   • nothing passes between a row and a key of weight 0 — masked, of logit −inf, or underflowed
//     (below e^−86 of the row's largest in the float32 kernels, e^−745 in the reference) — in either
//     direction: no 0·NaN term. (rope2d mixed's dfreqs sums over every rotated q and k row, seen or
//     not, so a NaN in any of them reaches it.)
// The fused kernels give the reference's results here, by careful steps that only calls with a NaN
// or ±inf take (src/attention/attention_tiles.h). What finite inputs pay to decide it: per row tests,
// a pass over k in the forward (none in a decode-sized call, which tests its logits instead) and one
// over v in the backward — about 1–2% at the study's L = 64, D = 16, less beyond. CoPE runs the
// reference for a call with a NaN or ±inf, found by a pass over k and in its kernel's results.
// q, k and v share one dtype, and out/dq/dk/dv keep it. A tensor of EncodingTensors or a gradient of
// EncodingGrads that the chosen encoding does not read is an error (so that a gradient buffer is
// never silently left unwritten). Positions here are query/key positions (offset + index): "i − j"
// below means query position − key position.
// The scale multiplies q·kᵀ only, with two exceptions taken from the papers: XL scales its whole
// logit (content and position terms), and CoPE's z term is added unscaled.
// Key shards: forward over key shards combines through lse for every encoding but CoPE (whose gate
// count runs over all keys of a row); backward runs on whole rows of keys.
//
// Encodings and their terms (h is the query head):
//   nope   nothing.
//   rope   q and k rotated by their positions before the product, any scheme and angle mode of
//          rope.h, the attention factor scaling both; the call's length (dynamic, longrope) is
//          rope.seq_len or max(q_offset + M, k_offset + N).
//   rope2d, mrope  q and k rotated as rotary.h says, by multi-dimensional positions: query i at
//          q_positions[·, i] and key j at k_positions[·, j] (EncodingTensors: int32/int64 [A, M] or
//          [B, A, M], [A, N] or [B, A, N]; A = 2 (x, y) for rope2d, 3 (t, h, w) for mrope). Absent,
//          every component is the 1D position (q_offset + i; k_offset + j): text. The 1D positions
//          still order the tokens: causal masks key j when k_offset + j > q_offset + i, whatever
//          the multi-dimensional positions. The call's length for rope.h's schemes: the largest
//          component + 1. rope2d mixed reads freqs [2, Hq, r/2] (per query head; with grouped
//          heads, the key of kv head h/G is rotated by query head h's frequencies for that head's
//          product) and gives dfreqs (EncodingGrads) from the gradients of the rotated q and k
//          (rotary.h's formula), accumulated per key block and per query row, no L×L buffer.
//   xpos   q rotated and scaled by ζ^((qp − c)/s), k by ζ^(−(kp − c)/s) (rotary.h): the logit of a
//          pair is Σ_k ζ_k^((qp − kp)/s)·(RoPE's terms), a function of qp − kp only, so c only
//          matters to rounding and range: it defaults to the middle of the call's positions,
//          lo + ⌈(hi + 1 − lo)/2⌉ over every query and key position (torchscale's ⌈n/2⌉ when they
//          start at 0), or ⌈seq_len/2⌉ when xpos.rope.seq_len is set, or xpos.center. A span of
//          positions beyond ~70000·scale_base/512 still leaves float32's range at the ends.
//   alibi  + alibi bias (see bias.h); variants symmetric, nonsymmetric, learned.
//   t5     + W[bucket(key − query), h] (see bias.h).
//   xl     Transformer-XL (Dai et al. 2019, arXiv 1901.02860, §3.3):
//            logit_ij = ((q_i + u_h)·k_j + (q_i + v_h)·r_h(i−j))·scale,  r_h(δ) = W_h·s(δ)
//          s(δ) the sinusoid of even dimension R (base 10000, layout as sinusoidal) of
//          δ = query position − key position; u, v: [Hq, D]; W: [Hq, D, R]. The scale multiplies the
//          whole logit here, as in the paper's implementation.
//   cope   Contextual Position Encoding (Golovneva et al. 2024, arXiv 2405.18719):
//            a_ij = scale·q_i·k_j + mask_ij,  g_ij = σ(a_ij)  (0 where masked),
//            p_ij = min(Σ_{t ≥ j} g_it, npos − 1)  (over all keys t of the row; masked ones give 0;
//                   the paper defines the causal case, where this runs from j to i),
//            z_ij = (1 − (p − ⌊p⌋))·q_i·e[⌊p⌋] + (p − ⌊p⌋)·q_i·e[⌈p⌉],   logit_ij = a_ij + z_ij;
//          table e: [npos, D].
//   kerple + −r1_h·log(1 + r2_h·|i − j|) (kernel log) or −r1_h·|i − j|^r2_h (power); r1, r2: [Hq]
//          each, > 0 (power: r2 ≤ 2) as given (see bias.h).
//   sandwich + (Σ_{k=1}^{d̄/2} cos((i − j)/base^(2k/d̄)) − d̄/2)·Hq/(8(h+1)) (see bias.h); no tensors.
//   fire   + f_h(ψ(|i − j|)/ψ(max(L, i))), ψ(x) = log(c·x + 1), f = w2·relu(w1·x + b1) + b2, with i
//          the query's position (see bias.h); tensors w1, b1 [W], w2 [Hq, W], b2 [Hq], c, L [1].
// Absolute encodings (learned, sinusoidal) act on embeddings before the first layer, not here.
//
// Implementations. posenc::attention_forward / attention_backward are dispatchers
// (src/attention/attention_cpu.cc): they validate, then run a fused, flash-style kernel (tiles of
// queries × keys, online softmax, O(L·D) memory, never an [H, M, N] buffer; backward recomputes the
// logits per tile, FlashAttention-2 style) for nope, rope, rope2d, mrope, xpos, alibi (all
// variants), t5, kerple, sandwich and fire with float32, bfloat16 or float16 q/k/v (math in float32, accumulation in float32; lse
// then carries float32 error); xl and cope run kernels of their own (attention_xl_cpu.cc,
// attention_cope_cpu.cc). Float64 inputs, outputs that overlap an input and small problems (B·Hq·M·N < 2^14,
// where the reference is as fast and exact) run the plain reference, posenc::reference::attention_forward /
// attention_backward (double accumulation; declared at the end of this file), which is the oracle the
// fused kernels are tested against. Both give the same Status for the same bad input.
#pragma once

#include <optional>

#include "posenc/bias.h"
#include "posenc/registry.h"
#include "posenc/rope.h"
#include "posenc/rotary.h"
#include "posenc/view.h"

namespace posenc {

struct AttentionParams {
  Encoding encoding = Encoding::kNope;
  bool causal = false;
  std::optional<double> scale;             // default 1/√D
  std::optional<std::int64_t> q_offset;    // default k_offset + N − M
  std::int64_t k_offset = 0;
  RopeParams rope;
  Rope2dParams rope2d;
  MropeParams mrope;
  XposParams xpos;
  AlibiParams alibi;
  T5Params t5;
  KerpleParams kerple;
  SandwichParams sandwich;
  FireParams fire;
};

// The learned or caller-given tensors an encoding reads (absent unless the encoding needs them).
// Every one of them must be finite: a NaN or ±inf is an error naming the tensor (positions aside).
struct EncodingTensors {
  View slopes;    // alibi: optional [Hq]
  View weights;   // alibi learned: [2, Hq]; t5: [num_buckets, Hq]
  View u, v;      // xl: [Hq, D] each
  View rel_proj;  // xl: [Hq, D, R]
  View table;     // cope: [npos, D]
  View r1, r2;    // kerple: [Hq] each
  FireTensors fire;  // fire: w1 [W], b1 [W], w2 [Hq, W], b2 [Hq], c [1], threshold [1]
  View freqs;     // rope2d mixed: [2, Hq, r/2]
  View q_positions, k_positions;  // rope2d, mrope: int32/int64 [A, M] / [B, A, M], [A, N] / [B, A, N]
};

// Gradients of those tensors (each optional, but only for a tensor the encoding reads; overwritten).
struct EncodingGrads {
  View weights;   // alibi learned [2, Hq] / t5 [num_buckets, Hq]
  View u, v;      // xl
  View rel_proj;  // xl
  View table;     // cope
  View r1, r2;    // kerple
  FireTensors fire;  // fire (each of the six optional)
  View freqs;     // rope2d mixed [2, Hq, r/2]
};

// lse (optional, float64 [B, Hq, M]): log Σ_j exp(logit_ij), so shards over keys can be combined.
Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse = View{});

// dout: [B, M, Hq, D]; dq, dk, dv optional (shapes of q, k, v); g: parameter gradients.
Status attention_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                          const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                          const View& dv, const EncodingGrads& g);

}  // namespace posenc

// The plain references (src/attention/attention_ref.cc): same arguments, validation and Status as the
// dispatchers above; scalar, double accumulation, every encoding. The oracle of the fused kernels.
namespace posenc::reference {

Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse = View{});

Status attention_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                          const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                          const View& dv, const EncodingGrads& g);

}  // namespace posenc::reference
