// The fused (flash-style) attention: the public posenc::attention_forward / attention_backward
// dispatch here.
//
// Validation is shared with the reference (attention_check.h), so errors are identical. The fused
// kernels run nope, rope, alibi (symmetric, nonsymmetric, learned) and t5 on float32, bfloat16 and
// float16 q/k/v (any strides; tiles are converted to float32 on load, outputs rounded once on store).
// xl, cope, float64 inputs, outputs that overlap an input, and small problems (fewer than 2^14
// (query, key) pairs over batch and heads: as fast there, and exact) fall back to posenc::reference
// (attention_ref.cc, double accumulation) — the same function the tests compare against. The kernels
// themselves, without the small-problem rule, are posenc::fused:: (attention_fused.h) for the tests.
//
// Shape letters: B batch, M queries, N keys, Hq query heads, Hkv kv heads (G = Hq/Hkv), D head dim;
// Bq × Bk the tile. Query i sits at qp = q_off + i, key j at kp = k_off + j.
//
// ---- forward, per task (b, h, query block of Bq rows), OpenMP dynamic over B·Hq·⌈M/Bq⌉ -------------
//   Q [Bq, D] loaded (rope: rotated by R(qp), angles in double, cos/sin tabulated once per call);
//   for each key block not wholly masked (causal / nonsymmetric ALiBi give the key range):
//     K, V [Bk, D] loaded (rope: K rotated by R(kp));
//     S [Bq, Bk] = scale·Q·Kᵀ (cblas_sgemm);
//     + bias: it depends on kp − qp only, so the tile's Bq + Bk − 1 distinct values are computed once
//       (ALiBi −m·|Δ|, learned −σ(w)·|Δ| per side, T5 W[bucket(Δ), h]) and row i adds a contiguous
//       slice of that diagonal array;
//     mask (−inf), online softmax: m' = max(m, rowmax S); P = exp(S − m'); l = l·e^{m−m'} + ΣP;
//     O = O·e^{m−m'} + P·V (cblas_sgemm);
//   out = O / l, lse = m + log l (−inf and out = 0 for a row with every key masked).
//   Memory: O((Bq + Bk)·D + Bq·Bk) per thread, plus rope's cos/sin table O((M + N)·r).
//
// ---- backward (FlashAttention-2, recompute) ----------------------------------------------------------
//   pass 1, per (b, h, query block): the forward above gives out and lse; Dᵢ = dOᵢ·outᵢ. Kept: lse, D
//     [B, Hq, M] (float32), nothing else.
//   pass 2, per (b, kv head) — one task owns its kv head's dK, dV and its G query heads' dQ, so nothing
//     races (parallelism is B·Hkv tasks: a single kv head runs on one thread): for each key block, for each of its query heads and query blocks not wholly masked:
//       S = scale·Q·Kᵀ + bias, P = exp(S − lse);  dP = dO·Vᵀ;  dV += Pᵀ·dO;  dS = P ⊙ (dP − D);
//       dK += scale·dSᵀ·Q;  dQ += scale·dS·K  (dQ accumulated in float32 [G, M, D] for the task);
//     parameter gradients from the tile's diagonal sums Σ_{j−i = t} dS (t5: dW[bucket, h]; learned
//     ALiBi: dw[side, h] += Σ dS·(−σ(1−σ)|Δ|)), per (b, h) in double, summed over b at the end;
//     rope: dQ, dK rotated back by R(−pos) on store.
//
// OpenBLAS is called from inside the OpenMP threads with its own threading set to 1 for the call
// (restored after). SIMD row helpers (max, exp, scale, add) are Highway, every target compiled, the
// best chosen at run time.
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/attention_tiles.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/attention_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float RowMax(const float* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  auto m = hn::Set(d, -HUGE_VALF);
  std::size_t i = 0;
  for (; i + L <= n; i += L) m = hn::Max(m, hn::LoadU(d, x + i));
  float r = hn::GetLane(hn::MaxOfLanes(d, m));
  for (; i < n; ++i) r = x[i] > r ? x[i] : r;
  return r;
}

float ExpSubSum(float* HWY_RESTRICT x, std::size_t n, float mx) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  const auto vm = hn::Set(d, mx);
  auto s = hn::Zero(d);
  std::size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vm));
    hn::StoreU(e, d, x + i);
    s = hn::Add(s, e);
  }
  if (i < n) {  // tail through a padded buffer (−inf pads give 0)
    HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)];
    for (std::size_t t = 0; t < L; ++t) buf[t] = i + t < n ? x[i + t] : -HUGE_VALF;
    const auto e = hn::Exp(d, hn::Sub(hn::Load(d, buf), vm));
    hn::Store(e, d, buf);
    s = hn::Add(s, e);
    for (std::size_t t = 0; i + t < n; ++t) x[i + t] = buf[t];
  }
  return hn::GetLane(hn::SumOfLanes(d, s));
}

void ScaleRow(float* HWY_RESTRICT x, std::size_t n, float c) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  const auto vc = hn::Set(d, c);
  std::size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vc), d, x + i);
  for (; i < n; ++i) x[i] *= c;
}

void AddTo(float* HWY_RESTRICT y, const float* HWY_RESTRICT x, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Add(hn::LoadU(d, y + i), hn::LoadU(d, x + i)), d, y + i);
  for (; i < n; ++i) y[i] += x[i];
}

void DsRow(float* HWY_RESTRICT p, const float* HWY_RESTRICT dp, std::size_t n, float di) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  const auto vd = hn::Set(d, di);
  std::size_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::Mul(hn::LoadU(d, p + i), hn::Sub(hn::LoadU(d, dp + i), vd)), d, p + i);
  for (; i < n; ++i) p[i] *= dp[i] - di;
}

float Dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  auto s = hn::Zero(d);
  std::size_t i = 0;
  for (; i + L <= n; i += L) s = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s);
  float r = hn::GetLane(hn::SumOfLanes(d, s));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

attn_fast::Simd GetSimd() {
  return attn_fast::Simd{&RowMax, &ExpSubSum, &ScaleRow, &AddTo, &DsRow, &Dot};
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>

#include "attention/attention_check.h"
#include "attention/attention_fused.h"
#include "core/fast_common.h"
#include "enc/alibi/alibi_math.h"
#include "enc/rope/rope_math.h"
#include "enc/t5/t5_math.h"
#include "posenc/attention.h"
#include "posenc/half.h"
#include "posenc/threads.h"

namespace posenc {
HWY_EXPORT(GetSimd);

// Not cached: the tests switch targets (hwy::SetSupportedTargetsForTest) between calls.
attn_fast::Simd attn_fast::simd() { return HWY_DYNAMIC_DISPATCH(GetSimd)(); }

namespace {

using attn::Dims;
using namespace attn_fast;  // NOLINT: the shared tile machinery

// cos/sin of every position in [p0, p0 + n) for the r/2 rotary frequencies, float, from double angles.
struct RopeTab {
  I p0 = 0, n = 0, half = 0;
  std::vector<float> c, s;  // [n, half]
  void build(I first, I count, I r, double theta, int threads) {
    p0 = first;
    n = count;
    half = r / 2;
    c.assign(ix(n * half), 0.f);
    s.assign(ix(n * half), 0.f);
    std::vector<double> inv(ix(half));
    for (I k = 0; k < half; ++k) inv[ix(k)] = rope::inv_freq(k, r, theta);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (I t = 0; t < n; ++t)
      for (I k = 0; k < half; ++k) {
        const double a = static_cast<double>(p0 + t) * inv[ix(k)];
        c[ix(t * half + k)] = static_cast<float>(std::cos(a));
        s[ix(t * half + k)] = static_cast<float>(std::sin(a));
      }
  }
};

// Per-thread scratch.
struct Scratch {
  std::vector<float> q, k, v, s, dp, o, dout, dk, dv, ml, diag, dq;
  void init(I D) {
    q.resize(ix(kBq * D));
    k.resize(ix(kBk * D));
    v.resize(ix(kBk * D));
    s.resize(ix(kBq * kBk));
    o.resize(ix(kBq * D));
    ml.resize(ix(2 * kBq));
    diag.resize(ix(kBq + kBk));
  }
  void init_backward(I D) {
    dp.resize(ix(kBq * kBk));
    dout.resize(ix(kBq * D));
    dk.resize(ix(kBk * D));
    dv.resize(ix(kBk * D));
  }
};

class Fused {
 public:
  Fused(const AttentionParams& p, const Dims& d, const View& q, const View& k, const View& v,
        const EncodingTensors& t, int threads)
      : p_(p), d_(d), q_(q), k_(k), v_(v), threads_(threads),
        simd_(simd()) {
    const I Hq = d.Hq;
    if (p.encoding == Encoding::kRope) {
      rope_ = true;
      interleaved_ = p.rope.layout == RopeLayout::kInterleaved;
      // One table over both position ranges when they overlap or abut closely, else two.
      const I lo = std::min(d.q_off, d.k_off), hi = std::max(d.q_off + d.M, d.k_off + d.N);
      if (hi - lo <= d.M + d.N) {
        tab_q_.build(lo, hi - lo, d.rdim, p.rope.theta, threads);
        tq_ = tk_ = &tab_q_;
      } else {
        tab_q_.build(d.q_off, d.M, d.rdim, p.rope.theta, threads);
        tab_k_.build(d.k_off, d.N, d.rdim, p.rope.theta, threads);
        tq_ = &tab_q_;
        tk_ = &tab_k_;
      }
    }
    if (p.encoding == Encoding::kAlibi) {
      const AlibiVariant var = p.alibi.variant;
      nonsym_ = var == AlibiVariant::kNonsymmetric;
      if (var == AlibiVariant::kLearned) {
        bias_ = Bias::kLearned;
        const std::vector<double> w = to_doubles(t.weights);  // [2, Hq]
        sig_.resize(ix(2 * Hq));
        for (I i = 0; i < 2 * Hq; ++i) sig_[ix(i)] = alibi::sigmoid(w[ix(i)]);
      } else {
        bias_ = Bias::kSlopes;
        if (t.slopes.present()) {
          slopes_ = to_doubles(t.slopes);
        } else {
          slopes_ = alibi::rule_slopes(Hq, nonsym_);
        }
      }
    }
    if (p.encoding == Encoding::kT5) {
      bias_ = Bias::kT5;
      t5w_ = to_doubles(t.weights);  // [nb, Hq]
    }
  }

  // Forward over every (b, h, query block); out [B, M, Hq, D], lse optional [B, Hq, M] float64.
  void forward(const View& out, const View& lse) const {
    const I nqb = (d_.M + kBq - 1) / kBq, per = d_.B * d_.Hq, tasks = per * nqb;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
    {
      Scratch w;
      w.init(d_.D);
      std::vector<double> l(ix(kBq));
#pragma omp for schedule(dynamic, 1)
      for (I task = 0; task < tasks; ++task) {
        // Later query blocks (more keys when causal) first.
        const I qb = nqb - 1 - task / per, bh = task % per, b = bh / d_.Hq, h = bh % d_.Hq;
        const I q0 = qb * kBq, nq = std::min(kBq, d_.M - q0);
        forward_block(b, h, q0, nq, &w, w.o.data(), l.data());
        store_rows(out, b, q0, nq, h, w.o.data(), nullptr, 0);
        if (lse.present()) {
          double* base = static_cast<double*>(lse.data);
          for (I i = 0; i < nq; ++i)
            base[b * lse.strides[0] + h * lse.strides[1] + (q0 + i) * lse.strides[2]] = l[ix(i)];
        }
      }
    }
  }

  // Backward. dq, dk, dv optional (absent: computed, not stored); dweights optional.
  void backward(const View& dout, const View& dq, const View& dk, const View& dv,
                const View& dweights) const {
    const I B = d_.B, M = d_.M, N = d_.N, Hq = d_.Hq, D = d_.D, G = d_.G;
    // pass 1: lse and D = rowsum(dO ⊙ out), [B, Hq, M]
    std::vector<float> lse(ix(B * Hq * M)), Dv(ix(B * Hq * M));
    const I nqb = (M + kBq - 1) / kBq, per = B * Hq;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
    {
      Scratch w;
      w.init(D);
      w.init_backward(D);
      std::vector<double> l(ix(kBq));
#pragma omp for schedule(dynamic, 1)
      for (I task = 0; task < per * nqb; ++task) {
        const I qb = nqb - 1 - task / per, bh = task % per, b = bh / Hq, h = bh % Hq;
        const I q0 = qb * kBq, nq = std::min(kBq, M - q0);
        forward_block(b, h, q0, nq, &w, w.o.data(), l.data());
        load_rows(dout, b, q0, nq, h, w.dout.data(), nullptr, 0);
        for (I i = 0; i < nq; ++i) {
          const std::size_t at = ix((b * Hq + h) * M + q0 + i);
          lse[at] = static_cast<float>(l[ix(i)]);
          Dv[at] = simd_.dot(&w.dout[ix(i * D)], &w.o[ix(i * D)], ix(D));
        }
      }
    }
    // pass 2: per (b, kv head)
    const I npar = bias_ == Bias::kT5 ? p_.t5.num_buckets : bias_ == Bias::kLearned ? 2 : 0;
    std::vector<double> gw(ix(B * Hq * npar), 0.0);  // [B, Hq, npar]
    const I kvtasks = B * d_.Hkv;
    const float sc = static_cast<float>(d_.scale);
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
    {
      Scratch w;
      w.init(D);
      w.init_backward(D);
#pragma omp for schedule(dynamic, 1)
      for (I task = 0; task < kvtasks; ++task) {
        const I b = task / d_.Hkv, kh = task % d_.Hkv;
        w.dq.assign(ix(G * M * D), 0.f);
        for (I j0 = 0; j0 < N; j0 += kBk) {
          const I nk = std::min(kBk, N - j0), kp0 = d_.k_off + j0;
          load_rows(k_, b, j0, nk, kh, w.k.data(), tk_, d_.k_off);
          load_rows(v_, b, j0, nk, kh, w.v.data(), nullptr, 0);
          std::fill(w.dk.begin(), w.dk.begin() + nk * D, 0.f);
          std::fill(w.dv.begin(), w.dv.begin() + nk * D, 0.f);
          for (I g = 0; g < G; ++g) {
            const I h = kh * G + g;
            I ilo = 0, ihi = M;
            if (past_only(h)) ilo = std::clamp<I>(kp0 - d_.q_off, 0, M);
            if (future_only(h)) ihi = std::clamp<I>(kp0 + nk - 1 - d_.q_off + 1, 0, M);
            double* gwh = npar ? &gw[ix((b * Hq + h) * npar)] : nullptr;
            for (I i0 = ilo; i0 < ihi; i0 += kBq) {
              const I nq = std::min(kBq, ihi - i0);
              load_rows(q_, b, i0, nq, h, w.q.data(), tq_, d_.q_off);
              load_rows(dout, b, i0, nq, h, w.dout.data(), nullptr, 0);
              float* S = w.s.data();
              float* dP = w.dp.data();
              logits(h, i0, nq, j0, nk, &w);
              const float* L = &lse[ix((b * Hq + h) * M + i0)];
              const float* Di = &Dv[ix((b * Hq + h) * M + i0)];
              for (I i = 0; i < nq; ++i) {
                float* Si = S + i * kBk;
                if (L[i] == kNegInfF) std::fill(Si, Si + nk, 0.f);
                else simd_.exp_sub_sum(Si, ix(nk), L[i]);
              }
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(nq), int(nk), int(D), 1.f,
                          w.dout.data(), int(D), w.v.data(), int(D), 0.f, dP, int(kBk));
              cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(nk), int(D), int(nq), 1.f, S,
                          int(kBk), w.dout.data(), int(D), 1.f, w.dv.data(), int(D));
              for (I i = 0; i < nq; ++i) simd_.ds_row(S + i * kBk, dP + i * kBk, ix(nk), Di[i]);
              if (npar) param_grads(h, kp0 - (d_.q_off + i0), nq, nk, S, w.diag.data(), gwh);
              cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(nk), int(D), int(nq), sc, S,
                          int(kBk), w.q.data(), int(D), 1.f, w.dk.data(), int(D));
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(nq), int(D), int(nk), sc, S,
                          int(kBk), w.k.data(), int(D), 1.f, &w.dq[ix((g * M + i0) * D)], int(D));
            }
          }
          if (dk.present()) store_rows(dk, b, j0, nk, kh, w.dk.data(), tk_, d_.k_off);
          if (dv.present()) store_rows(dv, b, j0, nk, kh, w.dv.data(), nullptr, 0);
        }
        if (dq.present())
          for (I g = 0; g < G; ++g)
            store_rows(dq, b, 0, M, kh * G + g, &w.dq[ix(g * M * D)], tq_, d_.q_off);
      }
    }
    if (dweights.present()) {  // [npar, Hq], summed over the batch
      for (I r = 0; r < npar; ++r)
        for (I h = 0; h < Hq; ++h) {
          double s = 0;
          for (I b = 0; b < B; ++b) s += gw[ix((b * Hq + h) * npar + r)];
          dweights.set(r * Hq + h, s);
        }
    }
  }

 private:
  enum class Bias { kNone, kSlopes, kLearned, kT5 };

  bool past_only(I h) const { return p_.causal || (nonsym_ && h < d_.Hq / 2); }
  bool future_only(I h) const { return nonsym_ && h >= d_.Hq / 2; }

  // Rows [r0, r0 + n) of head `head` of x [B, L, H, D] into dst [n, D] as float; rope tables rotate
  // by R(pos) (pos = pos0 + row).
  void load_rows(const View& x, I b, I r0, I n, I head, float* dst, const RopeTab* tab, I pos0) const {
    attn_fast::load_rows(x, d_.D, b, r0, n, head, dst);
    if (tab)
      for (I r = 0; r < n; ++r) rotate(dst + r * d_.D, *tab, pos0 + r0 + r, +1.f);
  }

  // src [n, D] into rows [r0, r0 + n) of head `head` of x, rotated by R(−pos) when tab is given
  // (the gradient of a rotated input). src is left unchanged.
  void store_rows(const View& x, I b, I r0, I n, I head, const float* src, const RopeTab* tab,
                  I pos0) const {
    const I D = d_.D;
    if (!tab) return attn_fast::store_rows(x, D, b, r0, n, head, src);
    std::vector<float> tmp(ix(D));
    for (I r = 0; r < n; ++r) {
      std::memcpy(tmp.data(), src + r * D, ix(D) * sizeof(float));
      rotate(tmp.data(), *tab, pos0 + r0 + r, -1.f);
      store_row(x, D, b, r0 + r, head, tmp.data());
    }
  }

  void rotate(float* x, const RopeTab& tab, I pos, float dir) const {
    const float* c = &tab.c[ix((pos - tab.p0) * tab.half)];
    const float* s = &tab.s[ix((pos - tab.p0) * tab.half)];
    const I half = tab.half;
    if (interleaved_) {
      for (I kk = 0; kk < half; ++kk) {
        const float xa = x[2 * kk], xb = x[2 * kk + 1], sn = dir * s[kk];
        x[2 * kk] = xa * c[kk] - xb * sn;
        x[2 * kk + 1] = xa * sn + xb * c[kk];
      }
    } else {
      float* xa = x;
      float* xb = x + half;
      for (I kk = 0; kk < half; ++kk) {
        const float a = xa[kk], bb = xb[kk], sn = dir * s[kk];
        xa[kk] = a * c[kk] - bb * sn;
        xb[kk] = a * sn + bb * c[kk];
      }
    }
  }

  // The bias of head h for the tile whose key 0 − query 0 distance is `base` (kp − qp):
  // diag[t] for kp − qp = base + t − (nq − 1), t ∈ [0, nq + nk − 1).
  void tile_bias(I h, I base, I nq, I nk, float* diag) const {
    const I nt = nq + nk - 1;
    for (I t = 0; t < nt; ++t) {
      const I rel = base + t - (nq - 1);
      const double dist = static_cast<double>(rel < 0 ? -rel : rel);
      double b = 0;
      switch (bias_) {
        case Bias::kSlopes: b = -slopes_[ix(h)] * dist; break;
        case Bias::kLearned:
          b = rel < 0 ? -sig_[ix(h)] * dist : rel > 0 ? -sig_[ix(d_.Hq + h)] * dist : 0.0;
          break;
        case Bias::kT5:
          b = t5w_[ix(t5::bucket(rel, p_.t5.bidirectional, p_.t5.num_buckets, p_.t5.max_distance) *
                          d_.Hq + h)];
          break;
        default: break;
      }
      diag[t] = static_cast<float>(b);
    }
  }

  // w->s [nq, Bk] = scale·Q·Kᵀ + bias, masked entries −inf (Q in w->q, K in w->k).
  void logits(I h, I q0, I nq, I j0, I nk, Scratch* w) const {
    float* S = w->s.data();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(nq), int(nk), int(d_.D),
                static_cast<float>(d_.scale), w->q.data(), int(d_.D), w->k.data(), int(d_.D), 0.f, S,
                int(kBk));
    const I base = (d_.k_off + j0) - (d_.q_off + q0);  // kp − qp of (row 0, col 0)
    if (bias_ != Bias::kNone) {
      tile_bias(h, base, nq, nk, w->diag.data());
      for (I i = 0; i < nq; ++i) simd_.add_to(S + i * kBk, w->diag.data() + (nq - 1 - i), ix(nk));
    }
    // kp − qp = base + j − i; past only: j ≤ i − base; future only: j ≥ i − base.
    const bool past = past_only(h), fut = future_only(h);
    if (!past && !fut) return;
    if (past && !fut && base + nk - 1 <= 0) return;  // wholly visible
    if (fut && !past && base - (nq - 1) >= 0) return;
    for (I i = 0; i < nq; ++i) {
      I jl = 0, jh = nk;
      if (fut) jl = std::clamp<I>(i - base, 0, nk);
      if (past) jh = std::clamp<I>(i - base + 1, 0, nk);
      float* Si = S + i * kBk;
      if (jh < jl) jh = jl;
      std::fill(Si, Si + jl, kNegInfF);
      std::fill(Si + jh, Si + nk, kNegInfF);
    }
  }

  // Rows [q0, q0 + nq) of head h: o [nq, D] = softmax(logits)·V, lse [nq].
  void forward_block(I b, I h, I q0, I nq, Scratch* w, float* o, double* lse) const {
    const I D = d_.D, kh = h / d_.G;
    load_rows(q_, b, q0, nq, h, w->q.data(), tq_, d_.q_off);
    const I qp_min = d_.q_off + q0, qp_max = qp_min + nq - 1;
    I jlo = 0, jhi = d_.N;
    if (past_only(h)) jhi = std::clamp<I>(qp_max - d_.k_off + 1, 0, d_.N);
    if (future_only(h)) jlo = std::clamp<I>(qp_min - d_.k_off, 0, d_.N);
    float* m = w->ml.data();
    float* l = m + kBq;
    std::fill(m, m + nq, kNegInfF);
    std::fill(l, l + nq, 0.f);
    std::fill(o, o + nq * D, 0.f);
    float* S = w->s.data();
    for (I j0 = jlo; j0 < jhi; j0 += kBk) {
      const I nk = std::min(kBk, jhi - j0);
      load_rows(k_, b, j0, nk, kh, w->k.data(), tk_, d_.k_off);
      load_rows(v_, b, j0, nk, kh, w->v.data(), nullptr, 0);
      logits(h, q0, nq, j0, nk, w);
      online_softmax_step(simd_, S, nq, nk, m, l, o, D);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(nq), int(D), int(nk), 1.f, S,
                  int(kBk), w->v.data(), int(D), 1.f, o, int(D));
    }
    online_softmax_finish(simd_, nq, m, l, o, D, lse);
  }

  // Parameter gradients of one tile from dS [nq, Bk]: diagonal sums, then per distance.
  void param_grads(I h, I base, I nq, I nk, const float* dS, float* diag, double* gwh) const {
    const I nt = nq + nk - 1;
    std::fill(diag, diag + nt, 0.f);
    for (I i = 0; i < nq; ++i) simd_.add_to(diag + (nq - 1 - i), dS + i * kBk, ix(nk));
    for (I t = 0; t < nt; ++t) {
      if (diag[t] == 0.f) continue;
      const I rel = base + t - (nq - 1);
      if (bias_ == Bias::kT5) {
        gwh[t5::bucket(rel, p_.t5.bidirectional, p_.t5.num_buckets, p_.t5.max_distance)] += diag[t];
      } else if (rel != 0) {  // learned ALiBi: ∂/∂w[side] = −σ(1 − σ)|Δ|
        const int side = rel < 0 ? 0 : 1;
        const double sg = sig_[ix(side * d_.Hq + h)];
        const double dist = static_cast<double>(rel < 0 ? -rel : rel);
        gwh[side] += static_cast<double>(diag[t]) * (-sg * (1 - sg) * dist);
      }
    }
  }

  const AttentionParams& p_;
  Dims d_;
  View q_, k_, v_;
  int threads_ = 1;
  Simd simd_;
  bool rope_ = false, interleaved_ = true, nonsym_ = false;
  RopeTab tab_q_, tab_k_;
  const RopeTab* tq_ = nullptr;  // rope tables for query and key positions (may be the same)
  const RopeTab* tk_ = nullptr;
  Bias bias_ = Bias::kNone;
  std::vector<double> slopes_, sig_, t5w_;  // alibi [Hq]; learned σ(w) [2, Hq]; t5 [nb, Hq]
};

// Below this many (query, key) pairs over the batch and heads, the dispatcher runs the reference:
// as fast at that size, and exact (double) where the float32 kernel is not.
constexpr I kFusedMinPairs = I{1} << 14;

// The fused kernels' argument checks beyond validation: which case they cover, and no output that
// overlaps an input (the reference reads everything before it writes).
Status fusable(const AttentionParams& p, const View& q, std::initializer_list<const View*> ins,
               std::initializer_list<std::pair<const char*, const View*>> outs) {
  if (!fused::supports(p, q.dtype))
    return Status::Invalid("encoding", "the fused kernels cover " + fused::covered() +
                                       " on float32, bfloat16 and float16; got " + attn::describe(p) +
                                       " on " + dtype_name(q.dtype));
  for (const auto& [arg, o] : outs)
    for (const View* in : ins)
      if (overlaps(*o, *in)) return Status::Invalid(arg, "overlaps an input");
  return Status::Ok();
}

Status fusable_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                        const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                        const View& dv, const EncodingGrads& g) {
  return fusable(p, q, {&q, &k, &v, &dout, &t.slopes, &t.weights, &t.u, &t.v, &t.rel_proj, &t.table},
                 {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dweights", &g.weights}, {"du", &g.u},
                  {"dv_bias", &g.v}, {"drel_proj", &g.rel_proj}, {"dtable", &g.table}});
}

Status run_forward(const AttentionParams& p, const Dims& d, const View& q, const View& k,
                   const View& v, const EncodingTensors& t, const View& out, const View& lse) {
  const BlasOneThread one;
  if (p.encoding == Encoding::kXL) return fused::xl_forward(p, d, q, k, v, t, out, lse);
  if (p.encoding == Encoding::kCope) return fused::cope_forward(p, d, q, k, v, t, out, lse);
  const Fused f(p, d, q, k, v, t, threads_for(d));
  f.forward(out, lse);
  return Status::Ok();
}

Status run_backward(const AttentionParams& p, const Dims& d, const View& q, const View& k,
                    const View& v, const EncodingTensors& t, const View& dout, const View& dq,
                    const View& dk, const View& dv, const EncodingGrads& g) {
  const BlasOneThread one;
  if (p.encoding == Encoding::kXL) return fused::xl_backward(p, d, q, k, v, t, dout, dq, dk, dv, g);
  if (p.encoding == Encoding::kCope)
    return fused::cope_backward(p, d, q, k, v, t, dout, dq, dk, dv, g);
  const Fused f(p, d, q, k, v, t, threads_for(d));
  f.backward(dout, dq, dk, dv, g.weights);
  return Status::Ok();
}

}  // namespace

namespace fused {

bool supports(const AttentionParams& p, DType qkv) {
  switch (p.encoding) {
    case Encoding::kNope: case Encoding::kRope: case Encoding::kAlibi: case Encoding::kT5: break;
    case Encoding::kXL: if (!xl_fused()) return false; break;
    case Encoding::kCope: if (!cope_fused()) return false; break;
    default: return false;
  }
  return fast::fast_dtype(qkv);
}

std::string covered() {
  std::string s = "nope, rope, alibi, t5";
  if (xl_fused()) s += ", xl";
  if (cope_fused()) s += ", cope";
  return s;
}

Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_forward(p, q, k, v, t, out, lse, &d));
  POSENC_RETURN_IF_ERROR(fusable(p, q, {&q, &k, &v, &t.slopes, &t.weights, &t.u, &t.v, &t.rel_proj, &t.table},
                 {{"out", &out}, {"lse", &lse}}));
  return run_forward(p, d, q, k, v, t, out, lse);
}

Status attention_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                          const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                          const View& dv, const EncodingGrads& g) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_backward(p, q, k, v, t, dout, dq, dk, dv, g, &d));
  if (!fast::fast_dtype(dout.dtype))
    return Status::Invalid("dout", std::string("the fused kernels read float32, bfloat16 or float16; got ") +
                                       dtype_name(dout.dtype));
  POSENC_RETURN_IF_ERROR(fusable_backward(p, q, k, v, t, dout, dq, dk, dv, g));
  return run_backward(p, d, q, k, v, t, dout, dq, dk, dv, g);
}

}  // namespace fused

Status attention_forward(const AttentionParams& p, const View& q, const View& k, const View& v,
                         const EncodingTensors& t, const View& out, const View& lse) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_forward(p, q, k, v, t, out, lse, &d));
  if (d.B * d.Hq * d.M * d.N < kFusedMinPairs ||
      !fusable(p, q, {&q, &k, &v, &t.slopes, &t.weights, &t.u, &t.v, &t.rel_proj, &t.table},
                 {{"out", &out}, {"lse", &lse}}).ok())
    return reference::attention_forward(p, q, k, v, t, out, lse);
  return run_forward(p, d, q, k, v, t, out, lse);
}

Status attention_backward(const AttentionParams& p, const View& q, const View& k, const View& v,
                          const EncodingTensors& t, const View& dout, const View& dq, const View& dk,
                          const View& dv, const EncodingGrads& g) {
  Dims d;
  POSENC_RETURN_IF_ERROR(attn::validate_backward(p, q, k, v, t, dout, dq, dk, dv, g, &d));
  if (d.B * d.Hq * d.M * d.N < kFusedMinPairs || !fast::fast_dtype(dout.dtype) ||
      !fusable_backward(p, q, k, v, t, dout, dq, dk, dv, g).ok())
    return reference::attention_backward(p, q, k, v, t, dout, dq, dk, dv, g);
  return run_backward(p, d, q, k, v, t, dout, dq, dk, dv, g);
}

}  // namespace posenc
#endif  // HWY_ONCE
