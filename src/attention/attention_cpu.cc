// The fused (flash-style) attention: the public posenc::attention_forward / attention_backward
// dispatch here.
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
//
// OpenBLAS (D > kTileGemmMaxD, sgemv) is called from inside the OpenMP threads with its own
// threading set to 1 for the call (restored after). SIMD row helpers (max, exp, scale, add, the rotation, diagonal adds and sums)
// are Highway, every target compiled, the best chosen at run time (per call: tests switch).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/attention_tiles.h"
#include "attention/tile_gemm.h"

#ifndef POSENC_ATTENTION_EXTRA_DEFINED
#define POSENC_ATTENTION_EXTRA_DEFINED
namespace posenc::attn_fast {
// This kernel's own SIMD helpers (beyond the shared Simd of attention_tiles.h), defined below.
struct Extra {
  void (*trig_rows)(const double* ang, const double* sc, I n, I half, float* c, float* s);
  void (*rot_rows)(const float* x, I xld, float* y, I n, I ld, const float* c, const float* s, I half,
                   bool interleaved, bool inverse);
  void (*add_diag)(float* S, I nq, I nk, I ld, const float* diag);
  void (*sum_diag)(const float* dS, I nq, I nk, I ld, float* diag);
  void (*affine_add)(float* y, const float* x, I n, float a, float g);  // y += a + g·x (fire)
  // fire, a tile off the diagonal whose segments lie in [lo, hi] (FireSpan below)
  void (*fire_span)(float* S, I nq, I nk, I ld, const float* ps0, I base, bool before, const I* th0, I nb,
                    I lo, I hi, const float* alpha, const double* beta, const double* inv);
  void (*moments)(const float* w, const float* x, const float* z, I n, float* out3);  // Σw, Σw·x, Σw·z
};

// fire_span's cuts (the forward's FireSpan, the backward's moments alike): in a row whose key 0 sits
// at kp − qp = r0, with thresholds th, the end of the run of segment sg that starts at key j — the
// k-th of the tile's segments lo..hi (hi, …, lo before the query, lo, …, hi after it), the last
// ending at nk.
inline I fire_span_end(bool before, I r0, const I* th, I sg, I k, I lo, I hi, I j, I nk) {
  if (k == hi - lo) return nk;
  return std::clamp<I>(before ? -r0 - th[sg - 1] + 1 : th[sg] - r0, j, nk);
}
}  // namespace posenc::attn_fast
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/attention_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using attn_fast::Extra;
using attn_fast::I;
using attn_fast::ix;

HWY_INLINE float RowMax(const float* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  auto m = hn::Set(d, -HUGE_VALF);
  auto nan = hn::IsNaN(m);  // Max's NaN rule differs between targets (EMU128 drops NaN): tracked apart
  std::size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto v = hn::LoadU(d, x + i);
    m = hn::Max(m, v);
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  float r = hn::GetLane(hn::MaxOfLanes(d, m));
  for (; i < n; ++i) r = (x[i] > r || std::isnan(x[i])) ? x[i] : r;
  return hn::AllFalse(d, nan) ? r : std::numeric_limits<float>::quiet_NaN();
}

// x = e^(x − mx) (ExpSoftmax, core/simd-inl.h); with kSum, returns Σ x (else 0).
template <bool kSum>
HWY_INLINE float ExpSub(float* HWY_RESTRICT x, std::size_t n, float mx) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  const auto vm = hn::Set(d, mx);
  auto s = hn::Zero(d);
  std::size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto e = ExpSoftmax(d, hn::Sub(hn::LoadU(d, x + i), vm));
    hn::StoreU(e, d, x + i);
    if (kSum) s = hn::Add(s, e);
  }
  if (i < n) {  // tail through a padded buffer (−inf pads give 0)
    HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)];
    for (std::size_t t = 0; t < L; ++t) buf[t] = i + t < n ? x[i + t] : -HUGE_VALF;
    const auto e = ExpSoftmax(d, hn::Sub(hn::Load(d, buf), vm));
    hn::Store(e, d, buf);
    if (kSum) s = hn::Add(s, e);
    for (std::size_t t = 0; i + t < n; ++t) x[i + t] = buf[t];
  }
  return kSum ? hn::GetLane(hn::SumOfLanes(d, s)) : 0.f;
}

HWY_INLINE void ZeroRow(float* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Zero(d), d, x + i);
  for (; i < n; ++i) x[i] = 0.f;
}

// P = exp(S − lse) over rows (0 for a row whose lse is −inf; attn_fast::nan_row for a NaN row, lse
// NaN), row stride ld.
void ExpRows(float* HWY_RESTRICT S, I nq, I nk, I ld, const float* HWY_RESTRICT lse, I band) {
  for (I i = 0; i < nq; ++i) {
    float* Si = S + i * ld;
    const I n = attn_fast::band_reach(i, band, nk);
    if (lse[i] == -HUGE_VALF) ZeroRow(Si, ix(n));
    else if (std::isnan(lse[i])) attn_fast::nan_row(Si, n);
    else ExpSub<false>(Si, ix(n), lse[i]);
  }
}

void ScaleRow(float* HWY_RESTRICT x, std::size_t n, float c) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  const auto vc = hn::Set(d, c);
  std::size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vc), d, x + i);
  for (; i < n; ++i) x[i] *= c;
}

void AddTo(float* HWY_RESTRICT y, const float* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Add(hn::LoadU(d, y + i), hn::LoadU(d, x + i)), d, y + i);
  for (; i < n; ++i) y[i] += x[i];
}

void DsRow(float* HWY_RESTRICT p, const float* HWY_RESTRICT dp, std::size_t n, float di) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  const auto vd = hn::Set(d, di);
  std::size_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::Mul(hn::LoadU(d, p + i), hn::Sub(hn::LoadU(d, dp + i), vd)), d, p + i);
  for (; i < n; ++i) p[i] *= dp[i] - di;
}

float Dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  auto s = hn::Zero(d);
  std::size_t i = 0;
  for (; i + L <= n; i += L) s = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s);
  float r = hn::GetLane(hn::SumOfLanes(d, s));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

// Whether every x[0, n) is < +inf: no NaN, no +inf (−inf passes).
bool BelowInf(const float* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  const auto inf = hn::Set(d, HUGE_VALF);
  auto ok = hn::Lt(hn::Zero(d), inf);  // all true
  std::size_t i = 0;
  for (; i + L <= n; i += L) ok = hn::And(ok, hn::Lt(hn::LoadU(d, x + i), inf));
  bool r = hn::AllTrue(d, ok);
  for (; i < n; ++i) r = r && x[i] < HUGE_VALF;
  return r;
}

// attn_fast::online_softmax_step (attention_tiles.h) over every row of the tile, in one call: per row
// the same steps as there, the row's o kept as it is (zeros) while its running max is still −∞. A NaN
// row (m NaN, or a row max of NaN or +inf: exp would make 0s of those, or a NaN behind a row max of
// −inf) gets m = l = NaN and S = 0; per row tests only, nothing added to the loops over the row (the
// last one reads the row again, where it would be taken for wholly masked).
void SoftmaxStep(float* HWY_RESTRICT S, I nq, I nk, float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                 float* HWY_RESTRICT o, I D, I band) {
  for (I i = 0; i < nq; ++i) {
    float* Si = S + i * attn_fast::kBk;
    const std::size_t n = ix(attn_fast::band_reach(i, band, nk));
    const float rm = RowMax(Si, n);
    if (std::isnan(m[i]) || std::isnan(rm) || rm == HUGE_VALF) {
      m[i] = l[i] = std::numeric_limits<float>::quiet_NaN();
      ZeroRow(Si, n);
      continue;
    }
    const float mn = std::max(m[i], rm);
    if (mn == -HUGE_VALF) {  // no key yet, unless the −inf row max dropped a NaN
      if (!BelowInf(Si, n)) m[i] = l[i] = std::numeric_limits<float>::quiet_NaN();
      ZeroRow(Si, n);
      continue;
    }
    const float sum = ExpSub<true>(Si, n, mn);
    if (m[i] == -HUGE_VALF) {  // the row's first keys: o is still 0, l = 0
      l[i] = sum;
    } else {
      const float corr = std::exp(m[i] - mn);
      if (corr != 1.f) ScaleRow(o + i * D, ix(D), corr);
      l[i] = l[i] * corr + sum;
    }
    m[i] = mn;
  }
}

// Whether `rows` runs of n floats, run r at x + r·stride, hold no NaN or ±inf: the largest |x| as
// bits below those of +inf, one reduction for all of them.
bool AllFiniteRows(const float* HWY_RESTRICT x, std::size_t n, std::size_t rows, std::size_t stride) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const std::size_t L = hn::Lanes(d);
  const auto abs_bits = hn::Set(du, 0x7fffffffu);
  auto mx = hn::Zero(du);
  bool ok = true;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* y = x + r * stride;
    std::size_t i = 0;
    for (; i + L <= n; i += L) mx = hn::Max(mx, hn::And(hn::BitCast(du, hn::LoadU(d, y + i)), abs_bits));
    for (; i < n; ++i) ok = ok && std::isfinite(y[i]);
  }
  return ok && hn::GetLane(hn::MaxOfLanes(du, mx)) < 0x7f800000u;
}

bool AllFinite(const float* HWY_RESTRICT x, std::size_t n) { return AllFiniteRows(x, n, 1, n); }

attn_fast::Simd GetSimd() {
  return attn_fast::Simd{&ExpRows, &ScaleRow, &AddTo,    &DsRow,        &Dot,
                         &SoftmaxStep, &AllFinite, &AllFiniteRows, &BelowInf};
}

// c, s [n, half] = sc·cos, sc·sin of the angles ang [n, half] (formed in double by the caller from
// the call's rotary plan), by the exact-angle sincos of core/simd-inl.h (reduced in double; bound
// stated there); sc [n, half] the per-pair a·ρ in double, rounded once to float, or null for 1.
void TrigRows(const double* HWY_RESTRICT ang, const double* HWY_RESTRICT sc, I n, I half, float* HWY_RESTRICT c,
              float* HWY_RESTRICT s) {
  std::vector<float> red(ix(2 * half));
  for (I t = 0; t < n; ++t) {
    float* ct = c + t * half;
    float* st = s + t * half;
    SinCosRow(1.0, ang + t * half, ix(half), red.data(), red.data() + half, st, ct);
    if (sc)
      for (I k = 0; k < half; ++k) {
        const float f = static_cast<float>(sc[t * half + k]);
        ct[k] *= f;
        st[k] *= f;
      }
  }
}

// Rotates rows x + r·xld (r < n; the first 2·half entries of each) by R(±pos) into rows y + r·ld, with
// table rows c, s + r·half (consecutive rows at consecutive positions); inverse: R(−pos), the
// gradient's. y may be x (in place: each vector is loaded before its place is stored); entries past
// 2·half are not touched.
//   interleaved: y = x·C + swap_pairs(x)·S, C = (c0 c0 c1 c1 …), S = ∓(s0, −s0, …) per vector;
//   half:        y_a = x_a·c ∓ x_b·s, y_b = x_b·c ± x_a·s over the two contiguous halves.
void RotRows(const float* x, I xld, float* y, I n, I ld, const float* HWY_RESTRICT c,
             const float* HWY_RESTRICT s, I half, bool interleaved, bool inverse) {
  const hn::ScalableTag<float> df;
  const I N = static_cast<I>(hn::Lanes(df));
  const float sg = inverse ? -1.f : 1.f;
  for (I r = 0; r < n; ++r, x += xld, y += ld, c += half, s += half) {
    I k = 0;
    if (interleaved) {
#if HWY_TARGET != HWY_SCALAR
      // Each pair's cos/sin duplicated into two lanes through a 64-bit widening; the sign of the
      // sin lanes flipped by xor (lane 2k gets −s for the forward rotation, lane 2k + 1 for the
      // inverse).
      const hn::Repartition<std::uint64_t, decltype(df)> d64;
      const hn::Rebind<std::uint32_t, decltype(d64)> d32;
      const auto flip =
          hn::BitCast(df, hn::Set(d64, inverse ? 0x8000000000000000ull : 0x80000000ull));
      for (; 2 * k + N <= 2 * half; k += N / 2) {
        const auto cw =
            hn::PromoteTo(d64, hn::LoadU(d32, reinterpret_cast<const std::uint32_t*>(c + k)));
        const auto sw =
            hn::PromoteTo(d64, hn::LoadU(d32, reinterpret_cast<const std::uint32_t*>(s + k)));
        const auto C = hn::BitCast(df, hn::Or(cw, hn::ShiftLeft<32>(cw)));
        const auto S = hn::Xor(hn::BitCast(df, hn::Or(sw, hn::ShiftLeft<32>(sw))), flip);
        const auto v = hn::LoadU(df, x + 2 * k);
        hn::StoreU(hn::MulAdd(hn::Shuffle2301(v), S, hn::Mul(v, C)), df, y + 2 * k);
      }
#endif
      for (; k < half; ++k) {
        const float xa = x[2 * k], xb = x[2 * k + 1], sn = sg * s[k];
        y[2 * k] = xa * c[k] - xb * sn;
        y[2 * k + 1] = xa * sn + xb * c[k];
      }
    } else {
      const auto vs = hn::Set(df, sg);
      for (; k + N <= half; k += N) {
        const auto xa = hn::LoadU(df, x + k), xb = hn::LoadU(df, x + half + k);
        const auto cv = hn::LoadU(df, c + k), sv = hn::Mul(vs, hn::LoadU(df, s + k));
        hn::StoreU(hn::NegMulAdd(xb, sv, hn::Mul(xa, cv)), df, y + k);
        hn::StoreU(hn::MulAdd(xa, sv, hn::Mul(xb, cv)), df, y + half + k);
      }
      for (; k < half; ++k) {
        const float xa = x[k], xb = x[half + k], sn = sg * s[k];
        y[k] = xa * c[k] - xb * sn;
        y[half + k] = xa * sn + xb * c[k];
      }
    }
  }
}

// Adds bias rows: S[i, 0 .. nk) += diag[nq − 1 − i ..] for i < nq (S's row stride ld).
void AddDiag(float* HWY_RESTRICT S, I nq, I nk, I ld, const float* HWY_RESTRICT diag) {
  for (I i = 0; i < nq; ++i) AddTo(S + i * ld, diag + (nq - 1 - i), ix(nk));
}

// Diagonal sums: diag[nq − 1 − i + j] += dS[i, j] (diag zeroed first, nq + nk − 1 entries).
void SumDiag(const float* HWY_RESTRICT dS, I nq, I nk, I ld, float* HWY_RESTRICT diag) {
  std::fill(diag, diag + nq + nk - 1, 0.f);
  for (I i = 0; i < nq; ++i) AddTo(diag + (nq - 1 - i), dS + i * ld, ix(nk));
}

// y[j] += a + g·x[j] (a FIRE run: one linear piece of the MLP over a slice of the ψ table).
HWY_INLINE void AffineAddRun(float* HWY_RESTRICT y, const float* HWY_RESTRICT x, I n, float a, float g) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  const auto va = hn::Set(d, a), vg = hn::Set(d, g);
  I j = 0;
  for (; j + L <= n; j += L) hn::StoreU(hn::Add(hn::LoadU(d, y + j), hn::MulAdd(vg, hn::LoadU(d, x + j), va)), d, y + j);
  for (; j < n; ++j) y[j] += a + g * x[j];
}

void AffineAdd(float* HWY_RESTRICT y, const float* HWY_RESTRICT x, I n, float a, float g) {
  AffineAddRun(y, x, n, a, g);
}

// A FIRE tile wholly before its queries (before) or wholly after them, whose segments all lie in
// [lo, hi]: row i (key 0 at kp − qp = base − i, ψ from ps0 − i, thresholds th0[i·nb ..]) is the runs
// of segments hi, hi − 1, …, lo (before: the distance falls along the row) or lo, …, hi (after),
// each cut at the row's threshold between it and the next; a segment the row does not reach is an
// empty run. S[i, run] += α[s] + (float)(β[s]·inv[i])·ψ: the runs of the general walk, no search.
void FireSpan(float* HWY_RESTRICT S, I nq, I nk, I ld, const float* ps0, I base, bool before, const I* th0,
              I nb, I lo, I hi, const float* alpha, const double* beta, const double* inv) {
  for (I i = 0; i < nq; ++i) {
    float* Si = S + i * ld;
    const float* ps = ps0 - i;
    const I r0 = base - i;
    const I* th = th0 + i * nb;
    I j = 0;
    for (I k = 0; k <= hi - lo; ++k) {
      const I sg = before ? hi - k : lo + k;
      const I e = attn_fast::fire_span_end(before, r0, th, sg, k, lo, hi, j, nk);
      AffineAddRun(Si + j, ps + j, e - j, alpha[sg], static_cast<float>(beta[sg] * inv[i]));
      j = e;
    }
  }
}

// out3 = (Σ w, Σ w·x, Σ w·z) over n entries (a FIRE run's moments of dS).
void Moments(const float* HWY_RESTRICT w, const float* HWY_RESTRICT x, const float* HWY_RESTRICT z, I n,
             float* HWY_RESTRICT out3) {
  const hn::ScalableTag<float> d;
  const I L = static_cast<I>(hn::Lanes(d));
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d);
  I j = 0;
  for (; j + L <= n; j += L) {
    const auto vw = hn::LoadU(d, w + j);
    s0 = hn::Add(s0, vw);
    s1 = hn::MulAdd(vw, hn::LoadU(d, x + j), s1);
    s2 = hn::MulAdd(vw, hn::LoadU(d, z + j), s2);
  }
  float a0 = hn::GetLane(hn::SumOfLanes(d, s0)), a1 = hn::GetLane(hn::SumOfLanes(d, s1)),
        a2 = hn::GetLane(hn::SumOfLanes(d, s2));
  for (; j < n; ++j) a0 += w[j], a1 += w[j] * x[j], a2 += w[j] * z[j];
  out3[0] = a0;
  out3[1] = a1;
  out3[2] = a2;
}

Extra GetExtra() {
  return Extra{&TrigRows, &RotRows, &AddDiag, &SumDiag, &AffineAdd, &FireSpan, &Moments};
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cblas.h>
#include <omp.h>

#include <climits>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>

#include "attention/attention_check.h"
#include "attention/attention_decode.h"
#include "attention/attention_fused.h"
#include "attention/tile_gemm_bf16.h"
#include "core/fast_common.h"
#include "enc/bias/alibi/alibi_math.h"
#include "enc/bias/fire/fire_check.h"
#include "enc/bias/fire/fire_math.h"
#include "enc/bias/kerple/kerple_math.h"
#include "enc/rotary/rope/rope_math.h"
#include "enc/bias/sandwich/sandwich_math.h"
#include "enc/bias/t5/t5_math.h"
#include "posenc/attention.h"
#include "posenc/half.h"
#include "posenc/threads.h"

namespace posenc {
HWY_EXPORT(GetSimd);
HWY_EXPORT(GetExtra);

// Not cached: the tests switch targets (hwy::SetSupportedTargetsForTest) between calls.
attn_fast::Simd attn_fast::simd() { return HWY_DYNAMIC_DISPATCH(GetSimd)(); }

namespace {

using attn::Dims;
using namespace attn_fast;  // NOLINT: the shared tile machinery

Extra extra() { return HWY_DYNAMIC_DISPATCH(GetExtra)(); }

// One side's rotation table (queries or keys): a·ρ·cos φ, a·ρ·sin φ of every token and pair,
// [nh, nb, n, half] — nh = Hq for rope2d mixed (per-head angles), else 1; nb = B when the positions
// differ per batch row, else 1. Angles and scales come from the call's rotary plan (rotary_plan.h),
// formed in double; role +1 for queries, −1 for keys (xPos's ζ^(±(p − c)/s)).
struct RotTab {
  I n = 0, half = 0, nb = 1, nh = 1;
  std::vector<float> c, s;
  void build(const Extra& xs, const rotary::Plan& pl, const std::vector<I>& ids, I B, I count, bool batched,
             I heads, int role, int threads) {
    n = count;
    half = pl.half;
    nb = batched ? B : 1;
    nh = pl.per_head() ? heads : 1;
    const I rows = nh * nb * n, A = pl.axes;
    c.resize(ix(rows * half));
    s.resize(ix(rows * half));
    const bool scaled = pl.scaled() || pl.factor != 1.0;
    constexpr I kPiece = 512;  // rows per parallel piece: a decode step's stays on one thread
    const I pieces = (rows + kPiece - 1) / kPiece;
    const int th = pieces > 1 ? threads : 1;
    attn_fast::RegionGuard guard;
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
    for (I pc = 0; pc < pieces; ++pc) {
      const I r0 = pc * kPiece, cnt = std::min(kPiece, rows - r0);
      std::vector<double> ang, sc;
      if (guard.failed() || !guard.run([&] {
            ang.resize(ix(cnt * half));
            sc.resize(scaled ? ix(cnt * half) : 0);
          }))
        continue;
      I p[3] = {0, 0, 0};
      for (I t = 0; t < cnt; ++t) {
        const I row = r0 + t, i = row % n, b = (row / n) % nb, h = row / (n * nb);
        for (I a = 0; a < A; ++a) p[a] = ids[ix((b * A + a) * n + i)];
        for (I k = 0; k < half; ++k) {
          ang[ix(t * half + k)] = pl.angle(p, k, h);
          if (scaled) sc[ix(t * half + k)] = pl.scale(p[0], k, role);
        }
      }
      xs.trig_rows(ang.data(), scaled ? sc.data() : nullptr, cnt, half, &c[ix(r0 * half)], &s[ix(r0 * half)]);
    }
    guard.rethrow();
  }
  std::size_t at(I b, I h, I i) const {
    return ix((((nh > 1 ? h : 0) * nb + (nb > 1 ? b : 0)) * n + i) * half);
  }
  // Rows i, i + 1, … of (b, h) follow one another.
  const float* cos_at(I b, I h, I i) const { return &c[at(b, h, i)]; }
  const float* sin_at(I b, I h, I i) const { return &s[at(b, h, i)]; }
};

// Rows of a tile as sgemm reads them: p with row stride ld (in the input itself, or in scratch).
struct Tile {
  const float* p;
  I ld;
};

// Where a backward task accumulates the dQ rows of its G query heads (float32): in dq itself or in
// a buffer [G, rows, D] whose first row is row0. p == nullptr: dq is not wanted.
struct Acc {
  float* p = nullptr;
  I ld = 0, hs = 0, row0 = 0;  // row stride, head stride
  float* row(I g, I i) const { return p + g * hs + (i - row0) * ld; }
};

// Per-thread scratch, kept by each thread between calls (thread_scratch): at the study model's size
// (B·L = 256 rows a call, D = 16) allocating and zero-filling it afresh took ~2% of a training step.
// Nothing reads it before writing it (the tests pass with it NaN-filled), so it is never cleared; it
// keeps ~(8·128·D + 2·128²) floats a thread (~200 KB at D = 16) after the last call.
struct Scratch {
  std::vector<float> q, k, v, s, dp, o, dout, dk, dv, ml, diag, dkg, row;
  std::vector<float> kt, vt;  // backward: Kᵀ, Vᵀ of the key block [D, kLdt] (the kNP products)
  std::vector<float> qs, ks, vs, dos;  // careful steps (non-finite inputs): sanitized copies
  // the bfloat16-rate forward (tile_gemm_bf16.h): Q [Bq, D/2], Kᵀ [D/2, kLdt] and P [Bq, Bk/2] as
  // pairs; V [Bk/2, D] as row pairs. Its backward (keys_rate): kb, pb as there, vb K's row pairs,
  // vtb Vᵀ [D/2, kLdt], ib P or dS as row pairs [Bq/2, kLdt]; under a rotary encoding kft the
  // rotated K̃ᵀ [D, kLdt] in float32 (the logits' kNP product)
  std::vector<attn_fast::Pair> qb, kb, pb, vb, vtb, ib;
  std::vector<float> kft;
  void init(I D) {
    q.resize(ix(kBq * D));
    k.resize(ix(kBk * D));
    v.resize(ix(kBk * D));
    vs.resize(ix(kBk * D));
    s.resize(ix(kBq * kBk));
    o.resize(ix(kBq * D));
    ml.resize(ix(2 * kBq));
    diag.resize(ix(kBq + kBk));
  }
  void init_bf16(I D) {
    qb.resize(ix(kBq * D / 2));
    kb.resize(ix(D / 2 * kLdt));
    pb.resize(ix(kBq * kBk / 2));
    vb.resize(ix(kBk / 2 * D));
  }
  void init_bf16_backward(I D) {
    init_bf16(D);
    vtb.resize(ix(D / 2 * kLdt));
    ib.resize(ix(kBq / 2 * kLdt));
    kft.resize(ix(D * kLdt));
  }
  void init_backward(I D) {
    dp.resize(ix(kBq * kBk));
    dout.resize(ix(kBq * D));
    dk.resize(ix(kBk * D));
    dv.resize(ix(kBk * D));
    dkg.resize(ix(kBk * D));
    row.resize(ix(D));
    kt.resize(ix(D * kLdt));
    vt.resize(ix(D * kLdt));
    qs.resize(ix(kBq * D));
    ks.resize(ix(kBk * D));
    dos.resize(ix(kBq * D));
  }
};

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

// The forward's key panels: every key block's Kᵀ and V packed once per call ([B, Hkv, key blocks]),
// not once per query tile that reads it. bf16: as bfloat16 pairs for the bfloat16 rate; wide: 16-bit
// k and v off that rate, widened to float32 once.
struct Panels {
  std::vector<attn_fast::Pair> bf16;
  std::vector<float> wide;
};

// What a forward wrote, handed to the backward: out [B, M, Hq, D] and lse (float64 [B, Hq, M]).
struct Saved {
  View out, lse;
};

class Fused {
 public:
  Fused(const AttentionParams& p, const Dims& d, const View& q, const View& k, const View& v,
        const EncodingTensors& t, int threads)
      : p_(p), d_(d), q_(q), k_(k), v_(v), threads_(threads), simd_(simd()), xs_(extra()), gemm_(tile_gemm_for(d.D)) {
    const I Hq = d.Hq;
    dir_q_ = direct(q);
    dir_k_ = direct(k);
    dir_v_ = direct(v);
    cf_ = careful_forward(simd_, d, k, threads);
    bf16_ = p.bf16_rate && bf16_rate(q, k, v) ? attn_fast::bf16_ops() : nullptr;
    if (d.rotary) {
      interleaved_ = d.rot.layout == RopeLayout::kInterleaved;
      per_head_ = d.rot.per_head();
      tab_q_.build(xs_, d.rot, d.q_ids, d.B, d.M, d.q_batched, Hq, +1, threads);
      tq_ = &tab_q_;
      if (!p.keys_rotated) {  // else k carries its rotation: read as it is, dK not rotated back
        tab_k_.build(xs_, d.rot, d.k_ids, d.B, d.N, d.k_batched, Hq, -1, threads);
        tk_ = &tab_k_;
      }
      if (per_head_) {
        // dfreqs = Σ p·∂L/∂φ over the head's rotated q and k rows. The logits depend on φ_q − φ_k
        // only, so Σ ∂L/∂φ = 0 per head and pair: Σ (p − p₀)·∂L/∂φ is the same sum, and with p₀ the
        // middle of the call's positions it loses no digits to cancellation at large positions.
        for (int a = 0; a < 2; ++a) {
          I lo = INT64_MAX, hi = INT64_MIN;
          for (const std::vector<I>* ids : {&d.q_ids, &d.k_ids}) {
            const I n = ids == &d.q_ids ? d.M : d.N;
            for (I b = 0; b < d.B; ++b)
              for (I i = 0; i < n; ++i) {
                const I v = (*ids)[ix((b * 2 + a) * n + i)];
                lo = std::min(lo, v), hi = std::max(hi, v);
              }
          }
          pos0_[a] = lo <= hi ? static_cast<double>(lo / 2 + hi / 2) : 0.0;
        }
      }
    }
    if (p.encoding == Encoding::kAlibi) {
      const AlibiVariant var = p.alibi.variant;
      nonsym_ = var == AlibiVariant::kNonsymmetric;
      if (var == AlibiVariant::kLearned) {
        bias_ = Bias::kLearned;
        const std::vector<double> w = to_doubles(t.weights);  // [2, Hq]
        sig_.resize(ix(2 * Hq));
        for (I i = 0; i < 2 * Hq; ++i) sig_[ix(i)] = alibi::sigmoid(w[ix(i)]);
      } else {
        bias_ = Bias::kSlopes;
        if (t.slopes.present()) {
          slopes_ = to_doubles(t.slopes);
        } else {
          slopes_ = alibi::rule_slopes(Hq, nonsym_);
        }
      }
    }
    if (p.encoding == Encoding::kT5) {
      bias_ = Bias::kT5;
      const I nb = p.t5.num_buckets;
      const std::vector<double> w = to_doubles(t.weights);  // [nb, Hq]
      t5w_.resize(ix(Hq * nb));  // [Hq, nb]: a head's row stays in cache
      for (I bk = 0; bk < nb; ++bk)
        for (I h = 0; h < Hq; ++h) t5w_[ix(h * nb + bk)] = static_cast<float>(w[ix(bk * Hq + h)]);
      // The bucket of every kp − qp the call meets (M + N − 1 values, shared by the heads): the log
      // of t5::bucket leaves the tiles.
      rel_lo_ = d.k_off - d.q_off - (d.M - 1);
      bucket_.resize(ix(d.M + d.N - 1));
      for (I t = 0; t < d.M + d.N - 1; ++t)
        bucket_[ix(t)] = static_cast<std::int32_t>(
            t5::bucket(rel_lo_ + t, p.t5.bidirectional, nb, p.t5.max_distance));
    }
    if (p.encoding == Encoding::kKerple || p.encoding == Encoding::kSandwich) build_lut(t);
    if (p.encoding == Encoding::kFire) build_fire(t);
  }

  // Forward over every (b, h, query block); out [B, M, Hq, D], lse optional [B, Hq, M] float64.
  void forward(const View& out, const View& lse) const {
    const I nqb = (d_.M + kBq - 1) / kBq, tasks = d_.B * d_.Hq * nqb;
    const Panels panels = key_panels(true);
    attn_fast::RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
    {
      Scratch& w = thread_scratch();
      std::vector<double> l;
      guard.run([&] {
        w.init(d_.D);
        if (bf16_) w.init_bf16(d_.D);
        l.resize(ix(kBq));
      });
#pragma omp for schedule(dynamic, 1)
      for (I task = 0; task < tasks; ++task) {
        if (guard.failed()) continue;
        I b, h, q0, nq;
        query_task(task, nqb, &b, &h, &q0, &nq);
        forward_block(b, h, q0, nq, &w, w.o.data(), l.data(), false, true, &panels);
        attn_fast::store_rows(out, d_.D, b, q0, nq, h, w.o.data());
        if (lse.present()) {
          double* base = static_cast<double*>(lse.data);
          for (I i = 0; i < nq; ++i)
            base[b * lse.strides[0] + h * lse.strides[1] + (q0 + i) * lse.strides[2]] = l[ix(i)];
        }
      }
    }
    guard.rethrow();
  }

  // Backward. dq, dk, dv optional (absent: not computed); parameter gradients g optional. With
  // `saved` (the out and lse this object's forward wrote for the same arguments), pass 1 reads them
  // instead of running the forward again: the same lse and D, bit for bit, when out is float32.
  void backward(const View& dout, const View& dq, const View& dk, const View& dv,
                const EncodingGrads& g, const Saved* saved = nullptr) const {
    const I B = d_.B, M = d_.M, N = d_.N, Hq = d_.Hq, Hkv = d_.Hkv, D = d_.D, G = d_.G;
    Bwd bw{dout, direct(dout), dq, dk, dv, {}, {}, 0};
    // the careful steps on every tile (attention_tiles.h): k or v not finite
    bw.careful = (cf_.k_known ? !cf_.k_finite : !all_finite(simd_, k_, threads_)) ||
                 !all_finite(simd_, v_, threads_);
    // the bfloat16 rate (keys_rate): the forward's conditions, dout bfloat16 too, not rope2d mixed
    bw.rate = bf16_ && !bw.careful && !per_head_ && dout.dtype == DType::kBF16 && M > 1;
    // rope2d mixed with dfreqs: the per-head sums [2, r/2] in gw; dQ̃ is then accumulated even
    // when dq is not wanted.
    bw.freq = per_head_ && g.freqs.present();
    bw.npar = bias_ == Bias::kT5 ? p_.t5.num_buckets
              : bias_ == Bias::kLearned || p_.encoding == Encoding::kKerple ? 2
              : bias_ == Bias::kFire ? 2 * fire_p_.segs() + 2
              : bw.freq              ? 2 * d_.rot.half
                                     : 0;
    // Pass 1 at the rate too, unless there are parameter gradients: they sum dS over whole rows, and
    // Σ_j dS_ij = 0 needs D of the out pass 2's P gives (the float32 products' out)
    const bool rate1 = bw.rate && bw.npar == 0;
    // pass 1: lse and D = rowsum(dO ⊙ out), [B, Hq, M]
    bw.lse.resize(ix(B * Hq * M));
    bw.Dv.resize(ix(B * Hq * M));
    const I nqb = (M + kBq - 1) / kBq;
    Panels panels = saved ? Panels{} : key_panels(rate1);  // released after pass 1
    attn_fast::RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
    {
      Scratch& w = thread_scratch();
      std::vector<double> l;
      guard.run([&] {
        w.init(D);
        w.init_backward(D);
        if (rate1) w.init_bf16(D);
        l.resize(ix(kBq));
      });
#pragma omp for schedule(dynamic, 1)
      for (I task = 0; task < B * Hq * nqb; ++task) {
        if (guard.failed()) continue;
        I b, h, q0, nq;
        query_task(task, nqb, &b, &h, &q0, &nq);
        if (saved) {
          attn_fast::load_rows(saved->out, D, b, q0, nq, h, w.o.data());
          const View& ls = saved->lse;
          const double* base = static_cast<const double*>(ls.data);
          for (I i = 0; i < nq; ++i) l[ix(i)] = base[b * ls.strides[0] + h * ls.strides[1] + (q0 + i) * ls.strides[2]];
        } else {
          forward_block(b, h, q0, nq, &w, w.o.data(), l.data(), bw.careful, rate1, &panels);
        }
        const Tile dO = rows(dout, bw.dir_dout, b, q0, nq, h, w.dout.data(), nullptr, 0);
        for (I i = 0; i < nq; ++i) {
          const std::size_t at = ix((b * Hq + h) * M + q0 + i);
          bw.lse[at] = static_cast<float>(l[ix(i)]);
          bw.Dv[at] = simd_.dot(dO.p + i * dO.ld, &w.o[ix(i * D)], ix(D));
        }
      }
    }
    guard.rethrow();
    panels = Panels{};
    // pass 2, per (b, kv head) = unit; units beyond the last multiple of the thread count are split
    // over the key blocks (see the file comment).
    const I npar = bw.npar;
    std::vector<double> gw(ix(B * Hq * npar), 0.0);  // [B, Hq, npar]
    const I U = B * Hkv, T = threads_, whole = U - U % T, nkb = (N + kBk - 1) / kBk;
    const bool need_dq = dq.present() || bw.freq;
    const bool dq_dir = dq.present() && direct_out(dq, Hq) && !attn_fast::dq_buffered(G, M, D);
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && whole > 1)
    if (whole > 0) {
      Scratch& w = thread_scratch();
      std::vector<float> dqbuf;  // [G, M, D]
      guard.run([&] {
        w.init(D);
        w.init_backward(D);
        if (bw.rate) w.init_bf16_backward(D);
        dqbuf.resize(need_dq && !dq_dir ? ix(G * M * D) : 0);
      });
#pragma omp for schedule(dynamic, 1)
      for (I u = 0; u < whole; ++u) {
        if (guard.failed()) continue;
        const I b = u / Hkv, kh = u % Hkv;
        const Acc acc = dq_dir    ? dq_in_place(dq, b, kh)
                        : need_dq ? Acc{dqbuf.data(), D, M * D, 0}
                                  : Acc{};
        for (I g = 0; g < G && acc.p; ++g) zero_rows(acc, g, 0, M);
        keys(bw, b, kh, 0, nkb, acc, npar ? &gw[ix((b * Hq + kh * G) * npar)] : nullptr, &w);
        for (I g = 0; g < G && acc.p; ++g) {
          if (bw.freq)  // dQ̃ of head h is complete: its frequency gradient, before it is rotated back
            freq_grad_rows(true, b, kh * G + g, 0, M, nullptr, 0, acc.row(g, 0), acc.ld, w.row.data(),
                           &gw[ix((b * Hq + kh * G + g) * npar)]);
          finish_dq(dq, dq_dir, acc, b, kh, g, 0, M);
        }
      }
    }
    guard.rethrow();
    for (I u = whole; u < U; ++u) split_unit(bw, u / Hkv, u % Hkv, dq_dir, &gw);
    // Parameter gradients: per (b, h) in gw, summed over the batch here.
    std::vector<double> sum(ix(Hq * npar), 0.0);  // [Hq, npar]
    for (I h = 0; h < Hq; ++h)
      for (I r = 0; r < npar; ++r) {
        double acc = 0;
        for (I b = 0; b < B; ++b) acc += gw[ix((b * Hq + h) * npar + r)];
        sum[ix(h * npar + r)] = acc;
      }
    if (g.weights.present())  // t5, learned alibi: [npar, Hq]
      for (I r = 0; r < npar; ++r)
        for (I h = 0; h < Hq; ++h) g.weights.set(r * Hq + h, sum[ix(h * npar + r)]);
    if (p_.encoding == Encoding::kKerple)  // [Hq, 2]: ∂/∂r1, ∂/∂r2
      for (I h = 0; h < Hq; ++h) {
        if (g.r1.present()) g.r1.set(h, sum[ix(h * npar)]);
        if (g.r2.present()) g.r2.set(h, sum[ix(h * npar + 1)]);
      }
    if (bias_ == Bias::kFire) fire_grads(sum, g.fire);
    if (bw.freq) {  // [2, Hq, r/2]: ∂/∂θˣ, ∂/∂θʸ
      const I half = d_.rot.half;
      for (I ax = 0; ax < 2; ++ax)
        for (I h = 0; h < Hq; ++h)
          for (I k = 0; k < half; ++k) g.freqs.set((ax * Hq + h) * half + k, sum[ix(h * npar + ax * half + k)]);
    }
  }

 private:
  // kLut: a per-head table over every distance of the call (kerple, sandwich); kFire: ψ per distance
  // and per-row linear pieces of the MLP.
  enum class Bias { kNone, kSlopes, kLearned, kT5, kLut, kFire };

  // What pass 2 reads and writes.
  struct Bwd {
    const View& dout;
    bool dir_dout;
    const View &dq, &dk, &dv;
    std::vector<float> lse, Dv;  // [B, Hq, M]
    I npar;                      // parameter gradients per head
    bool freq = false;           // rope2d mixed: dfreqs wanted (npar = r: θˣ then θʸ per pair)
    bool careful = false;        // k or v not finite: the careful steps on every tile
    bool rate = false;           // pass 2's products at the bfloat16 rate where a unit allows (keys_rate)
  };

  bool past_only(I h) const { return p_.causal || (nonsym_ && h < d_.Hq / 2); }
  bool future_only(I h) const { return nonsym_ && h >= d_.Hq / 2; }
  // The tile products' band (tile_gemm.h) for head h's tile whose key 0 − query 0 distance is base
  // (kp − qp): past-only heads see key j from row i when j ≤ i − base.
  I band(I h, I base) const { return past_only(h) && !future_only(h) ? -base : attn_fast::kNoBand; }

  // Task → (b, h, query block): (b, h)-major, so that the threads share a head's K and V in cache;
  // within a head the costly blocks first (the most keys: last when causal, first for future-only
  // heads), so the cheap ones even out the threads' ends.
  void query_task(I task, I nqb, I* b, I* h, I* q0, I* nq) const {
    I qi;
    attn_fast::head_major_task(task, nqb, d_.Hq, b, h, &qi);
    const I qb = future_only(*h) ? qi : nqb - 1 - qi;
    *q0 = qb * kBq;
    *nq = std::min(kBq, d_.M - *q0);
  }

  // Query rows [ilo, ihi) of head h that see any key of the block at kp0 .. kp0 + nk − 1.
  void query_range(I h, I kp0, I nk, I* ilo, I* ihi) const {
    *ilo = 0;
    *ihi = d_.M;
    if (past_only(h)) *ilo = std::clamp<I>(kp0 - d_.q_off, 0, d_.M);
    if (future_only(h)) *ihi = std::clamp<I>(kp0 + nk - d_.q_off, 0, d_.M);
  }

  // Whether the products may take the bfloat16 rate (where the CPU has it): q, k and v
  // bfloat16, even D within the tile GEMM's, k and v rows with unit inner stride (packed from the
  // input as they are).
  bool bf16_rate(const View& q, const View& k, const View& v) const {
    return q.dtype == DType::kBF16 && k.dtype == DType::kBF16 && v.dtype == DType::kBF16 && d_.D % 2 == 0 &&
           gemm_ && k.strides[3] == 1 && v.strides[3] == 1;
  }
  // Whether sgemm can read rows of x in place: float32, unit inner stride, a row stride ≥ D that
  // fits an int (or a single row).
  bool direct(const View& x) const {
    return x.dtype == DType::kF32 && (x.strides[3] == 1 || d_.D == 1) &&
           (x.shape[1] == 1 || (x.strides[1] >= d_.D && x.strides[1] <= INT_MAX));
  }
  // Whether dq [B, M, H, D] can take sgemm's accumulation in place: direct, and its (b, row, head)
  // rows never overlap one another.
  bool direct_out(const View& x, I H) const {
    if (!direct(x) || x.strides[3] != 1) return false;
    if (H > 1 && x.strides[2] < d_.D) return false;
    const I row = (H - 1) * x.strides[2] + d_.D;
    if (x.shape[1] > 1 && x.strides[1] < row) return false;
    return x.shape[0] == 1 || x.strides[0] >= (x.shape[1] - 1) * x.strides[1] + row;
  }
  Acc dq_in_place(const View& dq, I b, I kh) const {
    float* base = static_cast<float*>(dq.data) + b * dq.strides[0] + kh * d_.G * dq.strides[2];
    return Acc{base, d_.M == 1 ? d_.D : dq.strides[1], dq.strides[2], 0};
  }
  void zero_rows(const Acc& a, I g, I i0, I i1) const {
    for (I i = i0; i < i1; ++i) std::fill(a.row(g, i), a.row(g, i) + d_.D, 0.f);
  }
  // dQ rows [i0, i1) of query head g of (b, kh), accumulated in a: rotated back by the transpose
  // a·ρ·R(−φ) (rotary encodings) and, from a buffer, stored into dq (when dq is wanted: rope2d
  // mixed accumulates dQ̃ for dfreqs even without it).
  void finish_dq(const View& dq, bool in_place, const Acc& a, I b, I kh, I g, I i0, I i1) const {
    if (i1 <= i0) return;
    float* y = a.row(g, i0);
    const I h = kh * d_.G + g;
    if (tq_) rotate(y, i1 - i0, a.ld, *tq_, b, h, i0, true);
    if (!in_place && dq.present()) attn_fast::store_rows(dq, d_.D, b, i0, i1 - i0, h, y);
  }

  // rope2d mixed: fg [2, half] (head h's ∂/∂θˣ, ∂/∂θʸ) += Σ over the rows [i0, i0 + n) of the
  // queries (query) or keys of (px − x₀, py − y₀)·(g_b·ỹ_a − g_a·ỹ_b) (pos0_: the same total), ỹ
  // the row rotated for head h (tile rows at yt, row stride yld; null: the query rows, loaded and
  // rotated here into tmp [D]) and g its gradient (rows at gt, row stride gld).
  void freq_grad_rows(bool query, I b, I h, I i0, I n, const float* yt, I yld, const float* gt, I gld,
                      float* tmp, double* fg) const {
    const I half = d_.rot.half, L = query ? d_.M : d_.N;
    const std::vector<I>& ids = query ? d_.q_ids : d_.k_ids;
    const I bb = (query ? d_.q_batched : d_.k_batched) ? b : 0;
    for (I r = 0; r < n; ++r) {
      const I i = i0 + r;
      const float* y = yt ? yt + r * yld : tmp;
      if (!yt) {
        attn_fast::load_rows(q_, d_.D, b, i, 1, h, tmp);
        rotate(tmp, 1, d_.D, *tq_, b, h, i, false);
      }
      const float* g = gt + r * gld;
      const double px = static_cast<double>(ids[ix((bb * 2 + 0) * L + i)]) - pos0_[0];
      const double py = static_cast<double>(ids[ix((bb * 2 + 1) * L + i)]) - pos0_[1];
      for (I k = 0; k < half; ++k) {
        const I ia = interleaved_ ? 2 * k : k, ib = interleaved_ ? 2 * k + 1 : k + half;
        const double dphi = rope2d::dphi(y[ia], y[ib], g[ia], g[ib]);
        fg[k] += px * dphi;
        fg[half + k] += py * dphi;
      }
    }
  }

  // Rows [r0, r0 + n) of head `head` of x [B, L, H, D]: in place when `dir` and no rotation; with a
  // rotation table, rotated as query head th sees them into buf [n, D] (when `dir`, straight from x:
  // one pass); else converted into buf first.
  Tile rows(const View& x, bool dir, I b, I r0, I n, I head, float* buf, const RotTab* tab,
            I th) const {
    const I D = d_.D;
    if (dir) {
      const float* src = static_cast<const float*>(x.data) + b * x.strides[0] + r0 * x.strides[1] +
                         head * x.strides[2];
      if (!tab) return Tile{src, n == 1 ? D : x.strides[1]};
      xs_.rot_rows(src, x.strides[1], buf, n, D, tab->cos_at(b, th, r0), tab->sin_at(b, th, r0), tab->half,
                   interleaved_, false);
      if (const I rd = 2 * tab->half; rd < D)  // partial rotary: the rest as it is
        for (I r = 0; r < n; ++r) attn_fast::copy_row(buf + r * D + rd, src + r * x.strides[1] + rd, D - rd);
      return Tile{buf, D};
    }
    attn_fast::load_rows(x, D, b, r0, n, head, buf);
    if (tab) rotate(buf, n, D, *tab, b, th, r0, false);
    return Tile{buf, D};
  }

  // n rows of x (row stride ld), tokens i0, i0 + 1, … of batch row b as query head th sees them,
  // rotated by a·ρ·R(φ) or its transpose a·ρ·R(−φ) (inverse).
  void rotate(float* x, I n, I ld, const RotTab& tab, I b, I th, I i0, bool inverse) const {
    xs_.rot_rows(x, ld, x, n, ld, tab.cos_at(b, th, i0), tab.sin_at(b, th, i0), tab.half, interleaved_,
                 inverse);
  }

  // The bias of head h for the tile whose key 0 − query 0 distance is `base` (kp − qp):
  // diag[t] for kp − qp = base + t − (nq − 1), t ∈ [0, nq + nk − 1).
  void tile_bias(I h, I base, I nq, I nk, float* diag) const {
    const I nt = nq + nk - 1, rel0 = base - (nq - 1);
    switch (bias_) {
      case Bias::kSlopes: {
        const double m = slopes_[ix(h)];
        for (I t = 0; t < nt; ++t) {
          const I rel = rel0 + t;
          diag[t] = static_cast<float>(-m * static_cast<double>(rel < 0 ? -rel : rel));
        }
        break;
      }
      case Bias::kLearned: {
        const double past = sig_[ix(h)], fut = sig_[ix(d_.Hq + h)];
        for (I t = 0; t < nt; ++t) {
          const I rel = rel0 + t;
          diag[t] = static_cast<float>(rel < 0 ? past * static_cast<double>(rel)
                                               : -fut * static_cast<double>(rel));
        }
        break;
      }
      case Bias::kT5: {
        const float* w = &t5w_[ix(h * p_.t5.num_buckets)];
        const std::int32_t* bk = &bucket_[ix(rel0 - rel_lo_)];
        for (I t = 0; t < nt; ++t) diag[t] = w[bk[t]];
        break;
      }
      default: break;
    }
  }

  // w->s [nq, Bk] = scale·Q·Kᵀ + bias, masked entries −inf. Kt: K's rows transposed [D, kLdt] (the
  // tile GEMM's kNP form), or null.
  void logits(I h, I q0, I nq, I j0, I nk, const Tile& Q, const Tile& K, Scratch* w,
              const float* Kt = nullptr) const {
    float* S = w->s.data();
    const I base = (d_.k_off + j0) - (d_.q_off + q0);  // kp − qp of (row 0, col 0)
    const I bd = band(h, base);
    if (nq == 1)  // a decode step: no tile to reuse, so skip sgemm's packing
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(nk), int(d_.D), static_cast<float>(d_.scale),
                  K.p, int(K.ld), Q.p, 1, 0.f, S, 1);
    else if (Kt)
      tile_gemm(gemm_, GemmForm::kNP, nq, nk, d_.D, static_cast<float>(d_.scale), Q.p, Q.ld, Kt, kLdt, S,
                kBk, bd);
    else
      tile_gemm(gemm_, GemmForm::kNT, nq, nk, d_.D, static_cast<float>(d_.scale), Q.p, Q.ld, K.p,
                K.ld, S, kBk, bd);
    finish_logits(h, q0, nq, nk, base, bd, S, w->diag.data());
  }

  // The rest of logits() on S [nq, Bk] holding scale·Q·Kᵀ: the bias, and the masks.
  void finish_logits(I h, I q0, I nq, I nk, I base, I bd, float* S, float* diag) const {
    if (bias_ == Bias::kLut) {  // the table's slice for this tile, read in place
      xs_.add_diag(S, nq, nk, kBk, &lut_[ix(h * lut_w_ + base - (nq - 1) - rel_lo_)]);
    } else if (bias_ == Bias::kFire) {
      fire_tile(h, q0, base, nq, nk, S, nullptr, nullptr);
    } else if (bias_ != Bias::kNone) {
      tile_bias(h, base, nq, nk, diag);
      xs_.add_diag(S, nq, nk, kBk, diag);
    }
    // kp − qp = base + j − i; past only: j ≤ i − base; future only: j ≥ i − base.
    const bool past = past_only(h), fut = future_only(h);
    if (!past && !fut) return;
    if (past && !fut && base + nk - 1 <= 0) return;  // wholly visible
    if (fut && !past && base - (nq - 1) >= 0) return;
    // a banded tile (past only) holds −inf past each row's last key up to the softmax's reach
    // (band_reach, attention_tiles.h) and zeros beyond it: the softmax and exp_rows read only that
    // reach, and the products read the zeros as P and dS
    for (I i = 0; i < nq; ++i) {
      I jl = 0, jh = nk;
      if (fut) jl = std::clamp<I>(i - base, 0, nk);
      if (past) jh = std::clamp<I>(i - base + 1, 0, nk);
      float* Si = S + i * kBk;
      if (jh < jl) jh = jl;
      std::fill(Si, Si + jl, kNegInfF);
      const I reach = std::max(jh, attn_fast::band_reach(i, bd, nk));
      std::fill(Si + jh, Si + reach, kNegInfF);
      std::fill(Si + reach, Si + nk, 0.f);
    }
  }

  // Rows [q0, q0 + nq) of head h: o [nq, D] = softmax(logits)·V, lse [nq]. careful_v: P·V of the
  // sanitized V, its non-finite entries' terms added back (attention_tiles.h) — taken again with it
  // when a row of finite lse comes out non-finite (a NaN or ±inf in V).
  // rate_ok: the bfloat16-rate products where the call has them (bf16_): the forward's blocks, and the
  // backward's pass 1 where it has no parameter gradients (see backward()).
  // panels: key_panels() of the call, or null.
  void forward_block(I b, I h, I q0, I nq, Scratch* w, float* o, double* lse, bool careful_v = false,
                     bool rate_ok = false, const Panels* panels = nullptr) const {
    const I D = d_.D, kh = h / d_.G;
    const Tile Q = rows(q_, dir_q_, b, q0, nq, h, w->q.data(), tq_, h);
    const bool rate = rate_ok && bf16_ && !careful_v && nq > 1;
    if (rate && !tq_) bf16_->round_rows(Q.p, Q.ld, nq, D, w->qb.data(), D / 2);  // exact: q is bfloat16
    const I qp_min = d_.q_off + q0, qp_max = qp_min + nq - 1;
    I jlo = 0, jhi = d_.N;
    if (past_only(h)) jhi = std::clamp<I>(qp_max - d_.k_off + 1, 0, d_.N);
    if (future_only(h)) jlo = std::clamp<I>(qp_min - d_.k_off, 0, d_.N);
    float* m = w->ml.data();
    float* l = m + kBq;
    std::fill(m, m + nq, kNegInfF);
    std::fill(l, l + nq, 0.f);
    std::fill(o, o + nq * D, 0.f);
    float* S = w->s.data();
    for (I j0 = jlo; j0 < jhi; j0 += kBk) {
      const I nk = std::min(kBk, jhi - j0);
      const I bd = band(h, (d_.k_off + j0) - qp_min);
      const bool whole = panels && j0 % kBk == 0;  // a key block of the panels
      if (rate) {
        bf16_block(b, h, q0, nq, j0, nk, bd, Q, w, o,
                   whole && !panels->bf16.empty() ? &panels->bf16[ix(panel_at(b, kh, j0 / kBk, bf16_panel()))]
                                                  : nullptr);
        continue;
      }
      const float* kt = whole && nq > 1 && !panels->wide.empty()
                            ? &panels->wide[ix(panel_at(b, kh, j0 / kBk, wide_panel()))]
                            : nullptr;  // the key block's widened Kᵀ, then its V
      const Tile K = kt ? Tile{nullptr, D} : rows(k_, dir_k_, b, j0, nk, kh, w->k.data(), tk_, h);
      const Tile V = kt ? Tile{kt + D * kLdt, D} : rows(v_, dir_v_, b, j0, nk, kh, w->v.data(), nullptr, 0);
      logits(h, q0, nq, j0, nk, Q, K, w, kt);
      if (cf_.rows) mark_nan_rows(simd_, S, nq, nk, bd, m);  // careful steps (attention_tiles.h)
      online_softmax_step(simd_, S, nq, nk, m, l, o, D, bd);
      const bool bad_v = careful_v && sanitize_rows(V.p, V.ld, nk, D, w->vs.data());
      const Tile Vp = bad_v ? Tile{w->vs.data(), D} : V;
      if (nq == 1)
        cblas_sgemv(CblasRowMajor, CblasTrans, int(nk), int(D), 1.f, Vp.p, int(Vp.ld), S, 1, 1.f,
                    o, 1);
      else
        tile_gemm(gemm_, GemmForm::kNN, nq, D, nk, 1.f, S, kBk, Vp.p, Vp.ld, o, D, bd);
      if (bad_v) add_back_pv(S, nq, V.p, V.ld, nk, D, o, D);
    }
    online_softmax_finish(simd_, nq, m, l, o, D, lse);
    if (!careful_v && !outputs_finite(simd_, o, nq, D, lse)) forward_block(b, h, q0, nq, w, o, lse, true);
  }

  // One key block [j0, j0 + nk) of forward_block at the bfloat16 rate (tile_gemm_bf16.h): the
  // products read Q (w->qb), K, V and P as bfloat16 pairs, P rounded to bfloat16 for its product
  // (docs/attention.md); the softmax stays float32. Under a rotary encoding the logits stay the
  // float32 tile product of the rotated rows (rounded to bfloat16, those moved lse past its 1e-4).
  // panel: the key block's packed Kᵀ and V (key_panels), or null: packed here.
  void bf16_block(I b, I h, I q0, I nq, I j0, I nk, I bd, const Tile& Q, Scratch* w, float* o,
                  const attn_fast::Pair* panel) const {
    const I D = d_.D, kh = h / d_.G;
    float* S = w->s.data();
    float* m = w->ml.data();
    float* l = m + kBq;
    const attn_fast::Pair* kt = panel;
    const attn_fast::Pair* vp = panel ? panel + D / 2 * kLdt : nullptr;
    if (!panel) {
      if (!tq_ && !tk_) pack_keys(b, kh, j0, nk, w->kb.data());
      pack_values(b, kh, j0, nk, w->vb.data());
      kt = w->kb.data();
      vp = w->vb.data();
    }
    if (tq_ || tk_) {
      logits(h, q0, nq, j0, nk, Q, rows(k_, dir_k_, b, j0, nk, kh, w->k.data(), tk_, h), w);
    } else {
      bf16_->gemm(attn_fast::Bf16Form::kScores, nq, nk, D / 2, static_cast<float>(d_.scale), w->qb.data(), D / 2, kt,
                  kLdt, S, kBk, bd);
      finish_logits(h, q0, nq, nk, (d_.k_off + j0) - (d_.q_off + q0), bd, S, w->diag.data());
    }
    if (cf_.rows) mark_nan_rows(simd_, S, nq, nk, bd, m);
    online_softmax_step(simd_, S, nq, nk, m, l, o, D, bd);
    bf16_->round_rows(S, kBk, nq, nk, w->pb.data(), kBk / 2);
    bf16_->gemm(attn_fast::Bf16Form::kValues, nq, D, (nk + 1) / 2, 1.f, w->pb.data(), kBk / 2, vp, D, o, D, bd);
  }

  // Keys [j0, j0 + nk) of (b, kv head kh) as pairs transposed, Kᵀ [D/2, kLdt]; their values as row
  // pairs, V [kBk/2, D] (tile_gemm_bf16.h).
  const std::uint16_t* row_at(const View& x, I b, I row, I kh) const {
    return static_cast<const std::uint16_t*>(x.data) + b * x.strides[0] + row * x.strides[1] + kh * x.strides[2];
  }
  void pack_keys(I b, I kh, I j0, I nk, attn_fast::Pair* kt) const {
    bf16_->transpose_pairs(row_at(k_, b, j0, kh), k_.strides[1], nk, d_.D / 2, kt, kLdt);
  }
  void pack_values(I b, I kh, I j0, I nk, attn_fast::Pair* vp) const {
    bf16_->interleave_rows(row_at(v_, b, j0, kh), v_.strides[1], nk, d_.D, vp, d_.D);
  }
  // A key block's panel: Kᵀ [D, kLdt] then V, as bfloat16 pairs (V as row pairs [kBk/2, D]) for
  // the bfloat16 rate, or widened to float32 (V [kBk, D]); sizes in pairs or floats.
  I bf16_panel() const { return d_.D / 2 * kLdt + kBk / 2 * d_.D; }
  I wide_panel() const { return d_.D * kLdt + kBk * d_.D; }
  // Where key block kb of (b, kv head kh) starts in panels of `size` elements.
  I panel_at(I b, I kh, I kb, I size) const { return ((b * d_.Hkv + kh) * ((d_.N + kBk - 1) / kBk) + kb) * size; }

  // The forward's panels (Panels), where each key block has two or more readers (G heads × query
  // blocks), k is not rotated, and they fit kPanelBytes; else both empty (the blocks packed per tile).
  // rate: for blocks that take the bfloat16 rate where the call has it (else the float32 products).
  Panels key_panels(bool rate) const {
    constexpr I kPanelBytes = I{32} << 20;
    const I nkb = (d_.N + kBk - 1) / kBk, nqb = (d_.M + kBq - 1) / kBq, blocks = d_.B * d_.Hkv * nkb;
    const bool pairs = rate && bf16_, wide = !pairs && !dir_k_ && !dir_v_;
    Panels pan;  // a single query row (M = 1) reads K's rows as they are (no tile product)
    if ((!pairs && !wide) || tk_ || (pairs && tq_) || d_.M < 2 || d_.G * nqb < 2 ||
        blocks * (wide ? wide_panel() : bf16_panel()) * 4 > kPanelBytes)
      return pan;
    std::vector<float> rows_k;  // per thread: a key block's rows, widened
    try {
      if (wide) pan.wide.resize(ix(blocks * wide_panel()));
      else pan.bf16.resize(ix(blocks * bf16_panel()));
      rows_k.resize(wide ? ix(threads_ * kBk * d_.D) : 0);
    } catch (const std::bad_alloc&) {
      return {};  // the per-tile packing needs no more memory
    }
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
    {
      float* tmp = wide ? &rows_k[ix(omp_get_thread_num() * kBk * d_.D)] : nullptr;
#pragma omp for schedule(static)
      for (I t = 0; t < blocks; ++t) {
        const I kb = t % nkb, kh = (t / nkb) % d_.Hkv, b = t / (nkb * d_.Hkv), j0 = kb * kBk;
        const I nk = std::min(kBk, d_.N - j0), D = d_.D;
        if (wide) {
          float* dst = &pan.wide[ix(panel_at(b, kh, kb, wide_panel()))];
          attn_fast::load_rows(k_, D, b, j0, nk, kh, tmp);
          tr_(tmp, D, nk, D, dst, kLdt);
          attn_fast::load_rows(v_, D, b, j0, nk, kh, dst + D * kLdt);
        } else {
          attn_fast::Pair* dst = &pan.bf16[ix(panel_at(b, kh, kb, bf16_panel()))];
          pack_keys(b, kh, j0, nk, dst);
          pack_values(b, kh, j0, nk, dst + D / 2 * kLdt);
        }
      }
    }
    return pan;
  }

  // Q (rotated where it is) and dO of the G query heads of kv head kh, dense [G, M, D] each (Q's,
  // then dO's), once per pass-2 call, where together they fit the dQ buffer's limit; else empty.
  std::vector<float> dense_rows(const Bwd& bw, I b, I kh) const {
    const I D = d_.D, G = d_.G, M = d_.M;
    std::vector<float> dense;
    if (2 * G * M * D * I{4} > dq_buffer_limit.load()) return dense;
    try {
      dense.resize(ix(2 * G * M * D));
    } catch (const std::bad_alloc&) {
      return dense;
    }
    for (I g = 0; g < G; ++g)
      for (I i0 = 0; i0 < M; i0 += kBq) {
        const I nq = std::min(kBq, M - i0), h = kh * G + g;
        rows(q_, false, b, i0, nq, h, &dense[ix((g * M + i0) * D)], tq_, h);
        rows(bw.dout, false, b, i0, nq, h, &dense[ix(((G + g) * M + i0) * D)], nullptr, 0);
      }
    return dense;
  }

  // Pass 2 over key blocks [kb0, kb1) of (b, kv head kh), every query head of the group and every
  // query block that sees the key block: dK, dV of those keys stored; dQ added into acc; parameter
  // gradients added into gwu [G, npar] (when given).
  void keys(const Bwd& bw, I b, I kh, I kb0, I kb1, const Acc& acc, double* gwu, Scratch* w) const {
    if (bw.rate && keys_rate(bw, b, kh, kb0, kb1, acc, gwu, w)) return;
    const I D = d_.D, G = d_.G, M = d_.M, Hq = d_.Hq;
    const float sc = static_cast<float>(d_.scale);
    float* S = w->s.data();
    float* dP = w->dp.data();
    // dK̃ is needed for dk and for mixed's dfreqs. Mixed rotates the key block per query head (its
    // frequencies are per head): dK̃ of each head is rotated back on its own, then summed.
    const bool want_dk = bw.dk.present() || bw.freq;
    const std::vector<float> dense = dense_rows(bw, b, kh);  // else each tile's rows copied below
    for (I kb = kb0; kb < kb1; ++kb) {
      const I j0 = kb * kBk, nk = std::min(kBk, d_.N - j0), kp0 = d_.k_off + j0;
      // K, Q and dO are copied into dense rows (stride D) even where they could be read in place:
      // the dQ, dK and dV products read them as B, a row per step, and rows at the tensors' stride
      // (Hq·D floats) share few L1 sets
      Tile K{nullptr, D};
      if (!per_head_) K = rows(k_, false, b, j0, nk, kh, w->k.data(), tk_, kh * G);
      const Tile V = rows(v_, dir_v_, b, j0, nk, kh, w->v.data(), nullptr, 0);
      // Kᵀ and Vᵀ once for the block's query tiles (kNP), not packed again by each kNT product
      const bool packed = gemm_ != nullptr;
      if (packed) {
        if (!per_head_) tr_(K.p, K.ld, nk, D, w->kt.data(), kLdt);
        tr_(V.p, V.ld, nk, D, w->vt.data(), kLdt);
      }
      std::fill(w->dk.begin(), w->dk.begin() + nk * D, 0.f);
      std::fill(w->dv.begin(), w->dv.begin() + nk * D, 0.f);
      for (I g = 0; g < G; ++g) {
        const I h = kh * G + g;
        I ilo, ihi;
        query_range(h, kp0, nk, &ilo, &ihi);
        double* gwh = gwu ? gwu + g * bw.npar : nullptr;
        float* dKt = w->dk.data();
        if (per_head_) {
          K = rows(k_, false, b, j0, nk, kh, w->k.data(), tk_, h);
          if (packed) tr_(K.p, K.ld, nk, D, w->kt.data(), kLdt);
          dKt = w->dkg.data();
          std::fill(dKt, dKt + nk * D, 0.f);
        }
        for (I i0 = ilo; i0 < ihi; i0 += kBq) {
          const I nq = std::min(kBq, ihi - i0);
          const Tile Q = dense.empty() ? rows(q_, false, b, i0, nq, h, w->q.data(), tq_, h)
                                       : Tile{&dense[ix((g * M + i0) * D)], D};
          const Tile dO = dense.empty() ? rows(bw.dout, false, b, i0, nq, h, w->dout.data(), nullptr, 0)
                                        : Tile{&dense[ix(((G + g) * M + i0) * D)], D};
          logits(h, i0, nq, j0, nk, Q, K, w, packed && nq > 1 ? w->kt.data() : nullptr);
          // banded (tile_gemm.h): P and dS are formed on each row's visible keys only, the masked
          // ones keeping logits' zeros; dP's masked entries may stay unset
          const I bd = band(h, kp0 - (d_.q_off + i0));
          simd_.exp_rows(S, nq, nk, kBk, &bw.lse[ix((b * Hq + h) * M + i0)], bd);  // P
          const float* Di = &bw.Dv[ix((b * Hq + h) * M + i0)];
          if (packed)
            tile_gemm(gemm_, GemmForm::kNP, nq, nk, D, 1.f, dO.p, dO.ld, w->vt.data(), kLdt, dP, kBk, bd);
          else
            tile_gemm(gemm_, GemmForm::kNT, nq, nk, D, 1.f, dO.p, dO.ld, V.p, V.ld, dP, kBk, bd);
          // careful (attention_tiles.h): the products read sanitized dO, Q, K; dO's non-finite
          // entries' terms added back into dV; dS 0 wherever P is
          const bool careful = bw.careful || careful_rows(&bw.lse[ix((b * Hq + h) * M + i0)], Di, nq);
          const bool bad_do = careful && sanitize_rows(dO.p, dO.ld, nq, D, w->dos.data());
          if (bw.dv.present()) {
            const Tile dOp = bad_do ? Tile{w->dos.data(), D} : dO;
            tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, 1.f, S, kBk, dOp.p, dOp.ld, w->dv.data(), D, bd);
            if (bad_do) add_back_ptdo(S, nq, nk, dO.p, dO.ld, D, w->dv.data());
          }
          for (I i = 0; i < nq; ++i) {
            const I n = std::clamp<I>(i + bd + 1, 0, nk);
            if (careful) careful_ds(S + i * kBk, dP + i * kBk, n, Di[i]);
            else simd_.ds_row(S + i * kBk, dP + i * kBk, ix(n), Di[i]);
          }
          if (gwh && bias_ == Bias::kFire)
            fire_tile(h, i0, kp0 - (d_.q_off + i0), nq, nk, nullptr, S, gwh);
          else if (gwh && bias_ != Bias::kNone)
            param_grads(h, kp0 - (d_.q_off + i0), nq, nk, S, w->diag.data(), gwh);
          if (want_dk) {
            const Tile Qp = careful && sanitize_rows(Q.p, Q.ld, nq, D, w->qs.data()) ? Tile{w->qs.data(), D} : Q;
            tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, sc, S, kBk, Qp.p, Qp.ld, dKt, D, bd);
          }
          if (acc.p) {
            const Tile Kp = careful && sanitize_rows(K.p, K.ld, nk, D, w->ks.data()) ? Tile{w->ks.data(), D} : K;
            tile_gemm(gemm_, GemmForm::kNN, nq, D, nk, sc, S, kBk, Kp.p, Kp.ld, acc.row(g, i0), acc.ld, bd);
          }
        }
        if (per_head_) {  // this head's dK̃ of the block is complete
          if (bw.freq && gwh) freq_grad_rows(false, b, h, j0, nk, K.p, K.ld, dKt, D, nullptr, gwh);
          rotate(dKt, nk, D, *tk_, b, h, j0, true);
          simd_.add_to(w->dk.data(), dKt, ix(nk * D));
        }
      }
      if (bw.dk.present()) {
        if (tk_ && !per_head_) rotate(w->dk.data(), nk, D, *tk_, b, kh * G, j0, true);
        attn_fast::store_rows(bw.dk, D, b, j0, nk, kh, w->dk.data());
      }
      if (bw.dv.present()) attn_fast::store_rows(bw.dv, D, b, j0, nk, kh, w->dv.data());
    }
  }

  // The unit's Q (rotated, where it is) and dO as bfloat16 pairs for keys_rate (exact but for the
  // rotation: both are bfloat16), each as rows [G, M, D/2] (the S and dP products' A) and transposed,
  // pairs along the queries [G, D, Mh] (dK's and dV's A; Mh = rate_ld(): ⌈M/2⌉ rounded up to 16,
  // zeros past M): Q's rows, dO's rows, Qᵀ, dOᵀ; under a rotary encoding *qf the rotated Q̃ in
  // float32 [G, M, D] (the logits' A). False where they would pass the dQ buffer's limit, or where a
  // row of the unit takes the careful steps (lse or D not finite: keys() has them).
  bool rate_rows(const Bwd& bw, I b, I kh, Scratch* w, std::vector<attn_fast::Pair>* pr,
                 std::vector<float>* qf) const {
    const I D = d_.D, D2 = D / 2, G = d_.G, M = d_.M, Mh = rate_ld();
    for (I g = 0; g < G; ++g) {
      const I at = (b * d_.Hq + kh * G + g) * M;
      if (careful_rows(&bw.lse[ix(at)], &bw.Dv[ix(at)], M)) return false;
    }
    if ((2 * G * (M * D2 + D * Mh) + (tq_ ? G * M * D : 0)) * I{4} > dq_buffer_limit.load()) return false;
    try {
      pr->resize(ix(2 * G * (M * D2 + D * Mh)));
      qf->resize(tq_ ? ix(G * M * D) : 0);
    } catch (const std::bad_alloc&) {
      return false;
    }
    for (int which = 0; which < 2; ++which) {
      const View& x = which == 0 ? q_ : bw.dout;
      attn_fast::Pair* rows_at = &(*pr)[ix(which * G * M * D2)];
      attn_fast::Pair* cols_at = &(*pr)[ix(2 * G * M * D2 + which * G * D * Mh)];
      for (I g = 0; g < G; ++g)
        for (I i0 = 0; i0 < M; i0 += kBq) {
          const I nq = std::min(kBq, M - i0), h = kh * G + g;
          const bool rot = which == 0 && tq_;
          const Tile X = rows(x, false, b, i0, nq, h, rot ? &(*qf)[ix((g * M + i0) * D)] : w->q.data(),
                              rot ? tq_ : nullptr, h);
          attn_fast::Pair* r = rows_at + (g * M + i0) * D2;
          bf16_->round_rows(X.p, X.ld, nq, D, r, D2);
          // rows paired [nq/2, D], then transposed: the pairs' (e, (i0 + i) / 2) entries; i0 is even
          bf16_->interleave_rows(reinterpret_cast<const std::uint16_t*>(r), D, nq, D, w->ib.data(), D);
          bf16_->transpose_pairs(reinterpret_cast<const std::uint16_t*>(w->ib.data()), 2 * D, (nq + 1) / 2, D,
                                 cols_at + g * D * Mh + i0 / 2, Mh);
        }
    }
    return true;
  }
  // The row stride of rate_rows()' transposed pairs: ⌈M/2⌉ rounded up to 16 (transpose_pairs writes
  // whole 16s of columns).
  I rate_ld() const { return ((d_.M + 1) / 2 + 15) / 16 * 16; }

  // keys() at the bfloat16 rate (bw.rate): S, dP, dV, dK and dQ as products of bfloat16 pairs
  // (tile_gemm_bf16.h); P and scale·dS rounded to bfloat16 for their products, the softmax and dS
  // itself float32 as in keys(). Under a rotary encoding S stays the float32 product of the rotated
  // rows (as in the forward), and dK̃, dQ̃ read Q̃, K̃ rounded to bfloat16. dKᵀ and dVᵀ [D, nk] are
  // summed (their A is Qᵀ or dOᵀ, the B the tile's P or dS as pairs of query rows) and transposed
  // once per key block. A query range starts at an even row, so that its pairs are whole (a row
  // before the range sees no key: P = dS = 0; dQ skips it). False, nothing done, where rate_rows()
  // declines.
  bool keys_rate(const Bwd& bw, I b, I kh, I kb0, I kb1, const Acc& acc, double* gwu, Scratch* w) const {
    std::vector<attn_fast::Pair> pr;
    std::vector<float> qf;
    if (!rate_rows(bw, b, kh, w, &pr, &qf)) return false;
    using attn_fast::Bf16Form;
    const I D = d_.D, D2 = D / 2, G = d_.G, M = d_.M, Mh = rate_ld(), Hq = d_.Hq;
    const attn_fast::Pair *qr = pr.data(), *dor = qr + G * M * D2, *qt = dor + G * M * D2, *dot = qt + G * D * Mh;
    const float sc = static_cast<float>(d_.scale);
    float *S = w->s.data(), *dP = w->dp.data(), *dKt = w->kt.data(), *dVt = w->vt.data();
    const auto* pb16 = reinterpret_cast<const std::uint16_t*>(w->pb.data());  // P or dS rounded, [Bq, Bk]
    for (I kb = kb0; kb < kb1; ++kb) {
      const I j0 = kb * kBk, nk = std::min(kBk, d_.N - j0), kp0 = d_.k_off + j0;
      Tile K{nullptr, D};
      if (tq_) {  // K̃ᵀ in float32 for the logits, K̃ rounded to bfloat16 as row pairs for dQ
        K = rows(k_, false, b, j0, nk, kh, w->k.data(), tk_, kh * G);
        tr_(K.p, K.ld, nk, D, w->kft.data(), kLdt);
        bf16_->round_rows(K.p, K.ld, nk, D, w->pb.data(), D2);
        bf16_->interleave_rows(pb16, D, nk, D, w->vb.data(), D);
      } else {
        pack_keys(b, kh, j0, nk, w->kb.data());                                                // Kᵀ
        bf16_->interleave_rows(row_at(k_, b, j0, kh), k_.strides[1], nk, D, w->vb.data(), D);  // K
      }
      bf16_->transpose_pairs(row_at(v_, b, j0, kh), v_.strides[1], nk, D2, w->vtb.data(), kLdt);  // Vᵀ
      for (I e = 0; e < D; ++e) {
        std::fill(dKt + e * kLdt, dKt + e * kLdt + nk, 0.f);
        std::fill(dVt + e * kLdt, dVt + e * kLdt + nk, 0.f);
      }
      for (I g = 0; g < G; ++g) {
        const I h = kh * G + g;
        I ilo, ihi;
        query_range(h, kp0, nk, &ilo, &ihi);
        double* gwh = gwu ? gwu + g * bw.npar : nullptr;
        for (I i0 = ilo - ilo % 2; i0 < ihi; i0 += kBq) {
          const I nq = std::min(kBq, ihi - i0), nqh = (nq + 1) / 2, base = kp0 - (d_.q_off + i0);
          const I bd = band(h, base);
          if (tq_) {
            logits(h, i0, nq, j0, nk, Tile{&qf[ix((g * M + i0) * D)], D}, K, w, w->kft.data());
          } else {
            bf16_->gemm(Bf16Form::kScores, nq, nk, D2, sc, qr + (g * M + i0) * D2, D2, w->kb.data(), kLdt, S, kBk,
                        bd);
            finish_logits(h, i0, nq, nk, base, bd, S, w->diag.data());
          }
          simd_.exp_rows(S, nq, nk, kBk, &bw.lse[ix((b * Hq + h) * M + i0)], bd);  // P
          const float* Di = &bw.Dv[ix((b * Hq + h) * M + i0)];
          bf16_->gemm(Bf16Form::kScores, nq, nk, D2, 1.f, dor + (g * M + i0) * D2, D2, w->vtb.data(), kLdt, dP,
                      kBk, bd);
          if (bw.dv.present()) {  // dVᵀ += dOᵀ·P
            bf16_->round_rows(S, kBk, nq, nk, w->pb.data(), kBk / 2);
            bf16_->interleave_rows(pb16, kBk, nq, nk, w->ib.data(), kLdt);
            bf16_->gemm(Bf16Form::kValues, D, nk, nqh, 1.f, dot + g * D * Mh + i0 / 2, Mh, w->ib.data(), kLdt, dVt,
                        kLdt, attn_fast::kNoBand);
          }
          for (I i = 0; i < nq; ++i) {
            const I n = std::clamp<I>(i + bd + 1, 0, nk);
            simd_.ds_row(S + i * kBk, dP + i * kBk, ix(n), Di[i]);
          }
          if (gwh && bias_ == Bias::kFire) fire_tile(h, i0, base, nq, nk, nullptr, S, gwh);
          else if (gwh && bias_ != Bias::kNone) param_grads(h, base, nq, nk, S, w->diag.data(), gwh);
          for (I i = 0; i < nq; ++i) simd_.scale(S + i * kBk, ix(std::clamp<I>(i + bd + 1, 0, nk)), sc);
          bf16_->round_rows(S, kBk, nq, nk, w->pb.data(), kBk / 2);  // scale·dS
          if (bw.dk.present()) {  // dKᵀ += Qᵀ·(scale·dS)
            bf16_->interleave_rows(pb16, kBk, nq, nk, w->ib.data(), kLdt);
            bf16_->gemm(Bf16Form::kValues, D, nk, nqh, 1.f, qt + g * D * Mh + i0 / 2, Mh, w->ib.data(), kLdt, dKt,
                        kLdt, attn_fast::kNoBand);
          }
          if (acc.p) {  // dQ += (scale·dS)·K, not on a row before the range (acc may not hold it)
            const I skip = i0 < ilo ? 1 : 0;
            bf16_->gemm(Bf16Form::kValues, nq - skip, D, (nk + 1) / 2, 1.f, w->pb.data() + skip * kBk / 2, kBk / 2,
                        w->vb.data(), D, acc.row(g, i0 + skip), acc.ld, band(h, base - skip));
          }
        }
      }
      if (bw.dk.present()) {
        tr_(dKt, kLdt, D, nk, w->dk.data(), D);
        if (tk_) rotate(w->dk.data(), nk, D, *tk_, b, kh * G, j0, true);
        attn_fast::store_rows(bw.dk, D, b, j0, nk, kh, w->dk.data());
      }
      if (bw.dv.present()) {
        tr_(dVt, kLdt, D, nk, w->dv.data(), D);
        attn_fast::store_rows(bw.dv, D, b, j0, nk, kh, w->dv.data());
      }
    }
    return true;
  }

  // Key-block cuts [T + 1] of kv head kh into T parts of about equal work (the query rows each key
  // block meets, over the group's heads, plus a share for loading the block).
  std::vector<I> key_cuts(I kh, I T) const {
    const I nkb = (d_.N + kBk - 1) / kBk;
    std::vector<double> pre(ix(nkb + 1), 0.0);  // work of the blocks before kb
    for (I kb = 0; kb < nkb; ++kb) {
      const I nk = std::min(kBk, d_.N - kb * kBk);
      double c = static_cast<double>(kBq) / 4;
      for (I g = 0; g < d_.G; ++g) {
        I ilo, ihi;
        query_range(kh * d_.G + g, d_.k_off + kb * kBk, nk, &ilo, &ihi);
        c += static_cast<double>(std::max<I>(ihi - ilo, 0));
      }
      pre[ix(kb + 1)] = pre[ix(kb)] + c * static_cast<double>(nk);
    }
    std::vector<I> cuts(ix(T + 1), nkb);
    cuts[0] = 0;
    I x = 0;
    for (I p = 1; p < T; ++p) {
      const double target = pre[ix(nkb)] * static_cast<double>(p) / static_cast<double>(T);
      while (x < nkb && pre[ix(x + 1)] <= target) ++x;
      if (x < nkb && pre[ix(x + 1)] - target < target - pre[ix(x)]) ++x;  // the nearer cut
      cuts[ix(p)] = x;
    }
    return cuts;
  }

  // Pass 2 of one unit (b, kh) split over the threads: T parts of its key blocks (key_cuts), each
  // with its own dQ rows (part 0 in the primary accumulator — dq itself or a buffer —, the others
  // in buffers of the rows they touch) and parameter gradients; then summed in part order, so the
  // result depends on the thread count only, not on which thread ran what.
  void split_unit(const Bwd& bw, I b, I kh, bool dq_dir, std::vector<double>* gw) const {
    const I T = threads_, M = d_.M, D = d_.D, G = d_.G, npar = bw.npar;
    const std::vector<I> cuts = key_cuts(kh, T);
    std::vector<I> qlo(ix(T), 0), qhi(ix(T), 0);  // dQ rows each part touches
    for (I p = 0; p < T; ++p) {
      I lo = M, hi = 0;
      for (I kb = cuts[ix(p)]; kb < cuts[ix(p + 1)]; ++kb)
        for (I g = 0; g < G; ++g) {
          I ilo, ihi;
          query_range(kh * G + g, d_.k_off + kb * kBk, std::min(kBk, d_.N - kb * kBk), &ilo, &ihi);
          if (ilo < ihi) lo = std::min(lo, ilo), hi = std::max(hi, ihi);
        }
      if (lo < hi) qlo[ix(p)] = lo, qhi[ix(p)] = hi;
    }
    const bool want_dq = bw.dq.present() || bw.freq;  // mixed's dfreqs read dQ̃
    std::vector<float> prim;
    std::vector<std::vector<float>> part(ix(T));
    std::vector<Acc> acc(ix(T));
    if (want_dq) {
      if (dq_dir) {
        acc[0] = dq_in_place(bw.dq, b, kh);
      } else {
        prim.resize(ix(G * M * D));
        acc[0] = Acc{prim.data(), D, M * D, 0};
      }
      for (I p = 1; p < T; ++p) {
        const I n = qhi[ix(p)] - qlo[ix(p)];
        part[ix(p)].resize(ix(G * n * D));
        acc[ix(p)] = Acc{part[ix(p)].data(), D, n * D, qlo[ix(p)]};
      }
    }
    std::vector<double> gwp(ix(T * G * npar), 0.0);  // [T, G, npar]
    std::vector<double> fgp(bw.freq ? ix(T * G * npar) : 0, 0.0);  // mixed: dQ̃'s part, [thread, G, npar]
    attn_fast::RegionGuard guard;
#pragma omp parallel num_threads(static_cast<int>(T))
    {
      Scratch& w = thread_scratch();
      guard.run([&] {
        w.init(D);
        w.init_backward(D);
        if (bw.rate) w.init_bf16_backward(D);
      });
#pragma omp for schedule(dynamic, 1)
      for (I p = 0; p < T; ++p) {
        if (guard.failed()) continue;
        const Acc& a = acc[ix(p)];
        for (I g = 0; g < G && a.p; ++g)
          zero_rows(a, g, p == 0 ? 0 : qlo[ix(p)], p == 0 ? M : qhi[ix(p)]);
        keys(bw, b, kh, cuts[ix(p)], cuts[ix(p + 1)], a, npar ? &gwp[ix(p * G * npar)] : nullptr,
             &w);
      }
      if (want_dq && !guard.failed()) {  // after the loop's barrier: the same on every thread
#pragma omp for schedule(static)
        for (I gi = 0; gi < G * M; ++gi) {
          const I g = gi / M, i = gi % M;
          float* y = acc[0].row(g, i);
          for (I p = 1; p < T; ++p)
            if (i >= qlo[ix(p)] && i < qhi[ix(p)]) simd_.add_to(y, acc[ix(p)].row(g, i), ix(D));
          if (!bw.freq) finish_dq(bw.dq, dq_dir, acc[0], b, kh, g, i, i + 1);
        }
        if (bw.freq) {  // the rows of dQ̃ are complete: their frequency gradient, then the rotation back
          double* mine = &fgp[ix(static_cast<I>(omp_get_thread_num()) * G * npar)];
#pragma omp for schedule(static)
          for (I gi = 0; gi < G * M; ++gi) {
            const I g = gi / M, i = gi % M;
            freq_grad_rows(true, b, kh * G + g, i, 1, nullptr, 0, acc[0].row(g, i), acc[0].ld, w.row.data(),
                           mine + g * npar);
          }
#pragma omp for schedule(static)
          for (I gi = 0; gi < G * M; ++gi)
            finish_dq(bw.dq, dq_dir, acc[0], b, kh, gi / M, gi % M, gi % M + 1);
        }
      }
    }
    guard.rethrow();
    // In part (then thread) order: the result depends on the thread count only.
    for (I p = 0; p < T; ++p)
      for (I j = 0; j < G * npar; ++j)
        (*gw)[ix((b * d_.Hq + kh * G) * npar + j)] += gwp[ix(p * G * npar + j)];
    for (I p = 0; p < T && bw.freq; ++p)
      for (I j = 0; j < G * npar; ++j)
        (*gw)[ix((b * d_.Hq + kh * G) * npar + j)] += fgp[ix(p * G * npar + j)];
  }

  // Parameter gradients of one tile from dS [nq, Bk]: diagonal sums, then per distance.
  void param_grads(I h, I base, I nq, I nk, const float* dS, float* diag, double* gwh) const {
    const I nt = nq + nk - 1;
    xs_.sum_diag(dS, nq, nk, kBk, diag);
    for (I t = 0; t < nt; ++t) {
      if (diag[t] == 0.f) continue;
      const I rel = base + t - (nq - 1);
      if (bias_ == Bias::kT5) {
        gwh[bucket_[ix(rel - rel_lo_)]] += diag[t];
      } else if (bias_ == Bias::kLut) {  // kerple: Σ dS·∂b/∂r1, Σ dS·∂b/∂r2 at this distance
        const std::size_t at = ix(h * lut_w_ + rel - rel_lo_);
        gwh[0] += static_cast<double>(diag[t]) * dlut_[2 * at];
        gwh[1] += static_cast<double>(diag[t]) * dlut_[2 * at + 1];
      } else if (rel != 0) {  // learned ALiBi: ∂/∂w[side] = −σ(1 − σ)|Δ|
        const int side = rel < 0 ? 0 : 1;
        const double sg = sig_[ix(side * d_.Hq + h)];
        const double dist = static_cast<double>(rel < 0 ? -rel : rel);
        gwh[side] += static_cast<double>(diag[t]) * (-sg * (1 - sg) * dist);
      }
    }
  }

  // kerple, sandwich: the per-head tables over the M + N − 1 distances of the call (bias.h formulas
  // in double, rounded once).
  void build_lut(const EncodingTensors& t) {
    bias_ = Bias::kLut;
    const I Hq = d_.Hq, nd = std::max<I>(d_.M + d_.N - 1, 0);
    rel_lo_ = d_.k_off - d_.q_off - (d_.M - 1);
    lut_w_ = nd;
    lut_.resize(ix(Hq * nd));
    const int th = nd > 4096 ? threads_ : 1;
    if (p_.encoding == Encoding::kKerple) {
      const bool power = p_.kerple.kernel == KerpleKernel::kPower;
      const std::vector<double> r1 = to_doubles(t.r1), r2 = to_doubles(t.r2);
      dlut_.resize(ix(2 * Hq * nd));
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
      for (I e = 0; e < nd; ++e) {
        const I rel = rel_lo_ + e;
        const double dist = static_cast<double>(rel < 0 ? -rel : rel);
        for (I h = 0; h < Hq; ++h) {
          const kerple::Term k = kerple::term(power, r1[ix(h)], r2[ix(h)], dist);
          lut_[ix(h * nd + e)] = static_cast<float>(k.b);
          dlut_[ix(2 * (h * nd + e))] = k.d_r1;
          dlut_[ix(2 * (h * nd + e) + 1)] = k.d_r2;
        }
      }
    } else {
      const std::vector<double> w = sandwich::freqs(p_.sandwich.sinusoid_dim, p_.sandwich.base);
#pragma omp parallel for num_threads(th) schedule(static) if (th > 1)
      for (I e = 0; e < nd; ++e) {
        const double v = sandwich::shifted_inner_product(static_cast<double>(rel_lo_ + e), w);
        for (I h = 0; h < Hq; ++h) lut_[ix(h * nd + e)] = static_cast<float>(v * sandwich::head_scale(h, Hq));
      }
    }
  }

  // fire: tiles off the diagonal spanning at most this many segment boundaries take fire_span.
  static constexpr I kFireSpan = 3;

  // fire: the MLP's pieces, ψ per distance, the normaliser per query row.
  void build_fire(const EncodingTensors& t) {
    bias_ = Bias::kFire;
    const I Hq = d_.Hq, nd = std::max<I>(d_.M + d_.N - 1, 0), M = d_.M;
    fire_v_ = fire::values(t.fire);
    fire_p_ = fire::pieces(fire_v_.w1, fire_v_.b1, fire_v_.w2, fire_v_.b2, Hq);
    const double c = fire_v_.c, L = fire_v_.L;
    rel_lo_ = d_.k_off - d_.q_off - (d_.M - 1);
    fire_psi_.resize(ix(nd));
    fire_dpsi_.resize(ix(nd));
    for (I e = 0; e < nd; ++e) {
      const I rel = rel_lo_ + e;
      const double dist = static_cast<double>(rel < 0 ? -rel : rel);
      fire_psi_[ix(e)] = static_cast<float>(fire::psi(c, dist));
      fire_dpsi_[ix(e)] = static_cast<float>(fire::psi_dc(c, dist));
    }
    fire_inv_.resize(ix(M));
    fire_cf_.resize(ix(M));
    fire_lf_.resize(ix(M));
    for (I i = 0; i < M; ++i) {
      const I qp = d_.q_off + i;
      const double n = fire::norm_arg(L, qp), inv = 1.0 / fire::psi(c, n);
      fire_inv_[ix(i)] = inv;
      fire_cf_[ix(i)] = fire::psi_dc(c, n) * inv;
      fire_lf_[ix(i)] = fire::by_threshold(L, qp) ? -fire::psi_dx(c, n) * inv * inv : 0.0;
    }
    // Per row, the smallest distance at or past each breakpoint: x(d) ≥ t_k ⇔ d ≥ (e^{t_k·ψ(n)} − 1)/c,
    // clamped past the call's largest distance (rows at or below L share n = L).
    const I nb = fire_p_.S;
    fire_th_.resize(ix(M * nb));
    const double dmax = static_cast<double>(std::max(std::llabs(rel_lo_), std::llabs(rel_lo_ + nd - 1))) + 1;
    for (I i = 0; i < M; ++i) {
      const I qp = d_.q_off + i;
      if (i > 0 && fire::by_threshold(L, qp) && fire::by_threshold(L, qp - 1)) {
        std::copy_n(&fire_th_[ix((i - 1) * nb)], nb, &fire_th_[ix(i * nb)]);
        continue;
      }
      const double pn = fire::psi(c, fire::norm_arg(L, qp));
      for (I k = 0; k < nb; ++k) {
        const double dt = std::ceil(std::expm1(fire_p_.t[ix(k)] * pn) / c);
        fire_th_[ix(i * nb + k)] = static_cast<I>(dt < dmax ? dt : dmax);
      }
    }
    fire_a_.resize(fire_p_.alpha.size());
    for (std::size_t e = 0; e < fire_a_.size(); ++e) fire_a_[e] = static_cast<float>(fire_p_.alpha[e]);
  }

  // FIRE over the rows [q0, q0 + nq) of head h against nk keys, the tile's key 0 − query 0 distance
  // being `base`. Each row splits into runs of keys whose normalised distance x = ψ(d)/ψ(n) lies in
  // one linear piece of the MLP: keys before the query (d falling along the row) and from it on (d
  // rising), cut where d crosses the row's thresholds (the smallest d with x ≥ t_k, tabulated per
  // row; the diagonal d = 0 its own run). Forward (S): S += α + (β/ψ(n))·ψ(d) over each run.
  // Backward (dS): each run's Σ dS, Σ dS·ψ, Σ dS·∂ψ/∂c, turned into the segment moments and the c,
  // L sums of gwh [M0 (S + 2), M1 (S + 2), dc, dL] (fire_math.h).
  void fire_tile(I h, I q0, I base, I nq, I nk, float* S, const float* dS, double* gwh) const {
    const fire::Pieces& P = fire_p_;
    const I segs = P.segs(), nb = P.S;
    const float* alpha = &fire_a_[ix(h * segs)];
    // The segment of distance d ≥ 1 rises with d and, the thresholds rising with the query position,
    // falls from row to row. So the segments of a tile wholly before its queries (or wholly after
    // them) lie between its last row's at its smallest distance and its first row's at its largest:
    // one segment for most tiles off the diagonal, a few for the rest. There each row is those
    // segments' runs in order, cut at its thresholds with no search (the same runs, the same bits).
    I lo = -1, hi = -1;
    const bool before = base + nk - 1 < 0;
    if (before || base - (nq - 1) > 0) {
      const I dmax = before ? nq - 1 - base : base + nk - 1, dmin = before ? -(base + nk - 1) : base - (nq - 1);
      const auto seg = [nb](const I* th, I d) {
        I sg = 0;
        while (sg < nb && d >= th[sg]) ++sg;
        return sg;
      };
      hi = seg(fire_th_.data() + q0 * nb, dmax);
      lo = seg(fire_th_.data() + (q0 + nq - 1) * nb, dmin);
    }
    if (lo >= 0 && S && hi - lo <= kFireSpan) {
      xs_.fire_span(S, nq, nk, kBk, &fire_psi_[ix(base - rel_lo_)], base, before, fire_th_.data() + q0 * nb, nb,
                    lo, hi, alpha, &P.beta[ix(h * segs)], &fire_inv_[ix(q0)]);
      return;
    }
    I hint = 0;
    for (I i = 0; i < nq; ++i) {
      const I row = q0 + i, r0 = base - i;  // kp − qp of the row's key 0
      const float* ps = &fire_psi_[ix(r0 - rel_lo_)];
      const float* dps = &fire_dpsi_[ix(r0 - rel_lo_)];
      const I* th = nb ? &fire_th_[ix(row * nb)] : nullptr;
      const double inv = fire_inv_[ix(row)];
      auto run = [&](I j0, I j1, I sg) {
        if (S) {
          xs_.affine_add(S + i * kBk + j0, ps + j0, j1 - j0, alpha[sg], static_cast<float>(P.b(h, sg) * inv));
          return;
        }
        float m[3];
        xs_.moments(dS + i * kBk + j0, ps + j0, dps + j0, j1 - j0, m);
        const double beta = P.b(h, sg);
        gwh[sg] += m[0];
        gwh[segs + sg] += inv * m[1];
        gwh[2 * segs] += beta * inv * (m[2] - static_cast<double>(m[1]) * fire_cf_[ix(row)]);
        gwh[2 * segs + 1] += beta * m[1] * fire_lf_[ix(row)];
      };
      if (lo >= 0 && hi - lo <= kFireSpan) {  // the backward's side of fire_span: the same cuts
        I j = 0;
        for (I k = 0; k <= hi - lo; ++k) {
          const I sg = before ? hi - k : lo + k;
          const I e = fire_span_end(before, r0, th, sg, k, lo, hi, j, nk);
          if (e > j) run(j, e, sg);
          j = e;
        }
        continue;
      }
      // segment of distance d ≥ 1: the number of thresholds ≤ d, walked from the last one found
      auto seg = [&](I d) {
        I sg = hint > nb ? 0 : hint;
        while (sg > 0 && d < th[sg - 1]) --sg;
        while (sg < nb && d >= th[sg]) ++sg;
        return hint = sg;
      };
      const I jz = std::clamp<I>(-r0, 0, nk);  // the first key at or after the query
      for (I j = 0; j < jz;) {  // before the query: d = −r0 − j falls
        const I sg = seg(-r0 - j);
        const I e = sg > 0 ? std::min(jz, -r0 - th[sg - 1] + 1) : jz;  // until d < th[sg − 1]
        run(j, e, sg);
        j = e;
      }
      I j = jz;
      if (j < nk && r0 + j == 0) run(j, j + 1, P.zero()), ++j;  // the diagonal: x = 0
      while (j < nk) {  // after it: d = r0 + j rises
        const I sg = seg(r0 + j);
        const I e = sg < nb ? std::min(nk, th[sg] - r0) : nk;  // until d ≥ th[sg]
        run(j, e, sg);
        j = e;
      }
    }
  }

  // fire: the gradients of the six tensors from the per-head sums [Hq, npar] (fire_math.h).
  void fire_grads(const std::vector<double>& sum, const FireTensors& g) const {
    const fire::Pieces& P = fire_p_;
    const I Hq = d_.Hq, segs = P.segs(), npar = 2 * segs + 2;
    std::vector<double> M0(ix(Hq * segs)), M1(ix(Hq * segs));
    double dc = 0, dL = 0;
    for (I h = 0; h < Hq; ++h) {
      for (I sg = 0; sg < segs; ++sg) {
        M0[ix(h * segs + sg)] = sum[ix(h * npar + sg)];
        M1[ix(h * segs + sg)] = sum[ix(h * npar + segs + sg)];
      }
      dc += sum[ix(h * npar + 2 * segs)];
      dL += sum[ix(h * npar + 2 * segs + 1)];
    }
    std::vector<double> dw1(fire_v_.w1.size(), 0.0), db1(fire_v_.b1.size(), 0.0), dw2(fire_v_.w2.size(), 0.0),
        db2(fire_v_.b2.size(), 0.0);
    fire::mlp_grads(P, fire_v_.w1, fire_v_.b1, fire_v_.w2, M0, M1, &dw1, &db1, &dw2, &db2);
    fire::write_grads(g, dw1, db1, dw2, db2, dc, dL);
  }

  const AttentionParams& p_;
  Dims d_;
  View q_, k_, v_;
  int threads_ = 1;
  Simd simd_;
  Extra xs_;
  TileGemmFn gemm_;  // the tiles' small GEMM (D ≤ kTileGemmMaxD), else null: OpenBLAS
  TileTransposeFn tr_ = tile_transpose_fn();  // Kᵀ, Vᵀ of key blocks (tile_gemm.h)
  const attn_fast::Bf16Ops* bf16_ = nullptr;  // the bfloat16-rate products (bf16_rate())
  bool dir_q_ = false, dir_k_ = false, dir_v_ = false;  // read in place (see direct())
  CarefulForward cf_;  // how the forward finds NaN rows (attention_tiles.h)
  bool interleaved_ = true, nonsym_ = false;
  RotTab tab_q_, tab_k_;
  const RotTab* tq_ = nullptr;  // rotation tables of the queries and keys (rotary encodings)
  const RotTab* tk_ = nullptr;
  bool per_head_ = false;  // rope2d mixed: the tables are per query head
  double pos0_[2] = {0, 0};  // rope2d mixed: the positions dfreqs' sums are taken about (x, y)
  Bias bias_ = Bias::kNone;
  std::vector<double> slopes_, sig_;  // alibi [Hq]; learned σ(w) [2, Hq]
  std::vector<float> t5w_;            // t5 [Hq, nb]
  std::vector<std::int32_t> bucket_;  // t5: bucket of kp − qp = rel_lo_ + t
  I rel_lo_ = 0;
  // kerple, sandwich: lut_ [Hq, lut_w_] the bias at kp − qp = rel_lo_ + t; kerple also dlut_
  // [Hq, lut_w_, 2] its derivatives by r1 and r2 (double: the backward's weights).
  std::vector<float> lut_;
  std::vector<double> dlut_;
  I lut_w_ = 0;
  // fire: the MLP as pieces (fire_math.h); ψ(|kp − qp|) and ∂ψ/∂c per distance (float, rel_lo_ + t);
  // per query row 1/ψ(n), ∂ψ(n)/∂c/ψ(n) and the threshold's factor; α per head and segment.
  fire::Values fire_v_;
  fire::Pieces fire_p_;
  std::vector<float> fire_psi_, fire_dpsi_, fire_a_;
  std::vector<double> fire_inv_, fire_cf_, fire_lf_;
  std::vector<I> fire_th_;  // [M, S]: per row, the smallest distance in each breakpoint's segment
};
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
#endif  // HWY_ONCE
