// The float model's kernels (model_kernels.h: what each computes, GELU's approximation and its bound),
// written once with Highway and compiled for every target by foreach_target.h. Tails shorter than a
// vector run the same formulas through a padded buffer (or plain scalar code where the formula is a
// single rounding), so a row's result does not depend on where the vector boundary falls.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "study/model_kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "study/model_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "core/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace posenc {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using model_fast::I;

// ---- GELU ------------------------------------------------------------------------------------------
// Φ(x) − ½ = x·A(x²) on |x| ≤ 0.75.
constexpr float kA[5] = {3.989422619e-01f, -6.648989767e-02f, 9.969851933e-03f, -1.175417565e-03f,
                         9.832517389e-05f};
// Mills' ratio Q(t)/φ(t) = B(z), z = 3/(t + 3), on 0.75 ≤ t ≤ 14.5.
constexpr float kB[11] = {2.291598548e-06f, 3.332664967e-01f, 3.341757655e-01f,  2.903035581e-01f,
                          2.484418303e-01f, 5.236419290e-02f, 1.334016174e-01f,  -9.189088643e-02f,
                          -1.886828393e-01f, 1.954072565e-01f, -5.349146947e-02f};
// t·Q(t)/e^{−t²/2} = t·R(t)/√(2π) = H(z), z = 3/(t + 3), on 0.75 ≤ t ≤ 14.5: GELU's own tail
// polynomial, nearly constant in z (so the rounding of z barely reaches it).
constexpr float kH[12] = {3.989457786e-01f, -1.129268348e-04f, -4.270907119e-02f, -1.022313684e-01f,
                          -4.407687113e-02f, -3.941797614e-01f, 6.295833588e-01f,  -1.276848912e+00f,
                          1.490646243e+00f,  -8.952893019e-01f, 2.666258514e-01f,  -3.034907021e-02f};
constexpr float kSplit = 0.75f;           // |x| ≤ kSplit: the polynomial A
constexpr float kTailClamp = 18.0f;       // Q(18) < 10⁻⁷²: beyond, the tail terms are 0 in float
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// e^{−t²/2} = p·s1·s2 for 0 ≤ t ≤ kTailClamp (p ∈ [0.6, 1.7], s1, s2 powers of two, normal).
template <class D, class V = hn::Vec<D>>
HWY_INLINE void ExpNegHalfSquare(D d, V t, V* p, V* s1, V* s2) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const V th = hn::BitCast(d, hn::And(hn::BitCast(du, t), hn::Set(du, 0xFFFFF000u)));  // top 12 bits
  const V mhalf = hn::Set(d, -0.5f);
  const V hi = hn::Mul(hn::Mul(th, th), mhalf);                       // exact
  const V lo = hn::Mul(hn::Mul(hn::Sub(t, th), hn::Add(t, th)), mhalf);  // |lo| ≤ 0.14
  const V nf = hn::Round(hn::Mul(hi, hn::Set(d, kLog2e)));
  V r = hn::NegMulAdd(nf, hn::Set(d, kLn2Hi), hi);  // exact (Sterbenz)
  r = hn::Add(hn::NegMulAdd(nf, hn::Set(d, kLn2Lo), r), lo);  // |r| ≤ 0.49
  // e^r by Taylor's series to r⁹/9! (the first omitted term ≤ 0.49¹⁰/10! < 3·10⁻¹⁰).
  *p = ExpTaylor<9>(d, r);
  const auto n = hn::ConvertTo(di, nf);  // in [−234, 0]
  const auto n1 = hn::ShiftRight<1>(n), n2 = hn::Sub(n, n1);
  const auto bias = hn::Set(di, 127);
  *s1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  *s2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n2, bias)));
}

template <class D, std::size_t K, class V = hn::Vec<D>>
HWY_INLINE V Horner(D d, const float (&c)[K], V z) {
  V r = hn::Set(d, c[K - 1]);
  for (std::size_t k = K - 1; k-- > 0;) r = hn::MulAdd(r, z, hn::Set(d, c[k]));
  return r;
}

// What GELU and its derivative share: Φ on the inner region (phi_a), and for the tails t = |x|,
// tc = min(t, kTailClamp), z = 3/(tc + 3) and e^{−tc²/2} = p·s1·s2.
template <class D, class V = hn::Vec<D>>
struct GeluParts {
  V t, tc, z, phi_a, p, s1, s2;
  hn::Mask<D> inner, neg;
  HWY_INLINE GeluParts(D d, V x) {
    t = hn::Abs(x);
    inner = hn::Le(t, hn::Set(d, kSplit));
    neg = hn::Lt(x, hn::Zero(d));
    phi_a = hn::MulAdd(x, Horner(d, kA, hn::Mul(x, x)), hn::Set(d, 0.5f));
    tc = hn::Min(t, hn::Set(d, kTailClamp));
    const V three = hn::Set(d, 3.0f);
    z = hn::Div(three, hn::Add(tc, three));
    ExpNegHalfSquare(d, tc, &p, &s1, &s2);
  }
};

template <class D, class V = hn::Vec<D>>
HWY_INLINE V GeluVec(D d, V x) {
  const GeluParts<D> g(d, x);
  const V inner = hn::Mul(x, g.phi_a);
  // t·Q(t) = H(z)·p·2ⁿ, the power of two last (one rounding where it is subnormal)
  const V tq = hn::Mul(hn::Mul(hn::Mul(Horner(d, kH, g.z), g.p), g.s1), g.s2);
  const V tail = hn::IfThenElse(g.neg, hn::Neg(tq), hn::Sub(g.t, tq));
  return hn::IfThenElse(g.inner, inner, tail);
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE V GeluGradVec(D d, V x) {
  const GeluParts<D> g(d, x);
  const V phi0 = hn::Mul(g.p, hn::Set(d, kInvSqrt2Pi));
  const V phi = hn::Mul(hn::Mul(phi0, g.s1), g.s2);  // φ(x): normal on the inner region
  const V inner = hn::MulAdd(x, phi, g.phi_a);
  // u = φ(t)·(t − R(t)) ≥ 0; GELU'(−t) = −u, GELU'(t) = 1 + u
  const V u = hn::Mul(hn::Mul(hn::Mul(phi0, hn::Sub(g.tc, Horner(d, kB, g.z))), g.s1), g.s2);
  const V tail = hn::IfThenElse(g.neg, hn::Neg(u), hn::Add(hn::Set(d, 1.0f), u));
  return hn::IfThenElse(g.inner, inner, tail);
}

void Gelu(const float* x, float* y, I n) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  I i = 0;
  for (; i + N <= n; i += N) hn::StoreU(GeluVec(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {
    HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)] = {};
    std::memcpy(buf, x + i, static_cast<std::size_t>(n - i) * sizeof(float));
    hn::Store(GeluVec(d, hn::Load(d, buf)), d, buf);
    std::memcpy(y + i, buf, static_cast<std::size_t>(n - i) * sizeof(float));
  }
}

void GeluBackward(const float* HWY_RESTRICT x, const float* dy, float* dx, I n) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  I i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::Mul(hn::LoadU(d, dy + i), GeluGradVec(d, hn::LoadU(d, x + i))), d, dx + i);
  if (i < n) {
    HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)] = {};
    std::memcpy(buf, x + i, static_cast<std::size_t>(n - i) * sizeof(float));
    hn::Store(GeluGradVec(d, hn::Load(d, buf)), d, buf);
    for (I k = i; k < n; ++k) dx[k] = dy[k] * buf[k - i];
  }
}

// y = GELU(x) and dydx = GELU'(x) in one pass: the parts they share (the exponential, z) formed once;
// the same bits as Gelu and GeluBackward with dy = 1 (the same expressions on the same parts).
void GeluWithGrad(const float* x, float* y, float* dydx, I n) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  I i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    hn::StoreU(GeluVec(d, v), d, y + i);
    hn::StoreU(GeluGradVec(d, v), d, dydx + i);
  }
  if (i < n) {
    HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN float gbuf[HWY_MAX_BYTES / sizeof(float)];
    std::memcpy(buf, x + i, static_cast<std::size_t>(n - i) * sizeof(float));
    const auto v = hn::Load(d, buf);
    hn::Store(GeluGradVec(d, v), d, gbuf);
    hn::Store(GeluVec(d, v), d, buf);
    std::memcpy(y + i, buf, static_cast<std::size_t>(n - i) * sizeof(float));
    std::memcpy(dydx + i, gbuf, static_cast<std::size_t>(n - i) * sizeof(float));
  }
}

// y = a·b elementwise (y may be a or b).
void MulTo(const float* a, const float* b, float* y, I n) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  I i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, y + i);
  for (; i < n; ++i) y[i] = a[i] * b[i];
}

// ---- LayerNorm -------------------------------------------------------------------------------------
void LayerNorm(const float* HWY_RESTRICT x, const float* HWY_RESTRICT g, const float* HWY_RESTRICT b,
               I R, I C, double eps, float* HWY_RESTRICT y, float* HWY_RESTRICT mean,
               float* HWY_RESTRICT rstd) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  for (I r = 0; r < R; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    auto acc = hn::Zero(d);
    I c = 0;
    for (; c + N <= C; c += N) acc = hn::Add(acc, hn::LoadU(d, xr + c));
    float s = hn::GetLane(hn::SumOfLanes(d, acc));
    for (; c < C; ++c) s += xr[c];
    const float mu = s / static_cast<float>(C);
    const auto vmu = hn::Set(d, mu);
    acc = hn::Zero(d);
    for (c = 0; c + N <= C; c += N) {
      const auto e = hn::Sub(hn::LoadU(d, xr + c), vmu);
      acc = hn::MulAdd(e, e, acc);
    }
    float ss = hn::GetLane(hn::SumOfLanes(d, acc));
    for (; c < C; ++c) ss += (xr[c] - mu) * (xr[c] - mu);
    const float rs = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(C) + eps));
    mean[r] = mu;
    rstd[r] = rs;
    const auto vrs = hn::Set(d, rs);
    for (c = 0; c + N <= C; c += N)
      hn::StoreU(hn::MulAdd(hn::Mul(hn::Sub(hn::LoadU(d, xr + c), vmu), vrs), hn::LoadU(d, g + c),
                            hn::LoadU(d, b + c)),
                 d, yr + c);
    for (; c < C; ++c) yr[c] = (xr[c] - mu) * rs * g[c] + b[c];
  }
}

void LayerNormBackward(const float* HWY_RESTRICT x, const float* HWY_RESTRICT g,
                       const float* HWY_RESTRICT mean, const float* HWY_RESTRICT rstd,
                       const float* HWY_RESTRICT dy, I R, I C, float* HWY_RESTRICT dx,
                       float* HWY_RESTRICT dg, float* HWY_RESTRICT db) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  const float invC = 1.0f / static_cast<float>(C);
  for (I r = 0; r < R; ++r) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    float* dxr = dx + r * C;
    const float mu = mean[r], rs = rstd[r];
    const auto vmu = hn::Set(d, mu), vrs = hn::Set(d, rs);
    auto a1 = hn::Zero(d), a2 = hn::Zero(d);
    I c = 0;
    for (; c + N <= C; c += N) {
      const auto xh = hn::Mul(hn::Sub(hn::LoadU(d, xr + c), vmu), vrs);
      const auto dyv = hn::LoadU(d, dyr + c);
      hn::StoreU(hn::MulAdd(dyv, xh, hn::LoadU(d, dg + c)), d, dg + c);
      hn::StoreU(hn::Add(hn::LoadU(d, db + c), dyv), d, db + c);
      const auto e = hn::Mul(dyv, hn::LoadU(d, g + c));
      a1 = hn::Add(a1, e);
      a2 = hn::MulAdd(e, xh, a2);
    }
    float s1 = hn::GetLane(hn::SumOfLanes(d, a1)), s2 = hn::GetLane(hn::SumOfLanes(d, a2));
    for (; c < C; ++c) {
      const float xh = (xr[c] - mu) * rs;
      dg[c] += dyr[c] * xh;
      db[c] += dyr[c];
      const float e = dyr[c] * g[c];
      s1 += e;
      s2 += e * xh;
    }
    s1 *= invC;
    s2 *= invC;
    const auto v1 = hn::Set(d, s1), v2 = hn::Set(d, s2);
    for (c = 0; c + N <= C; c += N) {
      const auto xh = hn::Mul(hn::Sub(hn::LoadU(d, xr + c), vmu), vrs);
      const auto e = hn::Mul(hn::LoadU(d, dyr + c), hn::LoadU(d, g + c));
      const auto t = hn::NegMulAdd(xh, v2, hn::Sub(e, v1));
      hn::StoreU(hn::MulAdd(vrs, t, hn::LoadU(d, dxr + c)), d, dxr + c);
    }
    for (; c < C; ++c) {
      const float xh = (xr[c] - mu) * rs;
      dxr[c] += rs * (dyr[c] * g[c] - s1 - xh * s2);
    }
  }
}

// ---- softmax and cross-entropy ---------------------------------------------------------------------
void SoftmaxXent(float* HWY_RESTRICT z, const std::int32_t* HWY_RESTRICT target, I R, I V,
                 double* HWY_RESTRICT nll) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  for (I r = 0; r < R; ++r) {
    float* zr = z + r * V;
    auto vm = hn::Set(d, -HUGE_VALF);
    I j = 0;
    for (; j + N <= V; j += N) vm = hn::Max(vm, hn::LoadU(d, zr + j));
    float mx = hn::GetLane(hn::MaxOfLanes(d, vm));
    for (; j < V; ++j) mx = zr[j] > mx ? zr[j] : mx;
    const std::int32_t t = target[r];
    const float zt = t >= 0 ? zr[t] : 0.0f;
    vm = hn::Set(d, mx);
    auto acc = hn::Zero(d);
    for (j = 0; j + N <= V; j += N) {
      const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, zr + j), vm));
      hn::StoreU(e, d, zr + j);
      acc = hn::Add(acc, e);
    }
    if (j < V) {  // the tail through a buffer padded with −inf (exp gives 0)
      HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)];
      for (I k = 0; k < N; ++k) buf[k] = j + k < V ? zr[j + k] : -HUGE_VALF;
      const auto e = hn::Exp(d, hn::Sub(hn::Load(d, buf), vm));
      hn::Store(e, d, buf);
      acc = hn::Add(acc, e);
      for (I k = 0; j + k < V; ++k) zr[j + k] = buf[k];
    }
    const float sum = hn::GetLane(hn::SumOfLanes(d, acc));
    const auto inv = hn::Set(d, static_cast<float>(1.0 / static_cast<double>(sum)));
    for (j = 0; j + N <= V; j += N) hn::StoreU(hn::Mul(hn::LoadU(d, zr + j), inv), d, zr + j);
    for (; j < V; ++j) zr[j] *= hn::GetLane(inv);
    nll[r] = t >= 0 ? std::log(static_cast<double>(sum)) + static_cast<double>(mx) - static_cast<double>(zt)
                    : 0.0;
  }
}

void XentBackward(float* HWY_RESTRICT p, const std::int32_t* HWY_RESTRICT target, I R, I V,
                  float scale) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  const auto vs = hn::Set(d, scale);
  for (I r = 0; r < R; ++r) {
    float* pr = p + r * V;
    const std::int32_t t = target[r];
    if (t < 0) {
      std::memset(pr, 0, static_cast<std::size_t>(V) * sizeof(float));
      continue;
    }
    const float pt = pr[t];
    I j = 0;
    for (; j + N <= V; j += N) hn::StoreU(hn::Mul(hn::LoadU(d, pr + j), vs), d, pr + j);
    for (; j < V; ++j) pr[j] *= scale;
    pr[t] = (pt - 1.0f) * scale;
  }
}

// ---- rows --------------------------------------------------------------------------------------------
void AddBiasRows(const float* x, const float* HWY_RESTRICT b, I R, I n, float* y) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  for (I r = 0; r < R; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    I j = 0;
    for (; j + N <= n; j += N) hn::StoreU(hn::Add(hn::LoadU(d, xr + j), hn::LoadU(d, b + j)), d, yr + j);
    for (; j < n; ++j) yr[j] = xr[j] + b[j];
  }
}

void SumRows(const float* HWY_RESTRICT dy, I R, I n, float* HWY_RESTRICT db) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  I j = 0;
  // Four vectors of columns at a time held in registers over all rows (each column's sum still
  // goes through the rows in order).
  for (; j + 4 * N <= n; j += 4 * N) {
    auto a0 = hn::LoadU(d, db + j), a1 = hn::LoadU(d, db + j + N), a2 = hn::LoadU(d, db + j + 2 * N),
         a3 = hn::LoadU(d, db + j + 3 * N);
    for (I r = 0; r < R; ++r) {
      const float* row = dy + r * n + j;
      a0 = hn::Add(a0, hn::LoadU(d, row));
      a1 = hn::Add(a1, hn::LoadU(d, row + N));
      a2 = hn::Add(a2, hn::LoadU(d, row + 2 * N));
      a3 = hn::Add(a3, hn::LoadU(d, row + 3 * N));
    }
    hn::StoreU(a0, d, db + j);
    hn::StoreU(a1, d, db + j + N);
    hn::StoreU(a2, d, db + j + 2 * N);
    hn::StoreU(a3, d, db + j + 3 * N);
  }
  for (; j + N <= n; j += N) {
    auto a = hn::LoadU(d, db + j);
    for (I r = 0; r < R; ++r) a = hn::Add(a, hn::LoadU(d, dy + r * n + j));
    hn::StoreU(a, d, db + j);
  }
  for (; j < n; ++j) {
    float a = db[j];
    for (I r = 0; r < R; ++r) a += dy[r * n + j];
    db[j] = a;
  }
}

void Embed(const float* HWY_RESTRICT E, const std::int32_t* HWY_RESTRICT tok, I R, I C, float s,
           float* HWY_RESTRICT x) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  const auto vs = hn::Set(d, s);
  for (I r = 0; r < R; ++r) {
    const float* e = E + static_cast<I>(tok[r]) * C;
    float* xr = x + r * C;
    I c = 0;
    for (; c + N <= C; c += N) hn::StoreU(hn::Mul(vs, hn::LoadU(d, e + c)), d, xr + c);
    for (; c < C; ++c) xr[c] = s * e[c];
  }
}

void EmbedBackward(const float* HWY_RESTRICT dx, const std::int32_t* HWY_RESTRICT tok, I R, I C,
                   float s, float* HWY_RESTRICT dE) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  const auto vs = hn::Set(d, s);
  for (I r = 0; r < R; ++r) {
    float* e = dE + static_cast<I>(tok[r]) * C;
    const float* dr = dx + r * C;
    I c = 0;
    for (; c + N <= C; c += N)
      hn::StoreU(hn::MulAdd(vs, hn::LoadU(d, dr + c), hn::LoadU(d, e + c)), d, e + c);
    for (; c < C; ++c) e[c] += s * dr[c];
  }
}

void AddTo(float* HWY_RESTRICT y, const float* HWY_RESTRICT x, I n) {
  const hn::ScalableTag<float> d;
  const I N = static_cast<I>(hn::Lanes(d));
  I i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Add(hn::LoadU(d, y + i), hn::LoadU(d, x + i)), d, y + i);
  for (; i < n; ++i) y[i] += x[i];
}

// ---- AdamW -------------------------------------------------------------------------------------------
double SumSquares(const float* HWY_RESTRICT g, I n) {
  I i = 0;
  double s = 0;
#if HWY_HAVE_FLOAT64
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const I N = static_cast<I>(hn::Lanes(dd));
  auto acc = hn::Zero(dd);
  for (; i + N <= n; i += N) {
    const auto x = hn::PromoteTo(dd, hn::LoadU(df, g + i));
    acc = hn::Add(acc, hn::Mul(x, x));
  }
  s = hn::GetLane(hn::SumOfLanes(dd, acc));
#endif
  for (; i < n; ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  return s;
}

// The scalar update of one element (the tails, and targets without double lanes).
HWY_INLINE void AdamWOne(float* w, float g, float* m, float* v, double clip, float b1, float b2,
                         double bc1, double bc2, double eps, double lr, double wd) {
  const float gi = static_cast<float>(static_cast<double>(g) * clip);
  *m = b1 * *m + (1 - b1) * gi;
  *v = b2 * *v + (1 - b2) * gi * gi;
  const double upd = (static_cast<double>(*m) / bc1) / (std::sqrt(static_cast<double>(*v) / bc2) + eps);
  *w = static_cast<float>(static_cast<double>(*w) - lr * (upd + wd * static_cast<double>(*w)));
}

void AdamWRun(float* HWY_RESTRICT w, const float* HWY_RESTRICT g, float* HWY_RESTRICT m,
              float* HWY_RESTRICT v, I n, double clip, float b1, float b2, double bc1, double bc2,
              double eps, double lr, double wd) {
  I i = 0;
#if HWY_HAVE_FLOAT64
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const I N = static_cast<I>(hn::Lanes(dd));
  const auto vclip = hn::Set(dd, clip), vbc1 = hn::Set(dd, bc1), vbc2 = hn::Set(dd, bc2),
             veps = hn::Set(dd, eps), vlr = hn::Set(dd, lr), vwd = hn::Set(dd, wd);
  const auto vb1 = hn::Set(df, b1), vb2 = hn::Set(df, b2), vc1 = hn::Set(df, 1 - b1),
             vc2 = hn::Set(df, 1 - b2);
  for (; i + N <= n; i += N) {
    const auto gi = hn::DemoteTo(df, hn::Mul(hn::PromoteTo(dd, hn::LoadU(df, g + i)), vclip));
    const auto mv = hn::Add(hn::Mul(vb1, hn::LoadU(df, m + i)), hn::Mul(vc1, gi));
    const auto vv = hn::Add(hn::Mul(vb2, hn::LoadU(df, v + i)), hn::Mul(hn::Mul(vc2, gi), gi));
    hn::StoreU(mv, df, m + i);
    hn::StoreU(vv, df, v + i);
    const auto upd = hn::Div(hn::Div(hn::PromoteTo(dd, mv), vbc1),
                             hn::Add(hn::Sqrt(hn::Div(hn::PromoteTo(dd, vv), vbc2)), veps));
    const auto wv = hn::PromoteTo(dd, hn::LoadU(df, w + i));
    hn::StoreU(hn::DemoteTo(df, hn::Sub(wv, hn::Mul(vlr, hn::Add(upd, hn::Mul(vwd, wv))))), df, w + i);
  }
#endif
  for (; i < n; ++i) AdamWOne(w + i, g[i], m + i, v + i, clip, b1, b2, bc1, bc2, eps, lr, wd);
}

model_fast::Kernels GetKernels() {
  return model_fast::Kernels{&Gelu,        &GeluBackward, &GeluWithGrad, &MulTo,         &LayerNorm,
                             &LayerNormBackward, &SoftmaxXent, &XentBackward, &AddBiasRows, &SumRows,
                             &Embed,       &EmbedBackward, &AddTo,        &SumSquares,    &AdamWRun};
}

}  // namespace HWY_NAMESPACE
}  // namespace posenc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace posenc {
HWY_EXPORT(GetKernels);

model_fast::Kernels model_fast::kernels() { return HWY_DYNAMIC_DISPATCH(GetKernels)(); }

}  // namespace posenc
#endif
