// The study model's row operations (model.cc): its matrix products and Ops<T>, the row work of a
// pass — the Highway kernels of model_kernels.h for float, plain loops in double for double (the
// finite-difference oracle), under one contract — and the linear layer built on them.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "attention/tile_gemm.h"
#include "study/model_kernels.h"

namespace posenc::study_ops {

using I = std::int64_t;
inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

constexpr double kLnEps = 1e-5;  // LayerNorm's ε

// C[M, N] = alpha·op(A)·op(B) + beta·C, row-major. The float model's products run the Highway GEMM of
// the attention tiles (attention/tile_gemm.h; blocks of 8 rows at these heights): it packs nothing
// (OpenBLAS copies both operands of every call, a tenth of a training step here) and sums each
// element in one fixed order, so a one-thread run stays bit-reproducible. Measured on the default
// study model, one thread (forward + backward, alternating in one process): 2–5% faster a step than
// OpenBLAS. The forms it lacks (both transposed, kNT adding to C) go to OpenBLAS.
inline void gemm(bool ta, bool tb, I M, I N, I K, float alpha, const float* A, I lda, const float* B, I ldb,
          float beta, float* C, I ldc) {
  const bool nt = !ta && tb;
  if (!(ta && tb) && (beta == 0.f || (beta == 1.f && !nt))) {
    if (!nt && beta == 0.f)
      for (I i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.f);
    const attn_fast::GemmForm form = nt ? attn_fast::GemmForm::kNT : ta ? attn_fast::GemmForm::kTN
                                                                      : attn_fast::GemmForm::kNN;
    attn_fast::tile_gemm_fn()(form, M, N, K, alpha, A, lda, B, ldb, C, ldc, attn_fast::kNoBand);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}
inline void gemm(bool ta, bool tb, I M, I N, I K, double alpha, const double* A, I lda, const double* B,
          I ldb, double beta, double* C, I ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// ---- row operations ------------------------------------------------------------------------------
// Ops<double>: the plain loops (double accumulation; GELU by std::erf) — the finite-difference oracle.
// Ops<float>: the Highway kernels (model_kernels.h), fetched once per pass. Same contracts.
template <typename T> struct Ops;

template <> struct Ops<double> {
  using T = double;
  static T gelu1(T x) { return 0.5 * x * (1 + std::erf(x * M_SQRT1_2)); }  // x·Φ(x)
  static T gelu_grad1(T x) {                                                // Φ(x) + x·φ(x)
    return 0.5 * (1 + std::erf(x * M_SQRT1_2)) + x * (0.5 * M_2_SQRTPI * M_SQRT1_2) * std::exp(-0.5 * x * x);
  }
  void gelu_with_grad(const T* x, T* y, T* dydx, I n) const {
    for (I i = 0; i < n; ++i) {
      const T xi = x[i];
      y[i] = gelu1(xi);
      dydx[i] = gelu_grad1(xi);
    }
  }
  void mul(const T* a, const T* b, T* y, I n) const {
    for (I i = 0; i < n; ++i) y[i] = a[i] * b[i];
  }
  void layer_norm(const T* x, const T* g, const T* b, I R, I C, T* y, T* mean, T* rstd) const {
    for (I r = 0; r < R; ++r) {
      const T* xr = x + r * C;
      double s = 0, ss = 0;
      for (I c = 0; c < C; ++c) s += xr[c];
      const double mu = s / double(C);
      for (I c = 0; c < C; ++c) ss += (xr[c] - mu) * (xr[c] - mu);
      const double rs = 1.0 / std::sqrt(ss / double(C) + kLnEps);
      mean[r] = mu;
      rstd[r] = rs;
      for (I c = 0; c < C; ++c) y[r * C + c] = (xr[c] - mu) * rs * g[c] + b[c];
    }
  }
  void layer_norm_backward(const T* x, const T* g, const T* mean, const T* rstd, const T* dy, I R, I C,
                           T* dx, T* dg, T* db) const {
    for (I r = 0; r < R; ++r) {
      double s1 = 0, s2 = 0;
      for (I c = 0; c < C; ++c) {
        const double xh = (x[r * C + c] - mean[r]) * rstd[r];
        dg[c] += dy[r * C + c] * xh;
        db[c] += dy[r * C + c];
        s1 += dy[r * C + c] * g[c];
        s2 += dy[r * C + c] * g[c] * xh;
      }
      s1 /= double(C);
      s2 /= double(C);
      for (I c = 0; c < C; ++c) {
        const double xh = (x[r * C + c] - mean[r]) * rstd[r];
        dx[r * C + c] += rstd[r] * (dy[r * C + c] * g[c] - s1 - xh * s2);
      }
    }
  }
  void softmax_xent(T* z, const std::int32_t* target, I R, I V, double* nll) const {
    for (I r = 0; r < R; ++r) {
      T* p = z + r * V;
      const T mx = *std::max_element(p, p + V);
      const double zt = target[r] >= 0 ? p[target[r]] : 0.0;
      double sum = 0;
      for (I j = 0; j < V; ++j) sum += (p[j] = std::exp(p[j] - mx));
      const T inv = 1.0 / sum;
      for (I j = 0; j < V; ++j) p[j] *= inv;
      nll[r] = target[r] >= 0 ? std::log(sum) + mx - zt : 0.0;
    }
  }
  void xent_backward(T* p, const std::int32_t* target, I R, I V, T scale) const {
    for (I r = 0; r < R; ++r) {
      T* d = p + r * V;
      if (target[r] < 0) {
        std::fill(d, d + V, T(0));
        continue;
      }
      d[target[r]] -= 1;
      for (I j = 0; j < V; ++j) d[j] *= scale;
    }
  }
  void add_bias_rows(const T* x, const T* b, I R, I n, T* y) const {
    for (I r = 0; r < R; ++r)
      for (I j = 0; j < n; ++j) y[r * n + j] = x[r * n + j] + b[j];
  }
  void sum_rows(const T* dy, I R, I n, T* db) const {
    for (I r = 0; r < R; ++r)
      for (I j = 0; j < n; ++j) db[j] += dy[r * n + j];
  }
  void embed(const T* E, const std::int32_t* tok, I R, I C, T s, T* x) const {
    for (I r = 0; r < R; ++r)
      for (I c = 0; c < C; ++c) x[r * C + c] = s * E[I(tok[r]) * C + c];
  }
  void embed_backward(const T* dx, const std::int32_t* tok, I R, I C, T s, T* dE) const {
    for (I r = 0; r < R; ++r)
      for (I c = 0; c < C; ++c) dE[I(tok[r]) * C + c] += s * dx[r * C + c];
  }
  void add_to(T* y, const T* x, I n) const {
    for (I i = 0; i < n; ++i) y[i] += x[i];
  }
};

template <> struct Ops<float> {
  using T = float;
  model_fast::Kernels k = model_fast::kernels();
  void gelu_with_grad(const T* x, T* y, T* dydx, I n) const { k.gelu_with_grad(x, y, dydx, n); }
  void mul(const T* a, const T* b, T* y, I n) const { k.mul(a, b, y, n); }
  void layer_norm(const T* x, const T* g, const T* b, I R, I C, T* y, T* mean, T* rstd) const {
    k.layer_norm(x, g, b, R, C, kLnEps, y, mean, rstd);
  }
  void layer_norm_backward(const T* x, const T* g, const T* mean, const T* rstd, const T* dy, I R, I C,
                           T* dx, T* dg, T* db) const {
    k.layer_norm_backward(x, g, mean, rstd, dy, R, C, dx, dg, db);
  }
  void softmax_xent(T* z, const std::int32_t* target, I R, I V, double* nll) const {
    k.softmax_xent(z, target, R, V, nll);
  }
  void xent_backward(T* p, const std::int32_t* target, I R, I V, T scale) const {
    k.xent_backward(p, target, R, V, scale);
  }
  void add_bias_rows(const T* x, const T* b, I R, I n, T* y) const { k.add_bias_rows(x, b, R, n, y); }
  void sum_rows(const T* dy, I R, I n, T* db) const { k.sum_rows(dy, R, n, db); }
  void embed(const T* E, const std::int32_t* tok, I R, I C, T s, T* x) const { k.embed(E, tok, R, C, s, x); }
  void embed_backward(const T* dx, const std::int32_t* tok, I R, I C, T s, T* dE) const {
    k.embed_backward(dx, tok, R, C, s, dE);
  }
  void add_to(T* y, const T* x, I n) const { k.add_to(y, x, n); }
};

// y [R, n] = x·W + b for x [R, k], W [k, n].
template <typename T>
void linear(const T* x, const T* W, const T* b, I R, I k, I n, T* y) {
  for (I r = 0; r < R; ++r) std::memcpy(y + r * n, b, ix(n) * sizeof(T));
  gemm(false, false, R, n, k, T(1), x, k, W, n, T(1), y, n);
}

// dW [k, n] += xᵀ·dy, db [n] += Σ_r dy, dx [R, k] = dy·Wᵀ.
template <typename T>
void linear_backward(const Ops<T>& ops, const T* x, const T* W, const T* dy, I R, I k, I n, T* dW, T* db,
                     T* dx) {
  gemm(true, false, k, n, R, T(1), x, k, dy, n, T(1), dW, n);
  ops.sum_rows(dy, R, n, db);
  gemm(false, true, R, k, n, T(1), dy, n, W, n, T(0), dx, k);
}

}  // namespace posenc::study_ops
