// The plain reference of FIRE's logit bias (scalar, double, the MLP evaluated per pair). out,
// dbias: [H, M, N]; query i sits at qp = q_offset + i, key j at kp = k_offset + j; d = |kp − qp|:
//
//   x = ψ(d)/ψ(max(L, qp)),  ψ(y) = log(c·y + 1);   out[h,i,j] = b2[h] + Σ_k w2[h,k]·relu(w1[k]·x + b1[k])
//
// Backward, per pair with upstream g = dbias[h,i,j], u_k = w1[k]·x + b1[k] (a unit counts when u_k > 0):
//   db2[h] += g;  dw2[h,k] += g·u_k;  dw1[k] += g·w2[h,k]·x;  db1[k] += g·w2[h,k];
//   dx = g·Σ_k w2[h,k]·w1[k];  dc += dx·∂x/∂c;  dL += dx·∂x/∂L  (∂x/∂L = 0 when qp > L)
// with ∂x/∂c = (ψ_c(d) − x·ψ_c(n))/ψ(n), ψ_c(y) = y/(1 + c·y), and ∂x/∂L = −x·c/((1 + c·L)·ψ(L)).
//
// Source: Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context
// Transformers" (arXiv 2310.04418): b(i, j) = f_θ(ψ(i − j)/ψ(max(L, i))), ψ(x) = log(cx + 1), f_θ
// an MLP with one ReLU hidden layer and an output per head, c and L learned. The paper's setting is
// causal (i ≥ j); for keys after the query d = |i − j| (see docs/bias.md). fire_math.h holds the formula.
#include <string>
#include <vector>

#include "enc/bias/bias_geometry.h"
#include "enc/bias/fire/fire_check.h"
#include "enc/bias/fire/fire_math.h"
#include "posenc/bias.h"
#include "posenc/reference.h"

namespace posenc {
namespace fire {

Status check_forward(const BiasGeometry& g, const FireTensors& t, const View& out, std::int64_t* W) {
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  POSENC_RETURN_IF_ERROR(check_tensors(t, g.heads, W));
  POSENC_RETURN_IF_ERROR(bias::check_bias_out("out", out, g));
  return require_same_dtype("out", out, t.w2, "mlp_w2");
}

Status check_backward(const BiasGeometry& g, const FireTensors& t, const View& dbias,
                      const FireTensors& grads, std::int64_t* W) {
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  POSENC_RETURN_IF_ERROR(check_tensors(t, g.heads, W));
  POSENC_RETURN_IF_ERROR(bias::check_bias_view("dbias", dbias, g));
  return check_grads(grads, g.heads, *W);
}

}  // namespace fire

namespace reference {

static Status fire_bias_unmasked(const FireParams& p, const BiasGeometry& g, const FireTensors& t,
                                 const View& out) {
  std::int64_t W = 0;
  POSENC_RETURN_IF_ERROR(fire::check_forward(g, t, out, &W));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const fire::Values v = fire::values(t);
  std::vector<double> o(static_cast<std::size_t>(H * M * N));  // [H, M, N]
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      const std::int64_t r = bias::distance(g, i, j);
      const double x = fire::normalised(v.c, v.L, g.query_offset() + i, static_cast<double>(r < 0 ? -r : r)).x;
      for (std::int64_t h = 0; h < H; ++h)
        o[static_cast<std::size_t>((h * M + i) * N + j)] =
            fire::mlp(v.w1.data(), v.b1.data(), &v.w2[static_cast<std::size_t>(h * W)],
                      v.b2[static_cast<std::size_t>(h)], W, x);
    }
  from_doubles(o, out);
  return Status::Ok();
}

Status fire_bias(const FireParams& p, const BiasGeometry& g, const FireTensors& t, const View& out) {
  return bias::causal_forward(g, out,
                              [&](const BiasGeometry& open) { return fire_bias_unmasked(p, open, t, out); });
}

static Status fire_bias_backward_unmasked(const FireParams& p, const BiasGeometry& g, const FireTensors& t,
                                          const View& dbias, const FireTensors& grads) {
  std::int64_t W = 0;
  POSENC_RETURN_IF_ERROR(fire::check_backward(g, t, dbias, grads, &W));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  // Everything read before anything is written (a gradient may alias an input).
  const fire::Values v = fire::values(t);
  const std::vector<double> db = to_doubles(dbias);
  std::vector<double> dw1(v.w1.size(), 0.0), db1(v.b1.size(), 0.0), dw2(v.w2.size(), 0.0),
      db2(v.b2.size(), 0.0);
  double dc = 0, dL = 0;
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      const std::int64_t r = bias::distance(g, i, j);
      const fire::X xx = fire::normalised(v.c, v.L, g.query_offset() + i, static_cast<double>(r < 0 ? -r : r));
      for (std::int64_t h = 0; h < H; ++h) {
        const double gd = db[static_cast<std::size_t>((h * M + i) * N + j)];
        db2[static_cast<std::size_t>(h)] += gd;
        double dx = 0;
        for (std::int64_t k = 0; k < W; ++k) {
          const std::size_t uk = static_cast<std::size_t>(k), hk = static_cast<std::size_t>(h * W + k);
          const double u = v.w1[uk] * xx.x + v.b1[uk];
          if (!(u > 0)) continue;  // relu'(0) = 0
          dw2[hk] += gd * u;
          const double dh = gd * v.w2[hk];
          dw1[uk] += dh * xx.x;
          db1[uk] += dh;
          dx += dh * v.w1[uk];
        }
        dc += dx * xx.dc;
        dL += dx * xx.dL;
      }
    }
  fire::write_grads(grads, dw1, db1, dw2, db2, dc, dL);
  return Status::Ok();
}

Status fire_bias_backward(const FireParams& p, const BiasGeometry& g, const FireTensors& t, const View& dbias,
                          const FireTensors& grads) {
  return bias::causal_backward(g, dbias, [&](const BiasGeometry& open, const View& d) {
    return fire_bias_backward_unmasked(p, open, t, d, grads);
  });
}

}  // namespace reference

}  // namespace posenc
