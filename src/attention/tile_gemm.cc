// The attention tiles' small float32 GEMM (tile_gemm.h): Highway, compiled for every target by
// foreach_target.h, the best chosen at run time.
//
// All three forms run one register-blocked kernel, C[i, j] (+)= alpha·Σ_k a(i, k)·b(k, j) with
// a(i, k) = A[i·sai + k·sak] broadcast and b(k, ·) a row of a row-major [K, N] matrix loaded as
// vectors:
//   kNN: a = A (sai = lda, sak = 1), b = B;
//   kTN: a = Aᵀ (sai = 1, sak = lda: the R rows of a block are adjacent floats of A's row k), b = B;
//   kNT: a = A, b = Bᵀ packed per chunk of ≤ kNc columns into an aligned stack buffer (zero-padded
//        to whole vectors; 4 × 4 blocks transposed in 128-bit vectors);
//   kNP: kNT's chunks with b = the caller's Bᵀ, read in place.
// A block is R rows × W vectors of accumulators (R·W independent multiply-add chains over k):
// R = 4 with AVX-512, 6 on the 16-register targets (kR); W = 2 across N, then W = 1 when one vector
// or less is left (N = D = 16 on AVX-512); the last rows run blocks of 4, 2 and 1. The wide blocks
// (TileBlocks::kWide, AVX-512 only) first run 6 × 4 blocks (24 accumulators) over each stretch of
// 4 vectors of N, then the blocks above on what is left. A column tail shorter than a vector is loaded through a zeroed buffer
// and stored through one (no masked loads or stores: several targets emulate those by reading or
// writing whole vectors, which could race with a neighbouring thread's rows). Every element's sum
// is the same chain whatever R, W or tail: the result of a row does not depend on where it lies.
// A band (tile_gemm.h) trims each block of rows: kNN ends its sum at the block's last visible key,
// kTN starts it at the block's first visible query, and kNT starts each block of columns at the
// first row that sees it (and skips packed chunks no row sees).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#endif

#include "core/fast_common.h"
#include "attention/tile_gemm.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/tile_gemm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using attn_fast::GemmForm;
using I = std::int64_t;

constexpr I kNc = 64;      // NT: Bᵀ columns packed at a time (a multiple of 2 vectors on every target)
constexpr I kMaxKc = 128;  // NT: K up to this packs into the stack buffer (the tiles' largest), else heap
static_assert(attn_fast::kTileGemmMaxD <= kMaxKc, "the attention's NT products pack on the stack");
// Rows of a block. Measured (one thread, Zen 4, the attention's tile shapes, against OpenBLAS): with
// AVX-512, 4 (6 or 8 were slower: the rows of a score tile are 512 bytes apart, and 8 of them share
// the L1 sets of one another's lines); with 16-register targets (AVX2), 6 (12 accumulators; 4 left
// NN and TN up to ~30% behind OpenBLAS at D ≥ 64).
constexpr int kR = HWY_MAX_BYTES >= 64 ? 4 : 6;
// With AVX-512, blocks of 8 rows (16 accumulators, half the loads of B per multiply-add) where the
// rows of a do not share cache sets: kTN (a block's rows are adjacent floats of A's row k) and
// products taller than a tile (more than kWideM rows: the model's projections, whose rows are
// activations 256 or 1024 bytes apart). Measured (one thread, Zen 4) on the study model's
// projections, R = 1024 rows, K or N = 64 … 256, against OpenBLAS: kTN with K = 1024 1.05–1.28×
// (0.80–1.19× over two runs with 4-row blocks), kNN and kNT 1.0–1.2× (one run).
constexpr I kWideM = 128;
// Wide blocks (TileBlocks::kWide): 6 rows × 4 vectors where 4 vectors of N remain, on targets with
// 32 vector registers (24 accumulators, 4 of B and a broadcast). Measured (one thread, Intel Xeon
// Cascade Lake guest, attention nope L = 2048 and 4096, H = 8, D = 64, causal, medians of the thread
// CPU time over 7–11 rounds alternating with the narrow blocks): forward 9–15% and backward 13–17%
// less time than the narrow blocks. On an AMD EPYC Zen 5 (family 1Ah, 512-bit FMA datapath; `posenc
// bench` nope, two runs of 3 rounds, alternating): forward 122 → 136–141 GFLOP/s, backward 104–107 →
// 115–116. On an AMD EPYC Zen 4 (family 19h, 512-bit ops as two 256-bit halves; `posenc bench` nope,
// xl, cope at L = 4096, 3 runs each, alternating): backward 3–7% less time, forward level (nope, xl)
// or 7% less (cope); the model's projection shapes 0.90–1.04 of the narrow blocks' time.
constexpr bool kHasWide = HWY_MAX_BYTES >= 64;

// Rows [0, R) × vectors [0, W) of C from a(i, k) = A[i·sai + k·sak] and rows b(k) = B + k·ldb.
// kTailB: the last vector of B's rows has only `tail` valid floats (read through a buffer);
// kTailC: the last vector of C's rows has only `tail` valid floats (stored through a buffer).
template <int R, int W, bool kTailB, bool kTailC>
HWY_INLINE void Block(const float* HWY_RESTRICT A, I sai, I sak, const float* HWY_RESTRICT B, I ldb,
                      I K, float alpha, bool accumulate, float* HWY_RESTRICT C, I ldc, std::size_t tail) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const std::size_t L = hn::Lanes(d);
  V acc[R][W];
  HWY_UNROLL(8)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(4)
    for (int w = 0; w < W; ++w) acc[r][w] = hn::Zero(d);
  }
  HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)];
  if (kTailB) std::memset(buf, 0, sizeof(buf));
  for (I k = 0; k < K; ++k) {
    const float* HWY_RESTRICT b = B + k * ldb;
    V bv[W];
    HWY_UNROLL(4)
    for (int w = 0; w < W; ++w) {
      if (kTailB && w == W - 1) {
        std::memcpy(buf, b + static_cast<std::size_t>(w) * L, tail * sizeof(float));
        bv[w] = hn::Load(d, buf);
      } else {
        bv[w] = hn::LoadU(d, b + static_cast<std::size_t>(w) * L);
      }
    }
    const float* HWY_RESTRICT a = A + k * sak;
    HWY_UNROLL(8)
    for (int r = 0; r < R; ++r) {
      const V av = hn::Set(d, a[r * sai]);
      HWY_UNROLL(4)
      for (int w = 0; w < W; ++w) acc[r][w] = hn::MulAdd(av, bv[w], acc[r][w]);
    }
  }
  const V va = hn::Set(d, alpha);
  HWY_UNROLL(8)
  for (int r = 0; r < R; ++r) {
    float* HWY_RESTRICT c = C + r * ldc;
    HWY_UNROLL(4)
    for (int w = 0; w < W; ++w) {
      float* cw = c + static_cast<std::size_t>(w) * L;
      if (kTailC && w == W - 1) {
        if (accumulate) {
          std::memcpy(buf, cw, tail * sizeof(float));
          hn::Store(hn::MulAdd(va, acc[r][w], hn::Load(d, buf)), d, buf);
        } else {
          hn::Store(hn::Mul(va, acc[r][w]), d, buf);
        }
        std::memcpy(cw, buf, tail * sizeof(float));
      } else {
        hn::StoreU(accumulate ? hn::MulAdd(va, acc[r][w], hn::LoadU(d, cw)) : hn::Mul(va, acc[r][w]), d,
                   cw);
      }
    }
  }
}

// Which stretch of each block's sum a band keeps (tile_gemm.h): none (all of [0, K)), kNN's
// [0, min(K, i_last + c + 1)) and kTN's [max(0, i_first − c), K) for the block's rows i.
enum class Cut { kNone, kEnd, kStart };

// Rows [i0, M) of one column block: blocks of 8 rows where kWideM says so, then of kR rows, then 4
// (when kR = 6), 2, 1; each block's sum over the stretch of k that the band cut keeps (none of it:
// the block is skipped, C as it was).
template <int W, bool kTailB, bool kTailC>
HWY_INLINE void Rows(I i0, I M, const float* A, I sai, I sak, const float* B, I ldb, I K, float alpha,
                     bool accumulate, float* C, I ldc, std::size_t tail, Cut cut, I c) {
  const auto run = [&](auto rows, I i) {
    constexpr int R = decltype(rows)::value;
    I k0 = 0, k1 = K;
    if (cut == Cut::kEnd) k1 = std::clamp<I>(i + R + c, 0, K);
    if (cut == Cut::kStart) k0 = std::clamp<I>(i - c, 0, K);
    if (cut != Cut::kNone && k1 <= k0) return;
    Block<R, W, kTailB, kTailC>(A + i * sai + k0 * sak, sai, sak, B + k0 * ldb, ldb, k1 - k0, alpha,
                                accumulate, C + i * ldc, ldc, tail);
  };
  I i = i0;
  if constexpr (W == 4) {  // wide blocks (kHasWide)
    // 8 rows short of a multiple of 6 rows (a full tile: 128 = 6·20 + 8): the last 8 as two blocks
    // of 4 (below), not 6 + 2, whose 2-row block loads B's vectors for 2 rows' multiply-adds.
    // Measured on Zen 5 (one thread, 3 runs alternating, 128-row tiles): kNP 128 × 128 × 64 1–3%,
    // kTN and kNN 128 × 64 × 128 1–4% more GFLOP/s
    const I end = (M - i) % 6 == 2 && M - i >= 8 ? M - 8 : M;
    for (; i + 6 <= end; i += 6) run(std::integral_constant<int, 6>{}, i);
  } else if (kR == 4 && (sai == 1 || M > kWideM)) {  // see kWideM
    for (; i + 8 <= M; i += 8) run(std::integral_constant<int, 8>{}, i);
  }
  for (; i + kR <= M; i += kR) run(std::integral_constant<int, kR>{}, i);
  if (kR > 4 && i + 4 <= M) {
    run(std::integral_constant<int, 4>{}, i);
    i += 4;
  }
  if (i + 2 <= M) {
    run(std::integral_constant<int, 2>{}, i);
    i += 2;
  }
  if (i < M) run(std::integral_constant<int, 1>{}, i);
}

// C [M, N] (+)= alpha·a·B over every column: four-vector blocks when kWide, two-vector blocks, then what is left (one vector, a
// vector and a tail, or a tail). padded: B's rows hold whole vectors (zeros past N), so its tail is
// loaded directly. rows_from (kNT's band, c in these columns' numbering): a block of columns
// starting at j runs rows [max(0, j − c), M) only, the rows that see any of its columns.
template <bool kWide>
HWY_INLINE void Panel(I M, I N, const float* A, I sai, I sak, const float* B, I ldb, bool padded, I K,
                      float alpha, bool accumulate, float* C, I ldc, Cut cut, I c, bool rows_from) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  const auto first = [&](I j) { return rows_from ? std::clamp<I>(j - c, 0, M) : I{0}; };
  I j = 0;
  if constexpr (kWide && kHasWide)
    for (; j + 4 * L <= N; j += 4 * L)
      Rows<4, false, false>(first(j), M, A, sai, sak, B + j, ldb, K, alpha, accumulate, C + j, ldc, 0, cut, c);
  for (; j + 2 * L <= N; j += 2 * L)
    Rows<2, false, false>(first(j), M, A, sai, sak, B + j, ldb, K, alpha, accumulate, C + j, ldc, 0, cut, c);
  const I left = N - j;
  if (left == 0) return;
  const std::size_t tail = static_cast<std::size_t>(left % L);
  const I i0 = first(j);
  if (left == L)
    Rows<1, false, false>(i0, M, A, sai, sak, B + j, ldb, K, alpha, accumulate, C + j, ldc, 0, cut, c);
  else if (left > L && padded)
    Rows<2, false, true>(i0, M, A, sai, sak, B + j, ldb, K, alpha, accumulate, C + j, ldc, tail, cut, c);
  else if (left > L)
    Rows<2, true, true>(i0, M, A, sai, sak, B + j, ldb, K, alpha, accumulate, C + j, ldc, tail, cut, c);
  else if (padded)
    Rows<1, false, true>(i0, M, A, sai, sak, B + j, ldb, K, alpha, accumulate, C + j, ldc, tail, cut, c);
  else
    Rows<1, true, true>(i0, M, A, sai, sak, B + j, ldb, K, alpha, accumulate, C + j, ldc, tail, cut, c);
}

// bt [K, ncp] (row stride ldt ≥ ncp) = Bᵀ of B [nc, K] (row stride ldb), columns nc..ncp zero: 4 × 4
// blocks transposed in 128-bit vectors where the target has them, the edges one float at a time.
HWY_INLINE void PackT(const float* HWY_RESTRICT B, I ldb, I nc, I K, float* HWY_RESTRICT bt, I ldt, I ncp) {
  I j = 0, k = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::Full128<float> d4;
  for (; j + 4 <= nc; j += 4) {
    const float* b = B + j * ldb;
    for (k = 0; k + 4 <= K; k += 4) {
      const auto r0 = hn::LoadU(d4, b + k), r1 = hn::LoadU(d4, b + ldb + k),
                 r2 = hn::LoadU(d4, b + 2 * ldb + k), r3 = hn::LoadU(d4, b + 3 * ldb + k);
      const auto t0 = hn::InterleaveLower(d4, r0, r1), t1 = hn::InterleaveLower(d4, r2, r3);  // k, k+1
      const auto t2 = hn::InterleaveUpper(d4, r0, r1), t3 = hn::InterleaveUpper(d4, r2, r3);  // k+2, k+3
      hn::StoreU(hn::ConcatLowerLower(d4, t1, t0), d4, bt + k * ldt + j);
      hn::StoreU(hn::ConcatUpperUpper(d4, t1, t0), d4, bt + (k + 1) * ldt + j);
      hn::StoreU(hn::ConcatLowerLower(d4, t3, t2), d4, bt + (k + 2) * ldt + j);
      hn::StoreU(hn::ConcatUpperUpper(d4, t3, t2), d4, bt + (k + 3) * ldt + j);
    }
    for (; k < K; ++k)
      for (I jj = j; jj < j + 4; ++jj) bt[k * ldt + jj] = B[jj * ldb + k];
  }
#endif
  for (k = 0; k < K; ++k) {
    float* row = bt + k * ldt;
    for (I jj = j; jj < nc; ++jj) row[jj] = B[jj * ldb + k];
    for (I jj = nc; jj < ncp; ++jj) row[jj] = 0.f;
  }
}

template <bool kWide>
void TileGemm(GemmForm form, I M, I N, I K, float alpha, const float* A, I lda, const float* B, I ldb,
              float* C, I ldc, I band) {
  if (M <= 0 || N <= 0) return;
  const bool banded = band < attn_fast::kNoBand;
  if (form == GemmForm::kNN) {
    Panel<kWide>(M, N, A, lda, 1, B, ldb, false, K, alpha, true, C, ldc, banded ? Cut::kEnd : Cut::kNone, band,
          false);
    return;
  }
  if (form == GemmForm::kTN) {
    Panel<kWide>(M, N, A, 1, lda, B, ldb, false, K, alpha, true, C, ldc, banded ? Cut::kStart : Cut::kNone,
          band, false);
    return;
  }
  if (form == GemmForm::kNP) {  // kNT's loop over chunks of columns, Bᵀ as given
    for (I j0 = 0; j0 < N; j0 += kNc) {
      if (banded && j0 > M - 1 + band) break;
      Panel<kWide>(M, std::min(kNc, N - j0), A, lda, 1, B + j0, ldb, false, K, alpha, false, C + j0, ldc,
            Cut::kNone, band - j0, banded);
    }
    return;
  }
  // kNT: Bᵀ of each chunk of columns packed [K, ncp], ncp = nc rounded up to whole vectors; a band
  // skips the chunks no row sees.
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  HWY_ALIGN float stack[kMaxKc * kNc];
  std::vector<float> heap;
  float* bt = stack;
  if (K > kMaxKc) {
    heap.resize(static_cast<std::size_t>(K * kNc));
    bt = heap.data();
  }
  for (I j0 = 0; j0 < N; j0 += kNc) {
    if (banded && j0 > M - 1 + band) break;  // no row sees these columns
    const I nc = std::min(kNc, N - j0), ncp = (nc + L - 1) / L * L;
    PackT(B + j0 * ldb, ldb, nc, K, bt, ncp, ncp);
    Panel<kWide>(M, nc, A, lda, 1, bt, ncp, true, K, alpha, false, C + j0, ldc, Cut::kNone, band - j0, banded);
  }
}

attn_fast::TileGemmFn GetTileGemm(attn_fast::TileBlocks blocks) {
  return blocks == attn_fast::TileBlocks::kWide && kHasWide ? &TileGemm<true> : &TileGemm<false>;
}

void TileTranspose(const float* B, I ldb, I n, I K, float* bt, I ldt) {
  if (n > 0) PackT(B, ldb, n, K, bt, ldt, n);
}
attn_fast::TileTransposeFn GetTileTranspose() { return &TileTranspose; }

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posenc {
HWY_EXPORT(GetTileGemm);
HWY_EXPORT(GetTileTranspose);

attn_fast::TileGemmFn attn_fast::tile_gemm_fn(TileBlocks blocks) { return HWY_DYNAMIC_DISPATCH(GetTileGemm)(blocks); }
attn_fast::TileTransposeFn attn_fast::tile_transpose_fn() { return HWY_DYNAMIC_DISPATCH(GetTileTranspose)(); }

namespace {
attn_fast::TileBlocks blocks_for_cpu() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  if (__builtin_cpu_is("intel")) return attn_fast::TileBlocks::kWide;
  unsigned a = 0, b = 0, c = 0, d = 0;  // AMD: the family from CPUID leaf 1 (base + extended)
  if (!fast::amd_cpu() || !__get_cpuid(1, &a, &b, &c, &d)) return attn_fast::TileBlocks::kNarrow;
  const unsigned base = (a >> 8) & 0xF, family = base == 0xF ? base + ((a >> 20) & 0xFF) : base;
  // Zen 4 and later (the AVX-512 ones; earlier families run 16-register targets): see kHasWide
  return family >= 0x19 ? attn_fast::TileBlocks::kWide : attn_fast::TileBlocks::kNarrow;
#else
  return attn_fast::TileBlocks::kNarrow;
#endif
}
}  // namespace

// Once per process: CPUID traps to the hypervisor in a VM, and the model calls tile_gemm_fn() per product.
attn_fast::TileBlocks attn_fast::default_tile_blocks() {
  static const TileBlocks blocks = blocks_for_cpu();
  return blocks;
}
}  // namespace posenc
#endif
