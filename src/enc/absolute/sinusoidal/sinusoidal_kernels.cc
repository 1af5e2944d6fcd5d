// The sinusoidal encoding's fast kernels (sinusoidal_fast.h), per Highway target: the rows of a job
// and the rotation tables; sinusoidal_cpu.cc validates a call and builds its job.
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

#include "enc/absolute/sinusoidal/sinusoidal_fast.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "enc/absolute/sinusoidal/sinusoidal_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/fast_common.h"
#include "core/simd-inl.h"
#include "enc/absolute/sinusoidal/sinusoidal_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace {

using sinus_fast::kK;
using sinus_fast::kReanchor;
using sinus_fast::kRows;
using sinus_fast::kRun;
using sinus_rows::AddRow;
using sinus_rows::AwayFromStreams;
using sinus_rows::Interleave;
using sinus_rows::kPage;
using sinus_rows::PeRowFloat;
using sinus_rows::RotatedRows;
#if HWY_HAVE_FLOAT64
using sinus_rows::AnchorF64;
using sinus_rows::AnchorStep;
#endif

// A thread's scratch for SinusImpl, not zeroed (every element is written before it is read): arrays
// a whole number of 4 KiB pages apart, the first placed away from the streams modulo 4 KiB
// (AwayFromStreams). With copy_table, the job's tables are copied into it and jt reads them there.
struct Scratch {
  std::unique_ptr<float[]> fbuf;
  std::unique_ptr<double[]> dbuf;
  float *red, *quad, *s, *c, *as, *ac;  // [D/2] each
  float* pe;                            // [D]: a PE row, or the anchor interleaved (V of AddRotatedCols)
  double *ds, *dc;                      // [D/2]: the double anchor
  sinus_fast::Job jt;                   // the job, or with its tables in this scratch

  Scratch(const sinus_fast::Job& j, bool pairs, bool copy_table) : jt(j) {
    const auto pages = [](std::int64_t n) { return (n + kPage - 1) / kPage * kPage; };
    const std::int64_t half = j.D / 2, sp = pages(half), tsp = pages(j.tlen);
    fbuf.reset(new float[static_cast<std::size_t>(6 * sp + pages(j.D) + (copy_table ? (pairs ? 2 : 1) * tsp : 0) + kPage)]);
    red = AwayFromStreams(fbuf.get(), j.x ? j.x : j.y, j.y);
    quad = red + sp, s = quad + sp, c = s + sp, as = c + sp, ac = as + sp, pe = ac + sp;
    if (copy_table) {
      float* tc = pe + pages(j.D);
      std::memcpy(tc, j.tc, static_cast<std::size_t>(j.tlen) * sizeof(float));
      jt.tc = tc;
      if (pairs) {
        float* ts = tc + tsp;
        std::memcpy(ts, j.ts, static_cast<std::size_t>(j.tlen) * sizeof(float));
        jt.ts = ts;
      }
    }
    dbuf.reset(new double[j.tc ? static_cast<std::size_t>(2 * half) : 1]);
    ds = dbuf.get(), dc = ds + half;
  }
};

// The batch rows [*b0, *b1) of item sequence seq (all of them when the positions are shared).
inline void SeqRows(const sinus_fast::Job& j, std::int64_t seq, std::int64_t* b0, std::int64_t* b1) {
  *b0 = j.shared ? 0 : seq;
  *b1 = j.shared ? j.B : seq + 1;
}

// Row l of batch row b: x (null without x) and y.
template <typename T>
void RowPtrs(const sinus_fast::Job& j, std::int64_t b, std::int64_t l, const T** x, T** y) {
  *y = static_cast<T*>(j.y) + b * j.ys[0] + l * j.ys[1];
  *x = j.x ? static_cast<const T*>(j.x) + b * j.xs[0] + l * j.xs[1] : nullptr;
}

// y rows at l = x rows + w.pe [D], for the batch rows of sequence seq.
template <typename T>
void AddPe(const sinus_fast::Job& j, const Scratch& w, std::int64_t seq, std::int64_t l) {
  std::int64_t b0, b1;
  SeqRows(j, seq, &b0, &b1);
  for (std::int64_t b = b0; b < b1; ++b) {
    const T* x;
    T* y;
    RowPtrs(j, b, l, &x, &y);
    if (j.stream) AddRow<true>(x, w.pe, y, j.D);
    else AddRow<false>(x, w.pe, y, j.D);
  }
}

#if HWY_HAVE_FLOAT64
// Rows row0 .. row0 + R − 1 (R ≤ kRows) of the run of n rows from l, every batch row of sequence
// seq; k0 the first one's index in its group (bfloat16: in the run). The bfloat16 recurrence's
// state between passes is kept in w.s, w.c (PeRowFloat's scratch, free during a run), written by
// the last batch row's pass when the next pass continues from it.
template <typename T>
void RunPass(const sinus_fast::Job& j, Scratch& w, std::int64_t seq, std::int64_t l, std::int64_t n, std::int64_t row0,
             std::int64_t k0, int R) {
  constexpr bool kPairs = std::is_same_v<T, hwy::bfloat16_t>;
  const hn::ScalableTag<float> df;
  const bool more = kPairs && k0 + R < n && (k0 + R) % kReanchor != 0;
  std::int64_t b0, b1;
  SeqRows(j, seq, &b0, &b1);
  for (std::int64_t b = b0; b < b1; ++b) {
    const T* xr[kRows];
    T* yr[kRows];
    bool st = j.stream;
    for (int r = 0; r < R; ++r) {
      RowPtrs(j, b, l + row0 + r, &xr[r], &yr[r]);
      st = st && StreamAligned(df, yr[r]);
    }
    const T* const* xp = j.x ? xr : nullptr;
    const bool ws = more && b + 1 == b1;
    switch (R) {
      case 1: RotatedRows<T, 1>(w.jt, w.as, w.ac, w.s, w.c, w.pe, k0, xp, yr, st, ws); break;
      case 2: RotatedRows<T, 2>(w.jt, w.as, w.ac, w.s, w.c, w.pe, k0, xp, yr, st, ws); break;
      case 3: RotatedRows<T, 3>(w.jt, w.as, w.ac, w.s, w.c, w.pe, k0, xp, yr, st, ws); break;
      default: RotatedRows<T, kRows>(w.jt, w.as, w.ac, w.s, w.c, w.pe, k0, xp, yr, st, ws); break;
    }
  }
}

// The run of n ≥ 2 consecutive positions p0, p0 + 1, … at rows l … l + n − 1 of sequence seq: an
// exact double anchor at p0, then passes of kRows rows.
template <typename T>
void AnchoredRun(const sinus_fast::Job& j, Scratch& w, std::int64_t seq, std::int64_t l, std::int64_t n, std::int64_t p0) {
  const std::int64_t half = j.D / 2;
  AnchorF64(static_cast<double>(p0), j.inv, half, w.ds, w.dc);
  const auto rows = [&](std::int64_t left) { return static_cast<int>(std::min<std::int64_t>(kRows, left)); };
  if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {  // one float anchor for the run, rotated to each stretch's start
    AnchorStep(w.ds, w.dc, j.cK, j.sK, half, w.as, w.ac, false);
    for (std::int64_t k0 = 0; k0 < n; k0 += kRows) RunPass<T>(j, w, seq, l, n, k0, k0, rows(n - k0));
  } else {  // a float anchor every K rows, carried in double
    for (std::int64_t g = 0; g < n; g += kK) {
      AnchorStep(w.ds, w.dc, j.cK, j.sK, half, w.as, w.ac, g + kK < n);
      Interleave(w.as, w.ac, half, w.pe);
      for (std::int64_t k0 = 0; k0 < std::min(kK, n - g); k0 += kRows) RunPass<T>(j, w, seq, l, n, g + k0, k0, rows(n - g - k0));
    }
  }
}
#endif  // HWY_HAVE_FLOAT64

// Per item (a batch sequence, or all of them when shared, times a block of kRun positions): each
// run of consecutive positions p, p+1, … gets its PE rows from an exact double anchor sin,
// cos(p·w) rounded to float. float32 and float16 carry it in double K positions at a time
// (rotation by K·w), and row p + k, k < K, is that float anchor rotated by the float table of
// k·w; bfloat16 rotates the run's float anchor to every kReanchor-th row and steps row to row in
// float between (error bounds in this file's header comment and at AddRecurBf16, sinusoidal_rows-inl.h). Passes take kRows rows
// at a time. A token not followed by its successor takes the float sincos instead. Anchors sit at
// block starts, so the result does not depend on the thread count.
template <typename T>
void SinusImpl(const sinus_fast::Job& j) {
  const std::int64_t L = j.L, nblk = (L + kRun - 1) / kRun, nseq = j.shared ? 1 : j.B;
  // With at least this many rows each thread copies the table into its scratch (see
  // AwayFromStreams): the traffic of a few rows of x.
  constexpr std::int64_t kCopyTableRows = 4 * kRun;
  const bool copy_table = j.tc && j.B * L >= kCopyTableRows;
  fast::parallel_ranges(nseq * nblk, j.threads, [&](std::int64_t i0, std::int64_t i1) {
    Scratch w(j, std::is_same_v<T, hwy::bfloat16_t>, copy_table);
    for (std::int64_t item = i0; item < i1; ++item) {
      const std::int64_t seq = item / nblk, l1 = std::min(L, (item % nblk + 1) * kRun);
      const std::int64_t* p = j.pos + seq * L;
      for (std::int64_t l = (item % nblk) * kRun; l < l1;) {
        std::int64_t n = 1;  // a run of consecutive positions p[l] .. p[l] + n − 1
        while (l + n < l1 && p[l + n] == p[l] + n) ++n;
#if HWY_HAVE_FLOAT64
        if (n >= 2 && j.tc) {
          AnchoredRun<T>(j, w, seq, l, n, p[l]);
          l += n;
          continue;
        }
#endif
        PeRowFloat(static_cast<double>(p[l]), j, w.red, w.quad, w.s, w.c, w.pe);
        AddPe<T>(j, w, seq, l);
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
namespace posenc {
HWY_EXPORT(SinusRun);
HWY_EXPORT(SinusTables);

void sinus_fast::run(const Job& j) { HWY_DYNAMIC_DISPATCH(SinusRun)(j); }

void sinus_fast::tables(const double* w, std::int64_t n, bool columns, double* cK, double* sK, float* tc, float* ts) {
  HWY_DYNAMIC_DISPATCH(SinusTables)(w, n, columns, cK, sK, tc, ts);
}
}  // namespace posenc
#endif  // HWY_ONCE
