// Private: the bfloat16-rate tile products of the fused attention's bfloat16 forward (AMX or
// VDPBF16PS, chosen at run time by CPUID), and the packings they read. Operands are pairs of
// bfloat16 along the summed index (Pair: element 2p in the low half, 2p + 1 in the high half); each
// output is alpha · Σ_p (a_hi·b_hi + a_lo·b_lo) in float32, the products exact, the sums rounded
// (denormal inputs and results flushed to zero by the instructions). docs/attention.md says where the
// attention uses them and what they cost in accuracy.
#pragma once

#include <cstdint>

namespace posenc::attn_fast {

using Pair = std::uint32_t;

// Which products a call of Bf16Ops::gemm computes (the band as in tile_gemm.h: only the score-tile
// entries (i, j) with j ≤ i + band matter; kNoBand there is "every entry").
enum class Bf16Form {
  kScores,  // C [M, N] = alpha·A·B, the scores (i, j) = (row, column): masked columns may stay unwritten
  kValues,  // C [M, N] += alpha·A·B with A the scores (i, k): the masked pairs of A, zeros, skipped
};

struct Bf16Ops {
  // A [M, P] pairs (row stride lda), B [P, N] pairs (row stride ldb), C float [M, N] (row stride ldc).
  void (*gemm)(Bf16Form form, std::int64_t M, std::int64_t N, std::int64_t P, float alpha, const Pair* A,
               std::int64_t lda, const Pair* B, std::int64_t ldb, float* C, std::int64_t ldc, std::int64_t band);
  // x float [n, K] (row stride ld) rounded to bfloat16 (to nearest, ties to even) into out [n, ⌈K/2⌉]
  // pairs (row stride ldo); an odd K's last high half is 0.
  void (*round_rows)(const float* x, std::int64_t ld, std::int64_t n, std::int64_t K, Pair* out, std::int64_t ldo);
  // x bfloat16 [n, 2P] (row stride ld elements) as pairs, transposed: out[p·ldo + j] = pair p of row
  // j, for p < P and j < n rounded up to 16 (rows past n as 0: ldo ≥ that).
  void (*transpose_pairs)(const std::uint16_t* x, std::int64_t ld, std::int64_t n, std::int64_t P, Pair* out,
                          std::int64_t ldo);
  // x bfloat16 [n, K] (row stride ld elements), rows taken two by two: out[p·ldo + e] =
  // (x[2p, e], x[2p + 1, e]) for p < ⌈n/2⌉, e < K (an odd n's missing row as 0).
  void (*interleave_rows)(const std::uint16_t* x, std::int64_t ld, std::int64_t n, std::int64_t K, Pair* out,
                          std::int64_t ldo);
  const char* name;  // "amx", "vdpbf16" or "emulated"
};

// kAuto: AMX where the CPU has AMX-BF16, else VDPBF16PS on AMD CPUs with AVX512_BF16 (on Zen 5,
// 1.59× the float32 attention forward, 1.55× its backward), else none: on an Intel CPU with AMX the
// VDPBF16PS kernel measured slower than the float32 products (docs/performance.md).
// kOff: none. kAmx, kVdpbf16: that kernel where the CPU has it, else none. kEmulated: the VDPBF16PS
// kernels with each pair product as two float32 multiply-adds (any AVX-512 CPU), for tests.
enum class Bf16Mode { kAuto, kOff, kAmx, kVdpbf16, kEmulated };

// The kernels a call uses (null: the float32 products). Read once per call.
const Bf16Ops* bf16_ops();

// Whether this CPU (and its OS) runs AVX512_BF16 code; AMX-BF16 code (this process granted the tiles).
bool cpu_has_avx512_bf16();
bool cpu_has_amx_bf16();

// For tests and benchmarks: the mode bf16_ops() follows from now on (default kAuto).
void bf16_set_mode(Bf16Mode mode);

}  // namespace posenc::attn_fast
