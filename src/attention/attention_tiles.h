// Private: the tile machinery the fused attention kernels share (attention_fused_cpu.h for nope,
// the rotary and the bias encodings; attention_xl_cpu.cc; attention_cope_cpu.cc): tile sizes, SIMD
// row helpers (Highway, dispatched at run time, defined in attention_fused_simd.cc), row loads and stores between any-dtype,
// any-stride [B, L, H, D] views and float [n, D] tiles, the online-softmax step, and the OpenBLAS
// threading guard.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>

#include "attention/attention_check.h"
#include "attention/tile_gemm.h"
#include "core/convert.h"
#include "core/fast_common.h"
#include "posenc/half.h"
#include "posenc/view.h"

namespace posenc::attn_fast {

using I = std::int64_t;

constexpr float kNegInfF = -std::numeric_limits<float>::infinity();
constexpr I kBq = 128;  // query rows per tile
constexpr I kBk = 128;  // keys per tile (also the row stride of score tiles)
// The row stride of transposed key tiles (Kᵀ, Vᵀ: the kNP products' operand, tile_gemm.h): kBk and
// 16 more, so that a product's column strip, read down up to 128 rows, does not fall into few L1
// sets (a stride of 512 bytes maps every 8th row to the same sets).
constexpr I kLdt = kBk + 16;
// A backward task sums its G query heads' dQ rows [G, M, D] in a float32 buffer of its own, even
// where a float32 dq could take them in place, while the buffer is at most this size: the tile
// products then walk rows D floats apart, not dq's Hq·D (at 2 KiB a tile's rows share few L1 sets).
// Larger tasks sum in dq itself, so memory at long L stays as it is (docs/performance.md).
constexpr I kDqBufferBytes = I{8} << 20;
inline std::atomic<I> dq_buffer_limit{kDqBufferBytes};  // fused::set_dq_buffer_limit() (tests)
inline bool dq_buffered(I G, I M, I D) { return G * M * D * I{4} <= dq_buffer_limit.load(); }
// The plain backward (no saved statistics) of a unit keeps its score and dP tiles of one query block
// over all its keys, and the unit's dK, dV, K rows and Kᵀ, Vᵀ, where they fit this many bytes a
// thread: it then reads them instead of running the forward first (the stored_ok() of Fused,
// XlFused and Cope).
constexpr I kScoreStoreBytes = I{24} << 20;
inline std::atomic<I> score_store_limit{kScoreStoreBytes};  // fused::set_score_store_limit() (tests)

inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

// An exception cannot leave an OpenMP region (the runtime would end the process). A region's
// allocations run through run(), which records a failure instead of throwing; the region's threads
// then skip their work (every thread still meets each worksharing loop) and the caller, after the
// region, calls rethrow(): std::bad_alloc, which the entry points' callers see as an error.
class RegionGuard {
 public:
  // Runs f; false (and the failure recorded) when it threw.
  template <class F>
  bool run(F&& f) noexcept {
    try {
      f();
      return true;
    } catch (...) {
      failed_.store(true, std::memory_order_relaxed);
      return false;
    }
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  void rethrow() const {
    if (failed()) throw std::bad_alloc();
  }

 private:
  std::atomic<bool> failed_{false};
};

// Row helpers of one SIMD target.
struct Simd {
  // S = exp(S − lse) on row i's first band_reach(i, band, nk) entries (the rest hold zeros), 0 on a
  // row whose lse is −inf, nan_row on a row whose lse is NaN; row stride ld
  void (*exp_rows)(float* S, I nq, I nk, I ld, const float* lse, I band);
  void (*scale)(float* x, std::size_t n, float c);         // x *= c
  void (*add_to)(float* y, const float* x, std::size_t n);  // y += x
  void (*mul_add_to)(float* y, const float* a, const float* x, std::size_t n);  // y += a ⊙ x
  void (*ds_row)(float* p, const float* dp, std::size_t n, float di);  // p = p·(dp − di)
  float (*dot)(const float* a, const float* b, std::size_t n);
  // online_softmax_step below, every row of the tile in one call
  void (*softmax_step)(float* S, I nq, I nk, float* m, float* l, float* o, I D, I band);
  bool (*finite)(const float* x, std::size_t n);     // no NaN or ±inf among x[0, n)
  // the same over `rows` runs of n floats, run r at x + r·stride
  bool (*finite_rows)(const float* x, std::size_t n, std::size_t rows, std::size_t stride);
  bool (*below_inf)(const float* x, std::size_t n);  // every x < +inf: no NaN, no +inf (−inf passes)
  // whether no x[0, n) has all the bits of em set (16-bit floats: em the exponent field, ±inf and NaN)
  bool (*finite16)(const std::uint16_t* x, std::size_t n, std::uint16_t em);
};

// The best target's helpers on this CPU (attention_fused_simd.cc); a kernel fetches them once per call.
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
        if (s3 == 1) fast::widen(src, y, D);  // vector conversions (a scalar float16 one is a libgcc call)
        else for (I e = 0; e < D; ++e) y[e] = to_float(src[e * s3]);
        break;
      }
      default: {  // float16
        const f16* src = static_cast<const f16*>(x.data) + off;
        if (s3 == 1) fast::widen(src, y, D);
        else for (I e = 0; e < D; ++e) y[e] = to_float(src[e * s3]);
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
      if (s3 == 1) fast::narrow(y, dst, D);
      else for (I e = 0; e < D; ++e) dst[e * s3] = to_bf16(y[e]);
      break;
    }
    default: {
      f16* dst = static_cast<f16*>(x.data) + off;
      if (s3 == 1) fast::narrow(y, dst, D);
      else for (I e = 0; e < D; ++e) dst[e * s3] = to_f16(y[e]);
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

// Task `task` of the B·H·nqb query-block tasks in (b, h)-major order, so that the threads share a
// head's keys in cache: its batch row b, head h, and index qi < nqb among its head's blocks.
inline void head_major_task(I task, I nqb, I H, I* b, I* h, I* qi) {
  const I bh = task / nqb;
  *b = bh / H;
  *h = bh % H;
  *qi = task % nqb;
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
// A NaN row: one whose m is NaN (mark_nan_rows below), or whose tile row has a row max of NaN or +inf
// (exp would turn those into 0s, ExpSoftmax in core/simd-inl.h, and the row would pass for a masked
// one), or a row max of −inf with a NaN among the −infs (the max may drop NaNs: it is tested where a
// row is taken for wholly masked, which a row of finite logits never is): it gets m = l = NaN and
// S = 0, and stays so; online_softmax_finish makes it NaN. Per row tests only: a NaN among finite
// logits, which the row max need not show, is left to mark_nan_rows.
inline void online_softmax_step(const Simd& sd, float* S, I nq, I nk, float* m, float* l, float* o,
                                I D, I band = kNoBand) {
  sd.softmax_step(S, nq, nk, m, l, o, D, band);
}

// The end of the online softmax: o /= l, lse = m + log l (−inf, o = 0 for a row with no key; NaN, o
// all NaN for a NaN row).
inline void online_softmax_finish(const Simd& sd, I nq, const float* m, const float* l, float* o,
                                  I D, double* lse) {
  for (I i = 0; i < nq; ++i) {
    if (l[i] > 0) {
      sd.scale(o + i * D, ix(D), 1.f / l[i]);
      lse[i] = static_cast<double>(m[i]) + std::log(static_cast<double>(l[i]));
    } else if (std::isnan(m[i]) || std::isnan(l[i])) {
      std::fill(o + i * D, o + (i + 1) * D, std::numeric_limits<float>::quiet_NaN());
      lse[i] = std::numeric_limits<double>::quiet_NaN();
    } else {
      lse[i] = -std::numeric_limits<double>::infinity();
    }
  }
}

// ---- non-finite inputs ----------------------------------------------------------------------------
// The tile steps above are made for finite inputs: exp maps a NaN logit to 0, as if it were masked,
// and a product of a masked P = 0 or dS = 0 with a NaN or ±inf in q, k, v or dO gives NaN where no
// such term should exist. These careful steps give the reference's result instead (attention_ref.cc):
//   a row with a NaN or +inf logit is a NaN row (mark_nan_rows): out and lse NaN; in the backward its
//     P is NaN on every key it sees and 0 on the rest (nan_row), and it sends NaN to dq, to dk and
//     dv of those keys and to the parameter gradients they feed;
//   the products read q, k, v and dO with their non-finite values replaced by 0 (sanitize_rows), and
//     the terms those values make with a P or dO that is not 0 are added back one by one
//     (add_back_pv, add_back_ptdo); dS is 0 wherever P is (careful_ds). Replacing q or k is exact:
//     a non-finite q_i or k_j makes every logit it enters NaN or ±inf, so its dS is NaN or 0.
// What decides them, so that finite inputs pay little (careful_forward below):
//   forward: a non-finite q_i makes its whole row NaN or ±inf, which the per-row tests of
//     online_softmax_step catch; a non-finite k_j makes only some logits of a row NaN: one pass over
//     k (all_finite) turns mark_nan_rows on, or, where that pass would cost more than the tiles'
//     own work on k (a decode step: G·M < 2·D), mark_nan_rows runs on every tile, one vector test
//     per 16 logits; a non-finite v shows as a row with finite lse and a non-finite out, whose
//     block is then computed again with the sanitized V (a test of D floats per row);
//   backward: a non-finite k or v (the forward's pass over k, else one now; a pass over v) makes
//     every tile careful; otherwise a tile is careful when one of its rows has a non-finite lse or
//     Dᵢ = dOᵢ·outᵢ (pass 1's, per row: careful_rows) — which a non-finite q_i (lse NaN, or −inf
//     though the row sees keys) or dO_i always gives.

// Whether every element of x [B, L, H, D] (a float dtype, any strides) is finite: row by row through
// sd.finite (float32) or the bits (bfloat16, float16); threads > 1 splits the rows of a large x.
inline bool all_finite(const Simd& sd, const View& x, int threads = 1) {
  if (!x.present()) return true;
  if (x.dtype == DType::kF64) {
    const I n = x.numel();
    for (I e = 0; e < n; ++e)
      if (!std::isfinite(x.get(e))) return false;
    return true;
  }
  const I B = x.shape[0], L = x.shape[1], H = x.shape[2], D = x.shape[3], s3 = x.strides[3];
  const I rows = B * L * H;
  if (x.dtype == DType::kF32 && x.is_contiguous()) {  // one run, in pieces over the threads
    const float* p = static_cast<const float*>(x.data);
    const I n = rows * D, piece = I{1} << 16, np = (n + piece - 1) / piece;
    const int th = np > 1 ? threads : 1;
    bool ok = true;
#pragma omp parallel for num_threads(th) schedule(static) reduction(&& : ok) if (th > 1)
    for (I c = 0; c < np; ++c) ok = ok && sd.finite(p + c * piece, ix(std::min(piece, n - c * piece)));
    return ok;
  }
  bool ok = true;
  const int th = rows * D > (I{1} << 16) ? threads : 1;
  const std::uint16_t em = x.dtype == DType::kBF16 ? 0x7f80 : 0x7c00;  // 16-bit: the exponent field
  if (x.dtype != DType::kF32 && x.is_contiguous()) {  // 16-bit, one run, in pieces over the threads
    const auto* p = static_cast<const std::uint16_t*>(x.data);
    const I n = rows * D, piece = I{1} << 16, np = (n + piece - 1) / piece;
#pragma omp parallel for num_threads(th) schedule(static) reduction(&& : ok) if (th > 1)
    for (I c = 0; c < np; ++c) ok = ok && sd.finite16(p + c * piece, ix(std::min(piece, n - c * piece)), em);
    return ok;
  }
  if (x.dtype == DType::kF32 && s3 == 1 && x.strides[2] == D) {  // each token's H·D floats one run
    // one call per batch and chunk of ~2^16 floats' tokens, the chunks over the threads
    const I per = std::max<I>(1, (I{1} << 16) / (H * D)), nc = (L + per - 1) / per;
#pragma omp parallel for num_threads(th) schedule(static) reduction(&& : ok) if (th > 1)
    for (I t = 0; t < B * nc; ++t) {
      const I b = t / nc, l0 = (t % nc) * per;
      ok = ok && sd.finite_rows(static_cast<const float*>(x.data) + b * x.strides[0] + l0 * x.strides[1],
                                ix(H * D), ix(std::min(per, L - l0)), ix(x.strides[1]));
    }
    return ok;
  }
#pragma omp parallel for num_threads(th) schedule(static) reduction(&& : ok) if (th > 1)
  for (I r = 0; r < rows; ++r) {
    if (!ok) continue;
    const I b = r / (L * H), l = (r / H) % L, h = r % H;
    const I off = b * x.strides[0] + l * x.strides[1] + h * x.strides[2];
    if (x.dtype == DType::kF32) {
      const float* y = static_cast<const float*>(x.data) + off;
      if (s3 == 1) {
        ok = sd.finite(y, ix(D));
      } else {
        for (I e = 0; e < D && ok; ++e) ok = std::isfinite(y[e * s3]);
      }
    } else {  // the exponent field all ones: ±inf or NaN
      const std::uint16_t* y = static_cast<const std::uint16_t*>(x.data) + off;
      for (I e = 0; e < D && ok; ++e) ok = (y[e * s3] & em) != em;
    }
  }
  return ok;
}

// n rows of D floats (row stride ld) into y [n, D], a NaN or ±inf replaced by 0; whether there was any.
inline bool sanitize_rows(const float* x, I ld, I n, I D, float* y) {
  bool any = false;
  for (I r = 0; r < n; ++r)
    for (I e = 0; e < D; ++e) {
      const float v = x[r * ld + e];
      const bool ok = std::isfinite(v);
      any = any || !ok;
      y[r * D + e] = ok ? v : 0.f;
    }
  return any;
}

// Marks a NaN row (m = NaN; online_softmax_step then keeps it so) each row of the score tile S
// [nq, kBk] that holds a NaN or +inf among the logits the softmax reads (band_reach).
inline void mark_nan_rows(const Simd& sd, const float* S, I nq, I nk, I band, float* m) {
  for (I i = 0; i < nq; ++i)
    if (!sd.below_inf(S + i * kBk, ix(band_reach(i, band, nk)))) m[i] = std::numeric_limits<float>::quiet_NaN();
}

// A stored backward's first-sweep step (attention_fused_backward_stored.cc and xl's): S [nq, kBk] a
// copy of the kept logits (the step turns it into e^{S − m}), dP the kept dO·Vᵀ; the online softmax's
// m and l, and dsum += Σ_j e^{S_ij − m_i}·dP_ij over each row's visible keys, rescaled as l is (a
// 1-wide out). nan_rows: mark_nan_rows first (CarefulForward::rows).
inline void stored_sweep_step(const Simd& sd, float* S, const float* dP, I nq, I nk, I band, bool nan_rows,
                              float* m, float* l, float* dsum) {
  if (nan_rows) mark_nan_rows(sd, S, nq, nk, band, m);
  online_softmax_step(sd, S, nq, nk, m, l, dsum, 1, band);
  for (I i = 0; i < nq; ++i) dsum[i] += sd.dot(S + i * kBk, dP + i * kBk, ix(std::clamp<I>(i + band + 1, 0, nk)));
}

// The end of a stored backward's first sweep (attention_fused_backward_stored.cc and xl's):
// per row, lse as online_softmax_finish gives it and D = dsum/l, dsum = Σ_j e^{S_ij − m_i}·dP_ij
// rescaled as l is (= rowsum(dO ⊙ out)); NaN for a NaN row; −inf and dsum (0) for a row with no key.
inline void stored_row_stats(I nq, const float* m, const float* l, const float* dsum, float* lse, float* Di) {
  for (I i = 0; i < nq; ++i) {
    if (l[i] > 0) {
      lse[i] = static_cast<float>(static_cast<double>(m[i]) + std::log(static_cast<double>(l[i])));
      Di[i] = dsum[i] / l[i];
    } else if (std::isnan(m[i]) || std::isnan(l[i])) {
      lse[i] = Di[i] = std::numeric_limits<float>::quiet_NaN();
    } else {
      lse[i] = -std::numeric_limits<float>::infinity();
      Di[i] = dsum[i];
    }
  }
}

// How a forward finds its NaN rows (see above): mark_nan_rows on every tile (rows) or, when that is
// off, a pass over k decides it (a non-finite k turns it on). The encodings' tensors are checked
// finite where they are validated (attention_check.h), so they add no NaN of their own.
struct CarefulForward {
  bool rows = false;  // mark_nan_rows on every tile
  bool k_known = false, k_finite = true;  // the pass over k, where it was made
};
inline CarefulForward careful_forward(const Simd& sd, const attn::Dims& d, const View& k, int threads) {
  CarefulForward c;
  if (d.G * d.M < 2 * d.D) {  // the logits' test costs less than a pass over k
    c.rows = true;
  } else {
    c.k_known = true;
    c.k_finite = all_finite(sd, k, threads);
    c.rows = !c.k_finite;
  }
  return c;
}

// Whether row i of o [nq, D] is finite wherever lse[i] is (the rows a non-finite v reached): one test
// of the whole block, row by row only when it fails (NaN rows are NaN by design).
inline bool outputs_finite(const Simd& sd, const float* o, I nq, I D, const double* lse) {
  if (sd.finite(o, ix(nq * D))) return true;
  for (I i = 0; i < nq; ++i)
    if (std::isfinite(lse[i]) && !sd.finite(o + i * D, ix(D))) return false;
  return true;
}

// Whether some row of a backward tile has a non-finite lse or D [n]: then the tile is careful
// (above; a row of a pass-2 tile sees some key of it, so an lse of −inf there means logits of −inf).
inline bool careful_rows(const float* lse, const float* D, I n) {
  for (I i = 0; i < n; ++i)
    if (!std::isfinite(lse[i]) || !std::isfinite(D[i])) return true;
  return false;
}

// P of a NaN row (lse NaN) from its logits S [n]: NaN on every key it sees, 0 where masked (−inf).
inline void nan_row(float* S, I n) {
  for (I j = 0; j < n; ++j) S[j] = S[j] == kNegInfF ? 0.f : std::numeric_limits<float>::quiet_NaN();
}

// p = p·(dp − di) as Simd::ds_row, but 0 wherever p is 0 (whatever dp and di hold).
inline void careful_ds(float* p, const float* dp, I n, float di) {
  for (I j = 0; j < n; ++j) p[j] = p[j] == 0.f ? 0.f : p[j] * (dp[j] - di);
}

// After o [nq, D] (row stride ldo) += P·V' with V' = V [nk, D] (row stride ldv) sanitized: the terms
// of V's non-finite entries, P [nq, kBk] times them where P is not 0.
inline void add_back_pv(const float* P, I nq, const float* V, I ldv, I nk, I D, float* o, I ldo) {
  for (I j = 0; j < nk; ++j)
    for (I e = 0; e < D; ++e) {
      const float v = V[j * ldv + e];
      if (std::isfinite(v)) continue;
      for (I i = 0; i < nq; ++i)
        if (const float p = P[i * kBk + j]; p != 0.f) o[i * ldo + e] += p * v;
    }
}

// After dV [nk, D] += Pᵀ·dO' with dO' = dO [nq, D] (row stride ld) sanitized: the terms of dO's
// non-finite entries, times P [nq, kBk] where it is not 0.
inline void add_back_ptdo(const float* P, I nq, I nk, const float* dO, I ld, I D, float* dV) {
  for (I i = 0; i < nq; ++i)
    for (I e = 0; e < D; ++e) {
      const float g = dO[i * ld + e];
      if (std::isfinite(g)) continue;
      for (I j = 0; j < nk; ++j)
        if (const float p = P[i * kBk + j]; p != 0.f) dV[j * D + e] += p * g;
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

// OpenBLAS single-threaded inside our threads. Its count is process-wide, and calls may run on
// several caller threads at once: the first call in saves the caller's setting and sets 1, the last
// one out restores it (a save and restore per call would leave 1 behind when two overlap).
class BlasOneThread {
 public:
  BlasOneThread() {
    const std::lock_guard<std::mutex> lock(state().mu);
    if (state().users++ == 0) {
      state().saved = openblas_get_num_threads();
      openblas_set_num_threads(1);
    }
  }
  ~BlasOneThread() {
    const std::lock_guard<std::mutex> lock(state().mu);
    if (--state().users == 0) openblas_set_num_threads(state().saved);
  }
  BlasOneThread(const BlasOneThread&) = delete;
  BlasOneThread& operator=(const BlasOneThread&) = delete;

 private:
  struct State {
    std::mutex mu;
    int users = 0, saved = 1;
  };
  static State& state() {
    static State s;
    return s;
  }
};

}  // namespace posenc::attn_fast
