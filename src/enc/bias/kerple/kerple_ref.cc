// The plain reference of KERPLE's logit bias (scalar, double accumulation). out, dbias: [H, M, N];
// query i sits at qp = q_offset + i, key j at kp = k_offset + j; d = |kp − qp|.
//
//   power  b[h,i,j] = −r1_h·d^r2_h               log  b[h,i,j] = −r1_h·log(1 + r2_h·d)
//   dr1_h = Σ_{i,j} dbias[h,i,j]·∂b/∂r1,   dr2_h = Σ_{i,j} dbias[h,i,j]·∂b/∂r2   (kerple_math.h)
//
// Source: Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
// Extrapolation" (arXiv 2205.09921), its power and logarithmic variants with per-head r1, r2 > 0
// (power: r2 ≤ 2). The authors' code clamps r1, r2 to ≥ 0.01 (r2 ≤ 2 for power) around every step;
// here the parameters are taken as given and checked (kerple_check.h). The bias is symmetric in
// the distance, so it is also defined for keys after the query (the paper's models are causal).
#include <cmath>
#include <string>
#include <vector>

#include "core/overlap.h"
#include "enc/bias/bias_geometry.h"
#include "enc/bias/kerple/kerple_check.h"
#include "enc/bias/kerple/kerple_math.h"
#include "posenc/bias.h"
#include "posenc/reference.h"

namespace posenc {

const char* kerple_kernel_name(KerpleKernel k) {
  switch (k) {
    case KerpleKernel::kLog: return "log";
    case KerpleKernel::kPower: return "power";
  }
  return "?";
}

Expected<KerpleKernel> parse_kerple_kernel(const std::string& s) {
  if (s == "log") return KerpleKernel::kLog;
  if (s == "power") return KerpleKernel::kPower;
  return Status::Invalid("kernel", "expected log or power, got '" + s + "'");
}

namespace kerple {

// A gradient view: absent, or a float [H] of `like`'s dtype.
inline Status check_grad(const char* arg, const View& g, const View& like, std::int64_t H) {
  if (!g.present()) return Status::Ok();
  POSENC_RETURN_IF_ERROR(require_output(arg, g, 1));
  POSENC_RETURN_IF_ERROR(require_shape(arg, g, {H}));
  return require_same_dtype(arg, g, like, "r1");
}

Status check_forward(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                     const View& out) {
  POSENC_RETURN_IF_ERROR(check_kernel(p.kernel));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  POSENC_RETURN_IF_ERROR(check_params(p, r1, r2, g.heads));
  POSENC_RETURN_IF_ERROR(require_same_dtype("r2", r2, r1, "r1"));
  POSENC_RETURN_IF_ERROR(bias::check_bias_out("out", out, g));
  return require_same_dtype("out", out, r1, "r1");
}

Status check_backward(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                      const View& dbias, const View& dr1, const View& dr2) {
  POSENC_RETURN_IF_ERROR(check_kernel(p.kernel));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  POSENC_RETURN_IF_ERROR(check_params(p, r1, r2, g.heads));
  POSENC_RETURN_IF_ERROR(require_same_dtype("r2", r2, r1, "r1"));
  POSENC_RETURN_IF_ERROR(bias::check_bias_view("dbias", dbias, g));
  POSENC_RETURN_IF_ERROR(require_same_dtype("dbias", dbias, r1, "r1"));
  POSENC_RETURN_IF_ERROR(check_grad("dr1", dr1, r1, g.heads));
  POSENC_RETURN_IF_ERROR(check_grad("dr2", dr2, r1, g.heads));
  return fast::check_disjoint({{"dr1", &dr1}, {"dr2", &dr2}});
}

}  // namespace kerple

namespace reference {

static Status kerple_bias_unmasked(const KerpleParams& p, const BiasGeometry& g, const View& r1,
                                   const View& r2, const View& out) {
  POSENC_RETURN_IF_ERROR(kerple::check_forward(p, g, r1, r2, out));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const bool power = p.kernel == KerpleKernel::kPower;
  const std::vector<double> a = to_doubles(r1), b = to_doubles(r2);  // [H] each
  std::vector<double> o(static_cast<std::size_t>(H * M * N));        // [H, M, N]
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        const std::int64_t r = bias::distance(g, i, j);
        o[static_cast<std::size_t>((h * M + i) * N + j)] =
            kerple::bias(power, a[static_cast<std::size_t>(h)], b[static_cast<std::size_t>(h)],
                         static_cast<double>(r < 0 ? -r : r));
      }
  from_doubles(o, out);
  return Status::Ok();
}

Status kerple_bias(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                   const View& out) {
  return bias::causal_forward(
      g, out, [&](const BiasGeometry& open) { return kerple_bias_unmasked(p, open, r1, r2, out); });
}

static Status kerple_bias_backward_unmasked(const KerpleParams& p, const BiasGeometry& g, const View& r1,
                                            const View& r2, const View& dbias, const View& dr1,
                                            const View& dr2) {
  POSENC_RETURN_IF_ERROR(kerple::check_backward(p, g, r1, r2, dbias, dr1, dr2));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const bool power = p.kernel == KerpleKernel::kPower;
  // Everything read before anything is written (a gradient may alias an input).
  const std::vector<double> a = to_doubles(r1), b = to_doubles(r2), db = to_doubles(dbias);
  std::vector<double> g1(static_cast<std::size_t>(H), 0.0), g2(static_cast<std::size_t>(H), 0.0);
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        const std::int64_t r = bias::distance(g, i, j);
        const kerple::Term t = kerple::term(power, a[static_cast<std::size_t>(h)],
                                            b[static_cast<std::size_t>(h)], static_cast<double>(r < 0 ? -r : r));
        const double gd = db[static_cast<std::size_t>((h * M + i) * N + j)];
        g1[static_cast<std::size_t>(h)] += gd * t.d_r1;
        g2[static_cast<std::size_t>(h)] += gd * t.d_r2;
      }
  if (dr1.present()) from_doubles(g1, dr1);
  if (dr2.present()) from_doubles(g2, dr2);
  return Status::Ok();
}

Status kerple_bias_backward(const KerpleParams& p, const BiasGeometry& g, const View& r1, const View& r2,
                            const View& dbias, const View& dr1, const View& dr2) {
  return bias::causal_backward(g, dbias, [&](const BiasGeometry& open, const View& d) {
    return kerple_bias_backward_unmasked(p, open, r1, r2, d, dr1, dr2);
  });
}

}  // namespace reference

}  // namespace posenc
