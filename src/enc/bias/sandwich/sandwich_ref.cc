// The plain reference of Sandwich's logit bias (scalar, double). out: [H, M, N]; query i sits at
// qp = q_offset + i, key j at kp = k_offset + j:
//
//   out[h, i, j] = (Σ_{k=1}^{d̄/2} cos((kp − qp)·base^(−2k/d̄)) − d̄/2) · H/(8(h+1))
//
// Source: Chi et al. 2023 (arXiv 2212.10356), Sandwich: the inner product of sinusoidal position
// embeddings kept as a bias; the −d̄/2 offset and the per-head factor as in NVIDIA NeMo's
// implementation of the paper (sandwich_math.h). cos is even: the bias is symmetric in the
// distance. Parameter-free: there is no backward.
#include <cmath>
#include <string>
#include <vector>

#include "core/format.h"
#include "enc/bias/bias_geometry.h"
#include "enc/bias/sandwich/sandwich_math.h"
#include "posenc/bias.h"
#include "posenc/reference.h"

namespace posenc {

// d̄ is a sinusoid embedding's width (a model dimension, in the thousands at most); the bias sums
// d̄/2 terms per distance and keeps d̄/2 frequencies, so a d̄ beyond 2^16 is a typo, refused before
// anything is allocated.
constexpr std::int64_t kMaxSinusoidDim = std::int64_t{1} << 16;

Status sandwich_validate(const SandwichParams& p) {
  if (p.sinusoid_dim < 2 || p.sinusoid_dim % 2 != 0 || p.sinusoid_dim > kMaxSinusoidDim)
    return Status::Invalid("sinusoid_dim", "expected an even number in 2 .. " + std::to_string(kMaxSinusoidDim) +
                                               " (d/2 frequencies), got " + std::to_string(p.sinusoid_dim));
  if (!std::isfinite(p.base) || !(p.base > 0))
    return Status::Invalid("base", "expected a finite value > 0, got " + format_number(p.base));
  return Status::Ok();
}

namespace reference {

static Status sandwich_bias_unmasked(const SandwichParams& p, const BiasGeometry& g, const View& out) {
  POSENC_RETURN_IF_ERROR(sandwich_validate(p));
  POSENC_RETURN_IF_ERROR(bias::check_geometry(g));
  POSENC_RETURN_IF_ERROR(bias::check_bias_out("out", out, g));
  const std::int64_t H = g.heads, M = g.q_len, N = g.k_len;
  const std::vector<double> w = sandwich::freqs(p.sinusoid_dim, p.base);
  std::vector<double> o(static_cast<std::size_t>(H * M * N));  // [H, M, N]
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j)
        o[static_cast<std::size_t>((h * M + i) * N + j)] =
            sandwich::shifted_inner_product(static_cast<double>(bias::distance(g, i, j)), w) *
            sandwich::head_scale(h, H);
  from_doubles(o, out);
  return Status::Ok();
}

Status sandwich_bias(const SandwichParams& p, const BiasGeometry& g, const View& out) {
  return bias::causal_forward(g, out,
                              [&](const BiasGeometry& open) { return sandwich_bias_unmasked(p, open, out); });
}

}  // namespace reference

}  // namespace posenc
