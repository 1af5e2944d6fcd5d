// Private: the decode kernel of the attention (attention_decode.cc): a few queries (M ≤ kMaxQueries)
// against a long K/V cache, the G query heads of a kv head together, keys split over the threads
// when there are fewer (batch, kv head) units than threads. How it works: docs/attention.md.
#pragma once

#include <cstdint>
#include <string>

#include "attention/attention_check.h"
#include "posenc/attention.h"

namespace posenc::decode {

// The most queries per call the decode kernel takes.
constexpr std::int64_t kMaxQueries = 16;

// Whether the decode kernel takes this validated call (d from attn::validate_forward): M ≤
// kMaxQueries; nope, alibi (every variant), t5, kerple, sandwich, fire, xl, cope, rope2d mixed (its
// key tables within kMixedTableBytes), or rope, xpos, mrope, rope2d axial with keys_rotated; q, k, v
// float32, bfloat16 or float16 with unit inner stride; every key − query distance within ±2^24.
bool covers(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k, const View& v);

// The products a covered call with these q, k, v takes on bfloat16 pairs (docs/attention.md, "bfloat16
// at the bfloat16 rate"): "vdpbf16" or "emulated" (Bf16Mode::kEmulated), or "" for the float32 products.
std::string bf16_products(const AttentionParams& p, std::int64_t D, DType dt);

// The threads the dispatcher gives a call: posenc::num_threads(), or 1 below ~2^15 K elements.
int threads_for(const attn::Dims& d);

// Runs a covered call on `threads` threads (no output overlapping an input). Returns false when it
// met a NaN or ±inf (in a logit it reads, or in an output row whose lse is finite): out and lse may
// then hold part of the result, and the caller runs a path that handles such inputs.
bool forward(const AttentionParams& p, const attn::Dims& d, const View& q, const View& k, const View& v,
             const EncodingTensors& t, const View& out, const View& lse, int threads);

// For tests: validation, covers() and forward() at posenc::num_threads() (no small-problem rule).
// Not covered: kInvalidArgument naming "encoding"; a non-finite value met: kInvalidArgument naming
// "k" (the caller of forward() would have run another path).
Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse = View{});

}  // namespace posenc::decode
