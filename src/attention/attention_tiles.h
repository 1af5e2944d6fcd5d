// Private: the tile machinery the fused attention kernels share (attention_cpu.cc for nope, rope,
// alibi and t5; attention_xl_cpu.cc; attention_cope_cpu.cc): tile sizes, SIMD row helpers (Highway,
// dispatched at run time, defined in attention_cpu.cc), row loads and stores between any-dtype,
// any-stride [B, L, H, D] views and float [n, D] tiles, the online-softmax step, and the OpenBLAS
// threading guard.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attention/attention_check.h"
#include "attention/tile_gemm.h"
#include "core/fast_common.h"
#include "posenc/half.h"
#include "posenc/view.h"

namespace posenc::attn_fast {

using I = std::int64_t;

constexpr float kNegInfF = -std::numeric_limits<float>::infinity();
constexpr I kBq = 128;  // query rows per tile
constexpr I kBk = 128;  // keys per tile (also the row stride of score tiles)

inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

// Row helpers of one SIMD target.
struct Simd {
  float (*exp_sub_sum)(float* x, std::size_t n, float m);  // x = exp(x − m); returns Σ x
  void (*scale)(float* x, std::size_t n, float c);         // x *= c
  void (*add_to)(float* y, const float* x, std::size_t n);  // y += x
  void (*ds_row)(float* p, const float* dp, std::size_t n, float di);  // p = p·(dp − di)
  float (*dot)(const float* a, const float* b, std::size_t n);
  // online_softmax_step below, every row of the tile in one call
  void (*softmax_step)(float* S, I nq, I nk, float* m, float* l, float* o, I D, I band);
};

// The best target's helpers on this CPU (attention_cpu.cc); a kernel fetches them once per call.
Simd simd();

// n floats from src to dst, inline: a head's row is short (D = 16 in the study's model), and a
// memcpy call per row cost more than the copy (fixed-size pieces compile to plain vector moves).
inline void copy_row(float* dst, const float* src, I n) {
  I e = 0;
  for (; e + 16 <= n; e += 16) std::memcpy(dst + e, src + e, 16 * sizeof(float));
  for (; e + 4 <= n; e += 4) std::memcpy(dst + e, src + e, 4 * sizeof(float));
  for (; e < n; ++e) dst[e] = src[e];
}

// Rows [r0, r0 + n) of head `head` of x [B, L, H, D] into dst [n, D] as float.
inline void load_rows(const View& x, I D, I b, I r0, I n, I head, float* dst) {
  const I s3 = x.strides[3];
  for (I r = 0; r < n; ++r) {
    const I off = b * x.strides[0] + (r0 + r) * x.strides[1] + head * x.strides[2];
    float* y = dst + r * D;
    switch (x.dtype) {
      case DType::kF32: {
        const float* src = static_cast<const float*>(x.data) + off;
        if (s3 == 1) copy_row(y, src, D);
        else for (I e = 0; e < D; ++e) y[e] = src[e * s3];
        break;
      }
      case DType::kBF16: {
        const bf16* src = static_cast<const bf16*>(x.data) + off;
        for (I e = 0; e < D; ++e) y[e] = to_float(src[e * s3]);
        break;
      }
      default: {  // float16
        const f16* src = static_cast<const f16*>(x.data) + off;
        for (I e = 0; e < D; ++e) y[e] = to_float(src[e * s3]);
        break;
      }
    }
  }
}

// One row y [D] into row r of head `head` of x [B, L, H, D], rounded once to x's dtype.
inline void store_row(const View& x, I D, I b, I r, I head, const float* y) {
  const I s3 = x.strides[3];
  const I off = b * x.strides[0] + r * x.strides[1] + head * x.strides[2];
  switch (x.dtype) {
    case DType::kF32: {
      float* dst = static_cast<float*>(x.data) + off;
      if (s3 == 1) copy_row(dst, y, D);
      else for (I e = 0; e < D; ++e) dst[e * s3] = y[e];
      break;
    }
    case DType::kBF16: {
      bf16* dst = static_cast<bf16*>(x.data) + off;
      for (I e = 0; e < D; ++e) dst[e * s3] = to_bf16(y[e]);
      break;
    }
    default: {
      f16* dst = static_cast<f16*>(x.data) + off;
      for (I e = 0; e < D; ++e) dst[e * s3] = to_f16(y[e]);
      break;
    }
  }
}

// src [n, D] into rows [r0, r0 + n) of head `head` of x.
inline void store_rows(const View& x, I D, I b, I r0, I n, I head, const float* src) {
  for (I r = 0; r < n; ++r) store_row(x, D, b, r0 + r, head, src + r * D);
}

// Rows [r0, r0 + n) of head `head` of x += src [n, D], for a kernel that sums a row's parts in the
// caller's tensor. Any stride; a bfloat16 or float16 x is read, added to in float and rounded again
// (so a float32 x is what keeps the sum rounded once per addition, as in a float accumulator).
inline void add_rows(const View& x, I D, I b, I r0, I n, I head, const float* src) {
  const I s3 = x.strides[3];
  for (I r = 0; r < n; ++r) {
    const I off = b * x.strides[0] + (r0 + r) * x.strides[1] + head * x.strides[2];
    const float* y = src + r * D;
    switch (x.dtype) {
      case DType::kF32: {
        float* dst = static_cast<float*>(x.data) + off;
        if (s3 == 1)
          for (I e = 0; e < D; ++e) dst[e] += y[e];
        else
          for (I e = 0; e < D; ++e) dst[e * s3] += y[e];
        break;
      }
      case DType::kBF16: {
        bf16* dst = static_cast<bf16*>(x.data) + off;
        for (I e = 0; e < D; ++e) dst[e * s3] = to_bf16(to_float(dst[e * s3]) + y[e]);
        break;
      }
      default: {
        f16* dst = static_cast<f16*>(x.data) + off;
        for (I e = 0; e < D; ++e) dst[e * s3] = to_f16(to_float(dst[e * s3]) + y[e]);
        break;
      }
    }
  }
}

// The entries of row i of a score tile with nk keys that the softmax reads under a band (tile_gemm.h):
// its visible keys, min(nk, i + band + 1), rounded up to 16 (whole vectors of every target, so no
// row ends in a scalar tail), or all nk without a band. The masked keys within that reach hold −inf
// (exp gives their zeros), those beyond it zeros already (see Fused::logits).
inline I band_reach(I i, I band, I nk) {
  if (band >= kNoBand) return nk;
  const I n = std::clamp<I>(i + band + 1, 0, nk);
  return std::min(nk, (n + 15) / 16 * 16);
}

// One step of the online softmax over a score tile S [nq, kBk] (nk valid columns, −inf where masked):
// m' = max(m, rowmax S), S = exp(S − m'), l = l·e^{m−m'} + ΣS, o = o·e^{m−m'} ([nq, D]; a row whose m
// is still −∞ must hold o = 0, which it keeps). A row still wholly masked gets S = 0. The caller then
// adds S·V into o. band: row i reads only its first band_reach(i, band, nk) logits.
inline void online_softmax_step(const Simd& sd, float* S, I nq, I nk, float* m, float* l, float* o,
                                I D, I band = kNoBand) {
  sd.softmax_step(S, nq, nk, m, l, o, D, band);
}

// The end of the online softmax: o /= l, lse = m + log l (−inf, o = 0 for a row with no key).
inline void online_softmax_finish(const Simd& sd, I nq, const float* m, const float* l, float* o,
                                  I D, double* lse) {
  for (I i = 0; i < nq; ++i) {
    if (l[i] > 0) {
      sd.scale(o + i * D, ix(D), 1.f / l[i]);
      lse[i] = static_cast<double>(m[i]) + std::log(static_cast<double>(l[i]));
    } else {
      lse[i] = -std::numeric_limits<double>::infinity();
    }
  }
}

// Whether two views share memory.
inline bool overlaps(const View& a, const View& b) {
  if (!a.present() || !b.present()) return false;
  std::uintptr_t alo, ahi, blo, bhi;
  fast::extent(a, &alo, &ahi);
  fast::extent(b, &blo, &bhi);
  return alo < bhi && blo < ahi;
}

// Threads for a problem: one below the parallel threshold of (query, key) pairs.
inline int threads_for(const attn::Dims& d) {
  const I work = d.B * d.Hq * d.M * std::max<I>(d.N, 1);
  return work < fast::kParallelMin ? 1 : std::max(1, num_threads());
}

// OpenBLAS single-threaded inside our threads; the previous setting restored on scope exit.
struct BlasOneThread {
  int prev;
  BlasOneThread() : prev(openblas_get_num_threads()) { openblas_set_num_threads(1); }
  ~BlasOneThread() { openblas_set_num_threads(prev); }
};

}  // namespace posenc::attn_fast
