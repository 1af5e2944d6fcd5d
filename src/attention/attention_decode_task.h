// Private: one task of the decode kernel (attention_decode.cc): batch row b, a part of its keys,
// every kv head — its inputs, and run_task(), the best SIMD target's body (attention_decode_task.cc).
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention/tile_gemm.h"
#include "posenc/view.h"

#define POSENC_ATTENTION_DECODE_TYPES
namespace posenc::decode_impl {
using I = std::int64_t;
// Keys per block: 32768 K values over every kv head (64 KiB of 16-bit K, as much V); the next
// block's K and V rows are prefetched while a block is worked on. rope2d mixed (mixed): twice as
// many, so that a kv head's rows of the small table serve more keys before the next head's.
inline I block_keys(I Hkv, I D, bool mixed = false) {
  return std::clamp<I>((mixed ? 65536 : 32768) / std::max<I>(Hkv * D, 1), 8, 256);
}
// xl: keys per window of a task's position terms (whole blocks, at least 256 keys).
inline I xl_table_keys(I nb) { return nb * ((256 + nb - 1) / nb); }
// A task's scratch, in floats: S [R, nb], a flag per row, a row's gates [nb] (cope); rope2d mixed:
// query rows turned [R, D] and turned by their y [Hkv·R, D]; xl: the sinusoids s(m) [nt, X], the rows
// Ỹ turned for a window [X, Hkv·R], the window's position terms [Hkv·R, nt] and transposed,
// nt = xl_table_keys(nb).
inline I scratch_floats(I Hkv, I D, I R, I X, bool mixed) {
  const I nb = block_keys(Hkv, D, mixed);
  return nb * R + R + nb + (mixed ? (Hkv + 1) * R * D : 0) + X * xl_table_keys(nb) +
         (X ? Hkv * R * (X + 2 * xl_table_keys(nb)) : 0);
}

// rope2d mixed (attention_decode_rope2d.h): key j of head h turns each rotary pair by φ = θˣ·x_j +
// θʸ·y_j. With x_j − lo[0] = kLow·u + t (t < kLow), the key is turned by θˣ·t and the query back by
// θʸ·y_j + θˣ·(lo[0] + kLow·u) (attention_decode_rope2d-inl.h), from tables whose rows hold
// cos(α) of each of the r/2 pairs, then their sin(α), α the row's angle times the pair's θ; rows r
// apart, each table padded past its last row by a vector's floats.
struct MixedKeys {
  static constexpr I kLowBits = 4, kLow = I{1} << kLowBits;
  const float* low = nullptr;              // [Hq, kLow, r]: row (h, t) at angle t, θˣ
  const float* c[2] = {nullptr, nullptr};  // [Hq, w[a], r]: x: row (h, u) at lo[0] + kLow·u; y: row (h, y − lo[1])
  I lo[2] = {0, 0}, w[2] = {0, 0};
  const I* pos[2] = {nullptr, nullptr};  // the batch row's key positions x, y [N]
  I r = 0;                               // rotary dimensions (pairs (2k, 2k + 1) or (k, k + r/2))
  bool interleaved = true;
};

enum class BiasKind { kNone, kSlopes, kLearned, kT5, kKerpleLog, kKerplePower, kSandwich, kFire };

// A call's bias, as the per-target code reads it (filled in prepare_bias below).
struct Bias {
  BiasKind kind = BiasKind::kNone;
  const double* slopes = nullptr;  // alibi [Hq]
  const double* sig = nullptr;     // learned alibi σ(w) [2, Hq]
  I Hq = 0;
  const float* t5 = nullptr;       // [Hq, 2·t5_half + 1]: head h's weight at Δ = −t5_half + e
  I t5_half = 0;
  const float* kt = nullptr;       // kerple: head h's bias at |Δ| = e at kt[h·kt_w + e]
  I kt_w = 0;
  const float* sw = nullptr;       // sandwich: the head-independent part at |Δ| = 0, 1, …
  const float* hs = nullptr;       // sandwich: head scale [Hq]
  const float* w1 = nullptr;       // fire [W], b1 [W], w2 [Hq, W], b2 [Hq]
  const float* b1 = nullptr;
  const float* w2 = nullptr;
  const float* b2 = nullptr;
  I W = 0;
  float c = 0;
  const float* inv = nullptr;      // fire: 1/ψ(max(L, qp)) per query i [M]
};

// One task's inputs: batch row b, keys [j0, j1), every kv head.
struct Task {
  I D, G, M, Hq, Hkv;
  DType dt;
  const float* q;      // [Hkv, R, D]
  const void* k;       // key j of kv head kh of batch row b at k + j·kld + kh·khs elements
  const void* v;
  I kld, khs, vld, vhs;
  I j0, j1;
  const I* lo;         // [Hkv, R]: row r of kv head kh sees keys [lo, hi)
  const I* hi;
  I q_off, k_off;
  const Bias* bias;
  I X = 0;                    // xl: the sinusoid's dimension (0: not xl)
  const float* yt = nullptr;    // xl: Ỹᵀ [X, Hkv·R], each row's Ỹ a column (attention_decode.cc)
  attn_fast::TileGemmFn gemm = nullptr;  // xl: tile_gemm_for(X)
  attn_fast::TileTransposeFn tr = nullptr;  // xl: tile_transpose_fn()
  I npos = 0;                   // cope: table rows (0: not cope); keys walked from the last while counts run
  I ncol = 0;                   // cope: the columns of qe, min(npos, N + 1)
  const float* qe = nullptr;    // cope: [Hkv, R, ncol], q·e_c of each row (q unscaled)
  const MixedKeys* mixed = nullptr;  // rope2d mixed: the keys' rotations (q: only its own)
  // bfloat16 K and V at the bfloat16 rate (attention_decode_bf16-inl.h; AVX-512 targets): 1 VDPBF16PS,
  // 2 its emulation, 0 the float32 products. The logits read the rows q/qscale as qhi + qlo, each
  // [Hkv, R, D] bfloat16 (qlo null: every row exact in bfloat16), times qscale; not cope's counts.
  int dp = 0;
  const std::uint16_t* qhi = nullptr;
  const std::uint16_t* qlo = nullptr;
  float qscale = 1;
};
}  // namespace posenc::decode_impl

namespace posenc::decode_impl {
// Runs task t (the best target of this CPU, chosen per call): m, l [Hkv, R] and o [Hkv, R, D] of its
// keys (o unnormalised), scratch of scratch_floats(Hkv, D, R, X, mixed) floats, R = G·M. Returns false at
// a NaN or +inf logit.
bool run_task(const Task& t, float* scratch, float* m, float* l, float* o);
}  // namespace posenc::decode_impl
