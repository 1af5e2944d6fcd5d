// Private: a small float32 GEMM for the attention tiles (tile_gemm.cc, Highway, every target
// compiled, the best chosen at run time), and tile_gemm(), which the fused kernels call for each of
// their tile products: this GEMM when it is given (head dim D ≤ kTileGemmMaxD), else cblas_sgemm.
// The float model (model/model.cc) runs its projections on it too.
//
// Why: at the tiles' sizes (M, N ≤ 128, K or N = D) OpenBLAS packs both operands of the TN form
// and, for NT, reads Bᵀ across rows; this GEMM packs nothing but the NT form's Bᵀ (4 × 4 SIMD
// transposes) and runs near the machine's peak in every form (see kTileGemmMaxD).
//
// The three forms, row-major, leading dimensions (row strides) lda, ldb, ldc ≥ the row lengths:
//   kNT: C [M, N]  = alpha·A·Bᵀ   A [M, K], B [N, K]; C is written, never read (BLAS's beta = 0)
//   kNN: C [M, N] += alpha·A·B    A [M, K], B [K, N]                           (beta = 1)
//   kTN: C [M, N] += alpha·Aᵀ·B   A [K, M], B [K, N]                           (beta = 1)
//   kNP: C [M, N]  = alpha·A·B    A [M, K], B [K, N]: kNT's product with its Bᵀ given (packed once
//        by a caller that reuses it), the same sums; C written, never read          (beta = 0)
// Any M, N, K ≥ 0. Each C element is Σ_k a·b summed in the order k = 0, 1, … (multiply-adds, fused
// where the target has FMA), then multiplied by alpha (and added to C): the same operations whatever
// the element's place in the matrix, so a row's result does not depend on M, N, the block the row
// falls in, or the thread that computes it (deterministic; the models' bit-reproducibility rests on
// it). Nothing outside the M × N elements of C is read or written.
//
// A band (causal tiles): band = c < kNoBand says that only the score-tile entries (query i, key j)
// with j ≤ i + c matter; the others are masked. The score tile is C of kNT and kNP (i = row,
// j = column), A of kNN (i = row, j = k) and A of kTN (j = C's row, i = k). kNT and kNP may leave
// C's masked entries unwritten (the caller masks them); kNN and kTN skip the masked stretches of
// each block's sum, and may still read a masked entry where a block of rows straddles the
// diagonal, so those must hold zeros (P and dS of a masked score are 0). Skipping a product that is exactly ±0 leaves each sum
// the same (up to the sign of a zero result), so a banded product equals the full one wherever it
// is defined, on every target. On a causal diagonal tile this does about half the work.
#pragma once

#include <cblas.h>

#include <cstdint>

namespace posenc::attn_fast {

enum class GemmForm { kNT, kNN, kTN, kNP };

// No band: every entry of the tile matters.
constexpr std::int64_t kNoBand = std::int64_t{1} << 60;

using TileGemmFn = void (*)(GemmForm form, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                            const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float* C,
                            std::int64_t ldc, std::int64_t band);

// Register blocks of the GEMM (tile_gemm.cc): kNarrow (4 or 6 rows × 2 vectors) or kWide (6 rows × 4
// vectors first; the same as kNarrow on targets with 16 vector registers). Both give the same sums,
// bit for bit. kWide measured faster on Intel Cascade Lake and AMD Zen 5, faster or level on Zen 4 (tile_gemm.cc).
enum class TileBlocks { kNarrow, kWide };

// kWide on Intel CPUs and AMD family 19h (Zen 4) or later, else kNarrow.
TileBlocks default_tile_blocks();

// The best target's GEMM on this CPU with the given blocks. Not cached: the tests switch targets
// (hwy::SetSupportedTargetsForTest) between calls.
TileGemmFn tile_gemm_fn(TileBlocks blocks);
inline TileGemmFn tile_gemm_fn() { return tile_gemm_fn(default_tile_blocks()); }

// bt [K, ldt]: bt[k·ldt + j] = B[j·ldb + k] for j < n, k < K (B [n, K] with row stride ldb,
// transposed; ldt ≥ n; nothing else of bt written): the NT form's packing, for a caller that keeps
// a transposed operand for the kNP form.
using TileTransposeFn = void (*)(const float* B, std::int64_t ldb, std::int64_t n, std::int64_t K, float* bt,
                                 std::int64_t ldt);
// The best target's transpose on this CPU (not cached, as tile_gemm_fn()).
TileTransposeFn tile_transpose_fn();

// The largest head dim for which the fused kernels use tile_gemm_fn() instead of OpenBLAS (and the
// largest K that NT packs on the stack, so the attention never allocates here). Measured at one
// thread on one machine (Zen 4, OpenBLAS 0.3 with its AVX-512 small-matrix kernels), tiles of
// 64 × 64 and 128 × 128: the AVX-512 target as fast as OpenBLAS or faster for every form at
// D = 16 … 256 (NT 1.1–1.4×, NN and TN 0.95–1.2×), `posenc bench` attention at d = 64 ~10% faster
// forward and backward; the AVX2 target (forced there) about level up to D = 128 (NT faster, TN
// down to 0.94×) and behind beyond. Beyond 128 OpenBLAS stays: NT would allocate. Not measured on
// an AVX2-only CPU, where OpenBLAS's own kernels differ.
constexpr std::int64_t kTileGemmMaxD = 128;

// The GEMM a fused kernel uses for head dim D: tile_gemm_fn() up to kTileGemmMaxD, else none (null:
// tile_gemm() calls OpenBLAS).
inline TileGemmFn tile_gemm_for(std::int64_t D) { return D <= kTileGemmMaxD ? tile_gemm_fn() : nullptr; }

// One tile product: small(form, …) when small is given, else cblas_sgemm with the same meaning
// (OpenBLAS computes the whole tile whatever the band: the masked entries it writes are masked
// afterwards, and those it reads are zeros).
inline void tile_gemm(TileGemmFn small, GemmForm form, std::int64_t M, std::int64_t N, std::int64_t K,
                      float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                      float* C, std::int64_t ldc, std::int64_t band = kNoBand) {
  if (small) {
    small(form, M, N, K, alpha, A, lda, B, ldb, C, ldc, band);
    return;
  }
  const CBLAS_TRANSPOSE ta = form == GemmForm::kTN ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = form == GemmForm::kNT ? CblasTrans : CblasNoTrans;
  const float beta = form == GemmForm::kNT || form == GemmForm::kNP ? 0.f : 1.f;
  cblas_sgemm(CblasRowMajor, ta, tb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C,
              int(ldc));
}

}  // namespace posenc::attn_fast
