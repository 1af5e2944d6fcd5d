// The sinusoidal encoding's fast path: the public posenc::sinusoidal_table / _forward / _backward
// dispatch here (validation is the reference's, sinusoidal_check.h, so errors are identical).
//
// float32/bfloat16/float16 with a contiguous last dimension: per token, the D/2 angles p·w_i are formed
// in double and reduced exactly, sin/cos evaluated in float (bound in src/core/simd-inl.h), interleaved
// into PE[p, :] and added to x with vector loads (Highway, dynamic dispatch; OpenMP over tokens).
// Everything else falls back to posenc::reference. Backward is dx = dy: a row copy.
#include <cstdint>
#include <cstring>
#include <vector>

#include "posenc/absolute.h"

#ifndef POSENC_SINUS_JOB_DEFINED
#define POSENC_SINUS_JOB_DEFINED
namespace posenc::sinus_fast {
struct Job {
  DType dtype = DType::kF32;
  std::int64_t B = 0, L = 0, D = 0;
  const std::int64_t* pos = nullptr;  // [B, L]
  const double* inv = nullptr;        // [D/2]
  const void* x = nullptr;            // [B, L, D] or null (the table: y = PE)
  void* y = nullptr;                  // [B, L, D]
  std::int64_t xs[2] = {0, 0}, ys[2] = {0, 0};
  int threads = 1;
  bool stream = false;
};
}  // namespace posenc::sinus_fast
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "enc/sinusoidal/sinusoidal_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace {

template <typename T>
void SinusImpl(const sinus_fast::Job& j) {
  const std::int64_t ntok = j.B * j.L, D = j.D, half = D / 2;
#pragma omp parallel num_threads(j.threads) if (j.threads > 1)
  {
    std::vector<float> buf(static_cast<std::size_t>(4 * half + D + 64));
    float* red = buf.data();
    float* quad = red + half;
    float* s = quad + half;
    float* c = s + half;
    float* pe = c + half;  // [D]
    const hn::ScalableTag<float> df;
    const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < ntok; ++t) {
      const std::int64_t b = t / j.L, l = t % j.L;
      SinCosRow(static_cast<double>(j.pos[t]), j.inv, static_cast<std::size_t>(half), red, quad, s, c);
      std::int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
      for (; i + N <= half; i += N)
        hn::StoreInterleaved2(hn::LoadU(df, s + i), hn::LoadU(df, c + i), df, pe + 2 * i);
#endif
      for (; i < half; ++i) {
        pe[2 * i] = s[i];
        pe[2 * i + 1] = c[i];
      }
      T* y = static_cast<T*>(j.y) + b * j.ys[0] + l * j.ys[1];
      std::int64_t d = 0;
      if (j.x) {
        const T* x = static_cast<const T*>(j.x) + b * j.xs[0] + l * j.xs[1];
        if (j.stream) {
          for (; d + N <= D; d += N) StreamF(df, hn::Add(LoadF(df, x + d), hn::LoadU(df, pe + d)), y + d);
        } else {
          for (; d + N <= D; d += N) StoreF(df, hn::Add(LoadF(df, x + d), hn::LoadU(df, pe + d)), y + d);
        }
        for (; d < D; ++d) FromF(ToF(x[d]) + pe[d], y + d);
      } else {
        for (; d + N <= D; d += N) StoreF(df, hn::LoadU(df, pe + d), y + d);
        for (; d < D; ++d) FromF(pe[d], y + d);
      }
    }
  }
  if (j.stream) hwy::FlushStream();
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

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "core/fast_common.h"
#include "enc/sinusoidal/sinusoidal_check.h"
#include "enc/sinusoidal/sinusoidal_math.h"
#include "posenc/reference.h"

namespace posenc {
HWY_EXPORT(SinusRun);

namespace {

// y[b, l, :] = x[b, l, :] + PE[pos(b, l)] (x absent: y = PE). Views already validated.
Status run_fast(const SinusoidalParams& p, const View* x, const View& y, std::int64_t B, std::int64_t L,
                std::int64_t D, const std::vector<std::int64_t>& ids) {
  if (B * L * D == 0) return Status::Ok();
  std::vector<double> inv(static_cast<std::size_t>(D / 2));
  for (std::int64_t i = 0; i < D / 2; ++i) inv[static_cast<std::size_t>(i)] = sinusoid::inv_freq(i, D, p.base);
  sinus_fast::Job j;
  j.dtype = y.dtype;
  j.B = B;
  j.L = L;
  j.D = D;
  j.pos = ids.data();
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
  j.stream = x && x->data != y.data &&
             elems * static_cast<std::int64_t>(dtype_size(y.dtype)) >= fast::kStreamMinBytes;
  HWY_DYNAMIC_DISPATCH(SinusRun)(j);
  return Status::Ok();
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
  if (!fast::fast_dtype(out.dtype) || !fast::inner_contiguous(out))
    return reference::sinusoidal_table(p, pos, out);
  auto ids = expand_positions("positions", pos, 1, out.dim(0));  // [1, L]
  if (!ids.ok()) return ids.status();
  return run_fast(p, nullptr, out, 1, out.dim(0), out.dim(1), *ids);
}

Status sinusoidal_forward(const SinusoidalParams& p, const View& x, const Positions& pos, const View& y) {
  POSENC_RETURN_IF_ERROR(sinusoid::check_base(p));
  POSENC_RETURN_IF_ERROR(sinusoid::check_io("x", x, "y", y));
  if (!fast::fast_dtype(x.dtype) || !fast::inner_contiguous(x) || !fast::inner_contiguous(y) ||
      fast::partial_alias(x, y))
    return reference::sinusoidal_forward(p, x, pos, y);
  const std::int64_t B = x.dim(0), L = x.dim(1), D = x.dim(2);
  auto ids = expand_positions("positions", pos, B, L);  // [B, L]
  if (!ids.ok()) return ids.status();
  return run_fast(p, &x, y, B, L, D, *ids);
}

Status sinusoidal_backward(const SinusoidalParams& p, const View& dy, const Positions& pos, const View& dx) {
  POSENC_RETURN_IF_ERROR(sinusoid::check_base(p));
  POSENC_RETURN_IF_ERROR(sinusoid::check_io("dy", dy, "dx", dx));
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
