// The learned absolute encoding's fast path: the public posenc::learned_forward / learned_backward
// dispatch here (validation shared with the reference, learned_check.h, so errors are identical).
//
// forward: y[b,l,:] = x[b,l,:] + E[pos(b,l),:] with vector loads in float32 (Highway, dynamic
// dispatch; OpenMP over tokens) when x, table and y are all float32, all bfloat16 or all float16
// with contiguous last dimensions; large outputs with non-temporal stores. backward: dx = dy is a
// row copy; dtable, the scatter-add, groups the tokens by row (a stable counting sort) and sums
// each row's dy in double in token order (Highway, OpenMP over table rows, no [max_len, D] double
// buffer): the reference's own sums, equal to it bit for bit. Everything else falls back to
// posenc::reference.
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "posenc/absolute.h"

#ifndef POSENC_LEARNED_JOB_DEFINED
#define POSENC_LEARNED_JOB_DEFINED
namespace posenc::learned_fast {
struct Job {
  DType dtype = DType::kF32;
  std::int64_t B = 0, L = 0, D = 0;
  const std::int64_t* pos = nullptr;  // [B, L]
  const void* x = nullptr;            // [B, L, D]
  const void* table = nullptr;        // [max_len, D]
  void* y = nullptr;                  // [B, L, D]
  std::int64_t xs[2] = {0, 0}, ys[2] = {0, 0}, ts = 0;
  int threads = 1;
  bool stream = false;    // out of place and large: non-temporal stores
};

// dtable[p] = Σ_{tokens t at p, in token order} dy[t]: tokens sorted by row (stable).
struct GradJob {
  DType dtype = DType::kF32;
  std::int64_t L = 0, D = 0, max_len = 0;
  const std::int64_t* first =
      nullptr;  // [max_len + 1]: row p's tokens are tok[first[p] .. first[p+1])
  const std::int64_t* tok = nullptr;  // [B·L] token indices t = b·L + l
  const void* dy = nullptr;           // [B, L, D]
  std::int64_t ds[2] = {0, 0};
  void* dtable = nullptr;  // [max_len, D]
  std::int64_t ts = 0;
  int threads = 1;
};
}  // namespace posenc::learned_fast
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "enc/absolute/learned/learned_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/fast_common.h"
#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace {

// y[0, n) = x[0, n) + e[0, n), 2N elements per step. kStream: non-temporal stores from the first
// aligned element on.
template <bool kStream, typename T>
void AddRow(const T* x, const T* HWY_RESTRICT e, T* y, std::int64_t n) {
  const hn::ScalableTag<float> df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t i = 0;
  if (kStream)
    for (; i < n && !StreamAligned(df, y + i); ++i) FromF(ToF(x[i]) + ToF(e[i]), y + i);
#if POSENC_BF16_PAIRS
  if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {
    for (; i + 2 * N <= n; i += 2 * N) {
      hn::Vec<decltype(df)> xe, xo, ee, eo;
      LoadBf16Pairs(df, x + i, &xe, &xo);
      LoadBf16Pairs(df, e + i, &ee, &eo);
      StoreBf16Pairs<kStream>(df, hn::Add(xe, ee), hn::Add(xo, eo), y + i);
    }
  }
#endif
  if constexpr (std::is_same_v<T, float>) {  // one vector a step: float32 needs no 2N (measured alike)
    for (; i + N <= n; i += N) {
      const auto v = hn::Add(hn::LoadU(df, x + i), hn::LoadU(df, e + i));
      if (kStream) hn::Stream(v, df, y + i);
      else hn::StoreU(v, df, y + i);
    }
  }
  for (; i + 2 * N <= n; i += 2 * N) {
    hn::Vec<decltype(df)> x0, x1, e0, e1;
    LoadF2(df, x + i, &x0, &x1);
    LoadF2(df, e + i, &e0, &e1);
    StoreF2<kStream>(df, hn::Add(x0, e0), hn::Add(x1, e1), y + i);
  }
  for (; i + N <= n; i += N) StoreF(df, hn::Add(LoadF(df, x + i), LoadF(df, e + i)), y + i);
  for (; i < n; ++i) FromF(ToF(x[i]) + ToF(e[i]), y + i);
}

template <typename T>
void LearnedImpl(const learned_fast::Job& j) {
  const std::int64_t D = j.D;
  fast::parallel_ranges(j.B * j.L, j.threads, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t b = t / j.L, l = t % j.L;
      const T* x = static_cast<const T*>(j.x) + b * j.xs[0] + l * j.xs[1];
      const T* e = static_cast<const T*>(j.table) + j.pos[t] * j.ts;
      T* y = static_cast<T*>(j.y) + b * j.ys[0] + l * j.ys[1];
      if (j.stream)
        AddRow<true>(x, e, y, D);
      else
        AddRow<false>(x, e, y, D);
    }
    if (j.stream) hwy::FlushStream();  // each thread fences its own non-temporal stores
  });
}

// Rows [p0, p1) of dtable: the sum of their tokens' dy rows in double, in token order, rounded once
// to float and then to the storage type (as View::set): the reference's own sums and roundings, so
// equal to it bit for bit; a row of none is zero.
template <typename T>
void LearnedGradImpl(const learned_fast::GradJob& j) {
  const std::int64_t D = j.D;
  fast::parallel_ranges(j.max_len, j.threads, [&](std::int64_t p0, std::int64_t p1) {
    std::vector<double> acc;
    auto dy_row = [&](std::int64_t t) {
      return static_cast<const T*>(j.dy) + (t / j.L) * j.ds[0] + (t % j.L) * j.ds[1];
    };
    for (std::int64_t p = p0; p < p1; ++p) {
      T* out = static_cast<T*>(j.dtable) + p * j.ts;
      const std::int64_t a = j.first[p], n = j.first[p + 1] - a;
      if (n == 0) {
        std::memset(static_cast<void*>(out), 0, static_cast<std::size_t>(D) * sizeof(T));
        continue;
      }
      if (n == 1) {  // 0 + g: g itself, but for −0 → +0 (and NaN quieted), as the reference's sum
        const T* g = dy_row(j.tok[a]);
        const hn::ScalableTag<float> df;
        const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
        std::int64_t d = 0;
        for (; d + N <= D; d += N) StoreF(df, hn::Add(LoadF(df, g + d), hn::Zero(df)), out + d);
        for (; d < D; ++d) FromF(ToF(g[d]) + 0.0f, out + d);
        continue;
      }
      acc.assign(static_cast<std::size_t>(D), 0.0);
      std::int64_t d = 0;
#if HWY_HAVE_FLOAT64
      const hn::ScalableTag<double> dd;
      const hn::Rebind<float, decltype(dd)> dfh;
      const std::int64_t Nd = static_cast<std::int64_t>(hn::Lanes(dd));
      for (std::int64_t k = 0; k < n; ++k) {
        const T* g = dy_row(j.tok[a + k]);
        for (d = 0; d + Nd <= D; d += Nd)
          hn::StoreU(hn::Add(hn::LoadU(dd, acc.data() + d), hn::PromoteTo(dd, LoadF(dfh, g + d))),
                     dd, acc.data() + d);
      }
      for (d = 0; d + Nd <= D; d += Nd)
        StoreF(dfh, hn::DemoteTo(dfh, hn::LoadU(dd, acc.data() + d)), out + d);
#endif
      for (std::int64_t e = d; e < D; ++e) {
        double sum = 0.0;
        for (std::int64_t k = 0; k < n; ++k)
          sum += static_cast<double>(ToF(dy_row(j.tok[a + k])[e]));
        FromF(static_cast<float>(sum), out + e);
      }
    }
  });
}

}  // namespace

void LearnedRun(const learned_fast::Job& j) {
  switch (j.dtype) {
    case DType::kF32: LearnedImpl<float>(j); break;
    case DType::kBF16: LearnedImpl<hwy::bfloat16_t>(j); break;
    case DType::kF16: LearnedImpl<hwy::float16_t>(j); break;
    default: break;
  }
}

void LearnedGrad(const learned_fast::GradJob& j) {
  switch (j.dtype) {
    case DType::kF32:
      LearnedGradImpl<float>(j);
      break;
    case DType::kBF16:
      LearnedGradImpl<hwy::bfloat16_t>(j);
      break;
    case DType::kF16:
      LearnedGradImpl<hwy::float16_t>(j);
      break;
    default:
      break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "core/fast_common.h"
#include "enc/absolute/learned/learned_check.h"
#include "posenc/reference.h"

namespace posenc {
HWY_EXPORT(LearnedRun);
HWY_EXPORT(LearnedGrad);

Status learned_forward(const LearnedParams& p, const View& x, const View& table, const Positions& pos,
                       const View& y) {
  POSENC_RETURN_IF_ERROR(learned::check_forward(x, table, y));
  const std::int64_t B = x.dim(0), L = x.dim(1), D = x.dim(2);
  const bool fast_ok = fast::fast_dtype(x.dtype) && table.dtype == x.dtype && fast::inner_contiguous(x) &&
                       fast::inner_contiguous(y) && fast::inner_contiguous(table) &&
                       !fast::partial_alias(x, y) && !fast::partial_alias(table, y);
  if (!fast_ok) return reference::learned_forward(p, x, table, pos, y);
  auto ids = learned::checked_positions(pos, B, L, table.dim(0));  // [B, L]
  if (!ids.ok()) return ids.status();
  if (B * L * D == 0) return Status::Ok();
  learned_fast::Job j;
  j.dtype = x.dtype;
  j.B = B;
  j.L = L;
  j.D = D;
  j.pos = ids->data();
  j.x = x.data;
  j.table = table.data;
  j.y = y.data;
  j.xs[0] = x.strides[0];
  j.xs[1] = x.strides[1];
  j.ys[0] = y.strides[0];
  j.ys[1] = y.strides[1];
  j.ts = table.strides[0];
  j.threads = fast::threads_for(B * L * D);
  const bool large =
      B * L * D * static_cast<std::int64_t>(dtype_size(x.dtype)) >= fast::kStreamMinBytes;
  j.stream = large && x.data != y.data;
  HWY_DYNAMIC_DISPATCH(LearnedRun)(j);
  return Status::Ok();
}

Status learned_backward(const LearnedParams& p, const View& dy, const View& table, const Positions& pos,
                        const View& dx, const View& dtable) {
  const bool fast_ok =
      dy.present() && fast::fast_dtype(dy.dtype) && dy.ndim == 3 && fast::inner_contiguous(dy) &&
      (!dx.present() ||
       (dx.ndim == 3 && fast::inner_contiguous(dx) && !fast::partial_alias(dy, dx) &&
        !fast::partial_alias(dx, dtable) && !fast::partial_alias(dx, table))) &&
      (!dtable.present() ||
       (dtable.ndim == 2 && fast::inner_contiguous(dtable) && dtable.dtype == dy.dtype &&
        !fast::partial_alias(dy, dtable) && !fast::partial_alias(dtable, table)));
  if (!fast_ok) return reference::learned_backward(p, dy, table, pos, dx, dtable);
  // Validation in the reference's order, so that errors are identical.
  POSENC_RETURN_IF_ERROR(require_float("dy", dy, 3));
  const std::int64_t B = dy.dim(0), L = dy.dim(1), D = dy.dim(2);
  POSENC_RETURN_IF_ERROR(require_float("table", table, 2));
  POSENC_RETURN_IF_ERROR(require_shape("table", table, {-1, D}));
  const std::int64_t max_len = table.dim(0);
  if (dx.present()) {
    POSENC_RETURN_IF_ERROR(require_output("dx", dx, 3));
    POSENC_RETURN_IF_ERROR(require_shape("dx", dx, {B, L, D}));
    POSENC_RETURN_IF_ERROR(require_same_dtype("dx", dx, dy, "dy"));
  }
  if (dtable.present()) {
    POSENC_RETURN_IF_ERROR(require_output("dtable", dtable, 2));
    POSENC_RETURN_IF_ERROR(require_shape("dtable", dtable, {max_len, D}));
    POSENC_RETURN_IF_ERROR(require_same_dtype("dtable", dtable, table, "table"));
  }
  auto ids = learned::checked_positions(pos, B, L, max_len);  // [B, L]
  if (!ids.ok()) return ids.status();
  const std::size_t es = dtype_size(dy.dtype);
  if (dtable.present() && max_len * D > 0) {
    // Tokens grouped by row, in token order within a row (a stable counting sort).
    std::vector<std::int64_t> first(static_cast<std::size_t>(max_len + 1), 0),
        tok(static_cast<std::size_t>(B * L));
    for (std::int64_t m : *ids) ++first[static_cast<std::size_t>(m + 1)];
    for (std::int64_t r = 0; r < max_len; ++r)
      first[static_cast<std::size_t>(r + 1)] += first[static_cast<std::size_t>(r)];
    std::vector<std::int64_t> next(first.begin(), first.end() - 1);
    for (std::int64_t t = 0; t < B * L; ++t)
      tok[static_cast<std::size_t>(
          next[static_cast<std::size_t>((*ids)[static_cast<std::size_t>(t)])]++)] = t;
    learned_fast::GradJob j;
    j.dtype = dy.dtype;
    j.L = L;
    j.D = D;
    j.max_len = max_len;
    j.first = first.data();
    j.tok = tok.data();
    j.dy = dy.data;
    j.ds[0] = dy.strides[0];
    j.ds[1] = dy.strides[1];
    j.dtable = dtable.data;
    j.ts = dtable.strides[0];
    j.threads = fast::threads_for(B * L * D + max_len * D);
    HWY_DYNAMIC_DISPATCH(LearnedGrad)(j);
  }
  if (!dx.present() || dx.data == dy.data) return Status::Ok();
  const std::size_t bytes = static_cast<std::size_t>(D) * es;
  const int threads = fast::threads_for(B * L * D);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (std::int64_t t = 0; t < B * L; ++t) {
    const std::int64_t b = t / L, l = t % L;
    std::memcpy(static_cast<char*>(dx.data) +
                    (b * dx.strides[0] + l * dx.strides[1]) * static_cast<std::int64_t>(es),
                static_cast<const char*>(dy.data) +
                    (b * dy.strides[0] + l * dy.strides[1]) * static_cast<std::int64_t>(es),
                bytes);
  }
  return Status::Ok();
}

}  // namespace posenc
#endif  // HWY_ONCE
