// The sinusoidal kernels' row steps, per Highway target (re-included through foreach_target.h by
// sinusoidal_kernels.cc): a row added, the anchors, and the rotated rows of a pass (float32 and
// float16 by columns, bfloat16 by the recurrence), with the bounds of each.
#if defined(POSENC_SINUSOIDAL_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef POSENC_SINUSOIDAL_ROWS_INL_H_
#undef POSENC_SINUSOIDAL_ROWS_INL_H_
#else
#define POSENC_SINUSOIDAL_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <hwy/highway.h>

#include "core/fast_common.h"
#include "core/simd-inl.h"
#include "enc/absolute/sinusoidal/sinusoidal_fast.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace sinus_rows {

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

}  // namespace sinus_rows
}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#endif  // POSENC_SINUSOIDAL_ROWS_INL_H_
