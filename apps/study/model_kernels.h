// The float model's row and elementwise kernels (model_cpu.cc: Highway, every target compiled, the
// best supported one chosen at run time), used by Model<float> (model.cc) and AdamW (adamw.cc) and
// tested against scalar double computations on every target (tests/test_model_kernels.cc).
// Model<double>, the finite-difference oracle, keeps its scalar loops.
//
// Every kernel runs on the calling thread (the model's batch shards are the parallelism). Sums over
// rows (bias, LayerNorm and embedding gradients) go through the rows in order, so a result depends
// only on its inputs, never on the thread count.
//
// GELU (the exact form, Hendrycks & Gimpel 2016): GELU(x) = x·Φ(x), GELU'(x) = Φ(x) + x·φ(x), with
// φ(x) = e^{−x²/2}/√(2π) and Φ(x) = ½·erfc(−x/√2). Our own approximation, in float:
//   |x| ≤ 0.75: Φ(x) = ½ + x·A(x²), A of degree 4;
//   |x| > 0.75, t = |x|, Q(t) = 1 − Φ(t) = Φ(−t), z = 3/(t + 3):
//     GELU: t·Q(t) = H(z)·e^{−t²/2}, H of degree 11; GELU(−t) = −t·Q(t), GELU(t) = t − t·Q(t);
//     GELU': Q(t) = φ(t)·R(t) with Mills' ratio R = B(z), B of degree 10;
//            GELU'(−t) = −φ(t)·(t − R(t)), GELU'(t) = 1 + φ(t)·(t − R(t)).
// A, B and H are our minimax fits (numpy: Lawson-weighted least squares on 8000 Chebyshev points
// against math.erfc in double, coefficients rounded to float one at a time with the rest refitted):
// |½ + x·A − Φ(x)| ≤ 3.3·10⁻⁹·Φ(−|x|) on |x| ≤ 0.75 (relative on both sides, where ½ + x·A cancels
// least: the split at 0.75 keeps that cancellation ≤ 2.2×), B within 7.4·10⁻¹⁰ and H within
// 3.6·10⁻¹⁰ relative on [0.75, 14.5]. e^{−t²/2} keeps the low bits of t²: t = th + tl with th the
// top 12 bits of t (th² exact in float), exponent −th²/2 − tl(t + th)/2, reduced by n·ln 2 (two-part
// Cody–Waite) to |r| ≤ 0.5, Taylor's series to r⁹/9!; the 2ⁿ factor is applied last as two powers
// of two, so a tail that falls below FLT_MIN is rounded once. No tail formula cancels, so the
// relative accuracy holds until the value is subnormal (t ≳ 13.2); t is clamped at 18 (the tails are
// 0 in float beyond). Tested against x·Φ(x) and Φ(x) + x·φ(x) in double on a dense grid and 160k
// random floats of [−20, 20], every target: GELU within 4 float ulps of the exact value (measured
// 2.9 with FMA, 3.0 without; the subnormal spacing 2⁻¹⁴⁹ at least), GELU' within
// 5·2⁻²⁴·(|Φ(x)| + |x·φ(x)|) (measured 3.4 and 3.7: near its root x ≈ −0.75 only an absolute bound
// makes sense).
#pragma once

#include <cstddef>
#include <cstdint>

namespace posenc::model_fast {

using I = std::int64_t;

// Shapes: R rows of C (or n, V) floats, row-major and contiguous.
struct Kernels {
  // y = GELU(x) for n elements (y may be x).
  void (*gelu)(const float* x, float* y, I n);
  // dx = dy·GELU'(x) for n elements (dx may be dy).
  void (*gelu_backward)(const float* x, const float* dy, float* dx, I n);
  // y = GELU(x) and dydx = GELU'(x) in one pass (dydx may be x; y may not): the bits of gelu and of
  // gelu_backward with dy = 1, so that mul(dy, dydx) later is gelu_backward's dx exactly.
  void (*gelu_with_grad)(const float* x, float* y, float* dydx, I n);
  // y = a·b for n elements (y may be a or b).
  void (*mul)(const float* a, const float* b, float* y, I n);
  // LayerNorm of each row: μ, σ² over the row (float sums), rstd = 1/√(σ² + eps) (in double, then
  // rounded), y = (x − μ)·rstd·g + b; mean, rstd: [R].
  void (*layer_norm)(const float* x, const float* g, const float* b, I R, I C, double eps, float* y,
                     float* mean, float* rstd);
  // With x̂ = (x − mean)·rstd and e = dy⊙g: dx [R, C] += rstd·(e − mean(e) − x̂·mean(e⊙x̂));
  // dg [C] += Σ_r dy⊙x̂, db [C] += Σ_r dy.
  void (*layer_norm_backward)(const float* x, const float* g, const float* mean, const float* rstd,
                              const float* dy, I R, I C, float* dx, float* dg, float* db);
  // Each row of V logits z becomes softmax(z) in place; nll[r] = log Σ e^{z − max} + max − z[target]
  // (in double from the float sum), 0 where target[r] < 0.
  void (*softmax_xent)(float* z, const std::int32_t* target, I R, I V, double* nll);
  // Each row of probabilities p becomes (p − onehot(target))·scale, or 0 where target[r] < 0.
  void (*xent_backward)(float* p, const std::int32_t* target, I R, I V, float scale);
  // y[r] = x[r] + b for each of R rows of n (y may be x).
  void (*add_bias_rows)(const float* x, const float* b, I R, I n, float* y);
  // db [n] += Σ_r dy[r].
  void (*sum_rows)(const float* dy, I R, I n, float* db);
  // Embedding rows: x[r] = s·E[tok[r]]; backward dE[tok[r]] += s·dx[r] (R rows of C).
  void (*embed)(const float* E, const std::int32_t* tok, I R, I C, float s, float* x);
  void (*embed_backward)(const float* dx, const std::int32_t* tok, I R, I C, float s, float* dE);
  // y += x (n elements).
  void (*add_to)(float* y, const float* x, I n);
  // Σ double(g[i])² in double (vector partial sums, then lanes, then the tail: a fixed order).
  double (*sum_squares)(const float* g, I n);
  // One AdamW update of n elements, adamw.cc's formula in its precisions (float moments, double
  // update); targets with FMA may fuse the moments' multiply-adds:
  //   gi = float(g·clip); m = b1·m + (1 − b1)·gi; v = b2·v + (1 − b2)·gi·gi;
  //   w = float(w − lr·((m/bc1) / (√(v/bc2) + eps) + wd·w)).
  void (*adamw)(float* w, const float* g, float* m, float* v, I n, double clip, float b1, float b2,
                double bc1, double bc2, double eps, double lr, double wd);
};

// The best supported target's kernels (not cached: tests switch targets between calls).
Kernels kernels();

}  // namespace posenc::model_fast
