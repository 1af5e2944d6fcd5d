// The learned absolute encoding's fast path: the public posenc::learned_forward / learned_backward
// dispatch here (validation shared with the reference, learned_check.h, so errors are identical).
//
// forward: y[b,l,:] = x[b,l,:] + E[pos(b,l),:] with vector loads in float32 (Highway, dynamic dispatch;
// OpenMP over tokens) when x, table and y are all float32, all bfloat16 or all float16 with contiguous
// last dimensions. backward: dx = dy is a row copy; dtable (a scatter-add accumulated in double) is the
// reference's. Everything else falls back to posenc::reference.
#include <cstdint>
#include <cstring>
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
  bool stream = false;
};
}  // namespace posenc::learned_fast
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "enc/learned/learned_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace {

template <typename T>
void LearnedImpl(const learned_fast::Job& j) {
  const std::int64_t ntok = j.B * j.L, D = j.D;
  const hn::ScalableTag<float> df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
#pragma omp parallel for num_threads(j.threads) if (j.threads > 1) schedule(static)
  for (std::int64_t t = 0; t < ntok; ++t) {
    const std::int64_t b = t / j.L, l = t % j.L;
    const T* x = static_cast<const T*>(j.x) + b * j.xs[0] + l * j.xs[1];
    const T* e = static_cast<const T*>(j.table) + j.pos[t] * j.ts;
    T* y = static_cast<T*>(j.y) + b * j.ys[0] + l * j.ys[1];
    std::int64_t d = 0;
    if (j.stream) {
      for (; d + N <= D; d += N) StreamF(df, hn::Add(LoadF(df, x + d), LoadF(df, e + d)), y + d);
    } else {
      for (; d + N <= D; d += N) StoreF(df, hn::Add(LoadF(df, x + d), LoadF(df, e + d)), y + d);
    }
    for (; d < D; ++d) FromF(ToF(x[d]) + ToF(e[d]), y + d);
  }
  if (j.stream) hwy::FlushStream();
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

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "core/fast_common.h"
#include "enc/learned/learned_check.h"
#include "posenc/reference.h"

namespace posenc {
HWY_EXPORT(LearnedRun);

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
  j.stream = x.data != y.data && B * L * D * static_cast<std::int64_t>(dtype_size(x.dtype)) >= fast::kStreamMinBytes;
  HWY_DYNAMIC_DISPATCH(LearnedRun)(j);
  return Status::Ok();
}

Status learned_backward(const LearnedParams& p, const View& dy, const View& table, const Positions& pos,
                        const View& dx, const View& dtable) {
  const bool fast_ok = dx.present() && dy.present() && fast::fast_dtype(dy.dtype) && dy.ndim == 3 &&
                       dx.ndim == 3 && fast::inner_contiguous(dy) && fast::inner_contiguous(dx) &&
                       !fast::partial_alias(dy, dx) && !fast::partial_alias(dx, dtable) &&
                       !fast::partial_alias(dy, dtable) && !fast::partial_alias(dx, table);
  if (!fast_ok) return reference::learned_backward(p, dy, table, pos, dx, dtable);
  // Validation (and dtable) by the reference with dx absent, then dx = dy row by row.
  POSENC_RETURN_IF_ERROR(require_float("dy", dy, 3));
  const std::int64_t B = dy.dim(0), L = dy.dim(1), D = dy.dim(2);
  POSENC_RETURN_IF_ERROR(require_float("table", table, 2));
  POSENC_RETURN_IF_ERROR(require_shape("table", table, {-1, D}));
  POSENC_RETURN_IF_ERROR(require_float("dx", dx, 3));
  POSENC_RETURN_IF_ERROR(require_shape("dx", dx, {B, L, D}));
  POSENC_RETURN_IF_ERROR(require_same_dtype("dx", dx, dy, "dy"));
  if (dtable.present()) {
    POSENC_RETURN_IF_ERROR(reference::learned_backward(p, dy, table, pos, View{}, dtable));
  } else {
    auto ids = learned::checked_positions(pos, B, L, table.dim(0));
    if (!ids.ok()) return ids.status();
  }
  if (dx.data == dy.data) return Status::Ok();
  const std::size_t es = dtype_size(dy.dtype), bytes = static_cast<std::size_t>(D) * es;
  const int threads = fast::threads_for(B * L * D);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (std::int64_t t = 0; t < B * L; ++t) {
    const std::int64_t b = t / L, l = t % L;
    std::memcpy(static_cast<char*>(dx.data) + (b * dx.strides[0] + l * dx.strides[1]) * es,
                static_cast<const char*>(dy.data) + (b * dy.strides[0] + l * dy.strides[1]) * es, bytes);
  }
  return Status::Ok();
}

}  // namespace posenc
#endif  // HWY_ONCE
