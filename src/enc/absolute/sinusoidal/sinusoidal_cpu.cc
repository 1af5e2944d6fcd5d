// The sinusoidal encoding's fast path: the public posenc::sinusoidal_table / _forward / _backward
// dispatch here (validation is the reference's, sinusoidal_check.h, so errors are identical).
// float32/bfloat16/float16 with a contiguous last dimension run the kernels of
// sinusoidal_kernels.cc (Highway, dynamic dispatch; OpenMP over blocks of positions); everything else
// falls back to posenc::reference, as does a call with an angle p·w_i beyond 2^47
// (fast::kMaxFastAngle: the reduction's range; a tiny base or a far position). Backward is dx = dy:
// a row copy.
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/fast_common.h"
#include "enc/absolute/sinusoidal/sinusoidal_check.h"
#include "enc/absolute/sinusoidal/sinusoidal_fast.h"
#include "enc/absolute/sinusoidal/sinusoidal_math.h"
#include "posenc/absolute.h"
#include "posenc/reference.h"

#include "core/fast_common.h"
#include "enc/absolute/sinusoidal/sinusoidal_check.h"
#include "enc/absolute/sinusoidal/sinusoidal_math.h"
#include "posenc/reference.h"

namespace posenc {
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
      sinus_fast::tables(inv.data(), half, columns, r.cK.data(), r.sK.data(), r.tc.data(), r.ts.data());
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
  sinus_fast::run(j);
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
  POSENC_RETURN_IF_ERROR(require_output("out", out, 2));
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
