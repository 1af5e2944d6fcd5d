// Private: the fused (flash-style) attention kernels, callable directly — without the dispatcher's
// small-problem rule — so tests can hold them against posenc::reference at any size.
// Same arguments and validation as posenc::attention_forward / attention_backward; a case the kernels
// do not cover (an encoding not fused, float64 inputs, an output overlapping an input) returns
// kInvalidArgument naming "encoding", "q" or the output, and writes nothing.
#pragma once

#include <string>

#include "attention/attention_check.h"
#include "posenc/attention.h"

namespace posenc::fused {

// Whether the fused kernels cover this encoding and q/k/v dtype.
bool supports(const AttentionParams& p, DType qkv);

// Which products on bfloat16 pairs a bfloat16 call of this encoding takes on this CPU (in the mode
// bf16_ops() follows): "amx", "vdpbf16", "emulated", or "" (the float32 products; xl and cope always).
std::string bf16_products(const AttentionParams& p);

// The encodings the fused kernels cover, as a list for messages ("nope, rope, ...").
std::string covered();

Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse = View{});

Status attention_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                          const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                          const View& dv, const EncodingGrads& g);

// For tests: the largest dQ buffer [G, M, D] (bytes) a backward task keeps rather than summing a
// float32 dq in place (attn_fast::kDqBufferBytes; 0: always in place); negative restores the default.
void set_dq_buffer_limit(std::int64_t bytes);

// For tests: the most bytes a thread keeps for the plain backward's stored tiles
// (attn_fast::kScoreStoreBytes; 0: pass 1 runs the forward again); negative restores the default.
void set_score_store_limit(std::int64_t bytes);
// For tests: set_score_store_limit(bytes) for a scope, the default restored after it.
struct ScoreStoreLimit {
  explicit ScoreStoreLimit(std::int64_t bytes) { set_score_store_limit(bytes); }
  ~ScoreStoreLimit() { set_score_store_limit(-1); }
  ScoreStoreLimit(const ScoreStoreLimit&) = delete;
  ScoreStoreLimit& operator=(const ScoreStoreLimit&) = delete;
};

// ---- the kernels of the other files, called by the dispatcher of attention_cpu.cc -----------------
// Arguments are validated (d filled by attn::validate_*), the dtype is covered, no output overlaps an
// input, and OpenBLAS is set to one thread for the call.

// Transformer-XL (attention_xl_cpu.cc). xl_fused(): whether the kernel is built.
bool xl_fused();
Status xl_forward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k,
                  const View& v, const EncodingTensors& t, const View& out, const View& lse);
// saved_out, saved_lse (both or neither): the out [B, M, Hq, D] and lse (float64 [B, Hq, M]) pass 1
// reads instead of running the forward (attention_backward_from_stats).
Status xl_backward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k,
                   const View& v, const EncodingTensors& t, const View& dout, const View& dq,
                   const View& dk, const View& dv, const EncodingGrads& g,
                   const View* saved_out = nullptr, const View* saved_lse = nullptr);

// For tests: the most floats of each buffer xl keeps for speed (the keys' C transposed; the backward's
// [Q + u | Ỹ] of a task; the forward's key panels, 4× this): larger ones are not kept, their parts
// formed per tile (0: none kept); a negative value restores the default.
void xl_set_cache_limit(std::int64_t floats);

// CoPE (attention_cope_cpu.cc). cope_fused(): whether the kernel is built.
bool cope_fused();
Status cope_forward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k,
                    const View& v, const EncodingTensors& t, const View& out, const View& lse);
Status cope_backward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k,
                     const View& v, const EncodingTensors& t, const View& dout, const View& dq,
                     const View& dk, const View& dv, const EncodingGrads& g);
// For tests: the query rows per head of a chunk of the CoPE backward's pass 2 (rows > 0), so that a
// small M crosses several chunks; 0 restores the default (chunks of a few MiB).
void cope_set_chunk_rows(std::int64_t rows);

}  // namespace posenc::fused
