// FIRE's fast path: the public posenc::fire_bias / fire_bias_backward dispatch here (validation
// shared with the reference, fire_check.h, in the same order, so errors are identical).
//
// The MLP is evaluated in its piecewise-linear form (fire_math.h): per (query, key) pair one
// segment look-up — walking from the previous key's segment, so usually one or two comparisons —
// shared by the heads, then one multiply-add per head, instead of W hidden units per head. ψ is
// computed once per distance (M+N−1 values) and ψ(max(L, qp)) once per query row. The values are
// the reference's function summed in another order: equal to it within double rounding (tested).
// Backward: per head (OpenMP over heads; no shared sums, so the result does not depend on the
// thread count), the segment moments Σ g and Σ g·x and the c, L sums, then the MLP's gradients
// from the moments (fire::mlp_grads).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/fast_common.h"
#include "enc/bias/bias_geometry.h"
#include "enc/bias/fire/fire_check.h"
#include "enc/bias/fire/fire_math.h"
#include "posenc/half.h"
#include "posenc/reference.h"

namespace posenc {
namespace {

using I = std::int64_t;

// Row (h, i) of a [H, M, N] view, any float dtype and strides.
void store_row(const View& v, I h, I i, const double* x, I N) {
  const I base = h * v.strides[0] + i * v.strides[1], s = v.strides[2];
  switch (v.dtype) {
    case DType::kF32: { float* p = static_cast<float*>(v.data) + base; for (I j = 0; j < N; ++j) p[j * s] = static_cast<float>(x[j]); break; }
    case DType::kF64: { double* p = static_cast<double*>(v.data) + base; for (I j = 0; j < N; ++j) p[j * s] = x[j]; break; }
    case DType::kBF16: { bf16* p = static_cast<bf16*>(v.data) + base; for (I j = 0; j < N; ++j) p[j * s] = to_bf16(static_cast<float>(x[j])); break; }
    case DType::kF16: { f16* p = static_cast<f16*>(v.data) + base; for (I j = 0; j < N; ++j) p[j * s] = to_f16(static_cast<float>(x[j])); break; }
    default: break;
  }
}
void load_row(const View& v, I h, I i, double* x, I N) {
  const I base = h * v.strides[0] + i * v.strides[1], s = v.strides[2];
  switch (v.dtype) {
    case DType::kF32: { const float* p = static_cast<const float*>(v.data) + base; for (I j = 0; j < N; ++j) x[j] = p[j * s]; break; }
    case DType::kF64: { const double* p = static_cast<const double*>(v.data) + base; for (I j = 0; j < N; ++j) x[j] = p[j * s]; break; }
    case DType::kBF16: { const bf16* p = static_cast<const bf16*>(v.data) + base; for (I j = 0; j < N; ++j) x[j] = to_float(p[j * s]); break; }
    case DType::kF16: { const f16* p = static_cast<const f16*>(v.data) + base; for (I j = 0; j < N; ++j) x[j] = to_float(p[j * s]); break; }
    default: break;
  }
}

bool overlaps(const View& a, const View& b) {
  if (!a.present() || !b.present()) return false;
  std::uintptr_t alo, ahi, blo, bhi;
  fast::extent(a, &alo, &ahi);
  fast::extent(b, &blo, &bhi);
  return alo < bhi && blo < ahi;
}

// ψ(|r|) for r = r_min … r_min + W − 1 (the distances key − query of the call).
std::vector<double> psi_table(double c, I r_min, I W, bool derivative) {
  std::vector<double> t(static_cast<std::size_t>(W > 0 ? W : 0));
  for (I x = 0; x < W; ++x) {
    const I r = r_min + x;
    const double d = static_cast<double>(r < 0 ? -r : r);
    t[static_cast<std::size_t>(x)] = derivative ? fire::psi_dc(c, d) : fire::psi(c, d);
  }
  return t;
}

}  // namespace

static Status fire_bias_unmasked(const FireParams& p, const BiasGeometry& g, const FireTensors& t,
                                 const View& out) {
  I W = 0;
  POSENC_RETURN_IF_ERROR(fire::check_forward(g, t, out, &W));
  for (const View* in : {&t.w1, &t.b1, &t.w2, &t.b2, &t.c, &t.threshold})
    if (overlaps(*in, out)) return reference::fire_bias(p, g, t, out);
  const I H = g.heads, M = g.q_len, N = g.k_len;
  if (H * M * N == 0) return Status::Ok();
  const fire::Values v = fire::values(t);
  const fire::Pieces P = fire::pieces(v.w1, v.b1, v.w2, v.b2, H);
  const I r_min = g.k_offset - g.query_offset() - (M - 1);
  const std::vector<double> psi_d = psi_table(v.c, r_min, M + N - 1, false);
  const int threads = fast::threads_for(H * M * N);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    std::vector<double> row(static_cast<std::size_t>(H * N));  // [H, N]
#pragma omp for schedule(static)
    for (I i = 0; i < M; ++i) {
      const double inv = 1.0 / fire::psi(v.c, fire::norm_arg(v.L, g.query_offset() + i));
      const double* pd = &psi_d[static_cast<std::size_t>(M - 1 - i)];  // key j at pd[j]
      I s = 0;
      for (I j = 0; j < N; ++j) {
        const double x = pd[j] * inv;
        s = P.segment_near(x, s);
        for (I h = 0; h < H; ++h) row[static_cast<std::size_t>(h * N + j)] = P.a(h, s) + P.b(h, s) * x;
      }
      for (I h = 0; h < H; ++h) store_row(out, h, i, &row[static_cast<std::size_t>(h * N)], N);
    }
  }
  return Status::Ok();
}

Status fire_bias(const FireParams& p, const BiasGeometry& g, const FireTensors& t, const View& out) {
  return bias::causal_forward(g, out,
                              [&](const BiasGeometry& open) { return fire_bias_unmasked(p, open, t, out); });
}

static Status fire_bias_backward_unmasked(const FireParams& p, const BiasGeometry& g, const FireTensors& t,
                                          const View& dbias, const FireTensors& grads) {
  I W = 0;
  POSENC_RETURN_IF_ERROR(fire::check_backward(g, t, dbias, grads, &W));
  const I H = g.heads, M = g.q_len, N = g.k_len;
  // Every input is read (values, then dbias row by row) before any gradient is written.
  const fire::Values v = fire::values(t);
  const fire::Pieces P = fire::pieces(v.w1, v.b1, v.w2, v.b2, H);
  const I r_min = g.k_offset - g.query_offset() - (M - 1), S2 = P.segs();
  const std::vector<double> psi_d = psi_table(v.c, r_min, M + N - 1, false);
  const std::vector<double> dpsi_d = psi_table(v.c, r_min, M + N - 1, true);
  std::vector<double> M0(static_cast<std::size_t>(H * S2), 0.0), M1(M0.size(), 0.0);  // [H, S + 2]
  std::vector<double> dch(static_cast<std::size_t>(H), 0.0), dLh(dch.size(), 0.0);
  fast::parallel_ranges(H, fast::threads_for(H * M * N), [&](I h0, I h1) {
    std::vector<double> row(static_cast<std::size_t>(N));
    for (I h = h0; h < h1; ++h) {
      double* m0 = &M0[static_cast<std::size_t>(h * S2)];
      double* m1 = &M1[static_cast<std::size_t>(h * S2)];
      double dc = 0, dL = 0;
      for (I i = 0; i < M; ++i) {
        load_row(dbias, h, i, row.data(), N);
        const I qp = g.query_offset() + i;
        const double n = fire::norm_arg(v.L, qp), pn = fire::psi(v.c, n), inv = 1.0 / pn;
        const double xdc_n = fire::psi_dc(v.c, n), xdl = fire::by_threshold(v.L, qp) ? -fire::psi_dx(v.c, n) * inv : 0.0;
        const double* pd = &psi_d[static_cast<std::size_t>(M - 1 - i)];
        const double* dpd = &dpsi_d[static_cast<std::size_t>(M - 1 - i)];
        I s = 0;
        for (I j = 0; j < N; ++j) {
          const double gd = row[static_cast<std::size_t>(j)];
          const double x = pd[j] * inv;
          s = P.segment_near(x, s);
          m0[s] += gd;
          m1[s] += gd * x;
          const double dx = gd * P.b(h, s);
          dc += dx * (dpd[j] - x * xdc_n) * inv;  // ∂x/∂c
          dL += dx * x * xdl;                     // ∂x/∂L
        }
      }
      dch[static_cast<std::size_t>(h)] = dc;
      dLh[static_cast<std::size_t>(h)] = dL;
    }
  });
  std::vector<double> dw1(v.w1.size(), 0.0), db1(v.b1.size(), 0.0), dw2(v.w2.size(), 0.0), db2(v.b2.size(), 0.0);
  fire::mlp_grads(P, v.w1, v.b1, v.w2, M0, M1, &dw1, &db1, &dw2, &db2);
  double dc = 0, dL = 0;
  for (I h = 0; h < H; ++h) dc += dch[static_cast<std::size_t>(h)], dL += dLh[static_cast<std::size_t>(h)];
  fire::write_grads(grads, dw1, db1, dw2, db2, dc, dL);
  return Status::Ok();
}

Status fire_bias_backward(const FireParams& p, const BiasGeometry& g, const FireTensors& t, const View& dbias,
                          const FireTensors& grads) {
  return bias::causal_backward(g, dbias, [&](const BiasGeometry& open, const View& d) {
    return fire_bias_backward_unmasked(p, open, t, d, grads);
  });
}

}  // namespace posenc
