// The sinusoidal encoding's fast path: the public posenc::sinusoidal_table / _forward / _backward
// dispatch here (validation is the reference's, sinusoidal_check.h, so errors are identical).
//
// float32/bfloat16/float16 with a contiguous last dimension (Highway, dynamic dispatch; OpenMP over
// blocks of positions); everything else falls back to posenc::reference, as does a call with an
// angle p·w_i beyond 2^47 (fast::kMaxFastAngle: the reduction's range; a tiny base or a far position). Backward is dx = dy: a row
// copy.
//
// Evaluating sin and cos per element makes the add compute-bound, so runs of consecutive positions
// p, p+1, … (the usual offset + l) use the angle-addition formulas instead:
//   - an exact anchor every kRun = 64 positions (block starts, so the result does not depend on the
//     thread count) and at each run start: sin, cos(p·w_i) in double (simd-inl.h's SinCosF64);
//   - float32 and float16: carried in double by the rotation of K·w_i (K = kK = 8): drift ~10⁻¹⁵
//     over a block; rounded to float (as, ac), and row p + k, k < K, is PE = (as·ck + ac·sk,
//     ac·ck − as·sk), with ck, sk = cos, sin(k·w_i) from a per-(D, base) table rounded to float
//     (built once, kept);
//   - bfloat16: the float anchor rotated by the table's angle every kReanchor = 16 rows, and each
//     row in between the previous one rotated by (cos w_i, sin w_i) in float (AddRecurBf16, bound
//     2⁻¹⁸ there: far below bfloat16's rounding, and with fewer table reads, which bound this
//     kernel, measured below).
// Bound of a float32 rotated value against sin/cos of the exact angle: the float anchor and the
// table are each within 2⁻²⁴ relative, and |as·ck| + |ac·sk| ≤ 1 (Cauchy–Schwarz), so they
// contribute ≤ 2⁻²⁴ each; the product and the FMA round ≤ 2⁻²⁴ each: ≤ 2⁻²² (2.4·10⁻⁷) + the
// angle's |a|·2⁻⁵² — within the float sincos's 3·10⁻⁷ + |a|·2⁻⁵¹ (simd-inl.h), which a token not
// followed by its successor still takes. The float32 add is fused: y = as·ck + (ac·sk + x) (two
// FMAs per value). Large outputs: non-temporal stores.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include "posenc/absolute.h"

#ifndef POSENC_SINUS_JOB_DEFINED
#define POSENC_SINUS_JOB_DEFINED
namespace posenc::sinus_fast {
// Rows per exact anchor block; rows per double carry and float rotation table (K, float32 and
// float16); rows per pass of the rotated kernels; rows per re-anchored stretch of the bfloat16
// recurrence (its table holds every kReanchor-th row).
constexpr std::int64_t kRun = 64;
constexpr std::int64_t kK = 8;
constexpr int kRows = 4;
constexpr std::int64_t kReanchor = 16;
static_assert(kK % kRows == 0 && kReanchor % kRows == 0 && kRun % kReanchor == 0,
              "a pass stays inside a group and a stretch");

struct Job {
  DType dtype = DType::kF32;
  std::int64_t B = 0, L = 0, D = 0;
  const std::int64_t* pos = nullptr;  // [B, L]
  bool shared = false;                // every batch row has the positions of row 0
  const double* inv = nullptr;        // [D/2]: w_i
  const double* cK = nullptr;         // [D/2]: cos(K·w_i) (float32, float16)
  const double* sK = nullptr;         // [D/2]: sin(K·w_i)
  // cos, sin(k·w) rounded to float (null: no runs, L = 1). bfloat16, per pair: tc, ts
  // [kRun/kReanchor + 1, D/2], row m the angle m·kReanchor·w_i, the last row w_i itself (the
  // recurrence's step). Other dtypes, k < K, interleaved in tc [K, D] (cos(k·w_i), sin(k·w_i) at
  // columns 2i, 2i + 1; ts unused): one table row per PE row instead of two.
  const float* tc = nullptr;
  const float* ts = nullptr;
  std::int64_t tlen = 0;  // floats in tc (and in ts)
  const void* x = nullptr;            // [B, L, D] or null (the table: y = PE)
  void* y = nullptr;                  // [B, L, D]
  std::int64_t xs[2] = {0, 0}, ys[2] = {0, 0};
  int threads = 1;
  bool stream = false;  // large, and out of place or the table: non-temporal stores
};
}  // namespace posenc::sinus_fast
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "enc/absolute/sinusoidal/sinusoidal_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/fast_common.h"
#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace {

using sinus_fast::kK;
using sinus_fast::kReanchor;
using sinus_fast::kRows;
using sinus_fast::kRun;

// y[0, n) = x[0, n) + pe[0, n) (x null: y = pe). kStream: non-temporal stores from the first
// aligned element on.
template <bool kStream, typename T>
void AddRow(const T* x, const float* HWY_RESTRICT pe, T* y, std::int64_t n) {
  const hn::ScalableTag<float> df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t i = 0;
  if (kStream)
    for (; i < n && !StreamAligned(df, y + i); ++i) FromF((x ? ToF(x[i]) : 0.0f) + pe[i], y + i);
  if (x) {
    for (; i + 2 * N <= n; i += 2 * N) {
      hn::Vec<decltype(df)> v0, v1;
      LoadF2(df, x + i, &v0, &v1);
      StoreF2<kStream>(df, hn::Add(v0, hn::LoadU(df, pe + i)),
                       hn::Add(v1, hn::LoadU(df, pe + i + N)), y + i);
    }
    for (; i + N <= n; i += N) StoreF(df, hn::Add(LoadF(df, x + i), hn::LoadU(df, pe + i)), y + i);
    for (; i < n; ++i) FromF(ToF(x[i]) + pe[i], y + i);
  } else {
    for (; i + 2 * N <= n; i += 2 * N)
      StoreF2<kStream>(df, hn::LoadU(df, pe + i), hn::LoadU(df, pe + i + N), y + i);
    for (; i + N <= n; i += N) StoreF(df, hn::LoadU(df, pe + i), y + i);
    for (; i < n; ++i) FromF(pe[i], y + i);
  }
}

// v [2n] = (s0, c0, s1, c1, …).
void Interleave(const float* HWY_RESTRICT s, const float* HWY_RESTRICT c, std::int64_t n,
                float* HWY_RESTRICT v) {
  std::int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  for (; i + N <= n; i += N)
    hn::StoreInterleaved2(hn::LoadU(df, s + i), hn::LoadU(df, c + i), df, v + 2 * i);
#endif
  for (; i < n; ++i) {
    v[2 * i] = s[i];
    v[2 * i + 1] = c[i];
  }
}

// PE[m, :] by the exact-angle float sincos of simd-inl.h (a token not followed by its successor).
void PeRowFloat(double m, const sinus_fast::Job& j, float* red, float* quad, float* s, float* c,
                float* pe) {
  const std::int64_t half = j.D / 2;
  SinCosRow(m, j.inv, static_cast<std::size_t>(half), red, quad, s, c);
  Interleave(s, c, half, pe);
}

#if HWY_HAVE_FLOAT64
// ds, dc [n] = sin, cos(m·w) in double (SinCosF64).
void AnchorF64(double m, const double* HWY_RESTRICT w, std::int64_t n, double* HWY_RESTRICT ds,
               double* HWY_RESTRICT dc) {
  const hn::ScalableTag<double> dd;
  const std::int64_t Nd = static_cast<std::int64_t>(hn::Lanes(dd));
  const auto vm = hn::Set(dd, m);
  std::int64_t i = 0;
  for (; i + Nd <= n; i += Nd) {
    hn::Vec<decltype(dd)> s, c;
    SinCosF64(dd, hn::Mul(vm, hn::LoadU(dd, w + i)), &s, &c);
    hn::StoreU(s, dd, ds + i);
    hn::StoreU(c, dd, dc + i);
  }
  const hn::CappedTag<double, 1> d1;
  for (; i < n; ++i) {
    hn::Vec<decltype(d1)> s, c;
    SinCosF64(d1, hn::Set(d1, m * w[i]), &s, &c);
    ds[i] = hn::GetLane(s);
    dc[i] = hn::GetLane(c);
  }
}

// as, ac = float(ds, dc); then, if advance, (ds, dc) rotated by K·w: the anchor K positions on.
void AnchorStep(double* HWY_RESTRICT ds, double* HWY_RESTRICT dc, const double* HWY_RESTRICT cK,
                const double* HWY_RESTRICT sK, std::int64_t n, float* HWY_RESTRICT as,
                float* HWY_RESTRICT ac, bool advance) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;
  const std::int64_t Nd = static_cast<std::int64_t>(hn::Lanes(dd));
  std::int64_t i = 0;
  for (; i + Nd <= n; i += Nd) {
    const auto s = hn::LoadU(dd, ds + i), c = hn::LoadU(dd, dc + i);
    hn::StoreU(hn::DemoteTo(dfh, s), dfh, as + i);
    hn::StoreU(hn::DemoteTo(dfh, c), dfh, ac + i);
    if (advance) {
      const auto ck = hn::LoadU(dd, cK + i), sk = hn::LoadU(dd, sK + i);
      hn::StoreU(hn::MulAdd(s, ck, hn::Mul(c, sk)), dd, ds + i);
      hn::StoreU(hn::NegMulAdd(s, sk, hn::Mul(c, ck)), dd, dc + i);
    }
  }
  for (; i < n; ++i) {
    const double s = ds[i], c = dc[i];
    as[i] = static_cast<float>(s);
    ac[i] = static_cast<float>(c);
    if (advance) {
      ds[i] = s * cK[i] + c * sK[i];
      dc[i] = c * cK[i] - s * sK[i];
    }
  }
}
#endif  // HWY_HAVE_FLOAT64

// Memory speed here took three things, each measured with throwaway programs (bfloat16 [4096,
// 4096], one thread, medians against memcpy of the same bytes), and a fourth, where the scratch
// sits (at AwayFromStreams):
//   - Table reads, not memory, bounded the add: the anchor and rotation rows ([D] each) do not stay
//     in L1 beside the stream of x, and were read once per row: 0.69–0.75 of memcpy, against
//     1.6 with the arithmetic's operands held in registers and 1.0–1.1 with them read once per
//     four rows. So a pass takes kRows = 4 rows of x per read of the anchor (eight rows, more
//     concurrent streams, was no better: 0.93–1.06).
//   - Every row's x is loaded before any y is stored: x and y rows then share their low 12 address
//     bits (buffers of the same alignment, rows 8 KiB apart), and a load behind a store to the same
//     offset modulo 4 KiB waits on it. 5.4 ms per add with store–load order, 3.2 ms with y offset
//     by 256 bytes; loads first, with the row loop unrolled so nothing spills, removes most of it.
//   - bfloat16 reads one table row per 16 rows instead of one per pass: those rows are cold (the
//     stream of x evicts them between uses), and read per pass they cost 0.9 ms of 4.5.
// posenc bench, [1, 4096, 4096], one thread, nine runs alternating with the kernel before these
// changes, ratio to memcpy: bfloat16 out of place 0.60–0.80 → 0.73–1.05 (median 0.92), in place
// 0.69–0.94 → 0.91–1.19; float32 out of place 0.74–0.95 (median 0.81) → 0.93–1.09 (median 0.97).

// y_r = x_r + PE of the anchor rotated by k_r·w, per column (float32, float16), for R rows r < R
// at once: with V = the float anchor interleaved (sin, cos, …), W = V with each pair swapped, and
// from row r's interleaved table row t = (c, s, …) the columns C = (c, c, …) and S = (s, −s, …),
// PE = V·C + W·S (the angle-addition formulas), y = V·C + (W·S + x) in two FMAs. V and W are read
// and formed once for the R rows. x null: y = PE. kStream: every y_r aligned for StoreF2<true>.
// C and S are formed in registers (in-lane duplicates and a sign flip) rather than read as two
// tables: measured with posenc bench, float32 [1, 4096, 4096], one thread, eight alternating runs,
// out of place 0.76–0.80 of memcpy → 0.76–0.97 (median 0.83), in place 0.78–0.88 → 0.88–0.92.
template <bool kStream, int R, typename T>
void AddRotatedCols(const T* const* x, const float* HWY_RESTRICT V, const float* const* tc,
                    std::int64_t n, T* const* y) {
  std::int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const auto sgn = hn::OddEven(hn::Neg(hn::Zero(df)), hn::Zero(df));  // (+0, −0, …): odd lanes' sign
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto v0 = hn::LoadU(df, V + i), v1 = hn::LoadU(df, V + i + N);
    const auto w0 = hn::Shuffle2301(v0), w1 = hn::Shuffle2301(v1);
    hn::Vec<decltype(df)> r0[R], r1[R];  // every row's x loaded before any y is stored (above)
    HWY_UNROLL(kRows) for (int r = 0; r < R; ++r) {
      if (x) {
        LoadF2(df, x[r] + i, &r0[r], &r1[r]);
      } else {
        r0[r] = hn::Zero(df);
        r1[r] = hn::Zero(df);
      }
    }
    HWY_UNROLL(kRows) for (int r = 0; r < R; ++r) {
      const auto t0 = hn::LoadU(df, tc[r] + i), t1 = hn::LoadU(df, tc[r] + i + N);
      const auto s0 = hn::Xor(hn::DupOdd(t0), sgn), s1 = hn::Xor(hn::DupOdd(t1), sgn);
      const auto c0 = hn::DupEven(t0), c1 = hn::DupEven(t1);
      StoreF2<kStream>(df, hn::MulAdd(v0, c0, hn::MulAdd(w0, s0, r0[r])),
                       hn::MulAdd(v1, c1, hn::MulAdd(w1, s1, r1[r])), y[r] + i);
    }
  }
#endif
  for (; i < n; ++i)
    for (int r = 0; r < R; ++r) {
      const float c = tc[r][i & ~std::int64_t{1}], s = tc[r][i | 1];
      FromF((x ? ToF(x[r][i]) : 0.0f) + (V[i] * c + V[i ^ 1] * ((i & 1) ? -s : s)), y[r] + i);
    }
}

// (a, b) = (sin, cos) of an angle, rotated by the angle of (c, s) = (cos, sin): the angle-addition
// formulas, one product and one FMA each (vectors, or floats with std::fma: the same roundings).
template <class V>
HWY_INLINE void Rotate(V c, V s, V* a, V* b) {
  const V na = hn::MulAdd(*a, c, hn::Mul(*b, s));
  *b = hn::NegMulAdd(*a, s, hn::Mul(*b, c));
  *a = na;
}
HWY_INLINE void Rotate(float c, float s, float* a, float* b) {
  const float na = std::fma(*a, c, *b * s);
  *b = std::fma(-*a, s, *b * c);
  *a = na;
}

// bfloat16, per pair, R consecutive rows at once: the even and odd elements of x are the sin and
// cos columns. The first row's PE is (ia, ib), or, given the table row (t0c, t0s) of an angle
// k0·w, (ia, ib) rotated by it; each next row's is the previous one rotated by (c1, s1) = cos,
// sin(w), all in registers; given (oa, ob), the PE of the row after the last is stored there (it
// may be ia, ib: each is read before it is written). y = PE + x, rounded once to bfloat16.
// Bound of a PE value against sin/cos of the exact angle, as the 2-norm of a pair's error: a
// re-anchored start (SinusImpl) is within 2^-21.5 (the float anchor 2^-24; a table rotation 2^-22
// per component, header comment); a step adds at most 1.5·2^-23 (the table's rounding 2^-24, the
// product's and the FMA's 2^-24 each scaled by |s1| + 1 ≤ 2, the rotation otherwise
// norm-preserving); with at most kReanchor − 1 = 15 steps: ≤ 2^-21.5 + 22.5·2^-23 < 2^-18
// (3.8·10⁻⁶) + the angle's |a|·2⁻⁵², inside bfloat16's rounding (2⁻⁹ relative) for every |y| above
// 2^-9. kStream: every y_r aligned for StoreF2<true>.
template <bool kStream, int R>
void AddRecurBf16(const hwy::bfloat16_t* const* x, const float* ia, const float* ib,
                  const float* t0c, const float* t0s, const float* HWY_RESTRICT c1,
                  const float* HWY_RESTRICT s1, std::int64_t n, hwy::bfloat16_t* const* y,
                  float* oa, float* ob) {
  std::int64_t i = 0;  // pair index
#if POSENC_BF16_PAIRS
  const hn::ScalableTag<float> df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  for (; i + N <= n; i += N) {
    auto a = hn::LoadU(df, ia + i), b = hn::LoadU(df, ib + i);
    if (t0c) Rotate(hn::LoadU(df, t0c + i), hn::LoadU(df, t0s + i), &a, &b);
    const auto c = hn::LoadU(df, c1 + i), s = hn::LoadU(df, s1 + i);
    hn::Vec<decltype(df)> xe[R], xo[R];  // every row's x loaded before any y is stored (above)
    HWY_UNROLL(kRows) for (int r = 0; r < R; ++r) {
      if (x) {
        LoadBf16Pairs(df, x[r] + 2 * i, &xe[r], &xo[r]);
      } else {
        xe[r] = hn::Zero(df);
        xo[r] = hn::Zero(df);
      }
    }
    HWY_UNROLL(kRows) for (int r = 0; r < R; ++r) {
      if (r > 0) Rotate(c, s, &a, &b);
      StoreBf16Pairs<kStream>(df, hn::Add(a, xe[r]), hn::Add(b, xo[r]), y[r] + 2 * i);
    }
    if (oa) {
      Rotate(c, s, &a, &b);
      hn::StoreU(a, df, oa + i);
      hn::StoreU(b, df, ob + i);
    }
  }
#endif
  for (; i < n; ++i) {
    float a = ia[i], b = ib[i];
    if (t0c) Rotate(t0c[i], t0s[i], &a, &b);
    for (int r = 0; r < R; ++r) {
      if (r > 0) Rotate(c1[i], s1[i], &a, &b);
      FromF((x ? ToF(x[r][2 * i]) : 0.0f) + a, y[r] + 2 * i);
      FromF((x ? ToF(x[r][2 * i + 1]) : 0.0f) + b, y[r] + 2 * i + 1);
    }
    if (oa) {
      Rotate(c1[i], s1[i], &a, &b);
      oa[i] = a;
      ob[i] = b;
    }
  }
}

// Rows k0 .. k0 + R − 1 of a run (bfloat16) or of an anchor's group (other dtypes), R ≤ kRows,
// for one batch row: xr, yr [R] the rows. bfloat16: a pass at a multiple of kReanchor starts from
// the float anchor (as, ac) rotated by its table row, any other from the state (sa, sb) the pass
// before it left; write_state: leave the next pass's start there.
template <typename T, int R>
void RotatedRows(const sinus_fast::Job& j, const float* as, const float* ac, float* sa, float* sb,
                 const float* V, std::int64_t k0, const T* const* xr, T* const* yr, bool st,
                 bool write_state) {
  const std::int64_t D = j.D, half = D / 2;
  if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {
    const std::int64_t m = k0 / kReanchor, last = kRun / kReanchor;  // Job's table rows
    const bool anchored = k0 % kReanchor == 0;
    const float* ia = anchored ? as : sa;
    const float* ib = anchored ? ac : sb;
    const float* t0c = anchored && m ? j.tc + m * half : nullptr;
    const float* t0s = anchored && m ? j.ts + m * half : nullptr;
    const float* c1 = j.tc + last * half;
    const float* s1 = j.ts + last * half;
    float* oa = write_state ? sa : nullptr;
    float* ob = write_state ? sb : nullptr;
    if (st)
      AddRecurBf16<true, R>(xr, ia, ib, t0c, t0s, c1, s1, half, yr, oa, ob);
    else
      AddRecurBf16<false, R>(xr, ia, ib, t0c, t0s, c1, s1, half, yr, oa, ob);
  } else {
    (void)sa, (void)sb, (void)as, (void)ac, (void)write_state;
    const float* tr[R];
    for (int r = 0; r < R; ++r) tr[r] = j.tc + (k0 + r) * D;
    if (st)
      AddRotatedCols<true, R>(xr, V, tr, D, yr);
    else
      AddRotatedCols<false, R>(xr, V, tr, D, yr);
  }
}

// 4 KiB aliasing of the scratch: a load waits on an earlier store still in flight whose address has
// the same low 12 bits. The bfloat16 recurrence reads and writes its state arrays, and reads its
// table rows, in step with the rows of x and y (4 bytes a pair in each; float32's table rows and
// anchor advance 4 bytes an element, as x and y do), so an array within a few vector steps of x or
// y modulo 4 KiB stalls every step. Large buffers from malloc start a few bytes into a page, so x,
// y, the scratch and the cached table all tended to sit near the same offset (in `posenc bench`:
// the scratch at y + 0 and the table at y − 32 modulo 4 KiB). So the scratch is placed away from x
// and y, and with enough rows the table rows are copied into it. Measured with throwaway programs
// (bfloat16 [4096, 4096], one thread, x and y at one offset): the scratch 48 bytes after y 3.5–3.7
// ms an add, 64 bytes before it 3.9–4.1 ms, 1–3 KiB away 2.6–3.3 ms; y moved against x by 0, 256 or
// 2048 bytes, before 2.9–4.7 ms, after 2.6–3.3 ms. `posenc bench --filter
// 'rope.forward.qk.half.hf|sinusoidal' --threads 1` (the bfloat16 add after other cases, as in a
// full run): 3.37–3.55 ms (0.80–0.84 of memcpy) before, 2.76–3.01 ms (1.10–1.12) after. float32,
// its table copied too (y at 0, 256, 2048 bytes from x, eight alternating runs): a median of 6.42
// ms an add against 6.68 with only the scratch placed.
constexpr std::int64_t kPage = 4096 / sizeof(float);  // floats in 4 KiB

// p + k, 0 ≤ k < kPage, 64-byte aligned, at the middle of the longer arc between x and y modulo
// 4 KiB (at least 1 KiB less 64 bytes from both). p must have room for kPage floats more than its
// arrays need.
inline float* AwayFromStreams(float* p, const void* x, const void* y) {
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(x) % 4096;
  const std::uintptr_t d = (reinterpret_cast<std::uintptr_t>(y) - a) % 4096;  // y − x modulo 4 KiB
  const std::uintptr_t want = ((a + (d <= 2048 ? d / 2 + 2048 : d / 2)) % 4096) & ~std::uintptr_t{63};
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) % 4096;
  return p + (want + 4096 - at) % 4096 / sizeof(float);
}

// Per item (a batch sequence, or all of them when shared, times a block of kRun positions): each
// run of consecutive positions p, p+1, … gets its PE rows from an exact double anchor sin,
// cos(p·w) rounded to float. float32 and float16 carry it in double K positions at a time
// (rotation by K·w), and row p + k, k < K, is that float anchor rotated by the float table of
// k·w; bfloat16 rotates the run's float anchor to every kReanchor-th row and steps row to row in
// float between (error bounds in the header comment and at AddRecurBf16). Passes take kRows rows
// at a time. A token not followed by its successor takes the float sincos instead. Anchors sit at
// block starts, so the result does not depend on the thread count.
template <typename T>
void SinusImpl(const sinus_fast::Job& j) {
  const std::int64_t D = j.D, half = D / 2, L = j.L;
  const std::int64_t nblk = (L + kRun - 1) / kRun, nseq = j.shared ? 1 : j.B;
  const hn::ScalableTag<float> df;
  constexpr bool kPairs = std::is_same_v<T, hwy::bfloat16_t>;  // the tables' form (Job)
  // With at least this many rows each thread copies the table into its scratch (see
  // AwayFromStreams): the traffic of a few rows of x.
  constexpr std::int64_t kCopyTableRows = 4 * kRun;
  const bool copy_table = j.tc && j.B * L >= kCopyTableRows;
  fast::parallel_ranges(nseq * nblk, j.threads, [&](std::int64_t i0, std::int64_t i1) {
    // Scratch, not zeroed (every element is written before it is read): arrays a whole number of
    // 4 KiB pages apart, the first placed away from the streams modulo 4 KiB (AwayFromStreams).
    const auto pages = [](std::int64_t n) { return (n + kPage - 1) / kPage * kPage; };
    const std::int64_t sp = pages(half), tsp = pages(j.tlen);
    const std::unique_ptr<float[]> fbuf(new float[static_cast<std::size_t>(
        6 * sp + pages(D) + (copy_table ? (kPairs ? 2 : 1) * tsp : 0) + kPage)]);
    const void* x0 = j.x ? j.x : j.y;
    float* red = AwayFromStreams(fbuf.get(), x0, j.y);
    float* quad = red + sp;
    float* s = quad + sp;
    float* c = s + sp;
    float* as = c + sp;
    float* ac = as + sp;
    float* pe = ac + sp;  // [D]: a PE row, or the anchor interleaved (V of AddRotatedCols)
    sinus_fast::Job jt = j;  // j, or with the table in this thread's scratch
    if (copy_table) {
      float* tc = pe + pages(D);
      std::memcpy(tc, j.tc, static_cast<std::size_t>(j.tlen) * sizeof(float));
      jt.tc = tc;
      if (kPairs) {
        float* ts = tc + tsp;
        std::memcpy(ts, j.ts, static_cast<std::size_t>(j.tlen) * sizeof(float));
        jt.ts = ts;
      }
    }
    const std::unique_ptr<double[]> dbuf(new double[j.tc ? static_cast<std::size_t>(2 * half) : 1]);
    double* ds = dbuf.get();
    double* dc = ds + half;
    auto rows_of = [&](std::int64_t seq, std::int64_t* b0, std::int64_t* b1) {
      *b0 = j.shared ? 0 : seq;
      *b1 = j.shared ? j.B : seq + 1;
    };
    auto row_ptrs = [&](std::int64_t b, std::int64_t l, const T** x, T** y) {
      *y = static_cast<T*>(j.y) + b * j.ys[0] + l * j.ys[1];
      *x = j.x ? static_cast<const T*>(j.x) + b * j.xs[0] + l * j.xs[1] : nullptr;
    };
    // y rows at l = x rows + pe [D].
    auto add_pe = [&](std::int64_t seq, std::int64_t l) {
      std::int64_t b0, b1;
      rows_of(seq, &b0, &b1);
      for (std::int64_t b = b0; b < b1; ++b) {
        const T* x;
        T* y;
        row_ptrs(b, l, &x, &y);
        if (j.stream)
          AddRow<true>(x, pe, y, D);
        else
          AddRow<false>(x, pe, y, D);
      }
    };
    for (std::int64_t item = i0; item < i1; ++item) {
      const std::int64_t seq = item / nblk, l1 = std::min(L, (item % nblk + 1) * kRun);
      const std::int64_t* p = j.pos + seq * L;
      for (std::int64_t l = (item % nblk) * kRun; l < l1;) {
        std::int64_t n = 1;  // a run of consecutive positions p[l] .. p[l] + n − 1
        while (l + n < l1 && p[l + n] == p[l] + n) ++n;
#if HWY_HAVE_FLOAT64
        if (n >= 2 && j.tc) {
          AnchorF64(static_cast<double>(p[l]), j.inv, half, ds, dc);
          std::int64_t b0, b1;
          rows_of(seq, &b0, &b1);
          // Rows row0 .. row0 + R − 1 of the run (R ≤ kRows), k0 the first one's index in its
          // group (bfloat16: in the run). The bfloat16 recurrence's state between passes is
          // kept in s, c (PeRowFloat's scratch, free during a run), written by the last batch
          // row's pass when the next pass continues from it.
          auto pass = [&](std::int64_t row0, std::int64_t k0, int R) {
            const bool more = kPairs && k0 + R < n && (k0 + R) % kReanchor != 0;
            for (std::int64_t b = b0; b < b1; ++b) {
              const T* xr[kRows];
              T* yr[kRows];
              bool st = j.stream;
              for (int r = 0; r < R; ++r) {
                row_ptrs(b, l + row0 + r, &xr[r], &yr[r]);
                st = st && StreamAligned(df, yr[r]);
              }
              const T* const* xp = j.x ? xr : nullptr;
              const bool ws = more && b + 1 == b1;
              switch (R) {
                case 1: RotatedRows<T, 1>(jt, as, ac, s, c, pe, k0, xp, yr, st, ws); break;
                case 2: RotatedRows<T, 2>(jt, as, ac, s, c, pe, k0, xp, yr, st, ws); break;
                case 3: RotatedRows<T, 3>(jt, as, ac, s, c, pe, k0, xp, yr, st, ws); break;
                default: RotatedRows<T, kRows>(jt, as, ac, s, c, pe, k0, xp, yr, st, ws); break;
              }
            }
          };
          if constexpr (kPairs) {  // one float anchor for the run, rotated to each stretch's start
            AnchorStep(ds, dc, j.cK, j.sK, half, as, ac, false);
            for (std::int64_t k0 = 0; k0 < n; k0 += kRows)
              pass(k0, k0, static_cast<int>(std::min<std::int64_t>(kRows, n - k0)));
          } else {  // a float anchor every K rows, carried in double
            for (std::int64_t g = 0; g < n; g += kK) {
              AnchorStep(ds, dc, j.cK, j.sK, half, as, ac, g + kK < n);
              Interleave(as, ac, half, pe);
              for (std::int64_t k0 = 0; k0 < std::min(kK, n - g); k0 += kRows)
                pass(g + k0, k0, static_cast<int>(std::min<std::int64_t>(kRows, n - g - k0)));
            }
          }
          l += n;
          continue;
        }
#endif
        PeRowFloat(static_cast<double>(p[l]), j, red, quad, s, c, pe);
        add_pe(seq, l);
        ++l;
      }
    }
    if (j.stream) hwy::FlushStream();  // each thread fences its own non-temporal stores
  });
}

// The rotation tables of frequencies w [n], the angles formed in double and their cos, sin rounded
// to float: for columns, cK, sK = cos, sin(K·w) in double and tc [K, 2n] = cos, sin(k·w)
// interleaved; per pair (bfloat16), tc, ts [kRun/kReanchor + 1, n], row m the angle m·kReanchor·w
// and the last row w (Job).
void SinusTablesImpl(const double* w, std::int64_t n, bool columns, double* cK, double* sK,
                     float* tc, float* ts) {
  // sin, cos(k·w[i]) into sv, cv for i in [i0, i0 + m), vectorised where the target has doubles.
  auto sincos = [&](double k, std::int64_t i0, std::int64_t m, double* sv, double* cv) {
    std::int64_t i = 0;
#if HWY_HAVE_FLOAT64
    const hn::ScalableTag<double> dd;
    const std::int64_t Nd = static_cast<std::int64_t>(hn::Lanes(dd));
    for (; i + Nd <= m; i += Nd) {
      hn::Vec<decltype(dd)> s, c;
      SinCosF64(dd, hn::Mul(hn::Set(dd, k), hn::LoadU(dd, w + i0 + i)), &s, &c);
      hn::StoreU(s, dd, sv + i);
      hn::StoreU(c, dd, cv + i);
    }
#endif
    for (; i < m; ++i) {
      sv[i] = std::sin(k * w[i0 + i]);
      cv[i] = std::cos(k * w[i0 + i]);
    }
  };
  if (columns) sincos(static_cast<double>(kK), 0, n, sK, cK);
  // Table row k holds the angle mult(k)·w.
  const std::int64_t rows = columns ? kK : kRun / kReanchor + 1;
  auto mult = [&](std::int64_t k) { return columns ? k : k + 1 == rows ? 1 : k * kReanchor; };
  constexpr std::int64_t kBlock = 256;
  double sv[kBlock], cv[kBlock];
  for (std::int64_t k = 0; k < rows; ++k)
    for (std::int64_t i0 = 0; i0 < n; i0 += kBlock) {
      const std::int64_t m = std::min(kBlock, n - i0);
      sincos(static_cast<double>(mult(k)), i0, m, sv, cv);
      for (std::int64_t i = 0; i < m; ++i) {
        const float c = static_cast<float>(cv[i]), sn = static_cast<float>(sv[i]);
        if (columns) {
          float* pc = tc + k * 2 * n + 2 * (i0 + i);
          pc[0] = c;
          pc[1] = sn;
        } else {
          tc[k * n + i0 + i] = c;
          ts[k * n + i0 + i] = sn;
        }
      }
    }
}

}  // namespace

void SinusRun(const sinus_fast::Job& j) {
  switch (j.dtype) {
    case DType::kF32: SinusImpl<float>(j); break;
    case DType::kBF16: SinusImpl<hwy::bfloat16_t>(j); break;
    case DType::kF16: SinusImpl<hwy::float16_t>(j); break;
    default: break;
  }
}

void SinusTables(const double* w, std::int64_t n, bool columns, double* cK, double* sK, float* tc,
                 float* ts) {
  SinusTablesImpl(w, n, columns, cK, sK, tc, ts);
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "core/fast_common.h"
#include "enc/absolute/sinusoidal/sinusoidal_check.h"
#include "enc/absolute/sinusoidal/sinusoidal_math.h"
#include "posenc/reference.h"

namespace posenc {
HWY_EXPORT(SinusRun);
HWY_EXPORT(SinusTables);

namespace {

// The frequencies of D and base (std::pow, the reference's own values), and the rotation tables.
struct Rotations {
  std::vector<double> cK, sK;  // [D/2] (columns; empty per pair)
  std::vector<float> tc, ts;   // as Job's (columns: ts empty)
};
// y[b, l, :] = x[b, l, :] + PE[pos(b, l)] (x absent: y = PE). Views already validated. shared: the
// positions do not depend on b (given as [L] or an offset).
Status run_fast(const SinusoidalParams& p, const View* x, const View& y, std::int64_t B,
                std::int64_t L, std::int64_t D, const std::vector<std::int64_t>& ids, bool shared) {
  if (B * L * D == 0) return Status::Ok();
  const std::int64_t half = D / 2;
  const std::vector<double>& inv = fast::cached_tables(std::make_tuple(D, p.base), [&] {
    std::vector<double> w(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i)
      w[static_cast<std::size_t>(i)] = sinusoid::inv_freq(i, D, p.base);
    return w;
  });
  sinus_fast::Job j;
  if (L >=
      2) {  // runs of positions are possible: the rotation tables (a decode step never builds them)
    const bool columns = y.dtype != DType::kBF16;
    const Rotations& rt = fast::cached_tables(std::make_tuple(D, p.base, columns), [&] {
      Rotations r;
      r.cK.resize(columns ? static_cast<std::size_t>(half) : 0);
      r.sK.resize(r.cK.size());
      r.tc.resize(static_cast<std::size_t>(
          columns ? sinus_fast::kK * D : (sinus_fast::kRun / sinus_fast::kReanchor + 1) * half));
      r.ts.resize(columns ? 0 : r.tc.size());
      HWY_DYNAMIC_DISPATCH(SinusTables)
      (inv.data(), half, columns, r.cK.data(), r.sK.data(), r.tc.data(), r.ts.data());
      return r;
    });
    j.cK = rt.cK.data();
    j.sK = rt.sK.data();
    j.tc = rt.tc.data();
    j.ts = columns ? nullptr : rt.ts.data();
    j.tlen = static_cast<std::int64_t>(rt.tc.size());
  }
  j.dtype = y.dtype;
  j.B = B;
  j.L = L;
  j.D = D;
  j.pos = ids.data();
  j.shared = shared;
  j.inv = inv.data();
  j.y = y.data;
  const int yo = y.ndim - 3;  // the table is [L, D]: no batch stride
  j.ys[0] = yo < 0 ? 0 : y.strides[0];
  j.ys[1] = y.strides[y.ndim - 2];
  if (x) {
    j.x = x->data;
    j.xs[0] = x->strides[0];
    j.xs[1] = x->strides[1];
  }
  const std::int64_t elems = B * L * D;
  j.threads = fast::threads_for(elems);
  const bool large =
      elems * static_cast<std::int64_t>(dtype_size(y.dtype)) >= fast::kStreamMinBytes;
  j.stream = large && (!x || x->data != y.data);
  HWY_DYNAMIC_DISPATCH(SinusRun)(j);
  return Status::Ok();
}

// Whether every angle p·w_i of the call lies in the fast kernels' range (fast::kMaxFastAngle): the
// anchors' double reduction and the float sincos share simd-inl.h's.
bool fast_angles(const SinusoidalParams& p, std::int64_t D, const std::vector<std::int64_t>& ids) {
  return static_cast<double>(fast::max_abs(ids)) * sinusoid::max_freq(p, D) <= fast::kMaxFastAngle;
}

// dst[b, l, :] = src[b, l, :] row by row (same dtype, contiguous last dimension).
void copy_rows(const View& src, const View& dst) {
  if (src.data == dst.data) return;
  const std::int64_t B = src.dim(0), L = src.dim(1), D = src.dim(2);
  const std::size_t es = dtype_size(src.dtype), bytes = static_cast<std::size_t>(D) * es;
  const int threads = fast::threads_for(B * L * D);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (std::int64_t t = 0; t < B * L; ++t) {
    const std::int64_t b = t / L, l = t % L;
    std::memcpy(static_cast<char*>(dst.data) + (b * dst.strides[0] + l * dst.strides[1]) * es,
                static_cast<const char*>(src.data) + (b * src.strides[0] + l * src.strides[1]) * es, bytes);
  }
}

}  // namespace

Status sinusoidal_table(const SinusoidalParams& p, const Positions& pos, const View& out) {
  POSENC_RETURN_IF_ERROR(sinusoid::check_base(p));
  POSENC_RETURN_IF_ERROR(require_float("out", out, 2));
  POSENC_RETURN_IF_ERROR(sinusoid::check_even_d("out", out));
  POSENC_RETURN_IF_ERROR(sinusoid::check_freqs(p, out.dim(1)));
  if (!fast::fast_dtype(out.dtype) || !fast::inner_contiguous(out))
    return reference::sinusoidal_table(p, pos, out);
  auto ids = expand_positions("positions", pos, 1, out.dim(0));  // [1, L]
  if (!ids.ok()) return ids.status();
  if (!fast_angles(p, out.dim(1), *ids)) return reference::sinusoidal_table(p, pos, out);
  return run_fast(p, nullptr, out, 1, out.dim(0), out.dim(1), *ids, true);
}

Status sinusoidal_forward(const SinusoidalParams& p, const View& x, const Positions& pos, const View& y) {
  POSENC_RETURN_IF_ERROR(sinusoid::check_base(p));
  POSENC_RETURN_IF_ERROR(sinusoid::check_io("x", x, "y", y));
  POSENC_RETURN_IF_ERROR(sinusoid::check_freqs(p, x.dim(2)));
  if (!fast::fast_dtype(x.dtype) || !fast::inner_contiguous(x) || !fast::inner_contiguous(y) ||
      fast::partial_alias(x, y))
    return reference::sinusoidal_forward(p, x, pos, y);
  const std::int64_t B = x.dim(0), L = x.dim(1), D = x.dim(2);
  auto ids = expand_positions("positions", pos, B, L);  // [B, L]
  if (!ids.ok()) return ids.status();
  if (!fast_angles(p, D, *ids)) return reference::sinusoidal_forward(p, x, pos, y);
  return run_fast(p, &x, y, B, L, D, *ids, !pos.ids.present() || pos.ids.ndim == 1);
}

Status sinusoidal_backward(const SinusoidalParams& p, const View& dy, const Positions& pos, const View& dx) {
  POSENC_RETURN_IF_ERROR(sinusoid::check_base(p));
  POSENC_RETURN_IF_ERROR(sinusoid::check_io("dy", dy, "dx", dx));
  POSENC_RETURN_IF_ERROR(sinusoid::check_freqs(p, dy.dim(2)));
  if (!fast::fast_dtype(dy.dtype) || !fast::inner_contiguous(dy) || !fast::inner_contiguous(dx) ||
      fast::partial_alias(dy, dx))
    return reference::sinusoidal_backward(p, dy, pos, dx);
  auto ids = expand_positions("positions", pos, dy.dim(0), dy.dim(1));
  if (!ids.ok()) return ids.status();
  copy_rows(dy, dx);
  return Status::Ok();
}

}  // namespace posenc
#endif  // HWY_ONCE
