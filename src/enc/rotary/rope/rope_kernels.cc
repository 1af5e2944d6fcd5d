// RoPE's fast kernel (rope_fast.h), per Highway target: every target compiled by foreach_target.h,
// the best supported one chosen at run time; rope_cpu.cc validates a call and builds its job.
//
// The frequencies ω_k and the attention factor a_f are the call's RopeFrequencies (rope_freqs.cc),
// kept from the previous call on this thread while the parameters, r and what the scheme reads of
// the call's length stay the same (a decode step costs no std::pow; dynamic NTK beyond its window
// recomputes them per length, as transformers does).
// Per token (b, l) at position m: the r/2 angles are formed in double (accurate: m·ω_k; hf: the
// float32 product fl32(ω_k·fl32(m)), exact in double) and reduced exactly, their sin/cos evaluated
// once in float (core/simd-inl.h states the bound), scaled by a_f and shared by every head of q and
// k; then each head row [D] is rotated with vector loads:
//   interleaved: y = x·C + swap_pairs(x)·S, C = (c0 c0 c1 c1 …), S = (−s0 s0 −s1 s1 …)
//   half:        y_a = x_a·c − x_b·s, y_b = x_b·c + x_a·s over the two contiguous halves
// (bfloat16: the even and odd elements of a vector, simd-inl.h's pairs, take c and s directly), and
// the pass-through tail r .. D−1 is copied when out of place. With a plan the r/2 angles of a token
// are the plan's (its positions' components times their frequencies, or mixed x·θˣ + y·θʸ, formed
// in double) and the table is scaled per pair by a·ρ (xPos; ρ = ζ^(±(m−c)/s) in double, rounded
// once); mixed's per-head angles make its table per (token, head). The sin/cos of a token cost a few
// percent of its rows (64 angles, ~60 ns with the interleaved expansion, for 64 rows of 128 at the
// benchmark's shape, ~2.5 µs at memory speed), so no recurrence over positions here. Tokens go in
// blocks (kBlockTokens): the tables of a block first, then its rows tensor by tensor. Large outputs
// (fast::kStreamMinBytes), of every dtype, are written with non-temporal stores (whole vectors, 2N
// elements a step; measured choice: run_fast). OpenMP over tokens (B·L); one thread calls the
// kernel directly.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "posenc/rope.h"

#include "enc/rotary/rope/rope_fast.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "enc/rotary/rope/rope_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/fast_common.h"
#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace {

// Tables of one token: c, s [r/2] (pair k's cos and sin), C, S [r] (interleaved expansion, unused
// for bfloat16), and ce, co, se, so [r/4] (c and s at even and odd k: bfloat16, half layout).
struct Trig {
  const float *C, *S, *c, *s, *ce, *co, *se, *so;
};

// One head row: pairs of the first r elements rotated, 2N elements (one 16-bit vector) per step.
// kStream: y (and y + r/2 for the half layout) aligned for StoreF2<true>.
template <bool kStream, typename T>
void RotateRow(const T* x, T* y, bool interleaved, std::int64_t r, const Trig& g) {
  const hn::ScalableTag<float> df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const float* HWY_RESTRICT C = g.C;
  const float* HWY_RESTRICT S = g.S;
  const float* HWY_RESTRICT c = g.c;
  const float* HWY_RESTRICT s = g.s;
  std::int64_t i = 0;
#if POSENC_BF16_PAIRS
  if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {
    // Even elements x_a and odd elements x_b of 2N: interleaved, they are N whole pairs.
    if (interleaved) {
      for (; i + 2 * N <= r; i += 2 * N) {
        hn::Vec<decltype(df)> xa, xb;
        LoadBf16Pairs(df, x + i, &xa, &xb);
        const auto cv = hn::LoadU(df, c + i / 2), sv = hn::LoadU(df, s + i / 2);
        StoreBf16Pairs<kStream>(df, hn::NegMulAdd(xb, sv, hn::Mul(xa, cv)),
                                hn::MulAdd(xa, sv, hn::Mul(xb, cv)), y + i);
      }
      for (; i < r; i += 2) {
        const float xa = ToF(x[i]), xb = ToF(x[i + 1]);
        FromF(xa * c[i / 2] - xb * s[i / 2], y + i);
        FromF(xa * s[i / 2] + xb * c[i / 2], y + i + 1);
      }
      return;
    }
    // Half: pair k is (x_k, x_{h+k}); the even and odd k of 2N take the tables split the same way.
    const std::int64_t h = r / 2;
    for (; i + 2 * N <= h; i += 2 * N) {
      hn::Vec<decltype(df)> ae, ao, be, bo;
      LoadBf16Pairs(df, x + i, &ae, &ao);
      LoadBf16Pairs(df, x + h + i, &be, &bo);
      const auto ce = hn::LoadU(df, g.ce + i / 2), se = hn::LoadU(df, g.se + i / 2);
      const auto co = hn::LoadU(df, g.co + i / 2), so = hn::LoadU(df, g.so + i / 2);
      StoreBf16Pairs<kStream>(df, hn::NegMulAdd(be, se, hn::Mul(ae, ce)),
                              hn::NegMulAdd(bo, so, hn::Mul(ao, co)), y + i);
      StoreBf16Pairs<kStream>(df, hn::MulAdd(ae, se, hn::Mul(be, ce)),
                              hn::MulAdd(ao, so, hn::Mul(bo, co)), y + h + i);
    }
    for (; i < h; ++i) {
      const float xa = ToF(x[i]), xb = ToF(x[h + i]);
      FromF(xa * c[i] - xb * s[i], y + i);
      FromF(xa * s[i] + xb * c[i], y + h + i);
    }
    return;
  }
#endif
  if (interleaved) {
#if HWY_TARGET != HWY_SCALAR
    for (; i + 2 * N <= r; i += 2 * N) {
      hn::Vec<decltype(df)> v0, v1;
      LoadF2(df, x + i, &v0, &v1);
      const auto o0 =
          hn::MulAdd(hn::Shuffle2301(v0), hn::LoadU(df, S + i), hn::Mul(v0, hn::LoadU(df, C + i)));
      const auto o1 = hn::MulAdd(hn::Shuffle2301(v1), hn::LoadU(df, S + i + N),
                                 hn::Mul(v1, hn::LoadU(df, C + i + N)));
      StoreF2<kStream>(df, o0, o1, y + i);
    }
    for (; i + N <= r; i += N) {
      const auto v = LoadF(df, x + i);
      StoreF(df,
             hn::MulAdd(hn::Shuffle2301(v), hn::LoadU(df, S + i), hn::Mul(v, hn::LoadU(df, C + i))),
             y + i);
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
  for (; i + 2 * N <= h; i += 2 * N) {
    hn::Vec<decltype(df)> a0, a1, b0, b1;
    LoadF2(df, x + i, &a0, &a1);
    LoadF2(df, x + h + i, &b0, &b1);
    const auto c0 = hn::LoadU(df, c + i), s0 = hn::LoadU(df, s + i);
    const auto c1 = hn::LoadU(df, c + i + N), s1 = hn::LoadU(df, s + i + N);
    StoreF2<kStream>(df, hn::NegMulAdd(b0, s0, hn::Mul(a0, c0)),
                     hn::NegMulAdd(b1, s1, hn::Mul(a1, c1)), y + i);
    StoreF2<kStream>(df, hn::MulAdd(a0, s0, hn::Mul(b0, c0)), hn::MulAdd(a1, s1, hn::Mul(b1, c1)),
                     y + h + i);
  }
  for (; i + N <= h; i += N) {
    const auto xa = LoadF(df, x + i), xb = LoadF(df, x + h + i);
    const auto cv = hn::LoadU(df, c + i), sv = hn::LoadU(df, s + i);
    StoreF(df, hn::NegMulAdd(xb, sv, hn::Mul(xa, cv)), y + i);
    StoreF(df, hn::MulAdd(xa, sv, hn::Mul(xb, cv)), y + h + i);
  }
  for (; i < h; ++i) {
    const float xa = ToF(x[i]), xb = ToF(x[h + i]);
    FromF(xa * c[i] - xb * s[i], y + i);
    FromF(xa * s[i] + xb * c[i], y + h + i);
  }
}

// Per-token trig tables: s, c [r/2] and their expansions (C, S [r] for the interleaved float
// rotation; ce, co, se, so [r/4 + 1] for bfloat16's half layout), with scratch for the reduction.
struct TrigBuf {
  std::int64_t half = 0, r = 0;
  // Aligned, so that the tables' vector loads stay within cache lines (unaligned, each C and S load
  // of the interleaved rotation straddled two).
  alignas(64) float stack_buf[2048];
  double stack_ang[512];
  std::vector<float> heap_buf;
  std::vector<double> heap_ang;
  float *red, *quad, *s, *c, *C, *S, *ce, *co, *se, *so;
  double* ang;
  TrigBuf(std::int64_t half_, std::int64_t r_) : half(half_), r(r_) {
    const std::int64_t need = 4 * half + 2 * r + 4 * (half / 2 + 1);
    if (need > 2048) heap_buf.resize(static_cast<std::size_t>(need));
    if (2 * half > 512) heap_ang.resize(static_cast<std::size_t>(2 * half));
    red = need > 2048 ? heap_buf.data() : stack_buf;
    quad = red + half;
    point(quad + half);
    ang = 2 * half > 512 ? heap_ang.data() : stack_ang;
  }
  // Floats of one token's tables (s, c, C, S, ce, co, se, so), rounded up to whole cache lines.
  std::int64_t table_floats() const { return (2 * half + 2 * r + 4 * (half / 2 + 1) + 15) / 16 * 16; }
  // Places the tables (s .. so) at base: TrigBuf's own buffer, or a slot of a block of tokens.
  void point(float* base) {
    s = base;
    c = s + half;
    C = c + half;
    S = C + r;
    ce = S + r;
    co = ce + half / 2 + 1;
    se = co + half / 2 + 1;
    so = se + half / 2 + 1;
  }
  Trig trig() const { return Trig{C, S, c, s, ce, co, se, so}; }
  // The expansions RotateRow reads for storage T and the layout.
  void expand(bool interleaved, bool pairs) {
    if (interleaved && !pairs) {
      std::int64_t k = 0;
#if HWY_TARGET != HWY_SCALAR
      // A vector at a time: C is c with each lane doubled (lanes 0 .. N/2−1, then N/2 .. N−1), S
      // the same of s with its even lanes negated.
      const hn::ScalableTag<float> df;
      const hn::RebindToSigned<decltype(df)> di;
      const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
      const auto lo = hn::IndicesFromVec(df, hn::ShiftRight<1>(hn::Iota(di, 0)));
      const auto hi = hn::IndicesFromVec(df, hn::ShiftRight<1>(hn::Iota(di, static_cast<std::int32_t>(N))));
      for (; k + N <= half; k += N) {
        const auto cv = hn::LoadU(df, c + k), sv = hn::LoadU(df, s + k), nv = hn::Neg(sv);
        hn::StoreU(hn::TableLookupLanes(cv, lo), df, C + 2 * k);
        hn::StoreU(hn::TableLookupLanes(cv, hi), df, C + 2 * k + N);
        hn::StoreU(hn::OddEven(hn::TableLookupLanes(sv, lo), hn::TableLookupLanes(nv, lo)), df, S + 2 * k);
        hn::StoreU(hn::OddEven(hn::TableLookupLanes(sv, hi), hn::TableLookupLanes(nv, hi)), df, S + 2 * k + N);
      }
#endif
      for (; k < half; ++k) {
        C[2 * k] = C[2 * k + 1] = c[k];
        S[2 * k] = -s[k];
        S[2 * k + 1] = s[k];
      }
    }
    if (!interleaved && pairs) {
      for (std::int64_t k = 0; k + 1 < half; k += 2) {
        ce[k / 2] = c[k];
        co[k / 2] = c[k + 1];
        se[k / 2] = s[k];
        so[k / 2] = s[k + 1];
      }
    }
  }
  // s, c of a plan's token (position components p, head h): angles sign·φ_k in double, the exact-angle
  // sincos, times a·ρ_k.
  void plan_trig(const rotary::Plan& pl, const std::int64_t* p, std::int64_t h, double sign, int role) {
    for (std::int64_t k = 0; k < half; ++k) ang[k] = sign * pl.angle(p, k, h);
    SinCosRow(1.0, ang, static_cast<std::size_t>(half), red, quad, s, c);
    if (pl.scaled() || pl.factor != 1.0)
      for (std::int64_t k = 0; k < half; ++k) {
        const float f = static_cast<float>(pl.scale(p[0], k, role));
        s[k] *= f;
        c[k] *= f;
      }
  }
};

// Tokens whose tables are formed together before their rows are rotated, one tensor after the
// other: q's rows of the block, then k's. In a stand-alone loop of the same rotation (one thread,
// q and k [1, 4096, 32, 128] float32 out of place, alternating rounds in one process), walking q and
// k a token at a time (four streams in flight) ran at 16–19 GB/s in phases of this VM, seconds
// long, where walking all of q and then all of k ran at 23–26 (means over the slow rounds of 14
// runs). Blocks of 16 tokens (q's 256 KiB, then k's) keep two streams at a time; a block's tables
// take 16 slots of TrigBuf::table_floats() (36 KiB at r = 128), capped at kBlockFloats for very
// wide heads.
constexpr std::int64_t kBlockTokens = 16;
constexpr std::int64_t kBlockFloats = std::int64_t{1} << 16;

template <typename T>
void RopeImpl(const rope_fast::Job& j) {
  const std::int64_t half = j.r / 2, r = j.r;
  const hn::ScalableTag<float> df;
  constexpr bool kPairs = POSENC_BF16_PAIRS && std::is_same_v<T, hwy::bfloat16_t>;
  const rotary::Plan* pl = j.plan;
  const bool per_head = pl && pl->per_head();
  const std::int64_t A = pl ? pl->axes : 1;
  fast::parallel_ranges(j.B * j.L, j.threads, [&](std::int64_t t0, std::int64_t t1) {
    // On the stack for common sizes (TrigBuf); a block's tables in a buffer each thread keeps.
    TrigBuf tb(half, r);
    float* const own = tb.s;
    const std::int64_t slot = tb.table_floats();
    const std::int64_t nb =
        per_head ? 1 : std::max<std::int64_t>(1, std::min({kBlockTokens, t1 - t0, kBlockFloats / slot}));
    float* slots = nullptr;
    if (nb > 1) {
      static thread_local std::vector<float> block;
      block.resize(static_cast<std::size_t>(nb * slot + 16));
      const auto a = reinterpret_cast<std::uintptr_t>(block.data());
      slots = reinterpret_cast<float*>((a + 63) & ~std::uintptr_t{63});
    }
    const auto table = [&](std::int64_t i) { tb.point(slots ? slots + i * slot : own); };
    std::int64_t p[3] = {0, 0, 0};
    for (std::int64_t u0 = t0; u0 < t1; u0 += nb) {
      const std::int64_t u1 = std::min(u0 + nb, t1);
      for (std::int64_t t = u0; t < u1; ++t) {
        table(t - u0);
        const std::int64_t b = t / j.L, l = t % j.L;
        if (pl) {
          for (std::int64_t a = 0; a < A; ++a) p[a] = j.pos[(b * A + a) * j.L + l];
          if (!per_head) {
            tb.plan_trig(*pl, p, 0, j.sign, j.role);
            tb.expand(j.interleaved, kPairs);
          }
        } else {
          if (j.hf) {
            // transformers' angle: the float32 product of ω_k (a float32 value) and the float32
            // position, formed exactly in double and rounded once to float32.
            const double fm = static_cast<double>(static_cast<float>(j.pos[t]));
            for (std::int64_t k = 0; k < half; ++k)
              tb.ang[k] = j.sign * static_cast<double>(static_cast<float>(fm * j.inv[k]));
            SinCosRow(1.0, tb.ang, static_cast<std::size_t>(half), tb.red, tb.quad, tb.s, tb.c);
          } else {
            SinCosRow(j.sign * static_cast<double>(j.pos[t]), j.inv, static_cast<std::size_t>(half), tb.red,
                      tb.quad, tb.s, tb.c);
          }
          if (j.scale != 1.0f)
            for (std::int64_t k = 0; k < half; ++k) {
              tb.s[k] *= j.scale;
              tb.c[k] *= j.scale;
            }
          tb.expand(j.interleaved, kPairs);
        }
      }
      for (int ti = 0; ti < j.nt; ++ti) {
        const rope_fast::Tensor& tn = j.t[ti];
        for (std::int64_t t = u0; t < u1; ++t) {
          table(t - u0);
          const Trig g = tb.trig();
          const std::int64_t b = t / j.L, l = t % j.L;
          const T* xb = static_cast<const T*>(tn.in) + b * tn.is[0] + l * tn.is[1];
          T* yb = static_cast<T*>(tn.out) + b * tn.os[0] + l * tn.os[1];
          for (std::int64_t hh = 0; hh < tn.H; ++hh) {
            if (per_head) {  // mixed (one token a block, p its position): the angles of this head
              tb.plan_trig(*pl, p, hh, j.sign, j.role);
              tb.expand(j.interleaved, kPairs);
            }
            const T* x = xb + hh * tn.is[2];
            T* y = yb + hh * tn.os[2];
            const bool st =
                j.stream && StreamAligned(df, y) && (j.interleaved || StreamAligned(df, y + half));
            if (st)
              RotateRow<true>(x, y, j.interleaved, r, g);
            else
              RotateRow<false>(x, y, j.interleaved, r, g);
            if (tn.D > r && static_cast<const void*>(x) != static_cast<const void*>(y))
              std::memcpy(y + r, x + r, static_cast<std::size_t>(tn.D - r) * sizeof(T));
          }
        }
      }
    }
    if (j.stream) hwy::FlushStream();  // each thread fences its own non-temporal stores
  });
}

// Mixed 2D RoPE's frequency gradient over the tokens of job j (one tensor: t[0].in = x, t[0].out
// unused; dy with x's strides in dyv): per (token, head), y = R(φ)x in float (the forward), then
// ∂L/∂φ_k = g_b·y_a − g_a·y_b (rope2d_math.h) added, times x and times y, into part[thread]
// [2, H, r/2] (double).
template <typename T>
void MixedGradImpl(const rope_fast::Job& j, const T* dy_base, const std::int64_t* ds,
                   std::vector<std::vector<double>>* part) {
  const std::int64_t half = j.r / 2, r = j.r;
  const rotary::Plan& pl = *j.plan;
  const rope_fast::Tensor& tn = j.t[0];
  const std::int64_t H = tn.H;
  fast::parallel_ranges(j.B * j.L, j.threads, [&](std::int64_t t0, std::int64_t t1) {
    std::vector<double>& acc = (*part)[static_cast<std::size_t>(j.threads > 1 ? omp_get_thread_num() : 0)];
    TrigBuf tb(half, r);
    const Trig g = tb.trig();
    std::vector<float> xf(static_cast<std::size_t>(r)), yf(static_cast<std::size_t>(r)), gf(static_cast<std::size_t>(r));
    std::int64_t p[3] = {0, 0, 0};
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t b = t / j.L, l = t % j.L;
      p[0] = j.pos[(b * 2 + 0) * j.L + l];
      p[1] = j.pos[(b * 2 + 1) * j.L + l];
      const double px = static_cast<double>(p[0]), py = static_cast<double>(p[1]);
      for (std::int64_t hh = 0; hh < H; ++hh) {
        tb.plan_trig(pl, p, hh, 1.0, 1);
        tb.expand(j.interleaved, false);
        const T* x = static_cast<const T*>(tn.in) + b * tn.is[0] + l * tn.is[1] + hh * tn.is[2];
        const T* dy = dy_base + b * ds[0] + l * ds[1] + hh * ds[2];
        for (std::int64_t e = 0; e < r; ++e) {
          xf[static_cast<std::size_t>(e)] = ToF(x[e]);
          gf[static_cast<std::size_t>(e)] = ToF(dy[e]);
        }
        RotateRow<false>(xf.data(), yf.data(), j.interleaved, r, g);
        double* ax = acc.data() + hh * half;
        double* ay = acc.data() + (H + hh) * half;
        for (std::int64_t k = 0; k < half; ++k) {
          const std::int64_t ia = j.interleaved ? 2 * k : k, ib = j.interleaved ? 2 * k + 1 : k + half;
          const double d = rope2d::dphi(yf[static_cast<std::size_t>(ia)], yf[static_cast<std::size_t>(ib)],
                                        gf[static_cast<std::size_t>(ia)], gf[static_cast<std::size_t>(ib)]);
          ax[k] += px * d;
          ay[k] += py * d;
        }
      }
    }
  });
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

void MixedGradRun(const rope_fast::Job& j, const void* dy, const std::int64_t* ds,
                  std::vector<std::vector<double>>* part) {
  switch (j.dtype) {
    case DType::kF32: MixedGradImpl<float>(j, static_cast<const float*>(dy), ds, part); break;
    case DType::kBF16: MixedGradImpl<hwy::bfloat16_t>(j, static_cast<const hwy::bfloat16_t*>(dy), ds, part); break;
    case DType::kF16: MixedGradImpl<hwy::float16_t>(j, static_cast<const hwy::float16_t*>(dy), ds, part); break;
    default: break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posenc {
HWY_EXPORT(RopeRun);
HWY_EXPORT(MixedGradRun);

void rope_fast::run(const Job& j) { HWY_DYNAMIC_DISPATCH(RopeRun)(j); }

void rope_fast::mixed_grad(const Job& j, const void* dy, const std::int64_t* ds, std::vector<std::vector<double>>* part) {
  HWY_DYNAMIC_DISPATCH(MixedGradRun)(j, dy, ds, part);
}
}  // namespace posenc
#endif  // HWY_ONCE
