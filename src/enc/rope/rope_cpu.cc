// RoPE's fast path: the public posenc::rope_forward / rope_backward / rope_apply_qk dispatch here.
//
// Validation is the reference's own (rope_check.h), so errors are identical. float32, bfloat16 and
// float16 views whose innermost dimension is contiguous run the Highway kernel below (every target
// compiled by foreach_target.h, the best supported one chosen at run time by HWY_DYNAMIC_DISPATCH);
// float64, a strided innermost dimension or a partial overlap of input and output fall back to
// posenc::reference.
//
// Per token (b, l) at position m: the r/2 angles m·θ_k are formed in double and reduced exactly, their
// sin/cos evaluated once in float (core/simd-inl.h states the bound) and shared by every head of q and
// k; then each head row [D] is rotated with vector loads:
//   interleaved: y = x·C + swap_pairs(x)·S, C = (c0 c0 c1 c1 …), S = (−s0 s0 −s1 s1 …)
//   half:        y_a = x_a·c − x_b·s, y_b = x_b·c + x_a·s over the two contiguous halves
// and the pass-through tail r .. D−1 is copied when out of place. OpenMP over tokens (B·L).
#include <cstdint>
#include <cstring>
#include <vector>

#include "posenc/rope.h"

#ifndef POSENC_ROPE_JOB_DEFINED
#define POSENC_ROPE_JOB_DEFINED
namespace posenc::rope_fast {
struct Tensor {
  const void* in = nullptr;  // [B, L, H, D]
  void* out = nullptr;       // [B, L, H, D]
  std::int64_t H = 0, D = 0;
  std::int64_t is[3] = {0, 0, 0}, os[3] = {0, 0, 0};  // element strides of b, l, h
};
struct Job {
  DType dtype = DType::kF32;
  bool interleaved = true;
  std::int64_t B = 0, L = 0, r = 0;
  const std::int64_t* pos = nullptr;  // [B, L]
  const double* inv = nullptr;        // [r/2], already multiplied by the sign (±1)
  Tensor t[2];
  int nt = 0;
  int threads = 1;
  bool stream = false;
};
}  // namespace posenc::rope_fast
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "enc/rope/rope_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace {

template <typename T>
void RotateRow(const T* HWY_RESTRICT x, T* HWY_RESTRICT y, bool interleaved, std::int64_t r,
               const float* HWY_RESTRICT C, const float* HWY_RESTRICT S, const float* HWY_RESTRICT c,
               const float* HWY_RESTRICT s, bool stream) {
  const hn::ScalableTag<float> df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t i = 0;
  if (interleaved) {
#if HWY_TARGET != HWY_SCALAR
    for (; i + N <= r; i += N) {
      const auto v = LoadF(df, x + i);
      const auto o = hn::MulAdd(hn::Shuffle2301(v), hn::LoadU(df, S + i), hn::Mul(v, hn::LoadU(df, C + i)));
      if (stream) StreamF(df, o, y + i); else StoreF(df, o, y + i);
    }
#endif
    for (; i < r; i += 2) {
      const float xa = ToF(x[i]), xb = ToF(x[i + 1]), ck = C[i], sk = S[i + 1];
      FromF(xa * ck - xb * sk, y + i);
      FromF(xa * sk + xb * ck, y + i + 1);
    }
    return;
  }
  const std::int64_t h = r / 2;
  for (; i + N <= h; i += N) {
    const auto xa = LoadF(df, x + i), xb = LoadF(df, x + h + i);
    const auto cv = hn::LoadU(df, c + i), sv = hn::LoadU(df, s + i);
    const auto ya = hn::NegMulAdd(xb, sv, hn::Mul(xa, cv));
    const auto yb = hn::MulAdd(xa, sv, hn::Mul(xb, cv));
    if (stream) {
      StreamF(df, ya, y + i);
      StreamF(df, yb, y + h + i);
    } else {
      StoreF(df, ya, y + i);
      StoreF(df, yb, y + h + i);
    }
  }
  for (; i < h; ++i) {
    const float xa = ToF(x[i]), xb = ToF(x[h + i]);
    FromF(xa * c[i] - xb * s[i], y + i);
    FromF(xa * s[i] + xb * c[i], y + h + i);
  }
}

template <typename T>
void RopeImpl(const rope_fast::Job& j) {
  const std::int64_t ntok = j.B * j.L, half = j.r / 2, r = j.r;
#pragma omp parallel num_threads(j.threads) if (j.threads > 1)
  {
    // Per thread: red, quad, s, c [r/2] and C, S [r] (interleaved expansion).
    std::vector<float> buf(static_cast<std::size_t>(4 * half + 2 * r + 64));
    float* red = buf.data();
    float* quad = red + half;
    float* s = quad + half;
    float* c = s + half;
    float* C = c + half;
    float* S = C + r;
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < ntok; ++t) {
      const std::int64_t b = t / j.L, l = t % j.L;
      SinCosRow(static_cast<double>(j.pos[t]), j.inv, static_cast<std::size_t>(half), red, quad, s, c);
      if (j.interleaved) {
        for (std::int64_t k = 0; k < half; ++k) {
          C[2 * k] = C[2 * k + 1] = c[k];
          S[2 * k] = -s[k];
          S[2 * k + 1] = s[k];
        }
      }
      for (int ti = 0; ti < j.nt; ++ti) {
        const rope_fast::Tensor& tn = j.t[ti];
        const T* xb = static_cast<const T*>(tn.in) + b * tn.is[0] + l * tn.is[1];
        T* yb = static_cast<T*>(tn.out) + b * tn.os[0] + l * tn.os[1];
        for (std::int64_t hh = 0; hh < tn.H; ++hh) {
          const T* x = xb + hh * tn.is[2];
          T* y = yb + hh * tn.os[2];
          RotateRow(x, y, j.interleaved, r, C, S, c, s, j.stream);
          if (tn.D > r && static_cast<const void*>(x) != static_cast<const void*>(y))
            std::memcpy(y + r, x + r, static_cast<std::size_t>(tn.D - r) * sizeof(T));
        }
      }
    }
  }
  if (j.stream) hwy::FlushStream();
}

}  // namespace

void RopeRun(const rope_fast::Job& j) {
  switch (j.dtype) {
    case DType::kF32: RopeImpl<float>(j); break;
    case DType::kBF16: RopeImpl<hwy::bfloat16_t>(j); break;
    case DType::kF16: RopeImpl<hwy::float16_t>(j); break;
    default: break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "core/fast_common.h"
#include "enc/rope/rope_check.h"
#include "enc/rope/rope_math.h"
#include "posenc/reference.h"

namespace posenc {
HWY_EXPORT(RopeRun);

namespace {

bool kernel_ok(const View& in, const View& out) {
  return fast::fast_dtype(in.dtype) && fast::inner_contiguous(in) && fast::inner_contiguous(out) &&
         !fast::partial_alias(in, out);
}

void fill_tensor(rope_fast::Tensor* t, const View& in, const View& out) {
  t->in = in.data;
  t->out = out.data;
  t->H = in.dim(2);
  t->D = in.dim(3);
  for (int i = 0; i < 3; ++i) {
    t->is[i] = in.strides[i];
    t->os[i] = out.strides[i];
  }
}

// Rotates up to two tensors sharing B, L, positions and dtype.
Status run_fast(const RopeParams& p, std::int64_t r, const View* in, const View* out, int n,
                const Positions& pos, double sign) {
  const std::int64_t B = in[0].dim(0), L = in[0].dim(1);
  auto ids = expand_positions("positions", pos, B, L);  // [B, L]
  if (!ids.ok()) return ids.status();
  std::vector<double> inv(static_cast<std::size_t>(r / 2));
  for (std::int64_t k = 0; k < r / 2; ++k) inv[static_cast<std::size_t>(k)] = sign * rope::inv_freq(k, r, p.theta);
  rope_fast::Job j;
  j.dtype = in[0].dtype;
  j.interleaved = p.layout == RopeLayout::kInterleaved;
  j.B = B;
  j.L = L;
  j.r = r;
  j.pos = ids->data();
  j.inv = inv.data();
  j.nt = n;
  std::int64_t elems = 0;
  bool in_place = true;
  for (int i = 0; i < n; ++i) {
    fill_tensor(&j.t[i], in[i], out[i]);
    elems += in[i].numel();
    in_place = in_place && in[i].data == out[i].data;
  }
  if (elems == 0) return Status::Ok();
  j.threads = fast::threads_for(elems);
  j.stream = !in_place && elems * static_cast<std::int64_t>(dtype_size(j.dtype)) >= fast::kStreamMinBytes;
  HWY_DYNAMIC_DISPATCH(RopeRun)(j);
  return Status::Ok();
}

Status rotate(const RopeParams& p, const char* in_arg, const View& in, const Positions& pos,
              const char* out_arg, const View& out, double sign) {
  auto rr = rope::check(p, in_arg, in, out_arg, out);
  if (!rr.ok()) return rr.status();
  if (!kernel_ok(in, out))
    return sign > 0 ? reference::rope_forward(p, in, pos, out) : reference::rope_backward(p, in, pos, out);
  return run_fast(p, *rr, &in, &out, 1, pos, sign);
}

}  // namespace

Status rope_forward(const RopeParams& p, const View& x, const Positions& pos, const View& y) {
  return rotate(p, "x", x, pos, "y", y, +1.0);
}

Status rope_backward(const RopeParams& p, const View& dy, const Positions& pos, const View& dx) {
  return rotate(p, "dy", dy, pos, "dx", dx, -1.0);
}

Status rope_apply_qk(const RopeParams& p, const View& q, const View& k, const Positions& pos,
                     const View& q_out, const View& k_out, bool backward) {
  auto rq = rope::check(p, "q", q, "q_out", q_out);
  if (!rq.ok()) return rq.status();
  if (!k.present() && !k_out.present()) return rotate(p, "q", q, pos, "q_out", q_out, backward ? -1.0 : 1.0);
  auto rk = rope::check(p, "k", k, "k_out", k_out);
  if (!rk.ok()) return rk.status();
  if (k.dim(0) != q.dim(0) || k.dim(1) != q.dim(1))
    return Status::Invalid("k", "expected the batch and length of q, [" + std::to_string(q.dim(0)) + ", " +
                                    std::to_string(q.dim(1)) + ", *, *], got " + k.shape_str());
  if (*rq != *rk)
    return Status::Invalid("rotary_dim", "expected one rotary dimension for q and k (0 means D), got D = " +
                                             std::to_string(q.dim(3)) + " for q and " +
                                             std::to_string(k.dim(3)) + " for k");
  if (fast::partial_alias(q_out, k_out) || fast::partial_alias(q_out, k) || fast::partial_alias(k_out, q) ||
      (q_out.data == k_out.data && q_out.present()))
    return Status::Invalid("k_out", "expected memory disjoint from q and q_out");
  const double sign = backward ? -1.0 : 1.0;
  if (q.dtype == k.dtype && kernel_ok(q, q_out) && kernel_ok(k, k_out)) {
    const View in[2] = {q, k}, out[2] = {q_out, k_out};
    return run_fast(p, *rq, in, out, 2, pos, sign);
  }
  POSENC_RETURN_IF_ERROR(rotate(p, "q", q, pos, "q_out", q_out, sign));
  return rotate(p, "k", k, pos, "k_out", k_out, sign);
}

}  // namespace posenc
#endif  // HWY_ONCE
