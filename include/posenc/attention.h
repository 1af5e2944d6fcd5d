// posenc/attention.h — attention with a positional encoding fused into it:
// out = softmax(scale·q·kᵀ + encoding terms + mask)·v. Terms, masking, NaN rules: docs/attention.md.
#pragma once

#include <optional>

#include "posenc/bias.h"
#include "posenc/registry.h"
#include "posenc/rope.h"
#include "posenc/rotary.h"
#include "posenc/view.h"

namespace posenc {

// What to compute: the encoding, its parameters (the struct of that encoding), the mask and offsets.
struct AttentionParams {
  Encoding encoding = Encoding::kNope;
  bool causal = false;                     // mask keys whose position exceeds the query's
  std::optional<double> scale;             // default 1/√D
  std::optional<std::int64_t> q_offset;    // default k_offset + N − M
  std::int64_t k_offset = 0;               // key j sits at k_offset + j, query i at q_offset + i
  // Rotary encodings but rope2d mixed: k already carries its rotation at its positions (a KV cache
  // filled through rope_forward); only q is rotated, and dk is the gradient of those rotated keys.
  bool keys_rotated = false;
  // bfloat16 q, k, v (and dout): the fused forward's and backward's products (the decode kernel's
  // too) on bfloat16 pairs where the CPU multiplies them (AMX; AVX512_BF16 on AMD), P and dS rounded
  // to bfloat16 (docs/attention.md). false: the float32 products, the same results on every CPU.
  bool bf16_rate = true;
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

// q [B, M, Hq, D], k and v [B, N, Hkv, D] (Hq a multiple of Hkv), one dtype; out [B, M, Hq, D] of that
// dtype; lse (optional, float64 [B, Hq, M]) = log Σ_j exp(logit_ij). Errors name the argument.
Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse = View{});

// dout [B, M, Hq, D]; dq, dk, dv optional (shapes of q, k, v); g: the parameter gradients (each
// optional, overwritten). Validation and errors as attention_forward's.
Status attention_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                          const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                          const View& dv, const EncodingGrads& g);

// attention_backward for a call whose forward's results the caller kept: out and lse as
// attention_forward wrote them for the same p, q, k, v and t (out [B, M, Hq, D] of q's dtype, lse
// float64 [B, Hq, M]). Where the fused kernels run, they read out and lse instead of computing the
// forward again; elsewhere (the reference's sizes and dtypes; cope) they are checked but not read. The
// gradients equal attention_backward's within float32 rounding (bit for bit, with float32 out, where
// that computes out again; docs/attention.md). Every encoding. Errors as attention_backward's, plus
// "out" and "lse".
Status attention_backward_saved(const AttentionParams& p, const View& q, const View& k, const View& v,
                                const EncodingTensors& t, const View& out, const View& lse,
                                const View& dout, const View& dq, const View& dk, const View& dv,
                                const EncodingGrads& g);

// The gradients of the keys, values and parameters this call sees, under the softmax statistics of a
// larger attention the call is part of: the call holds a shard of that attention's keys (at their
// k_offset; q_offset given explicitly), out [B, M, Hq, D] (q's dtype) and lse (float64 [B, Hq, M])
// are the whole attention's. P_ij = exp(l_ij − lse_i), Δ_i = dout_i·out_i, dS = P ⊙ (dout·vᵀ − Δ).
// Summed over the shards, dq and the parameter gradients (each shard's a partial sum, overwritten)
// are the whole attention's; dk, dv are its rows of the shard's keys. Every encoding but cope (a
// key's position counts the gates of the later keys) — an error naming "encoding"; a RoPE scheme
// that reads the sequence length (dynamic, longrope by length) needs seq_len set ("seq_len").
// Other validation and errors as attention_backward's, plus "out" and "lse".
Status attention_backward_from_stats(const AttentionParams& p, const View& q, const View& k, const View& v,
                                     const EncodingTensors& t, const View& out, const View& lse,
                                     const View& dout, const View& dq, const View& dk, const View& dv,
                                     const EncodingGrads& g);

}  // namespace posenc

// The plain references: same arguments, validation and Status as the dispatchers above; scalar,
// double accumulation, every encoding. The oracle of the fused kernels.
namespace posenc::reference {

Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse = View{});

Status attention_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                          const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                          const View& dv, const EncodingGrads& g);

Status attention_backward_saved(const AttentionParams& p, const View& q, const View& k, const View& v,
                                const EncodingTensors& t, const View& out, const View& lse,
                                const View& dout, const View& dq, const View& dk, const View& dv,
                                const EncodingGrads& g);

Status attention_backward_from_stats(const AttentionParams& p, const View& q, const View& k, const View& v,
                                     const EncodingTensors& t, const View& out, const View& lse,
                                     const View& dout, const View& dq, const View& dk, const View& dv,
                                     const EncodingGrads& g);

}  // namespace posenc::reference
